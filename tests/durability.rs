//! Durability and backpressure, end to end against the real binary: the outbox and `sync`
//! (gap-free cursors, exactly-once hand-over from replay to live delivery, retention), crash
//! safety under `kill -9` (everything acknowledged or seen survives, interrupted turns are
//! answered at the next start), the graceful SIGTERM path, and a stalled reader that must neither
//! grow the gateway's memory without bound nor lose anything it can later `sync`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    cursor_of, frame_type, hello_paired, id_of, pair, pstr, sync_cursor, temp_data_dir, Client,
    Gateway, Schema,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// Frame types the gateway parks in the outbox (they carry a `cursor` when replayed).
const OUTBOXED: &[&str] = &[
    "message",
    "tool.end",
    "message.stop",
    "message.deleted",
    "channel.created",
    "channel.renamed",
    "channel.deleted",
];

fn is_outboxed(f: &Value) -> bool {
    OUTBOXED.contains(&frame_type(f))
}

/// A frame without the per-delivery envelope fields (`cursor` on replay, `id` on the
/// requester's copy): what must be identical between live delivery and replay.
fn strip(f: &Value) -> Value {
    let mut f = f.clone();
    if let Some(o) = f.as_object_mut() {
        o.remove("cursor");
        o.remove("id");
    }
    f
}

fn short(frames: &[Value]) -> String {
    frames
        .iter()
        .map(|f| {
            let key = match frame_type(f) {
                "message" | "message.stop" => pstr(f, "message_id").to_owned(),
                t if t.starts_with("channel.") => pstr(f, "chat_id").to_owned(),
                _ => String::new(),
            };
            match cursor_of(f) {
                Some(c) => format!("#{c} {} {key}", frame_type(f)),
                None => format!("{} {key}", frame_type(f)),
            }
        })
        .collect::<Vec<_>>()
        .join("\n  ")
}

#[track_caller]
fn assert_no_cursor(frames: &[Value], who: &str) {
    for f in frames {
        assert!(
            f.get("cursor").is_none(),
            "{who}: a live frame carries `cursor`: {f}"
        );
    }
}

/// What a `sync` request brought back.
struct Synced {
    /// Frames that arrived after the request and before the first replayed frame (greeting
    /// leftovers, live frames queued before the request was handled).
    pre: Vec<Value>,
    /// Frames carrying `cursor`, in arrival order.
    replay: Vec<Value>,
    /// Frames without `cursor` that arrived after the first replayed frame and before
    /// `sync.done` (should normally be none).
    interleaved: Vec<Value>,
    done: Value,
}

impl Synced {
    fn cursors(&self) -> Vec<u64> {
        self.replay.iter().filter_map(cursor_of).collect()
    }

    fn done_cursor(&self) -> u64 {
        self.done
            .pointer("/payload/cursor")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("sync.done without an integer cursor: {}", self.done))
    }
}

async fn sync(c: &mut Client, from: u64) -> Synced {
    let id = c
        .request("sync", None, None, json!({ "cursor": from }))
        .await;
    let mut out = Synced {
        pre: Vec::new(),
        replay: Vec::new(),
        interleaved: Vec::new(),
        done: Value::Null,
    };
    loop {
        let f = c.recv().await;
        if frame_type(&f) == "sync.done" && id_of(&f) == Some(id) {
            assert!(
                f.get("cursor").is_none(),
                "sync.done must not carry an envelope cursor: {f}"
            );
            out.done = f;
            return out;
        }
        if frame_type(&f) == "error" && id_of(&f) == Some(id) {
            panic!("sync{{cursor:{from}}} was refused: {f}\n{}", c.recent());
        }
        if let Some(cur) = cursor_of(&f) {
            assert!(
                is_outboxed(&f),
                "sync replayed a `{}` frame (cursor {cur}), which is not an outboxed type: {f}",
                frame_type(&f)
            );
            out.replay.push(f);
        } else if out.replay.is_empty() {
            out.pre.push(f);
        } else {
            out.interleaved.push(f);
        }
    }
}

#[track_caller]
fn assert_strictly_increasing(cursors: &[u64], what: &str) {
    for w in cursors.windows(2) {
        assert!(
            w[0] < w[1],
            "{what}: cursors not strictly increasing: {cursors:?}"
        );
    }
}

/// The answer to a `message.send` that was waited for.
struct Said {
    user_id: String,
    stop: Value,
}

/// Sends one message into the default lane and waits for its receipt, echo and `message.stop`;
/// retries (bounded) when the per-connection frame rate limit refuses the frame.
async fn say(c: &mut Client, text: &str) -> Said {
    for _ in 0..100 {
        let id = c.send_text(None, None, &text).await;
        let reply = c.recv_reply(id).await;
        match frame_type(&reply) {
            "read.receipt" => {
                let user_id = pstr(&reply, "message_id").to_owned();
                assert!(
                    !user_id.is_empty(),
                    "read.receipt without message_id: {reply}"
                );
                c.recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == user_id)
                    .await;
                let stop = c.recv_type("message.stop").await;
                return Said { user_id, stop };
            }
            "error" if pstr(&reply, "code") == "rate_limited" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("message.send `{text}` got {reply}\n{}", c.recent()),
        }
    }
    panic!("message.send `{text}` was rate limited 100 times in a row");
}

