//! The hub's side of the ports its services call back through: the core (`port.rs`) and each
//! service's own port (beside the service). Each method hands the question to its owner.

use std::collections::HashSet;
use std::rc::Rc;

use super::agent_calls::{CallKind, CallSlot};
use super::approvals::ApprovalsPort;
use super::automation::AutomationPort;
use super::commands::{Command, CommandsPort};
use super::devices::DevicesPort;
use super::directory::DirectoryPort;
use super::errors::{CommitError, Refusal};
use super::health::Causes;
use super::jobs::AgentJobsPort;
use super::message_send::MessagesPort;
use super::port::{Port, Reply};
use super::push::PushPort;
use super::read_marks::ReadMarksPort;
use super::search::QueriesPort;
use super::state::{Hub, Origin};
use super::status::{StatusPort, StatusReport};
use super::storage::StorageWatchPort;
use super::turns::QueuedTurn;
use crate::agent::AgentEvent;
use crate::config::{CronJob as CronConfig, WebhookConfig};
use crate::outlet::{ConnId, Outlet};
use crate::protocol::{
    Channel, HealthState, HistoryMessage, Lane, LaneRead, LaneRef, ServerCaps, TodoItem,
};
use crate::shutdown::Listener;
use crate::store::{Change, StoreError};

impl Port for Hub {
    async fn commit(&self, changes: Vec<Change>, reply: Option<Reply>) -> Result<(), CommitError> {
        let origin = reply.map(|r| Origin {
            conn: r.conn,
            before: None,
            reply: Some((r.at, r.frame)),
        });
        Hub::commit(self, changes, origin).await.map(|_| ())
    }

    fn commit_soon(&self, changes: Vec<Change>, what: &'static str) {
        Hub::commit_soon(self, changes, what);
    }

    fn published_head(&self) -> u64 {
        Hub::published_head(self)
    }

    fn update_health(&self, change: impl FnOnce(&mut Causes)) {
        Hub::update_health(self, change);
    }

    fn health_causes<T>(&self, read: impl FnOnce(&Causes) -> T) -> T {
        self.health.causes(read)
    }

    fn health_state(&self) -> HealthState {
        self.health.state()
    }

    fn lane_exists(&self, lane: &Lane) -> bool {
        self.directory.lane_exists(lane)
    }

    fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        self.directory.resolve_lane(chat_id, thread_id)
    }

    async fn collect_media(&self, media_ids: &[String]) {
        self.media.collect(media_ids).await
    }
}

impl ApprovalsPort for Hub {
    fn stop_turn_of_run(&self, lane: &Lane, run_id: &str) -> bool {
        let abort = self.turns.abort_of_run(lane, run_id);
        abort.map(|a| a.stop()).is_some()
    }
}

impl AutomationPort for Hub {
    fn cron_settings(&self) -> &[CronConfig] {
        &self.config.cron
    }

    fn webhook_settings(&self) -> &[WebhookConfig] {
        &self.config.webhook
    }

    fn lane_idle(&self, lane: &Lane) -> bool {
        self.turns.is_idle(lane)
    }

    fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String) {
        self.turns.enqueue_automation(lane, prompt, title)
    }

    fn follow_jobs(self: &Rc<Self>, stop: Listener) {
        let hub = self.clone();
        tokio::task::spawn_local(
            async move { hub.jobs.follow(&*hub, &hub.automation, stop).await },
        );
    }
}

impl CommandsPort for Hub {
    async fn new_conversation(&self, lane: &Lane) {
        self.turns.new_conversation(lane).await
    }

    fn stop_turn(&self, lane: &Lane) -> bool {
        self.turns.stop(lane)
    }

    async fn set_voice_mode(&self, lane: &Lane, value: &str) -> String {
        self.turns.set_voice_mode(lane, value).await
    }

    fn speech_service(&self) -> Option<String> {
        self.turns.speech_service()
    }

    async fn offer_jobs(&self, lane: &Lane) {
        let offer = self.jobs.picker(lane).await;
        self.commands.offer(self, lane, offer).await
    }

    async fn offer_job_actions(&self, lane: &Lane, job_id: &str) {
        let offer = self.jobs.actions_picker(job_id).await;
        self.commands.offer(self, lane, offer).await
    }

    async fn apply_job_action(&self, job_id: &str, value: &str) -> String {
        self.jobs.apply_action(job_id, value).await
    }

    fn status_report(&self) -> StatusReport {
        self.status.report()
    }

    fn approvals_waiting(&self) -> usize {
        self.open_approvals.count()
    }
}

impl PushPort for Hub {
    fn connected_devices(&self) -> HashSet<String> {
        self.fanout.device_ids()
    }

