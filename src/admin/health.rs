//! The home page's health at a glance (the gateway's status, the box's own figures, the
//! problems with a link to each fix), the JSON its script refreshes it from, and restarting the
//! gateway, rebooting and shutting down the box, each confirmed, with a page that comes back by
//! itself.
//!
//! Routes (all signed in; the POSTs carry the session's CSRF token like every form):
//! - `GET /admin/health.json`: what the home page shows, refreshed every
//!   `limits.admin_health_refresh_secs`;
//! - `GET /admin/power/{restart,reboot,poweroff}`: the confirm page; `POST` the same path does
//!   it and answers `303` to `GET /admin/restarting/{what}/{instance}`, a page that only waits:
//!   reloading it does nothing again.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tracing::{info, warn};

use super::pages::{self, csrf_field, Notice};
use super::reply::{guard, page, redirect, Refusal, Reply};
use super::transfer::schedule_restart;
use super::Admin;
use crate::hub::{Hub, StatusReport};
use crate::pairing::page::escape;
use crate::store::human_bytes;
use crate::system_health::{self, SystemHealth};

/// What the page says of a value this machine does not expose (a VM, a container, a board
/// without the sensor): nothing is made up.
pub const NOT_REPORTED: &str = "not reported by this board";
/// The JSON the home page and the restarting page read.
const JSON_PATH: &str = "/admin/health.json";
const POWER: &str = "/admin/power/";
const RESTARTING: &str = "/admin/restarting/";
/// Before this year the clock was not set (a Pi has no battery clock: it starts in the past
/// until the network sets it).
const CLOCK_SET_YEAR: i32 = 2024;
/// The most stderr kept of a failed power command, for the page.
const STDERR_CAP: u64 = 2048;

/// This process's id for the restarting page: it waits until the gateway answers with another
/// one. A restart execs the binary again, so a process-wide value is exactly one per start.
fn instance() -> &'static str {
    static INSTANCE: OnceLock<String> = OnceLock::new();
    INSTANCE.get_or_init(super::session::random_token)
}

/// What the three buttons do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Power {
    Restart,
    Reboot,
    Poweroff,
}

impl Power {
    fn from_name(name: &str) -> Option<Power> {
        match name {
            "restart" => Some(Power::Restart),
            "reboot" => Some(Power::Reboot),
            "poweroff" => Some(Power::Poweroff),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Power::Restart => "restart",
            Power::Reboot => "reboot",
            Power::Poweroff => "poweroff",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Power::Restart => "Restart the gateway",
            Power::Reboot => "Reboot the box",
            Power::Poweroff => "Shut down the box",
        }
    }

    /// Its command from `[power]`; the gateway's restart needs none (it execs itself).
    fn command(self, admin: &Admin) -> Option<Vec<String>> {
        let config = admin.config.borrow();
        let cmd = match self {
            Power::Restart => return None,
            Power::Reboot => &config.power.reboot,
            Power::Poweroff => &config.power.poweroff,
        };
        Some(cmd.clone())
    }

    /// Offered on the page: a restart always; the others when their command is set.
    fn offered(self, admin: &Admin) -> bool {
        self.command(admin).is_none_or(|c| !c.is_empty())
    }
}

/// One problem on the home page, with where to fix it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Problem {
    pub text: String,
    pub href: &'static str,
    pub fix: &'static str,
}

