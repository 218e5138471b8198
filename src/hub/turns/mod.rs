//! Turns as a service: [`Turns`] owns every lane's queue and running turn, the running-turn
//! slots, the agent watch and the speech services, and runs turns from queue to stored answer.
//! It reaches the rest of the hub only through its port ([`TurnPort`]: commit, broadcast,
//! health, and the answers of the hub's other owners), so turn code is not `impl Hub`.
//!
//! The hub asks it to enqueue (`queue.rs`), stop, steer (`steer.rs`) and settle the turns a
//! restart interrupted (`recovery.rs`). Running a turn is `run.rs`, what the agent streams
//! `events.rs`, voice notes `voice.rs`, spoken answers `voice_reply.rs`, the `agent.busy`
//! extension `busy.rs`, the agent's health `agent_health.rs`.

mod agent_health;
mod busy;
mod events;
mod lanes;
mod port;
mod queue;
mod recovery;
mod run;
mod steer;
mod voice;
mod voice_reply;

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::{Rc, Weak};

use tokio::sync::Semaphore;

use crate::agent::{Speaker, Transcriber};
use crate::protocol::{Lane, TodoItem};
use crate::store::Change;

use self::agent_health::AgentWatch;
use self::lanes::Lanes;
pub(in crate::hub) use self::lanes::{Abort, QueuedTurn};
pub(in crate::hub) use self::port::TurnPort;

/// The turns of every lane and what runs them. Built inside the hub (it holds the hub weakly:
/// the hub owns it), so every method may reach the hub through [`Turns::hub`].
pub(crate) struct Turns<P> {
    port: Weak<P>,
    /// Every lane's turns, queue and todo list.
    lanes: Lanes,
    /// A turn runs only with one of these (`limits.max_running_turns`).
    slots: Semaphore,
    watch: AgentWatch,
    /// Where voice notes are transcribed (`voice.rs`); `None` when no service is set.
    transcriber: RefCell<Option<Transcriber>>,
    /// Where answers are spoken (`voice_reply.rs`); `None` when no service is set.
    speaker: RefCell<Option<Speaker>>,
    /// Lanes told this run that voice notes need a transcription service (once each).
    voice_noticed: RefCell<HashSet<Lane>>,
}

impl<P: TurnPort> Turns<P> {
    /// `port`: the hub being built around these turns; `todos`: the lanes' saved todo lists.
    pub(in crate::hub) fn new(
        port: Weak<P>,
        max_running_turns: usize,
        todos: Vec<(Lane, Vec<TodoItem>)>,
    ) -> Turns<P> {
        Turns {
            port,
            lanes: Lanes::with_todos(todos),
            slots: Semaphore::new(max_running_turns),
            watch: AgentWatch::default(),
            transcriber: RefCell::default(),
            speaker: RefCell::default(),
            voice_noticed: RefCell::default(),
        }
    }

    /// The hub, for one call. It outlives every turn: the hub calls in while it is alive, and
    /// every task the turns start keeps it alive ([`Turns::spawn`]).
    fn hub(&self) -> Rc<P> {
        self.port
            .upgrade()
            .expect("the hub outlives its turns' calls and tasks")
    }

    /// Runs `task` on the event loop, keeping the hub alive until it ends.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + 'static) {
        let hub = self.hub();
        tokio::task::spawn_local(async move {
            task.await;
            drop(hub);
        });
    }

    /// Stops the running turn of `lane` (`/stop`, `agent.stop`, "Stop the task"); `false` when
    /// nothing runs there.
    pub(in crate::hub) fn stop(&self, lane: &Lane) -> bool {
        match self.lanes.abort_of(lane) {
            Some(a) => {
                a.stop();
                true
            }
            None => false,
        }
    }

    /// How to end the turn of `lane` that runs `run_id`, if that one is running.
    pub(in crate::hub) fn abort_of_run(&self, lane: &Lane, run_id: &str) -> Option<Rc<Abort>> {
        self.lanes.abort_of_run(lane, run_id)
    }

    /// Nothing runs or waits in `lane`.
    pub(in crate::hub) fn is_idle(&self, lane: &Lane) -> bool {
        self.lanes.is_idle(lane)
    }

    /// Turns waiting in `lane` behind the running one.
    pub(in crate::hub) fn waiting(&self, lane: &Lane) -> usize {
        self.lanes.waiting(lane)
    }

    /// The lane's todo list, when it changed since it was stored.
    pub(in crate::hub) fn unsaved_todos(&self, lane: &Lane) -> Option<Vec<TodoItem>> {
        self.lanes.unsaved_todos(lane)
    }

    /// Every lane's todo list, for a device's hello.
    pub(in crate::hub) fn todo_lists(&self) -> Vec<(Lane, Vec<TodoItem>)> {
        self.lanes.todo_lists()
    }

    /// Deleted messages take their turns with them: queued turns of deleted user messages are
    /// dropped, and a turn whose reply is deleted while streaming is abandoned (otherwise its
    /// end would store the deleted reply again).
    pub(in crate::hub) fn drop_turns_of(&self, message_ids: &[String]) {
        self.lanes.drop_turns_of(message_ids);
    }

    /// Drops everything live about deleted lanes: the running turn is abandoned, the todo list
    /// goes. Returns what the caller commits with the deletion (nothing is awaited here, so the
    /// deletion answers before the abandoned turn's last frames): the lanes' stored todo lists
    /// and agent sessions go, and their queued messages are closed (they were deleted with the
    /// lane's history).
    pub(in crate::hub) fn forget_lanes(&self, gone: impl Fn(&Lane) -> bool) -> Vec<Change> {
        use crate::store::Record;
        let mut closed = Vec::new();
        for lane in self.lanes.matching(&gone) {
            closed.push(Change::Record(Record::PutTodos(lane.clone(), Vec::new())));
            closed.push(Change::Record(Record::RemoveAgentSession(lane.clone())));
            closed.extend(self.lanes.forget(&lane).into_iter().map(Change::EndTurn));
        }
        closed
    }
}
