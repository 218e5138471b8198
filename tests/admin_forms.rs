//! The admin page's forms over plain HTTP, as a browser with no script sends them: the
//! passphrase policy the gateway enforces (and the meter's answers agree with), POST → 303 →
//! GET for every form with a one-time pairing result, messages as one sentence, a 404 page
//! with a way back, Test connection keeping what was typed, push called working only after a
//! test push got through, and sign-in landing on the page asked for.

mod common;

use std::path::Path;

use common::web::{Reply, Web};
use common::{devices_json, fake_http, owner_set, temp_data_dir, Gateway};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";

fn device_count(dir: &Path) -> usize {
    devices_json(dir).as_array().expect("a device list").len()
}

fn between(text: &str, start: &str, end: &str) -> String {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in:\n{text}"))
        + start.len();
    text[from..].split(end).next().unwrap_or("").to_owned()
}

/// The text of `<main>`, tags stripped and entities left as they are.
fn main_text(body: &str) -> String {
    let main = between(body, "<main>", "</main>");
    let mut out = String::new();
    let mut in_tag = false;
    for c in main.chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Asserts no sentence of a page's main text is said twice (the glued, repeated refusals the
/// restore form once showed).
fn assert_no_sentence_twice(what: &str, body: &str) {
    let text = main_text(body);
    let mut seen = std::collections::HashSet::new();
    for sentence in text.split_inclusive(['.', '!', '?']).map(str::trim) {
        if sentence.len() > 12 {
            assert!(
                seen.insert(sentence),
                "{what} says {sentence:?} twice:\n{text}"
            );
        }
    }
}

/// An address nothing listens on (bound, then let go).
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

async fn signed_in(gw: &Gateway) -> (Web, String) {
    let mut web = Web::new(gw, "127.0.0.1");
    assert_eq!(web.sign_in(PASSPHRASE).await.status, 303);
    let csrf = web.csrf().await;
    (web, csrf)
}

#[tokio::test]
async fn a_weak_passphrase_is_refused_by_the_server_and_the_meter_agrees() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    let mut pre = web.get("/admin/").await.field("pre");

    // The meter's question needs the page's token: no other site can ask it.
    let (status, _) = web.strength("forged", "aaaaaaaaaaaa").await;
    assert_eq!(status, 403);

    // What the meter says is what the claim does, for each passphrase.
    for (passphrase, accepted) in [
        ("short", false),
        ("aaaaaaaaaaaa", false),
        ("password1234", false),
        (PASSPHRASE, true),
    ] {
        let (status, verdict) = web.strength(&pre, passphrase).await;
        assert_eq!(status, 200, "{verdict}");
        assert_eq!(verdict["ok"], json!(accepted), "{passphrase}: {verdict}");
        if accepted {
            break;
        }
        let refused = web.claim(passphrase).await;
        assert_eq!(refused.status, 400, "{passphrase} claimed the box");
        // The refused set-up page comes with a fresh token.
        pre = refused.field("pre");
        let said = between(&refused.body, "id=\"notice\">", "<");
        assert_eq!(
            said,
            verdict["words"].as_str().unwrap().replace('"', "&quot;"),
            "the page and the meter say the same"
        );
        assert!(!dir.path().join("owner.json").exists());
    }
    let (_, weak) = web.strength(&pre, "aaaaaaaaaaaa").await;
    assert_eq!(
        weak["words"],
        json!(
            "This passphrase is too easy to guess (repeats like \"aaa\" or \"abab\" are tried \
             early): add a few unrelated words."
        )
    );
    assert!(weak["score"].as_u64().unwrap() < 3, "{weak}");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);

    // The change of passphrase applies the same policy, with the session's token.
    let csrf = web.csrf().await;
    let (_, verdict) = web.strength(&csrf, "aaaaaaaaaaaa").await;
    assert_eq!(verdict["ok"], json!(false));
    let refused = web
        .post(
            "/admin/passphrase",
            &[
                ("csrf", &csrf),
                ("current", PASSPHRASE),
                ("passphrase", "aaaaaaaaaaaa"),
                ("confirm", "aaaaaaaaaaaa"),
            ],
        )
        .await;
    assert!(
        refused.body.contains("too easy to guess"),
        "{}",
        refused.body
    );
    assert_eq!(
        Web::new(&gw, "127.0.0.2").sign_in(PASSPHRASE).await.status,
        303,
        "the passphrase stayed"
    );
}

