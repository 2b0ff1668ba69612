//! A GPU whose workers keep failing to start under MPS gets its MPS daemon restarted, once per
//! streak of failures: `quit` (or, when the daemon does not answer it, its processes killed),
//! then `-d` again. Seen once on an H200: after a client was
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
        let restarted = mps::stop_daemon(&*shared.mps, gpu, &dirs)
            .and_then(|_| start_again(&*shared.mps, gpu, &dirs));
        let error = restarted.err().map(|e| e.to_string());
        if let Some(error) = &error {
            tracing::error!(gpu, %error, "MPS daemon restart failed");
        }
        shared.emit(FleetEvent::MpsDaemonRestarted { gpu, error });
    }
}

/// How long a daemon told to quit may take to leave, and how often a new one is tried meanwhile.
const QUIT_WAIT: Duration = Duration::from_secs(10);
const RETRY_EVERY: Duration = Duration::from_millis(250);

/// Starts the GPU's daemon again after `quit`. The old one leaves its control pipe behind (seen
/// on an H200), so the pipe says nothing about whether it has gone; `-d` refuses while it is
/// still there, so the start is retried until it succeeds or [`QUIT_WAIT`] has passed.
fn start_again(control: &dyn MpsControl, gpu: u32, dirs: &MpsDirs) -> Result<(), FleetError> {
    let deadline = Instant::now() + QUIT_WAIT;
    loop {
        match control.run(&mps::daemon_start(gpu, dirs)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(RETRY_EVERY),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A daemon whose `-d` is refused the first `refusals` times (the old one still leaving).
    struct Leaving {
        refusals: AtomicU32,
    }

    impl MpsControl for Leaving {
        fn run(&self, command: &mps::CommandSpec) -> Result<String, FleetError> {
            let refused = self
                .refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if refused {
                return Err(FleetError::Mps {
                    command: command.display(),
                    detail: "An instance of this daemon is already running".into(),
                });
            }
            Ok(String::new())
        }
    }

    /// A daemon that answers nothing: `quit` times out; only a kill stops it.
    #[derive(Default)]
    struct Wedged {
        killed: AtomicU32,
        started: AtomicU32,
    }

    impl MpsControl for Wedged {
        fn run(&self, command: &mps::CommandSpec) -> Result<String, FleetError> {
            if command.args.iter().any(|a| a == "-d") {
                self.started.fetch_add(1, Ordering::SeqCst);
                return Ok(String::new());
            }
            Err(FleetError::Mps {
                command: command.display(),
                detail: "no answer within 10000 ms".into(),
            })
        }
        fn kill_daemon(&self, _dirs: &MpsDirs) -> Result<usize, FleetError> {
            self.killed.fetch_add(1, Ordering::SeqCst);
            Ok(2)
        }
    }

    fn dirs() -> MpsDirs {
        MpsDirs {
            pipe: "/run/fleet/mps/gpu0".into(),
            log: "/var/log/fleet/mps/gpu0".into(),
        }
    }

    #[test]
    fn a_daemon_that_does_not_quit_is_killed_and_started_again() {
        let wedged = Wedged::default();
        mps::stop_daemon(&wedged, 0, &dirs())
            .and_then(|_| start_again(&wedged, 0, &dirs()))
            .expect("restarted");
        assert_eq!(wedged.killed.load(Ordering::SeqCst), 1);
        assert_eq!(wedged.started.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_new_daemon_is_tried_until_the_old_one_has_left() {
        let dirs = MpsDirs {
            pipe: "/run/fleet/mps/gpu0".into(),
            log: "/var/log/fleet/mps/gpu0".into(),
        };
        let leaving = Leaving {
            refusals: AtomicU32::new(3),
        };
        assert!(start_again(&leaving, 0, &dirs).is_ok());
        assert_eq!(
            leaving.refusals.load(Ordering::SeqCst),
            0,
            "tried until it started"
        );
    }
}
