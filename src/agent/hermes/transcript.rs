//! What is read from a Hermes session's transcript: the history a run is sent, a completed
//! tool's record, the turn's reasoning and cost, and what a restart finds of an interrupted turn.

use std::time::Duration;

use serde_json::{json, Value};

use super::TurnWorker;
use crate::agent::{AgentError, AgentEvent, Recovery, TurnSummary};
use crate::protocol::{TodoItem, TodoStatus};

/// Hermes reports a tool complete a moment before its result is in the transcript.
const TRANSCRIPT_RETRIES: usize = 5;
const TRANSCRIPT_RETRY_PAUSE: Duration = Duration::from_millis(120);

/// A transcript row's words: a plain `content`, or the text parts of a list (a message sent
/// with images; its `[image: NAME]` lines are in its text). No image bytes.
pub(super) fn content_text(m: &Value) -> Option<String> {
    match m.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter(|p| {
                    matches!(
                        p.get("type").and_then(Value::as_str),
                        Some("text" | "input_text")
                    )
                })
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

impl TurnWorker {
    fn transcript(&self) -> Option<Vec<Value>> {
        let (_, v) = self
            .ep
            .get_json_lean(&format!("/api/sessions/{}/messages", self.session))
            .ok()?;
        v.get("messages")
            .or(v.get("data"))
            .and_then(Value::as_array)
            .cloned()
    }

    /// Run events carry no provider reasoning (`reasoning.available` repeats the answer's
    /// text); the transcript has it on the turn's assistant rows.
    pub(super) fn send_reasoning(&self) {
        let Some(messages) = self.transcript() else {
            return;
        };
        let since = messages
            .iter()
            .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map_or(0, |i| i + 1);
        let reasoning: Vec<&str> = messages[since..]
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .filter_map(|m| {
                m.get("reasoning")
                    .or_else(|| m.get("reasoning_content"))
                    .and_then(Value::as_str)
            })
            .filter(|r| !r.trim().is_empty())
            .collect();
        if !reasoning.is_empty() {
            self.send(AgentEvent::Reasoning(reasoning.join("\n\n")));
        }
    }

    /// Cost and model from the session object after the turn.
    pub(super) fn session_footer(&self, summary: &mut TurnSummary) {
        let Ok(s) = self.ep.get_json(&format!("/api/sessions/{}", self.session)) else {
            return;
        };
        let s = s.get("session").unwrap_or(&s);
        if let Some(m) = s
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            summary.model = Some(m.to_owned());
        }
        let cost = ["actual_cost_usd", "estimated_cost_usd"]
            .iter()
            .find_map(|k| s.get(*k).and_then(Value::as_f64));
        summary.runtime.cost = cost.filter(|c| *c > 0.0);
    }

    /// The lane's conversation so far, from its Hermes session, as `conversation_history`:
    /// a run does not load its session's history itself. User and assistant words only
    /// (the field is text only; tool rows would reach the model without their calls).
    pub(super) fn history(&self) -> Result<Vec<Value>, AgentError> {
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
        let rows = v
            .get("messages")
            .or(v.get("data"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok(rows
            .iter()
            .filter_map(|m| {
                let role = m.get("role").and_then(Value::as_str)?;
                let content = without_image_placeholders(&content_text(m)?);
                let content = content.trim();
                (matches!(role, "user" | "assistant") && !content.is_empty())
                    .then(|| json!({ "role": role, "content": content }))
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
            let since = messages
                .iter()
                .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"))
                .map_or(0, |i| i + 1);
            let turn = &messages[since..];
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

/// In a transcript: the arguments of tool call `call_id` and its result text.
pub(super) fn find_tool_call(messages: &[Value], call_id: &str) -> Option<(Value, String)> {
    let result = messages.iter().find(|m| {
        m.get("role").and_then(Value::as_str) == Some("tool")
            && m.get("tool_call_id").and_then(Value::as_str) == Some(call_id)
    })?;
    let output = match result.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let args = messages
        .iter()
        .filter_map(|m| m.get("tool_calls"))
        .filter_map(|calls| match calls {
            Value::String(s) => serde_json::from_str::<Value>(s).ok(),
            other => Some(other.clone()),
        })
        .filter_map(|calls| calls.as_array().cloned())
        .flatten()
        .find(|c| c.get("id").and_then(Value::as_str) == Some(call_id))
        .and_then(|c| {
            let raw = c.pointer("/function/arguments")?;
            Some(match raw {
                Value::String(s) => serde_json::from_str(s).unwrap_or(json!({ "raw": s })),
                other => other.clone(),
            })
        })
        .unwrap_or_else(|| json!({}));
    Some((args, output))
}

/// The todo tool's result (authoritative, even for merge writes) as a todo list.
pub(super) fn todos_from_result(output: &str) -> Option<Vec<TodoItem>> {
    let v: Value = serde_json::from_str(output).ok()?;
    let list = v.get("todos").or_else(|| v.pointer("/result/todos"))?;
    let items = list.as_array()?;
    Some(
        items
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let content = t.get("content").and_then(Value::as_str)?.to_owned();
                let status = match t.get("status").and_then(Value::as_str) {
                    Some("in_progress") => TodoStatus::InProgress,
                    Some("completed") => TodoStatus::Completed,
                    Some("cancelled") => TodoStatus::Cancelled,
                    _ => TodoStatus::Pending,
                };
                let id = t
                    .get("id")
                    .map(|v| v.as_str().map(str::to_owned).unwrap_or(v.to_string()))
                    .unwrap_or_else(|| (i + 1).to_string());
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
pub(super) fn call_ids_named(messages: &[Value], name: &str) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| m.get("tool_calls"))
        .filter_map(|calls| match calls {
            Value::String(s) => serde_json::from_str::<Value>(s).ok(),
            other => Some(other.clone()),
        })
        .filter_map(|calls| calls.as_array().cloned())
        .flatten()
        .filter(|c| c.pointer("/function/name").and_then(Value::as_str) == Some(name))
        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// What a transcript says about `user_text`, the last message a restart interrupted. Hermes
/// stores a partial answer (no `finish_reason`) when the stream to the gateway broke.
pub(super) fn recovery_from(messages: &[Value], user_text: &str) -> Recovery {
    let text_of = |m: &Value| content_text(m).unwrap_or_default().trim().to_owned();
    let role_of = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let Some(asked) = messages
        .iter()
        .rposition(|m| role_of(m) == "user" && asked_by(&text_of(m), user_text))
    else {
        return Recovery::Unknown;
    };
    let last = messages[asked + 1..]
        .iter()
        .rev()
        .find(|m| role_of(m) == "assistant" && !text_of(m).is_empty());
    match last {
        Some(m) => {
            let finished = m.get("finish_reason").and_then(Value::as_str);
            if matches!(finished, Some("stop" | "length")) {
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
