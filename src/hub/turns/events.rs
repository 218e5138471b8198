//! The event mapping: what the agent streams during a turn becomes frames for every device,
//! each bounded by its share of `limits.max_out_frame_bytes`, and the turn's text, reasoning,
//! tools and files are gathered for its final message.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::agent::AgentEvent;
use crate::ids;
use crate::outlet::{encode_text, StreamedText};
use crate::protocol::fit;
use crate::protocol::{Frame, HistoryMessage, Lane, MediaRef, TodoItem};
use crate::store::{Change, Record};

use super::super::state::coalesce_key;
use super::{TurnPort, Turns};

/// What ends a reply cut at its share of `limits.max_out_frame_bytes` (`OutBudget::text`).
const REPLY_CUT_NOTE: &str = "\n\n[reply cut: longer than the gateway keeps]";

/// A tool's name or emoji, escaped: a label, never a page.
const TOOL_LABEL_BYTES: usize = 256;

/// Todo items the agent sends: each item a line, the list within half a frame.
const TODO_ITEM_BYTES: usize = 1 << 10;

/// What a turn has produced so far.
#[derive(Default)]
pub(super) struct TurnText {
    pub(super) text: String,
    /// Where the current stretch of text began: text streamed before a tool call is the
    /// agent commenting on what it is about to do, so it becomes `commentary` and the answer
    /// restarts here.
    pub(super) segment_start: usize,
    pub(super) reasoning: String,
    /// Escaped (on-the-wire) sizes of `text` and `reasoning`: agent text is budgeted by what
    /// it encodes to, since JSON escaping can grow it sixfold.
    pub(super) text_escaped: usize,
    pub(super) reasoning_escaped: usize,
    pub(super) tool_names: HashMap<i64, String>,
    pub(super) truncated: bool,
    /// Files the agent produced, stored and offered.
    pub(super) media: Vec<MediaRef>,
    /// The user message this turn answers, and the agent's run of it (once it has one).
    pub(super) user_message_id: String,
    pub(super) run_id: Option<String>,
    /// Streamed frames held back until their interval is over.
    pub(super) pacer: Pacer,
    /// The answer as last sent to devices: an update whose text does not extend it starts a
    /// new generation, so append devices get the whole text again.
    pub(super) published: Option<Rc<StreamedText>>,
    /// Steering text the run ended without giving the model (`steer.rs` makes the steers it
    /// came from the lane's next messages).
    pub(super) pending_steer: Option<String>,
}

/// Paces the frames that only carry the latest state (`message.update`, `tool.progress`): per
/// key at most one per `limits.stream_update_ms`, the first at once, and a held one goes out
/// when its interval is over with whatever is newest then. Every device gets the same paced
/// stream (encoded once); a device that reads slower still coalesces in its own queue.
#[derive(Default)]
pub(super) struct Pacer {
    /// When each key last went out.
    sent: HashMap<u64, Instant>,
    /// Keys with a newer state than was sent, in the order they were held.
    held: Vec<(u64, Held)>,
}

/// Which held states `Turns::flush_held` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flush {
    /// Those whose interval is over.
    Due,
    /// All: a frame that must not overtake them is next, and the stream pauses there.
    Settle,
    /// All: the agent's stream ended, so every device ends on the agent's last state (a
    /// whole-text device within its budget; `message.stop` carries the final text anyway).
    End,
}

/// A state waiting for its key's interval to pass.
enum Held {
    /// The answer: what goes out is the turn's text at that moment.
    Answer,
    Progress {
        index: i64,
        name: String,
        note: String,
    },
}

impl Pacer {
    /// Whether `key` may go out now; if so it counts as sent now.
    fn admit(&mut self, key: u64, interval: Duration) -> bool {
        let now = Instant::now();
        let open = self
            .sent
            .get(&key)
            .is_none_or(|last| now.duration_since(*last) >= interval);
        if open {
            self.sent.insert(key, now);
            self.held.retain(|(k, _)| *k != key);
        }
        open
    }

