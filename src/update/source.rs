//! Where newer versions are found: the release index at `[update] url` (JSON), and the bundle
//! it names for this architecture. Both are fetched on a blocking thread, bounded in size and
//! time; nothing fetched is trusted before the bundle's signature is checked.
//!
//! ```json
//! {"version": "0.2.0", "notes": "…", "bundles": {"aarch64": "iris-gateway_0.2.0_aarch64.iub"}}
//! ```
//!
//! A bundle's address may be relative to the index's.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bundle::MAX_BUNDLE;
use super::policy::this_arch;
use super::version::{self, Step};
use super::Error;

/// Largest release index read.
pub const MAX_INDEX: u64 = 64 * 1024;
const INDEX_TIMEOUT: Duration = Duration::from_secs(20);
/// A bundle over a slow link: 64 MiB at 100 kB/s is about 11 minutes.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    version: String,
    #[serde(default)]
    notes: String,
    #[serde(default)]
    bundles: BTreeMap<String, String>,
}

/// What the index offers this box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    pub version: String,
    pub notes: String,
    /// How it steps from the running version.
    pub step: Step,
    /// The bundle for this architecture; `None` when the index has none for it.
    pub bundle_url: Option<String>,
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_global(Some(timeout))
        .tls_config(crate::http_client::system_tls())
        .user_agent(concat!("iris-gateway/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// Reads the index at `url`. Blocking.
pub fn check(url: &str) -> Result<Available, Error> {
    let fail = |why: String| Error::Refused(format!("cannot check {url}: {why}"));
    let resp = agent(INDEX_TIMEOUT)
        .get(url)
        .call()
        .map_err(|e| fail(e.to_string()))?;
    if resp.status() != 200 {
        return Err(fail(format!("HTTP {}", resp.status())));
    }
    let mut text = Vec::new();
    resp.into_body()
        .into_reader()
        .take(MAX_INDEX + 1)
        .read_to_end(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > MAX_INDEX {
        return Err(fail(format!("the index is larger than {MAX_INDEX} bytes")));
    }
    let index: Index =
        serde_json::from_slice(&text).map_err(|e| fail(format!("not a release index: {e}")))?;
    let v = semver::Version::parse(&index.version)
        .map_err(|e| fail(format!("its version does not parse: {e}")))?;
    Ok(Available {
        step: version::step(&version::running(), &v),
        version: index.version,
        notes: index.notes,
        bundle_url: index.bundles.get(this_arch()).map(|b| resolve(url, b)),
    })
}

/// Downloads `url` to `to`, refusing anything larger than a bundle. Blocking. On any failure
/// `to` is removed: a download cut half-way leaves nothing behind.
pub fn download(url: &str, to: &Path) -> Result<u64, Error> {
    let result = download_into(url, to);
    if result.is_err() {
        let _ = std::fs::remove_file(to);
    }
    result
}

fn download_into(url: &str, to: &Path) -> Result<u64, Error> {
    let fail = |why: String| Error::Refused(format!("cannot download {url}: {why}"));
    let resp = agent(DOWNLOAD_TIMEOUT)
        .get(url)
        .call()
        .map_err(|e| fail(e.to_string()))?;
    if resp.status() != 200 {
        return Err(fail(format!("HTTP {}", resp.status())));
    }
    let mut file = std::fs::File::create(to).map_err(|e| Error::io("creating", to, e))?;
    let n = std::io::copy(
        &mut resp.into_body().into_reader().take(MAX_BUNDLE + 1),
        &mut file,
    )
    .map_err(|e| fail(format!("the download broke off: {e}")))?;
    if n > MAX_BUNDLE {
        return Err(fail("larger than any bundle".into()));
    }
    file.flush()
        .and_then(|_| file.sync_all())
        .map_err(|e| Error::io("writing", to, e))?;
    Ok(n)
}

/// A bundle's address, relative to the index's or whole.
fn resolve(index: &str, bundle: &str) -> String {
    if bundle.contains("://") {
        return bundle.to_owned();
    }
    match index.rfind('/') {
        Some(i) => format!("{}/{}", &index[..i], bundle.trim_start_matches('/')),
        None => bundle.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bundle_addresses_resolve_against_the_index() {
        let i = "https://example.org/iris/index.json";
        assert_eq!(super::resolve(i, "b.iub"), "https://example.org/iris/b.iub");
        assert_eq!(super::resolve(i, "http://lan/b.iub"), "http://lan/b.iub");
    }
}
