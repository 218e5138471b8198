//! App→server frame decoding.
//!
//! Two steps, on purpose. The envelope header (`v`, `type`, `id`, `chat_id`, `thread_id`) is
//! read with serde-json-core into borrowed, fixed-size fields: no heap allocation, so junk, wrong
//! versions and unknown types are refused before the gateway spends memory on them. Only a frame
//! that names a known type gets its payload decoded, with serde_json, into an owned typed request
//! (payloads hold arbitrary objects and long escaped text that a no-alloc decoder cannot own).

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{is_valid_id, ErrorCode, PROTOCOL_VERSION};

/// Deepest JSON nesting accepted. serde-json-core recurses without a limit, so a frame of a
/// million `[` would overflow the stack; no v1 frame nests deeper than a handful of levels.
const MAX_NESTING: usize = 32;

/// Why a frame was refused, with the request id to echo when the header was readable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    pub id: Option<i64>,
    pub code: ErrorCode,
    pub message: String,
}

impl DecodeError {
    fn new(id: Option<i64>, code: ErrorCode, message: impl Into<String>) -> Self {
        DecodeError {
            id,
            code,
            message: message.into(),
        }
    }
}

/// A decoded app→server frame: the envelope fields the hub routes on plus the typed payload.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFrame {
    pub id: Option<i64>,
    pub chat_id: Option<String>,
    pub thread_id: Option<String>,
    pub request: Request,
}

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
pub struct Hello {
    pub token: String,
    #[serde(default)]
    pub device_id: Option<String>,
    #[serde(default)]
    pub device_name: Option<String>,
    #[serde(default)]
    pub fcm_token: Option<String>,
    #[serde(default)]
    pub ntfy_topic: Option<String>,
    #[serde(default, deserialize_with = "lenient_caps")]
    pub caps: HelloCaps,
}

/// Caps that are not an object (v1 never read them) still make a good hello.
fn lenient_caps<'de, D: serde::Deserializer<'de>>(d: D) -> Result<HelloCaps, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(HelloCaps::deserialize(v).unwrap_or_default())
}

/// What the app says it can do. Only `extensions` changes what the gateway sends; the other
/// v1 caps are informational and left unread.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct HelloCaps {
    /// Extension names the app turns on; names this gateway does not know are ignored, and
    /// the list is cut at [`MAX_HELLO_EXTENSIONS`] names.
    #[serde(default, deserialize_with = "extension_names")]
    pub extensions: Vec<String>,
}

/// Extension names a hello may list that are looked at; the rest are ignored (this build
/// knows one, so a long list is either a future app or garbage).
pub const MAX_HELLO_EXTENSIONS: usize = 32;

/// An extension name longer than this is not one the gateway knows; it is ignored.
const MAX_EXTENSION_NAME_BYTES: usize = 64;

/// A list of names, kept to what is worth comparing: a non-list or a non-string entry is
/// ignored rather than refused, since caps are advisory and a hello must still succeed.
fn extension_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(v.as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|x| x.as_str())
                .filter(|n| n.len() <= MAX_EXTENSION_NAME_BYTES)
                .take(MAX_HELLO_EXTENSIONS)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default())
}

impl Hello {
    /// Whether the app listed extension `name` in `caps.extensions`.
    pub fn wants(&self, name: &str) -> bool {
        self.caps.extensions.iter().any(|e| e == name)
    }
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

/// The envelope fields the hub routes on. Borrowed from the frame text on the fast path.
struct Header<'a> {
    v: Option<i64>,
    kind: Option<Cow<'a, str>>,
    id: Option<i64>,
    chat_id: Option<Cow<'a, str>>,
    thread_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawHeader<'a> {
    v: Option<i64>,
    #[serde(rename = "type", borrow)]
    kind: Option<&'a str>,
    id: Option<i64>,
    #[serde(borrow)]
    chat_id: Option<&'a str>,
    #[serde(borrow)]
    thread_id: Option<&'a str>,
}

/// Decodes one text frame. Every refusal carries a message that names the offending field.
pub fn decode_request(text: &str) -> Result<RequestFrame, DecodeError> {
    check_nesting(text.as_bytes())?;
    let header = read_header(text)?;
    let id = header.id;
    match header.v {
        Some(PROTOCOL_VERSION) => {}
        Some(other) => {
            return Err(DecodeError::new(
                id,
                ErrorCode::Unsupported,
                format!("protocol version {other} is not supported; this gateway speaks v1"),
            ))
        }
        None => {
            return Err(DecodeError::new(
                id,
                ErrorCode::Unsupported,
                "missing envelope field `v` (must be 1)",
            ))
        }
    }
    let kind = header.kind.ok_or_else(|| {
        DecodeError::new(id, ErrorCode::Unsupported, "missing envelope field `type`")
    })?;
    let chat_id = scope_id(id, "chat_id", header.chat_id)?;
    let thread_id = scope_id(id, "thread_id", header.thread_id)?;
    let request = decode_payload(id, &kind, text)?;
    Ok(RequestFrame {
        id,
        chat_id,
        thread_id,
        request,
    })
}

