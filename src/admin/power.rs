//! Restarting the gateway, rebooting and shutting down the box from the home page: each behind
//! a confirm page, each answered with a `303` to a page that only waits for another start of the
//! gateway (so a reload does nothing again), which its script leaves for the home page.
//!
//! Routes (signed in; the POST carries the session's CSRF token like every form):
//! - `GET /admin/power/{restart,reboot,poweroff}`: the confirm page; `POST` the same path does it;
//! - `GET /admin/restarting/{what}/{instance}`: the page that waits (also after a restore).

use std::sync::OnceLock;
use std::time::Duration;

use hyper::header::{self, HeaderValue};
use hyper::StatusCode;
use maud::{html, Markup};
use tracing::{info, warn};

use super::context::SignedIn;
use super::reply::{page, redirect, Refusal, Reply};
use super::route::{Power, Route, Waiting};
use super::transfer::schedule_restart;
use super::Admin;
use crate::web::csrf_field;

/// This process's id for the restarting page: it waits until the gateway answers with another
/// one. A restart execs the binary again, so a process-wide value is exactly one per start.
pub(super) fn instance() -> &'static str {
    static INSTANCE: OnceLock<String> = OnceLock::new();
    INSTANCE.get_or_init(super::session::random_token)
}

impl Power {
    fn label(self) -> &'static str {
        match self {
            Power::Restart => "Restart the gateway",
            Power::Reboot => "Reboot the box",
            Power::Poweroff => "Shut down the box",
        }
    }

    /// Its command from `[power]`; the gateway's restart needs none (it execs itself).
    fn command(self, admin: &Admin) -> Option<Vec<String>> {
        admin.config.read(|config| match self {
            Power::Restart => None,
            Power::Reboot => Some(config.power.reboot.clone()),
            Power::Poweroff => Some(config.power.poweroff.clone()),
        })
    }

    /// Offered on the page: a restart always; the others when their command is set and the
    /// gateway runs as the box's own service (a laptop running it by hand is not the box).
    fn offered(self, admin: &Admin) -> bool {
        self.command(admin)
            .is_none_or(|c| !c.is_empty() && as_appliance_service())
    }
}

/// The packaged unit (systemd/iris-gateway.service).
const APPLIANCE_UNIT: &str = "iris-gateway.service";

/// Whether this process is the appliance's service, read once: see [`is_appliance_service`].
pub(super) fn as_appliance_service() -> bool {
    static ANSWER: OnceLock<bool> = OnceLock::new();
    *ANSWER.get_or_init(|| {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        is_appliance_service(var("INVOCATION_ID"), var("NOTIFY_SOCKET"), &cgroup)
    })
}

/// Started by systemd (which sets `INVOCATION_ID` for every unit it runs) as a notify service
/// (`NOTIFY_SOCKET`, as the packaged unit is `Type=notify`), and, where the cgroup names the
/// unit, that unit is the packaged one. A gateway typed in a terminal has neither variable.
fn is_appliance_service(
    invocation_id: Option<String>,
    notify_socket: Option<String>,
    cgroup: &str,
) -> bool {
    let unit = cgroup
        .lines()
        .filter_map(|line| line.rsplit('/').next())
        .find(|last| last.ends_with(".service"));
    invocation_id.is_some() && notify_socket.is_some() && unit.is_none_or(|u| u == APPLIANCE_UNIT)
}

/// What the home page says where it offers no reboot or shut-down.
pub(super) const NOT_THE_APPLIANCE: &str = "Rebooting and shutting down are offered only where \
     the gateway runs as the box's own service (the iris-gateway unit systemd starts); here, \
     use the machine's own controls.";

/// The home page's three buttons (those whose command is set).
pub(super) fn buttons(admin: &Admin) -> Markup {
    let offered = [Power::Restart, Power::Reboot, Power::Poweroff]
        .into_iter()
        .filter(|p| p.offered(admin));
    html! {
        @for p in offered {
            a.button id={ "power-" (p.name()) } href=(Route::Power(p)) { (p.label()) "…" }
            " "
        }
    }
}

/// The signed-in GETs this file serves, or `None` for another route.
pub(super) fn get(admin: &Admin, who: &SignedIn, route: &Route) -> Option<Result<Reply, Refusal>> {
    match route {
        Route::Power(p) => Some(if p.offered(admin) {
            Ok(confirm(admin, who, *p))
        } else {
            Err(Refusal::NotFound)
        }),
        Route::Restarting {
            what: Waiting::Restore,
            from,
        } => Some(Ok(waiting(admin, who, "Restoring", RESTORING, from))),
        Route::Restarting {
            what: Waiting::Power(p),
            from,
        } => Some(Ok(restarting(admin, who, *p, from))),
        _ => None,
    }
}

