//! No saved setting stops the gateway from starting: a part whose settings from the admin page
//! (`DATA_DIR/settings.toml`) cannot work starts switched off, the gateway comes up `degraded`
//! with that cause (in `iris-gateway status`, on the admin page's home, and as every phone's
//! `status`), and the page that set it fixes it. The Push page takes the FCM key as an upload
//! and refuses FCM without a key that works.

mod common;

use std::path::Path;
use std::time::Duration;

use common::web::{Reply, Web};
use common::{
    cli_ok, connect_with_status, demo_reply, frame_type, nth_listening, owner_set, pair,
    recv_answer, temp_data_dir, Client, Gateway,
};
use serde_json::Value;

const PASSPHRASE: &str = "violet tractor harbour 42";
const FIXTURE_KEY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/fcm-service-account.json"
);
/// What the fixture key says it is for (shown on the page; the private key never is).
const KEY_EMAIL: &str = "gateway@iris-test.iam.gserviceaccount.com";

/// A claimed data dir with `settings` as the saved settings, and the gateway started on it.
fn start_with_saved(settings: &str) -> (tempfile::TempDir, Gateway) {
    let dir = temp_data_dir();
    owner_set(dir.path(), PASSPHRASE);
    if !settings.is_empty() {
        std::fs::write(dir.path().join("settings.toml"), settings).unwrap();
    }
    let gw = Gateway::start(dir.path(), &[]);
    (dir, gw)
}

/// `iris-gateway status --json`: what the control socket reports.
fn status(dir: &Path) -> Value {
    let d = dir.to_str().unwrap();
    serde_json::from_str(&cli_ok(&["status", "--data-dir", d, "--json"])).unwrap()
}

