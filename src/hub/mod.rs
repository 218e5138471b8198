//! The hub: the single owner of live state (connected devices, lanes, running turns).
//!
//! It turns decoded requests into store changes and fan-out. Everything that must survive goes
//! through the committer (`commit.rs`) first, which makes it durable and only then publishes it,
//! in cursor order, to every connected device. Ephemeral frames (typing, streaming updates) are
//! fanned out directly. The hub runs on the one event-loop thread, so its state sits in a
//! `RefCell` that is never borrowed across an `.await`.

mod admin;
mod approvals;
mod automation;
mod channels;
mod commands;
mod commit;
mod push;
mod search;
mod status;
mod storage;
mod turns;

pub use admin::TestPushError;
pub use status::StatusReport;

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Instant;

use tokio::sync::{mpsc, Semaphore};
use tracing::{info, warn};

/// For the fuzz targets: the webhook body parser is pure.
pub use automation::{parse_webhook_body, HookError};
pub use commit::{CommitError, Origin};

use crate::agent::Agent;
use crate::config::{Config, Limits};
use crate::guessing::GuessLimiter;
use crate::ids;
use crate::media::MediaFiles;
use crate::outlet::{encode_text, CloseReason, ConnId, Outlet};
use crate::protocol::fit::{self, OutBudget};
use crate::protocol::{
    Channel, ErrorCode, Frame, HealthState, Hello, HistoryRequest, Lane, Request, RequestFrame,
    ServerCaps, TodoItem,
};
use crate::store::{Device, DeviceOrigin, MediaRecord, Store, StoreError, DEFAULT_CHAT_ID};

/// A refusal to send back as an `error` frame: the kind of mistake (`error.code`) and what to
/// tell the user about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// The token is unknown or revoked, or the hello is otherwise not acceptable.
    pub fn auth(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::Auth, message)
    }

    /// What the request names does not exist (or not where it says).
    pub fn not_found(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::NotFound, message)
    }

    /// Over a limit the app can wait out.
    pub fn rate_limited(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::RateLimited, message)
    }

    /// A request the gateway does not accept as sent (bad value, over a size limit).
    pub fn unsupported(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::Unsupported, message)
    }

    /// The store failed while answering; the request itself may be fine.
    pub fn internal(e: impl std::fmt::Display) -> Refusal {
        Refusal::new(ErrorCode::Internal, format!("storage error: {e}"))
    }
}

/// A commit that failed is the gateway's fault whatever its kind: the wire has one code for it
/// (`internal`), and the message says which (a storage failure, or the gateway stopping).
impl From<CommitError> for Refusal {
    fn from(e: CommitError) -> Refusal {
        let code = match &e {
            CommitError::Store(_) | CommitError::ShuttingDown => ErrorCode::Internal,
        };
        Refusal::new(code, e.to_string())
    }
}

/// Source addresses whose failed hellos are counted one by one; past them, addresses share one
/// count (`guessing.rs`). A household's phones fit many times over.
const BAD_HELLO_TABLE: usize = 32;

/// Per-lane live state: the running turn's queue and the lane's current todo list.
#[derive(Default)]
struct LaneState {
    running: bool,
    queue: std::collections::VecDeque<turns::QueuedTurn>,
    todos: Vec<TodoItem>,
    /// Ends the running turn early: `/stop`, or its lane or reply was deleted.
    abort: Option<Rc<turns::Abort>>,
    /// The assistant message the running turn is streaming.
    streaming: Option<String>,
    /// The agent's run of the running turn, once it has one (Hermes' runs API).
    run_id: Option<String>,
}

