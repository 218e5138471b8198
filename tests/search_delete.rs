//! `search` and `message.delete` against the real binary: word-prefix matching (case and
//! Unicode folding), scopes, limits and errors; deletion end to end (requester and other
//! devices, history, search, and the outbox whose frames are replaced in place so a replay
//! never returns deleted text), idempotence, survival across SIGTERM and kill -9, and channel
//! deletion purging the index.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{
    connect_online, create_channel, create_thread, cursor_of, dump, frame_type, id_of, pair, pstr,
    sync_cursor, temp_data_dir, Client, Gateway, Paired,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// Authenticates and consumes the greeting up to and including `status`. Later greeting frames
/// (todo snapshots) are skipped by the reply-matching helpers.
/// One finished turn: the user's message id and the assistant's reply id.
#[derive(Debug, Clone)]
struct Turn {
    user: String,
    assistant: String,
}

/// Sends `text` into a lane and waits for its receipt, echo and `message.stop`. Retries (bounded)
/// when the per-connection frame rate limit refuses the frame.
async fn say(c: &mut Client, chat: Option<&str>, thread: Option<&str>, text: &str) -> Turn {
    for _ in 0..100 {
        let id = c.send_text(chat, thread, &text).await;
        let reply = c.recv_reply(id).await;
        match frame_type(&reply) {
            "read.receipt" => {
                let user = pstr(&reply, "message_id").to_owned();
                assert!(!user.is_empty(), "read.receipt without message_id: {reply}");
                c.recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == user)
                    .await;
                let start = c.recv_type("message.start").await;
                let assistant = pstr(&start, "message_id").to_owned();
                assert!(!assistant.is_empty(), "message.start without id: {start}");
                c.recv_until(|f| {
                    frame_type(f) == "message.stop" && pstr(f, "message_id") == assistant
                })
                .await;
                return Turn { user, assistant };
            }
            "error" if pstr(&reply, "code") == "rate_limited" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("message.send `{text}` got {reply}\n{}", c.recent()),
        }
    }
    panic!("message.send `{text}` was rate limited 100 times in a row");
}

/// A `search` request; returns the reply (search.results or error).
async fn search_raw(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    payload: Value,
) -> (i64, Value) {
    let id = c.request("search", chat, thread, payload).await;
    let reply = c.recv_reply(id).await;
    (id, reply)
}

/// A search that must succeed; returns the whole `search.results` frame.
async fn search_frame(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    payload: Value,
) -> Value {
    let shown = payload.to_string();
    let (_, reply) = search_raw(c, chat, thread, payload).await;
    assert_eq!(
        frame_type(&reply),
        "search.results",
        "search {shown} (envelope chat {chat:?} thread {thread:?}) got {reply}"
    );
    reply
}

/// The hits of a successful `search{query}` over everything with the default limit.
async fn search_all(c: &mut Client, query: &str) -> Vec<Value> {
    hits(&search_frame(c, None, None, json!({ "query": query, "limit": 100 })).await)
}

fn hits(results: &Value) -> Vec<Value> {
    results
        .pointer("/payload/hits")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("search.results without hits: {results}"))
        .clone()
}

fn hit_ids(hits: &[Value]) -> Vec<String> {
    hits.iter()
        .map(|h| h["message_id"].as_str().expect("hit message_id").to_owned())
        .collect()
}

/// Newest first by timestamp.
#[track_caller]
fn assert_ts_non_increasing(hits: &[Value], what: &str) {
    let ts: Vec<i64> = hits
        .iter()
        .map(|h| h["ts"].as_i64().expect("hit ts"))
        .collect();
    for w in ts.windows(2) {
        assert!(w[0] >= w[1], "{what}: hits not newest first by ts: {ts:?}");
    }
}

/// Asserts an error reply to request `id` with `code`.
#[track_caller]
fn assert_error(reply: &Value, id: i64, code: &str, what: &str) {
    assert_eq!(
        frame_type(reply),
        "error",
        "{what}: expected error, got {reply}"
    );
    assert_eq!(
        id_of(reply),
        Some(id),
        "{what}: error must echo the id: {reply}"
    );
    assert_eq!(pstr(reply, "code"), code, "{what}: {reply}");
}

/// `message.delete`; returns (request id, reply).
async fn delete_raw(c: &mut Client, ids: Value) -> (i64, Value) {
    let id = c
        .request("message.delete", None, None, json!({ "message_ids": ids }))
        .await;
    let reply = c.recv_reply(id).await;
    (id, reply)
}