/// Everything the home page shows, as the JSON carries it.
#[derive(Serialize)]
struct Snapshot {
    instance: &'static str,
    /// Each figure in words, by the id of the element showing it.
    values: Vec<(&'static str, String)>,
    problems: Vec<Problem>,
    system: SystemHealth,
    gateway_uptime_secs: u64,
}

/// The box's figures, read on a blocking thread: about fifteen small files, `statvfs` and the
/// interface list, and `statvfs` on a failing card can take seconds (`system_health::read`).
async fn system(admin: &Admin) -> Result<SystemHealth, Refusal> {
    let dir = admin.data_dir.clone();
    tokio::task::spawn_blocking(move || system_health::read(&dir))
        .await
        .map_err(|e| Refusal::Unavailable(format!("reading the system failed: {e}")))
}

async fn snapshot(admin: &Admin, hub: &Hub) -> Result<(StatusReport, Snapshot), Refusal> {
    let report = hub.status_report();
    let system = system(admin).await?;
    let low = admin.config.borrow().limits.admin_disk_low_percent;
    let snap = Snapshot {
        instance: instance(),
        values: values(&report, &system),
        problems: {
            let mut list = problems(&report, &system, low);
            // The scheduled backups are the admin page's own (`backups/`), not the hub's: a
            // failed one is the owner's to fix, it does not make the gateway degraded.
            if let Some(Err(why)) = admin.backups.last().map(|o| o.result) {
                list.push(Problem {
                    text: format!("The last scheduled backup failed: {why}"),
                    href: "/admin/backup",
                    fix: "Backup settings",
                });
            }
            list
        },
        gateway_uptime_secs: report.uptime_secs,
        system,
    };
    Ok((report, snap))
}

fn duration(secs: u64) -> String {
    format!(
        "{}d {}h {:02}m",
        secs / 86_400,
        (secs % 86_400) / 3600,
        (secs % 3600) / 60
    )
}

fn or_not_reported(v: Option<String>) -> String {
    v.unwrap_or_else(|| NOT_REPORTED.to_owned())
}

/// A `life_time` estimate (1–11) in words.
fn life_used(v: u8) -> String {
    match v {
        11 => "past its rated life".to_owned(),
        v => format!("{}–{}% of its life used", (v - 1) * 10, v * 10),
    }
}

/// Each figure in words, by the id of the element that shows it.
fn values(r: &StatusReport, s: &SystemHealth) -> Vec<(&'static str, String)> {
    let memory = match (s.mem_available_bytes, s.mem_total_bytes) {
        (Some(a), Some(t)) => Some(format!(
            "{} available of {}",
            human_bytes(a),
            human_bytes(t)
        )),
        (None, Some(t)) => Some(human_bytes(t)),
        _ => None,
    };
    let disk = match (s.disk_free_bytes, s.disk_total_bytes) {
        (Some(f), Some(t)) => Some(format!("{} free of {}", human_bytes(f), human_bytes(t))),
        (Some(f), None) => Some(format!("{} free", human_bytes(f))),
        _ => None,
    };
    let written = match (&s.disk_device, s.disk_written_bytes) {
        (Some(d), Some(w)) => Some(format!("{} since boot ({d})", human_bytes(w))),
        _ => None,
    };
    let eol = |v: u8| match v {
        1 => "reserve blocks normal",
        2 => "reserve blocks low (warning)",
        _ => "reserve blocks almost gone (urgent)",
    };
    let wear = match (s.wear_life, s.wear_pre_eol) {
        (Some([a, b]), pre) => Some(format!(
            "{} (estimate A), {} (estimate B){}",
            life_used(a),
            life_used(b),
            pre.map(|p| format!("; {}", eol(p))).unwrap_or_default()
        )),
        (None, Some(p)) => Some(eol(p).to_owned()),
        (None, None) => None,
    };
    let addresses = (!s.addresses.is_empty()).then(|| s.addresses.join(", "));
    let time = match &s.timezone {
        Some(tz) => format!("{} ({tz})", s.time),
        None => s.time.clone(),
    };
    vec![
        (
            "h-temp",
            or_not_reported(s.cpu_celsius.map(|c| format!("{c:.1} °C"))),
        ),
        ("h-memory", or_not_reported(memory)),
        (
            "h-load",
            or_not_reported(
                s.load
                    .map(|[a, b, c]| format!("{a:.2}, {b:.2}, {c:.2} (1, 5, 15 min)")),
            ),
        ),
        (
            "h-uptime",
            or_not_reported(s.system_uptime_secs.map(duration)),
        ),
        (
            "h-gateway",
            format!(
                "up {}, {} in memory",
                duration(r.uptime_secs),
                s.rss_bytes
                    .map_or_else(|| NOT_REPORTED.to_owned(), human_bytes)
            ),
        ),
        ("h-disk", or_not_reported(disk)),
        ("h-written", or_not_reported(written)),
        ("h-wear", or_not_reported(wear)),
        ("h-addresses", or_not_reported(addresses)),
        ("h-time", time),
    ]
}

/// What is wrong, from what the hub knows and what the system says, each with its fix.
/// `low_percent`: `limits.admin_disk_low_percent`.
pub fn problems(r: &StatusReport, s: &SystemHealth, low_percent: u8) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut add = |text: String, href, fix| out.push(Problem { text, href, fix });
    if let Some(e) = &r.storage_error {
        add(
            format!("The store cannot be written or is damaged: {e}"),
            "#help-store",
            "What to do",
        );
    }
    if let (Some(free), Some(total)) = (s.disk_free_bytes, s.disk_total_bytes) {
        if u128::from(free) * 100 < u128::from(total) * u128::from(low_percent) {
            add(
                format!(
                    "The data disk is almost full: {} free of {}.",
                    human_bytes(free),
                    human_bytes(total)
                ),
                "/admin/backup",
                "Back up, then make room",
            );
        }
    }
    if let Some(e) = &r.media_full {
        add(
            format!("Files are refused: {e}"),
            "/admin/backup",
            "Back up, then make room",
        );
    }
    if let Some(e) = &r.agent_error {
        add(
            format!("The agent is unreachable or refuses: {e}"),
            "/admin/agent",
            "Agent settings",
        );
    }
    if let Some(e) = &r.push_error {
        add(
            format!("Push notifications are failing: {e}"),
            "/admin/push",
            "Push settings",
        );
    }
    if let Some(why) = &r.restore_failure {
        add(
            format!("The last restore failed: {why}"),
            "/admin/backup",
            "Backup and restore",
        );
    }
    if s.year < CLOCK_SET_YEAR {
        add(
            format!("The clock is not set (it says {}).", s.time),
            "#help-clock",
            "What to do",
        );
    }
    let worn = s.wear_pre_eol.is_some_and(|p| p >= 2)
        || s.wear_life.is_some_and(|l| l.iter().any(|v| *v >= 10));
    if worn {
        add(
            "The SD card reports it is wearing out.".to_owned(),
            "#help-wear",
            "What to do",
        );
    }
    out
}

