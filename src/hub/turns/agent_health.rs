//! The agent health monitor: probes the agent, drives the `degraded` state while it is
//! unusable, and wakes turns waiting for it when it is back.

use std::rc::Rc;

use tracing::warn;

use crate::agent::AgentError;

use crate::shutdown::Listener;

use super::{TurnPort, Turns};

/// The agent monitor and the turns waiting for the agent wake each other through these.
#[derive(Default)]
pub(super) struct AgentWatch {
    /// Wakes the monitor for an immediate check (a turn just failed to reach the agent)...
    pub(super) check: tokio::sync::Notify,
    /// ...and the monitor wakes turns waiting for the agent when it is back.
    pub(super) back: tokio::sync::Notify,
}

impl<P: TurnPort> Turns<P> {
    /// A turn found the agent unusable: report `degraded` and have the monitor watch for its
    /// return.
    pub(super) fn agent_unusable(&self, e: &AgentError) {
        self.hub().set_agent_error(Some(e.to_string()));
        self.watch.check.notify_one();
    }

    /// The agent answered: clear `degraded` for it and wake the turns waiting for it.
    pub(super) fn agent_usable(&self) {
        if self.hub().agent_is_down() {
            self.hub().set_agent_error(None);
            self.watch.back.notify_waiters();
        }
    }

    /// Watches the agent: every `agent.probe_interval_secs` while it is usable, every second while
    /// it is not, and at once when a turn could not reach it. Drives the `degraded` state and wakes
    /// turns waiting for the agent.
    pub(in crate::hub) fn watch_agent(self: &Rc<Self>, stop: Listener) {
        self.spawn(self.clone().agent_monitor(stop));
    }

    async fn agent_monitor(self: Rc<Self>, mut stop: Listener) {
        let calm =
            std::time::Duration::from_secs(self.hub().config().agent.probe_interval_secs.max(1));
        let mut first = true;
        loop {
            if !first {
                let down = self.hub().agent_is_down();
                let pause = if down {
                    std::time::Duration::from_secs(1)
                } else {
                    calm
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = self.watch.check.notified() => {}
                    _ = stop.recv() => return,
                }
            }
            first = false;
            // A probe of a hung agent must not hold the shutdown up.
            let hub = self.hub();
            let probed = tokio::select! {
                probed = hub.agent().probe() => probed,
                _ = stop.recv() => return,
            };
            match probed {
                Ok(()) => self.agent_usable(),
                Err(e) if e.agent_is_down() => {
                    if !self.hub().agent_is_down() {
                        warn!("agent check failed: {e}");
                    }
                    self.hub().set_agent_error(Some(e.to_string()));
                }
                Err(e) => tracing::debug!("agent check: {e}"),
            }
        }
    }

    /// The agent behind the hub was replaced: turns waiting for the old one try the new one,
    /// and the monitor checks it now.
    pub(in crate::hub) fn agent_switched(&self) {
        self.watch.back.notify_waiters();
        self.watch.check.notify_one();
    }
}
