//! The gateway's health in one plain record: what `iris-gateway status` prints (over the control
//! socket) and what an admin page shows. The same state drives `status` frames and the LED; this
//! adds the causes in words and the figures behind them.

use std::rc::{Rc, Weak};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::port::Back;
use super::port::Port;
use crate::agent::Agent;
use crate::protocol::HealthState;
use crate::settings::{Part, SwitchedOff};
use crate::store::Store;

/// A snapshot of the gateway's health and use, in plain data (serialisable for the control
/// socket). Secrets never appear: agent and push are described by backend and address only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    pub state: HealthState,
    /// Each reason the gateway is degraded, in words (empty when online).
    pub causes: Vec<String>,
    pub version: String,
    pub uptime_secs: u64,
    /// The agent backend and where it is (`Hermes at http://…`), and why it is not usable.
    pub agent: String,
    pub agent_error: Option<String>,
    /// `none`, `ntfy` or `fcm`, and why it is failing.
    pub push: String,
    pub push_error: Option<String>,
    /// A push reached the push server since this start: only then is push called working.
    #[serde(default)]
    pub push_confirmed: bool,
    /// What sled reports for the store, and the newest outbox cursor.
    pub store_bytes: Option<u64>,
    pub cursor_head: u64,
    pub media_bytes: u64,
    pub media_quota_bytes: u64,
    /// Free space on the data disk, when it can be read.
    pub disk_free_bytes: Option<u64>,
    pub devices_paired: usize,
    pub devices_connected: usize,
    /// Why the restore uploaded from the admin page failed at this start (not a cause of
    /// `degraded`: the gateway runs on the store it had).
    #[serde(default)]
    pub restore_failure: Option<String>,
    /// Why the store cannot be written or is damaged, and why media storage refuses uploads,
    /// while they last (each also among `causes`): what the admin page's problems link to.
    #[serde(default)]
    pub storage_error: Option<String>,
    #[serde(default)]
    pub media_full: Option<String>,
    /// Updates: the newest rolled-back one until dismissed (also among `causes`), the one
    /// under way or staged, and whether this version is on trial (devices wait).
    #[serde(default)]
    pub update_failure: Option<String>,
    #[serde(default)]
    pub update_under_way: Option<String>,
    #[serde(default)]
    pub update_trial: bool,
    /// Parts switched off at this start because their saved settings cannot work (also
    /// among `causes`), each with the admin page that fixes it.
    #[serde(default)]
    pub switched_off: Vec<SwitchedOff>,
}

/// What the status asks of the hub beyond the core: the figures and notes other owners keep
/// (health, fan-out, push, media, updates) and the agent's replacement.
pub trait StatusPort: Port {
    /// Why the gateway is degraded, in words, one per cause.
    fn health_reasons(&self) -> Vec<String>;

    /// Whether a push has reached its server since this start.
    fn push_confirmed(&self) -> bool;

    /// The restore waiting for this start failed, and why.
    fn restore_failure(&self) -> Option<String>;

    /// Notes that the restore waiting for this start failed.
    fn note_restore_failure(&self, why: String);

    /// Connections past the hello gate.
    fn connections(&self) -> usize;

    /// The agent behind the hub was replaced: its turns' watch checks the new one.
    fn agent_replaced(&self);

    /// The push backend (`none`, `ntfy`, `fcm`).
    fn push_backend(&self) -> &'static str;

    /// The bytes stored media take.
    fn media_used(&self) -> u64;

    /// The update under way or staged.
    fn update_under_way(&self) -> Option<String>;

    /// This version is on trial after an update.
    fn on_update_trial(&self) -> bool;
}

/// The gateway's notes about itself and the report built from them: what went wrong at this
/// start (a failed restore, parts switched off), what happened since (history damage, a new
/// agent), and the figures `/status` shows. Built inside the hub (it holds the hub weakly: the
/// hub owns it); the doors above the hub reach it through `Hub::status`.
pub struct Status<P> {
    port: Back<P>,
    store: Store,
    agent: Rc<dyn Agent>,
    /// `limits.media_quota_bytes`, as the report shows it.
    media_quota_bytes: u64,
    started: Instant,
}

impl<P: StatusPort> Status<P> {
    /// `port`: the hub being built around this service.
    pub(super) fn new(
        port: Weak<P>,
        store: Store,
        agent: Rc<dyn Agent>,
        media_quota_bytes: u64,
    ) -> Status<P> {
        Status {
            port: Back::new(port),
            store,
            agent,
            media_quota_bytes,
            started: Instant::now(),
        }
    }

