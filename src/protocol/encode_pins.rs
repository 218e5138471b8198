//! Pins the exact bytes of every server→app frame type, so a change to the frame types or the
//! encoder cannot reorder a key, rename a field or drop an optional one unnoticed.

use serde_json::json;

use super::*;

fn message(role: Role, full: bool) -> HistoryMessage {
    HistoryMessage {
        message_id: "msg_1".into(),
        role,
        text: "hi \"there\"\n".into(),
        reasoning: full.then(|| "because".into()),
        model: full.then(|| "m-1".into()),
        tokens: full.then_some(7),
        runtime: full.then(|| Runtime {
            model: Some("m-1".into()),
            context_pct: Some(12),
            cwd: None,
            latency: Some(1.5),
            cost: None,
        }),
        ts: 1700,
        media: if full { vec![media()] } else { vec![] },
        steer: false,
    }
}

fn media() -> MediaRef {
    MediaRef {
        media_id: "med_1".into(),
        kind: "image".into(),
        mime: "image/png".into(),
        size: 42,
        filename: "a.png".into(),
        message_id: Some("msg_1".into()),
    }
}

fn channel() -> Channel {
    let mut c = Channel::new(
        "chan_1".into(),
        "Work".into(),
        ChannelKind::Thread,
        Some("default".into()),
    );
    c.auto = true;
    c.icon = Some("🌱".into());
    c
}

fn caps() -> ServerCaps {
    ServerCaps {
        streaming: true,
        reasoning: true,
        tools: true,
        media: false,
        search: true,
        push: "ntfy",
        push_ntfy_server: "https://ntfy.sh".into(),
        pickers: true,
        extensions: &["update_append"],
    }
}

/// One frame per constructor (and per optional-field shape), named for the failure message, in
/// the order of `PINNED`.
pub(super) fn samples() -> Vec<(&'static str, Frame)> {
    let mut all = session_and_directory();
    all.extend(conversation());
    all.extend(answers_and_media());
    all
}

/// Connection state and the channel directory.
fn session_and_directory() -> Vec<(&'static str, Frame)> {
    vec![
        (
            "error",
            Frame::error(Some(3), ErrorCode::RateLimited, "slow down"),
        ),
        ("pong", Frame::pong(Some(2), 99)),
        ("status", Frame::status(HealthState::Degraded)),
        (
            "hello.ack",
            Frame::hello_ack(Some(1), &caps(), 5, 4, &[channel()]),
        ),
        (
            "hello.ack busy lanes",
            Frame::hello_ack(Some(1), &caps(), 5, 4, &[]).with_busy_lanes(vec![
                LaneRef {
                    chat_id: "default".into(),
                    thread_id: None,
                },
                LaneRef {
                    chat_id: "chan_1".into(),
                    thread_id: Some("thr_1".into()),
                },
            ]),
        ),
        ("channel.list", Frame::channel_list(Some(6), &[channel()])),
        (
            "channel.created",
            Frame::channel_entry("channel.created", &channel()),
        ),
        (
            "channel.renamed",
            Frame::channel_entry("channel.renamed", &channel()).reply_to(Some(8)),
        ),
        ("channel.deleted", Frame::channel_deleted("chan_1")),
        ("read.receipt", Frame::read_receipt(Some(9), "msg_1")),
    ]
}

/// What a turn streams into a lane.
fn conversation() -> Vec<(&'static str, Frame)> {
    vec![
        (
            "message user",
            Frame::message(&message(Role::User, false)).in_lane("default", Some("thr_1")),
        ),
        (
            "message full",
            Frame::message(&message(Role::Assistant, true)).in_lane("default", None),
        ),
        ("typing", Frame::typing(false)),
        (
            "read.marker",
            Frame::read_marker("msg_1").in_lane("default", Some("thr_1")),
        ),
        (
            "hello.ack read lanes",
            Frame::hello_ack(Some(1), &caps(), 5, 4, &[]).with_read_lanes(vec![LaneRead {
                chat_id: "default".into(),
                thread_id: None,
                message_id: "msg_1".into(),
            }]),
        ),
        (
            "agent.busy",
            Frame::agent_busy(true).in_lane("default", Some("thr_1")),
        ),
        (
            "agent.idle",
            Frame::agent_busy(false).in_lane("default", None),
        ),
        ("message.start", Frame::message_start("msg_1")),
        ("message.update", Frame::message_update("msg_1", "partial")),
        (
            "message.update append",
            Frame::message_update_append("msg_1", "partial", 0).in_lane("default", None),
        ),
        (
            "message.update append named",
            Frame::message_update_append("msg_1", " more", 7),
        ),
        (
            "message.update append continued",
            Frame::message_update_continued(" more", 7),
        ),
        (
            "message.stop bare",
            Frame::message_stop(&message(Role::Assistant, false)),
        ),
        (
            "message.stop full",
            Frame::message_stop(&message(Role::Assistant, true)).in_lane("c", Some("t")),
        ),
        ("commentary", Frame::commentary("msg_1", "thinking")),
        (
            "tool.start",
            Frame::tool_start(0, "bash", "ls", &json!({"z": 1, "a": [true]}), Some("🔧")),
        ),
        (
            "tool.start plain",
            Frame::tool_start(1, "read", "", &json!(null), None),
        ),
        ("tool.progress", Frame::tool_progress(0, "bash", "50%")),
        ("tool.end", Frame::tool_end(0, "bash", false, 0.25, "out")),
        (
            "notification",
            Frame::notification("approval", "Approve?", "rm -rf", 1700),
        ),
    ]
}

