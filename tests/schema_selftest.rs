//! Proves the derived validators in `common` actually reject what they must; a validator that
//! accepts everything would make every other integration test meaningless.

mod common;

use common::Schema;
use serde_json::{json, Value};

fn schema() -> &'static Schema {
    Schema::load()
}

fn message_frame() -> Value {
    json!({
        "v": 1,
        "type": "message",
        "chat_id": "default",
        "payload": {
            "message_id": "m_1",
            "role": "assistant",
            "text": "hello",
            "reasoning": "thinking",
            "model": "demo",
            "tokens": 12,
            "runtime": { "model": "demo", "context_pct": 3, "cwd": "~", "latency": 0.25, "cost": 0.0 },
            "media": [{ "media_id": "md_1", "kind": "image", "mime": "image/png", "size": 10 }],
            "ts": 1_700_000_000_000_i64
        }
    })
}

fn full_channel() -> Value {
    json!({
        "chat_id": "chan_7",
        "name": "Projects",
        "kind": "channel",
        "parent_chat_id": null,
        "is_default": false,
        "archived": false,
        "auto": false,
        "favorite": true,
        "icon": null,
        "color": "#336699",
        "automation": false
    })
}

#[track_caller]
fn assert_server_ok(frame: &Value) {
    if let Err(e) = schema().validate_server_frame(frame) {
        panic!("expected valid, got:\n{e}");
    }
}

#[track_caller]
fn assert_server_err(frame: &Value, what: &str) {
    match schema().validate_server_frame(frame) {
        Ok(()) => panic!("{what}: expected a schema violation, frame passed: {frame}"),
        Err(e) => assert!(
            e.contains(&frame.to_string()),
            "error must quote the frame: {e}"
        ),
    }
}

#[test]
fn well_formed_message_passes() {
    assert_server_ok(&message_frame());
}

#[test]
fn message_violations_fail() {
    let mut f = message_frame();
    f["payload"]["colour"] = json!("red");
    assert_server_err(&f, "unknown payload field");

    let mut f = message_frame();
    f["v"] = json!(2);
    assert_server_err(&f, "v: 2");

    let mut f = message_frame();
    f["payload"]["ts"] = json!("yesterday");
    assert_server_err(&f, "ts as string");

    let mut f = message_frame();
    f["payload"]["role"] = json!("robot");
    assert_server_err(&f, "unknown role");

    let mut f = message_frame();
    f["extra"] = json!(1);
    assert_server_err(&f, "unknown envelope field");

    let mut f = message_frame();
    f["payload"]["runtime"]["gpu"] = json!("none");
    assert_server_err(&f, "unknown field in message.runtime");

    let mut f = message_frame();
    f["payload"]["media"][0]["url"] = json!("http://x");
    assert_server_err(&f, "unknown field in media_ref");
}

#[test]
fn violations_are_listed_with_pointers() {
    let mut f = message_frame();
    f["payload"]["ts"] = json!("yesterday");
    f["payload"]["role"] = json!("robot");
    let e = schema().validate_server_frame(&f).unwrap_err();
    assert!(e.contains("/payload/ts"), "{e}");
    assert!(e.contains("/payload/role"), "{e}");
}

#[test]
fn unknown_frame_type_fails() {
    let mut f = message_frame();
    f["type"] = json!("message.exploded");
    assert_server_err(&f, "unknown server frame type");
    // Planned frames are not part of the protocol yet.
    assert_server_err(
        &json!({ "v": 1, "type": "picker.model", "payload": {} }),
        "planned frame",
    );
    // A client frame type is not a server frame.
    assert_server_err(
        &json!({ "v": 1, "type": "ping", "payload": { "ts": 1 } }),
        "client-only type",
    );
    assert_server_err(&json!({ "v": 1, "payload": {} }), "missing type");
}

