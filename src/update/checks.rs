//! The check for a newer version: asking the release index (`source::check`, on a blocking
//! thread), keeping what it found for the admin page, and the daily check that runs by itself
//! and may install a fix. The admin page only shows [`Checks::last`] and asks for a check; what
//! the daily check needs of the gateway above this wing (the address and consent the owner
//! saved, a slot among the page's jobs, the install) it asks through [`Host`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::source::{self, Available};
use super::version::Step;

/// The daily check: once a day, the first a few minutes after start (not at once: a box that
/// restarts in a loop must not hammer the release server).
const CHECK_EVERY: Duration = Duration::from_secs(24 * 3600);
const FIRST_CHECK_AFTER: Duration = Duration::from_secs(10 * 60);

/// One check's answer: what the index offers, or why it could not be asked.
#[derive(Clone, Debug)]
pub struct Checked {
    pub at: SystemTime,
    pub found: Result<Available, String>,
}

impl Checked {
    /// A newer version with the same major part, with a bundle for this box: what the daily
    /// check may install by itself.
    pub fn offers_fix(&self) -> bool {
        matches!(&self.found, Ok(a) if a.step == Step::Minor && a.bundle_url.is_some())
    }
}

/// The last check's answer, shared by the daily check and the admin page (one event loop).
#[derive(Clone, Default)]
pub struct Checks {
    last: Rc<RefCell<Option<Checked>>>,
}

impl Checks {
    /// What the last check found, if one ran since the start or the last [`Checks::forget`].
    pub fn last(&self) -> Option<Checked> {
        self.last.borrow().clone()
    }

    /// Drops the last answer: the owner saved another index, so it no longer says anything.
    pub fn forget(&self) {
        *self.last.borrow_mut() = None;
    }

    /// Asks the index at `url` (on a blocking thread, within the index's own time limit) and
    /// keeps its answer; returns it in words, for the job's page.
    pub async fn check(&self, url: String) -> Result<String, String> {
        let answer = tokio::task::spawn_blocking(move || source::check(&url))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let said = match &answer {
            Err(e) => Err(e.clone()),
            Ok(a) if matches!(a.step, Step::Same | Step::Older) => {
                Ok(format!("Up to date: the newest release is {}.", a.version))
            }
            Ok(a) if a.bundle_url.is_none() => Ok(format!(
                "{} is out, but not for this box ({}).",
                a.version,
                super::policy::this_arch()
            )),
            Ok(a) => Ok(format!(
                "{} is available: install it from the Update page.",
                a.version
            )),
        };
        *self.last.borrow_mut() = Some(Checked {
            at: SystemTime::now(),
            found: answer,
        });
        said
    }
}

/// A check's slot among the page's jobs, finished with what the check found.
pub type Finish = Box<dyn FnOnce(Result<String, String>)>;

/// What the daily check asks of the gateway above the update wing.
pub trait Host {
    /// The release index address the owner saved (empty: none) and whether a fix may install
    /// by itself.
    fn source(&self) -> (String, bool);
    /// A slot for one check among the page's jobs, to be finished with what it found; `None`
    /// while a check or an install is under way.
    fn begin_check(&self) -> Option<Finish>;
    /// This version is on trial after an update: nothing else installs until it ends.
    fn on_trial(&self) -> bool;
    /// Starts downloading and installing what the last check found.
    fn install_found(&self) -> Result<(), String>;
}

/// Once a day, when an address is set: asks the index, and when the owner allowed it, a newer
/// version with the same major part is downloaded, checked and staged by itself. A major one
/// waits for the owner.
pub fn start(checks: Checks, host: impl Host + 'static, mut stop: crate::shutdown::Listener) {
    tokio::task::spawn_local(async move {
        let mut wait = FIRST_CHECK_AFTER;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.recv() => return,
            }
            wait = CHECK_EVERY;
            let (url, automatic) = host.source();
            if url.is_empty() {
                continue;
            }
            let Some(finish) = host.begin_check() else {
                continue;
            };
            let said = checks.check(url).await;
            if let Err(e) = &said {
                warn!("automatic update check: {e}");
            }
            finish(said);
            let fix = checks.last().is_some_and(|c| c.offers_fix());
            if automatic && fix && !host.on_trial() {
                match host.install_found() {
                    Ok(()) => info!("automatic update: downloading the newer version"),
                    Err(e) => warn!("automatic update: {e}"),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::io::{Read, Write};

    /// A release index on loopback offering a fix (the next patch: for a `0.y` version the next
    /// minor one is a major step), with a bundle for this box.
    fn index_offering_a_fix() -> String {
        let running = semver::Version::parse(env!("CARGO_PKG_VERSION")).unwrap();
        let body = serde_json::json!({
            "version": format!("{}.{}.{}", running.major, running.minor, running.patch + 1),
            "notes": "A fix.",
            "bundles": { std::env::consts::ARCH: "b.iub" },
        })
        .to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        format!("http://{addr}/index.json")
    }

    /// The admin's side as the daily check sees it: counts what it is asked.
    struct FakeHost {
        url: String,
        asked: Rc<Cell<u32>>,
        installs: Rc<Cell<u32>>,
        finished: tokio::sync::mpsc::UnboundedSender<Result<String, String>>,
    }

    impl Host for FakeHost {
        fn source(&self) -> (String, bool) {
            self.asked.set(self.asked.get() + 1);
            (self.url.clone(), true)
        }

        fn begin_check(&self) -> Option<Finish> {
            let finished = self.finished.clone();
            Some(Box::new(move |said| {
                let _ = finished.send(said);
            }))
        }

        fn on_trial(&self) -> bool {
            false
        }

        fn install_found(&self) -> Result<(), String> {
            self.installs.set(self.installs.get() + 1);
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_daily_check_asks_after_ten_minutes_then_daily_keeps_the_answer_and_installs_a_fix()
    {
        let shutdown = crate::shutdown::Shutdown::new();
        let checks = Checks::default();
        let (asked, installs) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        let (finished, mut said) = tokio::sync::mpsc::unbounded_channel();
        let host = FakeHost {
            url: index_offering_a_fix(),
            asked: asked.clone(),
            installs: installs.clone(),
            finished,
        };
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                start(checks.clone(), host, shutdown.listener());
                tokio::time::sleep(FIRST_CHECK_AFTER - Duration::from_secs(1)).await;
                assert_eq!(asked.get(), 0, "asked before the first wait was over");

                let first = said.recv().await.unwrap().unwrap();
                assert!(first.contains("is available"), "{first}");
                assert!(checks.last().is_some_and(|c| c.offers_fix()));
                assert_eq!((asked.get(), installs.get()), (1, 1));

                tokio::time::sleep(CHECK_EVERY - Duration::from_secs(60)).await;
                assert_eq!(asked.get(), 1, "asked again within the day");
                said.recv().await.unwrap().unwrap();
                assert_eq!((asked.get(), installs.get()), (2, 2));

                checks.forget();
                assert!(checks.last().is_none());
                shutdown.begin();
                shutdown.complete(Duration::from_secs(1)).await.unwrap();
            })
            .await;
    }
}
