//! Streamed answers through the real binary and the OpenAI-compatible backend (the scripted
//! mock LLM streams `[[stream N RATE]]`): `message.update` is paced, the final state is exact,
//! and an app that lists `update_append` in `hello.caps.extensions` gets only what it lacks
//! (reassembled across a cut and a reconnect with `sync`; a rewrite is
//! covered by the outlet's unit tests, since this backend never rewrites), while one that did not
//! ask only ever sees whole-text updates; two lanes streaming at once to one device each
//! reassemble, their continuations naming their message exactly when the other lane came
//! between. Sizes keep each test to a few seconds.

mod common;

use std::collections::HashMap;
use std::time::Instant;

use common::peers::MockLlm;
use common::{
    connect, connect_with, create_channel, frame_type, pair, pstr, sync_cursor, temp_data_dir,
    Client, Gateway,
};
use serde_json::{json, Value};

fn start_gateway(dir: &std::path::Path, url: &str, limits: &str) -> Gateway {
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!("[agent]\nbackend = \"openai\"\nurl = \"{url}\"\n[limits]\n{limits}\n"),
    )
    .unwrap();
    Gateway::start(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

fn append_caps() -> Value {
    json!({ "caps": { "extensions": ["update_append"] } })
}

/// What the mock streams for `[[stream N RATE]]`.
fn streamed_words(n: usize) -> String {
    (1..=n)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One connection's view of the messages streamed to it, reassembled as an app does: a
/// continuation (`append_at` above 0) without `message_id` is for the message of the
/// connection's previous `message.update`, and the gateway names the message exactly when that
/// previous update was for another one (or there was none).
#[derive(Default)]
struct Device {
    last: Option<String>,
    messages: HashMap<String, Seen>,
    /// Continuations that carried `message_id` (another message's update came between).
    named: usize,
    /// Continuations that left it out.
    unnamed: usize,
}

impl Device {
    fn apply(&mut self, f: &Value) {
        let p = &f["payload"];
        let continuation = p["append_at"].as_u64().is_some_and(|at| at > 0);
        if continuation {
            assert!(
                f.get("chat_id").is_none() && f.get("thread_id").is_none(),
                "a continuation repeats its lane: {f}"
            );
        }
        let id = match p["message_id"].as_str() {
            Some(id) => {
                if continuation {
                    assert_ne!(
                        self.last.as_deref(),
                        Some(id),
                        "a continuation of the previous update's message names it: {f}"
                    );
                    self.named += 1;
                }
                id.to_owned()
            }
            None => {
                assert!(
                    continuation,
                    "only a continuation may leave out message_id: {f}"
                );
                self.unnamed += 1;
                self.last.clone().unwrap_or_else(|| {
                    panic!("a continuation is the connection's first update: {f}")
                })
            }
        };
        self.messages.entry(id.clone()).or_default().apply(f);
        self.last = Some(id);
    }

    /// What the updates built for the message `stop` ends.
    fn of(&self, stop: &Value) -> &Seen {
        let id = pstr(stop, "message_id");
        self.messages
            .get(id)
            .unwrap_or_else(|| panic!("no update for {id}"))
    }
}

/// One device's view of a streamed message: its text as the updates built it, and what they
/// cost on the wire.
#[derive(Default)]
struct Seen {
    text: String,
    updates: usize,
    bytes: usize,
    appends: usize,
    rewrites: usize,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

impl Seen {
    /// Applies a `message.update` as an app does: whole text, or kept prefix plus appended text.
    fn apply(&mut self, f: &Value) {
        let p = &f["payload"];
        let text = p["text"].as_str().expect("text");
        self.updates += 1;
        self.bytes += f.to_string().len();
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        match p.get("append_at") {
            None => self.text = text.to_owned(),
            Some(at) => {
                let at = at.as_u64().expect("append_at is an integer") as usize;
                let have = self.text.chars().count();
                // The gateway appends where this device's text ends, or replaces it (0).
                assert!(
                    at == 0 || at == have,
                    "append_at {at} but the app has {have}"
                );
                if at == 0 {
                    self.rewrites += 1;
                }
                self.appends += 1;
                self.text = self.text.chars().take(at).collect::<String>() + text;
            }
        }
    }

    /// Updates a second between the first and the last.
    fn rate(&self) -> f64 {
        let span = self.last_at.unwrap().duration_since(self.first_at.unwrap());
        (self.updates.saturating_sub(1)) as f64 / span.as_secs_f64().max(1e-3)
    }
}

/// Reads until `message.stop`, applying every `message.update` on the way; returns the stop.
async fn follow(c: &mut Client, device: &mut Device) -> Value {
    loop {
        let f = c.recv().await;
        match frame_type(&f) {
            "message.update" => device.apply(&f),
            "message.stop" => return f,
            _ => {}
        }
    }
}

async fn send(c: &mut Client, text: &str) {
    c.request(
        "message.send",
        Some("default"),
        None,
        json!({ "text": text }),
    )
    .await;
}

#[tokio::test]
async fn a_one_millisecond_stream_arrives_paced_and_ends_exact() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), "");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    send(&mut c, "[[stream 800 1000]]").await;
    let mut device = Device::default();
    let stop = follow(&mut c, &mut device).await;
    let seen = device.of(&stop);
    let want = streamed_words(800);
    assert_eq!(pstr(&stop, "final_text"), want);
    // 800 tokens a millisecond apart: one update per token before pacing, now one per
    // interval (200 ms) over ~0.8 s, whatever the scheduling noise.
    assert!(seen.updates >= 1, "no update at all");
    assert!(seen.updates <= 12, "{} updates for 0.8 s", seen.updates);
    assert_eq!(seen.appends, 0, "a v1 device got the append form");
    assert!(want.starts_with(&seen.text), "{}", seen.text);
}

