//! The outbox's promise as the tests check it: a replay's cursors are every integer of a range,
//! in order, with no gaps.

/// `None` when `cursors` are exactly `first..=last`; otherwise what is wrong, with where the
/// run breaks (for tests that collect failures instead of panicking).
pub fn contiguity_breaks(cursors: &[u64], first: u64, last: u64) -> Option<String> {
    if cursors.iter().copied().eq(first..=last) {
        return None;
    }
    let breaks: Vec<&[u64]> = cursors.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    Some(format!(
        "expected cursors {first}..={last} with no gaps, got {} from {:?} to {:?}, breaking at {breaks:?}",
        cursors.len(),
        cursors.first(),
        cursors.last(),
    ))
}

/// Asserts `cursors` are exactly `first..=last`; `what` names the replay (and may carry the
/// frames, for the failure message).
#[track_caller]
pub fn assert_contiguous(cursors: &[u64], first: u64, last: u64, what: &str) {
    if let Some(why) = contiguity_breaks(cursors, first, last) {
        panic!("{why}: {what}");
    }
}