/// The whole history of the default lane, oldest first, paged with limit 200.
async fn history_all(c: &mut Client) -> Vec<Value> {
    let mut all: Vec<Value> = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..200 {
        let mut payload = json!({ "limit": 200 });
        if let Some(b) = &before {
            payload["before_message_id"] = json!(b);
        }
        let id = c.request("history", None, None, payload).await;
        let reply = c.recv_reply(id).await;
        assert_eq!(frame_type(&reply), "history", "history request got {reply}");
        let mut page: Vec<Value> = reply
            .pointer("/payload/messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        page.append(&mut all);
        all = page;
        let has_more = reply
            .pointer("/payload/has_more")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if !has_more {
            return all;
        }
        let oldest = pstr(&reply, "oldest_message_id").to_owned();
        assert!(
            !oldest.is_empty(),
            "has_more without oldest_message_id: {reply}"
        );
        before = Some(oldest);
    }
    panic!("history did not end after 200 pages");
}

// ---------------------------------------------------------------------------------------------
// 1. Offline catch-up
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn offline_device_catches_up_with_sync() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let pb = pair(dir.path(), "phone B");

    let (mut a, _) = hello_paired(&gw, &pa).await;
    let (b, ack_b) = hello_paired(&gw, &pb).await;
    let old = sync_cursor(&ack_b);
    let b_first_seen = b.seen.clone();
    b.close().await;

    let start = a.seen.len();
    for i in 1..=3 {
        say(&mut a, &format!("catch-up message number {i}")).await;
    }
    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Made while B slept", "kind": "channel" }),
        )
        .await;
    let created = a.recv_reply(id).await;
    assert_eq!(frame_type(&created), "channel.created", "{created}");
    // The turn's closing `typing{on:false}` may still be on its way; let A settle.
    a.collect_quiet(Duration::from_millis(200)).await;

    let a_outboxed: Vec<Value> = a.seen[start..]
        .iter()
        .filter(|f| is_outboxed(f))
        .cloned()
        .collect();
    let count = |t: &str| a_outboxed.iter().filter(|f| frame_type(f) == t).count();
    assert_eq!(
        (
            count("message"),
            count("tool.end"),
            count("message.stop"),
            count("channel.created")
        ),
        (3, 3, 3, 1),
        "A's live outboxed frames:\n  {}",
        short(&a_outboxed)
    );
    assert_eq!(
        a_outboxed.len(),
        10,
        "A's live outboxed frames:\n  {}",
        short(&a_outboxed)
    );

    let (mut b, ack_b2) = hello_paired(&gw, &pb).await;
    let new_head = sync_cursor(&ack_b2);
    let s = sync(&mut b, old).await;
    let replay_types: Vec<&str> = s.replay.iter().map(frame_type).collect();
    assert!(
        s.interleaved.is_empty(),
        "frames without cursor arrived inside the replay:\n  {}",
        short(&s.interleaved)
    );
    for f in &s.pre {
        assert!(
            matches!(frame_type(f), "status" | "todo.update"),
            "only the hello greeting may precede the replay, got {f}"
        );
    }
    assert_eq!(
        s.replay.len(),
        10,
        "sync{{cursor:{old}}} replayed:\n  {}",
        short(&s.replay)
    );
    common::cursors::assert_contiguous(
        &s.cursors(),
        old + 1,
        old + 10,
        "replay after an offline spell",
    );
    let replayed: Vec<Value> = s.replay.iter().map(strip).collect();
    let live: Vec<Value> = a_outboxed.iter().map(strip).collect();
    assert_eq!(
        replayed, live,
        "the replay must be exactly A's live outboxed frames, in A's order (types {replay_types:?})"
    );
    assert_eq!(
        s.done_cursor(),
        old + 10,
        "sync.done cursor is the last replayed cursor"
    );
    assert_eq!(
        new_head,
        s.done_cursor(),
        "hello.ack.sync_cursor on reconnect is the head"
    );

    // Already at the head: nothing but sync.done.
    let again = sync(&mut b, new_head).await;
    assert!(
        again.pre.is_empty() && again.replay.is_empty(),
        "sync from the head returned frames:\n  {}\n  {}",
        short(&again.pre),
        short(&again.replay)
    );
    assert_eq!(again.done_cursor(), new_head);

    assert_no_cursor(&a.seen, "device A");
    assert_no_cursor(&b_first_seen, "device B (first connection)");
    let b_live: Vec<Value> = b
        .seen
        .iter()
        .filter(|f| !s.replay.contains(f))
        .cloned()
        .collect();
    assert_no_cursor(&b_live, "device B (outside the replay)");
}

// ---------------------------------------------------------------------------------------------
// 2. Sync racing live traffic
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sync_during_live_traffic() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "5"]);
    let pa = pair(dir.path(), "phone A");
    let pb = pair(dir.path(), "phone B");

    let (mut a, _) = hello_paired(&gw, &pa).await;
    say(&mut a, "warm up one").await;
    say(&mut a, "warm up two").await;
    let (mut b, _) = hello_paired(&gw, &pb).await;

    for i in 0..3 {
        let id = a
            .send_text(None, None, &format!("streamed while B syncs {i}"))
            .await;
        let r = a.recv_reply(id).await;
        assert_eq!(frame_type(&r), "read.receipt", "{r}\n{}", a.recent());
    }
    // The first of those turns is streaming now.
    a.recv_type("message.update").await;
    let b_sync_from = b.seen.len();
    let sync_id = b.request("sync", None, None, json!({ "cursor": 0 })).await;

    const TURNS: usize = 5;
    let stops_in = |frames: &[Value]| -> BTreeSet<String> {
        frames
            .iter()
            .filter(|f| frame_type(f) == "message.stop")
            .map(|f| pstr(f, "message_id").to_owned())
            .collect()
    };
    let wait_a = async {
        while stops_in(&a.seen).len() < TURNS {
            a.recv_type("message.stop").await;
        }
        a.collect_quiet(Duration::from_millis(300)).await;
    };
    let wait_b = async {
        b.recv_until(|f| frame_type(f) == "sync.done" && id_of(f) == Some(sync_id))
            .await;
        loop {
            let first_replayed = b.seen[b_sync_from..]
                .iter()
                .position(|f| cursor_of(f).is_some())
                .map(|p| p + b_sync_from)
                .unwrap_or(b.seen.len());
            if stops_in(&b.seen[first_replayed..]).len() >= TURNS {
                break;
            }
            b.recv_type("message.stop").await;
        }
        b.collect_quiet(Duration::from_millis(300)).await;
    };
    tokio::join!(wait_a, wait_b);

    let a_outboxed: Vec<Value> = a.seen.iter().filter(|f| is_outboxed(f)).cloned().collect();
    assert_eq!(
        a_outboxed.len(),
        TURNS * 3,
        "A's outboxed frames:\n  {}",
        short(&a_outboxed)
    );

    let after_req = &b.seen[b_sync_from..];
    let done_at = after_req
        .iter()
        .position(|f| frame_type(f) == "sync.done" && id_of(f) == Some(sync_id))
        .expect("sync.done recorded");
    let first_replayed = after_req
        .iter()
        .position(|f| cursor_of(f).is_some())
        .expect("sync from 0 replayed nothing");
    let replay: Vec<Value> = after_req[first_replayed..done_at]
        .iter()
        .filter(|f| cursor_of(f).is_some())
        .cloned()
        .collect();
    let done_cursor = after_req[done_at]
        .pointer("/payload/cursor")
        .and_then(Value::as_u64)
        .expect("sync.done cursor");
    // Live outboxed frames delivered once the replay had started (normally only after sync.done).
    let live_after: Vec<Value> = after_req[first_replayed..]
        .iter()
        .filter(|f| cursor_of(f).is_none() && is_outboxed(f))
        .cloned()
        .collect();
    let late_cursor: Vec<&Value> = after_req[done_at..]
        .iter()
        .filter(|f| cursor_of(f).is_some())
        .collect();
    assert!(
        late_cursor.is_empty(),
        "frames with cursor after sync.done: {late_cursor:?}"
    );

    let cursors: Vec<u64> = replay.iter().filter_map(cursor_of).collect();
    common::cursors::assert_contiguous(
        &cursors,
        1,
        done_cursor,
        "replay from 0 during live traffic",
    );

    let mut b_union: Vec<Value> = replay.iter().map(strip).collect();
    b_union.extend(live_after.iter().map(strip));
    eprintln!(
        "sync_during_live_traffic: replay {} frames (head {done_cursor}), then {} live outboxed frames",
        replay.len(),
        live_after.len()
    );
    // Exactly once, nothing missing: per message_id and overall.
    for kind in ["message", "message.stop"] {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for f in b_union.iter().filter(|f| frame_type(f) == kind) {
            *seen.entry(pstr(f, "message_id")).or_default() += 1;
        }
        let dup: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            dup.is_empty(),
            "B got these {kind} frames twice across replay + live: {dup:?}\nreplay:\n  {}\nlive after:\n  {}",
            short(&replay),
            short(&live_after)
        );
        for f in a_outboxed.iter().filter(|f| frame_type(f) == kind) {
            assert!(
                seen.contains_key(pstr(f, "message_id")),
                "B never got {kind} {} (A did)\nreplay:\n  {}\nlive after:\n  {}",
                pstr(f, "message_id"),
                short(&replay),
                short(&live_after)
            );
        }
    }
    let tool_ends = b_union
        .iter()
        .filter(|f| frame_type(f) == "tool.end")
        .count();
    assert_eq!(tool_ends, TURNS, "tool.end frames across replay + live");
    let a_stripped: Vec<Value> = a_outboxed.iter().map(strip).collect();
    assert_eq!(
        b_union,
        a_stripped,
        "replay + live-after-sync.done must be A's outboxed stream exactly\nB:\n  {}\nA:\n  {}",
        short(&b_union),
        short(&a_outboxed)
    );
    assert_no_cursor(&a.seen, "device A");
}

