//! What the user typed that the gateway has not yet acknowledged: messages sent but without
//! their `read.receipt`, and lines typed while the connection was down. They survive any number
//! of reconnects and go out again in the order they were typed.

use std::collections::VecDeque;

/// Lines held at most (sent and unacknowledged, plus typed while disconnected). Past it the
/// client stops reading the terminal, so further lines wait in the terminal's own buffer:
/// nothing typed is dropped, and memory stays bounded however long the gateway is away.
pub(super) const MAX_HELD_LINES: usize = 100;

/// A `message.send` on its way: its request id and lane are kept so a resend after a reconnect
/// is the same request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unacked {
    pub(super) id: i64,
    pub(super) chat_id: String,
    pub(super) text: String,
    pub(super) media_refs: Vec<String>,
}

/// A user message the gateway stored, as `sync` replays its echo.
#[derive(Debug, Clone)]
pub(super) struct Echo {
    pub(super) message_id: String,
    pub(super) chat_id: String,
    pub(super) text: String,
}

#[derive(Default)]
pub(super) struct Held {
    /// Sent on some connection, no receipt yet, oldest first.
    unacked: VecDeque<Unacked>,
    /// Typed while disconnected (commands included), to be handled as if typed once back.
    typed: VecDeque<String>,
}

impl Held {
    pub(super) fn is_full(&self) -> bool {
        self.len() >= MAX_HELD_LINES
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn len(&self) -> usize {
        self.unacked.len() + self.typed.len()
    }

    /// A message just sent.
    pub(super) fn sent(&mut self, message: Unacked) {
        self.unacked.push_back(message);
    }

    /// A line typed while there is no connection to send it on.
    pub(super) fn typed_offline(&mut self, line: String) {
        self.typed.push_back(line);
    }

    /// A line that must be handled again first once back (an upload the connection cut).
    pub(super) fn retry_first(&mut self, line: String) {
        self.typed.push_front(line);
    }

    pub(super) fn has_typed(&self) -> bool {
        !self.typed.is_empty()
    }

    /// The next line typed offline, to handle now that the connection is back.
    pub(super) fn next_typed(&mut self) -> Option<String> {
        self.typed.pop_front()
    }

    /// The gateway answered request `id` (its receipt, or its refusal): the message it was.
    pub(super) fn answered(&mut self, id: i64) -> Option<Unacked> {
        let at = self.unacked.iter().position(|m| m.id == id)?;
        self.unacked.remove(at)
    }

    /// After a reconnect's `sync`: a message whose receipt was lost with the connection may
    /// have been stored all the same, and then its echo is among those replayed. Each unacked
    /// message takes the oldest unclaimed echo with its lane and text (the protocol carries no
    /// idempotency key, so this is how a resend is kept from doubling it). Returns the
    /// messages still to send (the same request ids) and the ids of the echoes claimed.
    pub(super) fn reconcile(&mut self, echoes: &[Echo]) -> (Vec<Unacked>, Vec<String>) {
        let mut claimed = vec![false; echoes.len()];
        let mut mine = Vec::new();
        let mut resend = Vec::new();
        for message in std::mem::take(&mut self.unacked) {
            let found = echoes.iter().enumerate().position(|(i, e)| {
                !claimed[i] && e.chat_id == message.chat_id && e.text == message.text
            });
            match found {
                Some(i) => {
                    claimed[i] = true;
                    mine.push(echoes[i].message_id.clone());
                }
                None => resend.push(message),
            }
        }
        self.unacked = resend.iter().cloned().collect();
        (resend, mine)
    }

    /// Everything still held, for the user to see when they quit.
    pub(super) fn unsent(&self) -> Vec<String> {
        self.unacked
            .iter()
            .map(|m| m.text.clone())
            .chain(self.typed.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: i64, chat: &str, text: &str) -> Unacked {
        Unacked {
            id,
            chat_id: chat.into(),
            text: text.into(),
            media_refs: Vec::new(),
        }
    }

    fn echo(id: &str, chat: &str, text: &str) -> Echo {
        Echo {
            message_id: id.into(),
            chat_id: chat.into(),
            text: text.into(),
        }
    }

    #[test]
    fn a_stored_message_is_claimed_once_and_the_rest_resent_with_their_ids() {
        let mut held = Held::default();
        held.sent(msg(5, "default", "hi"));
        held.sent(msg(6, "default", "hi"));
        held.sent(msg(7, "chan_2", "water"));
        // The first "hi" was stored; "water" arrived in another lane only.
        let echoes = [echo("m1", "default", "hi"), echo("m2", "default", "water")];
        let (resend, mine) = held.reconcile(&echoes);
        assert_eq!(mine, ["m1"]);
        assert_eq!(resend, [msg(6, "default", "hi"), msg(7, "chan_2", "water")]);
        assert_eq!(held.answered(6), Some(msg(6, "default", "hi")));
        assert_eq!(held.answered(6), None);
        assert_eq!(held.unsent(), ["water"]);
    }

    #[test]
    fn the_bound_counts_unacked_and_offline_lines_and_retries_go_first() {
        let mut held = Held::default();
        for i in 0..MAX_HELD_LINES - 1 {
            held.typed_offline(format!("line {i}"));
        }
        assert!(!held.is_full());
        held.sent(msg(1, "default", "x"));
        assert!(held.is_full());
        held.retry_first("/attach a.png".into());
        assert_eq!(held.next_typed().as_deref(), Some("/attach a.png"));
        assert_eq!(held.next_typed().as_deref(), Some("line 0"));
    }
}
