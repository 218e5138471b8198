//! User messages and agent turns: one turn at a time per lane, a bounded queue behind it.
//!
//! `message.send` stores the user's message (with a record that its turn is pending) before
//! anything is announced; then the sender gets `read.receipt`, every device gets the echo, and
//! the lane's runner streams the agent's turn to everyone. The finished assistant message, its
//! `message.stop` and the end of the pending record are committed together, so after a crash a
//! message either has its answer or is known to be unanswered (see `close_interrupted_turns`).

use std::collections::HashMap;
use std::rc::Rc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{channels, coalesce_key, Hub, Origin, Refusal};
use crate::agent::{AgentEvent, TurnInput, TurnSummary};
use crate::connection::Outlet;
use crate::ids;
use crate::protocol::{
    ErrorCode, Frame, HistoryMessage, Lane, MediaRef, MessageSend, Role, Runtime, TodoItem,
};
use crate::store::{Change, PendingTurn};

/// Longest auto-thread title derived from the first message.
const AUTO_TITLE_CHARS: usize = 48;
/// Longest assistant reply kept; a runaway agent is cut off here so frames stay under limits.
const MAX_REPLY_BYTES: usize = 512 << 10;

/// A stored user message waiting for its turn.
#[derive(Debug, Clone)]
pub struct QueuedTurn {
    pub user_message_id: String,
    pub text: String,
    pub media: Vec<MediaRef>,
}

pub async fn send_message(
    hub: &Rc<Hub>,
    outlet: &Rc<Outlet>,
    chat_id: Option<String>,
    thread_id: Option<String>,
    id: Option<i64>,
    req: MessageSend,
) -> Result<(), Refusal> {
    let limits = hub.limits();
    if req.text.len() > limits.max_text_bytes {
        return Err((
            ErrorCode::Unsupported,
            format!(
                "message text is {} bytes; the limit is {} (limits.max_text_bytes)",
                req.text.len(),
                limits.max_text_bytes
            ),
        ));
    }
    let media = attachments(hub, &outlet.device_id, &req.media_refs)?;
    if req.text.trim().is_empty() && media.is_empty() {
        return Err((
            ErrorCode::Unsupported,
            "an empty message has nothing to send".into(),
        ));
    }
    let (mut lane, root) = hub.resolve_lane(chat_id.as_deref(), thread_id.as_deref())?;
    if root.automation {
        return Err((
            ErrorCode::Unsupported,
            format!(
                "`{}` is an automation channel: it only receives gateway output",
                root.name
            ),
        ));
    }
    let mut changes = Vec::new();
    let wants_thread = req.auto_thread
        && root.is_default
        && lane.thread_id.is_none()
        && !req.text.trim_start().starts_with('/');
    if wants_thread {
        let thread = channels::new_thread(&lane.chat_id, auto_title(&req.text), true);
        lane = Lane::new(&lane.chat_id, Some(&thread.chat_id));
        changes.push(Change::PutChannel(thread.clone()));
        changes.push(Change::Outbox(
            Frame::channel_entry("channel.created", &thread).encode(),
        ));
    }
    {
        let st = hub.state.borrow();
        if let Some(ls) = st.lanes.get(&lane) {
            if ls.running && ls.queue.len() >= limits.lane_queue_depth {
                return Err((
                    ErrorCode::RateLimited,
                    format!(
                        "{} messages are already waiting for the agent in this conversation (limits.lane_queue_depth); wait for a reply",
                        ls.queue.len()
                    ),
                ));
            }
        }
    }
    let message = HistoryMessage {
        message_id: ids::message_id(),
        role: Role::User,
        text: req.text,
        reasoning: None,
        model: None,
        tokens: None,
        runtime: None,
        ts: ids::now_ms(),
        media,
    };
    let mut echo = Frame::message(&message).in_lane(&lane.chat_id, lane.thread());
    if let Some(r) = req
        .reply_to
        .as_deref()
        .filter(|r| crate::protocol::is_valid_id(r))
    {
        echo.payload["reply_to"] = serde_json::json!(r);
    }
    changes.push(Change::PutMessage(lane.clone(), message.clone()));
    changes.push(Change::OutboxOf {
        message_id: message.message_id.clone(),
        frame: echo.encode(),
    });
    changes.push(Change::BeginTurn(PendingTurn {
        user_message_id: message.message_id.clone(),
        lane: lane.clone(),
        text: message.text.clone(),
    }));
    let receipt =
        Frame::read_receipt(id, &message.message_id).in_lane(&lane.chat_id, lane.thread());
    hub.commit(
        changes,
        Some(Origin {
            conn: outlet.conn_id,
            before: Some(receipt),
            reply: None,
        }),
    )
    .await
    .map_err(|e| (ErrorCode::Internal, e.0))?;
    enqueue_turn(
        hub,
        lane,
        QueuedTurn {
            user_message_id: message.message_id,
            text: message.text,
            media: message.media,
        },
    );
    Ok(())
}

