//! The Update page, end to end over real HTTP against the real binary in a scratch root
//! (tests/common/update_root.rs): an uploaded bundle is refused with its reason and nothing
//! staged (untrusted key, no CSRF token, a major version not allowed), a good one is staged,
//! installed by the helper and listed; an update offered by a release index is checked,
//! downloaded and, failing its health check, rolled back, shown on the page and in `status`
//! (degraded) until the owner dismisses it.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::fake_http;
use common::update_root::{shown, Root};
use common::web::Web;

const OWNER: &str = "violet tractor harbour 42";

fn addr(root: &Root) -> SocketAddr {
    root.url.trim_start_matches("ws://").parse().unwrap()
}

async fn signed_in(root: &Root) -> Web {
    root.start_serving();
    let mut web = Web::at(addr(root), "127.0.0.1");
    let r = web.claim(OWNER).await;
    assert!(r.status == 303 || r.status == 200, "{r:?}");
    web
}

async fn upload(web: &mut Web, bundle: &Path, query: &str) -> common::web::Reply {
    let csrf = web.csrf().await;
    let bytes = std::fs::read(bundle).unwrap();
    web.upload(
        &format!("/admin/update/upload{query}"),
        &bytes,
        &format!("X-CSRF-Token: {csrf}\r\n"),
    )
    .await
}

/// Saves the Update page's release index address (the form answers with a redirect).
async fn save_index(web: &mut Web, url: &str) {
    let r = web.post_csrf("/admin/update/source", &[("url", url)]).await;
    assert_eq!(r.status, 303, "{r:?}");
}

/// "Check now": a redirect to the check's job page, and that page once the check has ended
/// well.
async fn check_now(web: &mut Web) -> common::web::Reply {
    let r = web.post_csrf("/admin/update/check", &[]).await;
    assert_eq!(r.status, 303, "{r:?}");
    assert_eq!(r.header("location"), Some("/admin/job/update-check"));
    let job = web.job_outcome("update-check").await;
    assert!(
        job.body.contains("data-phase=\"succeeded\""),
        "{}",
        job.body
    );
    job
}

#[tokio::test(flavor = "current_thread")]
async fn an_uploaded_update_is_checked_refused_or_installed_and_listed() {
    let root = Root::new(20);
    let v = root.versions.clone();
    let mut web = signed_in(&root).await;

    let page = web.get("/admin/update").await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body
            .contains(&format!("Running <strong>iris-gateway {}</strong>", v.old)),
        "{}",
        page.body
    );
    assert!(page.body.contains("No updates yet"), "{}", page.body);
    assert!(!page.body.contains("no-helper"), "{}", page.body);

    // Signed by a key this box does not trust.
    let untrusted = root.untrusted_bundle(&v.minor);
    let r = upload(&mut web, &untrusted, "").await;
    assert_eq!(r.status, 422, "{r:?}");
    assert!(
        r.body.contains("bad signature") && r.body.contains("does not trust"),
        "{}",
        r.body
    );
    assert!(root.nothing_staged());

    // Without the session's CSRF token: nothing is read.
    let good = root.bundle(&root.variant(&v.minor), &v.minor);
    let r = web
        .upload(
            "/admin/update/upload",
            &std::fs::read(&good).unwrap(),
            "X-CSRF-Token: wrong\r\n",
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(root.nothing_staged());

    // A new major version needs the owner's tick.
    let major = root.bundle(&root.variant(&v.major), &v.major);
    let r = upload(&mut web, &major, "").await;
    assert_eq!(r.status, 422, "{r:?}");
    assert!(r.body.contains("major version"), "{}", r.body);
    assert!(root.nothing_staged());

    // The good one: checked, staged for the helper, shown as under way.
    let r = upload(&mut web, &good, "").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains("is checked and is being installed"),
        "{}",
        r.body
    );
    assert!(root.stage_dir().join("staged.json").exists());
    // Sent again (a second click) before the helper took it: refused, the staged one kept.
    let staged_before = std::fs::read(root.stage_dir().join("staged.iub")).unwrap();
    let r = upload(&mut web, &good, "").await;
    assert_eq!(r.status, 422, "{r:?}");
    assert!(
        r.body.contains("already waiting for the installer"),
        "{}",
        r.body
    );
    assert_eq!(
        std::fs::read(root.stage_dir().join("staged.iub")).unwrap(),
        staged_before
    );
    let page = web.get("/admin/update").await;
    assert!(
        page.body.contains(&format!("Installing {}", v.minor)),
        "{}",
        page.body
    );

    // What iris-gateway-update.service does when staged.json appears.
    let out = root.apply(&[]);
    assert!(out.status.success(), "{}\n{}", shown(&out), root.log_tail());
    let minor_v = v.minor.clone();
    root.wait_status(&format!("version {minor_v} committed"), |s| {
        s["version"] == minor_v.as_str() && s["update_trial"] == false
    });
    // The session was kept over the restart the update made.
    let page = web.get("/admin/update").await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body.contains(&format!(
            "Running <strong>iris-gateway {}</strong>",
            v.minor
        )),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(&format!(
            "<td data-label=\"Version\">{} → {}</td><td class=\"good\" data-label=\"Result\">installed",
            v.old, v.minor
        )),
        "{}",
        page.body
    );
    assert!(!page.body.contains("Installing"), "{}", page.body);
    root.stop();
}

