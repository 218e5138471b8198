//! The turns queue: one turn at a time per lane, a bounded queue behind it; a lane's runner takes
//! the next turn when a running-turn slot is free. Also what deleting, stopping or forgetting a
//! lane does to its queue and running turn.

use std::rc::Rc;

use crate::ids;
use crate::protocol::Lane;
use crate::store::{Change, Record};

use super::lanes::QueuedTurn;
use super::state::Hub;

impl Hub {
    /// Queues a gateway-originated prompt (a cron job) in an automation lane. Its answer is stored
    /// with role `cron` and announced with a `notification{kind:cron}` titled `title`.
    pub(super) fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String) {
        self.enqueue_turn(
            lane,
            QueuedTurn {
                user_message_id: ids::time_ordered("cron"),
                text: prompt,
                media: Vec::new(),
                automation: Some(title),
                resume_run: None,
            },
        );
    }

    /// Queues a turn in its lane and starts the lane's runner if it is idle.
    pub(super) fn enqueue_turn(self: &Rc<Self>, lane: Lane, turn: QueuedTurn) {
        if self.lanes.enqueue(&lane, turn) {
            tokio::task::spawn_local(self.clone().lane_runner(lane));
        }
    }

    /// Runs a lane's queued turns one after another, then exits.
    pub(super) async fn lane_runner(self: Rc<Self>, lane: Lane) {
        loop {
            let Some(next) = self.lanes.next_turn(&lane) else {
                return;
            };
            if self.is_shutting_down() {
                // Left pending in the store: the next start closes it as interrupted.
                continue;
            }
            let Ok(_slot) = self.turn_slots.acquire().await else {
                return;
            };
            self.run_turn(&lane, next).await;
        }
    }

    /// Deleted messages take their turns with them: queued turns of deleted user messages are
    /// dropped, and a turn whose reply is deleted while streaming is abandoned (otherwise its
    /// end would store the deleted reply again).
    pub(super) fn drop_turns_of(&self, message_ids: &[String]) {
        self.lanes.drop_turns_of(message_ids);
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    pub(super) fn lane_exists(&self, lane: &Lane) -> bool {
        let exists = |id: &str| matches!(self.store.channel(id), Ok(Some(_)));
        exists(&lane.chat_id) && lane.thread().is_none_or(exists)
    }

    /// Drops everything live about deleted lanes: the running turn is abandoned, the todo list
    /// goes. Returns what the caller commits with the deletion (nothing is awaited here, so the
    /// deletion answers before the abandoned turn's last frames): the lanes' stored todo lists
    /// and agent sessions go, and their queued messages are closed (they were deleted with the
    /// lane's history).
    pub(super) fn forget_lanes(&self, gone: impl Fn(&Lane) -> bool) -> Vec<Change> {
        self.choices.forget_lanes(&gone);
        let mut closed = Vec::new();
        for lane in self.lanes.matching(&gone) {
            closed.push(Change::Record(Record::PutTodos(lane.clone(), Vec::new())));
            closed.push(Change::Record(Record::RemoveAgentSession(lane.clone())));
            closed.extend(self.lanes.forget(&lane).into_iter().map(Change::EndTurn));
        }
        closed
    }

    /// Stops the running turn of `lane` (`/stop`, `agent.stop`, "Stop the task"); `false` when
    /// nothing runs there.
    pub(super) fn stop_lane(&self, lane: &Lane) -> bool {
        match self.lanes.abort_of(lane) {
            Some(a) => {
                a.stop();
                true
            }
            None => false,
        }
    }
}