fn problems_html(list: &[Problem]) -> String {
    let items: String = list
        .iter()
        .map(|p| {
            format!(
                "<li>{} <a href=\"{}\">{}</a></li>",
                escape(&p.text),
                p.href,
                p.fix
            )
        })
        .collect();
    let none = if list.is_empty() { "" } else { " hidden" };
    format!(
        "<section id=\"problems-section\"><h2>Problems</h2>\
         <p id=\"no-problems\" class=\"good\"{none}>Nothing needs your attention.</p>\
         <ul id=\"problems\" class=\"bad\">{items}</ul></section>"
    )
}

/// The home page's body: the problems, the gateway's status as before, the box, the buttons,
/// and what to do about the problems that have no page of their own.
fn home_body(admin: &Admin, report: &StatusReport, snap: &Snapshot, n: &Notice) -> String {
    let rows: String = [
        ("h-temp", "CPU temperature"),
        ("h-memory", "Memory"),
        ("h-load", "Load"),
        ("h-uptime", "System up"),
        ("h-gateway", "This gateway"),
        ("h-disk", "Data disk"),
        ("h-written", "Written to the card"),
        ("h-wear", "Card wear"),
        ("h-addresses", "Addresses"),
        ("h-time", "Time"),
    ]
    .iter()
    .map(|(id, label)| {
        let v = snap
            .values
            .iter()
            .find(|(k, _)| k == id)
            .map_or("", |(_, v)| v.as_str());
        format!("<dt>{label}</dt><dd id=\"{id}\">{}</dd>", escape(v))
    })
    .collect();
    let every = admin.config.borrow().limits.admin_health_refresh_secs;
    let buttons: String = [Power::Restart, Power::Reboot, Power::Poweroff]
        .into_iter()
        .filter(|p| p.offered(admin))
        .map(|p| {
            format!(
                "<a class=\"button\" id=\"power-{0}\" href=\"{POWER}{0}\">{1}…</a> ",
                p.name(),
                p.label()
            )
        })
        .collect();
    format!(
        "{problems}{status}<section id=\"box\"><h2>The box</h2>\
         <dl id=\"box-health\" data-every=\"{every}\">{rows}</dl></section>\
         <section id=\"power\"><h2>Restart or shut down</h2><p>{buttons}</p></section>\
         <section id=\"help\"><h2>If something is wrong</h2>\
         <p id=\"help-store\"><strong>The store.</strong> The gateway keeps what it has and \
         refuses what it cannot keep. Make room on the data disk, check the card (its wear, \
         below), look at the <a href=\"/admin/log\">log</a>; if the store is damaged, restore a \
         backup on the <a href=\"/admin/backup\">Backup</a> page.</p>\
         <p id=\"help-clock\"><strong>The clock.</strong> A Raspberry Pi has no battery clock: \
         it sets its time from the network. Connect the box to a network that reaches the \
         internet (or a local time server) and it corrects itself.</p>\
         <p id=\"help-wear\"><strong>The card.</strong> An SD card that reports wear may soon \
         fail: download a backup from the <a href=\"/admin/backup\">Backup</a> page and move \
         to a new card.</p></section>",
        problems = problems_html(&snap.problems),
        status = pages::status(report, n),
    )
}

