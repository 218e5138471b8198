//! Deciding what to push, to whom, and recording what was delivered.
//!
//! Pushed: final assistant messages (`message.stop`), standalone assistant and cron `message`s
//! (automation output, restart notices) and `notification` frames; not `system` messages (the
//! gateway's answers to slash commands, which someone is looking at). Never streaming frames, tool
//! frames, typing, or user messages. Only to devices with a push target and no open connection.
//! A device's `seen_cursor` (the head when it last disconnected) and `last_pushed_cursor` (the
//! last frame pushed to it) bound what is still owed, so a restart catches up on pushes it
//! never sent and never repeats one it did.

use serde_json::Value;
use tracing::{info, warn};

use super::errors::Refusal;
use super::state::Hub;
use crate::push::{Outcome, PushJob};

/// How far back a restart looks for pushes still owed to each away device.
const CATCH_UP_FRAMES: u64 = 200;

/// Whether a frame's type can be pushed, read without allocating (serde-json-core, borrowed):
/// most outboxed frames (echoes, tool.end, directory changes) are not, and need no full parse.
fn may_push(encoded: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
    }
    match serde_json_core::from_slice::<Kind<'_>>(encoded) {
        Ok((k, _)) => matches!(k.kind, Some("message.stop" | "message" | "notification")),
        // Not readable by the fast path: let the full parser decide.
        Err(_) => true,
    }
}

/// What a pushable frame says: (chat_id, thread_id, message_id, body).
fn pushable(frame: &Value) -> Option<(String, Option<String>, String, String)> {
    let p = &frame["payload"];
    let body = match frame["type"].as_str()? {
        "message.stop" => p["final_text"].as_str()?.to_owned(),
        // Not the user's own words, nor the gateway's answers to a command someone just typed.
        "message" if p["role"] != "user" && p["role"] != "system" => p["text"].as_str()?.to_owned(),
        // An automation post is pushed once, as its message (titled with the channel); the
        // notification beside it would make the phone ring twice.
        "notification" if p["kind"] == "cron" => return None,
        "notification" => {
            let title = p["title"].as_str().unwrap_or("");
            let body = p["body"].as_str().unwrap_or("");
            format!("{title}{}{body}", if title.is_empty() { "" } else { ": " })
        }
        _ => return None,
    };
    let chat = frame["chat_id"].as_str().unwrap_or("default").to_owned();
    let thread = frame["thread_id"].as_str().map(str::to_owned);
    let message_id = p["message_id"].as_str().unwrap_or("").to_owned();
    Some((chat, thread, message_id, body))
}

impl Hub {
    /// Called for every published outbox frame: queues pushes for away devices.
    pub(super) fn push_if_away(&self, cursor: u64, encoded: &[u8]) {
        if self.pusher.backend() == "none" || !may_push(encoded) {
            return;
        }
        let Ok(frame) = serde_json::from_slice::<Value>(encoded) else {
            return;
        };
        let Some((chat, thread, message_id, body)) = pushable(&frame) else {
            return;
        };
        let devices = match self.store.devices() {
            Ok(d) => d,
            Err(e) => return warn!("cannot read devices for push: {e}"),
        };
        let connected: Vec<String> = self
            .state
            .borrow()
            .outlets
            .values()
            .map(|o| o.device_id.clone())
            .collect();
        for d in devices {
            if connected.contains(&d.device_id) || cursor <= d.last_pushed_cursor.max(d.seen_cursor)
            {
                continue;
            }
            let Some(target) = self
                .pusher
                .target_for(d.ntfy_topic.as_deref(), d.fcm_token.as_deref())
            else {
                continue;
            };
            self.pusher.enqueue(PushJob {
                device_id: d.device_id,
                target,
                cursor,
                title: self.lane_title(&chat, thread.as_deref()),
                chat_id: chat.clone(),
                thread_id: thread.clone(),
                message_id: message_id.clone(),
                body: body.clone(),
                count: 1,
            });
        }
    }

    /// "Channel" or "Channel › Thread", for a push's title.
    fn lane_title(&self, chat: &str, thread: Option<&str>) -> String {
        let name = |id: &str| {
            self.store
                .channel(id)
                .ok()
                .flatten()
                .map(|c| c.name)
                .unwrap_or_else(|| id.to_owned())
        };
        match thread {
            Some(t) => format!("{} \u{203a} {}", name(chat), name(t)),
            None => name(chat),
        }
    }

