//! The wire surface of the real binary: the hello gate, error handling for bad input, limits and
//! rate limiting, all over a real WebSocket on 127.0.0.1. Every frame the client sees is checked
//! against the wire schema by the harness; each test reads every frame it triggers.

mod common;

use std::time::Duration;

use common::{connect_online, frame_type, pair, temp_data_dir, Client, Gateway, Paired};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// Close code the gateway uses for auth refusals (policy violation).
const CLOSE_POLICY: u16 = 1008;
/// Close code for a frame over `max_frame_bytes` (message too big).
const CLOSE_TOO_BIG: u16 = 1009;

/// Pairs a device and connects it, greeted `online`.
async fn pair_and_connect(gw: &Gateway, name: &str) -> (Client, Paired) {
    let p = pair(&gw.data_dir, name);
    let (c, _) = connect_online(gw, &p).await;
    (c, p)
}

/// Sends a hello with an explicit id without waiting for anything.
async fn send_hello(c: &mut Client, id: i64, token: &str) {
    c.send(json!({
        "v": 1,
        "type": "hello",
        "id": id,
        "payload": { "token": token, "device_id": "surface-test", "device_name": "surface test" },
    }))
    .await;
}

/// Asserts an `error` frame: its code, the echoed id (`None` = no id), a non-empty message that
/// contains at least one of `keywords` (case-insensitive). Live frames never carry `cursor`.
#[track_caller]
fn assert_error(frame: &Value, code: &str, id: Option<i64>, keywords: &[&str]) {
    assert_eq!(
        frame_type(frame),
        "error",
        "expected an error frame, got {frame}"
    );
    assert_eq!(
        frame.pointer("/payload/code").and_then(Value::as_str),
        Some(code),
        "wrong error code: {frame}"
    );
    assert_eq!(
        frame.get("id").and_then(Value::as_i64),
        id,
        "wrong or missing echoed id: {frame}"
    );
    assert!(
        frame.get("cursor").is_none(),
        "live error carries a cursor: {frame}"
    );
    let message = frame
        .pointer("/payload/message")
        .and_then(Value::as_str)
        .unwrap_or("");
    assert!(
        !message.trim().is_empty(),
        "error message is empty: {frame}"
    );
    let lower = message.to_lowercase();
    assert!(
        keywords.iter().any(|k| lower.contains(&k.to_lowercase())),
        "error message {message:?} mentions none of {keywords:?}: {frame}"
    );
}

/// Sends a ping and requires the very next frame to be its pong (same id and ts).
async fn ping_ok(c: &mut Client, ts: i64) {
    let id = c.next_id();
    c.send(json!({ "v": 1, "type": "ping", "id": id, "payload": { "ts": ts } }))
        .await;
    let pong = c.recv().await;
    assert_eq!(
        frame_type(&pong),
        "pong",
        "ping {id} was not answered by a pong: {pong}\n{}",
        c.recent()
    );
    assert_eq!(pong["id"], json!(id), "{pong}");
    assert_eq!(pong["payload"]["ts"], json!(ts), "{pong}");
}

/// Expects an `error{code}` as the next frame, then the connection to close with `close_code`.
async fn expect_refused(
    c: &mut Client,
    code: &str,
    id: Option<i64>,
    keywords: &[&str],
    close_code: u16,
) {
    let err = c.recv().await;
    assert_error(&err, code, id, keywords);
    let closed = c.expect_closed().await;
    assert_eq!(
        closed,
        Some(close_code),
        "expected close {close_code} after {code} refusal\n{}",
        c.recent()
    );
}