/// The home page (`GET /admin/`).
pub(super) async fn home(
    admin: &Admin,
    hub: &Hub,
    csrf: &str,
    secure: bool,
    n: &Notice<'_>,
) -> Result<Reply, Refusal> {
    let (report, snap) = snapshot(admin, hub).await?;
    Ok(page(
        admin,
        StatusCode::OK,
        "Status",
        super::PREFIX,
        Some(csrf),
        secure,
        &home_body(admin, &report, &snap, n),
    ))
}

/// The signed-in GETs this file serves, or `None` for another path.
pub(super) async fn get(
    admin: &Admin,
    hub: &Hub,
    path: &str,
    csrf: &str,
    secure: bool,
) -> Option<Result<Reply, Refusal>> {
    if path == JSON_PATH {
        return Some(json(admin, hub).await);
    }
    if let Some(name) = path.strip_prefix(POWER) {
        let p = Power::from_name(name).filter(|p| p.offered(admin));
        return Some(
            p.ok_or(Refusal::NotFound)
                .map(|p| confirm(admin, p, csrf, secure)),
        );
    }
    let rest = path.strip_prefix(RESTARTING)?;
    let (name, from) = rest.split_once('/')?;
    if name == RESTORE {
        return Some(Ok(waiting(
            admin,
            "Restoring",
            RESTORING,
            from,
            csrf,
            secure,
        )));
    }
    let p = Power::from_name(name)?;
    Some(Ok(restarting(admin, p, from, csrf, secure)))
}

/// The waiting page's name for a restore the gateway restarts into.
const RESTORE: &str = "restore";
const RESTORING: &str = "The backup is whole and ready, and the gateway now restarts into it; \
     the current store is kept aside in the data dir. This page goes back to the home page when \
     it answers again (sign in with the backup's owner passphrase if it differs).";

/// The answer to a restore the gateway will restart into: a `303` to the page that waits, so a
/// reload waits again and never restores a second time.
pub(super) fn to_restoring_page() -> Reply {
    see_other(&format!("{RESTARTING}{RESTORE}/{}", instance()))
}

fn see_other(to: &str) -> Reply {
    let mut reply = redirect(super::PREFIX);
    if let Ok(v) = HeaderValue::from_str(to) {
        reply.headers_mut().insert(header::LOCATION, v);
    }
    reply
}

