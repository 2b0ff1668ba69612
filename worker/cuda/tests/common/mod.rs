//! Test support: the shared engine (or a loud skip), seeded random inputs, poisoned outputs and
//! tolerance checks that report their error statistics.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Mutex, MutexGuard, OnceLock};

use cuda_engine::{bf16, CudaEngine, CudaEngineError, CudaSlice};

/// One engine for the whole test binary (NVRTC compiles every module once), or why there is none.
static ENGINE: OnceLock<Result<Mutex<CudaEngine>, String>> = OnceLock::new();

/// The shared engine, or `None` after a loud skip message when this machine has no CUDA.
/// With `REQUIRE_CUDA=1` a missing device fails the test instead. Any other engine error fails.
pub fn engine(test: &str) -> Option<MutexGuard<'static, CudaEngine>> {
    let started = std::time::Instant::now();
    let slot = ENGINE.get_or_init(|| match CudaEngine::new(0) {
        Ok(engine) => {
            let name = engine.device_name().unwrap_or_else(|e| format!("? ({e})"));
            eprintln!(
                "cuda-engine tests on {name}, compute capability {:?}, {}; engine ready \
                 (NVRTC included) in {:.0} ms",
                engine.compute_capability(),
                engine.kernel_build(),
                started.elapsed().as_secs_f64() * 1e3
            );
            Ok(Mutex::new(engine))
        }
        Err(CudaEngineError::NoDevice { reason }) => Err(reason),
        Err(other) => panic!("CUDA engine failed to start: {other}"),
    });
    match slot {
        Ok(engine) => Some(
            engine
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        ),
        Err(reason) => {
            if std::env::var("REQUIRE_CUDA").as_deref() == Ok("1") {
                panic!("REQUIRE_CUDA=1 but no CUDA device: {reason}");
            }
            eprintln!(
                "SKIPPED {test}: no CUDA device ({reason}); set REQUIRE_CUDA=1 to fail instead"
            );
            None
        }
    }
}

/// SplitMix64: tiny, seedable, good enough for test inputs.
pub struct Rng(u64);

impl Rng {
    /// Fresh seed per run (printed, so a failure can be replayed with `CUDA_TEST_SEED`).
    pub fn fresh(test: &str) -> Self {
        let seed = std::env::var("CUDA_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0x5eed)
            });
        eprintln!("{test}: seed {seed} (CUDA_TEST_SEED={seed} to replay)");
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize
    }

    /// `n` values `mean + std * N(0,1)`, already rounded to bf16 (the device sees exactly these).
    pub fn bf16_vec(&mut self, n: usize, mean: f64, std: f64) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f64(mean + std * self.normal()))
            .collect()
    }

    pub fn f32_vec(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (mean + std * self.normal()) as f32)
            .collect()
    }
}

/// A storage type under test (see `cuda_engine::Storage`): how to make, read and poison its
/// buffers, and the relative error its rounding allows.
pub trait TestStorage: cuda_engine::Storage + std::fmt::Debug {
    const NAME: &'static str;
    /// bf16: one ulp (its rounding dominates). f32: a few ulps, for the kernels' own f32
    /// arithmetic (`expf`, division, accumulation order), still far below any indexing error.
    const ULP: f64;
    fn random(rng: &mut Rng, n: usize, mean: f64, std: f64) -> Vec<Self>;
    fn widen(values: &[Self]) -> Vec<f64>;
    fn to_f32(values: &[Self]) -> Vec<f32>;
    fn poisoned(engine: &CudaEngine, n: usize) -> CudaSlice<Self>;
}

impl TestStorage for bf16 {
    const NAME: &'static str = "bf16";
    const ULP: f64 = BF16_ULP;
    fn random(rng: &mut Rng, n: usize, mean: f64, std: f64) -> Vec<Self> {
        rng.bf16_vec(n, mean, std)
    }
    fn widen(values: &[Self]) -> Vec<f64> {
        widen(values)
    }
    fn to_f32(values: &[Self]) -> Vec<f32> {
        to_f32(values)
    }
    fn poisoned(engine: &CudaEngine, n: usize) -> CudaSlice<Self> {
        poisoned_bf16(engine, n)
    }
}

