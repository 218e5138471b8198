//! Voice notes before a turn: each voice or audio file of the message is transcribed (by the
//! service `[transcription]` names) before the agent is asked, and the agent gets the
//! transcript as the message's text. What was heard is a durable `system` message in the lane,
//! a reply to the voice note, so every device shows it live, in history, in search and after
//! `sync`; when nothing can be heard (no service, too large, a failure) the lane says why and
//! the agent still gets the note's attachment line.
//!
//! The lane never waits on the service silently: a `system` reply saying the notes are being
//! transcribed is posted before the service is asked, and `transcription.timeout_secs` is one
//! deadline for all of a message's notes, past which the agent gets them as attachments (with
//! a word that they could not be transcribed in time) and the lane's queue moves on.
//!
//! A transcript's id is derived from the user message's, so a turn run again finds the one
//! already stored and the service is asked once per note.

use tracing::{info, warn};

use crate::agent::{TranscribeError, Transcriber};
use crate::protocol::{Frame, HistoryMessage, Lane, MediaRef, Role};
use crate::store::Change;

use super::super::state::gateway_message;
use super::lanes::QueuedTurn;
use super::{TurnPort, Turns};

/// How a transcript starts and ends in its message: the lane shows what the agent heard.
const HEARD_OPEN: &str = "Heard: \u{201c}";
const HEARD_CLOSE: &str = "\u{201d}";

/// What a lane is told, once per run of the gateway, when a voice note arrives and no service
/// is set.
const NO_SERVICE: &str = "Voice notes reach the agent only as an attachment: no transcription \
service is set. Set one on the gateway's admin page (Agent \u{2192} Transcription) or with \
`[transcription] url` in config.toml; any OpenAI-compatible speech-to-text service works \
(OpenAI, Groq, or a faster-whisper or whisper.cpp server on your network).";

/// The transcript's message id for the `n`th audio file (from 0) of a user message.
fn heard_id(user_message_id: &str, n: usize) -> String {
    match n {
        0 => derived_id(user_message_id, ".heard"),
        n => derived_id(user_message_id, &format!(".heard{}", n + 1)),
    }
}

/// The id of the "transcribing" note posted before a user message's voice notes are heard.
fn hearing_id(user_message_id: &str) -> String {
    derived_id(user_message_id, ".hearing")
}

/// The user message's id with `suffix`, so a rerun of the turn finds what it stored.
fn derived_id(user_message_id: &str, suffix: &str) -> String {
    let id = format!("{user_message_id}{suffix}");
    if crate::protocol::is_valid_id(&id) {
        id
    } else {
        // Too long to derive from: a fresh id (a rerun may then transcribe again).
        crate::ids::message_id()
    }
}

/// What the lane shows while its voice notes are being transcribed.
fn transcribing_note(notes: usize, timeout: std::time::Duration) -> String {
    let what = match notes {
        1 => "the voice note".to_owned(),
        n => format!("{n} voice notes"),
    };
    format!(
        "Transcribing {what}\u{2026} (the agent is asked once it is heard, or after {} s without it)",
        timeout.as_secs()
    )
}