struct State {
    outlets: HashMap<ConnId, Rc<Outlet>>,
    lanes: HashMap<Lane, LaneState>,
    /// Highest cursor that is durable and has been fanned out; `sync` replays up to here.
    published_head: u64,
    next_conn_id: ConnId,
    bad_hellos: GuessLimiter<BAD_HELLO_TABLE>,
    storage_error: Option<String>,
    /// Turns' final changes that could not be stored while the disk failed (`storage.rs`).
    unsettled: Vec<Vec<crate::store::Change>>,
    /// Why pushes are failing, while they are.
    push_error: Option<String>,
    /// Why media storage refuses uploads (quota or disk full), while it does.
    media_full: Option<String>,
    /// Why the agent is unusable (unreachable, key refused), while it is.
    agent_error: Option<String>,
    /// Pickers waiting for a `picker.select` (memory only: a restart expires them).
    pickers: HashMap<String, commands::Picker>,
    /// Approvals offered and not answered yet, by picker id (also in the store: they survive
    /// restarts, unlike the settings pickers).
    approvals: HashMap<String, crate::store::ApprovalRecord>,
    /// The user's `/reasoning`, `/fast` and `/model` choices (also in the store).
    agent_settings: crate::agent::AgentSettings,
    shutting_down: bool,
}

pub struct Hub {
    /// The health state, for whoever shows it outside the protocol (the status LED).
    health_tx: tokio::sync::watch::Sender<HealthState>,
    store: Store,
    media: MediaFiles,
    pusher: crate::push::Pusher,
    config: Config,
    agent: Rc<dyn Agent>,
    state: RefCell<State>,
    committer: mpsc::Sender<commit::CommitJob>,
    turn_slots: Semaphore,
    /// Wakes the agent monitor for an immediate check (a turn just failed to reach it)...
    agent_check: tokio::sync::Notify,
    /// ...and it wakes turns waiting for the agent when it is back.
    agent_back: tokio::sync::Notify,
    started: Instant,
    /// Webhook tokens, the webhook rate window, the cron jobs' bookkeeping.
    automation: RefCell<automation::Automation>,
    /// Backups streaming media right now (`hold_media_files`), and the files whose removal
    /// waits for them.
    media_holds: std::cell::Cell<usize>,
    deferred_blobs: RefCell<Vec<String>>,
}

/// While alive, media files are not deleted (a backup is reading them); see `collect_media`.
pub struct MediaHold<'a>(&'a Hub);

impl Drop for MediaHold<'_> {
    fn drop(&mut self) {
        let hub = self.0;
        hub.media_holds.set(hub.media_holds.get() - 1);
        if hub.media_holds.get() == 0 {
            for sha in std::mem::take(&mut *hub.deferred_blobs.borrow_mut()) {
                hub.media.remove_blob(&sha);
            }
        }
    }
}

