//! `iris-gateway chat`: a small terminal client over the same WebSocket protocol as the app.
//!
//! It pairs itself when pointed at a local data dir (keeping its token in that dir), sends what
//! the user types and renders the streamed turn live. It doubles as a debugging tool on the Pi.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use crate::config::default_data_dir;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Gateway WebSocket URL (with --token); otherwise pair through --data-dir.
    #[arg(long, requires = "token")]
    pub url: Option<String>,
    #[arg(long, requires = "url")]
    pub token: Option<String>,
    /// The data dir of a gateway on this machine (default: the gateway's default).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Channel to talk in, by name or chat id (created if no channel has that name).
    #[arg(long)]
    pub channel: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{0}")]
    Pair(#[from] crate::cli::CliError),
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        source: tokio_tungstenite::tungstenite::Error,
    },
    #[error("connection lost: {0}")]
    Socket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("the gateway refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Where the client keeps its own credentials inside a gateway's data dir.
fn credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("chat-client.json")
}

fn credentials(args: &ChatArgs) -> Result<(String, String), ChatError> {
    if let (Some(url), Some(token)) = (&args.url, &args.token) {
        return Ok((url.clone(), token.clone()));
    }
    let dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let path = credentials_path(&dir);
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            if let (Some(u), Some(t)) = (v["url"].as_str(), v["token"].as_str()) {
                return Ok((u.to_owned(), t.to_owned()));
            }
        }
    }
    let paired = crate::cli::pair(&dir, "terminal chat", None)?;
    let saved = json!({ "url": paired.url, "token": paired.token, "device_id": paired.device_id });
    write_private(&path, saved.to_string().as_bytes())?;
    Ok((paired.url, paired.token))
}

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
}

impl Screen {
    fn line(&mut self, s: &str) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
        println!("{s}");
    }

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
    }
}

pub async fn run(args: ChatArgs) -> Result<(), ChatError> {
    let (url, token) = credentials(&args)?;
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .map_err(|source| ChatError::Connect {
            url: url.clone(),
            source,
        })?;
    let hello = json!({"v":1,"type":"hello","id":1,"payload":{"token":token,"device_id":"terminal","device_name":"terminal chat"}});
    ws.send(Message::text(hello.to_string())).await?;
    let ack = loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                match v["type"].as_str() {
                    Some("hello.ack") => break v,
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
    };
    let channels = ack["payload"]["channels"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut next_id = 2i64;
    let mut chat_id = channels
        .iter()
        .find(|c| c["is_default"] == true)
        .and_then(|c| c["chat_id"].as_str())
        .unwrap_or("default")
        .to_owned();
    if let Some(wanted) = &args.channel {
        match channels
            .iter()
            .find(|c| c["chat_id"] == wanted.as_str() || c["name"] == wanted.as_str())
        {
            Some(c) => chat_id = c["chat_id"].as_str().unwrap_or("default").to_owned(),
            None => {
                let req = json!({"v":1,"type":"channel.create","id":next_id,"payload":{"name":wanted,"kind":"channel"}});
                next_id += 1;
                ws.send(Message::text(req.to_string())).await?;
                chat_id = String::new();
            }
        }
    }
    println!("connected to {url}. Type a message and press Enter; Ctrl-D quits.");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut screen = Screen::default();
    loop {
        tokio::select! {
            line = stdin.next_line() => {
                let Some(line) = line? else { break };
                if line.trim().is_empty() { continue; }
                if chat_id.is_empty() {
                    println!("(still creating the channel; try again in a moment)");
                    continue;
                }
                let req = json!({"v":1,"type":"message.send","id":next_id,"chat_id":chat_id,"payload":{"text":line}});
                next_id += 1;
                ws.send(Message::text(req.to_string())).await?;
            }
            msg = ws.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(c))) => {
                        screen.line(&format!("[gateway closed the connection{}]", c.map(|c| format!(": {}", c.reason)).unwrap_or_default()));
                        break;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                };
                let frame: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
                if frame["type"] == "channel.created" && chat_id.is_empty() && frame.get("id").is_some() {
                    chat_id = frame["payload"]["chat_id"].as_str().unwrap_or("default").to_owned();
                    screen.line(&format!("[created channel {}]", frame["payload"]["name"].as_str().unwrap_or("")));
                    continue;
                }
                render(&mut screen, &frame, &chat_id);
            }
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

fn render(screen: &mut Screen, frame: &Value, chat_id: &str) {
    let p = &frame["payload"];
    let kind = frame["type"].as_str().unwrap_or("");
    let in_lane = frame["chat_id"].as_str() == Some(chat_id) && frame.get("thread_id").is_none();
    match kind {
        "status" => screen.line(&format!("[gateway {}]", p["state"].as_str().unwrap_or("?"))),
        "error" => screen.line(&format!(
            "\x1b[31merror ({}): {}\x1b[0m",
            p["code"].as_str().unwrap_or("?"),
            p["message"].as_str().unwrap_or("")
        )),
        _ if !in_lane => {}
        "message.update" => screen.update(p["text"].as_str().unwrap_or("")),
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