// ---------------------------------------------------------------------------------------------
// Hello gate
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn good_hello_gets_ack_then_online_status_and_nothing_before() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "ack-phone");

    let mut c = Client::open(&gw.url).await;
    send_hello(&mut c, 7, &p.token).await;

    let ack = c.recv().await;
    assert_eq!(
        frame_type(&ack),
        "hello.ack",
        "first frame after hello: {ack}"
    );
    assert_eq!(ack["id"], json!(7), "hello id not echoed: {ack}");
    assert!(ack.get("cursor").is_none(), "{ack}");
    let payload = &ack["payload"];
    assert_eq!(
        payload["server_caps"],
        json!({
            "streaming": true, "reasoning": true, "tools": true,
            "media": true, "search": true, "pickers": true,
            "push": "none", "push_ntfy_server": "",
            "extensions": ["update_append", "agent.busy", "read.receipt"]
        }),
        "server_caps differ from the contract: {ack}"
    );
    assert!(
        payload["sync_cursor"].is_i64(),
        "sync_cursor must be an integer: {ack}"
    );
    assert!(payload["sync_cursor"].as_i64().unwrap() >= 0, "{ack}");
    assert_eq!(payload["last_pushed_cursor"], json!(0), "{ack}");
    let channels = payload["channels"].as_array().expect("channels array");
    let first = channels.first().expect("at least the default channel");
    assert_eq!(
        first["chat_id"], "default",
        "default channel must come first: {ack}"
    );
    assert_eq!(first["name"], "General", "{ack}");
    assert_eq!(first["kind"], "default", "{ack}");
    assert_eq!(first["is_default"], true, "{ack}");
    assert_eq!(
        channels.iter().filter(|c| c["is_default"] == true).count(),
        1,
        "exactly one default channel: {ack}"
    );

    let status = c.recv().await;
    assert_eq!(frame_type(&status), "status", "second frame: {status}");
    assert_eq!(status["payload"]["state"], "online", "{status}");
    assert!(
        status.get("id").is_none(),
        "status is an event, not a reply: {status}"
    );

    // A fresh data dir has no todo lists, so the next frame is the answer to this ping.
    ping_ok(&mut c, 1).await;
    assert_eq!(c.seen_types(), ["hello.ack", "status", "pong"]);
}

#[tokio::test]
async fn bad_token_gets_auth_error_and_close() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let mut c = Client::open(&gw.url).await;
    send_hello(&mut c, 3, "iris_definitely-not-a-real-token").await;
    expect_refused(
        &mut c,
        "auth",
        Some(3),
        &["token", "pair", "revoked"],
        CLOSE_POLICY,
    )
    .await;
    assert_eq!(
        c.seen_types(),
        ["error"],
        "nothing but the error before the close"
    );
}

#[tokio::test]
async fn revoked_token_closes_open_socket_and_is_refused_afterwards() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut victim, p) = pair_and_connect(&gw, "victim").await;
    let (mut bystander, _) = pair_and_connect(&gw, "bystander").await;

    common::revoke(dir.path(), &p.device_id);

    let err = victim.recv().await;
    assert_error(&err, "auth", None, &["revoked"]);
    let closed = victim.expect_closed().await;
    assert_eq!(
        closed,
        Some(CLOSE_POLICY),
        "revoked socket close code\n{}",
        victim.recent()
    );

    // The other device is untouched.
    ping_ok(&mut bystander, 99).await;

    let mut again = Client::open(&gw.url).await;
    send_hello(&mut again, 1, &p.token).await;
    expect_refused(
        &mut again,
        "auth",
        Some(1),
        &["token", "revoked", "pair"],
        CLOSE_POLICY,
    )
    .await;
}

#[tokio::test]
async fn repeated_bad_hellos_are_rate_limited_even_for_a_good_token() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let good = pair(dir.path(), "good-phone");

    for i in 1..=5 {
        let mut c = Client::open(&gw.url).await;
        send_hello(&mut c, i, &format!("iris_wrong_{i}")).await;
        expect_refused(&mut c, "auth", Some(i), &["token"], CLOSE_POLICY).await;
    }

    // Sixth attempt from the same address: refused before the token is looked at.
    let mut c = Client::open(&gw.url).await;
    send_hello(&mut c, 6, &good.token).await;
    let err = c.recv().await;
    assert_error(
        &err,
        "rate_limited",
        Some(6),
        &["too many", "minute", "failed"],
    );
    let closed = c.expect_closed().await;
    assert!(
        closed.is_some(),
        "rate-limited hello must be closed with a close frame\n{}",
        c.recent()
    );

    // And a bad one stays rate limited too.
    let mut c = Client::open(&gw.url).await;
    send_hello(&mut c, 7, "iris_wrong_again").await;
    let err = c.recv().await;
    assert_error(
        &err,
        "rate_limited",
        Some(7),
        &["too many", "minute", "failed"],
    );
    c.expect_closed().await;
}

