//! `iris-gateway chat`: a small terminal client over the same WebSocket protocol as the app.
//!
//! It pairs itself when pointed at a local data dir (keeping its token in that dir), sends what
//! the user types and renders the streamed turn live; `/attach` sends a file and files the
//! gateway offers are saved to a downloads folder (`chat_files`). It doubles as a debugging tool
//! on the Pi.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use super::args::ChatArgs;
use super::chat_files::{default_downloads, parse_attach, Downloads, Stage, Step, Upload};
use super::error::CliError;
use super::pair::pair;
use crate::config::default_data_dir;

/// Why the terminal client stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{0}")]
    Pair(#[from] CliError),
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        source: tokio_tungstenite::tungstenite::Error,
    },
    #[error("connection lost: {0}")]
    Socket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("the gateway refused: {0}")]
    Refused(String),
    #[error("cannot connect to {url}: {why}")]
    Tls { url: String, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Where the client keeps its own credentials inside a gateway's data dir.
fn credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("chat-client.json")
}

/// Where and how to connect: the URL, the token and, for `wss://`, the pinned fingerprint.
struct Credentials {
    url: String,
    token: String,
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
fn credentials(args: &ChatArgs) -> Result<Credentials, ChatError> {
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
trait Transport: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Transport for T {}

/// A WebSocket over plain TCP or TLS alike.
type Socket = tokio_tungstenite::WebSocketStream<Box<dyn Transport>>;

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

/// Renders a streamed turn in a plain terminal: text grows in place by printing only what
/// was appended since the last update; tool and todo lines interleave on their own lines.
#[derive(Default)]
struct Screen {
    /// The reply text shown so far for the message being streamed.
    printed: String,
    streaming: bool,
    /// The cursor sits after streamed text (not at the start of a line).
    mid_line: bool,
    /// Lines about files, held while an answer streams so they do not split its text.
    held: Vec<String>,
}

impl Screen {
    /// A line of its own, after ending a streamed line that is still open.
    fn line(&mut self, s: &str) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
        println!("{s}");
    }

    /// A line that can wait for the answer streaming now to finish.
    fn note(&mut self, s: String) {
        if self.streaming {
            self.held.push(s);
        } else {
            self.line(&s);
        }
    }

    /// The streamed answer grew: print only what is new.
    fn update(&mut self, text: &str) {
        if !self.streaming {
            self.line("");
            print!("\x1b[1magent:\x1b[0m ");
            self.streaming = true;
            self.mid_line = true;
        }
        let delta = match text.strip_prefix(self.printed.as_str()) {
            Some(rest) => rest.to_owned(),
            None => format!("\n{text}"),
        };
        if !delta.is_empty() {
            print!("{delta}");
            self.mid_line = true;
        }
        self.printed = text.to_owned();
        let _ = std::io::stdout().flush();
    }

    /// The answer is complete: its footer (model, tokens, time).
    fn stop(&mut self, frame: &Value) {
        let p = &frame["payload"];
        self.update(p["final_text"].as_str().unwrap_or(""));
        if let Some(r) = p["reasoning"].as_str() {
            self.line(&format!("  \x1b[2mreasoning: {r}\x1b[0m"));
        }
        let model = p["model"].as_str().unwrap_or("?");
        let tokens = p["tokens"].as_i64().unwrap_or(0);
        let latency = p["runtime"]["latency"].as_f64().unwrap_or(0.0);
        self.line(&format!(
            "  \x1b[2m[{model} \u{b7} {tokens} tokens \u{b7} {latency:.1}s]\x1b[0m"
        ));
        self.streaming = false;
        self.printed.clear();
        for held in std::mem::take(&mut self.held) {
            self.line(&held);
        }
    }
}

/// Pairs or reads the saved credentials, says hello, picks the channel, then relays lines typed
/// to `message.send` (and `/attach` to an upload) and renders what comes back, saving offered
/// files, until Ctrl-D (once uploads and downloads in flight are done) or the gateway closes.
pub async fn run(args: ChatArgs) -> Result<(), ChatError> {
    let creds = credentials(&args)?;
    let mut ws = connect(&creds).await?;
    let (url, token) = (creds.url, creds.token);
    let ack = hello(&mut ws, &token).await?;
    let mut next_id = 2i64;
    let mut chat_id = pick_channel(&mut ws, &ack, args.channel.as_deref(), &mut next_id).await?;
    let downloads_dir = args.downloads.clone().unwrap_or_else(default_downloads);
    println!("connected to {url}. Type a message and press Enter; /attach PATH [caption] sends a file; Ctrl-D quits.");
    println!(
        "files from the agent are saved in {}",
        downloads_dir.display()
    );
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut screen = Screen::default();
    let mut updates = Updates::default();
    let mut files = Files {
        upload: None,
        downloads: Downloads::new(downloads_dir),
        mine: HashSet::new(),
    };
    let mut typing = true;
    loop {
        if !typing && files.upload.is_none() && !files.downloads.busy() {
            break;
        }
        let sending = files
            .upload
            .as_ref()
            .is_some_and(|u| u.stage == Stage::Sending);
        tokio::select! {
            // One upload at a time: what is typed after an `/attach` waits for it.
            line = stdin.next_line(), if typing && files.upload.is_none() => {
                let Some(line) = line? else {
                    typing = false;
                    continue;
                };
                if line.trim().is_empty() { continue; }
                if chat_id.is_empty() {
                    println!("(still creating the channel; try again in a moment)");
                    continue;
                }
                if let Some(rest) = attach_command(&line) {
                    files.attach(&mut ws, &mut screen, rest, &mut next_id).await?;
                    continue;
                }
                let req = json!({"v":1,"type":"message.send","id":next_id,"chat_id":chat_id,"payload":{"text":line}});
                next_id += 1;
                ws.send(Message::text(req.to_string())).await?;
            }
            // The next chunk goes out between frames read, so a long upload does not stall them.
            _ = std::future::ready(()), if sending => {
                files.send_chunk(&mut ws, &mut screen).await?;
            }
            msg = ws.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(bytes))) => {
                        files.downloads.chunk(&bytes).await;
                        continue;
                    }
                    Some(Ok(Message::Close(c))) => {
                        screen.line(&format!("[gateway closed the connection{}]", c.map(|c| format!(": {}", c.reason)).unwrap_or_default()));
                        break;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                };
                let frame = printable(serde_json::from_str(text.as_str()).unwrap_or(Value::Null));
                if frame["type"] == "channel.created" && chat_id.is_empty() && frame.get("id").is_some() {
                    chat_id = frame["payload"]["chat_id"].as_str().unwrap_or("default").to_owned();
                    screen.line(&format!("[created channel {}]", frame["payload"]["name"].as_str().unwrap_or("")));
                    continue;
                }
                if files.on_frame(&mut ws, &mut screen, &frame, &chat_id, &mut next_id).await? {
                    continue;
                }
                render(&mut screen, &mut updates, &frame, &chat_id);
            }
        }
    }
    for held in std::mem::take(&mut screen.held) {
        screen.line(&held);
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// The rest of an `/attach …` line (`None` for any other line).
fn attach_command(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("/attach")?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then_some(rest)
}

/// Whether a frame belongs to the lane the terminal shows (this channel, not a thread).
fn in_lane(frame: &Value, chat_id: &str) -> bool {
    frame["chat_id"].as_str() == Some(chat_id) && frame.get("thread_id").is_none()
}

/// What this connection's `message.update` frames leave for the client to remember
/// (`update_append`, docs/protocol.md): a continuation carries no lane, and no message id while
/// it continues the message of the connection's previous update.
#[derive(Default)]
struct Updates {
    /// The message of the previous `message.update` on this connection.
    last: Option<String>,
    /// Messages streaming in the lane shown, learnt from their first update (which has its
    /// lane); forgotten at their `message.stop`.
    shown: HashSet<String>,
}

impl Updates {
    /// Whether a `message.update` is for the lane shown; notes its message as the last.
    fn shown(&mut self, frame: &Value, chat_id: &str) -> bool {
        let id = match (frame["payload"]["message_id"].as_str(), &self.last) {
            (Some(id), _) => id.to_owned(),
            (None, Some(last)) => last.clone(),
            // A gateway that breaks the rule: nothing to attribute the text to.
            (None, None) => return false,
        };
        let shown = if frame.get("chat_id").is_some() {
            let shown = in_lane(frame, chat_id);
            if shown {
                self.shown.insert(id.clone());
            } else {
                self.shown.remove(&id);
            }
            shown
        } else {
            self.shown.contains(&id)
        };
        self.last = Some(id);
        shown
    }

    fn stopped(&mut self, frame: &Value) {
        if let Some(id) = frame["payload"]["message_id"].as_str() {
            self.shown.remove(id);
        }
    }
}

/// The client's file traffic: the upload in flight and the pulls.
struct Files {
    upload: Option<Upload>,
    downloads: Downloads,
    /// This client's own messages (from their `read.receipt`s): their files came from here and
    /// are not downloaded back.
    mine: HashSet<String>,
}

impl Files {
    /// `/attach PATH [caption]`: announces the upload, or says why the file cannot be sent.
    async fn attach(
        &mut self,
        ws: &mut Socket,
        screen: &mut Screen,
        rest: &str,
        next_id: &mut i64,
    ) -> Result<(), ChatError> {
        let Some((path, caption)) = parse_attach(rest) else {
            screen.line("usage: /attach PATH [caption]  (quote a path with spaces)");
            return Ok(());
        };
        match Upload::open(&path, caption, *next_id).await {
            Ok((upload, start, ping)) => {
                *next_id = upload.end_id + 1;
                ws.send(Message::text(start.to_string())).await?;
                // The start has no reply when accepted: the pong after it says it was.
                ws.send(Message::text(ping.to_string())).await?;
                self.upload = Some(upload);
            }
            Err(why) => screen.line(&format!("[{why}]")),
        }
        Ok(())
    }

    /// Sends the upload's next chunk, or its end.
    async fn send_chunk(&mut self, ws: &mut Socket, screen: &mut Screen) -> Result<(), ChatError> {
        let Some(upload) = self.upload.as_mut() else {
            return Ok(());
        };
        match upload.step().await {
            Ok(Step::Chunk(bytes)) => ws.send(Message::binary(bytes)).await?,
            Ok(Step::End(end)) => ws.send(Message::text(end.to_string())).await?,
            Err(e) => {
                screen.line(&format!(
                    "[{} was not sent: cannot read it: {e}]",
                    upload.filename
                ));
                // A wrong checksum ends the upload at the gateway, so the next one can start.
                upload.stage = Stage::Ending;
                upload.reported = true;
                let end = json!({"v":1,"type":"media.upload.end","id":upload.end_id,"payload":{"media_ref":upload.media_ref,"sha256":""}});
                ws.send(Message::text(end.to_string())).await?;
            }
        }
        Ok(())
    }

    /// Handles what concerns files; `true` when the frame needs no rendering.
    async fn on_frame(
        &mut self,
        ws: &mut Socket,
        screen: &mut Screen,
        frame: &Value,
        chat_id: &str,
        next_id: &mut i64,
    ) -> Result<bool, ChatError> {
        let p = &frame["payload"];
        let id = frame["id"].as_i64();
        let kind = frame["type"].as_str().unwrap_or("");
        if let Some(upload) = self.upload.as_mut() {
            match kind {
                "pong" if id == Some(upload.ping_id) => {
                    if upload.stage == Stage::Announced {
                        upload.stage = Stage::Sending;
                    }
                    return Ok(true);
                }
                "error" if id == Some(upload.start_id) || id == Some(upload.end_id) => {
                    screen.line(&format!(
                        "[{} was not sent: {}]",
                        upload.filename,
                        p["message"].as_str().unwrap_or("the gateway refused it")
                    ));
                    self.upload = None;
                    return Ok(true);
                }
                "media.upload.ack" if p["media_ref"] == upload.media_ref.as_str() => {
                    let upload = self.upload.take().expect("matched above");
                    if p["ok"] == true && upload.stage == Stage::Ending && !upload.changed {
                        let req = json!({"v":1,"type":"message.send","id":*next_id,"chat_id":chat_id,
                            "payload":{"text":upload.caption,"media_refs":[upload.media_ref]}});
                        *next_id += 1;
                        ws.send(Message::text(req.to_string())).await?;
                        screen.line(&format!(
                            "[sent {} ({}, {}, {} bytes)]",
                            upload.filename, upload.kind, upload.mime, upload.size
                        ));
                    } else if !upload.reported {
                        let why = if upload.changed {
                            "the file changed while it was sent"
                        } else if id.is_none() {
                            "the upload went idle and the gateway dropped it"
                        } else {
                            "the gateway did not accept it"
                        };
                        screen.line(&format!("[{} was not sent: {why}]", upload.filename));
                    }
                    return Ok(true);
                }
                _ => {}
            }
        }
        match kind {
            "read.receipt" if id.is_some() => {
                if let Some(m) = p["message_id"].as_str() {
                    self.mine.insert(m.to_owned());
                }
            }
            "media.pull.end" | "error" if id.is_some() => {
                let refused = (kind == "error").then(|| p["message"].as_str().unwrap_or(""));
                let ok = p["ok"] == true;
                if let Some(line) = self.downloads.end(id.unwrap_or(0), ok, refused).await {
                    screen.note(line);
                    return Ok(true);
                }
            }
            "media.offer" if in_lane(frame, chat_id) => {
                self.pull(ws, screen, p, next_id).await?;
                return Ok(true);
            }
            "message" if in_lane(frame, chat_id) => {
                let own = p["message_id"]
                    .as_str()
                    .is_some_and(|m| self.mine.contains(m));
                if !own {
                    for media in p["media"].as_array().into_iter().flatten() {
                        self.pull(ws, screen, media, next_id).await?;
                    }
                }
            }
            _ => {}
        }
        Ok(false)
    }

    /// Asks for a file's bytes (once per file), to be saved in the downloads folder.
    async fn pull(
        &mut self,
        ws: &mut Socket,
        screen: &mut Screen,
        media: &Value,
        next_id: &mut i64,
    ) -> Result<(), ChatError> {
        match self.downloads.begin(media, *next_id).await {
            Ok(Some(req)) => {
                *next_id += 1;
                ws.send(Message::text(req.to_string())).await?;
            }
            Ok(None) => {}
            Err(why) => screen.note(format!("[{why}]")),
        }
        Ok(())
    }
}

/// Sends `hello` and waits for its `hello.ack` (an `error` is the gateway's refusal).
async fn hello(ws: &mut Socket, token: &str) -> Result<Value, ChatError> {
    // Append updates: the terminal prints only what is new anyway, and a long answer then
    // costs its length, not its square, on the wire.
    let hello = json!({"v":1,"type":"hello","id":1,"payload":{"token":token,"device_id":"terminal","device_name":"terminal chat","caps":{"extensions":[crate::protocol::EXT_UPDATE_APPEND]}}});
    ws.send(Message::text(hello.to_string())).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v = printable(serde_json::from_str(t.as_str()).unwrap_or(Value::Null));
                match v["type"].as_str() {
                    Some("hello.ack") => return Ok(v),
                    Some("error") => {
                        return Err(ChatError::Refused(
                            v["payload"]["message"].as_str().unwrap_or("").to_owned(),
                        ))
                    }
                    _ => {}
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(ChatError::Refused(
                    "the gateway closed the connection".into(),
                ))
            }
        }
    }
}