// ---------------------------------------------------------------------------------------------
// 3. kill -9 while turns run
// ---------------------------------------------------------------------------------------------

/// What earlier cycles of `kill9_loses_nothing` promise the next start must still show.
#[derive(Default)]
struct Promised {
    /// user message_id → text, for every message that got a read.receipt.
    receipted: BTreeMap<String, String>,
    /// (type, message_id) of every `message` / `message.stop` seen live.
    seen_live: BTreeSet<(String, String)>,
    /// Head the next hello.ack must reach at least.
    min_head: u64,
}

const RESTARTED_WORD: &str = "restarted";

/// The quoted user text inside a demo reply (`You said: “TEXT”. …`).
fn demo_quote(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("You said: \u{201c}")?;
    rest.split_once("\u{201d}. That is ").map(|(q, _)| q)
}

async fn verify_after_crash(
    c: &mut Client,
    ack: &Value,
    promised: &Promised,
    label: &str,
    gw: &Gateway,
) {
    let head = sync_cursor(ack);
    assert!(
        head >= promised.min_head,
        "{label}: hello.ack.sync_cursor {head} is below {} (cursors already seen before the kill)\n{}",
        promised.min_head,
        gw.output_tail()
    );

    // History: everything acknowledged is there; every user message is answered exactly once.
    let hist = history_all(c).await;
    let mut users: Vec<(usize, String, String)> = Vec::new();
    let mut demo_answers: Vec<(usize, String)> = Vec::new();
    let mut restarted: Vec<usize> = Vec::new();
    let mut hist_ids: BTreeSet<String> = BTreeSet::new();
    for (i, m) in hist.iter().enumerate() {
        let id = m["message_id"].as_str().unwrap_or("").to_owned();
        assert!(
            hist_ids.insert(id.clone()),
            "{label}: message {id} twice in history"
        );
        let text = m["text"].as_str().unwrap_or("").to_owned();
        match m["role"].as_str() {
            Some("user") => users.push((i, id, text)),
            Some("assistant") => {
                if let Some(q) = demo_quote(&text) {
                    demo_answers.push((i, q.to_owned()));
                } else if text.contains(RESTARTED_WORD) {
                    restarted.push(i);
                } else {
                    panic!("{label}: unexpected assistant message in history: {m}");
                }
            }
            other => panic!("{label}: unexpected role {other:?} in history: {m}"),
        }
    }
    for (id, text) in &promised.receipted {
        let found = users.iter().find(|(_, uid, _)| uid == id);
        let Some((_, _, got)) = found else {
            panic!(
                "{label}: user message {id} ({text:?}) got a read.receipt before the kill but is not in history ({} messages)\n{}",
                hist.len(),
                gw.output_tail()
            );
        };
        assert_eq!(got, text, "{label}: stored text of {id}");
    }
    for (kind, id) in &promised.seen_live {
        assert!(
            hist_ids.contains(id),
            "{label}: a `{kind}` for {id} was delivered live before the kill, but {id} is not in history\n{}",
            gw.output_tail()
        );
    }
    let mut unanswered: Vec<usize> = Vec::new();
    for (pos, _, text) in &users {
        let answers: Vec<&(usize, String)> =
            demo_answers.iter().filter(|(_, q)| q == text).collect();
        assert!(
            answers.len() <= 1,
            "{label}: {text:?} was answered {} times",
            answers.len()
        );
        match answers.first() {
            Some((apos, _)) => assert!(
                apos > pos,
                "{label}: answer to {text:?} precedes it in history"
            ),
            None => unanswered.push(*pos),
        }
    }
    for (_, q) in &demo_answers {
        assert!(
            users.iter().any(|(_, _, t)| t == q),
            "{label}: demo answer quoting {q:?} has no user message"
        );
    }
    assert_eq!(
        restarted.len(),
        unanswered.len(),
        "{label}: every user message without a reply needs exactly one \"gateway restarted\" message \
         (unanswered user messages at positions {unanswered:?}, restarted notices at {restarted:?})\n{}",
        gw.output_tail()
    );
    // Each unanswered message needs its own notice somewhere after it (both lists ascend).
    for (u, r) in unanswered.iter().zip(&restarted) {
        assert!(
            r > u,
            "{label}: restarted notices at {restarted:?} cannot each follow a distinct unanswered message at {unanswered:?}"
        );
    }

    // Outbox: strictly increasing cursors, no duplicates, everything seen before is there.
    let s = sync(c, 0).await;
    let cursors = s.cursors();
    assert_strictly_increasing(&cursors, label);
    if let (Some(first), Some(last)) = (cursors.first(), cursors.last()) {
        if cursors.len() as u64 != last - first + 1 {
            eprintln!("{label}: note: outbox cursors have gaps: {cursors:?}");
        }
        assert_eq!(
            *last, head,
            "{label}: last replayed cursor vs hello.ack head"
        );
    }
    assert_eq!(
        s.done_cursor(),
        head,
        "{label}: sync.done cursor vs hello.ack head"
    );
    let mut replay_keys: BTreeSet<(String, String)> = BTreeSet::new();
    for f in s
        .replay
        .iter()
        .filter(|f| matches!(frame_type(f), "message" | "message.stop"))
    {
        let key = (frame_type(f).to_owned(), pstr(f, "message_id").to_owned());
        assert!(
            replay_keys.insert(key.clone()),
            "{label}: {key:?} replayed twice:\n  {}",
            short(&s.replay)
        );
    }
    for key in &promised.seen_live {
        assert!(
            replay_keys.contains(key),
            "{label}: {key:?} was delivered live before the kill but is not in the outbox\n{}",
            gw.output_tail()
        );
    }
    for id in promised.receipted.keys() {
        assert!(
            replay_keys.contains(&("message".to_owned(), id.clone())),
            "{label}: the echo of receipted message {id} is not in the outbox"
        );
    }
    let replayed_restarts = s
        .replay
        .iter()
        .filter(|f| {
            frame_type(f) == "message"
                && pstr(f, "role") == "assistant"
                && pstr(f, "text").contains(RESTARTED_WORD)
        })
        .count();
    assert_eq!(
        replayed_restarts,
        restarted.len(),
        "{label}: restarted notices in the outbox vs in history"
    );
    eprintln!(
        "{label}: head {head}, history {} messages ({} user, {} answered, {} restarted notices)",
        hist.len(),
        users.len(),
        demo_answers.len(),
        restarted.len()
    );
}