/// A loopback address of its own for each rotation step: 127.0.<hi>.<lo>, never 127.0.0.1.
fn loopback(n: u32) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(
        127,
        0,
        1 + (n / 250) as u8,
        1 + (n % 250) as u8,
    ))
}

/// One hello from `source` with `token`: the refusal's error code, or `None` when accepted.
async fn hello_from(gw: &Gateway, source: std::net::IpAddr, token: &str) -> Option<String> {
    let mut c = Client::open_from(&gw.url, gw.addr, source).await;
    send_hello(&mut c, 1, token).await;
    let reply = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    if frame_type(&reply) == "hello.ack" {
        c.close().await;
        return None;
    }
    assert_eq!(
        c.expect_closed().await,
        Some(CLOSE_POLICY),
        "{}",
        c.recent()
    );
    Some(reply["payload"]["code"].as_str().unwrap_or("").to_owned())
}

/// More source addresses than the gateway counts one by one (32) must not buy more guesses:
/// before, each new address pushed the oldest out of the table and started from zero.
#[tokio::test]
async fn rotating_source_addresses_does_not_escape_the_bad_hello_limit() {
    let dir = temp_data_dir();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, "[limits]\nbad_hellos_per_minute = 1\n").expect("write config");
    let data = dir.path().join("data");
    let gw = Gateway::start(&data, &["--config", config.to_str().unwrap()]);
    let good = pair(&data, "home-phone");
    let home: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(hello_from(&gw, home, &good.token).await, None);

    // 48 addresses, one wrong token each: at most the table plus the shared overflow count
    // (33 tries) get an answer about the token; after that, new addresses are refused unread.
    let mut answered = 0;
    let mut limited = 0;
    for n in 0..48 {
        match hello_from(&gw, loopback(n), &format!("iris_guess_{n}"))
            .await
            .as_deref()
        {
            Some("auth") => {
                assert_eq!(limited, 0, "a token was checked again after the limit bit");
                answered += 1;
            }
            Some("rate_limited") => limited += 1,
            other => panic!("address {n}: {other:?}"),
        }
    }
    assert!(
        answered <= 33,
        "{answered} guesses answered from rotating addresses"
    );
    assert!(
        limited >= 15,
        "only {limited} of 48 rotating addresses were limited"
    );

    // The first address was not forgotten, and a good token from a new address waits too.
    assert_eq!(
        hello_from(&gw, loopback(0), &good.token).await.as_deref(),
        Some("rate_limited")
    );
    let mut stranger = Client::open_from(&gw.url, gw.addr, loopback(200)).await;
    send_hello(&mut stranger, 9, &good.token).await;
    let err = stranger.recv().await;
    assert_error(&err, "rate_limited", Some(9), &["too many addresses"]);
    stranger.expect_closed().await;

    // The address the phone got in from before is judged by its own count: it still works.
    assert_eq!(hello_from(&gw, home, &good.token).await, None);
}

/// 4 bad + 1 good, repeated, used to be unlimited: the good hello reset the count.
#[tokio::test]
async fn a_good_hello_does_not_reset_the_failure_count() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let good = pair(dir.path(), "good-phone");
    let from: std::net::IpAddr = "127.0.0.9".parse().unwrap();
    for i in 0..4 {
        let refused = hello_from(&gw, from, &format!("iris_wrong_{i}")).await;
        assert_eq!(refused.as_deref(), Some("auth"), "bad hello {i}");
    }
    assert_eq!(hello_from(&gw, from, &good.token).await, None);
    assert_eq!(
        hello_from(&gw, from, "iris_wrong_4").await.as_deref(),
        Some("auth")
    );
    // Five failures this minute, whatever succeeded in between.
    assert_eq!(
        hello_from(&gw, from, &good.token).await.as_deref(),
        Some("rate_limited")
    );
    assert_eq!(
        hello_from(&gw, from, "iris_wrong_5").await.as_deref(),
        Some("rate_limited")
    );
}

