//! Failed guesses per source address, for the two doors a secret guards: the hello gate
//! (device tokens) and the pairing page (one-time codes). See docs/security.md, "Guessing".
//!
//! Memory is bounded (a fixed table of addresses), but forgetting is never a way around the
//! limit: an address's count is dropped only once its minute is over, when it would have been
//! reset anyway. While every slot holds a live count, the addresses without one share a single
//! extra count with the same per-minute budget, so rotating through more addresses than the
//! table holds buys at most one more address's worth of guesses: whatever the attacker's
//! address space, a minute allows at most `(capacity + 1) × per_address` failures in all.
//!
//! A success never clears a count. If it did, anyone who can succeed once in a while (the
//! holder of one device's token, or anyone sharing that device's address) would earn
//! `per_address - 1` fresh guesses with each success. A success marks the address as known
//! good instead ([`KNOWN_GOOD_FOR`]): a known-good address keeps a slot of its own, so a phone
//! that got in from it is still judged by its own count while strangers who rotate addresses
//! share the overflow count and run it out.
//!
//! An attempt is counted when it begins, not when it turns out wrong ([`GuessLimiter::begin`]):
//! a door that checks its secret off the event loop (the admin passphrase, an Argon2 hash that
//! takes a second) would otherwise let every attempt sent at once pass the check before the
//! first failure was counted. Only a success gives its own attempt back
//! ([`GuessLimiter::succeeded`]), and only within the minute it was counted in; an attempt that
//! is dropped unanswered (the client went away mid-check) stays counted.
//!
//! Used from the event loop only; callers wrap it in a `RefCell`.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

/// The window every count is kept for: the limits are "per minute".
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long a success keeps an address out of the shared overflow count: long enough for the
/// phones of a household to stay known across a day of reconnects, short enough that a table
/// full of stale good addresses frees itself.
pub const KNOWN_GOOD_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// The address a per-address limit counts: IPv4 as is (also when IPv4-mapped), IPv6 by its /64,
/// since a single host on an IPv6 LAN can use any number of addresses from its /64.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Why an attempt is refused before what it presented is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// When the count that refused it ends.
    pub retry_after: Duration,
    /// The count was the one shared by addresses the table had no room for (a rotation, or a
    /// crowd), not this address's own.
    pub shared: bool,
}

#[derive(Debug, Clone, Copy)]
struct Count {
    failures: u32,
    since: Instant,
}

impl Count {
    fn new(failures: u32, now: Instant) -> Count {
        Count {
            failures,
            since: now,
        }
    }

    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) < WINDOW
    }

    fn current(&self, now: Instant) -> u32 {
        if self.live(now) {
            self.failures
        } else {
            0
        }
    }

    fn add(&mut self, now: Instant) {
        if !self.live(now) {
            *self = Count::new(0, now);
        }
        self.failures = self.failures.saturating_add(1);
    }

    fn retry_after(&self, now: Instant) -> Duration {
        WINDOW.saturating_sub(now.saturating_duration_since(self.since))
    }

    /// Gives back one attempt counted in the minute that began at `since`; a count that has
    /// started a new minute since owes nothing.
    fn give_back(&mut self, since: Instant) {
        if self.since == since {
            self.failures = self.failures.saturating_sub(1);
        }
    }
}

/// One attempt, counted as a failure from the moment it began ([`GuessLimiter::begin`]). Pass
/// it to [`GuessLimiter::succeeded`] or [`GuessLimiter::cancel`] to give it back; dropping it
/// (a wrong secret, or an attempt abandoned half-way) leaves it counted.
#[derive(Debug)]
#[must_use = "an attempt is counted as a failure unless it is given back"]
pub struct Attempt {
    key: IpAddr,
    /// Counted in the overflow count, not the address's own.
    shared: bool,
    /// Which minute of that count it was counted in.
    since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    count: Count,
    good_until: Option<Instant>,
}

impl Entry {
    fn good(&self, now: Instant) -> bool {
        self.good_until.is_some_and(|t| now < t)
    }

    /// Forgetting it now loses nothing that still counts.
    fn forgettable(&self, now: Instant) -> bool {
        self.count.current(now) == 0 && !self.good(now)
    }
}

/// Failures per address per minute, in a fixed table of `N` addresses (no allocation, so the
/// bound is the type's size).
pub struct GuessLimiter<const N: usize> {
    per_address: u32,
    entries: heapless::LinearMap<IpAddr, Entry, N>,
    /// Shared by every address that has no slot while the table is full of live entries.
    overflow: Count,
}

impl<const N: usize> GuessLimiter<N> {
    pub fn new(per_address: u32, now: Instant) -> GuessLimiter<N> {
        GuessLimiter {
            per_address,
            entries: heapless::LinearMap::new(),
            overflow: Count::new(0, now),
        }
    }