/// The passphrase rule's refusals, each with its reason, from the set-up page and its meter
/// alike; the box's devices' names count only once signed in (before, the meter would tell
/// the LAN which words they hold).
#[tokio::test]
async fn set_up_refuses_a_leaked_password_and_a_sequence_saying_why_and_takes_a_good_one() {
    let dir = temp_data_dir();
    common::pair(dir.path(), "Kitchen Radio");
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");

    for (passphrase, why) in [
        (
            "Sunshine-2024!",
            "it is on a list of common and leaked passwords, even with digits or signs added",
        ),
        (
            "qwertyuiop123456",
            "sequences like \"abcd\", \"1234\" or keyboard rows like \"qwerty\" are tried early",
        ),
        ("Iris Gateway 2024", "words naming this box or its devices"),
    ] {
        let pre = web.get("/admin/").await.field("pre");
        let (status, verdict) = web.strength(&pre, passphrase).await;
        assert_eq!(status, 200, "{verdict}");
        assert_eq!(verdict["ok"], json!(false), "{passphrase}: {verdict}");
        assert!(verdict["score"].as_u64().unwrap() < 3, "{verdict}");
        let words = verdict["words"].as_str().unwrap();
        assert!(
            words.starts_with(&format!("This passphrase is too easy to guess ({why}")),
            "{passphrase}: {words}"
        );
        let refused = web.claim(passphrase).await;
        assert_eq!(refused.status, 400, "{passphrase} claimed the box");
        let said = between(&refused.body, "id=\"notice\">", "<");
        assert_eq!(
            said,
            words.replace('"', "&quot;"),
            "the page and the meter agree"
        );
        assert!(!dir.path().join("owner.json").exists());
    }

    // Before a session the devices' names are not the box's words: the meter says nothing of them.
    let good = "Kitchen radio sings sunshine";
    let pre = web.get("/admin/").await.field("pre");
    let (_, verdict) = web.strength(&pre, good).await;
    assert_eq!(
        (
            verdict["ok"].clone(),
            verdict["score"].clone(),
            verdict["words"].clone()
        ),
        (json!(true), json!(4), json!("Strong.")),
        "{verdict}"
    );
    assert_eq!(web.claim(good).await.status, 200);

    // Signed in, they are: "kitchen" and "radio" count for nothing, and the rest is too short.
    let csrf = web.csrf().await;
    let own = "kitchen radio 2024 ok";
    let (_, verdict) = web.strength(&csrf, own).await;
    assert_eq!(verdict["ok"], json!(false), "{verdict}");
    let refused = web
        .post(
            "/admin/passphrase",
            &[
                ("csrf", &csrf),
                ("current", good),
                ("passphrase", own),
                ("confirm", own),
            ],
        )
        .await;
    assert!(
        refused
            .body
            .contains("words naming this box or its devices"),
        "{}",
        refused.body
    );
    assert_eq!(
        Web::new(&gw, "127.0.0.2").sign_in(good).await.status,
        303,
        "the passphrase stayed"
    );
}