#[tokio::test]
async fn non_hello_first_frame_is_refused() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let mut c = Client::open(&gw.url).await;
    c.send(json!({ "v": 1, "type": "ping", "id": 4, "payload": { "ts": 5 } }))
        .await;
    expect_refused(&mut c, "auth", Some(4), &["hello"], CLOSE_POLICY).await;
    assert_eq!(
        c.seen_types(),
        ["error"],
        "a pong must not leak before hello"
    );
}

/// The contract: "Non-hello first frame → error auth + close". A first frame that is not even a
/// decodable frame, or names an unknown type, is not a hello either.
#[tokio::test]
async fn undecodable_or_unknown_first_frame_is_refused_with_auth() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let mut c = Client::open(&gw.url).await;
    c.send_raw_binary(vec![1, 2, 3]).await;
    expect_refused(&mut c, "auth", None, &["hello"], CLOSE_POLICY).await;

    let mut c = Client::open(&gw.url).await;
    c.send_raw_text(r#"{"v":1,"type":"teleport","id":3,"payload":{}}"#)
        .await;
    expect_refused(&mut c, "auth", Some(3), &["hello"], CLOSE_POLICY).await;

    let mut c = Client::open(&gw.url).await;
    c.send_raw_text("GET / HTTP/1.1").await;
    expect_refused(&mut c, "auth", None, &["hello"], CLOSE_POLICY).await;
}

#[tokio::test]
async fn oversized_first_frame_gets_unsupported_and_1009() {
    let dir = temp_data_dir();
    let gw = Gateway::start(
        dir.path(),
        &["--max-frame-bytes", "8192", "--max-text-bytes", "4096"],
    );
    let p = pair(dir.path(), "late-hello");

    let mut c = Client::open(&gw.url).await;
    let hello = json!({
        "v": 1, "type": "hello", "id": 1,
        "payload": { "token": p.token, "device_name": "n".repeat(10_000) },
    });
    let _ = c.try_send_raw(Message::text(hello.to_string())).await;
    let closed = c.expect_closed().await;
    assert_eq!(
        c.seen.len(),
        1,
        "exactly one frame before the close\n{}",
        c.recent()
    );
    assert_error(
        &c.seen[0],
        "unsupported",
        None,
        &["too large", "limit", "8192"],
    );
    assert_eq!(closed, Some(CLOSE_TOO_BIG), "{}", c.recent());

    // The token itself is fine: a normal hello still works.
    let (mut ok, _) = Client::hello(&gw.url, &p.token, "late-hello").await;
    assert_eq!(frame_type(&ok.recv().await), "status");
    ping_ok(&mut ok, 5).await;
}

#[tokio::test]
async fn missing_hello_times_out_with_auth_error() {
    let dir = temp_data_dir();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, "[limits]\nhello_timeout_secs = 1\n").expect("write config");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let gw = Gateway::start(dir.path(), &["--config", &config]);

    let mut c = Client::open(&gw.url).await;
    // Send nothing: the gateway must give up on its own (1 s), well within the client timeout.
    expect_refused(&mut c, "auth", None, &["hello", "time"], CLOSE_POLICY).await;
}

#[tokio::test]
async fn second_hello_is_unsupported_and_session_survives() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, p) = pair_and_connect(&gw, "twice").await;

    send_hello(&mut c, 5, &p.token).await;
    let err = c.recv().await;
    assert_error(&err, "unsupported", Some(5), &["hello"]);
    ping_ok(&mut c, 123).await;
}

