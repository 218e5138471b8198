//! The turns' port back to the hub: everything a turn asks of the rest of the hub, and nothing
//! else. Turns hold the hub only through it, so what they depend on is this list; the hub
//! implements it (`hub/turn_port.rs`) by calling the owners of each thing.

use std::rc::Rc;

use crate::agent::{Agent, AgentSettings, ApprovalRequest};
use crate::config::Config;
use crate::media::MediaFiles;
use crate::outlet::{Outlet, StreamedText};
use crate::protocol::fit::OutBudget;
use crate::protocol::{Frame, Lane};
use crate::store::{Change, Store, VoiceMode};

use super::super::errors::CommitError;

/// What turns need from the hub: the services it drives, its committer and fan-out, its health,
/// and the answers of the hub's other owners (lanes' existence, settings, approvals, jobs).
pub(crate) trait TurnPort: 'static {
    fn store(&self) -> &Store;
    fn agent(&self) -> &Rc<dyn Agent>;
    fn media(&self) -> &MediaFiles;
    fn config(&self) -> &Config;
    fn out_budget(&self) -> OutBudget;

    /// Makes `changes` durable, then publishes them to every device.
    async fn commit(&self, changes: Vec<Change>) -> Result<Vec<u64>, CommitError>;
    /// Queues `changes` without waiting for them (`what`: for the log, if they cannot be).
    fn commit_soon(&self, changes: Vec<Change>, what: &'static str);
    /// Keeps a turn's final changes that could not be stored, for when the disk works again.
    fn keep_unsettled(&self, changes: Vec<Change>);

    /// A live-only frame to every device.
    fn broadcast(&self, frame: &Frame, coalesce_key: Option<u64>);
    /// A live-only frame to the devices `to` picks.
    fn broadcast_to(&self, frame: &Frame, to: impl Fn(&Outlet) -> bool);
    /// The streamed answer so far, to every device (each renders it its own way).
    fn broadcast_answer(&self, coalesce_key: u64, streamed: &Rc<StreamedText>);

    fn is_shutting_down(&self) -> bool;
    /// The agent is unusable (`Some(why)`) or usable again (`None`): a cause of `degraded`.
    fn set_agent_error(&self, why: Option<String>);
    fn agent_is_down(&self) -> bool;
    /// Media storage is full (`Some(why)`) or has room again.
    fn set_media_full(&self, why: Option<String>);

    /// Whether the lane's channel (and thread) still exist.
    fn lane_exists(&self, lane: &Lane) -> bool;
    /// The user's settings for a turn in `lane`.
    fn turn_settings(&self, lane: &Lane) -> AgentSettings;
    fn lane_voice(&self, lane: &Lane) -> VoiceMode;
    fn set_lane_voice(&self, lane: &Lane, mode: VoiceMode);
    /// Posts a gateway `system` message in the lane.
    async fn post_system(&self, lane: &Lane, text: String);

    /// The results of the agent's jobs the lane has not seen yet, added to `text`.
    async fn with_job_results(&self, lane: &Lane, current: &str, text: String) -> String;
    /// The agent made a scheduled job during a turn.
    async fn job_made(&self, lane: &Lane, job_id: String);

    async fn offer_approval(&self, lane: &Lane, run_id: &str, request: ApprovalRequest);
    async fn approval_expired(&self, run_id: &str);
    /// Closes the approvals still open for `run_id`, saying `why` (given the command) in the lane.
    async fn close_approvals_of(&self, run_id: &str, why: impl Fn(&str) -> String);
    /// The runs approvals wait for.
    fn approval_runs(&self) -> Vec<String>;
    /// A part the settings switched off works again (a cause of `degraded` goes).
    fn switched_on(&self, part: crate::settings::Part);
}
