//! Crash campaign: a sustained, mixed load against the real binary, killed with SIGKILL at
//! random moments many times over, with the store's invariants checked after every restart.
//!
//! The load: two devices send messages into three lanes (the default channel, a channel and a
//! thread) while the demo agent streams its turns (`--demo-pace-ms` small but non-zero, so turns
//! are in flight when the kill lands); one of them deletes one of its messages now and then; a
//! third device keeps disconnecting, reconnecting and syncing from its last cursor. After each
//! kill the gateway is restarted on the same port and must open its store cleanly, and then:
//!
//! - every user message that got a `read.receipt` is in `history` with its text (unless its
//!   deletion was acknowledged, or was still in flight at the kill);
//! - every frame a device saw live (`message`, `message.stop`) is in history;
//! - a full `sync` from 0 has strictly increasing cursors with no gaps, ending at the head that
//!   `hello.ack` reports, which never goes below a cursor any device was shown;
//! - no message id appears twice (in history across lanes, or as the same frame in the outbox);
//! - history, the outbox replay and `search` agree: each history message has its outbox frame
//!   with the same text, each outbox message is in history, every message's unique word finds it,
//!   and deleted messages appear in none of the three (only as `message.deleted` tombstones);
//! - every user message is answered exactly once, after it, or marked interrupted ("The gateway
//!   restarted before the agent answered…").
//!
//! CI-sized by default (`IRIS_CAMPAIGN_CYCLES`, default 40; the seed is random and printed, and
//! `IRIS_CAMPAIGN_SEED=N` replays one). A long run: `IRIS_CAMPAIGN_CYCLES=200 cargo test --test
//! crash_campaign -- --nocapture`.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::{
    create_channel, create_thread, cursor_of, frame_type, id_of, pair, pstr, sync_cursor,
    temp_data_dir, Client, Gateway, Paired,
};
use serde_json::{json, Value};

const DEFAULT_CYCLES: u64 = 40;
/// The demo agent's pause between streamed steps: a turn takes ~50-100 ms, so most kills land
/// with turns in flight.
const PACE_MS: &str = "3";
const RESTARTED_NOTICE: &str = "The gateway restarted before the agent answered";
/// Searches per verification: the messages of the last cycles plus a sample of older ones.
const SEARCHES_PER_CHECK: usize = 40;

#[derive(Clone, Debug)]
struct LaneRef {
    name: &'static str,
    chat: Option<String>,
    thread: Option<String>,
}

#[derive(Clone, Debug)]
struct Sent {
    text: String,
    word: String,
    lane: usize,
    cycle: u64,
}

/// What the load was promised before each kill, and what the campaign counted.
#[derive(Default, Clone)]
struct Ledger {
    /// user message id → what was sent, for every `read.receipt`.
    receipted: BTreeMap<String, Sent>,
    /// Deletions the gateway acknowledged with `message.deleted`.
    deleted: BTreeSet<String>,
    /// Deletions sent but not acknowledged before a kill: either outcome is allowed, but
    /// history, outbox and search must agree on it.
    delete_in_flight: BTreeSet<String>,
    /// Message ids of `message` / `message.stop` frames some device received live.
    seen_live: BTreeSet<String>,
    /// Highest cursor any device was shown (replay or `sync.done`).
    max_cursor_seen: u64,
    /// The reconnecting device's last synced cursor.
    resync_cursor: u64,
    sends: u64,
    refused: u64,
    resyncs: u64,
    replayed_frames: u64,
}

/// Frames of a device's connection not yet looked at: record what it saw live.
fn note_live(ledger: &RefCell<Ledger>, c: &Client, scanned: &mut usize) {
    let mut l = ledger.borrow_mut();
    for f in &c.seen[*scanned..] {
        if cursor_of(f).is_none() && matches!(frame_type(f), "message" | "message.stop") {
            l.seen_live.insert(pstr(f, "message_id").to_owned());
        }
    }
    *scanned = c.seen.len();
}