#[tokio::test]
async fn ping_gets_pong_with_same_id_and_ts() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "pinger").await;

    c.send(json!({ "v": 1, "type": "ping", "id": 42, "payload": { "ts": 1_700_000_123_456_i64 } }))
        .await;
    let pong = c.recv().await;
    assert_eq!(frame_type(&pong), "pong", "{pong}");
    assert_eq!(pong["id"], json!(42), "{pong}");
    assert_eq!(
        pong["payload"]["ts"],
        json!(1_700_000_123_456_i64),
        "{pong}"
    );
    assert!(pong.get("cursor").is_none(), "{pong}");

    // Another id, another ts: nothing is cached between pings.
    ping_ok(&mut c, 7).await;
}

// ---------------------------------------------------------------------------------------------
// Bad input on an authenticated socket
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_frames_are_unsupported_and_socket_survives() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "junk-sender").await;

    // (description, raw text, echoed id, key words the message must contain one of)
    let cases: &[(&str, &str, Option<i64>, &[&str])] = &[
        (
            "malformed JSON",
            r#"{"v":1,"type":"ping","#,
            None,
            &["json"],
        ),
        ("not JSON at all", "hello gateway", None, &["json"]),
        (
            "a JSON array",
            r#"[{"v":1,"type":"ping"}]"#,
            None,
            &["object"],
        ),
        ("a JSON string", r#""ping""#, None, &["object"]),
        (
            "v: 2",
            r#"{"v":2,"type":"ping","id":11,"payload":{"ts":1}}"#,
            Some(11),
            &["version"],
        ),
        (
            "missing v",
            r#"{"type":"ping","id":12,"payload":{"ts":1}}"#,
            Some(12),
            &["`v`", "version"],
        ),
        (
            "missing type",
            r#"{"v":1,"id":13,"payload":{}}"#,
            Some(13),
            &["type"],
        ),
        (
            "id as a string",
            r#"{"v":1,"type":"ping","id":"14","payload":{"ts":1}}"#,
            None,
            &["`id`", "\"id\"", "'id'"],
        ),
        (
            "chat_id with a space",
            r#"{"v":1,"type":"history","id":15,"chat_id":"a b","payload":{}}"#,
            Some(15),
            &["chat_id"],
        ),
        (
            "chat_id too long",
            &format!(
                r#"{{"v":1,"type":"history","id":16,"chat_id":"{}","payload":{{}}}}"#,
                "c".repeat(65)
            ),
            Some(16),
            &["chat_id"],
        ),
        (
            "unknown type",
            r#"{"v":1,"type":"teleport","id":17,"payload":{}}"#,
            Some(17),
            &["teleport"],
        ),
        (
            "payload field of the wrong type",
            r#"{"v":1,"type":"channel.favorite","id":18,"chat_id":"default","payload":{"on":"yes"}}"#,
            Some(18),
            &["bool"],
        ),
        (
            "ping ts as a string",
            r#"{"v":1,"type":"ping","id":20,"payload":{"ts":"1"}}"#,
            Some(20),
            &["ping"],
        ),
        (
            "nesting deeper than any v1 frame",
            &format!(
                r#"{{"v":1,"type":"ping","payload":{{"x":{}}}}}"#,
                "[".repeat(200)
            ),
            None,
            &["nest", "deep"],
        ),
        (
            "message.send text as a number",
            r#"{"v":1,"type":"message.send","id":19,"payload":{"text":5}}"#,
            Some(19),
            &["string"],
        ),
    ];

    for (i, (what, raw, id, keywords)) in cases.iter().enumerate() {
        c.send_raw_text(raw).await;
        let err = c.recv().await;
        if frame_type(&err) != "error" {
            panic!("{what}: expected an error frame, got {err}\n{}", c.recent());
        }
        assert_eq!(
            err.pointer("/payload/code").and_then(Value::as_str),
            Some("unsupported"),
            "{what}: {err}"
        );
        assert_error(&err, "unsupported", *id, keywords);
        ping_ok(&mut c, 1000 + i as i64).await;
    }

    // The frame type of the mistyped payload is named too (the code's own promise).
    let favorite = c
        .seen
        .iter()
        .find(|f| f["id"] == json!(18))
        .cloned()
        .expect("error for id 18");
    let msg = favorite["payload"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("channel.favorite"), "{favorite}");
}

