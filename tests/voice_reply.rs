//! Answers in a voice against the real binary: with `[speech] url` set to a loopback
//! OpenAI-compatible text-to-speech service and `/voice on` in a lane, the answer's text streams
//! and ends as always, then a `media.offer` of kind `voice` tied to it reaches every device,
//! and `media.pull` gives exactly the service's bytes; the service was asked for the answer
//! without its markdown and code. With the demo agent and with the OpenAI-compatible backend.
//! `/voice auto` speaks only answers to voice notes; `/voice off` (the default) never asks the
//! service. A service that hangs, or answers something that is not audio, leaves the text
//! standing with a short `system` note under it, and the lane answers the next message.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fake_stt::upload_voice;
use common::fake_tts::{FakeTts, TtsAnswer};
use common::gate::Gate;
use common::peers::MockLlm;
use common::{
    connect_online, demo_reply, dump, frame_type, pair, pstr, pull_media, system_answer,
    temp_data_dir, Client, Gateway,
};
use serde_json::{json, Value};

/// A data dir, a config file and the gateway running on them.
struct Env {
    dir: tempfile::TempDir,
    _cfg: tempfile::TempDir,
    gw: Gateway,
}

impl Env {
    /// A gateway whose config file is `toml`, with `args` on its command line.
    fn start(toml: &str, args: &[&str]) -> Env {
        let dir = temp_data_dir();
        let cfg = temp_data_dir();
        let path = config_file(cfg.path(), toml);
        let mut all = vec!["--config", path.to_str().unwrap()];
        all.extend_from_slice(args);
        let gw = Gateway::start(dir.path(), &all);
        Env { dir, _cfg: cfg, gw }
    }

    async fn device(&self, name: &str) -> Client {
        connect_online(&self.gw, &pair(self.dir.path(), name))
            .await
            .0
    }
}

fn config_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).expect("write the config file");
    path
}

/// `[speech]` pointing at `tts`, plus `extra` lines of it.
fn speech_at(tts: &FakeTts, extra: &str) -> String {
    format!("[speech]\nurl = \"{}\"\nvoice = \"nova\"\n{extra}", tts.url)
}

