//! The Backup page's scheduled backups (`crate::backups`): the list with sizes and ages, the
//! schedule and folder, the backup passphrase, "Back up now", and restoring one of them.
//!
//! Each form answers with a redirect to the page (a `?done=` note says what was done), so a
//! reload repeats nothing. "Back up now" and a restore are jobs (`jobs.rs`): each answers with
//! its job's page, which follows it (a restore that succeeded: the page that waits for the
//! restart into it).

use std::rc::Rc;
use std::time::SystemTime;

use hyper::StatusCode;
use maud::{html, Markup};
use tracing::info;

use super::context::SignedIn;
use super::jobs::Kind;
use super::pages::{self, notice, Notice};
use super::reply::{redirect, signed_page, Refusal, Reply};
use super::restore_job::{restore_room, start_restore};
use super::route::Route;
use super::strength;
use super::{owner, Admin, Form};
use crate::backups::{self, sealed, Plan};
use crate::hub::Hub;
use crate::web::{csrf_field, tokens};

/// Longest folder path taken from the form.
const MAX_FOLDER_BYTES: usize = 1024;

fn plan(admin: &Admin) -> Result<Plan, Refusal> {
    Plan::load(&admin.data_dir, &admin.config.read(|c| c.limits.clone()))
        .map_err(|e| Refusal::Unavailable(e.to_string()))
}

/// `GET /admin/backup`: the download and upload (`pages::backup`), then the scheduled backups.
pub(super) async fn get(admin: &Admin, query: &str, who: &SignedIn) -> Result<Reply, Refusal> {
    let done = query
        .split('&')
        .find_map(|p| p.strip_prefix("done="))
        .and_then(|d| match d {
            "schedule" => Some("Schedule saved."),
            "passphrase" => Some("Backup passphrase set. Backups from now on open with it."),
            _ => None,
        });
    let n = done.map_or(Notice::None, Notice::Good);
    Ok(body_page(admin, StatusCode::OK, who, &n).await)
}

/// What the folder holds and what is wrong with it, read on a blocking thread: a USB stick that
/// hangs (or an NFS folder gone away) holds that thread, never the event loop and the phones.
struct FolderLook {
    problem: Option<String>,
    listed: Vec<backups::Listed>,
}

async fn look(folder: Option<std::path::PathBuf>) -> FolderLook {
    let Some(f) = folder else {
        return FolderLook {
            problem: Some("No folder is set: no backups are made.".to_owned()),
            listed: Vec::new(),
        };
    };
    tokio::task::spawn_blocking(move || FolderLook {
        problem: backups::check_folder(&f, 0).err().map(|e| e.to_string()),
        listed: backups::list(&f).unwrap_or_default(),
    })
    .await
    .unwrap_or(FolderLook {
        problem: Some("The folder could not be read.".to_owned()),
        listed: Vec::new(),
    })
}

async fn body_page(admin: &Admin, status: StatusCode, who: &SignedIn, n: &Notice<'_>) -> Reply {
    let csrf = who.csrf();
    let folder = plan(admin).ok().and_then(|p| p.folder);
    let seen = look(folder).await;
    let body = html! {
        (pages::backup(csrf, &Notice::None))
        (scheduled(admin, csrf, n, &seen))
    };
    signed_page(admin, who, status, "Backup", &Route::Backup, body)
}

/// How long ago, in words.
fn age(then: SystemTime) -> String {
    let s = SystemTime::now()
        .duration_since(then)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match s {
        s if s < 90 => format!("{s} s ago"),
        s if s < 90 * 60 => format!("{} min ago", s / 60),
        s if s < 36 * 3600 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86_400),
    }
}

