//! Every frame the gateway writes fits what an app takes (`limits.max_out_frame_bytes`, 1 MiB),
//! whatever a paired device or the agent sends within their limits. Each test here is one way
//! an earlier version could lock a device out for good, driven through the real binary; the
//! test client itself refuses any frame over 1 MiB (`Client::max_frame_in`), so a frame too
//! big fails the test wherever it appears.

mod common;

use base64::Engine;
use common::peers::MockLlm;
use common::{
    connect, frame_type, pair, pstr, sync_cursor, temp_data_dir, Client, Gateway,
    APP_MAX_FRAME_BYTES,
};
use serde_json::{json, Value};

/// A PNG the gateway accepts as an icon: the signature, then `size - 8` bytes of noise.
fn png_icon(size: usize, seed: u8) -> String {
    let mut bytes = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    let mut x = seed as u32 | 1;
    bytes.extend((8..size).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as u8
    }));
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn set_icon(c: &mut Client, chat: &str, icon: Option<&str>) -> Value {
    let id = c
        .request("channel.icon", Some(chat), None, json!({ "icon": icon }))
        .await;
    c.recv_reply(id).await
}

/// Pairs a tablet that says hello and goes away: (the tablet, the cursor it left at), for a
/// test that later checks what it catches up with.
async fn away_tablet(gw: &Gateway, dir: &std::path::Path) -> (common::Paired, u64) {
    let b = pair(dir, "tablet");
    let (cb, ack_b) = connect(gw, &b).await;
    let away_from = sync_cursor(&ack_b);
    cb.close().await;
    (b, away_from)
}

/// The whole history of a lane, paging with `before_message_id`, and the size of each page.
async fn whole_history(c: &mut Client, chat: &str, thread: Option<&str>) -> (Vec<Value>, usize) {
    let mut all: Vec<Value> = Vec::new();
    let mut before: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut payload = json!({});
        if let Some(b) = &before {
            payload["before_message_id"] = json!(b);
        }
        let id = c.request("history", Some(chat), thread, payload).await;
        let page = c.recv_reply(id).await;
        assert_eq!(frame_type(&page), "history", "{page}");
        pages += 1;
        let msgs = page["payload"]["messages"].as_array().unwrap().clone();
        assert!(!msgs.is_empty() || all.is_empty(), "an empty page mid-way");
        let mut older = msgs;
        older.extend(all);
        all = older;
        if page["payload"]["has_more"] != json!(true) {
            return (all, pages);
        }
        before = Some(pstr(&page, "oldest_message_id").to_owned());
        assert!(pages < 100, "history never ends");
    }
}

/// Lock-out 1: two 500 KiB icons made `hello.ack` (which carries the whole directory) too big
/// for every device, for good. The second icon is now refused, naming the limit; every device
/// still says hello, and one that was away catches up with `sync`.
#[tokio::test]
async fn icons_cannot_grow_the_directory_past_one_frame() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let a = pair(dir.path(), "phone");
    let (b, away_from) = away_tablet(&gw, dir.path()).await;
    let (mut ca, _) = connect(&gw, &a).await;
    let one = common::create_channel(&mut ca, "Photos").await;
    let two = common::create_channel(&mut ca, "Garden").await;
    let icon = png_icon(500 << 10, 1);
    let r = set_icon(&mut ca, &one, Some(&icon)).await;
    assert_eq!(frame_type(&r), "channel.renamed", "{r}");
    let r = set_icon(&mut ca, &two, Some(&png_icon(500 << 10, 2))).await;
    assert_eq!(frame_type(&r), "error", "{r}");
    assert_eq!(r["payload"]["code"], "unsupported");
    let msg = pstr(&r, "message");
    assert!(
        msg.contains("limits.max_out_frame_bytes") && msg.contains("icon"),
        "{msg}"
    );
    // The refusal lost nothing and the socket is still usable.
    let list = common::channel_list(&mut ca).await;
    let two_entry = list.iter().find(|c| c["chat_id"] == json!(two)).unwrap();
    assert!(two_entry.get("icon").is_none_or(Value::is_null));
    // A smaller icon still fits beside the big one.
    let r = set_icon(&mut ca, &two, Some(&png_icon(20 << 10, 3))).await;
    assert_eq!(frame_type(&r), "channel.renamed", "{r}");

    // Every device can still say hello (the client refuses frames over 1 MiB).
    let (mut cb, ack) = connect(&gw, &b).await;
    let with_icon = ack["payload"]["channels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["icon"].is_string())
        .count();
    assert_eq!(with_icon, 2, "{}", &ack.to_string()[..300]);
    let replayed = common::sync_from(&mut cb, away_from).await.0;
    let renamed: Vec<&Value> = replayed
        .iter()
        .filter(|f| frame_type(f) == "channel.renamed")
        .collect();
    assert_eq!(renamed.len(), 2, "{}", common::dump(&replayed));
    assert_eq!(renamed[0]["payload"]["icon"], json!(icon));
}

