//! A small Chrome DevTools Protocol client for tests that drive a real headless Chromium:
//! navigate, evaluate JavaScript (fill forms, click), wait for a page, take a screenshot.
//!
//! Chromium is started with `--remote-debugging-port=0` and its own throw-away profile; the
//! `DevTools listening on ws://…` line on its stderr gives the browser's socket, and one page
//! target is attached in flat mode (every command carries its `sessionId`). Everything is
//! bounded: start-up, each command and each wait have a deadline, and dropping the [`Browser`]
//! kills Chromium. Under CI (`CI` set) a missing Chromium is a failure, not a skip.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long Chromium may take to start, and each DevTools command to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Browser::wait_for`] waits for a page to reach a state.
pub const WAIT: Duration = Duration::from_secs(30);

/// Where Chromium is, if installed (Debian's package `chromium`).
pub fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// A headless Chromium with one page attached.
pub struct Browser {
    child: Child,
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: i64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium, or `None` when it is not installed and this is not CI (`test` names the
    /// test in the notice printed then).
    pub async fn start(test: &str) -> Option<Browser> {
        let Some(path) = chromium() else {
            let why = "no Chromium at /usr/bin/chromium (Debian package `chromium`)";
            if std::env::var_os("CI").is_some() {
                panic!("{test}: cannot run under CI: {why}");
            }
            eprintln!("\n*** {test}: NOT RUN: {why}.\n");
            return None;
        };
        let profile = tempfile::Builder::new()
            .prefix("iris-chromium-")
            .tempdir()
            .expect("chromium profile dir");
        let mut child = Command::new(path)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--hide-scrollbars",
                "--window-size=900,1400",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().expect("chromium stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let url = match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not open its DevTools socket within {START_TIMEOUT:?}");
            }
        };
        let (ws, _) = tokio::time::timeout(
            COMMAND_TIMEOUT,
            tokio_tungstenite::connect_async(url.as_str()),
        )
        .await
        .expect("DevTools connect in time")
        .expect("DevTools connect");
        let mut browser = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser
            .raw_call(
                "Target.createTarget",
                json!({ "url": "about:blank" }),
                false,
            )
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = browser
            .raw_call(
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
                false,
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        browser.call("Page.enable", json!({})).await;
        browser.call("Runtime.enable", json!({})).await;
        Some(browser)
    }