/// Sends a request and returns its reply, retrying while the per-connection rate limit refuses.
async fn ask(
    c: &mut Client,
    frame_type_: &str,
    chat: Option<&str>,
    thread: Option<&str>,
    payload: Value,
) -> Value {
    for _ in 0..200 {
        let id = c.request(frame_type_, chat, thread, payload.clone()).await;
        let reply = c.recv_reply(id).await;
        // Only the per-connection frame rate is retried; a full lane queue is an answer.
        if frame_type(&reply) == "error" && pstr(&reply, "message").contains("frames per second") {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        return reply;
    }
    panic!("{frame_type_} was rate limited 200 times in a row");
}

/// What every device of one cycle's load shares.
#[derive(Clone, Copy)]
struct Load<'a> {
    url: &'a str,
    lanes: &'a [LaneRef],
    ledger: &'a RefCell<Ledger>,
    cycle: u64,
}

/// A device sending messages into random lanes (and, for `deletes`, deleting some of them).
async fn sender(load: &Load<'_>, who: &Paired, device: &'static str, mut rng: Rng, deletes: bool) {
    let Load {
        url,
        lanes,
        ledger,
        cycle,
    } = *load;
    let (mut c, _) = Client::hello(url, &who.token, &who.device_id).await;
    let mut scanned = 0;
    let mut mine: Vec<String> = Vec::new();
    for n in 0.. {
        let lane = rng.below(lanes.len() as u64) as usize;
        let word = format!("q{cycle}{device}n{n}z{}", rng.below(1_000_000));
        let text = format!("{device} writes {word} in the {} lane", lanes[lane].name);
        let l = &lanes[lane];
        ledger.borrow_mut().sends += 1;
        let reply = ask(
            &mut c,
            "message.send",
            l.chat.as_deref(),
            l.thread.as_deref(),
            json!({ "text": text }),
        )
        .await;
        match frame_type(&reply) {
            "read.receipt" => {
                let id = pstr(&reply, "message_id").to_owned();
                mine.push(id.clone());
                ledger.borrow_mut().receipted.insert(
                    id,
                    Sent {
                        text,
                        word,
                        lane,
                        cycle,
                    },
                );
            }
            // A lane with 8 messages already waiting refuses more (limits.lane_queue_depth).
            "error" if pstr(&reply, "code") == "rate_limited" => {
                ledger.borrow_mut().refused += 1;
            }
            _ => panic!("{device}: message.send got {reply}\n{}", c.recent()),
        }
        note_live(ledger, &c, &mut scanned);
        tokio::time::sleep(Duration::from_millis(rng.range(10, 150))).await;
        if deletes && !mine.is_empty() && rng.below(8) == 0 {
            let victim = mine.remove(rng.below(mine.len() as u64) as usize);
            ledger.borrow_mut().delete_in_flight.insert(victim.clone());
            let reply = ask(
                &mut c,
                "message.delete",
                None,
                None,
                json!({ "message_ids": [victim] }),
            )
            .await;
            assert_eq!(frame_type(&reply), "message.deleted", "{reply}");
            let mut l = ledger.borrow_mut();
            l.delete_in_flight.remove(&victim);
            l.deleted.insert(victim);
            drop(l);
            note_live(ledger, &c, &mut scanned);
        }
    }
}

/// A device that keeps disconnecting, reconnecting and catching up with `sync`.
async fn resyncer(
    url: &str,
    who: &Paired,
    lanes: &[LaneRef],
    ledger: &RefCell<Ledger>,
    mut rng: Rng,
) {
    loop {
        let (mut c, ack) = Client::hello(url, &who.token, &who.device_id).await;
        let head = sync_cursor(&ack);
        let from = ledger.borrow().resync_cursor;
        assert!(
            head >= from,
            "hello.ack head {head} is below the cursor {from} this device already synced to"
        );
        let id = c
            .request("sync", None, None, json!({ "cursor": from }))
            .await;
        let mut cursors = Vec::new();
        let done = loop {
            let f = c.recv().await;
            if id_of(&f) == Some(id) {
                assert_eq!(frame_type(&f), "sync.done", "{f}");
                break f;
            }
            if let Some(cur) = cursor_of(&f) {
                cursors.push(cur);
            }
        };
        let done_cursor = done["payload"]["cursor"]
            .as_u64()
            .expect("sync.done cursor");
        common::cursors::assert_contiguous(
            &cursors,
            from + 1,
            done_cursor,
            &format!("sync from {from}: the replay must be every cursor up to sync.done, in order"),
        );
        {
            let mut l = ledger.borrow_mut();
            l.resync_cursor = done_cursor;
            l.max_cursor_seen = l.max_cursor_seen.max(done_cursor);
            l.resyncs += 1;
            l.replayed_frames += cursors.len() as u64;
        }
        let lane = &lanes[rng.below(lanes.len() as u64) as usize];
        let page = ask(
            &mut c,
            "history",
            lane.chat.as_deref(),
            lane.thread.as_deref(),
            json!({ "limit": 20 }),
        )
        .await;
        assert_eq!(frame_type(&page), "history", "{page}");
        let mut scanned = 0;
        tokio::time::sleep(Duration::from_millis(rng.range(30, 250))).await;
        note_live(ledger, &c, &mut scanned);
        if rng.below(2) == 0 {
            c.close().await;
        } else {
            drop(c);
        }
    }
}