/// A directory stored over the limit by an earlier version (here: a gateway run with a larger
/// `max_out_frame_bytes`) still greets every device: the largest icons are left out of the
/// frame until it fits, and clearing one is allowed although the directory is over.
#[tokio::test]
async fn a_directory_stored_too_big_still_greets_every_device() {
    let dir = temp_data_dir();
    let big = (4u32 << 20).to_string();
    let mut gw = Gateway::start(dir.path(), &["--max-out-frame-bytes", &big]);
    let a = pair(dir.path(), "phone");
    let (ca, _) = connect(&gw, &a).await;
    let mut ca = ca;
    ca.max_frame_in = 4 << 20;
    let mut chats = Vec::new();
    for (i, name) in ["One", "Two", "Three"].iter().enumerate() {
        let chat = common::create_channel(&mut ca, name).await;
        let r = set_icon(&mut ca, &chat, Some(&png_icon(500 << 10, i as u8 + 1))).await;
        assert_eq!(frame_type(&r), "channel.renamed", "{r}");
        chats.push(chat);
    }
    ca.close().await;
    gw.stop_ok();

    let gw = Gateway::start(dir.path(), &[]);
    let (mut ca, ack) = connect(&gw, &a).await;
    let icons = |channels: &Value| {
        channels
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["icon"].is_string())
            .count()
    };
    assert_eq!(icons(&ack["payload"]["channels"]), 1);
    let list = common::channel_list(&mut ca).await;
    assert_eq!(icons(&Value::Array(list)), 1);
    // Clearing an icon shrinks the directory, so it is allowed while it is over.
    let r = set_icon(&mut ca, &chats[0], None).await;
    assert_eq!(frame_type(&r), "channel.renamed", "{r}");
    // Adding one back while it is still over is not.
    let r = set_icon(&mut ca, &chats[0], Some(&png_icon(400 << 10, 9))).await;
    assert_eq!(frame_type(&r), "error", "{r}");
    let r = set_icon(&mut ca, &chats[1], None).await;
    assert_eq!(frame_type(&r), "channel.renamed", "{r}");
    let (_, ack) = connect(&gw, &a).await;
    assert_eq!(icons(&ack["payload"]["channels"]), 1, "one big icon fits");
    assert!(gw
        .stderr_tail()
        .contains("the largest icons are left out of hello.ack"));
}

/// Lock-out 2: five messages of ~250 KB (quotes, which escape to two bytes each) made the
/// default history page too big, so the conversation could no longer be opened. Pages now
/// end early by bytes, say `has_more`, and paging on returns every message.
#[tokio::test]
async fn a_lane_of_big_messages_pages_by_bytes() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "0"]);
    let a = pair(dir.path(), "phone");
    let (b, away_from) = away_tablet(&gw, dir.path()).await;
    let (mut ca, _) = connect(&gw, &a).await;
    for i in 0..5 {
        let text = format!("{i} {}", "\"".repeat(250_000));
        ca.say(&text, common::typing_off).await;
    }
    let id = ca
        .request("history", Some("default"), None, json!({}))
        .await;
    let page = ca.recv_reply(id).await;
    assert_eq!(frame_type(&page), "history", "{}", &page.to_string()[..200]);
    assert_eq!(page["payload"]["has_more"], json!(true));
    let first = page["payload"]["messages"].as_array().unwrap();
    assert!(!first.is_empty() && first.len() < 10, "{}", first.len());
    assert_eq!(
        page["payload"]["oldest_message_id"], first[0]["message_id"],
        "the page names its oldest message"
    );
    let (all, pages) = whole_history(&mut ca, "default", None).await;
    assert_eq!(all.len(), 10, "5 messages and 5 replies");
    assert!(pages >= 3, "{pages} pages");
    for (i, m) in all.iter().step_by(2).enumerate() {
        assert_eq!(m["role"], "user");
        assert_eq!(pstr_of(m, "text").len(), 250_000 + 2, "message {i} intact");
    }

    // The device that was away catches up with sync, frame by frame.
    let (mut cb, _) = connect(&gw, &b).await;
    let replayed = common::sync_from(&mut cb, away_from).await.0;
    let user: Vec<&Value> = replayed
        .iter()
        .filter(|f| frame_type(f) == "message" && f["payload"]["role"] == "user")
        .collect();
    assert_eq!(user.len(), 5, "{}", replayed.len());
}

