//! What a test reads about a process or the machine it runs on: `/proc` figures, and the
//! privileges a test needs but may not have.

/// Named `/proc/PID/status` figures (e.g. `VmRSS`, `VmHWM`, `RssAnon`) of a process, in KiB.
pub fn proc_status_kib<const N: usize>(pid: u32, names: [&str; N]) -> [u64; N] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    names.map(|name| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    })
}

/// A process's resident set and one more `/proc/PID/status` figure to judge it by (`VmHWM`
/// for a peak, `RssAnon` for the heap's share), in KiB: (VmRSS, that figure).
pub fn rss_kib(pid: u32, other: &str) -> (u64, u64) {
    let [rss, other] = proc_status_kib(pid, ["VmRSS", other]);
    (rss, other)
}

/// Why a test that needs root cannot run here, or `None` as root; `needs` says what root is
/// needed for, so a skipped test says what stayed untested.
pub fn lacks_privilege(needs: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some(format!("not running as root ({needs})"));
    }
    None
}