#[test]
fn strict_channel_entries_in_hello_ack() {
    let ack = json!({
        "v": 1,
        "type": "hello.ack",
        "id": 1,
        "payload": {
            "server_caps": { "streaming": true, "reasoning": true, "tools": true, "media": true,
                             "search": true, "push": "none", "push_ntfy_server": "", "pickers": true },
            "sync_cursor": 0,
            "last_pushed_cursor": 0,
            "channels": [full_channel()]
        }
    });
    assert_server_ok(&ack);

    let mut bad = ack.clone();
    bad["payload"]["channels"][0]["unread"] = json!(3);
    assert_server_err(&bad, "unknown field inside a channel entry");

    let mut bad = ack;
    bad["payload"]["channels"][0]["kind"] = json!("dm");
    assert_server_err(&bad, "unknown channel kind");
}

#[test]
fn strict_runtime_in_message_stop() {
    let stop = json!({
        "v": 1,
        "type": "message.stop",
        "chat_id": "default",
        "payload": { "message_id": "m_2", "final_text": "done", "runtime": { "model": "demo", "latency": 1.5 }, "ts": 5 }
    });
    assert_server_ok(&stop);
    let mut bad = stop;
    bad["payload"]["runtime"]["tokens_per_s"] = json!(42);
    assert_server_err(&bad, "unknown field inside message.stop.runtime");
}

#[test]
fn ref_payloads_are_the_definition() {
    let created = json!({ "v": 1, "type": "channel.created", "payload": full_channel() });
    assert_server_ok(&created);
    let renamed = json!({ "v": 1, "type": "channel.renamed", "id": 9, "payload": full_channel() });
    assert_server_ok(&renamed);

    let mut bad = created;
    bad["payload"]["members"] = json!([]);
    assert_server_err(&bad, "unknown field in channel.created payload");

    let offer = json!({ "v": 1, "type": "media.offer", "payload": {
        "media_id": "md_9", "kind": "voice", "mime": "audio/ogg", "size": 99, "filename": "a.ogg", "message_id": "m_3"
    }});
    assert_server_ok(&offer);
    let mut bad = offer;
    bad["payload"]["kind"] = json!("hologram");
    assert_server_err(&bad, "unknown media kind");
}

#[test]
fn free_objects_stay_free() {
    let start = json!({ "v": 1, "type": "tool.start", "payload": {
        "index": 0, "name": "terminal", "preview": "ls", "emoji": "💻",
        "args": { "command": "ls -la", "nested": { "anything": [1, 2, 3] } }
    }});
    assert_server_ok(&start);
    let mut bad = start;
    bad["payload"]["args"] = json!("ls");
    assert_server_err(&bad, "args must be an object");
}

#[test]
fn inner_array_items_are_strict() {
    let todos = json!({ "v": 1, "type": "todo.update", "payload": { "todos": [
        { "id": "t1", "content": "write tests", "status": "in_progress" }
    ]}});
    assert_server_ok(&todos);
    let mut bad = todos;
    bad["payload"]["todos"][0]["priority"] = json!("high");
    assert_server_err(&bad, "unknown field in a todo item");

    let hits = json!({ "v": 1, "type": "search.results", "id": 3, "payload": {
        "query": "x", "scope": "all",
        "hits": [{ "message_id": "m", "chat_id": "default", "thread_id": null, "role": "user", "snippet": "x", "ts": 1 }]
    }});
    assert_server_ok(&hits);
    let mut bad = hits;
    bad["payload"]["hits"][0]["score"] = json!(0.5);
    assert_server_err(&bad, "unknown field in a search hit");
}

#[test]
fn error_code_enum_is_enforced() {
    let ok = json!({ "v": 1, "type": "error", "id": 4, "payload": { "code": "not_found", "message": "no such chat" } });
    assert_server_ok(&ok);
    let bad = json!({ "v": 1, "type": "error", "id": 4, "payload": { "code": "bad_request", "message": "?" } });
    assert_server_err(&bad, "error code outside the enum");
}

