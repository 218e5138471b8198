//! The signed-in owner's forms: sign-out, passphrase, devices, agent, push. Each is
//! reached only after its CSRF token was checked (`super::serve_page`), and each answers with a
//! 303 to the page it belongs to, leaving what it did in the session for that page's next GET
//! (`outcome.rs`): reloading what the browser shows repeats a GET, never the form.

use std::rc::Rc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use tracing::info;

use super::context::SignedIn;
use super::outcome::{Outcome, Paired, Tone};
use super::pages::{self, Notice};
use super::reply::{redirect, redirect_to, sentence, set_cookies, signed_page, Refusal, Reply};
use super::route::Route;
use super::{
    hash_new, limited_notice, owner, retry_after, session, strength, verify, Admin, Form, Hashing,
};
use crate::agent::Agent;
use crate::config::Config;
use crate::hub::{Hub, TestTarget};
use crate::settings::{Hidden, Settings};

/// The ntfy topic the push test offers: any name works for a test.
pub(super) const TEST_TOPIC: &str = "iris-gateway-test";
/// Longest ntfy topic the test accepts (ntfy's own limit).
const MAX_TOPIC_CHARS: usize = 64;

/// How long "Test connection" waits for the agent.
pub(super) const TEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the transcription form's "Test" waits: a service on a small box may first load
/// its model.
pub(super) const TRANSCRIPTION_TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest agent URL, model name and key accepted from the form.
pub(super) const MAX_URL_BYTES: usize = 2048;
pub(super) const MAX_MODEL_BYTES: usize = 256;
pub(super) const MAX_KEY_BYTES: usize = 4096;

/// The signed-in forms (POST), after their CSRF token was checked: each does one thing and
/// answers with the section it belongs to.
pub(super) async fn post(
    admin: &Admin,
    hub: &Rc<Hub>,
    owner: &owner::Owner,
    who: &SignedIn,
    route: &Route,
    form: &Form,
) -> Result<Reply, Refusal> {
    let post = Post {
        admin,
        hub,
        form,
        who,
    };
    match route {
        Route::SignOut => Ok(post.sign_out()),
        Route::Passphrase => post.change_passphrase(owner).await,
        Route::DevicesPair => post.pair_device().await,
        Route::DevicesRename => post.rename_device().await,
        Route::DevicesRevoke => post.revoke_device().await,
        Route::Agent => post.agent(false).await,
        Route::AgentTest => post.agent(true).await,
        Route::Transcription => post.transcription(false).await,
        Route::TranscriptionTest => post.transcription(true).await,
        Route::Speech => post.speech(false).await,
        Route::SpeechTest => post.speech(true).await,
        Route::Push => post.save_push().await,
        Route::PushTest => post.test_push().await,
        _ => Err(Refusal::NotFound),
    }
}

/// One signed-in form being answered: what every form's handler needs, so each is a method
/// instead of one long match.
struct Post<'a> {
    admin: &'a Admin,
    hub: &'a Rc<Hub>,
    form: &'a Form,
    who: &'a SignedIn,
}

/// A store or file failure behind a form: the page says the gateway could not do it now.
fn unavailable(e: &dyn std::fmt::Display) -> Refusal {
    Refusal::Unavailable(e.to_string())
}

