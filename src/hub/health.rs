//! The gateway's health: why it is degraded (one cause per part that can fail), whether it is
//! shutting down, and why a restore failed at this start. Its one owner; every change goes
//! through `change` or `begin_shutdown`, which say whether the state itself moved, so the hub
//! tells devices and the LED exactly once.

use std::cell::RefCell;

use crate::protocol::HealthState;
use crate::settings::{Part, SwitchedOff};

/// A switched-off part with its cause in words, made once (`reasons` lends them out).
pub(super) struct OffCause {
    off: SwitchedOff,
    cause: String,
}

/// What the owner can do about a damaged history database, said with the cause: the start-up
/// check does not read every row, so a restart alone may hide the damage until it is read again.
pub(super) fn history_damage_fix() -> String {
    format!(
        "restore your latest backup (the admin page's Backup, or {}), which keeps the damaged \
         files aside",
        crate::hints::command("restore FILE")
    )
}

/// What makes the gateway `degraded`: one cause per part that can fail, each the reason shown
/// while it lasts. Any cause set means degraded; all clear means online.
#[derive(Default)]
pub struct Causes {
    pub(super) storage_error: Option<String>,
    /// The history database turned out damaged while running (a backup, a history page or a
    /// search could not read it): it does not heal, so this lasts until a restart (whose
    /// start-up check looks again).
    pub(super) history_damaged: Option<String>,
    /// An update failed and was rolled back, until the owner dismisses it on the admin page.
    pub(super) update_failed: Option<String>,
    /// Why pushes are failing, while they are.
    pub(super) push_error: Option<String>,
    /// Why media storage refuses uploads (quota or disk full), while it does.
    pub(super) media_full: Option<String>,
    /// Why the agent is unusable (unreachable, key refused), while it is.
    pub(super) agent_error: Option<String>,
    /// Parts that started switched off because their saved settings cannot work, each until
    /// the admin page gives it settings that do (push: until the next start).
    pub(super) switched_off: Vec<OffCause>,
}

impl Causes {
    /// The reasons that are set, in a fixed order (storage first: it matters most).
    pub(super) fn reasons(&self) -> impl Iterator<Item = &str> {
        [
            &self.storage_error,
            &self.history_damaged,
            &self.update_failed,
            &self.media_full,
            &self.push_error,
            &self.agent_error,
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .chain(self.switched_off.iter().map(|c| c.cause.as_str()))
    }

    /// Switches `part` off (again), or back on with `None`.
    pub(super) fn set_switched_off(&mut self, part: Part, why: Option<String>) {
        self.switched_off.retain(|c| c.off.part != part);
        if let Some(why) = why {
            let off = SwitchedOff { part, why };
            let cause = off.cause();
            self.switched_off.push(OffCause { off, cause });
        }
    }

    /// The parts switched off now.
    pub(super) fn switched_off(&self) -> Vec<SwitchedOff> {
        self.switched_off.iter().map(|c| c.off.clone()).collect()
    }

    /// Any cause set: the gateway is degraded.
    pub(super) fn any(&self) -> bool {
        self.reasons().next().is_some()
    }
}

pub struct Health {
    inner: RefCell<Inner>,
    /// The health state, for whoever shows it outside the protocol (the status LED).
    watch: tokio::sync::watch::Sender<HealthState>,
}

#[derive(Default)]
struct Inner {
    causes: Causes,
    shutting_down: bool,
    restore_failure: Option<String>,
    /// A push reached the push server since this start (a delivery or the admin page's test):
    /// until then no one knows the settings work, so no page may say they do.
    push_confirmed: bool,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            inner: RefCell::default(),
            watch: tokio::sync::watch::Sender::new(HealthState::Online),
        }
    }

    /// The one health state: drives `status` frames (and, with the board, the LED).
    pub(super) fn state(&self) -> HealthState {
        let i = self.inner.borrow();
        if i.shutting_down {
            HealthState::Restarting
        } else if i.causes.any() {
            HealthState::Degraded
        } else {
            HealthState::Online
        }
    }

    /// What is wrong while the gateway is degraded, storage first.
    pub(super) fn reasons(&self) -> Vec<String> {
        self.inner
            .borrow()
            .causes
            .reasons()
            .map(str::to_owned)
            .collect()
    }

    /// Reads the causes (e.g. whether the agent is the one that is down).
    pub(super) fn causes<T>(&self, read: impl FnOnce(&Causes) -> T) -> T {
        read(&self.inner.borrow().causes)
    }

    /// Changes a cause; `Some(new state)` when the health state itself moved (already passed
    /// to the watchers; the caller tells the devices).
    pub(super) fn change(&self, change: impl FnOnce(&mut Causes)) -> Option<HealthState> {
        let before = self.state();
        change(&mut self.inner.borrow_mut().causes);
        let after = self.state();
        (before != after).then(|| {
            self.watch.send_replace(after);
            after
        })
    }

    /// From now on `Restarting`, for good.
    pub(super) fn begin_shutdown(&self) {
        self.inner.borrow_mut().shutting_down = true;
        self.watch.send_replace(HealthState::Restarting);
    }

    pub(super) fn is_shutting_down(&self) -> bool {
        self.inner.borrow().shutting_down
    }

    pub(super) fn note_restore_failure(&self, why: String) {
        self.inner.borrow_mut().restore_failure = Some(why);
    }

    pub(super) fn confirm_push(&self) {
        self.inner.borrow_mut().push_confirmed = true;
    }

    pub(super) fn push_confirmed(&self) -> bool {
        self.inner.borrow().push_confirmed
    }

    pub(super) fn restore_failure(&self) -> Option<String> {
        self.inner.borrow().restore_failure.clone()
    }

    pub(super) fn watch(&self) -> tokio::sync::watch::Receiver<HealthState> {
        self.watch.subscribe()
    }
}