/// A deletion that must be answered with `message.deleted{ids}` carrying the request id.
async fn delete_ok(c: &mut Client, ids: &[&str]) -> Value {
    let (id, reply) = delete_raw(c, json!(ids)).await;
    assert_eq!(
        frame_type(&reply),
        "message.deleted",
        "message.delete {ids:?} got {reply}"
    );
    assert_eq!(id_of(&reply), Some(id), "{reply}");
    assert_eq!(reply["payload"]["message_ids"], json!(ids), "{reply}");
    reply
}

/// All history of one lane (chronological), one page of up to 200.
async fn history(c: &mut Client, chat: Option<&str>, thread: Option<&str>) -> Vec<Value> {
    let id = c
        .request("history", chat, thread, json!({ "limit": 200 }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "history", "history got {r}");
    assert_eq!(r["payload"]["has_more"], json!(false), "{r}");
    r["payload"]["messages"]
        .as_array()
        .expect("history messages")
        .clone()
}

/// What a `sync` replayed: frames carrying `cursor`, and the `sync.done` cursor.
struct Synced {
    replay: Vec<Value>,
    done: u64,
}

impl Synced {
    fn cursors(&self) -> Vec<u64> {
        self.replay.iter().filter_map(cursor_of).collect()
    }

    fn at(&self, cursor: u64) -> Option<&Value> {
        self.replay.iter().find(|f| cursor_of(f) == Some(cursor))
    }
}

async fn sync(c: &mut Client, from: u64) -> Synced {
    let id = c
        .request("sync", None, None, json!({ "cursor": from }))
        .await;
    let mut replay = Vec::new();
    loop {
        let f = c.recv().await;
        if id_of(&f) == Some(id) {
            assert_eq!(frame_type(&f), "sync.done", "sync{{cursor:{from}}} got {f}");
            let done = f
                .pointer("/payload/cursor")
                .and_then(Value::as_u64)
                .unwrap_or_else(|| panic!("sync.done without cursor: {f}"));
            return Synced { replay, done };
        }
        if cursor_of(&f).is_some() {
            replay.push(f);
        }
    }
}

/// The message ids of a page of messages, in order (`""` for one without).
fn message_ids(messages: &[Value]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or(""))
        .collect()
}

/// Every replayed cursor from `first` to the sync.done cursor, with no gaps.
#[track_caller]
fn assert_contiguous(s: &Synced, first: u64, what: &str) {
    common::cursors::assert_contiguous(
        &s.cursors(),
        first,
        s.done,
        &format!("{what}\nreplay:\n{}", dump(&s.replay)),
    );
}

#[track_caller]
fn assert_no_frame_mentions(frames: &[Value], word: &str, what: &str) {
    let offending: Vec<Value> = frames
        .iter()
        .filter(|f| f.to_string().to_lowercase().contains(word))
        .cloned()
        .collect();
    assert!(
        offending.is_empty(),
        "{what}: frames still containing {word:?}:\n{}",
        dump(&offending)
    );
}

