//! The supervisor with real CPU workers: kill -9 mid-batch and SIGSTOP lose nothing and leave
//! the other workers alone; the transcriber equals the in-process CPU engine.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};
use common::{clips, model_path, reference, wait_until, worker_binary};
use model_core::timestamps::Timestamper;
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

/// Answers MPS control commands like one daemon per pipe directory, each with server 4242
/// whose clients are the pids the test registers for that directory; records every command.
#[derive(Default)]
struct RecordingMps {
    commands: std::sync::Mutex<Vec<worker_fleet::mps::CommandSpec>>,
    clients: std::sync::Mutex<std::collections::HashMap<String, Vec<u32>>>,
}

fn pipe_of(command: &worker_fleet::mps::CommandSpec) -> String {
    command
        .env
        .iter()
        .find(|(k, _)| k == "CUDA_MPS_PIPE_DIRECTORY")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

impl worker_fleet::mps::MpsControl for RecordingMps {
    fn run(
        &self,
        command: &worker_fleet::mps::CommandSpec,
    ) -> Result<String, worker_fleet::FleetError> {
        self.commands
            .lock()
            .expect("not poisoned")
            .push(command.clone());
        let line = command.stdin.as_deref().unwrap_or("").trim().to_owned();
        Ok(match line.as_str() {
            "get_server_list" => "4242\n".into(),
            "get_client_list 4242" => self
                .clients
                .lock()
                .expect("not poisoned")
                .get(&pipe_of(command))
                .map(|pids| pids.iter().map(|p| format!("{p}\n")).collect())
                .unwrap_or_default(),
            _ => String::new(),
        })
    }
}

impl RecordingMps {
    /// `(pipe directory, stdin line or args)` of every command so far.
    fn lines(&self) -> Vec<(String, String)> {
        self.commands
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|c| {
                let what = match &c.stdin {
                    Some(s) => s.trim().to_owned(),
                    None => c.args.join(" "),
                };
                (pipe_of(c), what)
            })
            .collect()
    }
}

/// Issue 7's domain logic on CPU workers standing in for two GPUs: each GPU gets its own MPS
/// directories and daemon (GPU 1's is found running and left alone), and a stuck worker on
/// GPU 0 gets `terminate_client` on GPU 0's daemon, then GPU 0's whole group restarts while
/// GPU 1's workers keep their processes. Nothing is lost.
#[test]
fn a_fault_on_gpu0_restarts_only_gpu0s_mps_group() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    let mps = worker_fleet::mps::MpsConfig {
        pipe_root: dir.path().join("mps/pipe"),
        log_root: dir.path().join("mps/log"),
        active_thread_percentage: None,
    };
    let (pipe0, pipe1) = (mps.dirs(0).pipe, mps.dirs(1).pipe);
    std::fs::create_dir_all(&pipe1)?;
    std::fs::write(pipe1.join("control"), b"")?; // GPU 1's daemon is already running
    let mut cfg = config(dir.path(), 1);
    cfg.groups = worker_fleet::gpu_groups(&[0, 1], 2, Some(&mps))?;
    let recorder = std::sync::Arc::new(RecordingMps::default());
    let (events_tx, events) = std::sync::mpsc::channel();
    let fleet = Fleet::start_with(
        cfg,
        worker_fleet::FleetHooks {
            mps: recorder.clone(),
            events: Some(events_tx),
        },
    )?;
    let (p0, p1) = (pipe0.display().to_string(), pipe1.display().to_string());
    assert_eq!(
        recorder.lines(),
        vec![(p0.clone(), "-d".to_string())],
        "one daemon started, for GPU 0 only"
    );
    assert!(
        pipe0.is_dir() && mps.dirs(0).log.is_dir(),
        "GPU 0's own dirs"
    );
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let before = fleet.status();
    let pids = |group: &str, status: &[worker_fleet::WorkerStatus]| -> Vec<Option<u32>> {
        status
            .iter()
            .filter(|w| w.group == group)
            .map(|w| w.pid)
            .collect()
    };
    let (gpu0_before, gpu1_before) = (pids("gpu0", &before), pids("gpu1", &before));
    assert_eq!((gpu0_before.len(), gpu1_before.len()), (2, 2));
    for (pipe, group) in [(&p0, "gpu0"), (&p1, "gpu1")] {
        let clients = pids(group, &before).into_iter().flatten().collect();
        recorder
            .clients
            .lock()
            .expect("not poisoned")
            .insert(pipe.clone(), clients);
    }
    let stuck = gpu0_before[0].expect("running");
    signal(stuck, Signal::STOP);

    let work: Vec<&[f32]> = (0..clips.len() * 3)
        .map(|i| clips[i % clips.len()].1.as_slice())
        .collect();
    for (i, r) in fleet.transcribe(&work).into_iter().enumerate() {
        assert_eq!(r?.hypothesis, expected[i % clips.len()], "request {i}");
    }
    ensure!(
        wait_until(Duration::from_secs(15), || fleet
            .restarts(RestartCause::Stuck)
            >= 1),
        "the stopped worker was never declared stuck"
    );
    fleet.wait_all_ready(Duration::from_secs(60))?;
    let after = fleet.status();
    assert_eq!(
        pids("gpu1", &after),
        gpu1_before,
        "GPU 1's workers kept running"
    );
    assert!(after
        .iter()
        .filter(|w| w.group == "gpu1")
        .all(|w| w.restarts == 0));
    let gpu0_after = pids("gpu0", &after);
    assert!(
        gpu0_after.iter().zip(&gpu0_before).all(|(a, b)| a != b),
        "both GPU 0 workers replaced: {gpu0_before:?} -> {gpu0_after:?}"
    );
    assert!(fleet.restarts(RestartCause::Group) >= 1);

    // terminate_client on GPU 0's daemon for both of its (live) clients, before the kill;
    // nothing sent to GPU 1's daemon.
    let lines = recorder.lines();
    let terminated: Vec<&String> = lines
        .iter()
        .filter(|(_, l)| l.starts_with("terminate_client"))
        .map(|(pipe, l)| {
            assert_eq!(pipe, &p0, "{l} went to GPU 0's daemon");
            l
        })
        .collect();
    let peer = gpu0_before[1].expect("running");
    // (A loaded machine may add later restarts; the first one is the stuck worker's.)
    assert_eq!(
        terminated[..2],
        [
            &format!("terminate_client 4242 {stuck}"),
            &format!("terminate_client 4242 {peer}")
        ]
    );
    assert!(lines.iter().all(|(pipe, _)| pipe != &p1), "{lines:?}");
    // Fault-free readiness: handshakes report the CPU engine and no device.
    assert!(after
        .iter()
        .all(|w| w.engine.as_deref() == Some("cpu") && w.device.is_none()));

    drop(fleet);
    let lines = recorder.lines();
    assert_eq!(
        lines.last(),
        Some(&(p0.clone(), "quit".to_string())),
        "the daemon it started is stopped"
    );
    let events: Vec<worker_fleet::FleetEvent> = events.try_iter().collect();
    let restarted_groups: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match e {
            worker_fleet::FleetEvent::WorkerRestart { group, .. } => Some(group.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        restarted_groups.into_iter().collect::<Vec<_>>(),
        vec!["gpu0"]
    );
    assert!(events.contains(&worker_fleet::FleetEvent::MpsDaemon {
        gpu: 1,
        pipe_directory: p1.clone(),
        log_directory: mps.dirs(1).log.display().to_string(),
        started: false,
    }));
    assert!(events.iter().any(|e| matches!(
        e,
        worker_fleet::FleetEvent::WorkerReady {
            group,
            assigned_thread_percentage: Some(50),
            ..
        } if group == "gpu1"
    )));
    assert_eq!(events.last(), Some(&worker_fleet::FleetEvent::Stopped));
    Ok(())
}

