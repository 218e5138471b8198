//! Admission at accept: `limits.max_connections` over all sockets and
//! `limits.max_connections_per_ip` per client address, both counted from accept (before any
//! byte is read: a socket that never says hello costs memory too).
//!
//! A refused socket is closed at once, unread: answering it (a TLS handshake, an HTTP 429)
//! would spend the memory and CPU the limit exists to protect. Refusals are logged at most
//! once per [`LOG_EVERY`], with a count, so a connect flood cannot flood the journal either.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tracing::warn;

const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counted as the guessing limits count addresses (IPv6 by its /64).
pub use crate::guessing::address_key;

/// Counts open sockets, in all and per address.
pub struct Admission {
    max_total: usize,
    max_per_address: usize,
    total: Cell<usize>,
    /// Only addresses with open sockets are kept, so this holds at most `max_total` entries.
    per_address: RefCell<HashMap<IpAddr, usize>>,
    last_log: Cell<Option<Instant>>,
    unlogged: Cell<u64>,
}

/// One admitted socket; dropping it gives its place back.
pub struct Admitted {
    admission: Rc<Admission>,
    key: IpAddr,
}

impl Admission {
    pub fn new(max_total: usize, max_per_address: usize) -> Rc<Admission> {
        Rc::new(Admission {
            max_total,
            max_per_address,
            total: Cell::new(0),
            per_address: RefCell::default(),
            last_log: Cell::new(None),
            unlogged: Cell::new(0),
        })
    }

    /// Admits a socket from `ip`, or `None` when a limit is reached (the caller drops it).
    pub fn admit(self: &Rc<Self>, ip: IpAddr) -> Option<Admitted> {
        let key = address_key(ip);
        if self.total.get() >= self.max_total {
            self.refused(ip, "limits.max_connections");
            return None;
        }
        let mut per = self.per_address.borrow_mut();
        let open = per.entry(key).or_insert(0);
        if *open >= self.max_per_address {
            drop(per);
            self.refused(ip, "limits.max_connections_per_ip");
            return None;
        }
        *open += 1;
        self.total.set(self.total.get() + 1);
        Some(Admitted {
            admission: self.clone(),
            key,
        })
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.total.get()
    }

    fn refused(&self, ip: IpAddr, limit: &str) {
        let now = Instant::now();
        if self
            .last_log
            .get()
            .is_some_and(|at| now.duration_since(at) < LOG_EVERY)
        {
            self.unlogged.set(self.unlogged.get() + 1);
            return;
        }
        let earlier = self.unlogged.replace(0);
        self.last_log.set(Some(now));
        warn!(peer = %ip, "refusing a connection: {limit} reached ({earlier} more refused since the last such line)");
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let a = &self.admission;
        a.total.set(a.total.get() - 1);
        let mut per = a.per_address.borrow_mut();
        if let Some(open) = per.get_mut(&self.key) {
            *open -= 1;
            if *open == 0 {
                per.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_per_address_and_in_all() {
        let a = Admission::new(3, 2);
        let ip1: IpAddr = "192.168.1.10".parse().unwrap();
        let ip2: IpAddr = "192.168.1.11".parse().unwrap();
        let x = a.admit(ip1).unwrap();
        let y = a.admit(ip1).unwrap();
        assert!(a.admit(ip1).is_none(), "third from one address");
        let z = a.admit(ip2).unwrap();
        assert!(
            a.admit("10.0.0.1".parse().unwrap()).is_none(),
            "over the total"
        );
        drop(x);
        assert_eq!(a.open(), 2);
        let again = a.admit(ip1).unwrap();
        drop((y, z, again));
        assert_eq!(a.open(), 0);
        assert!(a.per_address.borrow().is_empty());
    }
}
