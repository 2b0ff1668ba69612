//! Shared harness for the dispatcher's integration tests.
#![allow(dead_code, unreachable_pub)]

pub mod backend;
pub mod moto;
pub mod tools;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::{Settings, SettingsArgs};
use dispatcher::lifecycle::RunSummary;
use dispatcher::transcriber::Transcriber;
use model_core::transcript::Transcript;
use tokio_util::sync::CancellationToken;

pub use backend::Backend;

/// The tiny real-weights fixture the models crate checks in.
pub fn fixture_model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/tdt-real-options/model.nemo");
    assert!(
        path.exists(),
        "fixture model {} is missing (it is checked in by the models crate)",
        path.display()
    );
    path
}

/// The real CPU engine on the fixture model, loaded once per test binary.
pub fn engine() -> Arc<dyn Transcriber> {
    static ENGINE: OnceLock<Arc<dyn Transcriber>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            dispatcher::in_process::load_transcriber(
                engine::EngineKind::Cpu,
                &fixture_model_path(),
                &engine::EngineSettings::cpu(),
                None,
            )
            .expect("load fixture model")
        })
        .clone()
}

pub fn clip(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/clips")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn bad_audio(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("audio/tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The real engine, slowed down: stands in for a long recording on a busy GPU so that
/// lifecycle tests (heartbeats, drain) can hold a job open for a known time.
pub struct Slow {
    pub inner: Arc<dyn Transcriber>,
    pub delay: Duration,
}

impl Transcriber for Slow {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn frame_duration_s(&self) -> f64 {
        self.inner.frame_duration_s()
    }
    fn transcribe(&self, segments: &[&[f32]]) -> dispatcher::error::Result<Vec<Transcript>> {
        std::thread::sleep(self.delay);
        self.inner.transcribe(segments)
    }
}

/// Test settings: short waits and leases so the suite stays quick.
pub fn settings(backend: &Backend, tweak: impl FnOnce(&mut SettingsArgs)) -> Settings {
    let mut args = SettingsArgs {
        output_uri: Some(backend.output.uri()),
        receivers: Some(2),
        wait_time_s: Some(1),
        visibility_timeout_s: Some(6),
        max_in_flight: Some(4),
        drain_grace_s: Some(30),
        max_receives: Some(backend.max_receives),
        max_retry_delay_s: Some(2),
        metrics_flush_s: Some(1),
        ..SettingsArgs::default()
    };
    tweak(&mut args);
    args.resolve().expect("test settings")
}

/// Runs a consumer over the backend until the queue is empty and nothing is in flight.
pub async fn run_until_idle(
    backend: &Backend,
    transcriber: Arc<dyn Transcriber>,
    settings: &Settings,
) -> RunSummary {
    let metrics = MetricsRuntime::start(settings, None)
        .await
        .expect("metrics");
    let parts = app::ConsumerParts {
        queue: backend.queue.clone(),
        store: backend.store.clone(),
        transcriber,
        diarizer: None,
    };
    let consumer = app::consumer(settings, parts, &metrics, true).expect("consumer");
    let summary = tokio::time::timeout(
        Duration::from_secs(180),
        consumer.run(CancellationToken::new()),
    )
    .await
    .expect("consumer finished within 180 s");
    metrics.shutdown().await;
    summary
}

/// Result directories (those holding a manifest or a failure record) under the output prefix.
pub async fn records(backend: &Backend) -> (Vec<String>, Vec<String>) {
    let keys = backend.output_keys().await;
    let manifests = keys
        .iter()
        .filter(|k| k.ends_with("/manifest.json"))
        .cloned()
        .collect();
    let failures = keys
        .iter()
        .filter(|k| k.ends_with("/failure.json"))
        .cloned()
        .collect();
    (manifests, failures)
}

/// Declares a test body once and runs it on both backends.
#[macro_export]
macro_rules! both_backends {
    ($name:ident, $max_receives:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                super::$name(super::common::Backend::local($max_receives).await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn moto() {
                super::$name(super::common::Backend::moto($max_receives).await).await;
            }
        }
    };
}

/// A 16-bit PCM WAV whose samples are those of `wav` repeated `times` times: a long recording
/// built from a real clip, so kill/drain tests can catch a job mid-flight.
pub fn repeat_wav(wav: &[u8], times: usize) -> Vec<u8> {
    let fmt = wav
        .windows(4)
        .position(|w| w == b"fmt ")
        .expect("fmt chunk");
    let channels = u16::from_le_bytes([wav[fmt + 10], wav[fmt + 11]]);
    let rate = u32::from_le_bytes([wav[fmt + 12], wav[fmt + 13], wav[fmt + 14], wav[fmt + 15]]);
    let bits = u16::from_le_bytes([wav[fmt + 22], wav[fmt + 23]]);
    assert_eq!(bits, 16, "repeat_wav expects 16-bit PCM");
    let data = wav
        .windows(4)
        .position(|w| w == b"data")
        .expect("data chunk");
    let len =
        u32::from_le_bytes([wav[data + 4], wav[data + 5], wav[data + 6], wav[data + 7]]) as usize;
    let samples = &wav[data + 8..(data + 8 + len).min(wav.len())];
    let body = samples.repeat(times);
    let mut out = Vec::with_capacity(44 + body.len());
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + body.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
    out.extend_from_slice(&(channels * 2).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}
