//! Agent backends behind one trait. A backend turns a user message into a stream of events;
//! it never sees frames, sockets or the store, so a new backend is one file.
//!
//! The network backends (`hermes`, `openai`) speak HTTP with blocking `ureq` on a worker thread
//! per running turn (`http.rs`), and hand events back over a channel: the event loop never
//! blocks, and at most `limits.max_running_turns` threads exist.
//!
//! Files an agent names in its answer (`MEDIA:` lines, inline `data:` images) are taken out of
//! the text on those threads and become `AgentEvent::File`s (`media_out/`).

mod demo;
mod hermes;
mod http;
pub mod media_in;
pub mod media_out;
mod off;
mod openai;
pub mod speech;
mod switch;
pub mod transcribe;

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use tokio::sync::mpsc;

pub use demo::DemoAgent;
pub use hermes::HermesAgent;
pub use off::OffAgent;
pub use openai::OpenAiAgent;
pub use speech::{Speaker, SpeechError, Spoken};
pub use switch::Switchable;
pub use transcribe::{TranscribeError, Transcriber};

// Plain data the store keeps too; it lives below both (a sibling service may not import this
// one), and is re-exported here, where a reader of the agent looks for it.
pub use crate::approval::ApprovalRequest;
pub use crate::config::AgentSettings;
use crate::protocol::{Lane, MediaRef, Role, Runtime, TodoItem};

/// The backend the configuration names.
pub fn from_config(
    config: &crate::config::Config,
) -> Result<std::rc::Rc<dyn Agent>, crate::config::ConfigError> {
    let a = &config.agent;
    let files = std::sync::Arc::new(media_out::FilePolicy::from_config(config));
    let media = media_in::MediaLimits::from_limits(&config.limits);
    Ok(match a.backend.as_str() {
        "hermes" => {
            std::rc::Rc::new(HermesAgent::new(a, a.resolve_key()?, media).with_files(files))
        }
        "openai" => {
            std::rc::Rc::new(OpenAiAgent::new(a, a.resolve_key()?, media).with_files(files))
        }
        _ => std::rc::Rc::new(DemoAgent::new(config.demo.pace_ms)),
    })
}

/// A boxed future that need not be `Send`: everything runs on one thread.
pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What the agent is asked to answer.
#[derive(Debug, Clone)]
pub struct TurnInput {
    pub lane: Lane,
    pub user_message_id: String,
    pub text: String,
    /// Files attached to the message, with where their bytes are on disk.
    pub media: Vec<(MediaRef, std::path::PathBuf)>,
    /// The media ids of the voice notes in `media` whose transcript `text` carries (after the
    /// typed text): the agent is told they were heard, not that it got a sound it cannot hear.
    pub heard: Vec<String>,
    /// The lane's conversation at the agent (a Hermes session id). Stable until `/new`.
    pub session: String,
    /// Earlier messages of this conversation, oldest first, for backends that keep no history
    /// of their own (`wants_history`); empty otherwise.
    pub history: Vec<PastMessage>,
    /// The user's `/reasoning`, `/fast` and `/model` choices.
    pub settings: AgentSettings,
    /// A run the agent already has (started before a gateway restart): follow it to its end
    /// instead of handing the message over again.
    pub resume_run: Option<String>,
}

/// One earlier message, as a backend that keeps no history needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PastMessage {
    pub role: Role,
    pub text: String,
}