    /// Everything `/status` and the admin page show, gathered at once.
    pub fn report(&self) -> StatusReport {
        let hub = self.port.hub();
        let (agent_error, push_error, storage_error, media_full) = hub.health_causes(|c| {
            (
                c.agent_error.clone(),
                c.push_error.clone(),
                c.storage_error
                    .clone()
                    .or_else(|| c.history_damaged.clone()),
                c.media_full.clone(),
            )
        });
        let restore_failure = hub.restore_failure();
        StatusReport {
            state: hub.health_state(),
            causes: hub.health_reasons(),
            version: crate::update::version::running().to_string(),
            uptime_secs: self.started.elapsed().as_secs(),
            agent: self.agent.describe(),
            agent_error,
            push: hub.push_backend().to_owned(),
            push_error,
            push_confirmed: hub.push_confirmed(),
            store_bytes: self.store.size_on_disk().ok(),
            cursor_head: hub.published_head(),
            media_bytes: hub.media_used(),
            media_quota_bytes: self.media_quota_bytes,
            disk_free_bytes: crate::disk::free_bytes(self.store.dir()).ok(),
            devices_paired: self.store.devices().map(|d| d.len()).unwrap_or(0),
            devices_connected: hub.connections(),
            restore_failure,
            storage_error,
            media_full,
            // The failure is held as a cause (read from the history at start and on dismiss).
            update_failure: hub.health_causes(|c| c.update_failed.clone()),
            update_under_way: hub.update_under_way(),
            update_trial: hub.on_update_trial(),
            switched_off: hub.health_causes(|c| c.switched_off()),
        }
    }

    /// The restore waiting for this start failed (`backups/restore.rs` says why).
    pub fn note_restore_failure(&self, why: String) {
        self.port.hub().note_restore_failure(why);
    }

    /// A part starts switched off because its saved settings cannot work: `degraded`, with
    /// that cause, until it is given settings that do (`switched_on`) or the next start.
    pub fn note_switched_off(&self, off: SwitchedOff) {
        tracing::warn!("{}", off.cause());
        self.port
            .hub()
            .update_health(|c| c.set_switched_off(off.part, Some(off.why)));
    }

    /// `part` runs on settings that work again (the admin page gave it new ones).
    pub(super) fn switched_on(&self, part: Part) {
        self.port
            .hub()
            .update_health(|c| c.set_switched_off(part, None));
    }

    /// A backup found the history database damaged: `degraded`, with that cause, until a
    /// restart (damage does not heal; the start-up check looks at the files again).
    pub fn note_history_damaged(&self, why: String) {
        self.port
            .hub()
            .update_health(|c| c.history_damaged = Some(why));
    }

    /// The agent behind the hub was replaced (the admin page saved new settings): forget what
    /// was wrong with the old one and check the new one now.
    pub fn agent_switched(&self) {
        let hub = self.port.hub();
        hub.update_health(|st| st.agent_error = None);
        self.switched_on(Part::Agent);
        hub.agent_replaced();
    }
}

impl StatusReport {
    /// The report for a person at a terminal.
    pub fn to_text(&self) -> String {
        let human = crate::store::human_bytes;
        let state = match self.state {
            HealthState::Online => "online".to_owned(),
            HealthState::Restarting => "restarting".to_owned(),
            HealthState::Degraded => format!("degraded: {}", self.causes.join("; ")),
        };
        let up = self.uptime_secs;
        let agent = match &self.agent_error {
            Some(e) => format!("{}, not usable: {e}", self.agent),
            None => format!("{}, reachable", self.agent),
        };
        let push = match &self.push_error {
            Some(e) => format!("{}, failing: {e}", self.push),
            None => self.push.clone(),
        };
        let store = self
            .store_bytes
            .map_or_else(|| "unreadable".to_owned(), human);
        let free = self
            .disk_free_bytes
            .map_or_else(|| "unknown".to_owned(), human);
        let restore = self
            .restore_failure
            .as_ref()
            .map(|why| format!("\nRestore: {why}"))
            .unwrap_or_default();
        let update = match (&self.update_failure, &self.update_under_way) {
            (_, Some(to)) if self.update_trial => format!("\nUpdate:  {to} on trial"),
            (_, Some(to)) => format!("\nUpdate:  to {to}, under way"),
            (Some(failure), None) => format!("\nUpdate:  {failure}"),
            (None, None) => String::new(),
        };
        format!(
            "Gateway: {state}\n\
             Version: {}, up {}d {}h {:02}m\n\
             Agent:   {agent}\n\
             Push:    {push}\n\
             Storage: store {store}, media {} of {} quota, {free} free on the data disk\n\
             Devices: {} paired, {} connected{restore}{update}",
            self.version,
            up / 86_400,
            (up % 86_400) / 3600,
            (up % 3600) / 60,
            human(self.media_bytes),
            human(self.media_quota_bytes),
            self.devices_paired,
            self.devices_connected,
        )
    }
}
