//! Getting into a conversation: the credentials (given, saved or paired), the socket (plain, or
//! TLS pinned to the paired certificate), the hello and the channel.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;

use super::screen::printable;
use super::ChatError;
use crate::cli::args::ChatArgs;
use crate::cli::pair::pair;
use crate::config::default_data_dir;

/// Where the client keeps its own credentials inside a gateway's data dir.
fn credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("chat-client.json")
}

/// Where and how to connect: the URL, the token and, for `wss://`, the pinned fingerprint.
pub(super) struct Credentials {
    pub(super) url: String,
    pub(super) token: String,
    fingerprint: Option<String>,
}

/// From the saved file or a fresh pairing: TLS (pinned) whenever the gateway offers it.
fn from_saved(v: &Value) -> Option<Credentials> {
    let token = v["token"].as_str()?.to_owned();
    if let (Some(url), Some(fp)) = (v["tls_url"].as_str(), v["tls_fingerprint"].as_str()) {
        return Some(Credentials {
            url: url.to_owned(),
            token,
            fingerprint: Some(fp.to_owned()),
        });
    }
    Some(Credentials {
        url: v["url"].as_str()?.to_owned(),
        token,
        fingerprint: None,
    })
}

/// The URL and token given, else the ones saved in the data dir, else a fresh pairing.
pub(super) fn credentials(args: &ChatArgs) -> Result<Credentials, ChatError> {
    if let (Some(url), Some(token)) = (&args.url, &args.token) {
        return Ok(Credentials {
            url: url.clone(),
            token: token.clone(),
            fingerprint: args.fingerprint.clone(),
        });
    }
    let dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let path = credentials_path(&dir);
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Some(creds) = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| from_saved(&v))
        {
            return Ok(creds);
        }
    }
    let paired = pair(&dir, "terminal chat", None)?;
    let mut saved =
        json!({ "url": paired.url, "token": paired.token, "device_id": paired.device_id });
    if let Some(t) = &paired.tls {
        saved["tls_url"] = t.url.clone().into();
        saved["tls_fingerprint"] = t.fingerprint.clone().into();
    }
    write_private(&path, saved.to_string().as_bytes())?;
    Ok(from_saved(&saved).expect("just written"))
}

/// A byte stream the WebSocket runs on: TCP, or TLS over TCP.
pub(super) trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// A WebSocket over plain TCP or TLS alike.
pub(super) type Socket = tokio_tungstenite::WebSocketStream<Box<dyn Transport>>;

/// Opens the WebSocket: plain for `ws://`, TLS accepting only the pinned certificate for `wss://`.
async fn connect(creds: &Credentials) -> Result<Socket, ChatError> {
    let url = creds.url.as_str();
    let fail = |why: String| ChatError::Tls {
        url: url.to_owned(),
        why,
    };
    let uri: tokio_tungstenite::tungstenite::http::Uri =
        url.parse().map_err(|e| fail(format!("not a URL: {e}")))?;
    let secure = match uri.scheme_str() {
        Some("wss") => true,
        Some("ws") => false,
        _ => return Err(fail("the URL must start with ws:// or wss://".into())),
    };
    let host = uri
        .host()
        .ok_or_else(|| fail("the URL has no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    let stream: Box<dyn Transport> = if secure {
        let fingerprint = creds.fingerprint.as_deref().ok_or_else(|| {
            fail("a wss:// URL needs --fingerprint (iris-gateway pair prints it)".into())
        })?;
        let config = crate::tls::pinned_client_config(fingerprint).map_err(fail)?;
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| fail(format!("bad host name: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        Box::new(
            connector
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS: {e}")))?,
        )
    } else {
        Box::new(tcp)
    };
    let (ws, _) = tokio_tungstenite::client_async(url, stream)
        .await
        .map_err(|source| ChatError::Connect {
            url: url.to_owned(),
            source,
        })?;
    Ok(ws)
}

/// Writes the saved credentials readable by this user only: the token is a password.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// How long connecting and the hello may take before the attempt counts as failed.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens the socket and says hello, within [`CONNECT_TIMEOUT`]: the socket and its `hello.ack`.
pub(super) async fn connect_and_hello(creds: &Credentials) -> Result<(Socket, Value), ChatError> {
    let attempt = async {
        let mut ws = connect(creds).await?;
        let ack = hello(&mut ws, &creds.token).await?;
        Ok((ws, ack))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(ChatError::Unavailable(format!(
                "no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            )))
        })
}

/// Sends `hello` and waits for its `hello.ack`. An `error{auth}` is the gateway's refusal of
/// the token; any other error (too many attempts) or a close is worth trying again later.
async fn hello(ws: &mut Socket, token: &str) -> Result<Value, ChatError> {
    // Append updates: the terminal prints only what is new anyway, and a long answer then
    // costs its length, not its square, on the wire. Busy lanes: the state to show on open.
    let extensions = [
        crate::protocol::EXT_UPDATE_APPEND,
        crate::protocol::EXT_AGENT_BUSY,
    ];
    let hello = json!({"v":1,"type":"hello","id":1,"payload":{"token":token,"device_id":"terminal","device_name":"terminal chat","caps":{"extensions":extensions}}});
    ws.send(Message::text(hello.to_string())).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v = printable(serde_json::from_str(t.as_str()).unwrap_or(Value::Null));
                let message = || v["payload"]["message"].as_str().unwrap_or("").to_owned();
                match (v["type"].as_str(), v["payload"]["code"].as_str()) {
                    (Some("hello.ack"), _) => return Ok(v),
                    (Some("error"), Some("auth")) => return Err(ChatError::Refused(message())),
                    (Some("error"), _) => return Err(ChatError::Unavailable(message())),
                    _ => {}
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(ChatError::Unavailable(
                    "the gateway closed the connection".into(),
                ))
            }
        }
    }
}

/// The channel to talk in: `wanted` by chat id or name, else the default one. A name no
/// channel has is created; until its `channel.created` arrives the chat id is empty.
pub(super) async fn pick_channel(
    ws: &mut Socket,
    ack: &Value,
    wanted: Option<&str>,
    next_id: &mut i64,
) -> Result<String, ChatError> {
    let channels = ack["payload"]["channels"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let default = channels
        .iter()
        .find(|c| c["is_default"] == true)
        .and_then(|c| c["chat_id"].as_str())
        .unwrap_or("default")
        .to_owned();
    let Some(wanted) = wanted else {
        return Ok(default);
    };
    match channels
        .iter()
        .find(|c| c["chat_id"] == wanted || c["name"] == wanted)
    {
        Some(c) => Ok(c["chat_id"].as_str().unwrap_or("default").to_owned()),
        None => {
            let req = json!({"v":1,"type":"channel.create","id":*next_id,"payload":{"name":wanted,"kind":"channel"}});
            *next_id += 1;
            ws.send(Message::text(req.to_string())).await?;
            Ok(String::new())
        }
    }
}
