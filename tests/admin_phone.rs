//! The admin page on a phone and on a desktop, in a real headless Chromium (tests/common/cdp.rs):
//! at 360 px and at 1280 px, no page is wider than the screen
//! (`document.documentElement.scrollWidth <= innerWidth`): set-up, sign-in, every page the
//! navigation links to (found by following its links, so a new page is checked too), and the
//! page every form leads to. No page says a sentence twice.
//!
//! With `IRIS_SCREENSHOTS=DIR` set, each of these pages is also saved as `DIR/NAME-WIDTH.png`
//! (`docs/screenshots/regenerate` does that for the README's pictures).

mod common;

use std::path::PathBuf;

use base64::Engine;
use common::cdp::Browser;
use common::{fake_http, temp_data_dir, Gateway};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";
/// Two phones (a small Android, an iPhone) and a desktop.
const WIDTHS: [u32; 3] = [360, 390, 1280];
/// The widths the screenshots are taken at.
const SHOT_WIDTHS: [u32; 2] = [360, 1280];
/// The tallest screenshot kept: the pages are short, and a PNG stays small.
const MAX_SHOT_PX: u32 = 1600;

/// The words (runs between spaces, cut after `:`, `/` and `-`) of every text shown outside a log
/// excerpt that the browser has broken across two lines, and every `.token` (a group of a
/// fingerprint, URL or id) drawn in more than one box; empty when none is.
const SPLIT_WORDS: &str = "(() => { const bad = []; \
    const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT); \
    for (let n = walk.nextNode(); n; n = walk.nextNode()) { \
      const el = n.parentElement; \
      if (!el || el.closest('pre, script, style, svg, select, textarea') \
          || el.getClientRects().length === 0) continue; \
      const words = /[^\\s:\\/-]+[:\\/-]*/g; let m; \
      while ((m = words.exec(n.data))) { \
        const r = document.createRange(); \
        r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length); \
        const lines = new Set([...r.getClientRects()].filter(x => x.width > 0) \
          .map(x => Math.round(x.top))); \
        if (lines.size > 1) bad.push(m[0]); } } \
    for (const t of document.querySelectorAll('.token')) \
      if (t.getClientRects().length !== 1) bad.push('token ' + t.textContent); \
    return bad.slice(0, 8).join(' | '); })()";

struct Check<'a> {
    b: &'a mut Browser,
    width: u32,
    shots: Option<PathBuf>,
    /// What was checked, for the summary at the end (and to prove pages were found).
    seen: Vec<String>,
}