    fn confirm_push(&self) {
        self.health.confirm_push();
    }
}

impl DevicesPort for Hub {
    fn is_shutting_down(&self) -> bool {
        Hub::is_shutting_down(self)
    }

    fn caps(&self) -> ServerCaps {
        Hub::caps(self)
    }

    fn channels_for_wire(&self, channels: Vec<Channel>) -> Vec<Channel> {
        self.directory.for_wire(channels)
    }

    fn busy_lanes(&self) -> Vec<LaneRef> {
        self.turns.busy_lanes()
    }

    fn todo_lists(&self) -> Vec<(Lane, Vec<TodoItem>)> {
        self.turns.todo_lists()
    }

    fn read_lanes(&self) -> Vec<LaneRead> {
        self.read_marks.lanes(self)
    }

    fn add_outlet(&self, outlet: Rc<Outlet>) {
        self.fanout.add(outlet);
    }

    fn remove_outlet(&self, conn_id: ConnId) -> Option<Rc<Outlet>> {
        self.fanout.remove(conn_id)
    }

    fn outlets_of_device(&self, device_id: &str) -> Vec<Rc<Outlet>> {
        self.fanout.of_device(device_id)
    }

    fn cancel_pushes(&self, device_id: &str) {
        self.push.cancel(device_id);
    }

    fn device_left(&self, device_id: &str) {
        self.push.device_left(device_id);
    }
}

impl DirectoryPort for Hub {
    /// Drops everything live about deleted lanes (their choices, turns and todo lists) and
    /// returns what the caller commits with the deletion (`Turns::forget_lanes`).
    fn forget_lanes(&self, gone: &dyn Fn(&Lane) -> bool) -> Vec<Change> {
        self.commands.forget_lanes(&gone);
        self.turns.forget_lanes(gone)
    }
}

impl AgentJobsPort for Hub {
    async fn attach_agent_files(
        &self,
        lane: &Lane,
        message: &mut HistoryMessage,
        files: Vec<AgentEvent>,
    ) {
        self.turns.attach_agent_files(lane, message, files).await
    }
}

impl MessagesPort for Hub {
    fn thread_fits(&self, thread: &Channel) -> bool {
        self.directory.room(std::slice::from_ref(thread)).is_ok()
    }

    fn lane_waiting(&self, lane: &Lane) -> usize {
        self.turns.waiting(lane)
    }

    fn agent_call(&self, device_id: &str, kind: CallKind) -> Result<CallSlot, Refusal> {
        self.agent_calls.slot(device_id, kind)
    }

    async fn commit_answering(
        &self,
        changes: Vec<Change>,
        origin: Origin,
    ) -> Result<(), CommitError> {
        Hub::commit(self, changes, Some(origin)).await.map(|_| ())
    }

    async fn run_command(&self, lane: &Lane, command: Command) {
        self.commands.execute(self, lane, command).await
    }

    fn enqueue_turn(&self, lane: Lane, turn: QueuedTurn) {
        self.turns.enqueue(lane, turn)
    }

    async fn hand_steer(&self, lane: Lane, message_id: String, text: String) {
        self.turns.hand_steer(lane, message_id, text).await
    }
}

impl ReadMarksPort for Hub {
    fn query_failed(&self, e: StoreError) -> Refusal {
        self.queries.failed(self, e)
    }
}

impl QueriesPort for Hub {
    fn drop_turns_of(&self, message_ids: &[String]) {
        self.turns.drop_turns_of(message_ids);
    }

    fn note_history_damaged(&self, why: String) {
        self.status.note_history_damaged(why);
    }
}

impl StatusPort for Hub {
    fn health_reasons(&self) -> Vec<String> {
        self.health.reasons()
    }

    fn push_confirmed(&self) -> bool {
        self.health.push_confirmed()
    }

    fn restore_failure(&self) -> Option<String> {
        self.health.restore_failure()
    }

    fn note_restore_failure(&self, why: String) {
        self.health.note_restore_failure(why);
    }

    fn connections(&self) -> usize {
        self.fanout.count()
    }

    fn agent_replaced(&self) {
        self.turns.agent_switched();
    }

    fn push_backend(&self) -> &'static str {
        self.push.backend().as_str()
    }

    fn media_used(&self) -> u64 {
        self.media.files().used()
    }

    fn update_under_way(&self) -> Option<String> {
        self.updates.stage().under_way()
    }

    fn on_update_trial(&self) -> bool {
        self.updates.on_trial()
    }
}

impl StorageWatchPort for Hub {
    fn begin_shutdown(&self) {
        Hub::begin_shutdown(self);
    }
}