fn deleted_ids(f: &Value) -> Vec<String> {
    f["payload"]["message_ids"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// 1. Matching: case, Unicode folding, word prefixes, every word
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn search_matches_word_prefixes_case_and_unicode_insensitively() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let t1 = say(&mut c, None, None, "I planted Zucchini today").await;
    let t2 = say(&mut c, None, None, "the zucchini's leaves are huge").await;
    let t3 = say(&mut c, None, None, "Grüner Tee bitte").await;
    let t4 = say(&mut c, None, None, "tomatoes only").await;

    // Send order reversed: reply 2, user 2, reply 1, user 1.
    let zucchini = vec![
        t2.assistant.clone(),
        t2.user.clone(),
        t1.assistant.clone(),
        t1.user.clone(),
    ];
    let results = search_frame(&mut c, None, None, json!({ "query": "  zucchini  " })).await;
    assert_eq!(
        pstr(&results, "query"),
        "zucchini",
        "query is trimmed: {results}"
    );
    assert_eq!(pstr(&results, "scope"), "all", "default scope: {results}");
    let h = hits(&results);
    assert_eq!(hit_ids(&h), zucchini, "search zucchini: {results}");
    assert_ts_non_increasing(&h, "zucchini");
    for hit in &h {
        assert_eq!(hit["chat_id"], "default", "{hit}");
        assert_eq!(hit.get("thread_id"), Some(&Value::Null), "flat lane: {hit}");
        let want_role =
            if hit["message_id"] == t1.user.as_str() || hit["message_id"] == t2.user.as_str() {
                "user"
            } else {
                "assistant"
            };
        assert_eq!(hit["role"], want_role, "{hit}");
        let snippet = hit["snippet"].as_str().expect("snippet");
        assert!(
            snippet.to_lowercase().contains("zucchini"),
            "snippet must contain the matched word: {hit}"
        );
    }

    let h = search_all(&mut c, "ZUCC").await;
    assert_eq!(hit_ids(&h), zucchini, "search ZUCC");

    let tea = vec![t3.assistant.clone(), t3.user.clone()];
    for q in ["grün", "GRÜNER", "Grü"] {
        let h = search_all(&mut c, q).await;
        assert_eq!(hit_ids(&h), tea, "search {q}: {h:?}");
        for hit in &h {
            assert!(
                hit["snippet"].as_str().unwrap_or("").contains("Grüner"),
                "snippet for {q}: {hit}"
            );
        }
    }

    let h = search_all(&mut c, "zucchini leaves").await;
    assert_eq!(
        hit_ids(&h),
        vec![t2.assistant.clone(), t2.user.clone()],
        "every word must match: {h:?}"
    );
    // Order of words does not matter; each is a prefix.
    let h = search_all(&mut c, "LEAV zuc").await;
    assert_eq!(hit_ids(&h), vec![t2.assistant.clone(), t2.user.clone()]);

    let h = search_all(&mut c, "tomatoes").await;
    assert_eq!(hit_ids(&h), vec![t4.assistant.clone(), t4.user.clone()]);

    assert!(search_all(&mut c, "pumpkin").await.is_empty());
    // A prefix must start a word: "ucchini" is inside a word, not at its start.
    assert!(search_all(&mut c, "ucchini").await.is_empty());
    // One word matching is not enough.
    assert!(search_all(&mut c, "zucchini pumpkin").await.is_empty());
}

#[tokio::test]
async fn snippets_are_excerpts_around_the_match() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let short = say(&mut c, None, None, "alpha\nmango\r\nbeta").await;
    let long_text = format!(
        "first line\nsecond line {}mango{}",
        "filler ".repeat(15),
        " tail".repeat(40)
    );
    let long = say(&mut c, None, None, &long_text).await;

    let h = search_all(&mut c, "mango").await;
    let find = |id: &str| -> String {
        h.iter()
            .find(|x| x["message_id"] == id)
            .unwrap_or_else(|| panic!("no hit for {id}: {h:?}"))["snippet"]
            .as_str()
            .expect("snippet")
            .to_owned()
    };

    let s = find(&short.user);
    assert!(!s.contains(['\n', '\r']), "newlines become spaces: {s:?}");
    assert!(s.contains("alpha mango"), "{s:?}");
    assert!(!s.contains('\u{2026}'), "nothing was cut: {s:?}");

    let s = find(&long.user);
    assert!(!s.contains(['\n', '\r']), "newlines become spaces: {s:?}");
    assert!(s.contains("mango"), "{s:?}");
    assert!(
        s.starts_with('\u{2026}') && s.ends_with('\u{2026}'),
        "cut on both sides: {s:?}"
    );
    let inner = s
        .trim_start_matches('\u{2026}')
        .trim_end_matches('\u{2026}');
    let at = inner.find("mango").expect("match inside the snippet");
    let before = inner[..at].chars().count();
    let after = inner[at + "mango".len()..].chars().count();
    assert!(
        before <= 70 && after <= 70,
        "about 60 characters of context on each side, got {before} before and {after} after: {s:?}"
    );
}

