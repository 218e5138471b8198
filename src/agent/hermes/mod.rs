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
//!
//! Here: the agent and its one-shot calls (probe, models, steering, approvals, stop, a run's
//! state). Following a run's events and status is `run.rs`; what is read from the session's
//! transcript (history, tool records, reasoning, a restart's recovery) is `transcript.rs`.

mod jobs;
mod run;
#[cfg(test)]
mod tests;
mod transcript;
mod wire;

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::http::{off_loop, Endpoint};
use super::media_in::{self, MediaLimits};
use super::media_out::{FilePolicy, OutFilter};
use super::openai::model_ids;
use super::{
    Agent, AgentError, AgentEvent, JobAction, JobInfo, JobRun, LocalBoxFuture, ModelOption,
    Recovery, Steered, TurnInput, TurnSummary,
};
use crate::config::{AgentConfig, Secret};
use crate::protocol::Runtime;
use run::{run_state_of, run_turn_blocking, runs_input, Start};
use transcript::recovery_from;
use wire::{
    record, ApprovalAnswer, Capabilities, ErrorAnswer, Features, Health, ModelOptions,
    RunsIdempotency, SteerAnswer, Transcript,
};

pub struct HermesAgent {
    endpoint: Endpoint,
    /// Model to ask for; empty leaves Hermes' configured default.
    model: String,
    /// Where files named in an answer (`MEDIA:` lines) may be read from (`media_out/policy.rs`).
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
    async fn read_capabilities(&self) -> Option<RunsIdempotency> {
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
    fn features(&self) -> Features {
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
}

/// Taken off Hermes' key retention when deciding whether a restart may repeat a start.
const START_REPEAT_MARGIN_SECS: u64 = 3600;

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
                Ok(Ok((200, v))) if record::<SteerAnswer>(&v).accepted != Some(false) => {
                    Steered::Accepted
                }
                // `run_not_accepting_steer`: the run is no longer running (it is ending).
                Ok(Ok((409, _))) => Steered::NotTaken("the answer was already ending".into()),
                Ok(Ok((404, _))) => {
                    Steered::NotTaken("the agent no longer has that answer's run".into())
                }
                Ok(Ok((status, v))) => Steered::NotTaken(format!(
                    "the agent answered HTTP {status}{}",
                    ErrorAnswer::message_of(&v)
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
                    Ok((_, v)) => recovery_from(&record::<Transcript>(&v).messages(), &user_text),
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
        let message_id = turn.user_message_id.clone();
        let limits = self.media_limits;
        Box::pin(async move {
            let start = match resume {
                Some(run_id) => Start::Resume { run_id },
                // The key goes on the first start too, whether or not a probe has read the
                // capabilities yet: a restart's repeat only finds a run that was started with it.
                None => Start::New {
                    body,
                    key: self
                        .read_capabilities()
                        .await
                        .map(|_| idempotency_key(&message_id)),
                },
            };
            let mut summary = off_loop("agent-turn", move |stop| {
                let start = match start {
                    Start::New { mut body, key } => {
                        body["input"] = runs_input(&media_in::prepare(
                            &turn.text,
                            &turn.media,
                            &turn.heard,
                            &limits,
                        ));
                        Start::New { body, key }
                    }
                    resume => resume,
                };
                run_turn_blocking(&worker, start, &stop)
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
                200..=299 => Ok(record::<ApprovalAnswer>(&v).resolved.unwrap_or(1) > 0),
                404 | 409 => Ok(false),
                _ => Err(AgentError::Failed(format!(
                    "HTTP {status}: {}",
                    ErrorAnswer::message_of(&v).unwrap_or_default()
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

    fn has_jobs(&self) -> bool {
        true
    }

    fn jobs(&self) -> LocalBoxFuture<'_, Result<Vec<JobInfo>, AgentError>> {
        self.list_jobs()
    }

    fn job_runs<'a>(
        &'a self,
        job: &'a JobInfo,
        after: Option<&'a str>,
    ) -> LocalBoxFuture<'a, Result<Vec<JobRun>, AgentError>> {
        self.runs_of(job, after)
    }

    fn job_action<'a>(
        &'a self,
        job_id: &'a str,
        action: JobAction,
    ) -> LocalBoxFuture<'a, Result<(), AgentError>> {
        self.change_job(job_id, action)
    }

    fn approvals_note(&self) -> Option<&'static str> {
        // Hermes' API does not report `approvals.mode`; say where to look.
        Some("Hermes does not report its approval mode through its API: check `approvals.mode` in Hermes' config.yaml (`manual` makes every flagged command wait for your answer here; the default `smart` lets the model approve its own; `off` runs everything) and keep `approvals.timeout` long enough to reach your phone (e.g. 300).")
    }
}
