//! The process's memory policy, set once at start: what the allocator and the kernel may keep.
//!
//! glibc's malloc raises its mmap threshold to the size of each large block freed (up to
//! 32 MiB), so after the first Argon2id hash (a 19 MiB block, freed at once) every later hash
//! came from a heap instead, and a heap keeps what it frees: a claim, three sign-ins and a
//! passphrase change took the release build from 13 MiB to 56-58 MiB RSS for good (blocking
//! threads each hash in their own arena, so each kept its own block). Fixing the threshold at
//! glibc's own starting value keeps the behaviour of a fresh process for ever: every block of
//! 128 KiB or more is its own mapping, unmapped when freed. Measured on the debug build's
//! test (tests/memory_return.rs): RssAnon +103 MiB after six hashes without the policy,
//! +5 MiB with it (the strength estimator's tables). Release build, 10 s after the owner's
//! work of benches/gateway.rs (claim, sign-ins, a passphrase change, a backup, a restore tried,
//! an update check): 20.1 MiB VmRSS. One arena for every thread (`M_ARENA_MAX` 1) saved
//! ~0.4 MiB more there, within the noise, for lock contention between threads: not set.
//!
//! glibc only (every target the gateway ships for is `*-linux-gnu`); elsewhere the policy is a
//! no-op, so the crate still builds.

/// Blocks at least this large are mapped on their own and given back to the system when freed:
/// glibc's default starting threshold, no longer raised by a large free.
const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Sets the policy; call once, first thing in `main`, before any thread starts.
pub fn set_policy() {
    disable_transparent_huge_pages();
    fix_mmap_threshold();
}

/// Debian's arm64 kernels enable transparent huge pages for every process, which grew this
/// gateway from ~3 MB to ~30 MB RSS (measured); opting out costs nothing at this size.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_THP_DISABLE only sets a flag on the calling process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's tunables; called before any other thread runs.
    unsafe {
        // Setting it explicitly is what turns off glibc's raising of it (and of the trim
        // threshold with it, so a heap's free top is still returned past 128 KiB).
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}
