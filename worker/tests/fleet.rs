//! The supervisor with real CPU workers: kill -9 mid-batch and SIGSTOP lose nothing and leave
//! the other workers alone; the transcriber equals the in-process CPU engine.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use common::{clips, model_path, reference, worker_binary};
use models::timestamps::Timestamper;
use rustix::process::{kill_process, Pid, Signal};
use worker_fleet::{Fleet, FleetConfig, FleetTranscriber, RestartCause};

fn config(dir: &Path, instances: usize) -> FleetConfig {
    let mut cfg = FleetConfig::cpu(worker_binary(), model_path(), dir.to_owned(), instances);
    cfg.health_interval = Duration::from_millis(100);
    cfg.health_timeout = Duration::from_secs(3);
    cfg.request_timeout = Duration::from_secs(60);
    cfg.startup_timeout = Duration::from_secs(60);
    cfg.restart_backoff.initial = Duration::from_millis(50);
    cfg.worker_args = vec!["--max-batch-wait-ms".into(), "20".into()];
    cfg
}

fn signal(pid: u32, sig: Signal) {
    let pid = Pid::from_raw(pid as i32).expect("positive pid");
    kill_process(pid, sig).expect("signal delivered");
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn kill_9_mid_batch_loses_nothing_and_spares_the_other_worker() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(config(dir.path(), 2))?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let before = fleet.status();
    let (victim, survivor) = (
        before[0].pid.expect("running"),
        before[1].pid.expect("running"),
    );

    let copies = 6;
    let work: Vec<&[f32]> = (0..clips.len() * copies)
        .map(|i| clips[i % clips.len()].1.as_slice())
        .collect();
    let results = std::thread::scope(|scope| {
        let job = scope.spawn(|| fleet.transcribe(&work));
        // Kill the first worker while it holds requests.
        let loaded = wait_until(Duration::from_secs(30), || {
            fleet.status()[0].outstanding > 0
        });
        signal(victim, Signal::KILL);
        (loaded, job.join())
    });
    let (loaded, joined) = results;
    ensure!(loaded, "worker 0 never held requests");
    let results = joined.map_err(|_| anyhow::anyhow!("transcribe panicked"))?;

    for (i, r) in results.into_iter().enumerate() {
        let r = r?;
        assert_eq!(r.hypothesis, expected[i % clips.len()], "request {i}");
    }
    assert!(fleet.restarts(RestartCause::Crashed) >= 1);
    assert_eq!(
        fleet.restarts(RestartCause::Group),
        0,
        "no MPS group: only the victim"
    );
    let after = fleet.status();
    assert_eq!(
        after[1].pid,
        Some(survivor),
        "the other worker was not touched"
    );
    assert_eq!(after[1].restarts, 0);
    assert!(after[0].restarts >= 1);
    fleet.wait_all_ready(Duration::from_secs(60))?;
    assert_ne!(fleet.status()[0].pid, Some(victim), "replaced");
    Ok(())
}

#[test]
fn stopped_worker_is_detected_and_replaced() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(config(dir.path(), 2))?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let stopped = fleet.status()[0].pid.expect("running");
    signal(stopped, Signal::STOP);

    let work: Vec<&[f32]> = clips.iter().map(|(_, pcm)| pcm.as_slice()).collect();
    for (i, r) in fleet.transcribe(&work).into_iter().enumerate() {
        assert_eq!(r?.hypothesis, expected[i], "clip {}", clips[i].0);
    }
    ensure!(
        wait_until(Duration::from_secs(10), || fleet
            .restarts(RestartCause::Stuck)
            >= 1),
        "the stopped worker was never declared stuck"
    );
    fleet.wait_all_ready(Duration::from_secs(60))?;
    let status = fleet.status();
    assert_ne!(status[0].pid, Some(stopped), "replaced by a new process");
    // SIGKILL reaches stopped processes: the old one is gone (reaped by the fleet).
    assert!(!Path::new(&format!("/proc/{stopped}")).exists());
    Ok(())
}

#[test]
fn fleet_transcriber_equals_the_in_process_engine() -> Result<()> {
    let clips = clips()?;
    let (model, expected) = reference(&clips)?;
    let timestamper = Timestamper::for_model(model.vocabulary(), model.config());
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(config(dir.path(), 1))?;
    let transcriber = FleetTranscriber::new(fleet, "fixture".into(), Duration::from_secs(120))?;
    assert_eq!(transcriber.model_id(), "fixture");
    assert_eq!(
        transcriber.frame_duration_s(),
        model.config().seconds_per_encoder_frame()
    );
    let segments: Vec<&[f32]> = clips.iter().map(|(_, pcm)| pcm.as_slice()).collect();
    let transcripts = transcriber.transcribe(&segments)?;
    for (i, t) in transcripts.iter().enumerate() {
        let want = timestamper.transcript(&expected[i], segments[i].len())?;
        assert_eq!(t, &want, "clip {}", clips[i].0);
    }
    Ok(())
}