#[tokio::test]
async fn two_devices_in_one_lane_each_get_their_own_form_within_the_byte_bounds() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), "");
    let data = dir.path().join("data");
    let (old, new) = (pair(&data, "old"), pair(&data, "new"));
    let (mut v1, _) = connect(&gw, &old).await;
    let (mut app, ack) = connect_with(&gw, &new, append_caps()).await;
    let listed = &ack["payload"]["server_caps"]["extensions"];
    assert!(
        listed.as_array().unwrap().contains(&json!("update_append")),
        "{ack}"
    );
    // 300 tokens of 6 bytes (like the 8.5 KB of a 1,500-token answer) at 100 a second (the
    // pace of a fast provider), 3 s.
    send(&mut app, "[[stream 300 100 6]]").await;
    let (mut v1_device, mut app_device) = (Device::default(), Device::default());
    let (stop_v1, stop_app) = tokio::join!(
        follow(&mut v1, &mut v1_device),
        follow(&mut app, &mut app_device)
    );
    let (whole, parts) = (v1_device.of(&stop_v1), app_device.of(&stop_app));
    // The reply's leading blank is trimmed, its trailing one kept.
    let want = format!("{}{}", "xxxxx ".repeat(299), "xxxxx ")
        .trim_start()
        .to_owned();
    assert_eq!(pstr(&stop_v1, "final_text"), want);
    assert_eq!(pstr(&stop_app, "final_text"), want);
    // The append device ends on the agent's text from its updates alone.
    assert_eq!(parts.text, want);
    assert_eq!(whole.appends, 0, "a v1 device got the append form");
    assert_eq!(
        parts.appends, parts.updates,
        "an append device got a whole-text update"
    );
    assert_eq!(parts.rewrites, 1, "only the first update replaces");
    // One message on the connection: every continuation leaves out its id.
    assert_eq!(app_device.named, 0);
    assert_eq!(app_device.unnamed, parts.updates - 1);
    let ratio = |s: &Seen| s.bytes as f64 / want.len() as f64;
    eprintln!(
        "whole text: {} updates, {:.1}x; append: {} updates, {:.2}x, {:.1}/s",
        whole.updates,
        ratio(whole),
        parts.updates,
        ratio(parts),
        parts.rate()
    );
    assert!(
        ratio(whole) <= 25.0,
        "whole-text updates cost {:.1}x the answer",
        ratio(whole)
    );
    // A continuation's frame is ~70 bytes (no lane, no message id) beside the ~105 bytes of
    // text 200 ms brings at this pace: ~1.7x, and no longer growing with the answer.
    assert!(
        ratio(parts) <= 2.0,
        "append updates cost {:.2}x the answer",
        ratio(parts)
    );
    // Loose: the paced rate is 5 a second; scheduling noise must not halve it.
    assert!(parts.rate() >= 3.0, "{:.1} updates a second", parts.rate());
}

