//! The hub's base: the `Hub` itself (the services it owns and drives), the small helpers every
//! part of the hub uses (fan-out, health), and one accessor for each service the doors above
//! the hub call (`devices()`, `status()`, `automation()`, `media()`, `push()`, `updates()`).
//! The services reach back only through their ports (`port.rs`, `hub_port.rs`) and never name
//! the `Hub`; the turns borrow two free helpers from here (`gateway_message`, `coalesce_key`).

use std::hash::{Hash, Hasher};
use std::rc::Rc;

use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::agent::Agent;
use crate::config::{Config, Limits};
use crate::ids;
use crate::media::MediaFiles;
use crate::outlet::{encode_text, CloseReason, ConnId, Outlet};
use crate::protocol::fit::OutBudget;
use crate::protocol::{Frame, HealthState, ServerCaps};
use crate::shutdown::{Listener, Shutdown};
use crate::store::{Change, Store, StoreError, StoreView};

use super::errors::CommitError;
use super::health::Causes;

/// Jobs that may wait for the committer; a full queue makes requests wait (backpressure).
pub const QUEUE_DEPTH: usize = 256;

pub struct Hub {
    /// Why the gateway is degraded, whether it is stopping (`health.rs`).
    pub(super) health: super::health::Health,
    pub(super) store: Store,
    /// The same store, read-only, for the doors above the hub (made once: it shares the
    /// store's handles, so a reopen after a storage failure shows through it).
    view: StoreView,
    /// The media files, uploads and the backups' holds on them (`media.rs`).
    pub(super) media: super::media::Media<Hub>,
    /// The push worker and what is owed to away devices (`push.rs`).
    pub(super) push: super::push::Push<Hub>,
    pub(super) config: Config,
    pub(super) agent: Rc<dyn Agent>,
    /// Every lane's turns and what runs them: queues, slots, the agent watch, the speech
    /// services (`turns/`).
    pub(super) turns: Rc<super::turns::Turns<Hub>>,
    /// The channel directory: lookups, lane resolution, `channel.*` requests (`directory.rs`).
    pub(super) directory: super::directory::Directory,
    /// The connected devices' outlets and how far frames were published to them.
    pub(super) fanout: super::fanout::Fanout,
    /// The gateway's own commands, and the user's choices and settings pickers they own
    /// (`commands.rs`, `choices.rs`).
    pub(super) commands: super::commands::Commands,
    /// The user's messages on their way in: `message.send`, `agent.steer` (`message_send.rs`).
    pub(super) messages: super::message_send::Messages,
    /// Approvals offered and not answered yet, and their answers (`approvals.rs`).
    pub(super) open_approvals: super::approvals::OpenApprovals,
    /// Each device's requests waiting on the agent, one per kind (`agent_calls.rs`).
    pub(super) agent_calls: super::agent_calls::AgentCalls,
    /// Per lane, where the household has read it up to (`read_marks.rs`).
    pub(super) read_marks: super::read_marks::ReadMarks,
    /// The data disk's watch and the answers kept while it failed (`storage.rs`).
    pub(super) storage: super::storage::StorageWatch,
    /// The paired devices: hellos (and the failed-hello limiter), pairing, revoking (`devices.rs`).
    devices: super::devices::Devices<Hub>,
    /// The gateway's notes about itself and the `/status` report (`status.rs`).
    pub(super) status: super::status::Status<Hub>,
    pub(super) committer: mpsc::Sender<CommitJob>,
    /// The agent's scheduled jobs: their delivery and `/jobs` (`jobs.rs`).
    pub(super) jobs: super::jobs::AgentJobs,
    /// Webhooks, cron jobs and the automation channels they post into (`automation.rs`).
    pub(super) automation: Rc<super::automation::Automation<Hub>>,
    /// Searches, history pages' query budget, deletions (`search.rs`).
    pub(super) queries: super::search::Queries,
    /// Updates: the helper's records, the staging area, the trial (`update.rs`).
    pub(super) updates: super::update::UpdateWatch<Hub>,
}

/// How the requesting connection is answered, next to the broadcast.
pub struct Origin {
    pub conn: ConnId,
    /// Sent to the requester just before the first broadcast frame (e.g. `read.receipt`).
    pub before: Option<Frame>,
    /// Sent to the requester instead of the broadcast frame at this index (the same frame
    /// carrying the request's `id`).
    pub reply: Option<(usize, Frame)>,
}