/// Queues a gateway-originated prompt (a cron job) in an automation lane. Its answer is stored
/// with role `cron` and announced with a `notification{kind:cron}` titled `title`.
pub(super) fn enqueue_automation(hub: &Rc<Hub>, lane: Lane, prompt: String, title: String) {
    let _ = title;
    enqueue_turn(
        hub,
        lane,
        QueuedTurn {
            user_message_id: ids::time_ordered("cron"),
            text: prompt,
            media: Vec::new(),
        },
    );
}

/// Resolves a device's upload refs to the stored files they name.
fn attachments(hub: &Hub, device_id: &str, refs: &[String]) -> Result<Vec<MediaRef>, Refusal> {
    let max = hub.limits().max_media_per_message;
    if refs.len() > max {
        return Err((
            ErrorCode::Unsupported,
            format!("at most {max} attachments per message (limits.max_media_per_message)"),
        ));
    }
    let mut out = Vec::new();
    for r in refs {
        let record = hub
            .store
            .media_by_ref(device_id, r)
            .map_err(super::internal)?
            .ok_or_else(|| {
                (
                    ErrorCode::NotFound,
                    format!(
                        "media_ref `{}` is not an upload of this device (upload it first)",
                        r.chars().take(64).collect::<String>()
                    ),
                )
            })?;
        out.push(record.to_ref(None));
    }
    Ok(out)
}

/// A thread title from the first line of a message, cut at a word boundary.
fn auto_title(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.chars().count() <= AUTO_TITLE_CHARS {
        return line.to_owned();
    }
    let cut: String = line.chars().take(AUTO_TITLE_CHARS).collect();
    let cut = match cut.rfind(' ') {
        Some(i) if i > AUTO_TITLE_CHARS / 2 => &cut[..i],
        _ => cut.as_str(),
    };
    format!("{}\u{2026}", cut.trim_end())
}

fn enqueue_turn(hub: &Rc<Hub>, lane: Lane, turn: QueuedTurn) {
    let start = {
        let mut st = hub.state.borrow_mut();
        let ls = st.lanes.entry(lane.clone()).or_default();
        ls.queue.push_back(turn);
        !std::mem::replace(&mut ls.running, true)
    };
    if start {
        tokio::task::spawn_local(lane_runner(hub.clone(), lane));
    }
}

/// Runs a lane's queued turns one after another, then exits.
async fn lane_runner(hub: Rc<Hub>, lane: Lane) {
    loop {
        let next = {
            let mut st = hub.state.borrow_mut();
            let ls = st.lanes.entry(lane.clone()).or_default();
            match ls.queue.pop_front() {
                Some(t) => t,
                None => {
                    ls.running = false;
                    return;
                }
            }
        };
        if hub.is_shutting_down() {
            // Left pending in the store: the next start closes it as interrupted.
            continue;
        }
        let Ok(_slot) = hub.turn_slots.acquire().await else {
            return;
        };
        run_turn(&hub, &lane, next).await;
    }
}

/// What a turn has produced so far.
#[derive(Default)]
struct TurnText {
    text: String,
    reasoning: String,
    tool_names: HashMap<i64, String>,
    truncated: bool,
    /// Files the agent produced, stored and offered.
    media: Vec<MediaRef>,
}

