//! CUDA MPS as data: the environment each worker gets and the control-daemon commands, so both
//! are unit-tested here and only executed on GPU machines. One daemon (and pipe directory) per
//! GPU: a server spanning GPUs would spread one GPU's fault to the other.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::error::FleetError;

mod control;
mod processes;

pub use control::{
    get_client_list, get_server_list, parse_pids, terminate_client, terminate_clients, MpsControl,
    SystemMps, Terminated,
};

pub const CONTROL_BINARY: &str = "nvidia-cuda-mps-control";

#[derive(Debug, Clone, PartialEq)]
pub struct MpsConfig {
    /// Per-GPU pipe directories are created under this (`<root>/gpu<N>`).
    pub pipe_root: PathBuf,
    pub log_root: PathBuf,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` per worker; default `100 / instances`.
    pub active_thread_percentage: Option<u32>,
}

/// The directories of one GPU's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    pub pipe: PathBuf,
    pub log: PathBuf,
}

impl MpsConfig {
    pub fn dirs(&self, gpu: u32) -> MpsDirs {
        MpsDirs {
            pipe: self.pipe_root.join(format!("gpu{gpu}")),
            log: self.log_root.join(format!("gpu{gpu}")),
        }
    }

    pub fn thread_percentage(&self, instances: usize) -> u32 {
        self.active_thread_percentage
            .unwrap_or_else(|| (100 / instances.max(1)).max(1) as u32)
    }
}

/// Environment of one worker of a group.
///
/// Without MPS the worker sees only its GPU (`CUDA_VISIBLE_DEVICES=N`). Under MPS it must not
/// set `CUDA_VISIBLE_DEVICES` at all ([`WORKER_ENV_REMOVE_UNDER_MPS`]): the daemon was started with it, and
/// its server remaps that GPU to ordinal 0 for its clients, so a client asking for `N > 0`
/// finds no device (seen on a 2-GPU H200 host; NVIDIA's MPS guide says the same).
pub fn worker_env(
    gpu: Option<u32>,
    instances: usize,
    mps: Option<&MpsConfig>,
) -> Vec<(String, String)> {
    let percentage = mps.map_or(100, |m| m.thread_percentage(instances));
    client_env(gpu, percentage, mps)
}

/// [`worker_env`] with an explicit thread percentage (the diarization workers' own share).
pub fn client_env(
    gpu: Option<u32>,
    thread_percentage: u32,
    mps: Option<&MpsConfig>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    let Some(gpu) = gpu else {
        return env;
    };
    if mps.is_none() {
        env.push(("CUDA_VISIBLE_DEVICES".into(), gpu.to_string()));
    }
    if let Some(mps) = mps {
        let dirs = mps.dirs(gpu);
        env.push(("CUDA_MPS_PIPE_DIRECTORY".into(), path_str(&dirs.pipe)));
        env.push(("CUDA_MPS_LOG_DIRECTORY".into(), path_str(&dirs.log)));
        env.push((
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            thread_percentage.to_string(),
        ));
    }
    env
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// A command to run: program, arguments, environment, optional stdin text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
}

impl CommandSpec {
    pub fn display(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let stdin = self
            .stdin
            .as_deref()
            .map(|s| format!("echo {} | ", s.trim()));
        format!(
            "{}{} {} {}",
            stdin.unwrap_or_default(),
            env.join(" "),
            self.program,
            self.args.join(" ")
        )
        .trim()
        .to_string()
    }

    /// Runs to completion; a non-zero exit is an error carrying stderr.
    pub fn run(&self) -> Result<Output, FleetError> {
        self.run_with_timeout(Duration::MAX)
    }

    /// Like [`Self::run`], but a command still running after `timeout` is killed and reported.
    pub fn run_with_timeout(&self, timeout: Duration) -> Result<Output, FleetError> {
        let fail = |detail: String| FleetError::Mps {
            command: self.display(),
            detail,
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        if let (Some(text), Some(mut stdin)) = (&self.stdin, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| fail(e.to_string()))?;
        }
        // Output is read on its own threads and exit is awaited separately: `-d` forks a
        // daemon that may keep our pipes open, so end-of-file is not a completion signal.
        let pid = child.id();
        let stdout = read_in_background(child.stdout.take());
        let stderr = read_in_background(child.stderr.take());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = match rx.recv_timeout(timeout) {
            Ok(waited) => waited.map_err(|e| fail(e.to_string()))?,
            Err(_) => {
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                return Err(fail(format!("no answer within {} ms", timeout.as_millis())));
            }
        };
        let output = Output {
            status,
            stdout: stdout.recv_timeout(OUTPUT_GRACE).unwrap_or_default(),
            stderr: stderr.recv_timeout(OUTPUT_GRACE).unwrap_or_default(),
        };
        if !output.status.success() {
            return Err(fail(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(output)
    }
}

/// How long output may trail the exit of a command.
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

fn read_in_background(
    pipe: Option<impl std::io::Read + Send + 'static>,
) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
    }
    rx
}

/// Variables removed from an MPS worker's inherited environment (see [`worker_env`]).
pub const WORKER_ENV_REMOVE_UNDER_MPS: &[&str] = &["CUDA_VISIBLE_DEVICES"];

pub(crate) fn daemon_env(gpu: u32, dirs: &MpsDirs) -> Vec<(String, String)> {
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), gpu.to_string()),
        ("CUDA_MPS_PIPE_DIRECTORY".into(), path_str(&dirs.pipe)),
        ("CUDA_MPS_LOG_DIRECTORY".into(), path_str(&dirs.log)),
    ]
}

/// `nvidia-cuda-mps-control -d` for one GPU, with its own pipe and log directories.
pub fn daemon_start(gpu: u32, dirs: &MpsDirs) -> CommandSpec {
    CommandSpec {
        program: CONTROL_BINARY.into(),
        args: vec!["-d".into()],
        env: daemon_env(gpu, dirs),
        stdin: None,
    }
}

/// `echo quit | nvidia-cuda-mps-control` against that GPU's pipe directory.
pub fn daemon_stop(gpu: u32, dirs: &MpsDirs) -> CommandSpec {
    CommandSpec {
        program: CONTROL_BINARY.into(),
        args: Vec::new(),
        env: daemon_env(gpu, dirs),
        stdin: Some("quit\n".into()),
    }
}

/// `quit`; a daemon that does not answer it (wedged after a client's fault) is killed with its
/// servers, the only way left to free the GPU for a new one.
pub(crate) fn stop_daemon(
    control: &dyn MpsControl,
    gpu: u32,
    dirs: &MpsDirs,
) -> Result<(), FleetError> {
    let Err(quit_error) = control.run(&daemon_stop(gpu, dirs)) else {
        return Ok(());
    };
    let killed = control.kill_daemon(dirs)?;
    tracing::warn!(gpu, error = %quit_error, killed,
        "the MPS daemon did not quit; killed its processes");
    Ok(())
}

/// The daemon listens on `<pipe dir>/control` while it runs.
pub fn daemon_running(dirs: &MpsDirs) -> bool {
    dirs.pipe.join("control").exists()
}

/// Starts the GPU's daemon unless one already serves its pipe directory. `Ok(true)` when this
/// call started it (and so should stop it).
pub fn ensure_daemon(
    control: &dyn MpsControl,
    gpu: u32,
    dirs: &MpsDirs,
) -> Result<bool, FleetError> {
    if control.daemon_running(dirs) {
        return Ok(false);
    }
    for dir in [&dirs.pipe, &dirs.log] {
        std::fs::create_dir_all(dir).map_err(FleetError::io("creating MPS directory", dir))?;
    }
    control.run(&daemon_start(gpu, dirs))?;
    Ok(true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mps(pct: Option<u32>) -> MpsConfig {
        MpsConfig {
            pipe_root: "/run/fleet/mps".into(),
            log_root: "/var/log/fleet/mps".into(),
            active_thread_percentage: pct,
        }
    }

    fn get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn worker_env_under_mps_defaults_to_an_equal_share() {
        let env = worker_env(Some(3), 4, Some(&mps(None)));
        // The daemon pins the GPU; its clients see it as their only device.
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), None);
        assert_eq!(
            get(&env, "CUDA_MPS_PIPE_DIRECTORY"),
            Some("/run/fleet/mps/gpu3")
        );
        assert_eq!(
            get(&env, "CUDA_MPS_LOG_DIRECTORY"),
            Some("/var/log/fleet/mps/gpu3")
        );
        assert_eq!(get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
        let env8 = worker_env(Some(0), 8, Some(&mps(None)));
        assert_eq!(get(&env8, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("12"));
        let pinned = worker_env(Some(0), 8, Some(&mps(Some(40))));
        assert_eq!(
            get(&pinned, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            Some("40")
        );
    }

    #[test]
    fn worker_env_without_mps_or_gpu() {
        let plain = worker_env(Some(1), 4, None);
        assert_eq!(
            plain,
            vec![("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string())]
        );
        assert!(worker_env(None, 4, Some(&mps(None))).is_empty());
    }

    #[test]
    fn daemon_commands_use_the_gpus_own_directories() {
        let dirs = mps(None).dirs(2);
        let start = daemon_start(2, &dirs);
        assert_eq!(start.program, "nvidia-cuda-mps-control");
        assert_eq!(start.args, vec!["-d"]);
        assert_eq!(
            get(&start.env, "CUDA_MPS_PIPE_DIRECTORY"),
            Some("/run/fleet/mps/gpu2")
        );
        assert_eq!(get(&start.env, "CUDA_VISIBLE_DEVICES"), Some("2"));
        let stop = daemon_stop(2, &dirs);
        assert!(stop.args.is_empty());
        assert_eq!(stop.stdin.as_deref(), Some("quit\n"));
        assert_eq!(
            get(&stop.env, "CUDA_MPS_PIPE_DIRECTORY"),
            Some("/run/fleet/mps/gpu2")
        );
        assert_eq!(
            stop.display(),
            "echo quit | CUDA_VISIBLE_DEVICES=2 CUDA_MPS_PIPE_DIRECTORY=/run/fleet/mps/gpu2 \
             CUDA_MPS_LOG_DIRECTORY=/var/log/fleet/mps/gpu2 nvidia-cuda-mps-control"
        );
    }

    #[test]
    fn daemon_running_checks_the_control_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = MpsDirs {
            pipe: dir.path().to_owned(),
            log: dir.path().to_owned(),
        };
        assert!(!daemon_running(&dirs));
        std::fs::write(dir.path().join("control"), b"").unwrap();
        assert!(daemon_running(&dirs));
    }

    /// `nvidia-cuda-mps-control -d` forks a daemon that may hold our output pipes open: the
    /// command's own exit is what counts.
    #[test]
    fn a_command_that_leaves_a_child_on_its_pipes_still_returns() {
        let spec = CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), "echo started; sleep 3 &".into()],
            env: vec![],
            stdin: None,
        };
        let started = std::time::Instant::now();
        let output = spec.run_with_timeout(Duration::from_secs(10)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(output.status.success());
    }

    #[test]
    fn a_missing_control_binary_is_a_typed_error() {
        let spec = CommandSpec {
            program: "/nonexistent/nvidia-cuda-mps-control".into(),
            args: vec![],
            env: vec![],
            stdin: None,
        };
        assert!(matches!(spec.run(), Err(FleetError::Mps { .. })));
    }
}
