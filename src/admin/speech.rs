//! The Agent page's Speech section: where answers are spoken for lanes that asked for voice
//! (`/voice`). Saved in `settings.toml`'s `[speech]` and applied at once (the next answer uses
//! it); Test asks the service to speak one short sentence. As with the agent and
//! transcription, a key goes only to the address it was saved for and is never shown back.

use maud::{html, Markup};

use super::pages::{key_note, notice, Notice};
use super::route::Route;
use crate::agent::Speaker;
use crate::config::speech::{MAX_CHARS, MAX_TIMEOUT_SECS};
use crate::web::csrf_field;

/// What Test asks the service to say.
const TEST_SENTENCE: &str = "This is the Iris gateway testing its voice.";

/// What the speech form shows: never the key itself.
pub(super) struct SpeechView<'a> {
    pub url: &'a str,
    pub model: &'a str,
    pub voice: &'a str,
    pub format: &'a str,
    pub timeout_secs: &'a str,
    pub max_chars: &'a str,
    pub key_set: bool,
    /// The service answers are spoken by now, or `None` when it is off.
    pub now: Option<String>,
    /// The form shows what was typed for a test, and a key was typed: it is not shown back.
    pub key_typed: bool,
}

/// The section's HTML, in the page's form pattern (labels over inputs, Save and Test).
/// (The form's handler and its checks are in `forms.rs`, with the other forms'.)
pub(super) fn section(v: &SpeechView, csrf: &str, n: &Notice) -> Markup {
    let (save, test) = (Route::Speech, Route::SpeechTest);
    html! {
        h2 id="speech" { "Speech" }
        (notice(n))
        p {
            "In a chat where someone said " code { "/voice on" } " (or " code { "/voice auto" }
            ", for answers to voice notes), the agent's answer is also spoken, by any \
             OpenAI-compatible text-to-speech service (OpenAI, or a Piper, Kokoro or \
             openedai-speech server on your network), and reaches every phone as a voice message \
             after its text."
        }
        p {
            "Now: "
            span id="speech-now" {
                @match &v.now {
                    Some(d) => { "answers are spoken by " (d) }
                    None => "off: answers are text only",
                }
            }
        }
        form method="post" action=(save) id="speech-form" {
            (csrf_field(csrf))
            label for="s-url" {
                "URL, with its version (e.g. http://192.168.1.20:8880/v1 or \
                 https://api.openai.com/v1; empty: off)"
            }
            input type="url" id="s-url" name="url" value=(v.url) maxlength="2048";
            label for="s-key" { "Key" }
            input type="password" id="s-key" name="key" autocomplete="off" maxlength="4096";
            small { (key_note(v.key_typed, v.key_set, "speech key")) }
            label {
                input type="checkbox" name="clear_key" value="1";
                " Remove the saved key"
            }
            label for="s-model" { "Model" }
            input type="text" id="s-model" name="model" value=(v.model) maxlength="256";
            label for="s-voice" { "Voice (the service's name for it)" }
            input type="text" id="s-voice" name="voice" value=(v.voice) maxlength="256";
            label for="s-format" {
                "Audio format (opus: Ogg Opus, small, played as a voice message)"
            }
            select id="s-format" name="format" {
                @for (name, _, _) in crate::config::speech::FORMATS {
                    option value=(name) selected[*name == v.format] { (name) }
                }
            }
            label for="s-timeout" {
                "Longest wait, in seconds (past it the answer stays text only, with a note)"
            }
            input type="number" id="s-timeout" name="timeout_secs" value=(v.timeout_secs) min="1"
                max=(MAX_TIMEOUT_SECS) step="1";
            label for="s-max-chars" {
                "Most characters spoken (a longer answer is spoken up to there, and says so)"
            }
            input type="number" id="s-max-chars" name="max_chars" value=(v.max_chars) min="1"
                max=(MAX_CHARS) step="1";
            p {
                button id="speech-save" formaction=(save) {
                    "Save (applies to the next answer)"
                }
                " "
                button id="speech-test" formaction=(test) { "Test (speaks one sentence)" }
            }
        }
    }
}

/// What the service makes of one sentence: how much audio, or what went wrong, in words.
/// Bounded by the service's own `timeout_secs` (at most `MAX_TIMEOUT_SECS`).
pub(super) async fn test(s: &Speaker) -> Result<String, String> {
    match tokio::time::timeout(s.timeout(), s.speak(TEST_SENTENCE)).await {
        Err(_) => Err(format!(
            "{}: no answer within {} s",
            s.describe(),
            s.timeout().as_secs()
        )),
        Ok(Err(e)) => Err(format!("Not working: {e}")),
        Ok(Ok(spoken)) => Ok(format!(
            "It works: {} spoke a test sentence as {} bytes of {}.",
            s.describe(),
            spoken.bytes.len(),
            spoken.mime
        )),
    }
}