async fn run_turn(hub: &Rc<Hub>, lane: &Lane, turn: QueuedTurn) {
    let message_id = ids::message_id();
    let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
    hub.broadcast(&Frame::typing(true).in_lane(chat, thread), None);
    hub.broadcast(
        &Frame::message_start(&message_id).in_lane(chat, thread),
        None,
    );
    let (tx, mut rx) = mpsc::channel(16);
    let media = turn
        .media
        .iter()
        .filter_map(|m| {
            let record = hub.store.media(&m.media_id).ok().flatten()?;
            Some((m.clone(), hub.media.blob_path(&record.sha256)))
        })
        .collect();
    let input = TurnInput {
        lane: lane.clone(),
        user_message_id: turn.user_message_id.clone(),
        text: turn.text,
        media,
        session: String::new(),
        history: Vec::new(),
        settings: Default::default(),
    };
    let agent = hub.agent.clone();
    let cancel = Rc::new(tokio::sync::Notify::new());
    {
        let mut st = hub.state.borrow_mut();
        let ls = st.lanes.entry(lane.clone()).or_default();
        ls.cancel = Some(cancel.clone());
        ls.streaming = Some(message_id.clone());
    }
    let mut acc = TurnText::default();
    let consume = async {
        while let Some(event) = rx.recv().await {
            apply_event(hub, lane, &message_id, &mut acc, event).await;
        }
    };
    let outcome = tokio::select! {
        (outcome, ()) = async { tokio::join!(agent.run_turn(input, tx), consume) } => Some(outcome),
        _ = cancel.notified() => None,
    };
    if let Some(ls) = hub.state.borrow_mut().lanes.get_mut(lane) {
        ls.cancel = None;
        ls.streaming = None;
    }
    let summary = match outcome {
        None => {
            // Its conversation or its reply was deleted: keep nothing of it.
            info!(%lane, "turn abandoned: its conversation or reply was deleted");
            let end = vec![Change::EndTurn(turn.user_message_id.clone())];
            if let Err(e) = hub.commit(end, None).await {
                warn!(%lane, "could not close an abandoned turn: {e}");
            }
            hub.broadcast(&Frame::typing(false).in_lane(chat, thread), None);
            return;
        }
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            warn!(%lane, "agent turn failed: {e}");
            if !acc.text.is_empty() {
                acc.text.push_str("\n\n");
            }
            acc.text.push_str(&format!("\u{26a0}\u{fe0f} {e}"));
            TurnSummary::default()
        }
    };
    let reply = HistoryMessage {
        message_id: message_id.clone(),
        role: Role::Assistant,
        text: acc.text,
        reasoning: (!acc.reasoning.is_empty()).then_some(acc.reasoning),
        model: summary.model,
        tokens: summary.tokens,
        runtime: Some(summary.runtime),
        ts: ids::now_ms(),
        media: acc.media,
    };
    finish_turn(hub, lane, &turn.user_message_id, reply, Frame::message_stop).await;
    hub.broadcast(&Frame::typing(false).in_lane(chat, thread), None);
}

/// Commits a turn's final message and closes its pending record, in one transaction.
async fn finish_turn(
    hub: &Hub,
    lane: &Lane,
    user_message_id: &str,
    reply: HistoryMessage,
    frame: fn(&HistoryMessage) -> Frame,
) {
    let mut changes = vec![Change::EndTurn(user_message_id.to_owned())];
    // A lane deleted while its turn ran gets no message (its history is gone too).
    if hub.lane_exists(lane) {
        changes.push(Change::PutMessage(lane.clone(), reply.clone()));
        changes.push(Change::OutboxOf {
            message_id: reply.message_id.clone(),
            frame: frame(&reply).in_lane(&lane.chat_id, lane.thread()).encode(),
        });
    }
    if let Err(e) = hub.commit(changes, None).await {
        warn!(%lane, "could not store the agent's reply: {e}");
    }
}

