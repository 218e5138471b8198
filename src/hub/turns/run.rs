//! Running a turn: the agent is asked (and asked again while it cannot be reached, within
//! `agent.unreachable_wait_secs`), its events are applied as they come, and the finished
//! assistant message, its `message.stop` and the end of the pending record are committed
//! together, so after a crash a message either has its answer or is known to be unanswered.

use std::rc::Rc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::agent::{AgentError, PastMessage, TurnInput, TurnSummary};
use crate::ids;
use crate::protocol::fit;
use crate::protocol::{Frame, HistoryMessage, Lane, Role, Runtime};
use crate::store::{AgentSession, Change, Record};

use super::events::{Flush, TurnText};
use super::lanes::{Abort, QueuedTurn};
use super::{TurnPort, Turns};

/// A gap long enough between tries that a flapping agent is not hammered, short enough that
/// a message is answered soon after the agent is back.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// One running turn, as its attempts see it: its lane, the reply it streams, how it is ended
/// early, when it began, and what it has gathered so far.
pub(super) struct RunningTurn<'a> {
    pub(super) lane: &'a Lane,
    pub(super) message_id: &'a str,
    pub(super) abort: &'a Abort,
    pub(super) started: tokio::time::Instant,
    pub(super) acc: TurnText,
}

/// How one attempt to run a turn ended.
pub(super) enum Attempt {
    Done(Result<TurnSummary, AgentError>),
    /// `/stop`: keep what was streamed.
    Stopped,
    /// The lane or the reply was deleted: keep nothing.
    Abandoned,
}

impl<P: TurnPort> Turns<P> {
    /// Runs one queued turn to its end: the agent's answer (or what was streamed before a
    /// `/stop`, or the failure) becomes the lane's reply; an abandoned turn leaves nothing.
    pub(super) async fn run_turn(self: &Rc<Self>, lane: &Lane, turn: QueuedTurn) {
        let message_id = ids::message_id();
        let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
        let started = tokio::time::Instant::now();
        let abort = self.begin_turn(lane, &message_id);
        // Voice notes are heard before the answer starts, so every device shows what was heard
        // above the reply, not below its first words. A `/stop` meanwhile ends the turn here.
        let heard = tokio::select! {
            text = self.hear(lane, &turn) => Ok(text),
            stop = abort.fired() => Err(if stop { Attempt::Stopped } else { Attempt::Abandoned }),
        };
        self.hub().broadcast(
            &Frame::message_start(&message_id).in_lane(chat, thread),
            None,
        );
        let mut running = RunningTurn {
            lane,
            message_id: &message_id,
            abort: &abort,
            started,
            acc: TurnText {
                user_message_id: turn.user_message_id.clone(),
                run_id: turn.resume_run.clone(),
                ..TurnText::default()
            },
        };
        self.lanes.set_run(lane, turn.resume_run.clone());
        let outcome = match heard {
            Ok((text, heard)) => {
                let input = self.turn_input(lane, &turn, text, heard).await;
                self.attempt_until_reached(&mut running, &input).await
            }
            Err(ended) => ended,
        };
        let mut acc = running.acc;
        // Stopping for a restart: the run goes on at the agent, and the next start follows it.
        if matches!(outcome, Attempt::Abandoned) && self.hub().is_shutting_down() {
            self.hub()
                .broadcast(&Frame::typing(false).in_lane(chat, thread), None);
            self.set_lane_busy(lane, false);
            return;
        }
        let steers = self.lanes.end_turn(lane);
        if let Some(run_id) = acc.run_id.clone() {
            self.settle_run(&run_id, &outcome).await;
        }
        // Only a whole answer is spoken: not one cut by `/stop`, nor a failure's note.
        let answered = matches!(outcome, Attempt::Done(Ok(_)));
        let (seen, unseen) =
            super::steer::split_by_pending(steers, acc.pending_steer.as_deref().unwrap_or(""));
        let steered: Vec<String> = seen.into_iter().map(|s| s.message_id).collect();
        if let Some(summary) = self
            .close_attempt(lane, &turn, &mut acc, outcome, &steered)
            .await
        {
            let reply = reply_message(message_id, &turn, acc, summary, started);
            let notice = turn.automation.as_deref().map(|title| {
                let body: String = reply.text.chars().take(200).collect();
                Frame::notification("cron", title, &body, reply.ts).in_lane(chat, thread)
            });
            let voiced = answered && self.voice_wanted(lane, &turn);
            let spoken = voiced.then(|| reply.clone());
            self.finish_turn(
                lane,
                &turn.user_message_id,
                &steered,
                reply,
                Frame::message_stop,
                notice,
                voiced,
            )
            .await;
            // After the text is durable and shown: the answer never waits on its voice.
            if let Some(reply) = spoken {
                self.voice_reply(lane, &reply).await;
            }
        }
        self.requeue_unseen_steers(lane, unseen).await;
        self.hub()
            .broadcast(&Frame::typing(false).in_lane(chat, thread), None);
        self.set_lane_busy(lane, false);
    }

