//! The pairing and device-management commands of the real binary (`pair`, `devices`, the
//! start-up pairing code), with and without a gateway running from the same data dir, and the
//! tokens they mint proven against a real hello on 127.0.0.1.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{cli, devices_json, frame_type, pair, revoke, temp_data_dir, Client, Gateway, BIN};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// Says hello with `token` and consumes the greeting up to `status{online}`.
async fn hello_works(url: &str, token: &str) -> Client {
    let (mut c, ack) = Client::hello(url, token, "cli-test").await;
    assert_eq!(frame_type(&ack), "hello.ack", "{ack}");
    let status = c.recv().await;
    assert_eq!(frame_type(&status), "status", "{status}");
    assert_eq!(status["payload"]["state"], "online", "{status}");
    c
}

/// Port of a `ws://host:port` URL.
fn url_port(url: &str) -> u16 {
    let rest = url
        .strip_prefix("ws://")
        .unwrap_or_else(|| panic!("not a ws:// url: {url}"));
    let hostport = rest.split('/').next().unwrap_or(rest);
    let port = hostport
        .rsplit_once(':')
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("url has no port: {url}"));
    port.parse()
        .unwrap_or_else(|e| panic!("bad port in {url}: {e}"))
}

/// The device list of `devices --json` (an array, or an object holding `devices`).
fn device_list(data_dir: &Path) -> Vec<Value> {
    let v = devices_json(data_dir);
    let list = v
        .as_array()
        .or_else(|| v.get("devices").and_then(Value::as_array))
        .unwrap_or_else(|| panic!("`devices --json` is not a device list: {v}"));
    list.clone()
}

fn find_device<'a>(list: &'a [Value], device_id: &str) -> Option<&'a Value> {
    list.iter().find(|d| d["device_id"] == device_id)
}

#[track_caller]
fn assert_listed(list: &[Value], device_id: &str, name: &str) {
    let d = find_device(list, device_id)
        .unwrap_or_else(|| panic!("device {device_id} ({name}) not listed: {list:?}"));
    assert_eq!(d["name"], name, "wrong name for {device_id}: {d}");
}

/// `devices revoke` of an id that does not exist: non-zero exit and a message saying so.
#[track_caller]
fn assert_revoke_unknown_fails(data_dir: &Path, bogus: &str) {
    let dir = data_dir.to_str().expect("utf-8 path");
    let out = cli(&["devices", "--data-dir", dir, "revoke", bogus]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "revoking unknown {bogus} must fail; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains(bogus) || said.to_lowercase().contains("no device"),
        "the failure must say which device is unknown; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {d:?}: {e}")) {
            let entry = entry.expect("dir entry");
            let ft = entry.file_type().expect("file type");
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file() {
                out.push(entry.path());
            }
        }
    }
    out
}

/// Asserts no file under `dir` contains `token`, nor its random part without the prefix.
#[track_caller]
fn assert_not_stored(dir: &Path, token: &str) {
    let body = token.strip_prefix("iris_").unwrap_or(token);
    let files = files_under(dir);
    assert!(!files.is_empty(), "no files in {dir:?}?");
    for file in files {
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        for needle in [token, body] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "token {needle:?} is stored in clear text in {file:?}"
            );
        }
    }
}

