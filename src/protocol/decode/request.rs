//! Every app→server request and the decoding of its payload, once the header named its type.

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::hello::Hello;
use super::DecodeError;
use crate::protocol::ErrorCode;

/// Every app→server frame of v1.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Hello(Hello),
    Ping {
        ts: Option<i64>,
    },
    MessageSend(MessageSend),
    ChannelCreate(ChannelCreate),
    ChannelRename {
        name: String,
    },
    ChannelSetDefault,
    ChannelFavorite {
        on: bool,
    },
    ChannelIcon(ChannelIcon),
    ChannelSetAutomation {
        on: bool,
    },
    ChannelDelete,
    ChannelList,
    Sync {
        cursor: i64,
    },
    History(HistoryRequest),
    Search(SearchRequest),
    MessageDelete {
        message_ids: Vec<String>,
    },
    MediaUploadStart(UploadStart),
    MediaUploadEnd {
        media_ref: String,
        sha256: String,
    },
    MediaPull {
        media_id: String,
    },
    FcmRegister {
        fcm_token: Option<String>,
        ntfy_topic: Option<String>,
    },
    CommandsCatalog,
    PickerSelect {
        picker_id: String,
        value: String,
    },
    /// Stop the agent's running turn in the frame's lane (the same as `/stop`). Listed in
    /// the schema's planned frames; accepted since approvals made stopping a waiting run
    /// something an app wants a button for.
    AgentStop,
    /// The lane (the frame's) is read up to this message, for the household (the
    /// `read.receipt` extension; the schema lists it as a planned app→server frame).
    ReadReceipt {
        message_id: String,
    },
    /// Guidance for the running answer in the frame's lane (the `agent.steer` extension; the
    /// schema lists it as a planned app→server frame). The same as `/steer TEXT`.
    AgentSteer {
        text: String,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct UploadStart {
    pub media_ref: String,
    pub kind: String,
    #[serde(default)]
    pub mime: String,
    pub size: i64,
    #[serde(default)]
    pub filename: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SearchRequest {
    pub query: String,
    #[serde(default)]
    pub scope: Option<SearchScope>,
    #[serde(default)]
    pub chat_id: Option<String>,
    #[serde(default)]
    pub thread_id: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchScope {
    All,
    Chat,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MessageSend {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub reply_to: Option<String>,
    #[serde(default)]
    pub media_refs: Vec<String>,
    #[serde(default)]
    pub auto_thread: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChannelCreate {
    pub name: String,
    #[serde(default)]
    pub kind: Option<CreateKind>,
    #[serde(default)]
    pub parent_chat_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreateKind {
    Channel,
    Thread,
}

/// Omitting a field and sending `null` both clear it, as the schema says.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChannelIcon {
    #[serde(default)]
    pub icon: Option<String>,
    #[serde(default)]
    pub color: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HistoryRequest {
    #[serde(default)]
    pub before_message_id: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
}

/// The typed request of a frame whose header named `kind`, by family: frames without payload
/// fields, the channel directory, media transfers, and the rest.
pub(super) fn decode_payload(
    id: Option<i64>,
    kind: &str,
    text: &str,
) -> Result<Request, DecodeError> {
    if let Some(request) = bare_request(kind) {
        // Frames without payload fields are still read through serde_json once: the header
        // decoder (serde-json-core) skips unknown fields leniently, so raw control characters
        // or junk values in them would otherwise be accepted (found by fuzz/decode_frame).
        well_formed(id, kind, text)?;
        return Ok(request);
    }
    if kind.starts_with("channel.") {
        return channel_request(id, kind, text);
    }
    if kind.starts_with("media.") {
        return media_request(id, kind, text);
    }
    Ok(match kind {
        "hello" => Request::Hello(payload(id, kind, text)?),
        "ping" => {
            #[derive(Deserialize)]
            struct Ping {
                ts: Option<i64>,
            }
            Request::Ping {
                ts: payload::<Ping>(id, kind, text)?.ts,
            }
        }
        "message.send" => Request::MessageSend(payload(id, kind, text)?),
        "sync" => {
            #[derive(Deserialize)]
            struct Sync {
                #[serde(default)]
                cursor: i64,
            }
            Request::Sync {
                cursor: payload::<Sync>(id, kind, text)?.cursor,
            }
        }
        "history" => Request::History(payload(id, kind, text)?),
        "search" => Request::Search(payload(id, kind, text)?),
        "message.delete" => {
            #[derive(Deserialize)]
            struct Delete {
                message_ids: Vec<String>,
            }
            Request::MessageDelete {
                message_ids: payload::<Delete>(id, kind, text)?.message_ids,
            }
        }
        "read.receipt" => {
            #[derive(Deserialize)]
            struct Receipt {
                message_id: String,
            }
            Request::ReadReceipt {
                message_id: payload::<Receipt>(id, kind, text)?.message_id,
            }
        }
        "agent.steer" => {
            #[derive(Deserialize)]
            struct Steer {
                text: String,
            }
            Request::AgentSteer {
                text: payload::<Steer>(id, kind, text)?.text,
            }
        }
        "fcm.register" => {
            #[derive(Deserialize)]
            struct Register {
                #[serde(default)]
                fcm_token: Option<String>,
                #[serde(default)]
                ntfy_topic: Option<String>,
            }
            let r: Register = payload(id, kind, text)?;
            Request::FcmRegister {
                fcm_token: r.fcm_token,
                ntfy_topic: r.ntfy_topic,
            }
        }
        "picker.select" => {
            #[derive(Deserialize)]
            struct Select {
                picker_id: String,
                value: String,
            }
            let s: Select = payload(id, kind, text)?;
            Request::PickerSelect {
                picker_id: s.picker_id,
                value: s.value,
            }
        }
        other => return Err(unknown_type(id, other)),
    })
}

/// The requests that carry no payload fields: the type alone is the request.
fn bare_request(kind: &str) -> Option<Request> {
    Some(match kind {
        "channel.set_default" => Request::ChannelSetDefault,
        "channel.delete" => Request::ChannelDelete,
        "channel.list" => Request::ChannelList,
        "commands.catalog" => Request::CommandsCatalog,
        "agent.stop" => Request::AgentStop,
        _ => return None,
    })
}

/// `channel.*` requests that carry payload fields (the bare ones are `bare_request`'s).
fn channel_request(id: Option<i64>, kind: &str, text: &str) -> Result<Request, DecodeError> {
    Ok(match kind {
        "channel.create" => Request::ChannelCreate(payload(id, kind, text)?),
        "channel.rename" => {
            #[derive(Deserialize)]
            struct Rename {
                name: String,
            }
            Request::ChannelRename {
                name: payload::<Rename>(id, kind, text)?.name,
            }
        }
        "channel.favorite" => Request::ChannelFavorite {
            on: payload::<Toggle>(id, kind, text)?.on,
        },
        "channel.icon" => Request::ChannelIcon(payload(id, kind, text)?),
        "channel.set_automation" => Request::ChannelSetAutomation {
            on: payload::<Toggle>(id, kind, text)?.on,
        },
        other => return Err(unknown_type(id, other)),
    })
}

/// `media.*` requests: uploads and pulls.
fn media_request(id: Option<i64>, kind: &str, text: &str) -> Result<Request, DecodeError> {
    Ok(match kind {
        "media.upload.start" => Request::MediaUploadStart(payload(id, kind, text)?),
        "media.upload.end" => {
            #[derive(Deserialize)]
            struct End {
                media_ref: String,
                sha256: String,
            }
            let e: End = payload(id, kind, text)?;
            Request::MediaUploadEnd {
                media_ref: e.media_ref,
                sha256: e.sha256,
            }
        }
        "media.pull" => {
            #[derive(Deserialize)]
            struct Pull {
                media_id: String,
            }
            Request::MediaPull {
                media_id: payload::<Pull>(id, kind, text)?.media_id,
            }
        }
        other => return Err(unknown_type(id, other)),
    })
}

/// The refusal of a type this gateway does not know, quoting (the start of) the type.
fn unknown_type(id: Option<i64>, kind: &str) -> DecodeError {
    let shown: String = kind.chars().take(40).collect();
    DecodeError::new(
        id,
        ErrorCode::Unsupported,
        format!("unknown frame type `{shown}`"),
    )
}

/// Checks the whole frame is well-formed JSON, allocating nothing (every value is skipped).
fn well_formed(id: Option<i64>, kind: &str, text: &str) -> Result<(), DecodeError> {
    payload::<serde::de::IgnoredAny>(id, kind, text).map(drop)
}

#[derive(Deserialize)]
struct Toggle {
    on: bool,
}

/// Decodes `payload` of a known frame type; a missing payload reads as `{}` so frames whose
/// fields are all optional may omit it.
fn payload<T: DeserializeOwned>(id: Option<i64>, kind: &str, text: &str) -> Result<T, DecodeError> {
    #[derive(Deserialize)]
    struct Outer<T> {
        payload: Option<T>,
    }
    let refuse = |e: serde_path_to_error::Error<serde_json::Error>| {
        let path = e.path().to_string();
        let field = path.strip_prefix("payload.").unwrap_or(&path).to_owned();
        let why = strip_position(e.inner());
        let message = if field.is_empty() || field == "." || field == "payload" {
            format!("bad `{kind}` payload: {why}")
        } else {
            format!("bad `{kind}` payload field `{field}`: {why}")
        };
        DecodeError::new(id, ErrorCode::Unsupported, message)
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let outer: Outer<T> = serde_path_to_error::deserialize(&mut de).map_err(refuse)?;
    match outer.payload {
        Some(p) => Ok(p),
        None => {
            let mut empty = serde_json::Deserializer::from_str("{}");
            serde_path_to_error::deserialize(&mut empty).map_err(refuse)
        }
    }
}

/// serde_json appends "at line 1 column N", which means nothing to an app developer looking at
/// one frame; the field name and expected type are the useful part.
fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}