fn pstr_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// A text whose escaped form would not fit a frame (control characters take six bytes) is
/// refused up front with a clear message, and the socket stays usable.
#[tokio::test]
async fn text_too_big_once_escaped_is_refused_and_nothing_is_lost() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "0"]);
    let a = pair(dir.path(), "phone");
    let (mut ca, _) = connect(&gw, &a).await;
    let text = "\u{1}".repeat(120_000);
    let id = ca.send_text(Some("default"), None, &text).await;
    let r = ca.recv_reply(id).await;
    assert_eq!(frame_type(&r), "error", "{r}");
    assert_eq!(r["payload"]["code"], "unsupported");
    let msg = pstr(&r, "message");
    assert!(
        msg.contains("JSON-escaped") && msg.contains("limits.max_out_frame_bytes"),
        "{msg}"
    );
    ca.say("still here", common::typing_off).await;
}

/// Frames stored too big by an earlier version (a gateway run with larger limits) are
/// replayed by `sync` cut to fit, with a marker, and history cuts such a message too; the
/// writer says so at warn.
#[tokio::test]
async fn frames_stored_too_big_are_replayed_cut_to_fit() {
    let dir = temp_data_dir();
    let big = (4u32 << 20).to_string();
    let mut gw = Gateway::start(
        dir.path(),
        &[
            "--demo-pace-ms",
            "0",
            "--max-out-frame-bytes",
            &big,
            "--max-frame-bytes",
            &big,
        ],
    );
    let a = pair(dir.path(), "phone");
    let (mut ca, ack) = connect(&gw, &a).await;
    ca.max_frame_in = 4 << 20;
    let from = sync_cursor(&ack);
    let text = "\u{1}".repeat(250_000);
    ca.say(&text, common::typing_off).await;
    ca.close().await;
    gw.stop_ok();

    let gw = Gateway::start(dir.path(), &[]);
    let (mut ca, _) = connect(&gw, &a).await;
    let replayed = common::sync_from(&mut ca, from).await.0;
    let echo = replayed
        .iter()
        .find(|f| frame_type(f) == "message" && f["payload"]["role"] == "user")
        .expect("the echo is replayed");
    let cut = pstr(echo, "text");
    assert!(cut.starts_with("\u{1}\u{1}") && cut.contains("more bytes cut"));
    assert!(gw.stderr_tail().contains("sent cut to fit"));
    let (all, _) = whole_history(&mut ca, "default", None).await;
    let user = all.iter().find(|m| m["role"] == "user").unwrap();
    assert!(pstr_of(user, "text").contains("more bytes cut"));
    // The connection is still usable after both.
    ca.say("after", common::typing_off).await;
}

/// Lock-out 3: an agent streaming ~400 KB of control characters (under the raw reply cut)
/// produced ~2.4 MB `message.update` / `message.stop` frames: live devices were dropped and a
/// device that was away was dropped at that stored frame on every sync. Agent text is now cut
/// by its encoded size.
#[tokio::test]
async fn an_agent_reply_of_control_characters_stays_within_frames() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = Gateway::start(
        dir.path(),
        &["--agent", "openai", "--agent-url", &llm.url()],
    );
    let a = pair(dir.path(), "phone");
    let (b, away_from) = away_tablet(&gw, dir.path()).await;
    let (mut ca, _) = connect(&gw, &a).await;
    let frames = ca
        .say("[[escape]]", |f| frame_type(f) == "message.stop")
        .await;
    let updates = frames
        .iter()
        .filter(|f| frame_type(f) == "message.update")
        .count();
    assert!(updates > 0);
    let stop = frames.last().unwrap();
    let final_text = pstr(stop, "final_text");
    assert!(final_text.ends_with("[reply cut: longer than the gateway keeps]"));
    assert!(final_text.len() > 100_000, "{}", final_text.len());
    assert!(!pstr(stop, "reasoning").is_empty());
    let encoded = stop.to_string().len();
    assert!(encoded <= APP_MAX_FRAME_BYTES, "{encoded}");
    // Still connected and answered.
    let id = ca.request("ping", None, None, json!({ "ts": 1 })).await;
    assert_eq!(frame_type(&ca.recv_reply(id).await), "pong");

    let (mut cb, _) = connect(&gw, &b).await;
    let replayed = common::sync_from(&mut cb, away_from).await.0;
    let stop = replayed
        .iter()
        .find(|f| frame_type(f) == "message.stop")
        .expect("message.stop replayed");
    assert_eq!(pstr(stop, "final_text"), final_text);
    let (all, _) = whole_history(&mut cb, "default", None).await;
    assert_eq!(all.len(), 2);
    assert!(
        !gw.stderr_tail().contains("sent cut to fit"),
        "the producer cut it, not the writer"
    );
}

