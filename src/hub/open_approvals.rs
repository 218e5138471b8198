//! The approvals offered and not answered yet: their one owner (also in the store, through the
//! committer; `approvals.rs` offers and answers them).

use crate::store::ApprovalRecord;

/// Approvals offered and not answered yet, by picker id (also in the store: they survive
/// restarts, unlike the settings pickers). Its one owner; each is taken out to be answered, and
/// put back when the answer could not be delivered.
pub(super) struct OpenApprovals {
    open: std::cell::RefCell<std::collections::HashMap<String, ApprovalRecord>>,
}

impl OpenApprovals {
    pub(super) fn new(records: Vec<ApprovalRecord>) -> OpenApprovals {
        OpenApprovals {
            open: std::cell::RefCell::new(
                records
                    .into_iter()
                    .map(|a| (a.picker_id.clone(), a))
                    .collect(),
            ),
        }
    }

    pub(super) fn insert(&self, record: ApprovalRecord) {
        self.open
            .borrow_mut()
            .insert(record.picker_id.clone(), record);
    }

    pub(super) fn take(&self, picker_id: &str) -> Option<ApprovalRecord> {
        self.open.borrow_mut().remove(picker_id)
    }

    /// Every open approval of one run, taken out.
    pub(super) fn take_of_run(&self, run_id: &str) -> Vec<ApprovalRecord> {
        let mut open = self.open.borrow_mut();
        let ids: Vec<String> = open
            .values()
            .filter(|a| a.run_id == run_id)
            .map(|a| a.picker_id.clone())
            .collect();
        ids.iter().filter_map(|id| open.remove(id)).collect()
    }

    pub(super) fn runs(&self) -> Vec<String> {
        self.open
            .borrow()
            .values()
            .map(|a| a.run_id.clone())
            .collect()
    }

    pub(super) fn count(&self) -> usize {
        self.open.borrow().len()
    }
}