#[tokio::test(flavor = "current_thread")]
async fn an_offered_update_that_fails_is_rolled_back_and_shown_until_dismissed() {
    let root = Root::new(6);
    let v = root.versions.clone();
    // A real program for this architecture that never comes up: /bin/false.
    let failing = root.bundle_with(
        Path::new("/bin/false"),
        &v.minor,
        std::env::consts::ARCH,
        &root.key,
        "failing.iub",
    );
    let bundle = std::fs::read(&failing).unwrap();
    let index = serde_json::json!({
        "version": v.minor,
        "notes": "Fixes the thing that was broken.",
        "bundles": { std::env::consts::ARCH: "failing.iub" },
    })
    .to_string();
    let server = fake_http::start(move |taken| {
        if taken.line.starts_with("GET /releases/index.json ") {
            fake_http::json_200(index.as_bytes())
        } else if taken.line.starts_with("GET /releases/failing.iub ") {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                bundle.len()
            )
            .into_bytes();
            r.extend_from_slice(&bundle);
            r
        } else {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    });
    let mut web = signed_in(&root).await;

    // No address yet: no check offered.
    let page = web.get("/admin/update").await;
    assert!(!page.body.contains("id=\"check\""), "{}", page.body);
    save_index(&mut web, "ftp://nowhere/x").await;
    let page = web.get("/admin/update").await;
    assert!(
        page.body.contains("must start with https://"),
        "{}",
        page.body
    );
    let url = format!("{server}/releases/index.json");
    save_index(&mut web, &url).await;
    let page = web.get("/admin/update").await;
    assert!(page.body.contains("id=\"check\""), "{}", page.body);

    check_now(&mut web).await;
    let page = web.get("/admin/update").await;
    assert!(
        page.body.contains(&format!("{} is available", v.minor))
            && page.body.contains("Fixes the thing that was broken."),
        "{}",
        page.body
    );

    let r = web.post_csrf("/admin/update/install", &[]).await;
    assert_eq!(r.status, 303, "{r:?}");
    assert_eq!(r.header("location"), Some("/admin/job/update-install"));
    let job = web.job_outcome("update-install").await;
    assert!(job.body.contains("downloaded and checked"), "{}", job.body);
    assert!(root.stage_dir().join("staged.json").exists());

    let out = root.apply(&[]);
    assert!(out.status.success(), "{}\n{}", shown(&out), root.log_tail());
    let old = v.old.clone();
    let status = root.wait_status("the old version back, the failure shown", |s| {
        s["version"] == old.as_str() && s["update_failure"].is_string()
    });
    let failure = format!("update to {} failed, rolled back", v.minor);
    assert!(
        status["update_failure"]
            .as_str()
            .unwrap()
            .starts_with(&failure),
        "{status}"
    );
    assert_eq!(status["state"], "degraded", "{status}");
    assert!(
        status["causes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().starts_with(&failure)),
        "{status}"
    );

    let home = web.get("/admin/").await;
    assert!(
        home.body.contains(&format!("The {failure}")) && home.body.contains("/admin/update"),
        "{}",
        home.body
    );
    let page = web.get("/admin/update").await;
    assert!(
        page.body.contains("id=\"update-failure\"") && page.body.contains(&failure),
        "{}",
        page.body
    );
    assert!(page.body.contains("rolled back</td>"), "{}", page.body);
    let id = root.last_entry().id;
    let r = web
        .post_csrf("/admin/update/dismiss", &[("id", id.as_str())])
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    let page = web.get("/admin/update").await;
    assert!(
        !page.body.contains("id=\"update-failure\""),
        "{}",
        page.body
    );
    let status = root.status().expect("status");
    assert!(status["update_failure"].is_null(), "{status}");
    assert_eq!(status["state"], "online", "{status}");
    root.stop();
}

/// The page's own script sends a chosen file (the update form and the restore form share it):
/// in Chromium, a file that is no bundle is refused and the page says why, in its result line.
#[tokio::test(flavor = "current_thread")]
async fn the_pages_upload_forms_send_the_file_and_show_the_answer() {
    let Some(mut b) = common::cdp::Browser::start("the_pages_upload_forms").await else {
        return;
    };
    let root = Root::new(20);
    root.start_serving();
    let base = format!("http://{}", addr(&root));
    common::cdp::claim(&mut b, addr(&root), OWNER).await;
    // A chosen file, as the file picker would give it.
    let choose = |input: &str| {
        format!(
            "(() => {{ const t = new DataTransfer(); \
             t.items.add(new File(['not a bundle at all'], 'x.iub')); \
             document.querySelector('{input}').files = t.files; return true; }})()"
        )
    };
    for (page, input, button, result, said) in [
        (
            "/admin/update",
            "#update-file",
            "#upload",
            "#update-result",
            "Update refused. Nothing was changed: not a usable bundle",
        ),
        (
            "/admin/backup",
            "#restore-file",
            "#restore",
            "#restore-result",
            "This is not an iris-gateway backup: it is neither a plain backup",
        ),
    ] {
        b.goto(&format!("{base}{page}")).await;
        b.wait_for(&format!("document.querySelector('{input}')"), page)
            .await;
        b.eval("window.confirm = () => true").await;
        b.eval(&choose(input)).await;
        b.click(button).await;
        let shown = b
            .wait_for(
                &format!(
                    "(() => {{ const o = document.querySelector('{result}'); \
                     return o.className === 'bad' && o.textContent; }})()"
                ),
                "the upload's answer on the page",
            )
            .await;
        assert!(shown.as_str().unwrap().contains(said), "{page}: {shown}");
    }
    assert!(root.nothing_staged());

    // A refusal by the helper itself (a bundle staged by hand, signed by an untrusted key)
    // leaves a history row with a long reason: on a phone the table becomes one card per
    // update and no page is wider than the screen.
    let v = root.versions.clone();
    let untrusted = root.untrusted_bundle(&v.minor);
    std::fs::copy(&untrusted, root.stage_dir().join("staged.iub")).unwrap();
    std::fs::write(
        root.stage_dir().join("staged.json"),
        serde_json::json!({ "to": v.minor, "staged_at": 0 }).to_string(),
    )
    .unwrap();
    let out = root.apply(&[]);
    assert!(out.status.success(), "{}", shown(&out));
    b.call(
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({ "width": 360, "height": 800, "deviceScaleFactor": 1, "mobile": true }),
    )
    .await;
    b.goto(&format!("{base}/admin/update")).await;
    b.wait_for("document.querySelector('#history td')", "the history")
        .await;
    let fits = b
        .eval(
            "[document.documentElement.scrollWidth, innerWidth, \
             document.querySelector('#history td[data-label=\"Result\"]').offsetParent !== null, \
             document.querySelector('#history td[data-label=\"Result\"]').textContent]",
        )
        .await;
    assert!(
        fits[0].as_u64() <= fits[1].as_u64(),
        "wider than the phone: {fits}"
    );
    assert_eq!(fits[2], serde_json::json!(true), "the row is shown: {fits}");
    assert_eq!(fits[3], serde_json::json!("refused"), "{fits}");
    root.stop();
}

/// The running version with its minor part one up: an update offered with no consent asked.
fn next_minor() -> String {
    let v: Vec<u64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    format!("{}.{}.0", v[0], v[1] + 1)
}

/// A release index and a bundle behind a slow link: each answer waits for a word from the
/// test (`release`); the bundle sends its head and its first MiB, then waits again, and is cut
/// there (the connection closes) whatever the word.
fn slow_release_server() -> (String, std::sync::mpsc::Sender<()>) {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let index = serde_json::json!({
        "version": next_minor(),
        "notes": "Slowly.",
        "bundles": { std::env::consts::ARCH: "b.iub" },
    })
    .to_string();
    let url = fake_http::start_streaming(move |taken, out| {
        let word = || {
            let _ = wait
                .lock()
                .unwrap()
                .recv_timeout(std::time::Duration::from_secs(60));
        };
        if taken.line.starts_with("GET /index.json ") {
            word();
            let _ = out.write_all(&fake_http::json_200(index.as_bytes()));
        } else {
            let head = "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\nConnection: close\r\n\r\n";
            let _ = out.write_all(head.as_bytes());
            let _ = out.write_all(&vec![0x5Au8; 1 << 20]);
            let _ = out.flush();
            word();
        }
    });
    (format!("{url}/index.json"), release)
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_check_and_a_cut_download_are_jobs_that_leave_no_part_file() {
    use std::time::{Duration, Instant};
    const DEADLINE: Duration = Duration::from_secs(2);
    let data = common::temp_data_dir();
    let cfg = data.path().join("config.toml");
    std::fs::write(&cfg, "[limits]\nhello_timeout_secs = 2\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let mut gw = common::Gateway::start(data.path(), &["--config", &cfg]);
    let mut web = Web::new(&gw, "127.0.0.1");
    web.claim(OWNER).await;
    let (index, release) = slow_release_server();
    save_index(&mut web, &index).await;
    let part = data.path().join("update").join("upload.part");

    // "Check now" against an index that answers after the request deadline.
    let csrf = web.csrf().await;
    let asked = Instant::now();
    let r = web
        .request_form("/admin/update/check", &[("csrf", &csrf)])
        .await;
    let answered = asked.elapsed();
    assert_eq!(r.status, 303, "{r:?}");
    assert_eq!(r.header("location"), Some("/admin/job/update-check"));
    assert!(answered < DEADLINE, "answered after {answered:?}");
    let page = web.get("/admin/job/update-check").await;
    assert!(
        page.body.contains("data-phase=\"running\""),
        "{}",
        page.body
    );
    let again = web
        .request_form("/admin/update/check", &[("csrf", &csrf)])
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    assert!(again.body.contains("already under way"), "{}", again.body);
    tokio::time::sleep_until((asked + DEADLINE + Duration::from_secs(1)).into()).await;
    release.send(()).unwrap();
    let job = web.job_outcome("update-check").await;
    assert!(
        job.body.contains("data-phase=\"succeeded\"")
            && job.body.contains(&format!("{} is available", next_minor())),
        "{}",
        job.body
    );
    eprintln!(
        "figure: slow index check: answered in {answered:?}, ended after {:?}",
        asked.elapsed()
    );

    // Install: the download outlasts the deadline, a second click and an upload are refused
    // while it runs, and once it is cut half-way nothing is left of it.
    let asked = Instant::now();
    let r = web
        .request_form("/admin/update/install", &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    assert_eq!(r.header("location"), Some("/admin/job/update-install"));
    assert!(asked.elapsed() < DEADLINE);
    let again = web
        .request_form("/admin/update/install", &[("csrf", &csrf)])
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    let token = format!("X-CSRF-Token: {csrf}\r\n");
    let upload = web
        .upload("/admin/update/upload", b"a bundle", &token)
        .await;
    assert_eq!(upload.status, 409, "{upload:?}");
    assert!(upload.body.contains("already under way"), "{}", upload.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::metadata(&part).is_ok_and(|m| m.len() >= 1 << 20) {
        assert!(Instant::now() < deadline, "no download under way");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep_until((asked + DEADLINE + Duration::from_secs(1)).into()).await;
    let page = web.get("/admin/job/update-install").await;
    assert!(
        page.body.contains("data-phase=\"running\""),
        "{}",
        page.body
    );
    release.send(()).unwrap();
    let job = web.job_outcome("update-install").await;
    assert!(
        job.body.contains("data-phase=\"failed\"") && job.body.contains("the download broke off"),
        "{}",
        job.body
    );
    eprintln!("figure: cut download: failed after {:?}", asked.elapsed());
    assert!(!part.exists(), "the cut download's part file is left");

    // Killed mid-download: the next start removes the part file.
    let r = web
        .request_form("/admin/update/install", &[("csrf", &csrf)])
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::metadata(&part).is_ok_and(|m| m.len() >= 1 << 20) {
        assert!(Instant::now() < deadline, "no download under way");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.kill9();
    release.send(()).unwrap();
    let mut gw = common::Gateway::start(data.path(), &["--config", &cfg]);
    assert!(
        !part.exists(),
        "a part file survived the kill and the start"
    );
    gw.stop_ok();
}

#[tokio::test(flavor = "current_thread")]
async fn with_no_update_helper_a_bundle_is_checked_before_the_refusal_and_nothing_is_ticked_without_an_index(
) {
    let Some(mut b) = common::cdp::Browser::start("with_no_update_helper").await else {
        return;
    };
    let root = Root::new(20);
    std::fs::remove_dir_all(&root.helper_dir).unwrap();
    root.start_serving();
    let base = format!("http://{}", addr(&root));
    common::cdp::claim(&mut b, addr(&root), OWNER).await;

    // No release index is set: "Install fixes by itself" is not shown ticked, and says why.
    b.goto(&format!("{base}/admin/update")).await;
    b.wait_for("document.querySelector('#no-helper')", "the page")
        .await;
    let automatic = b
        .eval(
            "[document.querySelector('#automatic').checked, \
             document.querySelector('#automatic').closest('label').textContent]",
        )
        .await;
    assert_eq!(automatic[0], serde_json::json!(false), "{automatic}");
    assert!(
        automatic[1]
            .as_str()
            .unwrap()
            .contains("needs the release index address"),
        "{automatic}"
    );
    let said = b
        .eval("document.querySelector('#no-helper').textContent")
        .await;
    assert!(said.as_str().unwrap().contains("checked in full"), "{said}");

    // What the page says is so: a bundle is checked before the missing helper refuses it.
    let mut web = Web::at(addr(&root), "127.0.0.1");
    let r = web.sign_in(OWNER).await;
    assert!(r.status == 303 || r.status == 200, "{r:?}");
    let v = root.versions.clone();
    let r = upload(&mut web, &root.untrusted_bundle(&v.minor), "").await;
    assert_eq!(r.status, 422, "{r:?}");
    assert!(r.body.contains("does not trust"), "{}", r.body);
    assert!(!r.body.contains("no update helper"), "{}", r.body);
    let good = root.bundle(&root.variant(&v.minor), &v.minor);
    let r = upload(&mut web, &good, "").await;
    assert_eq!(r.status, 422, "{r:?}");
    assert!(
        r.body
            .contains(&format!("iris-gateway {} (signed by", v.minor))
            && r.body.contains("is good for this box")
            && r.body.contains("no update helper"),
        "{}",
        r.body
    );
    assert!(root.nothing_staged());
}

/// What the owner typed and what the release index says reach the Update page and the check's
/// job page as text, never as markup: the address, the version's notes, the check's answer.
#[tokio::test(flavor = "current_thread")]
async fn what_the_index_and_the_address_say_is_shown_as_text_not_markup() {
    const MARKUP: &str = "<img src=x onerror=alert(1)>";
    let data = common::temp_data_dir();
    let mut gw = common::Gateway::start(data.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    web.claim(OWNER).await;
    let index = serde_json::json!({
        "version": next_minor(),
        "notes": format!("Fixes \"quotes\" & {MARKUP}."),
        "bundles": { std::env::consts::ARCH: "b.iub" },
    })
    .to_string();
    let server = fake_http::start(move |taken| {
        if taken.line.starts_with("GET /index.json ") {
            fake_http::json_200(index.as_bytes())
        } else {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    });

    // An address that would close its attribute and open an element.
    let hostile = format!("http://127.0.0.1:9/\">{MARKUP}");
    save_index(&mut web, &hostile).await;
    let page = web.get("/admin/update").await;
    assert!(
        page.body
            .contains("value=\"http://127.0.0.1:9/&quot;&gt;&lt;img src=x onerror=alert(1)&gt;\"")
            && !page.body.contains(MARKUP),
        "{}",
        page.body
    );

    // The notes of a real index.
    let url = format!("{server}/index.json");
    save_index(&mut web, &url).await;
    check_now(&mut web).await;
    let page = web.get("/admin/update").await;
    assert!(
        page.body.contains(
            "<p class=\"notes\">Fixes &quot;quotes&quot; &amp; &lt;img src=x onerror=alert(1)&gt;.</p>"
        ) && !page.body.contains(MARKUP),
        "{}",
        page.body
    );
    gw.stop_ok();
}