async fn apply_event(
    hub: &Hub,
    lane: &Lane,
    message_id: &str,
    acc: &mut TurnText,
    event: AgentEvent,
) {
    let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
    match event {
        AgentEvent::Text(delta) => {
            if acc.truncated {
                return;
            }
            if acc.text.len() + delta.len() > MAX_REPLY_BYTES {
                acc.truncated = true;
                acc.text
                    .push_str("\n\n[reply cut: longer than the gateway keeps]");
            } else {
                acc.text.push_str(&delta);
            }
            hub.broadcast(
                &Frame::message_update(message_id, &acc.text).in_lane(chat, thread),
                Some(coalesce_key("message.update", message_id, 0)),
            );
        }
        AgentEvent::Reasoning(delta) => {
            if acc.reasoning.len() + delta.len() <= MAX_REPLY_BYTES {
                acc.reasoning.push_str(&delta);
            }
        }
        AgentEvent::Commentary(text) => {
            hub.broadcast(
                &Frame::commentary(message_id, &text).in_lane(chat, thread),
                None,
            );
        }
        AgentEvent::ToolStart {
            index,
            name,
            preview,
            args,
            emoji,
        } => {
            let f = Frame::tool_start(index, &name, &preview, &args, emoji.as_deref());
            acc.tool_names.insert(index, name);
            hub.broadcast(&f.in_lane(chat, thread), None);
        }
        AgentEvent::ToolProgress { index, note } => {
            let name = acc.tool_names.get(&index).cloned().unwrap_or_default();
            hub.broadcast(
                &Frame::tool_progress(index, &name, &note).in_lane(chat, thread),
                Some(coalesce_key("tool.progress", message_id, index)),
            );
        }
        AgentEvent::ToolEnd {
            index,
            ok,
            duration_secs,
            output_preview,
        } => {
            let name = acc.tool_names.get(&index).cloned().unwrap_or_default();
            let f = Frame::tool_end(index, &name, ok, duration_secs, &output_preview)
                .in_lane(chat, thread);
            // Never dropped, so outboxed: a device that missed the stream still learns the
            // tool's outcome on sync. The turn waits for it to be durable, keeping order.
            let change = Change::OutboxOf {
                message_id: message_id.to_owned(),
                frame: f.encode(),
            };
            if let Err(e) = hub.commit(vec![change], None).await {
                warn!(%lane, "could not store tool.end: {e}");
            }
        }
        AgentEvent::Todos(todos) => hub.set_todos(lane, todos),
        AgentEvent::File {
            filename,
            mime,
            kind,
            bytes,
        } => {
            if let Some(m) = hub
                .store_agent_file(lane, message_id, filename, mime, kind, &bytes)
                .await
            {
                acc.media.push(m);
            }
        }
    }
}

impl Hub {
    /// A lane's todo list changed: remember it (memory and store) and tell every device.
    fn set_todos(&self, lane: &Lane, todos: Vec<TodoItem>) {
        if !self.lane_exists(lane) {
            return;
        }
        self.broadcast(
            &Frame::todo_update(&todos).in_lane(&lane.chat_id, lane.thread()),
            None,
        );
        if let Err(e) = self.store.put_todos(lane, &todos) {
            warn!(%lane, "could not save the todo list: {e}");
        }
        self.state
            .borrow_mut()
            .lanes
            .entry(lane.clone())
            .or_default()
            .todos = todos;
    }

    /// Stores a file the agent produced and offers it to every device (outboxed with the reply,
    /// so deleting the reply withdraws the offer too).
    async fn store_agent_file(
        &self,
        lane: &Lane,
        message_id: &str,
        filename: String,
        mime: String,
        kind: String,
        bytes: &[u8],
    ) -> Option<MediaRef> {
        let (sha256, size) = match self.media.store_bytes(bytes).await {
            Ok(stored) => stored,
            Err(e) => {
                warn!(%lane, "could not store a file from the agent: {e}");
                if e.is_space() {
                    self.set_media_full(Some(e.to_string()));
                }
                return None;
            }
        };
        let record = crate::store::MediaRecord {
            media_id: ids::time_ordered("med"),
            sha256,
            kind: if crate::media::KINDS.contains(&kind.as_str()) {
                kind
            } else {
                "document".into()
            },
            mime,
            size,
            filename: crate::media::clean_filename(&filename),
            created_ms: ids::now_ms(),
        };
        if let Err(e) = self.store.add_media(&record, "", "") {
            warn!(%lane, "could not record a file from the agent: {e}");
            return None;
        }
        let offer = Frame::media_offer(&record.to_ref(Some(message_id)))
            .in_lane(&lane.chat_id, lane.thread());
        let change = Change::OutboxOf {
            message_id: message_id.to_owned(),
            frame: offer.encode(),
        };
        if let Err(e) = self.commit(vec![change], None).await {
            warn!(%lane, "could not offer a file from the agent: {e}");
            return None;
        }
        Some(record.to_ref(None))
    }