async fn json(admin: &Admin, hub: &Hub) -> Result<Reply, Refusal> {
    let (_, snap) = snapshot(admin, hub).await?;
    let body = serde_json::to_vec(&snap).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    guard(&mut reply, "application/json");
    Ok(reply)
}

fn confirm(admin: &Admin, p: Power, csrf: &str, secure: bool) -> Reply {
    let what = match p {
        Power::Restart => {
            "The gateway stops and starts again (a few seconds). Phones reconnect by \
             themselves; a reply being written is finished after the restart."
        }
        Power::Reboot => {
            "The whole box restarts (about a minute). Phones reconnect by themselves once it \
             is back."
        }
        Power::Poweroff => {
            "The box shuts down and stays off: nothing works until it is unplugged and \
             plugged in again (or its power button pressed). Wait until its light is off \
             before unplugging it."
        }
    };
    let body = format!(
        "<p>{what}</p><form method=\"post\" action=\"{POWER}{name}\">{field}\
         <p><button id=\"confirm-{name}\" class=\"big\">{label}</button> \
         <a href=\"/admin/\">Cancel</a></p></form>",
        name = p.name(),
        label = p.label(),
        field = csrf_field(csrf),
    );
    page(
        admin,
        StatusCode::OK,
        &format!("{}?", p.label()),
        "",
        Some(csrf),
        secure,
        &body,
    )
}

/// The waiting page: its script asks for the health until another start answers, then goes
/// home. It does nothing itself, so reloading it repeats nothing.
fn restarting(admin: &Admin, p: Power, from: &str, csrf: &str, secure: bool) -> Reply {
    let (title, what) = match p {
        Power::Restart => (
            "Restarting",
            "The gateway is restarting. This page goes back to the home page when it answers \
             again, in a few seconds.",
        ),
        Power::Reboot => (
            "Rebooting",
            "The box is rebooting. This page goes back to the home page when the gateway \
             answers again, in about a minute.",
        ),
        Power::Poweroff => (
            "Shutting down",
            "The box is shutting down. Once its light is off it is safe to unplug. When it is \
             powered on again, this page goes back to the home page.",
        ),
    };
    waiting(admin, title, what, from, csrf, secure)
}

/// A page that only waits for another start of the gateway (`from` is this one's instance).
fn waiting(admin: &Admin, title: &str, what: &str, from: &str, csrf: &str, secure: bool) -> Reply {
    let every = admin.config.borrow().limits.admin_health_refresh_secs;
    let body = format!(
        "<p>{what}</p><p id=\"coming-back\" data-from=\"{}\" data-every=\"{every}\">\
         Waiting for the gateway…</p>",
        escape(from)
    );
    page(admin, StatusCode::OK, title, "", Some(csrf), secure, &body)
}

/// The signed-in POSTs this file serves (CSRF already checked), or `None` for another path.
pub(super) async fn post(
    admin: &Admin,
    path: &str,
    peer: std::net::SocketAddr,
) -> Option<Result<Reply, Refusal>> {
    let p = Power::from_name(path.strip_prefix(POWER)?).filter(|p| p.offered(admin));
    let Some(p) = p else {
        return Some(Err(Refusal::NotFound));
    };
    info!(%peer, what = p.name(), "admin page: asked to {}", p.label().to_lowercase());
    if let Some(cmd) = p.command(admin) {
        let within = Duration::from_secs(admin.config.borrow().limits.admin_power_command_secs);
        if let Err(e) = run(cmd, within).await {
            warn!("admin page: {} failed: {e}", p.name());
            return Some(Err(Refusal::Unavailable(format!(
                "{} did not work: {e}",
                p.label()
            ))));
        }
    } else {
        schedule_restart(admin);
    }
    Some(Ok(see_other(&format!(
        "{RESTARTING}{}/{}",
        p.name(),
        instance()
    ))))
}