/// A lane's whole history, oldest first.
async fn history_all(c: &mut Client, lane: &LaneRef) -> Vec<Value> {
    let mut all: Vec<Value> = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let mut payload = json!({ "limit": 200 });
        if let Some(b) = &before {
            payload["before_message_id"] = json!(b);
        }
        let reply = ask(
            c,
            "history",
            lane.chat.as_deref(),
            lane.thread.as_deref(),
            payload,
        )
        .await;
        assert_eq!(frame_type(&reply), "history", "{reply}");
        let mut page = reply["payload"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        page.append(&mut all);
        all = page;
        if reply["payload"]["has_more"] != json!(true) {
            return all;
        }
        before = Some(pstr(&reply, "oldest_message_id").to_owned());
    }
}

/// The quoted user text inside a demo reply (`You said: “TEXT”. …`).
fn demo_quote(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("You said: \u{201c}")?;
    rest.split_once("\u{201d}. That is ").map(|(q, _)| q)
}

/// What one verification found, for the summary.
struct Checked {
    head: u64,
    messages: usize,
    interrupted: usize,
}

/// Every invariant of the campaign, against a freshly restarted gateway.
async fn verify(
    gw: &Gateway,
    who: &Paired,
    lanes: &[LaneRef],
    ledger: &Ledger,
    rng: &mut Rng,
    label: &str,
) -> Checked {
    let fail = |what: String| -> ! { panic!("{label}: {what}\n{}", gw.output_tail()) };
    let (mut c, ack) = Client::hello(&gw.url, &who.token, &who.device_id).await;
    let head = sync_cursor(&ack);
    if head < ledger.max_cursor_seen {
        fail(format!(
            "hello.ack head {head} is below cursor {} that a device was already shown",
            ledger.max_cursor_seen
        ));
    }

    // History of every lane.
    let mut history: BTreeMap<String, (usize, Value)> = BTreeMap::new();
    let mut interrupted = 0;
    for (li, lane) in lanes.iter().enumerate() {
        let msgs = history_all(&mut c, lane).await;
        // Per lane: user texts in order, answers, notices.
        let mut unanswered: Vec<(usize, String)> = Vec::new();
        let mut answered: BTreeMap<String, usize> = BTreeMap::new();
        let mut users: Vec<(usize, String, String)> = Vec::new();
        let mut notices: Vec<usize> = Vec::new();
        for (pos, m) in msgs.iter().enumerate() {
            let id = m["message_id"].as_str().unwrap_or("").to_owned();
            if let Some((other, _)) = history.insert(id.clone(), (li, m.clone())) {
                fail(format!(
                    "message {id} is in history twice (lanes {} and {})",
                    lanes[other].name, lane.name
                ));
            }
            if m["role"] == json!("user") {
                users.push((pos, id, m["text"].as_str().unwrap_or("").to_owned()));
            }
        }
        for (pos, m) in msgs.iter().enumerate() {
            let text = m["text"].as_str().unwrap_or("").to_owned();
            match m["role"].as_str() {
                Some("user") => {}
                Some("assistant") => {
                    if let Some(q) = demo_quote(&text) {
                        let q = q.to_owned();
                        let Some((upos, _, _)) = users.iter().find(|(_, _, t)| *t == q) else {
                            // Its user message may have been deleted after it was answered.
                            let deleted = ledger.receipted.iter().any(|(uid, s)| {
                                s.text == q
                                    && (ledger.deleted.contains(uid)
                                        || ledger.delete_in_flight.contains(uid))
                            });
                            if !deleted {
                                fail(format!("an answer in {} quotes {q:?}, which precedes no such user message", lane.name));
                            }
                            continue;
                        };
                        if *upos > pos {
                            fail(format!("the answer to {q:?} precedes it"));
                        }
                        if answered.insert(q.clone(), pos).is_some() {
                            fail(format!("{q:?} was answered twice in {}", lane.name));
                        }
                    } else if text.contains(RESTARTED_NOTICE) {
                        notices.push(pos);
                    } else {
                        fail(format!(
                            "unexpected assistant message in {}: {m}",
                            lane.name
                        ));
                    }
                }
                other => fail(format!("unexpected role {other:?}: {m}")),
            }
        }
        for (pos, _, text) in &users {
            if !answered.contains_key(text) {
                unanswered.push((*pos, text.clone()));
            }
        }
        // Each unanswered message needs its own notice after it; a notice with no unanswered
        // message left is one whose message was deleted after the restart answered it.
        let mut pending: Vec<&(usize, String)> = Vec::new();
        let mut extra = 0;
        let mut ui = 0;
        for npos in &notices {
            while ui < unanswered.len() && unanswered[ui].0 < *npos {
                pending.push(&unanswered[ui]);
                ui += 1;
            }
            if pending.is_empty() {
                extra += 1;
            } else {
                pending.remove(0);
            }
        }
        pending.extend(unanswered[ui..].iter());
        if !pending.is_empty() {
            fail(format!(
                "in {}: user messages neither answered nor marked interrupted: {:?}",
                lane.name,
                pending.iter().map(|(_, t)| t).collect::<Vec<_>>()
            ));
        }
        let deleted_here = ledger
            .receipted
            .iter()
            .filter(|(id, s)| s.lane == li && !history.contains_key(*id))
            .count();
        if extra > deleted_here {
            fail(format!(
                "in {}: {extra} interrupted notices match no unanswered message (only {deleted_here} messages of this lane were deleted)",
                lane.name
            ));
        }
        interrupted += notices.len();
    }

    // Receipted messages survive (unless deleted), with their text and in their lane.
    for (id, sent) in &ledger.receipted {
        match history.get(id) {
            Some((li, m)) => {
                if ledger.deleted.contains(id) {
                    fail(format!(
                        "message {id} was deleted (acknowledged) but is in history"
                    ));
                }
                if m["text"].as_str() != Some(sent.text.as_str()) || *li != sent.lane {
                    fail(format!(
                        "message {id} changed: sent {sent:?}, history has {m} in {}",
                        lanes[*li].name
                    ));
                }
            }
            None if ledger.deleted.contains(id) || ledger.delete_in_flight.contains(id) => {}
            None => fail(format!(
                "user message {id} ({:?}, cycle {}) got a read.receipt but is not in history",
                sent.text, sent.cycle
            )),
        }
    }
    for id in &ledger.seen_live {
        if !history.contains_key(id)
            && !ledger.deleted.contains(id)
            && !ledger.delete_in_flight.contains(id)
        {
            // A reply whose user message was deleted keeps its own place in history, so
            // only the deleted ids themselves may be missing.
            fail(format!(
                "message {id} was delivered live but is not in history"
            ));
        }
    }

    // The outbox: strictly increasing, gap-free, ending at the head; one frame per message.
    let id = c.request("sync", None, None, json!({ "cursor": 0 })).await;
    let mut replay: Vec<Value> = Vec::new();
    let done = loop {
        let f = c.recv().await;
        if id_of(&f) == Some(id) {
            break f;
        }
        if cursor_of(&f).is_some() {
            replay.push(f);
        }
    };
    let done_cursor = done["payload"]["cursor"].as_u64().unwrap_or(u64::MAX);
    if done_cursor != head {
        fail(format!(
            "sync.done cursor {done_cursor} vs hello.ack head {head}"
        ));
    }
    let cursors: Vec<u64> = replay.iter().filter_map(cursor_of).collect();
    if let Some(first) = cursors.first() {
        if let Some(why) = common::cursors::contiguity_breaks(&cursors, *first, head) {
            fail(format!("sync from 0: {why}"));
        }
    } else if head != 0 {
        fail(format!(
            "sync from 0 replayed nothing but the head is {head}"
        ));
    }
    let mut outboxed: BTreeMap<(String, String), Value> = BTreeMap::new();
    let mut tombstoned: BTreeSet<String> = BTreeSet::new();
    for f in &replay {
        match frame_type(f) {
            t @ ("message" | "message.stop") => {
                let key = (t.to_owned(), pstr(f, "message_id").to_owned());
                if outboxed.insert(key.clone(), f.clone()).is_some() {
                    fail(format!("{key:?} is in the outbox twice"));
                }
            }
            "message.deleted" => {
                for m in f["payload"]["message_ids"].as_array().into_iter().flatten() {
                    tombstoned.insert(m.as_str().unwrap_or("").to_owned());
                }
            }
            _ => {}
        }
    }
    for (key, f) in &outboxed {
        let Some((_, m)) = history.get(&key.1) else {
            fail(format!("the outbox has {key:?} but history does not: {f}"));
        };
        let text = if key.0 == "message" {
            pstr(f, "text")
        } else {
            pstr(f, "final_text")
        };
        if Some(text) != m["text"].as_str() {
            fail(format!(
                "outbox {key:?} text differs from history: {f} vs {m}"
            ));
        }
    }
    for (id, (_, m)) in &history {
        let kind = if m["role"] == json!("user")
            || m["text"]
                .as_str()
                .is_some_and(|t| t.contains(RESTARTED_NOTICE))
        {
            "message"
        } else {
            "message.stop"
        };
        if !outboxed.contains_key(&(kind.to_owned(), id.clone())) {
            fail(format!(
                "history message {id} has no `{kind}` frame in the outbox: {m}"
            ));
        }
        if tombstoned.contains(id) {
            fail(format!(
                "message {id} is in history but the outbox says it was deleted"
            ));
        }
    }
    for id in &ledger.deleted {
        if !tombstoned.contains(id) {
            fail(format!(
                "deleted message {id} has no message.deleted tombstone in the outbox"
            ));
        }
    }

    // Search: recent messages and a sample of older ones, plus every deleted one.
    let last_cycle = ledger
        .receipted
        .values()
        .map(|s| s.cycle)
        .max()
        .unwrap_or(0);
    let mut words: Vec<(&String, &Sent)> = ledger
        .receipted
        .iter()
        .filter(|(_, s)| s.cycle + 1 >= last_cycle)
        .collect();
    words.truncate(SEARCHES_PER_CHECK / 2);
    let older: Vec<(&String, &Sent)> = ledger
        .receipted
        .iter()
        .filter(|(_, s)| s.cycle + 1 < last_cycle)
        .collect();
    for _ in 0..(SEARCHES_PER_CHECK / 4).min(older.len()) {
        words.push(older[rng.below(older.len() as u64) as usize]);
    }
    words.extend(
        ledger
            .receipted
            .iter()
            .filter(|(id, _)| ledger.deleted.contains(*id) || ledger.delete_in_flight.contains(*id))
            .rev()
            .take(SEARCHES_PER_CHECK / 4),
    );
    for (id, sent) in words {
        let r = ask(
            &mut c,
            "search",
            None,
            None,
            json!({ "query": sent.word, "limit": 20 }),
        )
        .await;
        assert_eq!(frame_type(&r), "search.results", "{r}");
        let hits: Vec<String> = r["payload"]["hits"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| h["message_id"].as_str().unwrap_or("").to_owned())
            .collect();
        for h in &hits {
            let Some((_, m)) = history.get(h) else {
                fail(format!(
                    "search for {:?} found {h}, which is not in history",
                    sent.word
                ));
            };
            if !m["text"].as_str().unwrap_or("").contains(&sent.word) {
                fail(format!(
                    "search for {:?} found {h}, which does not contain it: {m}",
                    sent.word
                ));
            }
        }
        let in_history = history.contains_key(id);
        if in_history != hits.contains(id) {
            fail(format!(
                "message {id} ({:?}): in history {in_history}, found by search {}",
                sent.word,
                hits.contains(id)
            ));
        }
    }
    c.close().await;
    Checked {
        head,
        messages: history.len(),
        interrupted,
    }
}

