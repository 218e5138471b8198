//! The turns queue: one turn at a time per lane, a bounded queue behind it; a lane's runner takes
//! the next turn when a running-turn slot is free. Also what deleting, stopping or forgetting a
//! lane does to its queue and running turn.

use std::rc::Rc;

use tracing::warn;

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
        let start = {
            let mut st = self.state.borrow_mut();
            let ls = st.lanes.entry(lane.clone()).or_default();
            ls.queue.push_back(turn);
            !std::mem::replace(&mut ls.running, true)
        };
        if start {
            tokio::task::spawn_local(self.clone().lane_runner(lane));
        }
    }

    /// Runs a lane's queued turns one after another, then exits.
    pub(super) async fn lane_runner(self: Rc<Self>, lane: Lane) {
        loop {
            let next = {
                let mut st = self.state.borrow_mut();
                let ls = st.lanes.entry(lane.clone()).or_default();
                match ls.queue.pop_front() {
                    Some(t) => t,
                    None => {
                        ls.running = false;
                        return;
                    }
                }
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
        for ls in self.state.borrow_mut().lanes.values_mut() {
            ls.queue
                .retain(|t| !message_ids.contains(&t.user_message_id));
            if ls
                .streaming
                .as_ref()
                .is_some_and(|m| message_ids.contains(m))
            {
                if let Some(abort) = &ls.abort {
                    abort.abandon();
                }
            }
        }
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    pub(super) fn lane_exists(&self, lane: &Lane) -> bool {
        let exists = |id: &str| matches!(self.store.channel(id), Ok(Some(_)));
        exists(&lane.chat_id) && lane.thread().is_none_or(exists)
    }

    /// Drops everything live about deleted lanes: the running turn is abandoned, queued
    /// messages are closed (they were deleted with the lane's history), the todo list goes.
    pub(super) async fn forget_lanes(&self, gone: impl Fn(&Lane) -> bool) {
        self.forget_lane_models(&gone);
        let mut closed = Vec::new();
        let lanes: Vec<Lane> = self
            .state
            .borrow()
            .lanes
            .keys()
            .filter(|l| gone(l))
            .cloned()
            .collect();
        for lane in lanes {
            closed.push(Change::Record(Record::PutTodos(lane.clone(), Vec::new())));
            closed.push(Change::Record(Record::RemoveAgentSession(lane.clone())));
            let mut st = self.state.borrow_mut();
            if let Some(ls) = st.lanes.get_mut(&lane) {
                ls.todos.clear();
                closed.extend(
                    ls.queue
                        .drain(..)
                        .map(|t| Change::EndTurn(t.user_message_id)),
                );
                if let Some(abort) = &ls.abort {
                    abort.abandon();
                }
            }
        }
        if !closed.is_empty() {
            if let Err(e) = self.commit(closed, None).await {
                warn!("could not close the turns of a deleted lane: {e}");
            }
        }
    }

    /// Stops the running turn of `lane` (`/stop`, `agent.stop`, "Stop the task"); `false` when
    /// nothing runs there.
    pub(super) fn stop_lane(&self, lane: &Lane) -> bool {
        let abort = self
            .state
            .borrow()
            .lanes
            .get(lane)
            .and_then(|ls| ls.abort.clone());
        match abort {
            Some(a) => {
                a.stop();
                true
            }
            None => false,
        }
    }
}