/// One step of a turn, as the agent reports it. The hub turns these into frames.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// More of the answer's text (appended).
    Text(String),
    /// More of the model's reasoning (appended; shown above the answer).
    Reasoning(String),
    /// An intermediate beat between tool calls.
    Commentary(String),
    ToolStart {
        index: i64,
        name: String,
        preview: String,
        args: Value,
        emoji: Option<String>,
    },
    ToolProgress {
        index: i64,
        note: String,
    },
    ToolEnd {
        index: i64,
        ok: bool,
        duration_secs: f64,
        output_preview: String,
    },
    /// The full current todo list of this lane.
    Todos(Vec<TodoItem>),
    /// A file the agent produced for the user (stored, then offered with `media.offer`).
    File {
        filename: String,
        mime: String,
        kind: String,
        bytes: Vec<u8>,
    },
    /// The agent took the message as this run (Hermes' runs API): from here on the run can be
    /// answered, stopped and, after a gateway restart, found again.
    RunStarted(String),
    /// The run waits for a person to approve a command the agent flagged as dangerous.
    Approval(ApprovalRequest),
    /// The approval the run waited for is over without the gateway having answered it
    /// (Hermes' own timeout: the command was not run). Ignored when the gateway answered.
    ApprovalExpired,
    /// The run ended with steering text it never gave the model (Hermes' `pending_steer`: the
    /// steer came after the run's last model call). The hub makes it the lane's next message.
    PendingSteer(String),
    /// The turn made a scheduled job (Hermes' `cronjob` tool): its results belong to this lane.
    JobMade(String),
}

/// A scheduled job at the agent, as `/jobs` lists it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobInfo {
    pub id: String,
    pub name: String,
    /// In the agent's words (`every 1m`, `0 9 * * *`).
    pub schedule: String,
    pub next_run_at: Option<String>,
    /// Changes with every finished run: the cue to look for its output.
    pub last_run_at: Option<String>,
    pub last_status: Option<String>,
    pub paused: bool,
}

/// One finished run of a job, as the agent saved it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRun {
    /// Orders a job's runs as text; kept as the job's newest delivered run.
    pub stamp: String,
    /// When the run was saved (epoch ms).
    pub at_ms: i64,
    /// What the run said; `None` when it asked to stay silent (Hermes' `[SILENT]`).
    pub text: Option<String>,
}

/// What `/jobs` can do to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Pause,
    Resume,
    RunNow,
    Remove,
}

impl JobAction {
    pub const ALL: [JobAction; 4] = [
        JobAction::Pause,
        JobAction::Resume,
        JobAction::RunNow,
        JobAction::Remove,
    ];

    /// The picker value, and the words a person reads.
    pub fn value(self) -> &'static str {
        match self {
            JobAction::Pause => "pause",
            JobAction::Resume => "resume",
            JobAction::RunNow => "run",
            JobAction::Remove => "remove",
        }
    }

    pub fn from_value(value: &str) -> Option<JobAction> {
        JobAction::ALL.into_iter().find(|a| a.value() == value)
    }
}

/// What became of guidance handed to a running turn (`Agent::steer_run`).
#[derive(Debug, Clone, PartialEq)]
pub enum Steered {
    /// The run took it: the model sees it at its next call (or the run's end returns it as
    /// `AgentEvent::PendingSteer`).
    Accepted,
    /// The run did not take it (it is ending, or this agent cannot be steered): why, in words
    /// for the person who sent it.
    NotTaken(String),
}

/// A model the user may pick with `/model`: the model's id and, where the agent lists models
/// per provider (Hermes' model options), the provider that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOption {
    pub model: String,
    pub provider: Option<String>,
}

/// Between a provider and a model in a picker value: never in a provider's slug.
const PROVIDER_SEPARATOR: &str = "::";

impl ModelOption {
    pub fn bare(model: impl Into<String>) -> ModelOption {
        ModelOption {
            model: model.into(),
            provider: None,
        }
    }

    /// What a picker sends back and `/model` accepts: `provider::model`, or the model alone.
    pub fn value(&self) -> String {
        match &self.provider {
            Some(p) => format!("{p}{PROVIDER_SEPARATOR}{}", self.model),
            None => self.model.clone(),
        }
    }

    /// Whether `/model VALUE` (or a picker's value) names this option: its [`value`], or the
    /// model's id alone.
    ///
    /// [`value`]: ModelOption::value
    pub fn is_named(&self, value: &str) -> bool {
        value == self.value() || value == self.model
    }
}

