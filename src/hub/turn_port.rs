//! Where the hub and its turns meet: the hub's side of the turns' port (what [`Turns`] may ask
//! of it, answered by the owner of each thing), and the hub's doors onto its turns that need more
//! of the hub than turns may see (a steer's request, the services set from the admin page, a
//! deletion's lanes).

use std::rc::Rc;

use crate::agent::{Agent, AgentSettings, ApprovalRequest, Speaker, Transcriber};
use crate::config::Config;
use crate::ids;
use crate::media::MediaFiles;
use crate::outlet::{Outlet, StreamedText};
use crate::protocol::fit::OutBudget;
use crate::protocol::{Frame, HistoryMessage, Lane, Role};
use crate::store::{Change, PendingTurn, Store, StoreError, VoiceMode};

use super::agent_calls::CallKind;
use super::errors::{CommitError, Refusal};
use super::state::{Hub, Origin};
use super::turns::TurnPort;

impl TurnPort for Hub {
    fn store(&self) -> &Store {
        &self.store
    }

    fn agent(&self) -> &Rc<dyn Agent> {
        &self.agent
    }

    fn media(&self) -> &MediaFiles {
        &self.media
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
        Hub::keep_unsettled(self, changes);
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
        Hub::set_media_full(self, why);
    }

    fn lane_exists(&self, lane: &Lane) -> bool {
        Hub::lane_exists(self, lane)
    }

    fn turn_settings(&self, lane: &Lane) -> AgentSettings {
        Hub::turn_settings(self, lane)
    }

    fn lane_voice(&self, lane: &Lane) -> VoiceMode {
        self.choices.lane_voice(lane)
    }

    fn set_lane_voice(&self, lane: &Lane, mode: VoiceMode) {
        self.choices.set_lane_voice(lane, mode);
    }

    async fn post_system(&self, lane: &Lane, text: String) {
        Hub::post_system(self, lane, text).await;
    }

    async fn with_job_results(&self, lane: &Lane, current: &str, text: String) -> String {
        self.jobs.with_results(lane, current, text).await
    }

    async fn job_made(&self, lane: &Lane, job_id: String) {
        self.jobs.made(self, lane, job_id).await;
    }

    async fn offer_approval(&self, lane: &Lane, run_id: &str, request: ApprovalRequest) {
        Hub::offer_approval(self, lane, run_id, request).await;
    }

    async fn approval_expired(&self, run_id: &str) {
        Hub::approval_expired(self, run_id).await;
    }

    async fn close_approvals_of(&self, run_id: &str, why: impl Fn(&str) -> String) {
        Hub::close_approvals_of(self, run_id, why).await;
    }

    fn approval_runs(&self) -> Vec<String> {
        Hub::approval_runs(self)
    }
}

impl Hub {
    /// Stores `text` as a steering message in the frame's lane, shows it to every device, and
    /// hands it to the running answer (or makes it the next message). `receipt`: the sender
    /// sent it as a `message.send` (`/steer TEXT`) and is owed a `read.receipt` for it.
    pub async fn steer(
        self: &Rc<Self>,
        outlet: &Rc<Outlet>,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
        id: Option<i64>,
        text: String,
        receipt: bool,
    ) -> Result<(), Refusal> {
        self.check_text_size(&text)?;
        let text = text.trim().to_owned();
        if text.is_empty() {
            return Err(Refusal::unsupported(
                "agent.steer needs text: what the running answer should do differently",
            ));
        }
        let (lane, root) = self.resolve_lane(chat_id, thread_id)?;
        if root.automation {
            return Err(Refusal::unsupported(format!(
                "`{}` is an automation channel: it only receives gateway output",
                root.name
            )));
        }
        // It may become the next message: refused now, before anything is stored, where the
        // lane could not queue it.
        self.check_lane_room(&lane)?;
        // An agent that takes steers is asked beside the reader (one steer per device at a
        // time): the phone's other frames are answered while the agent takes its time. Refused
        // before anything is stored.
        let slot = if self.agent.can_steer() {
            Some(self.claim_agent_call(&outlet.device_id, CallKind::Steer)?)
        } else {
            None
        };
        let message = HistoryMessage {
            steer: true,
            ..HistoryMessage::text_only(ids::message_id(), Role::User, text, ids::now_ms())
        };
        let echo = Frame::message(&message).in_lane(&lane.chat_id, lane.thread());
        let changes = vec![
            Change::PutMessage(lane.clone(), message.clone()),
            Change::OutboxOf {
                message_id: message.message_id.clone(),
                frame: echo.outboxed(),
            },
            Change::BeginTurn(PendingTurn {
                user_message_id: message.message_id.clone(),
                lane: lane.clone(),
                text: message.text.clone(),
            }),
        ];
        let before = receipt.then(|| {
            Frame::read_receipt(id, &message.message_id).in_lane(&lane.chat_id, lane.thread())
        });
        self.commit(
            changes,
            Some(Origin {
                conn: outlet.conn_id,
                before,
                reply: None,
            }),
        )
        .await?;
        match slot {
            Some(slot) => {
                let turns = self.turns.clone();
                self.beside(outlet, id, slot, async move {
                    turns
                        .hand_steer(lane, message.message_id, message.text)
                        .await;
                    Ok(())
                });
            }
            None => {
                self.turns
                    .hand_steer(lane, message.message_id, message.text)
                    .await
            }
        }
        Ok(())
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    pub(super) fn lane_exists(&self, lane: &Lane) -> bool {
        let exists = |id: &str| matches!(self.store.channel(id), Ok(Some(_)));
        exists(&lane.chat_id) && lane.thread().is_none_or(exists)
    }

    /// Drops everything live about deleted lanes (their choices, turns and todo lists) and
    /// returns what the caller commits with the deletion (`Turns::forget_lanes`).
    pub(super) fn forget_lanes(&self, gone: impl Fn(&Lane) -> bool) -> Vec<Change> {
        self.choices.forget_lanes(&gone);
        self.turns.forget_lanes(gone)
    }

    /// The transcription service new voice notes go to (`None`: off). The admin page sets it
    /// when its Transcription form is saved; the next voice note uses it.
    pub fn set_transcriber(&self, transcriber: Option<Transcriber>) {
        self.turns.set_transcriber(transcriber);
        self.status
            .switched_on(crate::settings::Part::Transcription);
    }

    /// Where voice notes are transcribed now (never with its key), or `None` when off.
    pub fn transcription_service(&self) -> Option<String> {
        self.turns.transcription_service()
    }

    /// The speech service answers are spoken by (`None`: off). The admin page sets it when its
    /// Speech form is saved; the next answer uses it.
    pub fn set_speaker(&self, speaker: Option<Speaker>) {
        self.turns.set_speaker(speaker);
        self.status.switched_on(crate::settings::Part::Speech);
    }

    /// Where answers are spoken now (never with its key), or `None` when off.
    pub fn speech_service(&self) -> Option<String> {
        self.turns.speech_service()
    }

    /// Settles user messages whose turns a previous run never finished, before listening
    /// (`Turns::close_interrupted`).
    pub async fn close_interrupted_turns(&self) -> Result<usize, StoreError> {
        self.turns.close_interrupted().await
    }
}