    fn hold(&mut self, key: u64, state: Held) {
        match self.held.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = state,
            None => self.held.push((key, state)),
        }
    }

    /// When the earliest held state is due, if one is held.
    pub(super) fn next_due(&self, interval: Duration) -> Option<Instant> {
        self.held
            .iter()
            .filter_map(|(k, _)| self.sent.get(k))
            .min()
            .map(|last| *last + interval)
    }

    /// Takes the held states that are due (all of them with `all`), marking them sent now.
    fn take_due(&mut self, interval: Duration, all: bool) -> Vec<(u64, Held)> {
        let now = Instant::now();
        let sent = &self.sent;
        let (due, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.held)
                .into_iter()
                .partition(|(k, _)| {
                    all || sent
                        .get(k)
                        .is_none_or(|last| now.duration_since(*last) >= interval)
                });
        self.held = keep;
        for (k, _) in &due {
            self.sent.insert(*k, now);
        }
        due
    }
}

impl TurnText {
    /// Adds streamed answer text within `budget` (escaped bytes); `false` when nothing changed:
    /// the answer was already cut, or a stretch after a tool starts with blank lines only.
    fn push_text(&mut self, delta: String, budget: usize) -> bool {
        if self.truncated {
            return false;
        }
        // A stretch after a tool starts fresh: no blank lines carried over from the split.
        let delta = if self.text.len() == self.segment_start {
            delta.trim_start().to_owned()
        } else {
            delta
        };
        if delta.is_empty() {
            return false;
        }
        self.truncated = fit::push_within(
            &mut self.text,
            &mut self.text_escaped,
            &delta,
            budget,
            REPLY_CUT_NOTE,
        );
        true
    }

    /// Reasoning past its share is left out silently: the answer is what matters.
    fn push_reasoning(&mut self, delta: &str, budget: usize) {
        fit::push_within(
            &mut self.reasoning,
            &mut self.reasoning_escaped,
            delta,
            budget,
            "",
        );
    }

    /// At a tool call, text streamed since the last one was the agent saying what it is about
    /// to do: it leaves the answer and is returned as commentary. The answer restarts here.
    fn take_commentary(&mut self) -> Option<String> {
        let said = self.text[self.segment_start..].trim().to_owned();
        let taken = (!said.is_empty() && !self.truncated).then(|| {
            self.text.truncate(self.segment_start);
            self.text_escaped = fit::escaped_len(&self.text);
            said
        });
        self.segment_start = self.text.len();
        taken
    }
}

impl<P: TurnPort> Turns<P> {
    /// Applies one agent event to the running turn: frames to every device, and what the reply keeps.
    pub(super) async fn apply_event(
        &self,
        lane: &Lane,
        message_id: &str,
        acc: &mut TurnText,
        event: AgentEvent,
    ) {
        let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
        // What follows a held state in the stream (a tool, a plan, a file, commentary) must not
        // overtake it, so it goes first; text, reasoning and progress only wait their turn,
        // and the states that are due go after them, so a due one carries this event too
        // (flushed before, it would go out a delta stale and hold this one an interval).
        let paced = matches!(
            event,
            AgentEvent::Text(_) | AgentEvent::Reasoning(_) | AgentEvent::ToolProgress { .. }
        );
        if !paced {
            self.flush_held(lane, message_id, acc, Flush::Settle);
        }
        self.apply_event_frames(lane, message_id, acc, event, chat, thread)
            .await;
        if paced {
            self.flush_held(lane, message_id, acc, Flush::Due);
        }
    }