/// Search hits carry a snippet around the matching word, and a "word" can be a whole message
/// of letters: 100 such hits still fit one `search.results`.
#[tokio::test]
async fn search_results_of_long_words_fit() {
    let dir = temp_data_dir();
    let gw = Gateway::start(
        dir.path(),
        &["--demo-pace-ms", "0", "--max-text-bytes", "262144"],
    );
    let a = pair(dir.path(), "phone");
    let (mut ca, _) = connect(&gw, &a).await;
    let word = format!("zebra{}", "a".repeat(60_000));
    for _ in 0..20 {
        ca.say(&word, common::typing_off).await;
    }
    let id = ca
        .request(
            "search",
            None,
            None,
            json!({ "query": "zebra", "limit": 100 }),
        )
        .await;
    let r = ca.recv_reply(id).await;
    assert_eq!(
        frame_type(&r),
        "search.results",
        "{}",
        &r.to_string()[..200]
    );
    let hits = r["payload"]["hits"].as_array().unwrap();
    assert!(hits.len() >= 20, "{}", hits.len());
    for h in hits {
        assert!(h["snippet"].as_str().unwrap().len() <= 1024);
    }
}

/// The writer's safety net, frame type by frame type: each server→app frame the gateway can
/// write, built with inputs far past every producer's budget (megabytes of control characters,
/// tens of thousands of entries), comes out of the cut under 1 MiB and still valid by the
/// schema. Together with the producer tests above this is the bound for every frame type;
/// the list is checked against the schema's, so a new frame type cannot be forgotten.
#[test]
fn every_frame_type_is_cut_to_fit_and_stays_valid() {
    use iris_gateway::protocol::{
        fit, Channel, ChannelKind, ErrorCode, Frame, HealthState, HistoryMessage, MediaRef, Role,
        Runtime, SearchScope, ServerCaps, TodoItem, TodoStatus,
    };
    let huge = "\u{1}\"\\x".repeat(100_000);
    // For fields repeated in many entries: big enough together, small enough to hold.
    let mid = "\u{1}\"\\x".repeat(1_000);
    let media = |i: usize| MediaRef {
        media_id: format!("med_{i}"),
        kind: "image".into(),
        mime: "image/png".into(),
        size: 1,
        filename: mid.clone(),
        message_id: Some("msg_1".into()),
    };
    let message = |i: usize| HistoryMessage {
        message_id: format!("msg_{i}"),
        role: Role::Assistant,
        text: if i == 1 { huge.clone() } else { mid.clone() },
        reasoning: Some(mid.clone()),
        model: Some(mid.clone()),
        tokens: Some(1),
        runtime: Some(Runtime {
            cwd: Some(mid.clone()),
            ..Runtime::default()
        }),
        ts: 1,
        media: (0..10).map(media).collect(),
        steer: false,
    };
    let mut channel = Channel::new("chan_1".into(), mid.clone(), ChannelKind::Channel, None);
    channel.icon = Some(mid.clone());
    let channels: Vec<Channel> = (0..500).map(|_| channel.clone()).collect();
    let caps = ServerCaps {
        streaming: true,
        reasoning: true,
        tools: true,
        media: true,
        search: true,
        push: "ntfy",
        push_ntfy_server: huge.clone(),
        pickers: true,
        extensions: iris_gateway::protocol::EXTENSIONS,
    };
    let ids: Vec<String> = (0..100_000).map(|i| format!("msg_{i}")).collect();
    let todos: Vec<TodoItem> = (0..20_000)
        .map(|i| TodoItem {
            id: format!("t{i}"),
            content: huge[..64].to_owned(),
            status: TodoStatus::Pending,
        })
        .collect();
    let hits = Value::Array(
        (0..1000)
            .map(|i| json!({"message_id": format!("msg_{i}"), "chat_id": "default", "thread_id": null, "role": "user", "snippet": mid, "ts": 1}))
            .collect(),
    );
    let big_args = json!({ "command": huge, "list": (0..100_000).collect::<Vec<u32>>() });
    let catalog = Value::Array(
        (0..50_000)
            .map(|i| json!({"name": format!("/c{i}"), "description": "d", "args_hint": "", "category": "x"}))
            .collect(),
    );
    let choices = Value::Array(
        (0..50_000)
            .map(|i| json!({"value": format!("v{i}"), "label": huge[..40], "is_current": false}))
            .collect(),
    );
    let history: Vec<HistoryMessage> = (0..200).map(message).collect();
    let frames = vec![
        Frame::hello_ack(Some(1), &caps, 1, 1, &channels),
        // The `agent.busy` extension's lanes, in the form a device that asked for it gets.
        Frame::hello_ack(Some(1), &caps, 1, 1, &channels).with_busy_lanes(
            (0..64)
                .map(|i| iris_gateway::protocol::LaneRef {
                    chat_id: format!("chan_{i}"),
                    thread_id: Some(format!("thr_{i}")),
                })
                .collect(),
        ),
        Frame::hello_ack(Some(1), &caps, 1, 1, &channels).with_read_lanes(
            (0..500)
                .map(|i| iris_gateway::protocol::LaneRead {
                    chat_id: format!("chan_{i}"),
                    thread_id: Some(format!("thr_{i}")),
                    message_id: format!("msg_{i}"),
                })
                .collect(),
        ),
        Frame::agent_busy(true),
        Frame::agent_busy(false),
        Frame::read_marker("msg_1"),
        Frame::message(&message(1)),
        Frame::message_start("msg_1"),
        Frame::message_update("msg_1", &huge),
        Frame::message_update_append("msg_1", &huge, 1 << 40),
        Frame::message_stop(&message(1)),
        Frame::message_deleted(Some(1), &ids),
        Frame::commentary("msg_1", &huge),
        Frame::tool_start(0, &huge, &huge, &big_args, Some(&huge)),
        Frame::tool_progress(0, &huge, &huge),
        Frame::tool_end(0, &huge, true, 1.0, &huge),
        Frame::todo_update(&todos),
        Frame::typing(true),
        Frame::notification("generic", &huge, &huge, 1),
        Frame::channel_list(Some(1), &channels),
        Frame::channel_entry("channel.created", &channel),
        Frame::channel_entry("channel.renamed", &channel),
        Frame::channel_deleted("chan_1"),
        Frame::search_results(Some(1), &huge, SearchScope::All, hits),
        Frame::media_offer(&media(1)),
        Frame::read_receipt(Some(1), "msg_1"),
        Frame::status(HealthState::Online),
        Frame::error(Some(1), ErrorCode::Internal, huge.clone()),
        Frame::pong(Some(1), 1),
        Frame::sync_done(Some(1), 1),
        Frame::history(Some(1), &history, true, Some("msg_0")),
        Frame::media_pull_end(Some(1), true),
        Frame::media_upload_ack(Some(1), true, "ref_1"),
        Frame::commands_catalog(Some(1), catalog),
        Frame::picker_choice("pick_1", &huge, choices),
    ];
    let schema = common::Schema::load();
    let mut covered: Vec<String> = Vec::new();
    for f in frames.iter().map(|f| f.clone().in_lane("default", None)) {
        let encoded = f.encode();
        let cut = fit::shrink_encoded(&encoded, APP_MAX_FRAME_BYTES)
            .unwrap_or_else(|| panic!("{} could not be cut to fit", f.kind()));
        assert!(
            cut.len() <= APP_MAX_FRAME_BYTES,
            "{}: {}",
            f.kind(),
            cut.len()
        );
        let v: Value = serde_json::from_slice(&cut).unwrap();
        if let Err(e) = schema.validate_server_frame(&v) {
            panic!("{} cut to fit is not valid: {e}", f.kind());
        }
        // A replayed frame carries a cursor too; it must fit just the same.
        let replay = iris_gateway::protocol::with_cursor(&encoded, u64::MAX);
        let cut = fit::shrink_encoded(&replay, APP_MAX_FRAME_BYTES).unwrap();
        assert!(cut.len() <= APP_MAX_FRAME_BYTES, "{} replayed", f.kind());
        covered.push(f.kind().to_owned());
    }
    let mut missing: Vec<String> = schema
        .server_frame_names()
        .into_iter()
        .filter(|n| !covered.contains(n))
        .collect();
    missing.sort();
    assert!(missing.is_empty(), "frame types not checked: {missing:?}");
}