/// The scheduled backups' section.
fn scheduled(admin: &Admin, csrf: &str, n: &Notice, seen: &FolderLook) -> Markup {
    let limits = admin.config.read(|c| c.limits.clone());
    let (plan, plan_error) = match plan(admin) {
        Ok(p) => (p, None),
        Err(e) => (
            Plan::from_settings(&Default::default(), &limits),
            Some(e.to_string()),
        ),
    };
    let state = &admin.backups;
    let key = sealed::key(&admin.data_dir);
    let every = match plan.every {
        None => "off",
        Some(backups::Every::Day) => "daily",
        Some(backups::Every::Week) => "weekly",
    };
    let last = state.last().map(|o| {
        let text = match &o.result {
            Ok(l) => format!(
                "Last result ({}): {} written, {}.",
                age(o.at),
                l.name,
                crate::store::human_bytes(l.bytes)
            ),
            Err(e) => format!(
                "Last result ({}): failed: {}.",
                age(o.at),
                super::words::owner_words(&e.to_string())
            ),
        };
        (if o.result.is_ok() { "good" } else { "bad" }, text)
    });
    html! {
        h2 id="scheduled" { "Scheduled backups" }
        (notice(n))
        @if let Some(e) = plan_error {
            (notice(&Notice::Bad(&e)))
        }
        // What is wrong now, in the owner's words, before anything else.
        @if let Some(problem) = &seen.problem {
            p.bad id="folder-problem" { (problem) }
        }
        @match &key {
            Ok(Some(_)) => {}
            Ok(None) => p.bad id="key-problem" {
                "No backup passphrase is set: none can be made until one is."
            },
            Err(e) => (notice(&Notice::Bad(&e.to_string()))),
        }
        p id="schedule-now" {
            "Schedule: " strong { (every) } ", keeping the newest " (plan.keep) ", "
            @match plan.folder.as_deref() {
                Some(f) => { "in " code { (tokens(&f.display().to_string())) } }
                None => "with no folder chosen",
            }
            "."
        }
        @if state.running() {
            p id="backup-running" { "A backup is being made now." }
        }
        (admin.jobs.under_way(&[Kind::Backup, Kind::Restore]))
        @match last {
            None => p id="last-result" { "Last result: none since the gateway started." },
            Some((class, text)) => p id="last-result" class=(class) { (text) },
        }
        (list_html(&seen.listed, csrf))
        (forms_html(&plan, csrf, limits.backup_keep_max))
    }
}

fn list_html(listed: &[backups::Listed], csrf: &str) -> Markup {
    if listed.is_empty() {
        return html! { p { "No scheduled backups in the folder yet." } };
    }
    html! {
        table.stack id="backups" {
            thead { tr { th { "Backup" } th { "Size" } th { "Made" } } }
            tbody {
                @for l in listed {
                    tr {
                        td.name data-label="Backup" { (tokens(&l.name)) }
                        td.size data-label="Size" { (crate::store::human_bytes(l.bytes)) }
                        td data-label="Made" { (age(l.made)) }
                    }
                }
            }
        }
        h3 { "Restore a scheduled backup" }
        p {
            "Replaces messages, channels, devices, media, the saved settings and the owner \
             passphrase with the backup's; the current store is kept aside and the gateway \
             restarts into it."
        }
        form method="post" action=(Route::BackupRestoreScheduled) {
            (csrf_field(csrf))
            label for="restore-name" { "Backup" }
            select id="restore-name" name="file" {
                @for l in listed { option { (l.name) } }
            }
            label for="restore-passphrase" { "Its backup passphrase" }
            input type="password" id="restore-passphrase" name="passphrase" autocomplete="off"
                maxlength="1024" required;
            p { button id="restore-scheduled" { "Restore it" } }
        }
    }
}

