//! The port: the narrow way a service of the hub (`Directory`, `Automation`, `AgentJobs`,
//! `Choices`' stored settings) reaches back to the
//! hub for what it does not own: the committer, the lanes' live turns, the media files. The
//! services take it as a parameter instead of being `impl Hub` blocks, so each one's state stays
//! private and what it may ask of the rest is this list. `hub_port.rs` implements it for `Hub`.

use std::rc::Rc;

use super::errors::CommitError;
use crate::agent::AgentEvent;
use crate::outlet::ConnId;
use crate::protocol::{Frame, HistoryMessage, Lane};

use super::errors::Refusal;
use super::fanout::Fanout;
use super::health::{Causes, Health};
use crate::config::Config;
use crate::protocol::{Channel, LaneRead, LaneRef, ServerCaps, TodoItem};
use crate::shutdown::Listener;
use crate::store::Change;
use crate::store::StoreError;

/// How a commit answers the device that asked for it: `frame` (the broadcast frame carrying the
/// request's `id`) instead of the broadcast frame at index `at`.
pub struct Reply {
    pub(super) conn: ConnId,
    pub(super) at: usize,
    pub(super) frame: Frame,
}

/// What the hub does for its services. Public only so that the services the doors above the hub
/// call (`Devices`, `Status`, `Automation`) may be bounded by it; it is named nowhere outside the
/// hub, and only the hub implements it, on the one event-loop thread (so its futures need no
/// `Send` bound, which is what `async_fn_in_trait` warns about).
#[allow(async_fn_in_trait)]
pub trait Port {
    /// Makes `changes` durable and publishes their outbox frames (the committer), answering the
    /// requester with `reply` if there is one.
    async fn commit(&self, changes: Vec<Change>, reply: Option<Reply>) -> Result<(), CommitError>;

    /// Drops everything live about deleted lanes (their turns, queues and settings); returns
    /// the changes to commit with the deletion.
    fn forget_lanes(&self, gone: &dyn Fn(&Lane) -> bool) -> Vec<Change>;

    /// Removes the media files that no message refers to any more.
    async fn collect_media(&self, media_ids: &[String]);

    /// The lane's channel (and thread) still exist.
    fn lane_exists(&self, lane: &Lane) -> bool;

    /// Stores the files an agent's answer names (`MEDIA:` lines, through the media policy) and
    /// attaches them to `message`.
    async fn attach_agent_files(
        &self,
        lane: &Lane,
        message: &mut HistoryMessage,
        files: Vec<AgentEvent>,
    );

    /// Nothing is running or queued in `lane`.
    fn lane_idle(&self, lane: &Lane) -> bool;

    /// Queues a scheduled prompt as an agent turn in `lane`; its answer is posted as `title`.
    fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String);

    /// Set once the gateway is stopping: no new hellos.
    fn is_shutting_down(&self) -> bool;

    /// Queues `changes` without waiting for them (`what`: for the log, if they cannot be).
    fn commit_soon(&self, changes: Vec<Change>, what: &'static str);

    /// The gateway's settings as this start read them.
    fn config(&self) -> &Config;

    /// The connected devices' outlets and how far frames were published to them.
    fn fanout(&self) -> &Fanout;

    /// Why the gateway is degraded and what it has noted (read only; changes go through
    /// [`Port::update_health`], which tells the devices).
    fn gateway_health(&self) -> &Health;

    /// Changes a cause of `degraded`; a change of the state itself is sent to every device.
    fn update_health(&self, change: impl FnOnce(&mut Causes));

    /// What this gateway offers, as `hello.ack` says it.
    fn caps(&self) -> ServerCaps;

    /// The directory's channels as a device is given them (`Directory::for_wire`).
    fn channels_for_wire(&self, channels: Vec<Channel>) -> Vec<Channel>;

    /// A frame's `chat_id`/`thread_id` as a lane and its root channel (the directory's rule).
    fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal>;

    /// A history query's failure as the refusal a device gets (damage is noted as a cause).
    fn query_failed(&self, e: StoreError) -> Refusal;

    /// The lanes with a turn running, for `hello.ack.agent_busy`.
    fn busy_lanes(&self) -> Vec<LaneRef>;

    /// Every lane's todo list, for a device's hello.
    fn todo_lists(&self) -> Vec<(Lane, Vec<TodoItem>)>;

    /// Every existing lane's read marker, for `hello.ack.read`.
    fn read_lanes(&self) -> Vec<LaneRead>;

    /// The agent behind the hub was replaced: its turns' watch checks the new one.
    fn agent_replaced(&self);

    /// No pushes for this device while it is connected.
    fn cancel_pushes(&self, device_id: &str);

    /// A device's connection closed: pushes may start for it.
    fn device_left(&self, device_id: &str);

    /// The push backend (`none`, `ntfy`, `fcm`).
    fn push_backend(&self) -> &'static str;

    /// The bytes stored media take.
    fn media_used(&self) -> u64;

    /// The update under way or staged, and whether this version is on trial.
    fn update_under_way(&self) -> Option<String>;
    fn on_update_trial(&self) -> bool;

    /// Starts the task that delivers the agent's job results into their lanes and automation's
    /// channels (`AgentJobs::follow`), until `stop`.
    fn follow_jobs(self: &Rc<Self>, stop: Listener);
}
