//! A GPU whose workers keep failing to start under MPS gets its MPS daemon restarted, once per
//! streak of failures: `quit`, then `-d` again. Seen once on an H200: after a client was
//! SIGKILLed and `terminate_client` got no answer, every new client failed with
//! `CUDA_ERROR_MPS_SERVER_NOT_READY` for minutes while the fleet kept restarting workers.
//! Only a daemon this fleet started is restarted (another's is reported, not touched); if the
//! restart does not help, the slots run out of tries and the fleet gives up.

use super::state::{Phase, Shared, State};
use crate::events::FleetEvent;
use crate::mps;

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
            .and_then(|_| mps::ensure_daemon(&*shared.mps, gpu, &dirs));
        let error = restarted.err().map(|e| e.to_string());
        if let Some(error) = &error {
            tracing::error!(gpu, %error, "MPS daemon restart failed");
        }
        shared.emit(FleetEvent::MpsDaemonRestarted { gpu, error });
    }
}