impl Post<'_> {
    /// Leaves `outcome` for its page and sends the browser there.
    fn done(&self, outcome: Outcome) -> Result<Reply, Refusal> {
        let to = redirect_to(&outcome.page);
        self.admin
            .sessions
            .borrow_mut()
            .leave(self.who.key(), outcome);
        Ok(to)
    }

    fn said(&self, page: Route, tone: Tone, text: impl Into<String>) -> Result<Reply, Refusal> {
        self.done(Outcome::new(page, tone, text))
    }

    fn sign_out(&self) -> Reply {
        self.admin.sessions.borrow_mut().end_all();
        info!(peer = %self.who.peer(), "admin page: signed out (every session ended)");
        let mut reply = redirect_to(&Route::Home);
        set_cookies(&mut reply, &[self.who.ctx().cookie(session::COOKIE, "")]);
        reply
    }

    async fn change_passphrase(&self, owner: &owner::Owner) -> Result<Reply, Refusal> {
        let (admin, form) = (self.admin, self.form);
        let (new, confirm) = (form.get("passphrase"), form.get("confirm"));
        let bad = |t: &str| self.said(Route::Owner, Tone::Bad, t);
        if new != confirm {
            return bad("The two new passphrases differ.");
        }
        let rated = strength::rate_for_owner(self.hub, new).await;
        if !rated.ok {
            return bad(&rated.words);
        }
        // The same passphrase as at sign-in, so the same count: a session (an unlocked
        // browser left alone) must not buy guesses at a secret that outlives it. Counted as
        // it begins, as at sign-in.
        let begun = admin
            .signin
            .borrow_mut()
            .begin(self.who.peer().ip(), Instant::now());
        let attempt = match begun {
            Ok(a) => a,
            Err(limited) => {
                // Said in place with its status and Retry-After: nothing changed, so a reload
                // changes nothing either.
                let (n, secs) = limited_notice(limited, self.who.peer(), "passphrase change");
                let mut reply = signed_page(
                    admin,
                    self.who,
                    StatusCode::TOO_MANY_REQUESTS,
                    "Owner",
                    &Route::Owner,
                    pages::owner(self.who.csrf(), &Notice::Bad(&n)),
                );
                retry_after(&mut reply, secs);
                return Ok(reply);
            }
        };
        if !verify(admin, owner, form.get("current")).await {
            info!(peer = %self.who.peer(), "admin page: wrong current passphrase in a change");
            return bad("The current passphrase is not right.");
        }
        admin.signin.borrow_mut().succeeded(attempt, Instant::now());
        let fresh = hash_new(admin, new, Hashing::Always)
            .await
            .map_err(|e| unavailable(&e))?
            .ok_or_else(|| unavailable(&"the passphrase could not be hashed"))?;
        owner::store(&admin.data_dir, &fresh).map_err(|e| unavailable(&e))?;
        admin.sessions.borrow_mut().end_all();
        info!(peer = %self.who.peer(), "admin page: passphrase changed (every session ended)");
        let mut reply = redirect(&format!("{}?changed=passphrase", Route::Home));
        set_cookies(&mut reply, &[self.who.ctx().cookie(session::COOKIE, "")]);
        Ok(reply)
    }

    /// Pairs a device and keeps its token for one showing (`outcome.rs`): a reload of the
    /// page that shows it pairs nothing and shows nothing again.
    async fn pair_device(&self) -> Result<Reply, Refusal> {
        let name = self.form.get("name").trim();
        let (device, token) = self
            .hub
            .devices()
            .pair(name)
            .await
            .map_err(|e| unavailable(&e))?;
        let paired = Paired {
            device_id: device.device_id,
            token: zeroize::Zeroizing::new(token),
            intro: "Pair the phone with:",
        };
        let once = self
            .admin
            .sessions
            .borrow_mut()
            .keep_paired(self.who.key(), paired);
        Ok(redirect(&format!("{}?id={once}", Route::Paired)))
    }

    async fn rename_device(&self) -> Result<Reply, Refusal> {
        let id = self.form.get("device_id");
        let found = self
            .hub
            .devices()
            .rename(id, self.form.get("name").trim())
            .await
            .map_err(|e| unavailable(&e))?;
        if !found {
            return Err(Refusal::BadInput(format!("no device `{}`", cut(id))));
        }
        self.said(Route::Devices, Tone::Good, "Renamed.")
    }

    async fn revoke_device(&self) -> Result<Reply, Refusal> {
        let id = self.form.get("device_id");
        let existed = self
            .hub
            .devices()
            .revoke(id)
            .await
            .map_err(|e| unavailable(&e))?;
        if !existed {
            return Err(Refusal::BadInput(format!("no device `{}`", cut(id))));
        }
        self.said(
            Route::Devices,
            Tone::Good,
            "Revoked: its token no longer works and it was disconnected.",
        )
    }

    /// What was typed into a form, to show again after a test (never a secret: whether a key
    /// was typed is kept, the key is not).
    fn typed(&self, form: &str, keys: &[&str], tone: Tone, text: String) -> Outcome {
        let mut typed: Vec<(String, String)> = keys
            .iter()
            .map(|k| ((*k).to_owned(), self.form.get(k).trim().to_owned()))
            .collect();
        typed.push(("form".into(), form.into()));
        let key_typed = !self.form.get("key").is_empty();
        typed.push(("key_typed".into(), if key_typed { "1" } else { "0" }.into()));
        Outcome {
            typed,
            ..Outcome::new(Route::Agent, tone, text)
        }
    }

    /// Saves the agent form (new turns use it at once) and then tries the agent, or with `test`
    /// only tries it and brings the form back as typed.
    async fn agent(&self, test: bool) -> Result<Reply, Refusal> {
        let admin = self.admin;
        let keep = |tone, text: String| {
            self.done(self.typed("agent", &["backend", "url", "model"], tone, text))
        };
        let (config, saved) = agent_from_form(admin, self.form)?;
        let agent = match crate::agent::from_config(&config) {
            Ok(a) => a,
            Err(e) => return keep(Tone::Bad, format!("Not usable: {e}.")),
        };
        if test {
            return match test_agent(agent.as_ref()).await {
                Ok(t) => keep(Tone::Good, sentence(&t)),
                Err(t) => keep(Tone::Bad, sentence(&format!("Not working: {t}"))),
            };
        }
        saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
        admin.agent.replace(agent);
        admin.config.apply(|c| *c = config);
        self.hub.status().agent_switched();
        info!(peer = %self.who.peer(), agent = %admin.agent.describe(), "admin page: agent settings saved; new turns use them");
        // Saved is not the same as working: say which, now, rather than on the next message.
        match test_agent(&*admin.agent).await {
            Ok(_) => self.said(
                Route::Agent,
                Tone::Good,
                "Saved: new messages go to this agent, and it answers.",
            ),
            Err(t) => self.said(
                Route::Agent,
                Tone::Warn,
                sentence(&format!("Saved, but the agent does not answer: {t}")),
            ),
        }
    }

    /// Saves the transcription form (the next voice note uses it), or with `test` sends the
    /// service a one-second tone and shows its answer or what went wrong.
    async fn transcription(&self, test: bool) -> Result<Reply, Refusal> {
        let admin = self.admin;
        let section = |tone, text: &str| {
            // A test brings the form back as typed; a save shows what was saved.
            let o = if test {
                self.typed(
                    "transcription",
                    &["url", "model", "language", "timeout_secs"],
                    tone,
                    sentence(text),
                )
            } else {
                let mut o = Outcome::new(Route::Agent, tone, sentence(text));
                o.typed.push(("form".into(), "transcription".into()));
                o
            };
            self.done(o)
        };
        let (config, saved) = transcription_from_form(admin, self.form)?;
        let t = &config.transcription;
        let transcriber =
            match crate::agent::Transcriber::from_config(t, config.limits.transcription_bytes) {
                Ok(tr) => tr,
                Err(e) => return section(Tone::Bad, &format!("Not usable: {e}")),
            };
        if test {
            let Some(tr) = transcriber else {
                return section(
                    Tone::Bad,
                    "Nothing to test: the URL is empty, so transcription is off.",
                );
            };
            return match test_transcription(&tr).await {
                Ok(t) => section(Tone::Good, &t),
                Err(t) => section(Tone::Bad, &t),
            };
        }
        saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
        let said = match &transcriber {
            Some(tr) => format!(
                "Saved: the next voice note is transcribed by {}.",
                tr.describe()
            ),
            None => {
                "Saved: transcription is off; voice notes reach the agent as an attachment line."
                    .to_owned()
            }
        };
        let transcription = config.transcription.clone();
        self.admin.config.apply(|c| c.transcription = transcription);
        self.hub.turns().set_transcriber(transcriber);
        info!(peer = %self.who.peer(), "admin page: transcription settings saved; the next voice note uses them");
        section(Tone::Good, &said)
    }

    /// Saves the speech form (the next answer uses it), or with `test` asks the service to
    /// speak one sentence and shows how much audio came back or what went wrong.
    async fn speech(&self, test: bool) -> Result<Reply, Refusal> {
        let admin = self.admin;
        let section = |tone, text: &str| {
            // A test brings the form back as typed; a save shows what was saved.
            let o = if test {
                let fields = [
                    "url",
                    "model",
                    "voice",
                    "format",
                    "timeout_secs",
                    "max_chars",
                ];
                self.typed("speech", &fields, tone, sentence(text))
            } else {
                let mut o = Outcome::new(Route::Agent, tone, sentence(text));
                o.typed.push(("form".into(), "speech".into()));
                o
            };
            self.done(o)
        };
        let (config, saved) = speech_from_form(admin, self.form)?;
        let speaker = match crate::agent::Speaker::from_config(&config.speech) {
            Ok(s) => s,
            Err(e) => return section(Tone::Bad, &format!("Not usable: {e}")),
        };
        if test {
            let Some(s) = speaker else {
                return section(
                    Tone::Bad,
                    "Nothing to test: the URL is empty, so speech is off.",
                );
            };
            return match super::speech::test(&s).await {
                Ok(t) => section(Tone::Good, &t),
                Err(t) => section(Tone::Bad, &t),
            };
        }
        saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
        let said = match &speaker {
            Some(s) => format!(
                "Saved: answers in chats with /voice on are spoken by {}.",
                s.describe()
            ),
            None => "Saved: speech is off; answers are text only.".to_owned(),
        };
        let speech = config.speech.clone();
        self.admin.config.apply(|c| c.speech = speech);
        self.hub.turns().set_speaker(speaker);
        info!(peer = %self.who.peer(), "admin page: speech settings saved; the next answer uses them");
        section(Tone::Good, &said)
    }

    /// Saves the push form; it applies at the next start. FCM is saved only with a key that
    /// works (uploaded with the form, or the one already in use): push that cannot start would
    /// only be switched off at the next start.
    async fn save_push(&self) -> Result<Reply, Refusal> {
        let (admin, form) = (self.admin, self.form);
        let mut saved = Settings::load(&admin.data_dir).map_err(|e| unavailable(&e))?;
        let backend = form.get("backend");
        if !matches!(backend, "none" | "ntfy" | "fcm") {
            return Err(Refusal::BadInput(
                "backend must be none, ntfy or fcm".into(),
            ));
        }
        let content = form.get("content");
        if !matches!(content, "full" | "preview" | "title" | "none") {
            return Err(Refusal::BadInput(
                "content must be full, preview, title or none".into(),
            ));
        }
        let server = checked_url(form.get("ntfy_server"), "the ntfy server")?;
        let token = form.get("ntfy_token");
        if token.len() > MAX_KEY_BYTES {
            return Err(Refusal::BadInput(format!(
                "the token is over {MAX_KEY_BYTES} bytes"
            )));
        }
        // The server the saved (or configured) credentials were given for, before this form.
        let mut before = admin.config.get();
        saved.apply(&mut before);
        let key = fcm_key(form.get("fcm_key"), backend, &before).await?;
        saved.push.backend = Some(backend.to_owned());
        saved.push.content = Some(content.to_owned());
        if !server.is_empty() {
            saved.push.ntfy_server = Some(server.to_owned());
        }
        if !token.is_empty() {
            saved.push.ntfy_token = Some(Hidden(token.to_owned()));
        } else if !server.is_empty()
            && !admin.pinned.contains("push.ntfy_server")
            && !same_server(server, &before.push.ntfy_server)
        {
            // As for the agent key: credentials go only to the server they were given for.
            // An empty saved token means none at all (`Settings::apply`).
            if admin.pinned.contains("push.ntfy_token") {
                return Err(Refusal::BadInput(
                    "the ntfy token is set by a command-line flag for the current server; it \
                     is not sent to a new one: change the server where the token is set"
                        .into(),
                ));
            }
            saved.push.ntfy_token = Some(Hidden(String::new()));
        }
        let mut said = String::from("Saved");
        if let Some((text, summary)) = key {
            let path = admin.data_dir.join(crate::settings::FCM_KEY_FILE);
            // Found by its name from now on (`Settings::load`): nothing more to save for it.
            crate::atomic_file::write(&path, text.as_bytes(), 0o600)
                .map_err(|e| unavailable(&e))?;
            said = format!(
                "Saved, with the FCM key of {} (project {})",
                summary.client_email, summary.project_id
            );
            info!(peer = %self.who.peer(), project = %summary.project_id, "admin page: an FCM service-account key was uploaded");
        }
        saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
        info!(peer = %self.who.peer(), "admin page: push settings saved (they apply at the next start)");
        self.said(
            Route::Push,
            Tone::Good,
            format!("{said}. Push settings apply when the gateway restarts (Restart now, below)."),
        )
    }

    /// Sends one push now with the saved settings, to a registered device or to a topic typed
    /// on the page (so push can be tried before any phone registered), and says what the push
    /// server answered.
    async fn test_push(&self) -> Result<Reply, Refusal> {
        let admin = self.admin;
        let saved = Settings::load(&admin.data_dir).map_err(|e| unavailable(&e))?;
        let mut config = admin.config.get();
        let running = config.push.clone();
        saved.apply(&mut config);
        let device = self.form.get("device_id");
        let topic = self.form.get("topic").trim();
        let to = if !device.is_empty() {
            TestTarget::Device(device)
        } else if (1..=MAX_TOPIC_CHARS).contains(&topic.chars().count())
            && topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            TestTarget::Topic(topic)
        } else {
            return Err(Refusal::BadInput(format!(
                "an ntfy topic is 1 to {MAX_TOPIC_CHARS} letters, digits, - or _"
            )));
        };
        // Only a test of the settings running now says whether push works now.
        let is_running = running.backend == config.push.backend
            && running.ntfy_server == config.push.ntfy_server
            && running.ntfy_token == config.push.ntfy_token;
        match self
            .hub
            .devices()
            .test_push(&config.push, is_running, to)
            .await
        {
            Ok(place) => self.said(
                Route::Push,
                Tone::Good,
                format!("The test push reached {place}: the push server accepted it."),
            ),
            Err(e) => self.said(Route::Push, Tone::Bad, sentence(&e.to_string())),
        }
    }
}