/// A group marked as MPS without a GPU: no daemon and no CUDA environment, but the group
/// semantics apply, so a crash of one worker restarts both, and nothing is lost.
#[test]
fn mps_group_restarts_every_worker_on_one_failure() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path(), 2);
    cfg.groups[0].mps = Some(worker_fleet::mps::MpsConfig {
        pipe_root: dir.path().join("mps-pipe"),
        log_root: dir.path().join("mps-log"),
        active_thread_percentage: None,
    });
    let fleet = Fleet::start(cfg)?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let before: Vec<Option<u32>> = fleet.status().iter().map(|s| s.pid).collect();
    signal(before[0].expect("running"), Signal::KILL);
    let work: Vec<&[f32]> = clips.iter().map(|(_, pcm)| pcm.as_slice()).collect();
    for (i, r) in fleet.transcribe(&work).into_iter().enumerate() {
        assert_eq!(r?.hypothesis, expected[i], "clip {}", clips[i].0);
    }
    ensure!(
        wait_until(Duration::from_secs(10), || fleet
            .restarts(RestartCause::Group)
            >= 1),
        "the healthy worker of the group was not restarted"
    );
    fleet.wait_all_ready(Duration::from_secs(60))?;
    let after: Vec<Option<u32>> = fleet.status().iter().map(|s| s.pid).collect();
    assert_ne!(after[0], before[0]);
    assert_ne!(
        after[1], before[1],
        "group restart replaced the survivor too"
    );
    Ok(())
}

#[test]
fn model_loading_waits_for_the_load_lock() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path(), 2);
    let held = worker_fleet::LoadLock::try_acquire(&cfg.load_lock)?.expect("free");
    let fleet = Fleet::start(cfg)?;
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        fleet.status().iter().all(|s| s.pid.is_none()),
        "no worker spawned while another process loads"
    );
    drop(held);
    fleet.wait_all_ready(Duration::from_secs(120))?;
    Ok(())
}

#[test]
fn garbage_on_a_fleet_workers_socket_changes_nothing() -> Result<()> {
    use std::io::Write;
    let clips = clips()?;
    let (_, expected) = reference(&clips[..2])?;
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(config(dir.path(), 1))?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let pid = fleet.status()[0].pid;
    for junk in [
        &b"\xff\xff\xff\xffjunk"[..],
        b"\x00\x00\x00\x03abc",
        b"hello worker",
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(dir.path().join("cpu-0.sock"))?;
        s.write_all(junk)?;
    }
    let work: Vec<&[f32]> = clips[..2].iter().map(|(_, pcm)| pcm.as_slice()).collect();
    for (i, r) in fleet.transcribe(&work).into_iter().enumerate() {
        assert_eq!(r?.hypothesis, expected[i]);
    }
    assert_eq!(fleet.status()[0].pid, pid);
    assert_eq!(fleet.status()[0].restarts, 0);
    Ok(())
}

/// A request whose workers keep dying is failed, typed, after `max_attempts` losses instead of
/// being re-sent forever (here 1: the first loss); the rest are unaffected.
#[test]
fn requests_lost_max_attempts_times_fail_as_poison() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path(), 2);
    cfg.max_attempts = 1;
    let fleet = Fleet::start(cfg)?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let victim = fleet.status()[0].pid.expect("running");
    let work: Vec<&[f32]> = (0..clips.len() * 6)
        .map(|i| clips[i % clips.len()].1.as_slice())
        .collect();
    let (loaded, joined) = std::thread::scope(|scope| {
        let job = scope.spawn(|| fleet.transcribe(&work));
        let loaded = wait_until(Duration::from_secs(30), || {
            fleet.status()[0].outstanding > 0
        });
        signal(victim, Signal::KILL);
        (loaded, job.join())
    });
    ensure!(loaded, "worker 0 never held requests");
    let results = joined.map_err(|_| anyhow::anyhow!("transcribe panicked"))?;
    let mut poisoned = 0;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(r) => assert_eq!(r.hypothesis, expected[i % clips.len()], "request {i}"),
            Err(worker_fleet::FleetError::PoisonRequest { attempts: 1 }) => poisoned += 1,
            Err(e) => return Err(e.into()),
        }
    }
    assert!(
        poisoned >= 1,
        "the killed worker's requests were failed, not re-sent"
    );
    Ok(())
}
