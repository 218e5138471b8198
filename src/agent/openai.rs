//! Any OpenAI-compatible `/v1/chat/completions` server (llama.cpp, Ollama, vLLM, …).
//!
//! Such a server keeps no conversation, so the gateway sends the lane's recent history with
//! every message (`TurnInput::history`, read from the store: deleted messages are gone from it,
//! and `/new` starts it afresh). Streamed `reasoning_content` (or `reasoning`) becomes the
//! message's reasoning.

use std::cell::RefCell;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{off_loop, Endpoint};
use super::media_in::{self, AgentInput, MediaLimits};
use super::media_out::{FilePolicy, OutFilter};
use super::{Agent, AgentError, AgentEvent, LocalBoxFuture, ModelOption, TurnInput, TurnSummary};
use crate::config::{AgentConfig, Secret};
use crate::protocol::Role;

pub struct OpenAiAgent {
    endpoint: Endpoint,
    /// The configured model; empty means "the server's first model".
    model: String,
    system_prompt: String,
    /// The server's first model, asked once when no model is configured.
    default_model: RefCell<Option<String>>,
    /// Where files named in an answer may be read from (`media_out/policy.rs`).
    files: std::sync::Arc<FilePolicy>,
    media_limits: MediaLimits,
}

impl OpenAiAgent {
    pub fn new(config: &AgentConfig, key: Secret, media_limits: MediaLimits) -> OpenAiAgent {
        OpenAiAgent {
            endpoint: Endpoint::new(config, key),
            model: config.model.trim().to_owned(),
            system_prompt: config.system_prompt.clone(),
            default_model: RefCell::new(None),
            files: std::sync::Arc::default(),
            media_limits,
        }
    }

    /// Takes files from answers under `files` (without it, none are read).
    pub fn with_files(mut self, files: std::sync::Arc<FilePolicy>) -> OpenAiAgent {
        self.files = files;
        self
    }

    async fn list_models(&self) -> Result<Vec<String>, AgentError> {
        let ep = self.endpoint.clone();
        let answer = off_loop("agent-models", move |_| ep.get_json("/models")).await??;
        Ok(model_ids(&answer))
    }

    /// The model to ask for: the user's `/model` choice, the configured one, or the server's
    /// first.
    async fn model_for(&self, turn: &TurnInput) -> Result<String, AgentError> {
        if let Some(m) = turn.settings.model.as_ref().filter(|m| !m.is_empty()) {
            return Ok(m.clone());
        }
        if !self.model.is_empty() {
            return Ok(self.model.clone());
        }
        if let Some(m) = self.default_model.borrow().clone() {
            return Ok(m);
        }
        let first = self
            .list_models()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| {
                AgentError::Failed("the server lists no models; set agent.model".into())
            })?;
        *self.default_model.borrow_mut() = Some(first.clone());
        Ok(first)
    }
}

/// `{"data":[{"id":…},…]}` → the ids.
pub(super) fn model_ids(answer: &Value) -> Vec<String> {
    answer
        .get("data")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The request body for one turn. Reads and converts the message's files: call it on the
/// turn's worker thread.
fn request_body(system_prompt: &str, model: &str, turn: &TurnInput, limits: &MediaLimits) -> Value {
    let mut messages = Vec::with_capacity(turn.history.len() + 2);
    if !system_prompt.trim().is_empty() {
        messages.push(json!({ "role": "system", "content": system_prompt }));
    }
    for past in &turn.history {
        let role = match past.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System | Role::Cron => continue,
        };
        messages.push(json!({ "role": role, "content": past.text }));
    }
    let input = media_in::prepare(&turn.text, &turn.media, &turn.heard, limits);
    messages.push(json!({ "role": "user", "content": user_content(&input) }));
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    // Only when the user chose them: strict servers refuse fields they do not know.
    if let Some(effort) = &turn.settings.reasoning {
        body["reasoning_effort"] = json!(effort);
    }
    if turn.settings.fast {
        body["service_tier"] = json!("priority");
    }
    body
}

/// The new message's `content`: its text alone, or (with images) OpenAI's content parts, the
/// text first and each image as a `data:` URL (docs/agents.md, "Images and documents").
pub(super) fn user_content(input: &AgentInput) -> Value {
    if input.images.is_empty() {
        return Value::String(input.text.clone());
    }
    let mut parts = Vec::with_capacity(input.images.len() + 1);
    if !input.text.is_empty() {
        parts.push(json!({ "type": "text", "text": input.text }));
    }
    for img in &input.images {
        parts.push(json!({ "type": "image_url", "image_url": { "url": img.data_url() } }));
    }
    Value::Array(parts)
}

/// What one streamed chunk says.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Chunk {
    pub text: Option<String>,
    pub reasoning: Option<String>,
    pub finish_reason: Option<String>,
    pub total_tokens: Option<i64>,
    pub model: Option<String>,
    pub error: Option<String>,
}

