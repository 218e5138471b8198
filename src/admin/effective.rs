//! The configuration in effect for the admin app: the file, the saved settings and the flags,
//! updated by what the pages save. One owner, so every page reads the same values, a save is one
//! call, and no borrow of it outlives the call that took it (none can be held across an await,
//! where a second request would find it taken).

use std::cell::RefCell;

use crate::config::Config;

pub(super) struct Effective(RefCell<Config>);

impl Effective {
    pub(super) fn new(config: Config) -> Effective {
        Effective(RefCell::new(config))
    }

    /// What `look` reads of the configuration in effect.
    pub(super) fn read<T>(&self, look: impl FnOnce(&Config) -> T) -> T {
        look(&self.0.borrow())
    }

    /// A copy of the whole, to change and check before [`Effective::apply`].
    pub(super) fn get(&self) -> Config {
        self.0.borrow().clone()
    }

    /// Puts `change` in effect: the pages' next reads see it.
    pub(super) fn apply(&self, change: impl FnOnce(&mut Config)) {
        change(&mut self.0.borrow_mut());
    }
}