#[tokio::test]
async fn every_form_answers_with_a_redirect_and_a_reload_changes_nothing() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let (mut web, csrf) = signed_in(&gw).await;

    // Pairing: the token is shown by one GET; a reload pairs nothing and shows nothing.
    let before = device_count(dir.path());
    let r = web
        .request_form(
            "/admin/devices/pair",
            &[("csrf", &csrf), ("name", "kitchen")],
        )
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    let result = r.header("location").unwrap().to_owned();
    assert!(result.starts_with("/admin/paired?id="), "{result}");
    let shown = web.get(&result).await;
    let token = shown.code_after("id=\"pair-token\">");
    let device = shown.code_after("<dt>Device</dt><dd><code>");
    assert!(token.starts_with("iris_"), "{token}");
    assert_eq!(device_count(dir.path()), before + 1);
    for _ in 0..2 {
        let again = web.get(&result).await;
        assert_eq!(again.status, 200);
        assert!(
            !again.body.contains(&token) && !again.body.contains("pair-token"),
            "the token was shown twice"
        );
        assert!(again.body.contains("shown once"), "{}", again.body);
        assert!(again.body.contains("href=\"/admin/devices\""));
        assert_eq!(device_count(dir.path()), before + 1, "a reload paired");
    }

    // Every other form: 303 to its page, whose first GET says what was done, once.
    let dead = dead_url();
    let forms: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "/admin/devices/rename",
            vec![("device_id", &device), ("name", "hall")],
        ),
        (
            "/admin/agent/test",
            vec![("backend", "openai"), ("url", &dead)],
        ),
        ("/admin/agent", vec![("backend", "demo")]),
        (
            "/admin/push",
            vec![
                ("backend", "ntfy"),
                ("ntfy_server", &dead),
                ("content", "title"),
            ],
        ),
        ("/admin/push/test", vec![("topic", "iris-test")]),
        (
            "/admin/passphrase",
            vec![
                ("current", "wrong wrong"),
                ("passphrase", "x"),
                ("confirm", "y"),
            ],
        ),
        ("/admin/devices/revoke", vec![("device_id", &device)]),
        ("/admin/devices/revoke", vec![("device_id", "dev_gone")]),
    ];
    for (path, fields) in forms {
        let mut pairs = vec![("csrf", csrf.as_str())];
        pairs.extend(fields);
        let r = web.request_form(path, &pairs).await;
        assert_eq!(r.status, 303, "{path}: {r:?}");
        let to = r.header("location").unwrap().to_owned();
        let first = web.get(&to).await;
        assert_eq!(first.status, 200, "{path}");
        assert_eq!(
            first.body.matches("id=\"notice\"").count(),
            1,
            "{path}: {}",
            first.body
        );
        assert_no_sentence_twice(path, &first.body);
        let count = device_count(dir.path());
        let reload = web.get(&to).await;
        assert_eq!(reload.status, 200, "{path}");
        assert!(!reload.body.contains("id=\"notice\""), "{path}: said twice");
        assert_eq!(
            device_count(dir.path()),
            count,
            "{path}: a reload changed the devices"
        );
    }
    assert!(
        !devices_json(dir.path()).to_string().contains(&device),
        "the revoke was done"
    );
}

#[tokio::test]
async fn messages_are_one_sentence_and_a_wrong_address_has_a_way_back() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let (mut web, csrf) = signed_in(&gw).await;

    let missing = web.get("/admin/no-such-page").await;
    assert_eq!(missing.status, 404);
    assert!(
        missing.body.contains("<title>Page not found"),
        "{}",
        missing.body
    );
    assert!(
        missing.body.contains("<nav>"),
        "the page keeps its navigation"
    );
    assert!(missing.body.contains("id=\"back\" href=\"/admin/\""));
    assert_no_sentence_twice("404", &missing.body);

    // A refused restore: its one sentence, once, in the block the page's script shows.
    let extra = format!("X-CSRF-Token: {csrf}\r\n");
    let refused = web
        .request_with(
            "POST",
            "/admin/backup/restore",
            Some("not a backup"),
            &extra,
        )
        .await;
    assert!(refused.status >= 400, "{refused:?}");
    let result = between(&refused.body, "id=\"result\">", "</div>");
    assert_eq!(result.matches("<p").count(), 1, "{result}");
    assert_no_sentence_twice("refused restore", &refused.body);

    // The sign-in limit: one sentence, how long to wait, and no config key.
    let mut guesser = Web::new(&gw, "127.0.0.9");
    let mut limited: Option<Reply> = None;
    for _ in 0..10 {
        let r = guesser.sign_in("not the passphrase at all").await;
        if r.status == 429 {
            limited = Some(r);
            break;
        }
    }
    let limited = limited.expect("the sign-in limit");
    let said = between(&limited.body, "id=\"notice\">", "<");
    assert!(
        said.contains("wait") && said.ends_with("seconds, then try again."),
        "{said}"
    );
    assert_eq!(said.matches(". ").count(), 0, "one sentence: {said}");
    assert!(!limited.body.contains("limits."), "{}", limited.body);
}