#[tokio::test]
async fn binary_frame_is_unsupported_and_socket_survives() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "binary").await;

    c.send_raw_binary(vec![0x89, b'P', b'N', b'G', 0, 1, 2, 3])
        .await;
    let err = c.recv().await;
    assert_error(&err, "unsupported", None, &["binary"]);
    ping_ok(&mut c, 3).await;
    assert!(c.binaries.is_empty(), "the gateway sent binary frames back");
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

/// Reads the rest of a demo turn in the lane until `typing{on:false}`; returns `message.stop`.
async fn read_turn_to_end(c: &mut Client) -> Value {
    let stop = c.recv_type("message.stop").await;
    let off = c
        .recv_until(|f| frame_type(f) == "typing" && f["payload"]["on"] == false)
        .await;
    assert_eq!(off["chat_id"], stop["chat_id"], "{off}");
    stop
}

#[tokio::test]
async fn message_text_limit_is_in_bytes_and_exact() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--max-text-bytes", "1000"]);
    let (mut c, _) = pair_and_connect(&gw, "long-writer").await;

    // One over: 1001 ASCII bytes, and 1001 bytes in only 501 characters (the limit counts
    // bytes).
    for (ping, text) in [(1, "a".repeat(1001)), (2, format!("{}a", "é".repeat(500)))] {
        assert_eq!(text.len(), 1001);
        let id = c.send_text(Some("default"), None, &text).await;
        let err = c.recv().await;
        assert_error(
            &err,
            "unsupported",
            Some(id),
            &["1000", "max_text_bytes", "limit"],
        );
        ping_ok(&mut c, ping).await;
    }

    // Exactly at the limit: accepted.
    let text = "b".repeat(1000);
    let id = c.send_text(Some("default"), None, &text).await;
    let receipt = c.recv().await;
    assert_eq!(
        frame_type(&receipt),
        "read.receipt",
        "1000-byte message refused: {receipt}"
    );
    assert_eq!(receipt["id"], json!(id), "{receipt}");
    let echo = c.recv_type("message").await;
    assert_eq!(echo["payload"]["role"], "user", "{echo}");
    assert_eq!(echo["payload"]["text"], json!(text), "{echo}");
    let stop = read_turn_to_end(&mut c).await;
    assert_eq!(stop["payload"]["model"], "iris-demo", "{stop}");
    ping_ok(&mut c, 3).await;
}

#[tokio::test]
async fn frame_over_max_frame_bytes_is_refused_and_gateway_keeps_serving() {
    let dir = temp_data_dir();
    // max_text_bytes must stay below max_frame_bytes, so lower it alongside.
    let gw = Gateway::start(
        dir.path(),
        &["--max-frame-bytes", "8192", "--max-text-bytes", "4096"],
    );
    let (mut big, _) = pair_and_connect(&gw, "big-sender").await;
    let (mut other, _) = pair_and_connect(&gw, "other").await;

    let head = r#"{"v":1,"type":"message.send","id":9,"payload":{"text":""#;
    let tail = r#""}}"#;
    let frame = format!(
        "{head}{}{tail}",
        "x".repeat(20_000 - head.len() - tail.len())
    );
    assert_eq!(frame.len(), 20_000);
    // The gateway may close while the frame is still being written; that is fine.
    let _ = big.try_send_raw(Message::text(frame)).await;
    let closed = big.expect_closed().await;

    let after_hello: Vec<&Value> = big.seen.iter().skip(2).collect();
    for f in &after_hello {
        assert_error(
            f,
            "unsupported",
            None,
            &["8192", "max_frame_bytes", "too large", "limit"],
        );
    }
    assert_eq!(
        after_hello.len(),
        1,
        "expected exactly one error{{unsupported}} before the close\n{}",
        big.recent()
    );
    assert_eq!(
        closed,
        Some(CLOSE_TOO_BIG),
        "expected close code 1009 (last transport error: {:?})\n{}",
        big.last_error,
        big.recent()
    );

    // Other clients are unaffected, and new ones can still connect.
    ping_ok(&mut other, 77).await;
    let (mut late, _) = pair_and_connect(&gw, "late").await;
    ping_ok(&mut late, 78).await;
}