impl Hub {
    /// Builds the hub and starts its committer task (must be called inside a `LocalSet`).
    pub fn start(
        store: Store,
        media: MediaFiles,
        pusher: crate::push::Pusher,
        config: Config,
        agent: Rc<dyn Agent>,
    ) -> Result<Rc<Hub>, StoreError> {
        let head = store.cursor_head()?;
        let mut lanes: HashMap<Lane, LaneState> = HashMap::new();
        for (lane, todos) in store.all_todos()? {
            lanes.entry(lane).or_default().todos = todos;
        }
        let (tx, rx) = mpsc::channel(commit::QUEUE_DEPTH);
        let agent_settings = store.agent_settings()?;
        let approvals = store
            .approvals()?
            .into_iter()
            .map(|a| (a.picker_id.clone(), a))
            .collect();
        let bad_hellos = GuessLimiter::new(config.limits.bad_hellos_per_minute, Instant::now());
        let hub = Rc::new(Hub {
            health_tx: tokio::sync::watch::Sender::new(HealthState::Online),
            turn_slots: Semaphore::new(config.limits.max_running_turns),
            store,
            media,
            pusher,
            config,
            agent,
            state: RefCell::new(State {
                outlets: HashMap::new(),
                lanes,
                published_head: head,
                next_conn_id: 1,
                bad_hellos,
                storage_error: None,
                unsettled: Vec::new(),
                push_error: None,
                media_full: None,
                agent_error: None,
                pickers: HashMap::new(),
                approvals,
                agent_settings,
                shutting_down: false,
            }),
            committer: tx,
            agent_check: tokio::sync::Notify::new(),
            agent_back: tokio::sync::Notify::new(),
            started: Instant::now(),
            automation: RefCell::default(),
            media_holds: std::cell::Cell::new(0),
            deferred_blobs: RefCell::default(),
        });
        tokio::task::spawn_local(hub.clone().run_committer(rx));
        tokio::task::spawn_local(hub.clone().storage_monitor());
        // Also for the demo (whose probe always succeeds): the admin page can switch the agent
        // to a network backend while the gateway runs, and that one needs watching.
        tokio::task::spawn_local(hub.clone().agent_monitor());
        Ok(hub)
    }

    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// What each kind of outgoing content may take (`limits.max_out_frame_bytes`).
    pub fn out_budget(&self) -> OutBudget {
        OutBudget::new(self.config.limits.max_out_frame_bytes)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn published_head(&self) -> u64 {
        self.state.borrow().published_head
    }

    pub fn next_conn_id(&self) -> ConnId {
        let mut st = self.state.borrow_mut();
        st.next_conn_id += 1;
        st.next_conn_id
    }

    /// Sockets currently open past the hello gate.
    pub fn connected(&self) -> usize {
        self.state.borrow().outlets.len()
    }

    /// The one health state: drives `status` frames (and, with the board, the LED).
    pub fn health(&self) -> HealthState {
        let st = self.state.borrow();
        if st.shutting_down {
            HealthState::Restarting
        } else if st.storage_error.is_some()
            || st.media_full.is_some()
            || st.push_error.is_some()
            || st.agent_error.is_some()
        {
            HealthState::Degraded
        } else {
            HealthState::Online
        }
    }

    fn caps(&self) -> ServerCaps {
        ServerCaps {
            streaming: true,
            reasoning: true,
            tools: true,
            media: true,
            search: true,
            push: self.pusher.backend(),
            push_ntfy_server: self.pusher.ntfy_server().to_owned(),
            pickers: true,
        }
    }

    /// Checks a hello's token. Repeated failures from one address (IPv6: one /64), or from a
    /// rotation through more addresses than are counted one by one, are refused before the
    /// token is even looked at, so guessing tokens is slow (`guessing.rs`).
    ///
    /// The token is found by its SHA-256 (the `tokens` tree's key), never compared itself: how
    /// long the lookup takes depends only on the hash of what was presented, and learning how
    /// many leading bytes of that hash match a stored one tells nothing about any token (it
    /// would take a SHA-256 preimage to use it), so the check is constant-time in the secret.
    pub fn authenticate(&self, hello: &Hello, ip: IpAddr) -> Result<Device, Refusal> {
        let limit = self.config.limits.bad_hellos_per_minute;
        if let Err(limited) = self.state.borrow().bad_hellos.check(ip, Instant::now()) {
            let wait = limited.retry_after.as_secs().max(1);
            let whose = if limited.shared {
                "from too many addresses at once"
            } else {
                "from this address"
            };
            return Err(Refusal::rate_limited(format!("too many failed hellos {whose} ({limit} per minute, limits.bad_hellos_per_minute); wait {wait} s")));
        }
        if self.state.borrow().shutting_down {
            return Err(Refusal::new(
                ErrorCode::Internal,
                "the gateway is restarting",
            ));
        }
        let found = if hello.token.len() <= 256 {
            self.store
                .device_by_token_hash(&ids::token_hash(&hello.token))
                .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?
        } else {
            None
        };
        let Some(mut device) = found else {
            self.state.borrow_mut().bad_hellos.fail(ip, Instant::now());
            return Err(Refusal::auth(
                "unknown or revoked token: pair this device again (iris-gateway pair)",
            ));
        };
        device.last_seen_ms = Some(ids::now_ms());
        if let Some(app_id) = hello.device_id.as_deref().filter(|s| s.len() <= 128) {
            device.app_device_id = Some(app_id.to_owned());
        }
        if device.name.is_empty() {
            if let Some(name) = hello.device_name.as_deref() {
                device.name = name
                    .chars()
                    .take(self.config.limits.max_name_chars)
                    .collect();
            }
        }
        if let Some(t) = hello.fcm_token.as_deref().filter(|s| s.len() <= 4096) {
            device.fcm_token = Some(t.to_owned());
        }
        if let Some(t) = hello.ntfy_topic.as_deref().filter(|s| s.len() <= 256) {
            device.ntfy_topic = Some(t.to_owned());
        }
        if let Err(e) = self.store.update_device(&device) {
            warn!("could not record the device's hello: {e}");
        }
        // Not a reset: see `guessing.rs` for why a success keeps the count.
        self.state
            .borrow_mut()
            .bad_hellos
            .succeed(ip, Instant::now());
        Ok(device)
    }

    /// Registers an authenticated connection and queues its greeting: `hello.ack`, `status`,
    /// then the todo snapshot of every lane that has one. Done without an await, so the
    /// `sync_cursor` it reports is exactly where live delivery to this device starts.
    pub fn attach(&self, outlet: &Rc<Outlet>, hello_id: Option<i64>) {
        let channels = self.directory_for_wire(self.store.channels().unwrap_or_default());
        let device = self.store.device(&outlet.device_id).ok().flatten();
        let last_pushed = device.map(|d| d.last_pushed_cursor).unwrap_or(0);
        let health = self.health();
        let mut st = self.state.borrow_mut();
        outlet.push_frame(&Frame::hello_ack(
            hello_id,
            &self.caps(),
            st.published_head,
            last_pushed,
            &channels,
        ));
        outlet.push_frame(&Frame::status(health));
        for (lane, ls) in st.lanes.iter() {
            if !ls.todos.is_empty() {
                outlet.push_frame(
                    &Frame::todo_update(&ls.todos).in_lane(&lane.chat_id, lane.thread()),
                );
            }
        }
        st.outlets.insert(outlet.conn_id, outlet.clone());
        drop(st);
        self.pusher.cancel(&outlet.device_id);
    }

    pub fn detach(&self, conn_id: ConnId) {
        let gone = self.state.borrow_mut().outlets.remove(&conn_id);
        if let Some(outlet) = gone {
            self.device_left(&outlet.device_id);
        }
    }

    /// Sends a live-only frame to every connected device, encoded once.
    pub fn broadcast(&self, frame: &Frame, coalesce_key: Option<u64>) {
        let text = encode_text(frame.encode());
        let delivery = frame.delivery();
        let outlets: Vec<Rc<Outlet>> = self.state.borrow().outlets.values().cloned().collect();
        for o in outlets {
            o.push(&text, delivery, coalesce_key);
        }
    }

    fn set_storage_error(&self, error: Option<String>) {
        self.update_health(|st| st.storage_error = error);
    }

    /// What is wrong while the gateway is degraded, for `/status`.
    fn health_causes(&self) -> Vec<String> {
        let st = self.state.borrow();
        [
            &st.storage_error,
            &st.media_full,
            &st.push_error,
            &st.agent_error,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }

    /// Media storage is full (`Some(why)`) or has room again (`None`).
    pub fn set_media_full(&self, why: Option<String>) {
        self.update_health(|st| st.media_full = why);
    }

    fn update_health(&self, change: impl FnOnce(&mut State)) {
        let before = self.health();
        change(&mut self.state.borrow_mut());
        let after = self.health();
        if before != after {
            match after {
                HealthState::Degraded => {
                    let st = self.state.borrow();
                    let causes: Vec<&str> = [
                        &st.storage_error,
                        &st.media_full,
                        &st.push_error,
                        &st.agent_error,
                    ]
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                    warn!("gateway degraded: {}", causes.join("; "));
                }
                _ => info!("gateway back online"),
            }
            self.broadcast(&Frame::status(after), None);
            self.health_tx.send_replace(after);
        }
    }

    /// Follows the health state: the same one `status` frames report.
    pub fn watch_health(&self) -> tokio::sync::watch::Receiver<HealthState> {
        self.health_tx.subscribe()
    }

    /// Routes one decoded request from an authenticated connection.
    pub async fn handle(self: &Rc<Self>, outlet: &Rc<Outlet>, frame: RequestFrame) {
        let id = frame.id;
        let result: Result<(), Refusal> = match frame.request {
            Request::Hello(_) => Err(Refusal::unsupported("this connection already said hello")),
            Request::Ping { ts } => {
                outlet.push_frame(&Frame::pong(id, ts.unwrap_or_else(ids::now_ms)));
                Ok(())
            }
            Request::Sync { cursor } => {
                outlet.push_replay(cursor.max(0) as u64, id);
                Ok(())
            }
            Request::History(h) => self.history(outlet, &frame.chat_id, &frame.thread_id, id, h),
            Request::MessageSend(m) => {
                self.send_message(outlet, frame.chat_id, frame.thread_id, id, m)
                    .await
            }
            Request::ChannelList => {
                self.store
                    .channels()
                    .map_err(Refusal::internal)
                    .map(|channels| {
                        let channels = self.directory_for_wire(channels);
                        outlet.push_frame(&Frame::channel_list(id, &channels));
                    })
            }
            Request::Search(req) => self.search(outlet, id, (frame.chat_id, frame.thread_id), req),
            Request::MessageDelete { message_ids } => {
                self.delete_messages(outlet, id, message_ids).await
            }
            Request::MediaPull { media_id } => match self.store.media(&media_id) {
                Ok(Some(record)) => {
                    outlet.push_pull(self.media.blob_path(&record.sha256), id);
                    Ok(())
                }
                Ok(None) => Err(Refusal::not_found(format!(
                    "no media `{}`",
                    media_id.chars().take(64).collect::<String>()
                ))),
                Err(e) => Err(Refusal::internal(e)),
            },
            Request::MediaUploadStart(_) | Request::MediaUploadEnd { .. } => Err(
                Refusal::unsupported("uploads are handled by the connection"),
            ),
            Request::FcmRegister {
                fcm_token,
                ntfy_topic,
            } => self.register_push_target(&outlet.device_id, fcm_token, ntfy_topic),
            Request::CommandsCatalog => {
                outlet.push_frame(&Frame::commands_catalog(id, self.commands_catalog()));
                Ok(())
            }
            Request::PickerSelect { picker_id, value }
                if picker_id.starts_with(approvals::PICKER_PREFIX) =>
            {
                self.select_approval(outlet, &picker_id, &value).await
            }
            Request::PickerSelect { picker_id, value } => {
                self.picker_select(outlet, &picker_id, &value).await
            }
            Request::AgentStop => self
                .resolve_lane(frame.chat_id.as_deref(), frame.thread_id.as_deref())
                .and_then(|(lane, _)| {
                    // The same as `/stop` in that lane, without a command message to answer.
                    if self.stop_lane(&lane) {
                        Ok(())
                    } else {
                        Err(Refusal::not_found(format!("nothing is running in {lane}")))
                    }
                }),
            other => {
                let target = frame.thread_id.or(frame.chat_id);
                self.handle_channel_request(outlet.conn_id, id, target, other)
                    .await
            }
        };
        if let Err(refusal) = result {
            outlet.push_frame(&Frame::error(id, refusal.code, refusal.message));
        }
    }

    fn history(
        &self,
        outlet: &Outlet,
        chat_id: &Option<String>,
        thread_id: &Option<String>,
        id: Option<i64>,
        req: HistoryRequest,
    ) -> Result<(), Refusal> {
        let (lane, _) = self.resolve_lane(chat_id.as_deref(), thread_id.as_deref())?;
        let limits = &self.config.limits;
        let limit = match req.limit {
            None => limits.history_default,
            Some(n) if n >= 1 => (n as usize).min(limits.history_max),
            Some(n) => {
                return Err(Refusal::unsupported(format!(
                    "history limit must be at least 1 (got {n})"
                )))
            }
        };
        let page = self
            .store
            .history_page(&lane, req.before_message_id.as_deref(), limit)
            .map_err(Refusal::internal)?
            .ok_or_else(|| {
                let before = req.before_message_id.as_deref().unwrap_or("");
                let message = match self.store.message(before) {
                    Ok(Some((other, _))) => {
                        format!("before_message_id `{before}` belongs to {other}, not {lane}")
                    }
                    _ => format!("before_message_id `{before}`: no such message"),
                };
                Refusal::not_found(message)
            })?;
        // Bounded by bytes as well as by count: a page that would not fit one frame ends
        // early, saying `has_more`, and the app pages on from its oldest message.
        let (messages, cut_short) = fit::history_within(page.messages, &self.out_budget());
        let oldest = messages.first().map(|m| m.message_id.as_str());
        outlet.push_frame(
            &Frame::history(id, &messages, page.has_more || cut_short, oldest)
                .in_lane(&lane.chat_id, lane.thread()),
        );
        Ok(())
    }

    /// Resolves a frame's `chat_id`/`thread_id` to a lane and its root channel.
    ///
    /// The addressing rule: a thread's frames carry `chat_id` = its parent channel and
    /// `thread_id` = the thread's own id. For convenience a thread's own id alone in `chat_id`
    /// is accepted too and means the same lane. No `chat_id` means the default channel.
    pub fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        let default_id;
        let chat_id = match chat_id {
            Some(c) => c,
            None => {
                default_id = self.default_channel_id();
                default_id.as_str()
            }
        };
        let entry = self.channel(chat_id)?;
        if entry.is_thread() {
            if thread_id.is_some() {
                return Err(Refusal::not_found(format!(
                    "`{chat_id}` is a thread; use its parent as chat_id"
                )));
            }
            let parent = entry.parent_chat_id.clone().unwrap_or_default();
            let root = self.channel(&parent)?;
            return Ok((Lane::new(&parent, Some(chat_id)), root));
        }
        if let Some(t) = thread_id {
            let thread = self.channel(t)?;
            if !thread.is_thread() || thread.parent_chat_id.as_deref() != Some(chat_id) {
                return Err(Refusal::not_found(format!(
                    "no thread `{t}` in channel `{chat_id}`"
                )));
            }
        }
        Ok((Lane::new(chat_id, thread_id), entry))
    }

    fn channel(&self, chat_id: &str) -> Result<Channel, Refusal> {
        self.store
            .channel(chat_id)
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::not_found(format!("no channel `{chat_id}`")))
    }