    /// Announces the turn (typing) and registers how to end it early. Done before the first
    /// await, so a `/stop` or a deletion of the reply that arrives while the turn is still
    /// getting ready (hearing a voice note) is not missed. `message.start` follows once the
    /// turn is ready.
    fn begin_turn(&self, lane: &Lane, message_id: &str) -> Rc<Abort> {
        let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
        let abort = Rc::new(Abort::default());
        self.lanes.begin_turn(lane, abort.clone(), message_id);
        self.hub()
            .broadcast(&Frame::typing(true).in_lane(chat, thread), None);
        self.set_lane_busy(lane, true);
        abort
    }

    /// What the agent is given for a turn: the message (`text`: as typed, with what was heard
    /// in its voice notes), its files, the lane's conversation (and, for backends that keep
    /// none, its recent history) and the user's settings.
    async fn turn_input(
        &self,
        lane: &Lane,
        turn: &QueuedTurn,
        text: String,
        heard: Vec<String>,
    ) -> TurnInput {
        let media = turn
            .media
            .iter()
            .filter_map(|m| {
                let record = self.hub().store().media(&m.media_id).ok().flatten()?;
                Some((m.clone(), self.hub().media().blob_path(&record.sha256)))
            })
            .collect();
        let session = self.lane_session(lane).await;
        let text = self
            .hub()
            .with_job_results(lane, &turn.user_message_id, text)
            .await;
        TurnInput {
            lane: lane.clone(),
            user_message_id: turn.user_message_id.clone(),
            text,
            media,
            heard,
            history: self
                .past_messages(lane, &session, &turn.user_message_id)
                .await,
            session: session.session_id,
            settings: self.hub().turn_settings(lane),
            resume_run: turn.resume_run.clone(),
        }
    }

