//! One-time codes for the pairing page.
//!
//! The page hands out a pairing token, a secret that is never logged, to whoever presents a
//! valid code. The code itself may go to the console and the journal because it is weak in
//! every way that matters to an attacker who reads it later: one use, a few minutes
//! (`limits.pair_code_ttl_secs`), and only the newest one works. Guessing is bounded by 40
//! random bits and `limits.pair_code_failures_per_minute` wrong tries per address, with a bound
//! on all addresses together that rotating addresses cannot escape (`crate::guessing`).
//!
//! Only SHA-256 of the live code is kept, and a presented code is compared by digest in
//! constant time, as webhook tokens are.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::guessing::GuessLimiter;

/// Crockford's base 32: no I, L, O or U, so a code read off a screen cannot be mistyped into
/// another valid one (I/L are read as 1, O as 0).
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// 8 characters of 5 bits: 40 random bits.
const CODE_CHARS: usize = 8;
/// Addresses whose failures are counted one by one; past them, addresses share one count, so a
/// flood from many addresses can neither grow memory nor buy more guesses.
const FAILURE_TABLE: usize = 256;
/// Spent codes remembered, to tell "used or expired" (410) from "wrong" (403).
const SPENT_KEPT: usize = 16;

type CodeDigest = [u8; 32];

/// Why a presented code was not accepted; each maps to one HTTP status on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 403: never a valid code.
    Wrong,
    /// 410: a code that was valid once: used, expired, or replaced by a newer one.
    Spent,
    /// 429: too many failures from this address, or (`shared`) from too many addresses at
    /// once; retry after this many seconds.
    RateLimited { retry_after_secs: u64, shared: bool },
}

/// The live code and the failure counts; one per gateway, used from the event loop only.
pub struct PageCodes {
    ttl: Duration,
    state: RefCell<State>,
}

struct State {
    live: Option<(CodeDigest, Instant)>,
    spent: VecDeque<CodeDigest>,
    failures: GuessLimiter<FAILURE_TABLE>,
}

impl PageCodes {
    pub fn new(ttl: Duration, failures_per_minute: u32) -> PageCodes {
        PageCodes {
            ttl,
            state: RefCell::new(State {
                live: None,
                spent: VecDeque::new(),
                failures: GuessLimiter::new(failures_per_minute, Instant::now()),
            }),
        }
    }

    /// How long a fresh code stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A fresh code, shown as `XXXX-XXXX`; any earlier code stops working.
    pub fn mint(&self) -> String {
        let mut bytes = [0u8; 5];
        getrandom::fill(&mut bytes).expect("the OS random source is unavailable");
        let bits = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let code: String = (0..CODE_CHARS)
            .rev()
            .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
            .collect();
        let mut st = self.state.borrow_mut();
        if let Some((old, _)) = st.live.take() {
            remember_spent(&mut st.spent, old);
        }
        st.live = Some((digest(&code), Instant::now() + self.ttl));
        format!("{}-{}", &code[..4], &code[4..])
    }

    /// Accepts `presented` once, if it is the live code and not expired. Failures are counted
    /// per address (IPv6: per /64) and, past the limit, refused before the code is looked at.
    /// A success keeps the count: it never buys more wrong tries.
    pub fn redeem(&self, presented: &str, ip: IpAddr) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut st = self.state.borrow_mut();
        // Counted as it begins (`guessing.rs`): the check and the count are one step.
        let attempt = match st.failures.begin(ip, now) {
            Ok(a) => a,
            Err(limited) => {
                return Err(Refusal::RateLimited {
                    retry_after_secs: limited.retry_after.as_secs().max(1),
                    shared: limited.shared,
                })
            }
        };
        let presented = normalize(presented).map(|c| digest(&c));
        let outcome = match (&presented, st.live) {
            (Some(p), Some((live, expires))) if same_digest(p, &live) => {
                st.live = None;
                remember_spent(&mut st.spent, live);
                if now < expires {
                    Ok(())
                } else {
                    Err(Refusal::Spent)
                }
            }
            (Some(p), _) if st.spent.iter().any(|s| same_digest(p, s)) => Err(Refusal::Spent),
            _ => Err(Refusal::Wrong),
        };
        if outcome.is_ok() {
            st.failures.succeeded(attempt, now);
        }
        outcome
    }
}

/// Upper case, separators dropped, and the look-alikes Crockford defines read as digits; `None`
/// when what is left cannot be a code.
fn normalize(presented: &str) -> Option<String> {
    let code: String = presented
        .chars()
        .filter(|c| !matches!(c, '-' | ' ' | '\t'))
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect();
    let valid = code.len() == CODE_CHARS && code.bytes().all(|b| ALPHABET.contains(&b));
    valid.then_some(code)
}

fn digest(code: &str) -> CodeDigest {
    Sha256::digest(code.as_bytes()).into()
}

/// Constant-time equality: the time taken never depends on how much of a digest matched.
fn same_digest(a: &CodeDigest, b: &CodeDigest) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn remember_spent(spent: &mut VecDeque<CodeDigest>, code: CodeDigest) {
    if spent.len() == SPENT_KEPT {
        spent.pop_front();
    }
    spent.push_back(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 1, 30));

    #[test]
    fn a_code_works_once_and_a_newer_one_replaces_it() {
        let codes = PageCodes::new(Duration::from_secs(600), 100);
        let first = codes.mint();
        assert_eq!(first.len(), 9, "{first}");
        let second = codes.mint();
        assert_eq!(codes.redeem(&first, HOME), Err(Refusal::Spent));
        // Lower case, without the dash, is the same code.
        let typed = second.replace('-', "").to_lowercase();
        assert_eq!(codes.redeem(&typed, HOME), Ok(()));
        assert_eq!(codes.redeem(&second, HOME), Err(Refusal::Spent));
        assert_eq!(codes.redeem("ABCD-EFGH", HOME), Err(Refusal::Wrong));
        assert_eq!(codes.redeem("not a code", HOME), Err(Refusal::Wrong));
    }

    #[test]
    fn an_expired_code_is_spent() {
        let codes = PageCodes::new(Duration::ZERO, 100);
        let code = codes.mint();
        assert_eq!(codes.redeem(&code, HOME), Err(Refusal::Spent));
    }

    #[test]
    fn failures_are_limited_per_address_before_the_code_is_checked() {
        let codes = PageCodes::new(Duration::from_secs(600), 3);
        let code = codes.mint();
        for _ in 0..3 {
            assert_eq!(codes.redeem("0000-0000", HOME), Err(Refusal::Wrong));
        }
        assert!(matches!(
            codes.redeem(&code, HOME),
            Err(Refusal::RateLimited { .. })
        ));
        let other: IpAddr = "192.168.1.31".parse().unwrap();
        assert_eq!(codes.redeem(&code, other), Ok(()));
    }
}