fn forms_html(plan: &Plan, csrf: &str, keep_max: u32) -> Markup {
    let csrf = csrf_field(csrf);
    let folder = plan
        .folder
        .as_deref()
        .map(|f| f.display().to_string())
        .unwrap_or_default();
    html! {
        form method="post" action=(Route::BackupNow) {
            (csrf)
            p { button id="back-up-now" { "Back up now" } }
        }
        h3 { "Schedule" }
        form method="post" action=(Route::BackupSchedule) {
            (csrf)
            label for="schedule" { "How often" }
            select id="schedule" name="schedule" {
                option value="off" selected[plan.every.is_none()] { "Off" }
                option value="daily" selected[plan.every == Some(backups::Every::Day)] { "Daily" }
                option value="weekly" selected[plan.every == Some(backups::Every::Week)] {
                    "Weekly"
                }
            }
            label for="folder" { "Folder (a USB stick: its mount point, e.g. /media/usb)" }
            input id="folder" name="folder" value=(folder) maxlength=(MAX_FOLDER_BYTES);
            label for="keep" { "How many to keep" }
            input id="keep" name="keep" type="number" min="1" max=(keep_max) value=(plan.keep);
            p { button id="save-schedule" { "Save the schedule" } }
        }
        h3 { "Backup passphrase" }
        p {
            "Scheduled backups are encrypted; only this passphrase opens them (on this box or a \
             new one). Keep it somewhere safe: it cannot be recovered. Changing it applies to \
             backups made from then on."
        }
        form method="post" action=(Route::BackupPassphrase) {
            (csrf)
            label for="backup-passphrase" { "Backup passphrase" }
            input type="password" id="backup-passphrase" name="passphrase"
                autocomplete="new-password" minlength=(owner::MIN_PASSPHRASE_CHARS)
                maxlength="1024" required;
            label for="backup-confirm" { "The same again" }
            input type="password" id="backup-confirm" name="confirm" autocomplete="new-password"
                maxlength="1024" required;
            p { button id="set-backup-passphrase" { "Set it" } }
        }
    }
}

/// The Backup page's forms for scheduled backups; `None` for any other path.
pub(super) async fn post(
    admin: &Admin,
    hub: &Rc<Hub>,
    route: &Route,
    form: &Form,
    who: &SignedIn,
) -> Option<Result<Reply, Refusal>> {
    let bad = |status, text: String| async move {
        Ok(body_page(admin, status, who, &Notice::Bad(&text)).await)
    };
    let scheduled = |done: &str| redirect(&format!("{}?done={done}#scheduled", Route::Backup));
    Some(match route {
        Route::BackupSchedule => match save_schedule(admin, form) {
            Ok(()) => Ok(scheduled("schedule")),
            Err(why) => bad(StatusCode::BAD_REQUEST, why).await,
        },
        Route::BackupPassphrase => match set_passphrase(admin, hub, form).await {
            Ok(()) => Ok(scheduled("passphrase")),
            Err(why) => bad(StatusCode::BAD_REQUEST, why).await,
        },
        Route::BackupNow => match back_up_now(admin, hub) {
            Ok(()) => Ok(redirect(&Kind::Backup.page())),
            Err(why) => bad(StatusCode::CONFLICT, why).await,
        },
        Route::BackupRestoreScheduled => match restore(admin, hub, form).await {
            Ok(reply) => Ok(reply),
            Err((status, why)) => bad(status, why).await,
        },
        _ => return None,
    })
}

fn save_schedule(admin: &Admin, form: &Form) -> Result<(), String> {
    let keep_max = admin.config.read(|c| c.limits.backup_keep_max);
    let every = match form.get("schedule") {
        "off" => None,
        "daily" => Some(backups::Every::Day),
        "weekly" => Some(backups::Every::Week),
        other => {
            return Err(format!(
                "\"{other}\" is not a schedule: off, daily or weekly."
            ))
        }
    };
    let folder = form.get("folder").trim();
    if folder.len() > MAX_FOLDER_BYTES {
        return Err(format!(
            "The folder is longer than {MAX_FOLDER_BYTES} bytes."
        ));
    }
    if !folder.is_empty() && !folder.starts_with('/') {
        return Err("The folder must be a full path, starting with /.".into());
    }
    if every.is_some() && folder.is_empty() {
        return Err("A schedule needs a folder to write to.".into());
    }
    let keep: u32 = match form.get("keep").trim().parse() {
        Ok(k) if (1..=keep_max).contains(&k) => k,
        _ => {
            return Err(format!(
                "How many to keep must be a number from 1 to {keep_max}."
            ))
        }
    };
    let plan = Plan {
        every,
        folder: (!folder.is_empty()).then(|| folder.into()),
        keep,
    };
    plan.save(&admin.data_dir).map_err(|e| e.to_string())?;
    info!(
        schedule = form.get("schedule"),
        folder, keep, "admin page: backup schedule saved"
    );
    Ok(())
}

