//! The signed-in sections whose pages gather state from several places: the devices (the
//! store, who is connected), the agent and transcription (the configuration in effect, or what
//! was typed for a test) and push (what runs now and what is saved).

use maud::{html, Markup};

use super::outcome::Outcome;
use super::pages::{self, Notice};
use super::reply::Refusal;
use super::Admin;
use crate::agent::Agent;
use crate::hub::Hub;
use crate::settings::Settings;

/// The devices section with the store's devices, oldest first.
pub(super) fn devices_body(
    hub: &Hub,
    csrf: &str,
    this_device: Option<&str>,
    n: &Notice,
) -> Result<Markup, Refusal> {
    let mut list = hub
        .store()
        .devices()
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    list.sort_by_key(|d| d.created_ms);
    Ok(pages::devices(
        &list,
        &hub.devices().connected(),
        this_device,
        csrf,
        n,
    ))
}

/// The agent section: what is in effect now (never the key), and what flags pin; then the
/// transcription and speech sections. An outcome of a test shows the values that were typed for it, so a
/// test never throws them away (secrets excepted: the page says so).
pub(super) fn agent_body(
    admin: &Admin,
    hub: &Hub,
    csrf: &str,
    agent: Option<&Outcome>,
    transcription: Option<&Outcome>,
    speech: Option<&Outcome>,
) -> Markup {
    let config = admin.config.get();
    let a = &config.agent;
    let typed = |o: Option<&Outcome>, key: &str, now: &str| -> String {
        o.and_then(|o| o.typed(key)).unwrap_or(now).to_owned()
    };
    let key_typed = |o: Option<&Outcome>| o.and_then(|o| o.typed("key_typed")) == Some("1");
    let (backend, url, model) = (
        typed(agent, "backend", &a.backend),
        typed(agent, "url", &a.url),
        typed(agent, "model", &a.model),
    );
    let view = pages::AgentView {
        backend: &backend,
        url: &url,
        model: &model,
        key_set: !a.key.is_empty() || a.key_file.is_some(),
        pinned: admin
            .pinned
            .iter()
            .copied()
            .filter(|k| k.starts_with("agent."))
            .collect(),
        describe: admin.agent.describe(),
        files: if a.backend == "demo" {
            "The demo agent answers a message that has files with a small text file.".to_owned()
        } else {
            crate::agent::media_out::FilePolicy::from_config(&config).describe()
        },
        key_typed: key_typed(agent),
    };
    let t = &config.transcription;
    let (t_url, t_model, t_language) = (
        typed(transcription, "url", &t.url),
        typed(transcription, "model", &t.model),
        typed(transcription, "language", &t.language),
    );
    let t_timeout = typed(transcription, "timeout_secs", &t.timeout_secs.to_string());
    let transcription_view = pages::TranscriptionView {
        url: &t_url,
        model: &t_model,
        language: &t_language,
        timeout_secs: &t_timeout,
        key_set: !t.key.is_empty() || t.key_file.is_some(),
        now: hub.turns().transcription_service(),
        key_typed: key_typed(transcription),
    };
    let s = &config.speech;
    let (s_url, s_model, s_voice, s_format) = (
        typed(speech, "url", &s.url),
        typed(speech, "model", &s.model),
        typed(speech, "voice", &s.voice),
        typed(speech, "format", &s.format),
    );
    let s_timeout = typed(speech, "timeout_secs", &s.timeout_secs.to_string());
    let s_max_chars = typed(speech, "max_chars", &s.max_chars.to_string());
    let speech_view = super::speech::SpeechView {
        url: &s_url,
        model: &s_model,
        voice: &s_voice,
        format: &s_format,
        timeout_secs: &s_timeout,
        max_chars: &s_max_chars,
        key_set: !s.key.is_empty() || s.key_file.is_some(),
        now: hub.turns().speech_service(),
        key_typed: key_typed(speech),
    };
    html! {
        (pages::agent(&view, csrf, &Notice::of(agent)))
        (pages::transcription(&transcription_view, csrf, &Notice::of(transcription)))
        (super::speech::section(&speech_view, csrf, &Notice::of(speech)))
    }
}

/// Who the FCM key at `path` is for: read from its JSON alone (at most
/// `push::MAX_FCM_KEY_BYTES`), never the key.
fn fcm_key_shown(path: &std::path::Path) -> String {
    let read = crate::push::read_key_file(path).map_err(|e| e.to_string());
    match read.map(|text| crate::push::key_summary(&text)) {
        Ok(Some(k)) => format!("{} (project {})", k.client_email, k.project_id),
        Ok(None) => "a file that is not a service-account key".to_owned(),
        Err(e) => e,
    }
}

/// The push section: what runs now, and the saved settings (they apply at the next start).
pub(super) fn push_body(
    admin: &Admin,
    hub: &Hub,
    csrf: &str,
    n: &Notice,
) -> Result<Markup, Refusal> {
    let saved = Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let mut config = admin.config.get();
    saved.apply(&mut config);
    let p = &config.push;
    let report = hub.status().report();
    // Switched off at start: what to fix, on the page that fixes it. Working only once a push
    // got through since this start (a delivery or a test).
    let off = report
        .switched_off
        .iter()
        .find(|off| off.part == crate::settings::Part::Push);
    let running = match (off, &report.push_error) {
        (Some(off), _) => off.cause(),
        (None, Some(e)) => format!("{}, failing: {e}", report.push),
        (None, None) if report.push == "none" || report.push_confirmed => report.push.clone(),
        (None, None) => format!("{}, not tried yet: send a test push below", report.push),
    };
    let targets: Vec<_> = hub
        .store()
        .devices()
        .map_err(|e| Refusal::Unavailable(e.to_string()))?
        .into_iter()
        .filter(|d| d.ntfy_topic.is_some() || d.fcm_token.is_some())
        .collect();
    let view = pages::PushView {
        running: &running,
        backend: &p.backend,
        ntfy_server: &p.ntfy_server,
        token_set: p.ntfy_token.is_some() || p.ntfy_token_file.is_some(),
        content: &p.content,
        fcm_key: p.fcm_credentials.as_deref().map(fcm_key_shown),
        pinned: admin
            .pinned
            .iter()
            .copied()
            .filter(|k| k.starts_with("push."))
            .collect(),
        test_topic: super::forms::TEST_TOPIC,
    };
    Ok(pages::push(&view, &targets, csrf, n))
}
