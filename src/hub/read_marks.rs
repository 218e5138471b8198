//! The household's read markers per lane: their one owner (also in the store, through the
//! committer; `read_state.rs` answers receipts and greets devices with them).

use crate::protocol::Lane;
use crate::store::ReadMark;

/// Per lane, where the household has read it up to (also in the store). Its one owner: a marker
/// only moves forward.
pub(super) struct ReadMarks {
    marks: std::cell::RefCell<std::collections::HashMap<Lane, ReadMark>>,
}

impl ReadMarks {
    pub(super) fn new(marks: Vec<(Lane, ReadMark)>) -> ReadMarks {
        ReadMarks {
            marks: std::cell::RefCell::new(marks.into_iter().collect()),
        }
    }

    /// Moves the lane's marker to `mark`; `false` (nothing changes) when it is not past it.
    pub(super) fn advance(&self, lane: &Lane, mark: &ReadMark) -> bool {
        let mut marks = self.marks.borrow_mut();
        if marks.get(lane).is_some_and(|m| !mark.is_past(m)) {
            return false;
        }
        marks.insert(lane.clone(), mark.clone());
        true
    }

    pub(super) fn all(&self) -> Vec<(Lane, ReadMark)> {
        self.marks
            .borrow()
            .iter()
            .map(|(l, m)| (l.clone(), m.clone()))
            .collect()
    }

    pub(super) fn forget(&self, lane: &Lane) {
        self.marks.borrow_mut().remove(lane);
    }
}
