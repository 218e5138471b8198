use super::*;

fn err(text: &str) -> DecodeError {
    decode_request(text).expect_err("must be refused")
}

#[test]
fn decodes_a_hello_with_envelope_fields() {
    let f = decode_request(
        r#"{"v":1,"type":"hello","id":7,"payload":{"token":"t\"x","device_id":"d1","caps":{"media":true}}}"#,
    )
    .unwrap();
    assert_eq!(f.id, Some(7));
    let Request::Hello(h) = f.request else {
        panic!()
    };
    assert_eq!(h.token, "t\"x");
    assert_eq!(h.device_id.as_deref(), Some("d1"));
    assert!(!h.wants("update_append"));
}

#[test]
fn hello_extensions_are_read_and_junk_is_ignored() {
    let hello = |caps: &str| {
        let text = format!(r#"{{"v":1,"type":"hello","payload":{{"token":"t","caps":{caps}}}}}"#);
        match decode_request(&text).unwrap().request {
            Request::Hello(h) => h,
            _ => panic!(),
        }
    };
    assert!(hello(r#"{"extensions":["x","update_append"]}"#).wants("update_append"));
    assert!(!hello(r#"{"extensions":"update_append"}"#).wants("update_append"));
    assert!(hello(r#"{"extensions":[1,null,"update_append"]}"#).wants("update_append"));
    assert!(!hello(r#"{"media":true}"#).wants("update_append"));
    assert!(!hello("null").wants("update_append"));
    assert!(!hello("[1]").wants("update_append"));
}

#[test]
fn scopes_and_payload_of_message_send() {
    let f = decode_request(
        r#"{"v":1,"type":"message.send","id":3,"chat_id":"chan_1","thread_id":"thr_2","payload":{"text":"hi","auto_thread":true}}"#,
    )
    .unwrap();
    assert_eq!(f.chat_id.as_deref(), Some("chan_1"));
    assert_eq!(f.thread_id.as_deref(), Some("thr_2"));
    assert!(matches!(
        f.request,
        Request::MessageSend(MessageSend {
            auto_thread: true,
            ..
        })
    ));
}

#[test]
fn escaped_envelope_strings_are_unescaped() {
    let f =
        decode_request(r#"{"v":1,"type":"p\u0069ng","id":2,"chat_id":"defa\u0075lt"}"#).unwrap();
    assert_eq!(f.request, Request::Ping { ts: None });
    assert_eq!(f.chat_id.as_deref(), Some("default"));
}

#[test]
fn the_full_parser_reads_only_the_envelope() {
    // An escape sends the header to the full parser; fields it does not need are skipped.
    let big = format!(
        r#"{{"v":1,"type":"p\u0069ng","id":5,"x":[{}],"y":{{"a":[{{}}]}},"ts":true}}"#,
        vec!["0"; 1000].join(",")
    );
    let f = decode_request(&big).unwrap();
    assert_eq!((f.id, f.request), (Some(5), Request::Ping { ts: None }));
    // A repeated key: the last one counts, as before.
    let f = decode_request(r#"{"v":1,"type":"p\u0069ng","id":1,"id":2}"#).unwrap();
    assert_eq!(f.id, Some(2));
    let e = err(r#"{"v":1,"type":"p\u0069ng","id":[1]}"#);
    assert!(e.message.contains("`id`"), "{}", e.message);
    let e = err(r#"{"v":null,"type":"p\u0069ng","id":3}"#);
    assert_eq!(e.id, Some(3));
    assert!(e.message.contains("`v`"), "{}", e.message);
    let e = err(r#"{"v":1,"type":"p\u0069ng","chat_id":7}"#);
    assert!(e.message.contains("`chat_id`"), "{}", e.message);
    assert!(err(r#""p\u0069ng""#).message.contains("object"));
    assert!(err(r#"{"v":1,"type":"p\u0069ng"} x"#)
        .message
        .contains("malformed JSON"));
}

#[test]
fn refuses_wrong_version_with_the_id_echoed() {
    let e = err(r#"{"v":2,"type":"ping","id":9}"#);
    assert_eq!((e.id, e.code), (Some(9), ErrorCode::Unsupported));
    assert!(e.message.contains("version 2"));
}

#[test]
fn names_the_mistyped_field() {
    let e = err(r#"{"v":1,"type":"ping","id":"nine"}"#);
    assert!(e.message.contains("`id`"), "{}", e.message);
    let e = err(r#"{"v":1,"type":"channel.favorite","id":4,"payload":{"on":"yes"}}"#);
    assert_eq!(e.id, Some(4));
    assert!(
        e.message.contains("channel.favorite") && e.message.contains("`on`"),
        "{}",
        e.message
    );
    let e = err(r#"{"v":1,"type":"hello","id":5,"payload":{}}"#);
    assert!(e.message.contains("token"), "{}", e.message);
}

#[test]
fn refuses_junk_unknown_types_and_bad_ids() {
    assert!(err("not json").message.contains("malformed JSON"));
    assert!(err("[1,2]").message.contains("object"));
    assert!(err(r#"{"v":1,"type":"teleport","id":1}"#)
        .message
        .contains("unknown frame type"));
    assert!(err(r#"{"v":1,"type":"ping","chat_id":"a b"}"#)
        .message
        .contains("chat_id"));
}

#[test]
fn junk_in_frames_without_payload_is_refused() {
    // Inputs fuzz/decode_frame found accepted: a raw control character, a bare word.
    let e = err("{\"v\":1,\"type\":\"channel.list\",\"x\u{13}\":1}");
    assert_eq!(e.code, ErrorCode::Unsupported);
    err(r#"{"v":1,"type":"channel.delete","id":7,"x":[#msg]}"#);
    assert_eq!(
        decode_request(r#"{"v":1,"type":"channel.list","id":3,"x":{"y":[1,"\n"]}}"#)
            .map(|f| f.request),
        Ok(Request::ChannelList)
    );
}

#[test]
fn deep_nesting_is_refused_without_recursion() {
    let deep = format!(
        r#"{{"v":1,"type":"ping","payload":{{"x":{}}}}}"#,
        "[".repeat(100_000)
    );
    assert!(err(&deep).message.contains("nests deeper"));
}

#[test]
fn agent_stop_is_accepted() {
    let f = decode_request(r#"{"v":1,"type":"agent.stop","id":3,"chat_id":"default"}"#).unwrap();
    assert_eq!(f.request, Request::AgentStop);
    assert_eq!(f.chat_id.as_deref(), Some("default"));
}

#[test]
fn planned_features_decode_as_unimplemented() {
    let f = decode_request(
        r#"{"v":1,"type":"picker.select","id":1,"payload":{"picker_id":"x","value":"y"}}"#,
    )
    .unwrap();
    assert_eq!(
        f.request,
        Request::PickerSelect {
            picker_id: "x".into(),
            value: "y".into()
        }
    );
}

#[test]
fn agent_steer_carries_its_text() {
    let f = decode_request(
        r#"{"v":1,"type":"agent.steer","id":4,"chat_id":"default","payload":{"text":"shorter"}}"#,
    )
    .unwrap();
    assert_eq!(
        f.request,
        Request::AgentSteer {
            text: "shorter".into()
        }
    );
    let e = decode_request(r#"{"v":1,"type":"agent.steer","id":5,"payload":{}}"#).unwrap_err();
    assert_eq!(e.id, Some(5));
}

#[test]
fn read_receipt_from_the_app_names_a_message() {
    let f = decode_request(
        r#"{"v":1,"type":"read.receipt","chat_id":"default","payload":{"message_id":"msg_1"}}"#,
    )
    .unwrap();
    assert_eq!(
        f.request,
        Request::ReadReceipt {
            message_id: "msg_1".into()
        }
    );
    let e = decode_request(r#"{"v":1,"type":"read.receipt","id":2,"payload":{}}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported);
}
