//! Every address the admin app answers, in one enum: a request's path is parsed into a
//! [`Route`] once, and dispatch, the section menu, form actions, links and redirects all name
//! a route instead of spelling its path, so a page cannot link to an address nobody serves and
//! moving one is a change here.

use std::borrow::Cow;
use std::fmt;

/// Every admin path starts with this.
pub const PREFIX: &str = "/admin/";
/// The embedded stylesheet and script live under this (never a page sign-in may lead to).
pub(super) const STATIC_PREFIX: &str = "/admin/static/";
const POWER_PREFIX: &str = "/admin/power/";
const RESTARTING_PREFIX: &str = "/admin/restarting/";
const JOB_PREFIX: &str = "/admin/job/";

/// One admin address. The method is matched beside it at dispatch: most pages answer a GET
/// with the page and a POST with its form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/` or `/admin`: a browser's way in, sent to [`Route::Home`].
    Entry,
    Css,
    Js,
    /// The status (home) page, `/admin/`.
    Home,
    HealthJson,
    Setup,
    SignIn,
    SignOut,
    Strength,
    Owner,
    Passphrase,
    Devices,
    DevicesPair,
    DevicesRename,
    DevicesRevoke,
    /// A new device's one-time pairing result (`?id=` its one-time id).
    Paired,
    Agent,
    AgentTest,
    Transcription,
    TranscriptionTest,
    Speech,
    SpeechTest,
    Push,
    PushTest,
    Backup,
    BackupDownload,
    BackupRestore,
    BackupNow,
    BackupSchedule,
    BackupPassphrase,
    BackupRestoreScheduled,
    Log,
    LogDownload,
    LogTimezone,
    Update,
    UpdateUpload,
    UpdateCheck,
    UpdateInstall,
    UpdateSource,
    UpdateDismiss,
    /// A job's page (`jobs.rs`).
    Job(Kind),
    /// A power button's confirm page (GET) and its doing (POST).
    Power(Power),
    /// The page that waits for another start of the gateway: after `what`, from the process
    /// `from` (`power.rs`).
    Restarting {
        what: Waiting,
        from: String,
    },
}

/// What the three power buttons do (`power.rs`): part of their addresses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Power {
    Restart,
    Reboot,
    Poweroff,
}

impl Power {
    pub(super) fn from_name(name: &str) -> Option<Power> {
        match name {
            "restart" => Some(Power::Restart),
            "reboot" => Some(Power::Reboot),
            "poweroff" => Some(Power::Poweroff),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Power::Restart => "restart",
            Power::Reboot => "reboot",
            Power::Poweroff => "poweroff",
        }
    }
}

/// The kinds of long work (`jobs.rs`), one at a time each: part of their pages' addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A backup put back: from the folder of scheduled backups, or from an upload.
    Restore,
    /// "Back up now".
    Backup,
    /// "Check now" (and the daily check).
    UpdateCheck,
    /// An offered update downloaded, checked and staged.
    UpdateInstall,
}

pub(super) const KINDS: [Kind; 4] = [
    Kind::Restore,
    Kind::Backup,
    Kind::UpdateCheck,
    Kind::UpdateInstall,
];

impl Kind {
    /// Its name in the job page's address.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Restore => "restore",
            Kind::Backup => "backup",
            Kind::UpdateCheck => "update-check",
            Kind::UpdateInstall => "update-install",
        }
    }

    pub(super) fn from_name(name: &str) -> Option<Kind> {
        KINDS.into_iter().find(|k| k.name() == name)
    }
}

/// What the restarting page waits after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    Power(Power),
    /// A restore the gateway restarts into.
    Restore,
}

/// The routes with a fixed path, with it: [`Route::parse`] and [`Route::path`] read the same
/// table, so the two cannot disagree.
const FIXED: [(Route, &str); 40] = [
    (Route::Css, "/admin/static/admin.css"),
    (Route::Js, "/admin/static/admin.js"),
    (Route::Home, PREFIX),
    (Route::HealthJson, "/admin/health.json"),
    (Route::Setup, "/admin/setup"),
    (Route::SignIn, "/admin/signin"),
    (Route::SignOut, "/admin/signout"),
    (Route::Strength, "/admin/strength"),
    (Route::Owner, "/admin/owner"),
    (Route::Passphrase, "/admin/passphrase"),
    (Route::Devices, "/admin/devices"),
    (Route::DevicesPair, "/admin/devices/pair"),
    (Route::DevicesRename, "/admin/devices/rename"),
    (Route::DevicesRevoke, "/admin/devices/revoke"),
    (Route::Paired, "/admin/paired"),
    (Route::Agent, "/admin/agent"),
    (Route::AgentTest, "/admin/agent/test"),
    (Route::Transcription, "/admin/transcription"),
    (Route::TranscriptionTest, "/admin/transcription/test"),
    (Route::Speech, "/admin/speech"),
    (Route::SpeechTest, "/admin/speech/test"),
    (Route::Push, "/admin/push"),
    (Route::PushTest, "/admin/push/test"),
    (Route::Backup, "/admin/backup"),
    (Route::BackupDownload, "/admin/backup/download"),
    (Route::BackupRestore, "/admin/backup/restore"),
    (Route::BackupNow, "/admin/backup/now"),
    (Route::BackupSchedule, "/admin/backup/schedule"),
    (Route::BackupPassphrase, "/admin/backup/passphrase"),
    (
        Route::BackupRestoreScheduled,
        "/admin/backup/restore-scheduled",
    ),
    (Route::Log, "/admin/log"),
    (Route::LogDownload, "/admin/log/download"),
    (Route::LogTimezone, "/admin/log/timezone"),
    (Route::Update, "/admin/update"),
    (Route::UpdateUpload, "/admin/update/upload"),
    (Route::UpdateCheck, "/admin/update/check"),
    (Route::UpdateInstall, "/admin/update/install"),
    (Route::UpdateSource, "/admin/update/source"),
    (Route::UpdateDismiss, "/admin/update/dismiss"),
    (Route::Entry, "/admin"),
];

