//! A failing disk's backlog: the turns' final changes that could not be stored, kept to be
//! stored once it works again (`storage.rs`). Their one owner.

/// Answers kept while they could not be stored, at most this many (older ones are left to the
/// next start, which marks their messages as interrupted).
const MAX_UNSETTLED: usize = 64;

/// Turns' final changes that could not be stored while the disk failed, oldest first. Its one
/// owner; bounded by [`MAX_UNSETTLED`].
#[derive(Default)]
pub(super) struct Unsettled {
    kept: std::cell::RefCell<Vec<Vec<crate::store::Change>>>,
}

impl Unsettled {
    pub(super) fn keep(&self, changes: Vec<crate::store::Change>) {
        let mut kept = self.kept.borrow_mut();
        if kept.len() >= MAX_UNSETTLED {
            kept.remove(0);
        }
        kept.push(changes);
    }

    pub(super) fn take_all(&self) -> Vec<Vec<crate::store::Change>> {
        std::mem::take(&mut self.kept.borrow_mut())
    }
}
