//! `dispatcher local --input-dir`: the progress a person sees (plain lines off a terminal, a bar
//! on one), where the time went, and an exit status that tells a run with failed jobs from a
//! clean one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

/// The fixture clips, plus `extra` files (name, bytes), in a new input folder.
fn inputs(dir: &Path, extra: &[(&str, &[u8])]) -> (PathBuf, usize) {
    let inputs = dir.join("inputs");
    std::fs::create_dir(&inputs).expect("mkdir");
    let mut n = 0;
    for entry in std::fs::read_dir(fixtures().join("clips")).expect("clips") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, inputs.join(path.file_name().expect("name"))).expect("copy");
        n += 1;
    }
    for (name, bytes) in extra {
        std::fs::write(inputs.join(name), bytes).expect("write");
        n += 1;
    }
    (inputs, n)
}

fn local_args(work: &Path, inputs: &Path) -> Vec<String> {
    let model = fixtures().join("tdt-real-options/model.nemo");
    [
        "local",
        "--spool",
        &work.join("spool").display().to_string(),
        "--store",
        &work.join("store").display().to_string(),
        "--input-dir",
        &inputs.display().to_string(),
        "--model",
        &model.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `dispatcher local` on `inputs` with its spool and store under `work`, plus `extra` flags,
/// off a terminal: its exit and what it printed on stderr.
fn run_local(work: &Path, inputs: &Path, extra: &[&str]) -> (Output, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args(local_args(work, inputs))
        .args(extra)
        .output()
        .expect("spawn dispatcher");
    let log = stderr(&output);
    (output, log)
}

#[test]
fn off_a_terminal_progress_is_plain_lines_and_failed_jobs_exit_3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = b"This is a text file, not audio.\n".repeat(40);
    let (inputs, n) = inputs(dir.path(), &[("notes.mp3", &text)]);
    let (output, log) = run_local(dir.path(), &inputs, &["--progress-interval-s", "0.05"]);
    assert_eq!(output.status.code(), Some(3), "{log}");
    // The closing line counts every file, the failed one included, and the audio.
    let closing = format!("progress: {n}/{n} files · done {} · failed 1 · ", n - 1);
    assert!(log.contains(&closing), "{log}");
    assert!(
        log.contains(" h audio · ") && log.contains(" audio-s/s"),
        "{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "no terminal control codes off a terminal: {log}"
    );
    // Where the time went, per stage, after the run.
    for stage in [
        "fetch",
        "decode",
        "resample",
        "inference",
        "render",
        "upload",
    ] {
        assert!(log.contains(&format!("stage {stage} ")), "{stage}: {log}");
    }
    assert!(
        log.contains("1 jobs failed") && log.contains("failure.json"),
        "{log}"
    );
    // The summary comes before the non-zero exit, not instead of it.
    assert!(log.contains(&format!("done {} ·", n - 1)), "{log}");
}

#[test]
fn a_clean_run_exits_0_and_rejects_a_nonsense_interval_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (inputs, n) = inputs(dir.path(), &[]);
    let (output, log) = run_local(dir.path(), &inputs, &[]);
    assert!(output.status.success(), "{log}");
    assert!(
        log.contains(&format!("progress: {n}/{n} files · done {n} · failed 0")),
        "{log}"
    );

    let other = tempfile::tempdir().expect("tempdir");
    let (output, log) = run_local(other.path(), &inputs, &["--progress-interval-s", "0"]);
    assert_eq!(output.status.code(), Some(1), "{log}");
    assert!(log.contains("--progress-interval-s"), "{log}");
    assert!(
        !other.path().join("spool").exists(),
        "nothing was submitted: {log}"
    );
}

/// On a terminal (a pseudo-terminal from util-linux `script`) the progress is a bar.
#[test]
fn on_a_terminal_progress_is_a_bar() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (inputs, n) = inputs(dir.path(), &[]);
    let command = std::iter::once(env!("CARGO_BIN_EXE_dispatcher").to_owned())
        .chain(local_args(dir.path(), &inputs))
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let transcript = dir.path().join("typescript");
    let output = Command::new("script")
        .args(["--quiet", "--return", "--command", &command])
        .arg(&transcript)
        .env("TERM", "xterm-256color")
        .output()
        .expect("util-linux `script` (a pseudo-terminal) is installed");
    let screen = std::fs::read_to_string(&transcript).expect("typescript");
    assert!(output.status.success(), "{screen}");
    // The bar's frame: `[====>   ] k/n files ... ETA ...`, drawn with control codes.
    assert!(screen.contains('\u{1b}'), "{screen}");
    assert!(
        screen.contains("] ") && screen.contains("· ETA"),
        "{screen}"
    );
    assert!(
        screen.contains(&format!("progress: {n}/{n} files · done {n}")),
        "{screen}"
    );
}

/// A run long enough to judge ends with what set its pace: on the CPU engine with 16 kHz WAV
/// input (next to nothing to decode), the engine.
#[test]
fn a_long_enough_run_names_its_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir(&inputs).expect("mkdir");
    let long = std::fs::read(fixtures().join("clips/long.wav")).expect("long.wav");
    // About 2 000 s of audio: several seconds on the CPU engine, well past the one a verdict needs.
    for i in 0..80 {
        std::fs::write(inputs.join(format!("long{i}.wav")), &long).expect("write");
    }
    let (output, log) = run_local(dir.path(), &inputs, &[]);
    assert!(output.status.success(), "{log}");
    let limit = log
        .lines()
        .find(|line| line.starts_with("limit: "))
        .unwrap_or_else(|| panic!("no limit line: {log}"));
    assert!(
        limit.starts_with("limit: the engine (inference and waiting for it): "),
        "{limit}"
    );
    assert!(limit.contains("decode threads busy"), "{limit}");
}
