//! The Log page: the in-memory log ring (`crate::logring`), filtered by level and by text,
//! downloadable as a text file, with times in the zone the owner chose.
//!
//! Zones come from the box's zone database (`/usr/share/zoneinfo`, which every Raspberry Pi OS
//! and Debian image has, kept current by the `tzdata` package) through `tz-rs`, which only
//! parses those files: a zone database built into the binary would be bigger and go stale
//! (README, "Design notes"). The chosen zone is a saved setting (`[log] timezone` in
//! `settings.toml`), picked from the system's list (`zone1970.tab`); unset, the box's own zone
//! is used. It is the one zone of the admin page: the Status page's clock ([`Zone::now`]) shows
//! it too.

use hyper::header::{self, HeaderValue};
use hyper::StatusCode;
use maud::{html, Markup};

use super::context::SignedIn;
use super::pages::{notice, Notice};
use super::reply::{guard, redirect, signed_page, Refusal, Reply};
use super::route::Route;
use super::{parse_form, Admin, Form};
use crate::settings::Settings;

/// Longest zone name taken from the form (the longest in the database is 32 bytes).
const MAX_ZONE_BYTES: usize = 64;
/// Longest search text taken.
const MAX_SEARCH_BYTES: usize = 256;

/// A log line's level, most severe first (so "at least as severe" is `<=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        Some(match s.to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

/// A line as the formatter wrote it: `2026-12-02T19:18:45.123456Z  INFO message`.
struct Line<'a> {
    time: Option<chrono::DateTime<chrono::FixedOffset>>,
    level: Option<Level>,
    rest: &'a str,
    whole: &'a str,
}

fn parse(line: &str) -> Line<'_> {
    let (first, after) = line.split_once(' ').unwrap_or((line, ""));
    let Ok(time) = chrono::DateTime::parse_from_rfc3339(first) else {
        return Line {
            time: None,
            level: None,
            rest: line,
            whole: line,
        };
    };
    let after = after.trim_start();
    let (lvl, rest) = after.split_once(' ').unwrap_or((after, ""));
    match Level::parse(lvl) {
        Some(level) => Line {
            time: Some(time),
            level: Some(level),
            rest: rest.trim_start(),
            whole: line,
        },
        None => Line {
            time: Some(time),
            level: None,
            rest: after,
            whole: line,
        },
    }
}

/// The zone every admin page shows times in (the one setting, saved from the Log page): its
/// name for the page, and the database's rules.
pub(super) struct Zone {
    name: String,
    tz: Option<tz::TimeZone>,
}

impl Zone {
    pub(super) fn of(admin: &Admin) -> Zone {
        let saved = Settings::load(&admin.data_dir)
            .ok()
            .and_then(|s| s.log.timezone);
        match saved {
            Some(name) => Zone {
                tz: tz::TimeZone::from_posix_tz(&name).ok(),
                name,
            },
            None => Zone {
                name: std::fs::read_to_string("/etc/timezone")
                    .map(|s| s.trim().to_owned())
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map_or_else(
                        || "the box's own".to_owned(),
                        |n| format!("the box's own ({n})"),
                    ),
                tz: tz::TimeZone::local().ok(),
            },
        }
    }

    /// Now, as [`Zone::show`] puts it, with the zone's name.
    pub(super) fn now(&self) -> String {
        format!(
            "{} ({})",
            self.show(chrono::Utc::now().fixed_offset()),
            self.name
        )
    }

    /// `2026-12-02 20:18:45 +01:00`, or the time as logged (UTC) when the zone is unknown.
    fn show(&self, t: chrono::DateTime<chrono::FixedOffset>) -> String {
        let offset = self
            .tz
            .as_ref()
            .and_then(|z| z.find_local_time_type(t.timestamp()).ok())
            .and_then(|l| chrono::FixedOffset::east_opt(l.ut_offset()))
            .unwrap_or_else(|| chrono::FixedOffset::east_opt(0).expect("zero offset"));
        t.with_timezone(&offset)
            .format("%Y-%m-%d %H:%M:%S %:z")
            .to_string()
    }
}

/// What the page is asked to show.
struct Filter {
    level: Level,
    search: String,
}