#[tokio::test]
async fn kill9_loses_nothing() {
    const N: usize = 20;
    const KILL_AFTER_RECEIPTS: usize = 10;
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let mut promised = Promised::default();

    for cycle in 1..=3 {
        let (mut a, ack) = hello_paired(&gw, &pa).await;
        verify_after_crash(
            &mut a,
            &ack,
            &promised,
            &format!("before cycle {cycle}"),
            &gw,
        )
        .await;
        let head = sync_cursor(&ack);
        let live_from = a.seen.len();

        let mut sent: BTreeMap<i64, String> = BTreeMap::new();
        for i in 0..N {
            let text = format!("cycle {cycle} message {i:02}");
            let id = a.send_text(None, None, &text).await;
            sent.insert(id, text);
        }
        let mut receipts = 0;
        let mut answered = 0;
        let mut refused = 0;
        while receipts < KILL_AFTER_RECEIPTS && answered < N {
            let f = a.recv().await;
            let Some(id) = id_of(&f).filter(|id| sent.contains_key(id)) else {
                continue;
            };
            match frame_type(&f) {
                "read.receipt" => {
                    receipts += 1;
                    answered += 1;
                    promised
                        .receipted
                        .insert(pstr(&f, "message_id").to_owned(), sent[&id].clone());
                }
                "error" => {
                    assert_eq!(pstr(&f, "code"), "rate_limited", "cycle {cycle}: {f}");
                    refused += 1;
                    answered += 1;
                }
                _ => panic!("cycle {cycle}: unexpected reply {f}"),
            }
        }
        gw.kill9();

        let live = &a.seen[live_from..];
        assert_no_cursor(live, &format!("cycle {cycle}: device A"));
        let live_outboxed = live.iter().filter(|f| is_outboxed(f)).count() as u64;
        for f in live
            .iter()
            .filter(|f| matches!(frame_type(f), "message" | "message.stop"))
        {
            promised
                .seen_live
                .insert((frame_type(f).to_owned(), pstr(f, "message_id").to_owned()));
        }
        promised.min_head = head + live_outboxed;
        eprintln!(
            "cycle {cycle}: killed after {receipts} receipts ({refused} rate limited); {live_outboxed} outboxed frames seen live since head {head}"
        );
        drop(a);
        gw = Gateway::start(dir.path(), &[]);
    }
    let (mut a, ack) = hello_paired(&gw, &pa).await;
    verify_after_crash(&mut a, &ack, &promised, "after the last kill", &gw).await;
}

// ---------------------------------------------------------------------------------------------
// 4. kill -9 while the channel directory changes
// ---------------------------------------------------------------------------------------------

/// One directory change sent without waiting for its reply.
enum DirOp {
    Create(String),
    SetDefault(String),
    Rename(String, String),
}

/// What a directory entry may look like after a crash: the last acknowledged state, or the
/// state after any later change that was still in flight.
fn allowed_after(
    previous: &BTreeSet<String>,
    changes: &[(usize, String)],
    last_acked: Option<usize>,
) -> BTreeSet<String> {
    match last_acked {
        Some(acked) => changes
            .iter()
            .filter(|(i, _)| *i >= acked)
            .map(|(_, v)| v.clone())
            .collect(),
        None => previous
            .iter()
            .cloned()
            .chain(changes.iter().map(|(_, v)| v.clone()))
            .collect(),
    }
}