/// A short prefix shared by many distinct words must still find every message that has one.
#[tokio::test]
async fn short_prefix_shared_by_many_words_finds_every_match() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let zebra = say(&mut c, None, None, "zqzebra stripes").await;
    let many: Vec<String> = (0..70).map(|i| format!("zq{i:02}")).collect();
    let crowd = say(&mut c, None, None, &many.join(" ")).await;

    let got: BTreeSet<String> = hit_ids(&search_all(&mut c, "zq").await)
        .into_iter()
        .collect();
    let want: BTreeSet<String> = [&zebra.user, &zebra.assistant, &crowd.user, &crowd.assistant]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(
        got, want,
        "search \"zq\" must find the zqzebra message (user {}, reply {}) as well as the one with 70 zq.. words",
        zebra.user, zebra.assistant
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Scope
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn search_scope_all_channel_and_thread() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let chan = create_channel(&mut c, "Garden").await;
    let thr = create_thread(&mut c, &chan, "Beds").await;
    let d = say(&mut c, None, None, "shared banana in general").await;
    let f = say(&mut c, Some(&chan), None, "shared banana in the garden").await;
    let t = say(&mut c, Some(&chan), Some(&thr), "shared banana in a bed").await;

    let ids = |turns: &[&Turn]| -> Vec<String> {
        turns
            .iter()
            .rev()
            .flat_map(|t| [t.assistant.clone(), t.user.clone()])
            .collect()
    };

    let all = search_frame(
        &mut c,
        None,
        None,
        json!({ "query": "banana", "scope": "all" }),
    )
    .await;
    let h = hits(&all);
    assert_eq!(hit_ids(&h), ids(&[&d, &f, &t]), "scope all: {all}");
    for hit in &h {
        let id = hit["message_id"].as_str().unwrap_or("");
        let (want_chat, want_thread) = if id == d.user || id == d.assistant {
            ("default", Value::Null)
        } else if id == f.user || id == f.assistant {
            (chan.as_str(), Value::Null)
        } else {
            (chan.as_str(), json!(thr))
        };
        assert_eq!(hit["chat_id"], want_chat, "{hit}");
        assert_eq!(hit.get("thread_id"), Some(&want_thread), "{hit}");
    }

    // The channel: its flat lane and its thread.
    let r = search_frame(
        &mut c,
        None,
        None,
        json!({ "query": "banana", "scope": "chat", "chat_id": chan }),
    )
    .await;
    assert_eq!(pstr(&r, "scope"), "chat", "{r}");
    assert_eq!(hit_ids(&hits(&r)), ids(&[&f, &t]), "scope chat {chan}: {r}");

    // Only the thread.
    let r = search_frame(
        &mut c,
        None,
        None,
        json!({ "query": "banana", "scope": "chat", "chat_id": chan, "thread_id": thr }),
    )
    .await;
    assert_eq!(hit_ids(&hits(&r)), ids(&[&t]), "scope thread {thr}: {r}");

    // The default channel only.
    let r = search_frame(
        &mut c,
        None,
        None,
        json!({ "query": "banana", "scope": "chat", "chat_id": "default" }),
    )
    .await;
    assert_eq!(hit_ids(&hits(&r)), ids(&[&d]), "scope chat default: {r}");

    // chat_id / thread_id from the envelope when the payload omits them.
    let r = search_frame(
        &mut c,
        Some(&chan),
        None,
        json!({ "query": "banana", "scope": "chat" }),
    )
    .await;
    assert_eq!(hit_ids(&hits(&r)), ids(&[&f, &t]), "envelope chat_id: {r}");
    let r = search_frame(
        &mut c,
        Some(&chan),
        Some(&thr),
        json!({ "query": "banana", "scope": "chat" }),
    )
    .await;
    assert_eq!(hit_ids(&hits(&r)), ids(&[&t]), "envelope thread_id: {r}");
}

// ---------------------------------------------------------------------------------------------
// 3. Limits and errors
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn search_limits_and_errors() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    // 15 turns: 30 matching messages (user + reply each).
    let mut newest_first: Vec<String> = Vec::new();
    for i in 0..15 {
        let t = say(&mut c, None, None, &format!("melon number {i}")).await;
        newest_first.insert(0, t.user);
        newest_first.insert(0, t.assistant);
    }

    let h = hits(&search_frame(&mut c, None, None, json!({ "query": "melon" })).await);
    assert_eq!(hit_ids(&h), newest_first[..20].to_vec(), "default limit 20");
    assert_ts_non_increasing(&h, "default limit");

    let h = hits(&search_frame(&mut c, None, None, json!({ "query": "melon", "limit": 2 })).await);
    assert_eq!(
        hit_ids(&h),
        newest_first[..2].to_vec(),
        "limit 2 → the 2 newest"
    );

    for limit in [100, 500] {
        let h = hits(
            &search_frame(
                &mut c,
                None,
                None,
                json!({ "query": "melon", "limit": limit }),
            )
            .await,
        );
        assert_eq!(hit_ids(&h), newest_first, "limit {limit} returns all 30");
    }

    // A 256-character query is accepted.
    let q256 = "b".repeat(256);
    let r = search_frame(&mut c, None, None, json!({ "query": q256 })).await;
    assert_eq!(pstr(&r, "query"), q256);
    assert!(hits(&r).is_empty(), "{r}");

    let bad: Vec<(Value, Option<&str>, &str, &str)> = vec![
        (json!({ "query": "" }), None, "unsupported", "empty query"),
        (
            json!({ "query": "   \t " }),
            None,
            "unsupported",
            "whitespace query",
        ),
        (
            json!({ "query": "b".repeat(257) }),
            None,
            "unsupported",
            "257-char query",
        ),
        (
            json!({ "query": "!!!" }),
            None,
            "unsupported",
            "no letters or digits",
        ),
        (
            json!({ "query": "melon", "limit": 0 }),
            None,
            "unsupported",
            "limit 0",
        ),
        (
            json!({ "query": "melon", "limit": -3 }),
            None,
            "unsupported",
            "negative limit",
        ),
        (
            json!({ "query": "melon", "scope": "chat" }),
            None,
            "not_found",
            "scope chat without chat_id",
        ),
        (
            json!({ "query": "melon", "scope": "chat", "chat_id": "chan_nope" }),
            None,
            "not_found",
            "unknown chat",
        ),
        (
            json!({ "query": "melon", "scope": "chat" }),
            Some("chan_nope"),
            "not_found",
            "unknown chat in the envelope",
        ),
        (
            json!({ "query": "melon", "scope": "chat", "chat_id": "default", "thread_id": "thr_nope" }),
            None,
            "not_found",
            "unknown thread",
        ),
    ];
    for (payload, env_chat, code, what) in bad {
        let (id, reply) = search_raw(&mut c, env_chat, None, payload.clone()).await;
        assert_error(&reply, id, code, &format!("{what} ({payload})"));
    }

    // The socket is still usable.
    let id = c.request("ping", None, None, json!({ "ts": 7 })).await;
    let pong = c.recv_reply(id).await;
    assert_eq!(frame_type(&pong), "pong", "{pong}");
}

