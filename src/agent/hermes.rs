//! A Hermes Agent, through the API server of `hermes gateway run` (docs/hermes.md has the
//! endpoint choice and the stream → frame table).
//!
//! A turn streams from `POST /v1/chat/completions` with `X-Hermes-Session-Id` set to the
//! lane's session: Hermes loads that session's history itself, and closing this stream
//! interrupts the agent, which is what `/stop`, the turn time limit and a deleted conversation
//! need. That stream lacks tool arguments, tool results and the todo list, so when a tool
//! completes the backend reads the session's transcript (`GET /api/sessions/{id}/messages`),
//! and after the turn the session object (`GET /api/sessions/{id}`) for the real model and cost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{off_loop, Endpoint, SseEvent};
use super::openai::{model_ids, read_chunk, user_text};
use super::{Agent, AgentError, AgentEvent, LocalBoxFuture, Recovery, TurnInput, TurnSummary};
use crate::config::{AgentConfig, Secret};
use crate::protocol::{Runtime, TodoItem, TodoStatus};

/// Longest tool output shown in `tool.end`.
const OUTPUT_PREVIEW_CHARS: usize = 200;
/// Hermes reports a tool complete a moment before its result is in the transcript.
const TRANSCRIPT_RETRIES: usize = 5;
const TRANSCRIPT_RETRY_PAUSE: Duration = Duration::from_millis(120);

pub struct HermesAgent {
    endpoint: Endpoint,
    /// Model to ask for; empty leaves Hermes' configured default.
    model: String,
}

impl HermesAgent {
    pub fn new(config: &AgentConfig, key: Secret) -> HermesAgent {
        HermesAgent {
            endpoint: Endpoint::new(config, key),
            model: config.model.trim().to_owned(),
        }
    }
}

/// A tool call seen in the stream.
struct RunningTool {
    index: i64,
    name: String,
    started: Instant,
}

/// Everything one turn's worker needs, moved onto its thread.
struct TurnWorker {
    ep: Endpoint,
    session: String,
    events: mpsc::Sender<AgentEvent>,
}

impl TurnWorker {
    fn send(&self, e: AgentEvent) -> bool {
        self.events.blocking_send(e).is_ok()
    }

    fn transcript(&self) -> Option<Vec<Value>> {
        let v = self
            .ep
            .get_json(&format!("/api/sessions/{}/messages", self.session))
            .ok()?;
        v.get("messages")
            .or(v.get("data"))
            .and_then(Value::as_array)
            .cloned()
    }

    /// A completed tool's arguments and result, from the transcript (briefly retried).
    fn tool_record(&self, call_id: &str) -> Option<(Value, String)> {
        for attempt in 0..TRANSCRIPT_RETRIES {
            if attempt > 0 {
                std::thread::sleep(TRANSCRIPT_RETRY_PAUSE);
            }
            let Some(messages) = self.transcript() else {
                continue;
            };
            if let Some(found) = find_tool_call(&messages, call_id) {
                return Some(found);
            }
        }
        None
    }