/// The FCM key the push form brings (its text, to store, and who it is for), checked on a
/// blocking thread (an RSA key is parsed). With `fcm` chosen and no upload, the key in use
/// must work, or nothing is saved.
async fn fcm_key(
    upload: &str,
    backend: &str,
    before: &Config,
) -> Result<Option<(String, crate::push::KeySummary)>, Refusal> {
    use crate::push::MAX_FCM_KEY_BYTES;
    let upload = upload.trim();
    if upload.len() > MAX_FCM_KEY_BYTES {
        return Err(Refusal::BadInput(format!(
            "the key file is over {MAX_FCM_KEY_BYTES} bytes: it is not a service-account key; \
             nothing was saved"
        )));
    }
    if upload.is_empty() && backend != "fcm" {
        return Ok(None);
    }
    // No upload: the key in use is what FCM would start with.
    let stored =
        match (upload.is_empty(), before.push.fcm_credentials.clone()) {
            (false, _) => None,
            (true, Some(path)) => Some(path),
            (true, None) => return Err(Refusal::BadInput(
                "Firebase (FCM) needs its service-account key: choose the key file (JSON, from \
                 the Firebase console: Project settings, Service accounts) and save again; \
                 nothing was saved"
                    .into(),
            )),
        };
    let text = upload.to_owned();
    let checked = tokio::task::spawn_blocking(move || match stored {
        Some(path) => {
            let in_use = crate::push::read_key_file(&path)?;
            crate::push::check_key(&in_use).map(|_| None)
        }
        None => crate::push::check_key(&text).map(|summary| Some((text, summary))),
    })
    .await
    .map_err(|e| unavailable(&e))?;
    checked.map_err(|e| {
        let whose = if upload.is_empty() {
            "the FCM key in use"
        } else {
            "the uploaded file"
        };
        Refusal::BadInput(format!(
            "{whose} cannot work ({e}): choose the service-account key file from the Firebase \
             console; nothing was saved"
        ))
    })
}

