//! The guessing limits under concurrency, end to end with the real binary on 127.0.0.1: for each
//! door that takes a secret (admin sign-in, the change-passphrase form, the pairing page, the
//! hello gate, webhooks), requests launched together from one address are counted as they
//! begin, so at most the limit reach the secret, and the right secret sent after them is
//! refused; many addresses together stay within the documented bound (docs/security.md,
//! "Guessing"; docs/limits.md).

mod common;

use iris_gateway::pairing::percent_encode as encode;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::{
    frame_type, owner_set, pair, startup_page_code, temp_data_dir, Client, Gateway, RawHttp,
};
use serde_json::json;
use tokio::sync::{mpsc, Barrier};

const PASSPHRASE: &str = "violet tractor harbour 42";
const HOOK_TOKEN: &str = "door-token-0123456789";

/// One HTTP/1.1 request from `from` (a loopback address), read to the close. The connection is
/// made first; the request is written once `go` lets every request of the batch go together.
async fn http_from(addr: SocketAddr, from: &str, request: String, go: Arc<Barrier>) -> RawHttp {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse::<SocketAddr>().unwrap())
        .expect("bind the client address");
    let tcp = tokio::time::timeout(Duration::from_secs(10), socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    go.wait().await;
    common::raw_http(tcp, &request, Duration::from_secs(120)).await
}

/// Sends every `(from, request)` at once and hands each answer's status to `seen` as it comes.
fn launch_together(
    addr: SocketAddr,
    requests: Vec<(String, String)>,
) -> mpsc::UnboundedReceiver<(String, RawHttp)> {
    let go = Arc::new(Barrier::new(requests.len()));
    let (tx, rx) = mpsc::unbounded_channel();
    for (from, request) in requests {
        let (go, tx) = (go.clone(), tx.clone());
        tokio::spawn(async move {
            let reply = http_from(addr, &from, request, go).await;
            let _ = tx.send((from, reply));
        });
    }
    rx
}

/// Every answer of a batch, with where it was sent from.
async fn all_of(mut rx: mpsc::UnboundedReceiver<(String, RawHttp)>) -> Vec<(String, RawHttp)> {
    let mut out = Vec::new();
    while let Some(r) = rx.recv().await {
        out.push(r);
    }
    out
}

fn post(addr: SocketAddr, path: &str, extra_headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/html\r\n{extra_headers}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

fn get(addr: SocketAddr, path: &str, extra_headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/html\r\n{extra_headers}Connection: close\r\n\r\n")
}

/// One request on its own.
async fn one(addr: SocketAddr, from: &str, request: String) -> RawHttp {
    http_from(addr, from, request, Arc::new(Barrier::new(1))).await
}

fn cookie(reply: &RawHttp, name: &str) -> Option<String> {
    reply
        .headers
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .find_map(|(_, v)| {
            let first = v.split(';').next()?;
            let (k, v) = first.split_once('=')?;
            (k == name).then(|| v.to_owned())
        })
}

fn field(reply: &RawHttp, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = reply
        .body
        .find(&marker)
        .unwrap_or_else(|| panic!("no field {name} in:\n{}", reply.body))
        + marker.len();
    reply.body[start..].split('"').next().unwrap().to_owned()
}

fn header<'a>(reply: &'a RawHttp, name: &str) -> Option<&'a str> {
    reply
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn show(r: &RawHttp) -> String {
    format!("HTTP {} {:?}\n{}", r.status, r.headers, r.body)
}

fn count(replies: &[(String, RawHttp)], status: u16) -> usize {
    replies.iter().filter(|(_, r)| r.status == status).count()
}

/// The sign-in form's double-submit token for `from`: the cookie header and the form field.
async fn signin_token(gw: &Gateway, from: &str) -> (String, String) {
    let page = one(gw.addr, from, get(gw.addr, "/admin/", "")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let pre = cookie(&page, "iris_admin_pre").expect("a pre-session cookie");
    (
        format!("Cookie: iris_admin_pre={pre}\r\n"),
        field(&page, "pre"),
    )
}

fn signin(gw: &Gateway, token: &(String, String), passphrase: &str) -> String {
    let body = format!("pre={}&passphrase={}", encode(&token.1), encode(passphrase));
    post(gw.addr, "/admin/signin", &token.0, &body)
}

fn admin_gateway(per_minute: u32) -> (tempfile::TempDir, Gateway) {
    let dir = temp_data_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[limits]\nadmin_signin_failures_per_minute = {per_minute}\n"),
    )
    .unwrap();
    let data = dir.path().join("data");
    owner_set(&data, PASSPHRASE);
    let gw = Gateway::start(&data, &["--config", config.to_str().unwrap()]);
    (dir, gw)
}