#[tokio::test]
async fn kill9_during_channel_changes() {
    const CREATES: usize = 30;
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    // chat_id → the names it may have, for every channel whose channel.created reply arrived.
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut defaults_allowed: BTreeSet<String> = BTreeSet::from(["default".to_owned()]);

    for cycle in 1..=3 {
        let (mut a, _) = hello_paired(&gw, &pa).await;
        let known: Vec<String> = names.keys().cloned().collect();
        let mut ops: Vec<DirOp> = Vec::new();
        for i in 0..CREATES {
            ops.push(DirOp::Create(format!("crash {cycle}-{i:02}")));
            if !known.is_empty() && i % 3 == 2 {
                ops.push(DirOp::SetDefault(
                    known[(i * 7 + cycle) % known.len()].clone(),
                ));
            }
            if !known.is_empty() && i % 5 == 4 {
                let target = known[(i * 3 + cycle) % known.len()].clone();
                ops.push(DirOp::Rename(target, format!("renamed {cycle}-{i:02}")));
            }
        }
        let mut by_request: BTreeMap<i64, usize> = BTreeMap::new();
        for (index, op) in ops.iter().enumerate() {
            let id = match op {
                DirOp::Create(name) => {
                    a.request(
                        "channel.create",
                        None,
                        None,
                        json!({ "name": name, "kind": "channel" }),
                    )
                    .await
                }
                DirOp::SetDefault(chat) => {
                    a.request("channel.set_default", Some(chat), None, json!({}))
                        .await
                }
                DirOp::Rename(chat, name) => {
                    a.request("channel.rename", Some(chat), None, json!({ "name": name }))
                        .await
                }
            };
            by_request.insert(id, index);
        }
        let mut acked: BTreeSet<usize> = BTreeSet::new();
        while acked.len() < ops.len() / 2 {
            let f = a.recv().await;
            let Some(index) = id_of(&f).and_then(|id| by_request.get(&id).copied()) else {
                continue;
            };
            match (&ops[index], frame_type(&f)) {
                (DirOp::Create(name), "channel.created") => {
                    assert_eq!(pstr(&f, "name"), name, "{f}");
                    names.insert(
                        pstr(&f, "chat_id").to_owned(),
                        BTreeSet::from([name.clone()]),
                    );
                }
                (DirOp::SetDefault(chat), "channel.renamed") => {
                    assert_eq!(pstr(&f, "chat_id"), chat, "{f}");
                    assert_eq!(f.pointer("/payload/is_default"), Some(&json!(true)), "{f}");
                }
                (DirOp::Rename(chat, name), "channel.renamed") => {
                    assert_eq!(
                        (pstr(&f, "chat_id"), pstr(&f, "name")),
                        (chat.as_str(), name.as_str()),
                        "{f}"
                    );
                }
                _ => panic!(
                    "cycle {cycle}: unexpected reply to request #{index}: {f}\n{}",
                    a.recent()
                ),
            }
            acked.insert(index);
        }
        gw.kill9();
        drop(a);

        // What the directory may hold now.
        let sent_defaults: Vec<(usize, String)> = ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                DirOp::SetDefault(chat) => Some((i, chat.clone())),
                _ => None,
            })
            .collect();
        let last_default_ack = sent_defaults
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| acked.contains(i))
            .max();
        defaults_allowed = allowed_after(&defaults_allowed, &sent_defaults, last_default_ack);
        for chat in &known {
            let renames: Vec<(usize, String)> = ops
                .iter()
                .enumerate()
                .filter_map(|(i, op)| match op {
                    DirOp::Rename(c, name) if c == chat => Some((i, name.clone())),
                    _ => None,
                })
                .collect();
            let last = renames
                .iter()
                .map(|(i, _)| *i)
                .filter(|i| acked.contains(i))
                .max();
            let allowed = allowed_after(&names[chat], &renames, last);
            names.insert(chat.clone(), allowed);
        }

        gw = Gateway::start(dir.path(), &[]);
        let (mut a, ack) = hello_paired(&gw, &pa).await;
        let channels = ack
            .pointer("/payload/channels")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let by_id: BTreeMap<&str, &Value> = channels
            .iter()
            .map(|c| (c["chat_id"].as_str().unwrap_or(""), c))
            .collect();
        for (chat_id, allowed) in names.iter_mut() {
            let Some(entry) = by_id.get(chat_id.as_str()) else {
                panic!(
                    "cycle {cycle}: channel {chat_id} ({allowed:?}) was acknowledged before the kill but is missing after restart\nchannels: {channels:?}\n{}",
                    gw.output_tail()
                );
            };
            let name = entry["name"].as_str().unwrap_or("").to_owned();
            assert!(
                allowed.contains(&name),
                "cycle {cycle}: {chat_id} is named {name:?} after restart; acknowledged/in-flight names were {allowed:?}"
            );
            *allowed = BTreeSet::from([name]);
        }
        let defaults: Vec<&Value> = channels
            .iter()
            .filter(|c| c["is_default"] == json!(true))
            .collect();
        assert_eq!(
            defaults.len(),
            1,
            "cycle {cycle}: exactly one default, got {defaults:?}"
        );
        let default_id = defaults[0]["chat_id"].as_str().unwrap_or("").to_owned();
        assert_eq!(
            defaults[0]["kind"].as_str(),
            Some("default"),
            "{}",
            defaults[0]
        );
        assert_eq!(
            channels[0]["chat_id"].as_str(),
            Some(default_id.as_str()),
            "the default comes first"
        );
        let kind_default = channels
            .iter()
            .filter(|c| c["kind"] == json!("default"))
            .count();
        assert_eq!(
            kind_default, 1,
            "cycle {cycle}: exactly one entry of kind default: {channels:?}"
        );
        assert!(
            defaults_allowed.contains(&default_id),
            "cycle {cycle}: default after restart is {default_id}; the last acknowledged set_default (or a later one in flight) allows only {defaults_allowed:?}"
        );
        defaults_allowed = BTreeSet::from([default_id.clone()]);
        eprintln!(
            "kill9_during_channel_changes cycle {cycle}: {} of {} changes acknowledged before the kill; {} acknowledged channels survive among {} entries; default {default_id}",
            acked.len(),
            ops.len(),
            names.len(),
            channels.len()
        );
        // channel.list agrees with hello.ack.
        let id = a.request("channel.list", None, None, json!({})).await;
        let list = a.recv_reply(id).await;
        assert_eq!(
            list.pointer("/payload/channels"),
            Some(&json!(channels)),
            "channel.list vs hello.ack"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. SIGTERM
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sigterm_sends_restarting() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let pb = pair(dir.path(), "phone B");
    let (mut a, _) = hello_paired(&gw, &pa).await;
    let (mut b, _) = hello_paired(&gw, &pb).await;
    let said = say(&mut a, "remember me across a restart").await;
    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Kept", "kind": "channel" }),
        )
        .await;
    let created = a.recv_reply(id).await;
    let kept = pstr(&created, "chat_id").to_owned();
    b.recv_until(|f| frame_type(f) == "channel.created" && pstr(f, "chat_id") == kept)
        .await;

    let stopping = tokio::task::spawn_blocking(move || {
        let mut gw = gw;
        let status = gw.sigterm();
        (gw, status)
    });
    async fn restarting_then_1012(c: &mut Client, who: &str) {
        c.recv_until(|f| frame_type(f) == "status" && pstr(f, "state") == "restarting")
            .await;
        let code = c.expect_closed().await;
        assert_eq!(
            code,
            Some(1012),
            "{who}: close after status restarting\n{}",
            c.recent()
        );
    }
    tokio::join!(
        restarting_then_1012(&mut a, "device A"),
        restarting_then_1012(&mut b, "device B")
    );
    let (gw, status) = stopping.await.expect("sigterm task");
    assert!(
        status.success(),
        "gateway exit after SIGTERM: {status}\n{}",
        gw.output_tail()
    );
    drop(gw);

    let gw = Gateway::start(dir.path(), &[]);
    let (mut a, ack) = hello_paired(&gw, &pa).await;
    let channels = ack
        .pointer("/payload/channels")
        .cloned()
        .unwrap_or_default();
    assert!(
        channels
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["chat_id"] == json!(kept))),
        "channel {kept} missing after a graceful restart: {channels}"
    );
    let hist = history_all(&mut a).await;
    let ids: Vec<&str> = hist
        .iter()
        .filter_map(|m| m["message_id"].as_str())
        .collect();
    assert!(
        ids.contains(&said.user_id.as_str()),
        "user message lost: {ids:?}"
    );
    assert!(
        ids.contains(&pstr(&said.stop, "message_id")),
        "assistant reply lost: {ids:?}"
    );
    assert_eq!(
        hist.len(),
        2,
        "a clean stop leaves no restarted notice: {hist:?}"
    );
}

