//! The hub's side of the port (`port.rs`) its services call back through.

use std::collections::HashSet;
use std::rc::Rc;

use super::errors::{CommitError, Refusal};
use super::health::Causes;
use super::port::{Port, Reply};
use super::state::{Hub, Origin};
use crate::agent::AgentEvent;
use crate::protocol::{Channel, HistoryMessage, Lane};
use crate::store::Change;

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
        self.media.collect(media_ids).await
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

    fn update_health(&self, change: impl FnOnce(&mut Causes)) {
        Hub::update_health(self, change);
    }

    fn health_causes<T>(&self, read: impl FnOnce(&Causes) -> T) -> T {
        self.health.causes(read)
    }

    fn confirm_push(&self) {
        self.health.confirm_push();
    }

    fn commit_soon(&self, changes: Vec<Change>, what: &'static str) {
        Hub::commit_soon(self, changes, what);
    }

    fn connected_devices(&self) -> HashSet<String> {
        self.fanout.device_ids()
    }

    fn published_head(&self) -> u64 {
        Hub::published_head(self)
    }

    fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal> {
        self.directory.resolve_lane(chat_id, thread_id)
    }

    fn drop_turns_of(&self, message_ids: &[String]) {
        self.turns.drop_turns_of(message_ids);
    }

    fn note_history_damaged(&self, why: String) {
        Hub::note_history_damaged(self, why);
    }

    fn begin_shutdown(&self) {
        Hub::begin_shutdown(self);
    }
}