    /// Sends one command (on the page when `on_page`) and waits for its answer; a protocol error is returned as `{"__error": …}`.
    async fn raw_call(&mut self, method: &str, params: Value, on_page: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if on_page {
            msg["sessionId"] = Value::String(self.session.clone());
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .expect("send to DevTools");
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        loop {
            let next = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {method} in time"));
            let Some(Ok(Message::Text(text))) = next else {
                match next {
                    Some(Ok(_)) => continue,
                    other => panic!("DevTools socket ended during {method}: {other:?}"),
                }
            };
            let v: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    return json!({ "__error": e });
                }
                return v["result"].clone();
            }
        }
    }

    /// A command on the page; panics on a protocol error.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let r = self.raw_call(method, params, true).await;
        if let Some(e) = r.get("__error") {
            panic!("{method} failed: {e}");
        }
        r
    }

    /// Opens `url` and waits for the document to load.
    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_for(
            &format!(
                "document.readyState === 'complete' && location.href !== 'about:blank' \
                 && {:?}.length > 0",
                url
            ),
            &format!("{url} to load"),
        )
        .await;
    }

    /// Evaluates `expr` in the page; its value (JSON), or `Err` with the exception text.
    pub async fn try_eval(&mut self, expr: &str) -> Result<Value, String> {
        let r = self
            .raw_call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
                true,
            )
            .await;
        if let Some(e) = r.get("__error") {
            return Err(e.to_string());
        }
        if let Some(ex) = r.get("exceptionDetails") {
            return Err(ex.to_string());
        }
        Ok(r["result"]["value"].clone())
    }

    /// As [`Browser::try_eval`], panicking on an exception.
    pub async fn eval(&mut self, expr: &str) -> Value {
        self.try_eval(expr)
            .await
            .unwrap_or_else(|e| panic!("`{expr}` threw: {e}"))
    }

    /// Polls `expr` until it is truthy (a page being replaced counts as not yet); panics with
    /// the page's text after [`WAIT`].
    pub async fn wait_for(&mut self, expr: &str, what: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(v) = self.try_eval(expr).await {
                let truthy = !matches!(&v, Value::Null | Value::Bool(false))
                    && v != Value::String(String::new())
                    && v != json!(0);
                if truthy {
                    return v;
                }
            }
            if Instant::now() >= deadline {
                let text = self
                    .try_eval("location.href + '\\n' + document.body.innerText")
                    .await;
                panic!("waited {WAIT:?} for {what} (`{expr}`); the page:\n{text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets an input's value as typing would (fires `input`, so the page's script sees it).
    pub async fn fill(&mut self, selector: &str, value: &str) {
        let expr = format!(
            "(() => {{ const e = document.querySelector({selector:?}); if (!e) return false; \
             e.value = {value:?}; e.dispatchEvent(new Event('input', {{bubbles: true}})); \
             return true; }})()"
        );
        assert_eq!(self.eval(&expr).await, json!(true), "no {selector} to fill");
    }

    /// Clicks an element (a button submits its form, a link navigates).
    pub async fn click(&mut self, selector: &str) {
        let expr = format!(
            "(() => {{ const e = document.querySelector({selector:?}); if (!e) return false; \
             e.click(); return true; }})()"
        );
        assert_eq!(
            self.eval(&expr).await,
            json!(true),
            "no {selector} to click"
        );
    }

    /// The page's visible text.
    pub async fn text(&mut self) -> String {
        self.eval("document.body.innerText")
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Whether each selector names an element that is rendered inside the viewport.
    pub async fn visible(&mut self, selectors: &[&str]) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for s in selectors {
            let expr = format!(
                "(() => {{ const e = document.querySelector({s:?}); if (!e) return false; \
                 const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 \
                 && r.top < innerHeight && r.left < innerWidth; }})()"
            );
            out.push((s.to_string(), self.eval(&expr).await == json!(true)));
        }
        out
    }

    /// A screenshot of the viewport, in grey.
    pub async fn screenshot(&mut self) -> image::GrayImage {
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64");
        image::load_from_memory(&png)
            .expect("screenshot is a PNG")
            .to_luma8()
    }
}

/// Decodes the one QR code in a screenshot.
/// Claims an unclaimed box at `addr` from its set-up page with `passphrase`, as the owner does,
/// and waits for the page that pairs this phone.
pub async fn claim(b: &mut Browser, addr: std::net::SocketAddr, passphrase: &str) {
    b.goto(&format!("http://{addr}/")).await;
    b.wait_for("document.querySelector('#claim')", "the set-up page")
        .await;
    b.fill("#passphrase", passphrase).await;
    b.fill("#confirm", passphrase).await;
    b.click("#claim").await;
    b.wait_for(
        "document.querySelector('#qr svg')",
        "the pair-this-phone page",
    )
    .await;
}

pub fn decode_qr(img: &image::GrayImage) -> String {
    let (w, h) = img.dimensions();
    let mut prepared =
        rqrr::PreparedImage::prepare_from_greyscale(w as usize, h as usize, |x, y| {
            img.get_pixel(x as u32, y as u32)[0]
        });
    let grids = prepared.detect_grids();
    assert_eq!(grids.len(), 1, "expected one QR code in the screenshot");
    grids[0]
        .decode()
        .unwrap_or_else(|e| panic!("the QR code does not decode: {e:?}"))
        .1
}

/// Asserts a screenshot shows a page (not blank: both ink and background) and that each
/// selector is rendered in view.
pub async fn assert_page_shows(b: &mut Browser, page: &str, selectors: &[&str]) {
    let img = b.screenshot().await;
    let dark = img.pixels().filter(|p| p[0] < 100).count();
    let light = img.pixels().filter(|p| p[0] > 200).count();
    assert!(
        dark > 500 && light > img.pixels().len() / 4,
        "{page}: the screenshot looks blank ({dark} dark, {light} light pixels)"
    );
    let missing: Vec<_> = b
        .visible(selectors)
        .await
        .into_iter()
        .filter(|(_, seen)| !seen)
        .map(|(s, _)| s)
        .collect();
    assert!(
        missing.is_empty(),
        "{page}: not rendered in view: {missing:?}\n{}",
        b.text().await
    );
}
