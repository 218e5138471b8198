//! Per-lane live state and its one owner, [`Lanes`]: a lane runs one turn at a time, with a
//! bounded queue behind it; the running turn can be told to end early, knows its run at the
//! agent and the steers that run took; each lane keeps its latest todo list. The fields are
//! private to this file: the rest of the hub asks `Lanes` (one method per question).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::protocol::{Lane, MediaRef, TodoItem};

/// One lane's live state.
#[derive(Default)]
struct LaneState {
    running: bool,
    queue: std::collections::VecDeque<QueuedTurn>,
    todos: Vec<TodoItem>,
    /// Ends the running turn early: `/stop`, or its lane or reply was deleted.
    abort: Option<Rc<Abort>>,
    /// The assistant message the running turn is streaming.
    streaming: Option<String>,
    /// The agent's run of the running turn, once it has one (Hermes' runs API).
    run_id: Option<String>,
    /// A turn runs here, as the `agent.busy` extension last told devices (`busy.rs`).
    busy: bool,
    /// The todo list changed since it was last stored (it is stored with the turn's end).
    todos_unsaved: bool,
    /// Steers the running turn's run took (`steer.rs`), settled when the turn ends.
    steers: Vec<SteerTaken>,
}

/// Every lane's live state (lanes with a turn, a queue or a todo list; bounded by the
/// directory).
#[derive(Default)]
pub(super) struct Lanes {
    lanes: RefCell<HashMap<Lane, LaneState>>,
}

impl Lanes {
    /// The todo lists saved before a restart.
    pub(super) fn with_todos(saved: Vec<(Lane, Vec<TodoItem>)>) -> Lanes {
        let lanes = Lanes::default();
        for (lane, todos) in saved {
            lanes.lanes.borrow_mut().entry(lane).or_default().todos = todos;
        }
        lanes
    }

    /// Queues a turn; `true` when the lane's runner must be started (none runs).
    pub(super) fn enqueue(&self, lane: &Lane, turn: QueuedTurn) -> bool {
        let mut lanes = self.lanes.borrow_mut();
        let ls = lanes.entry(lane.clone()).or_default();
        ls.queue.push_back(turn);
        !std::mem::replace(&mut ls.running, true)
    }

    /// The lane's next queued turn; `None` also marks the runner gone.
    pub(super) fn next_turn(&self, lane: &Lane) -> Option<QueuedTurn> {
        let mut lanes = self.lanes.borrow_mut();
        let ls = lanes.entry(lane.clone()).or_default();
        let next = ls.queue.pop_front();
        if next.is_none() {
            ls.running = false;
        }
        next
    }

    /// Nothing is running or queued in `lane`.
    pub(super) fn is_idle(&self, lane: &Lane) -> bool {
        self.lanes
            .borrow()
            .get(lane)
            .is_none_or(|ls| !ls.running && ls.queue.is_empty())
    }

    /// How many messages wait behind a running turn (0 when none runs).
    pub(super) fn waiting(&self, lane: &Lane) -> usize {
        self.lanes
            .borrow()
            .get(lane)
            .filter(|ls| ls.running)
            .map_or(0, |ls| ls.queue.len())
    }

    /// A turn starts streaming `message_id`; `abort` ends it early.
    pub(super) fn begin_turn(&self, lane: &Lane, abort: Rc<Abort>, message_id: &str) {
        let mut lanes = self.lanes.borrow_mut();
        let ls = lanes.entry(lane.clone()).or_default();
        ls.abort = Some(abort);
        ls.streaming = Some(message_id.to_owned());
    }

    /// The running turn's run at the agent (or none yet).
    pub(super) fn set_run(&self, lane: &Lane, run_id: Option<String>) {
        if let Some(ls) = self.lanes.borrow_mut().get_mut(lane) {
            ls.run_id = run_id;
        }
    }

    /// The turn ended: forgets how to stop it, and hands back the steers its run took.
    pub(super) fn end_turn(&self, lane: &Lane) -> Vec<SteerTaken> {
        match self.lanes.borrow_mut().get_mut(lane) {
            Some(ls) => {
                ls.abort = None;
                ls.streaming = None;
                ls.run_id = None;
                std::mem::take(&mut ls.steers)
            }
            None => Vec::new(),
        }
    }

