//! Storage benchmark: durable appends through the outbox and history paging, each beside a
//! baseline measured in the same run (these machines are noisy; ratios travel, seconds do not).
//!
//! `cargo bench --bench store` (add `-- --messages N --history N` for a longer run). Prints a
//! Markdown table; `docs/benchmarks.md` keeps the latest figures.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use iris_gateway::protocol::{Frame, HistoryMessage, Lane, Role};
use iris_gateway::store::{Change, PendingTurn, Store};

struct Args {
    messages: usize,
    history: usize,
}

fn args() -> Args {
    let mut a = Args {
        messages: 1000,
        history: 100_000,
    };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        match w[0].as_str() {
            "--messages" => a.messages = w[1].parse().expect("--messages N"),
            "--history" => a.history = w[1].parse().expect("--history N"),
            _ => {}
        }
    }
    a
}

/// Bytes this process has caused to be written to the block device so far.
fn disk_writes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn message(i: usize) -> HistoryMessage {
    HistoryMessage::text_only(
        format!("msg_{i:016x}"),
        Role::User,
        format!("message number {i}: could you remind me to water the tomatoes tomorrow at eight, and check the forecast first?"),
        1_760_000_000_000 + i as i64,
    )
}

/// What `message.send` commits for one user message.
fn user_message_changes(lane: &Lane, i: usize) -> Vec<Change> {
    let m = message(i);
    let echo = Frame::message(&m)
        .in_lane(&lane.chat_id, lane.thread())
        .outboxed();
    vec![
        Change::PutMessage(lane.clone(), m.clone()),
        Change::Outbox(echo),
        Change::BeginTurn(PendingTurn {
            user_message_id: m.message_id,
            lane: lane.clone(),
            text: m.text,
        }),
    ]
}

struct Row {
    what: String,
    value: String,
    baseline: String,
    ratio: String,
}

fn durable_append(dir: &Path, n: usize, group: usize) -> (Duration, u64) {
    let store = Store::open(
        &dir.join(format!("append-{group}")),
        1 << 20,
        Duration::from_secs(1),
    )
    .expect("open store");
    let lane = Lane::new("default", None);
    let writes0 = disk_writes();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        for _ in 0..group.min(n - i) {
            store
                .commit(&user_message_changes(&lane, i))
                .expect("commit");
            i += 1;
        }
        store.sync_blocking().expect("fsync");
    }
    (t.elapsed(), disk_writes() - writes0)
}