#[tokio::test]
async fn frame_flood_is_rate_limited_then_recovers() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "flooder").await;

    const N: i64 = 100;
    let first_id = c.next_id();
    for i in 0..N {
        c.send(json!({ "v": 1, "type": "ping", "id": first_id + i, "payload": { "ts": i } }))
            .await;
    }
    let mut pongs = 0;
    let mut limited = 0;
    let mut ids = Vec::new();
    for _ in 0..N {
        let f = c.recv().await;
        match frame_type(&f) {
            "pong" => {
                let i = f["id"].as_i64().expect("pong id") - first_id;
                assert_eq!(
                    f["payload"]["ts"],
                    json!(i),
                    "pong paired with wrong ts: {f}"
                );
                pongs += 1;
            }
            "error" => {
                assert_error(
                    &f,
                    "rate_limited",
                    f["id"].as_i64(),
                    &["per second", "rate", "retry"],
                );
                limited += 1;
            }
            other => panic!("unexpected `{other}` during the flood: {f}"),
        }
        ids.push(f["id"].as_i64());
    }
    assert!(
        limited >= 1,
        "100 back-to-back frames must exceed the burst: {pongs} pongs"
    );
    assert!(
        pongs >= 60,
        "the burst of 60 frames must be served: only {pongs} pongs, {limited} refused"
    );
    // Each ping is answered exactly once, in order, each answer naming its ping.
    let want: Vec<Option<i64>> = (0..N).map(|i| Some(first_id + i)).collect();
    assert_eq!(
        ids, want,
        "every ping gets one answer carrying its id, in order"
    );

    // The bucket refills at 20 frames/s; after a second a ping is served again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ping_ok(&mut c, 4242).await;
}

