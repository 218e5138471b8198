//! What the LAN can make the box do before a session (docs/security.md, "What costs the box
//! work before a session"), end to end with the real binary: the passphrase meter answers only
//! a token the gateway stands behind (the set-up page's, issued by this gateway while the box
//! is unclaimed, or a signed-in owner's), so a flood of made-up cookie and header pairs from
//! many addresses runs no check and a paired phone's pings keep their pace meanwhile.
//!
//! The flood lasts `IRIS_ABUSE_SECS` seconds (10 by default; the full run is 60).

mod common;

use std::time::{Duration, Instant};

use common::web::Web;
use common::{connect, frame_type, owner_set, pair, temp_data_dir, Client, Gateway};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";
/// Addresses a flood comes from: more than one, as a rotating attacker's.
const ABUSERS: u8 = 8;
/// Each address sends a request this often (100 a second, 800 in all: thousands of times the
/// 120 a minute the meter allowed when one of them could stall every phone). Unpaced, the
/// connections alone keep a loaded 2-core machine's loop busy (the rate of new connections is
/// not limited, docs/security.md) and each flood's tens of thousands of sockets in TIME_WAIT
/// use up the addresses' ports.
const EVERY: Duration = Duration::from_millis(10);
/// The worst a paired phone's ping may take while the flood lasts.
const WORST_PING: Duration = Duration::from_millis(100);
/// One flood at a time in this file: two at once on a 2-core machine measure each other.
static ONE_FLOOD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A 100-character string of l33t substitutions: the zxcvbn estimator's most expensive kind of
/// input (1.2 s in a debug build), kept as the flood's passphrase: the check it gets now costs
/// microseconds, and the meter is still bounded by its count per minute.
fn costly_passphrase() -> String {
    "4@8(3!1|0$5+7".chars().cycle().take(100).collect()
}

