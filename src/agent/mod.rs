//! Agent backends behind one trait. A backend turns a user message into a stream of events;
//! it never sees frames, sockets or the store, so a new backend is one file.

mod demo;

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use tokio::sync::mpsc;

pub use demo::DemoAgent;

use crate::protocol::{Lane, MediaRef, Runtime, TodoItem};

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
}

/// How a finished turn went, for the `message.stop` footer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnSummary {
    pub model: Option<String>,
    pub tokens: Option<i64>,
    pub runtime: Runtime,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the agent failed: {0}")]
    Failed(String),
}

/// An agent backend.
pub trait Agent {
    /// Short name for logs and `/status`.
    fn name(&self) -> &'static str;

    /// Runs one turn, sending events as they happen. Returns when the turn is over; dropping
    /// the returned future abandons the turn.
    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>>;

    /// The user deleted these messages: a backend that keeps its own copy of the conversation
    /// drops them, so the agent cannot recall them later. The demo keeps nothing.
    fn forget(&self, _message_ids: &[String]) {}
}
