//! Streamed answers through the real binary and the OpenAI-compatible backend (the scripted
//! mock LLM streams `[[stream N RATE]]`): `message.update` is paced, the final state is exact,
//! and an app that lists `update_append` in `hello.caps.extensions` gets only what it lacks
//! (reassembled across a cut and a reconnect with `sync`; a rewrite is
//! covered by the outlet's unit tests, since this backend never rewrites), while one that did not
//! ask only ever sees whole-text updates. Sizes keep each test to a few seconds.

mod common;

use std::time::Instant;

use common::peers::MockLlm;
use common::{
    connect, connect_with, frame_type, pair, pstr, sync_cursor, temp_data_dir, Client, Gateway,
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
async fn follow(c: &mut Client, seen: &mut Seen) -> Value {
    loop {
        let f = c.recv().await;
        match frame_type(&f) {
            "message.update" => seen.apply(&f),
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
    let mut seen = Seen::default();
    let stop = follow(&mut c, &mut seen).await;
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
    let (mut whole, mut parts) = (Seen::default(), Seen::default());
    let (stop_v1, stop_app) =
        tokio::join!(follow(&mut v1, &mut whole), follow(&mut app, &mut parts));
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
    let ratio = |s: &Seen| s.bytes as f64 / want.len() as f64;
    eprintln!(
        "whole text: {} updates, {:.1}x; append: {} updates, {:.2}x, {:.1}/s",
        whole.updates,
        ratio(&whole),
        parts.updates,
        ratio(&parts),
        parts.rate()
    );
    assert!(
        ratio(&whole) <= 25.0,
        "whole-text updates cost {:.1}x the answer",
        ratio(&whole)
    );
    // Each update's frame (~105 bytes for a continuation, which names only its message) is
    // about what 200 ms of text brings at this pace: ~2x (1.98x measured here), with room for
    // scheduling noise; what matters is that it no longer grows with the answer.
    assert!(
        ratio(&parts) <= 2.5,
        "append updates cost {:.2}x the answer",
        ratio(&parts)
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
    let mut seen = Seen::default();
    let stop = follow(&mut c, &mut seen).await;
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
    let mut seen = Seen::default();
    while seen.updates < 3 {
        let f = c.recv().await;
        if frame_type(&f) == "message.update" {
            seen.apply(&f);
        }
    }
    c.close().await;

    let (mut c, _) = connect_with(&gw, &p, append_caps()).await;
    c.request("sync", None, None, json!({ "cursor": cursor }))
        .await;
    // The new connection knows nothing of what the old one had: its first update replaces.
    let mut again = Seen::default();
    let stop = follow(&mut c, &mut again).await;
    let want = streamed_words(300);
    assert_eq!(pstr(&stop, "final_text"), want);
    assert!(again.updates >= 1, "no update after the reconnect");
    assert!(again.rewrites >= 1);
    assert_eq!(again.text, want);
}