impl Filter {
    fn from_query(query: &str) -> Filter {
        let form = parse_form(query.as_bytes()).unwrap_or(Form(Vec::new()));
        let mut search = form.get("q").to_owned();
        if search.len() > MAX_SEARCH_BYTES {
            let mut cut = MAX_SEARCH_BYTES;
            while !search.is_char_boundary(cut) {
                cut -= 1;
            }
            search.truncate(cut);
        }
        Filter {
            level: Level::parse(form.get("level")).unwrap_or(Level::Debug),
            search,
        }
    }

    /// A line without a level (a separator, a continued message) shows only unfiltered.
    fn keeps(&self, line: &Line) -> bool {
        let level_ok = match line.level {
            Some(l) => l <= self.level,
            None => self.level >= Level::Debug,
        };
        let needle = self.search.to_lowercase();
        level_ok && (needle.is_empty() || line.whole.to_lowercase().contains(&needle))
    }
}

/// The kept lines, oldest first, with their times in `zone`.
fn shown(filter: &Filter, zone: &Zone) -> Vec<String> {
    crate::logring::lines()
        .iter()
        .map(|l| parse(l))
        .filter(|l| filter.keeps(l))
        .map(|l| match (l.time, l.level) {
            (Some(t), Some(level)) => {
                format!(
                    "{} {:5} {}",
                    zone.show(t),
                    level.name().to_uppercase(),
                    l.rest
                )
            }
            (Some(t), None) => format!("{} {}", zone.show(t), l.rest),
            _ => l.whole.to_owned(),
        })
        .collect()
}

/// `GET /admin/log` and `GET /admin/log/download`.
pub(super) fn get(
    admin: &Admin,
    who: &SignedIn,
    route: &Route,
    query: &str,
) -> Result<Reply, Refusal> {
    let filter = Filter::from_query(query);
    let zone = Zone::of(admin);
    let lines = shown(&filter, &zone);
    if *route == Route::LogDownload {
        return Ok(download(&lines));
    }
    let n = if query.split('&').any(|p| p == "saved=timezone") {
        Notice::Good("Time zone saved.")
    } else {
        Notice::None
    };
    Ok(log_page(
        admin,
        who,
        StatusCode::OK,
        &filter,
        &zone,
        &lines,
        &n,
    ))
}

fn log_page(
    admin: &Admin,
    who: &SignedIn,
    status: StatusCode,
    filter: &Filter,
    zone: &Zone,
    lines: &[String],
    n: &Notice,
) -> Reply {
    let levels = [Level::Error, Level::Warn, Level::Info, Level::Debug];
    let download = format!(
        "{}?level={}&q={}",
        Route::LogDownload,
        filter.level.name(),
        crate::pairing::percent_encode(&filter.search)
    );
    let saved_zone = Settings::load(&admin.data_dir)
        .ok()
        .and_then(|s| s.log.timezone)
        .unwrap_or_default();
    let body = html! {
        (notice(n))
        form method="get" action=(Route::Log) id="log-filter" {
            label for="level" { "At least" }
            select #level name="level" {
                @for l in levels {
                    option value=(l.name()) selected[l == filter.level] { (l.name()) }
                }
            }
            label for="q" { "Containing" }
            input #q name="q" value=(filter.search) maxlength=(MAX_SEARCH_BYTES);
            p {
                button #log-show { "Show" }
                " "
                a #log-download href=(download) download { "Download these lines" }
            }
        }
        p #log-count { (lines.len()) " of the last " (crate::logring::lines().len())
            " lines the gateway logged, newest first (the journal keeps the rest, on the \
            box). Times in " (zone.name) "." }
        pre #log { @for l in lines.iter().rev() { (l) "\n" } }
        h2 { "Time zone" }
        form method="post" action=(Route::LogTimezone) {
            (crate::web::csrf_field(who.csrf()))
            label for="timezone" { "Zone, for the times on every page" }
            select #timezone name="timezone" { (zone_options(&saved_zone)) }
            p { button #save-timezone { "Save" } }
        }
    };
    signed_page(admin, who, status, "Log", &Route::Log, body)
}

