//! The checked-in data-dir fixtures of earlier on-disk layouts (`tests/fixtures/layoutN`): a
//! `data.tar.gz` of the data dir and the `expected.json` a gateway must find in it.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The fixture of a store written by layout `layout`'s release (1: everything in sled; 2:
/// history in SQLite, commits as sled transactions).
pub fn fixture_dir(layout: u64) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/layout{layout}"))
}

/// What the fixture of `layout` holds (its `expected.json`).
pub fn expected(layout: u64) -> Value {
    let text = std::fs::read_to_string(fixture_dir(layout).join("expected.json")).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// Unpacks the data dir of the fixture of `layout` into `into` (created if need be).
pub fn unpack_fixture(into: &Path, layout: u64) {
    std::fs::create_dir_all(into).unwrap();
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(fixture_dir(layout).join("data.tar.gz"))
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success(), "unpacking the fixture failed");
}