/// Answers to requests, agent todos and media.
fn answers_and_media() -> Vec<(&'static str, Frame)> {
    let todos = vec![TodoItem {
        id: "t1".into(),
        content: "write".into(),
        status: TodoStatus::InProgress,
    }];
    vec![
        (
            "commands.catalog",
            Frame::commands_catalog(
                Some(4),
                json!([{"name": "/new", "description": "d", "args_hint": "", "category": "x"}]),
            ),
        ),
        (
            "picker.choice",
            Frame::picker_choice(
                "pick_1",
                "Model",
                json!([{"value": "a", "label": "A", "is_current": true}]),
            ),
        ),
        ("todo.update", Frame::todo_update(&todos)),
        (
            "media.upload.ack",
            Frame::media_upload_ack(Some(5), true, "ref_1"),
        ),
        ("media.pull.end", Frame::media_pull_end(Some(5), false)),
        ("media.offer", Frame::media_offer(&media())),
        (
            "message.deleted",
            Frame::message_deleted(Some(7), &["msg_1".into(), "msg_2".into()]),
        ),
        (
            "search.results",
            Frame::search_results(
                Some(10),
                "q",
                SearchScope::Chat,
                json!([{"message_id": "msg_1", "snippet": "s", "ts": 1}]),
            ),
        ),
        ("sync.done", Frame::sync_done(Some(11), 12)),
        (
            "history",
            Frame::history(
                Some(12),
                &[
                    message(Role::User, false),
                    message(Role::System, false),
                    message(Role::Cron, true),
                ],
                true,
                Some("msg_0"),
            ),
        ),
        ("history empty", Frame::history(None, &[], false, None)),
    ]
}

