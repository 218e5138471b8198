//! `iris-gateway chat`: a small terminal client over the same WebSocket protocol as the app.
//!
//! It pairs itself when pointed at a local data dir (keeping its token in that dir), shows the
//! channel's recent history, sends what the user types and renders the streamed turn live and
//! what other devices send; `/attach` sends a file (with its progress) and files the gateway
//! offers are saved to a downloads folder (`chat_files`); `/channels` and `/switch NAME` move
//! between channels. A lost connection (a restart, an update, a restore) is tried again with
//! backoff and caught up with `sync`; what was typed meanwhile is held and sent once back
//! (`held`). It doubles as a debugging tool on the Pi.

mod backoff;
mod connect;
mod held;
mod screen;
mod session;
mod transfers;

use std::time::Duration;

use tokio::sync::mpsc;

use super::args::ChatArgs;
use super::chat_files::{default_downloads, Downloads};
use super::error::CliError;
use backoff::Backoff;
use connect::{connect_and_hello, credentials};
use session::{Chat, Ended};

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
    #[error("the gateway is not taking connections: {0}")]
    Unavailable(String),
    #[error("cannot connect to {url}: {why}")]
    Tls { url: String, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ChatError {
    /// A failure that trying again later can mend (the gateway restarting, the network), as
    /// opposed to one that needs the user (a refused token, a wrong URL or fingerprint).
    fn is_transient(&self) -> bool {
        matches!(
            self,
            ChatError::Connect { .. }
                | ChatError::Socket(_)
                | ChatError::Unavailable(_)
                | ChatError::Io(_)
        )
    }
}

/// Lines read from the terminal and not yet taken: with `held::MAX_HELD_LINES` it bounds
/// what the client keeps of the user's input.
const TYPED_AHEAD: usize = 8;

/// Pairs or reads the saved credentials, then converses, connection after connection: a lost
/// one is tried again with backoff (the line typed meanwhile held), until `/quit`, Ctrl-D with
/// nothing left to send or save, or a refused token (an error, so a non-zero exit).
pub async fn run(args: ChatArgs) -> Result<(), ChatError> {
    let creds = credentials(&args)?;
    let downloads_dir = args.downloads.clone().unwrap_or_else(default_downloads);
    let mut chat = Chat::new(args.channel.clone(), Downloads::new(downloads_dir.clone()));
    let mut lines = read_terminal();
    let mut backoff = Backoff::default();
    let mut greeted = false;
    loop {
        match connect_and_hello(&creds).await {
            Ok((mut ws, ack)) => {
                backoff.reset();
                if !greeted {
                    greeted = true;
                    chat.screen.line(&format!("connected to {}. Type a message and press Enter; /attach PATH [caption] sends a file; /channels lists the channels, /switch NAME moves to one; /quit or Ctrl-D quits.", creds.url));
                    chat.screen.line(&format!(
                        "files from the agent are saved in {}",
                        downloads_dir.display()
                    ));
                }
                let ended = match chat.converse(&mut ws, &ack, &mut lines).await {
                    Ok(ended) => ended,
                    Err(e) if e.is_transient() => Ended::Lost(e.to_string()),
                    Err(e) => return Err(e),
                };
                match ended {
                    Ended::Quit => {
                        chat.screen.interrupted();
                        let _ = futures_util::SinkExt::close(&mut ws).await;
                        return quit(&chat);
                    }
                    Ended::Lost(why) => chat.screen.line(&format!("[connection lost: {why}]")),
                }
                chat.lost().await;
            }
            Err(e) if e.is_transient() => {
                if !greeted {
                    chat.screen
                        .line(&format!("[cannot reach the gateway: {e}]"));
                }
            }
            Err(e) => return Err(e),
        }
        if chat.settled() {
            return Ok(());
        }
        let delay = backoff.next_delay();
        chat.screen.line(&format!(
            "[reconnecting in {:.1}s\u{2026}]",
            delay.as_secs_f64()
        ));
        if !wait_offline(&mut chat, &mut lines, delay).await {
            return quit(&chat);
        }
    }
}

/// Waits `delay` before the next attempt, holding what is typed meanwhile; `false` on `/quit`.
async fn wait_offline(
    chat: &mut Chat,
    lines: &mut mpsc::Receiver<String>,
    delay: Duration,
) -> bool {
    let pause = tokio::time::sleep(delay);
    tokio::pin!(pause);
    loop {
        tokio::select! {
            _ = &mut pause => return true,
            line = lines.recv(), if chat.input_open && !chat.held.is_full() => match line {
                Some(line) => {
                    if !chat.typed_offline(line) {
                        return false;
                    }
                }
                None => chat.input_open = false,
            },
        }
    }
}

/// `/quit`: what was still held is named, since it was not sent.
fn quit(chat: &Chat) -> Result<(), ChatError> {
    for line in chat.held.unsent() {
        println!("[not sent: {line}]");
    }
    Ok(())
}

/// The terminal's lines, read on a thread of their own: a read of a terminal cannot be
/// cancelled, and a runtime blocking thread stuck in one would keep the process from exiting
/// on `/quit`. The channel closes at end of input (Ctrl-D).
fn read_terminal() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(TYPED_AHEAD);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}