impl TestStorage for f32 {
    const NAME: &'static str = "f32";
    const ULP: f64 = 2e-6;
    fn random(rng: &mut Rng, n: usize, mean: f64, std: f64) -> Vec<Self> {
        rng.f32_vec(n, mean, std)
    }
    fn widen(values: &[Self]) -> Vec<f64> {
        values.iter().map(|&v| f64::from(v)).collect()
    }
    fn to_f32(values: &[Self]) -> Vec<f32> {
        values.to_vec()
    }
    fn poisoned(engine: &CudaEngine, n: usize) -> CudaSlice<Self> {
        poisoned_f32(engine, n)
    }
}

/// Runs a kernel test for bf16 storage, then for f32 storage (its kernel build compiled first).
pub fn for_each_storage(
    engine: &CudaEngine,
    bf16_case: fn(&CudaEngine),
    f32_case: fn(&CudaEngine),
) {
    bf16_case(engine);
    engine
        .load_f32_storage()
        .expect("compiling the f32-storage kernels");
    f32_case(engine);
}

pub fn widen(values: &[bf16]) -> Vec<f64> {
    values.iter().map(|v| f64::from(v.to_f32())).collect()
}

/// A device buffer of `n` NaNs (all-ones bit patterns): an element the kernel fails to write
/// stays NaN and fails every comparison.
pub fn poisoned_bf16(engine: &CudaEngine, n: usize) -> CudaSlice<bf16> {
    engine
        .upload(&vec![bf16::from_bits(0xFFFF); n])
        .expect("upload poison")
}

pub fn poisoned_f32(engine: &CudaEngine, n: usize) -> CudaSlice<f32> {
    engine
        .upload(&vec![f32::from_bits(0xFFFF_FFFF); n])
        .expect("upload poison")
}

/// One bf16 unit in the last place, relative: rounding the exact result to bf16 costs at most
/// half of it; a one-ulp allowance also covers f32 intermediates that land on the other side of
/// a rounding boundary.
pub const BF16_ULP: f64 = 1.0 / 256.0;

/// Checks `|got - want| <= bound(i)` for every element (NaN never passes), prints the error
/// statistics, and panics with the first offenders.
pub fn assert_close(label: &str, got: &[f32], want: &[f64], bound: impl Fn(usize) -> f64) {
    if let Err(message) = check_close(label, got, want, bound) {
        panic!("{message}");
    }
}

/// [`assert_close`] that returns the failure instead of panicking, so a test can report every
/// case before failing.
pub fn check_close(
    label: &str,
    got: &[f32],
    want: &[f64],
    bound: impl Fn(usize) -> f64,
) -> Result<(), String> {
    assert_eq!(got.len(), want.len(), "{label}: length mismatch");
    let mut max_abs = 0.0f64;
    let mut max_ratio = 0.0f64;
    let (mut diff_sq, mut ref_sq) = (0.0f64, 0.0f64);
    let mut failures = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let diff = (f64::from(g) - w).abs();
        let limit = bound(i);
        // NaN in `got` makes `diff` NaN, which must fail.
        if diff.is_nan() || diff > limit {
            failures.push(i);
        }
        if diff.is_finite() {
            max_abs = max_abs.max(diff);
            max_ratio = max_ratio.max(diff / limit);
            diff_sq += diff * diff;
        }
        ref_sq += w * w;
    }
    let rel_l2 = if ref_sq > 0.0 {
        (diff_sq / ref_sq).sqrt()
    } else {
        diff_sq.sqrt()
    };
    eprintln!(
        "RESULT {label}: n={} max_abs_err={max_abs:.3e} rel_l2={rel_l2:.3e} worst_err/tol={max_ratio:.3} failures={}",
        got.len(),
        failures.len()
    );
    if !failures.is_empty() {
        let shown: Vec<String> = failures
            .iter()
            .take(8)
            .map(|&i| format!("[{i}] got {} want {} tol {:.3e}", got[i], want[i], bound(i)))
            .collect();
        return Err(format!(
            "{label}: {} of {} elements out of tolerance: {}",
            failures.len(),
            got.len(),
            shown.join("; ")
        ));
    }
    Ok(())
}