/// The channel to talk in: `wanted` by chat id or name, else the default one. A name no
/// channel has is created; until its `channel.created` arrives the chat id is empty.
async fn pick_channel(
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

/// What the gateway relays (an agent's words, tool names and previews, channel names) must not
/// drive the terminal: control characters other than newline and tab (escape sequences can
/// rewrite the screen, the window title or the clipboard) are shown as U+FFFD.
fn printable(v: Value) -> Value {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    match v {
        Value::String(s) if s.chars().any(bad) => Value::String(
            s.chars()
                .map(|c| if bad(c) { '\u{fffd}' } else { c })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(printable).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, printable(v))).collect()),
        v => v,
    }
}

/// The streamed text after a `message.update`: the whole text, or (`update_append`) the first
/// `append_at` characters of what the screen has, followed by the update's text.
fn updated_text(printed: &str, payload: &Value) -> String {
    let text = payload["text"].as_str().unwrap_or("");
    match payload["append_at"].as_u64() {
        Some(at) => {
            let mut kept: String = printed
                .chars()
                .take(usize::try_from(at).unwrap_or(usize::MAX))
                .collect();
            kept.push_str(text);
            kept
        }
        None => text.to_owned(),
    }
}

/// One frame from the gateway, as the terminal shows it: status and errors always, a turn only
/// when it is in this channel (not a thread).
fn render(screen: &mut Screen, updates: &mut Updates, frame: &Value, chat_id: &str) {
    let p = &frame["payload"];
    let kind = frame["type"].as_str().unwrap_or("");
    let shown = match kind {
        "message.update" => updates.shown(frame, chat_id),
        "message.stop" => {
            updates.stopped(frame);
            in_lane(frame, chat_id)
        }
        _ => in_lane(frame, chat_id),
    };
    match kind {
        "status" => screen.line(&format!("[gateway {}]", p["state"].as_str().unwrap_or("?"))),
        "error" => screen.line(&format!(
            "\x1b[31merror ({}): {}\x1b[0m",
            p["code"].as_str().unwrap_or("?"),
            p["message"].as_str().unwrap_or("")
        )),
        _ if !shown => {}
        "message.update" => {
            let text = updated_text(&screen.printed, p);
            screen.update(&text);
        }
        "message.stop" => screen.stop(frame),
        "message" if p["role"] != "user" => screen.line(&format!(
            "\x1b[1m{}:\x1b[0m {}",
            p["role"].as_str().unwrap_or(""),
            p["text"].as_str().unwrap_or("")
        )),
        "commentary" => screen.line(&format!("  \u{1f4ac} {}", p["text"].as_str().unwrap_or(""))),
        "tool.start" => screen.line(&format!(
            "  {} {}: {}",
            p["emoji"].as_str().unwrap_or("\u{1f527}"),
            p["name"].as_str().unwrap_or(""),
            p["preview"].as_str().unwrap_or("")
        )),
        "tool.progress" => screen.line(&format!(
            "    \u{2026} {}",
            p["note"].as_str().unwrap_or("")
        )),
        "tool.end" => screen.line(&format!(
            "    {} {} ({:.2}s)",
            if p["ok"] == true {
                "\u{2713}"
            } else {
                "\u{2717}"
            },
            p["output_preview"].as_str().unwrap_or(""),
            p["duration"].as_f64().unwrap_or(0.0)
        )),
        "todo.update" => {
            let items: Vec<String> = p["todos"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|t| {
                            let mark = match t["status"].as_str() {
                                Some("completed") => "\u{2611}",
                                Some("in_progress") => "\u{25d0}",
                                Some("cancelled") => "\u{2612}",
                                _ => "\u{2610}",
                            };
                            format!("{mark} {}", t["content"].as_str().unwrap_or(""))
                        })
                        .collect()
                })
                .unwrap_or_default();
            screen.line(&format!("  \x1b[2mtodo: {}\x1b[0m", items.join("  ")));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_updates_reassemble_and_whole_ones_replace() {
        let mut text = updated_text("", &json!({"text": "héllo", "append_at": 0}));
        text = updated_text(&text, &json!({"text": " wörld", "append_at": 5}));
        assert_eq!(text, "héllo wörld");
        text = updated_text(&text, &json!({"text": "héllo", "append_at": 0}));
        assert_eq!(text, "héllo");
        text = updated_text(&text, &json!({"text": "whole"}));
        assert_eq!(text, "whole");
    }

    #[test]
    fn continuations_belong_to_the_last_updates_message_and_its_lane() {
        let mut u = Updates::default();
        let update = |chat: Option<&str>, id: Option<&str>| {
            let mut f = json!({"type": "message.update", "payload": {"text": "t", "append_at": 1}});
            if let Some(c) = chat {
                f["chat_id"] = json!(c);
            }
            if let Some(m) = id {
                f["payload"]["message_id"] = json!(m);
            }
            f
        };
        assert!(
            !u.shown(&update(None, None), "default"),
            "nothing to continue"
        );
        assert!(u.shown(&update(Some("default"), Some("msg_a")), "default"));
        assert!(u.shown(&update(None, None), "default"));
        // Another lane's answer streams in between: not shown, nor its continuations.
        assert!(!u.shown(&update(Some("other"), Some("msg_b")), "default"));
        assert!(!u.shown(&update(None, None), "default"));
        // Back to the shown one, named since another message's update came between.
        assert!(u.shown(&update(None, Some("msg_a")), "default"));
        assert!(u.shown(&update(None, None), "default"));
        u.stopped(&json!({"payload": {"message_id": "msg_a"}}));
        assert!(u.shown.is_empty());
    }

    #[test]
    fn relayed_text_cannot_send_terminal_escapes() {
        let frame = json!({"payload": {"text": "hi\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J\nok\tthere",
                                      "todos": [{"content": "\u{1b}[31mred"}]}});
        let clean = printable(frame);
        let text = clean["payload"]["text"].as_str().unwrap();
        assert_eq!(
            text,
            "hi\u{fffd}]52;c;ZXZpbA==\u{fffd}\u{fffd}2J\nok\tthere"
        );
        assert_eq!(clean["payload"]["todos"][0]["content"], "\u{fffd}[31mred");
    }
}
