//! Prints what every file in a folder decodes to: `cargo run -p audio --example probe_corpus DIR`.
//! The `pcm` column hashes the 16 kHz samples' bits: two builds (other compiler flags, another
//! decoder version) decode a folder identically when every line's `pcm` column matches.
use std::hash::{Hash, Hasher};

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "dispatcher/audio/tests/data".into());
    let mut paths: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    paths.sort();
    for path in paths {
        let bytes = std::fs::read(&path)?;
        let ext = path.extension().and_then(|e| e.to_str());
        let t = std::time::Instant::now();
        let result = audio::decode(&bytes, ext, &audio::AudioLimits::default());
        let ms = t.elapsed().as_millis();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        match result {
            Ok(a) => {
                // SipHash with fixed keys: the same on every run of one toolchain.
                let mut pcm = std::collections::hash_map::DefaultHasher::new();
                a.pcm_16k.iter().for_each(|s| s.to_bits().hash(&mut pcm));
                println!(
                    "{name:28} ok  {} Hz x{} -> {} samples ({:.4} s) peak {:.3} pcm {:016x}  [{ms} ms]",
                    a.source_sample_rate_hz,
                    a.source_channels,
                    a.pcm_16k.len(),
                    a.duration_s,
                    a.peak_abs,
                    pcm.finish()
                )
            }
            Err(e) => println!("{name:28} ERR {:24} {e}  [{ms} ms]", e.reason_code()),
        }
    }
    Ok(())
}
