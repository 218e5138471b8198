//! sled's reopen for its snapshot (`Store::bound_replay`, src/store/engine/replay_bound.rs) bounds by
//! bytes of its log what a start after a SIGKILL replays: the log between the snapshot sled
//! last wrote and the tip, measured here from the snapshot files' names (`snap.<log position>`),
//! not from anything the gateway says. The floor and cap are made small by debug-build hooks, so
//! a few dozen demo turns cross them several times.

mod common;

use std::path::Path;

use common::{frame_type, Client, Gateway};

/// The bound set through the hooks: floor and cap alike, in bytes of sled's log.
const BOUND: u64 = 100_000;

/// The log position of the newest snapshot in `data`'s sled directory.
fn snapshot_lsn(data: &Path) -> Option<u64> {
    std::fs::read_dir(data.join("db"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            u64::from_str_radix(name.to_str()?.strip_prefix("snap.")?, 16).ok()
        })
        .max()
}

/// A number field (`key=value`) of a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    let (_, rest) = line.split_once(&format!(" {key}="))?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "current_thread")]
async fn a_start_after_a_kill_replays_at_most_the_bound_in_bytes_of_log() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    let config = work.path().join("gateway.toml");
    std::fs::write(
        &config,
        "[limits]\nframes_per_second = 100000\nframe_burst = 100000\n",
    )
    .unwrap();
    let cfg = ["--config", config.to_str().unwrap()];
    let phone = common::pair(&data, "phone");
    let hooks = [
        ("IRIS_GATEWAY_REPLAY_BOUND_BYTES", "100000"),
        ("IRIS_GATEWAY_REPLAY_CAP_BYTES", "100000"),
    ];
    let mut gw = Gateway::start_with_env(&data, &cfg, &hooks);
    let (mut c, _) = Client::hello(&gw.url, &phone.token, &phone.device_id).await;
    // About 6 KB of log a turn: ~600 KB in all, six times the bound. The bound by records
    // (5,000, ~300 turns) never reopened sled in a run this short.
    for i in 0..100 {
        c.say(&format!("turn {i}: how are the tomatoes doing?"), |f| {
            frame_type(f) == "message.stop"
        })
        .await;
    }
    gw.kill9();
    let reopens: Vec<String> = gw
        .stderr_tail()
        .lines()
        .filter(|l| l.contains("sled reopened to write its snapshot"))
        .map(str::to_owned)
        .collect();
    eprintln!("{}", reopens.join("\n"));
    assert!(
        reopens.len() >= 3,
        "sled was reopened {} times in ~600 KB of log with a bound of {BOUND} bytes\n{}",
        reopens.len(),
        gw.output_tail()
    );
    // Each reopen measured the log written since the previous open from the snapshots'
    // positions: within the bound, give or take one commit group and the estimate by
    // committed bytes before sled's own figure was learnt.
    for line in &reopens[1..] {
        let log = field(line, "log_bytes").expect("the reopen says the log it covered");
        assert!(
            (BOUND / 2..=2 * BOUND).contains(&log),
            "a reopen after {log} bytes of log, with a bound of {BOUND}: {line}"
        );
        assert!(
            field(line, "wrote_bytes").is_some_and(|w| w > 0),
            "the reopen says what it wrote: {line}"
        );
    }
    let before = snapshot_lsn(&data).expect("a snapshot from the last reopen");
    drop(c);
    drop(gw);

    // The start after the kill replays the log from `before` to the tip, then writes its own
    // snapshot at the tip.
    let gw = Gateway::start(&data, &cfg);
    let (mut c, _) = Client::hello(&gw.url, &phone.token, &phone.device_id).await;
    let after = snapshot_lsn(&data).expect("the start's snapshot");
    assert!(
        after - before <= 2 * BOUND,
        "the start after the kill replayed {} bytes of log, with a bound of {BOUND}",
        after - before
    );
    // Nothing acknowledged was lost to the reopens or the kill.
    let page = c
        .request(
            "history",
            Some("default"),
            None,
            serde_json::json!({ "limit": 2 }),
        )
        .await;
    let reply = c.recv_reply(page).await;
    let texts: Vec<&str> = reply["payload"]["messages"]
        .as_array()
        .expect("a history page")
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert!(
        texts.iter().any(|t| t.starts_with("turn 99:")),
        "the last turn is in history: {reply}"
    );
}