    /// Tries the turn, and while the agent could not even be reached (nothing was handed over,
    /// nothing streamed), waits for it and tries again, within `agent.unreachable_wait_secs`.
    async fn attempt_until_reached(
        self: &Rc<Self>,
        turn: &mut RunningTurn<'_>,
        input: &TurnInput,
    ) -> Attempt {
        let (lane, message_id, abort) = (turn.lane, turn.message_id, turn.abort);
        let (chat, thread) = (lane.chat_id.as_str(), lane.thread());
        let hub = self.hub();
        let agent_config = &hub.config().agent;
        let wait_limit = std::time::Duration::from_secs(agent_config.unreachable_wait_secs);
        let turn_limit = std::time::Duration::from_secs(agent_config.turn_timeout_secs);
        let mut told_waiting = false;
        loop {
            let attempt = self.attempt_turn(turn, input, turn_limit).await;
            let Attempt::Done(Err(e)) = &attempt else {
                return attempt;
            };
            if e.agent_is_down() {
                self.agent_unusable(e);
            }
            let waited = turn.started.elapsed();
            if !e.not_handed_over() || !turn.acc.text.is_empty() || waited >= wait_limit {
                return attempt;
            }
            // Never reached the agent: safe to wait for it and try again.
            if !told_waiting {
                told_waiting = true;
                let note = format!(
                    "{e}. Your message is kept and will be answered when the agent is back."
                );
                self.hub().broadcast(
                    &Frame::commentary(message_id, &note).in_lane(chat, thread),
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
                _ = self.watch.back.notified() => {}
                stop = abort.fired() => return if stop { Attempt::Stopped } else { Attempt::Abandoned },
            }
            if self.hub().is_shutting_down() {
                return Attempt::Abandoned;
            }
        }
    }

    /// How the turn's last attempt ended decides its answer: `None` for an abandoned turn (its
    /// pending record is closed, nothing is kept), else the summary to build the reply from,
    /// with a note about a `/stop` or a failure added to what was streamed.
    async fn close_attempt(
        &self,
        lane: &Lane,
        turn: &QueuedTurn,
        acc: &mut TurnText,
        outcome: Attempt,
        steered: &[String],
    ) -> Option<TurnSummary> {
        match outcome {
            Attempt::Abandoned => {
                // Its conversation or its reply was deleted (or the gateway is stopping, and the
                // next start settles it): keep nothing of it, nor of the steers it took.
                info!(%lane, "turn abandoned");
                if !self.hub().is_shutting_down() {
                    let mut end: Vec<Change> = std::iter::once(&turn.user_message_id)
                        .chain(steered)
                        .map(|id| Change::EndTurn(id.clone()))
                        .collect();
                    end.push(Change::Record(Record::RemoveRun(
                        turn.user_message_id.clone(),
                    )));
                    if let Err(e) = self.hub().commit(end).await {
                        warn!(%lane, "could not close an abandoned turn: {e}");
                    }
                }
                None
            }
            Attempt::Stopped => {
                info!(%lane, "turn stopped by /stop");
                if !acc.text.is_empty() {
                    acc.text.push_str("\n\n");
                }
                acc.text.push_str("\u{23f9}\u{fe0f} Stopped.");
                Some(TurnSummary::default())
            }
            Attempt::Done(Ok(s)) => {
                self.agent_usable();
                Some(s)
            }
            Attempt::Done(Err(e)) => {
                warn!(%lane, "agent turn failed: {e}");
                if !acc.text.is_empty() {
                    acc.text.push_str("\n\n");
                }
                acc.text
                    .push_str(&format!("\u{26a0}\u{fe0f} {}", failure_text(&e)));
                Some(TurnSummary::default())
            }
        }
    }

    /// A turn with a run at the agent is over: a run the gateway gave up on (stopped, timed out,
    /// its lane deleted) is stopped at the agent too, since closing its events stream does not
    /// stop it; and an approval still open for it is closed, saying why.
    pub(super) async fn settle_run(self: &Rc<Self>, run_id: &str, outcome: &Attempt) {
        let gave_up = matches!(
            outcome,
            Attempt::Stopped | Attempt::Abandoned | Attempt::Done(Err(AgentError::TimedOut(_)))
        );
        if gave_up {
            let (agent, id) = (self.hub().agent().clone(), run_id.to_owned());
            self.spawn(async move { agent.stop_run(&id).await });
        }
        let stopped = matches!(outcome, Attempt::Stopped);
        self.hub()
            .close_approvals_of(run_id, |command| {
                if stopped {
                    format!("The task was stopped: Hermes did not run `{command}`.")
                } else {
                    format!(
                        "The agent's turn ended: the approval for `{command}` is no longer open."
                    )
                }
            })
            .await;
    }

    /// One try at a turn: runs the agent and applies its events until it ends, the time limit
    /// passes, or the turn is stopped.
    pub(super) async fn attempt_turn(
        self: &Rc<Self>,
        turn: &mut RunningTurn<'_>,
        input: &TurnInput,
        limit: std::time::Duration,
    ) -> Attempt {
        let (lane, message_id, abort) = (turn.lane, turn.message_id, turn.abort);
        let acc = &mut turn.acc;
        let (tx, mut rx) = mpsc::channel(16);
        let agent = self.hub().agent().clone();
        let run = agent.run_turn(input.clone(), tx);
        let interval = self.update_interval();
        let consume = async {
            loop {
                // A held update goes out when its interval is over, even if the agent pauses.
                let due = acc.pacer.next_due(interval);
                tokio::select! {
                    event = rx.recv() => match event {
                        Some(event) => self.apply_event(lane, message_id, acc, event).await,
                        None => break,
                    },
                    () = sleep_until_due(due) => self.flush_held(lane, message_id, acc, Flush::Due),
                }
            }
            self.flush_held(lane, message_id, acc, Flush::End);
        };
        let both = async { tokio::join!(run, consume).0 };
        tokio::select! {
            done = tokio::time::timeout(limit, both) => Attempt::Done(
                done.unwrap_or(Err(AgentError::TimedOut(limit.as_secs())))
            ),
            stop = abort.fired() => if stop { Attempt::Stopped } else { Attempt::Abandoned },
        }
    }

    /// Commits a turn's final message (and its notification, for automation turns) and closes
    /// its pending record, and those of the steers its run gave the model (`steered`), in one
    /// transaction. `voiced`: its voice follows, and a push to an away phone says so.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finish_turn(
        &self,
        lane: &Lane,
        user_message_id: &str,
        steered: &[String],
        reply: HistoryMessage,
        frame: fn(&HistoryMessage) -> Frame,
        notice: Option<Frame>,
        voiced: bool,
    ) {
        // Built within budget as it streamed; this catches what was not (an error text, a
        // partial answer recovered after a restart).
        let mut reply = reply;
        fit::fit_message(&mut reply, &self.hub().out_budget());
        let mut changes: Vec<Change> = std::iter::once(user_message_id)
            .chain(steered.iter().map(String::as_str))
            .map(|id| Change::EndTurn(id.to_owned()))
            .collect();
        // The run record and the plan are settled in the same commit as the answer: no SD-card
        // write of their own per turn (and none at all for a turn that had no run).
        if matches!(self.hub().store().run_of(user_message_id), Ok(Some(_))) {
            changes.push(Change::Record(Record::RemoveRun(
                user_message_id.to_owned(),
            )));
        }
        if let Some(todos) = self.lanes.unsaved_todos(lane) {
            changes.push(Change::Record(Record::PutTodos(lane.clone(), todos)));
        }
        // A lane deleted while its turn ran gets no message (its history is gone too).
        if self.hub().lane_exists(lane) {
            changes.push(Change::PutMessage(lane.clone(), reply.clone()));
            let mut outboxed = frame(&reply)
                .in_lane(&lane.chat_id, lane.thread())
                .outboxed();
            if voiced {
                super::super::push::say_voice_reply(&mut outboxed);
            }
            changes.push(Change::OutboxOf {
                message_id: reply.message_id.clone(),
                frame: outboxed,
            });
            if let Some(n) = notice {
                changes.push(Change::OutboxOf {
                    message_id: reply.message_id.clone(),
                    frame: n.outboxed(),
                });
            }
        }
        if let Err(e) = self.hub().commit(changes.clone()).await {
            warn!(%lane, "could not store the agent's reply: {e}");
            // The disk filled (or failed) while the turn ran: the user's message is stored and
            // waits for this answer. Keep it and store it once the disk works again
            // (`storage::monitor`), rather than leave the message unanswered until a restart.
            self.hub().keep_unsettled(changes);
        }
    }