    fn default_channel_id(&self) -> String {
        self.store
            .channels()
            .ok()
            .and_then(|all| all.into_iter().find(|c| c.is_default))
            .map(|c| c.chat_id)
            .unwrap_or_else(|| DEFAULT_CHAT_ID.to_owned())
    }

    pub fn media_files(&self) -> &MediaFiles {
        &self.media
    }

    /// Records a verified upload under the device's ref, durably, and returns its record.
    pub async fn finish_upload(
        &self,
        device_id: &str,
        media_ref: &str,
        start: &crate::protocol::UploadStart,
        sha256: String,
        size: u64,
    ) -> Result<MediaRecord, StoreError> {
        let record = MediaRecord {
            media_id: ids::time_ordered("med"),
            sha256,
            kind: start.kind.clone(),
            mime: start.mime.chars().take(128).collect(),
            size,
            filename: crate::media::clean_filename(&start.filename),
            created_ms: ids::now_ms(),
        };
        self.store.add_media(&record, device_id, media_ref)?;
        self.store.sync().await?;
        self.set_media_full(None);
        Ok(record)
    }

    /// Deletes media that no message uses any more, and their files. The records' removal is
    /// made durable before any file goes, so a crash can leave an orphaned file (removed at the
    /// next start) but never a record whose bytes are gone.
    pub async fn collect_media(&self, media_ids: &[String]) {
        if media_ids.is_empty() {
            return;
        }
        let freed = match self.store.collect_unused(media_ids) {
            Ok(freed) => freed,
            Err(e) => return warn!("media clean-up failed: {e}"),
        };
        if let Err(e) = self.store.sync().await {
            return warn!("media clean-up not durable, files kept: {e}");
        }
        if self.media_holds.get() > 0 {
            // A backup is streaming media: the files go when it is done.
            self.deferred_blobs.borrow_mut().extend(freed);
            return;
        }
        for sha in freed {
            self.media.remove_blob(&sha);
        }
    }

