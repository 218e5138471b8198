//! A gate a fake server's thread waits at until the test opens it: how a test makes a peer
//! "slow" for exactly as long as it needs, with no clock to guess at.

use std::sync::{Arc, Condvar, Mutex};

/// Closed until [`Gate::open`]; clones share the one gate.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// Blocks the calling thread until the gate is open (at once if it already is).
    pub fn wait(&self) {
        let (open, changed) = &*self.0;
        let mut is_open = open.lock().unwrap();
        while !*is_open {
            is_open = changed.wait(is_open).unwrap();
        }
    }

    /// Opens the gate for every waiter, now and later.
    pub fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
}