/// Waits (bounded) for the gateway's stdout to contain a `token: …` line and returns the token
/// and the `url: …` printed with it.
fn startup_code(gw: &Gateway) -> (String, Option<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.stdout_tail();
        let field = |key: &str| {
            out.lines()
                .find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_owned()))
        };
        if let Some(token) = field("token:") {
            return (token, field("url:"));
        }
        assert!(
            Instant::now() < deadline,
            "no `token: …` line on stdout of a fresh gateway\n{}",
            gw.output_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A gateway started with nothing but `run --data-dir D --listen 127.0.0.1:0` (the harness
/// always adds `--demo-pace-ms 0`, which this must not).
struct BareGateway {
    child: Child,
    url: String,
}

impl BareGateway {
    fn start(data_dir: &Path) -> BareGateway {
        BareGateway::start_with(&["run"], data_dir)
    }

    /// `command` before the flags: `["run"]`, or nothing (run is the default command).
    fn start_with(command: &[&str], data_dir: &Path) -> BareGateway {
        let mut child = Command::new(BIN)
            .args(command)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {BIN}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keeps draining after the url is found so the child never blocks on stdout.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut gw = BareGateway {
            child,
            url: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(i) = line.find("listening on ws://") {
                        let url = line[i + "listening on ".len()..]
                            .split_whitespace()
                            .next()
                            .unwrap_or("")
                            .to_owned();
                        gw.url = url;
                        return gw;
                    }
                    seen.push(line);
                }
                Err(e) => panic!(
                    "bare gateway did not print `listening on ws://…` ({e:?}); stdout so far:\n{}",
                    seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for BareGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn pair_json_offline_then_token_works_once_running() {
    let dir = temp_data_dir();

    // No gateway: `pair` opens the store itself. The harness asserts exit 0 and one JSON line.
    let p = pair(dir.path(), "offline-phone");
    let keys: Vec<&str> = p
        .json
        .as_object()
        .expect("pair prints an object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["device_id", "token", "url"], "{}", p.json);
    assert!(p.token.starts_with("iris_"), "{}", p.json);
    assert!(
        p.token.len() > "iris_".len() + 20,
        "token too short to be a secret: {}",
        p.json
    );
    assert!(p.url.starts_with("ws://"), "{}", p.json);
    url_port(&p.url);
    assert!(!p.device_id.is_empty(), "{}", p.json);

    let gw = Gateway::start(dir.path(), &[]);
    let mut c = hello_works(&gw.url, &p.token).await;
    let id = c.request("ping", None, None, json!({ "ts": 5 })).await;
    assert_eq!(c.recv_reply(id).await["type"], "pong");
}

#[tokio::test]
async fn pair_json_while_running_uses_live_port_and_works_without_restart() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let a = pair(dir.path(), "phone-a");
    let b = pair(dir.path(), "phone-b");
    for p in [&a, &b] {
        assert!(p.token.starts_with("iris_"), "{}", p.json);
        assert!(p.url.starts_with("ws://"), "{}", p.json);
        assert_eq!(
            url_port(&p.url),
            gw.addr.port(),
            "pair must report the running gateway's port: {} vs {}",
            p.url,
            gw.url
        );
    }
    assert_ne!(a.token, b.token, "two pairs minted the same token");
    assert_ne!(
        a.device_id, b.device_id,
        "two pairs minted the same device id"
    );

    // Both work at once, through the url `pair` printed, with no restart in between.
    let mut ca = hello_works(&a.url, &a.token).await;
    let mut cb = hello_works(&b.url, &b.token).await;
    for c in [&mut ca, &mut cb] {
        let id = c.request("ping", None, None, json!({ "ts": 1 })).await;
        assert_eq!(c.recv_reply(id).await["type"], "pong");
    }
}

#[tokio::test]
async fn devices_list_and_revoke_running_and_offline() {
    let dir = temp_data_dir();

    // Offline: pair, list.
    let a = pair(dir.path(), "alpha phone");
    let list = device_list(dir.path());
    assert_listed(&list, &a.device_id, "alpha phone");

    // Running: pair another; both are listed through the control socket.
    let mut gw = Gateway::start(dir.path(), &[]);
    let b = pair(dir.path(), "beta tablet");
    let c = pair(dir.path(), "gamma laptop");
    let list = device_list(dir.path());
    assert_listed(&list, &a.device_id, "alpha phone");
    assert_listed(&list, &b.device_id, "beta tablet");
    assert_listed(&list, &c.device_id, "gamma laptop");

    // Revoke while running: gone from the list, and its token no longer works.
    revoke(dir.path(), &a.device_id);
    let list = device_list(dir.path());
    assert!(
        find_device(&list, &a.device_id).is_none(),
        "revoked device still listed: {list:?}"
    );
    assert_listed(&list, &b.device_id, "beta tablet");
    let mut refused = Client::open(&gw.url).await;
    refused
        .send(json!({ "v": 1, "type": "hello", "id": 1, "payload": { "token": a.token } }))
        .await;
    let err = refused.expect_error("auth").await;
    assert_eq!(err["id"], json!(1), "{err}");
    assert_revoke_unknown_fails(dir.path(), "dev_does_not_exist_running");

    // Not running: the store is read directly.
    assert!(gw.sigterm().success(), "gateway did not stop cleanly");
    let list = device_list(dir.path());
    assert!(find_device(&list, &a.device_id).is_none(), "{list:?}");
    assert_listed(&list, &b.device_id, "beta tablet");
    assert_listed(&list, &c.device_id, "gamma laptop");
    revoke(dir.path(), &b.device_id);
    let list = device_list(dir.path());
    assert!(
        find_device(&list, &b.device_id).is_none(),
        "offline revoke did not remove: {list:?}"
    );
    assert_listed(&list, &c.device_id, "gamma laptop");
    assert_revoke_unknown_fails(dir.path(), "dev_does_not_exist_offline");

    // An offline revoke holds after the next start.
    let gw = Gateway::start(dir.path(), &[]);
    let mut refused = Client::open(&gw.url).await;
    refused
        .send(json!({ "v": 1, "type": "hello", "id": 1, "payload": { "token": b.token } }))
        .await;
    refused.expect_error("auth").await;
    hello_works(&gw.url, &c.token).await;
}

#[tokio::test]
async fn tokens_are_not_stored_in_clear_text() {
    let dir = temp_data_dir();
    let offline = pair(dir.path(), "offline");
    let mut gw = Gateway::start(dir.path(), &[]);
    let (startup, _) = startup_code(&gw);
    let online = pair(dir.path(), "online");
    // Use each token once so every record the gateway keeps about a device is written.
    for token in [&offline.token, &online.token, &startup] {
        hello_works(&gw.url, token).await;
    }
    for token in [&offline.token, &online.token, &startup] {
        assert_not_stored(dir.path(), token);
    }
    assert!(gw.sigterm().success(), "gateway did not stop cleanly");
    for token in [&offline.token, &online.token, &startup] {
        assert_not_stored(dir.path(), token);
    }
}

#[tokio::test]
async fn startup_pairing_code_is_printed_on_a_fresh_dir_and_works() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let (token, url) = startup_code(&gw);
    assert!(
        token.starts_with("iris_"),
        "start-up token: {token:?}\n{}",
        gw.stdout_tail()
    );
    if let Some(url) = &url {
        assert_eq!(url_port(url), gw.addr.port(), "start-up url: {url}");
    }
    let mut c = hello_works(&gw.url, &token).await;
    let id = c.request("ping", None, None, json!({ "ts": 8 })).await;
    assert_eq!(c.recv_reply(id).await["type"], "pong");
}

#[tokio::test]
async fn bare_run_uses_the_demo_agent() {
    let dir = temp_data_dir();
    let gw = BareGateway::start(dir.path());
    let p = pair(dir.path(), "bare");
    let mut c = hello_works(&gw.url, &p.token).await;
    // Default demo pacing streams step by step; allow for it.
    c.timeout = Duration::from_secs(30);

    let text = "hello there";
    let id = c.send_text(None, None, &text).await;
    let receipt = c.recv_reply(id).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let stop = c.recv_type("message.stop").await;
    let want = "You said: \u{201c}hello there\u{201d}. That is 2 words and 11 characters. \
                I am the demo agent; connect a Hermes agent for real answers.";
    assert_eq!(stop["payload"]["final_text"], want, "{stop}");
    assert_eq!(stop["payload"]["model"], "iris-demo", "{stop}");
    assert_eq!(stop["chat_id"], "default", "{stop}");
    c.recv_until(|f| frame_type(f) == "typing" && f["payload"]["on"] == false)
        .await;
}

/// `status` asks the running gateway (over the control socket) for health, agent, push,
/// storage and devices; with no gateway running it says so and exits 3.
#[tokio::test]
async fn status_reports_the_running_gateway_and_says_when_none_runs() {
    let dir = temp_data_dir();
    let d = dir.path().to_str().unwrap();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let c = hello_works(&gw.url, &p.token).await;
    let text = common::cli_ok(&["status", "--data-dir", d]);
    assert!(text.contains("Gateway: online"), "{text}");
    assert!(text.contains("Agent:   demo"), "{text}");
    assert!(text.contains("connected"), "{text}");
    assert!(!text.contains(&p.token), "no secret in the status");
    let json: serde_json::Value =
        serde_json::from_str(&common::cli_ok(&["status", "--data-dir", d, "--json"])).unwrap();
    assert_eq!(json["state"], "online", "{json}");
    assert_eq!(json["devices_connected"], 1, "{json}");
    assert!(json["devices_paired"].as_u64().unwrap() >= 1, "{json}");
    assert!(json["disk_free_bytes"].as_u64().unwrap() > 0, "{json}");
    c.close().await;
    gw.stop_ok();

    let out = cli(&["status", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Gateway: not running"), "{text}");
    assert!(text.contains("paired"), "{text}");
}

/// `run` is the default command, so its flags work without it (a newcomer's first try).
#[tokio::test]
async fn flags_without_a_command_mean_run() {
    let dir = temp_data_dir();
    let gw = BareGateway::start_with(&[], dir.path());
    let p = pair(dir.path(), "flags only");
    let c = hello_works(&gw.url, &p.token).await;
    c.close().await;
    // An unknown flag is still an error, not silently a run.
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--no-such-flag"])
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}

/// After a crash (kill -9) the control socket file is left behind; `pair` must notice nothing
/// listens there, pair offline, and the token must work once the gateway is back.
#[tokio::test]
async fn pair_after_a_crash_ignores_the_stale_control_socket() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    gw.kill9();
    drop(gw);
    assert!(
        dir.path().join("control.sock").exists(),
        "expected the crashed gateway's control socket to be left behind"
    );

    let p = pair(dir.path(), "after-crash");
    assert!(p.token.starts_with("iris_"), "{}", p.json);

    let gw = Gateway::start(dir.path(), &[]);
    hello_works(&gw.url, &p.token).await;
    let list = device_list(dir.path());
    assert_listed(&list, &p.device_id, "after-crash");
}

/// The devices as `devices --json` lists them: (id, name, origin).
fn listed(dir: &Path) -> Vec<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    devices_json(dir)
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (s(&d["device_id"]), s(&d["name"]), s(&d["origin"])))
        .collect()
}

#[tokio::test]
async fn the_set_up_device_keeps_its_id_across_starts_and_goes_once_a_phone_connected() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let (first, _) = startup_code(&gw);
    let one = listed(dir.path());
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(one[0].1, "Set-up device (printed at start)");
    assert!(gw.sigterm().success());

    // Started again before any phone connected: the same device, with a new token.
    let mut gw = Gateway::start(dir.path(), &[]);
    let (second, _) = startup_code(&gw);
    assert_ne!(first, second, "each start prints a new token");
    assert_eq!(
        listed(dir.path()),
        one,
        "the same one device, same id and name"
    );
    let mut stale = Client::open(&gw.url).await;
    let id = stale.next_id();
    stale
        .send(json!({ "v": 1, "type": "hello", "id": id, "payload": { "token": first } }))
        .await;
    let refused = stale
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(
        frame_type(&refused),
        "error",
        "an older printed token works no more"
    );

    // A phone paired otherwise connects: at the next start the unused set-up device is gone.
    let phone = pair(dir.path(), "phone");
    hello_works(&gw.url, &phone.token).await;
    assert!(gw.sigterm().success());
    let gw = Gateway::start(dir.path(), &[]);
    let _ = started_hint(&gw);
    let left = listed(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, phone.device_id);
}

/// Waits until the gateway listens (its start-up, including the set-up device, is done).
fn started_hint(gw: &Gateway) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.stdout_tail();
        if let Some(l) = out.lines().find(|l| l.contains("pair another device")) {
            return l.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no start-up hint:\n{}",
            gw.output_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