    /// Keeps every media file on disk until the returned hold is dropped (`backup`).
    pub fn hold_media_files(&self) -> MediaHold<'_> {
        self.media_holds.set(self.media_holds.get() + 1);
        MediaHold(self)
    }

    /// Mints a device and its token (the `pair` command, through the control socket).
    pub async fn pair(&self, name: &str) -> Result<(Device, String), StoreError> {
        let (device, token) = new_device(name, DeviceOrigin::Pair);
        self.store.add_device(&device)?;
        self.store.sync().await?;
        info!(device = %device.device_id, name = %device.name, "paired a new device");
        Ok((device, token))
    }

    /// Removes a device and closes its open sockets; its next hello gets `error{auth}`.
    pub async fn revoke(&self, device_id: &str) -> Result<bool, StoreError> {
        let existed = self.store.remove_device(device_id)?;
        self.pusher.cancel(device_id);
        self.store.sync().await?;
        let outlets: Vec<Rc<Outlet>> = self
            .state
            .borrow()
            .outlets
            .values()
            .filter(|o| o.device_id == device_id)
            .cloned()
            .collect();
        for o in outlets {
            o.push_frame(&Frame::error(
                None,
                ErrorCode::Auth,
                "this device was revoked",
            ));
            o.close(CloseReason::Revoked);
        }
        if existed {
            info!(device = %device_id, "revoked a device");
        }
        Ok(existed)
    }

    /// The shutdown path: tell every device the gateway is restarting, then close them all.
    pub fn begin_shutdown(&self) {
        self.state.borrow_mut().shutting_down = true;
        self.health_tx.send_replace(HealthState::Restarting);
        self.broadcast(&Frame::status(HealthState::Restarting), None);
        let outlets: Vec<Rc<Outlet>> = self.state.borrow().outlets.values().cloned().collect();
        for o in outlets {
            o.close(CloseReason::Restarting);
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.state.borrow().shutting_down
    }
}

/// A new device record and the token that authenticates it (returned once, never stored).
pub fn new_device(name: &str, origin: DeviceOrigin) -> (Device, String) {
    let token = ids::pairing_token();
    let device = Device {
        device_id: ids::time_ordered("dev"),
        name: name.chars().take(100).collect(),
        origin,
        created_ms: ids::now_ms(),
        last_seen_ms: None,
        app_device_id: None,
        last_pushed_cursor: 0,
        fcm_token: None,
        ntfy_topic: None,
        token_hash: ids::token_hash(&token),
        seen_cursor: 0,
    };
    (device, token)
}

/// A message the gateway itself writes (command answers, automation posts, restart notices):
/// no model, no footer data, stamped now.
fn gateway_message(role: crate::protocol::Role, text: String) -> crate::protocol::HistoryMessage {
    crate::protocol::HistoryMessage {
        message_id: ids::message_id(),
        role,
        text,
        reasoning: None,
        model: None,
        tokens: None,
        runtime: None,
        ts: ids::now_ms(),
        media: Vec::new(),
    }
}

/// Coalescing key for a streamed frame: same kind, same message, same tool → same key.
fn coalesce_key(kind: &str, message_id: &str, index: i64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind, message_id, index).hash(&mut h);
    h.finish()
}
