//! Signed updates end to end with the real binary, in a scratch root (tests/common/update_root.rs:
//! its own /usr/bin, /etc and /var/lib, start and stop scripts in place of systemd): a good
//! update committed, a failing one rolled back by itself, refusals that change nothing (by the
//! gateway when staging, and by the helper, which trusts nothing the gateway decided), and the
//! trial gate that keeps devices out while a new version may still be rolled back. Devices talk
//! over a real WebSocket, every frame checked against the schema.
//!
//! One build plays every version: see the note on versions in tests/common/update_root.rs.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use common::update_root::{
    file_sha256, http_head, send_acked, shown, still_serves, upgrade_request, Acked, Root,
};
use common::Client;
use iris_gateway::update::policy::Consent;
use iris_gateway::update::{Error, Outcome};
use serde_json::{json, Value};

/// Health window of a root whose update comes up healthy (it is committed as soon as it is).
const WINDOW_GOOD: u64 = 15;
/// Health window of a root whose update never comes up: the time its rollback takes.
const WINDOW_FAILING: u64 = 5;

/// The helper's files that exist only while an update is under way.
const UNDER_WAY_FILES: [&str; 4] = [
    "journal.json",
    "previous-binary",
    "new-binary",
    "incoming.iub",
];

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Nothing of an update is left: no journal or binaries in the helper's directory, no copy
/// of the store, nothing staged.
fn assert_nothing_under_way(r: &Root) {
    for name in UNDER_WAY_FILES {
        assert!(
            !r.helper_file(name).exists(),
            "{name} is left in the helper's directory"
        );
    }
    assert!(
        !r.store_backup().exists(),
        "the store's copy is left behind"
    );
    assert!(r.nothing_staged(), "something is still staged");
}

/// The gateway is on the old version, running, and has every message it acknowledged.
async fn pair_and_talk(r: &Root, n: usize) -> (common::Paired, Vec<Acked>) {
    r.start_serving();
    let phone = r.pair("phone");
    let (mut c, _) = r.connect(&phone).await;
    let mut acked = Vec::new();
    for i in 0..n {
        acked.push(send_acked(&mut c, &format!("before the update, number {i}")).await);
    }
    c.close().await;
    (phone, acked)
}

#[tokio::test]
async fn a_good_update_is_committed_and_keeps_every_acknowledged_message() {
    let r = Root::new(WINDOW_GOOD);
    let v = r.versions.clone();
    let (phone, mut acked) = pair_and_talk(&r, 3).await;

    // A minor step (same major part), so no consent is needed: what `automatic` installs.
    let new = r.variant(&v.minor);
    let bundle = r.bundle(&new, &v.minor);
    let verified = r
        .stage(&bundle, Consent::default())
        .expect("a minor update is staged without asking");
    assert_eq!(verified.manifest.version, v.minor);
    assert_eq!(verified.signed_by, "update tests");
    let s = r.wait_serving();
    assert_eq!(s["update_under_way"], json!(v.minor), "staged: {s}");

    let out = r.apply(&[]);
    assert!(
        out.status.success(),
        "apply:\n{}\n{}",
        shown(&out),
        r.log_tail()
    );
    assert!(
        stdout(&out).contains(&format!("updated from {} to {}", v.old, v.minor)),
        "{}",
        shown(&out)
    );

    // The new version runs, is committed, and opens to devices (it looks at the journal
    // every half second, so the trial may last a moment after the helper is done).
    let s = r.wait_status("the new version, committed", |s| {
        s["version"] == json!(v.minor) && s["update_trial"] == json!(false)
    });
    assert_eq!(s["state"], "online", "{s}");
    assert_eq!(s["update_failure"], Value::Null, "{s}");
    assert_eq!(s["update_under_way"], Value::Null, "{s}");
    assert_eq!(file_sha256(&r.bin), verified.manifest.payload_sha256);
    assert_eq!(file_sha256(&r.bin), file_sha256(&new));
    assert_nothing_under_way(&r);
    let entry = r.last_entry();
    assert_eq!(
        (entry.outcome, entry.from.as_str(), entry.to.as_str()),
        (Outcome::Installed, v.old.as_str(), v.minor.as_str()),
        "{entry:?}"
    );
    assert!(r.updates().state().failure.is_none());

    still_serves(&r, &phone, &mut acked, "after the update").await;
}