    async fn apply_event_frames(
        &self,
        lane: &Lane,
        message_id: &str,
        acc: &mut TurnText,
        event: AgentEvent,
        chat: &str,
        thread: Option<&str>,
    ) {
        match event {
            AgentEvent::Text(delta) => self.push_answer(lane, message_id, acc, delta),
            AgentEvent::Reasoning(delta) => {
                acc.push_reasoning(&delta, self.hub().out_budget().reasoning)
            }
            AgentEvent::Commentary(mut text) => {
                fit::cut_in_place(&mut text, self.hub().out_budget().text);
                self.hub().broadcast(
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
                if let Some(said) = acc.take_commentary() {
                    self.hub().broadcast(
                        &Frame::commentary(message_id, &said).in_lane(chat, thread),
                        None,
                    );
                    // The answer lost its last stretch: said at once, not paced.
                    acc.pacer.admit(
                        coalesce_key("message.update", message_id, 0),
                        Duration::ZERO,
                    );
                    self.broadcast_answer(lane, message_id, acc, true);
                }
                let (name, preview, args, emoji) = self.bounded_tool(name, preview, args, emoji);
                let f = Frame::tool_start(index, &name, &preview, &args, emoji.as_deref());
                acc.tool_names.insert(index, name);
                self.hub().broadcast(&f.in_lane(chat, thread), None);
            }
            AgentEvent::ToolProgress { index, mut note } => {
                fit::cut_in_place(&mut note, fit::PREVIEW_BYTES);
                let name = acc.tool_names.get(&index).cloned().unwrap_or_default();
                let key = coalesce_key("tool.progress", message_id, index);
                if acc.pacer.admit(key, self.update_interval()) {
                    self.hub().broadcast(
                        &Frame::tool_progress(index, &name, &note).in_lane(chat, thread),
                        Some(key),
                    );
                } else {
                    acc.pacer.hold(key, Held::Progress { index, name, note });
                }
            }
            AgentEvent::ToolEnd {
                index,
                ok,
                duration_secs,
                mut output_preview,
            } => {
                fit::cut_in_place(&mut output_preview, fit::PREVIEW_BYTES);
                let name = acc.tool_names.get(&index).cloned().unwrap_or_default();
                let f = Frame::tool_end(index, &name, ok, duration_secs, &output_preview)
                    .in_lane(chat, thread);
                self.outbox_tool_end(lane, message_id, f).await;
            }
            AgentEvent::Todos(todos) => self.set_todos(lane, todos),
            AgentEvent::RunStarted(run_id) => self.run_started(lane, acc, run_id).await,
            AgentEvent::Approval(request) => match acc.run_id.clone() {
                Some(run_id) => self.hub().offer_approval(lane, &run_id, request).await,
                None => warn!(%lane, "an approval request outside a run was ignored"),
            },
            AgentEvent::ApprovalExpired => {
                if let Some(run_id) = acc.run_id.clone() {
                    self.hub().approval_expired(&run_id).await;
                }
            }
            AgentEvent::PendingSteer(text) => acc.pending_steer = Some(text),
            AgentEvent::JobMade(job_id) => self.hub().job_made(lane, job_id).await,
            AgentEvent::File {
                filename,
                mime,
                kind,
                bytes,
            } => {
                let name = crate::media::clean_filename(&filename);
                match self
                    .store_agent_file(lane, message_id, filename, mime, kind, &bytes)
                    .await
                {
                    Ok(m) => acc.media.push(m),
                    // Said where the file would have been: nothing is lost without a word.
                    Err(why) => {
                        let line_start = acc.text.is_empty() || acc.text.ends_with('\n');
                        let sep = if line_start { "" } else { "\n" };
                        let note =
                            format!("{sep}[file not sent: {name} could not be kept: {why}]\n");
                        self.push_answer(lane, message_id, acc, note);
                    }
                }
            }
        }
    }

    /// Adds `text` to the answer and sends the update now, or holds it for the pacer when one
    /// went out less than `limits.stream_update_ms` ago (the held one carries everything).
    fn push_answer(&self, lane: &Lane, message_id: &str, acc: &mut TurnText, text: String) {
        if acc.push_text(text, self.hub().out_budget().text) {
            let key = coalesce_key("message.update", message_id, 0);
            if acc.pacer.admit(key, self.update_interval()) {
                self.broadcast_answer(lane, message_id, acc, false);
            } else {
                acc.pacer.hold(key, Held::Answer);
            }
        }
    }

    /// `limits.stream_update_ms`: the least time between two updates of one message.
    pub(super) fn update_interval(&self) -> Duration {
        Duration::from_millis(self.hub().config().limits.stream_update_ms)
    }

    /// Sends the held states that `how` asks for. The turn's loop calls it when
    /// `Pacer::next_due` passes, and at the end of the agent's stream.
    pub(super) fn flush_held(&self, lane: &Lane, message_id: &str, acc: &mut TurnText, how: Flush) {
        if acc.pacer.held.is_empty() {
            return;
        }
        let all = how != Flush::Due;
        for (key, held) in acc.pacer.take_due(self.update_interval(), all) {
            match held {
                Held::Answer => self.broadcast_answer(lane, message_id, acc, how == Flush::Settle),
                Held::Progress { index, name, note } => self.hub().broadcast(
                    &Frame::tool_progress(index, &name, &note)
                        .in_lane(&lane.chat_id, lane.thread()),
                    Some(key),
                ),
            }
        }
    }

    /// The answer so far, to every device; a newer one replaces an unsent older one. Each
    /// device's writer turns it into the form the device asked for (`Outlet::render_update`).
    /// `settles`: the stream pauses after it (see `StreamedText::settles`).
    fn broadcast_answer(&self, lane: &Lane, message_id: &str, acc: &mut TurnText, settles: bool) {
        let generation = match &acc.published {
            Some(p) if acc.text.starts_with(p.text.as_str()) => p.generation,
            Some(p) => p.generation + 1,
            None => 1,
        };
        let full =
            Frame::message_update(message_id, &acc.text).in_lane(&lane.chat_id, lane.thread());
        let streamed = Rc::new(StreamedText {
            message_id: message_id.to_owned(),
            chat_id: lane.chat_id.clone(),
            thread_id: lane.thread_id.clone(),
            generation,
            text: acc.text.clone(),
            full: encode_text(full.encode()),
            settles,
        });
        let key = coalesce_key("message.update", message_id, 0);
        self.hub().broadcast_answer(key, &streamed);
        acc.published = Some(streamed);
    }

    /// `tool.end` is never dropped, so it is outboxed: a device that missed the stream still
    /// learns the tool's outcome on sync. The turn waits for it to be durable, keeping order.
    async fn outbox_tool_end(&self, lane: &Lane, message_id: &str, frame: Frame) {
        let change = Change::OutboxOf {
            message_id: message_id.to_owned(),
            frame: frame.outboxed(),
        };
        if let Err(e) = self.hub().commit(vec![change]).await {
            warn!(%lane, "could not store tool.end: {e}");
        }
    }

    /// The agent took the turn as a run: recorded durably before anything else happens in it,
    /// since a restart must find it (to follow it, never to hand the message over again).
    async fn run_started(&self, lane: &Lane, acc: &mut TurnText, run_id: String) {
        let record = crate::store::RunRecord {
            user_message_id: acc.user_message_id.clone(),
            lane: lane.clone(),
            run_id: run_id.clone(),
        };
        if let Err(e) = self
            .hub()
            .commit(vec![Change::Record(Record::PutRun(record))])
            .await
        {
            warn!(%lane, "could not store the agent's run (a restart will not find it): {e}");
        }
        self.lanes.set_run(lane, Some(run_id.clone()));
        acc.run_id = Some(run_id);
    }

    /// A tool call as the agent described it, cut to what a `tool.start` may carry: a preview is a
    /// glance ([`fit::PREVIEW_BYTES`]), the name and emoji are labels, and the arguments (any JSON
    /// the agent sent) get half a frame, their longest strings cut first.
    pub(super) fn bounded_tool(
        &self,
        mut name: String,
        mut preview: String,
        mut args: serde_json::Value,
        mut emoji: Option<String>,
    ) -> (String, String, serde_json::Value, Option<String>) {
        fit::cut_in_place(&mut name, TOOL_LABEL_BYTES);
        fit::cut_in_place(&mut preview, fit::PREVIEW_BYTES);
        if let Some(e) = emoji.as_mut() {
            fit::cut_in_place(e, TOOL_LABEL_BYTES);
        }
        if !fit::shrink_value(&mut args, self.hub().out_budget().content / 2) {
            args = serde_json::json!({});
        }
        (name, preview, args, emoji)
    }

    /// A fresh conversation has no plan yet.
    pub(in crate::hub) fn clear_todos(&self, lane: &Lane) {
        if self.lanes.has_todos(lane) {
            self.set_todos(lane, Vec::new());
        }
    }

    /// A lane's todo list changed: remember it (memory and store) and tell every device.
    pub(super) fn set_todos(&self, lane: &Lane, mut todos: Vec<TodoItem>) {
        if !self.hub().lane_exists(lane) {
            return;
        }
        // The list goes out whole in one `todo.update` (and after every hello): bounded per
        // item and in all, the first items kept.
        let mut used = 0;
        let budget = self.hub().out_budget().content / 2;
        todos.retain_mut(|t| {
            fit::cut_in_place(&mut t.content, TODO_ITEM_BYTES);
            fit::cut_in_place(&mut t.id, TOOL_LABEL_BYTES);
            used += fit::escaped_len(&t.content) + fit::escaped_len(&t.id) + 64;
            used <= budget
        });
        self.hub().broadcast(
            &Frame::todo_update(&todos).in_lane(&lane.chat_id, lane.thread()),
            None,
        );
        // Stored with the turn's end (`finish_turn`), not at every update: `todo.update` is
        // ephemeral, and the saved copy only lets a restarted gateway give a better snapshot
        // than none, so a turn's plan costs no SD-card write of its own.
        self.lanes.set_todos(lane, todos);
    }

    /// Stores the files the agent named for `message`, a finished answer that did not stream
    /// (a recovered turn, a scheduled job's run), and lists them on it; a file that cannot be
    /// kept is named in its text instead.
    pub(in crate::hub) async fn attach_agent_files(
        &self,
        lane: &Lane,
        message: &mut HistoryMessage,
        files: Vec<AgentEvent>,
    ) {
        for file in files {
            if let AgentEvent::File {
                filename,
                mime,
                kind,
                bytes,
            } = file
            {
                let name = crate::media::clean_filename(&filename);
                let stored = self
                    .store_agent_file(lane, &message.message_id, filename, mime, kind, &bytes)
                    .await;
                match stored {
                    Ok(m) => message.media.push(m),
                    Err(why) => message.text.push_str(&format!(
                        "\n[file not sent: {name} could not be kept: {why}]"
                    )),
                }
            }
        }
    }

    /// Stores a file the agent produced and offers it to every device (outboxed with the reply,
    /// so deleting the reply withdraws the offer too). `Err`: why it could not be, for the user.
    pub(super) async fn store_agent_file(
        &self,
        lane: &Lane,
        message_id: &str,
        filename: String,
        mime: String,
        kind: String,
        bytes: &[u8],
    ) -> Result<MediaRef, String> {
        let (sha256, size) = match self.hub().media().store_bytes(bytes).await {
            Ok(stored) => stored,
            Err(e) => {
                warn!(%lane, "could not store a file from the agent: {e}");
                if e.is_space() {
                    self.hub().set_media_full(Some(e.to_string()));
                }
                return Err(e.to_string());
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
        let offer = Frame::media_offer(&record.to_ref(Some(message_id)))
            .in_lane(&lane.chat_id, lane.thread());
        // The record and its offer in one commit: an offer never names a file the store lacks.
        let changes = vec![
            Change::AddMedia {
                record: record.clone(),
                device_id: String::new(),
                media_ref: String::new(),
            },
            Change::OutboxOf {
                message_id: message_id.to_owned(),
                frame: offer.outboxed(),
            },
        ];
        if let Err(e) = self.hub().commit(changes).await {
            warn!(%lane, "could not offer a file from the agent: {e}");
            return Err(e.to_string());
        }
        Ok(record.to_ref(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_state_goes_at_once_and_later_ones_wait_for_their_interval() {
        let interval = Duration::from_secs(60);
        let mut p = Pacer::default();
        assert!(p.admit(1, interval), "the first update is never held");
        assert!(!p.admit(1, interval));
        assert!(p.admit(2, interval), "another key has its own interval");
        assert!(p.next_due(interval).is_none(), "nothing held yet");
        p.hold(1, Held::Answer);
        p.hold(
            1,
            Held::Progress {
                index: 0,
                name: "t".into(),
                note: "newest".into(),
            },
        );
        // One held state per key, the newest.
        assert_eq!(p.held.len(), 1);
        let due = p.next_due(interval).expect("a held state has a deadline");
        assert!(due > Instant::now() + Duration::from_secs(59));
        assert!(p.take_due(interval, false).is_empty(), "not due yet");
        let flushed = p.take_due(interval, true);
        assert!(matches!(&flushed[..], [(1, Held::Progress { note, .. })] if note == "newest"));
        assert!(p.held.is_empty());
        // With no interval every state goes at once.
        assert!(p.admit(1, Duration::ZERO));
    }
}
