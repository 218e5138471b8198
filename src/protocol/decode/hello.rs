//! The `hello` payload: the token and device, and the caps, which never fail a hello.

use serde::Deserialize;

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
    /// The push service the app uses (`fcm`, `ntfy`), shown to the owner; anything but a
    /// short string is ignored rather than refused.
    #[serde(default, deserialize_with = "short_name")]
    pub push: Option<String>,
}

/// A push service's name as the app says it, when it is a string of at most
/// [`MAX_EXTENSION_NAME_BYTES`]; else none (caps are advisory).
fn short_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(v.as_str()
        .filter(|s| s.len() <= MAX_EXTENSION_NAME_BYTES)
        .map(str::to_owned))
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
