//! What a form leaves for the page it redirects to. Every form answers POST → 303 → GET, so a
//! reload repeats the GET, never the form; what the form did travels in the owner's session:
//! - an [`Outcome`], the sentence the next GET of its page shows, once;
//! - a [`Paired`] result (a new device's token), kept under a one-time id that the GET of
//!   `/admin/paired?id=…` takes: shown once, and a reload finds it gone and says so.

use super::route::Route;

/// How a sentence is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Good,
    /// It was done, with something the owner should know (saved, but the agent does not answer).
    Warn,
    Bad,
}

/// What a form did, for the next GET of `page`.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The admin page whose next GET shows it.
    pub page: Route,
    pub tone: Tone,
    pub text: String,
    /// The form's values to put back (a test that saved nothing keeps what was typed); never a
    /// secret.
    pub typed: Vec<(String, String)>,
}

impl Outcome {
    pub fn new(page: Route, tone: Tone, text: impl Into<String>) -> Outcome {
        Outcome {
            page,
            tone,
            text: text.into(),
            typed: Vec::new(),
        }
    }

    /// A value typed into the form, if this outcome kept it.
    pub fn typed(&self, key: &str) -> Option<&str> {
        self.typed
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A device just paired, until its page is shown once.
pub struct Paired {
    pub device_id: String,
    pub token: zeroize::Zeroizing<String>,
    /// The sentence above the QR code.
    pub intro: &'static str,
}