#[tokio::test]
async fn a_failing_update_is_rolled_back_by_itself() {
    let r = Root::new(WINDOW_FAILING);
    let v = r.versions.clone();
    let (phone, mut acked) = pair_and_talk(&r, 3).await;
    let old_hash = file_sha256(&r.bin);
    let modes = |dir: &Path| {
        use std::os::unix::fs::PermissionsExt;
        ["db", "history"].map(|d| {
            std::fs::metadata(dir.join(d))
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0)
        })
    };
    // As the service's UMask=0077 makes them (this test process's umask may be looser).
    for d in ["db", "history"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(r.data_dir.join(d), std::fs::Permissions::from_mode(0o700))
            .unwrap();
    }
    let modes_before = modes(&r.data_dir);
    assert_eq!(modes_before, [0o700, 0o700]);

    // A real program for this architecture that exits at once: it never answers healthy.
    let bundle = r.bundle(Path::new("/bin/false"), &v.minor);
    r.stage(&bundle, Consent::default())
        .expect("the bundle itself is fine");
    let out = r.apply(&[]);
    assert!(
        out.status.success(),
        "apply:\n{}\n{}",
        shown(&out),
        r.log_tail()
    );
    let summary = format!("update to {} failed, rolled back: ", v.minor);
    assert!(stdout(&out).contains(&summary), "{}", shown(&out));

    let entry = r.last_entry();
    assert_eq!(
        (entry.outcome, entry.from.as_str(), entry.to.as_str()),
        (Outcome::RolledBack, v.old.as_str(), v.minor.as_str()),
        "{entry:?}"
    );
    let reason = entry.reason.clone().unwrap_or_default();
    let waited: u64 = reason
        .strip_prefix(&format!("{} was not healthy within ", v.minor))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the reason does not say how long it waited: {reason}"));
    assert!(
        (WINDOW_FAILING..WINDOW_FAILING + 30).contains(&waited),
        "waited {waited} s for a window of {WINDOW_FAILING} s: {reason}"
    );
    assert_eq!(file_sha256(&r.bin), old_hash, "the old binary is back");
    assert_eq!(
        modes(&r.data_dir),
        modes_before,
        "the store's directories keep their modes through the copy and back"
    );
    assert_nothing_under_way(&r);

    // The old version runs again, degraded by the rolled-back update until it is dismissed.
    let s = r.wait_status("the old version back", |s| s["version"] == json!(v.old));
    assert_eq!(s["update_failure"], json!(entry.summary()), "{s}");
    assert!(entry.summary().starts_with(&summary), "{}", entry.summary());
    assert_eq!(s["state"], "degraded", "{s}");
    assert!(
        s["causes"]
            .as_array()
            .unwrap()
            .contains(&json!(entry.summary())),
        "{s}"
    );
    assert_eq!(s["update_trial"], json!(false), "{s}");

    still_serves(&r, &phone, &mut acked, "after the rollback").await;
}

