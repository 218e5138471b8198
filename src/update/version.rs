//! Versions as the update rules compare them: semver, where a change of the first non-zero part
//! is a major one (`0.3` after `0.2` may break things as `2.0` after `1.9` may).

use semver::Version;

/// The test hook `IRIS_GATEWAY_VERSION` (debug builds only): the version a test build says it
/// is, so the tests can make a "newer" gateway out of the one binary they have. The release
/// binary people run always says the version it was built as.
const VERSION_ENV: &str = "IRIS_GATEWAY_VERSION";

/// The version of the running binary.
pub fn running() -> Version {
    if cfg!(debug_assertions) {
        if let Some(v) = std::env::var(VERSION_ENV)
            .ok()
            .and_then(|v| Version::parse(&v).ok())
        {
            return v;
        }
    }
    Version::parse(env!("CARGO_PKG_VERSION")).expect("Cargo.toml's version is semver")
}

/// How a bundle's version stands to the running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Newer, with the same major part: a fix or a feature.
    Minor,
    /// Newer, with another major part: may change what the owner relies on.
    Major,
    /// The running version itself.
    Same,
    /// Older: going back.
    Older,
}

/// Where `to` stands from `from`.
pub fn step(from: &Version, to: &Version) -> Step {
    use std::cmp::Ordering;
    match to.cmp_precedence(from) {
        Ordering::Less => Step::Older,
        Ordering::Equal => Step::Same,
        Ordering::Greater if major_part(from) != major_part(to) => Step::Major,
        Ordering::Greater => Step::Minor,
    }
}

/// The part whose change may break things: the major number, or for `0.y` the minor one, or
/// for `0.0.z` the patch one (semver's rule for versions before 1.0).
fn major_part(v: &Version) -> (u64, u64, u64) {
    match (v.major, v.minor) {
        (0, 0) => (0, 0, v.patch),
        (0, minor) => (0, minor, 0),
        (major, _) => (major, 0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn steps_follow_semver_with_zero_versions_breaking_on_minor() {
        assert_eq!(step(&v("1.2.3"), &v("1.2.4")), Step::Minor);
        assert_eq!(step(&v("1.2.3"), &v("1.9.0")), Step::Minor);
        assert_eq!(step(&v("1.2.3"), &v("2.0.0")), Step::Major);
        assert_eq!(step(&v("0.1.0"), &v("0.1.7")), Step::Minor);
        assert_eq!(step(&v("0.1.0"), &v("0.2.0")), Step::Major);
        assert_eq!(step(&v("0.1.0"), &v("0.1.0")), Step::Same);
        assert_eq!(step(&v("0.2.0"), &v("0.1.9")), Step::Older);
        assert_eq!(step(&v("1.0.0-rc.1"), &v("1.0.0")), Step::Minor);
        assert_eq!(step(&v("1.0.0"), &v("1.0.0-rc.1")), Step::Older);
    }
}
