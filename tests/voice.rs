//! Voice notes against the real binary: a voice note is transcribed by an OpenAI-compatible
//! service (a fake on loopback that checks the multipart request) before the agent is asked;
//! the agent gets the transcript as the message's text (typed text first) with the note's
//! attachment line; the lane shows `Heard: “…”` as a `system` reply to the note, live on every
//! device, in history, in search and after `sync`. At `limits.transcription_bytes` a note is
//! sent, one byte over it is not; no service set tells each lane once; a failing service is a
//! note and the turn still answered. The same end to end through a real Hermes 0.19.0, whose
//! mock model logs what it receives.

mod common;

use std::path::{Path, PathBuf};

use common::fake_stt::{send_notes, upload_voice, FakeStt, SttAnswer};
use common::gate::Gate;
use common::peers::{HermesRig, MockLlm, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    connect_awaiting_online, connect_online, demo_reply, dump, frame_type, pair, pstr, sync_cursor,
    sync_from, temp_data_dir, typing_off, Client, Gateway, Paired,
};
use serde_json::{json, Value};

const HEARD: &str = "water the tomatoes tonight";

/// A data dir, a config file and the gateway running on them.
struct Env {
    dir: tempfile::TempDir,
    _cfg: tempfile::TempDir,
    gw: Gateway,
}

impl Env {
    /// A gateway whose config file is `toml`.
    fn start(toml: &str) -> Env {
        let dir = temp_data_dir();
        let cfg = temp_data_dir();
        let path = config_file(cfg.path(), toml);
        let gw = Gateway::start(dir.path(), &["--config", path.to_str().unwrap()]);
        Env { dir, _cfg: cfg, gw }
    }

    fn pair(&self, name: &str) -> Paired {
        pair(self.dir.path(), name)
    }
}

fn config_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).expect("write the config file");
    path
}

/// `[transcription]` pointing at `stt`, in English, plus `extra` lines of TOML.
fn with_service(stt: &FakeStt, extra: &str) -> String {
    format!(
        "[transcription]\nurl = \"{}\"\nlanguage = \"en\"\n{extra}",
        stt.url
    )
}

/// Bytes that stand for a recorded voice note (any bytes: the fake service does not decode).
fn note_bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed as u32) as u8
        })
        .collect()
}

/// One turn as the sender saw it: the user message id and every frame through `typing` off.
struct Turn {
    user: String,
    frames: Vec<Value>,
}

impl Turn {
    fn stop(&self) -> &Value {
        self.frames
            .iter()
            .find(|f| frame_type(f) == "message.stop")
            .unwrap_or_else(|| panic!("no message.stop:\n{}", dump(&self.frames)))
    }

    /// The `system` messages answering the voice note, past the "transcribing" one.
    fn notes(&self) -> Vec<&Value> {
        self.frames
            .iter()
            .filter(|f| is_note_on(f, &self.user) && !is_transcribing(f))
            .collect()
    }

    fn position(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.frames
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("frame missing:\n{}", dump(&self.frames)))
    }
}

/// A `system` message answering the user message `user`.
fn is_note_on(f: &Value, user: &str) -> bool {
    frame_type(f) == "message" && f["payload"]["role"] == "system" && pstr(f, "reply_to") == user
}

/// The note a lane shows while its voice notes are being transcribed.
fn is_transcribing(f: &Value) -> bool {
    pstr(f, "message_id").ends_with(".hearing") && pstr(f, "text").starts_with("Transcribing")
}

/// Sends `text` with the uploads `refs` in `chat` and waits for the whole turn.
async fn voice_turn(c: &mut Client, chat: &str, text: &str, refs: &[&str]) -> Turn {
    let id = c
        .request(
            "message.send",
            Some(chat),
            None,
            json!({ "text": text, "media_refs": refs }),
        )
        .await;
    let receipt = c.recv_reply(id).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let user = pstr(&receipt, "message_id").to_owned();
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await;
        let done = typing_off(&f);
        frames.push(f);
        if done {
            return Turn { user, frames };
        }
    }
}

