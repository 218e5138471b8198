//! The home page's health at a glance (the gateway's status, the box's own figures, the
//! problems with a link to each fix) and the JSON its script refreshes it from
//! (`GET /admin/health.json`, signed in, every `limits.admin_health_refresh_secs`). The power
//! buttons it shows are `power.rs`'s.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use maud::{html, Markup};
use serde::Serialize;

use super::context::SignedIn;
use super::pages::{self, Notice};
use super::reply::{guard, signed_page, Refusal, Reply};
use super::route::{Route, PREFIX};
use super::Admin;
use crate::hub::{Hub, StatusReport};
use crate::store::human_bytes;
use crate::system_health::{self, History, Sample, Series, SystemHealth, HISTORY_SAMPLES};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// What the page says of a value this machine does not expose (a VM, a container, a board
/// without the sensor): nothing is made up.
pub const NOT_REPORTED: &str = "not reported by this board";
/// Before this year the clock was not set (a Pi has no battery clock: it starts in the past
/// until the network sets it).
const CLOCK_SET_YEAR: i32 = 2024;
/// A link to a page with a fixed address, as a problem's fix keeps it.
fn href(route: Route) -> &'static str {
    route.static_path().unwrap_or(PREFIX)
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
    let report = hub.status().report();
    let system = system(admin).await?;
    let low = admin.config.read(|c| c.limits.admin_disk_low_percent);
    let mut values = values(&report, &system);
    // The box's clock in the zone the owner chose for every page (the Log page's setting).
    let now = super::log_page::Zone::of(admin).now();
    if let Some((_, time)) = values.iter_mut().find(|(id, _)| *id == "h-time") {
        *time = now;
    }
    let snap = Snapshot {
        instance: super::power::instance(),
        values,
        problems: {
            let mut list = problems(&report, &system, low);
            // The scheduled backups are the admin page's own (`backups/`), not the hub's: a
            // failed one is the owner's to fix, it does not make the gateway degraded.
            if let Some(Err(why)) = admin.backups.last().map(|o| o.result) {
                list.push(Problem {
                    text: format!("The last scheduled backup failed: {why}"),
                    href: href(Route::Backup),
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

/// The Status page's last 24 hours (temperature, memory, load, writes to the card) and when
/// its next sample is due. Filled by [`start_sampling`]'s task; read by the page.
pub struct Day {
    history: RefCell<History>,
    next_due: Cell<Instant>,
}

impl Default for Day {
    fn default() -> Self {
        Day {
            history: RefCell::default(),
            next_due: Cell::new(Instant::now() + system_health::sample_every()),
        }
    }
}

/// One [`Sample`] read on a blocking thread: the event loop only awaits it.
async fn read_sample(dir: PathBuf) -> Option<Sample> {
    tokio::task::spawn_blocking(move || system_health::read_sample(&dir))
        .await
        .ok()
}

/// Takes the day's samples until the gateway stops: a baseline at once (for the first step
/// of the write counter), then one every `system_health::sample_every()`.
pub fn start_sampling(admin: &Admin, mut stop: crate::shutdown::Listener) {
    let (day, dir) = (admin.day.clone(), admin.data_dir.clone());
    let every = system_health::sample_every();
    tokio::task::spawn_local(async move {
        if let Some(sample) = read_sample(dir.clone()).await {
            day.history.borrow_mut().baseline(&sample);
        }
        let mut tick = tokio::time::interval_at(day.next_due.get(), every);
        // A loop held up (a long suspend) takes one sample late, not a burst to catch up.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.recv() => return,
            }
            day.next_due.set(Instant::now() + every);
            if let Some(sample) = read_sample(dir.clone()).await {
                day.history.borrow_mut().record(&sample);
            }
        }
    });
}

/// `5 min`, `30 s`, `200 ms`: how long one sample's step is.
fn span(d: Duration) -> String {
    match d.as_secs() {
        0 => format!("{} ms", d.as_millis()),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// One series as a small chart: an SVG polyline (newest at the right, a gap where nothing was
/// reported) with its now, lowest and highest in words.
fn sparkline(
    id: &str,
    label: &str,
    values: &[Option<f32>],
    words: impl Fn(f32) -> String,
) -> Markup {
    let present: Vec<f32> = values.iter().flatten().copied().collect();
    let (Some(now), Some(min), Some(max)) = (
        present.last(),
        present.iter().copied().reduce(f32::min),
        present.iter().copied().reduce(f32::max),
    ) else {
        return html! {
            figure id=(id) class="day-figure" { figcaption { (label) ": " (NOT_REPORTED) } }
        };
    };
    const HEIGHT: f32 = 40.0;
    const MARGIN: f32 = 2.0;
    let y = |v: f32| {
        if max > min {
            MARGIN + (max - v) / (max - min) * (HEIGHT - 2.0 * MARGIN)
        } else {
            HEIGHT / 2.0
        }
    };
    let offset = HISTORY_SAMPLES - values.len();
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| format!("{},{:.1}", offset + i, y(v))))
        .collect();
    let caption = format!(
        "{label}: now {}, lowest {}, highest {}",
        words(*now),
        words(min),
        words(max)
    );
    html! {
        figure id=(id) class="day-figure" {
            figcaption { (caption) }
            svg.spark viewBox=(format!("0 0 {} {HEIGHT}", HISTORY_SAMPLES - 1))
                preserveAspectRatio="none" role="img" aria-label=(caption) {
                polyline fill="none" stroke="currentColor" stroke-width="1.5"
                    vector-effect="non-scaling-stroke" points=(points.join(" ")) {}
            }
        }
    }
}

/// The Status page's section of the day: a chart per series, or how long until the first
/// sample.
fn day_html(day: &Day) -> Markup {
    let every = system_health::sample_every();
    let history = day.history.borrow();
    let samples = history.samples();
    let step = span(every);
    let body = if samples == 0 {
        let left = day.next_due.get().saturating_duration_since(Instant::now());
        let minutes = left.as_secs().div_ceil(60).max(1);
        let unit = if minutes == 1 { "minute" } else { "minutes" };
        html! { p #day-collecting { "Collecting: the first sample in " (minutes) " " (unit) "." } }
    } else {
        html! {
            @for &series in Series::ALL.iter() {
                @let values: Vec<Option<f32>> = history.series(series).values().collect();
                @match series {
                    Series::Temperature => (sparkline("day-temp", "CPU temperature", &values, |c| {
                        format!("{c:.1} °C")
                    })),
                    Series::Memory => (sparkline("day-memory", "Memory in use", &values, |b| {
                        human_bytes(b as u64)
                    })),
                    Series::Load => {
                        (sparkline("day-load", "Load (1 min)", &values, |l| format!("{l:.2}")))
                    }
                    Series::Written => (sparkline(
                        "day-written",
                        &format!("Written to the card per {step}"),
                        &values,
                        |b| human_bytes(b as u64),
                    )),
                }
            }
        }
    };
    let plural = if samples == 1 { "" } else { "s" };
    html! {
        section #day data-samples=(samples) {
            h2 { "The last 24 hours" }
            p { (samples) " sample" (plural) ", one every " (step) ", kept in memory only: a \
                restart starts the day again. Reload the page for the latest." }
            (body)
        }
    }
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
                href(Route::Backup),
                "Back up, then make room",
            );
        }
    }
    if let Some(e) = &r.media_full {
        add(
            format!("Files are refused: {e}"),
            href(Route::Backup),
            "Back up, then make room",
        );
    }
    if let Some(e) = &r.agent_error {
        add(
            format!("The agent is unreachable or refuses: {e}"),
            href(Route::Agent),
            "Agent settings",
        );
    }
    if let Some(e) = &r.push_error {
        add(
            format!("Push notifications are failing: {e}"),
            href(Route::Push),
            "Push settings",
        );
    }
    for off in &r.switched_off {
        add(
            super::reply::sentence(&off.cause()),
            off.part.page(),
            "Settings",
        );
    }
    if let Some(failure) = &r.update_failure {
        add(format!("The {failure}."), href(Route::Update), "Updates");
    }
    if let Some(to) = r.update_under_way.as_ref().filter(|_| r.update_trial) {
        add(
            format!("Version {to} is being checked after an update: phones wait a moment."),
            href(Route::Update),
            "Updates",
        );
    }
    if let Some(why) = &r.restore_failure {
        add(
            format!("The last restore failed: {why}"),
            href(Route::Backup),
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

fn problems_html(list: &[Problem]) -> Markup {
    html! {
        section #problems-section {
            h2 { "Problems" }
            p id="no-problems" class="good" hidden[!list.is_empty()] { "Nothing needs your attention." }
            ul id="problems" class="bad" {
                @for p in list { li { (p.text) " " a href=(p.href) { (p.fix) } } }
            }
        }
    }
}

/// The home page's body: the problems, the gateway's status as before, the box, the buttons,
/// and what to do about the problems that have no page of their own.
fn home_body(admin: &Admin, report: &StatusReport, snap: &Snapshot, n: &Notice) -> Markup {
    let rows = [
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
    ];
    let value = |id: &str| {
        snap.values
            .iter()
            .find(|(k, _)| *k == id)
            .map_or("", |(_, v)| v.as_str())
    };
    let every = admin.config.read(|c| c.limits.admin_health_refresh_secs);
    let appliance = super::power::as_appliance_service();
    html! {
        (problems_html(&snap.problems))
        (pages::status(report, n))
        section #box {
            h2 { "The box" }
            dl #box-health data-every=(every) {
                @for (id, label) in rows { dt { (label) } dd id=(id) { (value(id)) } }
            }
        }
        (day_html(&admin.day))
        section #power {
            h2 { (if appliance { "Restart or shut down" } else { "Restart" }) }
            p { (super::power::buttons(admin)) }
            @if !appliance {
                p #power-note { (super::power::NOT_THE_APPLIANCE) }
            }
        }
        section #help {
            h2 { "If something is wrong" }
            p #help-store { strong { "The store." } " The gateway keeps what it has and refuses \
                what it cannot keep. Make room on the data disk, check the card (its wear, \
                above), look at the " a href=(Route::Log) { "log" } "; if the store is damaged, \
                restore a backup on the " a href=(Route::Backup) { "Backup" } " page." }
            p #help-clock { strong { "The clock." } " A Raspberry Pi has no battery clock: it \
                sets its time from the network. Connect the box to a network that reaches the \
                internet (or a local time server) and it corrects itself." }
            p #help-wear { strong { "The card." } " An SD card that reports wear may soon fail: \
                download a backup from the " a href=(Route::Backup) { "Backup" } " page and \
                move to a new card." }
        }
    }
}

/// The home page (`GET /admin/`).
pub(super) async fn home(
    admin: &Admin,
    hub: &Hub,
    who: &SignedIn,
    n: &Notice<'_>,
) -> Result<Reply, Refusal> {
    let (report, snap) = snapshot(admin, hub).await?;
    Ok(signed_page(
        admin,
        who,
        StatusCode::OK,
        "Status",
        &Route::Home,
        home_body(admin, &report, &snap, n),
    ))
}

/// The signed-in GETs this file serves, or `None` for another path.
pub(super) async fn get(admin: &Admin, hub: &Hub, route: &Route) -> Option<Result<Reply, Refusal>> {
    if *route == Route::HealthJson {
        return Some(json(admin, hub).await);
    }
    None
}

async fn json(admin: &Admin, hub: &Hub) -> Result<Reply, Refusal> {
    let (_, snap) = snapshot(admin, hub).await?;
    let body = serde_json::to_vec(&snap).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    guard(&mut reply, "application/json");
    Ok(reply)
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
            update_failure: None,
            update_under_way: None,
            update_trial: false,
            switched_off: vec![],
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
}
