//! One device's queries must not freeze the others: with 20,000 messages in history, another
//! device's `ping` is answered within a loose bound (one second) while a device sends costly
//! searches as fast as its frame rate allows (the query the index cannot see, `n ᦰ`, and the
//! 36 one-character prefixes `a … z 0 … 9`), and while a channel of 2,000 messages is
//! deleted. Before the query thread these waited 8 s, 19 s and 1.9 s. The figures themselves
//! are benchmarks (benches/gateway.rs, docs/benchmarks.md); this only bounds them.
//!
//! The history is filled through the store's own commit path before the gateway starts (as
//! the benchmarks do), not message by message over the socket: tens of seconds, not minutes.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{connect_online, frame_type, pair, pstr, temp_data_dir, Client, Gateway};
use iris_gateway::protocol::{Channel, ChannelKind, Frame, HistoryMessage, Lane, Role};
use iris_gateway::store::{Change, Store};
use serde_json::json;
use tokio::time::Instant;

const HISTORY: usize = 20_000;
const CHANNEL: usize = 2_000;
const BULK: &str = "chan_bulk";
/// The loose bound: far above a healthy ping (milliseconds), far below the stalls it guards.
const PING_BOUND: Duration = Duration::from_secs(1);

/// Words for every letter (50 variants each, so the index holds many terms per prefix), and
/// numbers for every digit.
fn text(i: usize) -> String {
    const STEMS: [&str; 26] = [
        "apple", "bread", "cider", "dough", "eagle", "fable", "grape", "hazel", "inlet", "jelly",
        "kiwi", "lemon", "mango", "nectar", "olive", "pearl", "quail", "radish", "salad", "tulip",
        "umber", "violet", "wheat", "xenon", "yeast", "zest",
    ];
    let mut t = format!("note {i}: ");
    for (k, stem) in STEMS.iter().enumerate() {
        t.push_str(&format!("{stem}{} ", (i + k) % 50));
    }
    t.push_str(&format!("{} {}", i % 10, (i * 7) % 1000));
    t
}

fn message(id: String, text: String, i: usize) -> HistoryMessage {
    let role = if i.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    HistoryMessage::text_only(id, role, text, 1_760_000_000_000 + i as i64)
}

/// `HISTORY` messages in the default channel, and a channel `BULK` of `CHANNEL` messages with
/// their outbox frames (which its deletion turns into tombstones), 1,000 per commit.
fn fill(dir: &Path) {
    let store = Store::open(dir, 1 << 20, Duration::from_secs(5)).unwrap();
    let mut bulk = Channel::new(BULK.into(), "Bulk".into(), ChannelKind::Channel, None);
    bulk.archived = false;
    store.commit(&[Change::PutChannel(bulk)]).unwrap();
    let default = Lane::new("default", None);
    let mut batch = Vec::new();
    for i in 0..HISTORY {
        let m = message(format!("msg_{i:08}"), text(i), i);
        batch.push(Change::PutMessage(default.clone(), m));
        if batch.len() == 1000 {
            store.commit(&batch).unwrap();
            batch.clear();
            store.sync_blocking().unwrap();
        }
    }
    let lane = Lane::new(BULK, None);
    for i in 0..CHANNEL {
        let m = message(format!("bulk_{i:08}"), format!("pumice {}", text(i)), i);
        let frame = Frame::message(&m).in_lane(BULK, None).outboxed();
        batch.push(Change::OutboxOf {
            message_id: m.message_id.clone(),
            frame,
        });
        batch.push(Change::PutMessage(lane.clone(), m));
        if batch.len() == 1000 {
            store.commit(&batch).unwrap();
            batch.clear();
            store.sync_blocking().unwrap();
        }
    }
    store.commit(&batch).unwrap();
    store.sync_blocking().unwrap();
    store.checkpoint_blocking().unwrap();
}

/// Pings every `every` until `stop` says so; returns the slowest round trip and how many.
async fn ping_while(
    c: &mut Client,
    every: Duration,
    stop: &std::cell::Cell<bool>,
) -> (Duration, usize) {
    let mut worst = Duration::ZERO;
    let mut n = 0;
    while !stop.get() {
        let sent = Instant::now();
        let id = c.request("ping", None, None, json!({})).await;
        let pong = c.recv_reply(id).await;
        assert_eq!(frame_type(&pong), "pong", "{pong}");
        worst = worst.max(sent.elapsed());
        n += 1;
        tokio::time::sleep_until(sent + every).await;
    }
    (worst, n)
}

