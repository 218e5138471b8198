//! The admin web app, end to end with the real binary on 127.0.0.1: set-up (claiming the box),
//! sign-in, sessions and CSRF over plain HTTP, and every section driven in a real headless
//! Chromium over the DevTools protocol (tests/common/cdp.rs): claim, pair a phone from the
//! QR code in a screenshot, rename and revoke (its socket closes), switch the agent to the
//! OpenAI-compatible mock with no restart, a test push to a fake ntfy server, read the log.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cdp::{assert_page_shows, decode_qr, Browser};
use common::peers::MockLlm;
use common::web::{Reply, Web};
use common::{
    cli, devices_json, fake_http, frame_type, nth_listening, owner_set, pair, temp_data_dir,
    Client, Gateway,
};
use serde_json::{json, Value};

const PASSPHRASE: &str = "violet tractor harbour 42";

fn admin_config(dir: &Path, limits: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, format!("[limits]\n{limits}\n")).expect("write config");
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn no_session_is_refused_and_the_box_is_claimed_once() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");

    // A browser's GET / lands on the app; the app's own WebSocket answer is unchanged.
    let root = web.get("/").await;
    assert_eq!(root.status, 303, "{root:?}");
    assert_eq!(root.header("location"), Some("/admin/"));

    // Unclaimed: set-up only.
    let setup = web.get("/admin/").await;
    assert!(setup.body.contains("Claim this gateway"), "{}", setup.body);
    assert!(setup.body.contains("plain HTTP"), "{}", setup.body);
    assert_guarded(&setup);
    assert_eq!(web.get("/admin/devices").await.status, 303);
    assert_eq!(web.post("/admin/devices/pair", &[]).await.status, 401);
    assert_eq!(web.get("/admin/backup/download").await.status, 401);
    assert_eq!(web.post("/admin/backup/restore", &[]).await.status, 401);

    // A set-up form without its token (another site's form) changes nothing.
    let forged = web
        .post(
            "/admin/setup",
            &[
                ("pre", "forged"),
                ("passphrase", PASSPHRASE),
                ("confirm", PASSPHRASE),
            ],
        )
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    let pre = web.get("/admin/").await.field("pre");
    let short = web
        .post(
            "/admin/setup",
            &[("pre", &pre), ("passphrase", "short"), ("confirm", "short")],
        )
        .await;
    assert_eq!(short.status, 400);
    assert!(
        short.body.contains("at least 12 characters"),
        "{}",
        short.body
    );
    assert!(!dir.path().join("owner.json").exists());

    // The claim: a session, and a phone paired at once (the token on the page works). The
    // claim answers 303 (its cookies come with it), and the token is shown by the GET after.
    let page = web.get("/admin/").await;
    let pre = page.field("pre");
    let claim = web
        .request_form(
            "/admin/setup",
            &[
                ("pre", &pre),
                ("passphrase", PASSPHRASE),
                ("confirm", PASSPHRASE),
            ],
        )
        .await;
    assert_eq!(claim.status, 303, "{claim:?}");
    let cookie = claim
        .headers
        .iter()
        .find(|(k, v)| k == "set-cookie" && v.starts_with("iris_admin="))
        .map(|(_, v)| v.clone())
        .expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("Secure"),
        "plain HTTP cannot carry a Secure cookie: {cookie}"
    );
    let claimed = web
        .get(claim.header("location").expect("where the result is"))
        .await;
    assert_eq!(claimed.status, 200, "{claimed:?}");
    let token = claimed.code_after("id=\"pair-token\">");
    let device = claimed.code_after("<dt>Device</dt><dd><code>");
    let (_c, _) = Client::hello(&gw.url, &token, &device).await;
    assert!(
        claimed.body.contains("href=\"iris://pair?url="),
        "{}",
        claimed.body
    );

    // Claimed once: a second set-up is refused, and strangers must sign in.
    let again = Web::new(&gw, "127.0.0.2")
        .claim("another passphrase 1")
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    let mut stranger = Web::new(&gw, "127.0.0.3");
    let signin = stranger.get("/admin/").await;
    assert!(signin.body.contains("Sign in"), "{}", signin.body);
    assert_eq!(stranger.get("/admin/agent").await.status, 303);
    assert_eq!(
        stranger
            .post("/admin/agent", &[("backend", "demo")])
            .await
            .status,
        401
    );
    assert_eq!(web.get("/admin/agent").await.status, 200);
}

#[track_caller]
fn assert_guarded(reply: &Reply) {
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let csp = reply.header("content-security-policy").expect("a CSP");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    // No inline script or style, nothing from outside the box.
    assert!(!reply.body.contains("<script>"), "{}", reply.body);
    assert!(!reply.body.contains("style="), "{}", reply.body);
    assert!(!reply.body.contains("src=\"http"), "{}", reply.body);
}