impl Check<'_> {
    async fn size(&mut self, width: u32) {
        self.width = width;
        self.b
            .call(
                "Emulation.setDeviceMetricsOverride",
                // Not `mobile`: a mobile viewport zooms out to fit a page that is too wide,
                // and then innerWidth grows with it and hides the fault.
                json!({ "width": width, "height": 800, "deviceScaleFactor": 1, "mobile": false }),
            )
            .await;
    }

    async fn settle(&mut self) {
        self.b
            .wait_for(
                "document.readyState === 'complete' && !!document.querySelector('main')",
                "a page",
            )
            .await;
    }

    /// The page now shown fits the screen and says no sentence twice; with `shoot`, it is
    /// saved as a screenshot when they are asked for.
    async fn fits(&mut self, name: &str, shoot: bool) {
        self.settle().await;
        let dims = self
            .b
            .eval("[document.documentElement.scrollWidth, innerWidth, location.pathname]")
            .await;
        let (scroll, inner) = (dims[0].as_u64().unwrap(), dims[1].as_u64().unwrap());
        let wide = self
            .b
            .eval(
                "[...document.querySelectorAll('main *, header *')].filter(e => \
                 e.getBoundingClientRect().right > innerWidth + 0.5).slice(0, 5)\
                 .map(e => e.tagName + '#' + e.id + '.' + e.className).join(', ')",
            )
            .await;
        assert_eq!(
            inner,
            u64::from(self.width),
            "{name}: the screen is not as set"
        );
        assert!(
            scroll <= inner,
            "{name} at {} px is {scroll} px wide ({}); too wide: {wide}",
            self.width,
            dims[2]
        );
        assert_eq!(
            wide,
            json!(""),
            "{name} at {} px: elements reach past the screen",
            self.width
        );
        let split = self.b.eval(SPLIT_WORDS).await;
        assert_eq!(
            split,
            json!(""),
            "{name} at {} px breaks these inside a word",
            self.width
        );
        let twice = self
            .b
            .eval(
                "(() => { const seen = new Set(); for (const s of document.querySelector('main')\
                 .innerText.split(/(?<=[.!?])\\s+/)) { const t = s.trim(); \
                 if (t.length > 12 && seen.has(t)) return t; seen.add(t); } return ''; })()",
            )
            .await;
        assert_eq!(twice, json!(""), "{name} says a sentence twice");
        self.seen.push(format!("{name}@{}", self.width));
        let shots = self
            .shots
            .as_ref()
            .filter(|_| shoot && SHOT_WIDTHS.contains(&self.width));
        if let Some(dir) = shots {
            let height = self
                .b
                .eval("document.documentElement.scrollHeight")
                .await
                .as_u64()
                .unwrap_or(800)
                .min(u64::from(MAX_SHOT_PX));
            let shot = self
                .b
                .call(
                    "Page.captureScreenshot",
                    json!({ "format": "png", "captureBeyondViewport": true,
                            "clip": { "x": 0, "y": 0, "width": self.width,
                                      "height": height, "scale": 1 } }),
                )
                .await;
            let png = base64::engine::general_purpose::STANDARD
                .decode(shot["data"].as_str().unwrap())
                .unwrap();
            let path = dir.join(format!("{name}-{}.png", self.width));
            std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }

    async fn goto(&mut self, url: &str) {
        self.b.goto(url).await;
        self.settle().await;
    }

    /// Clicks a form's button and waits for the new page it leads to (the old one is marked,
    /// so a condition it already met does not count).
    async fn submit(&mut self, button: &str, until: &str) {
        self.b.eval("window.oldPage = true").await;
        self.b.click(button).await;
        self.b
            .wait_for(
                &format!("!window.oldPage && document.readyState === 'complete' && ({until})"),
                button,
            )
            .await;
    }
}