#[tokio::test]
async fn pings_are_answered_while_another_device_searches_and_deletes_a_channel() {
    let dir = temp_data_dir();
    let searcher = pair(dir.path(), "searcher");
    let pinger = pair(dir.path(), "pinger");
    let filling = Instant::now();
    fill(dir.path());
    eprintln!("filled in {:?}", filling.elapsed());
    let gw = Gateway::start(dir.path(), &[]);
    let (mut a, _) = connect_online(&gw, &searcher).await;
    let (mut b, _) = connect_online(&gw, &pinger).await;
    a.timeout = Duration::from_secs(60);
    b.timeout = Duration::from_secs(60);

    // 1. Searches every 50 ms for 6 s, not waiting for their answers (the frame rate limit's
    // pace), alternating the two costly queries.
    let alphabet: String = ('a'..='z')
        .chain('0'..='9')
        .map(|c| format!("{c} "))
        .collect();
    let queries = ["n \u{19b0}".to_owned(), alphabet.trim().to_owned()];
    let done = std::cell::Cell::new(false);
    let search = async {
        let end = Instant::now() + Duration::from_secs(6);
        let mut next = Instant::now();
        let (mut sent, mut answered, mut results, mut limited) = (0, 0, 0, 0);
        while answered < sent || Instant::now() < end {
            if Instant::now() >= next && Instant::now() < end {
                let q = &queries[sent % 2];
                a.request("search", None, None, json!({ "query": q, "limit": 20 }))
                    .await;
                sent += 1;
                next += Duration::from_millis(50);
            }
            let until = if Instant::now() < end {
                next
            } else {
                Instant::now() + Duration::from_secs(60)
            };
            if let Some(f) = a.recv_before(until).await {
                match frame_type(&f) {
                    "search.results" => {
                        answered += 1;
                        results += 1;
                    }
                    "error" if pstr(&f, "code") == "rate_limited" => {
                        answered += 1;
                        limited += 1;
                    }
                    "error" => panic!("search refused: {f}"),
                    _ => {}
                }
            }
        }
        done.set(true);
        (sent, results, limited)
    };
    let ((sent, results, limited), (worst, pings)) = tokio::join!(
        search,
        ping_while(&mut b, Duration::from_millis(100), &done)
    );
    eprintln!(
        "searches: {sent} sent, {results} answered, {limited} rate limited; \
         pings: {pings}, slowest {worst:?}"
    );
    assert!(
        results >= 4,
        "the costly searches must run ({results} answered)"
    );
    assert!(
        worst < PING_BOUND,
        "another device's ping waited {worst:?} while a device searched"
    );

    // 2. Deleting the 2,000-message channel.
    let done = std::cell::Cell::new(false);
    let delete = async {
        let id = a
            .request("channel.delete", Some(BULK), None, json!({}))
            .await;
        let r = a.recv_reply(id).await;
        done.set(true);
        r
    };
    let (reply, (worst, pings)) =
        tokio::join!(delete, ping_while(&mut b, Duration::from_millis(50), &done));
    eprintln!("channel delete: pings {pings}, slowest {worst:?}");
    assert_eq!(frame_type(&reply), "channel.deleted", "{reply}");
    assert!(
        worst < PING_BOUND,
        "another device's ping waited {worst:?} while a channel was deleted"
    );
    // Gone from search; the rest is still found.
    tokio::time::sleep(Duration::from_millis(2100)).await; // the budget of part 1 refills
    let id = a
        .request("search", None, None, json!({ "query": "pumice" }))
        .await;
    let r = a.recv_reply(id).await;
    assert_eq!(frame_type(&r), "search.results", "{r}");
    assert_eq!(r["payload"]["hits"], json!([]), "{r}");
    let id = a
        .request("search", None, None, json!({ "query": "nectar7 apple" }))
        .await;
    let r = a.recv_reply(id).await;
    assert_eq!(frame_type(&r), "search.results", "{r}");
    assert!(!r["payload"]["hits"].as_array().unwrap().is_empty(), "{r}");
}
