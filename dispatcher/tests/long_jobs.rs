//! Long recordings in checkpoints: a job whose lease reaches its cap (SQS's 12 h, shortened
//! here) stops at its next checkpoint and the message's next delivery resumes after the saved
//! ones; a dispatcher killed mid-job resumes the same way. Either way every segment is
//! transcribed once and the result is the one an uninterrupted run gives. Both backends, the
//! real fixture model.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{clip, fixture_model_path, records, Backend};
use dispatcher::app::{self, MetricsRuntime, Sizing};
use dispatcher::config::Settings;
use dispatcher::decode::{decode_segments, Decoded};
use dispatcher::job::{JobMessage, OutputFormat};
use dispatcher::lifecycle::Consumer;
use dispatcher::pipeline::Pipeline;
use dispatcher::recording::{checkpoint_runs, transcribe_recording};
use dispatcher::render;
use dispatcher::transcriber::{Priority, Transcriber};
use model_core::render::RenderOptions;
use model_core::transcript::Transcript;
use tokio_util::sync::CancellationToken;

/// The real engine, slowed per call, counting the segments it transcribes.
struct Counting {
    inner: Arc<dyn Transcriber>,
    delay: Duration,
    segments: AtomicUsize,
}

impl Transcriber for Counting {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn frame_duration_s(&self) -> f64 {
        self.inner.frame_duration_s()
    }
    fn transcribe(&self, segments: &[&[f32]]) -> dispatcher::error::Result<Vec<Transcript>> {
        std::thread::sleep(self.delay);
        self.segments.fetch_add(segments.len(), Ordering::SeqCst);
        self.inner.transcribe(segments)
    }
}

const STEM: &str = "lecture";

/// Puts `audio` in as `long/lecture.wav` and enqueues one job for it.
async fn enqueue(backend: &Backend, audio: &[u8]) {
    let key = format!("long/{STEM}.wav");
    backend.put_input(&key, audio).await;
    let message = JobMessage::new("lecture-1", &backend.input(&key));
    backend
        .send(&serde_json::to_string(&message).expect("json"))
        .await;
}

/// The recording as these settings cut it.
fn decoded(audio: &[u8], settings: &Settings) -> Decoded {
    decode_segments(audio, Some("wav"), &app::audio_settings(settings)).expect("decode")
}

/// What an uninterrupted run writes as `transcript.verbose.json` for this recording (segments
/// and words with their times and scores).
fn uninterrupted_json(decoded: &Decoded) -> serde_json::Value {
    let result = transcribe_recording(
        common::engine().as_ref(),
        None,
        decoded,
        1,
        Priority::Batch,
        None,
    )
    .expect("transcribe");
    let options = RenderOptions {
        file_id: Some(STEM.into()),
        ..RenderOptions::default()
    };
    let text = render::render_with(OutputFormat::VerboseJson, &result.transcript, &options)
        .expect("render");
    serde_json::from_str(&text).expect("json")
}

/// The one result's `transcript.verbose.json`, and how many checkpoints its directory holds.
async fn result(backend: &Backend) -> (serde_json::Value, usize) {
    let (manifests, failures) = records(backend).await;
    assert_eq!((manifests.len(), failures.len()), (1, 0));
    let dir = manifests[0].trim_end_matches("manifest.json");
    let keys = backend.output_keys().await;
    let checkpoints = keys
        .iter()
        .filter(|k| k.starts_with(dir) && k[dir.len()..].starts_with("ckpt-"))
        .count();
    let json = backend.read(&format!("{dir}transcript.verbose.json")).await;
    (serde_json::from_slice(&json).expect("json"), checkpoints)
}

/// A job that outlives its lease's cap: it stops at a checkpoint boundary, its message is
/// released, and the next delivery resumes after what was saved, until it is done.
async fn a_job_past_its_lease_cap_resumes_from_its_checkpoints(backend: Backend) {
    // About 42 s of speech, cut at quiet points into pieces of at most 5 s, in checkpoints
    // of at most 8 s.
    let audio = common::repeat_wav(&clip("espeak_us.wav"), 12);
    enqueue(&backend, &audio).await;
    let settings = common::settings(&backend, |s| {
        s.receivers = Some(1);
        s.max_in_flight = Some(1);
        s.segments_per_call = Some(1);
        s.visibility_timeout_s = Some(1);
        s.max_segment_s = Some(5.0);
        s.checkpoint_every_s = Some(8.0);
    });
    let decoded = decoded(&audio, &settings);
    let runs = checkpoint_runs(&decoded.segments, 8 * 16_000);
    assert!(runs.len() >= 4, "{} checkpoints", runs.len());

    let counting = Arc::new(Counting {
        inner: common::engine(),
        delay: Duration::from_millis(300),
        segments: AtomicUsize::new(0),
    });
    let metrics = MetricsRuntime::start(&settings, None)
        .await
        .expect("metrics");
    let sizing = Sizing::for_host(&settings, counting.capacity());
    let pipeline = Pipeline::new(
        backend.store.clone(),
        counting.clone(),
        metrics.metrics.clone(),
        app::pipeline_settings(&settings, &sizing).expect("pipeline settings"),
    )
    .expect("pipeline");
    let mut consumer_settings = app::consumer_settings(&settings, &sizing, true);
    // The whole job takes several times this (300 ms per segment).
    consumer_settings.visibility_cap = Duration::from_secs(3);
    let consumer = Arc::new(Consumer::new(
        backend.queue.clone(),
        Arc::new(pipeline),
        consumer_settings,
    ));
    let summary = tokio::time::timeout(
        Duration::from_secs(120),
        consumer.run(CancellationToken::new()),
    )
    .await
    .expect("done within 120 s");
    metrics.shutdown().await;

    assert_eq!(summary.done, 1, "{summary:?}");
    assert!(summary.released >= 1, "stopped at the cap: {summary:?}");
    assert_eq!(
        counting.segments.load(Ordering::SeqCst),
        decoded.segments.len(),
        "every segment transcribed once across the attempts"
    );
    let (json, checkpoints) = result(&backend).await;
    assert_eq!(checkpoints, runs.len());
    assert_eq!(json, uninterrupted_json(&decoded));
    assert_eq!(backend.pending().await, 0);
    assert!(backend.dead_letters().await.is_empty());
}
both_backends!(a_job_past_its_lease_cap_resumes_from_its_checkpoints, 10);

