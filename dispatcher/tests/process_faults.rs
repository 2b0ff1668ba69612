//! The dispatcher binary under signals: SIGKILL mid-job (the message comes back and the job
//! completes once) and SIGTERM (stop receiving, finish in-flight work, exit cleanly). Both
//! backends, the real fixture model.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{clip, fixture_model_path, records, Backend};
use dispatcher::job::JobMessage;

fn spawn(backend: &Backend, extra: &[&str], log_name: &str) -> (Child, std::path::PathBuf) {
    let log = backend.dir.path().join(log_name);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dispatcher"));
    cmd.args(backend.cli_args())
        .arg("--model")
        .arg(fixture_model_path())
        .args(["--wait-time-s", "1", "--receivers", "1"])
        .args(extra)
        .envs(backend.cli_env())
        .env("RUST_LOG", "info,dispatcher::pipeline=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    (cmd.spawn().expect("spawn dispatcher"), log)
}

fn wait_for_log(log: &std::path::Path, needle: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`{needle}` not logged within {within:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dispatcher did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Loop mode for the backend: keep running (local `--follow`; `run` never exits by itself).
fn follow(backend: &Backend) -> Vec<&'static str> {
    match backend.name() {
        "local" => vec!["--follow"],
        _ => vec![],
    }
}

fn until_idle(backend: &Backend) -> Vec<&'static str> {
    match backend.name() {
        "local" => vec![],
        _ => vec!["--exit-when-idle"],
    }
}

async fn enqueue_long_job(backend: &Backend) {
    // About 5 minutes of speech: long enough to be caught mid-job on the CPU engine.
    let audio = common::repeat_wav(&clip("long.wav"), 10);
    backend.put_input("long/consult.wav", &audio).await;
    let msg = JobMessage::new("long-1", &backend.input("long/consult.wav"));
    backend
        .send(&serde_json::to_string(&msg).expect("json"))
        .await;
}

async fn sigkill_mid_job_is_redelivered_and_completed_once(backend: Backend) {
    enqueue_long_job(&backend).await;
    let mut args = follow(&backend);
    args.extend(["--visibility-timeout-s", "2"]);
    let (mut child, log) = spawn(&backend, &args, "first.log");
    wait_for_log(&log, "job started", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert_eq!(
        records(&backend).await.0.len(),
        0,
        "killed before the result was written"
    );

    let mut args = until_idle(&backend);
    args.extend(["--visibility-timeout-s", "2"]);
    let (mut child, log) = spawn(&backend, &args, "second.log");
    let status = wait_exit(&mut child, Duration::from_secs(120));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "second run failed:\n{text}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!((manifests.len(), failures.len()), (1, 0), "{text}");
    assert_eq!(backend.pending().await, 0);
    assert!(backend.dead_letters().await.is_empty());
}
both_backends!(sigkill_mid_job_is_redelivered_and_completed_once, 4);

async fn sigterm_drains_in_flight_work(backend: Backend) {
    enqueue_long_job(&backend).await;
    let mut args = follow(&backend);
    args.extend(["--visibility-timeout-s", "3", "--drain-grace-s", "120"]);
    let (mut child, log) = spawn(&backend, &args, "drain.log");
    wait_for_log(&log, "job started", Duration::from_secs(60));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(killed.success());
    let status = wait_exit(&mut child, Duration::from_secs(150));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{text}");
    assert!(text.contains("stop signal received"), "{text}");
    // The in-flight job finished during the drain and its message was deleted.
    assert_eq!(records(&backend).await.0.len(), 1, "{text}");
    assert_eq!(backend.pending().await, 0, "{text}");
}
both_backends!(sigterm_drains_in_flight_work, 4);
