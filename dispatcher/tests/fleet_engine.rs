//! `--engine fleet`: the dispatcher's local mode through a 2-worker CPU fleet writes the same
//! transcripts as the in-process engine, and the fleet joins `/health` and `/metrics`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use dispatcher::fleet_engine::{EngineArgs, EngineChoice};
use tokio_util::sync::CancellationToken;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

fn model() -> PathBuf {
    fixtures().join("tdt-real-options/model.nemo")
}

/// `target/<profile>/worker`, built on demand when only this package was built.
fn worker_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_dispatcher")).with_file_name("worker");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "worker", "--bin", "worker"])
            .status()
            .expect("cargo");
        assert!(status.success(), "building the worker binary");
    }
    path
}

/// Every file under `dir`, by relative path.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(
                    rel.display().to_string(),
                    std::fs::read(&path).expect("read"),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn run_local(work: &Path, inputs: &Path, extra: &[&str]) -> (BTreeMap<String, Vec<u8>>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("local")
        .arg("--spool")
        .arg(work.join("spool"))
        .arg("--store")
        .arg(work.join("store"))
        .arg("--input-dir")
        .arg(inputs)
        .arg("--model")
        .arg(model())
        .args(extra)
        .output()
        .expect("spawn dispatcher");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    let n = std::fs::read_dir(inputs).expect("inputs").count();
    assert!(log.contains(&format!("done {n} ·")), "{log}");
    (files(&work.join("store/results")), log.into_owned())
}

#[test]
fn local_mode_through_a_cpu_fleet_writes_the_in_process_transcripts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir(&inputs).expect("mkdir");
    for entry in std::fs::read_dir(fixtures().join("clips")).expect("clips") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, inputs.join(path.file_name().expect("name"))).expect("copy");
    }
    let (in_process, log) = run_local(&dir.path().join("a"), &inputs, &[]);
    assert!(!log.contains("worker ready"), "{log}");
    let worker = worker_binary();
    let runtime = dir.path().join("fleet-run");
    let (fleet, log) = run_local(
        &dir.path().join("b"),
        &inputs,
        &[
            "--engine",
            "fleet",
            "--cpu-instances",
            "2",
            "--worker-binary",
            worker.to_str().expect("utf-8 path"),
            "--runtime-dir",
            runtime.to_str().expect("utf-8 path"),
            "--inference-slots",
            "2",
            "--worker-arg=--max-batch-wait-ms=10",
        ],
    );
    // Both workers served (the fleet logs each handshake).
    assert_eq!(log.matches("worker ready").count(), 2, "{log}");
    let keys = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&fleet), keys(&in_process), "same result keys");
    let mut transcripts = 0;
    for (key, bytes) in &in_process {
        // Manifests carry job ids and times; the transcripts themselves must be identical.
        if key.ends_with("manifest.json") {
            continue;
        }
        assert_eq!(
            String::from_utf8_lossy(&fleet[key]),
            String::from_utf8_lossy(bytes),
            "{key}"
        );
        transcripts += 1;
    }
    let clips = std::fs::read_dir(&inputs).expect("inputs").count();
    assert_eq!(transcripts, clips * 5, "five formats per clip");
}

#[test]
fn the_fleet_joins_health_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = EngineArgs {
        engine: EngineChoice::Fleet,
        worker_engine: "cpu".into(),
        fleet_ready_timeout_s: 120,
        fleet: worker_fleet::FleetOptions {
            cpu_instances: Some(2),
            worker_binary: Some(worker_binary()),
            runtime_dir: Some(dir.path().to_owned()),
            max_outstanding_per_worker: 8,
            request_timeout_s: 60,
            health_timeout_ms: 5000,
            startup_timeout_s: 60,
            ..Default::default()
        },
    };
    let engine = dispatcher::fleet_engine::load(&args, &model(), Some("fixture".into()))
        .expect("fleet engine");
    let pcm: Vec<f32> = (0..16_000)
        .map(|i| 0.1 * (i as f32 * 300.0 * std::f32::consts::TAU / 16_000.0).sin())
        .collect();
    let transcripts = engine
        .transcriber
        .transcribe(&[&pcm, &pcm])
        .expect("transcribed");
    assert_eq!(transcripts[0], transcripts[1]);
    assert_eq!(engine.transcriber.model_id(), "fixture");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (metrics, _rx) = dispatcher::metrics::Metrics::new(16);
        metrics.add_source(engine.metrics_source.clone().expect("fleet source"));
        let stop = CancellationToken::new();
        let healthy = Arc::new(AtomicBool::new(true));
        let addr = dispatcher::metrics::prometheus::serve(
            "127.0.0.1:0".parse().expect("addr"),
            metrics.clone(),
            healthy,
            stop.clone(),
        )
        .await
        .expect("listener");
        let text = http_get(addr, "/metrics").await;
        assert!(text.contains("dispatcher_jobs_total"), "{text}");
        assert!(
            text.contains("fleet_batch_size_count{group=\"cpu\",task=\"transcribe\"}"),
            "{text}"
        );
        assert!(
            text.contains("fleet_restarts_total{group=\"cpu\",task=\"transcribe\",cause=\"crashed\"} 0"),
            "{text}"
        );
        let health: serde_json::Value =
            serde_json::from_str(&http_get(addr, "/health").await).expect("health is JSON");
        assert_eq!(health["status"], "ok", "{health}");
        assert_eq!(health["fleet"]["any_ready"], true, "{health}");
        assert_eq!(
            health["fleet"]["workers"].as_array().map(Vec::len),
            Some(2),
            "{health}"
        );
        stop.cancel();
    });
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}
