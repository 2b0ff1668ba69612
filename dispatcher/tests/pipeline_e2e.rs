//! End-to-end: messages in, transcripts and manifests out, on the local spool/store and on
//! SQS/S3 (moto). Every body runs on both backends with the real fixture model.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{clip, engine, records, run_until_idle, settings, Backend, Slow};
use dispatcher::job::{JobMessage, OutputFormat};
use dispatcher::outputs::{FailureRecord, Manifest};
use sha2::{Digest, Sha256};

fn job_body(backend: &Backend, key: &str) -> String {
    let msg = JobMessage::new(uuid::Uuid::new_v4().to_string(), &backend.input(key));
    serde_json::to_string(&msg).expect("json")
}

fn s3_event(bucket: &str, encoded_key: &str) -> String {
    serde_json::json!({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": bucket}, "object": {"key": encoded_key, "size": 1}}
    }]})
    .to_string()
}

async fn manifest(backend: &Backend, key: &str) -> Manifest {
    serde_json::from_slice(&backend.read(key).await).expect("manifest json")
}

async fn upload_enqueue_result(backend: Backend) {
    backend
        .put_input("calls/hello.wav", &clip("espeak_us.wav"))
        .await;
    backend.send(&job_body(&backend, "calls/hello.wav")).await;
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!(
        (summary.done, summary.failed, summary.released),
        (1, 0, 0),
        "{summary:?}"
    );

    let (manifests, failures) = records(&backend).await;
    assert_eq!(
        (manifests.len(), failures.len()),
        (1, 0),
        "{manifests:?} {failures:?}"
    );
    let m = manifest(&backend, &manifests[0]).await;
    assert_eq!(m.input.key, "calls/hello.wav");
    assert_eq!(m.model_id, engine().model_id());
    assert!(
        (m.audio_duration_s - 3.48).abs() < 0.05,
        "{}",
        m.audio_duration_s
    );
    let formats: Vec<OutputFormat> = m.outputs.iter().map(|o| o.format).collect();
    assert_eq!(formats, OutputFormat::TRANSCRIPT.to_vec());
    for out in &m.outputs {
        let body = backend.read(&out.key).await;
        assert_eq!(
            format!("{:x}", Sha256::digest(&body)),
            out.sha256,
            "{}",
            out.key
        );
        assert_eq!(body.len() as u64, out.bytes);
    }
    let verbose = m
        .outputs
        .iter()
        .find(|o| o.format == OutputFormat::VerboseJson)
        .expect("vj");
    let doc: serde_json::Value =
        serde_json::from_slice(&backend.read(&verbose.key).await).expect("json");
    assert!(doc.get("segments").is_some(), "{doc}");
    assert_eq!(backend.pending().await, 0, "message deleted");
}
both_backends!(upload_enqueue_result, 3);