#[tokio::test]
async fn a_bad_csrf_token_is_refused_and_changes_nothing() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "kitchen");
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let before = devices_json(dir.path());

    for (path, fields) in [
        ("/admin/devices/pair", vec![("name", "evil")]),
        (
            "/admin/devices/rename",
            vec![("device_id", p.device_id.as_str()), ("name", "evil")],
        ),
        (
            "/admin/devices/revoke",
            vec![("device_id", p.device_id.as_str())],
        ),
        (
            "/admin/agent",
            vec![("backend", "openai"), ("url", "http://evil.example/v1")],
        ),
        ("/admin/signout", vec![]),
    ] {
        for token in ["", "wrong", &csrf[..csrf.len() - 1]] {
            let mut f = fields.clone();
            f.push(("csrf", token));
            let r = web.post(path, &f).await;
            assert_eq!(r.status, 403, "{path} with csrf {token:?}: {r:?}");
        }
    }
    assert_eq!(
        devices_json(dir.path()),
        before,
        "a refused form changed the devices"
    );
    assert!(!dir.path().join("settings.toml").exists());
    // Still signed in (the forged sign-out did nothing), and the real token works.
    let ok = web
        .post(
            "/admin/devices/rename",
            &[
                ("csrf", &csrf),
                ("device_id", &p.device_id),
                ("name", "pantry"),
            ],
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let names: Vec<Value> = devices_json(dir.path())
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert!(names.contains(&json!("pantry")), "{names:?}");
    // An oversized form is refused before it is read.
    let big = "x".repeat(20 << 10);
    let r = web
        .post("/admin/devices/pair", &[("csrf", &csrf), ("name", &big)])
        .await;
    assert_eq!(r.status, 413, "{r:?}");
}

#[tokio::test]
async fn wrong_passphrases_are_rate_limited_also_from_rotating_addresses() {
    let dir = temp_data_dir();
    let config = admin_config(dir.path(), "admin_signin_failures_per_minute = 1");
    let data = dir.path().join("data");
    owner_set(&data, PASSPHRASE);
    let gw = Gateway::start(&data, &["--config", &config]);

    // One address: the second wrong try is refused unread, and so is then the right one
    // (a success would not reset it either).
    let mut one = Web::new(&gw, "127.0.0.2");
    assert_eq!(one.sign_in("not the passphrase").await.status, 401);
    let limited = one.sign_in("not the passphrase").await;
    assert_eq!(limited.status, 429, "{limited:?}");
    assert!(limited.header("retry-after").is_some());
    assert_eq!(one.sign_in(PASSPHRASE).await.status, 429);

    // Rotating addresses: the table (16) plus one shared count answer; the rest wait.
    let from = |n: u32| format!("127.0.{}.{}", 10 + n / 200, 1 + n % 200);
    let (mut wrong, mut refused) = (0, 0);
    for n in 0..30 {
        match Web::new(&gw, &from(n))
            .sign_in("guess guess guess")
            .await
            .status
        {
            401 => {
                assert_eq!(refused, 0, "a passphrase was checked after the limit bit");
                wrong += 1;
            }
            429 => refused += 1,
            other => panic!("HTTP {other}"),
        }
    }
    assert!(
        wrong <= 17,
        "{wrong} guesses answered from rotating addresses"
    );
    assert!(
        refused >= 13,
        "only {refused} of 30 rotating addresses limited"
    );
    let stranger = Web::new(&gw, "127.0.99.1").sign_in(PASSPHRASE).await;
    assert_eq!(stranger.status, 429, "{stranger:?}");
    assert!(
        stranger.body.contains("too many addresses"),
        "{}",
        stranger.body
    );
}

#[tokio::test]
async fn expired_and_signed_out_sessions_are_refused() {
    let dir = temp_data_dir();
    let config = admin_config(
        dir.path(),
        "admin_session_idle_secs = 2\nadmin_session_max_secs = 4",
    );
    let data = dir.path().join("data");
    owner_set(&data, PASSPHRASE);
    let gw = Gateway::start(&data, &["--config", &config]);

    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        web.get("/admin/devices").await.status,
        303,
        "idle session kept"
    );
    let r = web.post("/admin/devices/pair", &[("csrf", &csrf)]).await;
    assert_eq!(r.status, 401, "{r:?}");

    // Kept busy, a session still ends at admin_session_max_secs.
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let _ = web.get("/admin/devices").await;
    }
    assert_eq!(
        web.get("/admin/devices").await.status,
        303,
        "session outlived its maximum"
    );

    // Signing out ends every session, also the other browser's.
    let mut other = Web::new(&gw, "127.0.0.2");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    assert_eq!(other.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    assert_eq!(
        web.request_form("/admin/signout", &[("csrf", &csrf)])
            .await
            .status,
        303
    );
    assert_eq!(web.get("/admin/devices").await.status, 303);
    assert_eq!(other.get("/admin/devices").await.status, 303);
}