/// Two server URLs name the same server (a trailing `/` aside).
fn same_server(a: &str, b: &str) -> bool {
    a.trim().trim_end_matches('/') == b.trim().trim_end_matches('/')
}

/// At most 64 characters of something a client sent, for a message.
pub(super) fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An http(s) URL from a form, or empty; refused otherwise.
pub(super) fn checked_url<'a>(url: &'a str, what: &str) -> Result<&'a str, Refusal> {
    let url = url.trim();
    if url.len() > MAX_URL_BYTES {
        return Err(Refusal::BadInput(format!(
            "{what} URL is over {MAX_URL_BYTES} bytes"
        )));
    }
    if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
        return Err(Refusal::BadInput(format!(
            "{what} URL must start with http:// or https://"
        )));
    }
    Ok(url)
}

/// The configuration the agent form asks for (flags still win), and the settings to save.
pub(super) fn agent_from_form(admin: &Admin, form: &Form) -> Result<(Config, Settings), Refusal> {
    let backend = form.get("backend");
    if !matches!(backend, "demo" | "hermes" | "openai") {
        return Err(Refusal::BadInput(
            "backend must be demo, hermes or openai".into(),
        ));
    }
    let url = checked_url(form.get("url"), "the agent")?;
    let model = form.get("model").trim();
    let key = form.get("key");
    if model.len() > MAX_MODEL_BYTES || key.len() > MAX_KEY_BYTES {
        return Err(Refusal::BadInput(format!(
            "the model is at most {MAX_MODEL_BYTES} bytes and the key {MAX_KEY_BYTES}"
        )));
    }
    let mut saved =
        Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    saved.agent.backend = Some(backend.to_owned());
    saved.agent.url = Some(url.to_owned());
    saved.agent.model = Some(model.to_owned());
    let typed = !key.is_empty();
    if form.get("clear_key") == "1" {
        saved.agent.key = Some(Hidden(String::new()));
    } else if typed {
        saved.agent.key = Some(Hidden(key.trim().to_owned()));
    }
    let old = admin.config.get();
    let mut config = old.clone();
    saved.apply(&mut config);
    // A flag outranks the page: put back what each flag set.
    for key in admin.pinned.iter() {
        match *key {
            "agent.backend" => config.agent.backend = old.agent.backend.clone(),
            "agent.url" => config.agent.url = old.agent.url.clone(),
            "agent.key" => {
                config.agent.key = old.agent.key.clone();
                config.agent.key_file = old.agent.key_file.clone();
            }
            "agent.model" => config.agent.model = old.agent.model.clone(),
            _ => {}
        }
    }
    // A key was given for one address: a new address with the key field left empty gets no
    // key, for a test as for a save, or a typo'd or hostile URL would receive it. The saved
    // key is dropped, not kept for later, so it can never follow the URL afterwards either.
    if !typed && config.agent.base_url() != old.agent.base_url() {
        if admin.pinned.contains("agent.key") {
            return Err(Refusal::BadInput(
                "the agent key is set by a command-line flag for the current URL; it is not \
                 sent to a new one: change the URL where the key is set"
                    .into(),
            ));
        }
        saved.agent.key = Some(Hidden(String::new()));
        config.agent.key = crate::config::Secret(String::new());
        config.agent.key_file = None;
    }
    Ok((config, saved))
}

