//! The blink patterns: pure functions of (state, time since the pattern started).
//!
//! Each pattern is a table of `(on_ms, off_ms)` steps played in order and repeated. A step with
//! `off_ms == 0` (or `on_ms == 0`) is a pattern that never changes level, so it has no edges and
//! the blinker never wakes for it.

use std::time::Duration;

use super::BoardState;

/// One step of a pattern: the LED is on for `on_ms`, then off for `off_ms`.
pub type Step = (u32, u32);

/// `Starting`: slow blink, 500 ms on, 500 ms off (1 Hz).
pub const STARTING: &[Step] = &[(500, 500)];
/// `Online`: steady on.
pub const ONLINE: &[Step] = &[(1000, 0)];
/// `Degraded`: double blink, 150 on, 150 off, 150 on, 1050 off (a 1.5 s period).
pub const DEGRADED: &[Step] = &[(150, 150), (150, 1050)];
/// `Restarting`: fast blink, 100 ms on, 100 ms off (5 Hz).
pub const RESTARTING: &[Step] = &[(100, 100)];
/// `Stopped`: off.
pub const STOPPED: &[Step] = &[(0, 1000)];

/// The step table a state plays.
pub fn steps(state: BoardState) -> &'static [Step] {
    match state {
        BoardState::Starting => STARTING,
        BoardState::Online => ONLINE,
        BoardState::Degraded => DEGRADED,
        BoardState::Restarting => RESTARTING,
        BoardState::Stopped => STOPPED,
    }
}

/// The pattern's phases as (level, duration), skipping empty ones.
fn phases(steps: &'static [Step]) -> impl Iterator<Item = (bool, u128)> + Clone {
    steps
        .iter()
        .flat_map(|&(on, off)| [(true, u128::from(on)), (false, u128::from(off))])
        .filter(|&(_, ms)| ms > 0)
        .map(|(level, ms)| (level, ms * 1_000_000))
}

fn period_ns(steps: &'static [Step]) -> u128 {
    phases(steps).map(|(_, ns)| ns).sum()
}

/// The level the pattern of `state` shows `elapsed` after it started (`true` = LED on).
pub fn level_at(state: BoardState, elapsed: Duration) -> bool {
    let steps = steps(state);
    let period = period_ns(steps);
    if period == 0 {
        return false;
    }
    let mut t = elapsed.as_nanos() % period;
    for (level, ns) in phases(steps) {
        if t < ns {
            return level;
        }
        t -= ns;
    }
    unreachable!("t is below the period")
}

/// When (measured from the pattern's start) the level next changes strictly after `elapsed`;
/// `None` for a pattern that never changes (`Online`, `Stopped`).
pub fn next_edge(state: BoardState, elapsed: Duration) -> Option<Duration> {
    let steps = steps(state);
    let mut levels = phases(steps).map(|(level, _)| level);
    let first = levels.next()?;
    if levels.all(|level| level == first) {
        return None;
    }
    let period = period_ns(steps);
    let now = elapsed.as_nanos();
    let base = now - now % period;
    let current = level_at(state, elapsed);
    // Walk phase starts over this period and the next: the first start after `now` whose level
    // differs from the current one is the edge. The next period starts after `now` and holds
    // both levels, so the walk always finds one.
    let mut start = base;
    for (level, ns) in phases(steps).chain(phases(steps)) {
        if start > now && level != current {
            return Some(nanos(start));
        }
        start += ns;
    }
    None
}

fn nanos(ns: u128) -> Duration {
    Duration::new((ns / 1_000_000_000) as u64, (ns % 1_000_000_000) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn levels_follow_the_tables() {
        use BoardState::*;
        assert!(level_at(Starting, ms(0)));
        assert!(level_at(Starting, ms(499)));
        assert!(!level_at(Starting, ms(500)));
        assert!(level_at(Starting, ms(1000)));
        assert!(level_at(Online, ms(0)));
        assert!(level_at(Online, ms(123_456)));
        assert!(!level_at(Stopped, ms(0)));
        assert!(!level_at(Stopped, ms(777)));
        let degraded: Vec<bool> = [0, 149, 150, 299, 300, 449, 450, 1499, 1500]
            .iter()
            .map(|&t| level_at(Degraded, ms(t)))
            .collect();
        assert_eq!(
            degraded,
            [true, true, false, false, true, true, false, false, true]
        );
        assert!(level_at(Restarting, ms(99)));
        assert!(!level_at(Restarting, ms(100)));
    }

    #[test]
    fn edges_are_where_the_level_changes() {
        use BoardState::*;
        assert_eq!(next_edge(Online, ms(5)), None);
        assert_eq!(next_edge(Stopped, ms(5)), None);
        assert_eq!(next_edge(Starting, ms(0)), Some(ms(500)));
        assert_eq!(next_edge(Starting, ms(500)), Some(ms(1000)));
        assert_eq!(next_edge(Starting, ms(999)), Some(ms(1000)));
        assert_eq!(next_edge(Degraded, ms(300)), Some(ms(450)));
        assert_eq!(next_edge(Degraded, ms(450)), Some(ms(1500)));
        assert_eq!(next_edge(Degraded, ms(1499)), Some(ms(1500)));
        assert_eq!(next_edge(Restarting, ms(1234)), Some(ms(1300)));
        assert_eq!(
            next_edge(Starting, Duration::from_micros(499_999)),
            Some(ms(500))
        );
    }
}