/// The shutdown waits for what matters and for nothing else: a request left half-sent on the
/// HTTP front (a page left loading, a scanner) is dropped at once, while a device session gets
/// `status{restarting}` and 1012, and a message sent just before the signal is acknowledged and
/// kept. Were the half-sent request waited for, the gateway would log that tasks lingered past
/// the shutdown bound (the request may take `limits.hello_timeout_secs`, 10 s, to time out).
#[tokio::test]
async fn sigterm_drops_a_half_sent_request_and_keeps_what_a_device_sent() {
    use tokio::io::AsyncWriteExt;
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let mut half = TcpStream::connect(gw.addr).await.expect("connect");
    half.write_all(b"GET /pair HTTP/1.1\r\nHost: iris\r\n")
        .await
        .expect("half a request");
    let (mut a, _) = hello_paired(&gw, &pa).await;
    let said = say(&mut a, "sent just before the stop").await;

    let started = std::time::Instant::now();
    let stopping = tokio::task::spawn_blocking(move || {
        let mut gw = gw;
        let status = gw.sigterm();
        (gw, status)
    });
    a.recv_until(|f| frame_type(f) == "status" && pstr(f, "state") == "restarting")
        .await;
    assert_eq!(a.expect_closed().await, Some(1012), "{}", a.recent());
    let (gw, status) = stopping.await.expect("sigterm task");
    let took = started.elapsed();
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        gw.output_tail()
    );
    let out = gw.output_tail();
    assert!(
        !out.contains("had not finished within the shutdown bound"),
        "the shutdown waited for a half-sent request ({took:?}):\n{out}"
    );
    drop((gw, half));

    let gw = Gateway::start(dir.path(), &[]);
    let (mut a, _) = hello_paired(&gw, &pa).await;
    let hist = history_all(&mut a).await;
    assert!(
        hist.iter()
            .any(|m| m["message_id"].as_str() == Some(said.user_id.as_str())),
        "the message sent before the stop is gone: {hist:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. A stalled reader
// ---------------------------------------------------------------------------------------------

enum RawEnd {
    Close(Option<u16>),
    Eof(String),
    Quiet,
}

/// Reads a raw (non-harness) WebSocket until close, EOF or `quiet` without a frame; every text
/// frame is checked against the schema.
async fn drain_raw(
    ws: &mut WebSocketStream<TcpStream>,
    quiet: Duration,
    overall: Duration,
) -> (Vec<Value>, RawEnd) {
    let deadline = tokio::time::Instant::now() + overall;
    let mut frames = Vec::new();
    loop {
        let until = (tokio::time::Instant::now() + quiet).min(deadline);
        match tokio::time::timeout_at(until, ws.next()).await {
            Err(_) => return (frames, RawEnd::Quiet),
            Ok(None) => return (frames, RawEnd::Eof("end of stream".into())),
            Ok(Some(Err(e))) => return (frames, RawEnd::Eof(e.to_string())),
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str())
                    .unwrap_or_else(|e| panic!("non-JSON text frame ({e}): {}", t.as_str()));
                if let Err(e) = Schema::load().validate_server_frame(&v) {
                    panic!("{e}");
                }
                frames.push(v);
            }
            Ok(Some(Ok(Message::Close(c)))) => {
                return (frames, RawEnd::Close(c.map(|c| u16::from(c.code))))
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[tokio::test]
async fn stalled_reader_stays_bounded_and_loses_nothing() {
    const TURNS: usize = 150;
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let ps = pair(dir.path(), "stalled phone");

    // S: a socket with a tiny receive buffer that stops reading after hello.ack.
    let sock = TcpSocket::new_v4().expect("tcp socket");
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = tokio::time::timeout(Duration::from_secs(10), sock.connect(gw.addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let (mut s, _) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::client_async(gw.url.as_str(), stream),
    )
    .await
    .expect("handshake timed out")
    .expect("websocket handshake");
    let hello_frame = json!({
        "v": 1, "type": "hello", "id": 1,
        "payload": { "token": ps.token, "device_id": ps.device_id, "device_name": "stalled" }
    });
    Schema::load().validate_client_frame(&hello_frame).unwrap();
    s.send(Message::text(hello_frame.to_string()))
        .await
        .expect("send hello");
    let s_ack = loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("no hello.ack within 10 s");
        match msg {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
                Schema::load().validate_server_frame(&v).unwrap();
                if frame_type(&v) == "hello.ack" {
                    break v;
                }
                assert_ne!(frame_type(&v), "error", "S hello refused: {v}");
            }
            other => panic!("S: unexpected {other:?} before hello.ack"),
        }
    };
    let s_cursor = sync_cursor(&s_ack);

    let (mut a, _) = hello_paired(&gw, &pa).await;
    let a_from = a.seen.len();
    let (rss_before, hwm_before) = common::proc::rss_kib(gw.pid(), "VmHWM");
    // ~16 KB per message: with loopback's send buffer able to grow to 4 MiB (tcp_wmem), ~2 KB
    // texts (~2 MB in all) fit in the kernel buffers and never back up into the gateway's queue.
    let filler = "lorem ipsum dolor sit amet ".repeat(600);
    let mut a_stops: Vec<String> = Vec::new();
    for i in 0..TURNS {
        let said = say(&mut a, &format!("stall {i:03} {filler}")).await;
        a_stops.push(pstr(&said.stop, "message_id").to_owned());
    }
    let (rss_after, hwm_after) = common::proc::rss_kib(gw.pid(), "VmHWM");
    // S is sent what A gets, minus A's own replies.
    let fanned_out: usize = a.seen[a_from..]
        .iter()
        .filter(|f| !matches!(frame_type(f), "read.receipt"))
        .map(|f| f.to_string().len())
        .sum();
    eprintln!(
        "stalled reader: {:.1} MiB of frames were fanned out to S while it did not read",
        fanned_out as f64 / (1024.0 * 1024.0)
    );
    eprintln!(
        "stalled reader: gateway VmRSS {rss_before} KiB -> {rss_after} KiB (grew {} KiB); VmHWM {hwm_before} -> {hwm_after} KiB",
        rss_after as i64 - rss_before as i64
    );
    assert!(
        rss_after < rss_before + 40 * 1024,
        "gateway RSS grew from {rss_before} KiB to {rss_after} KiB with one stalled reader"
    );

    // Now read S: it was disconnected (frames, then close 1013 or EOF), or it drains everything.
    let (s_live, end) = drain_raw(&mut s, Duration::from_secs(3), Duration::from_secs(60)).await;
    let s_live_stops: BTreeSet<String> = s_live
        .iter()
        .filter(|f| frame_type(f) == "message.stop")
        .map(|f| pstr(f, "message_id").to_owned())
        .collect();
    assert_no_cursor(&s_live, "stalled device S");
    match &end {
        RawEnd::Close(code) => {
            eprintln!(
                "stalled reader: S read {} frames live, then close {code:?}",
                s_live.len()
            );
            assert_eq!(*code, Some(1013), "a slow device is closed with 1013");
        }
        RawEnd::Eof(why) => {
            eprintln!(
                "stalled reader: S read {} frames live, then EOF ({why})",
                s_live.len()
            );
        }
        RawEnd::Quiet => {
            eprintln!(
                "stalled reader: S was not disconnected; read {} frames live",
                s_live.len()
            );
            let missing: Vec<&String> = a_stops
                .iter()
                .filter(|m| !s_live_stops.contains(*m))
                .collect();
            assert!(
                missing.is_empty(),
                "S stayed connected but never got message.stop for {missing:?}"
            );
        }
    }
    drop(s);
    // Whatever S got while connected is an unbroken prefix of the stream: never-dropped frames
    // are not skipped on a connection that stays open.
    let s_live_stop_order: Vec<String> = s_live
        .iter()
        .filter(|f| frame_type(f) == "message.stop")
        .map(|f| pstr(f, "message_id").to_owned())
        .collect();
    assert_eq!(
        s_live_stop_order.as_slice(),
        &a_stops[..s_live_stop_order.len().min(a_stops.len())],
        "S's live message.stop frames are not a prefix of the turns' order"
    );
    let slow_logged = gw.stderr_tail().contains("not reading fast enough");
    eprintln!("stalled reader: gateway logged the slow-reader disconnect: {slow_logged}");

    let (mut s2, _) = hello_paired(&gw, &ps).await;
    let synced = sync(&mut s2, s_cursor).await;
    let cursors = synced.cursors();
    common::cursors::assert_contiguous(
        &cursors,
        s_cursor + 1,
        synced.done_cursor(),
        "S catch-up replay",
    );
    let mut union = s_live_stops.clone();
    union.extend(
        synced
            .replay
            .iter()
            .filter(|f| frame_type(f) == "message.stop")
            .map(|f| pstr(f, "message_id").to_owned()),
    );
    let missing: Vec<&String> = a_stops.iter().filter(|m| !union.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "S lacks message.stop for {} of {TURNS} turns after live + sync: {missing:?}\n{}",
        missing.len(),
        gw.output_tail()
    );
    eprintln!(
        "stalled reader: replay after reconnect {} frames; {} stops live + replay cover all {TURNS}",
        synced.replay.len(),
        union.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Outbox retention
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn outbox_retention() {
    const MESSAGES: usize = 40;
    const RETAIN: u64 = 100;
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--outbox-retain-frames", "100"]);
    let pa = pair(dir.path(), "phone A");
    let (mut a, ack) = hello_paired(&gw, &pa).await;
    assert_eq!(sync_cursor(&ack), 0);
    for i in 0..MESSAGES {
        say(&mut a, &format!("retention {i:02}")).await;
    }
    let s = sync(&mut a, 0).await;
    let head = s.done_cursor();
    assert_eq!(head, 3 * MESSAGES as u64, "three outboxed frames per turn");
    common::cursors::assert_contiguous(
        &s.cursors(),
        head - RETAIN + 1,
        head,
        "replay after pruning to 100 frames",
    );
    assert_eq!(s.replay.last().map(frame_type), Some("message.stop"));

    let hist = history_all(&mut a).await;
    assert_eq!(
        hist.len(),
        2 * MESSAGES,
        "history keeps every message regardless of outbox pruning"
    );
    for (i, pair) in hist.chunks(2).enumerate() {
        assert_eq!(pair[0]["role"], json!("user"));
        assert_eq!(pair[0]["text"], json!(format!("retention {i:02}")));
        assert_eq!(pair[1]["role"], json!("assistant"));
    }
}

// ---------------------------------------------------------------------------------------------
// 8. Cursors across restarts
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn cursors_increase_across_restarts() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let (mut a, _) = hello_paired(&gw, &pa).await;
    say(&mut a, "before the restart").await;
    let head = sync(&mut a, 0).await.done_cursor();
    assert_eq!(head, 3);
    let status = gw.sigterm();
    assert!(status.success(), "{status}");
    drop(a);

    let gw = Gateway::start(dir.path(), &[]);
    let (mut a, ack) = hello_paired(&gw, &pa).await;
    assert_eq!(sync_cursor(&ack), head, "a clean restart keeps the head");
    let said = say(&mut a, "after the restart").await;
    let s = sync(&mut a, head).await;
    common::cursors::assert_contiguous(
        &s.cursors(),
        head + 1,
        head + 3,
        "first frames after a restart",
    );
    assert_eq!(frame_type(&s.replay[0]), "message");
    assert_eq!(pstr(&s.replay[0], "message_id"), said.user_id);
    assert_eq!(s.done_cursor(), head + 3);
}

/// Killed after a user message's sled commit (outbox echo, journal entry, pending turn) was
/// fsynced but before the history database had it (`IRIS_GATEWAY_KILL_AT=before-apply`): the
/// next start applies the journal, so history, search and the replay all have the message,
/// and its turn is answered with the restart notice.
#[tokio::test]
async fn kill9_between_the_outbox_commit_and_the_history_apply() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let mut gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    say(&mut c, "an aubergine before the kill").await;
    c.close().await;
    gw.stop_ok();

    let head_before = kill_while_storing_a_message(
        dir.path(),
        &phone,
        "before-apply",
        "a turnip at the kill point",
    )
    .await;

    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, ack) = hello_paired(&gw, &phone).await;
    assert!(sync_cursor(&ack) > head_before, "{ack}");
    let all = history_all(&mut c).await;
    let texts: Vec<&str> = all.iter().map(|m| m["text"].as_str().unwrap()).collect();
    let at = texts
        .iter()
        .position(|t| *t == "a turnip at the kill point")
        .unwrap_or_else(|| panic!("the journaled message is not in history: {texts:?}"));
    assert!(texts
        .iter()
        .any(|t| t.contains("aubergine before the kill")));
    assert_eq!(all[at]["role"], "user");
    let notice = all.get(at + 1).expect("an answer after the message");
    assert_eq!(notice["role"], "assistant", "{notice}");
    assert!(
        notice["text"].as_str().unwrap().contains("restart"),
        "{notice}"
    );
    let id = c
        .request("search", None, None, json!({ "query": "turnip" }))
        .await;
    let r = c.recv_reply(id).await;
    let hits = r["payload"]["hits"].as_array().unwrap();
    assert!(
        hits.iter()
            .any(|h| h["message_id"] == all[at]["message_id"]),
        "{r}"
    );
    let replay = sync(&mut c, head_before).await;
    assert!(
        replay
            .replay
            .iter()
            .any(|f| frame_type(f) == "message"
                && f["payload"]["text"] == "a turnip at the kill point"),
        "the echo is in the outbox: {}",
        short(&replay.replay)
    );
}

/// Starts a gateway that kills itself at `point` (`IRIS_GATEWAY_KILL_AT`) while it stores the
/// next `message.send`, of `text`; checks the sender got no receipt and returns the cursor head
/// before it.
async fn kill_while_storing_a_message(
    dir: &std::path::Path,
    phone: &common::Paired,
    point: &str,
    text: &str,
) -> u64 {
    let mut gw = Gateway::start_with_env(dir, &[], &[("IRIS_GATEWAY_KILL_AT", point)]);
    let (mut c, ack) = hello_paired(&gw, phone).await;
    let head_before = sync_cursor(&ack);
    c.send(json!({ "v": 1, "type": "message.send", "id": 901, "payload": { "text": text } }))
        .await;
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .expect("the gateway kills itself at the hook");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}\n{}", gw.output_tail());
    assert!(
        c.seen.iter().all(|f| id_of(f) != Some(901)),
        "no receipt before the kill: {}",
        c.recent()
    );
    head_before
}

