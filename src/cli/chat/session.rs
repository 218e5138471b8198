//! One conversation across any number of connections: what is shown (so a `sync` replay shows
//! each message once), what is held until the gateway acknowledges it, the channel, the files.

use std::collections::HashSet;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::connect::{pick_channel, Socket};
use super::held::{Echo, Held, Unacked};
use super::screen::{printable, render, render_history, Screen, Updates};
use super::transfers::{attach_command, Files};
use super::ChatError;
use crate::cli::chat_files::{Downloads, Stage};

/// Messages of a lane shown when it is opened.
const HISTORY_ON_OPEN: u32 = 20;

/// How a connection ended.
pub(super) enum Ended {
    /// `/quit`, or the input ended with nothing left to send or save.
    Quit,
    /// The connection is gone: the reason, to show before reconnecting.
    Lost(String),
}

pub(super) struct Chat {
    pub(super) screen: Screen,
    pub(super) held: Held,
    files: Files,
    /// The channel to talk in, asked for on the command line (looked up on the first hello).
    wanted: Option<String>,
    chat_id: String,
    /// The directory as last heard: the hello's list, then channels created.
    channels: Vec<Value>,
    /// The outbox cursor caught up to (the last `sync.done`); `None` before the first hello.
    cursor: Option<i64>,
    /// Messages shown, this client's own included, so a replay after a reconnect shows each
    /// once. It grows with the session (an id is ~30 bytes) and is not trimmed: the replay
    /// reaches back to the session's last `sync.done`, so any id may come again.
    seen: HashSet<String>,
    next_id: i64,
    /// The terminal's input has not ended (Ctrl-D).
    pub(super) input_open: bool,
    history_id: Option<i64>,
    channels_id: Option<i64>,
}

/// What the user typed asks for.
enum Typed {
    Go,
    Quit,
}

impl Chat {
    pub(super) fn new(wanted: Option<String>, downloads: Downloads) -> Chat {
        Chat {
            screen: Screen::default(),
            held: Held::default(),
            files: Files::new(downloads),
            wanted,
            chat_id: String::new(),
            channels: Vec::new(),
            cursor: None,
            seen: HashSet::new(),
            next_id: 2,
            input_open: true,
            history_id: None,
            channels_id: None,
        }
    }

    /// Nothing typed is waiting and no file is moving: Ctrl-D may end the client.
    pub(super) fn settled(&self) -> bool {
        !self.input_open && self.held.is_empty() && self.files.idle()
    }

    /// The connection dropped: an answer streaming is cut, pulls are given up, and an upload
    /// cut short is typed again once back.
    pub(super) async fn lost(&mut self) {
        self.screen.interrupted();
        if let Some(line) = self.files.lost().await {
            self.held.retry_first(line);
        }
    }

    /// A line typed while disconnected: held for when the connection is back (`/quit` ends).
    pub(super) fn typed_offline(&mut self, line: String) -> bool {
        if line.trim() == "/quit" {
            return false;
        }
        if !line.trim().is_empty() {
            self.screen
                .line("[held: it goes out when the gateway is back]");
            self.held.typed_offline(line);
        }
        true
    }