pub struct CommitJob {
    pub(super) changes: Vec<Change>,
    pub(super) origin: Option<Origin>,
    pub(super) done: oneshot::Sender<Result<Vec<u64>, CommitError>>,
}

impl Hub {
    /// Builds the hub and starts its tasks (must be called inside a `LocalSet`): the storage
    /// and agent monitors stop with `shutdown`; the committer stops at `committer_stop`, which
    /// the server gives last, once nothing is left to commit.
    pub fn start(
        store: Store,
        media: MediaFiles,
        pusher: crate::push::Pusher,
        config: Config,
        agent: Rc<dyn Agent>,
        shutdown: &Shutdown,
        committer_stop: Listener,
    ) -> Result<Rc<Hub>, StoreError> {
        let head = store.cursor_head()?;
        let todos = store.all_todos()?;
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let choices = super::choices::Choices::new(
            store.agent_settings()?,
            store.lane_models()?,
            store.lane_voices()?,
        );
        let read_marks = super::read_marks::ReadMarks::new(store.clone(), store.read_marks()?);
        let open_approvals =
            super::approvals::OpenApprovals::new(store.approvals()?, store.clone(), agent.clone());
        let commands = super::commands::Commands::new(choices, agent.clone());
        let messages =
            super::message_send::Messages::new(store.clone(), agent.clone(), config.limits.clone());
        let updates = crate::update::stage::Updates::new(&config.update, store.dir());
        let queries =
            super::search::Queries::new(store.clone(), config.limits.clone(), agent.clone());
        let storage = super::storage::StorageWatch::new(store.clone());
        let max_running_turns = config.limits.max_running_turns;
        let directory = super::directory::Directory::new(store.clone(), config.limits.clone());
        let jobs =
            super::jobs::AgentJobs::new(store.clone(), agent.clone(), config.limits.max_text_bytes);
        let hub = Rc::new_cyclic(|hub| Hub {
            health: super::health::Health::new(),
            turns: Rc::new(super::turns::Turns::new(
                hub.clone(),
                max_running_turns,
                todos,
            )),
            devices: super::devices::Devices::new(hub.clone(), store.clone(), &config.limits),
            status: super::status::Status::new(
                hub.clone(),
                store.clone(),
                agent.clone(),
                config.limits.media_quota_bytes,
            ),
            automation: Rc::new(super::automation::Automation::new(
                hub.clone(),
                store.clone(),
                config.limits.clone(),
            )),
            view: store.view(),
            directory,
            media: super::media::Media::new(hub.clone(), media, store.clone()),
            push: super::push::Push::new(hub.clone(), pusher, store.clone()),
            store,
            config,
            agent,
            committer: tx,
            fanout: super::fanout::Fanout::new(head),
            commands,
            messages,
            open_approvals,
            agent_calls: Default::default(),
            read_marks,
            storage,
            jobs,
            queries,
            updates: super::update::UpdateWatch::new(hub.clone(), updates),
        });
        tokio::task::spawn_local(hub.clone().run_committer(rx, committer_stop));
        let (watched, stop) = (hub.clone(), shutdown.listener());
        tokio::task::spawn_local(async move { watched.storage.watch(&*watched, stop).await });
        // Also for the demo (whose probe always succeeds): the admin page can switch the agent
        // to a network backend while the gateway runs, and that one needs watching.
        hub.turns.watch_agent(shutdown.listener());
        hub.updates.follow(shutdown.listener());
        Ok(hub)
    }

    /// The configured limits, for the connection's read limits.
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// What each kind of outgoing content may take (`limits.max_out_frame_bytes`).
    pub fn out_budget(&self) -> OutBudget {
        OutBudget::new(self.config.limits.max_out_frame_bytes)
    }

    /// The store, for the connection's `sync` replay and the doors that read it.
    pub fn store(&self) -> &StoreView {
        &self.view
    }

    /// Where live fan-out is: a replay reads up to here, then switches to live.
    pub fn published_head(&self) -> u64 {
        self.fanout.published_head()
    }

    /// A fresh id for a connection that passed the hello gate.
    pub fn next_conn_id(&self) -> ConnId {
        self.fanout.next_conn_id()
    }

    /// Sockets currently open past the hello gate.
    pub fn connected(&self) -> usize {
        self.fanout.count()
    }

    /// The one health state: drives `status` frames (and, with the board, the LED).
    pub fn health(&self) -> HealthState {
        self.health.state()
    }