    /// Deleted messages take their turns with them: queued turns of deleted user messages are
    /// dropped, and a turn whose reply is deleted while streaming is abandoned (otherwise its
    /// end would store the deleted reply again).
    pub(super) fn drop_turns_of(&self, message_ids: &[String]) {
        for ls in self.state.borrow_mut().lanes.values_mut() {
            ls.queue
                .retain(|t| !message_ids.contains(&t.user_message_id));
            if ls
                .streaming
                .as_ref()
                .is_some_and(|m| message_ids.contains(m))
            {
                if let Some(cancel) = &ls.cancel {
                    cancel.notify_one();
                }
            }
        }
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    fn lane_exists(&self, lane: &Lane) -> bool {
        let exists = |id: &str| matches!(self.store.channel(id), Ok(Some(_)));
        exists(&lane.chat_id) && lane.thread().is_none_or(exists)
    }

    /// Drops everything live about deleted lanes: the running turn is abandoned, queued
    /// messages are closed (they were deleted with the lane's history), the todo list goes.
    pub(super) async fn forget_lanes(&self, gone: impl Fn(&Lane) -> bool) {
        let mut closed = Vec::new();
        let lanes: Vec<Lane> = self
            .state
            .borrow()
            .lanes
            .keys()
            .filter(|l| gone(l))
            .cloned()
            .collect();
        for lane in lanes {
            let _ = self.store.put_todos(&lane, &[]);
            let mut st = self.state.borrow_mut();
            if let Some(ls) = st.lanes.get_mut(&lane) {
                ls.todos.clear();
                closed.extend(
                    ls.queue
                        .drain(..)
                        .map(|t| Change::EndTurn(t.user_message_id)),
                );
                if let Some(cancel) = &ls.cancel {
                    cancel.notify_one();
                }
            }
        }
        if !closed.is_empty() {
            if let Err(e) = self.commit(closed, None).await {
                warn!("could not close the turns of a deleted lane: {e}");
            }
        }
    }

    /// Answers user messages whose turns a previous run never finished (power cut, kill -9):
    /// each gets an assistant message saying so, rather than silence. Runs before listening.
    pub async fn close_interrupted_turns(&self) -> Result<usize, super::CommitError> {
        let pending = self
            .store
            .pending_turns()
            .map_err(|e| super::CommitError(e.to_string()))?;
        let count = pending.len();
        for p in pending {
            info!(lane = %p.lane, message = %p.user_message_id, "closing a turn interrupted by a restart");
            let reply = HistoryMessage {
                message_id: ids::message_id(),
                role: Role::Assistant,
                text: "\u{26a0}\u{fe0f} The gateway restarted before the agent answered this message. Send it again if you still need an answer.".into(),
                reasoning: None,
                model: None,
                tokens: None,
                runtime: Some(Runtime::default()),
                ts: ids::now_ms(),
                media: Vec::new(),
            };
            finish_turn(self, &p.lane, &p.user_message_id, reply, Frame::message).await;
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::auto_title;

    #[test]
    fn auto_titles_are_short_first_lines() {
        assert_eq!(auto_title("  Plan the garden\nmore"), "Plan the garden");
        let long = "word ".repeat(30);
        let t = auto_title(&long);
        assert!(t.chars().count() <= 49 && t.ends_with('\u{2026}'), "{t}");
    }
}
