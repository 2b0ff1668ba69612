//! A short run of the project's chaos test (`scripts/chaos/chaos.py`): three `dispatcher run`
//! processes against SQS and S3 on moto behind a fault-injecting proxy (5xx, throttling, slow
//! answers, connections dropped before and after moto acts; on result uploads KMS throttling and
//! flipped bytes, which the upload's checksum must catch; SSE-KMS asked on every upload), one of
//! them SIGKILLed or SIGTERMed every 2-4 s, 60 jobs with awkward keys, bad inputs, duplicates and
//! poison messages; then
//! `dispatcher reconcile`: every input exactly one complete result or a failure record, the
//! queue empty, only the poison messages dead-lettered. The 500-job run is in
//! docs/operations.md.

use std::path::Path;
use std::process::Command;

#[test]
fn chaos_loses_nothing_and_writes_nothing_twice() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/chaos/chaos.py");
    let work = tempfile::tempdir().expect("tempdir");
    let out = Command::new("python3")
        .arg(script)
        .args(["--dispatcher", env!("CARGO_BIN_EXE_dispatcher")])
        .args([
            "--jobs",
            "60",
            "--bad",
            "3",
            "--duplicates",
            "6",
            "--poison",
            "2",
        ])
        .args(["--kill-every-s", "2", "4", "--max-s", "300", "--seed", "7"])
        .arg("--workdir")
        .arg(work.path())
        .output()
        .expect("python3 scripts/chaos/chaos.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chaos run failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.trim()).expect("one JSON summary line");
    let faults: u64 = summary["faults_injected"]
        .as_object()
        .expect("faults")
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    let kills = summary["kills"]["SIGKILL"].as_u64().unwrap_or(0)
        + summary["kills"]["SIGTERM"].as_u64().unwrap_or(0);
    // The run must actually have been chaotic, result uploads included: KMS throttled some and
    // the checksum every upload carries caught the flipped bytes (chaos.py already failed the
    // run for an upload without SSE-KMS or a checksum, or a flip that reached moto).
    assert!(faults >= 10 && kills >= 2, "{summary}");
    let uploads = &summary["result_uploads"];
    assert!(
        summary["faults_injected"]["kms_throttle"].as_u64() >= Some(1)
            && uploads["flips_rejected"].as_u64() >= Some(1),
        "{summary}"
    );
}