/// The message the commit-record tests are killed in the middle of storing.
const PARSNIP: &str = "a parsnip inside the commit";

/// Killed in a commit after its outbox frame, `frame_of` entry and journal entry reached the
/// disk but before its commit record did (`before-commit-record`): the next start drops them.
/// Nobody was told of the message (no receipt), so it is in neither history, search nor the
/// replay, no turn is answered for it, and the next message takes the cursor it would have had.
#[tokio::test]
async fn kill9_before_a_commit_record_drops_the_commit() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let mut gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    say(&mut c, "a leek before the kill").await;
    c.close().await;
    gw.stop_ok();

    let head_before =
        kill_while_storing_a_message(dir.path(), &phone, "before-commit-record", PARSNIP).await;

    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, ack) = hello_paired(&gw, &phone).await;
    assert_eq!(
        sync_cursor(&ack),
        head_before,
        "{ack}\n{}",
        gw.output_tail()
    );
    assert!(
        gw.output_tail()
            .contains("a commit cut short by a crash was dropped"),
        "{}",
        gw.output_tail()
    );
    let all = history_all(&mut c).await;
    let texts: Vec<&str> = all.iter().map(|m| m["text"].as_str().unwrap()).collect();
    assert!(
        texts.iter().any(|t| t.contains("a leek before the kill")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .all(|t| !t.contains("parsnip") && !t.contains("restart")),
        "the uncommitted message left a trace: {texts:?}"
    );
    let id = c
        .request("search", None, None, json!({ "query": "parsnip" }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(r["payload"]["hits"], json!([]), "{r}");
    let replay = sync(&mut c, 0).await;
    assert!(
        replay
            .replay
            .iter()
            .all(|f| !f.to_string().contains("parsnip")),
        "{}",
        short(&replay.replay)
    );
    // The cursors it had written past the head are free again, and the next commit takes them.
    let said = say(&mut c, "a swede after the restart").await;
    let replay = sync(&mut c, head_before).await;
    let echo = replay
        .replay
        .iter()
        .find(|f| frame_type(f) == "message" && pstr(f, "message_id") == said.user_id)
        .unwrap_or_else(|| panic!("no echo in the replay: {}", short(&replay.replay)));
    assert_eq!(echo["cursor"], json!(head_before + 1), "{echo}");
}

/// Killed in a commit right after its commit record reached the disk, before the changes to
/// existing keys (the pending turn, the message's frame list) were written
/// (`after-commit-record`): the next start applies them from the record, so the message is
/// kept and its turn is closed with the restart notice as after any crash mid-turn.
#[tokio::test]
async fn kill9_after_a_commit_record_finishes_the_commit() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let head_before =
        kill_while_storing_a_message(dir.path(), &phone, "after-commit-record", PARSNIP).await;

    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, ack) = hello_paired(&gw, &phone).await;
    assert!(sync_cursor(&ack) > head_before, "{ack}");
    let all = history_all(&mut c).await;
    let at = all
        .iter()
        .position(|m| m["text"] == PARSNIP)
        .unwrap_or_else(|| panic!("the committed message is not in history: {all:?}"));
    let notice = all.get(at + 1).expect("an answer after the message");
    assert_eq!(notice["role"], "assistant", "{notice}");
    assert!(
        notice["text"].as_str().unwrap().contains("restart"),
        "the pending turn (a redo of the record) was not closed: {notice}"
    );
    // Its frame list was rebuilt from the record: deleting the message tombstones the echo.
    let id = all[at]["message_id"].as_str().unwrap().to_owned();
    let req = c
        .request("message.delete", None, None, json!({ "message_ids": [id] }))
        .await;
    let r = c.recv_reply(req).await;
    assert_eq!(frame_type(&r), "message.deleted", "{r}");
    let replay = sync(&mut c, head_before).await;
    assert!(
        replay
            .replay
            .iter()
            .all(|f| !f.to_string().contains("parsnip")),
        "the deleted message's echo is still replayed: {}",
        short(&replay.replay)
    );
}