/// The same bytes appended to a plain file with the same fsync policy.
fn file_append(dir: &Path, n: usize, group: usize) -> (Duration, u64) {
    let lane = Lane::new("default", None);
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("plain-{group}.log")))
        .expect("open file");
    let writes0 = disk_writes();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        for _ in 0..group.min(n - i) {
            for c in user_message_changes(&lane, i) {
                let bytes = match c {
                    Change::Outbox(b) => b.bytes.to_vec(),
                    Change::PutMessage(_, m) => serde_json::to_vec(&m).unwrap(),
                    Change::BeginTurn(p) => serde_json::to_vec(&p).unwrap(),
                    _ => Vec::new(),
                };
                f.write_all(&bytes).unwrap();
            }
            i += 1;
        }
        f.sync_data().unwrap();
    }
    (t.elapsed(), disk_writes() - writes0)
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let a = args();
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir on disk");
    let mut rows = Vec::new();

    for group in [1usize, 16] {
        let (st, sw) = durable_append(tmp.path(), a.messages, group);
        let (ft, fw) = file_append(tmp.path(), a.messages, group);
        let (s_rate, f_rate) = (per_sec(a.messages, st), per_sec(a.messages, ft));
        rows.push(Row {
            what: format!("durable user messages/s, {group} per fsync"),
            value: format!("{s_rate:.0}"),
            baseline: format!("{f_rate:.0} (plain file append + fsync)"),
            ratio: format!("{:.2}", s_rate / f_rate),
        });
        rows.push(Row {
            what: format!("bytes written to disk per message, {group} per fsync"),
            value: format!("{}", sw / a.messages as u64),
            baseline: format!("{} (plain file)", fw / a.messages as u64),
            ratio: format!("{:.1}", sw as f64 / fw.max(1) as f64),
        });
    }

    // History paging cost must not depend on how much is stored: page the same lane with a
    // small and a large total and compare.
    let page = |total: usize, name: &str| -> Duration {
        let store = Store::open(&tmp.path().join(name), 1 << 20, Duration::from_secs(1)).unwrap();
        let lane = Lane::new("default", None);
        let other = Lane::new("chan_other", None);
        let mut batch = Vec::new();
        for i in 0..total {
            // Most history lives in other lanes; the paged lane holds 1,000 messages.
            let l = if i % (total / 1000).max(1) == 0 {
                &lane
            } else {
                &other
            };
            batch.push(Change::PutMessage(l.clone(), message(i)));
            if batch.len() == 1000 {
                store.commit(&batch).unwrap();
                batch.clear();
            }
        }
        store.commit(&batch).unwrap();
        store.sync_blocking().unwrap();
        let rounds = 200;
        let t = Instant::now();
        for _ in 0..rounds {
            let p = store.history_page(&lane, None, 50).unwrap().unwrap();
            assert_eq!(p.messages.len(), 50);
        }
        t.elapsed() / rounds
    };
    let small = page(2_000, "hist-small");
    let large = page(a.history, "hist-large");
    rows.push(Row {
        what: format!("history page of 50 at {} stored messages", a.history),
        value: format!("{:.0} µs", large.as_secs_f64() * 1e6),
        baseline: format!("{:.0} µs at 2,000 stored", small.as_secs_f64() * 1e6),
        ratio: format!("{:.2}", large.as_secs_f64() / small.as_secs_f64()),
    });

    // Search at `a.history` stored messages: the index against a naive scan of every message
    // (what the index exists to avoid), both in this run.
    {
        let store =
            Store::open(&tmp.path().join("search"), 1 << 20, Duration::from_secs(1)).unwrap();
        let vocab = [
            "garden", "tomato", "zucchini", "forecast", "water", "reminder", "kitchen", "recipe",
            "battery", "invoice", "holiday", "train", "meeting", "birthday", "printer", "router",
        ];
        let lanes = [
            Lane::new("default", None),
            Lane::new("chan_a", None),
            Lane::new("chan_b", Some("thr_1")),
        ];
        let disk0 = store.size_on_disk().unwrap();
        let mut batch = Vec::new();
        for i in 0..a.history {
            let mut m = message(i);
            m.text = format!(
                "{} {} {} note {i} about the {} and the {}",
                vocab[i % 16],
                vocab[(i / 16) % 16],
                vocab[(i / 256) % 16],
                vocab[(i * 7) % 16],
                if i % 1000 == 0 {
                    "aubergine"
                } else {
                    "usual things"
                }
            );
            batch.push(Change::PutMessage(lanes[i % 3].clone(), m));
            if batch.len() == 1000 {
                store.commit(&batch).unwrap();
                batch.clear();
            }
        }
        store.commit(&batch).unwrap();
        store.sync_blocking().unwrap();
        store.close_cleanly().unwrap();
        let disk = store.size_on_disk().unwrap().saturating_sub(disk0);
        let history_bytes = store.history_bytes().unwrap();
        let text_bytes: usize = (0..a.history.min(10_000))
            .map(|i| 40 + format!("note {i} about the usual things").len())
            .sum::<usize>()
            / a.history.min(10_000);
        let time = |words: &[&str]| {
            let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            let rounds = 50;
            let t = Instant::now();
            let mut hits = 0;
            for _ in 0..rounds {
                hits = store
                    .search(&words, &iris_gateway::store::search::Scope::All, 20)
                    .unwrap()
                    .len();
            }
            (t.elapsed() / rounds, hits)
        };
        let (rare, rare_hits) = time(&["aubergine"]);
        let (common, _) = time(&["gar", "tom"]);
        let t = Instant::now();
        let mut naive_hits = 0;
        for m in store.all_messages().unwrap() {
            if m.text.contains("aubergine") {
                naive_hits += 1;
            }
        }
        let naive = t.elapsed();
        assert!(
            rare_hits.min(20) == naive_hits.min(20),
            "index and scan disagree"
        );
        rows.push(Row {
            what: format!("search, rare word, {} messages", a.history),
            value: format!("{:.2} ms", rare.as_secs_f64() * 1e3),
            baseline: format!(
                "{:.1} ms (scan of every message)",
                naive.as_secs_f64() * 1e3
            ),
            ratio: format!("{:.4}", rare.as_secs_f64() / naive.as_secs_f64()),
        });
        rows.push(Row {
            what: "search, two common prefixes".into(),
            value: format!("{:.2} ms", common.as_secs_f64() * 1e3),
            baseline: format!(
                "{:.1} ms (scan of every message)",
                naive.as_secs_f64() * 1e3
            ),
            ratio: format!("{:.4}", common.as_secs_f64() / naive.as_secs_f64()),
        });
        rows.push(Row {
            what: "history database per message on disk (row, ids, FTS5 index)".into(),
            value: format!("{} B", history_bytes / a.history as u64),
            baseline: format!(
                "{} B of text per message; {} B per message for the whole store",
                text_bytes,
                disk / a.history as u64
            ),
            ratio: format!(
                "{:.2}",
                history_bytes as f64 / a.history as f64 / text_bytes as f64
            ),
        });
    }

    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::env::consts::ARCH
    );
    println!("| figure | value | baseline (same run) | ratio |");
    println!("|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} |",
            r.what, r.value, r.baseline, r.ratio
        );
    }
}