impl Route {
    /// The route a request's path (without its query) names; `None` for one nobody serves.
    pub(super) fn parse(path: &str) -> Option<Route> {
        if path == "/" {
            return Some(Route::Entry);
        }
        if let Some((route, _)) = FIXED.iter().find(|(_, p)| *p == path) {
            return Some(route.clone());
        }
        if let Some(name) = path.strip_prefix(JOB_PREFIX) {
            return Kind::from_name(name).map(Route::Job);
        }
        if let Some(name) = path.strip_prefix(POWER_PREFIX) {
            return Power::from_name(name).map(Route::Power);
        }
        let (name, from) = path.strip_prefix(RESTARTING_PREFIX)?.split_once('/')?;
        let what = match name {
            RESTORE => Waiting::Restore,
            _ => Waiting::Power(Power::from_name(name)?),
        };
        Some(Route::Restarting {
            what,
            from: from.to_owned(),
        })
    }

    /// Its path, as links, form actions and redirects give it.
    pub(super) fn path(&self) -> Cow<'static, str> {
        match self {
            Route::Job(kind) => format!("{JOB_PREFIX}{}", kind.name()).into(),
            Route::Power(p) => format!("{POWER_PREFIX}{}", p.name()).into(),
            Route::Restarting { what, from } => {
                let name = match what {
                    Waiting::Power(p) => p.name(),
                    Waiting::Restore => RESTORE,
                };
                format!("{RESTARTING_PREFIX}{name}/{from}").into()
            }
            fixed => fixed.static_path().unwrap_or(PREFIX).into(),
        }
    }

    /// The path of a route that has no parameter (a link kept in a `&'static str`).
    pub(super) fn static_path(&self) -> Option<&'static str> {
        FIXED.iter().find(|(r, _)| r == self).map(|(_, p)| *p)
    }

    /// The page a form belongs to: where its answer leads, and where a refusal of it is said.
    pub(super) fn section(&self) -> Option<Route> {
        Some(match self {
            Route::Passphrase => Route::Owner,
            Route::DevicesPair | Route::DevicesRename | Route::DevicesRevoke => Route::Devices,
            Route::Agent | Route::AgentTest => Route::Agent,
            Route::Transcription | Route::TranscriptionTest => Route::Agent,
            Route::Speech | Route::SpeechTest => Route::Agent,
            Route::Push | Route::PushTest => Route::Push,
            _ => return None,
        })
    }

    /// Asks for a transfer that may outlast the request deadline (`transfer.rs`).
    pub(super) fn is_transfer(&self) -> bool {
        matches!(
            self,
            Route::BackupDownload | Route::BackupRestore | Route::UpdateUpload
        )
    }
}

/// A route prints as its path (plain characters: no escaping needed in an attribute).
impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}

/// The restarting page's name for a restore.
const RESTORE: &str = "restore";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_parses_back_from_its_path() {
        let mut all: Vec<Route> = FIXED.iter().map(|(r, _)| r.clone()).collect();
        all.extend(KINDS.map(Route::Job));
        all.extend([Power::Restart, Power::Reboot, Power::Poweroff].map(Route::Power));
        all.push(Route::Restarting {
            what: Waiting::Restore,
            from: "abc".into(),
        });
        all.push(Route::Restarting {
            what: Waiting::Power(Power::Reboot),
            from: "abc".into(),
        });
        for route in all {
            assert_eq!(Route::parse(&route.path()), Some(route.clone()), "{route}");
        }
        assert_eq!(Route::parse("/"), Some(Route::Entry));
    }

    #[test]
    fn an_address_nobody_serves_is_no_route() {
        for path in [
            "/admin/nothing",
            "/admin/job/other",
            "/admin/power/",
            "/admin/power/explode",
            "/admin/restarting/restore",
            "/admin/restarting/explode/abc",
            "/admin/devices/",
            "/elsewhere",
        ] {
            assert_eq!(Route::parse(path), None, "{path}");
        }
    }
}