#[tokio::test]
async fn test_connection_keeps_what_was_typed_and_save_warns_when_the_agent_is_silent() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let (mut web, csrf) = signed_in(&gw).await;
    let dead = format!("{}/v1", dead_url());
    let typed = [
        ("csrf", csrf.as_str()),
        ("backend", "openai"),
        ("url", dead.as_str()),
        ("model", "my-model"),
        ("key", "sk-typed-secret"),
    ];

    let tested = web.post("/admin/agent/test", &typed).await;
    let b = &tested.body;
    assert!(b.contains(&format!("name=\"url\" value=\"{dead}\"")), "{b}");
    assert!(b.contains("<option value=\"openai\" selected>"), "{b}");
    assert!(b.contains("name=\"model\" value=\"my-model\""), "{b}");
    assert!(!b.contains("sk-typed-secret"), "a key is never shown back");
    assert!(b.contains("never shown back: type it again"), "{b}");
    assert!(
        b.contains("class=\"bad\" role=\"alert\" id=\"notice\">Not working"),
        "{b}"
    );
    assert!(
        b.contains("Now: <span id=\"agent-now\">demo"),
        "a test saves nothing: {b}"
    );

    let saved = web.post("/admin/agent", &typed).await;
    let b = &saved.body;
    assert!(
        b.contains(
            "class=\"warn\" role=\"status\" id=\"notice\">Saved, but the agent does not answer: "
        ),
        "{b}"
    );
    assert!(
        !b.contains("class=\"good\""),
        "no green for a silent agent: {b}"
    );

    let demo = web
        .post("/admin/agent", &[("csrf", &csrf), ("backend", "demo")])
        .await;
    assert!(
        demo.body.contains("class=\"good\" role=\"status\" id=\"notice\">Saved: new messages go to this agent, and it answers."),
        "{}",
        demo.body
    );
}

/// The status page's push line.
async fn push_line(web: &mut Web) -> String {
    let status = web.get("/admin/").await;
    between(&status.body, "<dd id=\"push\">", "</dd>")
}

#[tokio::test]
async fn push_is_called_working_only_after_a_test_push_got_through() {
    // A server that refuses connections: the test says so, and Status says failing.
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let dead = dead_url();
    let gw = Gateway::start(dir.path(), &["--push", "ntfy", "--ntfy-server", &dead]);
    let (mut web, csrf) = signed_in(&gw).await;
    assert!(push_line(&mut web).await.contains("not tried yet"));
    let failed = web
        .post(
            "/admin/push/test",
            &[("csrf", &csrf), ("topic", "iris-test")],
        )
        .await;
    assert!(
        failed.body.contains(
            "class=\"bad\" role=\"alert\" id=\"notice\">The test push to topic iris-test"
        ),
        "{}",
        failed.body
    );
    let line = push_line(&mut web).await;
    assert!(
        line.contains("failing") && !line.contains("working"),
        "{line}"
    );
    drop(gw);

    // A server that takes it, before any phone registered: sent to the typed topic.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let ntfy = fake_http::start(move |req| {
        log.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&req.body).into_owned());
        fake_http::json_200(b"{}")
    });
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &["--push", "ntfy", "--ntfy-server", &ntfy]);
    let (mut web, csrf) = signed_in(&gw).await;
    let line = push_line(&mut web).await;
    assert!(
        line.contains("not tried yet") && !line.contains("working"),
        "{line}"
    );
    let sent = web
        .post(
            "/admin/push/test",
            &[("csrf", &csrf), ("topic", "iris-first-test")],
        )
        .await;
    assert!(
        sent.body.contains("class=\"good\" role=\"status\" id=\"notice\">The test push reached topic iris-first-test"),
        "{}",
        sent.body
    );
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .any(|b| b.contains("iris-first-test")));
    assert_eq!(push_line(&mut web).await, "ntfy: working");
}

#[tokio::test]
async fn sign_in_lands_on_the_page_asked_for_and_only_on_this_box() {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    let asked = web.get("/admin/push").await;
    assert_eq!(asked.status, 303);
    let to = asked.header("location").unwrap().to_owned();
    assert_eq!(to, "/admin/?next=/admin/push");
    let page = web.get(&to).await;
    assert_eq!(page.field("next"), "/admin/push");
    let r = web
        .request_form(
            "/admin/signin",
            &[
                ("pre", &page.field("pre")),
                ("passphrase", PASSPHRASE),
                ("next", "/admin/push"),
            ],
        )
        .await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/admin/push"));

    for elsewhere in [
        "https://evil.example/",
        "//evil.example/admin/",
        "/admin/../x",
        "/admin/static/admin.js",
    ] {
        let mut web = Web::new(&gw, "127.0.0.1");
        let pre = web.get("/admin/").await.field("pre");
        let r = web
            .request_form(
                "/admin/signin",
                &[
                    ("pre", &pre),
                    ("passphrase", PASSPHRASE),
                    ("next", elsewhere),
                ],
            )
            .await;
        assert_eq!(r.header("location"), Some("/admin/"), "{elsewhere}");
    }
}
