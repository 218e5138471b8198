//! The port: the narrow way a service of the hub (`Directory`, `Automation`, `AgentJobs`,
//! `Choices`' stored settings) reaches back to the
//! hub for what it does not own: the committer, the lanes' live turns, the media files. The
//! services take it as a parameter instead of being `impl Hub` blocks, so each one's state stays
//! private and what it may ask of the rest is this list. `hub_port.rs` implements it for `Hub`.

use std::collections::HashSet;
use std::rc::Rc;

use super::errors::{CommitError, Refusal};
use super::health::Causes;
use crate::agent::AgentEvent;
use crate::outlet::ConnId;
use crate::protocol::{Channel, Frame, HistoryMessage, Lane};
use crate::store::Change;

/// How a commit answers the device that asked for it: `frame` (the broadcast frame carrying the
/// request's `id`) instead of the broadcast frame at index `at`.
pub(super) struct Reply {
    pub(super) conn: ConnId,
    pub(super) at: usize,
    pub(super) frame: Frame,
}

/// What the hub does for its services.
pub(super) trait Port {
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

    /// A frame's `chat_id`/`thread_id` as a lane (the directory's rule).
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
}