/// Reads one `chat.completion.chunk` (OpenAI's streaming format).
pub(super) fn read_chunk(data: &str) -> Option<Chunk> {
    let v: Value = serde_json::from_str(data).ok()?;
    let choice = v.pointer("/choices/0");
    let delta = choice.and_then(|c| c.get("delta"));
    let text_of = |key: &str| {
        delta
            .and_then(|d| d.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Some(Chunk {
        text: text_of("content"),
        reasoning: text_of("reasoning_content").or_else(|| text_of("reasoning")),
        finish_reason: choice
            .and_then(|c| c.get("finish_reason"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        total_tokens: v.pointer("/usage/total_tokens").and_then(Value::as_i64),
        model: v.get("model").and_then(Value::as_str).map(str::to_owned),
        error: v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

impl Agent for OpenAiAgent {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn describe(&self) -> String {
        format!("OpenAI-compatible server at {}", self.endpoint.base())
    }

    fn wants_history(&self) -> bool {
        true
    }

    fn probe(&self) -> LocalBoxFuture<'_, Result<(), AgentError>> {
        Box::pin(async move { self.list_models().await.map(|_| ()) })
    }

    fn models(&self) -> LocalBoxFuture<'_, Result<Vec<ModelOption>, AgentError>> {
        Box::pin(async move {
            let ids = self.list_models().await?;
            Ok(ids.into_iter().map(ModelOption::bare).collect())
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
        Box::pin(async move {
            let model = self.model_for(&turn).await?;
            let (system_prompt, limits) = (self.system_prompt.clone(), self.media_limits);
            let ep = self.endpoint.clone();
            let mut out = OutFilter::new(self.files.clone());
            off_loop("agent-turn", move |stop| {
                let body = request_body(&system_prompt, &model, &turn, &limits);
                let mut summary = TurnSummary {
                    model: Some(model),
                    ..TurnSummary::default()
                };
                let mut finished = false;
                let mut failure = None;
                let streamed = ep.post_sse("/chat/completions", &[], &body, &stop, |ev| {
                    if ev.data.trim() == "[DONE]" {
                        finished = true;
                        return false;
                    }
                    let Some(chunk) = read_chunk(&ev.data) else {
                        return true;
                    };
                    if let Some(m) = chunk.model {
                        summary.model = Some(m);
                    }
                    if let Some(t) = chunk.total_tokens {
                        summary.tokens = Some(t);
                    }
                    if let Some(e) = chunk.error {
                        failure = Some(e);
                    }
                    if chunk.finish_reason.is_some() {
                        finished = true;
                    }
                    // The text goes through the media filter: tags become files.
                    let text = chunk.text.map(|t| out.push(&t)).unwrap_or_default();
                    let sent = chunk
                        .reasoning
                        .map(AgentEvent::Reasoning)
                        .into_iter()
                        .chain(text)
                        .all(|e| events.blocking_send(e).is_ok());
                    sent && !stop.is_set()
                });
                // What the filter still held (a tag on the last line) is decided now, also
                // when the stream broke: the start of an answer is kept.
                for e in out.end() {
                    if events.blocking_send(e).is_err() {
                        break;
                    }
                }
                streamed?;
                if let Some(e) = failure {
                    return Err(AgentError::Failed(e));
                }
                if !finished && !stop.is_set() {
                    return Err(AgentError::Interrupted(
                        "the stream ended before the answer did".into(),
                    ));
                }
                Ok(summary)
            })
            .await?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentSettings, PastMessage};
    use crate::protocol::Lane;

    fn turn(history: Vec<PastMessage>, settings: AgentSettings) -> TurnInput {
        TurnInput {
            lane: Lane::new("default", None),
            user_message_id: "m1".into(),
            text: "and now?".into(),
            media: Vec::new(),
            heard: Vec::new(),
            session: "s".into(),
            history,
            settings,
            resume_run: None,
        }
    }

    #[test]
    fn history_goes_before_the_new_message_and_system_notes_stay_out() {
        let history = vec![
            PastMessage {
                role: Role::User,
                text: "hi".into(),
            },
            PastMessage {
                role: Role::System,
                text: "Reasoning set to high".into(),
            },
            PastMessage {
                role: Role::Assistant,
                text: "hello".into(),
            },
        ];
        let body = request_body(
            "be brief",
            "m",
            &turn(history, AgentSettings::default()),
            &MediaLimits::default(),
        );
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(body["messages"][3]["content"], "and now?");
        assert!(body.get("reasoning_effort").is_none() && body.get("service_tier").is_none());
    }

    #[test]
    fn user_choices_reach_the_request() {
        let settings = AgentSettings {
            reasoning: Some("high".into()),
            fast: true,
            model: None,
            provider: None,
        };
        let body = request_body(
            "",
            "m",
            &turn(Vec::new(), settings),
            &MediaLimits::default(),
        );
        assert_eq!(body["reasoning_effort"], "high");
        assert_eq!(body["service_tier"], "priority");
        assert_eq!(body["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn chunks_carry_text_reasoning_usage_and_errors() {
        let c = read_chunk(r#"{"model":"qwen","choices":[{"delta":{"reasoning_content":"hm"},"finish_reason":null}]}"#).unwrap();
        assert_eq!(c.reasoning.as_deref(), Some("hm"));
        assert_eq!(c.text, None);
        let c = read_chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":42}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.finish_reason.as_deref(), c.total_tokens),
            (Some("stop"), Some(42))
        );
        let c = read_chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"error"}],"error":{"message":"boom"}}"#,
        )
        .unwrap();
        assert_eq!(c.error.as_deref(), Some("boom"));
        assert!(read_chunk("not json").is_none());
    }
}
