//! Guidance for a running answer (`agent.steer`, `/steer TEXT`).
//!
//! The text is stored first, as a user message marked `steer` with a pending-turn record
//! (like any message), and shown to every device. Then it goes to the lane's running run. Where
//! nothing can take it (nothing runs, the agent cannot be steered, the run is ending), it
//! becomes the lane's next message and the lane is told so: nothing failed, so no `error`.
//!
//! A run that took a steer may still end without giving it to the model (Hermes returns it as
//! `pending_steer` when no model call followed). At the turn's end the steers are split by that
//! text: the ones the model saw are settled with the answer, the rest become the next
//! messages. Either way none is lost; after a crash mid-turn their pending records make the
//! restart treat them as unanswered messages (docs/agents.md).

use std::rc::Rc;

use tracing::info;

use crate::agent::Steered;
use crate::protocol::Lane;
use crate::store::Change;

use super::lanes::{QueuedTurn, SteerTaken};
use super::{TurnPort, Turns};

impl<P: TurnPort> Turns<P> {
    /// Gives a stored steer to the lane's running run, or makes it the next message.
    pub(in crate::hub) async fn hand_steer(
        self: &Rc<Self>,
        lane: Lane,
        message_id: String,
        text: String,
    ) {
        let run = self.lanes.running_run(&lane);
        let why = match run {
            None => "nothing was running in this chat".to_owned(),
            Some(_) if !self.hub().agent().can_steer() => {
                "this agent cannot take guidance while it answers".to_owned()
            }
            Some(None) => "the answer had not started at the agent yet".to_owned(),
            Some(Some(run_id)) => match self.hub().agent().steer_run(&run_id, &text).await {
                Steered::Accepted => {
                    let steer = SteerTaken {
                        message_id: message_id.clone(),
                        text: text.clone(),
                    };
                    // The run may have ended while the steer was on its way: then the end
                    // did not count it, and it goes on as the next message.
                    if self.lanes.steer_taken(&lane, &run_id, steer) {
                        info!(%lane, run = %run_id, message = %message_id, "steer taken by the running answer");
                        return;
                    }
                    "the answer ended as it arrived".to_owned()
                }
                Steered::NotTaken(why) => why,
            },
        };
        info!(%lane, message = %message_id, "steer not taken ({why}): the next message");
        self.steers_to_next_messages(
            &lane,
            vec![SteerTaken { message_id, text }],
            &format!(
                "Not taken by a running answer ({why}): sent to the agent as the next message."
            ),
        )
        .await;
    }

    /// The turn ended and its answer is stored: the steers its run ended without (`unseen`,
    /// from [`split_by_pending`]) become the lane's next messages.
    pub(super) async fn requeue_unseen_steers(
        self: &Rc<Self>,
        lane: &Lane,
        unseen: Vec<SteerTaken>,
    ) {
        if unseen.is_empty() {
            return;
        }
        info!(%lane, count = unseen.len(), "steers the run ended without: the next messages");
        self.steers_to_next_messages(
            lane,
            unseen,
            "The answer ended before the agent read your guidance: it is sent as the next message.",
        )
        .await;
    }

    /// Queues stored steers as the lane's next turns (their pending records already exist) and
    /// tells the lane why; in a lane that is gone, closes them instead.
    async fn steers_to_next_messages(
        self: &Rc<Self>,
        lane: &Lane,
        steers: Vec<SteerTaken>,
        note: &str,
    ) {
        if !self.hub().lane_exists(lane) {
            let end = steers
                .into_iter()
                .map(|s| Change::EndTurn(s.message_id))
                .collect();
            if let Err(e) = self.hub().commit(end).await {
                tracing::warn!(%lane, "could not close the steers of a deleted lane: {e}");
            }
            return;
        }
        self.hub().post_system(lane, note.to_owned()).await;
        for s in steers {
            self.enqueue(
                lane.clone(),
                QueuedTurn {
                    user_message_id: s.message_id,
                    text: s.text,
                    media: Vec::new(),
                    automation: None,
                    resume_run: None,
                },
            );
        }
    }
}

/// Splits a run's steers into the ones its model saw (settled with the answer) and the ones it
/// ended without (`pending`: the text the run returned unread). The agent
/// queues steers joined by newlines and hands the model everything queued at once, so what is
/// left at the end is the joined text of the last few: the longest such tail is taken. Text the
/// agent reshaped is matched steer by steer instead, so a steer is never dropped for a
/// mismatch.
pub(super) fn split_by_pending(
    steers: Vec<SteerTaken>,
    pending: &str,
) -> (Vec<SteerTaken>, Vec<SteerTaken>) {
    let pending = pending.trim();
    if pending.is_empty() {
        return (steers, Vec::new());
    }
    for first in 0..steers.len() {
        let tail: Vec<&str> = steers[first..].iter().map(|s| s.text.trim()).collect();
        if tail.join("\n") == pending {
            let mut seen = steers;
            let unseen = seen.split_off(first);
            return (seen, unseen);
        }
    }
    steers
        .into_iter()
        .partition(|s| !pending.contains(s.text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steers(texts: &[&str]) -> Vec<SteerTaken> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| SteerTaken {
                message_id: format!("msg_{i}"),
                text: (*t).to_owned(),
            })
            .collect()
    }

    fn ids(s: &[SteerTaken]) -> Vec<&str> {
        s.iter().map(|s| s.message_id.as_str()).collect()
    }

    #[test]
    fn nothing_pending_means_every_steer_was_seen() {
        let (seen, unseen) = split_by_pending(steers(&["a", "b"]), "  ");
        assert_eq!((ids(&seen), ids(&unseen)), (vec!["msg_0", "msg_1"], vec![]));
    }

    #[test]
    fn the_pending_text_names_the_last_steers() {
        let (seen, unseen) = split_by_pending(
            steers(&["short", "in French", "no lists"]),
            "in French\nno lists",
        );
        assert_eq!(
            (ids(&seen), ids(&unseen)),
            (vec!["msg_0"], vec!["msg_1", "msg_2"])
        );
        let (seen, unseen) = split_by_pending(steers(&["a", "b"]), "a\nb");
        assert_eq!((ids(&seen), ids(&unseen)), (vec![], vec!["msg_0", "msg_1"]));
    }

    #[test]
    fn reshaped_pending_text_is_matched_steer_by_steer() {
        let (seen, unseen) =
            split_by_pending(steers(&["short", "in French"]), "[steer] in French.");
        assert_eq!((ids(&seen), ids(&unseen)), (vec!["msg_0"], vec!["msg_1"]));
    }
}
