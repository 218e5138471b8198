//! The port: the narrow way a service of the hub (`Directory`, `Automation`, `AgentJobs`,
//! `Choices`' stored settings) reaches back to the
//! hub for what it does not own: the committer, the lanes' live turns, the media files. The
//! services take it as a parameter instead of being `impl Hub` blocks, so each one's state stays
//! private and what it may ask of the rest is this list. `hub_port.rs` implements it for `Hub`.

use std::collections::HashSet;
use std::rc::Rc;

use super::agent_calls::{CallKind, CallSlot};
use super::commands::catalog::Command;
use super::errors::{CommitError, Refusal};
use super::health::Causes;
use super::turns::QueuedTurn;
// The hub's public face (`mod.rs`): its types, not its files.
use super::{Origin, StatusReport};
use crate::agent::AgentEvent;
use crate::outlet::ConnId;
use crate::protocol::{
    Channel, Frame, HistoryMessage, Lane, LaneRead, LaneRef, ServerCaps, TodoItem,
};

use super::fanout::Fanout;
use super::health::Health;
use crate::config::Config;
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

    /// Changes a cause of `degraded` (media full, push failing, an update rolled back, the
    /// disk): the hub owns the health and tells the devices when the state moves.
    fn update_health(&self, change: impl FnOnce(&mut Causes));

    /// Reads the causes of `degraded` (whether storage is the one failing).
    fn health_causes<T>(&self, read: impl FnOnce(&Causes) -> T) -> T;

    /// A push reached its server: push is known to work (`/status`).
    fn confirm_push(&self);

    /// Queues `changes` for the committer without waiting (`what`: for the log).
    fn commit_soon(&self, changes: Vec<Change>, what: &'static str);

    /// The devices with a connection open now (pushes go only to the others).
    fn connected_devices(&self) -> HashSet<String>;

    /// Where live fan-out is.
    fn published_head(&self) -> u64;

    /// Starts a fresh conversation in `lane` (`/new`: the turns' new agent session and plan).
    async fn new_conversation(&self, lane: &Lane);

    /// Stops the running turn of `lane`; `false` when nothing runs there.
    fn stop_turn(&self, lane: &Lane) -> bool;

    /// Stops the running turn of `lane` if it runs `run_id`; `false` when that one is not
    /// running.
    fn stop_turn_of_run(&self, lane: &Lane, run_id: &str) -> bool;

    /// `/voice on|off|auto` in `lane`, answered in words.
    async fn set_voice_mode(&self, lane: &Lane, value: &str) -> String;

    /// Where answers are spoken now, or `None` when no speech service is set.
    fn speech_service(&self) -> Option<String>;

    /// Offers the agent's jobs in `lane` (`/jobs`: a picker, or a sentence saying why not).
    async fn offer_jobs(&self, lane: &Lane);

    /// Offers in `lane` what can be done to the job `job_id` a picker's answer chose.
    async fn offer_job_actions(&self, lane: &Lane, job_id: &str);

    /// Does `value` (pause, resume, run, remove) to the agent's job `job_id`; says how it went.
    async fn apply_job_action(&self, job_id: &str, value: &str) -> String;

    /// The gateway's health and figures, as `iris-gateway status` reports them.
    fn status_report(&self) -> StatusReport;

    /// Approvals waiting for an answer.
    fn approvals_waiting(&self) -> usize;

    /// Set once the gateway is stopping: no new hellos.
    fn is_shutting_down(&self) -> bool;

    /// The gateway's settings as this start read them.
    fn config(&self) -> &Config;

    /// The connected devices' outlets and how far frames were published to them.
    fn fanout(&self) -> &Fanout;

    /// Why the gateway is degraded and what it has noted (read only; changes go through
    /// [`Port::update_health`], which tells the devices).
    fn gateway_health(&self) -> &Health;

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

    /// Drops the queued turns of deleted messages.
    fn drop_turns_of(&self, message_ids: &[String]);

    /// A query found the history database damaged: `degraded` with that cause.
    fn note_history_damaged(&self, why: String);

    /// Tells every device the gateway is restarting and closes them (the store cannot resume).
    fn begin_shutdown(&self);

    /// The directory has room for the new thread `thread`.
    fn thread_fits(&self, thread: &Channel) -> bool;

    /// Turns waiting in `lane` behind the running one.
    fn lane_waiting(&self, lane: &Lane) -> usize;

    /// The device's slot for a call of `kind` to the agent, or the refusal while its previous
    /// one is under way.
    fn agent_call(&self, device_id: &str, kind: CallKind) -> Result<CallSlot, Refusal>;

    /// Makes `changes` durable and publishes them, answering the requester as `origin` says.
    async fn commit_answering(
        &self,
        changes: Vec<Change>,
        origin: Origin,
    ) -> Result<(), CommitError>;

    /// Runs a gateway command sent in `lane` and posts its answer there.
    async fn run_command(&self, lane: &Lane, command: Command);

    /// Queues a user's message as a turn in `lane`.
    fn enqueue_turn(&self, lane: Lane, turn: QueuedTurn);

    /// Hands a stored steering message to the running answer of `lane` (or queues it).
    async fn hand_steer(&self, lane: Lane, message_id: String, text: String);

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
