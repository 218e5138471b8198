//! The admin home page's health at a glance, end to end with the real binary and a real
//! headless Chromium (tests/common/cdp.rs): the box's figures read from this machine and
//! refreshed by the page's script, a problem linked to its fix, restarting the gateway from the
//! page and coming back to it signed in, and reboot and shut-down running the configured
//! command (a script writing a marker here: never the machine's own).

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use common::cdp::Browser;
use common::{nth_listening, temp_data_dir, Gateway};
use serde_json::{json, Value};

const PASSPHRASE: &str = "violet tractor harbour 42";
const NOT_REPORTED: &str = "not reported by this board";

/// A loopback port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path.to_str().unwrap().to_owned()
}

/// A `[power]` script in `dir` that records what it was asked in a marker file (then runs
/// `more`), and a config (`before`, then `[power]` naming it): the marker's path and the
/// config's.
fn power_script(dir: &Path, more: &str, before: &str) -> (std::path::PathBuf, String) {
    let marker = dir.join("asked");
    let script = dir.join("power.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$1\" >> '{}'\n{more}", marker.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = script.display();
    let config = write_config(
        dir,
        &format!(
            "{before}[power]\nreboot = [\"{s}\", \"reboot\"]\npoweroff = [\"{s}\", \"poweroff\"]\n"
        ),
    );
    (marker, config)
}

/// Claims the box in the browser, then opens the home page.
async fn claim_and_go_home(b: &mut Browser, addr: SocketAddr) {
    common::cdp::claim(b, addr, PASSPHRASE).await;
    b.goto(&format!("http://{addr}/admin/")).await;
    b.wait_for("document.querySelector('#box-health')", "the home page")
        .await;
}

/// The health JSON as the page's script gets it, with its status and caching header.
async fn health_json(b: &mut Browser) -> Value {
    b.eval(
        "fetch('/admin/health.json', {cache: 'no-store'}).then(r => r.json().then(j => \
         ({status: r.status, cache: r.headers.get('cache-control'), \
           type: r.headers.get('content-type'), j})))",
    )
    .await
}

/// `MemTotal` of this machine, read here independently of the gateway.
fn mem_total_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("read /proc/meminfo");
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("MemTotal");
    kib * 1024
}

