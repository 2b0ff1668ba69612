//! The open-file limit: the dispatcher raises a low soft limit towards the hard one before it
//! sizes its jobs in flight, and says how to fix a hard limit too low for the jobs asked for
//! (each job in flight holds a connection or file; past the limit connects fail with "Too many
//! open files").

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

/// `dispatcher local` on two fixture clips after `limits` (shell `ulimit` commands) ran in the
/// shell that starts it, plus `extra` flags: exit success, stderr (the shell's hard limit
/// first, as `hard=N`).
fn local_under(dir: &Path, limits: &str, extra: &[&str]) -> (bool, String) {
    let inputs = dir.join("inputs");
    std::fs::create_dir(&inputs).expect("mkdir");
    for clip in ["espeak_short.wav", "audioeval_fox.wav"] {
        std::fs::copy(fixtures().join("clips").join(clip), inputs.join(clip)).expect("copy");
    }
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{limits} && echo \"hard=$(ulimit -Hn)\" >&2 && exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_dispatcher"))
        .args(["local", "--spool"])
        .arg(dir.join("spool"))
        .arg("--store")
        .arg(dir.join("store"))
        .arg("--input-dir")
        .arg(&inputs)
        .arg("--model")
        .arg(fixtures().join("tdt-real-options/model.nemo"))
        .args(extra)
        .output()
        .expect("spawn sh");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The `open_files=N` of the pipeline-limits line.
fn open_files_logged(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("pipeline limits"))
        .unwrap_or_else(|| panic!("no pipeline limits line: {log}"));
    let value = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("open_files="))
        .unwrap_or_else(|| panic!("no open_files in {line}"));
    value.parse().expect("open_files is a number")
}

fn hard_limit(log: &str) -> u64 {
    let value = log
        .lines()
        .find_map(|l| l.strip_prefix("hard="))
        .expect("the shell printed its hard limit");
    if value == "unlimited" {
        u64::MAX
    } else {
        value.parse().expect("a number")
    }
}

#[test]
fn a_low_soft_limit_is_raised_before_the_jobs_are_sized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, log) = local_under(dir.path(), "ulimit -Sn 256", &[]);
    assert!(ok, "{log}");
    let hard = hard_limit(&log);
    assert!(
        hard > 256,
        "this test needs a hard limit above 256 to show the raise (hard={hard})"
    );
    assert_eq!(open_files_logged(&log), hard.min(65_536), "{log}");
    assert!(
        !log.contains("Too many open files") && !log.contains("may need"),
        "{log}"
    );
}

#[test]
fn jobs_asked_for_beyond_a_low_hard_limit_are_named_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Soft and hard at 300: (300 - 256) / 2 = 22 jobs fit; 544 are asked for.
    let (ok, log) = local_under(dir.path(), "ulimit -n 300", &["--max-in-flight", "544"]);
    assert!(ok, "a run this small still finishes: {log}");
    assert_eq!(open_files_logged(&log), 300, "{log}");
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("--max-in-flight 544 may need"))
        .unwrap_or_else(|| panic!("no warning naming the jobs asked for: {log}"));
    for fix in [
        "1344 open files",
        "limit of 300",
        "ulimit -Hn",
        "LimitNOFILE",
    ] {
        assert!(warning.contains(fix), "{fix}: {warning}");
    }
}