    /// The stream carries no reasoning; the transcript has it on the turn's assistant rows.
    fn send_reasoning(&self) {
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
    fn session_footer(&self, summary: &mut TurnSummary) {
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
}

/// In a transcript: the arguments of tool call `call_id` and its result text.
fn find_tool_call(messages: &[Value], call_id: &str) -> Option<(Value, String)> {
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
fn todos_from_result(output: &str) -> Option<Vec<TodoItem>> {
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

/// `hermes.tool.progress` payloads.
fn tool_progress(ev: &SseEvent) -> Option<Value> {
    (ev.event == "hermes.tool.progress")
        .then(|| serde_json::from_str(&ev.data).ok())
        .flatten()
}

fn run_stream(
    w: &TurnWorker,
    body: &Value,
    stop: &super::http::StopFlag,
) -> Result<TurnSummary, AgentError> {
    // Hermes creates the session on first use and loads its history itself.
    let mut summary = TurnSummary::default();
    let mut tools: HashMap<String, RunningTool> = HashMap::new();
    let mut next_index = 0i64;
    let mut finished = false;
    let mut failure = None;
    let headers = [("X-Hermes-Session-Id", w.session.as_str())];
    w.ep.post_sse("/v1/chat/completions", &headers, body, stop, |ev| {
        if let Some(p) = tool_progress(&ev) {
            let call_id = p.get("toolCallId").and_then(Value::as_str).unwrap_or("");
            let name = p.get("tool").and_then(Value::as_str).unwrap_or("tool");
            match p.get("status").and_then(Value::as_str) {
                Some("running") => {
                    next_index += 1;
                    tools.insert(
                        call_id.to_owned(),
                        RunningTool {
                            index: next_index,
                            name: name.to_owned(),
                            started: Instant::now(),
                        },
                    );
                    let preview = p.get("label").and_then(Value::as_str).unwrap_or(name);
                    return w.send(AgentEvent::ToolStart {
                        index: next_index,
                        name: name.to_owned(),
                        preview: preview.to_owned(),
                        args: json!({}),
                        emoji: p
                            .get("emoji")
                            .and_then(Value::as_str)
                            .filter(|e| !e.is_empty())
                            .map(str::to_owned),
                    }) && !stop.is_set();
                }
                Some(status) => {
                    let Some(tool) = tools.remove(call_id) else {
                        return true;
                    };
                    let duration = tool.started.elapsed().as_secs_f64();
                    let record = w.tool_record(call_id);
                    let output = record.as_ref().map(|r| r.1.as_str()).unwrap_or("");
                    if tool.name == "todo" {
                        if let Some(todos) = todos_from_result(output) {
                            w.send(AgentEvent::Todos(todos));
                        }
                    }
                    let ok = status == "completed"
                        && serde_json::from_str::<Value>(output)
                            .ok()
                            .is_none_or(|v| v.get("error").is_none_or(Value::is_null));
                    return w.send(AgentEvent::ToolEnd {
                        index: tool.index,
                        ok,
                        duration_secs: (duration * 1000.0).round() / 1000.0,
                        output_preview: output.chars().take(OUTPUT_PREVIEW_CHARS).collect(),
                    }) && !stop.is_set();
                }
                None => return true,
            }
        }
        if ev.data.trim() == "[DONE]" {
            finished = true;
            return false;
        }
        let Some(chunk) = read_chunk(&ev.data) else {
            return true;
        };
        if let Some(t) = chunk.total_tokens.filter(|t| *t > 0) {
            summary.tokens = Some(t);
        }
        if chunk.finish_reason.is_some() {
            finished = true;
        }
        if let Some(e) = chunk.error.or_else(|| {
            let v: Value = serde_json::from_str(&ev.data).ok()?;
            v.pointer("/hermes/error")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }) {
            failure = Some(e);
        }
        match chunk.text {
            Some(t) => w.send(AgentEvent::Text(t)) && !stop.is_set(),
            None => true,
        }
    })?;
    if stop.is_set() {
        return Ok(summary);
    }
    if let Some(e) = failure {
        return Err(AgentError::Failed(e));
    }
    if !finished {
        return Err(AgentError::Interrupted(
            "the stream ended before the answer did".into(),
        ));
    }
    w.send_reasoning();
    w.session_footer(&mut summary);
    Ok(summary)
}

/// What a transcript says about `user_text`, the last message a restart interrupted. Hermes
/// stores a partial answer (no `finish_reason`) when the stream to the gateway broke.
fn recovery_from(messages: &[Value], user_text: &str) -> Recovery {
    let text_of = |m: &Value| match m.get("content") {
        Some(Value::String(s)) => s.trim().to_owned(),
        _ => String::new(),
    };
    let role_of = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let Some(asked) = messages
        .iter()
        .rposition(|m| role_of(m) == "user" && text_of(m) == user_text.trim())
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

impl Agent for HermesAgent {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn describe(&self) -> String {
        format!("Hermes Agent at {}", self.endpoint.base())
    }

    fn choices_note(&self) -> Option<&'static str> {
        // Its API server reads only `messages`, `stream` and `model` from a request.
        Some("Hermes takes reasoning effort and speed from its own config.yaml (agent.reasoning_effort), not per message: the choice is kept here but Hermes does not see it.")
    }

    fn probe(&self) -> LocalBoxFuture<'_, Result<(), AgentError>> {
        let ep = self.endpoint.clone();
        // /v1/models needs the key, so this also proves the key is right.
        Box::pin(async move {
            off_loop("agent-probe", move |_| ep.get_json("/v1/models"))
                .await?
                .map(|_| ())
        })
    }

    fn models(&self) -> LocalBoxFuture<'_, Result<Vec<String>, AgentError>> {
        let ep = self.endpoint.clone();
        Box::pin(async move {
            let v = off_loop("agent-models", move |_| ep.get_json("/v1/models")).await??;
            Ok(model_ids(&v))
        })
    }

    fn recover<'a>(&'a self, session: &'a str, user_text: &'a str) -> LocalBoxFuture<'a, Recovery> {
        let ep = self.endpoint.clone();
        let (session, user_text) = (session.to_owned(), user_text.to_owned());
        Box::pin(async move {
            let found = off_loop("agent-recover", move |_| {
                match ep.get_json(&format!("/api/sessions/{session}/messages")) {
                    Ok(v) => {
                        let messages = v
                            .get("messages")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        recovery_from(&messages, &user_text)
                    }
                    Err(_) => Recovery::Unknown,
                }
            })
            .await;
            found.unwrap_or(Recovery::Unknown)
        })
    }

    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        let mut body = json!({
            "messages": [{ "role": "user", "content": user_text(&turn) }],
            "stream": true,
        });
        let model = turn
            .settings
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .or_else(|| (!self.model.is_empty()).then(|| self.model.clone()));
        if let Some(m) = &model {
            body["model"] = json!(m);
        }
        let worker = TurnWorker {
            ep: self.endpoint.clone(),
            session: turn.session.clone(),
            events,
        };
        Box::pin(async move {
            let mut summary =
                off_loop("agent-turn", move |stop| run_stream(&worker, &body, &stop)).await??;
            summary.runtime = Runtime {
                cost: summary.runtime.cost,
                ..Runtime::default()
            };
            Ok(summary)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_is_found_with_its_arguments_and_result() {
        let messages = vec![
            json!({"role": "user", "content": "plan tea"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "todo", "arguments": "{\"todos\":[{\"id\":\"1\",\"content\":\"Boil\",\"status\":\"pending\"}]}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"todos\":[{\"id\":\"1\",\"content\":\"Boil\",\"status\":\"in_progress\"}]}"}),
        ];
        let (args, output) = find_tool_call(&messages, "call_1").unwrap();
        assert_eq!(args["todos"][0]["content"], "Boil");
        let todos = todos_from_result(&output).unwrap();
        assert_eq!(todos.len(), 1);
        assert_eq!(todos[0].status, TodoStatus::InProgress);
        assert!(find_tool_call(&messages, "call_2").is_none());
    }

    #[test]
    fn recovery_reads_the_transcript() {
        let q = json!({"role": "user", "content": "hi"});
        let a = json!({"role": "assistant", "content": "hello", "finish_reason": "stop"});
        let cut = json!({"role": "assistant", "content": "hel", "finish_reason": null});
        assert_eq!(
            recovery_from(&[q.clone(), a], "hi"),
            Recovery::Answered("hello".into())
        );
        assert_eq!(
            recovery_from(&[q.clone(), cut], "hi"),
            Recovery::Partial("hel".into())
        );
        assert_eq!(
            recovery_from(std::slice::from_ref(&q), "hi"),
            Recovery::Unknown
        );
        assert_eq!(recovery_from(&[q], "other"), Recovery::Unknown);
    }
}