    /// The lane's conversation at the agent, started (and stored) on first use.
    pub(super) async fn lane_session(&self, lane: &Lane) -> AgentSession {
        if let Ok(Some(s)) = self.hub().store().agent_session(lane) {
            return s;
        }
        // The first conversation covers the lane's whole history (including the message
        // that is starting it).
        self.new_lane_session(lane, 0).await
    }

    /// `/new`: a fresh agent session for `lane` and an empty plan, stored now (no turn ends to
    /// store it).
    pub(in crate::hub) async fn new_conversation(&self, lane: &Lane) {
        self.new_lane_session(lane, ids::now_ms()).await;
        self.clear_todos(lane);
        if let Some(todos) = self.unsaved_todos(lane) {
            let put = Change::Record(Record::PutTodos(lane.clone(), todos));
            if let Err(e) = self.hub().commit(vec![put]).await {
                warn!(%lane, "could not store the cleared todo list: {e}");
            }
        }
    }

    /// Starts a fresh conversation for the lane: on first use, or from now on (`/new`).
    pub(in crate::hub) async fn new_lane_session(
        &self,
        lane: &Lane,
        started_ms: i64,
    ) -> AgentSession {
        let session = AgentSession {
            session_id: ids::time_ordered("iris"),
            started_ms,
        };
        // Durable before the run that names it starts: a restart that repeats the start
        // (docs/agents.md, "Exactly once") must send the same session, or Hermes refuses it.
        let put = Change::Record(Record::PutAgentSession(lane.clone(), session.clone()));
        if let Err(e) = self.hub().commit(vec![put]).await {
            warn!(%lane, "could not store the lane's agent session: {e}");
        }
        session
    }

