//! The last resort for a wedged MPS daemon: its processes, found in `/proc`, killed.
//!
//! Seen on an H200 (scripts/device/fault_drill.sh, 2026-12-04): after an illegal-address fault
//! in one client, the control daemon answered neither `terminate_client` nor `quit`, and every
//! new client failed (`CUDA_ERROR_MPS_SERVER_NOT_READY`, then `..._CONNECTION_FAILED`) until
//! the fleet gave up. A daemon that no longer answers can only be killed, with its server.

use std::path::Path;

use super::MpsDirs;
use crate::error::FleetError;

/// What `/proc/<pid>/comm` holds for both the control daemon and its servers (the kernel cuts
/// names at 15 bytes: `nvidia-cuda-mps-control` and `nvidia-cuda-mps-server` look alike).
const MPS_COMM: &str = "nvidia-cuda-mps";

/// Whether a process environment (`/proc/<pid>/environ`: NUL-separated `KEY=value`) names `pipe`
/// as its MPS pipe directory. The server inherits the daemon's environment, so this finds both.
fn serves(environ: &[u8], pipe: &Path) -> bool {
    let wanted = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display());
    environ
        .split(|b| *b == 0)
        .any(|entry| entry == wanted.as_bytes())
}

/// PIDs of the MPS control daemon and servers that serve `dirs` (processes this user may read).
pub(crate) fn daemon_processes(dirs: &MpsDirs) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim_end().starts_with(MPS_COMM)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|environ| serves(&environ, &dirs.pipe))
        })
        .collect()
}

/// SIGKILLs the daemon and servers of `dirs`; returns how many processes it signalled.
pub(crate) fn kill_daemon(dirs: &MpsDirs) -> Result<usize, FleetError> {
    let pids = daemon_processes(dirs);
    for &pid in &pids {
        let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
            continue;
        };
        match rustix::process::kill_process(target, rustix::process::Signal::KILL) {
            // Gone meanwhile: what was wanted.
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => {
                return Err(FleetError::Mps {
                    command: format!("kill -KILL {pid} (MPS daemon of {})", dirs.pipe.display()),
                    detail: e.to_string(),
                })
            }
        }
    }
    Ok(pids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipe_directory_must_match_exactly() {
        let pipe = Path::new("/run/fleet/mps/pipe/gpu1");
        let env = b"PATH=/usr/bin\0CUDA_MPS_PIPE_DIRECTORY=/run/fleet/mps/pipe/gpu1\0X=1\0";
        assert!(serves(env, pipe));
        let other = b"CUDA_MPS_PIPE_DIRECTORY=/run/fleet/mps/pipe/gpu10\0";
        assert!(!serves(other, pipe), "another GPU's daemon is not touched");
        assert!(!serves(b"PATH=/usr/bin\0", pipe));
    }

    #[test]
    fn no_process_serves_an_unused_directory() {
        let dirs = MpsDirs {
            pipe: "/nonexistent/mps/pipe/gpu0".into(),
            log: "/nonexistent/mps/log/gpu0".into(),
        };
        assert!(daemon_processes(&dirs).is_empty());
        assert_eq!(kill_daemon(&dirs).expect("nothing to kill"), 0);
    }
}
