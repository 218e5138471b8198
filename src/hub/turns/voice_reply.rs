//! Answers in a voice: in a lane whose `/voice` is `on` (or `auto`, when the message answered
//! was a voice note), the finished answer is spoken by the service `[speech]` names, and the
//! audio follows the answer's `message.stop` as a `media.offer` of kind `voice` tied to it, on
//! every device (stored, outboxed and under the media quota like any file of the agent's).
//!
//! The text never waits on the voice: it is committed first, then spoken. The service is asked
//! once, on a worker thread, within `speech.timeout_secs` (also held here, on the event loop,
//! for what else could hang); when it is down, slow or answers something that is not audio,
//! the answer stands as text and a short `system` reply under it says the voice could not be
//! made. Nothing is retried. The lane's next turn starts once the voice is offered or given
//! up, so a lane's voices come in the order of its answers; the turn's slot is held meanwhile,
//! which bounds how many answers are spoken at once (`limits.max_running_turns`).

use tracing::{info, warn};

use crate::agent::{Speaker, SpeechError, Spoken};
use crate::protocol::{HistoryMessage, Lane};
use crate::store::{Change, VoiceMode};

use super::super::errors::CommitError;
use super::lanes::QueuedTurn;
use super::{TurnPort, Turns};

/// What `/voice` answers when it is turned on but no service is set.
const NO_SERVICE: &str = "No speech service is set, so answers stay text only. Set one on the \
gateway's admin page (Agent \u{2192} Speech) or with `[speech] url` in config.toml; any \
OpenAI-compatible text-to-speech service works (OpenAI, or a Piper, Kokoro or openedai-speech \
server on your network).";

impl<P: TurnPort> Turns<P> {
    /// The speech service answers are spoken by (`None`: off); the next answer uses it.
    pub(crate) fn set_speaker(&self, speaker: Option<Speaker>) {
        match &speaker {
            Some(s) => info!(service = %s.describe(), "answers can be spoken"),
            None => info!("no speech service: answers are text only"),
        }
        *self.speaker.borrow_mut() = speaker;
        self.hub().switched_on(crate::settings::Part::Speech);
    }

    /// Where answers are spoken now (never with its key), or `None` when off.
    pub(crate) fn speech_service(&self) -> Option<String> {
        self.speaker.borrow().as_ref().map(Speaker::describe)
    }

    /// `/voice on|off|auto`: stored with the lane, then answered in words.
    pub(in crate::hub) async fn set_voice_mode(&self, lane: &Lane, value: &str) -> String {
        let mode = match value.trim().to_ascii_lowercase().as_str() {
            "on" => VoiceMode::On,
            "off" => VoiceMode::Off,
            "auto" => VoiceMode::Auto,
            _ => {
                let shown: String = value.chars().take(40).collect();
                return format!("`{shown}`: say `/voice on`, `/voice off` or `/voice auto`.");
            }
        };
        let stored = (mode != VoiceMode::Off).then_some(mode);
        if let Err(e) = self.store_voice_mode(lane, stored).await {
            warn!(%lane, "could not store the lane's voice mode: {e}");
            return format!("Could not save the setting: {e}.");
        }
        self.hub().set_lane_voice(lane, mode);
        let said = match mode {
            VoiceMode::On => "Voice on: answers in this chat are also spoken.",
            VoiceMode::Off => "Voice off: answers in this chat are text only.",
            VoiceMode::Auto => "Voice auto: answers to voice notes in this chat are also spoken.",
        };
        match (mode, self.speaker.borrow().is_some()) {
            (VoiceMode::Off, _) | (_, true) => said.to_owned(),
            (_, false) => format!("{said} {NO_SERVICE}"),
        }
    }

    async fn store_voice_mode(
        &self,
        lane: &Lane,
        mode: Option<VoiceMode>,
    ) -> Result<(), CommitError> {
        self.hub()
            .commit(vec![Change::SetLaneVoice(lane.clone(), mode)])
            .await?;
        Ok(())
    }

    /// Whether the answer to `turn` is to be spoken: the lane asked for voice (always, or for
    /// voice notes when `auto`) and a service is set.
    pub(super) fn voice_wanted(&self, lane: &Lane, turn: &QueuedTurn) -> bool {
        let wanted = match self.hub().lane_voice(lane) {
            VoiceMode::On => true,
            VoiceMode::Auto => turn.media.iter().any(|m| m.is_audio()),
            VoiceMode::Off => false,
        };
        wanted && self.speaker.borrow().is_some()
    }

    /// Speaks the committed answer `reply` and offers the audio on every device, tied to it;
    /// a failure is a `system` note under it, and the text stands.
    pub(super) async fn voice_reply(&self, lane: &Lane, reply: &HistoryMessage) {
        let Some(speaker) = self.speaker.borrow().clone() else {
            return;
        };
        // Deleted while its turn ran: its answer was not stored, and gets no voice.
        if !self.hub().lane_exists(lane) {
            return;
        }
        let timed_out = Err(SpeechError::TimedOut(speaker.timeout().as_secs()));
        let spoken = tokio::time::timeout(speaker.timeout(), speaker.speak(&reply.text))
            .await
            .unwrap_or(timed_out);
        let why = match spoken {
            Ok(Spoken {
                bytes,
                mime,
                filename,
                cut,
            }) => {
                if cut {
                    info!(%lane, "a long answer was spoken up to speech.max_chars");
                }
                let stored = self
                    .store_agent_file(
                        lane,
                        &reply.message_id,
                        filename,
                        mime,
                        "voice".into(),
                        &bytes,
                    )
                    .await;
                match stored {
                    Ok(_) => return,
                    Err(why) => format!("it could not be kept: {why}"),
                }
            }
            // Code or marks only: there was nothing to say, and nothing went wrong.
            Err(SpeechError::NothingToSay) => return,
            Err(e) => e.to_string(),
        };
        warn!(%lane, "no voice for an answer: {why}");
        let note = format!("The voice of this answer could not be made: {why}. The text above is the whole answer.");
        self.post_voice_note(lane, &reply.message_id, note, None)
            .await;
    }
}
