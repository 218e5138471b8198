//! Files over the conversation's socket: the `/attach` command and its upload's frames, and the
//! pulls of files offered. Reading, hashing and saving the files themselves happens in `chat_files`.

use std::collections::HashSet;

use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::connect::Socket;
use super::screen::{in_lane, Screen};
use super::ChatError;
use crate::cli::chat_files::{parse_attach, Downloads, Stage, Step, Upload};

/// The rest of an `/attach …` line (`None` for any other line).
pub(super) fn attach_command(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("/attach")?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then_some(rest)
}

/// The client's file traffic: the upload in flight and the pulls.
pub(super) struct Files {
    pub(super) upload: Option<Upload>,
    pub(super) downloads: Downloads,
    /// This client's own messages (from their `read.receipt`s): their files came from here and
    /// are not downloaded back.
    pub(super) mine: HashSet<String>,
    /// The `/attach` line of the upload in flight, typed again if the connection drops.
    line: Option<String>,
    /// An upload the gateway took, whose message (caption and media ref) is to be sent.
    ready: Option<(String, String)>,
    /// The tenth of the upload's size last reported, so progress is a line per 10 %.
    reported_tenth: u64,
}

impl Files {
    pub(super) fn new(downloads: Downloads) -> Files {
        Files {
            upload: None,
            downloads,
            mine: HashSet::new(),
            line: None,
            ready: None,
            reported_tenth: 0,
        }
    }

    /// Neither an upload nor a pull is under way.
    pub(super) fn idle(&self) -> bool {
        self.upload.is_none() && !self.downloads.busy()
    }

    /// The connection dropped: pulls under way are given up (their offers come again with the
    /// `sync` replay), and the `/attach` line of an upload cut short is returned to try again.
    pub(super) async fn lost(&mut self) -> Option<String> {
        self.downloads.abandon().await;
        self.ready = None;
        self.upload.take().and(self.line.take())
    }

    /// The caption and media ref of an upload the gateway took, to send as a message.
    pub(super) fn take_ready(&mut self) -> Option<(String, String)> {
        self.ready.take()
    }

    /// `/attach PATH [caption]`: announces the upload, or says why the file cannot be sent.
    pub(super) async fn attach(
        &mut self,
        ws: &mut Socket,
        screen: &mut Screen,
        line: &str,
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
                self.line = Some(line.to_owned());
                self.reported_tenth = 0;
            }
            Err(why) => screen.line(&format!("[{why}]")),
        }
        Ok(())
    }

    /// Sends the upload's next chunk, or its end.
    pub(super) async fn send_chunk(
        &mut self,
        ws: &mut Socket,
        screen: &mut Screen,
    ) -> Result<(), ChatError> {
        let Some(upload) = self.upload.as_mut() else {
            return Ok(());
        };
        match upload.step().await {
            Ok(Step::Chunk(bytes)) => {
                ws.send(Message::binary(bytes)).await?;
                let (sent, size) = upload.progress();
                let tenth = (sent * 10).checked_div(size).unwrap_or(10);
                if tenth > self.reported_tenth {
                    self.reported_tenth = tenth;
                    screen.note(format!(
                        "[sending {}: {}% of {} bytes]",
                        upload.filename,
                        (sent * 100).checked_div(size).unwrap_or(100),
                        size
                    ));
                }
            }
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
    pub(super) async fn on_frame(
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
                    self.line = None;
                    return Ok(true);
                }
                "media.upload.ack" if p["media_ref"] == upload.media_ref.as_str() => {
                    let upload = self.upload.take().expect("matched above");
                    self.line = None;
                    if p["ok"] == true && upload.stage == Stage::Ending && !upload.changed {
                        screen.line(&format!(
                            "[sent {} ({}, {}, {} bytes)]",
                            upload.filename, upload.kind, upload.mime, upload.size
                        ));
                        self.ready = Some((upload.caption, upload.media_ref));
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