#[tokio::test]
async fn owner_reset_reopens_set_up_and_owner_set_ends_sessions() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);
    assert_eq!(web.get("/admin/devices").await.status, 200);

    // At the box, while the gateway runs: a new passphrase signs everyone out.
    owner_set(dir.path(), "a new passphrase at the box");
    assert_eq!(web.get("/admin/devices").await.status, 303);
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 401);
    assert_eq!(web.sign_in("a new passphrase at the box").await.status, 303);
    assert_eq!(web.get("/admin/devices").await.status, 200);

    // Reset: set-up again, and the old session is dead even after a new claim.
    let out = cli(&["owner", "reset", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page = web.get("/admin/").await;
    assert!(page.body.contains("Claim this gateway"), "{}", page.body);
    let old = web.jar.get("iris_admin").cloned().unwrap();
    let mut someone = Web::new(&gw, "127.0.0.2");
    assert_eq!(someone.claim("someone else's passphrase").await.status, 200);
    web.jar.insert("iris_admin".into(), old);
    assert_eq!(web.get("/admin/devices").await.status, 303);
}

#[tokio::test]
async fn secrets_are_never_in_a_page_a_log_line_or_a_backup() {
    let dir = temp_data_dir();
    let data = dir.path().join("data");
    let gw = Gateway::start(&data, &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);
    let csrf = web.csrf().await;
    let key = "sk-live-0123456789abcdef-SECRET";
    let ntfy = "tk_ntfy_token_SECRET_42";
    let saved = web
        .post(
            "/admin/agent",
            &[
                ("csrf", &csrf),
                ("backend", "openai"),
                ("url", "http://127.0.0.1:9/v1"),
                ("key", key),
                ("model", "m"),
            ],
        )
        .await;
    assert_eq!(saved.status, 200, "{saved:?}");
    let pushed = web
        .post(
            "/admin/push",
            &[
                ("csrf", &csrf),
                ("backend", "ntfy"),
                ("ntfy_server", "http://127.0.0.1:9"),
                ("ntfy_token", ntfy),
                ("content", "title"),
            ],
        )
        .await;
    assert_eq!(pushed.status, 200, "{pushed:?}");
    assert!(saved.body.contains("A key is saved"), "{}", saved.body);

    let owner_file = std::fs::read_to_string(data.join("owner.json")).unwrap();
    let hash: Value = serde_json::from_str(&owner_file).unwrap();
    let hash = hash["hash"].as_str().unwrap().to_owned();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    let secrets = [PASSPHRASE, key, ntfy, hash.as_str()];
    for path in [
        "/admin/",
        "/admin/devices",
        "/admin/agent",
        "/admin/push",
        "/admin/backup",
        "/admin/log",
        "/admin/owner",
    ] {
        let page = web.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert_guarded(&page);
        for s in secrets {
            assert!(!page.body.contains(s), "{path} shows a secret");
        }
    }
    let backup = dir.path().join("backup.iris");
    let out = cli(&[
        "backup",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&backup).unwrap();
    for s in secrets {
        assert!(
            !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
            "the backup holds a secret"
        );
    }
    let mut gw = gw;
    gw.stop_ok();
    let logs = gw.output_tail();
    for s in secrets {
        assert!(!logs.contains(s), "the gateway logged a secret:\n{logs}");
    }
    assert!(logs.contains("agent settings saved"), "{logs}");
    use std::os::unix::fs::PermissionsExt;
    for f in ["owner.json", "settings.toml"] {
        let mode = std::fs::metadata(data.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{f} is readable by others: {mode:o}");
    }
}

#[tokio::test]
async fn config_effective_says_where_each_value_comes_from() {
    let dir = temp_data_dir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("settings.toml"),
        "[agent]\nbackend = \"openai\"\nurl = \"http://127.0.0.1:9/v1\"\n",
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[agent]\nmodel = \"from-file\"\nurl = \"http://file/v1\"\n",
    )
    .unwrap();
    let out = cli(&[
        "config",
        "--effective",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--agent-url",
        "http://flag/v1",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
            .to_owned()
    };
    assert!(
        line("agent.backend").contains("openai") && line("agent.backend").contains("admin page")
    );
    assert!(line("agent.url").contains("http://flag/v1") && line("agent.url").contains("flag"));
    assert!(
        line("agent.model").contains("from-file") && line("agent.model").contains("config file")
    );
    assert!(line("push.backend").contains("(default)"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// In a real browser
// ---------------------------------------------------------------------------------------------

/// On a page showing an invitation: the QR code from a screenshot, checked against the text
/// and the link, and its token proven with a hello. Returns the connected client and device.
async fn pair_from_page(b: &mut Browser, gw: &Gateway, page: &str) -> (Client, String) {
    assert_page_shows(b, page, &["#qr svg", "#open-in-app", "#pair-token"]).await;
    let uri = decode_qr(&b.screenshot().await);
    let values = common::parse_pairing_uri(&uri);
    let link = b
        .eval("document.querySelector('#open-in-app').getAttribute('href')")
        .await;
    assert_eq!(link, json!(uri), "the link and the QR code differ");
    let shown = b
        .eval("document.querySelector('#pair-token').textContent")
        .await;
    assert_eq!(shown, json!(values["token"]));
    assert!(values["url"].starts_with("wss://"), "{uri}");
    assert_eq!(values["fp"].len(), 64, "{uri}");
    let device = b
        .eval("[...document.querySelectorAll('dt')].find(e => e.textContent == 'Device').nextElementSibling.textContent")
        .await;
    let device = device.as_str().unwrap().to_owned();
    let (c, _) = Client::hello(&gw.url, &values["token"], &device).await;
    (c, device)
}

async fn sign_in_in(b: &mut Browser, gw: &Gateway, passphrase: &str) {
    b.goto(&format!("http://{}/", gw.addr)).await;
    b.wait_for("document.querySelector('#signin')", "the sign-in page")
        .await;
    b.fill("#passphrase", passphrase).await;
    b.click("#signin").await;
    b.wait_for("document.querySelector('#health')", "the status page")
        .await;
}

#[tokio::test]
async fn in_a_browser_claim_pair_rename_and_revoke() {
    let Some(mut b) = Browser::start("in_a_browser_claim_pair_rename_and_revoke").await else {
        return;
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    // Set-up: the script runs under the CSP (the strength meter answers typing).
    b.goto(&format!("http://{}/", gw.addr)).await;
    b.wait_for("document.querySelector('#claim')", "the set-up page")
        .await;
    assert_page_shows(
        &mut b,
        "set-up",
        &["h1", "#passphrase", "#claim", "#plain-warning"],
    )
    .await;
    // The meter shows the gateway's own verdict (it asks /admin/strength): below the accepted
    // score the meter is under its `low` mark (red), never in the green.
    let meter = "(() => { const m = document.querySelector('#passphrase-meter'); \
                 const t = document.querySelector('#passphrase-meter-text').textContent; \
                 return [m.value < m.low, t]; })()";
    for (typed, says) in [
        ("short", "at least 12 characters"),
        ("aaaaaaaaaaaa", "too easy to guess"),
    ] {
        b.fill("#passphrase", typed).await;
        let red = format!(
            "(() => {{ const [red, t] = {meter}; return red && t.includes({says:?}); }})()"
        );
        b.wait_for(&red, &format!("the meter to refuse {typed:?} in red"))
            .await;
    }
    b.fill("#passphrase", PASSPHRASE).await;
    let green = format!("(() => {{ const [red, t] = {meter}; return !red && t.length > 0 && !t.includes('too'); }})()");
    b.wait_for(&green, "the meter to accept a strong passphrase")
        .await;
    b.fill("#confirm", PASSPHRASE).await;
    b.click("#claim").await;
    b.wait_for(
        "document.querySelector('#qr svg')",
        "the pair-this-phone page",
    )
    .await;
    let (_first, _) = pair_from_page(&mut b, &gw, "pair this phone").await;

    // Sign out, a wrong passphrase, the right one.
    b.click("#signout").await;
    b.wait_for("document.querySelector('#signin')", "the sign-in page")
        .await;
    assert_page_shows(&mut b, "sign-in", &["#passphrase", "#signin"]).await;
    b.fill("#passphrase", "not my passphrase").await;
    b.click("#signin").await;
    b.wait_for(
        "document.body.innerText.includes('not right')",
        "the refusal",
    )
    .await;
    b.fill("#passphrase", PASSPHRASE).await;
    b.click("#signin").await;
    b.wait_for("document.querySelector('#health')", "the status page")
        .await;
    assert_page_shows(&mut b, "status", &["#health", "#agent", "#devices", "nav"]).await;
    let text = b.text().await;
    assert!(
        text.contains("online") && text.contains("1 connected now"),
        "{text}"
    );

    // The owner section: changing the passphrase (tested over HTTP) is one page away.
    b.click("a[href='/admin/owner']").await;
    b.wait_for("document.querySelector('#change')", "the owner page")
        .await;
    assert_page_shows(
        &mut b,
        "owner",
        &["#current", "#passphrase", "#confirm", "#change"],
    )
    .await;

    // Devices: pair another phone from the page.
    b.click("a[href='/admin/devices']").await;
    b.wait_for("document.querySelector('#pair')", "the devices page")
        .await;
    assert_page_shows(&mut b, "devices", &["#device-table", "#pair"]).await;
    b.fill("#name", "hall tablet").await;
    b.click("#pair").await;
    b.wait_for("document.querySelector('#qr svg')", "the new pairing")
        .await;
    let (mut phone, device) = pair_from_page(&mut b, &gw, "pair a phone").await;

    // Rename it, then revoke it: its open socket closes at once.
    b.click("a[href='/admin/devices']").await;
    let row = format!("tr[data-device='{device}']");
    b.wait_for(&format!("document.querySelector(\"{row}\")"), "its row")
        .await;
    let connected = b
        .eval(&format!(
            "document.querySelector(\"{row} .connected\").textContent"
        ))
        .await;
    assert_eq!(connected, json!("yes"));
    b.fill(&format!("{row} input[name=name]"), "living room")
        .await;
    b.click(&format!("{row} .rename")).await;
    b.wait_for("document.body.innerText.includes('Renamed.')", "the rename")
        .await;
    let names: Vec<Value> = devices_json(dir.path())
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["device_id"] == json!(device))
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, [json!("living room")]);
    b.eval("window.confirm = () => true").await;
    b.click(&format!("{row} .revoke")).await;
    b.wait_for(
        "document.body.innerText.includes('Revoked')",
        "the revocation",
    )
    .await;
    assert!(
        phone.expect_closed().await.is_some(),
        "the revoked socket was not closed"
    );
    let left = devices_json(dir.path());
    assert!(
        !left
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["device_id"] == json!(device)),
        "{left}"
    );
}

/// A fake ntfy server: answers `200 {}` and records each request line.
struct FakeNtfy {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

fn fake_ntfy() -> FakeNtfy {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let url = fake_http::start(move |req| {
        log.lock().unwrap().push(format!(
            "{} {}",
            req.line,
            String::from_utf8_lossy(&req.body)
        ));
        fake_http::json_200(b"{}")
    });
    FakeNtfy { url, seen }
}

#[tokio::test]
async fn in_a_browser_switch_the_agent_test_push_and_read_the_log() {
    let Some(mut b) =
        Browser::start("in_a_browser_switch_the_agent_test_push_and_read_the_log").await
    else {
        return;
    };
    let mock = MockLlm::start();
    let ntfy = fake_ntfy();
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &["--push", "ntfy", "--ntfy-server", &ntfy.url]);
    let p = pair(dir.path(), "phone");
    let mut c = Client::open(&gw.url).await;
    let id = c.next_id();
    c.send(json!({ "v": 1, "type": "hello", "id": id, "payload": {
        "token": p.token, "device_id": p.device_id, "device_name": "iris-test",
        "ntfy_topic": "iris-admin-test" } }))
        .await;
    let ack = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(frame_type(&ack), "hello.ack", "{ack}");

    sign_in_in(&mut b, &gw, PASSPHRASE).await;

    // Agent: test the mock, then save it; the next turn goes to it with no restart.
    b.goto(&format!("http://{}/admin/agent", gw.addr)).await;
    b.wait_for("document.querySelector('#agent-form')", "the agent page")
        .await;
    assert_page_shows(
        &mut b,
        "agent",
        &["#backend", "#url", "#key", "#agent-save", "#agent-test"],
    )
    .await;
    b.eval("document.querySelector('#backend').value = 'openai'")
        .await;
    b.fill("#url", &mock.url()).await;
    b.click("#agent-test").await;
    b.wait_for(
        "document.body.innerText.includes('reachable')",
        "the test result",
    )
    .await;
    let text = b.text().await;
    assert!(text.contains("mock-model"), "{text}");
    assert!(mock.requests().is_empty(), "a test must not start a turn");
    b.eval("document.querySelector('#backend').value = 'openai'")
        .await;
    b.fill("#url", &mock.url()).await;
    b.click("#agent-save").await;
    b.wait_for("document.body.innerText.includes('Saved')", "the save")
        .await;
    let frames = c
        .say("hello from the page", |f| frame_type(f) == "message.stop")
        .await;
    let answer: String = frames
        .iter()
        .filter(|f| frame_type(f) == "message.update" || frame_type(f) == "message.stop")
        .map(|f| f.to_string())
        .collect();
    assert!(answer.contains("Echo: hello from the page"), "{answer}");
    assert_eq!(mock.requests().len(), 1);

    // Push: a test push to the chosen device reaches the ntfy server.
    c.close().await;
    b.goto(&format!("http://{}/admin/push", gw.addr)).await;
    b.wait_for("document.querySelector('#push-test')", "the push page")
        .await;
    assert_page_shows(&mut b, "push", &["#device", "#push-test", "#push-save"]).await;
    let text = b.text().await;
    assert!(
        text.contains("Set by a command-line flag") && text.contains("push.backend"),
        "the page must say --push outranks it: {text}"
    );
    b.click("#push-test").await;
    b.wait_for(
        "document.body.innerText.includes('The test push reached')",
        "the test push",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let seen = ntfy.seen.lock().unwrap().clone();
        if seen.iter().any(|l| l.contains("iris-admin-test")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no test push arrived: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Log: what the gateway just did, and never the passphrase.
    b.goto(&format!("http://{}/admin/log", gw.addr)).await;
    b.wait_for("document.querySelector('#log')", "the log page")
        .await;
    assert_page_shows(&mut b, "log", &["#log"]).await;
    let log = b.eval("document.querySelector('#log').textContent").await;
    let log = log.as_str().unwrap();
    assert!(log.contains("agent settings saved"), "{log}");
    assert!(log.contains("a test push reached the push server"), "{log}");
    assert!(!log.contains(PASSPHRASE));
    let _ = Command::new("true").status();
}

fn device_names(dir: &Path) -> Vec<String> {
    devices_json(dir)
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn in_a_browser_download_a_backup_and_restore_it() {
    let Some(mut b) = Browser::start("in_a_browser_download_a_backup_and_restore_it").await else {
        return;
    };
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    pair(dir.path(), "before the backup");
    sign_in_in(&mut b, &gw, PASSPHRASE).await;
    b.goto(&format!("http://{}/admin/backup", gw.addr)).await;
    b.wait_for("document.querySelector('#restore-form')", "the backup page")
        .await;
    assert_page_shows(
        &mut b,
        "backup",
        &["#backup-download", "#restore-file", "#restore"],
    )
    .await;

    // Download it as the page's link does (same session), and keep it in the page.
    let got = b
        .eval(
            "fetch(document.querySelector('#backup-download').href).then(r => r.arrayBuffer()\
             .then(buf => { window.backup = buf; return [r.status, buf.byteLength, \
             new TextDecoder().decode(new Uint8Array(buf).slice(0, 19))]; }))",
        )
        .await;
    assert_eq!(got[0], json!(200), "{got}");
    assert_eq!(got[2], json!("IRIS-GATEWAY-BACKUP"), "{got}");
    assert!(got[1].as_u64().unwrap() > 1000, "{got}");
    pair(dir.path(), "after the backup");

    // Something that is not a backup is refused, and nothing changes.
    b.eval(
        "(() => { const dt = new DataTransfer(); dt.items.add(new File(['not a backup'], 'x.iris')); \
         document.querySelector('#restore-file').files = dt.files; window.confirm = () => true; })()",
    )
    .await;
    b.click("#restore").await;
    b.wait_for(
        "document.querySelector('#restore-result').className == 'bad'",
        "the refusal",
    )
    .await;
    // One sentence, once: not the whole answer page glued together.
    let said = b
        .eval("document.querySelector('#restore-result').textContent")
        .await;
    assert_eq!(
        said,
        json!(
            "This is not an iris-gateway backup: it is neither a plain backup (a download from \
             this page) nor an age-sealed one (a scheduled backup); nothing was changed."
        )
    );
    assert!(!dir.path().join("pending-restore.iris").exists());
    assert!(device_names(dir.path()).contains(&"after the backup".to_owned()));

    // The real one: checked, then the gateway restarts into it.
    b.eval(
        "(() => { const dt = new DataTransfer(); dt.items.add(new File([window.backup], 'b.iris')); \
         document.querySelector('#restore-file').files = dt.files; })()",
    )
    .await;
    b.click("#restore").await;
    // The upload starts the restore job: the browser follows it to its page, which reloads
    // itself while the job checks and builds the backup, then goes on to the page that waits
    // for the restart. (Here the restarted gateway listens on a new port, so what the page does
    // after the restart is not followed.)
    b.wait_for(
        "location.pathname.startsWith('/admin/job/restore') \
         || location.pathname.startsWith('/admin/restarting/restore')",
        "the restore job's page",
    )
    .await;
    let said = b.eval("document.body.textContent").await;
    let said = said.as_str().unwrap();
    assert!(
        (said.contains("Restoring a backup") || said.contains("restarts into it"))
            && !said.contains("Encrypted"),
        "{said}"
    );
    let addr = nth_listening(&gw, 2, Duration::from_secs(30)).await;
    let names = device_names(dir.path());
    assert!(names.contains(&"before the backup".to_owned()), "{names:?}");
    assert!(!names.contains(&"after the backup".to_owned()), "{names:?}");
    let aside = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("before-restore-")
        });
    assert!(aside, "the old store was not kept aside");
    assert!(!dir.path().join("pending-restore.iris").exists());
    // The restarted gateway serves the page again (to a new client: sign in).
    let mut web = Web {
        addr,
        from: "127.0.0.1".into(),
        jar: HashMap::new(),
    };
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
}

#[tokio::test]
async fn over_https_the_image_check_script_claims_the_box_and_plain_can_be_refused() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    // image/admin-claim is what image/check runs against the booted image under qemu.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/image/admin-claim");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("https://{}", gw.addr))
        .arg(PASSPHRASE)
        .arg("20")
        .output()
        .expect("run image/admin-claim");
    assert!(
        out.status.success(),
        "admin-claim failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claim: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    let fp = claim["fingerprint"].as_str().unwrap();
    assert_eq!(fp.len(), 95, "{claim}");
    assert!(
        claim["uri"]
            .as_str()
            .unwrap()
            .ends_with(&fp.replace(':', "")),
        "the pairing link pins another certificate: {claim}"
    );
    Client::hello(
        &gw.url,
        claim["token"].as_str().unwrap(),
        claim["device_id"].as_str().unwrap(),
    )
    .await;

    // `[tls] allow_plain = false` applies to the admin page too.
    let other = temp_data_dir();
    let config = other.path().join("config.toml");
    std::fs::write(&config, "[tls]\nallow_plain = false\n").unwrap();
    let strict = Gateway::start(
        &other.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let mut web = Web::new(&strict, "127.0.0.1");
    assert_eq!(web.get("/admin/").await.status, 426);
    assert_eq!(web.get("/").await.status, 426);
}

#[tokio::test]
async fn changing_the_passphrase_asks_for_the_current_one_and_ends_every_session() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    let mut other = Web::new(&gw, "127.0.0.2");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    assert_eq!(other.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let new = "a much better passphrase";
    let wrong = web
        .post(
            "/admin/passphrase",
            &[
                ("csrf", &csrf),
                ("current", "nope nope nope"),
                ("passphrase", new),
                ("confirm", new),
            ],
        )
        .await;
    assert_eq!(
        wrong.status, 200,
        "a refusal is said on the form's page: {wrong:?}"
    );
    assert!(
        wrong.body.contains("current passphrase is not right"),
        "{}",
        wrong.body
    );
    let short = web
        .post(
            "/admin/passphrase",
            &[
                ("csrf", &csrf),
                ("current", PASSPHRASE),
                ("passphrase", "short"),
                ("confirm", "short"),
            ],
        )
        .await;
    assert!(
        short.body.contains("at least 12 characters"),
        "{}",
        short.body
    );
    assert_eq!(
        other.get("/admin/devices").await.status,
        200,
        "a refused change ended sessions"
    );
    let changed = web
        .post(
            "/admin/passphrase",
            &[
                ("csrf", &csrf),
                ("current", PASSPHRASE),
                ("passphrase", new),
                ("confirm", new),
            ],
        )
        .await;
    assert_eq!(changed.status, 200, "{changed:?}");
    assert!(
        changed.body.contains("Passphrase changed"),
        "{}",
        changed.body
    );
    assert_eq!(web.get("/admin/devices").await.status, 303);
    assert_eq!(other.get("/admin/devices").await.status, 303);
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 401);
    assert_eq!(web.sign_in(new).await.status, 303);
}

#[tokio::test]
async fn push_settings_saved_from_the_page_apply_after_a_restart_from_the_page() {
    let ntfy = fake_ntfy();
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);
    let csrf = web.csrf().await;
    let saved = web
        .post(
            "/admin/push",
            &[
                ("csrf", &csrf),
                ("backend", "ntfy"),
                ("ntfy_server", &ntfy.url),
                ("ntfy_token", ""),
                ("content", "title"),
            ],
        )
        .await;
    assert_eq!(saved.status, 200, "{saved:?}");
    assert!(
        saved
            .body
            .contains("Running now: <span id=\"push-now\">none"),
        "{}",
        saved.body
    );
    let bad = web
        .post(
            "/admin/push",
            &[
                ("csrf", &csrf),
                ("backend", "carrier pigeon"),
                ("content", "title"),
            ],
        )
        .await;
    assert!(
        bad.body
            .contains("id=\"notice\">Backend must be none, ntfy or fcm."),
        "{}",
        bad.body
    );
    assert_eq!(
        web.post("/admin/power/restart", &[("csrf", "forged")])
            .await
            .status,
        403
    );
    assert_eq!(
        web.post("/admin/power/restart", &[("csrf", &csrf)])
            .await
            .status,
        200,
        "the 303 leads to the page that waits for the restart"
    );
    let addr = nth_listening(&gw, 2, Duration::from_secs(30)).await;
    let mut web = Web {
        addr,
        from: "127.0.0.1".into(),
        jar: HashMap::new(),
    };
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let push = web.get("/admin/push").await;
    assert!(
        push.body
            .contains("Running now: <span id=\"push-now\">ntfy"),
        "{}",
        push.body
    );
    let out = cli(&[
        "status",
        "--json",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(report["push"], "ntfy", "{report}");
}

/// A request line and its `Authorization` header, if any.
type Seen = (String, Option<String>);

/// A fake HTTP server (agent or ntfy) that answers `200` with an empty model list to anything
/// and records each request line with its `Authorization` header, if any.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let url = fake_http::start(move |req| {
            let auth = req.header("authorization").map(str::to_owned);
            log.lock().unwrap().push((req.line, auth));
            fake_http::json_200(br#"{"object":"list","data":[]}"#)
        });
        Recorder { url, seen }
    }

    /// Takes what was recorded so far.
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }

    /// Waits (bounded) for a request, and takes what was recorded.
    async fn wait(&self) -> Vec<Seen> {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.seen.lock().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no request reached {}",
                self.url
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.take()
    }
}

/// Posts the agent form (Save or Test connection) for the OpenAI-compatible backend.
async fn agent_form(web: &mut Web, csrf: &str, path: &str, url: String, key: &str) -> Reply {
    let r = web
        .post(
            path,
            &[
                ("csrf", csrf),
                ("backend", "openai"),
                ("url", &url),
                ("model", "m"),
                ("key", key),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r
}

/// Saves push settings, restarts from the page (the `n`th start), signs in again and sends
/// a test push to `device`.
async fn push_round(
    web: &mut Web,
    gw: &Gateway,
    n: usize,
    server: &str,
    token: &str,
    device: &str,
) {
    let csrf = web.csrf().await;
    let saved = web
        .post(
            "/admin/push",
            &[
                ("csrf", &csrf),
                ("backend", "ntfy"),
                ("ntfy_server", server),
                ("ntfy_token", token),
                ("content", "title"),
            ],
        )
        .await;
    assert_eq!(saved.status, 200, "{saved:?}");
    assert_eq!(
        web.post("/admin/power/restart", &[("csrf", &csrf)])
            .await
            .status,
        200,
        "the 303 leads to the page that waits for the restart"
    );
    web.addr = nth_listening(gw, n, Duration::from_secs(30)).await;
    web.jar.clear();
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let r = web
        .post(
            "/admin/push/test",
            &[("csrf", &csrf), ("device_id", device)],
        )
        .await;
    assert!(r.body.contains("The test push reached topic"), "{}", r.body);
}

#[tokio::test]
async fn a_saved_agent_key_goes_only_to_the_url_it_was_saved_for() {
    let (a, b) = (Recorder::start(), Recorder::start());
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let w = &mut web;
    let saved = agent_form(w, &csrf, "/admin/agent", a.url.clone(), "sk-for-a").await;
    assert!(saved.body.contains("Saved"), "{}", saved.body);
    // Its own URL, the key field left empty: the saved key goes with it.
    agent_form(w, &csrf, "/admin/agent/test", a.url.clone(), "").await;
    let to_a = a.wait().await;
    assert!(
        to_a.iter()
            .all(|(_, auth)| auth.as_deref() == Some("Bearer sk-for-a")),
        "{to_a:?}"
    );
    // A new URL with the field empty: no key, for a test and for a save.
    agent_form(w, &csrf, "/admin/agent/test", b.url.clone(), "").await;
    let to_b = b.wait().await;
    assert!(
        to_b.iter().all(|(_, auth)| auth.is_none()),
        "the key went to a URL it was not saved for: {to_b:?}"
    );
    let moved = agent_form(w, &csrf, "/admin/agent", b.url.clone(), "").await;
    assert!(moved.body.contains("No key is saved"), "{}", moved.body);
    let settings = std::fs::read_to_string(dir.path().join("settings.toml")).unwrap();
    assert!(!settings.contains("sk-for-a"), "{settings}");
    agent_form(w, &csrf, "/admin/agent/test", b.url.clone(), "").await;
    let to_b = b.wait().await;
    assert!(to_b.iter().all(|(_, auth)| auth.is_none()), "{to_b:?}");
    // Nor does it come back with the old URL.
    agent_form(w, &csrf, "/admin/agent/test", a.url.clone(), "").await;
    let to_a = a.wait().await;
    assert!(to_a.iter().all(|(_, auth)| auth.is_none()), "{to_a:?}");
    // A key typed with the new URL goes to it.
    agent_form(w, &csrf, "/admin/agent/test", b.url.clone(), "sk-for-b").await;
    let to_b = b.wait().await;
    assert!(
        to_b.iter()
            .all(|(_, auth)| auth.as_deref() == Some("Bearer sk-for-b")),
        "{to_b:?}"
    );
    // The page says what of the agent's files reaches the phone (docs/media.md).
    assert!(
        moved.body.contains("Files the agent names with MEDIA:"),
        "{}",
        moved.body
    );
    let far = agent_form(w, &csrf, "/admin/agent", "http://192.0.2.1:9/v1".into(), "").await;
    assert!(
        far.body.contains("only images it puts inline"),
        "{}",
        far.body
    );
}

#[tokio::test]
async fn a_saved_ntfy_token_goes_only_to_the_server_it_was_saved_for() {
    let (a, b) = (Recorder::start(), Recorder::start());
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);
    let p = pair(dir.path(), "phone");
    let mut c = Client::open(&gw.url).await;
    let id = c.next_id();
    c.send(json!({ "v": 1, "type": "hello", "id": id, "payload": {
        "token": p.token, "device_id": p.device_id, "device_name": "iris-test",
        "ntfy_topic": "iris-guard-test" } }))
        .await;
    let ack = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(frame_type(&ack), "hello.ack", "{ack}");
    c.close().await;

    push_round(&mut web, &gw, 2, &a.url, "tok-for-a", &p.device_id).await;
    let to_a = a.wait().await;
    assert!(
        to_a.iter()
            .all(|(_, auth)| auth.as_deref() == Some("Bearer tok-for-a")),
        "{to_a:?}"
    );
    // A new server with the token field empty: the old server's token is not sent to it.
    push_round(&mut web, &gw, 3, &b.url, "", &p.device_id).await;
    let to_b = b.wait().await;
    assert!(
        to_b.iter().all(|(_, auth)| auth.is_none()),
        "the token went to a server it was not saved for: {to_b:?}"
    );
    assert!(a.take().is_empty());
}

#[tokio::test]
async fn transcription_is_set_and_tested_on_the_agent_page_and_applies_at_once() {
    use common::fake_stt::{send_notes, upload_voice, FakeStt, SttAnswer};
    let good = FakeStt::hearing("testing one two");
    let refusing = FakeStt::start(|_| SttAnswer::Fail(401, "invalid api key".into()));
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    let page = web.get("/admin/agent").await;
    assert!(
        page.body.contains("id=\"transcription-form\"") && page.body.contains("off: voice notes"),
        "{}",
        page.body
    );
    let fields = |url: &str, key: &str| {
        vec![
            ("csrf".to_owned(), csrf.clone()),
            ("url".to_owned(), url.to_owned()),
            ("key".to_owned(), key.to_owned()),
            ("model".to_owned(), "whisper-1".to_owned()),
            ("language".to_owned(), "en".to_owned()),
            ("timeout_secs".to_owned(), "7".to_owned()),
        ]
    };
    // Test: the service gets a one-second WAV tone, and the page shows what it heard.
    let r = transcription_form(
        &mut web,
        "/admin/transcription/test",
        fields(&good.url, "stt-secret-key"),
    )
    .await;
    assert!(
        r.body.contains("It works") && r.body.contains("testing one two"),
        "{}",
        r.body
    );
    let taken = good.requests();
    assert_eq!(taken.len(), 1);
    let t = &taken[0];
    assert!(t.malformed.is_none(), "{:?}", t.malformed);
    assert_eq!(&t.file[..4], b"RIFF");
    assert_eq!(
        t.file.len(),
        44 + 32_000,
        "one second of 16 kHz 16-bit mono"
    );
    assert_eq!(
        (t.filename.as_str(), t.file_type.as_str()),
        ("iris-test-tone.wav", "audio/wav")
    );
    assert_eq!(t.fields["model"], "whisper-1");
    assert_eq!(t.fields["language"], "en");
    assert_eq!(t.authorization.as_deref(), Some("Bearer stt-secret-key"));
    // A test saves nothing.
    assert!(web
        .get("/admin/agent")
        .await
        .body
        .contains("off: voice notes"));

    // Save: the key is never shown back.
    let r = transcription_form(
        &mut web,
        "/admin/transcription",
        fields(&good.url, "stt-secret-key"),
    )
    .await;
    assert!(
        r.body
            .contains("Saved: the next voice note is transcribed by"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("stt-secret-key"), "the key was shown back");
    assert!(r.body.contains("A key is saved"), "{}", r.body);
    assert!(
        r.body.contains("name=\"timeout_secs\" value=\"7\""),
        "the saved wait is shown: {}",
        r.body
    );
    // A wait that is no whole number of seconds from 1 to 600 is refused, and nothing changes.
    for bad in ["0", "601", "ten"] {
        let mut f = fields(&good.url, "");
        f.retain(|(k, _)| k != "timeout_secs");
        f.push(("timeout_secs".to_owned(), bad.to_owned()));
        let r = transcription_form(&mut web, "/admin/transcription", f).await;
        assert!(r.body.contains("from 1 to 600"), "{bad}: {}", r.body);
        assert!(
            r.body.contains("name=\"timeout_secs\" value=\"7\""),
            "{bad}"
        );
    }

    // A service that refuses, tested at another URL with the key field empty: no key goes
    // there, and the page says what went wrong.
    let r = transcription_form(
        &mut web,
        "/admin/transcription/test",
        fields(&refusing.url, ""),
    )
    .await;
    assert!(
        r.body.contains("Not working") && r.body.contains("refused the key"),
        "{}",
        r.body
    );
    assert!(
        refusing.requests()[0].authorization.is_none(),
        "the key followed a new URL"
    );

    // No restart: the next voice note is heard by the saved service, with its key.
    let p = pair(dir.path(), "phone");
    let (mut c, _) = common::connect_online(&gw, &p).await;
    upload_voice(&mut c, "v1", "note.ogg", b"OggS pretend voice").await;
    send_notes(&mut c, &["v1"]).await;
    // The saved wait applies at once too: the lane says how long it may take.
    let transcribing = c
        .recv_until(|f| {
            frame_type(f) == "message"
                && f["payload"]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("Transcribing"))
        })
        .await;
    assert!(
        transcribing["payload"]["text"]
            .as_str()
            .unwrap()
            .contains("after 7 s "),
        "{transcribing}"
    );
    let heard = c
        .recv_until(|f| {
            frame_type(f) == "message"
                && f["payload"]["role"] == "system"
                && f["payload"]["text"] == "Heard: \u{201c}testing one two\u{201d}"
        })
        .await;
    assert!(heard["payload"]["message_id"]
        .as_str()
        .unwrap()
        .ends_with(".heard"));
    let last = good.requests().pop().unwrap();
    assert_eq!(last.file, b"OggS pretend voice");
    assert_eq!(last.authorization.as_deref(), Some("Bearer stt-secret-key"));
    let log = gw.output_tail();
    assert!(
        !log.contains("stt-secret-key"),
        "the key was logged:\n{log}"
    );
    let settings = std::fs::read_to_string(dir.path().join("settings.toml")).unwrap();
    assert!(settings.contains("[transcription]"), "{settings}");
    assert!(settings.contains("timeout_secs = 7"), "{settings}");
}

/// Posts the Agent page's transcription form (Save or Test); the page answers 200 either way.
async fn transcription_form(web: &mut Web, path: &str, fields: Vec<(String, String)>) -> Reply {
    let pairs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = web.post(path, &pairs).await;
    assert_eq!(r.status, 200, "{r:?}");
    r
}