/// A copy of `bundle` with the byte at `at` changed.
fn tampered(bundle: &Path, at: usize, name: &str) -> std::path::PathBuf {
    let mut bytes = std::fs::read(bundle).unwrap();
    bytes[at] ^= 0x01;
    let path = bundle.with_file_name(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A 64-byte ELF header for another architecture than this box's: (its name, the file).
fn foreign_elf(r: &Root) -> (&'static str, std::path::PathBuf) {
    let (arch, machine) = if std::env::consts::ARCH == "aarch64" {
        ("x86_64", 62u16)
    } else {
        ("aarch64", 183u16)
    };
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(b"\x7fELF");
    header[4] = 2; // 64-bit
    header[5] = 1; // little-endian
    header[6] = 1; // ELF version
    header[16] = 2; // an executable
    header[18..20].copy_from_slice(&machine.to_le_bytes());
    let path = r.root.join("build").join(format!("fake-{arch}"));
    std::fs::write(&path, header).unwrap();
    (arch, path)
}

#[tokio::test]
async fn refused_bundles_change_nothing_whoever_checks_them() {
    let r = Root::new(WINDOW_FAILING);
    let v = r.versions.clone();
    let old_hash = file_sha256(&r.bin);
    let good = r.bundle(&r.variant(&v.minor), &v.minor);

    // Bad signatures: a payload byte changed, a manifest byte changed, an untrusted signer.
    let payload_flipped = tampered(
        &good,
        std::fs::metadata(&good).unwrap().len() as usize - 100,
        "payload-flipped.iub",
    );
    let bytes = std::fs::read(&good).unwrap();
    let notes_at = bytes
        .windows(10)
        .position(|w| w == b"test build")
        .expect("the notes in the manifest");
    let manifest_flipped = tampered(&good, notes_at, "manifest-flipped.iub");
    let untrusted = r.untrusted_bundle(&v.minor);
    // Architecture: a binary for another one, and this one's binary labelled as another.
    let (foreign, fake) = foreign_elf(&r);
    let foreign_bundle = r.bundle_with(&fake, &v.minor, foreign, &r.key, "foreign.iub");
    let mislabelled = r.bundle_with(&r.old_bin, &v.minor, foreign, &r.key, "mislabelled.iub");
    // Versions: the running one, an older one, a major step.
    let same = r.bundle(&r.old_bin, &v.old);
    let older = r.bundle(&r.variant(&v.older), &v.older);
    let major = r.bundle(&r.variant(&v.major), &v.major);

    type Kind = fn(&Error) -> bool;
    let bad_signature: Kind = |e| matches!(e, Error::BadSignature(_));
    let bad_bundle: Kind = |e| matches!(e, Error::Bundle(_));
    let refused: Kind = |e| matches!(e, Error::Refused(_));
    let cases: [(&str, &Path, Kind, &str); 8] = [
        (
            "payload changed",
            &payload_flipped,
            bad_signature,
            "bad signature: the binary does not match the signed manifest",
        ),
        (
            "manifest changed",
            &manifest_flipped,
            bad_signature,
            "bad signature: the signature does not match the bundle: it was changed after signing",
        ),
        (
            "untrusted key",
            &untrusted,
            bad_signature,
            "bad signature: signed by a key this gateway does not trust",
        ),
        (
            "wrong architecture",
            &foreign_bundle,
            refused,
            &format!(
                "wrong architecture: the bundle is for {foreign}, this box is {}",
                std::env::consts::ARCH
            ),
        ),
        (
            "mislabelled architecture",
            &mislabelled,
            bad_bundle,
            &format!(
                "the manifest says {foreign} but the binary is {}",
                std::env::consts::ARCH
            ),
        ),
        (
            "same version",
            &same,
            refused,
            &format!("version {} is the one running", v.old),
        ),
        (
            "downgrade without consent",
            &older,
            refused,
            &format!("downgrade: {} is older than the running {}", v.older, v.old),
        ),
        (
            "major without consent",
            &major,
            refused,
            &format!("major version: {} may change what {}", v.major, v.old),
        ),
    ];
    for (what, bundle, kind, words) in cases {
        let e = r
            .stage(bundle, Consent::default())
            .err()
            .unwrap_or_else(|| panic!("{what}: staged"));
        assert!(kind(&e), "{what}: {e:?}");
        assert!(
            e.to_string().contains(words),
            "{what}: {e}\n(expected it to say: {words})"
        );
        assert!(r.nothing_staged(), "{what}: something is staged");
        assert!(
            !r.stage_dir().join("upload.part").exists(),
            "{what}: the upload is left"
        );
        assert_eq!(file_sha256(&r.bin), old_hash, "{what}: the binary changed");
        assert!(!r.journal_exists(), "{what}: a journal appeared");
    }
    assert!(r.history().is_empty(), "{:?}", r.history());

    // With the owner's consent the older and the major version are staged.
    for (what, bundle, consent, to) in [
        (
            "downgrade",
            &older,
            Consent {
                downgrade: true,
                major: false,
            },
            &v.older,
        ),
        (
            "major",
            &major,
            Consent {
                downgrade: false,
                major: true,
            },
            &v.major,
        ),
    ] {
        let verified = r
            .stage(bundle, consent)
            .unwrap_or_else(|e| panic!("{what} with consent: {e}"));
        assert_eq!(&verified.manifest.version, to);
        let request: Value = serde_json::from_slice(
            &std::fs::read(r.stage_dir().join("staged.json")).expect("staged.json"),
        )
        .unwrap();
        assert_eq!(request["to"], json!(to), "{request}");
        assert_eq!(
            request["consent"],
            json!({ "downgrade": consent.downgrade, "major": consent.major }),
            "{request}"
        );
        assert_eq!(
            std::fs::read(r.stage_dir().join("staged.iub")).unwrap(),
            std::fs::read(bundle).unwrap()
        );
        for name in ["staged.json", "staged.iub"] {
            std::fs::remove_file(r.stage_dir().join(name)).unwrap();
        }
    }

    // The helper checks again whatever is staged, as if the gateway had been fooled: a bundle
    // changed after the gateway's check, and a downgrade staged without consent.
    r.start_serving();
    let pid = r.gateway_pid().expect("the gateway runs");
    for (what, bundle, words) in [
        (
            "changed after staging",
            &payload_flipped,
            "bad signature: the binary does not match the signed manifest".to_owned(),
        ),
        (
            "downgrade staged without consent",
            &older,
            format!("downgrade: {} is older than the running {}", v.older, v.old),
        ),
    ] {
        let to = if what.starts_with("downgrade") {
            &v.older
        } else {
            &v.minor
        };
        std::fs::copy(bundle, r.stage_dir().join("staged.iub")).unwrap();
        std::fs::write(
            r.stage_dir().join("staged.json"),
            json!({ "to": to, "consent": {}, "staged_at": 0 }).to_string(),
        )
        .unwrap();
        let out = r.apply(&[]);
        assert!(out.status.success(), "{what}:\n{}", shown(&out));
        assert!(
            stdout(&out).contains(&format!("update to {to} refused: ")),
            "{what}:\n{}",
            shown(&out)
        );
        let entry = r.last_entry();
        assert_eq!(entry.outcome, Outcome::Refused, "{what}: {entry:?}");
        assert_eq!(
            (entry.from.as_str(), entry.to.as_str()),
            (v.old.as_str(), to.as_str())
        );
        let reason = entry.reason.clone().unwrap_or_default();
        assert!(reason.contains(&words), "{what}: {reason}");
        assert_nothing_under_way(&r);
        assert_eq!(file_sha256(&r.bin), old_hash, "{what}: the binary changed");
        assert_eq!(
            r.gateway_pid(),
            Some(pid),
            "{what}: the gateway was stopped or restarted\n{}",
            r.log_tail()
        );
        let s = r.wait_serving();
        assert_eq!(s["version"], json!(v.old), "{s}");
        // A refusal changed nothing: it is history, not a failure to show.
        assert_eq!(s["state"], "online", "{what}: {s}");
        assert_eq!(s["update_failure"], Value::Null, "{what}: {s}");
    }
    assert_eq!(r.history().len(), 2, "{:?}", r.history());
}

#[tokio::test]
async fn a_version_on_trial_keeps_devices_out_and_a_power_cut_rolls_it_back() {
    let r = Root::new(WINDOW_GOOD);
    let v = r.versions.clone();
    let (phone, mut acked) = pair_and_talk(&r, 2).await;
    let old_hash = file_sha256(&r.bin);

    let bundle = r.bundle(&r.variant(&v.minor), &v.minor);
    r.stage(&bundle, Consent::default()).expect("staged");
    // The helper dies right after starting the new version: it stays on trial.
    let out = r.apply(&[("IRIS_GATEWAY_KILL_AT", "update-trial")]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "apply was not killed at update-trial:\n{}",
        shown(&out)
    );
    let s = r.wait_status("the new version on trial", |s| {
        s["version"] == json!(v.minor) && s["update_trial"] == json!(true)
    });
    assert_eq!(s["update_under_way"], json!(v.minor), "{s}");

    // Devices and webhooks are told to come back later; nothing is acknowledged meanwhile.
    let (code, headers) = http_head(&r.url, &upgrade_request(&r.url)).await;
    assert_eq!(code, 503, "{headers:?}");
    let retry = headers
        .iter()
        .find(|(k, _)| k == "retry-after")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no Retry-After: {headers:?}"));
    assert!(retry.parse::<u64>().is_ok_and(|s| s > 0), "{retry}");
    let refused = Client::try_open(&r.url).await.err().expect("a refusal");
    assert!(refused.contains("503"), "{refused}");
    let host = r.url.trim_start_matches("ws://");
    let (code, _) = http_head(
        &r.url,
        &format!(
            "POST /hooks/test HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: 2\r\n\r\n{{}}"
        ),
    )
    .await;
    assert_eq!(code, 503, "a webhook while on trial");

    // The power goes while the new version is on trial; the next boot puts the old one back.
    r.power_cut();
    let boot = r.boot();
    let reason = format!(
        "power lost (or the installer stopped) while {} was on trial",
        v.minor
    );
    assert!(
        stdout(&boot).contains(&format!(
            "update to {} failed, rolled back: {reason}",
            v.minor
        )),
        "{}",
        shown(&boot)
    );
    let entry = r.last_entry();
    assert_eq!(
        (entry.outcome, entry.reason.as_deref()),
        (Outcome::RolledBack, Some(reason.as_str())),
        "{entry:?}"
    );
    assert_eq!(file_sha256(&r.bin), old_hash, "the old binary is back");
    assert_nothing_under_way(&r);
    let s = r.wait_status("the old version back", |s| s["version"] == json!(v.old));
    assert_eq!(s["update_failure"], json!(entry.summary()), "{s}");
    assert_eq!(s["state"], "degraded", "{s}");
    assert_eq!(s["update_trial"], json!(false), "{s}");

    still_serves(&r, &phone, &mut acked, "after the power cut").await;
}
