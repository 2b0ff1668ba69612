//! `dispatcher reconcile`: after a run, every input under a prefix is complete, failed or
//! missing (a result whose output went missing or changed is reported, not counted done);
//! `--enqueue-missing` sends jobs for the missing ones, and the exit status tells "all
//! accounted for" (0) from "inputs still need work" (3). The real binary, both backends.

mod common;

use std::process::{Command, Output};

use common::backend::Kind;
use common::{bad_audio, clip, engine, records, run_until_idle, settings, Backend};
use dispatcher::job::JobMessage;

/// `dispatcher reconcile s3://<inputs>/rc/ ...` against the backend.
fn reconcile(backend: &Backend, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dispatcher"));
    cmd.arg("reconcile")
        .arg(format!("s3://{}/rc/", backend.input_bucket))
        .args(["--output-uri", &backend.output.uri()])
        .args(["--model-id", engine().model_id()])
        .args(extra)
        .envs(backend.cli_env());
    match &backend.kind {
        Kind::Local { spool, store } => {
            cmd.arg("--store")
                .arg(store.root())
                .arg("--spool")
                .arg(spool.dir());
        }
        Kind::Moto { queue_url, .. } => {
            cmd.args(["--queue-url", queue_url, "--s3-force-path-style"]);
        }
    }
    cmd.output().expect("run dispatcher reconcile")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replaces a result object's bytes behind the dispatcher's back (an incident).
async fn overwrite(backend: &Backend, key: &str, bytes: &[u8]) {
    match &backend.kind {
        Kind::Local { store, .. } => {
            let path = store
                .path_of(&backend.output.bucket, key)
                .expect("result path");
            std::fs::write(path, bytes).expect("overwrite");
        }
        Kind::Moto { s3, .. } => {
            s3.put_object()
                .bucket(&backend.output.bucket)
                .key(key)
                .body(bytes.to_vec().into())
                .send()
                .await
                .expect("overwrite");
        }
    }
}

async fn reconcile_reports_and_enqueues_what_is_missing(backend: Backend) {
    // Three jobs run (one of them bad audio, so a failure record); two inputs never enqueued.
    for (i, key) in [
        "rc/a.wav",
        "rc/b.wav",
        "rc/bad.wav",
        "rc/never1.wav",
        "rc/never2.wav",
    ]
    .iter()
    .enumerate()
    {
        let bytes = if key.contains("bad") {
            bad_audio("random.bin")
        } else {
            clip("espeak_short.wav")
        };
        backend.put_input(key, &bytes).await;
        if !key.contains("never") {
            let job = JobMessage::new(format!("rc-{i}"), &backend.input(key));
            backend
                .send(&serde_json::to_string(&job).expect("json"))
                .await;
        }
    }
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!((summary.done, summary.failed), (2, 1), "{summary:?}");

    // One finished result damaged: its transcript.txt replaced with other bytes.
    let (manifests, _) = records(&backend).await;
    let damaged = manifests
        .iter()
        .find(|k| k.contains("/rc/b.wav/"))
        .expect("b's manifest")
        .replace("manifest.json", "transcript.txt");
    let original = backend.read(&damaged).await;
    overwrite(&backend, &damaged, b"not what the manifest says").await;

    let out = reconcile(&backend, &["--json"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(report["inputs"], 5, "{report}");
    assert_eq!(report["complete"], 1, "{report}");
    assert_eq!(report["failed"], 1, "{report}");
    assert_eq!(
        report["failed_by_reason"].as_object().map(|m| m.len()),
        Some(1)
    );
    assert_eq!(
        report["missing"],
        serde_json::json!(["rc/never1.wav", "rc/never2.wav"]),
        "{report}"
    );
    let incomplete = report["incomplete"].as_array().expect("incomplete");
    assert_eq!(incomplete.len(), 1, "{report}");
    assert_eq!(incomplete[0][0], "rc/b.wav");
    assert!(
        incomplete[0][1]
            .as_str()
            .is_some_and(|why| why.contains("bytes")),
        "{report}"
    );
    assert_eq!(report["enqueued"], 0);

    // The missing ones enqueued, then transcribed: only the damaged result is left.
    let out = reconcile(&backend, &["--enqueue-missing"]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("missing\trc/never1.wav"), "{text}");
    assert!(text.contains("incomplete\trc/b.wav"), "{text}");
    assert!(text.contains("enqueued 2"), "{text}");
    let summary = run_until_idle(&backend, engine(), &settings(&backend, |_| {})).await;
    assert_eq!((summary.done, summary.failed), (2, 0), "{summary:?}");
    let out = reconcile(&backend, &[]);
    let text = stdout(&out);
    assert!(
        text.contains("inputs 5 · complete 3 · failed 1 · missing 0 · incomplete 1"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(3));

    // The damage repaired, everything is accounted for: exit 0.
    overwrite(&backend, &damaged, &original).await;
    let out = reconcile(&backend, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
both_backends!(reconcile_reports_and_enqueues_what_is_missing, 4);

/// `--enqueue-missing` without a queue is refused with the flags that give one.
#[test]
fn enqueue_missing_needs_a_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args([
            "reconcile",
            "s3://inputs/x/",
            "--output-uri",
            "s3://results/",
        ])
        .args(["--model-id", "m", "--enqueue-missing", "--store"])
        .arg(dir.path())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--queue-url"), "{stderr}");
}