// ---------------------------------------------------------------------------------------------
// 4. Deletion end to end
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn delete_reaches_every_device_history_search_and_outbox() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let pb = pair(dir.path(), "phone B");
    let pc = pair(dir.path(), "phone C");

    // C notes where it was, then goes away.
    let (c, ack_c) = connect_online(&gw, &pc).await;
    let c0 = sync_cursor(&ack_c);
    c.close().await;

    let (mut a, _) = connect_online(&gw, &pa).await;
    let (mut b, _) = connect_online(&gw, &pb).await;
    let keep = say(&mut a, None, None, "harmless plum note").await;
    let t = say(&mut a, None, None, "secret pineapple plan").await;
    b.recv_until(|f| frame_type(f) == "message.stop" && pstr(f, "message_id") == t.assistant)
        .await;

    // Before deletion: where the turn's content sits in the outbox.
    let before = sync(&mut a, c0).await;
    assert_contiguous(&before, c0 + 1, "before deletion");
    let pos = |ty: &str, mid: &str| -> u64 {
        before
            .replay
            .iter()
            .find(|f| frame_type(f) == ty && (mid.is_empty() || pstr(f, "message_id") == mid))
            .and_then(cursor_of)
            .unwrap_or_else(|| panic!("no {ty} {mid} in replay:\n{}", dump(&before.replay)))
    };
    let echo_at = pos("message", &t.user);
    let stop_at = pos("message.stop", &t.assistant);
    let tool_end_at: Vec<u64> = before
        .replay
        .iter()
        .filter(|f| frame_type(f) == "tool.end")
        .filter_map(cursor_of)
        .filter(|c| *c > echo_at && *c < stop_at)
        .collect();
    assert_eq!(
        tool_end_at.len(),
        1,
        "one tool.end in the turn:\n{}",
        dump(&before.replay)
    );
    let tool_end_at = tool_end_at[0];
    assert!(
        before
            .replay
            .iter()
            .any(|f| f.to_string().contains("pineapple")),
        "the content is in the outbox before deletion"
    );
    let keep_echo_at = pos("message", &keep.user);

    // Delete both the user message and the reply.
    let reply = delete_ok(&mut a, &[&t.user, &t.assistant]).await;
    let b_got = b.recv_type("message.deleted").await;
    assert!(
        b_got.get("id").is_none(),
        "other devices get the broadcast without id: {b_got}"
    );
    assert_eq!(b_got["payload"], reply["payload"], "{b_got}");
    let a_extra: Vec<Value> = a
        .collect_quiet(Duration::from_millis(300))
        .await
        .into_iter()
        .filter(|f| frame_type(f) == "message.deleted")
        .collect();
    assert!(
        a_extra.is_empty(),
        "the requester gets only its reply, not also the broadcast:\n{}",
        dump(&a_extra)
    );

    // History, on both devices.
    for (who, dev) in [("A", &mut a), ("B", &mut b)] {
        let hist = history(dev, None, None).await;
        let ids = message_ids(&hist);
        assert!(
            !ids.contains(&t.user.as_str()) && !ids.contains(&t.assistant.as_str()),
            "{who}: deleted messages still in history: {ids:?}"
        );
        assert!(
            ids.contains(&keep.user.as_str()),
            "{who}: other messages stay: {ids:?}"
        );
        assert_no_frame_mentions(&hist, "pineapple", &format!("{who}: history"));
    }

    // Search.
    assert!(
        search_all(&mut a, "pineapple").await.is_empty(),
        "search pineapple"
    );
    assert!(
        search_all(&mut b, "secret").await.is_empty(),
        "search secret"
    );
    assert_eq!(
        hit_ids(&search_all(&mut a, "plum").await),
        vec![keep.assistant.clone(), keep.user.clone()],
        "undeleted messages are still found"
    );

    // C comes back and catches up from its old cursor.
    let (mut c, _) = connect_online(&gw, &pc).await;
    let s = sync(&mut c, c0).await;
    assert_contiguous(&s, c0 + 1, "C's replay after the deletion");
    assert_no_frame_mentions(&s.replay, "pineapple", "C's replay");
    assert_eq!(
        s.done,
        before.done + 1,
        "one new outbox frame: the broadcast"
    );
    for (at, id, what) in [
        (echo_at, &t.user, "user echo"),
        (tool_end_at, &t.assistant, "tool.end"),
        (stop_at, &t.assistant, "message.stop"),
    ] {
        let f = s
            .at(at)
            .unwrap_or_else(|| panic!("cursor {at} missing:\n{}", dump(&s.replay)));
        assert_eq!(
            frame_type(f),
            "message.deleted",
            "the {what} at cursor {at} must now be a message.deleted: {f}"
        );
        assert_eq!(deleted_ids(f), vec![id.clone()], "{what} at {at}: {f}");
    }
    let keep_echo = s.at(keep_echo_at).expect("kept echo");
    assert_eq!(frame_type(keep_echo), "message", "untouched: {keep_echo}");
    assert_eq!(pstr(keep_echo, "message_id"), keep.user);
    let last = s.replay.last().expect("non-empty replay");
    assert_eq!(frame_type(last), "message.deleted", "{last}");
    assert_eq!(
        deleted_ids(last),
        vec![t.user.clone(), t.assistant.clone()],
        "the final broadcast is replayed: {last}"
    );
    assert!(last.get("id").is_none(), "{last}");
}