/// Today's encodings, captured from the untyped encoder this module replaced.
const PINNED: &[(&str, &str)] = &[
    (
        "error",
        r#"{"v":1,"id":3,"type":"error","payload":{"code":"rate_limited","message":"slow down"}}"#,
    ),
    (
        "pong",
        r#"{"v":1,"id":2,"type":"pong","payload":{"ts":99}}"#,
    ),
    (
        "status",
        r#"{"v":1,"type":"status","payload":{"state":"degraded"}}"#,
    ),
    (
        "hello.ack",
        r#"{"v":1,"id":1,"type":"hello.ack","payload":{"channels":[{"archived":false,"auto":true,"automation":false,"chat_id":"chan_1","color":null,"favorite":false,"icon":"🌱","is_default":false,"kind":"thread","name":"Work","parent_chat_id":"default"}],"last_pushed_cursor":4,"server_caps":{"extensions":["update_append"],"media":false,"pickers":true,"push":"ntfy","push_ntfy_server":"https://ntfy.sh","reasoning":true,"search":true,"streaming":true,"tools":true},"sync_cursor":5}}"#,
    ),
    (
        "hello.ack busy lanes",
        r#"{"v":1,"id":1,"type":"hello.ack","payload":{"agent_busy":[{"chat_id":"default"},{"chat_id":"chan_1","thread_id":"thr_1"}],"channels":[],"last_pushed_cursor":4,"server_caps":{"extensions":["update_append"],"media":false,"pickers":true,"push":"ntfy","push_ntfy_server":"https://ntfy.sh","reasoning":true,"search":true,"streaming":true,"tools":true},"sync_cursor":5}}"#,
    ),
    (
        "channel.list",
        r#"{"v":1,"id":6,"type":"channel.list","payload":{"channels":[{"archived":false,"auto":true,"automation":false,"chat_id":"chan_1","color":null,"favorite":false,"icon":"🌱","is_default":false,"kind":"thread","name":"Work","parent_chat_id":"default"}]}}"#,
    ),
    (
        "channel.created",
        r#"{"v":1,"type":"channel.created","payload":{"archived":false,"auto":true,"automation":false,"chat_id":"chan_1","color":null,"favorite":false,"icon":"🌱","is_default":false,"kind":"thread","name":"Work","parent_chat_id":"default"}}"#,
    ),
    (
        "channel.renamed",
        r#"{"v":1,"id":8,"type":"channel.renamed","payload":{"archived":false,"auto":true,"automation":false,"chat_id":"chan_1","color":null,"favorite":false,"icon":"🌱","is_default":false,"kind":"thread","name":"Work","parent_chat_id":"default"}}"#,
    ),
    (
        "channel.deleted",
        r#"{"v":1,"type":"channel.deleted","payload":{"chat_id":"chan_1"}}"#,
    ),
    (
        "read.receipt",
        r#"{"v":1,"id":9,"type":"read.receipt","payload":{"message_id":"msg_1"}}"#,
    ),
    (
        "message user",
        r#"{"v":1,"type":"message","chat_id":"default","thread_id":"thr_1","payload":{"media":[],"message_id":"msg_1","role":"user","text":"hi \"there\"\n","ts":1700}}"#,
    ),
    (
        "message full",
        r#"{"v":1,"type":"message","chat_id":"default","payload":{"media":[{"filename":"a.png","kind":"image","media_id":"med_1","message_id":"msg_1","mime":"image/png","size":42}],"message_id":"msg_1","model":"m-1","reasoning":"because","role":"assistant","runtime":{"context_pct":12,"latency":1.5,"model":"m-1"},"text":"hi \"there\"\n","tokens":7,"ts":1700}}"#,
    ),
    (
        "typing",
        r#"{"v":1,"type":"typing","payload":{"on":false}}"#,
    ),
    (
        "read.marker",
        r#"{"v":1,"type":"read.marker","chat_id":"default","thread_id":"thr_1","payload":{"message_id":"msg_1"}}"#,
    ),
    (
        "hello.ack read lanes",
        r#"{"v":1,"id":1,"type":"hello.ack","payload":{"channels":[],"last_pushed_cursor":4,"read":[{"chat_id":"default","message_id":"msg_1"}],"server_caps":{"extensions":["update_append"],"media":false,"pickers":true,"push":"ntfy","push_ntfy_server":"https://ntfy.sh","reasoning":true,"search":true,"streaming":true,"tools":true},"sync_cursor":5}}"#,
    ),
    (
        "agent.busy",
        r#"{"v":1,"type":"agent.busy","chat_id":"default","thread_id":"thr_1","payload":{}}"#,
    ),
    (
        "agent.idle",
        r#"{"v":1,"type":"agent.idle","chat_id":"default","payload":{}}"#,
    ),
    (
        "message.start",
        r#"{"v":1,"type":"message.start","payload":{"message_id":"msg_1","role":"assistant"}}"#,
    ),
    (
        "message.update",
        r#"{"v":1,"type":"message.update","payload":{"message_id":"msg_1","text":"partial"}}"#,
    ),
    (
        "message.update append",
        r#"{"v":1,"type":"message.update","chat_id":"default","payload":{"append_at":0,"message_id":"msg_1","text":"partial"}}"#,
    ),
    (
        "message.update append named",
        r#"{"v":1,"type":"message.update","payload":{"append_at":7,"message_id":"msg_1","text":" more"}}"#,
    ),
    (
        "message.update append continued",
        r#"{"v":1,"type":"message.update","payload":{"append_at":7,"text":" more"}}"#,
    ),
    (
        "message.stop bare",
        r#"{"v":1,"type":"message.stop","payload":{"final_text":"hi \"there\"\n","message_id":"msg_1","runtime":{},"ts":1700}}"#,
    ),
    (
        "message.stop full",
        r#"{"v":1,"type":"message.stop","chat_id":"c","thread_id":"t","payload":{"final_text":"hi \"there\"\n","message_id":"msg_1","model":"m-1","reasoning":"because","runtime":{"context_pct":12,"latency":1.5,"model":"m-1"},"tokens":7,"ts":1700}}"#,
    ),
    (
        "commentary",
        r#"{"v":1,"type":"commentary","payload":{"message_id":"msg_1","text":"thinking"}}"#,
    ),
    (
        "tool.start",
        r#"{"v":1,"type":"tool.start","payload":{"args":{"a":[true],"z":1},"emoji":"🔧","index":0,"name":"bash","preview":"ls"}}"#,
    ),
    (
        "tool.start plain",
        r#"{"v":1,"type":"tool.start","payload":{"args":null,"index":1,"name":"read","preview":""}}"#,
    ),
    (
        "tool.progress",
        r#"{"v":1,"type":"tool.progress","payload":{"index":0,"name":"bash","note":"50%"}}"#,
    ),
    (
        "tool.end",
        r#"{"v":1,"type":"tool.end","payload":{"duration":0.25,"index":0,"name":"bash","ok":false,"output_preview":"out"}}"#,
    ),
    (
        "notification",
        r#"{"v":1,"type":"notification","payload":{"body":"rm -rf","kind":"approval","title":"Approve?","ts":1700}}"#,
    ),
    (
        "commands.catalog",
        r#"{"v":1,"id":4,"type":"commands.catalog","payload":{"commands":[{"args_hint":"","category":"x","description":"d","name":"/new"}]}}"#,
    ),
    (
        "picker.choice",
        r#"{"v":1,"type":"picker.choice","payload":{"choices":[{"is_current":true,"label":"A","value":"a"}],"picker_id":"pick_1","title":"Model"}}"#,
    ),
    (
        "todo.update",
        r#"{"v":1,"type":"todo.update","payload":{"todos":[{"content":"write","id":"t1","status":"in_progress"}]}}"#,
    ),
    (
        "media.upload.ack",
        r#"{"v":1,"id":5,"type":"media.upload.ack","payload":{"media_ref":"ref_1","ok":true}}"#,
    ),
    (
        "media.pull.end",
        r#"{"v":1,"id":5,"type":"media.pull.end","payload":{"ok":false}}"#,
    ),
    (
        "media.offer",
        r#"{"v":1,"type":"media.offer","payload":{"filename":"a.png","kind":"image","media_id":"med_1","message_id":"msg_1","mime":"image/png","size":42}}"#,
    ),
    (
        "message.deleted",
        r#"{"v":1,"id":7,"type":"message.deleted","payload":{"message_ids":["msg_1","msg_2"]}}"#,
    ),
    (
        "search.results",
        r#"{"v":1,"id":10,"type":"search.results","payload":{"hits":[{"message_id":"msg_1","snippet":"s","ts":1}],"query":"q","scope":"chat"}}"#,
    ),
    (
        "sync.done",
        r#"{"v":1,"id":11,"type":"sync.done","payload":{"cursor":12}}"#,
    ),
    (
        "history",
        r#"{"v":1,"id":12,"type":"history","payload":{"has_more":true,"messages":[{"media":[],"message_id":"msg_1","role":"user","text":"hi \"there\"\n","ts":1700},{"media":[],"message_id":"msg_1","role":"assistant","text":"hi \"there\"\n","ts":1700},{"media":[{"filename":"a.png","kind":"image","media_id":"med_1","message_id":"msg_1","mime":"image/png","size":42}],"message_id":"msg_1","model":"m-1","reasoning":"because","role":"assistant","runtime":{"context_pct":12,"latency":1.5,"model":"m-1"},"text":"hi \"there\"\n","tokens":7,"ts":1700}],"oldest_message_id":"msg_0"}}"#,
    ),
    (
        "history empty",
        r#"{"v":1,"type":"history","payload":{"has_more":false,"messages":[]}}"#,
    ),
];