/// The nav's links of the page shown now: the pages a signed-in owner moves between.
async fn nav_links(b: &mut Browser) -> Vec<String> {
    let links = b
        .eval("[...document.querySelectorAll('header nav a')].map(a => a.getAttribute('href'))")
        .await;
    links
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// `/admin/devices` → `devices`; `/admin/` → `status`.
fn page_name(href: &str) -> String {
    let name = href.trim_start_matches("/admin/").replace('/', "-");
    if name.is_empty() {
        "status".to_owned()
    } else {
        name
    }
}

#[tokio::test]
async fn every_page_and_every_result_fits_a_phone_and_a_desktop() {
    let Some(mut b) =
        Browser::start("every_page_and_every_result_fits_a_phone_and_a_desktop").await
    else {
        return;
    };
    let shots = std::env::var_os("IRIS_SCREENSHOTS").map(PathBuf::from);
    if let Some(dir) = &shots {
        std::fs::create_dir_all(dir).expect("the screenshot folder");
    }
    let ntfy = fake_http::start(|_| fake_http::json_200(b"{}"));
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", l.local_addr().unwrap())
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--push", "ntfy", "--ntfy-server", &ntfy]);
    let base = format!("http://{}", gw.addr);
    let mut c = Check {
        b: &mut b,
        width: 0,
        shots,
        seen: Vec::new(),
    };

    // Set-up, at both widths, then claimed on the phone: its result is the pairing page.
    for width in WIDTHS {
        c.size(width).await;
        c.goto(&format!("{base}/")).await;
        c.fits("setup", true).await;
    }
    c.size(360).await;
    c.goto(&format!("{base}/")).await;
    c.b.fill("#passphrase", PASSPHRASE).await;
    c.b.fill("#confirm", PASSPHRASE).await;
    c.submit("#claim", "!!document.querySelector('#qr svg')")
        .await;
    c.fits("paired", true).await;

    for width in WIDTHS {
        c.size(width).await;
        c.goto(&format!("{base}/admin/")).await;
        let links = nav_links(c.b).await;
        assert!(links.len() >= 6, "{links:?}");
        for href in &links {
            c.goto(&format!("{base}{href}")).await;
            c.fits(&page_name(href), true).await;
        }

        // Devices: a new phone with a long name; its one-time page, then that page reloaded.
        c.goto(&format!("{base}/admin/devices")).await;
        c.b.fill("#name", &"living-room-tablet-".repeat(5)).await;
        c.submit("#pair", "!!document.querySelector('#qr svg')")
            .await;
        c.fits("pair-result", false).await;
        let groups =
            c.b.eval("document.querySelectorAll('#pair-url .token, #pair-token .token').length")
                .await;
        assert!(
            groups.as_u64().unwrap() >= 2,
            "the URL and token are set as groups that wrap whole: {groups}"
        );
        c.b.eval("window.oldPage = true").await;
        c.b.call("Page.reload", json!({})).await;
        c.b.wait_for(
            "!window.oldPage && document.readyState === 'complete' \
             && document.body.innerText.includes('shown once')",
            "the page shown once, reloaded",
        )
        .await;
        c.fits("pair-reloaded", true).await;
        c.goto(&format!("{base}/admin/devices")).await;
        c.fits("devices-long-names", true).await;
        let row = "#device-table tr[data-device]:last-child";
        c.b.fill(&format!("{row} input[name=name]"), &"hall-".repeat(18))
            .await;
        c.submit(
            &format!("{row} .rename"),
            "document.body.innerText.includes('Renamed.')",
        )
        .await;
        c.fits("renamed", false).await;
        c.b.eval("window.confirm = () => true").await;
        c.submit(
            &format!("{row} .revoke"),
            "document.body.innerText.includes('Revoked')",
        )
        .await;
        c.fits("revoked", false).await;

        // Agent: a test that fails keeps the form; a save of the demo agent.
        c.goto(&format!("{base}/admin/agent")).await;
        c.b.eval("document.querySelector('#backend').value = 'openai'")
            .await;
        c.b.fill("#url", &dead).await;
        c.submit("#agent-test", "!!document.querySelector('#notice')")
            .await;
        c.fits("agent-tested", true).await;
        assert_eq!(
            c.b.eval("document.querySelector('#url').value").await,
            json!(dead)
        );
        c.b.eval("document.querySelector('#backend').value = 'demo'")
            .await;
        c.submit("#agent-save", "!!document.querySelector('#notice')")
            .await;
        c.fits("agent-saved", false).await;

        // Push: a test push to a topic (no phone registered), and a save.
        c.goto(&format!("{base}/admin/push")).await;
        c.submit("#push-test", "!!document.querySelector('#notice')")
            .await;
        c.fits("push-tested", true).await;
        c.submit("#push-save", "!!document.querySelector('#notice')")
            .await;
        c.fits("push-saved", false).await;

        // Owner: a refused change; a wrong address.
        c.goto(&format!("{base}/admin/owner")).await;
        c.b.fill("#current", "not the passphrase").await;
        c.b.fill("#passphrase", "aaaaaaaaaaaa").await;
        c.b.fill("#confirm", "aaaaaaaaaaaa").await;
        c.submit("#change", "!!document.querySelector('#notice')")
            .await;
        c.fits("owner-refused", true).await;
        // A job's page: "Check now" against a release index that is not there runs as a job
        // and fails saying why; reloaded, the page shows the same outcome and starts nothing.
        c.goto(&format!("{base}/admin/update")).await;
        c.b.fill("#update-url", &format!("{dead}/index.json")).await;
        c.submit(
            "#update-url ~ p button",
            "!!document.querySelector('#check')",
        )
        .await;
        c.submit("#check", "location.pathname.startsWith('/admin/job/')")
            .await;
        c.b.wait_for(
            "document.querySelector('#job-state').dataset.phase !== 'running'",
            "the check's outcome",
        )
        .await;
        c.fits("update-check-job", true).await;
        let outcome =
            c.b.eval("document.querySelector('#job-state').textContent")
                .await;
        c.goto(&format!("{base}/admin/job/update-check")).await;
        c.fits("update-check-job-reloaded", false).await;
        assert_eq!(
            c.b.eval("document.querySelector('#job-state').textContent")
                .await,
            outcome,
            "a reload shows the same outcome and starts nothing"
        );
        c.goto(&format!("{base}/admin/no-such-page")).await;
        c.fits("not-found", true).await;
        // The home page's confirm pages (a GET does nothing; only their form would).
        c.goto(&format!("{base}/admin/power/restart")).await;
        c.fits("restart-confirm", true).await;

        // Signed out: the sign-in page, and its refusal.
        c.submit("#signout", "!!document.querySelector('#signin')")
            .await;
        c.fits("signin", true).await;
        c.b.fill("#passphrase", "not the passphrase").await;
        c.submit("#signin", "!!document.querySelector('#notice')")
            .await;
        c.fits("signin-refused", false).await;
        c.b.fill("#passphrase", PASSPHRASE).await;
        c.submit("#signin", "!!document.querySelector('header nav')")
            .await;
    }
    let seen = c.seen.len();
    assert!(
        seen > WIDTHS.len() * 20,
        "too few pages checked: {:?}",
        c.seen
    );
    eprintln!("checked {seen} pages: {:?}", c.seen);
}

/// The colours of the page's body and its first filled button, and that button's corner radius.
const LOOK: &str = "(() => { const b = document.querySelector('main button'); \
    const c = s => s.match(/[\\d.]+/g).slice(0, 3).map(Number); \
    const lum = ([r, g, b]) => (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255; \
    return { page: lum(c(getComputedStyle(document.body).backgroundColor)), \
             ink: lum(c(getComputedStyle(document.body).color)), \
             button: getComputedStyle(b).backgroundColor, \
             radius: parseFloat(getComputedStyle(b).borderTopLeftRadius) }; })()";

#[tokio::test]
async fn the_page_follows_the_systems_dark_mode_and_has_real_buttons() {
    let Some(mut b) = Browser::start("the_page_follows_the_systems_dark_mode").await else {
        return;
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    common::cdp::claim(&mut b, gw.addr, PASSPHRASE).await;
    let mut looks = Vec::new();
    for scheme in ["light", "dark"] {
        b.call(
            "Emulation.setEmulatedMedia",
            json!({ "features": [{ "name": "prefers-color-scheme", "value": scheme }] }),
        )
        .await;
        b.goto(&format!("http://{}/admin/devices", gw.addr)).await;
        let look = b.eval(LOOK).await;
        let radius = look["radius"].as_f64().unwrap();
        assert!(
            radius >= 4.0,
            "{scheme}: a button with square corners: {look}"
        );
        assert_ne!(
            look["button"],
            json!("rgb(239, 239, 239)"),
            "{scheme}: the browser's own grey button: {look}"
        );
        looks.push(look);
    }
    let (light, dark) = (&looks[0], &looks[1]);
    assert!(
        light["page"].as_f64().unwrap() > 0.8 && light["ink"].as_f64().unwrap() < 0.3,
        "light: dark ink on a light page: {light}"
    );
    assert!(
        dark["page"].as_f64().unwrap() < 0.2 && dark["ink"].as_f64().unwrap() > 0.7,
        "dark: light ink on a dark page: {dark}"
    );
}