    /// What this gateway offers, as `hello.ack` says it.
    pub(super) fn caps(&self) -> ServerCaps {
        ServerCaps {
            streaming: true,
            reasoning: true,
            tools: true,
            media: true,
            search: true,
            push: self.push.backend().as_str(),
            push_ntfy_server: self.push.ntfy_server().to_owned(),
            pickers: true,
            extensions: if self.agent.can_steer() {
                crate::protocol::EXTENSIONS_WITH_STEER
            } else {
                crate::protocol::EXTENSIONS
            },
        }
    }

    /// Sends a live-only frame to every connected device, encoded once.
    pub fn broadcast(&self, frame: &Frame, coalesce_key: Option<u64>) {
        let text = encode_text(frame.encode());
        let delivery = frame.delivery();
        for o in self.fanout.all() {
            o.push(&text, delivery, coalesce_key);
        }
    }

    /// Sends a live-only frame, encoded once, to the connected devices `to` picks (those that
    /// asked for the extension the frame belongs to).
    pub(super) fn broadcast_to(&self, frame: &Frame, to: impl Fn(&Outlet) -> bool) {
        let text = encode_text(frame.encode());
        let delivery = frame.delivery();
        for o in self.fanout.all().into_iter().filter(|o| to(o)) {
            o.push(&text, delivery, None);
        }
    }

    /// Storage is failing (`Some(why)`) or works again (`None`).
    pub(super) fn set_storage_error(&self, error: Option<String>) {
        self.update_health(|st| st.storage_error = error);
    }

    /// Changes a cause of `degraded`; a change of the health state itself is logged, sent to
    /// every device as `status`, and passed to whoever watches it.
    pub(super) fn update_health(&self, change: impl FnOnce(&mut Causes)) {
        if let Some(after) = self.health.change(change) {
            match after {
                HealthState::Degraded => {
                    warn!("gateway degraded: {}", self.health.reasons().join("; "))
                }
                _ => info!("gateway back online"),
            }
            self.broadcast(&Frame::status(after), None);
        }
    }

    /// Follows the health state: the same one `status` frames report.
    pub fn watch_health(&self) -> tokio::sync::watch::Receiver<HealthState> {
        self.health.watch()
    }

    /// The shutdown path: tell every device the gateway is restarting, then close them all.
    pub fn begin_shutdown(&self) {
        self.health.begin_shutdown();
        self.broadcast(&Frame::status(HealthState::Restarting), None);
        for o in self.fanout.all() {
            o.close(CloseReason::Restarting);
        }
    }

    /// Set once by `begin_shutdown`: no new turns, no new hellos.
    pub fn is_shutting_down(&self) -> bool {
        self.health.is_shutting_down()
    }

    /// The media files and what is done with them: uploads (`session/upload.rs`), the backups'
    /// holds, the clean-up at start (`media.rs`).
    pub fn media(&self) -> &super::media::Media<Hub> {
        &self.media
    }

    /// The paired devices: a connection's hello, pairing and revoking (`Devices`).
    pub fn devices(&self) -> &super::devices::Devices<Hub> {
        &self.devices
    }

    /// The gateway's notes about itself and the `/status` report (`Status`).
    pub fn status(&self) -> &super::status::Status<Hub> {
        &self.status
    }

    /// Webhooks and cron jobs: the server starts them, the HTTP front hands them webhook
    /// requests (`Automation`).
    pub fn automation(&self) -> &Rc<super::automation::Automation<Hub>> {
        &self.automation
    }

    /// Push as the server drives it: the worker's outcomes, the catch-up at start (`push.rs`).
    pub fn push(&self) -> &super::push::Push<Hub> {
        &self.push
    }

    /// Updates as the doors see them: the staging area (admin page), the trial (front door)
    /// (`update.rs`).
    pub fn updates(&self) -> &super::update::UpdateWatch<Hub> {
        &self.updates
    }
}

/// A message the gateway itself writes (command answers, automation posts, restart notices):
/// no model, no footer data, stamped now.
pub(super) fn gateway_message(
    role: crate::protocol::Role,
    text: String,
) -> crate::protocol::HistoryMessage {
    crate::protocol::HistoryMessage::text_only(ids::message_id(), role, text, ids::now_ms())
}

/// Coalescing key for a streamed frame: same kind, same message, same tool → same key.
pub(super) fn coalesce_key(kind: &str, message_id: &str, index: i64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind, message_id, index).hash(&mut h);
    h.finish()
}
