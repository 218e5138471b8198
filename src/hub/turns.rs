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
use crate::agent::{
    AgentError, AgentEvent, PastMessage, Recovery, RunState, TurnInput, TurnSummary,
};
use crate::ids;
use crate::outlet::Outlet;
use crate::protocol::fit;
use crate::protocol::{
    Frame, HistoryMessage, Lane, MediaRef, MessageSend, Role, Runtime, TodoItem,
};
use crate::store::{AgentSession, Change, PendingTurn, StoreError};

/// Longest auto-thread title derived from the first message.
const AUTO_TITLE_CHARS: usize = 48;
/// What ends a reply cut at its share of `limits.max_out_frame_bytes` (`OutBudget::text`).
const REPLY_CUT_NOTE: &str = "\n\n[reply cut: longer than the gateway keeps]";

/// A stored user message (or a cron prompt) waiting for its turn.
#[derive(Debug, Clone)]
pub struct QueuedTurn {
    pub user_message_id: String,
    pub text: String,
    pub media: Vec<MediaRef>,
    /// `Some(title)` for a gateway-originated prompt in an automation channel: its answer is
    /// stored with role `cron` and announced by a `notification` with this title.
    pub automation: Option<String>,
    /// The agent's run of this message, when a restart found it still going: followed, never
    /// handed over again.
    pub resume_run: Option<String>,
}

/// Ends a running turn early. `stop` (from `/stop`) keeps what was streamed so far as the
/// answer; otherwise the turn is abandoned without a trace (its lane or reply was deleted).
#[derive(Default)]
pub struct Abort {
    notify: tokio::sync::Notify,
    stop: std::cell::Cell<bool>,
}

impl Abort {
    pub fn stop(&self) {
        self.stop.set(true);
        self.notify.notify_one();
    }

    pub fn abandon(&self) {
        self.notify.notify_one();
    }
}