// ---------------------------------------------------------------------------------------------
// 5. Idempotence and request validation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn delete_is_idempotent_and_validates_its_request() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "phone A");
    let pb = pair(dir.path(), "phone B");
    let (mut a, ack) = connect_online(&gw, &pa).await;
    let (mut b, _) = connect_online(&gw, &pb).await;
    let head = sync_cursor(&ack);

    delete_ok(&mut a, &["msg_nope"]).await;
    let bf = b.recv_type("message.deleted").await;
    assert_eq!(deleted_ids(&bf), vec!["msg_nope".to_owned()], "{bf}");
    assert!(bf.get("id").is_none(), "{bf}");

    let t = say(&mut a, None, None, "delete me twice").await;
    delete_ok(&mut a, &[&t.user]).await;
    delete_ok(&mut a, &[&t.user]).await;
    let ids: Vec<String> = history(&mut a, None, None)
        .await
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(ids, vec![t.assistant.clone()], "only the reply remains");

    // Request validation.
    let (id, r) = delete_raw(&mut a, json!([])).await;
    assert_error(&r, id, "unsupported", "empty message_ids");
    let too_many: Vec<String> = (0..101).map(|i| format!("msg_nope_{i}")).collect();
    let (id, r) = delete_raw(&mut a, json!(too_many)).await;
    assert_error(&r, id, "unsupported", "101 ids");
    let (id, r) = delete_raw(&mut a, json!(["msg ok?", "msg_fine"])).await;
    assert_error(&r, id, "unsupported", "id with bad characters");
    let (id, r) = delete_raw(&mut a, json!(["x".repeat(65)])).await;
    assert_error(&r, id, "unsupported", "65-character id");
    let hundred: Vec<String> = (0..100).map(|i| format!("msg_nope_{i}")).collect();
    let refs: Vec<&str> = hundred.iter().map(String::as_str).collect();
    delete_ok(&mut a, &refs).await;

    // Every answer was outboxed: nope, echo tombstone, two broadcasts, the hundred.
    let s = sync(&mut a, head).await;
    assert_contiguous(&s, head + 1, "outbox after deletions");
    let deleted: Vec<Vec<String>> = s
        .replay
        .iter()
        .filter(|f| frame_type(f) == "message.deleted")
        .map(deleted_ids)
        .collect();
    let only_user = deleted.iter().filter(|d| **d == [t.user.clone()]).count();
    assert_eq!(only_user, 3, "echo tombstone + two broadcasts: {deleted:?}");
    assert!(
        deleted.contains(&vec!["msg_nope".to_owned()]),
        "{deleted:?}"
    );
    assert!(deleted.contains(&hundred), "{deleted:?}");
}

