//! Start-up recovery: turns a previous run never finished (power cut, kill -9) are settled
//! before the gateway listens, without ever handing a message to the agent twice.

use std::rc::Rc;

use tracing::info;

use crate::agent::{AgentEvent, Recovery, RunState};
use crate::protocol::{Frame, HistoryMessage, Role, Runtime};
use crate::store::{PendingTurn, RunRecord, StoreError};

use super::super::state::gateway_message;
use super::lanes::QueuedTurn;
use super::{TurnPort, Turns};

/// What an interrupted turn comes to: its run is followed, or it gets this reply and files.
enum Settled {
    Follow(String),
    Reply(String, Vec<AgentEvent>),
}

/// The longest start-up spends asking the agent about interrupted turns.
const RECOVERY_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

impl<P: TurnPort> Turns<P> {
    /// Settles user messages whose turns a previous run never finished (power cut, kill -9),
    /// before listening. Nothing is ever sent to the agent twice: a turn the agent took as a
    /// run that is still going is followed to its end (its approval, if it waits for one,
    /// stays answerable); a finished run's answer is delivered; otherwise, where the agent's
    /// own store has the answer (or its start), that is delivered; else the user is told.
    pub(crate) async fn close_interrupted(self: &Rc<Self>) -> Result<usize, StoreError> {
        let pending = self.hub().store().pending_turns()?;
        let count = pending.len();
        let deadline = tokio::time::Instant::now() + RECOVERY_BUDGET;
        let mut followed = Vec::new();
        let mut repeated = Vec::new();
        // Asked once, and only when some turn has no run on record.
        let mut repeat_window = None;
        for p in pending {
            let run = self.hub().store().run_of(&p.user_message_id).ok().flatten();
            if run.is_none() {
                // The gateway died before it recorded a run for this message: before handing it
                // over, or between the start request and its answer. Where the agent answers a
                // repeated start with the run of the first (Hermes' Idempotency-Key), the start
                // is repeated: the message is answered once, by whichever run took it.
                if repeat_window.is_none() {
                    let hub = self.hub();
                    let ask = hub.agent().repeatable_start();
                    repeat_window =
                        Some(tokio::time::timeout_at(deadline, ask).await.ok().flatten());
                }
                if let Some(turn) = repeat_window
                    .flatten()
                    .and_then(|w| self.repeatable_turn(&p.user_message_id, &p.text, w))
                {
                    info!(lane = %p.lane, message = %p.user_message_id, "repeating the start of a turn a restart interrupted (the agent answers a repeat with the same run)");
                    repeated.push((p, turn));
                    continue;
                }
            }
            match self.settle_interrupted(&p, run, deadline).await {
                Settled::Follow(run_id) => followed.push((p, run_id)),
                Settled::Reply(text, files) => self.deliver_recovered(&p, text, files).await,
            }
        }
        self.forget_what_ended(&followed, &repeated).await;
        for (p, run_id) in followed {
            info!(lane = %p.lane, run = %run_id, "following a run that outlived the gateway");
            self.enqueue(
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
        for (p, turn) in repeated {
            self.enqueue(p.lane, turn);
        }
        Ok(count)
    }

    /// What becomes of one interrupted turn that is not repeated: followed while its run still
    /// goes, else the answer the agent has for it (or a note saying there is none).
    async fn settle_interrupted(
        &self,
        p: &PendingTurn,
        run: Option<RunRecord>,
        deadline: tokio::time::Instant,
    ) -> Settled {
        let state = match &run {
            Some(r) if tokio::time::Instant::now() < deadline => {
                tokio::time::timeout_at(deadline, self.hub().agent().run_state(&r.run_id))
                    .await
                    .unwrap_or(RunState::Gone)
            }
            _ => RunState::Gone,
        };
        info!(lane = %p.lane, message = %p.user_message_id, ?state, "a turn interrupted by a restart");
        // What the agent answered may name files (`MEDIA:` lines, inline images): they are
        // taken out of the text and offered with the reply, as in a streamed turn.
        let (text, files) = match state {
            RunState::Active { .. } => {
                return Settled::Follow(run.map(|r| r.run_id).unwrap_or_default())
            }
            RunState::Completed { output, .. } => self.hub().agent().files_of(output).await,
            RunState::Failed(e) => (
                format!("\u{26a0}\u{fe0f} the agent failed: {e}"),
                Vec::new(),
            ),
            RunState::Cancelled => ("\u{23f9}\u{fe0f} Stopped.".to_owned(), Vec::new()),
            RunState::Gone => self.recover_from_session(p, deadline).await,
        };
        Settled::Reply(text, files)
    }

    /// A turn whose run is gone (or was never recorded): what the agent's own session kept of
    /// the answer, if it can still be asked in time.
    async fn recover_from_session(
        &self,
        p: &PendingTurn,
        deadline: tokio::time::Instant,
    ) -> (String, Vec<AgentEvent>) {
        let recovery = match self.hub().store().agent_session(&p.lane).ok().flatten() {
            Some(session) if tokio::time::Instant::now() < deadline => {
                let hub = self.hub();
                let ask = hub.agent().recover(&session.session_id, &p.text);
                tokio::time::timeout_at(deadline, ask)
                    .await
                    .unwrap_or(Recovery::Unknown)
            }
            _ => Recovery::Unknown,
        };
        info!(lane = %p.lane, message = %p.user_message_id, ?recovery, "settling a turn interrupted by a restart");
        match recovery {
            Recovery::Answered(text) => self.hub().agent().files_of(text).await,
            Recovery::Partial(text) => {
                let (text, files) = self.hub().agent().files_of(text).await;
                (format!("{text}\n\n\u{26a0}\u{fe0f} The gateway restarted while the agent was answering, so this answer stopped here. Send the message again if you need the rest."), files)
            }
            Recovery::Unknown => ("\u{26a0}\u{fe0f} The gateway restarted before the agent answered this message. Send it again if you still need an answer.".into(), Vec::new()),
        }
    }

    /// Ends an interrupted turn with `text` and the files the agent named, kept as they would
    /// be in a streamed turn (a file that cannot be kept is named in the text instead).
    async fn deliver_recovered(&self, p: &PendingTurn, text: String, files: Vec<AgentEvent>) {
        let mut base = gateway_message(Role::Assistant, text);
        self.attach_agent_files(&p.lane, &mut base, files).await;
        let reply = HistoryMessage {
            runtime: Some(Runtime::default()),
            ..base
        };
        self.finish_turn(
            &p.lane,
            &p.user_message_id,
            &[],
            reply,
            Frame::message,
            None,
            false,
        )
        .await;
    }

    /// Closes the approvals of runs that are over (they can no longer be answered) and forgets
    /// the run records of turns settled before a crash removed them.
    async fn forget_what_ended(
        &self,
        followed: &[(PendingTurn, String)],
        repeated: &[(PendingTurn, QueuedTurn)],
    ) {
        let live: Vec<&String> = followed.iter().map(|(_, r)| r).collect();
        for run_id in self.hub().approval_runs() {
            if !live.contains(&&run_id) {
                self.hub().close_approvals_of(&run_id, |command| {
                    format!("The gateway restarted after the task ended: the approval for `{command}` is no longer open.")
                })
                .await;
            }
        }
        let pending: Vec<&String> = followed
            .iter()
            .map(|(p, _)| &p.user_message_id)
            .chain(repeated.iter().map(|(p, _)| &p.user_message_id))
            .collect();
        for r in self.hub().store().runs().unwrap_or_default() {
            if !pending.contains(&&r.user_message_id) {
                self.forget_run(&r.user_message_id);
            }
        }
    }

    /// The turn that starts user message `message_id` again, when it was sent within `window`
    /// (older, the agent may have forgotten the first start, and a repeat could run it twice)
    /// and is still in the history, with its files: a repeat must be the same request.
    fn repeatable_turn(
        &self,
        message_id: &str,
        text: &str,
        window: std::time::Duration,
    ) -> Option<QueuedTurn> {
        let (_, message) = self.hub().store().message(message_id).ok().flatten()?;
        let age_ms = crate::ids::now_ms().saturating_sub(message.ts);
        if message.role != Role::User || age_ms < 0 || age_ms as u128 >= window.as_millis() {
            return None;
        }
        Some(QueuedTurn {
            user_message_id: message_id.to_owned(),
            text: text.to_owned(),
            media: message.media,
            automation: None,
            resume_run: None,
        })
    }
}