#[test]
fn empty_payloads_allow_nothing() {
    let s = schema();
    let ok =
        json!({ "v": 1, "type": "channel.list", "id": 2, "chat_id": "default", "payload": {} });
    s.validate_client_frame(&ok).unwrap();
    let bad = json!({ "v": 1, "type": "channel.list", "id": 2, "payload": { "all": true } });
    assert!(s.validate_client_frame(&bad).is_err());
}

#[test]
fn client_frames_are_checked_too() {
    let s = schema();
    let hello = json!({ "v": 1, "type": "hello", "id": 1, "payload": {
        "token": "t", "device_id": "d", "device_name": "n", "caps": { "min_protocol": 1, "media": true, "push": "none" }
    }});
    s.validate_client_frame(&hello).unwrap();
    let mut bad = hello.clone();
    bad["payload"]["password"] = json!("x");
    assert!(s.validate_client_frame(&bad).is_err());
    let mut bad = hello;
    bad["id"] = json!("1");
    assert!(s.validate_client_frame(&bad).is_err());
    // Server-only frame types are not valid from the app.
    assert!(s
        .validate_client_frame(&json!({ "v": 1, "type": "pong", "payload": { "ts": 1 } }))
        .is_err());
}

#[test]
fn frame_counts_and_reliability() {
    let s = schema();
    // v1's 29, and `agent.busy`, `agent.idle`, `read.marker` from the extensions file.
    assert_eq!(
        s.server_frame_names().len(),
        32,
        "{:?}",
        s.server_frame_names()
    );
    // v1's 21, and `read.receipt` and `agent.steer` from the extensions file.
    assert_eq!(
        s.client_frame_names().len(),
        23,
        "{:?}",
        s.client_frame_names()
    );
    assert!(s.never_dropped().iter().any(|n| n == "message.stop"));
    assert!(s.is_never_dropped("channel.renamed"));
    assert!(!s.is_never_dropped("message.update"));
    assert_eq!(s.coalescable(), vec!["message.update", "tool.progress"]);
    for name in s.never_dropped().iter().chain(&s.coalescable()) {
        assert!(
            s.server_frame_names()
                .iter()
                .any(|f| common::glob_matches(name, f)),
            "reliability entry {name} names no server frame"
        );
    }
}

#[test]
fn schema_copy_matches_shared() {
    let local = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/wire-v1.schema.json");
    let shared = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/protocol/wire-v1.schema.json"
    );
    let Ok(shared_bytes) = std::fs::read(shared) else {
        eprintln!("skipping: {shared} not present");
        return;
    };
    let local_bytes = std::fs::read(local).expect("read local schema copy");
    assert!(
        local_bytes == shared_bytes,
        "protocol/wire-v1.schema.json differs from {shared}; re-copy it"
    );
}

/// The extensions file only adds: new optional fields and descriptions. Anything else it
/// replaced would change what v1 means, for apps that never asked for an extension too.
#[test]
fn extensions_only_add_to_the_shared_schema() {
    fn walk(base: &Value, over: &Value, at: &str, bad: &mut Vec<String>) {
        let Some(over) = over.as_object() else { return };
        for (k, v) in over {
            let here = format!("{at}/{k}");
            match base.get(k) {
                None => {}
                Some(b) if b == v => {}
                Some(b) if b.is_object() && v.is_object() => walk(b, v, &here, bad),
                Some(_) if k == "description" => {}
                Some(_) => bad.push(here),
            }
        }
    }
    let read =
        |p: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    let base = read(common::SCHEMA_PATH);
    let mut over = read(common::EXTENSIONS_PATH);
    over.as_object_mut().unwrap().remove("description");
    let mut bad = Vec::new();
    walk(&base, &over, "", &mut bad);
    assert!(bad.is_empty(), "the extensions replace v1's {bad:?}");
    // And the fields they add are optional: no `required` anywhere in them.
    assert!(!over.to_string().contains("\"required\""));
}
