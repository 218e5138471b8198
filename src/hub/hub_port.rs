//! The hub's side of the port (`port.rs`) its services call back through.

use std::rc::Rc;

use super::errors::CommitError;
use super::port::{Port, Reply};
use super::state::{Hub, Origin};
use crate::agent::AgentEvent;
use crate::protocol::{HistoryMessage, Lane};

use super::errors::Refusal;
use super::fanout::Fanout;
use super::health::{Causes, Health};
use crate::config::Config;
use crate::protocol::{Channel, LaneRead, LaneRef, ServerCaps, TodoItem};
use crate::shutdown::Listener;
use crate::store::Change;
use crate::store::StoreError;

impl Port for Hub {
    async fn commit(&self, changes: Vec<Change>, reply: Option<Reply>) -> Result<(), CommitError> {
        let origin = reply.map(|r| Origin {
            conn: r.conn,
            before: None,
            reply: Some((r.at, r.frame)),
        });
        Hub::commit(self, changes, origin).await.map(|_| ())
    }

    fn forget_lanes(&self, gone: &dyn Fn(&Lane) -> bool) -> Vec<Change> {
        Hub::forget_lanes(self, gone)
    }

    async fn collect_media(&self, media_ids: &[String]) {
        Hub::collect_media(self, media_ids).await
    }

    fn lane_exists(&self, lane: &Lane) -> bool {
        Hub::lane_exists(self, lane)
    }

    async fn attach_agent_files(
        &self,
        lane: &Lane,
        message: &mut HistoryMessage,
        files: Vec<AgentEvent>,
    ) {
        self.turns.attach_agent_files(lane, message, files).await
    }

    fn lane_idle(&self, lane: &Lane) -> bool {
        self.turns.is_idle(lane)
    }

    fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String) {
        self.turns.enqueue_automation(lane, prompt, title)
    }

    fn is_shutting_down(&self) -> bool {
        Hub::is_shutting_down(self)
    }

    fn commit_soon(&self, changes: Vec<Change>, what: &'static str) {
        Hub::commit_soon(self, changes, what);
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn fanout(&self) -> &Fanout {
        &self.fanout
    }

    fn gateway_health(&self) -> &Health {
        &self.health
    }

    fn update_health(&self, change: impl FnOnce(&mut Causes)) {
        Hub::update_health(self, change);
    }

    fn caps(&self) -> ServerCaps {
        Hub::caps(self)
    }

    fn channels_for_wire(&self, channels: Vec<Channel>) -> Vec<Channel> {
        self.directory.for_wire(channels)
    }

    fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        self.directory.resolve_lane(chat_id, thread_id)
    }

    fn query_failed(&self, e: StoreError) -> Refusal {
        Hub::query_failed(self, e)
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

    fn agent_replaced(&self) {
        self.turns.agent_switched();
    }

    fn cancel_pushes(&self, device_id: &str) {
        self.pusher.cancel(device_id);
    }

    fn device_left(&self, device_id: &str) {
        Hub::device_left(self, device_id);
    }

    fn push_backend(&self) -> &'static str {
        self.pusher.backend().as_str()
    }

    fn media_used(&self) -> u64 {
        self.media.used()
    }

    fn update_under_way(&self) -> Option<String> {
        self.updates.under_way()
    }

    fn on_update_trial(&self) -> bool {
        Hub::on_update_trial(self)
    }

    fn follow_jobs(self: &Rc<Self>, stop: Listener) {
        let hub = self.clone();
        tokio::task::spawn_local(
            async move { hub.jobs.follow(&*hub, &hub.automation, stop).await },
        );
    }
}