    fn id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// One connection, from its `hello.ack` until it drops or the user quits. The first one
    /// picks the channel and shows its history; every one catches up with `sync` from the
    /// cursor reached, and only then sends what is held.
    pub(super) async fn converse(
        &mut self,
        ws: &mut Socket,
        ack: &Value,
        lines: &mut mpsc::Receiver<String>,
    ) -> Result<Ended, ChatError> {
        let first = self.cursor.is_none();
        let mut updates = Updates::default();
        self.channels = ack["payload"]["channels"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if first {
            self.chat_id = pick_channel(ws, ack, self.wanted.as_deref(), &mut self.next_id).await?;
        }
        let busy_here = ack["payload"]["agent_busy"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["chat_id"] == self.chat_id.as_str() && l.get("thread_id").is_none());
        if busy_here {
            self.screen
                .line("[the agent is busy answering in this channel]");
        }
        let asked = self
            .cursor
            .unwrap_or_else(|| ack["payload"]["sync_cursor"].as_i64().unwrap_or(0));
        let sync_id = self.id();
        send(
            ws,
            json!({"v":1,"type":"sync","id":sync_id,"payload":{"cursor":asked}}),
        )
        .await?;
        // Asked after the sync, so the history shown also says the catch-up is over (the
        // gateway answers a connection's requests in order).
        if first && !self.chat_id.is_empty() {
            self.ask_history(ws).await?;
        }
        let mut catching_up = true;
        let mut echoes: Vec<Echo> = Vec::new();
        loop {
            if !catching_up && self.settled() {
                return Ok(Ended::Quit);
            }
            let sending = self
                .files
                .upload
                .as_ref()
                .is_some_and(|u| u.stage == Stage::Sending);
            let free = !catching_up && self.files.upload.is_none();
            tokio::select! {
                // Lines typed while away go first, in order; one upload at a time.
                _ = std::future::ready(()), if free && self.held.has_typed() => {
                    let line = self.held.next_typed().expect("checked");
                    if let Typed::Quit = self.typed(ws, &mut updates, line).await? {
                        return Ok(Ended::Quit);
                    }
                }
                line = lines.recv(), if free && self.input_open && !self.held.is_full() && !self.held.has_typed() => {
                    let Some(line) = line else {
                        self.input_open = false;
                        continue;
                    };
                    if let Typed::Quit = self.typed(ws, &mut updates, line).await? {
                        return Ok(Ended::Quit);
                    }
                }
                // The next chunk goes out between frames read, so a long upload does not stall them.
                _ = std::future::ready(()), if sending => {
                    self.files.send_chunk(ws, &mut self.screen).await?;
                }
                msg = ws.next() => {
                    let text = match msg {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Binary(bytes))) => {
                            self.files.downloads.chunk(&bytes).await;
                            continue;
                        }
                        Some(Ok(Message::Close(c))) => {
                            let why = c.map(|c| c.reason.to_string()).filter(|r| !r.is_empty());
                            return Ok(Ended::Lost(why.unwrap_or_else(|| "the gateway closed it".into())));
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => return Ok(Ended::Lost(e.to_string())),
                        None => return Ok(Ended::Lost("the gateway closed it".into())),
                    };
                    let frame = printable(serde_json::from_str(text.as_str()).unwrap_or(Value::Null));
                    if frame.get("cursor").is_some() {
                        self.replayed(ws, &mut updates, &frame, &mut echoes).await?;
                    } else if frame["type"] == "sync.done" && frame["id"] == sync_id {
                        let head = frame["payload"]["cursor"].as_i64().unwrap_or(asked);
                        self.caught_up(ws, asked, head, std::mem::take(&mut echoes), first).await?;
                        catching_up = false;
                    } else {
                        self.live(ws, &mut updates, &frame).await?;
                    }
                }
            }
        }
    }

