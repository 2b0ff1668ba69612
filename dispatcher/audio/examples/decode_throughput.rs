//! The host's ceiling for the main job: how many audio seconds per second this machine decodes
//! (decode, downmix and resampling to 16 kHz mono, nothing else) with N threads, per folder of
//! recordings and for all of them at once.
//!
//! `decode_throughput DIR [THREADS,...]` (default threads: 1 and the host's logical CPUs), one
//! line per (folder, threads): recordings, audio seconds, wall, process CPU, audio-s/s and audio
//! seconds per CPU-second. Folders are DIR's subfolders (the pipeline corpus keeps one per
//! format); `all` is every recording, in one shuffled order, as the main job meets them.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: decode_throughput DIR [THREADS,...]"))?,
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, cpus],
    };
    let mut groups: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    let mut all = Vec::new();
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    folders.sort();
    for folder in folders {
        let files = read_all(&folder)?;
        all.extend(files.iter().cloned());
        let name = folder
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        groups.push((name, files));
    }
    // A fixed shuffle (multiplicative stride) so the formats interleave as in a queue.
    let n = all.len();
    let stride = (1..n.max(2))
        .rev()
        .find(|s| gcd(*s, n) == 1 && *s * 3 < n * 2)
        .unwrap_or(1);
    let all: Vec<Vec<u8>> = (0..n).map(|i| all[(i * stride) % n].clone()).collect();
    groups.push(("all".to_owned(), all));
    println!("host: {cpus} logical CPUs");
    for &t in &threads {
        for (name, files) in &groups {
            let (audio_s, wall_s, cpu_s) = decode_all(files, t)?;
            println!(
                "{name:>10} threads {t:>3}: {:>5} recordings {audio_s:>9.0} audio-s wall {wall_s:>6.2} s cpu {cpu_s:>7.2} s -> {:>6.0} audio-s/s, {:>5.0} audio-s per CPU-second",
                files.len(),
                audio_s / wall_s,
                audio_s / cpu_s
            );
        }
    }
    Ok(())
}

fn read_all(folder: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.into_iter().map(|p| Ok(std::fs::read(p)?)).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Decodes every file once on `threads` threads taking the next file as they finish.
fn decode_all(files: &[Vec<u8>], threads: usize) -> anyhow::Result<(f64, f64, f64)> {
    let next = AtomicUsize::new(0);
    let limits = audio::AudioLimits::default();
    let cpu_before = process_cpu_s()?;
    let started = Instant::now();
    let audio_s = std::thread::scope(|scope| -> anyhow::Result<f64> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<f64> {
                    let mut audio_s = 0.0;
                    while let Some(bytes) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                        audio_s += audio::decode(bytes, None, &limits)?.duration_s;
                    }
                    Ok(audio_s)
                })
            })
            .collect();
        let mut total = 0.0;
        for handle in handles {
            total += handle
                .join()
                .map_err(|_| anyhow::anyhow!("a decode thread panicked"))??;
        }
        Ok(total)
    })?;
    let wall_s = started.elapsed().as_secs_f64();
    Ok((audio_s, wall_s, process_cpu_s()? - cpu_before))
}

/// User + system time of this process (fields 14 and 15 of /proc/self/stat, in clock ticks of
/// 10 ms: the runs here take seconds).
fn process_cpu_s() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("/proc/self/stat has no field {}", i + 3))?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}