/// The fast path borrows the header's strings as they stand in the text (serde-json-core, no
/// allocation). A string with a JSON escape in it, or anything the fast path cannot read, goes
/// to the full parser, which also produces the precise error message.
fn read_header(text: &str) -> Result<Header<'_>, DecodeError> {
    if let Ok((raw, used)) = serde_json_core::from_str::<RawHeader<'_>>(text) {
        let escaped = [raw.kind, raw.chat_id, raw.thread_id]
            .iter()
            .flatten()
            .any(|s| s.contains('\\'));
        if text[used..].trim().is_empty() && !escaped {
            return Ok(Header {
                v: raw.v,
                kind: raw.kind.map(Cow::Borrowed),
                id: raw.id,
                chat_id: raw.chat_id.map(Cow::Borrowed),
                thread_id: raw.thread_id.map(Cow::Borrowed),
            });
        }
    }
    header_from_value(text)
}

/// The full parser's header. It reads only the five envelope fields and skips everything else
/// unbuilt (`IgnoredAny`), like the fast path: parsing the whole frame into a `serde_json::Value`
/// here cost up to ~50 bytes of memory per byte of frame (a 1 MiB frame of `0,0,0,…` with an
/// escape in its `type`, before any hello: found by fuzz/decode_frame's allocation bound).
fn header_from_value(text: &str) -> Result<Header<'static>, DecodeError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let env = Envelope::deserialize(&mut de)
        .and_then(|env| de.end().map(|()| env))
        .map_err(|e| {
            let message = if e.classify() == serde_json::error::Category::Data {
                "a frame must be a JSON object".to_owned()
            } else {
                format!("malformed JSON: {e}")
            };
            DecodeError::new(None, ErrorCode::Unsupported, message)
        })?;
    let mistyped = |id, field: &str, want: &str| {
        DecodeError::new(
            id,
            ErrorCode::Unsupported,
            format!("envelope field `{field}` must be {want}"),
        )
    };
    let id = match env.id {
        None | Some(Field::Null) => None,
        Some(Field::Int(i)) => Some(i),
        Some(_) => return Err(mistyped(None, "id", "an integer")),
    };
    let v = match env.v {
        None => None,
        Some(Field::Int(v)) => Some(v),
        Some(_) => return Err(mistyped(id, "v", "an integer")),
    };
    let string = |field: &str, value: Option<Field>| match value {
        None | Some(Field::Null) => Ok(None),
        Some(Field::Str(s)) => Ok(Some(Cow::Owned(s))),
        Some(_) => Err(mistyped(id, field, "a string")),
    };
    Ok(Header {
        v,
        kind: string("type", env.kind)?,
        id,
        chat_id: string("chat_id", env.chat_id)?,
        thread_id: string("thread_id", env.thread_id)?,
    })
}