/// Runs a `[power]` command (no shell) on a blocking thread, waiting at most `within`: it
/// only asks logind, which answers at once, but a stuck D-Bus must not hold the page forever.
async fn run(cmd: Vec<String>, within: Duration) -> Result<(), String> {
    tokio::task::spawn_blocking(move || run_blocking(&cmd, within))
        .await
        .map_err(|e| e.to_string())?
}

fn run_blocking(cmd: &[String], within: Duration) -> Result<(), String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let (program, args) = cmd.split_first().ok_or("no command is set")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{program} did not finish within {} s",
                within.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = stderr.take(STDERR_CAP).read_to_string(&mut err);
    }
    Err(format!("{program} ended with {status}: {}", err.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::HealthState;

    fn report() -> StatusReport {
        StatusReport {
            state: HealthState::Online,
            causes: vec![],
            version: "0".into(),
            uptime_secs: 61,
            agent: "Hermes at http://127.0.0.1:9".into(),
            agent_error: None,
            push: "none".into(),
            push_error: None,
            push_confirmed: false,
            store_bytes: Some(1),
            cursor_head: 0,
            media_bytes: 0,
            media_quota_bytes: 1,
            disk_free_bytes: None,
            devices_paired: 0,
            devices_connected: 0,
            restore_failure: None,
            storage_error: None,
            media_full: None,
        }
    }

    fn system() -> SystemHealth {
        SystemHealth {
            year: 2026,
            time: "2026-01-01 00:00:00 +00:00".into(),
            ..SystemHealth::default()
        }
    }

    #[test]
    fn each_problem_links_to_its_fix() {
        assert!(problems(&report(), &system(), 10).is_empty());
        let mut r = report();
        r.agent_error = Some("connection refused".into());
        r.push_error = Some("ntfy: 500".into());
        r.storage_error = Some("read-only".into());
        let mut s = system();
        s.year = 1970;
        s.disk_free_bytes = Some(5);
        s.disk_total_bytes = Some(100);
        s.wear_pre_eol = Some(2);
        let hrefs: Vec<_> = problems(&r, &s, 10).iter().map(|p| p.href).collect();
        assert_eq!(
            hrefs,
            [
                "#help-store",
                "/admin/backup",
                "/admin/agent",
                "/admin/push",
                "#help-clock",
                "#help-wear"
            ]
        );
        s.disk_free_bytes = Some(10);
        assert!(!problems(&r, &s, 10)
            .iter()
            .any(|p| p.href == "/admin/backup"));
    }

    #[test]
    fn what_is_not_exposed_says_so() {
        let v = values(&report(), &system());
        let of = |id: &str| v.iter().find(|(k, _)| *k == id).unwrap().1.clone();
        for id in [
            "h-temp",
            "h-memory",
            "h-load",
            "h-written",
            "h-wear",
            "h-addresses",
        ] {
            assert_eq!(of(id), NOT_REPORTED, "{id}");
        }
        let mut s = system();
        s.cpu_celsius = Some(48.31);
        s.wear_life = Some([1, 11]);
        s.wear_pre_eol = Some(1);
        let v = values(&report(), &s);
        let of = |id: &str| v.iter().find(|(k, _)| *k == id).unwrap().1.clone();
        assert_eq!(of("h-temp"), "48.3 °C");
        assert_eq!(
            of("h-wear"),
            "0–10% of its life used (estimate A), past its rated life (estimate B); reserve blocks normal"
        );
        assert!(of("h-gateway").starts_with("up 0d 0h 01m"));
    }

    #[test]
    fn a_power_command_runs_and_its_failure_is_told() {
        let sh = |s: &str| vec!["/bin/sh".to_owned(), "-c".to_owned(), s.to_owned()];
        assert_eq!(run_blocking(&sh("exit 0"), Duration::from_secs(5)), Ok(()));
        let e = run_blocking(
            &sh("echo 'Access denied' >&2; exit 1"),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(e.contains("Access denied"), "{e}");
        let e = run_blocking(&sh("sleep 5"), Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        assert!(run_blocking(&[], Duration::from_secs(1)).is_err());
    }
}
