//! The envelope header of an app→server frame (`v`, `type`, `id`, `chat_id`, `thread_id`): read
//! without allocating when it can be, by the full parser (reading only those fields) when not.

use std::borrow::Cow;

use serde::Deserialize;

use super::DecodeError;
use crate::protocol::{is_valid_id, ErrorCode};

/// The envelope fields the hub routes on. Borrowed from the frame text on the fast path.
pub(super) struct Header<'a> {
    pub(super) v: Option<i64>,
    pub(super) kind: Option<Cow<'a, str>>,
    pub(super) id: Option<i64>,
    pub(super) chat_id: Option<Cow<'a, str>>,
    pub(super) thread_id: Option<Cow<'a, str>>,
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

/// The fast path borrows the header's strings as they stand in the text (serde-json-core, no
/// allocation). A string with a JSON escape in it, or anything the fast path cannot read, goes
/// to the full parser, which also produces the precise error message.
pub(super) fn read_header(text: &str) -> Result<Header<'_>, DecodeError> {
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

pub(super) fn scope_id(
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