/// Where a run is, as the agent reports it (after a gateway restart, or a lost stream).
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// Still going; `waiting` while it waits for an approval.
    Active {
        waiting: bool,
    },
    Completed {
        output: String,
        tokens: Option<i64>,
    },
    Failed(String),
    Cancelled,
    /// The agent does not know the run (restarted, or the run is older than it keeps them).
    Gone,
}

/// What the agent's own store says about a turn a restart interrupted.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// The agent finished it: here is the answer it stored.
    Answered(String),
    /// The agent stored only the start of an answer (the stream broke mid-turn).
    Partial(String),
    /// Nothing usable (no store, unreachable, or no answer stored yet): fail it clearly.
    /// An absent message is not proof it never arrived (Hermes stores a turn when it ends),
    /// so nothing is ever sent again.
    Unknown,
}

/// How a finished turn went, for the `message.stop` footer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnSummary {
    pub model: Option<String>,
    pub tokens: Option<i64>,
    pub runtime: Runtime,
}

/// Why a turn (or a probe) failed. The variant decides what the hub does next: only failures
/// that happened *before* the agent accepted the message may be retried, so a message is
/// handed over at most once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// No connection (refused, unreachable, DNS, connect timeout): the message was not handed
    /// over. The hub waits for the agent and tries again.
    #[error("the agent is unreachable: {0}")]
    Unreachable(String),
    /// The agent refused the key (401/403). Not retried: a person must fix the configuration.
    #[error("the agent refused the gateway's key ({0}); check agent.key")]
    Unauthorized(String),
    /// The agent asked us to come back later (429, or 503) without taking the message.
    #[error("the agent is busy: {why}")]
    Busy {
        retry_after: Option<std::time::Duration>,
        why: String,
    },
    /// The agent took the message, then the stream ended before the turn did.
    #[error("the agent stopped mid-answer: {0}")]
    Interrupted(String),
    /// The turn ran past `agent.turn_timeout_secs` and was stopped.
    #[error("the agent took longer than {0} seconds and was stopped")]
    TimedOut(u64),
    /// The agent answered with an error of its own.
    #[error("the agent failed: {0}")]
    Failed(String),
}

impl AgentError {
    /// The message never reached the agent, so trying again cannot answer it twice.
    pub fn not_handed_over(&self) -> bool {
        matches!(self, AgentError::Unreachable(_) | AgentError::Busy { .. })
    }

    /// The agent as a whole is not usable (the gateway reports `degraded` until a probe
    /// succeeds), as opposed to one turn going wrong.
    pub fn agent_is_down(&self) -> bool {
        matches!(
            self,
            AgentError::Unreachable(_) | AgentError::Unauthorized(_) | AgentError::Interrupted(_)
        )
    }
}

/// An agent backend.
pub trait Agent {
    /// Short name for logs and `/status`.
    fn name(&self) -> &'static str;

    /// Where the agent is, for `/status` (never includes a key).
    fn describe(&self) -> String {
        self.name().to_owned()
    }

    /// Whether `TurnInput::history` must be filled: true for backends that keep no history.
    fn wants_history(&self) -> bool {
        false
    }

