//! Stopping: workers first (SIGTERM, then SIGKILL), then the MPS daemons this fleet started.

use std::process::Child;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::{Fleet, TICK};
use crate::error::FleetError;
use crate::events::FleetEvent;
use crate::mps::{self, MpsControl};

impl Fleet {
    /// Stops every worker (SIGTERM, then SIGKILL after a grace period) and MPS daemons this
    /// fleet started. Waiting submitters get `ShuttingDown`.
    pub fn shutdown(&self) {
        let (children, daemons) = {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            for req in state.requests.values_mut() {
                if req.outcome.is_none() {
                    req.finish(Err(FleetError::ShuttingDown));
                }
            }
            let children: Vec<Child> = state
                .slots
                .iter_mut()
                .filter_map(|s| {
                    if let Some(c) = s.conn.take() {
                        c.close();
                    }
                    s.child.take()
                })
                .collect();
            (children, std::mem::take(&mut state.mps_started))
        };
        self.shared.changed.notify_all();
        let monitor = self
            .monitor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(monitor) = monitor {
            let _ = monitor.join();
        }
        stop_children(children, Duration::from_secs(2));
        stop_daemons(&*self.shared.mps, &self.shared.events, daemons);
        if !std::mem::replace(&mut self.shared.lock().stopped, true) {
            self.shared.emit(FleetEvent::Stopped);
        }
    }
}

/// `quit` to each daemon this fleet started (after its clients are gone).
pub(super) fn stop_daemons(
    control: &dyn MpsControl,
    events: &Option<Sender<FleetEvent>>,
    daemons: Vec<(u32, mps::MpsDirs)>,
) {
    for (gpu, dirs) in daemons {
        let event = match control.run(&mps::daemon_stop(gpu, &dirs)) {
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

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

fn stop_children(mut children: Vec<Child>, grace: Duration) {
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