/// The configuration the transcription form asks for, and the settings to save. As with the
/// agent, a key goes only to the address it was given for.
pub(super) fn transcription_from_form(
    admin: &Admin,
    form: &Form,
) -> Result<(Config, Settings), Refusal> {
    let url = checked_url(form.get("url"), "the transcription")?;
    let (model, language, key) = (
        form.get("model").trim(),
        form.get("language").trim(),
        form.get("key"),
    );
    if model.len() > MAX_MODEL_BYTES || key.len() > MAX_KEY_BYTES {
        return Err(Refusal::BadInput(format!(
            "the model is at most {MAX_MODEL_BYTES} bytes and the key {MAX_KEY_BYTES}"
        )));
    }
    if language.len() > 16
        || !language
            .chars()
            .all(|c| c.is_ascii_alphabetic() || c == '-')
    {
        return Err(Refusal::BadInput(
            "the language is a short code such as en or pt-BR, or empty".into(),
        ));
    }
    let timeout = whole_in(
        form.get("timeout_secs"),
        crate::config::transcription::MAX_TIMEOUT_SECS as usize,
        "the longest wait for a transcription is a whole number of seconds",
    )?;
    let mut saved =
        Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let t = &mut saved.transcription;
    t.url = Some(url.to_owned());
    if let Some(secs) = timeout {
        t.timeout_secs = Some(secs as u64);
    }
    t.model = Some(if model.is_empty() { "whisper-1" } else { model }.to_owned());
    t.language = Some(language.to_owned());
    let typed = !key.is_empty();
    if form.get("clear_key") == "1" {
        t.key = Some(Hidden(String::new()));
    } else if typed {
        t.key = Some(Hidden(key.trim().to_owned()));
    }
    let old = admin.config.get();
    let mut config = old.clone();
    saved.apply(&mut config);
    if !typed && config.transcription.base_url() != old.transcription.base_url() {
        saved.transcription.key = Some(Hidden(String::new()));
        config.transcription.key = crate::config::Secret(String::new());
        config.transcription.key_file = None;
    }
    Ok((config, saved))
}

