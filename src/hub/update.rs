//! Updates as the running gateway sees them: a rolled-back update is a cause of `degraded`
//! until the owner dismisses it, and a version on trial keeps devices and webhooks out until
//! the helper commits it, so nothing is acknowledged by a version that may yet be rolled back.
//! `UpdateWatch` owns the staging area and the helper's records (`Updates`) and the trial flag;
//! it reaches the hub only through its port (`port.rs`), for the health.

use std::cell::Cell;
use std::rc::{Rc, Weak};
use std::time::Duration;

use tracing::info;

use super::port::Back;
use super::port::Port;
use crate::shutdown::Listener;
use crate::update::stage::Updates;

/// How often a version on trial looks whether the helper has committed it.
const TRIAL_POLL: Duration = Duration::from_millis(500);

/// The helper's records and staging area, and whether this version is on trial.
pub struct UpdateWatch<P> {
    port: Back<P>,
    stage: Updates,
    /// Shared with the task that follows the trial (`follow`), which clears it.
    trial: Rc<Cell<bool>>,
}

// The doors above the hub only ever see the service over the `Hub` (its accessor), so the
// port it is generic over stays the hub's own.
#[allow(private_bounds)]
impl<P: Port + 'static> UpdateWatch<P> {
    /// `port`: the hub being built around this service (it owns it, so it is held weakly).
    pub(super) fn new(port: Weak<P>, stage: Updates) -> UpdateWatch<P> {
        UpdateWatch {
            port: Back::new(port),
            stage,
            trial: Rc::default(),
        }
    }

    /// The helper's records and the staging area.
    pub fn stage(&self) -> &Updates {
        &self.stage
    }

    /// Devices and webhooks wait: this version is on trial.
    pub fn on_trial(&self) -> bool {
        self.trial.get()
    }

    /// Reads the helper's records at start: the failure to show, and whether this version is
    /// on trial (then follows the trial until it ends).
    pub(super) fn follow(&self, mut stop: Listener) {
        self.refresh_failure();
        if !self.stage.on_trial() {
            return;
        }
        info!("this version is on trial after an update: devices wait until it is committed");
        self.trial.set(true);
        let (port, stage, trial) = (self.port.weak(), self.stage.clone(), self.trial.clone());
        tokio::task::spawn_local(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TRIAL_POLL) => {}
                    _ = stop.recv() => return,
                }
                if !stage.on_trial() {
                    trial.set(false);
                    if let Some(hub) = port.upgrade() {
                        show_failure(&stage, &*hub);
                    }
                    info!("update committed: devices are welcome");
                    return;
                }
            }
        });
    }

    /// The owner has seen the rolled-back update `id`.
    pub fn dismiss_failure(&self, id: &str) -> Result<(), crate::update::Error> {
        self.stage.dismiss(id)?;
        self.refresh_failure();
        Ok(())
    }

    fn refresh_failure(&self) {
        let hub = self.port.hub();
        show_failure(&self.stage, &*hub);
    }
}

/// The helper's rolled-back update, if any, as a cause of `degraded`.
fn show_failure(stage: &Updates, port: &impl Port) {
    let failure = stage.failure().map(|e| e.summary());
    port.update_health(|c| c.update_failed = failure);
}