    /// Whether `ip` may try now; a refusal comes before the secret is looked at, so the answer
    /// says nothing about it.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Limited> {
        let key = address_key(ip);
        let (count, shared) = match self.entries.get(&key) {
            Some(e) => (&e.count, false),
            None if self.has_room(now) => return Ok(()),
            None => (&self.overflow, true),
        };
        if count.current(now) >= self.per_address {
            Err(Limited {
                retry_after: count.retry_after(now),
                shared,
            })
        } else {
            Ok(())
        }
    }

    /// Checks `ip` and, if it may try, counts the attempt as a failure at once, before its
    /// secret is looked at: however many attempts are in flight together, at most the limit
    /// are ever checked. The check and the count happen without an await in between.
    pub fn begin(&mut self, ip: IpAddr, now: Instant) -> Result<Attempt, Limited> {
        self.check(ip, now)?;
        let (shared, since) = self.fail(ip, now);
        Ok(Attempt {
            key: address_key(ip),
            shared,
            since,
        })
    }

    /// The attempt's secret was right: the attempt is given back (it was no guess), and the
    /// address is known good for a day. Earlier failures stay counted.
    pub fn succeeded(&mut self, attempt: Attempt, now: Instant) {
        self.give_back(&attempt);
        self.succeed(attempt.key, now);
    }

    /// The attempt never reached its secret (a bad form, the store unavailable): given back.
    pub fn cancel(&mut self, attempt: Attempt) {
        self.give_back(&attempt);
    }

    fn give_back(&mut self, attempt: &Attempt) {
        if attempt.shared {
            self.overflow.give_back(attempt.since);
        } else if let Some(e) = self.entries.get_mut(&attempt.key) {
            e.count.give_back(attempt.since);
        }
    }

    /// Counts a failed attempt from `ip`: in its own count (`false`) or the shared one
    /// (`true`), and since when that count runs.
    fn fail(&mut self, ip: IpAddr, now: Instant) -> (bool, Instant) {
        let key = address_key(ip);
        if let Some(e) = self.entries.get_mut(&key) {
            e.count.add(now);
            return (false, e.count.since);
        }
        if self.make_room(now, false) {
            let entry = Entry {
                count: Count::new(1, now),
                good_until: None,
            };
            let _ = self.entries.insert(key, entry);
            (false, now)
        } else {
            self.overflow.add(now);
            (true, self.overflow.since)
        }
    }

    /// Records a success from `ip`: its count stays, it is known good for a day.
    fn succeed(&mut self, ip: IpAddr, now: Instant) {
        let key = address_key(ip);
        let good_until = Some(now + KNOWN_GOOD_FOR);
        if let Some(e) = self.entries.get_mut(&key) {
            e.good_until = good_until;
            return;
        }
        if self.make_room(now, true) {
            let entry = Entry {
                count: Count::new(0, now),
                good_until,
            };
            let _ = self.entries.insert(key, entry);
        }
    }

    /// Addresses remembered now (at most `N`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn has_room(&self, now: Instant) -> bool {
        self.entries.len() < N || self.entries.values().any(|e| e.forgettable(now))
    }

    /// Frees a slot if one can go without losing a live count. For a success, the known-good
    /// address with the oldest success may go too (it keeps no live failures): the newest
    /// successes are the phones most likely to come back.
    fn make_room(&mut self, now: Instant, for_good: bool) -> bool {
        if self.entries.len() < N {
            return true;
        }
        let victim = self
            .entries
            .iter()
            .find(|(_, e)| e.forgettable(now))
            .map(|(ip, _)| *ip)
            .or_else(|| {
                if !for_good {
                    return None;
                }
                self.entries
                    .iter()
                    .filter(|(_, e)| e.count.current(now) == 0)
                    .min_by_key(|(_, e)| e.good_until)
                    .map(|(ip, _)| *ip)
            });
        match victim {
            Some(ip) => {
                self.entries.remove(&ip);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn an_address_is_limited_by_its_own_count_for_the_minute() {
        let t0 = Instant::now();
        let mut g = GuessLimiter::<4>::new(3, t0);
        for _ in 0..3 {
            assert_eq!(g.check(v4(1), t0), Ok(()));
            g.fail(v4(1), t0);
        }
        let limited = g.check(v4(1), t0 + Duration::from_secs(20)).unwrap_err();
        assert!(!limited.shared);
        assert_eq!(limited.retry_after, Duration::from_secs(40));
        assert_eq!(
            g.check(v4(2), t0),
            Ok(()),
            "another address is not affected"
        );
        assert_eq!(g.check(v4(1), t0 + WINDOW), Ok(()), "the minute is over");
    }

    #[test]
    fn a_success_does_not_reset_the_count() {
        let t0 = Instant::now();
        let mut g = GuessLimiter::<4>::new(5, t0);
        // 4 bad + 1 good, repeated: the second round runs out.
        for _ in 0..4 {
            g.fail(v4(1), t0);
        }
        assert_eq!(g.check(v4(1), t0), Ok(()));
        g.succeed(v4(1), t0);
        g.fail(v4(1), t0);
        assert!(g.check(v4(1), t0).is_err());
    }

    #[test]
    fn rotating_through_more_addresses_than_the_table_holds_is_still_bounded() {
        let t0 = Instant::now();
        const CAP: usize = 8;
        let (per, cap) = (2, CAP);
        let mut g = GuessLimiter::<CAP>::new(per, t0);
        let mut allowed = 0;
        for _ in 0..10 {
            for n in 0..1000 {
                let ip = v4(n);
                if g.check(ip, t0).is_ok() {
                    allowed += 1;
                    g.fail(ip, t0);
                }
            }
        }
        assert_eq!(allowed, (cap as u32 + 1) * per);
        assert!(g.len() <= cap);
        // The first addresses were never forgotten; new ones share the spent overflow.
        assert!(!g.check(v4(0), t0).unwrap_err().shared);
        assert!(g.check(v4(5000), t0).unwrap_err().shared);
        // A minute later everyone starts again, and stale slots are reused.
        let t1 = t0 + WINDOW;
        for n in 2000..2000 + cap as u32 + 1 {
            assert_eq!(g.check(v4(n), t1), Ok(()));
            g.fail(v4(n), t1);
        }
        assert!(g.len() <= cap);
    }

    #[test]
    fn a_known_good_address_keeps_its_slot_while_strangers_share_the_overflow() {
        let t0 = Instant::now();
        let mut g = GuessLimiter::<4>::new(2, t0);
        let home = v4(100);
        g.succeed(home, t0);
        for n in 0..50 {
            g.fail(v4(n), t0);
        }
        assert!(g.check(v4(999), t0).unwrap_err().shared);
        assert_eq!(g.check(home, t0), Ok(()), "home is judged by its own count");
        g.fail(home, t0);
        g.fail(home, t0);
        assert!(!g.check(home, t0).unwrap_err().shared);
        // A day later it is a stranger again, and its slot can be reused once its count ends.
        let later = t0 + KNOWN_GOOD_FOR;
        assert_eq!(g.check(v4(999), later), Ok(()));
    }

    #[test]
    fn a_new_success_replaces_the_oldest_good_address_not_a_live_count() {
        let t0 = Instant::now();
        let mut g = GuessLimiter::<2>::new(1, t0);
        g.fail(v4(1), t0);
        g.succeed(v4(2), t0);
        let t1 = t0 + Duration::from_secs(1);
        g.succeed(v4(3), t1);
        assert_eq!(g.len(), 2);
        assert!(g.check(v4(1), t1).is_err(), "the live count is kept");
        assert_eq!(g.check(v4(3), t1), Ok(()));
    }

    #[test]
    fn attempts_in_flight_together_are_counted_as_they_begin() {
        let t0 = Instant::now();
        let mut g = GuessLimiter::<4>::new(3, t0);
        // Sixteen begun before any is answered: three get through.
        let begun: Vec<_> = (0..16).filter_map(|_| g.begin(v4(1), t0).ok()).collect();
        assert_eq!(begun.len(), 3);
        // One of them was right: it gives its own attempt back, no more.
        let mut begun = begun.into_iter();
        g.succeeded(begun.next().unwrap(), t0);
        drop(begun);
        let again = g
            .begin(v4(1), t0)
            .expect("the success's attempt was given back");
        assert!(
            g.begin(v4(1), t0).is_err(),
            "the two wrong ones still count"
        );
        drop(again);
        // A cancelled attempt is given back too; one from an earlier minute gives nothing back.
        let t1 = t0 + WINDOW;
        let late = g.begin(v4(2), t0).unwrap();
        let now = g.begin(v4(2), t1).unwrap();
        g.cancel(late);
        let _ = g.begin(v4(2), t1).unwrap();
        let _ = g.begin(v4(2), t1).unwrap();
        assert!(
            g.begin(v4(2), t1).is_err(),
            "{now:?} and two more are the minute's three"
        );
    }

    #[test]
    fn attempts_from_many_addresses_at_once_stay_within_the_bound() {
        let t0 = Instant::now();
        const CAP: usize = 4;
        let mut g = GuessLimiter::<CAP>::new(2, t0);
        let begun: Vec<_> = (0..100)
            .flat_map(|n| (0..5).map(move |_| n))
            .filter_map(|n| g.begin(v4(n), t0).ok())
            .collect();
        assert_eq!(begun.len(), (CAP + 1) * 2);
    }

    #[test]
    fn ipv6_counts_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let mapped: IpAddr = "::ffff:192.168.1.10".parse().unwrap();
        assert_eq!(
            address_key(mapped),
            "192.168.1.10".parse::<IpAddr>().unwrap()
        );
        let t0 = Instant::now();
        let mut g = GuessLimiter::<4>::new(1, t0);
        g.fail(a, t0);
        assert!(g.check(b, t0).is_err());
        assert_eq!(g.check(c, t0), Ok(()));
    }
}