    /// Checks the agent is reachable and accepts our key, without starting a turn.
    fn probe(&self) -> LocalBoxFuture<'_, Result<(), AgentError>> {
        Box::pin(async { Ok(()) })
    }

    /// Set when the backend cannot apply `/reasoning` and `/fast` per message: what to tell
    /// the user instead (the choice is still kept).
    fn choices_note(&self) -> Option<&'static str> {
        None
    }

    /// Whether `/model` is offered: false for a backend that has one model only (the demo).
    fn can_pick_model(&self) -> bool {
        true
    }

    /// Models the user may pick with `/model`; empty when the backend cannot switch.
    fn models(&self) -> LocalBoxFuture<'_, Result<Vec<ModelOption>, AgentError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Whether a running turn can take guidance now (`steer_run`): the agent advertises it.
    fn can_steer(&self) -> bool {
        false
    }

    /// Hands `text` to the running `run_id` as guidance for the answer it is making.
    fn steer_run<'a>(&'a self, _run_id: &'a str, _text: &'a str) -> LocalBoxFuture<'a, Steered> {
        Box::pin(async { Steered::NotTaken("this agent cannot be steered".into()) })
    }

    /// After a restart, what became of a turn the gateway never finished: the agent's own
    /// store may hold its answer. Never resends.
    fn recover<'a>(
        &'a self,
        _session: &'a str,
        _user_text: &'a str,
    ) -> LocalBoxFuture<'a, Recovery> {
        Box::pin(async { Recovery::Unknown })
    }

    /// The files a finished answer names (`MEDIA:` lines, inline images) when it did not stream
    /// through a turn (a run that ended while the gateway was down, an answer recovered from
    /// the agent's store): the text without them, and `AgentEvent::File`s. The demo names none.
    fn files_of(&self, text: String) -> LocalBoxFuture<'_, (String, Vec<AgentEvent>)> {
        Box::pin(async move { (text, Vec::new()) })
    }

    /// How long after a message its run may be started again and be answered with the run of
    /// the first start (Hermes' durable `Idempotency-Key`s), so that a restart can hand over a
    /// message it does not know the fate of; `None` when a repeat could run it twice.
    fn repeatable_start(&self) -> LocalBoxFuture<'_, Option<std::time::Duration>> {
        Box::pin(async { None })
    }

    /// Runs one turn, sending events as they happen. Returns when the turn is over; dropping
    /// the returned future abandons the turn.
    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>>;

    /// Answers the approval a run waits for (`once`, `session`, `always` or `deny`; never all
    /// of a run's requests at once). `Ok(false)`: the request is no longer open (answered,
    /// timed out, or the run is over).
    fn answer_approval<'a>(
        &'a self,
        _run_id: &'a str,
        _choice: &'a str,
    ) -> LocalBoxFuture<'a, Result<bool, AgentError>> {
        Box::pin(async { Ok(false) })
    }

    /// Stops a run at the agent (closing a stream does not stop a run).
    fn stop_run<'a>(&'a self, _run_id: &'a str) -> LocalBoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Where a run is now.
    fn run_state<'a>(&'a self, _run_id: &'a str) -> LocalBoxFuture<'a, RunState> {
        Box::pin(async { RunState::Gone })
    }

    /// What to say about the agent's approval settings in `/status`, if anything.
    fn approvals_note(&self) -> Option<&'static str> {
        None
    }

    /// Whether the agent has scheduled jobs the gateway can list and deliver (Hermes).
    fn has_jobs(&self) -> bool {
        false
    }

    /// Every scheduled job the agent has.
    fn jobs(&self) -> LocalBoxFuture<'_, Result<Vec<JobInfo>, AgentError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// `job`'s finished runs newer than the run stamped `after`, oldest first.
    fn job_runs<'a>(
        &'a self,
        _job: &'a JobInfo,
        _after: Option<&'a str>,
    ) -> LocalBoxFuture<'a, Result<Vec<JobRun>, AgentError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Pauses, resumes, runs or removes a job at the agent.
    fn job_action<'a>(
        &'a self,
        _job_id: &'a str,
        _action: JobAction,
    ) -> LocalBoxFuture<'a, Result<(), AgentError>> {
        Box::pin(async {
            Err(AgentError::Failed(
                "this agent has no scheduled jobs".into(),
            ))
        })
    }

    /// The user deleted these messages: a backend that keeps its own copy of the conversation
    /// drops them, so the agent cannot recall them later. The demo keeps nothing.
    fn forget(&self, _message_ids: &[String]) {}
}