async fn set_passphrase(admin: &Admin, hub: &Hub, form: &Form) -> Result<(), String> {
    let (pass, confirm) = (form.get("passphrase"), form.get("confirm"));
    if pass != confirm {
        return Err("The two passphrases differ; nothing was changed.".into());
    }
    // The same rule as the owner's own passphrase change.
    let rated = strength::rate_for_owner(hub, pass).await;
    if !rated.ok {
        return Err(format!("Not set: {}", lowercase_first(&rated.words)));
    }
    let _permit = admin.hashing.acquire().await.map_err(|e| e.to_string())?;
    let (dir, p) = (
        admin.data_dir.clone(),
        zeroize::Zeroizing::new(pass.to_owned()),
    );
    tokio::task::spawn_blocking(move || sealed::set_passphrase(&dir, &p))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    info!("admin page: backup passphrase set (a new backup key)");
    Ok(())
}

/// The rule's sentence inside "Not set: …" (its verdict starts with a capital).
fn lowercase_first(sentence: &str) -> String {
    let mut chars = sentence.chars();
    chars
        .next()
        .map(|c| c.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

/// "Back up now" as a job (`jobs.rs`): the page follows it, and the schedule's own backups
/// share its one-at-a-time slot (`backups::Backups`).
fn back_up_now(admin: &Admin, hub: &Rc<Hub>) -> Result<(), String> {
    let plan = plan(admin).map_err(|e| e.to_string())?;
    let Some(folder) = plan.folder.clone() else {
        return Err("Set a folder for the backups first.".into());
    };
    if admin.backups.running() {
        return Err("A scheduled backup is being made now; wait for it.".into());
    }
    let (state, hub) = (admin.backups.clone(), hub.clone());
    let what = format!("Making a backup into {}.", folder.display());
    admin
        .jobs
        .start(Kind::Backup, &what, async move {
            state
                .back_up_now(&hub, &plan)
                .await
                .map(|l| {
                    format!(
                        "{} written, {}.",
                        l.name,
                        crate::store::human_bytes(l.bytes)
                    )
                })
                .map_err(|e| super::reply::sentence(&e.to_string()))
        })
        .map_err(|busy| super::reply::sentence(&busy.to_string()))
}

/// Starts the restore of the chosen backup as a job (`jobs.rs`): the answer is a `303` to the
/// job's page at once, whatever the USB stick's speed.
async fn restore(admin: &Admin, hub: &Rc<Hub>, form: &Form) -> Result<Reply, (StatusCode, String)> {
    let bad = |why: &str| (StatusCode::BAD_REQUEST, why.to_owned());
    let name = form.get("file");
    if !backups::is_backup_name(name) {
        return Err(bad("Choose a backup from the list."));
    }
    let folder = plan(admin)
        .map_err(|e| bad(&e.to_string()))?
        .folder
        .ok_or_else(|| bad("No backup folder is set."))?;
    let file = folder.join(name);
    let size = std::fs::metadata(&file)
        .map_err(|e| {
            bad(&format!(
                "{name} cannot be read ({e}); nothing was changed."
            ))
        })?
        .len();
    let ticket = admin
        .jobs
        .begin(Kind::Restore, &format!("Opening and checking {name}."))
        .map_err(|busy| {
            (
                StatusCode::CONFLICT,
                super::reply::sentence(&busy.to_string()),
            )
        })?;
    if let Err(why) = restore_room(admin, hub, size.saturating_mul(2)) {
        ticket.finish(Err(why.clone()));
        return Err((StatusCode::CONFLICT, why));
    }
    let passphrase = zeroize::Zeroizing::new(form.get("passphrase").to_owned());
    info!("admin page: restore of scheduled backup {name} started");
    start_restore(admin, hub, ticket, file, Some(passphrase), false);
    Ok(redirect(&Kind::Restore.page()))
}