// ---------------------------------------------------------------------------------------------
// 6. Survives restarts
// ---------------------------------------------------------------------------------------------

/// After a restart: the deleted turn is gone from history, search and a full replay; the kept
/// turn is still there.
async fn assert_gone_after_restart(
    gw: &Gateway,
    p: &Paired,
    gone: &Turn,
    word: &str,
    keep: &Turn,
    keep_word: &str,
) {
    let (mut c, _) = connect_online(gw, p).await;
    let hist = history(&mut c, None, None).await;
    let ids = message_ids(&hist);
    assert!(
        !ids.contains(&gone.user.as_str()) && !ids.contains(&gone.assistant.as_str()),
        "deleted messages are back in history after restart: {ids:?}"
    );
    assert!(ids.contains(&keep.user.as_str()), "{ids:?}");
    assert_no_frame_mentions(&hist, word, "history after restart");
    assert!(
        search_all(&mut c, word).await.is_empty(),
        "search {word} after restart"
    );
    assert_eq!(
        hit_ids(&search_all(&mut c, keep_word).await),
        vec![keep.assistant.clone(), keep.user.clone()],
        "search {keep_word} after restart"
    );
    let s = sync(&mut c, 0).await;
    assert_contiguous(&s, 1, "full replay after restart");
    assert_no_frame_mentions(&s.replay, word, "full replay after restart");
    assert!(
        s.replay.iter().any(|f| frame_type(f) == "message.deleted"
            && deleted_ids(f) == [gone.user.clone(), gone.assistant.clone()]),
        "the deletion broadcast is replayed:\n{}",
        dump(&s.replay)
    );
}

#[tokio::test]
async fn deletion_survives_sigterm_restart() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;
    let keep = say(&mut c, None, None, "harmless walnut note").await;
    let gone = say(&mut c, None, None, "secret mango recipe").await;
    delete_ok(&mut c, &[&gone.user, &gone.assistant]).await;
    gw.stop_ok();
    drop(c);

    let gw = Gateway::start(dir.path(), &[]);
    assert_gone_after_restart(&gw, &p, &gone, "mango", &keep, "walnut").await;
}

#[tokio::test]
async fn deletion_survives_kill9() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;
    let keep = say(&mut c, None, None, "harmless hazelnut note").await;
    let gone = say(&mut c, None, None, "secret papaya idea").await;
    delete_ok(&mut c, &[&gone.user, &gone.assistant]).await;
    gw.kill9();
    drop(c);

    let gw = Gateway::start(dir.path(), &[]);
    assert_gone_after_restart(&gw, &p, &gone, "papaya", &keep, "hazelnut").await;
}

// ---------------------------------------------------------------------------------------------
// 7. Channel deletion purges the index
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn deleting_a_channel_removes_its_messages_from_search_and_replay() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let chan = create_channel(&mut c, "Orchard").await;
    let thr = create_thread(&mut c, &chan, "Rows").await;
    say(&mut c, Some(&chan), None, "kiwi harvest soon").await;
    say(&mut c, Some(&chan), Some(&thr), "kiwi rows need water").await;
    let keep = say(&mut c, None, None, "apricot elsewhere").await;
    assert_eq!(search_all(&mut c, "kiwi").await.len(), 4, "indexed before");

    let id = c
        .request("channel.delete", Some(&chan), None, json!({}))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.deleted", "{r}");

    let h = search_all(&mut c, "kiwi").await;
    assert!(h.is_empty(), "search kiwi after channel.delete: {h:?}");
    assert_eq!(
        hit_ids(&search_all(&mut c, "apricot").await),
        vec![keep.assistant.clone(), keep.user.clone()]
    );
    let (id, r) = search_raw(
        &mut c,
        None,
        None,
        json!({ "query": "kiwi", "scope": "chat", "chat_id": chan }),
    )
    .await;
    assert_error(&r, id, "not_found", "scope chat on a deleted channel");

    let s = sync(&mut c, 0).await;
    assert_contiguous(&s, 1, "full replay after channel.delete");
    assert_no_frame_mentions(&s.replay, "kiwi", "full replay after channel.delete");
}