/// Whether `id` is the id of a transcript of the user message `user_message_id`.
pub(super) fn is_heard_of(id: &str, user_message_id: &str) -> bool {
    id.strip_prefix(user_message_id)
        .and_then(|rest| rest.strip_prefix(".heard"))
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

impl<P: TurnPort> Turns<P> {
    /// The transcription service new voice notes go to (`None`: off); the next voice note uses
    /// it.
    pub(crate) fn set_transcriber(&self, transcriber: Option<Transcriber>) {
        match &transcriber {
            Some(t) => info!(service = %t.describe(), "voice notes are transcribed"),
            None => info!("no transcription service: voice notes reach the agent as attachments"),
        }
        *self.transcriber.borrow_mut() = transcriber;
        self.hub().switched_on(crate::settings::Part::Transcription);
    }

    /// Where voice notes are transcribed now (never with its key), or `None` when off.
    pub(crate) fn transcription_service(&self) -> Option<String> {
        self.transcriber
            .borrow()
            .as_ref()
            .map(Transcriber::describe)
    }

    /// The text the agent gets for a queued turn (the typed text, then the transcript of each
    /// voice note) and the media ids of the notes it carries the words of. Transcripts (or why
    /// there is none) are posted in the lane first.
    pub(super) async fn hear(&self, lane: &Lane, turn: &QueuedTurn) -> (String, Vec<String>) {
        let audio: Vec<&MediaRef> = turn.media.iter().filter(|m| m.is_audio()).collect();
        // A followed run already has its message: nothing to hear again.
        if audio.is_empty() || turn.resume_run.is_some() {
            return (turn.text.clone(), Vec::new());
        }
        let voice_id = turn.user_message_id.as_str();
        let transcriber = self.transcriber.borrow().clone();
        let mut heard = Vec::new();
        let mut heard_notes = Vec::new();
        let stored: Vec<Option<String>> = (0..audio.len())
            .map(|n| self.stored_transcript(&heard_id(voice_id, n)))
            .collect();
        let to_hear = stored.iter().filter(|s| s.is_none()).count();
        let deadline = tokio::time::Instant::now()
            + transcriber
                .as_ref()
                .map_or(std::time::Duration::ZERO, Transcriber::timeout);
        if let (Some(t), true) = (&transcriber, to_hear > 0) {
            // Shown before the service is asked, on every device: the lane is waiting on the
            // transcription, not on nothing.
            let note = transcribing_note(to_hear, t.timeout());
            self.post_voice_note(lane, voice_id, note, Some(hearing_id(voice_id)))
                .await;
        }
        for ((n, m), stored) in audio.into_iter().enumerate().zip(stored) {
            let id = heard_id(voice_id, n);
            if let Some(text) = stored {
                heard.push(text);
                heard_notes.push(m.media_id.clone());
                continue;
            }
            let Some(t) = &transcriber else {
                let first = self.voice_noticed.borrow_mut().insert(lane.clone());
                if first {
                    self.post_voice_note(lane, voice_id, NO_SERVICE.to_owned(), None)
                        .await;
                }
                continue;
            };
            // One deadline for all of the message's notes, so the lane waits at most
            // `timeout_secs` however many there are. The worker's HTTP call has the same bound;
            // this one also holds what else could hang (reading the file, a stuck worker).
            let timed_out = Err(TranscribeError::TimedOut(t.timeout().as_secs()));
            let answer = if tokio::time::Instant::now() >= deadline {
                timed_out
            } else {
                tokio::time::timeout_at(deadline, self.transcribe_media(t, m))
                    .await
                    .unwrap_or(timed_out)
            };
            match answer {
                Ok(text) if text.is_empty() => {
                    let note = format!(
                        "The transcription service heard no words in \u{201c}{}\u{201d}; the agent was told it is attached.",
                        m.filename
                    );
                    self.post_voice_note(lane, voice_id, note, None).await;
                }
                Ok(text) => {
                    let shown = format!("{HEARD_OPEN}{text}{HEARD_CLOSE}");
                    self.post_voice_note(lane, voice_id, shown, Some(id)).await;
                    heard.push(text);
                    heard_notes.push(m.media_id.clone());
                }
                Err(TranscribeError::TimedOut(secs)) => {
                    warn!(%lane, file = %m.filename, "voice note not transcribed in {secs} s");
                    let note = format!(
                        "\u{201c}{}\u{201d} could not be transcribed in time: the service did not answer within {secs} seconds (transcription.timeout_secs). The agent got it as an attachment.",
                        m.filename
                    );
                    self.post_voice_note(lane, voice_id, note, None).await;
                    heard.push(format!(
                        "[The voice note {} could not be transcribed in time.]",
                        m.filename
                    ));
                }
                Err(e) => {
                    warn!(%lane, file = %m.filename, "voice note not transcribed: {e}");
                    let note = format!(
                        "\u{201c}{}\u{201d} was not transcribed: {e}. The agent was told it is attached.",
                        m.filename
                    );
                    self.post_voice_note(lane, voice_id, note, None).await;
                }
            }
        }
        (agent_text(&turn.text, &heard), heard_notes)
    }

    /// A transcript stored for this id by an earlier run of the turn.
    fn stored_transcript(&self, id: &str) -> Option<String> {
        let (_, m) = self.hub().store().message(id).ok().flatten()?;
        transcript_of(&m)
    }

    /// Sends one stored file to the service (read and sent on a worker thread).
    async fn transcribe_media(
        &self,
        t: &Transcriber,
        m: &MediaRef,
    ) -> Result<String, TranscribeError> {
        // Refused before a byte is read: the size is known from the upload.
        if m.size.max(0) as u64 > t.max_bytes() {
            return Err(TranscribeError::TooLarge {
                size: m.size as u64,
                limit: t.max_bytes(),
            });
        }
        let record = self
            .hub()
            .store()
            .media(&m.media_id)
            .map_err(|e| TranscribeError::Unreadable(e.to_string()))?
            .ok_or_else(|| TranscribeError::Unreadable("it was deleted".into()))?;
        let path = self.hub().media().blob_path(&record.sha256);
        t.transcribe_file(path, m.filename.clone(), m.mime.clone())
            .await
    }

    /// Commits a `system` message answering `reply_to`: durable, outboxed, live on every device.
    pub(super) async fn post_voice_note(
        &self,
        lane: &Lane,
        reply_to: &str,
        text: String,
        id: Option<String>,
    ) {
        // Deleted while its note was being heard: its history is gone, and so is the reply.
        if !self.hub().lane_exists(lane) {
            return;
        }
        let mut message: HistoryMessage = gateway_message(Role::System, text);
        if let Some(id) = id {
            message.message_id = id;
        }
        let frame = Frame::message(&message)
            .with_reply_to(Some(reply_to))
            .in_lane(&lane.chat_id, lane.thread());
        let changes = vec![
            Change::PutMessage(lane.clone(), message.clone()),
            Change::OutboxOf {
                message_id: message.message_id,
                frame: frame.outboxed(),
            },
        ];
        if let Err(e) = self.hub().commit(changes).await {
            warn!(%lane, "could not store a voice note's transcript or note: {e}");
        }
    }
}

/// What was heard, when `m` is a voice note's transcript (a `system` message with a derived id).
pub(super) fn transcript_of(m: &HistoryMessage) -> Option<String> {
    if m.role != Role::System || !m.message_id.contains(".heard") {
        return None;
    }
    let inner = m.text.strip_prefix(HEARD_OPEN)?.strip_suffix(HEARD_CLOSE)?;
    Some(inner.to_owned())
}

/// The typed text first, then each transcript, as one message.
pub(super) fn agent_text(typed: &str, heard: &[String]) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if !typed.trim().is_empty() {
        parts.push(typed);
    }
    parts.extend(heard.iter().map(String::as_str));
    parts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_text_comes_first() {
        assert_eq!(agent_text("", &["hello".into()]), "hello");
        assert_eq!(
            agent_text("see this", &["a".into(), "b".into()]),
            "see this\n\na\n\nb"
        );
        assert_eq!(agent_text("only typed", &[]), "only typed");
    }

    #[test]
    fn heard_ids_are_derived_and_valid() {
        assert_eq!(heard_id("msg_1", 0), "msg_1.heard");
        assert_eq!(heard_id("msg_1", 1), "msg_1.heard2");
        assert!(heard_id(&"m".repeat(64), 0).starts_with("msg_"));
        assert!(is_heard_of("msg_1.heard", "msg_1") && is_heard_of("msg_1.heard3", "msg_1"));
        assert!(!is_heard_of("msg_12.heard", "msg_1") && !is_heard_of("msg_1.heardx", "msg_1"));
        // The "transcribing" note is not taken for a transcript.
        assert_eq!(hearing_id("msg_1"), "msg_1.hearing");
        assert!(!is_heard_of(&hearing_id("msg_1"), "msg_1"));
        assert!(hearing_id(&"m".repeat(64)).starts_with("msg_"));
    }
}