    /// A device went away: remember how far it saw, so pushes start after that.
    pub(super) fn device_left(&self, device_id: &str) {
        if self
            .state
            .borrow()
            .outlets
            .values()
            .any(|o| o.device_id == device_id)
        {
            return; // Another connection of the same device is still open.
        }
        let head = self.published_head();
        if let Ok(Some(mut d)) = self.store.device(device_id) {
            d.seen_cursor = d.seen_cursor.max(head);
            if let Err(e) = self.store.update_device(&d) {
                warn!("cannot record where the device left off: {e}");
            }
        }
    }

    /// `fcm.register` (or later target changes): stored with the device, survives restarts.
    pub(super) fn register_push_target(
        &self,
        device_id: &str,
        fcm_token: Option<String>,
        ntfy_topic: Option<String>,
    ) -> Result<(), Refusal> {
        let mut d = self
            .store
            .device(device_id)
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::auth("this device was revoked"))?;
        if let Some(t) = fcm_token {
            if t.len() > 4096 {
                return Err(Refusal::unsupported("fcm_token is over 4096 bytes"));
            }
            d.fcm_token = Some(t);
        }
        if let Some(t) = ntfy_topic {
            if t.len() > 256 {
                return Err(Refusal::unsupported("ntfy_topic is over 256 bytes"));
            }
            d.ntfy_topic = Some(t);
        }
        self.store.update_device(&d).map_err(Refusal::internal)
    }

    /// The push worker's report: advance `last_pushed_cursor` durably, track push health.
    pub async fn push_outcome(&self, outcome: Outcome) {
        match outcome {
            Outcome::Delivered { device_id, cursor } => {
                if let Ok(Some(mut d)) = self.store.device(&device_id) {
                    if cursor > d.last_pushed_cursor {
                        d.last_pushed_cursor = cursor;
                        if let Err(e) = self.store.update_device(&d) {
                            warn!("cannot record a delivered push: {e}");
                        } else if let Err(e) = self.store.sync().await {
                            warn!("cannot make a delivered push durable: {e}");
                        }
                    }
                }
                self.update_health(|st| st.push_error = None);
            }
            Outcome::Failing { reason } => {
                self.update_health(|st| st.push_error = Some(reason));
            }
            Outcome::GaveUp { device_id, reason } => {
                // Degraded means "pushes are being retried"; nothing is now.
                warn!(device = %device_id, "gave up a push: {reason}");
                self.update_health(|st| st.push_error = None);
            }
        }
    }

    /// At start: queue the pushes still owed to away devices (the queue died with the process).
    /// Each owed frame is offered once; `push_if_away` picks the devices it is owed to.
    pub fn catch_up_pushes(&self) {
        if self.pusher.backend() == "none" {
            return;
        }
        let head = self.published_head();
        let Ok(devices) = self.store.devices() else {
            return;
        };
        let Some(from) = devices
            .iter()
            .filter(|d| {
                self.pusher
                    .target_for(d.ntfy_topic.as_deref(), d.fcm_token.as_deref())
                    .is_some()
            })
            .map(|d| d.last_pushed_cursor.max(d.seen_cursor))
            .min()
        else {
            return;
        };
        let from = from.max(head.saturating_sub(CATCH_UP_FRAMES));
        let Ok(frames) = self
            .store
            .outbox_range(from, head, CATCH_UP_FRAMES as usize)
        else {
            return;
        };
        for (cursor, bytes) in &frames {
            self.push_if_away(*cursor, bytes);
        }
        if !frames.is_empty() {
            info!(
                "checked {} outbox frame(s) for pushes owed since the last run",
                frames.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::may_push;
    use crate::protocol::{Frame, HistoryMessage, Role};

    #[test]
    fn only_pushable_kinds_get_a_full_parse() {
        let m = HistoryMessage {
            message_id: "m".into(),
            role: Role::User,
            text: "a \"quoted\" line\n".into(),
            reasoning: None,
            model: None,
            tokens: None,
            runtime: None,
            ts: 1,
            media: vec![],
        };
        assert!(may_push(&Frame::message_stop(&m).encode()));
        assert!(may_push(
            &Frame::message(&m).in_lane("c", Some("t")).encode()
        ));
        assert!(!may_push(
            &Frame::tool_end(0, "x", true, 0.1, "out").encode()
        ));
        assert!(!may_push(
            &Frame::channel_deleted("c").reply_to(Some(3)).encode()
        ));
    }
}
