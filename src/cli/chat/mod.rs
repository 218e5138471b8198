//! `iris-gateway chat`: a small terminal client over the same WebSocket protocol as the app.
//!
//! It pairs itself when pointed at a local data dir (keeping its token in that dir), sends what
//! the user types and renders the streamed turn live; `/attach` sends a file and files the
//! gateway offers are saved to a downloads folder (`chat_files`). It doubles as a debugging tool
//! on the Pi.

mod connect;
mod screen;
mod transfers;

use std::collections::HashSet;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use super::args::ChatArgs;
use super::chat_files::{default_downloads, Downloads, Stage};
use super::error::CliError;
use connect::{connect, credentials, hello, pick_channel};
use screen::{printable, render, Screen, Updates};
use transfers::{attach_command, Files};

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
