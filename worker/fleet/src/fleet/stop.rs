//! Stopping: workers (SIGTERM, then SIGKILL), and the MPS daemons this fleet started.

use std::process::Child;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::state::TICK;
use crate::events::FleetEvent;
use crate::mps::{self, MpsControl};

/// `quit` to each daemon this fleet started (after its clients are gone).
pub(super) fn stop_daemons(
    control: &dyn MpsControl,
    events: &Option<Sender<FleetEvent>>,
    daemons: Vec<(u32, mps::MpsDirs)>,
) {
    for (gpu, dirs) in daemons {
        let event = match mps::stop_daemon(control, gpu, &dirs) {
            Ok(_) => {
                tracing::info!(gpu, "stopped MPS control daemon");
                FleetEvent::MpsDaemonStopped { gpu }
            }
            Err(e) => {
                tracing::warn!(gpu, error = %e, "stopping MPS daemon");
                FleetEvent::MpsDaemonStopFailed {
                    gpu,
                    error: e.to_string(),
                }
            }
        };
        if let Some(events) = events {
            let _ = events.send(event);
        }
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

pub(super) fn stop_children(mut children: Vec<Child>, grace: Duration) {
    for c in &children {
        signal(c, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        if children.is_empty() {
            return;
        }
        std::thread::sleep(TICK);
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}