#[tokio::test]
async fn sign_ins_sent_together_are_counted_before_the_passphrase_is_hashed() {
    let (_dir, gw) = admin_gateway(5);
    let from = "127.0.0.2";
    let token = signin_token(&gw, from).await;
    let wrong: Vec<_> = (0..15)
        .map(|_| (from.to_owned(), signin(&gw, &token, "not the passphrase")))
        .collect();
    let mut rx = launch_together(gw.addr, wrong);
    // Once one of them is refused, the limit is spent: the right passphrase, sent while the
    // wrong ones are still being hashed, must be refused too (it was let in before the fix).
    let mut replies = Vec::new();
    while let Some(r) = rx.recv().await {
        let refused = r.1.status == 429;
        replies.push(r);
        if refused {
            break;
        }
    }
    let right = one(gw.addr, from, signin(&gw, &token, PASSPHRASE)).await;
    replies.extend(all_of(rx).await);
    let checked = count(&replies, 401);
    assert!(
        checked <= 5,
        "{checked} of 15 simultaneous wrong passphrases were checked (limit 5)"
    );
    assert_eq!(checked + count(&replies, 429), 15);
    assert_eq!(
        right.status,
        429,
        "the right passphrase after the limit: {}",
        show(&right)
    );
    assert!(header(&right, "retry-after").is_some());
    assert!(
        !right.body.contains("limits."),
        "the owner's page names no config key: {}",
        right.body
    );
    // Another address is not affected.
    let other = signin_token(&gw, "127.0.0.3").await;
    let ok = one(gw.addr, "127.0.0.3", signin(&gw, &other, PASSPHRASE)).await;
    assert_eq!(ok.status, 303, "{}", show(&ok));
}

#[tokio::test]
async fn sign_ins_from_many_addresses_together_stay_within_the_documented_bound() {
    // 16 addresses counted one by one plus one shared count (docs/limits.md): 17 × 2.
    let (_dir, gw) = admin_gateway(2);
    let from = |n: u32| format!("127.0.1.{}", n + 1);
    let mut requests = Vec::new();
    for n in 0..20 {
        let token = signin_token(&gw, &from(n)).await;
        for _ in 0..3 {
            requests.push((from(n), signin(&gw, &token, "guess guess guess")));
        }
    }
    let replies = all_of(launch_together(gw.addr, requests)).await;
    let checked = count(&replies, 401);
    assert_eq!(checked + count(&replies, 429), 60);
    assert!(
        checked <= 17 * 2,
        "{checked} of 60 guesses from 20 addresses were checked (bound 34)"
    );
    for n in 0..20 {
        let own = replies
            .iter()
            .filter(|(f, r)| *f == from(n) && r.status == 401)
            .count();
        assert!(own <= 2, "{own} guesses checked from {}", from(n));
    }
}

#[tokio::test]
async fn wrong_current_passphrases_are_refused_past_the_limit() {
    let (_dir, gw) = admin_gateway(5);
    let from = "127.0.0.4";
    let token = signin_token(&gw, from).await;
    let signed = one(gw.addr, from, signin(&gw, &token, PASSPHRASE)).await;
    assert_eq!(signed.status, 303, "{}", show(&signed));
    let session = format!(
        "Cookie: iris_admin={}\r\n",
        cookie(&signed, "iris_admin").expect("a session cookie")
    );
    let page = one(gw.addr, from, get(gw.addr, "/admin/owner", &session)).await;
    let csrf = field(&page, "csrf");
    let change = |current: &str| {
        let new = "a much better passphrase";
        let body = format!(
            "csrf={}&current={}&passphrase={}&confirm={}",
            encode(&csrf),
            encode(current),
            encode(new),
            encode(new)
        );
        post(gw.addr, "/admin/passphrase", &session, &body)
    };
    let wrong: Vec<_> = (0..12)
        .map(|_| (from.to_owned(), change("not the passphrase")))
        .collect();
    let replies = all_of(launch_together(gw.addr, wrong)).await;
    // A checked one is refused on the Owner page it redirects to (303); past the limit, 429.
    let checked = count(&replies, 303);
    assert!(
        checked <= 5,
        "{checked} of 12 wrong current passphrases were checked (limit 5)"
    );
    assert_eq!(checked + count(&replies, 429), 12);
    let right = one(gw.addr, from, change(PASSPHRASE)).await;
    assert_eq!(
        right.status,
        429,
        "the right one past the limit: {}",
        show(&right)
    );
    assert!(header(&right, "retry-after").is_some());
    assert!(
        right.body.contains("Too many wrong passphrases") && !right.body.contains("limits."),
        "a clear message without config keys: {}",
        right.body
    );
    // The passphrase is unchanged, and sign-in shares the count.
    let again = one(gw.addr, from, signin(&gw, &token, PASSPHRASE)).await;
    assert_eq!(again.status, 429, "{}", show(&again));
    let other = signin_token(&gw, "127.0.0.5").await;
    let ok = one(gw.addr, "127.0.0.5", signin(&gw, &other, PASSPHRASE)).await;
    assert_eq!(
        ok.status,
        303,
        "the passphrase must be unchanged: {}",
        show(&ok)
    );
}