    /// A line the user typed, on a live connection.
    async fn typed(
        &mut self,
        ws: &mut Socket,
        updates: &mut Updates,
        line: String,
    ) -> Result<Typed, ChatError> {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Ok(Typed::Go);
        }
        if trimmed == "/quit" {
            return Ok(Typed::Quit);
        }
        if trimmed == "/channels" {
            let id = self.id();
            self.channels_id = Some(id);
            send(
                ws,
                json!({"v":1,"type":"channel.list","id":id,"payload":{}}),
            )
            .await?;
            return Ok(Typed::Go);
        }
        if let Some(name) = switch_command(trimmed) {
            self.switch(ws, updates, name).await?;
            return Ok(Typed::Go);
        }
        if self.chat_id.is_empty() {
            self.screen
                .line("(still creating the channel; try again in a moment)");
            return Ok(Typed::Go);
        }
        if let Some(rest) = attach_command(&line) {
            self.files
                .attach(ws, &mut self.screen, &line, rest, &mut self.next_id)
                .await?;
            return Ok(Typed::Go);
        }
        self.send_message(ws, line, Vec::new()).await?;
        Ok(Typed::Go)
    }

    /// Sends a message, held until its `read.receipt` says the gateway stored it.
    async fn send_message(
        &mut self,
        ws: &mut Socket,
        text: String,
        media_refs: Vec<String>,
    ) -> Result<(), ChatError> {
        let message = Unacked {
            id: self.id(),
            chat_id: self.chat_id.clone(),
            text,
            media_refs,
        };
        let frame = message_send(&message);
        self.held.sent(message);
        send(ws, frame).await
    }

    /// `/switch NAME`: talk in another channel (by name or chat id), shown from its history.
    async fn switch(
        &mut self,
        ws: &mut Socket,
        updates: &mut Updates,
        name: &str,
    ) -> Result<(), ChatError> {
        let found = self.channels.iter().find(|c| {
            c["kind"] != "thread"
                && (c["chat_id"] == name
                    || c["name"]
                        .as_str()
                        .is_some_and(|n| n.eq_ignore_ascii_case(name)))
        });
        let Some(channel) = found else {
            self.screen.line(&format!(
                "[no channel is called {name}; /channels lists them]"
            ));
            return Ok(());
        };
        self.chat_id = channel["chat_id"].as_str().unwrap_or("default").to_owned();
        let shown = channel["name"].as_str().unwrap_or("").to_owned();
        *updates = Updates::default();
        self.screen.interrupted();
        self.screen.line(&format!("[now in {shown}]"));
        self.ask_history(ws).await
    }

    async fn ask_history(&mut self, ws: &mut Socket) -> Result<(), ChatError> {
        let id = self.id();
        self.history_id = Some(id);
        send(
            ws,
            json!({"v":1,"type":"history","id":id,"chat_id":self.chat_id,"payload":{"limit":HISTORY_ON_OPEN}}),
        )
        .await
    }

    /// A frame `sync` replays (it carries its `cursor`): frames this client saw live come again
    /// (live frames carry no cursor to move it on), so complete messages and finished answers
    /// not yet shown are shown, files offered are pulled, and user messages are kept aside
    /// until the replay ends, when some may turn out to be this client's own (see
    /// `caught_up`). The steps of turns long over (tools, todo lists) are not replayed on
    /// screen.
    async fn replayed(
        &mut self,
        ws: &mut Socket,
        updates: &mut Updates,
        frame: &Value,
        echoes: &mut Vec<Echo>,
    ) -> Result<(), ChatError> {
        let p = &frame["payload"];
        match frame["type"].as_str().unwrap_or("") {
            "message" | "message.stop" => {
                let Some(id) = p["message_id"].as_str() else {
                    return Ok(());
                };
                if !self.seen.insert(id.to_owned()) {
                    return Ok(());
                }
                if frame["type"] == "message" && p["role"] == "user" {
                    if frame.get("thread_id").is_none() {
                        echoes.push(Echo {
                            message_id: id.to_owned(),
                            chat_id: frame["chat_id"].as_str().unwrap_or("").to_owned(),
                            text: p["text"].as_str().unwrap_or("").to_owned(),
                        });
                    }
                    return Ok(());
                }
                self.shown(ws, updates, frame).await
            }
            "media.offer" => self.shown(ws, updates, frame).await,
            "channel.created" => {
                self.channels.push(p.clone());
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The replay ended at cursor `head` (below `asked`: this store is not the one the client
    /// caught up with, a restore, so the lane is shown afresh). Messages whose receipt the
    /// connection lost are matched with the echoes replayed; the others are sent again, then
    /// whatever else is held.
    async fn caught_up(
        &mut self,
        ws: &mut Socket,
        asked: i64,
        head: i64,
        echoes: Vec<Echo>,
        first: bool,
    ) -> Result<(), ChatError> {
        self.cursor = Some(head);
        if head < asked {
            self.screen.line(
                "[the gateway's store was replaced (restored from a backup?): showing this channel afresh]",
            );
            self.ask_history(ws).await?;
        }
        let (resend, mine) = self.held.reconcile(&echoes);
        self.files.mine.extend(mine.iter().cloned());
        for echo in &echoes {
            if echo.chat_id == self.chat_id && !mine.contains(&echo.message_id) {
                self.screen.line(&format!(
                    "\x1b[1myou (another device):\x1b[0m {}",
                    echo.text
                ));
            }
        }
        if !first {
            self.screen.line("[back]");
        }
        for echo in echoes.iter().filter(|e| mine.contains(&e.message_id)) {
            self.screen.line(&format!(
                "[delivered before the connection dropped: {}]",
                echo.text
            ));
        }
        for message in &resend {
            self.screen
                .line(&format!("[sending again: {}]", message.text));
            send(ws, message_send(message)).await?;
        }
        Ok(())
    }

    /// A live frame.
    async fn live(
        &mut self,
        ws: &mut Socket,
        updates: &mut Updates,
        frame: &Value,
    ) -> Result<(), ChatError> {
        let p = &frame["payload"];
        let id = frame["id"].as_i64();
        match frame["type"].as_str().unwrap_or("") {
            "channel.created" => {
                self.channels.push(p.clone());
                if self.chat_id.is_empty() && id.is_some() {
                    self.chat_id = p["chat_id"].as_str().unwrap_or("default").to_owned();
                    self.screen.line(&format!(
                        "[created channel {}]",
                        p["name"].as_str().unwrap_or("")
                    ));
                    return Ok(());
                }
            }
            "channel.list" => {
                self.channels = p["channels"].as_array().cloned().unwrap_or_default();
                if id.is_none() || id != self.channels_id {
                    return Ok(());
                }
            }
            "history" if id.is_some() && id == self.history_id => {
                for m in p["messages"].as_array().into_iter().flatten() {
                    if let Some(m) = m["message_id"].as_str() {
                        self.seen.insert(m.to_owned());
                    }
                }
                render_history(&mut self.screen, p);
                return Ok(());
            }
            "read.receipt" if id.is_some() => {
                self.held.answered(id.unwrap_or(0));
                if let Some(m) = p["message_id"].as_str() {
                    self.seen.insert(m.to_owned());
                }
            }
            // A refused message is not held: the error says why, and sending it again would
            // only be refused again.
            "error" if id.is_some() => {
                if let Some(m) = self.held.answered(id.unwrap_or(0)) {
                    self.screen.line(&format!("[not sent: {}]", m.text));
                }
            }
            "message" => {
                if let Some(m) = p["message_id"].as_str() {
                    self.seen.insert(m.to_owned());
                }
            }
            "message.stop" => {
                if let Some(m) = p["message_id"].as_str() {
                    self.seen.insert(m.to_owned());
                }
            }
            _ => {}
        }
        self.shown(ws, updates, frame).await
    }

    /// Files first (an upload's answers, pulls), then the screen; this client's own messages
    /// are not shown again.
    async fn shown(
        &mut self,
        ws: &mut Socket,
        updates: &mut Updates,
        frame: &Value,
    ) -> Result<(), ChatError> {
        let handled = self
            .files
            .on_frame(
                ws,
                &mut self.screen,
                frame,
                &self.chat_id,
                &mut self.next_id,
            )
            .await?;
        if let Some((caption, media_ref)) = self.files.take_ready() {
            self.send_message(ws, caption, vec![media_ref]).await?;
        }
        let own = frame["type"] == "message"
            && frame["payload"]["role"] == "user"
            && frame["payload"]["message_id"]
                .as_str()
                .is_some_and(|m| self.files.mine.contains(m));
        if !handled && !own {
            render(&mut self.screen, updates, frame, &self.chat_id);
        }
        Ok(())
    }
}

/// The rest of a `/switch NAME` line.
fn switch_command(line: &str) -> Option<&str> {
    let name = line.strip_prefix("/switch")?;
    (name.starts_with(char::is_whitespace) && !name.trim().is_empty()).then(|| name.trim())
}

fn message_send(m: &Unacked) -> Value {
    let mut payload = json!({ "text": m.text });
    if !m.media_refs.is_empty() {
        payload["media_refs"] = json!(m.media_refs);
    }
    json!({"v":1,"type":"message.send","id":m.id,"chat_id":m.chat_id,"payload":payload})
}

async fn send(ws: &mut Socket, frame: Value) -> Result<(), ChatError> {
    ws.send(Message::text(frame.to_string())).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_takes_a_name() {
        assert_eq!(switch_command("/switch Garden"), Some("Garden"));
        assert_eq!(switch_command("/switch  my list "), Some("my list"));
        assert_eq!(switch_command("/switch"), None);
        assert_eq!(switch_command("/switcheroo"), None);
    }
}
