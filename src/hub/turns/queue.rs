//! The turns queue: one turn at a time per lane, a bounded queue behind it; a lane's runner takes
//! the next turn when a running-turn slot is free.

use std::rc::Rc;

use crate::ids;
use crate::protocol::Lane;

use super::lanes::QueuedTurn;
use super::{TurnPort, Turns};

impl<P: TurnPort> Turns<P> {
    /// Queues a gateway-originated prompt (a cron job) in an automation lane. Its answer is stored
    /// with role `cron` and announced with a `notification{kind:cron}` titled `title`.
    pub(in crate::hub) fn enqueue_automation(
        self: &Rc<Self>,
        lane: Lane,
        prompt: String,
        title: String,
    ) {
        self.enqueue(
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
    pub(in crate::hub) fn enqueue(self: &Rc<Self>, lane: Lane, turn: QueuedTurn) {
        if self.lanes.enqueue(&lane, turn) {
            self.spawn(self.clone().lane_runner(lane));
        }
    }

    /// Runs a lane's queued turns one after another, then exits.
    async fn lane_runner(self: Rc<Self>, lane: Lane) {
        loop {
            let Some(next) = self.lanes.next_turn(&lane) else {
                return;
            };
            if self.hub().is_shutting_down() {
                // Left pending in the store: the next start closes it as interrupted.
                continue;
            }
            let Ok(_slot) = self.slots.acquire().await else {
                return;
            };
            self.run_turn(&lane, next).await;
        }
    }
}
