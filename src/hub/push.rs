//! `Push`: deciding what to push, to whom, and recording what was delivered. It owns the
//! `Pusher` (the push worker's queue and backend) and reaches the hub only through its port
//! (`port.rs`): the committer, who is connected, the published head and push's health.
//!
//! Which frames are pushed, and what a push says, is the frame types' own rule
//! (`Frame::push_note` in protocol). Pushed: final assistant messages (`message.stop`), standalone assistant and cron `message`s
//! (automation output, restart notices) and `notification` frames; not `system` messages (the
//! gateway's answers to slash commands, which someone is looking at). Never streaming frames, tool
//! frames, typing, or user messages. Only to devices with a push target and no open connection.
//! A device's `seen_cursor` (the head when it last disconnected) and `last_pushed_cursor` (the
//! last frame pushed to it) bound what is still owed, so a restart catches up on pushes it
//! never sent and never repeats one it did.

use std::collections::HashSet;
use std::rc::Weak;

use tracing::{info, warn};

use super::errors::Refusal;
use super::port::Back;
use super::port::Port;
use crate::protocol::{decode_pushable, Outboxed, PushNote};
use crate::push::{Backend, Outcome, PushJob, Pusher};
use crate::store::{Change, Record, Store};

/// How far back a restart looks for pushes still owed to each away device.
const CATCH_UP_FRAMES: u64 = 200;
/// What a push of an answer that is also spoken starts with: the phone shows it is a voice
/// reply before the app is opened.
const VOICE_REPLY: &str = "\u{1f50a} Voice reply: ";

/// Marks the push of an answer whose voice follows (`/voice`). Only the live push says it: a
/// restart's catch-up reads the stored frame, which is the plain answer.
pub(super) fn say_voice_reply(outboxed: &mut Outboxed) {
    if let Some(note) = outboxed.push.as_mut() {
        note.body = format!("{VOICE_REPLY}{}", note.body);
    }
}

/// What push asks of the hub beyond the core: who is connected (pushes go only to the others)
/// and that a push got through. `Devices` asks the same (its test push).
pub trait PushPort: Port {
    /// The devices with a connection open now.
    fn connected_devices(&self) -> HashSet<String>;

    /// A push reached its server: push is known to work (`/status`).
    fn confirm_push(&self);
}

/// The push worker and what it is owed.
pub struct Push<P> {
    port: Back<P>,
    pusher: Pusher,
    store: Store,
}

// The doors above the hub only ever see the service over the `Hub` (its accessor), so the
// port it is generic over stays the hub's own.
#[allow(private_bounds)]
impl<P: PushPort> Push<P> {
    /// `port`: the hub being built around this service (it owns it, so it is held weakly).
    pub(super) fn new(port: Weak<P>, pusher: Pusher, store: Store) -> Push<P> {
        Push {
            port: Back::new(port),
            pusher,
            store,
        }
    }

    /// The configured backend, for `hello.ack` and `/status`.
    pub(super) fn backend(&self) -> Backend {
        self.pusher.backend()
    }

    /// The ntfy server devices subscribe to, for `hello.ack`.
    pub(super) fn ntfy_server(&self) -> &str {
        self.pusher.ntfy_server()
    }

    /// A device connected: what was queued for it is dropped (it reads it live).
    pub(super) fn cancel(&self, device_id: &str) {
        self.pusher.cancel(device_id);
    }

    /// Called for every published outbox frame that can be pushed (its note was made from the
    /// frame's type when it was built): queues `note` (the frame at `cursor`) for every device
    /// that is away and still owed it.
    pub(super) fn push_if_away(&self, cursor: u64, note: &PushNote) {
        if !self.pusher.is_enabled() {
            return;
        }
        let devices = match self.store.devices() {
            Ok(d) => d,
            Err(e) => return warn!("cannot read devices for push: {e}"),
        };
        let connected = self.port.hub().connected_devices();
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
                title: self.lane_title(&note.chat_id, note.thread_id.as_deref()),
                chat_id: note.chat_id.clone(),
                thread_id: note.thread_id.clone(),
                message_id: note.message_id.clone(),
                body: note.body.clone(),
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
        let hub = self.port.hub();
        if hub.connected_devices().contains(device_id) {
            return; // Another connection of the same device is still open.
        }
        let head = hub.published_head();
        if let Ok(Some(mut d)) = self.store.device(device_id) {
            d.seen_cursor = d.seen_cursor.max(head);
            hub.commit_soon(
                vec![Change::Record(Record::PutDevice(d))],
                "where the device left off",
            );
        }
    }

    /// `fcm.register` (or later target changes): stored with the device, survives restarts.
    pub(super) async fn register_target(
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
        self.port
            .hub()
            .commit(vec![Change::Record(Record::PutDevice(d))], None)
            .await?;
        Ok(())
    }

    /// The push worker's report: advance `last_pushed_cursor` durably, track push health.
    pub async fn outcome(&self, outcome: Outcome) {
        let hub = self.port.hub();
        match outcome {
            Outcome::Delivered { device_id, cursor } => {
                if let Ok(Some(mut d)) = self.store.device(&device_id) {
                    if cursor > d.last_pushed_cursor {
                        d.last_pushed_cursor = cursor;
                        let record = vec![Change::Record(Record::PutDevice(d))];
                        if let Err(e) = hub.commit(record, None).await {
                            warn!("cannot record a delivered push: {e}");
                        }
                    }
                }
                hub.confirm_push();
                hub.update_health(|st| st.push_error = None);
            }
            Outcome::Failing { reason } => {
                hub.update_health(|st| st.push_error = Some(reason));
            }
            Outcome::GaveUp { device_id, reason } => {
                // Degraded means "pushes are being retried"; nothing is now.
                warn!(device = %device_id, "gave up a push: {reason}");
                hub.update_health(|st| st.push_error = None);
            }
        }
    }

    /// At start: queue the pushes still owed to away devices (the queue died with the process).
    /// Each owed frame is offered once; `push_if_away` picks the devices it is owed to.
    pub fn catch_up(&self) {
        if !self.pusher.is_enabled() {
            return;
        }
        let head = self.port.hub().published_head();
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
        // Only bytes are left of these frames: the protocol's one decoder reads them back into
        // the typed form (turning every unpushable frame away without allocating).
        for (cursor, bytes) in &frames {
            if let Some(note) = decode_pushable(bytes).and_then(|f| f.push_note()) {
                self.push_if_away(*cursor, &note);
            }
        }
        if !frames.is_empty() {
            info!(
                "checked {} outbox frame(s) for pushes owed since the last run",
                frames.len()
            );
        }
    }
}
