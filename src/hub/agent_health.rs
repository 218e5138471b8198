//! The agent health monitor: probes the agent, drives the `degraded` state while it is
//! unusable, and wakes turns waiting for it when it is back.

use std::rc::Rc;

use tracing::warn;

use crate::agent::AgentError;

use super::state::Hub;
use crate::shutdown::Listener;

impl Hub {
    /// A turn found the agent unusable: report `degraded` and have the monitor watch for its
    /// return.
    pub(super) fn agent_unusable(&self, e: &AgentError) {
        self.update_health(|st| st.agent_error = Some(e.to_string()));
        self.agent_watch.check.notify_one();
    }

    /// The agent answered: clear `degraded` for it and wake the turns waiting for it.
    pub(super) fn agent_usable(&self) {
        if self.health.causes(|c| c.agent_error.is_some()) {
            self.update_health(|st| st.agent_error = None);
            self.agent_watch.back.notify_waiters();
        }
    }

    /// Watches the agent: every `agent.probe_interval_secs` while it is usable, every second while
    /// it is not, and at once when a turn could not reach it. Drives the `degraded` state and wakes
    /// turns waiting for the agent.
    pub(super) async fn agent_monitor(self: Rc<Self>, mut stop: Listener) {
        let calm = std::time::Duration::from_secs(self.config.agent.probe_interval_secs.max(1));
        let mut first = true;
        loop {
            if !first {
                let down = self.health.causes(|c| c.agent_error.is_some());
                let pause = if down {
                    std::time::Duration::from_secs(1)
                } else {
                    calm
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = self.agent_watch.check.notified() => {}
                    _ = stop.recv() => return,
                }
            }
            first = false;
            // A probe of a hung agent must not hold the shutdown up.
            let probed = tokio::select! {
                probed = self.agent.probe() => probed,
                _ = stop.recv() => return,
            };
            match probed {
                Ok(()) => self.agent_usable(),
                Err(e) if e.agent_is_down() => {
                    if self.health.causes(|c| c.agent_error.is_none()) {
                        warn!("agent check failed: {e}");
                    }
                    self.update_health(|st| st.agent_error = Some(e.to_string()));
                }
                Err(e) => tracing::debug!("agent check: {e}"),
            }
        }
    }
}