pub fn to_f32(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

/// The checked-in NeMo fixtures: `FIXTURES_DIR`, else `models/tests/fixtures` beside the crate,
/// else under the current directory (device runs start in the repository root).
pub fn fixtures() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("FIXTURES_DIR") {
        return std::path::PathBuf::from(dir);
    }
    let built =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tests/fixtures");
    if built.is_dir() {
        built
    } else {
        std::path::PathBuf::from("models/tests/fixtures")
    }
}

/// A 16 kHz mono PCM16 WAV as f32 samples in [-1, 1).
pub fn read_wav(path: &std::path::Path) -> anyhow::Result<Vec<f32>> {
    let mut reader =
        hound::WavReader::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let spec = reader.spec();
    anyhow::ensure!(
        spec.channels == 1 && spec.sample_rate == 16000 && spec.bits_per_sample == 16,
        "{}: expected 16 kHz mono PCM16, got {spec:?}",
        path.display()
    );
    reader
        .samples::<i16>()
        .map(|s| Ok(f32::from(s?) / 32768.0))
        .collect()
}

/// Both NeMo-made Parakeet fixtures: full `rel_pos` attention, and `rel_pos_local_attn`.
pub const MODELS: [&str; 2] = ["tdt-real-options", "tdt-local-attn"];
/// Every fixture clip (`models/tests/fixtures/clips/<name>.wav`).
pub const CLIPS: [&str; 8] = [
    "audioeval_counting",
    "audioeval_fox",
    "espeak_gb_fast",
    "espeak_short",
    "espeak_us",
    "long",
    "noise",
    "silence",
];

/// Random prediction and joint networks for `cfg` under NeMo's key names, for a `d_model`-wide
/// encoder: weights with std 1/sqrt(fan-in) (the joint's output layer times `out_gain`),
/// embedding std 1, joint biases std 0.1, and `blank_bias` added to the blank logit's bias.
pub fn random_decoder_tensors(
    rng: &mut Rng,
    cfg: &model_core::config::DecoderConfig,
    d_model: usize,
    out_gain: f64,
    blank_bias: f32,
) -> std::collections::BTreeMap<String, models::tensor::Tensor> {
    let (vocab, hidden, joint) = (cfg.vocab_size, cfg.pred_hidden, cfg.joint_hidden);
    let n_out = vocab + 1 + cfg.durations.len();
    let mut map = std::collections::BTreeMap::new();
    let mut add = |name: String, shape: Vec<usize>, std: f64| {
        let n = shape.iter().product();
        let values = rng.f32_vec(n, 0.0, std);
        map.insert(name, models::tensor::Tensor::new(shape, values));
    };
    let h_std = 1.0 / (hidden as f64).sqrt();
    let lstm = "decoder.prediction.dec_rnn.lstm";
    add(
        "decoder.prediction.embed.weight".into(),
        vec![vocab + 1, hidden],
        1.0,
    );
    for l in 0..cfg.pred_rnn_layers {
        for kind in ["ih", "hh"] {
            add(
                format!("{lstm}.weight_{kind}_l{l}"),
                vec![4 * hidden, hidden],
                h_std,
            );
            add(format!("{lstm}.bias_{kind}_l{l}"), vec![4 * hidden], h_std);
        }
    }
    add("joint.pred.weight".into(), vec![joint, hidden], h_std);
    add("joint.pred.bias".into(), vec![joint], h_std);
    add(
        "joint.enc.weight".into(),
        vec![joint, d_model],
        1.0 / (d_model as f64).sqrt(),
    );
    add("joint.enc.bias".into(), vec![joint], 0.1);
    add(
        "joint.joint_net.2.weight".into(),
        vec![n_out, joint],
        out_gain / (joint as f64).sqrt(),
    );
    add("joint.joint_net.2.bias".into(), vec![n_out], 0.1);
    if let Some(bias) = map.get_mut("joint.joint_net.2.bias") {
        bias.data[vocab] += blank_bias;
    }
    map
}