/// The envelope fields of a frame object (absent: `None`; a repeated key: the last wins).
#[derive(Default)]
struct Envelope {
    v: Option<Field>,
    kind: Option<Field>,
    id: Option<Field>,
    chat_id: Option<Field>,
    thread_id: Option<Field>,
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Envelope;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a frame object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Envelope, A::Error> {
                let mut env = Envelope::default();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let slot = match key.as_ref() {
                        "v" => &mut env.v,
                        "type" => &mut env.kind,
                        "id" => &mut env.id,
                        "chat_id" => &mut env.chat_id,
                        "thread_id" => &mut env.thread_id,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value()?);
                }
                Ok(env)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// One envelope field's value: what the header needs to know of it, nothing more (an array or
/// object given for a field is skipped, not built).
enum Field {
    Null,
    Int(i64),
    Str(String),
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> serde::de::Visitor<'de> for Any {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E>(self) -> Result<Field, E> {
                Ok(Field::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Field, E> {
                Ok(Field::Other)
            }
            fn visit_i64<E>(self, v: i64) -> Result<Field, E> {
                Ok(Field::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Field, E> {
                Ok(i64::try_from(v).map_or(Field::Other, Field::Int))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Field, E> {
                Ok(Field::Other)
            }
            fn visit_str<E>(self, v: &str) -> Result<Field, E> {
                Ok(Field::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Field, E> {
                Ok(Field::Str(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Field, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Field::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Field, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Field::Other)
            }
        }
        d.deserialize_any(Any)
    }
}

fn scope_id(
    id: Option<i64>,
    field: &str,
    value: Option<Cow<'_, str>>,
) -> Result<Option<String>, DecodeError> {
    match value {
        None => Ok(None),
        Some(v) if is_valid_id(&v) => Ok(Some(v.into_owned())),
        Some(_) => Err(DecodeError::new(
            id,
            ErrorCode::Unsupported,
            format!("envelope field `{field}` must be 1-64 characters of [A-Za-z0-9_.:-]"),
        )),
    }
}

/// The typed request of a frame whose header named `kind`, by family: frames without payload
/// fields, the channel directory, media transfers, and the rest.
fn decode_payload(id: Option<i64>, kind: &str, text: &str) -> Result<Request, DecodeError> {
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

fn check_nesting(bytes: &[u8]) -> Result<(), DecodeError> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(DecodeError::new(
                        None,
                        ErrorCode::Unsupported,
                        format!("frame nests deeper than {MAX_NESTING} levels"),
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> DecodeError {
        decode_request(text).expect_err("must be refused")
    }

    #[test]
    fn decodes_a_hello_with_envelope_fields() {
        let f = decode_request(
            r#"{"v":1,"type":"hello","id":7,"payload":{"token":"t\"x","device_id":"d1","caps":{"media":true}}}"#,
        )
        .unwrap();
        assert_eq!(f.id, Some(7));
        let Request::Hello(h) = f.request else {
            panic!()
        };
        assert_eq!(h.token, "t\"x");
        assert_eq!(h.device_id.as_deref(), Some("d1"));
        assert!(!h.wants("update_append"));
    }

    #[test]
    fn hello_extensions_are_read_and_junk_is_ignored() {
        let hello = |caps: &str| {
            let text =
                format!(r#"{{"v":1,"type":"hello","payload":{{"token":"t","caps":{caps}}}}}"#);
            match decode_request(&text).unwrap().request {
                Request::Hello(h) => h,
                _ => panic!(),
            }
        };
        assert!(hello(r#"{"extensions":["x","update_append"]}"#).wants("update_append"));
        assert!(!hello(r#"{"extensions":"update_append"}"#).wants("update_append"));
        assert!(hello(r#"{"extensions":[1,null,"update_append"]}"#).wants("update_append"));
        assert!(!hello(r#"{"media":true}"#).wants("update_append"));
        assert!(!hello("null").wants("update_append"));
        assert!(!hello("[1]").wants("update_append"));
    }

    #[test]
    fn scopes_and_payload_of_message_send() {
        let f = decode_request(
            r#"{"v":1,"type":"message.send","id":3,"chat_id":"chan_1","thread_id":"thr_2","payload":{"text":"hi","auto_thread":true}}"#,
        )
        .unwrap();
        assert_eq!(f.chat_id.as_deref(), Some("chan_1"));
        assert_eq!(f.thread_id.as_deref(), Some("thr_2"));
        assert!(matches!(
            f.request,
            Request::MessageSend(MessageSend {
                auto_thread: true,
                ..
            })
        ));
    }

    #[test]
    fn escaped_envelope_strings_are_unescaped() {
        let f = decode_request(r#"{"v":1,"type":"p\u0069ng","id":2,"chat_id":"defa\u0075lt"}"#)
            .unwrap();
        assert_eq!(f.request, Request::Ping { ts: None });
        assert_eq!(f.chat_id.as_deref(), Some("default"));
    }

    #[test]
    fn the_full_parser_reads_only_the_envelope() {
        // An escape sends the header to the full parser; fields it does not need are skipped.
        let big = format!(
            r#"{{"v":1,"type":"p\u0069ng","id":5,"x":[{}],"y":{{"a":[{{}}]}},"ts":true}}"#,
            vec!["0"; 1000].join(",")
        );
        let f = decode_request(&big).unwrap();
        assert_eq!((f.id, f.request), (Some(5), Request::Ping { ts: None }));
        // A repeated key: the last one counts, as before.
        let f = decode_request(r#"{"v":1,"type":"p\u0069ng","id":1,"id":2}"#).unwrap();
        assert_eq!(f.id, Some(2));
        let e = err(r#"{"v":1,"type":"p\u0069ng","id":[1]}"#);
        assert!(e.message.contains("`id`"), "{}", e.message);
        let e = err(r#"{"v":null,"type":"p\u0069ng","id":3}"#);
        assert_eq!(e.id, Some(3));
        assert!(e.message.contains("`v`"), "{}", e.message);
        let e = err(r#"{"v":1,"type":"p\u0069ng","chat_id":7}"#);
        assert!(e.message.contains("`chat_id`"), "{}", e.message);
        assert!(err(r#""p\u0069ng""#).message.contains("object"));
        assert!(err(r#"{"v":1,"type":"p\u0069ng"} x"#)
            .message
            .contains("malformed JSON"));
    }

    #[test]
    fn refuses_wrong_version_with_the_id_echoed() {
        let e = err(r#"{"v":2,"type":"ping","id":9}"#);
        assert_eq!((e.id, e.code), (Some(9), ErrorCode::Unsupported));
        assert!(e.message.contains("version 2"));
    }

    #[test]
    fn names_the_mistyped_field() {
        let e = err(r#"{"v":1,"type":"ping","id":"nine"}"#);
        assert!(e.message.contains("`id`"), "{}", e.message);
        let e = err(r#"{"v":1,"type":"channel.favorite","id":4,"payload":{"on":"yes"}}"#);
        assert_eq!(e.id, Some(4));
        assert!(
            e.message.contains("channel.favorite") && e.message.contains("`on`"),
            "{}",
            e.message
        );
        let e = err(r#"{"v":1,"type":"hello","id":5,"payload":{}}"#);
        assert!(e.message.contains("token"), "{}", e.message);
    }

    #[test]
    fn refuses_junk_unknown_types_and_bad_ids() {
        assert!(err("not json").message.contains("malformed JSON"));
        assert!(err("[1,2]").message.contains("object"));
        assert!(err(r#"{"v":1,"type":"teleport","id":1}"#)
            .message
            .contains("unknown frame type"));
        assert!(err(r#"{"v":1,"type":"ping","chat_id":"a b"}"#)
            .message
            .contains("chat_id"));
    }

    #[test]
    fn junk_in_frames_without_payload_is_refused() {
        // Inputs fuzz/decode_frame found accepted: a raw control character, a bare word.
        let e = err("{\"v\":1,\"type\":\"channel.list\",\"x\u{13}\":1}");
        assert_eq!(e.code, ErrorCode::Unsupported);
        err(r#"{"v":1,"type":"channel.delete","id":7,"x":[#msg]}"#);
        assert_eq!(
            decode_request(r#"{"v":1,"type":"channel.list","id":3,"x":{"y":[1,"\n"]}}"#)
                .map(|f| f.request),
            Ok(Request::ChannelList)
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let deep = format!(
            r#"{{"v":1,"type":"ping","payload":{{"x":{}}}}}"#,
            "[".repeat(100_000)
        );
        assert!(err(&deep).message.contains("nests deeper"));
    }

    #[test]
    fn agent_stop_is_accepted() {
        let f =
            decode_request(r#"{"v":1,"type":"agent.stop","id":3,"chat_id":"default"}"#).unwrap();
        assert_eq!(f.request, Request::AgentStop);
        assert_eq!(f.chat_id.as_deref(), Some("default"));
    }

    #[test]
    fn planned_features_decode_as_unimplemented() {
        let f = decode_request(
            r#"{"v":1,"type":"picker.select","id":1,"payload":{"picker_id":"x","value":"y"}}"#,
        )
        .unwrap();
        assert_eq!(
            f.request,
            Request::PickerSelect {
                picker_id: "x".into(),
                value: "y".into()
            }
        );
    }

    #[test]
    fn agent_steer_carries_its_text() {
        let f = decode_request(
            r#"{"v":1,"type":"agent.steer","id":4,"chat_id":"default","payload":{"text":"shorter"}}"#,
        )
        .unwrap();
        assert_eq!(
            f.request,
            Request::AgentSteer {
                text: "shorter".into()
            }
        );
        let e = decode_request(r#"{"v":1,"type":"agent.steer","id":5,"payload":{}}"#).unwrap_err();
        assert_eq!(e.id, Some(5));
    }

    #[test]
    fn read_receipt_from_the_app_names_a_message() {
        let f = decode_request(
            r#"{"v":1,"type":"read.receipt","chat_id":"default","payload":{"message_id":"msg_1"}}"#,
        )
        .unwrap();
        assert_eq!(
            f.request,
            Request::ReadReceipt {
                message_id: "msg_1".into()
            }
        );
        let e = decode_request(r#"{"v":1,"type":"read.receipt","id":2,"payload":{}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported);
    }
}
