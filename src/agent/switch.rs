//! An agent that can be replaced while the gateway runs: what the admin page's Agent form saves
//! applies to the next turn, with no restart.
//!
//! The hub holds an `Rc<dyn Agent>` and never learns about switching: it holds a [`Switchable`],
//! which hands every call to the backend current at the time of the call. A call that already
//! started (a running turn, a probe) keeps the backend it started with until it ends, because
//! each forwarded future owns its own `Rc` of that backend.

use std::cell::RefCell;
use std::rc::Rc;

use tokio::sync::mpsc;

use super::{
    Agent, AgentError, AgentEvent, JobAction, JobInfo, JobRun, LocalBoxFuture, ModelOption,
    Recovery, RunState, Steered, TurnInput, TurnSummary,
};

/// The current backend, replaceable with [`Switchable::replace`].
pub struct Switchable {
    current: RefCell<Rc<dyn Agent>>,
}

impl Switchable {
    pub fn new(agent: Rc<dyn Agent>) -> Switchable {
        Switchable {
            current: RefCell::new(agent),
        }
    }

    /// The backend new calls go to (the borrow ends at once, never held across an await).
    pub fn current(&self) -> Rc<dyn Agent> {
        self.current.borrow().clone()
    }

    /// Makes `agent` answer every call from now on; calls under way finish with the old one.
    pub fn replace(&self, agent: Rc<dyn Agent>) {
        *self.current.borrow_mut() = agent;
    }
}

impl Agent for Switchable {
    fn name(&self) -> &'static str {
        self.current().name()
    }

    fn describe(&self) -> String {
        self.current().describe()
    }

    fn wants_history(&self) -> bool {
        self.current().wants_history()
    }

    fn probe(&self) -> LocalBoxFuture<'_, Result<(), AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.probe().await })
    }

    fn choices_note(&self) -> Option<&'static str> {
        self.current().choices_note()
    }

    fn can_pick_model(&self) -> bool {
        self.current().can_pick_model()
    }

    fn models(&self) -> LocalBoxFuture<'_, Result<Vec<ModelOption>, AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.models().await })
    }

    fn can_steer(&self) -> bool {
        self.current().can_steer()
    }

    fn steer_run<'a>(&'a self, run_id: &'a str, text: &'a str) -> LocalBoxFuture<'a, Steered> {
        let agent = self.current();
        Box::pin(async move { agent.steer_run(run_id, text).await })
    }

    fn recover<'a>(&'a self, session: &'a str, user_text: &'a str) -> LocalBoxFuture<'a, Recovery> {
        let agent = self.current();
        Box::pin(async move { agent.recover(session, user_text).await })
    }

    fn files_of(&self, text: String) -> LocalBoxFuture<'_, (String, Vec<AgentEvent>)> {
        let agent = self.current();
        Box::pin(async move { agent.files_of(text).await })
    }

    fn repeatable_start(&self) -> LocalBoxFuture<'_, Option<std::time::Duration>> {
        let agent = self.current();
        Box::pin(async move { agent.repeatable_start().await })
    }

    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.run_turn(turn, events).await })
    }

    fn answer_approval<'a>(
        &'a self,
        run_id: &'a str,
        choice: &'a str,
    ) -> LocalBoxFuture<'a, Result<bool, AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.answer_approval(run_id, choice).await })
    }

    fn stop_run<'a>(&'a self, run_id: &'a str) -> LocalBoxFuture<'a, ()> {
        let agent = self.current();
        Box::pin(async move { agent.stop_run(run_id).await })
    }

    fn run_state<'a>(&'a self, run_id: &'a str) -> LocalBoxFuture<'a, RunState> {
        let agent = self.current();
        Box::pin(async move { agent.run_state(run_id).await })
    }

    fn approvals_note(&self) -> Option<&'static str> {
        self.current().approvals_note()
    }

    fn has_jobs(&self) -> bool {
        self.current().has_jobs()
    }

    fn jobs(&self) -> LocalBoxFuture<'_, Result<Vec<JobInfo>, AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.jobs().await })
    }

    fn job_runs<'a>(
        &'a self,
        job: &'a JobInfo,
        after: Option<&'a str>,
    ) -> LocalBoxFuture<'a, Result<Vec<JobRun>, AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.job_runs(job, after).await })
    }

    fn job_action<'a>(
        &'a self,
        job_id: &'a str,
        action: JobAction,
    ) -> LocalBoxFuture<'a, Result<(), AgentError>> {
        let agent = self.current();
        Box::pin(async move { agent.job_action(job_id, action).await })
    }

    fn forget(&self, message_ids: &[String]) {
        self.current().forget(message_ids)
    }
}
