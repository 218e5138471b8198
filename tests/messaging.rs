//! Messages and agent turns against the real binary: the full streamed turn as every device
//! sees it, lane addressing (threads, auto-threads), todo snapshots, history paging (also
//! across a restart), the per-lane queue and concurrent lanes.

mod common;

use std::collections::HashSet;

use common::{
    channel_list, connect_online, create_channel, create_thread, demo_reply, dump, frame_type,
    pair, typing_off, Client, Gateway, Paired,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// Authenticates and consumes the greeting up to and including `status` (fresh gateways have
/// no todo snapshots). Returns the client and its `hello.ack`.
struct Two {
    _dir: tempfile::TempDir,
    gw: Gateway,
    pa: Paired,
    a: Client,
    b: Client,
}

async fn two_devices(extra: &[&str]) -> Two {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), extra);
    let pa = pair(dir.path(), "device-a");
    let pb = pair(dir.path(), "device-b");
    let (a, _) = connect_online(&gw, &pa).await;
    let (b, _) = connect_online(&gw, &pb).await;
    Two {
        _dir: dir,
        gw,
        pa,
        a,
        b,
    }
}

/// Every frame up to and including the next `typing{on:false}`.
async fn frames_until_typing_off(c: &mut Client) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let f = c.recv().await;
        let done = typing_off(&f);
        out.push(f);
        if done {
            return out;
        }
    }
}

fn scope(f: &Value) -> (Option<&str>, Option<&str>) {
    (f["chat_id"].as_str(), f["thread_id"].as_str())
}

/// Frame types with runs of coalescable frames collapsed and typing split by on/off.
fn collapsed_types(frames: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in frames {
        let mut t = frame_type(f).to_owned();
        if t == "typing" {
            t = format!("typing:{}", f["payload"]["on"]);
        }
        if (t == "message.update" || t == "tool.progress") && out.last() == Some(&t) {
            continue;
        }
        out.push(t);
    }
    out
}

/// A `history` request; returns the reply frame (history or error).
async fn history(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    payload: Value,
) -> Value {
    let id = c.request("history", chat, thread, payload).await;
    c.recv_reply(id).await
}