const PINNED_REPLY_TO: &str = r#"{"v":1,"type":"message","chat_id":"default","payload":{"media":[],"message_id":"msg_1","reply_to":"msg_0","role":"user","text":"hi \"there\"\n","ts":1700}}"#;

#[test]
fn every_frame_encodes_exactly_as_pinned() {
    let samples = samples();
    assert_eq!(samples.len(), PINNED.len());
    for ((name, frame), (pinned_name, pinned)) in samples.iter().zip(PINNED) {
        assert_eq!(name, pinned_name);
        let encoded = frame.encode();
        assert_eq!(std::str::from_utf8(&encoded).unwrap(), *pinned, "{name}");
    }
}

#[test]
fn every_frame_type_is_pinned() {
    let mut kinds: Vec<&str> = samples().iter().map(|(_, f)| f.kind()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds.len(), 32, "{kinds:?}");
}

#[test]
fn the_echo_carries_the_message_it_answers() {
    let echo = Frame::message(&message(Role::User, false))
        .with_reply_to(Some("msg_0"))
        .in_lane("default", None);
    assert_eq!(
        std::str::from_utf8(&echo.encode()).unwrap(),
        PINNED_REPLY_TO
    );
    let plain = Frame::message(&message(Role::User, false)).with_reply_to(None);
    assert!(!std::str::from_utf8(&plain.encode())
        .unwrap()
        .contains("reply_to"));
}

/// `agent.steer`'s mark on a user message, in the payload's key order; absent otherwise (the
/// other pins have none).
const PINNED_STEER: &str = r#"{"v":1,"type":"message","chat_id":"default","payload":{"media":[],"message_id":"msg_1","role":"user","steer":true,"text":"hi \"there\"\n","ts":1700}}"#;

#[test]
fn a_steering_message_is_marked() {
    let steer = HistoryMessage {
        steer: true,
        ..message(Role::User, false)
    };
    let echo = Frame::message(&steer).in_lane("default", None);
    assert_eq!(std::str::from_utf8(&echo.encode()).unwrap(), PINNED_STEER);
}
