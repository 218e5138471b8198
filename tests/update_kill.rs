//! A power cut at every step of an update: the helper is killed (SIGKILL, the debug builds'
//! `IRIS_GATEWAY_KILL_AT` hook) at each of `iris_gateway::update::KILL_POINTS`, the gateway dies
//! with it, and the next boot (`update recover` from the helper's copy of the previous binary,
//! or the installed one, then the gateway's start) must leave exactly one working version:
//! the old one or the new one, never neither, with every message it acknowledged, nothing of
//! the update left behind, and a history that says what happened.
//!
//! The points are taken from the constant, so a new one is covered as soon as it exists. Each
//! runs in a fresh scratch root (tests/common/update_root.rs, which also explains how one build
//! plays both versions).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::update_root::{file_sha256, send_acked, shown, still_serves, Root};
use iris_gateway::update::policy::Consent;
use iris_gateway::update::{Outcome, KILL_POINTS};
use serde_json::{json, Value};

/// The points only a failing update reaches: there the new version is `/bin/false`, which
/// never answers healthy. A new point on the rollback path belongs here.
const ON_ROLLBACK: &[&str] = &["update-rolling-back", "update-restored"];
/// The health window: short, since a failing update waits all of it before its rollback.
const WINDOW_SECS: u64 = 4;

/// How the history must end after a cut at `point`, for the points known when this was written
/// (a new point is held to the general rules only).
fn expected_outcome(point: &str) -> Option<Outcome> {
    match point {
        "update-copied" | "update-prepared" | "update-stopped" | "update-backed-up" => {
            Some(Outcome::Interrupted)
        }
        "update-switched" | "update-trial" | "update-rolling-back" | "update-restored" => {
            Some(Outcome::RolledBack)
        }
        "update-committing" => Some(Outcome::Installed),
        _ => None,
    }
}

#[tokio::test]
async fn a_power_cut_at_every_step_of_an_update_leaves_one_working_version() {
    assert!(!KILL_POINTS.is_empty());
    for point in ON_ROLLBACK {
        assert!(KILL_POINTS.contains(point), "{point} is not a kill point");
    }
    let all = Instant::now();
    for point in KILL_POINTS {
        let one = Instant::now();
        cut_at(point).await;
        eprintln!("{point}: recovered ({:.1} s)", one.elapsed().as_secs_f64());
    }
    eprintln!(
        "{} kill points in {:.1} s",
        KILL_POINTS.len(),
        all.elapsed().as_secs_f64()
    );
}

async fn cut_at(point: &str) {
    let r = Root::new(WINDOW_SECS);
    let v = r.versions.clone();
    let old_hash = file_sha256(&r.bin);

    r.start_serving();
    let phone = r.pair("phone");
    let (mut c, _) = r.connect(&phone).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(send_acked(&mut c, &format!("before a cut at {point}, number {i}")).await);
    }
    c.close().await;

    let fails = ON_ROLLBACK.contains(&point);
    let payload: PathBuf = if fails {
        Path::new("/bin/false").to_owned()
    } else {
        r.variant(&v.minor)
    };
    let new_hash = file_sha256(&payload);
    let bundle = r.bundle(&payload, &v.minor);
    r.stage(&bundle, Consent::default())
        .unwrap_or_else(|e| panic!("{point}: staging: {e}"));

    let out = r.apply(&[("IRIS_GATEWAY_KILL_AT", point)]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{point}: the helper was not killed there (a point on the rollback path belongs in \
         ON_ROLLBACK):\n{}\n{}",
        shown(&out),
        r.log_tail()
    );
    // The power cut takes the gateway too, whichever version was running.
    r.power_cut();

    let boot = r.boot();
    let s = r.wait_serving();
    let version = s["version"].as_str().unwrap_or("").to_owned();
    let hash = file_sha256(&r.bin);
    let context = format!(
        "{point}: version {version}\nstatus: {s}\nrecover:\n{}\n{}",
        shown(&boot),
        r.log_tail()
    );
    assert!(
        (version == v.old && hash == old_hash)
            || (!fails && version == v.minor && hash == new_hash),
        "neither the old version nor the new one runs from the installed binary\n{context}"
    );

    // Nothing of the update is left behind.
    assert!(!r.journal_exists(), "a journal is left\n{context}");
    for name in ["previous-binary", "new-binary", "incoming.iub"] {
        assert!(!r.helper_file(name).exists(), "{name} is left\n{context}");
    }
    assert!(
        !r.store_backup().exists(),
        "the store's copy is left\n{context}"
    );
    assert!(r.nothing_staged(), "something is still staged\n{context}");
    assert_eq!(s["update_under_way"], Value::Null, "{context}");
    assert_eq!(s["update_trial"], json!(false), "{context}");

    // The history says what happened, and agrees with the version that runs.
    let history = r.history();
    assert_eq!(history.len(), 1, "{history:?}\n{context}");
    let entry = &history[0];
    assert_eq!(
        (entry.from.as_str(), entry.to.as_str()),
        (v.old.as_str(), v.minor.as_str()),
        "{entry:?}\n{context}"
    );
    match entry.outcome {
        Outcome::Installed => assert_eq!(version, v.minor, "{entry:?}\n{context}"),
        Outcome::Interrupted | Outcome::RolledBack => {
            assert_eq!(version, v.old, "{entry:?}\n{context}")
        }
        Outcome::Refused => panic!("a staged, good bundle was refused: {entry:?}\n{context}"),
    }
    if let Some(expected) = expected_outcome(point) {
        assert_eq!(entry.outcome, expected, "{entry:?}\n{context}");
    }
    // The boot's recovery said what it did.
    assert!(
        String::from_utf8_lossy(&boot.stdout).contains(&entry.summary()),
        "{entry:?}\n{context}"
    );
    let reason = entry.reason.as_deref().unwrap_or("");
    if entry.outcome == Outcome::RolledBack {
        let why = if fails {
            format!("{} was not healthy within ", v.minor)
        } else {
            format!(
                "power lost (or the installer stopped) while {} was on trial",
                v.minor
            )
        };
        assert!(reason.contains(&why), "{reason}\n{context}");
        // A rollback is shown until dismissed; anything else is not a failure.
        assert_eq!(s["update_failure"], json!(entry.summary()), "{context}");
        assert_eq!(s["state"], "degraded", "{context}");
    } else {
        assert_eq!(s["update_failure"], Value::Null, "{context}");
    }

    // The device is served, and finds every message the gateway acknowledged before the cut.
    still_serves(&r, &phone, &mut acked, &format!("after a cut at {point}")).await;
}
