//! A GPU whose workers keep failing to start under MPS gets its MPS daemon restarted, once per
//! streak of failures: `quit`, then `-d` again. Seen once on an H200: after a client was
//! SIGKILLed and `terminate_client` got no answer, every new client failed with
//! `CUDA_ERROR_MPS_SERVER_NOT_READY` for minutes while the fleet kept restarting workers.
//! Only a daemon this fleet started is restarted (another's is reported, not touched); if the
//! restart does not help, the slots run out of tries and the fleet gives up.

use std::time::{Duration, Instant};

use super::state::{Phase, Shared, State};
use crate::error::FleetError;
use crate::events::FleetEvent;
use crate::mps::{self, MpsControl, MpsDirs};

/// Failed starts in a row, on every worker of the group, before its daemon is restarted.
pub(super) const RESTART_DAEMON_AFTER: u32 = 2;

/// Restarts the daemon of each MPS group whose workers are all down after failing to start.
pub(super) fn restart_wedged_daemons(shared: &Shared, state: &mut State) {
    for (g, group) in shared.config.groups.iter().enumerate() {
        let (Some(gpu), Some(mps_cfg)) = (group.gpu, &group.mps) else {
            continue;
        };
        let mut slots = state.slots.iter().filter(|s| s.group == g).peekable();
        let wedged = slots.peek().is_some()
            && slots.all(|s| {
                s.start_failures >= RESTART_DAEMON_AFTER && matches!(s.phase, Phase::Down { .. })
            });
        if !wedged || !state.daemon_restarted.insert(g) {
            continue;
        }
        let dirs = mps_cfg.dirs(gpu);
        if !state.mps_started.iter().any(|(started, _)| *started == gpu) {
            tracing::error!(gpu, "workers keep failing to start; the MPS daemon is not this fleet's: not restarting it");
            continue;
        }
        tracing::warn!(
            gpu,
            "workers keep failing to start: restarting the GPU's MPS daemon"
        );
        let restarted = shared
            .mps
            .run(&mps::daemon_stop(gpu, &dirs))
            .and_then(|_| gone(&*shared.mps, gpu, &dirs))
            .and_then(|()| mps::ensure_daemon(&*shared.mps, gpu, &dirs));
        let error = restarted.err().map(|e| e.to_string());
        if let Some(error) = &error {
            tracing::error!(gpu, %error, "MPS daemon restart failed");
        }
        shared.emit(FleetEvent::MpsDaemonRestarted { gpu, error });
    }
}

/// How long a daemon told to quit may take to leave (it removes its control pipe last).
const QUIT_WAIT: Duration = Duration::from_secs(10);

/// Waits until the daemon that was told to quit has gone: a new one started while its control
/// pipe is still there would be taken for it, and no daemon would be left (seen on an H200).
fn gone(control: &dyn MpsControl, gpu: u32, dirs: &MpsDirs) -> Result<(), FleetError> {
    let deadline = Instant::now() + QUIT_WAIT;
    while control.daemon_running(dirs) {
        if Instant::now() > deadline {
            return Err(FleetError::Mps {
                command: mps::daemon_stop(gpu, dirs).display(),
                detail: format!("the daemon still runs {} s after quit", QUIT_WAIT.as_secs()),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A daemon that is still there for the first `polls` looks after `quit`.
    struct Leaving {
        polls: AtomicU32,
    }

    impl MpsControl for Leaving {
        fn run(&self, _: &mps::CommandSpec) -> Result<String, FleetError> {
            Ok(String::new())
        }
        fn daemon_running(&self, _: &MpsDirs) -> bool {
            self.polls
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        }
    }

    #[test]
    fn a_new_daemon_waits_for_the_old_one_to_leave() {
        let dirs = MpsDirs {
            pipe: "/run/fleet/mps/gpu0".into(),
            log: "/var/log/fleet/mps/gpu0".into(),
        };
        let leaving = Leaving {
            polls: AtomicU32::new(3),
        };
        assert!(gone(&leaving, 0, &dirs).is_ok());
        assert_eq!(leaving.polls.load(Ordering::SeqCst), 0, "looked until it left");
    }
}