async fn duplicates_end_in_one_result(backend: Backend) {
    backend
        .put_input("dup/a b.wav", &clip("espeak_gb_fast.wav"))
        .await;
    let body = job_body(&backend, "dup/a b.wav");
    backend.send(&body).await;
    backend.send(&body).await; // the same message delivered twice
    backend
        .send(&s3_event(&backend.input_bucket, "dup/a+b.wav"))
        .await; // and an S3 event
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!(summary.done + summary.already_done, 3, "{summary:?}");
    assert!(summary.done >= 1, "{summary:?}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!((manifests.len(), failures.len()), (1, 0), "{manifests:?}");
    // One result directory: five documents and one manifest, nothing else.
    assert_eq!(backend.output_keys().await.len(), 6);
    assert_eq!(backend.pending().await, 0);
}
both_backends!(duplicates_end_in_one_result, 3);

async fn poison_messages_do_not_block_others(backend: Backend) {
    backend
        .put_input("ok.wav", &clip("audioeval_fox.wav"))
        .await;
    backend.send("{not json").await;
    backend
        .send(r#"{"schema_version": 7, "job_id": "future", "input": "s3://x/y.wav"}"#)
        .await;
    backend
        .send(&job_body(&backend, "never/uploaded.wav"))
        .await;
    backend
        .send(r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"in"}"#)
        .await;
    backend.send(&job_body(&backend, "ok.wav")).await;
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!(summary.done, 1, "{summary:?}");
    assert_eq!(
        summary.failed, 1,
        "missing object → failure record: {summary:?}"
    );
    assert_eq!(summary.ignored, 1, "s3:TestEvent: {summary:?}");

    let (manifests, failures) = records(&backend).await;
    assert_eq!(manifests.len(), 1);
    assert_eq!(failures.len(), 1);
    let record: FailureRecord =
        serde_json::from_slice(&backend.read(&failures[0]).await).expect("failure json");
    assert_eq!(record.reason_code, "source_missing");
    assert_eq!(record.input.key, "never/uploaded.wav");

    let mut dead = backend.dead_letters().await;
    dead.sort();
    assert_eq!(
        dead.len(),
        2,
        "bad JSON and unknown schema end in the DLQ: {dead:?}"
    );
    assert!(dead.iter().any(|b| b == "{not json"));
    assert!(dead.iter().any(|b| b.contains("\"schema_version\": 7")));
    assert_eq!(backend.pending().await, 0);
}
both_backends!(poison_messages_do_not_block_others, 2);

async fn awkward_keys(backend: Backend) {
    let keys = [
        "with space/a b.wav",
        "plus+sign.wav",
        "per%cent 100%.wav",
        "ünï/cødé 語.wav",
    ];
    let audio = clip("espeak_short.wav");
    for key in keys {
        backend.put_input(key, &audio).await;
    }
    // Two arrive as S3 events (form-encoded keys), two as job messages (raw keys).
    let encode = |k: &str| {
        let spaced = k.replace(' ', "\u{1}");
        percent_encoding::utf8_percent_encode(&spaced, percent_encoding::NON_ALPHANUMERIC)
            .to_string()
            .replace("%01", "+")
            .replace("%2F", "/")
    };
    backend
        .send(&s3_event(&backend.input_bucket, &encode(keys[0])))
        .await;
    backend
        .send(&s3_event(&backend.input_bucket, &encode(keys[1])))
        .await;
    backend.send(&job_body(&backend, keys[2])).await;
    backend.send(&job_body(&backend, keys[3])).await;
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!((summary.done, summary.failed), (4, 0), "{summary:?}");
    let (manifests, _) = records(&backend).await;
    let mut inputs = Vec::new();
    for key in &manifests {
        inputs.push(manifest(&backend, key).await.input.key);
    }
    inputs.sort();
    let mut expected: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    expected.sort();
    assert_eq!(inputs, expected);
}
both_backends!(awkward_keys, 3);

async fn heartbeats_keep_a_long_job_invisible(backend: Backend) {
    backend
        .put_input("long.wav", &clip("espeak_short.wav"))
        .await;
    backend.send(&job_body(&backend, "long.wav")).await;
    // A 2 s lease and a job that takes 3x as long: without heartbeats the message would be
    // redelivered to the second receiver mid-job.
    let slow = Arc::new(Slow {
        inner: engine(),
        delay: Duration::from_secs(6),
    });
    let s = settings(&backend, |a| {
        a.visibility_timeout_s = Some(2);
        a.receivers = Some(2);
    });
    let summary = run_until_idle(&backend, slow, &s).await;
    assert_eq!(
        summary,
        dispatcher::lifecycle::RunSummary {
            done: 1,
            ..Default::default()
        }
    );
    assert_eq!(records(&backend).await.0.len(), 1);
    assert_eq!(backend.pending().await, 0);
}
both_backends!(heartbeats_keep_a_long_job_invisible, 3);

async fn bad_audio_set(backend: Backend) {
    // (file, expected reason code, or None when the file is valid audio and must transcribe)
    let cases: [(&str, Option<&str>); 15] = [
        ("empty.wav", Some("empty")),
        ("truncated.wav", None),
        ("truncated.mp3", None),
        ("mp3_named.wav", None),
        ("text_named.mp3", Some("unsupported_format")),
        ("ac3.mka", Some("unsupported_codec")),
        ("clip_100ms.wav", Some("too_short")),
        ("silence_2s.wav", None),
        ("rate_8k.wav", None),
        ("rate_96k.wav", None),
        ("speech_mp3.wav", None), // MP3 inside WAVE (format tag 0x0055)
        ("channels_8.wav", None),
        ("channels_32.wav", None), // a 32-microphone array, downmixed
        ("channels_33.wav", Some("too_many_channels")),
        ("lying_header_huge.wav", None),
    ];
    for (name, _) in &cases {
        backend
            .put_input(&format!("bad/{name}"), &common::bad_audio(name))
            .await;
        backend
            .send(&job_body(&backend, &format!("bad/{name}")))
            .await;
    }
    let started = std::time::Instant::now();
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert!(started.elapsed() < Duration::from_secs(120));
    assert_eq!(summary.released + summary.bad_messages, 0, "{summary:?}");
    let (manifests, failures) = records(&backend).await;
    assert_eq!(
        manifests.len() + failures.len(),
        cases.len(),
        "one terminal record per file"
    );
    for (name, expected) in cases {
        let key = format!("bad/{name}");
        let mut found = Vec::new();
        for f in &failures {
            let r: FailureRecord = serde_json::from_slice(&backend.read(f).await).expect("json");
            if r.input.key == key {
                found.push(r.reason_code);
            }
        }
        let has_manifest = manifests.iter().any(|m| m.contains(&format!("/{key}/")));
        match expected {
            Some(code) => assert_eq!(found, vec![code.to_owned()], "{name}"),
            // Valid-but-odd audio, or a damaged file the decoder can still read: either a
            // transcript or a typed failure, never both and never neither.
            None => assert!(
                has_manifest ^ (found.len() == 1),
                "{name}: {found:?} {has_manifest}"
            ),
        }
    }
}
both_backends!(bad_audio_set, 3);
