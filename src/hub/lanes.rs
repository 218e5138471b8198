//! Per-lane live state: a lane runs one turn at a time, with a bounded queue behind it, and the
//! running turn can be told to end early. Plain data, so every part of the hub can hold it.

use std::rc::Rc;

use crate::protocol::{MediaRef, TodoItem};

/// Per-lane live state: the running turn's queue and the lane's current todo list.
#[derive(Default)]
pub(super) struct LaneState {
    pub(super) running: bool,
    pub(super) queue: std::collections::VecDeque<QueuedTurn>,
    pub(super) todos: Vec<TodoItem>,
    /// Ends the running turn early: `/stop`, or its lane or reply was deleted.
    pub(super) abort: Option<Rc<Abort>>,
    /// The assistant message the running turn is streaming.
    pub(super) streaming: Option<String>,
    /// The agent's run of the running turn, once it has one (Hermes' runs API).
    pub(super) run_id: Option<String>,
    /// A turn runs here, as the `agent.busy` extension last told devices (`busy.rs`).
    pub(super) busy: bool,
    /// Steers the running turn's run took (`steer.rs`), settled when the turn ends.
    pub(super) steers: Vec<SteerTaken>,
}

/// A steer the lane's running run took (`steer.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SteerTaken {
    pub(super) message_id: String,
    pub(super) text: String,
}

/// A stored user message (or a cron prompt) waiting for its turn.
#[derive(Debug, Clone)]
pub struct QueuedTurn {
    pub user_message_id: String,
    pub text: String,
    pub media: Vec<MediaRef>,
    /// `Some(title)` for a gateway-originated prompt in an automation channel: its answer is
    /// stored with role `cron` and announced by a `notification` with this title.
    pub automation: Option<String>,
    /// The agent's run of this message, when a restart found it still going: followed, never
    /// handed over again.
    pub resume_run: Option<String>,
}

/// Ends a running turn early. `stop` (from `/stop`) keeps what was streamed so far as the
/// answer; otherwise the turn is abandoned without a trace (its lane or reply was deleted).
#[derive(Default)]
pub struct Abort {
    notify: tokio::sync::Notify,
    stop: std::cell::Cell<bool>,
}

impl Abort {
    /// `/stop`: the turn ends and keeps what was streamed.
    pub fn stop(&self) {
        self.stop.set(true);
        self.notify.notify_one();
    }

    /// The lane or the reply is gone: the turn ends and keeps nothing.
    pub fn abandon(&self) {
        self.notify.notify_one();
    }

    /// Resolves when the turn is told to end: `true` for a `/stop` (keep what was streamed),
    /// `false` when it is abandoned.
    pub async fn fired(&self) -> bool {
        self.notify.notified().await;
        self.stop.get()
    }
}