/// Bytes that stand for the service's audio (any bytes: nothing decodes them).
fn audio_bytes(len: usize) -> Vec<u8> {
    let mut bytes = b"OggS".to_vec();
    bytes.extend((0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    bytes
}

/// Sends a command in the default channel and returns the gateway's answer.
async fn command(c: &mut Client, text: &str) -> String {
    let frames = c.say(text, system_answer).await;
    pstr(frames.last().unwrap(), "text").to_owned()
}

/// Whether `f` is the `media.offer` of a voice for the reply `message_id`.
fn is_voice_of(f: &Value, message_id: &str) -> bool {
    frame_type(f) == "media.offer"
        && f["payload"]["kind"] == "voice"
        && pstr(f, "message_id") == message_id
}

/// Sends `text` and returns every frame up to and including the one `last` picks after the
/// answer's `message.stop` (which is returned too).
async fn ask_then(
    c: &mut Client,
    text: &str,
    last: impl Fn(&Value, &str) -> bool,
) -> (Value, Vec<Value>) {
    let mut stop: Option<Value> = None;
    let frames = c
        .say(text, |f| {
            if frame_type(f) == "message.stop" {
                stop = Some(f.clone());
                return false;
            }
            stop.as_ref()
                .is_some_and(|s| last(f, pstr(s, "message_id")))
        })
        .await;
    (stop.expect("message.stop"), frames)
}

/// The whole voice path: `/voice on`, a message, its text, then its voice on both devices,
/// pulled back byte for byte. `reply` is what the agent answers to `text`.
async fn the_answer_is_spoken(env: &Env, tts: &FakeTts, audio: &[u8], text: &str, reply: &str) {
    let mut a = env.device("phone").await;
    let mut b = env.device("tablet").await;
    let on = command(&mut a, "/voice on").await;
    assert!(on.starts_with("Voice on"), "{on}");
    assert!(
        tts.requests().is_empty(),
        "nothing is spoken before an answer"
    );

    let (stop, frames) = ask_then(&mut a, text, is_voice_of).await;
    assert_eq!(pstr(&stop, "final_text"), reply);
    let message_id = pstr(&stop, "message_id");
    let offer = frames.last().unwrap();
    // The text came first, whole; the voice after it, as the service made it.
    let stop_at = frames.iter().position(|f| frame_type(f) == "message.stop");
    assert!(stop_at < Some(frames.len() - 1), "{}", dump(&frames));
    assert_eq!(offer["payload"]["mime"], "audio/ogg", "{offer}");
    assert_eq!(offer["payload"]["size"], audio.len(), "{offer}");
    assert_eq!(pstr(offer, "filename"), "voice.ogg", "{offer}");

    let requests = tts.requests();
    assert_eq!(requests.len(), 1, "one request per answer");
    let r = &requests[0];
    assert_eq!(r.line, "POST /v1/audio/speech HTTP/1.1");
    assert_eq!(r.body["model"], "tts-1", "{}", r.body);
    assert_eq!(r.body["voice"], "nova", "{}", r.body);
    assert_eq!(r.body["response_format"], "opus", "{}", r.body);
    assert_eq!(r.input(), reply);

    // Every device is offered it, and the bytes pulled are the service's.
    let on_b = b.recv_until(|f| is_voice_of(f, message_id)).await;
    assert_eq!(on_b["payload"]["media_id"], offer["payload"]["media_id"]);
    let pulled = pull_media(&mut b, pstr(offer, "media_id")).await;
    assert!(
        pulled == audio,
        "pulled {} bytes, not the service's",
        pulled.len()
    );

    let status = command(&mut a, "/status").await;
    assert!(status.contains("voice on (spoken by"), "{status}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_demo_agents_answer_comes_as_text_then_as_the_services_voice() {
    let audio = audio_bytes(30_000);
    let tts = FakeTts::start(TtsAnswer::Audio(audio.clone()));
    let env = Env::start(&speech_at(&tts, ""), &[]);
    let text = "Water the tomatoes";
    the_answer_is_spoken(&env, &tts, &audio, text, &demo_reply(text)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_openai_backends_answer_comes_as_text_then_as_the_services_voice() {
    let llm = MockLlm::start();
    let audio = audio_bytes(12_345);
    let tts = FakeTts::start(TtsAnswer::Audio(audio.clone()));
    let url = llm.url();
    let env = Env::start(
        &speech_at(&tts, "key = \"tts-key-42\"\n"),
        &["--agent", "openai", "--agent-url", &url],
    );
    let text = "What is tea?";
    let reply = "Echo: What is tea?. I have seen 0 earlier user messages; the first was: none.";
    the_answer_is_spoken(&env, &tts, &audio, text, reply).await;
    assert_eq!(
        tts.requests()[0].authorization.as_deref(),
        Some("Bearer tts-key-42")
    );
}

#[tokio::test(flavor = "current_thread")]
async fn off_by_default_and_auto_speaks_only_answers_to_voice_notes() {
    let audio = audio_bytes(2_000);
    let tts = FakeTts::start(TtsAnswer::Audio(audio.clone()));
    let env = Env::start(&speech_at(&tts, ""), &[]);
    let mut a = env.device("phone").await;

    // Off: the answer ends, and the service is never asked.
    let frames = a
        .say("plain text please", |f| frame_type(f) == "message.stop")
        .await;
    assert_eq!(frame_type(frames.last().unwrap()), "message.stop");
    let after = a.collect_quiet(Duration::from_millis(400)).await;
    assert!(
        !after.iter().any(|f| frame_type(f) == "media.offer"),
        "{}",
        dump(&after)
    );
    assert!(tts.requests().is_empty(), "{:?}", tts.requests());

    let auto = command(&mut a, "/voice auto").await;
    assert!(auto.starts_with("Voice auto"), "{auto}");
    assert!(command(&mut a, "/status").await.contains("voice auto"));
    // Auto, typed: text only.
    a.say("typed again", |f| frame_type(f) == "message.stop")
        .await;
    let after = a.collect_quiet(Duration::from_millis(400)).await;
    assert!(
        !after.iter().any(|f| frame_type(f) == "media.offer"),
        "{}",
        dump(&after)
    );
    assert!(tts.requests().is_empty());

    // Auto, a voice note: spoken.
    upload_voice(&mut a, "v1", "note.ogg", &audio_bytes(500)).await;
    let id = a
        .request(
            "message.send",
            Some("default"),
            None,
            json!({ "text": "", "media_refs": ["v1"] }),
        )
        .await;
    let stop = a.recv_until(|f| frame_type(f) == "message.stop").await;
    let offer = a
        .recv_until(|f| is_voice_of(f, pstr(&stop, "message_id")))
        .await;
    assert!(pull_media(&mut a, pstr(&offer, "media_id")).await == audio);
    assert_eq!(tts.requests().len(), 1, "message {id}");

    // A word that is not a mode is answered with the usage; the mode stays.
    let usage = command(&mut a, "/voice loud").await;
    assert!(usage.contains("/voice on"), "{usage}");
    assert!(command(&mut a, "/voice").await.contains("auto"));
    let help = command(&mut a, "/help").await;
    assert!(help.contains("/voice [on|off|auto]"), "{help}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_hanging_service_leaves_the_text_with_a_note_and_the_lane_moves_on() {
    let gate = Gate::default();
    let tts = FakeTts::start(TtsAnswer::Hang(gate.clone()));
    let env = Env::start(&speech_at(&tts, "timeout_secs = 1\n"), &[]);
    let mut a = env.device("phone").await;
    command(&mut a, "/voice on").await;

    let is_note = |f: &Value, reply: &str| system_answer(f) && pstr(f, "reply_to") == reply;
    let (stop, frames) = ask_then(&mut a, "are you there", is_note).await;
    assert_eq!(pstr(&stop, "final_text"), demo_reply("are you there"));
    let note = pstr(frames.last().unwrap(), "text");
    assert!(
        note.starts_with("The voice of this answer could not be made")
            && note.contains("did not answer within 1 seconds (speech.timeout_secs)"),
        "{note}"
    );
    assert!(!frames.iter().any(|f| frame_type(f) == "media.offer"));
    assert_eq!(tts.requests().len(), 1);

    // Nothing is retried, and the lane answers the next message.
    gate.open();
    let (next, _) = ask_then(&mut a, "still there", is_note).await;
    assert_eq!(pstr(&next, "final_text"), demo_reply("still there"));
    assert_eq!(tts.requests().len(), 2, "one request per answer, no retry");
}

#[tokio::test(flavor = "current_thread")]
async fn a_service_answering_junk_or_an_error_leaves_the_text_with_a_note() {
    for (answer, said) in [
        (TtsAnswer::Html, "not audio: text/html"),
        (
            TtsAnswer::Fail(500, "model not loaded".into()),
            "HTTP 500: model not loaded",
        ),
        (TtsAnswer::Fail(401, "bad key".into()), "check speech.key"),
    ] {
        let tts = FakeTts::start(answer);
        let env = Env::start(&speech_at(&tts, "key = \"tts-secret-key\"\n"), &[]);
        let mut a = env.device("phone").await;
        command(&mut a, "/voice on").await;
        let is_note = |f: &Value, reply: &str| system_answer(f) && pstr(f, "reply_to") == reply;
        let (stop, frames) = ask_then(&mut a, "hello", is_note).await;
        assert_eq!(pstr(&stop, "final_text"), demo_reply("hello"));
        let note = pstr(frames.last().unwrap(), "text");
        assert!(note.contains(said), "{note}");
        assert!(!note.contains("tts-secret-key"), "{note}");
        assert!(!frames.iter().any(|f| frame_type(f) == "media.offer"));
        assert!(!env.gw.output_tail().contains("tts-secret-key"));
    }
}

#[test]
fn a_speech_setting_that_cannot_work_is_refused_at_start() {
    let cfg = temp_data_dir();
    for (toml, wanted) in [
        ("[speech]\nurl = \"ftp://192.168.1.20/v1\"\n", "speech.url"),
        (
            "[speech]\nurl = \"http://127.0.0.1:1/v1\"\nformat = \"midi\"\n",
            "speech.format",
        ),
        ("[speech]\ntimeout_secs = 0\n", "speech.timeout_secs"),
        ("[speech]\ntimeout_secs = 121\n", "speech.timeout_secs"),
        ("[speech]\nmax_chars = 4097\n", "speech.max_chars"),
        (
            "[speech]\nurl = \"http://127.0.0.1:1/v1\"\nkey_file = \"/nonexistent/tts.key\"\n",
            "/nonexistent/tts.key",
        ),
    ] {
        let stderr = common::refused_start(&config_file(cfg.path(), toml));
        assert!(stderr.contains(wanted), "{toml}: {stderr}");
    }
}

/// The Agent page's Speech section sets the service, tests it and applies it at once: the next
/// answer in a `/voice on` lane is spoken by it, with its key, without a restart. The key is
/// never shown back and follows no new URL; a wait outside 1 to 120 s is refused.
#[tokio::test(flavor = "current_thread")]
async fn speech_is_set_and_tested_on_the_agent_page_and_applies_at_once() {
    use common::web::Web;
    const PASSPHRASE: &str = "violet tractor harbour 42";
    let audio = audio_bytes(4_000);
    let good = FakeTts::start(TtsAnswer::Audio(audio.clone()));
    let refusing = FakeTts::start(TtsAnswer::Fail(401, "invalid api key".into()));
    let dir = temp_data_dir();
    common::owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let page = web.get("/admin/agent").await;
    assert!(
        page.body.contains("id=\"speech-form\"")
            && page.body.contains("off: answers are text only"),
        "{}",
        page.body
    );
    let fields = |url: &str, key: &str, timeout: &str| {
        vec![
            ("csrf".to_owned(), csrf.clone()),
            ("url".to_owned(), url.to_owned()),
            ("key".to_owned(), key.to_owned()),
            ("model".to_owned(), "kokoro".to_owned()),
            ("voice".to_owned(), "af_sky".to_owned()),
            ("format".to_owned(), "opus".to_owned()),
            ("timeout_secs".to_owned(), timeout.to_owned()),
            ("max_chars".to_owned(), "800".to_owned()),
        ]
    };

    // Test: one sentence goes to the service, and the page says how much audio came back.
    let r = form(
        &mut web,
        "/admin/speech/test",
        fields(&good.url, "tts-secret-key", "9"),
    )
    .await;
    assert!(
        r.body.contains("It works") && r.body.contains(&format!("{} bytes", audio.len())),
        "{}",
        r.body
    );
    let taken = good.requests();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].body["model"], "kokoro");
    assert_eq!(taken[0].body["voice"], "af_sky");
    assert_eq!(
        taken[0].authorization.as_deref(),
        Some("Bearer tts-secret-key")
    );
    assert!(!r.body.contains("tts-secret-key"), "the key was shown back");
    // A test saves nothing.
    assert!(web
        .get("/admin/agent")
        .await
        .body
        .contains("off: answers are text only"));

    // Refused: a wait outside its bounds; nothing changes.
    for bad in ["0", "121", "ten"] {
        let r = form(&mut web, "/admin/speech", fields(&good.url, "", bad)).await;
        assert!(r.body.contains("from 1 to 120"), "{bad}: {}", r.body);
        assert!(r.body.contains("off: answers are text only"), "{bad}");
    }

    // Save, with the key.
    let r = form(
        &mut web,
        "/admin/speech",
        fields(&good.url, "tts-secret-key", "9"),
    )
    .await;
    assert!(
        r.body
            .contains("Saved: answers in chats with /voice on are spoken by"),
        "{}",
        r.body
    );
    assert!(r.body.contains("A speech key is saved"), "{}", r.body);
    assert!(!r.body.contains("tts-secret-key"), "the key was shown back");
    assert!(
        r.body.contains("name=\"max_chars\" value=\"800\""),
        "{}",
        r.body
    );

    // Another URL tested with the key field empty: no key goes there.
    let r = form(
        &mut web,
        "/admin/speech/test",
        fields(&refusing.url, "", "9"),
    )
    .await;
    assert!(
        r.body.contains("Not working") && r.body.contains("refused the key"),
        "{}",
        r.body
    );
    assert!(
        refusing.requests()[0].authorization.is_none(),
        "the key followed a new URL"
    );

    // No restart: the next answer in a `/voice on` lane is spoken by the saved service.
    let mut c = connect_online(&gw, &pair(dir.path(), "phone")).await.0;
    command(&mut c, "/voice on").await;
    let (stop, frames) = ask_then(&mut c, "from the page", is_voice_of).await;
    assert_eq!(pstr(&stop, "final_text"), demo_reply("from the page"));
    let offer = frames.last().unwrap();
    assert!(pull_media(&mut c, pstr(offer, "media_id")).await == audio);
    let last = good.requests().pop().unwrap();
    assert_eq!(last.authorization.as_deref(), Some("Bearer tts-secret-key"));
    assert_eq!(last.input(), demo_reply("from the page"));
    assert!(!gw.output_tail().contains("tts-secret-key"));
    assert!(!std::fs::read_to_string(dir.path().join("settings.toml"))
        .unwrap()
        .is_empty());
}

/// Posts an admin form and follows it to the page it leads to.
async fn form(
    web: &mut common::web::Web,
    path: &str,
    fields: Vec<(String, String)>,
) -> common::web::Reply {
    let pairs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = web.post(path, &pairs).await;
    assert_eq!(r.status, 200, "{r:?}");
    r
}

/// A phone that is away is pushed the spoken answer as a voice reply: its push starts with
/// "🔊 Voice reply: " and then the answer; a lane without voice is pushed the plain answer.
#[tokio::test(flavor = "current_thread")]
async fn an_away_phones_push_says_it_is_a_voice_reply() {
    let (pushed, pushes) = std::sync::mpsc::channel::<Value>();
    let pushed = std::sync::Mutex::new(pushed);
    let ntfy = common::fake_http::start(move |taken| {
        let body: Value = serde_json::from_slice(&taken.body).unwrap_or(Value::Null);
        let _ = pushed.lock().unwrap().send(body);
        common::fake_http::json_200(b"{}")
    });
    let tts = FakeTts::start(TtsAnswer::Audio(audio_bytes(100)));
    let env = Env::start(
        &format!(
            "{}[push]\nbackend = \"ntfy\"\nntfy_server = \"{ntfy}\"\n",
            speech_at(&tts, "")
        ),
        &[],
    );
    let away = pair(env.dir.path(), "away-phone");
    let (c, _) = common::connect_with(&env.gw, &away, json!({ "ntfy_topic": "away-1" })).await;
    c.close().await;
    let pushes = std::sync::Arc::new(std::sync::Mutex::new(pushes));
    let next_push = || {
        let pushes = pushes.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                pushes
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(15))
                    .expect("a push within 15 s")
            })
            .await
            .unwrap()
        }
    };

    let mut a = env.device("phone").await;
    a.say("text only", |f| frame_type(f) == "message.stop")
        .await;
    // The push's text is the answer's start (`push.content = "preview"`, the default).
    let plain = next_push().await;
    let plain_text = plain["message"].as_str().unwrap_or("");
    assert!(
        plain_text.starts_with("You said: \u{201c}text only"),
        "{plain}"
    );

    command(&mut a, "/voice on").await;
    ask_then(&mut a, "say it", is_voice_of).await;
    let voiced = next_push().await;
    assert_eq!(voiced["topic"], "away-1", "{voiced}");
    let voiced_text = voiced["message"].as_str().unwrap_or("");
    assert!(
        voiced_text.starts_with("\u{1f50a} Voice reply: You said: \u{201c}say it"),
        "{voiced}"
    );
}