// ---------------------------------------------------------------------------------------------
// 8. Capability
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn hello_ack_advertises_search() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (_c, ack) = connect_online(&gw, &p).await;
    assert_eq!(
        ack.pointer("/payload/server_caps/search"),
        Some(&json!(true)),
        "{ack}"
    );
}

// ---------------------------------------------------------------------------------------------
// Probes beyond the basic list
// ---------------------------------------------------------------------------------------------

/// A device saw `channel.deleted`; a crash right after must not bring the channel's messages
/// back into search or replay.
#[tokio::test]
async fn channel_delete_then_kill9_keeps_messages_out_of_search() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let chan = create_channel(&mut c, "Orchard").await;
    say(&mut c, Some(&chan), None, "kiwi harvest soon").await;
    let id = c
        .request("channel.delete", Some(&chan), None, json!({}))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.deleted", "{r}");
    gw.kill9();
    drop(c);

    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect_online(&gw, &p).await;
    let h = search_all(&mut c, "kiwi").await;
    let s = sync(&mut c, 0).await;
    assert_contiguous(&s, 1, "full replay after channel.delete + kill -9");
    let leaked: Vec<Value> = s
        .replay
        .iter()
        .filter(|f| f.to_string().contains("kiwi"))
        .cloned()
        .collect();
    assert!(
        h.is_empty() && leaked.is_empty(),
        "after channel.deleted was seen and the gateway was killed, the channel's messages are back.\nsearch kiwi hits: {h:?}\nreplayed frames with kiwi:\n{}",
        dump(&leaked)
    );
}

/// Deleting the assistant reply while it is still streaming: it must not come back when the
/// turn finishes.
#[tokio::test]
async fn deleting_a_streaming_reply_keeps_it_deleted() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "30"]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let id = c.send_text(None, None, "guava streaming test").await;
    let receipt = c.recv_reply(id).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let start = c.recv_type("message.start").await;
    let assistant = pstr(&start, "message_id").to_owned();
    delete_ok(&mut c, &[&assistant]).await;
    // The turn ends (stop or not); wait for typing off.
    c.recv_until(|f| frame_type(f) == "typing" && f["payload"]["on"] == json!(false))
        .await;

    let hist = history(&mut c, None, None).await;
    let ids = message_ids(&hist);
    assert!(
        !ids.contains(&assistant.as_str()),
        "the deleted reply {assistant} is back in history after its turn finished: {ids:?}"
    );
    let h = search_all(&mut c, "guava").await;
    assert!(
        !hit_ids(&h).contains(&assistant),
        "the deleted reply {assistant} is searchable after its turn finished: {h:?}"
    );
}

/// Deleting a user message that is still queued behind a running turn: it never gets a turn.
#[tokio::test]
async fn deleting_a_queued_message_cancels_its_turn() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "30"]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let first = c.send_text(None, None, "first cherry").await;
    let r = c.recv_reply(first).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let start = c.recv_type("message.start").await;
    let first_reply = pstr(&start, "message_id").to_owned();
    let second = c.send_text(None, None, "second cherry").await;
    let r = c.recv_reply(second).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let queued = pstr(&r, "message_id").to_owned();
    delete_ok(&mut c, &[&queued]).await;
    c.recv_until(|f| frame_type(f) == "message.stop" && pstr(f, "message_id") == first_reply)
        .await;
    let after = c.collect_quiet(Duration::from_millis(1500)).await;
    assert!(
        !after.iter().any(|f| frame_type(f) == "message.start"),
        "a turn ran for the deleted queued message {queued}:\n{}",
        dump(&after)
    );
    let h = hit_ids(&search_all(&mut c, "cherry").await);
    assert_eq!(h.len(), 2, "only the first message and its reply: {h:?}");
    assert!(!h.contains(&queued), "{h:?}");
}

/// Words longer than the index keeps are still matched as whole prefixes: a query word that is
/// longer than any word in the message must not match it.
#[tokio::test]
async fn long_query_words_do_not_match_shorter_words() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;

    let word = "supercalifragilisticexpialidocious"; // 34 characters
    let t = say(&mut c, None, None, &format!("a {word} day")).await;
    let h = hit_ids(&search_all(&mut c, word).await);
    assert!(h.contains(&t.user), "the full word finds it: {h:?}");
    let longer = format!("{word}xyz");
    let h = search_all(&mut c, &longer).await;
    assert!(
        h.is_empty(),
        "{longer:?} is not a prefix of any word in {:?}, yet it matched: {h:?}",
        format!("a {word} day")
    );
}