async fn history(c: &mut Client, chat: &str) -> Vec<Value> {
    let id = c
        .request("history", Some(chat), None, json!({ "limit": 200 }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "history", "{r}");
    r["payload"]["messages"].as_array().unwrap().clone()
}

async fn search(c: &mut Client, query: &str) -> Vec<Value> {
    let id = c
        .request("search", None, None, json!({ "query": query }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "search.results", "{r}");
    r["payload"]["hits"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "current_thread")]
async fn a_voice_note_is_heard_by_the_agent_and_shown_on_every_device() {
    let stt = FakeStt::hearing(HEARD);
    let env = Env::start(&with_service(&stt, ""));
    let (pa, pb, pc) = (env.pair("a"), env.pair("b"), env.pair("away"));
    // The away device was here once, and knows where it left off.
    let (c, ack_c) = connect_online(&env.gw, &pc).await;
    let away_cursor = sync_cursor(&ack_c);
    c.close().await;
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let (mut b, _) = connect_online(&env.gw, &pb).await;

    let note = note_bytes(20_000, 1);
    upload_voice(&mut a, "v1", "note.ogg", &note).await;
    let t = voice_turn(&mut a, "default", "", &["v1"]).await;

    // The service got the note as OpenAI's API takes it.
    let reqs = stt.requests();
    assert_eq!(reqs.len(), 1, "one transcription per note");
    let r = &reqs[0];
    assert!(r.malformed.is_none(), "{:?}", r.malformed);
    assert!(r.content_type.starts_with("multipart/form-data; boundary="));
    assert_eq!(r.fields.get("model").map(String::as_str), Some("whisper-1"));
    assert_eq!(
        r.fields.get("response_format").map(String::as_str),
        Some("json")
    );
    assert_eq!(r.fields.get("language").map(String::as_str), Some("en"));
    assert_eq!(r.file, note, "the file sent is the note as uploaded");
    assert_eq!(
        (r.filename.as_str(), r.file_type.as_str()),
        ("note.ogg", "audio/ogg")
    );
    assert!(r.authorization.is_none(), "no key configured, none sent");

    // The lane shows what was heard, as a reply to the note, before the answer starts.
    let notes = t.notes();
    assert_eq!(notes.len(), 1, "{}", dump(&t.frames));
    let heard = notes[0];
    let heard_id = format!("{}.heard", t.user);
    assert_eq!(pstr(heard, "message_id"), heard_id);
    assert_eq!(
        pstr(heard, "text"),
        format!("Heard: \u{201c}{HEARD}\u{201d}")
    );
    let heard_at = t.position(|f| pstr(f, "message_id") == heard_id);
    let start_at = t.position(|f| frame_type(f) == "message.start");
    let typing_at = t.position(|f| frame_type(f) == "typing" && f["payload"]["on"] == true);
    // While the service works, the lane says so; then what was heard replaces nothing but
    // follows it.
    let transcribing_at = t.position(|f| is_note_on(f, &t.user) && is_transcribing(f));
    assert!(
        typing_at < transcribing_at && transcribing_at < heard_at && heard_at < start_at,
        "{}",
        dump(&t.frames)
    );

    // The agent got the transcript as the message's text, and still the note.
    let answer = pstr(t.stop(), "final_text");
    assert!(answer.contains(HEARD), "{answer}");
    assert!(answer.contains("note.ogg"), "{answer}");

    // The other device saw it live.
    let on_b = b
        .recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == heard_id)
        .await;
    assert_eq!(pstr(&on_b, "reply_to"), t.user);

    // History and search have it.
    let hist = history(&mut a, "default").await;
    let kept = hist
        .iter()
        .find(|m| m["message_id"] == heard_id.as_str())
        .unwrap_or_else(|| panic!("no transcript in history: {hist:?}"));
    // v1's `history` knows `user` and `assistant` only: gateway notices page in as `assistant`.
    assert_eq!(kept["role"], "assistant");
    assert_eq!(kept["text"], pstr(heard, "text"));
    let hits = search(&mut a, "tomatoes").await;
    assert!(
        hits.iter().any(|h| h["message_id"] == heard_id.as_str()),
        "{hits:?}"
    );

    // The away device gets it on sync, still a reply to the note.
    let (mut c, _) = connect_online(&env.gw, &pc).await;
    let (replay, _) = sync_from(&mut c, away_cursor).await;
    let synced = replay
        .iter()
        .find(|f| frame_type(f) == "message" && pstr(f, "message_id") == heard_id)
        .unwrap_or_else(|| panic!("no transcript in the sync:\n{}", dump(&replay)));
    assert_eq!(pstr(synced, "reply_to"), t.user);
    assert_eq!(pstr(synced, "text"), pstr(heard, "text"));
}

#[tokio::test(flavor = "current_thread")]
async fn typed_text_comes_first_and_the_key_goes_along() {
    let stt = FakeStt::hearing(HEARD);
    let env = Env::start(&with_service(
        &stt,
        "key = \"stt-key-123\"\nmodel = \"whisper-large-v3\"\n",
    ));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    upload_voice(&mut a, "v1", "memo", &note_bytes(3000, 2)).await;
    let t = voice_turn(&mut a, "default", "from the garden", &["v1"]).await;
    let r = &stt.requests()[0];
    assert_eq!(r.authorization.as_deref(), Some("Bearer stt-key-123"));
    assert_eq!(r.fields["model"], "whisper-large-v3");
    // A name without an extension gets the type's: services tell the format by it.
    assert_eq!(r.filename, "memo.ogg");
    let answer = pstr(t.stop(), "final_text");
    assert!(
        answer.contains(&format!("from the garden\n\n{HEARD}")),
        "typed text first, then the transcript: {answer}"
    );
    let log = env.gw.output_tail();
    assert!(
        !log.contains("stt-key-123"),
        "the key is never logged:\n{log}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_note_at_the_limit_is_sent_and_one_byte_over_is_not() {
    let stt = FakeStt::hearing(HEARD);
    let env = Env::start(&with_service(
        &stt,
        "[limits]\ntranscription_bytes = 4096\n",
    ));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;

    let at = note_bytes(4096, 3);
    upload_voice(&mut a, "at", "at.ogg", &at).await;
    let t = voice_turn(&mut a, "default", "", &["at"]).await;
    assert_eq!(stt.requests().len(), 1);
    assert_eq!(stt.requests()[0].file, at);
    assert_eq!(t.notes().len(), 1);
    assert!(pstr(t.notes()[0], "text").starts_with("Heard: "));

    upload_voice(&mut a, "over", "over.ogg", &note_bytes(4097, 4)).await;
    let t = voice_turn(&mut a, "default", "", &["over"]).await;
    assert_eq!(stt.requests().len(), 1, "a note over the limit is not sent");
    let notes = t.notes();
    assert_eq!(notes.len(), 1, "{}", dump(&t.frames));
    let said = pstr(notes[0], "text");
    assert!(
        said.contains("over.ogg")
            && said.contains("4097 bytes")
            && said.contains("4096")
            && said.contains("limits.transcription_bytes"),
        "{said}"
    );
    assert!(!said.starts_with("Heard"), "{said}");
    // The turn went on: the agent was told the note is attached.
    let answer = pstr(t.stop(), "final_text");
    assert!(answer.contains("over.ogg"), "{answer}");
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_service_each_lane_is_told_once() {
    let env = Env::start("");
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    let other = common::create_channel(&mut a, "other").await;
    let mut notices = Vec::new();
    for (n, chat) in ["default", "default", other.as_str()]
        .into_iter()
        .enumerate()
    {
        let media_ref = format!("v{n}");
        upload_voice(&mut a, &media_ref, "n.ogg", &note_bytes(500, n as u8)).await;
        let t = voice_turn(&mut a, chat, "", &[&media_ref]).await;
        if let Some(note) = t.notes().first() {
            let said = pstr(note, "text");
            assert!(
                said.contains("no transcription service")
                    && said.contains("admin page")
                    && said.contains("[transcription] url"),
                "{said}"
            );
        }
        notices.push((chat.to_owned(), t.notes().len()));
        // The agent still got the message, with the note's attachment line.
        assert!(pstr(t.stop(), "final_text").contains("n.ogg"));
    }
    let counts: Vec<usize> = notices.iter().map(|(_, n)| *n).collect();
    assert_eq!(counts, [1, 0, 1], "one notice per lane: {notices:?}");
    let hist = history(&mut a, "default").await;
    let told = hist
        .iter()
        .filter(|m| {
            m["text"]
                .as_str()
                .unwrap()
                .contains("no transcription service")
        })
        .count();
    assert_eq!(told, 1, "{hist:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_service_is_a_note_and_the_turn_is_answered() {
    let stt = FakeStt::start(|_| SttAnswer::Fail(500, "the model is not loaded".into()));
    let env = Env::start(&with_service(&stt, ""));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    upload_voice(&mut a, "v1", "note.ogg", &note_bytes(1000, 5)).await;
    let t = voice_turn(&mut a, "default", "listen", &["v1"]).await;
    assert_eq!(stt.requests().len(), 1);
    let notes = t.notes();
    assert_eq!(notes.len(), 1, "{}", dump(&t.frames));
    let said = pstr(notes[0], "text");
    assert!(
        said.contains("note.ogg")
            && said.contains("HTTP 500")
            && said.contains("the model is not loaded"),
        "{said}"
    );
    let answer = pstr(t.stop(), "final_text");
    assert!(
        answer.contains("listen") && answer.contains("note.ogg"),
        "{answer}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_service_is_a_note_that_names_it() {
    // A port nothing listens on.
    let port = common::peers::free_port();
    let env = Env::start(&format!(
        "[transcription]\nurl = \"http://127.0.0.1:{port}/v1\"\n"
    ));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    upload_voice(&mut a, "v1", "note.ogg", &note_bytes(1000, 6)).await;
    let t = voice_turn(&mut a, "default", "", &["v1"]).await;
    let said = pstr(t.notes()[0], "text").to_owned();
    assert!(
        said.contains("cannot be reached") && said.contains(&format!("127.0.0.1:{port}")),
        "{said}"
    );
    assert!(pstr(t.stop(), "final_text").contains("note.ogg"));
}

#[tokio::test]
async fn hermes_hears_the_transcript_as_the_users_words() {
    let _one = ONE_HERMES.lock().await;
    let stt = FakeStt::hearing(HEARD);
    let cfg = temp_data_dir();
    let path = config_file(cfg.path(), &with_service(&stt, ""));
    let r = HermesRig::start("", &["--config", path.to_str().unwrap()], temp_data_dir());
    let mut a = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let pb = pair(r.dir.path(), "second");
    let (mut b, _) = common::connect(&r.gw, &pb).await;
    b.timeout = HERMES_TURN_TIMEOUT;

    let note = note_bytes(8000, 7);
    upload_voice(&mut a, "v1", "note.ogg", &note).await;
    let t = voice_turn(&mut a, "default", "please note", &["v1"]).await;
    assert_eq!(stt.requests()[0].file, note);
    let heard_id = format!("{}.heard", t.user);
    assert_eq!(t.notes().len(), 1, "{}", dump(&t.frames));
    b.recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == heard_id)
        .await;

    // The model got the typed text, the transcript and the note's attachment line as the
    // user's words.
    let asked: Vec<String> = r
        .llm
        .requests()
        .iter()
        .filter_map(|req| {
            req["messages"]
                .as_array()?
                .iter()
                .rev()
                .find(|m| m["role"] == "user")
                .map(|m| match &m["content"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
        })
        .collect();
    assert!(
        asked
            .iter()
            .any(|u| u.contains(&format!("please note\n\n{HEARD}")) && u.contains("note.ogg")),
        "the model never got the transcript: {asked:?}"
    );
    // Hermes echoes the user's words back through the mock model.
    let answer = pstr(t.stop(), "final_text");
    assert!(answer.contains(HEARD), "{answer}");
}

/// The last user message of each request the mock model got.
fn user_words(llm: &MockLlm) -> Vec<Vec<String>> {
    llm.requests()
        .iter()
        .map(|req| {
            req["messages"]
                .as_array()
                .map(|ms| {
                    ms.iter()
                        .filter(|m| m["role"] == "user")
                        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn the_openai_backend_hears_the_transcript_now_and_in_later_history() {
    let llm = MockLlm::start();
    let stt = FakeStt::hearing(HEARD);
    let env = Env::start(&format!(
        "[agent]\nbackend = \"openai\"\nurl = \"{}\"\n{}",
        llm.url(),
        with_service(&stt, "")
    ));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    upload_voice(&mut a, "v1", "note.ogg", &note_bytes(2000, 8)).await;
    let t = voice_turn(&mut a, "default", "", &["v1"]).await;
    let answer = pstr(t.stop(), "final_text");
    assert!(
        answer.starts_with(&format!("Echo: {HEARD}\n[attached: note.ogg")),
        "{answer}"
    );

    // The next turn's history carries what was heard as the user's earlier words.
    let next = voice_turn(&mut a, "default", "and the roses?", &[]).await;
    assert!(pstr(next.stop(), "final_text").contains(&format!("the first was: {HEARD}")));
    let asked = user_words(&llm);
    let last = asked.last().unwrap();
    // What was heard, then the note by name (its sound went nowhere).
    assert_eq!(
        last[0],
        format!("{HEARD}\n[attached: note.ogg (audio/ogg, 2000 bytes)]"),
        "{asked:?}"
    );
    assert_eq!(last[1], "and the roses?");
}

#[tokio::test(flavor = "current_thread")]
async fn stop_while_a_note_is_heard_ends_the_turn_without_asking_the_agent() {
    let stt = FakeStt::start(|_| {
        std::thread::sleep(std::time::Duration::from_secs(2));
        SttAnswer::Text(HEARD.into())
    });
    let env = Env::start(&with_service(&stt, ""));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    upload_voice(&mut a, "v1", "note.ogg", &note_bytes(2000, 9)).await;
    send_notes(&mut a, &["v1"]).await;
    a.recv_until(|f| frame_type(f) == "typing" && f["payload"]["on"] == true)
        .await;
    a.send_text(Some("default"), None, "/stop").await;
    let stop = a.recv_type("message.stop").await;
    assert!(pstr(&stop, "final_text").contains("Stopped"), "{stop}");
    // Past the moment the service answers: what it heard is dropped with the turn.
    a.collect_quiet(std::time::Duration::from_millis(2500))
        .await;
    assert_eq!(stt.requests().len(), 1);
    assert!(
        !a.seen.iter().any(|f| pstr(f, "text").starts_with("Heard:")),
        "nothing heard is posted after the stop: {}",
        dump(&a.seen)
    );
}

#[test]
fn a_transcription_setting_that_cannot_work_is_refused_at_start() {
    let cfg = temp_data_dir();
    for (toml, wanted) in [
        (
            "[transcription]\nurl = \"ftp://192.168.1.20/v1\"\n",
            "transcription.url",
        ),
        (
            "[transcription]\nurl = \"http://127.0.0.1:1/v1\"\nmodel = \" \"\n",
            "transcription.model",
        ),
        (
            "[limits]\ntranscription_bytes = 10\n",
            "limits.transcription_bytes",
        ),
        (
            "[transcription]\nurl = \"http://127.0.0.1:1/v1\"\nkey_file = \"/nonexistent/stt.key\"\n",
            "/nonexistent/stt.key",
        ),
    ] {
        let stderr = common::refused_start(&config_file(cfg.path(), toml));
        assert!(stderr.contains(wanted), "{toml}: {stderr}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_injected_mime_type_is_refused_at_upload_and_never_reaches_the_service() {
    let stt = FakeStt::hearing(HEARD);
    let env = Env::start(&with_service(&stt, ""));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    let data = note_bytes(1000, 11);
    let start = a
        .request(
            "media.upload.start",
            None,
            None,
            json!({ "media_ref": "v1", "kind": "voice", "mime": "audio/ogg\r\nX-Injected: yes",
                    "size": data.len(), "filename": "note.ogg" }),
        )
        .await;
    let refused = a.recv_reply(start).await;
    assert_eq!(frame_type(&refused), "error", "{refused}");
    assert_eq!(refused["payload"]["code"], "unsupported", "{refused}");
    assert!(
        pstr(&refused, "message").contains("mime"),
        "the error names the field: {refused}"
    );
    // Nothing was stored: the ref names no file, so a message carrying it is refused and the
    // service is never asked.
    let answer = send_notes(&mut a, &["v1"]).await;
    assert_eq!(frame_type(&answer), "error", "{answer}");
    // A well-formed type with a parameter is taken, and reaches the service as it was sent.
    common::upload_file(
        &mut a,
        "v2",
        "voice",
        "audio/ogg; codecs=opus",
        "note",
        &data,
    )
    .await;
    let t = voice_turn(&mut a, "default", "", &["v2"]).await;
    assert!(
        pstr(t.stop(), "final_text").contains(HEARD),
        "{}",
        dump(&t.frames)
    );
    let seen = stt.requests();
    assert_eq!(seen.len(), 1, "only the well-formed note was sent");
    assert_eq!(seen[0].file_type, "audio/ogg; codecs=opus");
    assert_eq!(seen[0].filename, "note.ogg");
    assert!(seen[0].malformed.is_none(), "{seen:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_hanging_service_holds_the_lane_only_until_the_timeout_and_says_so() {
    // The service takes the request and never answers (until the test ends).
    let gate = Gate::default();
    let held = gate.clone();
    let stt = FakeStt::start(move |_| {
        held.wait();
        SttAnswer::Text(HEARD.into())
    });
    let env = Env::start(&with_service(&stt, "timeout_secs = 1\n"));
    let (mut a, _) = connect_online(&env.gw, &env.pair("a")).await;
    let (mut b, _) = connect_online(&env.gw, &env.pair("b")).await;
    upload_voice(&mut a, "v1", "note.ogg", &note_bytes(1000, 12)).await;
    let user = pstr(&send_notes(&mut a, &["v1"]).await, "message_id").to_owned();
    let timed_out = |f: &Value| {
        is_note_on(f, &user) && pstr(f, "text").contains("could not be transcribed in time")
    };
    // Both devices are told at once that the note is being transcribed, with the wait.
    for c in [&mut a, &mut b] {
        let note = c
            .recv_until(|f| is_note_on(f, &user) && is_transcribing(f))
            .await;
        assert!(pstr(&note, "text").contains("after 1 s "), "{note}");
        assert!(!c.seen.iter().any(timed_out), "{}", c.recent());
    }
    // Another device's message in the same channel waits behind the note...
    b.send_text(Some("default"), None, "and the roses?").await;
    // ...until the timeout: the lane says why, the agent gets the note as an attachment with
    // a word about it, and then the other message is answered.
    let said = b.recv_until(timed_out).await;
    assert!(
        pstr(&said, "text").contains("note.ogg")
            && pstr(&said, "text").contains("transcription.timeout_secs"),
        "{said}"
    );
    let first = b.recv_type("message.stop").await;
    let answer = pstr(&first, "final_text");
    assert!(
        answer.contains("could not be transcribed in time") && answer.contains("note.ogg"),
        "{answer}"
    );
    let second = b.recv_type("message.stop").await;
    assert_eq!(pstr(&second, "final_text"), demo_reply("and the roses?"));
    assert_eq!(stt.requests().len(), 1);
    gate.open();
}