    /// The lane's messages since its conversation began, for backends that keep no history:
    /// the user's and the agent's words only (no gateway notices, no slash commands).
    pub(super) async fn past_messages(
        &self,
        lane: &Lane,
        session: &AgentSession,
        current: &str,
    ) -> Vec<PastMessage> {
        if !self.hub().agent().wants_history() {
            return Vec::new();
        }
        let limit = self.hub().config().agent.history_messages;
        // On the query thread: the read first applies what the journal holds (a few turns).
        let Ok((Ok(page), _)) = self
            .hub()
            .store()
            .query_history_page(lane.clone(), None, limit + 1)
            .await
        else {
            return Vec::new();
        };
        // Kept messages with what was heard in their voice notes, then made text at the end.
        let mut kept: Vec<(HistoryMessage, Vec<String>)> = Vec::new();
        // Whether `kept` ends with a user message (whose transcripts may follow it).
        let mut ends_with_user = false;
        for m in page
            .messages
            .into_iter()
            .filter(|m| m.ts >= session.started_ms && m.message_id != current)
        {
            // What was heard in a voice note was part of the user's words when it was asked.
            if let Some(heard) = super::voice::transcript_of(&m) {
                if let (true, Some((user, transcripts))) = (ends_with_user, kept.last_mut()) {
                    if super::voice::is_heard_of(&m.message_id, &user.message_id) {
                        transcripts.push(heard);
                    }
                }
                continue;
            }
            let keep = match m.role {
                Role::User => super::super::commands::parse(&m.text).is_none(),
                Role::Assistant => true,
                Role::System | Role::Cron => false,
            };
            if keep {
                ends_with_user = m.role == Role::User;
                kept.push((m, Vec::new()));
            }
        }
        let mut past: Vec<PastMessage> = kept
            .into_iter()
            .map(|(m, heard)| PastMessage {
                role: m.role,
                // As the agent was asked: typed words, what was heard, then the files by name
                // only (their bytes went to the agent once, with their message).
                text: crate::agent::media_in::history_text(
                    &super::voice::agent_text(&m.text, &heard),
                    &m.media,
                ),
            })
            .collect();
        let skip = past.len().saturating_sub(limit);
        past.drain(..skip);
        past
    }

    /// A settled turn's run record is no longer needed.
    pub(super) fn forget_run(&self, user_message_id: &str) {
        // Not awaited: a run left behind by a crash is dropped at the next start (its turn is
        // no longer pending).
        self.hub().commit_soon(
            vec![Change::Record(Record::RemoveRun(
                user_message_id.to_owned(),
            ))],
            "that a run is settled",
        );
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

/// The turn's reply as stored: what was streamed, the model and its runtime figures, and the
/// files the agent produced; a cron prompt's answer has the role `cron`.
fn reply_message(
    message_id: String,
    turn: &QueuedTurn,
    acc: TurnText,
    summary: TurnSummary,
    started: tokio::time::Instant,
) -> HistoryMessage {
    let model = summary.model.as_deref().map(bare_model);
    let runtime = Runtime {
        model: model.clone(),
        latency: Some((started.elapsed().as_secs_f64() * 100.0).round() / 100.0),
        ..summary.runtime
    };
    let role = if turn.automation.is_some() {
        Role::Cron
    } else {
        Role::Assistant
    };
    HistoryMessage {
        reasoning: (!acc.reasoning.is_empty()).then_some(acc.reasoning),
        model,
        tokens: summary.tokens,
        runtime: Some(runtime),
        media: acc.media,
        ..HistoryMessage::text_only(message_id, role, acc.text, ids::now_ms())
    }
}

/// `openai/gpt-5.4` → `gpt-5.4`: the app shows bare model names.
fn bare_model(model: &str) -> String {
    model.rsplit('/').next().unwrap_or(model).to_owned()
}

/// Resolves at `due`, never without one.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