/// The causes of `degraded` in one line.
fn causes(report: &Value) -> String {
    report["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Asserts the gateway at `url` is degraded with one cause, which contains each of `words`,
/// over the control socket, on the admin page's home (linking to `fix_at`) and as a phone's
/// `status`.
async fn assert_degraded_by(url: &str, dir: &Path, web: &mut Web, words: &[&str], fix_at: &str) {
    let report = status(dir);
    assert_eq!(report["state"], "degraded", "{report}");
    let said = causes(&report);
    assert_eq!(report["causes"].as_array().unwrap().len(), 1, "{said}");
    for w in words {
        assert!(said.contains(w), "{w:?} not in the cause: {said}");
    }
    let home = web.get("/admin/").await;
    let problems = home.after("<ul id=\"problems\"", "</ul>");
    assert!(problems.to_lowercase().contains(words[0]), "{problems}");
    assert!(
        problems.contains(&format!("href=\"{fix_at}\"")),
        "{problems}"
    );
    let (_c, greeting) = phone_greeting(url, dir).await;
    assert_eq!(greeting["payload"]["state"], "degraded", "{greeting}");
}

/// A newly paired phone's `hello` at `url`, and the `status` that greets it.
async fn phone_greeting(url: &str, dir: &Path) -> (Client, Value) {
    let phone = pair(dir, "phone");
    let (mut c, _) = Client::hello(url, &phone.token, &phone.device_id).await;
    let status = c.recv().await;
    assert_eq!(frame_type(&status), "status", "{status}");
    (c, status)
}

async fn signed_in(gw: &Gateway) -> Web {
    let mut web = Web::new(gw, "127.0.0.1");
    let r = web.sign_in(PASSPHRASE).await;
    assert_eq!(r.status, 303, "{r:?}");
    web
}

/// Stops the gateway and starts it again on the same data dir.
fn restart(gw: &mut Gateway, dir: &Path) -> Gateway {
    gw.stop_ok();
    Gateway::start(dir, &[])
}

fn assert_online(dir: &Path) {
    let report = status(dir);
    assert_eq!(report["state"], "online", "{report}");
    assert!(report["causes"].as_array().unwrap().is_empty(), "{report}");
}

/// The fixture key as the Firebase console gives it.
fn good_key() -> String {
    std::fs::read_to_string(FIXTURE_KEY)
        .unwrap()
        .replace("TOKEN_PORT", "9")
}

/// The Push form as a browser sends it for `backend`, with the key file `key` (empty: none
/// chosen).
async fn save_push(web: &mut Web, backend: &str, key: &str) -> Reply {
    let fields = [
        ("backend", backend),
        ("ntfy_server", ""),
        ("ntfy_token", ""),
        ("content", "preview"),
    ];
    // With no file chosen a browser still sends the part, empty and with an empty name.
    let name = if key.is_empty() {
        ""
    } else {
        "service-account.json"
    };
    web.post_multipart("/admin/push", &fields, &[("fcm_key", name, key)])
        .await
}

#[tokio::test]
async fn saved_fcm_without_a_key_starts_push_off_and_an_uploaded_key_fixes_it() {
    // What the Push page saved before it took keys: FCM, and no key anywhere.
    let (dir, gw) = start_with_saved("[push]\nbackend = \"fcm\"\n");
    let mut web = signed_in(&gw).await;
    assert_degraded_by(
        &gw.url,
        dir.path(),
        &mut web,
        &["push is off", "service-account key"],
        "/admin/push",
    )
    .await;
    assert_eq!(status(dir.path())["push"], "none");
    let page = web.get("/admin/push").await;
    let now = page.after("id=\"push-now\">", "<");
    assert!(
        now.starts_with("push is off: ") && now.contains("key"),
        "{now}"
    );

    upload_the_key_and_restart(&mut web, gw, dir.path()).await;
}

#[tokio::test]
async fn a_saved_fcm_key_file_that_is_not_a_key_starts_push_off_and_an_uploaded_key_fixes_it() {
    // As a hand-edit or a damaged card may leave it: a key file FCM cannot use.
    let dir = temp_data_dir();
    let key_file = dir.path().join("fcm-service-account.json");
    std::fs::write(&key_file, "{\"type\": \"authorized_user\"}").unwrap();
    owner_set(dir.path(), PASSPHRASE);
    std::fs::write(
        dir.path().join("settings.toml"),
        "[push]\nbackend = \"fcm\"\n",
    )
    .unwrap();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = signed_in(&gw).await;
    assert_degraded_by(
        &gw.url,
        dir.path(),
        &mut web,
        &["push is off", "not a service-account key"],
        "/admin/push",
    )
    .await;
    // The key in use cannot work: saving FCM again without a new one is refused.
    let refused = save_push(&mut web, "fcm", "").await;
    assert!(
        refused.notice().contains("The FCM key in use cannot work"),
        "{}",
        refused.notice()
    );
    upload_the_key_and_restart(&mut web, gw, dir.path()).await;
}

/// The fix on the Push page: FCM with the good key uploaded, then a restart that comes up
/// online with FCM running; the key is stored privately and shown only by whom it is for.
async fn upload_the_key_and_restart(web: &mut Web, mut gw: Gateway, dir: &Path) {
    let saved = save_push(web, "fcm", &good_key()).await;
    let said = saved.notice();
    assert!(said.starts_with("Saved, with the FCM key of"), "{said}");
    assert!(
        said.contains(KEY_EMAIL) && said.contains("iris-test"),
        "{said}"
    );
    assert!(
        !saved.body.contains("PRIVATE KEY"),
        "the key is never shown"
    );
    let key_file = dir.join("fcm-service-account.json");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        std::fs::read_to_string(&key_file).unwrap(),
        good_key().trim()
    );

    let gw = restart(&mut gw, dir);
    assert_online(dir);
    assert_eq!(status(dir)["push"], "fcm");
    let phone = pair(dir, "phone after the fix");
    let (_c, ack, greeting) = connect_with_status(&gw, &phone).await;
    assert_eq!(greeting["payload"]["state"], "online", "{greeting}");
    assert_eq!(ack["payload"]["server_caps"]["push"], "fcm", "{ack}");
    let page = signed_in(&gw).await.get("/admin/push").await;
    assert!(
        page.body.contains(KEY_EMAIL),
        "the page names the key in use"
    );
    assert!(!page.body.contains("PRIVATE KEY"));
    assert!(!gw.output_tail().contains("PRIVATE KEY"), "never logged");
}

#[tokio::test]
async fn restart_now_after_fcm_was_saved_without_a_key_comes_back_degraded() {
    // What the Push page used to save with no key; its Restart now then never came back.
    let (dir, gw) = start_with_saved("");
    std::fs::write(
        dir.path().join("settings.toml"),
        "[push]\nbackend = \"fcm\"\n",
    )
    .unwrap();
    let mut web = signed_in(&gw).await;
    let csrf = web.csrf().await;
    let restarting = web.post("/admin/power/restart", &[("csrf", &csrf)]).await;
    assert_eq!(restarting.status, 200, "{restarting:?}");
    web.addr = nth_listening(&gw, 2, Duration::from_secs(30)).await;
    let url = format!("ws://{}", web.addr);
    let words = ["push is off", "service-account key"];
    assert_degraded_by(&url, dir.path(), &mut web, &words, "/admin/push").await;
    // The page waiting for the restart reads this: it answers, so the wait ends.
    assert_eq!(web.get("/admin/health.json").await.status, 200);
}

#[tokio::test]
async fn a_saved_push_backend_that_cannot_work_starts_push_off_and_switching_it_back_fixes_it() {
    let (dir, mut gw) = start_with_saved("[push]\nbackend = \"pigeon\"\n");
    let mut web = signed_in(&gw).await;
    assert_degraded_by(
        &gw.url,
        dir.path(),
        &mut web,
        &["push is off", "push.backend"],
        "/admin/push",
    )
    .await;
    let saved = save_push(&mut web, "none", "").await;
    assert!(saved.notice().starts_with("Saved."), "{}", saved.notice());
    let _gw = restart(&mut gw, dir.path());
    assert_online(dir.path());
}

#[tokio::test]
async fn a_saved_agent_backend_that_cannot_work_starts_the_agent_off_until_the_agent_page_sets_one()
{
    let cause = ["agent is off", "agent.backend"];
    let fix = ("/admin/agent", &[("backend", "demo")][..]);
    let saved = "[agent]\nbackend = \"bogus\"\n";
    let (_dir, gw, mut c) = fixed_live_by_a_form(saved, &cause, "/admin/agent", fix).await;
    c.send_text(Some("default"), None, "and now?").await;
    let (_, answer) = recv_answer(&mut c).await;
    assert_eq!(answer, demo_reply("and now?"), "{}", gw.output_tail());
}

#[tokio::test]
async fn a_saved_transcription_service_that_cannot_work_starts_off_until_the_page_sets_one() {
    let cause = ["transcription is off", "transcription.url"];
    let off = [("url", ""), ("model", ""), ("language", "")];
    let fix = ("/admin/transcription", &off[..]);
    let saved = "[transcription]\nurl = \"ftp://stt.example\"\n";
    fixed_live_by_a_form(saved, &cause, "/admin/agent", fix).await;
}

/// Starts on the bad `saved` settings, degraded with a cause of `words`; a message sent then is
/// answered (by the agent off: with why it is off). Then sends the form `fix` (path, fields):
/// the phone is told `online` at once, with no restart, and the status has no cause left.
/// The data dir, the gateway and the phone, for what the test checks next.
async fn fixed_live_by_a_form(
    saved: &str,
    words: &[&str],
    fix_at: &str,
    (form, fields): (&str, &[(&str, &str)]),
) -> (tempfile::TempDir, Gateway, Client) {
    let (dir, gw) = start_with_saved(saved);
    let mut web = signed_in(&gw).await;
    assert_degraded_by(&gw.url, dir.path(), &mut web, words, fix_at).await;
    let (mut c, _) = phone_greeting(&gw.url, dir.path()).await;
    c.send_text(Some("default"), None, "hello").await;
    let (_, answer) = recv_answer(&mut c).await;
    if words[0] == "agent is off" {
        assert!(answer.contains("the agent is off"), "{answer}");
        assert!(answer.contains("Agent page"), "{answer}");
    } else {
        assert_eq!(answer, demo_reply("hello"));
    }
    let csrf = web.csrf().await;
    let mut all = vec![("csrf", csrf.as_str())];
    all.extend_from_slice(fields);
    let saved = web.post(form, &all).await;
    assert!(saved.notice().starts_with("Saved"), "{}", saved.notice());
    c.recv_until(|f| frame_type(f) == "status" && f["payload"]["state"] == "online")
        .await;
    assert_online(dir.path());
    (dir, gw, c)
}

#[tokio::test]
async fn unreadable_saved_settings_are_set_aside_and_the_gateway_starts_without_them() {
    let broken = "[agent]\nkey = \"sk-never-shown\"\nurl = \n";
    let (dir, mut gw) = start_with_saved(broken);
    let mut web = signed_in(&gw).await;
    assert_degraded_by(
        &gw.url,
        dir.path(),
        &mut web,
        &[
            "saved settings cannot be read",
            "settings.toml.unreadable",
            "line 3",
        ],
        "/admin/agent",
    )
    .await;
    let aside = dir.path().join("settings.toml.unreadable");
    assert_eq!(
        std::fs::read_to_string(aside).unwrap(),
        broken,
        "kept as it was"
    );
    assert!(!dir.path().join("settings.toml").exists());
    assert!(!causes(&status(dir.path())).contains("sk-never-shown"));
    assert!(!gw.output_tail().contains("sk-never-shown"));
    // The pages save afresh, and the next start reads what they saved.
    let saved = save_push(&mut web, "none", "").await;
    assert!(saved.notice().starts_with("Saved."), "{}", saved.notice());
    let _gw = restart(&mut gw, dir.path());
    assert_online(dir.path());
}

#[tokio::test]
async fn the_push_page_saves_fcm_only_with_a_key_that_works() {
    let (dir, gw) = start_with_saved("");
    let mut web = signed_in(&gw).await;
    let settings = dir.path().join("settings.toml");

    let refused = save_push(&mut web, "fcm", "").await;
    let said = refused.notice();
    assert!(said.contains("needs its service-account key"), "{said}");
    assert!(said.contains("nothing was saved"), "{said}");
    assert!(!settings.exists(), "nothing saved");

    let key = good_key();
    let no_private_key = {
        let mut v: Value = serde_json::from_str(&key).unwrap();
        v.as_object_mut().unwrap().remove("private_key");
        v.to_string()
    };
    let not_a_key = key.replace(
        "-----BEGIN PRIVATE KEY-----\\nMII",
        "-----BEGIN PRIVATE KEY-----\\nMIA",
    );
    // Padded inside the JSON: what is around it is trimmed.
    let oversized = key.replacen('{', &format!("{{{}", " ".repeat(9 << 10)), 1);
    for (bad, why) in [
        ("{not json", "not a service-account key"),
        (&no_private_key, "private_key"),
        (&not_a_key, "private_key"),
        (&oversized, "over 8192 bytes"),
    ] {
        let refused = save_push(&mut web, "fcm", bad).await;
        let said = refused.notice();
        assert!(
            said.contains(why) && said.contains("nothing was saved"),
            "{said}"
        );
        assert!(!said.contains("MII"), "the key is never quoted: {said}");
        assert!(!settings.exists(), "nothing saved for {why}");
        assert!(!dir.path().join("fcm-service-account.json").exists());
    }

    let saved = save_push(&mut web, "fcm", &key).await;
    assert!(saved.notice().contains(KEY_EMAIL), "{}", saved.notice());
    let text = std::fs::read_to_string(&settings).unwrap();
    assert!(text.contains("backend = \"fcm\""), "{text}");
    // The key is found by its file, so the settings stay readable by older versions.
    assert!(!text.contains("fcm_credentials"), "{text}");
    // Saved again with no new file: the key in use is kept (and checked).
    let again = save_push(&mut web, "fcm", "").await;
    assert!(again.notice().starts_with("Saved."), "{}", again.notice());
    // Saved settings apply at the next start: this one still runs as it started.
    assert_online(dir.path());
    assert!(!gw.output_tail().contains("PRIVATE KEY"));
}

#[test]
fn the_config_file_written_at_the_box_still_refuses_to_start_with_its_reason() {
    // Whoever wrote the config file is at the box and reads the message; the page cannot fix
    // the file, so it is not switched off quietly.
    let data = temp_data_dir();
    let config = data.path().join("config.toml");
    std::fs::write(&config, "[push]\nbackend = \"fcm\"\n").unwrap();
    let (d, c) = (data.path().to_str().unwrap(), config.to_str().unwrap());
    let out = common::cli(&[
        "run",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        d,
        "--config",
        c,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("push.fcm_credentials"), "{stderr}");
}
