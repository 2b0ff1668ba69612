//! `worker serve --task diarize` on the tiny Sortformer fixture: answers equal the in-process
//! model, the handshake names the task, and requests of the other task are refused as
//! `BadRequest` by both kinds of worker.

mod common;

use std::os::unix::net::UnixStream;

use anyhow::{bail, ensure, Result};
use common::{model_path, sortformer_path, three_speakers, WorkerProcess};
use models::sortformer::SortformerModel;
use worker_protocol::{
    read_frame, write_frame, Audio, ClientMessage, DiarizeRequest, Task, TranscribeRequest,
    WireErrorKind, WorkerMessage,
};

fn diarize_worker(dir: &std::path::Path) -> Result<WorkerProcess> {
    let model = sortformer_path().display().to_string();
    WorkerProcess::start_with(
        dir,
        &["--task", "diarize", "--model", &model, "--engine", "cpu"],
    )
}

fn diarize(stream: &mut UnixStream, id: u64, pcm: &[f32]) -> Result<WorkerMessage> {
    let request = DiarizeRequest {
        id,
        audio: Audio::Pcm16k(pcm.to_vec().into()),
        deadline_ms: None,
    };
    write_frame(stream, &ClientMessage::Diarize(request))?;
    Ok(read_frame(stream)?)
}

fn expect_bad_request(answer: WorkerMessage, id: u64) -> Result<String> {
    match answer {
        WorkerMessage::Error {
            id: Some(got),
            error,
        } if got == id && error.kind == WireErrorKind::BadRequest => Ok(error.message),
        other => bail!("expected BadRequest for {id}, got {other:?}"),
    }
}

#[test]
fn diarize_worker_answers_equal_the_in_process_model() -> Result<()> {
    let pcm = three_speakers()?;
    let model = SortformerModel::load(&sortformer_path())?;
    let expected = model.diarize(&pcm)?;
    ensure!(
        expected
            .iter()
            .map(|s| s.speaker)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1,
        "the fixture clip has several speakers: {expected:?}"
    );
    let first_half = &pcm[..pcm.len() / 2];
    let expected_half = model.diarize(first_half)?;

    let dir = tempfile::tempdir()?;
    let worker = diarize_worker(dir.path())?;
    let (mut stream, info) = worker.handshake()?;
    assert_eq!(info.task, Task::Diarize);
    assert_eq!(info.engine, "cpu");
    assert!(info.model.vocabulary.is_empty());
    // Twice the whole clip, with the half in between: streaming state does not leak from one
    // recording into the next.
    for (id, clip, want) in [
        (1, pcm.as_slice(), &expected),
        (2, first_half, &expected_half),
        (3, pcm.as_slice(), &expected),
    ] {
        match diarize(&mut stream, id, clip)? {
            WorkerMessage::Diarized(response) => {
                assert_eq!(response.id, id);
                assert_eq!(&response.segments, want, "request {id}");
                assert_eq!(response.timings.batch_size, 1);
            }
            other => bail!("expected Diarized, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn requests_of_the_other_task_are_bad_requests() -> Result<()> {
    let pcm = three_speakers()?;
    let dir = tempfile::tempdir()?;
    let worker = diarize_worker(dir.path())?;
    let mut stream = worker.connect()?;
    let request = TranscribeRequest {
        id: 7,
        audio: Audio::Pcm16k(pcm[..16_000].to_vec().into()),
        deadline_ms: None,
        priority: worker_protocol::Priority::Batch,
    };
    write_frame(&mut stream, &ClientMessage::Transcribe(request))?;
    let message = expect_bad_request(read_frame(&mut stream)?, 7)?;
    assert!(message.contains("diarize"), "{message}");
    // Still serving diarization on the same connection; empty audio is refused too.
    expect_bad_request(diarize(&mut stream, 8, &[])?, 8)?;
    assert!(matches!(
        diarize(&mut stream, 9, &pcm[..32_000])?,
        WorkerMessage::Diarized(r) if r.id == 9
    ));

    let dir = tempfile::tempdir()?;
    let transcriber = WorkerProcess::start(dir.path(), &[])?;
    let (mut stream, info) = transcriber.handshake()?;
    assert_eq!(info.task, Task::Transcribe);
    expect_bad_request(diarize(&mut stream, 10, &pcm[..16_000])?, 10)?;
    assert!(model_path().exists());
    Ok(())
}

/// onnx has no diarization engine; cuda without a GPU fails with the reason (never the CPU);
/// cuda with a GPU serves diarization on it.
#[test]
fn diarize_engines_never_fall_back_to_the_cpu() -> Result<()> {
    let has_gpu = cuda_engine::CudaEngine::new(0).is_ok();
    let dir = tempfile::tempdir()?;
    let model = sortformer_path().display().to_string();
    let mut refused = vec![("onnx", "cpu or cuda")];
    if !has_gpu {
        refused.push(("cuda", "no CUDA device available"));
    }
    for (engine, why) in refused {
        let out = std::process::Command::new(common::worker_binary())
            .args(["serve", "--socket"])
            .arg(dir.path().join("w.sock"))
            .args(["--task", "diarize", "--engine", engine, "--model", &model])
            .output()?;
        ensure!(!out.status.success(), "{engine} diarization must not start");
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(stderr.contains(why), "{engine}: {stderr}");
        ensure!(
            !dir.path().join("w.sock").exists(),
            "{engine}: never served"
        );
    }
    if has_gpu {
        let worker = WorkerProcess::start_with(
            dir.path(),
            &["--task", "diarize", "--model", &model, "--engine", "cuda"],
        )?;
        let (mut stream, info) = worker.handshake()?;
        assert_eq!((info.task, info.engine.as_str()), (Task::Diarize, "cuda"));
        assert!(info.device.is_some());
        let pcm = three_speakers()?;
        assert!(matches!(
            diarize(&mut stream, 1, &pcm)?,
            WorkerMessage::Diarized(r) if r.id == 1
        ));
    }
    Ok(())
}
