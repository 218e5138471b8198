//! Running as a systemd service: readiness, watchdog and stopping notifications, and the
//! commented default config file the package installs as /etc/iris-gateway/config.toml.
//!
//! The unit (systemd/iris-gateway.service) is `Type=notify`. systemd then counts the gateway as
//! started only when it sends `READY=1`, so `systemctl start` returns, and units ordered after
//! it start, once phones can really connect rather than while the store is still opening. With
//! `WatchdogSec=` systemd also expects `WATCHDOG=1` at least that often and restarts a gateway
//! whose pings stop. `STOPPING=1` tells it that a shutdown in progress is deliberate.
//!
//! Messages go over the datagram socket named by `NOTIFY_SOCKET` (the `sd-notify` crate; see
//! sd_notify(3)). Outside systemd (`cargo run`, most tests) the variable is unset and
//! [`Notifier::from_env`] returns `None`: the gateway behaves exactly as before.

use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::{debug, info, warn};

/// The commented default configuration printed by `iris-gateway config`. One file serves both
/// the command and the package (it ships as /etc/iris-gateway/config.toml), so they cannot
/// drift apart; tests/service.rs checks that loading it yields `Config::default()` and that it
/// names every key.
pub const CONFIG_TEMPLATE: &str = include_str!("../systemd/config.toml");

/// Writes [`CONFIG_TEMPLATE`] to stdout, byte for byte.
pub fn print_config_template() -> std::io::Result<()> {
    // Not `print!`: it panics when stdout is a closed pipe (`iris-gateway config | head`).
    let mut out = std::io::stdout().lock();
    out.write_all(CONFIG_TEMPLATE.as_bytes())?;
    out.flush()
}

/// Whether stdout is the journal (systemd's `StandardOutput=journal`): `JOURNAL_STREAM` names
/// the device and inode of the stream systemd connected, and it must be our fd 1 itself, not
/// one a parent was given (systemd.exec(5)). Secrets must not be printed there: the journal is
/// kept long after and read by the `adm` and `systemd-journal` groups.
pub fn stdout_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    // fstat of a duplicate of fd 1: same device and inode.
    let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// Shortest ping period, so that an absurd `WATCHDOG_USEC` cannot turn the watchdog task into
/// a busy loop.
const MIN_PING_PERIOD: Duration = Duration::from_millis(10);

/// A handle for telling systemd how the gateway is doing. Only exists when systemd asked for
/// notifications (`NOTIFY_SOCKET` is set).
///
/// Every send is best effort: a failure is logged and otherwise ignored, because a gateway
/// that serves phones but cannot reach systemd is better than one that exits. (If systemd
/// really waits for `READY=1` and never gets it, it stops the service after `TimeoutStartSec=`
/// and the journal says why.)
#[derive(Debug)]
pub struct Notifier {
    watchdog: Option<Duration>,
    /// Whether a failed watchdog ping was already logged at `warn`: pings repeat every few
    /// seconds, and one broken socket must not flood the journal.
    ping_failure_logged: Cell<bool>,
}

impl Notifier {
    /// A notifier when the process runs under systemd with `NOTIFY_SOCKET` set, else `None`.
    ///
    /// The environment is left as it is (sd-notify's `*_and_unset_env` variants are not used):
    /// every later send reads `NOTIFY_SOCKET` again, and removing variables is only sound
    /// before threads exist (the push worker is one).
    pub fn from_env() -> Option<Notifier> {
        let socket = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty())?;
        // `watchdog_enabled` applies sd_watchdog_enabled(3)'s rule: WATCHDOG_USEC counts only
        // when WATCHDOG_PID is unset or names this process, so a child that inherited the
        // variables does not ping on its parent's behalf.
        let watchdog = sd_notify::watchdog_enabled().filter(|d| !d.is_zero());
        info!(
            notify_socket = %socket.to_string_lossy(),
            watchdog = ?watchdog,
            "running under systemd: readiness and watchdog notifications on"
        );
        Some(Notifier {
            watchdog,
            ping_failure_logged: Cell::new(false),
        })
    }

    /// `READY=1`: start-up is complete and phones can connect. Send it once the listener is
    /// bound and the store is open, not earlier: systemd (and anything ordered after the
    /// unit) takes it as the promise that the service works.
    pub fn ready(&self) {
        self.send(
            &[NotifyState::Ready, NotifyState::Status("online")],
            "READY=1",
        );
    }

    /// `STOPPING=1`: the gateway is shutting down on purpose (SIGTERM), so systemd shows
    /// "deactivating" instead of waiting for a service that is merely busy.
    pub fn stopping(&self) {
        self.send(
            &[
                NotifyState::Stopping,
                NotifyState::Status("stopping: telling devices the gateway is restarting"),
            ],
            "STOPPING=1",
        );
    }

    /// `STATUS=text`: one line shown by `systemctl status iris-gateway`.
    pub fn status(&self, text: &str) {
        // A newline would end the STATUS= assignment and start a bogus one.
        let line = text.replace('\n', " ");
        self.send(&[NotifyState::Status(&line)], "STATUS");
    }

    /// The watchdog timeout systemd enforces (`WatchdogSec=`), or `None` when it set none.
    /// Ping at least twice per interval.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// `WATCHDOG=1`: "still alive". Without a watchdog interval it is sent anyway; systemd
    /// ignores it.
    pub fn ping(&self) {
        match sd_notify::notify(&[NotifyState::Watchdog]) {
            Ok(()) => {
                if self.ping_failure_logged.replace(false) {
                    info!("systemd watchdog pings work again");
                }
            }
            Err(e) if self.ping_failure_logged.replace(true) => {
                debug!("could not send WATCHDOG=1 to systemd: {e}");
            }
            Err(e) => warn!(
                "could not send WATCHDOG=1 to systemd (further failures are logged at debug): {e}"
            ),
        }
    }

    fn send(&self, states: &[NotifyState<'_>], what: &str) {
        match sd_notify::notify(states) {
            Ok(()) => debug!("told systemd {what}"),
            Err(e) => warn!("could not send {what} to systemd: {e}"),
        }
    }
}

/// Pings the systemd watchdog at half its interval, for as long as the event loop runs.
/// Returns at once when systemd set no watchdog. Spawn it with `spawn_local` on the gateway's
/// own event loop.
///
/// The pings come from a task on the same single-threaded loop that serves every socket, not
/// from a thread of their own: a thread would keep pinging while the loop is stuck (a blocking
/// call, a livelock, a deadlocked `RefCell`), and the watchdog exists precisely to notice that
/// the loop no longer runs. When the loop hangs, this task stops too, the pings stop, and
/// systemd kills and restarts the service (`Restart=on-failure`).
///
/// Half the interval, as sd_watchdog_enabled(3) advises: one late wake-up (a slow fsync on an SD
/// card, a busy Pi) then costs nothing, and only a real hang of a whole interval is fatal.
pub async fn watchdog_task(notifier: Rc<Notifier>) {
    let Some(interval) = notifier.watchdog_interval() else {
        return;
    };
    let period = (interval / 2).max(MIN_PING_PERIOD);
    debug!(?period, "systemd watchdog: pinging");
    loop {
        notifier.ping();
        // A plain sleep rather than `tokio::time::interval`: after a stall, an interval would
        // fire its missed ticks back to back, which says nothing more than one ping does.
        tokio::time::sleep(period).await;
    }
}