fn history_ids(page: &Value) -> Vec<String> {
    page["payload"]["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("history without messages: {page}"))
        .iter()
        .map(|m| m["message_id"].as_str().expect("message_id").to_owned())
        .collect()
}

/// Sends `texts` one by one into a lane (waiting for each `message.stop`) and returns the
/// message ids in chronological order: user, assistant, user, assistant, ...
/// Reconnects every 40 sends so the per-connection frame rate limit never applies.
async fn run_turns(
    gw: &Gateway,
    p: &Paired,
    chat: Option<&str>,
    thread: Option<&str>,
    texts: &[String],
) -> Vec<String> {
    let mut ids = Vec::new();
    let mut conn: Option<Client> = None;
    for (i, text) in texts.iter().enumerate() {
        if i % 40 == 0 {
            if let Some(old) = conn.take() {
                old.close().await;
            }
            conn = Some(connect_online(gw, p).await.0);
        }
        let c = conn.as_mut().expect("connected");
        let rid = c.send_text(chat, thread, &text).await;
        let receipt = c.recv_reply(rid).await;
        assert_eq!(frame_type(&receipt), "read.receipt", "send #{i}: {receipt}");
        ids.push(
            receipt["payload"]["message_id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
        let stop = c.recv_type("message.stop").await;
        assert_eq!(
            stop["payload"]["final_text"].as_str(),
            Some(demo_reply(text).as_str()),
            "send #{i}: {stop}"
        );
        ids.push(
            stop["payload"]["message_id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }
    if let Some(c) = conn {
        c.close().await;
    }
    ids
}

/// Pages a lane with `limit` until `has_more` is false; returns the history frames newest first.
async fn all_pages(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    limit: i64,
) -> Vec<Value> {
    let mut pages: Vec<Value> = Vec::new();
    loop {
        let mut payload = json!({ "limit": limit });
        if let Some(last) = pages.last() {
            payload["before_message_id"] = last["payload"]["oldest_message_id"].clone();
        }
        let page = history(c, chat, thread, payload).await;
        assert_eq!(frame_type(&page), "history", "{page}");
        let more = page["payload"]["has_more"].as_bool().expect("has_more");
        pages.push(page);
        if !more {
            return pages;
        }
        assert!(pages.len() <= 1000, "history paging does not end");
    }
}

fn texts(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix} number {i}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn full_turn_reaches_both_devices_in_order() {
    let mut t = two_devices(&[]).await;
    let text = "hello there world";
    let expected_reply = "You said: \u{201c}hello there world\u{201d}. That is 3 words and 17 characters. I am the demo agent; connect a Hermes agent for real answers.";
    assert_eq!(demo_reply(text), expected_reply);

    let rid = t.a.send_text(Some("default"), None, &text).await;
    let fa = frames_until_typing_off(&mut t.a).await;
    let fb = frames_until_typing_off(&mut t.b).await;

    // The receipt answers the request and comes before anything of the turn.
    let receipt = &fa[0];
    assert_eq!(
        frame_type(receipt),
        "read.receipt",
        "A's first frame:\n{}",
        dump(&fa)
    );
    assert_eq!(receipt["id"].as_i64(), Some(rid), "{receipt}");
    let user_id = receipt["payload"]["message_id"]
        .as_str()
        .expect("read.receipt.message_id")
        .to_owned();
    assert!(!user_id.is_empty());
    assert!(
        fb.iter().all(|f| frame_type(f) != "read.receipt"),
        "B must not get A's read.receipt:\n{}",
        dump(&fb)
    );

    let expected_order = [
        "read.receipt",
        "message",
        "typing:true",
        "message.start",
        "todo.update",
        "tool.start",
        "tool.progress",
        "tool.end",
        "todo.update",
        "commentary",
        "message.update",
        "todo.update",
        "message.stop",
        "typing:false",
    ];
    assert_eq!(
        collapsed_types(&fa),
        expected_order,
        "A's turn frames:\n{}",
        dump(&fa)
    );
    assert_eq!(
        collapsed_types(&fb),
        expected_order[1..],
        "B's turn frames:\n{}",
        dump(&fb)
    );

    let mut finals = Vec::new();
    for (who, frames) in [("A", &fa), ("B", &fb)] {
        // Scope: the default channel's flat lane.
        for f in frames.iter() {
            assert_eq!(
                scope(f),
                (Some("default"), None),
                "{who}: frame out of lane: {f}"
            );
            assert!(
                f.get("cursor").is_none(),
                "{who}: live frame carries cursor: {f}"
            );
        }
        let echo = frames
            .iter()
            .find(|f| frame_type(f) == "message")
            .expect("echo");
        assert!(
            echo.get("id").is_none(),
            "{who}: echo carries an id: {echo}"
        );
        let p = &echo["payload"];
        assert_eq!(
            p["message_id"].as_str(),
            Some(user_id.as_str()),
            "{who}: {echo}"
        );
        assert_eq!(p["role"], "user", "{who}: {echo}");
        assert_eq!(p["text"], text, "{who}: {echo}");
        assert!(p["ts"].as_i64().is_some_and(|ts| ts > 0), "{who}: {echo}");
        assert_eq!(p["media"], json!([]), "{who}: {echo}");

        let start = frames
            .iter()
            .find(|f| frame_type(f) == "message.start")
            .unwrap();
        let mid = start["payload"]["message_id"]
            .as_str()
            .expect("start id")
            .to_owned();
        assert_ne!(mid, user_id, "{who}");
        assert_eq!(start["payload"]["role"], "assistant", "{who}: {start}");

        let ts = frames
            .iter()
            .find(|f| frame_type(f) == "tool.start")
            .unwrap();
        assert_eq!(ts["payload"]["index"], 0, "{who}: {ts}");
        assert_eq!(ts["payload"]["name"], "word_count", "{who}: {ts}");
        assert!(
            ts["payload"]["emoji"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
            "{who}: tool.start without emoji: {ts}"
        );
        assert!(ts["payload"]["args"].is_object(), "{who}: {ts}");
        for f in frames.iter().filter(|f| frame_type(f) == "tool.progress") {
            assert_eq!(f["payload"]["index"], 0, "{who}: {f}");
        }
        let te = frames.iter().find(|f| frame_type(f) == "tool.end").unwrap();
        assert_eq!(te["payload"]["index"], 0, "{who}: {te}");
        assert_eq!(te["payload"]["ok"], true, "{who}: {te}");
        assert_eq!(te["payload"]["name"], "word_count", "{who}: {te}");

        let commentary = frames
            .iter()
            .find(|f| frame_type(f) == "commentary")
            .unwrap();
        assert_eq!(
            commentary["payload"]["message_id"].as_str(),
            Some(mid.as_str()),
            "{who}"
        );
        assert!(commentary["payload"]["text"]
            .as_str()
            .is_some_and(|s| !s.is_empty()));

        // Updates grow: each is the previous text extended (coalescing only skips some).
        let mut prev = String::new();
        for u in frames.iter().filter(|f| frame_type(f) == "message.update") {
            assert_eq!(
                u["payload"]["message_id"].as_str(),
                Some(mid.as_str()),
                "{who}: {u}"
            );
            let text = u["payload"]["text"].as_str().expect("update text");
            assert!(
                text.starts_with(&prev) && text.len() > prev.len(),
                "{who}: message.update does not extend the previous text ({prev:?}): {u}"
            );
            prev = text.to_owned();
        }
        assert_eq!(prev, expected_reply, "{who}: last message.update");

        let todos: Vec<&Value> = frames
            .iter()
            .filter(|f| frame_type(f) == "todo.update")
            .collect();
        let last_todos = todos.last().unwrap()["payload"]["todos"]
            .as_array()
            .unwrap();
        assert_eq!(last_todos.len(), 3, "{who}: {:?}", todos.last());
        assert!(
            last_todos.iter().all(|t| t["status"] == "completed"),
            "{who}: last todo.update not all completed: {:?}",
            todos.last()
        );

        let stop = frames
            .iter()
            .find(|f| frame_type(f) == "message.stop")
            .unwrap();
        let sp = &stop["payload"];
        assert_eq!(
            sp["message_id"].as_str(),
            Some(mid.as_str()),
            "{who}: {stop}"
        );
        assert_eq!(sp["final_text"], expected_reply, "{who}: {stop}");
        assert!(
            sp["reasoning"].as_str().is_some_and(|r| !r.is_empty()),
            "{who}: {stop}"
        );
        assert_eq!(sp["model"], "iris-demo", "{who}: {stop}");
        assert!(
            sp["tokens"].as_i64().is_some_and(|n| n > 0),
            "{who}: {stop}"
        );
        assert_eq!(sp["runtime"]["model"], "iris-demo", "{who}: {stop}");
        assert!(sp["ts"].as_i64().is_some_and(|ts| ts > 0), "{who}: {stop}");
        assert!(stop.get("id").is_none(), "{who}: {stop}");
        finals.push((mid, stop["payload"].clone()));
    }
    assert_eq!(
        finals[0], finals[1],
        "both devices see the same final message"
    );

    // Nothing either device has seen (greeting included) carries a cursor.
    for f in t.a.seen.iter().chain(t.b.seen.iter()) {
        assert!(f.get("cursor").is_none(), "live frame carries cursor: {f}");
    }

    // History holds exactly what was streamed: the echo and the final message.
    let page = history(&mut t.b, Some("default"), None, json!({})).await;
    let msgs = page["payload"]["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 2, "{page}");
    let echo = fa.iter().find(|f| frame_type(f) == "message").unwrap();
    assert_eq!(
        msgs[0], echo["payload"],
        "history's user message is the echo"
    );
    let (mid, stop) = &finals[0];
    let h = &msgs[1];
    assert_eq!(h["message_id"].as_str(), Some(mid.as_str()), "{h}");
    assert_eq!(h["role"], "assistant", "{h}");
    assert_eq!(h["text"], stop["final_text"], "{h}");
    for key in ["reasoning", "model", "tokens", "runtime", "ts"] {
        assert_eq!(
            h[key], stop[key],
            "history `{key}` differs from message.stop: {h}"
        );
    }
    assert_eq!(page["payload"]["has_more"], false, "{page}");
}

#[tokio::test]
async fn thread_turns_carry_parent_chat_and_thread_id() {
    let mut t = two_devices(&[]).await;
    let chan = create_channel(&mut t.a, "Projects").await;
    let thread = create_thread(&mut t.a, &chan, "Garden").await;
    // B learns about both entries.
    t.b.recv_until(|f| {
        frame_type(f) == "channel.created" && f["payload"]["chat_id"] == thread.as_str()
    })
    .await;

    let text = "plan the beds";
    let rid = t.a.send_text(Some(&chan), Some(&thread), &text).await;
    let fa = frames_until_typing_off(&mut t.a).await;
    let fb = frames_until_typing_off(&mut t.b).await;
    assert_eq!(frame_type(&fa[0]), "read.receipt", "{}", dump(&fa));
    assert_eq!(fa[0]["id"].as_i64(), Some(rid));
    for (who, frames) in [("A", &fa), ("B", &fb)] {
        assert!(
            frames.iter().any(|f| frame_type(f) == "message.stop"),
            "{who}: no message.stop:\n{}",
            dump(frames)
        );
        for f in frames.iter() {
            assert_eq!(
                scope(f),
                (Some(chan.as_str()), Some(thread.as_str())),
                "{who}: turn frame not scoped to chat_id=parent, thread_id=thread: {f}"
            );
        }
    }
    let user_id = fa[0]["payload"]["message_id"].as_str().unwrap().to_owned();
    let stop = fa.iter().find(|f| frame_type(f) == "message.stop").unwrap();
    let asst_id = stop["payload"]["message_id"].as_str().unwrap().to_owned();

    let page = history(&mut t.a, Some(&chan), Some(&thread), json!({})).await;
    assert_eq!(frame_type(&page), "history", "{page}");
    assert_eq!(
        history_ids(&page),
        vec![user_id.clone(), asst_id.clone()],
        "{page}"
    );
    assert_eq!(
        scope(&page),
        (Some(chan.as_str()), Some(thread.as_str())),
        "{page}"
    );
    let msgs = page["payload"]["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "user");
    assert_eq!(msgs[0]["text"], text);
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[1]["text"], demo_reply(text));

    let flat = history(&mut t.a, Some(&chan), None, json!({})).await;
    assert_eq!(frame_type(&flat), "history", "{flat}");
    let flat_ids = history_ids(&flat);
    assert!(
        !flat_ids.contains(&user_id) && !flat_ids.contains(&asst_id),
        "thread messages leaked into the parent's flat lane: {flat}"
    );
    assert_eq!(flat["payload"]["has_more"], false, "{flat}");
    // A thread message is not a paging cursor in the parent's flat lane.
    let e = history(
        &mut t.a,
        Some(&chan),
        None,
        json!({ "before_message_id": user_id }),
    )
    .await;
    assert_eq!(frame_type(&e), "error", "{e}");
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    // Older than the first message: an empty last page.
    let e = history(
        &mut t.a,
        Some(&chan),
        Some(&thread),
        json!({ "before_message_id": user_id }),
    )
    .await;
    assert_eq!(e["payload"]["messages"], json!([]), "{e}");
    assert_eq!(e["payload"]["has_more"], false, "{e}");
}

#[tokio::test]
async fn auto_thread_in_default_flat_lane_mints_a_thread() {
    let mut t = two_devices(&[]).await;
    let text = "Plan the garden";
    let rid = t.a.send_auto_threaded(Some("default"), text).await;
    let fa = frames_until_typing_off(&mut t.a).await;
    let fb = frames_until_typing_off(&mut t.b).await;

    let created_b = fb
        .iter()
        .position(|f| frame_type(f) == "channel.created")
        .unwrap_or_else(|| panic!("B got no channel.created:\n{}", dump(&fb)));
    let echo_b = fb
        .iter()
        .position(|f| frame_type(f) == "message")
        .expect("B echo");
    assert!(
        created_b < echo_b,
        "channel.created must precede the echo:\n{}",
        dump(&fb)
    );
    let created = &fb[created_b]["payload"];
    assert_eq!(created["kind"], "thread", "{created}");
    assert_eq!(created["auto"], true, "{created}");
    assert_eq!(created["parent_chat_id"], "default", "{created}");
    assert_eq!(created["name"], text, "{created}");
    assert_eq!(created["is_default"], false, "{created}");
    let thread = created["chat_id"].as_str().expect("thread id").to_owned();

    let created_a = fa
        .iter()
        .find(|f| frame_type(f) == "channel.created")
        .unwrap_or_else(|| panic!("A got no channel.created:\n{}", dump(&fa)));
    assert_eq!(
        created_a["payload"], *created,
        "A and B see the same thread"
    );

    assert_eq!(frame_type(&fa[0]), "read.receipt", "{}", dump(&fa));
    assert_eq!(fa[0]["id"].as_i64(), Some(rid));
    for (who, frames) in [("A", &fa), ("B", &fb)] {
        assert!(
            frames.iter().any(|f| frame_type(f) == "message.stop"),
            "{who}"
        );
        for f in frames
            .iter()
            .filter(|f| !frame_type(f).starts_with("channel."))
        {
            assert_eq!(
                scope(f),
                (Some("default"), Some(thread.as_str())),
                "{who}: echo/turn frame must carry the new thread_id: {f}"
            );
        }
    }

    let list = channel_list(&mut t.a).await;
    assert!(
        list.iter()
            .any(|c| c["chat_id"] == thread.as_str() && c["parent_chat_id"] == "default"),
        "{list:?}"
    );
    let page = history(&mut t.a, Some("default"), Some(&thread), json!({})).await;
    assert_eq!(history_ids(&page).len(), 2, "{page}");
    let flat = history(&mut t.a, Some("default"), None, json!({})).await;
    assert_eq!(history_ids(&flat), Vec::<String>::new(), "{flat}");
}

#[tokio::test]
async fn auto_thread_ignored_for_slash_text_and_other_channels() {
    let mut t = two_devices(&[]).await;
    let chan = create_channel(&mut t.a, "Elsewhere").await;
    t.b.recv_type("channel.created").await;
    let before = channel_list(&mut t.a).await;

    // Slash text in the default flat lane stays there (one the gateway does not know goes to
    // the agent as typed, so it gets a turn).
    t.a.send_auto_threaded(Some("default"), "/weather today")
        .await;
    let fa = frames_until_typing_off(&mut t.a).await;
    let fb = frames_until_typing_off(&mut t.b).await;
    for (who, frames) in [("A", &fa), ("B", &fb)] {
        assert!(
            frames.iter().all(|f| frame_type(f) != "channel.created"),
            "{who}: a slash text must not mint a thread:\n{}",
            dump(frames)
        );
        let echo = frames
            .iter()
            .find(|f| frame_type(f) == "message")
            .expect("echo");
        assert_eq!(scope(echo), (Some("default"), None), "{who}: {echo}");
        for f in frames {
            assert_eq!(scope(f), (Some("default"), None), "{who}: {f}");
        }
    }

    // auto_thread in a non-default channel does not thread.
    t.a.send_auto_threaded(Some(&chan), "Plan the garden").await;
    let fa = frames_until_typing_off(&mut t.a).await;
    let fb = frames_until_typing_off(&mut t.b).await;
    for (who, frames) in [("A", &fa), ("B", &fb)] {
        assert!(
            frames.iter().all(|f| frame_type(f) != "channel.created"),
            "{who}: auto_thread outside the default channel must not mint a thread:\n{}",
            dump(frames)
        );
        for f in frames {
            assert_eq!(scope(f), (Some(chan.as_str()), None), "{who}: {f}");
        }
    }
    assert_eq!(channel_list(&mut t.a).await, before, "directory changed");
}

#[tokio::test]
async fn new_connection_gets_todo_snapshot_after_greeting() {
    let mut t = two_devices(&[]).await;
    let chan = create_channel(&mut t.a, "Todo lane").await;
    let thread = create_thread(&mut t.a, &chan, "Sub").await;
    t.a.send_text(Some(&chan), Some(&thread), "count these words")
        .await;
    frames_until_typing_off(&mut t.a).await;

    let (mut c, ack) = Client::hello(&t.gw.url, &t.pa.token, &t.pa.device_id).await;
    assert_eq!(frame_type(&ack), "hello.ack");
    assert_eq!(
        frame_type(&c.seen[0]),
        "hello.ack",
        "hello.ack must be the first frame"
    );
    let status = c.recv().await;
    assert_eq!(frame_type(&status), "status", "{status}");
    let snap = c.recv().await;
    assert_eq!(
        frame_type(&snap),
        "todo.update",
        "expected the todo snapshot: {snap}"
    );
    assert_eq!(
        scope(&snap),
        (Some(chan.as_str()), Some(thread.as_str())),
        "{snap}"
    );
    let todos = snap["payload"]["todos"].as_array().expect("todos");
    assert_eq!(todos.len(), 3, "{snap}");
    assert!(todos.iter().all(|t| t["status"] == "completed"), "{snap}");
    assert!(
        snap.get("cursor").is_none() && snap.get("id").is_none(),
        "{snap}"
    );
}

#[tokio::test]
async fn history_pages_cover_everything_in_order() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "pager");
    let sent = texts("history message", 60);
    let expected = run_turns(&gw, &p, Some("default"), None, &sent).await;
    assert_eq!(expected.len(), 120);

    // A fresh connection so the sends above do not count against its frame rate.
    let (mut c, _) = connect_online(&gw, &p).await;
    let pages = all_pages(&mut c, Some("default"), None, 25).await;
    let sizes: Vec<usize> = pages.iter().map(|p| history_ids(p).len()).collect();
    assert_eq!(sizes, vec![25, 25, 25, 25, 20], "page sizes");
    let mut seen = HashSet::new();
    let mut chronological: Vec<Value> = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        let ids = history_ids(page);
        let last = i + 1 == pages.len();
        assert_eq!(
            page["payload"]["has_more"],
            json!(!last),
            "page {i}: {page}"
        );
        assert_eq!(
            page["payload"]["oldest_message_id"].as_str(),
            Some(ids[0].as_str()),
            "page {i}: oldest_message_id must be the page's first message"
        );
        assert_eq!(scope(page), (Some("default"), None), "page {i}");
        for id in &ids {
            assert!(seen.insert(id.clone()), "pages overlap at {id}");
        }
    }
    for page in pages.iter().rev() {
        chronological.extend(
            page["payload"]["messages"]
                .as_array()
                .unwrap()
                .iter()
                .cloned(),
        );
    }
    let got: Vec<String> = chronological
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, expected, "all 120 messages in chronological order");
    for (i, m) in chronological.iter().enumerate() {
        let text = &sent[i / 2];
        if i % 2 == 0 {
            assert_eq!(m["role"], "user", "{m}");
            assert_eq!(m["text"], text.as_str(), "{m}");
            assert_eq!(m["media"], json!([]), "{m}");
        } else {
            assert_eq!(m["role"], "assistant", "{m}");
            assert_eq!(m["text"], demo_reply(text), "{m}");
            assert_eq!(m["model"], "iris-demo", "{m}");
            assert!(m["tokens"].as_i64().is_some_and(|n| n > 0), "{m}");
            assert!(
                m["reasoning"].as_str().is_some_and(|r| !r.is_empty()),
                "{m}"
            );
            assert!(m["runtime"].is_object(), "{m}");
        }
        assert!(m["ts"].as_i64().is_some_and(|ts| ts > 0), "{m}");
    }

    // Other page sizes, including exact multiples of the total, page the same history.
    for limit in [40_usize, 60, 119, 120, 200] {
        let pages = all_pages(&mut c, Some("default"), None, limit as i64).await;
        let got: Vec<String> = pages.iter().rev().flat_map(history_ids).collect();
        assert_eq!(got, expected, "paging with limit {limit}");
        assert_eq!(
            pages.len(),
            120_usize.div_ceil(limit),
            "pages with limit {limit}"
        );
    }

    // Default limit 50: the newest 50.
    let newest = history(&mut c, Some("default"), None, json!({})).await;
    assert_eq!(
        history_ids(&newest),
        expected[70..].to_vec(),
        "default page"
    );
    assert_eq!(newest["payload"]["has_more"], true);
    // No chat_id means the default channel.
    let implicit = history(&mut c, None, None, json!({})).await;
    assert_eq!(implicit["payload"], newest["payload"]);

    // limit 0 is refused, unknown before_message_id and unknown chats are not found.
    let e = history(&mut c, Some("default"), None, json!({ "limit": 0 })).await;
    assert_eq!(frame_type(&e), "error", "{e}");
    assert_eq!(e["payload"]["code"], "unsupported", "{e}");
    let e = history(
        &mut c,
        Some("default"),
        None,
        json!({ "before_message_id": "msg_doesnotexist" }),
    )
    .await;
    assert_eq!(frame_type(&e), "error", "{e}");
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    let e = history(&mut c, Some("chan_doesnotexist"), None, json!({})).await;
    assert_eq!(frame_type(&e), "error", "{e}");
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    // The socket stays usable after the refusals.
    let again = history(&mut c, Some("default"), None, json!({ "limit": 2 })).await;
    assert_eq!(history_ids(&again), expected[118..].to_vec());
    c.close().await;

    // limit above history_max (200) is capped: grow the lane past 200 messages.
    let more = texts("more history", 41);
    let expected_more = run_turns(&gw, &p, Some("default"), None, &more).await;
    let all: Vec<String> = expected
        .iter()
        .chain(expected_more.iter())
        .cloned()
        .collect();
    assert_eq!(all.len(), 202);
    let (mut c, _) = connect_online(&gw, &p).await;
    let capped = history(&mut c, Some("default"), None, json!({ "limit": 500 })).await;
    assert_eq!(frame_type(&capped), "history", "{capped}");
    assert_eq!(
        history_ids(&capped),
        all[2..].to_vec(),
        "limit 500 must be capped to 200"
    );
    assert_eq!(capped["payload"]["has_more"], true);
}

#[tokio::test]
async fn history_survives_restart() {
    let dir = common::temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "pager");
    let chan = {
        let (mut c, _) = connect_online(&gw, &p).await;
        let chan = create_channel(&mut c, "Kept").await;
        c.close().await;
        chan
    };
    let expected = run_turns(&gw, &p, Some("default"), None, &texts("kept message", 30)).await;
    let expected_chan = run_turns(&gw, &p, Some(&chan), None, &texts("channel message", 3)).await;

    let (mut c, _) = connect_online(&gw, &p).await;
    let before = all_pages(&mut c, Some("default"), None, 25).await;
    let before_chan = all_pages(&mut c, Some(&chan), None, 4).await;
    c.close().await;
    let got: Vec<String> = before.iter().rev().flat_map(history_ids).collect();
    assert_eq!(got, expected);
    let got: Vec<String> = before_chan.iter().rev().flat_map(history_ids).collect();
    assert_eq!(got, expected_chan);

    gw.stop_ok();
    drop(gw);
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect_online(&gw, &p).await;
    let after = all_pages(&mut c, Some("default"), None, 25).await;
    let after_chan = all_pages(&mut c, Some(&chan), None, 4).await;
    let payloads = |pages: &[Value]| {
        pages
            .iter()
            .map(|p| p["payload"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        payloads(&after),
        payloads(&before),
        "default lane pages after restart"
    );
    assert_eq!(
        payloads(&after_chan),
        payloads(&before_chan),
        "channel pages after restart"
    );
    c.close().await;

    // New messages after the restart land after the old ones.
    let newer = run_turns(&gw, &p, Some("default"), None, &texts("after restart", 2)).await;
    let (mut c, _) = connect_online(&gw, &p).await;
    let pages = all_pages(&mut c, Some("default"), None, 200).await;
    let got: Vec<String> = pages.iter().rev().flat_map(history_ids).collect();
    let want: Vec<String> = expected.iter().chain(newer.iter()).cloned().collect();
    assert_eq!(got, want, "history order across a restart");
}

#[tokio::test]
async fn lane_queue_holds_eight_then_rate_limits() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "30"]);
    let p = pair(dir.path(), "queuer");
    let (mut c, _) = connect_online(&gw, &p).await;
    let sent = texts("queued", 12);
    let mut ids = Vec::new();
    for text in &sent {
        ids.push(c.send_text(Some("default"), None, &text).await);
    }
    let mut outcome = Vec::new();
    for id in &ids {
        let r = c.recv_reply(*id).await;
        outcome.push(match frame_type(&r) {
            "read.receipt" => "accepted".to_owned(),
            "error" => format!("error:{}", r["payload"]["code"].as_str().unwrap_or("?")),
            other => panic!("unexpected reply {other}: {r}"),
        });
    }
    let mut want = vec!["accepted".to_owned(); 9];
    want.extend(vec!["error:rate_limited".to_owned(); 3]);
    assert_eq!(
        outcome, want,
        "1 running + 8 queued accepted, the rest rate_limited"
    );

    let mut finals = Vec::new();
    for _ in 0..9 {
        let stop = c.recv_type("message.stop").await;
        finals.push(stop["payload"]["final_text"].as_str().unwrap().to_owned());
    }
    let expected: Vec<String> = sent[..9].iter().map(|t| demo_reply(t)).collect();
    assert_eq!(finals, expected, "answers in send order");
    let echoed: Vec<&str> = c
        .seen
        .iter()
        .filter(|f| frame_type(f) == "message")
        .map(|f| f["payload"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        echoed,
        sent[..9].iter().map(String::as_str).collect::<Vec<_>>()
    );

    let page = history(&mut c, Some("default"), None, json!({})).await;
    assert_eq!(
        history_ids(&page).len(),
        18,
        "refused messages must not be stored: {page}"
    );
}

#[tokio::test]
async fn two_lanes_run_concurrently() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "20"]);
    let p = pair(dir.path(), "lanes");
    let (mut c, _) = connect_online(&gw, &p).await;
    let chan = create_channel(&mut c, "Second lane").await;
    c.send_text(Some("default"), None, "first lane").await;
    c.send_text(Some(&chan), None, "second lane").await;

    let mut started: HashSet<String> = HashSet::new();
    while started.len() < 2 {
        let f = c.recv().await;
        match frame_type(&f) {
            "message.start" => {
                started.insert(f["chat_id"].as_str().unwrap_or("").to_owned());
            }
            "message.stop" => panic!(
                "a turn finished before both lanes started (started: {started:?}): {f}\n{}",
                c.recent()
            ),
            _ => {}
        }
    }
    let want: HashSet<String> = ["default".to_owned(), chan.clone()].into();
    assert_eq!(started, want);
    let mut stopped = HashSet::new();
    while stopped.len() < 2 {
        let f = c.recv_type("message.stop").await;
        stopped.insert(f["chat_id"].as_str().unwrap_or("").to_owned());
    }
    assert_eq!(stopped, want);
}

#[tokio::test]
async fn demo_reply_wording() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "words");
    let (mut c, _) = connect_online(&gw, &p).await;
    let long: String = "abcd ".repeat(50); // 250 characters, 50 words
    let cases = [
        (
            "x".to_owned(),
            "You said: \u{201c}x\u{201d}. That is 1 word and 1 character. I am the demo agent; connect a Hermes agent for real answers.".to_owned(),
        ),
        (
            "h\u{e9}llo w\u{f6}rld".to_owned(),
            "You said: \u{201c}h\u{e9}llo w\u{f6}rld\u{201d}. That is 2 words and 11 characters. I am the demo agent; connect a Hermes agent for real answers.".to_owned(),
        ),
        (
            long.clone(),
            format!(
                "You said: \u{201c}{}\u{201d}. That is 50 words and 250 characters. I am the demo agent; connect a Hermes agent for real answers.",
                &long[..200]
            ),
        ),
    ];
    for (text, want) in cases {
        c.send_text(None, None, &text).await;
        let stop = c.recv_type("message.stop").await;
        assert_eq!(stop["payload"]["final_text"], want.as_str(), "for {text:?}");
        assert_eq!(demo_reply(&text), want);
    }
}
