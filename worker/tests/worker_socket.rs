//! The worker process through its socket: batched answers equal single-clip answers, garbage
//! and protocol misuse get typed errors without hurting the worker, unavailable engines fail.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::process::Command;

use anyhow::{bail, Result};
use common::{clips, reference, WorkerProcess};
use worker_protocol::{
    read_frame, write_frame, Audio, ClientMessage, TranscribeRequest, WireErrorKind, WorkerMessage,
    MAX_FRAME_BYTES,
};

fn transcribe_all(
    worker: &WorkerProcess,
    clips: &[(String, Vec<f32>)],
    copies: usize,
) -> Result<HashMap<u64, worker_protocol::TranscribeResponse>> {
    let mut stream = worker.connect()?;
    let n = clips.len() * copies;
    for id in 0..n {
        let request = TranscribeRequest {
            id: id as u64,
            audio: Audio::Pcm16k(clips[id % clips.len()].1.clone().into()),
            deadline_ms: None,
            priority: worker_protocol::Priority::Batch,
        };
        write_frame(&mut stream, &ClientMessage::Transcribe(request))?;
    }
    let mut answers = HashMap::new();
    while answers.len() < n {
        match read_frame::<WorkerMessage>(&mut stream)? {
            WorkerMessage::Result(r) => {
                answers.insert(r.id, r);
            }
            other => bail!("unexpected {other:?}"),
        }
    }
    Ok(answers)
}

#[test]
fn batched_answers_equal_each_clip_alone() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips)?;
    let dir = tempfile::tempdir()?;
    // A generous wait so the 24 requests form real batches.
    let worker = WorkerProcess::start(dir.path(), &["--max-batch-wait-ms", "300"])?;
    let answers = transcribe_all(&worker, &clips, 3)?;
    for (id, answer) in &answers {
        let clip = *id as usize % clips.len();
        assert_eq!(
            answer.hypothesis, expected[clip],
            "clip {} (request {id}) in a batch of {}",
            clips[clip].0, answer.timings.batch_size
        );
    }
    let largest = answers.values().map(|a| a.timings.batch_size).max();
    assert!(
        largest >= Some(4),
        "requests were batched (largest batch {largest:?})"
    );
    // Answers of one batch share its sequence number, size and frame totals: the members'
    // own frames (samples / 160 + 1) add up to `batch_frames`, padding is never negative.
    let mut batches: HashMap<u64, Vec<&worker_protocol::TranscribeResponse>> = HashMap::new();
    for answer in answers.values() {
        batches
            .entry(answer.timings.batch_seq)
            .or_default()
            .push(answer);
    }
    for (seq, members) in &batches {
        let t = members[0].timings;
        assert_eq!(members.len(), t.batch_size as usize, "batch {seq}");
        let own: u64 = members
            .iter()
            .map(|a| (clips[a.id as usize % clips.len()].1.len() / 160 + 1) as u64)
            .sum();
        assert_eq!(t.batch_frames, own, "batch {seq}");
        assert!(t.padded_frames >= t.batch_frames, "batch {seq}");
        assert!(members.iter().all(|a| a.timings.batch_frames == own));
    }
    Ok(())
}

#[test]
fn garbage_and_misuse_get_typed_errors_and_worker_keeps_serving() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips[..1])?;
    let dir = tempfile::tempdir()?;
    let mut worker = WorkerProcess::start(dir.path(), &[])?;

    // A lying length: refused without allocating, connection closed.
    let mut s = worker.send_raw(&(MAX_FRAME_BYTES + 1).to_be_bytes())?;
    assert!(matches!(
        read_frame::<WorkerMessage>(&mut s)?,
        WorkerMessage::Error { id: None, error } if error.kind == WireErrorKind::Malformed
    ));
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest)?, 0, "closed after the error");

    // Random bytes in a well-formed frame, and random bytes with no framing at all.
    let mut frame = 32u32.to_be_bytes().to_vec();
    frame.extend((0..32u8).map(|i| i.wrapping_mul(97).wrapping_add(13)));
    let mut s = worker.send_raw(&frame)?;
    assert!(matches!(
        read_frame::<WorkerMessage>(&mut s)?,
        WorkerMessage::Error { id: None, .. }
    ));
    drop(worker.send_raw(b"\x00\x00\x00\x05GET / HTTP/1.1\r\n\r\n")?);

    // A wrong version.
    let mut s = worker.send_raw(&[])?;
    write_frame(
        &mut s,
        &ClientMessage::Hello {
            version: 999,
            client: "old".into(),
        },
    )?;
    assert!(matches!(
        read_frame::<WorkerMessage>(&mut s)?,
        WorkerMessage::Error { id: None, error } if error.kind == WireErrorKind::VersionMismatch
    ));

    // Unusable audio is a per-request error; the connection goes on.
    let mut s = worker.connect()?;
    for (id, pcm) in [(1u64, vec![]), (2, vec![f32::NAN; 1600])] {
        let req = TranscribeRequest {
            id,
            audio: Audio::Pcm16k(pcm.into()),
            deadline_ms: None,
            priority: worker_protocol::Priority::Batch,
        };
        write_frame(&mut s, &ClientMessage::Transcribe(req))?;
        assert!(matches!(
            read_frame::<WorkerMessage>(&mut s)?,
            WorkerMessage::Error { id: Some(got), error }
                if got == id && error.kind == WireErrorKind::BadRequest
        ));
    }

    // Still alive, still right.
    assert!(worker.is_running());
    let answers = transcribe_all(&worker, &clips[..1], 1)?;
    assert_eq!(answers[&0].hypothesis, expected[0]);
    Ok(())
}