/// Workers that keep failing to start under MPS (here: CPU workers standing in for a GPU
/// group, with a model that does not exist) get their GPU's daemon restarted once (`quit`,
/// then `-d`), and when that does not help the fleet gives up with the worker's own error
/// instead of restarting them forever.
#[test]
fn failing_starts_restart_the_mps_daemon_then_the_fleet_gives_up() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mps = worker_fleet::mps::MpsConfig {
        pipe_root: dir.path().join("mps/pipe"),
        log_root: dir.path().join("mps/log"),
        active_thread_percentage: None,
    };
    let mut cfg = config(dir.path(), 1);
    cfg.model = dir.path().join("no-such-model.nemo");
    cfg.groups = worker_fleet::gpu_groups(&[0], 2, Some(&mps))?;
    cfg.max_start_failures = 3;
    let recorder = std::sync::Arc::new(RecordingMps::default());
    let (events_tx, events) = std::sync::mpsc::channel();
    let fleet = Fleet::start_with(
        cfg,
        worker_fleet::FleetHooks {
            mps: recorder.clone(),
            events: Some(events_tx),
        },
    )?;
    let error = fleet
        .wait_ready(Duration::from_secs(60))
        .expect_err("no worker can start");
    let text = error.to_string();
    assert!(
        matches!(
            error,
            worker_fleet::FleetError::WorkersCannotStart { tries: 3, .. }
        ) && text.contains("no-such-model.nemo"),
        "{text}"
    );
    let pipe = mps.dirs(0).pipe.display().to_string();
    let daemon: Vec<String> = recorder
        .lines()
        .into_iter()
        .filter(|(p, _)| *p == pipe)
        .map(|(_, line)| line)
        .collect();
    assert_eq!(daemon, ["-d", "quit", "-d"], "started, then restarted once");
    let events: Vec<worker_fleet::FleetEvent> = events.try_iter().collect();
    assert!(
        events.contains(&worker_fleet::FleetEvent::MpsDaemonRestarted {
            gpu: 0,
            error: None
        })
    );
    // Requests are refused with the same error, not queued for workers that will not come.
    let refused = fleet.transcribe(&[&[0.0f32; 1600][..]]);
    assert!(matches!(
        refused.as_slice(),
        [Err(worker_fleet::FleetError::WorkersCannotStart { .. })]
    ));
    Ok(())
}
