//! A fleet with a diarization pool next to its transcription workers (CPU workers on the tiny
//! fixtures): each kind of request reaches only its kind of worker and equals the in-process
//! models; killing a diarization worker of an MPS-style group restarts the whole group (the
//! transcription worker too, as all are clients of one daemon) and re-sends what it held.

mod common;

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};
use common::{
    clips, model_path, reference, sortformer_path, three_speakers, wait_until, worker_binary,
};
use models::sortformer::SortformerModel;
use rustix::process::{kill_process, Pid, Signal};
use worker_fleet::{DiarizationPool, Fleet, FleetConfig, RestartCause, Task, WorkerStatus};

fn config(dir: &Path, transcribers: usize, diarizers: usize) -> FleetConfig {
    let mut cfg = FleetConfig::cpu(worker_binary(), model_path(), dir.to_owned(), transcribers);
    cfg.health_interval = Duration::from_millis(100);
    cfg.health_timeout = Duration::from_secs(3);
    cfg.request_timeout = Duration::from_secs(60);
    cfg.startup_timeout = Duration::from_secs(60);
    cfg.restart_backoff.initial = Duration::from_millis(50);
    cfg.worker_args = vec!["--max-batch-wait-ms".into(), "20".into()];
    cfg.diarization = Some(DiarizationPool {
        model: sortformer_path(),
        engine: worker_protocol::EngineKind::Cpu,
        instances: diarizers,
        mps_thread_percentage: 12,
    });
    cfg
}

fn of_task(status: &[WorkerStatus], task: Task) -> Vec<&WorkerStatus> {
    status.iter().filter(|w| w.task == task).collect()
}

#[test]
fn a_fleet_with_both_pools_diarizes_and_transcribes() -> Result<()> {
    let clips = clips()?;
    let (_, expected_hyps) = reference(&clips)?;
    let pcm = three_speakers()?;
    let expected_segments = SortformerModel::load(&sortformer_path())?.diarize(&pcm)?;
    let dir = tempfile::tempdir()?;
    let fleet = Fleet::start(config(dir.path(), 1, 2))?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let status = fleet.status();
    assert_eq!(of_task(&status, Task::Transcribe).len(), 1);
    assert_eq!(of_task(&status, Task::Diarize).len(), 2);
    let model = fleet.wait_ready(Duration::from_secs(1))?;
    assert!(
        !model.vocabulary.is_empty(),
        "the transcription model's handshake"
    );

    // Both kinds at once, from several threads: each request lands on its own kind.
    std::thread::scope(|scope| -> Result<()> {
        let diarized: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| fleet.diarize(pcm.clone().into())))
            .collect();
        let work: Vec<&[f32]> = clips.iter().map(|(_, pcm)| pcm.as_slice()).collect();
        for (i, r) in fleet.transcribe(&work).into_iter().enumerate() {
            assert_eq!(r?.hypothesis, expected_hyps[i], "clip {}", clips[i].0);
        }
        for handle in diarized {
            let response = handle.join().map_err(|_| anyhow::anyhow!("panicked"))??;
            assert_eq!(response.segments, expected_segments);
        }
        Ok(())
    })?;

    let health = fleet.health();
    assert!(health.healthy);
    assert_eq!(health.groups[0].diarization_ready, 2);
    let metrics = fleet.render_prometheus();
    for line in [
        "fleet_worker_ready{group=\"cpu\",task=\"diarize\",slot=\"2\"} 1",
        "fleet_batch_size_count{group=\"cpu\",task=\"diarize\"} 4",
        "fleet_batch_size_sum{group=\"cpu\",task=\"diarize\"} 4.0",
    ] {
        ensure!(
            metrics.lines().any(|l| l == line),
            "missing `{line}` in\n{metrics}"
        );
    }
    // No transcription answer was counted as diarization or the reverse.
    let transcribed = format!(
        "fleet_queue_wait_seconds_count{{group=\"cpu\",task=\"transcribe\"}} {}",
        clips.len()
    );
    ensure!(metrics.lines().any(|l| l == transcribed), "{metrics}");
    Ok(())
}