/// Whether this machine has a usable GPU (the CUDA cases below check what fits the machine).
fn has_gpu() -> bool {
    cuda_engine::CudaEngine::new(0).is_ok()
}

#[test]
fn unavailable_engine_fails_hard() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let engines: &[&str] = if has_gpu() {
        &["onnx"]
    } else {
        &["cuda", "onnx"]
    };
    for engine in engines.iter().copied() {
        // onnx: a missing ONNX Runtime must not turn into the CPU reference engine.
        let out = Command::new(common::worker_binary())
            .env_remove("ORT_DYLIB_PATH")
            .args(["serve", "--engine", engine, "--socket"])
            .arg(dir.path().join("w.sock"))
            .arg("--model")
            .arg(match engine {
                "onnx" => common::fixtures().join("tdt-real-options/onnx"),
                _ => common::model_path(),
            })
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{engine}: must not fall back");
        let why = if engine == "cuda" {
            "no CUDA device available"
        } else {
            "ORT_DYLIB_PATH"
        };
        assert!(stderr.contains(why), "{engine}: {stderr}");
        assert!(
            !dir.path().join("w.sock").exists(),
            "{engine}: never served"
        );
    }
    Ok(())
}

#[test]
fn probe_reports_the_gpu_or_why_there_is_none() -> Result<()> {
    let out = Command::new(common::worker_binary())
        .arg("probe")
        .output()?;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("engine cpu: available"), "{text}");
    let strict = Command::new(common::worker_binary())
        .args(["probe", "--require-cuda"])
        .output()?;
    if has_gpu() {
        assert!(text.contains("engine cuda: available: GPU 0"), "{text}");
        assert!(text.contains("device {\"ordinal\":0"), "{text}");
        assert!(strict.status.success());
    } else {
        assert!(
            text.contains("engine cuda: unavailable: no CUDA device available"),
            "{text}"
        );
        assert!(!strict.status.success(), "--require-cuda without a GPU");
    }
    Ok(())
}

