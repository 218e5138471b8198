//! What is read from a Hermes session's transcript: the history a run is sent, a completed
//! tool's record, the turn's reasoning and cost, and what a restart finds of an interrupted turn.
//! The rows are typed once as they arrive (`wire.rs`: [`Message`], its content and tool calls).

use std::time::Duration;

use serde_json::Value;

use super::wire::{record, HistoryTurn, Message, Role, SessionInfo, TodoResult, Transcript};
use super::TurnWorker;
use crate::agent::{AgentError, AgentEvent, Recovery, TurnSummary};
use crate::protocol::{TodoItem, TodoStatus};

/// Hermes reports a tool complete a moment before its result is in the transcript.
const TRANSCRIPT_RETRIES: usize = 5;
const TRANSCRIPT_RETRY_PAUSE: Duration = Duration::from_millis(120);

/// The rows of this turn: those after the last user message (all of them when there is none).
fn this_turn(messages: &[Message]) -> &[Message] {
    let since = messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1);
    &messages[since..]
}

impl TurnWorker {
    fn transcript(&self) -> Option<Vec<Message>> {
        let (_, v) = self
            .ep
            .get_json_lean(&format!("/api/sessions/{}/messages", self.session))
            .ok()?;
        record::<Transcript>(&v).rows()
    }

    /// Run events carry no provider reasoning (`reasoning.available` repeats the answer's
    /// text); the transcript has it on the turn's assistant rows.
    pub(super) fn send_reasoning(&self) {
        let Some(messages) = self.transcript() else {
            return;
        };
        let reasoning: Vec<&str> = this_turn(&messages)
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .filter_map(Message::reasoning)
            .filter(|r| !r.trim().is_empty())
            .collect();
        if !reasoning.is_empty() {
            self.send(AgentEvent::Reasoning(reasoning.join("\n\n")));
        }
    }

    /// Cost and model from the session object after the turn.
    pub(super) fn session_footer(&self, summary: &mut TurnSummary) {
        let Ok(v) = self.ep.get_json(&format!("/api/sessions/{}", self.session)) else {
            return;
        };
        let session = SessionInfo::of(&v);
        if let Some(m) = session.model {
            summary.model = Some(m);
        }
        summary.runtime.cost = session.cost_usd.filter(|c| *c > 0.0);
    }

    /// The lane's conversation so far, from its Hermes session, as `conversation_history`:
    /// a run does not load its session's history itself. User and assistant words only
    /// (the field is text only; tool rows would reach the model without their calls).
    pub(super) fn history(&self) -> Result<Vec<HistoryTurn>, AgentError> {
        let (status, v) = self
            .ep
            .get_json_lean(&format!("/api/sessions/{}/messages", self.session))?;
        if status == 404 {
            return Ok(Vec::new()); // the first turn of this session: Hermes creates it
        }
        if !(200..300).contains(&status) {
            return Err(AgentError::Failed(format!(
                "could not read the conversation's history (HTTP {status})"
            )));
        }
        let rows = record::<Transcript>(&v).rows().unwrap_or_default();
        Ok(rows
            .iter()
            .filter_map(|m| {
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::Tool | Role::Other => return None,
                };
                let content = without_image_placeholders(m.content.words()?);
                let content = content.trim();
                (!content.is_empty()).then(|| HistoryTurn {
                    role,
                    content: content.to_owned(),
                })
            })
            .collect())
    }

    /// The transcript's record of a completed tool: the first call of that name in this turn
    /// (after the last user message) that has a result and was not matched before.
    pub(super) fn run_tool_record(
        &self,
        name: &str,
        reported: &[String],
    ) -> Option<(String, Value, String)> {
        for attempt in 0..TRANSCRIPT_RETRIES {
            if attempt > 0 {
                std::thread::sleep(TRANSCRIPT_RETRY_PAUSE);
            }
            let Some(messages) = self.transcript() else {
                continue;
            };
            let turn = this_turn(&messages);
            let found = call_ids_named(turn, name)
                .into_iter()
                .filter(|id| !reported.contains(id))
                .find_map(|id| find_tool_call(turn, &id).map(|(a, o)| (id, a, o)));
            if found.is_some() {
                return found;
            }
        }
        None
    }
}

/// In a transcript: the arguments of tool call `call_id` (`{}` when it is not found) and its
/// result text; `None` while the call has no result row.
pub(super) fn find_tool_call(messages: &[Message], call_id: &str) -> Option<(Value, String)> {
    let result = messages
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call_id))?;
    let args = messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.id.as_deref() == Some(call_id))
        .map_or_else(
            || Value::Object(Default::default()),
            |c| c.function.arguments.clone(),
        );
    Some((args, result.content.as_output()))
}

/// The todo tool's result (authoritative, even for merge writes) as a todo list.
pub(super) fn todos_from_result(output: &str) -> Option<Vec<TodoItem>> {
    let v: Value = serde_json::from_str(output).ok()?;
    let rows = record::<TodoResult>(&v).rows()?;
    Some(
        rows.into_iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let content = t.content?;
                let status = match t.status.as_deref() {
                    Some("in_progress") => TodoStatus::InProgress,
                    Some("completed") => TodoStatus::Completed,
                    Some("cancelled") => TodoStatus::Cancelled,
                    _ => TodoStatus::Pending,
                };
                let id = t.id.written().unwrap_or_else(|| (i + 1).to_string());
                Some(TodoItem {
                    id,
                    content,
                    status,
                })
            })
            .collect(),
    )
}

/// Ids of the calls of tool `name` in `messages`, in order.
pub(super) fn call_ids_named(messages: &[Message], name: &str) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .filter(|c| c.function.name.as_deref() == Some(name))
        .filter_map(|c| c.id.clone())
        .collect()
}

/// What a transcript says about `user_text`, the last message a restart interrupted. Hermes
/// stores a partial answer (no `finish_reason`) when the stream to the gateway broke.
pub(super) fn recovery_from(messages: &[Message], user_text: &str) -> Recovery {
    let text_of = |m: &Message| m.content.words().unwrap_or_default().trim().to_owned();
    let Some(asked) = messages
        .iter()
        .rposition(|m| m.role == Role::User && asked_by(&text_of(m), user_text))
    else {
        return Recovery::Unknown;
    };
    let last = messages[asked + 1..]
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && !text_of(m).is_empty());
    match last {
        Some(m) => {
            if matches!(m.finish_reason.as_deref(), Some("stop" | "length")) {
                Recovery::Answered(text_of(m))
            } else {
                Recovery::Partial(text_of(m))
            }
        }
        None => Recovery::Unknown,
    }
}

/// Hermes saves a message's images as `[screenshot]` lines (run_agent.py,
/// `_flush_messages_to_session_db_unlocked`); the gateway's own `[image: NAME]` lines already
/// say what was shown, and a photo is no screenshot.
pub(super) fn without_image_placeholders(text: &str) -> String {
    if !text.contains("[image: ") {
        return text.to_owned();
    }
    text.lines()
        .filter(|l| l.trim() != "[screenshot]")
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a stored user message is the one the person typed `typed` into: the same text, or
/// that text followed by the lines for its files (`[image: …]`, `[file: …]`, `[attached: …]`).
fn asked_by(stored: &str, typed: &str) -> bool {
    let (stored, typed) = (stored.trim(), typed.trim());
    match stored.strip_prefix(typed) {
        Some("") => true,
        Some(rest) if typed.is_empty() => rest.starts_with('['),
        Some(rest) => rest.starts_with("\n["),
        None => false,
    }
}