#[test]
fn killing_a_diarization_worker_restarts_its_mps_group_and_resends() -> Result<()> {
    let pcm = three_speakers()?;
    let expected = SortformerModel::load(&sortformer_path())?.diarize(&pcm)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path(), 1, 1);
    // An MPS group without a GPU: no daemon, but the group-restart rule applies.
    cfg.groups[0].mps = Some(worker_fleet::mps::MpsConfig {
        pipe_root: dir.path().join("mps-pipe"),
        log_root: dir.path().join("mps-log"),
        active_thread_percentage: None,
    });
    let (events_tx, events) = std::sync::mpsc::channel();
    let hooks = worker_fleet::FleetHooks {
        events: Some(events_tx),
        ..worker_fleet::FleetHooks::default()
    };
    let fleet = Fleet::start_with(cfg, hooks)?;
    fleet.wait_all_ready(Duration::from_secs(120))?;
    let before = fleet.status();
    let transcriber_before = of_task(&before, Task::Transcribe)[0].pid;
    let diarizer = of_task(&before, Task::Diarize)[0];
    let (victim, victim_slot) = (diarizer.pid.expect("running"), diarizer.slot);

    // Several recordings queue on the one diarization worker (it runs one at a time), so it
    // holds requests when it is killed.
    let results = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..6)
            .map(|_| scope.spawn(|| fleet.diarize(pcm.clone().into())))
            .collect();
        let held = wait_until(Duration::from_secs(30), || {
            fleet.status()[victim_slot].outstanding >= 2
        });
        let pid = Pid::from_raw(victim as i32).expect("positive pid");
        kill_process(pid, Signal::KILL).expect("signal delivered");
        let joined: Vec<_> = jobs.into_iter().map(|j| j.join()).collect();
        (held, joined)
    });
    let (held, joined) = results;
    ensure!(held, "the diarization worker never held requests");
    for (i, r) in joined.into_iter().enumerate() {
        let response = r.map_err(|_| anyhow::anyhow!("panicked"))??;
        assert_eq!(response.segments, expected, "recording {i}");
    }
    ensure!(
        wait_until(Duration::from_secs(10), || fleet
            .restarts(RestartCause::Group)
            >= 1),
        "the transcription worker of the group was not restarted"
    );
    assert!(fleet.restarts(RestartCause::Crashed) >= 1);
    fleet.wait_all_ready(Duration::from_secs(60))?;
    let after = fleet.status();
    assert_ne!(of_task(&after, Task::Diarize)[0].pid, Some(victim));
    assert_ne!(of_task(&after, Task::Transcribe)[0].pid, transcriber_before);
    // Still transcribing after the group restart.
    let clips = clips()?;
    let (_, expected_hyps) = reference(&clips[..1])?;
    let answer = fleet.transcribe(&[clips[0].1.as_slice()]).remove(0)?;
    assert_eq!(answer.hypothesis, expected_hyps[0]);

    let events: Vec<worker_fleet::FleetEvent> = events.try_iter().collect();
    assert!(events.iter().any(|e| matches!(
        e,
        worker_fleet::FleetEvent::WorkerRestart {
            task: Task::Diarize,
            cause: RestartCause::Crashed,
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(
        e,
        worker_fleet::FleetEvent::WorkerRestart {
            task: Task::Transcribe,
            cause: RestartCause::Group,
            ..
        }
    )));
    Ok(())
}

#[test]
fn a_fleet_without_a_diarization_pool_says_so() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(dir.path(), 1, 1);
    cfg.diarization = None;
    let fleet = Fleet::start(cfg)?;
    let err = fleet
        .diarize(vec![0.0; 1600].into())
        .expect_err("no diarization workers");
    assert!(matches!(err, worker_fleet::FleetError::Config(_)), "{err}");
    assert!(!fleet.has_diarization());
    Ok(())
}
