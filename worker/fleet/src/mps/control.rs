//! Talking to a running MPS control daemon: the `get_server_list` / `get_client_list` /
//! `terminate_client` exchange that safely removes a client before it is killed.
//!
//! NVIDIA's guidance: killing an MPS client that has GPU work outstanding "may leave the MPS
//! server in an undefined state". `terminate_client <server pid> <client pid>` makes the server
//! drop the client's work (the client sees the sticky `CUDA_ERROR_MPS_CLIENT_TERMINATED`);
//! the supervisor kills the process after that.

use std::time::Duration;

use super::{daemon_env, CommandSpec, MpsDirs, CONTROL_BINARY};
use crate::error::FleetError;

/// How the fleet runs MPS control commands. [`SystemMps`] runs them; tests substitute a
/// recorder so the per-GPU command sequences are checked without a GPU.
pub trait MpsControl: Send + Sync {
    /// Runs the command and returns its standard output.
    fn run(&self, command: &CommandSpec) -> Result<String, FleetError>;

    /// Whether a daemon already serves these directories.
    fn daemon_running(&self, dirs: &MpsDirs) -> bool {
        super::daemon_running(dirs)
    }

    /// Kills the daemon and servers of these directories (one that answers no command);
    /// returns how many processes were signalled.
    fn kill_daemon(&self, dirs: &MpsDirs) -> Result<usize, FleetError> {
        super::processes::kill_daemon(dirs)
    }
}

/// Runs commands on this machine, each bounded by `timeout` (a wedged daemon must not hang
/// the supervisor).
#[derive(Debug, Clone, Copy)]
pub struct SystemMps {
    pub timeout: Duration,
}

impl Default for SystemMps {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
        }
    }
}

