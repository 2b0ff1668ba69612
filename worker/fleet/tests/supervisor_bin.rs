//! The standalone `fleet` binary with two real CPU workers: JSON events on stdout, `/health`
//! and `/metrics`, a SIGKILLed worker restarted with its cause, SIGTERM stops everything and
//! exits 0.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/tests/fixtures/tdt-real-options/model.nemo")
}

/// `target/<profile>/worker`, built on demand when only this package was built.
fn worker_binary() -> Result<PathBuf> {
    let path = Path::new(env!("CARGO_BIN_EXE_fleet")).with_file_name("worker");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "worker", "--bin", "worker"])
            .status()?;
        ensure!(status.success(), "building the worker binary");
    }
    Ok(path)
}

fn signal(pid: u32, sig: Signal) -> Result<()> {
    kill_process(Pid::from_raw(pid as i32).context("pid")?, sig)?;
    Ok(())
}

fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: fleet\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_owned()))
}

/// The next event matching `want` within `timeout` (others are skipped).
fn next_event(
    events: &mpsc::Receiver<Value>,
    timeout: Duration,
    want: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = events.recv_timeout(left).context("no such event in time")?;
        if want(&event) {
            return Ok(event);
        }
    }
}

fn is(event: &Value, name: &str) -> bool {
    event["event"] == name
}

#[test]
fn supervisor_reports_restarts_serves_health_and_stops_on_sigterm() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["--engine", "cpu", "--cpu-instances", "2"])
        .arg("--model")
        .arg(model_path())
        .arg("--worker-binary")
        .arg(worker_binary()?)
        .arg("--runtime-dir")
        .arg(dir.path())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--worker-arg=--max-batch-wait-ms=10")
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, events) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => {
                    let _ = tx.send(v);
                }
                Err(e) => panic!("stdout line is not JSON ({e}): {line}"),
            }
        }
    });
    let result = (|| -> Result<()> {
        let listening = next_event(&events, Duration::from_secs(30), |e| is(e, "listening"))?;
        let addr = listening["addr"].as_str().context("addr")?.to_owned();
        let mut pids = Vec::new();
        for _ in 0..2 {
            let ready = next_event(&events, Duration::from_secs(120), |e| is(e, "worker_ready"))?;
            assert_eq!(ready["group"], "cpu");
            assert_eq!(ready["engine"], "cpu");
            assert!(ready["device"].is_null());
            pids.push(ready["pid"].as_u64().context("pid")? as u32);
        }
        let (status, body) = http_get(&addr, "/health")?;
        assert_eq!(status, 200, "{body}");
        let health: Value = serde_json::from_str(&body)?;
        assert_eq!(health["healthy"], true);
        assert_eq!(health["groups"][0]["ready"], 2);
        assert_eq!(health["workers"].as_array().map(Vec::len), Some(2));
        let (status, metrics) = http_get(&addr, "/metrics")?;
        assert_eq!(status, 200);
        assert!(
            metrics.contains("fleet_worker_ready{group=\"cpu\",task=\"transcribe\",slot=\"1\"} 1"),
            "{metrics}"
        );

        signal(pids[0], Signal::KILL)?;
        let restart = next_event(&events, Duration::from_secs(10), |e| {
            is(e, "worker_restart")
        })?;
        assert_eq!(restart["cause"], "crashed");
        assert_eq!(restart["pid"].as_u64(), Some(u64::from(pids[0])));
        let replaced = next_event(&events, Duration::from_secs(120), |e| is(e, "worker_ready"))?;
        assert_ne!(replaced["pid"].as_u64(), Some(u64::from(pids[0])));
        pids.push(replaced["pid"].as_u64().context("pid")? as u32);
        let (_, metrics) = http_get(&addr, "/metrics")?;
        assert!(
            metrics.contains(
                "fleet_restarts_total{group=\"cpu\",task=\"transcribe\",cause=\"crashed\"} 1"
            ),
            "{metrics}"
        );

        signal(child.id(), Signal::TERM)?;
        next_event(&events, Duration::from_secs(20), |e| is(e, "stopped"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                bail!("fleet did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "exit status {status}");
        for pid in &pids[1..] {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "worker {pid} still running"
            );
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    result
}

/// `fleet --diar-model`: one diarization worker next to the transcription worker, announced
/// with its task, counted in `/health` and labelled in `/metrics`.
#[test]
fn the_binary_runs_a_diarization_pool_beside_the_transcribers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sortformer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/tests/fixtures/sortformer-tiny/model.nemo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["--engine", "cpu", "--cpu-instances", "1"])
        .arg("--model")
        .arg(model_path())
        .arg("--diar-model")
        .arg(sortformer)
        .args(["--diar-workers-per-gpu", "1"])
        .arg("--worker-binary")
        .arg(worker_binary()?)
        .arg("--runtime-dir")
        .arg(dir.path())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, events) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let result = (|| -> Result<()> {
        let listening = next_event(&events, Duration::from_secs(30), |e| is(e, "listening"))?;
        let addr = listening["addr"].as_str().context("addr")?.to_owned();
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let ready = next_event(&events, Duration::from_secs(120), |e| is(e, "worker_ready"))?;
            tasks.push(ready["task"].as_str().context("task")?.to_owned());
        }
        tasks.sort();
        assert_eq!(tasks, ["diarize", "transcribe"]);
        let (status, body) = http_get(&addr, "/health")?;
        assert_eq!(status, 200, "{body}");
        let health: Value = serde_json::from_str(&body)?;
        assert_eq!(health["groups"][0]["ready"], 1, "{health}");
        assert_eq!(health["groups"][0]["diarization_ready"], 1, "{health}");
        let (_, metrics) = http_get(&addr, "/metrics")?;
        assert!(
            metrics.contains("fleet_worker_ready{group=\"cpu\",task=\"diarize\",slot=\"1\"} 1"),
            "{metrics}"
        );
        signal(child.id(), Signal::TERM)?;
        next_event(&events, Duration::from_secs(20), |e| is(e, "stopped"))?;
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    result
}

#[test]
fn version_is_printed() {
    let output = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("--version")
        .output()
        .expect("spawn fleet");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        text.trim(),
        format!("fleet {}", env!("CARGO_PKG_VERSION")),
        "{text}"
    );
}

/// Workers that cannot start (here: the model file does not exist) are not restarted forever:
/// after `--max-start-failures` tries each the fleet exits non-zero with the worker's own error.
#[test]
fn a_fleet_whose_workers_cannot_start_gives_up_with_their_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("no-such-model.nemo");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args([
            "--engine",
            "cpu",
            "--cpu-instances",
            "2",
            "--max-start-failures",
            "3",
        ])
        .arg("--model")
        .arg(&missing)
        .arg("--worker-binary")
        .arg(worker_binary()?)
        .arg("--runtime-dir")
        .arg(dir.path())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the fleet should give up:\n{stderr}");
    ensure!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    let verdict = stderr
        .lines()
        .find(|l| l.starts_with("error: no worker could start (3 tries each)"))
        .unwrap_or_default();
    ensure!(
        verdict.contains("no-such-model.nemo"),
        "the fleet's error should carry the worker's:\n{stderr}"
    );
    Ok(())
}