#[test]
fn cancel_and_deadline_answer_without_running() -> Result<()> {
    let clips = clips()?;
    let (_, expected) = reference(&clips[..1])?;
    let dir = tempfile::tempdir()?;
    // Two requests never reach a preferred size: they wait the full 3 s unless answered early.
    let worker = WorkerProcess::start(dir.path(), &["--max-batch-wait-ms", "3000"])?;
    let mut s = worker.connect()?;
    let started = std::time::Instant::now();
    for (id, deadline_ms) in [(1u64, None), (2, Some(100)), (3, None)] {
        let audio = Audio::Pcm16k(clips[0].1.clone().into());
        write_frame(
            &mut s,
            &ClientMessage::Transcribe(TranscribeRequest {
                id,
                audio,
                deadline_ms,
                priority: worker_protocol::Priority::Batch,
            }),
        )?;
    }
    write_frame(&mut s, &ClientMessage::Cancel { id: 3 })?;
    let mut seen = HashMap::new();
    while seen.len() < 3 {
        match read_frame::<WorkerMessage>(&mut s)? {
            WorkerMessage::Result(r) => {
                assert_eq!(r.hypothesis, expected[0]);
                seen.insert(r.id, ("result".to_string(), started.elapsed()));
            }
            WorkerMessage::Error {
                id: Some(id),
                error,
            } => {
                seen.insert(id, (format!("{:?}", error.kind), started.elapsed()));
            }
            other => bail!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen[&3].0, "Cancelled");
    assert_eq!(seen[&2].0, "DeadlineExceeded");
    assert!(
        seen[&2].1.as_millis() < 2000,
        "answered at its deadline, not the batch wait"
    );
    assert_eq!(seen[&1].0, "result", "the rest still runs");
    Ok(())
}

/// The ONNX engine through the socket: batched answers equal the in-process ONNX model's
/// answer for each clip alone. Needs `ORT_DYLIB_PATH` (skipped, loudly, without it).
#[test]
fn onnx_engine_batched_answers_equal_each_clip_alone() -> Result<()> {
    if models::onnx::dylib_from_env().is_none() {
        eprintln!("SKIPPING onnx_engine test: ORT_DYLIB_PATH is not set");
        return Ok(());
    }
    let export = common::fixtures().join("tdt-real-options/onnx");
    let clips = clips()?;
    let mut model = models::onnx::OnnxModel::load(&export, &Default::default())?;
    let expected: Vec<_> = clips
        .iter()
        .map(|(_, pcm)| Ok(model.transcribe_batch(&[pcm])?.remove(0)))
        .collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    let export_arg = export.display().to_string();
    let worker = WorkerProcess::start_with(
        dir.path(),
        &[
            "--engine",
            "onnx",
            "--model",
            &export_arg,
            "--max-batch-wait-ms",
            "300",
        ],
    )?;
    let answers = transcribe_all(&worker, &clips, 2)?;
    for (id, answer) in &answers {
        let clip = *id as usize % clips.len();
        assert_eq!(answer.hypothesis, expected[clip], "clip {}", clips[clip].0);
    }
    assert!(answers.values().any(|a| a.timings.batch_size > 1));
    Ok(())
}

/// The CUDA engine through the socket: every clip answered in a batch equals the clip answered
/// alone, and the handshake reports the GPU. Skipped (loudly) without a GPU unless
/// `REQUIRE_CUDA=1`.
#[test]
fn cuda_engine_batched_answers_equal_each_clip_alone() -> Result<()> {
    if !has_gpu() {
        assert!(
            std::env::var("REQUIRE_CUDA").as_deref() != Ok("1"),
            "REQUIRE_CUDA=1 but no GPU"
        );
        eprintln!("SKIPPED cuda_engine_batched_answers_equal_each_clip_alone: no GPU");
        return Ok(());
    }
    let clips = clips()?;
    let dir = tempfile::tempdir()?;
    let worker = WorkerProcess::start(
        dir.path(),
        &["--engine", "cuda", "--max-batch-wait-ms", "300"],
    )?;
    let mut alone = Vec::new();
    for i in 0..clips.len() {
        let answer = transcribe_all(&worker, &clips[i..=i], 1)?.remove(&0);
        alone.push(answer.map(|a| a.hypothesis).expect("one answer"));
    }
    let answers = transcribe_all(&worker, &clips, 3)?;
    for (id, answer) in &answers {
        let clip = *id as usize % clips.len();
        assert_eq!(
            answer.hypothesis, alone[clip],
            "clip {} (request {id}) in a batch of {}",
            clips[clip].0, answer.timings.batch_size
        );
    }
    assert!(answers.values().any(|a| a.timings.batch_size >= 4));
    Ok(())
}

/// `--fault-injection` is off by default: SIGUSR1 then ends the worker as the signal does. On,
/// the signal asks the engine for a fault before its next batch; the CPU engine has none to
/// cause, says so, and goes on answering (the GPU drill is scripts/device/fault_drill.sh).
#[test]
fn fault_injection_is_a_switch() -> Result<()> {
    let clips = clips()?;
    let usr1 = |worker: &WorkerProcess| {
        Command::new("kill")
            .args(["-USR1", &worker.child.id().to_string()])
            .status()
    };
    let dir = tempfile::tempdir()?;
    let mut plain = WorkerProcess::start(dir.path(), &[])?;
    assert!(usr1(&plain)?.success());
    assert!(
        common::wait_until(std::time::Duration::from_secs(10), || !plain.is_running()),
        "without the switch SIGUSR1 ends the worker"
    );

    let dir = tempfile::tempdir()?;
    let mut drill = WorkerProcess::start(dir.path(), &["--fault-injection"])?;
    // The handler is installed just before the socket appears; let it settle.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(usr1(&drill)?.success());
    std::thread::sleep(std::time::Duration::from_millis(200));
    let answers = transcribe_all(&drill, &clips[..1], 2)?;
    assert_eq!(answers.len(), 2);
    assert!(drill.is_running(), "the CPU engine has no fault to cause");
    Ok(())
}