/// The configuration the speech form asks for, and the settings to save. A key goes only to
/// the address it was given for: a new URL without a new key has none.
pub(super) fn speech_from_form(admin: &Admin, form: &Form) -> Result<(Config, Settings), Refusal> {
    let url = checked_url(form.get("url"), "the speech")?;
    let (model, voice, key) = (
        form.get("model").trim(),
        form.get("voice").trim(),
        form.get("key"),
    );
    if model.len() > MAX_MODEL_BYTES || voice.len() > MAX_MODEL_BYTES || key.len() > MAX_KEY_BYTES {
        return Err(Refusal::BadInput(format!(
            "the model and the voice are at most {MAX_MODEL_BYTES} bytes and the key {MAX_KEY_BYTES}"
        )));
    }
    let format = form.get("format").trim().to_ascii_lowercase();
    if !format.is_empty()
        && !crate::config::speech::FORMATS
            .iter()
            .any(|(name, _, _)| *name == format)
    {
        return Err(Refusal::BadInput(
            "the audio format is one of opus, mp3, aac, flac, wav".into(),
        ));
    }
    let timeout = whole_in(
        form.get("timeout_secs"),
        crate::config::speech::MAX_TIMEOUT_SECS as usize,
        "the longest wait for a voice is a whole number of seconds",
    )?;
    let max_chars = whole_in(
        form.get("max_chars"),
        crate::config::speech::MAX_CHARS,
        "the most characters spoken is a whole number",
    )?;
    let mut saved =
        Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let s = &mut saved.speech;
    s.url = Some(url.to_owned());
    s.model = Some(if model.is_empty() { "tts-1" } else { model }.to_owned());
    s.voice = Some(if voice.is_empty() { "alloy" } else { voice }.to_owned());
    if !format.is_empty() {
        s.format = Some(format);
    }
    if let Some(t) = timeout {
        s.timeout_secs = Some(t as u64);
    }
    if max_chars.is_some() {
        s.max_chars = max_chars;
    }
    let typed = !key.is_empty();
    if form.get("clear_key") == "1" {
        s.key = Some(Hidden(String::new()));
    } else if typed {
        s.key = Some(Hidden(key.trim().to_owned()));
    }
    let old = admin.config.get();
    let mut config = old.clone();
    saved.apply(&mut config);
    if !typed && config.speech.base_url() != old.speech.base_url() {
        saved.speech.key = Some(Hidden(String::new()));
        config.speech.key = crate::config::Secret(String::new());
        config.speech.key_file = None;
    }
    Ok((config, saved))
}