    /// How to stop the running turn, if one runs.
    pub(super) fn abort_of(&self, lane: &Lane) -> Option<Rc<Abort>> {
        self.lanes
            .borrow()
            .get(lane)
            .and_then(|ls| ls.abort.clone())
    }

    /// How to stop the running turn, if it is `run_id`'s.
    pub(super) fn abort_of_run(&self, lane: &Lane, run_id: &str) -> Option<Rc<Abort>> {
        self.lanes
            .borrow()
            .get(lane)
            .filter(|ls| ls.run_id.as_deref() == Some(run_id))
            .and_then(|ls| ls.abort.clone())
    }

    /// `None` when no turn runs; else its run at the agent, if it has one yet.
    pub(super) fn running_run(&self, lane: &Lane) -> Option<Option<String>> {
        self.lanes
            .borrow()
            .get(lane)
            .filter(|ls| ls.abort.is_some())
            .map(|ls| ls.run_id.clone())
    }

    /// Records a steer `run_id` took; `false` when that run is no longer the lane's (it ended
    /// while the steer was on its way).
    pub(super) fn steer_taken(&self, lane: &Lane, run_id: &str, steer: SteerTaken) -> bool {
        match self
            .lanes
            .borrow_mut()
            .get_mut(lane)
            .filter(|ls| ls.run_id.as_deref() == Some(run_id))
        {
            Some(ls) => {
                ls.steers.push(steer);
                true
            }
            None => false,
        }
    }

    /// Queued turns of these user messages go; a turn streaming one of these replies is
    /// abandoned.
    pub(super) fn drop_turns_of(&self, message_ids: &[String]) {
        for ls in self.lanes.borrow_mut().values_mut() {
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

    /// The lanes `pick` chooses.
    pub(super) fn matching(&self, pick: impl Fn(&Lane) -> bool) -> Vec<Lane> {
        self.lanes
            .borrow()
            .keys()
            .filter(|l| pick(l))
            .cloned()
            .collect()
    }

    /// A deleted lane: its running turn is abandoned, its todo list goes; returns the user
    /// messages that were queued there (to be closed).
    pub(super) fn forget(&self, lane: &Lane) -> Vec<String> {
        let mut lanes = self.lanes.borrow_mut();
        let Some(ls) = lanes.get_mut(lane) else {
            return Vec::new();
        };
        ls.todos.clear();
        if let Some(abort) = &ls.abort {
            abort.abandon();
        }
        ls.queue.drain(..).map(|t| t.user_message_id).collect()
    }

    /// Marks the lane busy or idle; `true` when that changed. A lane gone while its turn ran
    /// counts as busy, so a device told `agent.busy` still gets its `agent.idle`.
    pub(super) fn set_busy(&self, lane: &Lane, busy: bool) -> bool {
        match self.lanes.borrow_mut().get_mut(lane) {
            Some(ls) => std::mem::replace(&mut ls.busy, busy) != busy,
            None => !busy,
        }
    }

    pub(super) fn busy_lanes(&self) -> Vec<Lane> {
        self.lanes
            .borrow()
            .iter()
            .filter(|(_, ls)| ls.busy)
            .map(|(lane, _)| lane.clone())
            .collect()
    }

    pub(super) fn has_todos(&self, lane: &Lane) -> bool {
        self.lanes
            .borrow()
            .get(lane)
            .is_some_and(|ls| !ls.todos.is_empty())
    }

    pub(super) fn set_todos(&self, lane: &Lane, todos: Vec<TodoItem>) {
        let mut lanes = self.lanes.borrow_mut();
        let ls = lanes.entry(lane.clone()).or_default();
        ls.todos = todos;
        ls.todos_unsaved = true;
    }

    /// The lane's todo list if it changed since it was last stored (then counted as stored).
    pub(super) fn unsaved_todos(&self, lane: &Lane) -> Option<Vec<TodoItem>> {
        let mut lanes = self.lanes.borrow_mut();
        let ls = lanes.get_mut(lane)?;
        std::mem::take(&mut ls.todos_unsaved).then(|| ls.todos.clone())
    }

    /// Every lane's todo list that is not empty, for a device's greeting.
    pub(super) fn todo_lists(&self) -> Vec<(Lane, Vec<TodoItem>)> {
        self.lanes
            .borrow()
            .iter()
            .filter(|(_, ls)| !ls.todos.is_empty())
            .map(|(l, ls)| (l.clone(), ls.todos.clone()))
            .collect()
    }
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
