//! Updates as the running gateway sees them: a rolled-back update is a cause of `degraded`
//! until the owner dismisses it, and a version on trial keeps devices and webhooks out until
//! the helper commits it, so nothing is acknowledged by a version that may yet be rolled back.

use std::time::Duration;

use tracing::info;

use super::state::Hub;
use crate::shutdown::Listener;
use crate::update::stage::Updates;

/// How often a version on trial looks whether the helper has committed it.
const TRIAL_POLL: Duration = Duration::from_millis(500);

impl Hub {
    pub fn updates(&self) -> &Updates {
        &self.updates
    }

    /// Devices and webhooks wait: this version is on trial.
    pub fn on_update_trial(&self) -> bool {
        self.update_trial.get()
    }

    /// Reads the helper's records at start: the failure to show, and whether this version is
    /// on trial (then follows the trial until it ends).
    pub(super) fn follow_update(self: &std::rc::Rc<Self>, mut stop: Listener) {
        self.refresh_update_failure();
        if !self.updates.on_trial() {
            return;
        }
        info!("this version is on trial after an update: devices wait until it is committed");
        self.update_trial.set(true);
        let hub = self.clone();
        tokio::task::spawn_local(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TRIAL_POLL) => {}
                    _ = stop.recv() => return,
                }
                if !hub.updates.on_trial() {
                    hub.update_trial.set(false);
                    hub.refresh_update_failure();
                    info!("update committed: devices are welcome");
                    return;
                }
            }
        });
    }

    /// The owner has seen the rolled-back update `id`.
    pub fn dismiss_update_failure(&self, id: &str) -> Result<(), crate::update::Error> {
        self.updates.dismiss(id)?;
        self.refresh_update_failure();
        Ok(())
    }

    fn refresh_update_failure(&self) {
        let failure = self.updates.failure().map(|e| e.summary());
        self.update_health(|c| c.update_failed = failure);
    }
}