#[tokio::test]
async fn append_updates_reassemble_across_a_cut() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), "max_out_frame_bytes = 65536");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect_with(&gw, &p, append_caps()).await;

    // 100 tokens of 1 KiB: past the reply's share of a 64 KiB frame, so it is cut.
    send(&mut c, "[[stream 100 1000 1024]]").await;
    let mut device = Device::default();
    let stop = follow(&mut c, &mut device).await;
    let seen = device.of(&stop);
    let fin = pstr(&stop, "final_text");
    assert!(fin.contains("[reply cut"), "{}", &fin[fin.len() - 80..]);
    assert_eq!(seen.text, fin);
    assert!(seen.updates >= 2, "{} updates", seen.updates);
}

#[tokio::test]
async fn append_updates_start_whole_after_a_reconnect_and_sync() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), "");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, ack) = connect_with(&gw, &p, append_caps()).await;
    let cursor = sync_cursor(&ack);
    send(&mut c, "[[stream 300 100]]").await;
    let mut before = Device::default();
    let mut updates = 0;
    while updates < 3 {
        let f = c.recv().await;
        if frame_type(&f) == "message.update" {
            before.apply(&f);
            updates += 1;
        }
    }
    assert!(before.unnamed >= 1, "no continuation before the reconnect");
    c.close().await;

    let (mut c, _) = connect_with(&gw, &p, append_caps()).await;
    c.request("sync", None, None, json!({ "cursor": cursor }))
        .await;
    // The new connection knows nothing of what the old one had: its first update replaces,
    // and names its message (`Device::apply` checks).
    let mut device = Device::default();
    let stop = follow(&mut c, &mut device).await;
    let again = device.of(&stop);
    let want = streamed_words(300);
    assert_eq!(pstr(&stop, "final_text"), want);
    assert!(again.updates >= 1, "no update after the reconnect");
    assert!(again.rewrites >= 1);
    assert_eq!(again.text, want);
}

#[tokio::test]
async fn two_lanes_streaming_at_once_reassemble_on_one_append_device() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), "");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect_with(&gw, &p, append_caps()).await;
    let side = create_channel(&mut c, "Side").await;

    // Two turns in two lanes run at once (limits.max_running_turns), their updates to this
    // device interleaved for the 1 s of the shorter; the longer goes on alone for 1 s more.
    send(&mut c, "[[stream 200 100]]").await;
    c.request(
        "message.send",
        Some(&side),
        None,
        json!({ "text": "[[stream 100 100 4]]" }),
    )
    .await;
    let mut device = Device::default();
    let mut stops = Vec::new();
    while stops.len() < 2 {
        let f = c.recv().await;
        match frame_type(&f) {
            "message.update" => device.apply(&f),
            "message.stop" => stops.push(f),
            _ => {}
        }
    }
    let mut finals: Vec<&str> = Vec::new();
    for stop in &stops {
        let fin = pstr(stop, "final_text");
        assert_eq!(device.of(stop).text, fin, "{}", pstr(stop, "message_id"));
        finals.push(fin);
    }
    finals.sort();
    let mut want = [
        streamed_words(200),
        "xxx ".repeat(100).trim_start().to_owned(),
    ];
    want.sort();
    assert_eq!(finals, want);
    // While the lanes interleaved continuations had to name their message again; once the
    // longer went on alone they did not.
    assert!(
        device.named >= 1,
        "no continuation named its message: the lanes did not interleave"
    );
    assert!(device.unnamed >= 1, "every continuation named its message");
    eprintln!(
        "continuations: {} named, {} unnamed",
        device.named, device.unnamed
    );
}