#[tokio::test]
async fn crash_campaign() {
    let cycles: u64 = std::env::var("IRIS_CAMPAIGN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CYCLES);
    let seed: u64 = std::env::var("IRIS_CAMPAIGN_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!(
        "crash campaign: {cycles} cycles, seed {seed} (replay with IRIS_CAMPAIGN_SEED={seed})"
    );
    let mut rng = Rng(seed);
    let started = Instant::now();
    let dir = temp_data_dir();
    let listen = format!("--listen=127.0.0.1:{}", common::peers::free_port());
    let args = [listen.as_str(), "--demo-pace-ms", PACE_MS];
    let mut gw = Gateway::start(dir.path(), &args);
    let pa = pair(dir.path(), "sender A");
    let pb = pair(dir.path(), "sender B");
    let pc = pair(dir.path(), "reconnecting C");
    let pv = pair(dir.path(), "verifier");

    let (mut a, _) = Client::hello(&gw.url, &pa.token, &pa.device_id).await;
    let garden = create_channel(&mut a, "Garden").await;
    let plans = create_thread(&mut a, &garden, "Plans").await;
    a.close().await;
    let lanes = vec![
        LaneRef {
            name: "default",
            chat: None,
            thread: None,
        },
        LaneRef {
            name: "Garden",
            chat: Some(garden.clone()),
            thread: None,
        },
        LaneRef {
            name: "Plans thread",
            chat: Some(garden),
            thread: Some(plans),
        },
    ];

    let ledger = RefCell::new(Ledger::default());
    let mut kills_mid_turn = 0;
    let mut kills_with_request_in_flight = 0;
    let mut last_interrupted = 0;
    let mut last = None;
    for cycle in 1..=cycles {
        let load_for = match rng.below(6) {
            0 => Duration::from_millis(rng.range(0, 60)),
            _ => Duration::from_millis(rng.range(150, 1500)),
        };
        let sends_before = ledger.borrow().sends;
        let receipts_before = ledger.borrow().receipted.len() as u64 + ledger.borrow().refused;
        {
            let (ra, rb, rc) = (rng.fork(), rng.fork(), rng.fork());
            let ctx = Load {
                url: &gw.url,
                lanes: &lanes,
                ledger: &ledger,
                cycle,
            };
            let load = async {
                tokio::join!(
                    sender(&ctx, &pa, "a", ra, false),
                    sender(&ctx, &pb, "b", rb, true),
                    resyncer(&gw.url, &pc, &lanes, &ledger, rc),
                )
            };
            tokio::select! {
                _ = load => unreachable!("the load runs until the kill"),
                _ = tokio::time::sleep(load_for) => {}
            }
        }
        gw.kill9();
        // What the load was promised, as of the kill (the load is gone: nothing changes it).
        let promised = ledger.borrow().clone();
        let replied = promised.receipted.len() as u64 + promised.refused;
        if promised.sends - sends_before > replied - receipts_before {
            kills_with_request_in_flight += 1;
        }

        gw = Gateway::start(dir.path(), &args);
        let checked = verify(
            &gw,
            &pv,
            &lanes,
            &promised,
            &mut rng,
            &format!("after kill {cycle}"),
        )
        .await;
        if checked.interrupted > last_interrupted {
            kills_mid_turn += 1;
        }
        last_interrupted = checked.interrupted;
        {
            let mut l = ledger.borrow_mut();
            l.max_cursor_seen = l.max_cursor_seen.max(checked.head);
        }
        if cycle % 10 == 0 || cycle == cycles {
            eprintln!(
                "  cycle {cycle}: head {}, {} messages in history, {} interrupted notices, {:.1} s",
                checked.head,
                checked.messages,
                checked.interrupted,
                started.elapsed().as_secs_f64()
            );
        }
        last = Some(checked);
    }
    gw.stop_ok();
    let l = ledger.borrow();
    let last = last.expect("at least one cycle");
    eprintln!(
        "crash campaign summary: seed {seed}; {cycles} kill -9 cycles in {:.1} s; {} messages sent, \
         {} receipted, {} refused by the lane limit, {} deleted ({} deletions in flight at a kill); \
         {} kills mid-turn ({} interrupted notices in all), {} kills with a request in flight; \
         reconnecting device: {} syncs replaying {} frames; final head {}, {} messages in history",
        started.elapsed().as_secs_f64(),
        l.sends,
        l.receipted.len(),
        l.refused,
        l.deleted.len(),
        l.delete_in_flight.len(),
        kills_mid_turn,
        last.interrupted,
        kills_with_request_in_flight,
        l.resyncs,
        l.replayed_frames,
        last.head,
        last.messages,
    );
}