fn abuse_secs() -> u64 {
    std::env::var("IRIS_ABUSE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// A browser that made its own token up: the same value as the pre-session cookie and in the
/// header, which is all a double-submit check compares.
fn forger(gw: &Gateway, n: u8) -> (Web, String) {
    let mut web = Web::new(gw, &format!("127.0.1.{}", 1 + n));
    let token = format!("made-up-token-{n}");
    web.jar.insert("iris_admin_pre".into(), token.clone());
    (web, token)
}

/// Asks the meter to rate [`costly_passphrase`] from each browser with its token, every
/// [`EVERY`] until `until`, on a thread of its own (so a phone's pings in the test wait for nothing
/// of it); every answer.
fn flood_meter(
    browsers: Vec<(Web, String)>,
    until: Instant,
) -> std::thread::JoinHandle<Vec<(u16, serde_json::Value)>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the flood's runtime");
        rt.block_on(async move {
            let costly = costly_passphrase();
            let tasks: Vec<_> = browsers
                .into_iter()
                .map(|(mut web, token)| {
                    let costly = costly.clone();
                    tokio::spawn(async move {
                        let mut answers = Vec::new();
                        let mut pace = tokio::time::interval(EVERY);
                        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        while Instant::now() < until {
                            pace.tick().await;
                            answers.push(web.strength(&token, &costly).await);
                        }
                        answers
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("a browser of the flood"));
            }
            all
        })
    })
}

/// Pings every `every` until `until`; the slowest round trip.
async fn worst_ping(c: &mut Client, until: Instant, every: Duration) -> Duration {
    let mut worst = Duration::ZERO;
    let mut pace = tokio::time::interval(every);
    let mut n = 0;
    while Instant::now() < until {
        pace.tick().await;
        n += 1;
        let sent = Instant::now();
        let id = c.request("ping", None, None, json!({ "ts": n })).await;
        let pong = c.recv_reply(id).await;
        worst = worst.max(sent.elapsed());
        assert_eq!(frame_type(&pong), "pong", "{pong}");
    }
    worst
}

#[tokio::test]
async fn made_up_meter_tokens_cost_nothing_and_phones_keep_their_pace() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let phone = pair(dir.path(), "phone");
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect(&gw, &phone).await;

    let _alone = ONE_FLOOD.lock().await;
    let until = Instant::now() + Duration::from_secs(abuse_secs());
    let flood = flood_meter((0..ABUSERS).map(|n| forger(&gw, n)).collect(), until);
    let worst = worst_ping(&mut c, until, Duration::from_millis(50)).await;
    let answers = flood.join().expect("the flood");
    let sent = answers.len();
    for (status, said) in answers {
        assert_eq!(status, 403, "a made-up token was answered: {said}");
        assert!(said.get("score").is_none(), "{said}");
    }
    eprintln!(
        "{sent} made-up meter requests from {ABUSERS} addresses in {} s; worst ping {worst:?}",
        abuse_secs()
    );
    assert!(sent >= usize::from(ABUSERS), "the flood did not run");
    assert!(
        worst <= WORST_PING,
        "a phone's ping took {worst:?} during the flood (at most {WORST_PING:?})"
    );

    // The owner, signed in, still gets the meter: the flood spent none of its budget.
    let mut owner = Web::new(&gw, "127.0.0.1");
    assert_eq!(owner.sign_in(PASSPHRASE).await.status, 303);
    let csrf = owner.csrf().await;
    let (status, verdict) = owner.strength(&csrf, "aaaaaaaaaaaa").await;
    assert_eq!(
        (status, verdict["ok"].clone()),
        (200, json!(false)),
        "{verdict}"
    );
    let (status, verdict) = owner.strength(&csrf, &costly_passphrase()).await;
    assert_eq!(status, 200, "{verdict}");
    assert!(verdict["score"].is_u64(), "{verdict}");
    // A session's cookie with a made-up header is no better than a made-up pair.
    let (status, _) = owner.strength("made-up", PASSPHRASE).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn the_setup_meter_answers_only_tokens_the_gateway_issued_while_unclaimed() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let (mut forged, token) = forger(&gw, 0);
    let (status, said) = forged.strength(&token, PASSPHRASE).await;
    assert_eq!(status, 403, "a made-up set-up token was answered: {said}");
    // Nor does a made-up token open the set-up form.
    let form = [
        ("pre", token.as_str()),
        ("passphrase", PASSPHRASE),
        ("confirm", PASSPHRASE),
    ];
    let refused = forged.request_form("/admin/setup", &form).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        !dir.path().join("owner.json").exists(),
        "claimed with a made-up token"
    );

    // The set-up page's own token is answered, and only with its cookie.
    let mut web = Web::new(&gw, "127.0.0.1");
    let pre = web.get("/admin/").await.field("pre");
    let (status, verdict) = web.strength(&pre, PASSPHRASE).await;
    assert_eq!(
        (status, verdict["ok"].clone()),
        (200, json!(true)),
        "{verdict}"
    );
    let (status, _) = forged.strength(&pre, PASSPHRASE).await;
    assert_eq!(status, 403, "the header without its cookie");
    // The whole passphrase is checked, past the 64 characters zxcvbn once rated too.
    let (_, verdict) = web.strength(&pre, &"ab".repeat(100)).await;
    assert_eq!(verdict["ok"], json!(false), "{verdict}");

    // Once the box is claimed, the set-up page's token buys nothing.
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);
    let mut late = Web::new(&gw, "127.0.0.3");
    late.jar.insert("iris_admin_pre".into(), pre.clone());
    let (status, said) = late.strength(&pre, PASSPHRASE).await;
    assert_eq!(status, 403, "a set-up token after the claim: {said}");
}

#[tokio::test]
async fn set_up_tokens_from_many_addresses_share_one_meter_count() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect(&gw, &phone).await;

    // Unclaimed, anyone on the LAN can load the set-up page and get a real token.
    let mut browsers = Vec::new();
    for n in 0..ABUSERS {
        let mut web = Web::new(&gw, &format!("127.0.2.{}", 1 + n));
        let pre = web.get("/admin/").await.field("pre");
        browsers.push((web, pre));
    }
    let _alone = ONE_FLOOD.lock().await;
    let until = Instant::now() + Duration::from_secs(abuse_secs());
    let flood = flood_meter(browsers, until);
    let worst = worst_ping(&mut c, until, Duration::from_millis(50)).await;
    let answers = flood.join().expect("the flood");
    let rated = answers.iter().filter(|(s, _)| *s == 200).count();
    let held_back = answers.iter().filter(|(s, _)| *s == 429).count();
    eprintln!(
        "{} meter requests with set-up tokens from {ABUSERS} addresses in {} s: {rated} rated, \
         {held_back} held back; worst ping {worst:?}",
        answers.len(),
        abuse_secs()
    );
    for (status, said) in &answers {
        assert!(*status == 200 || *status == 429, "{status}: {said}");
    }
    assert!(rated >= 1, "the meter rated nothing");
    assert!(
        held_back >= 1,
        "the meter rated every one of {} requests: no gateway-wide bound",
        answers.len()
    );
    assert!(
        worst <= WORST_PING,
        "a phone's ping took {worst:?} during the flood (at most {WORST_PING:?})"
    );
}