/// A whole number from 1 to `max` typed in a field; empty keeps the one in effect.
fn whole_in(typed: &str, max: usize, what: &str) -> Result<Option<usize>, Refusal> {
    let typed = typed.trim();
    if typed.is_empty() {
        return Ok(None);
    }
    match typed.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(Refusal::BadInput(format!("{what} from 1 to {max}"))),
    }
}

/// What the service makes of a one-second tone: its answer, or what went wrong, in words.
pub(super) async fn test_transcription(t: &crate::agent::Transcriber) -> Result<String, String> {
    let audio = crate::agent::transcribe::Audio {
        bytes: crate::agent::transcribe::test_sound(),
        filename: "iris-test-tone.wav".into(),
        mime: "audio/wav".into(),
    };
    match tokio::time::timeout(TRANSCRIPTION_TEST_TIMEOUT, t.transcribe(audio)).await {
        Err(_) => Err(format!(
            "{}: no answer within {} s",
            t.describe(),
            TRANSCRIPTION_TEST_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("Not working: {e}")),
        Ok(Ok(text)) if text.is_empty() => Ok(format!(
            "It works: {} answered with no words, as expected for a test tone.",
            t.describe()
        )),
        Ok(Ok(text)) => Ok(format!(
            "It works: {} heard \u{201c}{text}\u{201d} in a test tone.",
            t.describe()
        )),
    }
}

/// What the gateway sees of an agent: reachable with our key, and its models when it lists them.
pub(super) async fn test_agent(agent: &dyn Agent) -> Result<String, String> {
    match tokio::time::timeout(TEST_TIMEOUT, agent.probe()).await {
        Err(_) => return Err(format!("no answer within {} s", TEST_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("{}: {e}", agent.describe())),
        Ok(Ok(())) => {}
    }
    let models = match tokio::time::timeout(TEST_TIMEOUT, agent.models()).await {
        Ok(Ok(m)) if !m.is_empty() => {
            let shown: Vec<_> = m.iter().take(10).map(|m| m.model.as_str()).collect();
            format!("; models: {}", shown.join(", "))
        }
        _ => String::new(),
    };
    Ok(format!("{}: reachable{models}", agent.describe()))
}