impl Hub {
    pub async fn send_message(
        self: &Rc<Self>,
        outlet: &Rc<Outlet>,
        chat_id: Option<String>,
        thread_id: Option<String>,
        id: Option<i64>,
        req: MessageSend,
    ) -> Result<(), Refusal> {
        let limits = self.limits();
        if req.text.len() > limits.max_text_bytes {
            return Err(Refusal::unsupported(format!(
                "message text is {} bytes; the limit is {} (limits.max_text_bytes)",
                req.text.len(),
                limits.max_text_bytes
            )));
        }
        // Raw bytes understate the wire: the echo, history and sync all carry the text escaped.
        let escaped = fit::escaped_len(&req.text);
        let text_budget = self.out_budget().text;
        if escaped > text_budget {
            return Err(Refusal::unsupported(format!(
                "message text is {escaped} bytes once JSON-escaped (a control character takes six); \
                 frames the gateway sends must fit limits.max_out_frame_bytes, which leaves {text_budget} for a message's text"
            )));
        }
        let media = self.attachments(&outlet.device_id, &req.media_refs)?;
        if req.text.trim().is_empty() && media.is_empty() {
            return Err(Refusal::unsupported("an empty message has nothing to send"));
        }
        let (mut lane, root) = self.resolve_lane(chat_id.as_deref(), thread_id.as_deref())?;
        if root.automation {
            return Err(Refusal::unsupported(format!(
                "`{}` is an automation channel: it only receives gateway output",
                root.name
            )));
        }
        let command = super::commands::parse(&req.text);
        let mut changes = Vec::new();
        let wants_thread = req.auto_thread
            && root.is_default
            && lane.thread_id.is_none()
            && !req.text.trim_start().starts_with('/');
        // A directory with no room left for another entry (its icons fill the hello.ack budget)
        // keeps the message in the default lane rather than refusing it.
        let thread = wants_thread
            .then(|| channels::new_thread(&lane.chat_id, auto_title(&req.text), true))
            .filter(|t| self.directory_room(std::slice::from_ref(t)).is_ok());
        if let Some(thread) = thread {
            lane = Lane::new(&lane.chat_id, Some(&thread.chat_id));
            changes.push(Change::PutChannel(thread.clone()));
            changes.push(Change::Outbox(
                Frame::channel_entry("channel.created", &thread).encode(),
            ));
        }
        if command.is_none() {
            let st = self.state.borrow();
            if let Some(ls) = st.lanes.get(&lane) {
                if ls.running && ls.queue.len() >= limits.lane_queue_depth {
                    return Err(Refusal::rate_limited(format!(
                        "{} messages are already waiting for the agent in this conversation (limits.lane_queue_depth); wait for a reply",
                        ls.queue.len()
                    )));
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
        if command.is_none() {
            changes.push(Change::BeginTurn(PendingTurn {
                user_message_id: message.message_id.clone(),
                lane: lane.clone(),
                text: message.text.clone(),
            }));
        }
        let receipt =
            Frame::read_receipt(id, &message.message_id).in_lane(&lane.chat_id, lane.thread());
        self.commit(
            changes,
            Some(Origin {
                conn: outlet.conn_id,
                before: Some(receipt),
                reply: None,
            }),
        )
        .await?;
        if let Some(command) = command {
            // Answered by the gateway itself, never sent to the agent.
            self.execute_command(&lane, command).await;
            return Ok(());
        }
        self.enqueue_turn(
            lane,
            QueuedTurn {
                user_message_id: message.message_id,
                text: message.text,
                media: message.media,
                automation: None,
                resume_run: None,
            },
        );
        Ok(())
    }

    /// Queues a gateway-originated prompt (a cron job) in an automation lane. Its answer is stored
    /// with role `cron` and announced with a `notification{kind:cron}` titled `title`.
    pub(super) fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String) {
        self.enqueue_turn(
            lane,
            QueuedTurn {
                user_message_id: ids::time_ordered("cron"),
                text: prompt,
                media: Vec::new(),
                automation: Some(title),
                resume_run: None,
            },
        );
    }

    /// Resolves a device's upload refs to the stored files they name.
    fn attachments(&self, device_id: &str, refs: &[String]) -> Result<Vec<MediaRef>, Refusal> {
        let max = self.limits().max_media_per_message;
        if refs.len() > max {
            return Err(Refusal::unsupported(format!(
                "at most {max} attachments per message (limits.max_media_per_message)"
            )));
        }
        let mut out = Vec::new();
        for r in refs {
            let record = self
                .store
                .media_by_ref(device_id, r)
                .map_err(Refusal::internal)?
                .ok_or_else(|| {
                    Refusal::not_found(format!(
                        "media_ref `{}` is not an upload of this device (upload it first)",
                        r.chars().take(64).collect::<String>()
                    ))
                })?;
            out.push(record.to_ref(None));
        }
        Ok(out)
    }
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

impl Hub {
    fn enqueue_turn(self: &Rc<Self>, lane: Lane, turn: QueuedTurn) {
        let start = {
            let mut st = self.state.borrow_mut();
            let ls = st.lanes.entry(lane.clone()).or_default();
            ls.queue.push_back(turn);
            !std::mem::replace(&mut ls.running, true)
        };
        if start {
            tokio::task::spawn_local(self.clone().lane_runner(lane));
        }
    }

    /// Runs a lane's queued turns one after another, then exits.
    async fn lane_runner(self: Rc<Self>, lane: Lane) {
        loop {
            let next = {
                let mut st = self.state.borrow_mut();
                let ls = st.lanes.entry(lane.clone()).or_default();
                match ls.queue.pop_front() {
                    Some(t) => t,
                    None => {
                        ls.running = false;
                        return;
                    }
                }
            };
            if self.is_shutting_down() {
                // Left pending in the store: the next start closes it as interrupted.
                continue;
            }
            let Ok(_slot) = self.turn_slots.acquire().await else {
                return;
            };
            self.run_turn(&lane, next).await;
        }
    }
}

/// What a turn has produced so far.
#[derive(Default)]
struct TurnText {
    text: String,
    /// Where the current stretch of text began: text streamed before a tool call is the
    /// agent commenting on what it is about to do, so it becomes `commentary` and the answer
    /// restarts here.
    segment_start: usize,
    reasoning: String,
    /// Escaped (on-the-wire) sizes of `text` and `reasoning`: agent text is budgeted by what
    /// it encodes to, since JSON escaping can grow it sixfold.
    text_escaped: usize,
    reasoning_escaped: usize,
    tool_names: HashMap<i64, String>,
    truncated: bool,
    /// Files the agent produced, stored and offered.
    media: Vec<MediaRef>,
    /// The user message this turn answers, and the agent's run of it (once it has one).
    user_message_id: String,
    run_id: Option<String>,
}

/// How one attempt to run a turn ended.
enum Attempt {
    Done(Result<TurnSummary, AgentError>),
    /// `/stop`: keep what was streamed.
    Stopped,
    /// The lane or the reply was deleted: keep nothing.
    Abandoned,
}

/// A gap long enough between tries that a flapping agent is not hammered, short enough that
/// a message is answered soon after the agent is back.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

impl Hub {
    async fn run_turn(self: &Rc<Self>, lane: &Lane, turn: QueuedTurn) {
        let message_id = ids::message_id();
        let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
        let started = tokio::time::Instant::now();
        // Registered before the first await, so a `/stop` or a deletion of the reply that arrives
        // while the turn is still getting ready is not missed.
        let abort = Rc::new(Abort::default());
        {
            let mut st = self.state.borrow_mut();
            let ls = st.lanes.entry(lane.clone()).or_default();
            ls.abort = Some(abort.clone());
            ls.streaming = Some(message_id.clone());
        }
        self.broadcast(&Frame::typing(true).in_lane(chat, thread), None);
        self.broadcast(
            &Frame::message_start(&message_id).in_lane(chat, thread),
            None,
        );
        let media = turn
            .media
            .iter()
            .filter_map(|m| {
                let record = self.store.media(&m.media_id).ok().flatten()?;
                Some((m.clone(), self.media.blob_path(&record.sha256)))
            })
            .collect();
        let session = self.lane_session(lane).await;
        let input = TurnInput {
            lane: lane.clone(),
            user_message_id: turn.user_message_id.clone(),
            text: turn.text.clone(),
            media,
            history: self.past_messages(lane, &session, &turn.user_message_id),
            session: session.session_id,
            settings: self.state.borrow().agent_settings.clone(),
            resume_run: turn.resume_run.clone(),
        };
        let agent_config = &self.config.agent;
        let wait_limit = std::time::Duration::from_secs(agent_config.unreachable_wait_secs);
        let turn_limit = std::time::Duration::from_secs(agent_config.turn_timeout_secs);
        let mut acc = TurnText {
            user_message_id: turn.user_message_id.clone(),
            run_id: turn.resume_run.clone(),
            ..TurnText::default()
        };
        if let Some(ls) = self.state.borrow_mut().lanes.get_mut(lane) {
            ls.run_id = turn.resume_run.clone();
        }
        let mut told_waiting = false;
        let outcome = loop {
            let attempt = self
                .attempt_turn(lane, &message_id, &mut acc, &input, &abort, turn_limit)
                .await;
            let Attempt::Done(Err(e)) = &attempt else {
                break attempt;
            };
            if e.agent_is_down() {
                self.agent_unusable(e);
            }
            let waited = started.elapsed();
            if !e.not_handed_over() || !acc.text.is_empty() || waited >= wait_limit {
                break attempt;
            }
            // Never reached the agent: safe to wait for it and try again.
            if !told_waiting {
                told_waiting = true;
                let note = format!(
                    "{e}. Your message is kept and will be answered when the agent is back."
                );
                self.broadcast(
                    &Frame::commentary(&message_id, &note).in_lane(chat, thread),
                    None,
                );
            }
            let pause = match e {
                AgentError::Busy {
                    retry_after: Some(d),
                    ..
                } => *d,
                _ => RETRY_PAUSE,
            }
            .min(wait_limit.saturating_sub(waited))
            .max(std::time::Duration::from_millis(100));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.agent_back.notified() => {}
                _ = abort.notify.notified() => break if abort.stop.get() { Attempt::Stopped } else { Attempt::Abandoned },
            }
            if self.is_shutting_down() {
                break Attempt::Abandoned;
            }
        };
        let outcome = match outcome {
            // Stopping for a restart: the run goes on at the agent, and the next start follows it.
            Attempt::Abandoned if self.is_shutting_down() => {
                self.broadcast(&Frame::typing(false).in_lane(chat, thread), None);
                return;
            }
            other => other,
        };
        if let Some(ls) = self.state.borrow_mut().lanes.get_mut(lane) {
            ls.abort = None;
            ls.streaming = None;
            ls.run_id = None;
        }
        if let Some(run_id) = acc.run_id.clone() {
            self.settle_run(&run_id, &outcome).await;
        }
        let summary = match outcome {
            Attempt::Abandoned => {
                // Its conversation or its reply was deleted (or the gateway is stopping, and the
                // next start settles it): keep nothing of it.
                info!(%lane, "turn abandoned");
                if !self.is_shutting_down() {
                    let end = vec![Change::EndTurn(turn.user_message_id.clone())];
                    if let Err(e) = self.commit(end, None).await {
                        warn!(%lane, "could not close an abandoned turn: {e}");
                    }
                    self.forget_run(&turn.user_message_id);
                }
                self.broadcast(&Frame::typing(false).in_lane(chat, thread), None);
                return;
            }
            Attempt::Stopped => {
                info!(%lane, "turn stopped by /stop");
                if !acc.text.is_empty() {
                    acc.text.push_str("\n\n");
                }
                acc.text.push_str("\u{23f9}\u{fe0f} Stopped.");
                TurnSummary::default()
            }
            Attempt::Done(Ok(s)) => {
                self.agent_usable();
                s
            }
            Attempt::Done(Err(e)) => {
                warn!(%lane, "agent turn failed: {e}");
                if !acc.text.is_empty() {
                    acc.text.push_str("\n\n");
                }
                acc.text
                    .push_str(&format!("\u{26a0}\u{fe0f} {}", failure_text(&e)));
                TurnSummary::default()
            }
        };
        let model = summary.model.as_deref().map(bare_model);
        let runtime = Runtime {
            model: model.clone(),
            latency: Some((started.elapsed().as_secs_f64() * 100.0).round() / 100.0),
            ..summary.runtime
        };
        let reply = HistoryMessage {
            message_id: message_id.clone(),
            role: if turn.automation.is_some() {
                Role::Cron
            } else {
                Role::Assistant
            },
            text: acc.text,
            reasoning: (!acc.reasoning.is_empty()).then_some(acc.reasoning),
            model,
            tokens: summary.tokens,
            runtime: Some(runtime),
            ts: ids::now_ms(),
            media: acc.media,
        };
        let notice = turn.automation.as_deref().map(|title| {
            let body: String = reply.text.chars().take(200).collect();
            Frame::notification("cron", title, &body, reply.ts).in_lane(chat, thread)
        });
        self.finish_turn(
            lane,
            &turn.user_message_id,
            reply,
            Frame::message_stop,
            notice,
        )
        .await;
        self.forget_run(&turn.user_message_id);
        self.broadcast(&Frame::typing(false).in_lane(chat, thread), None);
    }

    /// A turn with a run at the agent is over: a run the gateway gave up on (stopped, timed out,
    /// its lane deleted) is stopped at the agent too, since closing its events stream does not
    /// stop it; and an approval still open for it is closed, saying why.
    async fn settle_run(self: &Rc<Self>, run_id: &str, outcome: &Attempt) {
        let gave_up = matches!(
            outcome,
            Attempt::Stopped | Attempt::Abandoned | Attempt::Done(Err(AgentError::TimedOut(_)))
        );
        if gave_up {
            let (hub2, id) = (self.clone(), run_id.to_owned());
            tokio::task::spawn_local(async move { hub2.agent.stop_run(&id).await });
        }
        let stopped = matches!(outcome, Attempt::Stopped);
        self.close_approvals_of(run_id, |command| {
            if stopped {
                format!("The task was stopped: Hermes did not run `{command}`.")
            } else {
                format!("The agent's turn ended: the approval for `{command}` is no longer open.")
            }
        })
        .await;
    }

    /// One try at a turn: runs the agent and applies its events until it ends, the time limit
    /// passes, or the turn is stopped.
    async fn attempt_turn(
        self: &Rc<Self>,
        lane: &Lane,
        message_id: &str,
        acc: &mut TurnText,
        input: &TurnInput,
        abort: &Abort,
        limit: std::time::Duration,
    ) -> Attempt {
        let (tx, mut rx) = mpsc::channel(16);
        let agent = self.agent.clone();
        let run = agent.run_turn(input.clone(), tx);
        let consume = async {
            while let Some(event) = rx.recv().await {
                self.apply_event(lane, message_id, acc, event).await;
            }
        };
        let both = async { tokio::join!(run, consume).0 };
        tokio::select! {
            done = tokio::time::timeout(limit, both) => Attempt::Done(
                done.unwrap_or(Err(AgentError::TimedOut(limit.as_secs())))
            ),
            _ = abort.notify.notified() => if abort.stop.get() { Attempt::Stopped } else { Attempt::Abandoned },
        }
    }
}

/// What the user reads when a turn fails: what happened, and what to do about it.
fn failure_text(e: &AgentError) -> String {
    match e {
        AgentError::Unreachable(_) | AgentError::Busy { .. } => format!(
            "{e}. The gateway waited agent.unreachable_wait_secs for it; send the message again once it is back."
        ),
        AgentError::Interrupted(_) => format!(
            "{e}. The answer above may be incomplete; the agent was not asked again."
        ),
        _ => e.to_string(),
    }
}

/// `openai/gpt-5.4` → `gpt-5.4`: the app shows bare model names.
fn bare_model(model: &str) -> String {
    model.rsplit('/').next().unwrap_or(model).to_owned()
}

impl Hub {
    /// Commits a turn's final message (and its notification, for automation turns) and closes
    /// its pending record, in one transaction.
    async fn finish_turn(
        &self,
        lane: &Lane,
        user_message_id: &str,
        reply: HistoryMessage,
        frame: fn(&HistoryMessage) -> Frame,
        notice: Option<Frame>,
    ) {
        // Built within budget as it streamed; this catches what was not (an error text, a
        // partial answer recovered after a restart).
        let mut reply = reply;
        fit::fit_message(&mut reply, &self.out_budget());
        let mut changes = vec![Change::EndTurn(user_message_id.to_owned())];
        // A lane deleted while its turn ran gets no message (its history is gone too).
        if self.lane_exists(lane) {
            changes.push(Change::PutMessage(lane.clone(), reply.clone()));
            changes.push(Change::OutboxOf {
                message_id: reply.message_id.clone(),
                frame: frame(&reply).in_lane(&lane.chat_id, lane.thread()).encode(),
            });
            if let Some(n) = notice {
                changes.push(Change::OutboxOf {
                    message_id: reply.message_id.clone(),
                    frame: n.encode(),
                });
            }
        }
        if let Err(e) = self.commit(changes.clone(), None).await {
            warn!(%lane, "could not store the agent's reply: {e}");
            // The disk filled (or failed) while the turn ran: the user's message is stored and
            // waits for this answer. Keep it and store it once the disk works again
            // (`storage::monitor`), rather than leave the message unanswered until a restart.
            self.keep_unsettled(changes);
        }
    }

    async fn apply_event(
        &self,
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
                // A stretch after a tool starts fresh: no blank lines carried over from the split.
                let delta = if acc.text.len() == acc.segment_start {
                    delta.trim_start().to_owned()
                } else {
                    delta
                };
                if delta.is_empty() {
                    return;
                }
                let budget = self.out_budget().text;
                acc.truncated = fit::push_within(
                    &mut acc.text,
                    &mut acc.text_escaped,
                    &delta,
                    budget,
                    REPLY_CUT_NOTE,
                );
                self.broadcast(
                    &Frame::message_update(message_id, &acc.text).in_lane(chat, thread),
                    Some(coalesce_key("message.update", message_id, 0)),
                );
            }
            AgentEvent::Reasoning(delta) => {
                // Reasoning past its share is left out silently: the answer is what matters.
                let budget = self.out_budget().reasoning;
                fit::push_within(
                    &mut acc.reasoning,
                    &mut acc.reasoning_escaped,
                    &delta,
                    budget,
                    "",
                );
            }
            AgentEvent::Commentary(mut text) => {
                fit::cut_in_place(&mut text, self.out_budget().text);
                self.broadcast(
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
                // Text streamed since the last tool was the agent saying what it is about to do.
                let said = acc.text[acc.segment_start..].trim().to_owned();
                if !said.is_empty() && !acc.truncated {
                    acc.text.truncate(acc.segment_start);
                    acc.text_escaped = fit::escaped_len(&acc.text);
                    self.broadcast(
                        &Frame::commentary(message_id, &said).in_lane(chat, thread),
                        None,
                    );
                    self.broadcast(
                        &Frame::message_update(message_id, &acc.text).in_lane(chat, thread),
                        Some(coalesce_key("message.update", message_id, 0)),
                    );
                }
                acc.segment_start = acc.text.len();
                let (name, preview, args, emoji) = self.bounded_tool(name, preview, args, emoji);
                let f = Frame::tool_start(index, &name, &preview, &args, emoji.as_deref());
                acc.tool_names.insert(index, name);
                self.broadcast(&f.in_lane(chat, thread), None);
            }
            AgentEvent::ToolProgress { index, mut note } => {
                fit::cut_in_place(&mut note, fit::PREVIEW_BYTES);
                let name = acc.tool_names.get(&index).cloned().unwrap_or_default();
                self.broadcast(
                    &Frame::tool_progress(index, &name, &note).in_lane(chat, thread),
                    Some(coalesce_key("tool.progress", message_id, index)),
                );
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
                // Never dropped, so outboxed: a device that missed the stream still learns the
                // tool's outcome on sync. The turn waits for it to be durable, keeping order.
                let change = Change::OutboxOf {
                    message_id: message_id.to_owned(),
                    frame: f.encode(),
                };
                if let Err(e) = self.commit(vec![change], None).await {
                    warn!(%lane, "could not store tool.end: {e}");
                }
            }
            AgentEvent::Todos(todos) => self.set_todos(lane, todos),
            AgentEvent::RunStarted(run_id) => {
                // Durable before anything else happens in the run: a restart must find it (to
                // follow it, never to hand the message over again).
                let record = crate::store::RunRecord {
                    user_message_id: acc.user_message_id.clone(),
                    lane: lane.clone(),
                    run_id: run_id.clone(),
                };
                if let Err(e) = self.store.put_run(&record).await {
                    warn!(%lane, "could not store the agent's run (a restart will not find it): {e}");
                }
                if let Some(ls) = self.state.borrow_mut().lanes.get_mut(lane) {
                    ls.run_id = Some(run_id.clone());
                }
                acc.run_id = Some(run_id);
            }
            AgentEvent::Approval(request) => match acc.run_id.clone() {
                Some(run_id) => self.offer_approval(lane, &run_id, request).await,
                None => warn!(%lane, "an approval request outside a run was ignored"),
            },
            AgentEvent::ApprovalExpired => {
                if let Some(run_id) = acc.run_id.clone() {
                    self.approval_expired(&run_id).await;
                }
            }
            AgentEvent::File {
                filename,
                mime,
                kind,
                bytes,
            } => {
                if let Some(m) = self
                    .store_agent_file(lane, message_id, filename, mime, kind, &bytes)
                    .await
                {
                    acc.media.push(m);
                }
            }
        }
    }

    /// A tool call as the agent described it, cut to what a `tool.start` may carry: a preview is a
    /// glance ([`fit::PREVIEW_BYTES`]), the name and emoji are labels, and the arguments (any JSON
    /// the agent sent) get half a frame, their longest strings cut first.
    fn bounded_tool(
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
        if !fit::shrink_value(&mut args, self.out_budget().content / 2) {
            args = serde_json::json!({});
        }
        (name, preview, args, emoji)
    }
}

/// A tool's name or emoji, escaped: a label, never a page.
const TOOL_LABEL_BYTES: usize = 256;

/// Todo items the agent sends: each item a line, the list within half a frame.
const TODO_ITEM_BYTES: usize = 1 << 10;

impl Hub {
    /// A fresh conversation has no plan yet.
    pub(super) fn clear_todos(&self, lane: &Lane) {
        let had = self
            .state
            .borrow()
            .lanes
            .get(lane)
            .is_some_and(|ls| !ls.todos.is_empty());
        if had {
            self.set_todos(lane, Vec::new());
        }
    }

