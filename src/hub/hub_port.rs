//! The hub's side of the port (`port.rs`) its services call back through.

use std::rc::Rc;

use super::errors::CommitError;
use super::port::{Port, Reply};
use super::state::{Hub, Origin};
use crate::agent::AgentEvent;
use crate::protocol::{HistoryMessage, Lane};
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
}