/// Envelope strings are JSON strings: `"p\u0069ng"` is the string `ping` and `"defa\u0075lt"`
/// is `default`. An encoder that escapes characters must not change the meaning of a frame.
#[tokio::test]
async fn json_escapes_in_envelope_strings_are_decoded() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "escaper").await;

    c.send_raw_text(r#"{"v":1,"type":"p\u0069ng","id":20,"payload":{"ts":31}}"#)
        .await;
    let f = c.recv().await;
    assert_eq!(
        frame_type(&f),
        "pong",
        "escaped `ping` type was not understood: {f}"
    );
    assert_eq!(f["id"], json!(20), "{f}");
    assert_eq!(f["payload"]["ts"], json!(31), "{f}");

    c.send_raw_text(r#"{"v":1,"type":"history","id":21,"chat_id":"defa\u0075lt","payload":{}}"#)
        .await;
    let f = c.recv().await;
    assert_eq!(
        frame_type(&f),
        "history",
        "escaped chat_id `default` was refused: {f}"
    );
    assert_eq!(f["id"], json!(21), "{f}");
    assert_eq!(f["chat_id"], "default", "{f}");

    ping_ok(&mut c, 32).await;
}

/// "More than frame_burst frames at once → rate_limited for the excess": binary frames are
/// frames too, and must not be a way around the limit.
#[tokio::test]
async fn binary_frames_count_against_the_rate_limit() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = pair_and_connect(&gw, "binary-flooder").await;

    const N: usize = 100;
    for i in 0..N {
        c.send_raw_binary(vec![i as u8; 16]).await;
    }
    let mut unsupported = 0;
    let mut limited = 0;
    for _ in 0..N {
        let f = c.recv().await;
        match f.pointer("/payload/code").and_then(Value::as_str) {
            Some("unsupported") => {
                assert_error(&f, "unsupported", None, &["binary"]);
                unsupported += 1;
            }
            Some("rate_limited") => {
                assert_error(&f, "rate_limited", None, &["per second", "rate", "retry"]);
                limited += 1;
            }
            _ => panic!(
                "unexpected frame during the binary flood: {f}\n{}",
                c.recent()
            ),
        }
    }
    assert!(
        limited >= 1,
        "{N} back-to-back binary frames were all processed ({unsupported} unsupported, 0 rate_limited)"
    );
    assert!(
        unsupported >= 60,
        "the burst must be served: {unsupported} unsupported, {limited} limited"
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    ping_ok(&mut c, 9).await;
}

// ---------------------------------------------------------------------------------------------
// Protocol violations: RFC 6455 close codes
// ---------------------------------------------------------------------------------------------

/// Close code for a text frame that is not UTF-8 (RFC 6455 §7.4.1).
const CLOSE_INVALID_DATA: u16 = 1007;
/// Close code for a WebSocket protocol error (RFC 6455 §7.4.1).
const CLOSE_PROTOCOL: u16 = 1002;

/// One client frame as bytes on the wire: `head` is the first byte (FIN, RSV1-3, opcode);
/// masked as a client must unless `masked` is false.
fn wire_frame(head: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    assert!(payload.len() < 126, "short frames only");
    let key = [0x37u8, 0xfa, 0x21, 0x3d];
    let mut out = vec![head, payload.len() as u8 | if masked { 0x80 } else { 0 }];
    if masked {
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

const PING: &[u8] = br#"{"v":1,"type":"ping","id":3,"payload":{"ts":1}}"#;

#[tokio::test]
async fn protocol_violations_close_with_their_rfc_6455_codes() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "violations");
    let cases: [(&str, Vec<u8>, u16, &[&str]); 6] = [
        (
            "invalid UTF-8 in a text frame",
            wire_frame(0x81, b"{\"v\":1,\xff\xfe}", true),
            CLOSE_INVALID_DATA,
            &["utf-8"],
        ),
        (
            "RSV1 set",
            wire_frame(0x80 | 0x40 | 0x1, PING, true),
            CLOSE_PROTOCOL,
            &["reserved"],
        ),
        (
            "unmasked client frame",
            wire_frame(0x81, PING, false),
            CLOSE_PROTOCOL,
            &["unmasked"],
        ),
        (
            "reserved data opcode",
            wire_frame(0x83, PING, true),
            CLOSE_PROTOCOL,
            &["opcode", "unknown"],
        ),
        (
            "reserved control opcode",
            wire_frame(0x8B, b"", true),
            CLOSE_PROTOCOL,
            &["opcode", "unknown"],
        ),
        (
            "stray continuation frame",
            wire_frame(0x80, PING, true),
            CLOSE_PROTOCOL,
            &["continue"],
        ),
    ];
    for (what, bytes, code, keywords) in cases {
        let (mut c, _) = Client::hello(&gw.url, &p.token, "violations").await;
        assert_eq!(frame_type(&c.recv().await), "status", "{what}");
        ping_ok(&mut c, 2).await;
        c.send_raw_wire(&bytes).await;
        let err = c.recv().await;
        assert_error(&err, "unsupported", None, keywords);
        assert_eq!(
            c.expect_closed().await,
            Some(code),
            "{what}\n{}",
            c.recent()
        );
    }

    // Before the hello, too: the first frame is not UTF-8.
    let mut c = Client::open(&gw.url).await;
    c.send_raw_wire(&wire_frame(0x81, b"\xc3\x28", true)).await;
    let err = c.recv().await;
    assert_error(&err, "unsupported", None, &["utf-8"]);
    assert_eq!(
        c.expect_closed().await,
        Some(CLOSE_INVALID_DATA),
        "{}",
        c.recent()
    );

    // None of that costs the device anything: it still connects and is served.
    let (mut c, _) = Client::hello(&gw.url, &p.token, "violations").await;
    assert_eq!(frame_type(&c.recv().await), "status");
    ping_ok(&mut c, 2).await;
}
