//! Where the hub and its turns meet: the hub's side of the turns' port (what [`Turns`] may ask
//! of it, answered by the owner of each thing), and the one door the gateway's other parts
//! reach the turns by (`Hub::turns`: the speech services set from the admin page, the start's
//! settling of interrupted turns).

use std::rc::Rc;

use crate::agent::{Agent, AgentSettings, ApprovalRequest};
use crate::config::Config;
use crate::media::MediaFiles;
use crate::outlet::{Outlet, StreamedText};
use crate::protocol::fit::OutBudget;
use crate::protocol::{Frame, Lane};
use crate::store::{Change, Store, VoiceMode};

use super::errors::CommitError;
use super::state::Hub;
use super::turns::{TurnPort, Turns};

impl TurnPort for Hub {
    fn store(&self) -> &Store {
        &self.store
    }

    fn agent(&self) -> &Rc<dyn Agent> {
        &self.agent
    }

    fn media(&self) -> &MediaFiles {
        self.media.files()
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn out_budget(&self) -> OutBudget {
        Hub::out_budget(self)
    }

    async fn commit(&self, changes: Vec<Change>) -> Result<Vec<u64>, CommitError> {
        Hub::commit(self, changes, None).await
    }

    fn commit_soon(&self, changes: Vec<Change>, what: &'static str) {
        Hub::commit_soon(self, changes, what);
    }

    fn keep_unsettled(&self, changes: Vec<Change>) {
        self.storage.keep_unsettled(changes);
    }

    fn broadcast(&self, frame: &Frame, coalesce_key: Option<u64>) {
        Hub::broadcast(self, frame, coalesce_key);
    }

    fn broadcast_to(&self, frame: &Frame, to: impl Fn(&Outlet) -> bool) {
        Hub::broadcast_to(self, frame, to);
    }

    fn broadcast_answer(&self, coalesce_key: u64, streamed: &Rc<StreamedText>) {
        for o in self.fanout.all() {
            o.push_update(coalesce_key, streamed);
        }
    }

    fn is_shutting_down(&self) -> bool {
        Hub::is_shutting_down(self)
    }

    fn set_agent_error(&self, why: Option<String>) {
        self.update_health(|st| st.agent_error = why);
    }

    fn agent_is_down(&self) -> bool {
        self.health.causes(|c| c.agent_error.is_some())
    }

    fn set_media_full(&self, why: Option<String>) {
        self.media.set_full(why);
    }

    fn lane_exists(&self, lane: &Lane) -> bool {
        self.directory.lane_exists(lane)
    }

    fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        self.commands.turn_settings(lane)
    }

    fn lane_voice(&self, lane: &Lane) -> VoiceMode {
        self.commands.lane_voice(lane)
    }

    fn set_lane_voice(&self, lane: &Lane, mode: VoiceMode) {
        self.commands.set_lane_voice(lane, mode);
    }

    async fn post_system(&self, lane: &Lane, text: String) {
        super::commands::post_system(self, lane, text).await;
    }

    async fn with_job_results(&self, lane: &Lane, current: &str, text: String) -> String {
        self.jobs.with_results(lane, current, text).await
    }

    async fn job_made(&self, lane: &Lane, job_id: String) {
        self.jobs.made(self, lane, job_id).await;
    }

    async fn offer_approval(&self, lane: &Lane, run_id: &str, request: ApprovalRequest) {
        self.open_approvals.offer(self, lane, run_id, request).await;
    }

    async fn approval_expired(&self, run_id: &str) {
        self.open_approvals.expired(self, run_id).await;
    }

    async fn close_approvals_of(&self, run_id: &str, why: impl Fn(&str) -> String) {
        self.open_approvals.close_of_run(self, run_id, why).await;
    }

    fn approval_runs(&self) -> Vec<String> {
        self.open_approvals.runs()
    }

    fn switched_on(&self, part: crate::settings::Part) {
        self.update_health(|c| c.set_switched_off(part, None));
    }
}

impl Hub {
    /// The turns, for the doors outside the hub: the speech services the server and the admin
    /// page set (`set_transcriber`, `set_speaker`) and show, and the start's settling of the
    /// turns a previous run left (`close_interrupted`).
    pub(crate) fn turns(&self) -> &Rc<Turns<Hub>> {
        &self.turns
    }
}