#[tokio::test]
async fn pairing_codes_sent_together_are_limited_per_address() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let code = startup_page_code(&gw);
    let from = "127.0.0.6";
    let wrong: Vec<_> = (0..15)
        .map(|_| {
            (
                from.to_owned(),
                post(gw.addr, "/pair", "", "code=0000-0000"),
            )
        })
        .collect();
    let replies = all_of(launch_together(gw.addr, wrong)).await;
    let checked = count(&replies, 403);
    assert!(checked <= 5, "{checked} of 15 wrong codes were checked");
    assert_eq!(checked + count(&replies, 429), 15);
    let right = one(
        gw.addr,
        from,
        post(gw.addr, "/pair", "", &format!("code={code}")),
    )
    .await;
    assert_eq!(right.status, 429, "{}", show(&right));
    let elsewhere = one(
        gw.addr,
        "127.0.0.7",
        post(gw.addr, "/pair", "", &format!("code={code}")),
    )
    .await;
    assert_eq!(elsewhere.status, 200, "{}", show(&elsewhere));
}

#[tokio::test]
async fn webhook_tokens_sent_together_are_limited_per_address() {
    let dir = temp_data_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[[webhook]]\nname = \"door\"\nchannel = \"Alerts\"\ntoken = \"{HOOK_TOKEN}\"\n"),
    )
    .unwrap();
    let data = dir.path().join("data");
    let gw = Gateway::start(&data, &["--config", config.to_str().unwrap()]);
    let hook = |token: &str| {
        format!(
            "POST /hooks/door HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        )
    };
    let from = "127.0.0.8";
    let wrong: Vec<_> = (0..15)
        .map(|n| (from.to_owned(), hook(&format!("guess-{n:016}"))))
        .collect();
    let replies = all_of(launch_together(gw.addr, wrong)).await;
    let checked = count(&replies, 401);
    assert!(
        checked <= 5,
        "{checked} of 15 wrong webhook tokens were checked"
    );
    assert_eq!(checked + count(&replies, 429), 15);
    let right = one(gw.addr, from, hook(HOOK_TOKEN)).await;
    assert_eq!(right.status, 429, "{}", show(&right));
    assert!(header(&right, "retry-after").is_some());
    assert!(
        right.body.contains("wrong webhook tokens"),
        "{}",
        right.body
    );
    let elsewhere = one(gw.addr, "127.0.0.9", hook(HOOK_TOKEN)).await;
    assert_eq!(elsewhere.status, 202, "{}", show(&elsewhere));
}

#[tokio::test]
async fn hellos_sent_together_are_limited_per_address() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let from: IpAddr = "127.0.0.10".parse().unwrap();
    let mut clients = Vec::new();
    for _ in 0..15 {
        clients.push(Client::open_from(&gw.url, gw.addr, from).await);
    }
    // Every hello is written before any answer is read.
    for (n, c) in clients.iter_mut().enumerate() {
        c.send(json!({ "v": 1, "type": "hello", "id": 1, "payload": {
            "token": format!("iris_wrong{n:040}"), "device_id": format!("guess-{n}"),
            "device_name": "guesser" } }))
            .await;
    }
    let (mut checked, mut limited) = (0, 0);
    for c in clients.iter_mut() {
        let e = c.recv_until(|f| frame_type(f) == "error").await;
        match e["payload"]["code"].as_str() {
            Some("auth") => checked += 1,
            Some("rate_limited") => limited += 1,
            other => panic!("unexpected {other:?}: {e}"),
        }
    }
    assert!(checked <= 5, "{checked} of 15 wrong tokens were checked");
    assert_eq!(checked + limited, 15);
    for c in clients.iter_mut() {
        c.expect_closed().await;
    }
    drop(clients);
    let mut c = Client::open_from(&gw.url, gw.addr, from).await;
    c.send(json!({ "v": 1, "type": "hello", "id": 1, "payload": {
        "token": p.token, "device_id": p.device_id, "device_name": "phone" } }))
        .await;
    let e = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(e["payload"]["code"], "rate_limited", "{e}");
    let mut elsewhere = Client::open_from(&gw.url, gw.addr, "127.0.0.11".parse().unwrap()).await;
    elsewhere.hello_on(&p.token, &p.device_id).await;
}