#[tokio::test]
async fn the_home_page_shows_the_box_refreshes_it_and_links_a_problem_to_its_fix() {
    let Some(mut b) = Browser::start("the_home_page_shows_the_box").await else {
        return;
    };
    let dir = temp_data_dir();
    let conf = tempfile::tempdir().unwrap();
    let config = write_config(conf.path(), "[limits]\nadmin_health_refresh_secs = 1\n");
    // The agent's address is a closed port: the gateway finds it unreachable.
    let agent = format!("http://127.0.0.1:{}", free_port());
    let gw = Gateway::start(
        dir.path(),
        &[
            "--config",
            &config,
            "--agent",
            "hermes",
            "--agent-url",
            &agent,
        ],
    );
    claim_and_go_home(&mut b, gw.addr).await;
    // The day's first sample comes five minutes after the start: until then the page says so.
    let collecting = b
        .eval("document.querySelector('#day-collecting').textContent")
        .await;
    assert_eq!(
        collecting,
        json!("Collecting: the first sample in 5 minutes."),
        "{collecting}"
    );

    let h = health_json(&mut b).await;
    assert_eq!(h["status"], 200, "{h}");
    assert_eq!(h["cache"], "no-store", "{h}");
    assert_eq!(h["type"], "application/json", "{h}");
    let s = &h["j"]["system"];
    assert_eq!(s["mem_total_bytes"], json!(mem_total_bytes()), "{h}");
    let available = s["mem_available_bytes"].as_u64().expect("MemAvailable");
    assert!(available > 0 && available <= mem_total_bytes(), "{h}");
    assert!(s["system_uptime_secs"].as_u64().unwrap() > 0, "{h}");
    let load = s["load"].as_array().expect("the load averages");
    assert_eq!(load.len(), 3, "{h}");
    assert!(load.iter().all(|l| l.as_f64().unwrap() >= 0.0), "{h}");
    let rss = s["rss_bytes"].as_u64().expect("the gateway's RSS");
    assert!((1 << 20..1 << 30).contains(&rss), "{h}");
    assert!(s["disk_free_bytes"].as_u64().unwrap() > 0, "{h}");
    assert!(
        s["disk_total_bytes"].as_u64().unwrap() >= s["disk_free_bytes"].as_u64().unwrap(),
        "{h}"
    );
    assert!(s["year"].as_i64().unwrap() >= 2024, "{h}");
    assert!(h["j"]["gateway_uptime_secs"].as_u64().is_some(), "{h}");

    // What the page shows: a sane temperature, or the sentence, never a made-up number.
    let shown = |id: &str| format!("document.querySelector('#{id}').textContent");
    let temp = b.eval(&shown("h-temp")).await;
    match s["cpu_celsius"].as_f64() {
        Some(c) => {
            assert!((-40.0..=150.0).contains(&c), "{h}");
            assert!(temp.as_str().unwrap().ends_with("°C"), "{temp}");
        }
        None => assert_eq!(temp, json!(NOT_REPORTED)),
    }
    let memory = b.eval(&shown("h-memory")).await;
    assert!(
        memory.as_str().unwrap().contains(" available of "),
        "{memory}"
    );
    let wear = b.eval(&shown("h-wear")).await;
    if s["wear_life"].is_null() && s["wear_pre_eol"].is_null() {
        assert_eq!(wear, json!(NOT_REPORTED));
    }

    // The script refreshes the figures without a reload: the clock moves on the page.
    let before = b.eval(&shown("h-time")).await;
    b.eval("window.notReloaded = true").await;
    b.wait_for(
        &format!("window.notReloaded && {} !== {before}", shown("h-time")),
        "the time on the page to be refreshed",
    )
    .await;

    // The unreachable agent is a problem, linked to the Agent page.
    let link = "[...document.querySelectorAll('#problems li')]\
                .filter(li => li.textContent.includes('agent is unreachable'))\
                .map(li => li.querySelector('a[href=\"/admin/agent\"]'))[0]";
    b.wait_for(link, "the agent problem and its link").await;
    b.eval(&format!("{link}.click()")).await;
    b.wait_for(
        "location.pathname === '/admin/agent' && document.querySelector('h1').textContent === 'Agent'",
        "the Agent page",
    )
    .await;

    // Signed in only: without the cookie, the JSON's address sends to sign-in.
    let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let raw = common::raw_http(
        tcp,
        &format!(
            "GET /admin/health.json HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            gw.addr
        ),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(raw.status, 303, "{}", raw.body);
    assert!(!raw.body.contains("mem_total_bytes"));
}

#[tokio::test]
async fn restart_from_the_page_comes_back_to_the_page_signed_in() {
    let Some(mut b) = Browser::start("restart_from_the_page_comes_back").await else {
        return;
    };
    let dir = temp_data_dir();
    let conf = tempfile::tempdir().unwrap();
    let config = write_config(conf.path(), "[limits]\nadmin_health_refresh_secs = 1\n");
    // The same port after the restart, as on the box: the page polls its own address.
    let listen = format!("127.0.0.1:{}", free_port());
    let gw = Gateway::start(dir.path(), &["--config", &config, "--listen", &listen]);
    claim_and_go_home(&mut b, gw.addr).await;
    let first = health_json(&mut b).await["j"]["instance"].clone();
    assert!(first.is_string(), "{first}");

    b.click("#power-restart").await;
    b.wait_for(
        "document.querySelector('#confirm-restart')",
        "the confirm page",
    )
    .await;
    b.click("#confirm-restart").await;
    let again = nth_listening(&gw, 2, Duration::from_secs(30)).await;
    assert_eq!(again, gw.addr, "the restart listens where it did");
    // The restarting page finds the new start and goes home, where the owner is still signed
    // in: the home page with its figures and the sign-out button, not the sign-in page.
    b.wait_for(
        "location.pathname === '/admin/' && document.querySelector('#box-health') \
         && document.querySelector('#signout')",
        "the home page, signed in, after the restart",
    )
    .await;
    let now = health_json(&mut b).await;
    assert_eq!(now["status"], 200, "{now}");
    assert_ne!(
        now["j"]["instance"], first,
        "the page is served by the new start"
    );
    assert!(
        !dir.path().join("admin-sessions.json").exists(),
        "the kept sessions are read once and removed"
    );
    let out = gw.output_tail();
    assert!(out.contains("sessions kept over the restart"), "{out}");
}

#[tokio::test]
async fn reboot_and_shut_down_run_the_configured_command_once_and_say_when_it_fails() {
    let Some(mut b) = Browser::start("reboot_and_shut_down_run_the_configured_command").await
    else {
        return;
    };
    let dir = temp_data_dir();
    let conf = tempfile::tempdir().unwrap();
    // "poweroff" fails as logind refusing would.
    let (marker, config) = power_script(
        conf.path(),
        "if [ \"$1\" = poweroff ]; then echo 'Access denied' >&2; exit 1; fi\n",
        "[limits]\nadmin_health_refresh_secs = 1\n\n",
    );
    // As systemd starts the packaged unit: INVOCATION_ID, and a notify socket of ours.
    let notify = conf.path().join("notify");
    let _systemd = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    let gw = Gateway::start_with_env(
        dir.path(),
        &["--config", &config],
        &[
            ("INVOCATION_ID", "0123456789abcdef0123456789abcdef"),
            ("NOTIFY_SOCKET", notify.to_str().unwrap()),
        ],
    );
    claim_and_go_home(&mut b, gw.addr).await;
    let asked = || std::fs::read_to_string(&marker).unwrap_or_default();

    // The confirm page asks; it does nothing itself.
    b.click("#power-reboot").await;
    b.wait_for(
        "document.querySelector('#confirm-reboot')",
        "the confirm page",
    )
    .await;
    assert_eq!(asked(), "");
    // A forged form does nothing either.
    let forged = b
        .eval(
            "fetch('/admin/power/reboot', {method: 'POST', headers: {'Content-Type': \
             'application/x-www-form-urlencoded'}, body: 'csrf=forged'}).then(r => r.status)",
        )
        .await;
    assert_eq!(forged, json!(403));
    assert_eq!(asked(), "");

    b.click("#confirm-reboot").await;
    b.wait_for(
        "location.pathname.startsWith('/admin/restarting/reboot/') \
         && document.querySelector('#coming-back')",
        "the rebooting page",
    )
    .await;
    assert_eq!(asked(), "reboot\n");
    // Reloading the waiting page repeats nothing.
    b.eval("location.reload()").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.wait_for("document.querySelector('#coming-back')", "the page again")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(asked(), "reboot\n");
    // This gateway did not go away, so the page keeps waiting for another start.
    assert!(b
        .eval("location.pathname")
        .await
        .as_str()
        .unwrap()
        .starts_with("/admin/restarting/"));

    // Shut down: the command ran, and its refusal is on the page, not a "Shutting down".
    b.goto(&format!("http://{}/admin/power/poweroff", gw.addr))
        .await;
    b.click("#confirm-poweroff").await;
    b.wait_for(
        "document.querySelector('h1').textContent === 'Not done'",
        "the refusal",
    )
    .await;
    let text = b.text().await;
    assert!(text.contains("Shut down the box did not work"), "{text}");
    assert!(text.contains("Access denied"), "{text}");
    assert_eq!(asked(), "reboot\npoweroff\n");
}

#[tokio::test]
async fn a_restore_restarts_into_the_backup_with_the_owner_still_signed_in() {
    let Some(mut b) = Browser::start("a_restore_restarts_with_the_owner_signed_in").await else {
        return;
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    claim_and_go_home(&mut b, gw.addr).await;
    b.goto(&format!("http://{}/admin/backup", gw.addr)).await;
    b.wait_for("document.querySelector('#restore-form')", "the backup page")
        .await;
    // Download a backup and give it back, as the page's link and form do (same session).
    let status = b
        .eval(
            "fetch(document.querySelector('#backup-download').href).then(r => r.arrayBuffer())\
             .then(buf => fetch('/admin/backup/restore', {method: 'POST', body: buf, headers: \
             {'X-CSRF-Token': document.querySelector('#restore-form').dataset.csrf}}))\
             .then(r => r.status)",
        )
        .await;
    assert_eq!(status, json!(200));
    let addr = nth_listening(&gw, 2, Duration::from_secs(30)).await;
    // The browser's cookie, from before the restore, still opens the home page.
    b.goto(&format!("http://{addr}/admin/")).await;
    b.wait_for(
        "document.querySelector('#box-health') && document.querySelector('#signout')",
        "the home page, signed in, after the restore",
    )
    .await;
}

#[tokio::test]
async fn a_gateway_run_by_hand_offers_no_reboot_or_shut_down() {
    let Some(mut b) = Browser::start("a_gateway_run_by_hand_offers_no_reboot").await else {
        return;
    };
    let dir = temp_data_dir();
    let conf = tempfile::tempdir().unwrap();
    let (marker, config) = power_script(conf.path(), "", "");
    // Typed in a terminal: no INVOCATION_ID, no NOTIFY_SOCKET (the test's own are removed).
    let gw = Gateway::start_with_env(
        dir.path(),
        &["--config", &config],
        &[("INVOCATION_ID", ""), ("NOTIFY_SOCKET", "")],
    );
    claim_and_go_home(&mut b, gw.addr).await;
    let shown = b
        .eval(
            "[!!document.querySelector('#power-restart'), \
             !!document.querySelector('#power-reboot'), \
             !!document.querySelector('#power-poweroff'), \
             document.querySelector('#power').innerText]",
        )
        .await;
    assert_eq!(shown[0], json!(true), "{shown}");
    assert_eq!(shown[1], json!(false), "{shown}");
    assert_eq!(shown[2], json!(false), "{shown}");
    assert!(
        shown[3]
            .as_str()
            .unwrap()
            .contains("runs as the box's own service"),
        "{shown}"
    );
    // Not by a typed address or a form either, with the session's own CSRF token.
    for what in ["reboot", "poweroff"] {
        let statuses = b
            .eval(&format!(
                "(async () => {{ const csrf = document.querySelector('input[name=csrf]').value; \
                 const get = await fetch('/admin/power/{what}'); \
                 const post = await fetch('/admin/power/{what}', {{method: 'POST', \
                 headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, \
                 body: 'csrf=' + encodeURIComponent(csrf)}}); \
                 return [get.status, post.status]; }})()"
            ))
            .await;
        assert_eq!(statuses, json!([404, 404]), "{what}");
    }
    assert_eq!(std::fs::read_to_string(&marker).unwrap_or_default(), "");
}

/// Every file under `dir` with its length and modification time.
fn files_and_mtimes(dir: &Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read the data dir") {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            } else {
                out.push((entry.path(), meta.len(), meta.modified().unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn the_status_page_charts_the_day_from_memory_and_fits_a_phone() {
    let Some(mut b) = Browser::start("the_status_page_charts_the_day").await else {
        return;
    };
    let dir = temp_data_dir();
    // The debug build's hook: a sample every 150 ms instead of every five minutes.
    let gw = Gateway::start_with_env(dir.path(), &[], &[("IRIS_GATEWAY_HEALTH_SAMPLE_MS", "150")]);
    claim_and_go_home(&mut b, gw.addr).await;
    let on_disk = files_and_mtimes(dir.path());

    const ENOUGH: u64 = 6;
    let samples_now = "fetch('/admin/', {cache: 'no-store'}).then(r => r.text()).then(t => \
                       +(/data-samples=\"(\\d+)\"/.exec(t) || [0, 0])[1])";
    b.wait_for(
        &format!("{samples_now}.then(n => n >= {ENOUGH})"),
        "several samples of the day",
    )
    .await;
    // Sampling kept nothing on the card: the data dir is as it was, file by file.
    assert_eq!(files_and_mtimes(dir.path()), on_disk);

    b.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 360, "height": 800, "deviceScaleFactor": 1, "mobile": false }),
    )
    .await;
    b.goto(&format!("http://{}/admin/", gw.addr)).await;
    b.wait_for("document.querySelector('#day')", "the day's section")
        .await;
    let day = b
        .eval(
            "({samples: +document.querySelector('#day').dataset.samples, \
              wide: document.documentElement.scrollWidth, \
              figures: [...document.querySelectorAll('#day figure')].map(f => { \
                const svg = f.querySelector('svg'); \
                const line = f.querySelector('svg polyline'); \
                return {id: f.id, caption: f.querySelector('figcaption').textContent, \
                        points: line ? line.getAttribute('points').trim().split(/\\s+/).length : null, \
                        right: svg ? svg.getBoundingClientRect().right : null, \
                        height: svg ? svg.getBoundingClientRect().height : null}; })})",
        )
        .await;
    let samples = day["samples"].as_u64().unwrap();
    assert!(samples >= ENOUGH, "{day}");
    assert!(day["wide"].as_u64().unwrap() <= 360, "{day}");
    let figures = day["figures"].as_array().unwrap();
    let ids: Vec<_> = figures.iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["day-temp", "day-memory", "day-load", "day-written"],
        "{day}"
    );
    for f in figures {
        let caption = f["caption"].as_str().unwrap();
        let reported = !caption.ends_with(NOT_REPORTED);
        // Memory and load are in every Linux's /proc; the sensor and the card's counter may
        // be missing in a VM or a container, and then the figure says so.
        if matches!(f["id"].as_str(), Some("day-memory" | "day-load")) {
            assert!(reported, "{day}");
        }
        if reported {
            assert_eq!(f["points"].as_u64(), Some(samples), "{day}");
            assert!(
                caption.contains("now ") && caption.contains("lowest "),
                "{day}"
            );
            assert!(f["right"].as_f64().unwrap() <= 360.0, "{day}");
            assert!(f["height"].as_f64().unwrap() > 10.0, "{day}");
        } else {
            assert!(f["points"].is_null(), "{day}");
        }
    }
}