impl MpsControl for SystemMps {
    fn run(&self, command: &CommandSpec) -> Result<String, FleetError> {
        let output = command.run_with_timeout(self.timeout)?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

fn control_command(gpu: u32, dirs: &MpsDirs, line: String) -> CommandSpec {
    CommandSpec {
        program: CONTROL_BINARY.into(),
        args: Vec::new(),
        env: daemon_env(gpu, dirs),
        stdin: Some(line + "\n"),
    }
}

/// `echo get_server_list | nvidia-cuda-mps-control`: the PIDs of the daemon's MPS servers.
pub fn get_server_list(gpu: u32, dirs: &MpsDirs) -> CommandSpec {
    control_command(gpu, dirs, "get_server_list".into())
}

/// `echo get_client_list <server> | nvidia-cuda-mps-control`: the PIDs of that server's clients.
pub fn get_client_list(gpu: u32, dirs: &MpsDirs, server_pid: u32) -> CommandSpec {
    control_command(gpu, dirs, format!("get_client_list {server_pid}"))
}

/// `echo terminate_client <server> <client> | nvidia-cuda-mps-control`.
pub fn terminate_client(gpu: u32, dirs: &MpsDirs, server_pid: u32, client_pid: u32) -> CommandSpec {
    control_command(
        gpu,
        dirs,
        format!("terminate_client {server_pid} {client_pid}"),
    )
}

/// The PIDs in a `get_server_list` / `get_client_list` answer (one per line; anything else,
/// such as an empty answer, is skipped).
pub fn parse_pids(output: &str) -> Vec<u32> {
    output
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

/// One client the daemon was asked to terminate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminated {
    pub server_pid: u32,
    pub client_pid: u32,
}

/// Asks the GPU's daemon to terminate each of `clients` (host PIDs) on whichever server holds
/// it. Clients no server lists (not yet connected, already gone) are skipped: there is nothing
/// to terminate and killing them is safe.
pub fn terminate_clients(
    control: &dyn MpsControl,
    gpu: u32,
    dirs: &MpsDirs,
    clients: &[u32],
) -> Result<Vec<Terminated>, FleetError> {
    let mut done = Vec::new();
    if clients.is_empty() {
        return Ok(done);
    }
    for server_pid in parse_pids(&control.run(&get_server_list(gpu, dirs))?) {
        let listed = parse_pids(&control.run(&get_client_list(gpu, dirs, server_pid))?);
        for &client_pid in clients.iter().filter(|c| listed.contains(c)) {
            control.run(&terminate_client(gpu, dirs, server_pid, client_pid))?;
            done.push(Terminated {
                server_pid,
                client_pid,
            });
        }
    }
    Ok(done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Answers like a daemon with servers 500 (clients 11, 12) and 600 (client 13).
    #[derive(Default)]
    struct FakeDaemon {
        seen: Mutex<Vec<CommandSpec>>,
    }

    impl MpsControl for FakeDaemon {
        fn run(&self, command: &CommandSpec) -> Result<String, FleetError> {
            self.seen.lock().unwrap().push(command.clone());
            Ok(match command.stdin.as_deref().unwrap_or("").trim() {
                "get_server_list" => "500\n600\n".into(),
                "get_client_list 500" => "11\n12\n".into(),
                "get_client_list 600" => "13\n".into(),
                _ => String::new(),
            })
        }
    }

    fn dirs() -> MpsDirs {
        MpsDirs {
            pipe: "/run/fleet/mps/gpu1".into(),
            log: "/var/log/fleet/mps/gpu1".into(),
        }
    }

    #[test]
    fn command_lines_are_exact() {
        let d = dirs();
        let env = "CUDA_VISIBLE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY=/run/fleet/mps/gpu1 \
                   CUDA_MPS_LOG_DIRECTORY=/var/log/fleet/mps/gpu1 nvidia-cuda-mps-control";
        assert_eq!(
            get_server_list(1, &d).display(),
            format!("echo get_server_list | {env}")
        );
        assert_eq!(
            get_client_list(1, &d, 500).display(),
            format!("echo get_client_list 500 | {env}")
        );
        let t = terminate_client(1, &d, 500, 4242);
        assert_eq!(t.stdin.as_deref(), Some("terminate_client 500 4242\n"));
        assert!(t.args.is_empty());
        assert_eq!(
            t.display(),
            format!("echo terminate_client 500 4242 | {env}")
        );
    }

    #[test]
    fn pids_parse_from_daemon_answers() {
        assert_eq!(parse_pids("123\n456\n"), vec![123, 456]);
        assert_eq!(parse_pids(""), Vec::<u32>::new());
        assert_eq!(parse_pids("  77 \n"), vec![77]);
    }

    #[test]
    fn terminates_each_client_on_the_server_that_holds_it() {
        let daemon = FakeDaemon::default();
        let done = terminate_clients(&daemon, 1, &dirs(), &[12, 13, 99]).unwrap();
        assert_eq!(
            done,
            vec![
                Terminated {
                    server_pid: 500,
                    client_pid: 12
                },
                Terminated {
                    server_pid: 600,
                    client_pid: 13
                },
            ]
        );
        let lines: Vec<String> = daemon
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.stdin.clone().unwrap_or_default().trim().to_owned())
            .collect();
        assert_eq!(
            lines,
            vec![
                "get_server_list",
                "get_client_list 500",
                "terminate_client 500 12",
                "get_client_list 600",
                "terminate_client 600 13",
            ]
        );
        // Every command went to GPU 1's own pipe directory.
        assert!(daemon.seen.lock().unwrap().iter().all(|c| c.env.contains(&(
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            "/run/fleet/mps/gpu1".into()
        ))));
    }

    #[test]
    fn no_clients_means_no_commands() {
        let daemon = FakeDaemon::default();
        assert!(terminate_clients(&daemon, 1, &dirs(), &[])
            .unwrap()
            .is_empty());
        assert!(daemon.seen.lock().unwrap().is_empty());
    }

    #[test]
    fn a_hanging_command_is_cut_off() {
        let spec = CommandSpec {
            program: "sleep".into(),
            args: vec!["5".into()],
            env: vec![],
            stdin: None,
        };
        let started = std::time::Instant::now();
        let err = SystemMps {
            timeout: Duration::from_millis(200),
        }
        .run(&spec)
        .unwrap_err();
        assert!(matches!(err, FleetError::Mps { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