/// The lines as a text file, oldest first, as a journal reads.
fn download(lines: &[String]) -> Reply {
    let mut text = lines.join("\n");
    text.push('\n');
    let mut reply = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(text)));
    guard(&mut reply, "text/plain; charset=utf-8");
    let name = format!(
        "attachment; filename=\"iris-gateway-log-{}.txt\"",
        chrono::Utc::now().format("%Y%m%d-%H%M%S")
    );
    if let Ok(v) = HeaderValue::from_str(&name) {
        reply.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    reply
}

/// The system's list of zones (`zone1970.tab` of the zone database, one zone a line after two
/// columns), sorted; read once, as it changes only with the tzdata package.
fn system_zones() -> &'static [String] {
    static ZONES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ZONES.get_or_init(|| {
        let text = std::fs::read_to_string(ZONE_TABLE).unwrap_or_default();
        let mut zones: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split('\t').nth(2))
            .filter(|z| plausible_zone(z))
            .map(str::to_owned)
            .collect();
        zones.sort();
        zones.dedup();
        zones
    })
}

/// Where the system lists its zones (Debian's tzdata).
const ZONE_TABLE: &str = "/usr/share/zoneinfo/zone1970.tab";

/// The zone picker's options: the box's own, then the system's zones, `current` selected (kept
/// even when the list lacks it, so saving the form again changes nothing).
fn zone_options(current: &str) -> Markup {
    let zones = system_zones();
    html! {
        option value="" selected[current.is_empty()] { "The box's own" }
        @if !current.is_empty() && !zones.iter().any(|z| z == current) {
            option selected { (current) }
        }
        @for z in zones { option selected[z == current] { (z) } }
    }
}

/// Whether `name` can be a zone database name (no path tricks: it becomes a file name).
fn plausible_zone(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ZONE_BYTES
        && !name.starts_with('/')
        && !name
            .split('/')
            .any(|part| part.is_empty() || part.starts_with('.'))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
}

/// `POST /admin/log/timezone`; `None` for any other path.
pub(super) fn post(
    admin: &Admin,
    who: &SignedIn,
    route: &Route,
    form: &Form,
) -> Option<Result<Reply, Refusal>> {
    if *route != Route::LogTimezone {
        return None;
    }
    let name = form.get("timezone").trim();
    let refuse = |why: &str| {
        let filter = Filter::from_query("");
        let zone = Zone::of(admin);
        Ok(log_page(
            admin,
            who,
            StatusCode::BAD_REQUEST,
            &filter,
            &zone,
            &shown(&filter, &zone),
            &Notice::Bad(why),
        ))
    };
    let known =
        name.is_empty() || (plausible_zone(name) && tz::TimeZone::from_posix_tz(name).is_ok());
    if !known {
        return Some(refuse(&format!(
            "\"{name}\" is not a time zone this box knows (e.g. Europe/Berlin); nothing was changed."
        )));
    }
    let saved = Settings::load(&admin.data_dir).map_err(|e| e.to_string());
    let result = saved.and_then(|mut s| {
        s.log.timezone = (!name.is_empty()).then(|| name.to_owned());
        s.save(&admin.data_dir).map_err(|e| e.to_string())
    });
    Some(match result {
        Ok(()) => {
            tracing::info!(zone = name, "admin page: log time zone saved");
            Ok(redirect(&format!("{}?saved=timezone", Route::Log)))
        }
        Err(e) => refuse(&format!("The time zone could not be saved: {e}.")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_filter_by_level_and_text() {
        let l = parse("2026-12-02T19:18:45.123456Z  WARN agent unreachable: refused");
        assert_eq!(l.level, Some(Level::Warn));
        assert_eq!(l.rest, "agent unreachable: refused");
        let f = Filter {
            level: Level::Warn,
            search: "AGENT".into(),
        };
        assert!(f.keeps(&l));
        let info = parse("2026-12-02T19:18:45.123456Z  INFO agent ok");
        assert!(!f.keeps(&info));
        assert!(plausible_zone("America/Argentina/Buenos_Aires"));
        assert!(!plausible_zone("../../etc/passwd"));
        assert!(!plausible_zone("/etc/passwd"));
    }
}
