//! The Log page, end to end with the real binary over real HTTP: it filters the log ring by
//! level and by text, downloads what it shows as a text file, shows times in the zone the owner
//! saved (refusing one the box does not know), and still shows the lines from before a restart.

mod common;

use std::time::Duration;

use common::web::Web;
use common::Gateway;

const OWNER: &str = "violet tractor harbour 42";

/// Lines of the page's log with `needle`.
fn with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn the_log_filters_by_level_and_text_downloads_and_shows_the_chosen_zone() {
    let data = common::temp_data_dir();
    let mut gw = Gateway::start(data.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    web.claim(OWNER).await;
    // A warning of a known text: a backup asked for before a backup passphrase is set.
    let folder = tempfile::tempdir().unwrap();
    let r = web
        .post_csrf(
            "/admin/backup/schedule",
            &[
                ("schedule", "off"),
                ("folder", folder.path().to_str().unwrap()),
                ("keep", "3"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    let r = web.post_csrf("/admin/backup/now", &[]).await;
    assert_eq!(r.status, 303, "{r:?}");
    let warned = "scheduled backup not made: no backup passphrase is set";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let all = web.get("/admin/log").await;
        if all.pre("log").contains(warned) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", all.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every level by default; at "warn" only warnings and errors.
    let all = web.get("/admin/log").await.pre("log");
    assert!(!with(&all, " INFO ").is_empty(), "{all}");
    let warn = web.get("/admin/log?level=warn").await.pre("log");
    assert!(!warn.is_empty());
    assert!(
        warn.lines()
            .all(|l| l.contains(" WARN ") || l.contains(" ERROR ")),
        "{warn}"
    );
    assert!(warn.contains(warned), "{warn}");
    let error = web.get("/admin/log?level=error").await.pre("log");
    assert!(!error.contains(warned), "{error}");

    // Text search, case-insensitive.
    let found = web
        .get("/admin/log?level=debug&q=OWNER+PASSPHRASE+SET")
        .await;
    let found = found.pre("log");
    assert!(!found.is_empty());
    assert!(
        found
            .lines()
            .all(|l| l.to_lowercase().contains("owner passphrase set")),
        "{found}"
    );

    // The download: a text attachment with what the page shows (oldest first).
    let file = web.get("/admin/log/download?level=warn&q=").await;
    assert_eq!(file.status, 200);
    assert!(file
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert!(file
        .header("content-disposition")
        .unwrap()
        .starts_with("attachment; filename=\"iris-gateway-log-"));
    assert!(file.body.contains(warned), "{}", file.body);
    assert!(file
        .body
        .lines()
        .all(|l| l.contains(" WARN ") || l.contains(" ERROR ")));

    // Times in the zone saved on the page (no daylight saving there: a fixed +09:00).
    let r = web
        .post_csrf("/admin/log/timezone", &[("timezone", "Asia/Tokyo")])
        .await;
    assert_eq!(r.status, 303, "{r:?}");
    let page = web.get("/admin/log?level=warn").await;
    assert!(page.body.contains("Times in Asia/Tokyo"), "{}", page.body);
    let first = page.pre("log");
    let line = first.lines().next().unwrap();
    assert!(line.contains(" +09:00 WARN "), "{line}");
    let r = web
        .post_csrf("/admin/log/timezone", &[("timezone", "Mars/Olympus_Mons")])
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("is not a time zone this box knows"),
        "{}",
        r.body
    );
    let r = web
        .post_csrf("/admin/log/timezone", &[("timezone", "../../etc/passwd")])
        .await;
    assert_eq!(r.status, 400);
    let saved = std::fs::read_to_string(data.path().join("settings.toml")).unwrap();
    assert!(saved.contains("timezone = \"Asia/Tokyo\""), "{saved}");
    let r = web
        .post_csrf("/admin/log/timezone", &[("timezone", "UTC")])
        .await;
    assert_eq!(r.status, 303);
    let utc = web.get("/admin/log?level=warn").await.pre("log");
    assert!(
        utc.lines().next().unwrap().contains(" +00:00 WARN "),
        "{utc}"
    );

    // A restart (here: a stop and a start) keeps the lines from before it.
    gw.stop_ok();
    assert!(data.path().join("log-before-restart.txt").exists());
    let gw = Gateway::start(data.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.sign_in(OWNER).await.status, 303);
    let after = web.get("/admin/log").await.pre("log");
    assert!(after.contains(warned), "{after}");
    assert!(
        after.contains("----- the gateway restarted -----"),
        "{after}"
    );
    assert!(!data.path().join("log-before-restart.txt").exists());
}

#[tokio::test]
async fn one_time_zone_picked_from_the_systems_list_is_used_on_the_status_page() {
    let Some(mut b) = common::cdp::Browser::start("one_time_zone_picked").await else {
        return;
    };
    let dir = common::temp_data_dir();
    let gw = common::Gateway::start(dir.path(), &[]);
    common::cdp::claim(&mut b, gw.addr, "violet tractor harbour 42").await;
    b.goto(&format!("http://{}/admin/log", gw.addr)).await;
    // A picker of the system's zones, not a field to type a name into.
    let offered = b
        .eval(
            "(() => { const s = document.querySelector('select#timezone'); \
             return s ? [s.options.length, [...s.options].some(o => o.value === 'Asia/Tokyo')] \
             : null; })()",
        )
        .await;
    assert!(
        offered[0].as_u64().unwrap() > 100 && offered[1] == serde_json::json!(true),
        "{offered}"
    );
    b.eval("document.querySelector('#timezone').value = 'Asia/Tokyo'")
        .await;
    b.eval("window.oldPage = true").await;
    b.click("#save-timezone").await;
    b.wait_for(
        "!window.oldPage && !!document.querySelector('#log')",
        "the log page",
    )
    .await;
    b.goto(&format!("http://{}/admin/", gw.addr)).await;
    let time = b
        .wait_for(
            "document.querySelector('#h-time') && document.querySelector('#h-time').textContent",
            "the status page's time",
        )
        .await;
    let time = time.as_str().unwrap();
    assert!(time.ends_with("+09:00 (Asia/Tokyo)"), "{time}");
}
