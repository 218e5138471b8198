//! The `agent.busy` extension through the real binary on the demo backend: a device that asked
//! is told when any lane's turn starts and ends, whoever started it (another device, a cron
//! job), and its `hello.ack` lists the lanes busy at connect; a device that did not ask sees
//! neither the frames nor the field. The demo is paced so a turn lasts long enough to connect
//! during it.

mod common;

use common::{
    channel_list, connect, connect_with, frame_type, pair, temp_data_dir, typing_off, Client,
    Gateway,
};
use serde_json::{json, Value};
use std::time::Duration;

fn busy_caps() -> Value {
    json!({ "caps": { "extensions": ["agent.busy"] } })
}

fn in_chat(f: &Value, kind: &str, chat: &str) -> bool {
    frame_type(f) == kind && f["chat_id"] == json!(chat)
}

/// Neither the extension's frames nor its `hello.ack` field reached this device.
fn assert_never_told(c: &Client, ack: &Value) {
    assert!(ack["payload"].get("agent_busy").is_none(), "{ack}");
    let told: Vec<String> = c
        .seen_types()
        .into_iter()
        .filter(|t| t.starts_with("agent."))
        .collect();
    assert!(told.is_empty(), "{told:?}\n{}", c.recent());
}

/// Enough words that the demo, at 50 ms a word, streams for well over a second.
fn long_prompt() -> String {
    (1..=40)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn busy_and_idle_reach_devices_that_asked_and_no_other() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "50"]);
    let starter = pair(dir.path(), "starter");
    let watcher = pair(dir.path(), "watcher");
    let plain = pair(dir.path(), "plain");
    let late = pair(dir.path(), "late");
    let plain_late = pair(dir.path(), "plain late");

    let (mut a, a_ack) = connect(&gw, &starter).await;
    let (mut b, b_ack) = connect_with(&gw, &watcher, busy_caps()).await;
    let (mut c, c_ack) = connect(&gw, &plain).await;
    let listed = b_ack["payload"]["server_caps"]["extensions"]
        .as_array()
        .expect("extensions");
    assert!(listed.contains(&json!("agent.busy")), "{b_ack}");
    assert_eq!(b_ack["payload"]["agent_busy"], json!([]), "{b_ack}");

    a.send_text(Some("default"), None, &long_prompt()).await;
    let busy = b.recv_until(|f| in_chat(f, "agent.busy", "default")).await;
    assert_eq!(busy["payload"], json!({}), "{busy}");
    assert!(busy.get("thread_id").is_none(), "{busy}");
    assert!(busy.get("cursor").is_none(), "live-only: {busy}");

    // Connected while the turn runs: the ack says the lane is busy, and the idle follows live.
    let (mut d, d_ack) = connect_with(&gw, &late, busy_caps()).await;
    assert_eq!(
        d_ack["payload"]["agent_busy"],
        json!([{ "chat_id": "default" }]),
        "{d_ack}"
    );
    let (mut e, e_ack) = connect(&gw, &plain_late).await;

    let stop = b.recv_until(|f| frame_type(f) == "message.stop").await;
    let idle = b.recv_until(|f| in_chat(f, "agent.idle", "default")).await;
    assert_eq!(idle["payload"], json!({}), "{idle}");
    assert!(stop["chat_id"] == json!("default"), "{stop}");
    let seen = b.seen_types();
    let n = |t: &str| seen.iter().filter(|s| *s == t).count();
    assert_eq!((n("agent.busy"), n("agent.idle")), (1, 1), "{seen:?}");
    d.recv_until(|f| in_chat(f, "agent.idle", "default")).await;

    // After the turn: nothing is busy.
    let (_f, f_ack) = connect_with(&gw, &late, busy_caps()).await;
    assert_eq!(f_ack["payload"]["agent_busy"], json!([]), "{f_ack}");

    for (client, ack) in [(&mut c, &c_ack), (&mut e, &e_ack), (&mut a, &a_ack)] {
        client.recv_until(typing_off).await;
        client.collect_quiet(Duration::from_millis(300)).await;
        assert_never_told(client, ack);
    }
}

#[tokio::test]
async fn a_cron_turn_is_busy_then_idle_for_devices_that_asked() {
    let dir = temp_data_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[[cron]]\nchannel = \"Reports\"\nschedule = \"* * * * * *\"\nprompt = \"status report\"\n",
    )
    .unwrap();
    let gw = Gateway::start(dir.path(), &["--config", config.to_str().unwrap()]);
    let watcher = pair(dir.path(), "watcher");
    let plain = pair(dir.path(), "plain");
    let (mut b, _) = connect_with(&gw, &watcher, busy_caps()).await;
    let (mut c, c_ack) = connect(&gw, &plain).await;
    let reports = channel_list(&mut b)
        .await
        .into_iter()
        .find(|ch| ch["name"] == json!("Reports"))
        .expect("the cron channel");
    let chat = reports["chat_id"].as_str().expect("chat_id").to_owned();

    b.recv_until(|f| in_chat(f, "agent.busy", &chat)).await;
    b.recv_until(|f| in_chat(f, "message.stop", &chat)).await;
    b.recv_until(|f| in_chat(f, "agent.idle", &chat)).await;

    c.recv_until(|f| in_chat(f, "typing", &chat) && typing_off(f))
        .await;
    assert_never_told(&c, &c_ack);
}