const RESTORING: &str = "The backup is whole and ready, and the gateway now restarts into it; \
     the current store is kept aside in the data dir. This page goes back to the home page when \
     it answers again (sign in with the backup's owner passphrase if it differs).";

/// The answer to a restore the gateway will restart into: a `303` to the page that waits, so a
/// reload waits again and never restores a second time.
pub(super) fn to_restoring_page() -> Reply {
    see_other(
        &Route::Restarting {
            what: Waiting::Restore,
            from: instance().to_owned(),
        }
        .path(),
    )
}

fn see_other(to: &str) -> Reply {
    let mut reply = redirect(super::PREFIX);
    if let Ok(v) = HeaderValue::from_str(to) {
        reply.headers_mut().insert(header::LOCATION, v);
    }
    reply
}

fn confirm(admin: &Admin, who: &SignedIn, p: Power) -> Reply {
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
    let body = html! {
        p { (what) }
        form method="post" action=(Route::Power(p)) {
            (csrf_field(who.csrf()))
            p {
                button id={ "confirm-" (p.name()) } class="big" { (p.label()) }
                " "
                a href=(Route::Home) { "Cancel" }
            }
        }
    };
    page(
        admin,
        StatusCode::OK,
        &format!("{}?", p.label()),
        "",
        Some(who.csrf()),
        who.ctx(),
        body,
    )
}

/// The waiting page: its script asks for the health until another start answers, then goes
/// home. It does nothing itself, so reloading it repeats nothing.
fn restarting(admin: &Admin, who: &SignedIn, p: Power, from: &str) -> Reply {
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
    waiting(admin, who, title, what, from)
}

/// A page that only waits for another start of the gateway (`from` is this one's instance).
fn waiting(admin: &Admin, who: &SignedIn, title: &str, what: &str, from: &str) -> Reply {
    let every = admin.config.read(|c| c.limits.admin_health_refresh_secs);
    let body = html! {
        p { (what) }
        p id="coming-back" data-from=(from) data-every=(every) { "Waiting for the gateway…" }
    };
    page(
        admin,
        StatusCode::OK,
        title,
        "",
        Some(who.csrf()),
        who.ctx(),
        body,
    )
}

/// The signed-in POSTs this file serves (CSRF already checked), or `None` for another path.
pub(super) async fn post(
    admin: &Admin,
    who: &SignedIn,
    route: &Route,
) -> Option<Result<Reply, Refusal>> {
    let peer = who.peer();
    let Route::Power(p) = *route else {
        return None;
    };
    if !p.offered(admin) {
        return Some(Err(Refusal::NotFound));
    }
    info!(%peer, what = p.name(), "admin page: asked to {}", p.label().to_lowercase());
    if let Some(cmd) = p.command(admin) {
        let within = Duration::from_secs(admin.config.read(|c| c.limits.admin_power_command_secs));
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
    Some(Ok(see_other(
        &Route::Restarting {
            what: Waiting::Power(p),
            from: instance().to_owned(),
        }
        .path(),
    )))
}

/// Runs a `[power]` command (no shell) on a blocking thread, waiting at most `within`: it
/// only asks logind, which answers at once, but a stuck D-Bus must not hold the page forever.
async fn run(cmd: Vec<String>, within: Duration) -> Result<(), String> {
    tokio::task::spawn_blocking(move || crate::command::run(&cmd, within))
        .await
        .map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    use super::is_appliance_service;

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn only_the_packaged_unit_under_systemd_is_the_appliance() {
        let unit = "0::/system.slice/iris-gateway.service\n";
        assert!(is_appliance_service(
            some("1f"),
            some("/run/systemd/notify"),
            unit
        ));
        // A container's cgroup names no unit: the variables decide.
        assert!(is_appliance_service(some("1f"), some("/run/n"), "0::/\n"));
        // By hand in a terminal: no variables.
        assert!(!is_appliance_service(
            None,
            None,
            "0::/user.slice/session-2.scope\n"
        ));
        // Another unit that runs the binary (a user's own service, a test harness).
        let other = "0::/system.slice/my-chat.service\n";
        assert!(!is_appliance_service(some("1f"), some("/run/n"), other));
        // Started by systemd but not as a notify service (`systemd-run` of a shell).
        assert!(!is_appliance_service(some("1f"), None, unit));
    }
}