/// Runs the `dispatcher` binary on the backend's queue with `flags`, kills it (SIGKILL) once it
/// has saved a checkpoint, then runs it again until the queue is empty; returns the second
/// run's log, which must say that it resumed.
async fn kill_after_a_checkpoint_and_resume(backend: &Backend, flags: &[&str]) -> String {
    let spawn = |extra: &[&str], log_name: &str| {
        let log = backend.dir.path().join(log_name);
        let child = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(backend.cli_args())
            .arg("--model")
            .arg(fixture_model_path())
            .args(["--wait-time-s", "1", "--receivers", "1"])
            .args(["--visibility-timeout-s", "2"])
            .args(flags)
            .args(extra)
            .envs(backend.cli_env())
            .env("RUST_LOG", "info,dispatcher::checkpoint=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn dispatcher");
        (child, log)
    };
    let local = backend.name() == "local";
    let (mut child, log) = spawn(if local { &["--follow"] } else { &[] }, "first.log");
    let deadline = Instant::now() + Duration::from_secs(300);
    let first_log = || std::fs::read_to_string(&log).unwrap_or_default();
    while !first_log().contains("checkpoint saved") {
        assert!(
            Instant::now() < deadline,
            "no checkpoint saved within 300 s:\n{}",
            first_log()
        );
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!(
                "dispatcher exited before it was killed ({status}):\n{}",
                first_log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert_eq!(records(backend).await.0.len(), 0, "killed mid-job");

    let (mut child, log) = spawn(
        if local { &[] } else { &["--exit-when-idle"] },
        "second.log",
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{text}");
    assert!(
        text.contains("resumed after the checkpoints"),
        "{}\n---\n{text}",
        first_log()
    );
    assert_eq!(backend.pending().await, 0);
    assert!(backend.dead_letters().await.is_empty());
    text
}

/// `dispatcher` killed after its first checkpoint: the next process resumes after what was
/// saved and writes the uninterrupted result.
async fn a_killed_job_resumes_after_its_last_checkpoint(backend: Backend) {
    // About 8 minutes of speech in checkpoints of at most 20 s (the fixture model takes about
    // a second for all of it on one core: the kill after the first comes well before the end).
    let audio = common::repeat_wav(&clip("long.wav"), 20);
    enqueue(&backend, &audio).await;
    let flags = ["--max-segment-s", "10", "--checkpoint-every-s", "20"];
    kill_after_a_checkpoint_and_resume(&backend, &flags).await;
    let settings = common::settings(&backend, |s| s.max_segment_s = Some(10.0));
    let decoded = decoded(&audio, &settings);
    let runs = checkpoint_runs(&decoded.segments, 20 * 16_000);
    let (json, checkpoints) = result(&backend).await;
    assert_eq!(checkpoints, runs.len());
    assert_eq!(json, uninterrupted_json(&decoded));
}
both_backends!(a_killed_job_resumes_after_its_last_checkpoint, 4);

/// Ten hours in one recording, checkpoints of an hour (the default), killed after its first
/// and resumed: it completes, and the transcript spans the whole recording in order. Segments of
/// 60 s: at the default 24 minutes the CPU engine's full attention takes about 15 minutes over
/// ten hours (docs/operations.md). The local backend only (moto would hold the 1.15 GB input in
/// memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_hour_recording_completes_across_a_kill() {
    let backend = Backend::local(4).await;
    let hour = common::repeat_wav(&clip("long.wav"), 146);
    let audio = common::repeat_wav(&hour, 10);
    drop(hour);
    enqueue(&backend, &audio).await;
    drop(audio);
    kill_after_a_checkpoint_and_resume(&backend, &["--max-segment-s", "60"]).await;
    let (json, checkpoints) = result(&backend).await;
    assert!(checkpoints >= 9, "{checkpoints} checkpoints");
    let duration = json["duration"].as_f64().expect("duration");
    assert!(duration > 36_000.0, "{duration}");
    let starts: Vec<f64> = json["words"]
        .as_array()
        .expect("words")
        .iter()
        .map(|w| w["start"].as_f64().expect("start"))
        .collect();
    assert!(starts.len() > 10_000, "{} words", starts.len());
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "words in order");
    let last = json["words"][starts.len() - 1]["end"]
        .as_f64()
        .expect("end");
    assert!(
        last > 35_000.0 && last <= duration,
        "the last word ends at {last} s"
    );
}