    /// A lane's todo list changed: remember it (memory and store) and tell every device.
    fn set_todos(&self, lane: &Lane, mut todos: Vec<TodoItem>) {
        if !self.lane_exists(lane) {
            return;
        }
        // The list goes out whole in one `todo.update` (and after every hello): bounded per
        // item and in all, the first items kept.
        let mut used = 0;
        let budget = self.out_budget().content / 2;
        todos.retain_mut(|t| {
            fit::cut_in_place(&mut t.content, TODO_ITEM_BYTES);
            fit::cut_in_place(&mut t.id, TOOL_LABEL_BYTES);
            used += fit::escaped_len(&t.content) + fit::escaped_len(&t.id) + 64;
            used <= budget
        });
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
                if let Some(abort) = &ls.abort {
                    abort.abandon();
                }
            }
        }
    }

    /// A lane is live while its channel (and thread) exist in the directory.
    pub(super) fn lane_exists(&self, lane: &Lane) -> bool {
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
            let _ = self.store.remove_agent_session(&lane);
            let mut st = self.state.borrow_mut();
            if let Some(ls) = st.lanes.get_mut(&lane) {
                ls.todos.clear();
                closed.extend(
                    ls.queue
                        .drain(..)
                        .map(|t| Change::EndTurn(t.user_message_id)),
                );
                if let Some(abort) = &ls.abort {
                    abort.abandon();
                }
            }
        }
        if !closed.is_empty() {
            if let Err(e) = self.commit(closed, None).await {
                warn!("could not close the turns of a deleted lane: {e}");
            }
        }
    }

    /// Settles user messages whose turns a previous run never finished (power cut, kill -9),
    /// before listening. Nothing is ever sent to the agent twice: a turn the agent took as a
    /// run that is still going is followed to its end (its approval, if it waits for one,
    /// stays answerable); a finished run's answer is delivered; otherwise, where the agent's
    /// own store has the answer (or its start), that is delivered; else the user is told.
    pub async fn close_interrupted_turns(self: &Rc<Self>) -> Result<usize, StoreError> {
        let pending = self.store.pending_turns()?;
        let count = pending.len();
        let deadline = tokio::time::Instant::now() + RECOVERY_BUDGET;
        let mut followed = Vec::new();
        for p in pending {
            let run = self.store.run_of(&p.user_message_id).ok().flatten();
            let state = match &run {
                Some(r) if tokio::time::Instant::now() < deadline => {
                    tokio::time::timeout_at(deadline, self.agent.run_state(&r.run_id))
                        .await
                        .unwrap_or(RunState::Gone)
                }
                _ => RunState::Gone,
            };
            info!(lane = %p.lane, message = %p.user_message_id, ?state, "a turn interrupted by a restart");
            let text = match state {
                RunState::Active { .. } => {
                    let run_id = run.map(|r| r.run_id).unwrap_or_default();
                    followed.push((p, run_id));
                    continue;
                }
                RunState::Completed { output, .. } => output,
                RunState::Failed(e) => format!("\u{26a0}\u{fe0f} the agent failed: {e}"),
                RunState::Cancelled => "\u{23f9}\u{fe0f} Stopped.".to_owned(),
                RunState::Gone => {
                    let recovery = match self.store.agent_session(&p.lane).ok().flatten() {
                        Some(session) if tokio::time::Instant::now() < deadline => {
                            let ask = self.agent.recover(&session.session_id, &p.text);
                            tokio::time::timeout_at(deadline, ask)
                                .await
                                .unwrap_or(Recovery::Unknown)
                        }
                        _ => Recovery::Unknown,
                    };
                    info!(lane = %p.lane, message = %p.user_message_id, ?recovery, "settling a turn interrupted by a restart");
                    match recovery {
                        Recovery::Answered(text) => text,
                        Recovery::Partial(text) => format!("{text}\n\n\u{26a0}\u{fe0f} The gateway restarted while the agent was answering, so this answer stopped here. Send the message again if you need the rest."),
                        Recovery::Unknown => "\u{26a0}\u{fe0f} The gateway restarted before the agent answered this message. Send it again if you still need an answer.".into(),
                    }
                }
            };
            let reply = HistoryMessage {
                runtime: Some(Runtime::default()),
                ..super::gateway_message(Role::Assistant, text)
            };
            self.finish_turn(&p.lane, &p.user_message_id, reply, Frame::message, None)
                .await;
            self.forget_run(&p.user_message_id);
        }
        // Approvals of runs that are over can no longer be answered: close them.
        let live: Vec<String> = followed.iter().map(|(_, r)| r.clone()).collect();
        for run_id in self.approval_runs() {
            if !live.contains(&run_id) {
                self.close_approvals_of(&run_id, |command| {
                    format!("The gateway restarted after the task ended: the approval for `{command}` is no longer open.")
                })
                .await;
            }
        }
        // Runs whose turns were settled before a crash removed their records.
        let pending: Vec<String> = followed
            .iter()
            .map(|(p, _)| p.user_message_id.clone())
            .collect();
        for r in self.store.runs().unwrap_or_default() {
            if !pending.contains(&r.user_message_id) {
                self.forget_run(&r.user_message_id);
            }
        }
        for (p, run_id) in followed {
            info!(lane = %p.lane, run = %run_id, "following a run that outlived the gateway");
            self.enqueue_turn(
                p.lane,
                QueuedTurn {
                    user_message_id: p.user_message_id,
                    text: p.text,
                    media: Vec::new(),
                    automation: None,
                    resume_run: Some(run_id),
                },
            );
        }
        Ok(count)
    }

    /// A settled turn's run record is no longer needed.
    fn forget_run(&self, user_message_id: &str) {
        if let Err(e) = self.store.remove_run(user_message_id) {
            warn!("could not forget a settled run: {e}");
        }
    }

    /// Stops the running turn of `lane` (`/stop`, `agent.stop`, "Stop the task"); `false` when
    /// nothing runs there.
    pub(super) fn stop_lane(&self, lane: &Lane) -> bool {
        let abort = self
            .state
            .borrow()
            .lanes
            .get(lane)
            .and_then(|ls| ls.abort.clone());
        match abort {
            Some(a) => {
                a.stop();
                true
            }
            None => false,
        }
    }

    /// The lane's conversation at the agent, started (and stored) on first use.
    async fn lane_session(&self, lane: &Lane) -> AgentSession {
        if let Ok(Some(s)) = self.store.agent_session(lane) {
            return s;
        }
        // The first conversation covers the lane's whole history (including the message
        // that is starting it).
        self.new_lane_session(lane, 0).await
    }

    /// Starts a fresh conversation for the lane: on first use, or from now on (`/new`).
    pub(super) async fn new_lane_session(&self, lane: &Lane, started_ms: i64) -> AgentSession {
        let session = AgentSession {
            session_id: ids::time_ordered("iris"),
            started_ms,
        };
        if let Err(e) = self.store.put_agent_session(lane, &session).await {
            warn!(%lane, "could not store the lane's agent session: {e}");
        }
        session
    }

    /// The lane's messages since its conversation began, for backends that keep no history:
    /// the user's and the agent's words only (no gateway notices, no slash commands).
    fn past_messages(
        &self,
        lane: &Lane,
        session: &AgentSession,
        current: &str,
    ) -> Vec<PastMessage> {
        if !self.agent.wants_history() {
            return Vec::new();
        }
        let limit = self.config.agent.history_messages;
        let Ok(Some(page)) = self.store.history_page(lane, None, limit + 1) else {
            return Vec::new();
        };
        let mut past: Vec<PastMessage> = page
            .messages
            .into_iter()
            .filter(|m| m.ts >= session.started_ms && m.message_id != current)
            .filter(|m| match m.role {
                Role::User => super::commands::parse(&m.text).is_none(),
                Role::Assistant => true,
                Role::System | Role::Cron => false,
            })
            .map(|m| PastMessage {
                role: m.role,
                text: m.text,
            })
            .collect();
        let skip = past.len().saturating_sub(limit);
        past.drain(..skip);
        past
    }

    /// A turn found the agent unusable: report `degraded` and have the monitor watch for its
    /// return.
    fn agent_unusable(&self, e: &AgentError) {
        self.update_health(|st| st.agent_error = Some(e.to_string()));
        self.agent_check.notify_one();
    }

    fn agent_usable(&self) {
        if self.state.borrow().agent_error.is_some() {
            self.update_health(|st| st.agent_error = None);
            self.agent_back.notify_waiters();
        }
    }
}

/// The longest start-up spends asking the agent about interrupted turns.
const RECOVERY_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

impl Hub {
    /// Watches the agent: every `agent.probe_interval_secs` while it is usable, every second while
    /// it is not, and at once when a turn could not reach it. Drives the `degraded` state and wakes
    /// turns waiting for the agent.
    pub(super) async fn agent_monitor(self: Rc<Self>) {
        let calm = std::time::Duration::from_secs(self.config.agent.probe_interval_secs.max(1));
        let mut first = true;
        while !self.is_shutting_down() {
            if !first {
                let down = self.state.borrow().agent_error.is_some();
                let pause = if down {
                    std::time::Duration::from_secs(1)
                } else {
                    calm
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = self.agent_check.notified() => {}
                }
            }
            first = false;
            match self.agent.probe().await {
                Ok(()) => self.agent_usable(),
                Err(e) if e.agent_is_down() => {
                    if self.state.borrow().agent_error.is_none() {
                        warn!("agent check failed: {e}");
                    }
                    self.update_health(|st| st.agent_error = Some(e.to_string()));
                }
                Err(e) => tracing::debug!("agent check: {e}"),
            }
        }
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
