//! The requests of each device that are waiting on the agent right now: their one owner.
//!
//! A request that asks the agent something (a steer handed to the running answer, an approval's
//! answer, the agent's list of models) is not awaited by the device's reader, which would leave
//! that phone's pings and other frames unanswered for as long as the agent takes. It runs
//! beside the reader instead; this part bounds how many: one per device and kind at a time.

use std::cell::RefCell;
use std::collections::HashSet;
use std::future::Future;
use std::rc::Rc;

use super::errors::Refusal;
use crate::outlet::Outlet;
use crate::protocol::Frame;

/// What a device's call to the agent is for; each kind has its own slot per device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// A steer on its way to the running answer (`agent.steer`, `/steer TEXT`).
    Steer,
    /// An approval's answer on its way to the agent (`picker.select` on an approval).
    Approval,
    /// The agent's list of models (`/model`, `/model NAME`, the model picker's answer).
    Models,
    /// The agent's scheduled jobs (`/jobs`, its pickers' answers).
    Jobs,
}

impl CallKind {
    /// The request as its sender knows it, for the refusal of a second one.
    pub(super) fn described(self) -> &'static str {
        match self {
            CallKind::Steer => "a steer",
            CallKind::Approval => "an approval's answer",
            CallKind::Models => "a model choice",
            CallKind::Jobs => "a scheduled-jobs request",
        }
    }
}

type Pending = Rc<RefCell<HashSet<(String, CallKind)>>>;

/// The calls under way, by device and kind.
#[derive(Default)]
pub(super) struct AgentCalls {
    pending: Pending,
}

/// A device's slot for one kind of call, held while the call runs; dropping it frees the slot.
pub struct CallSlot {
    pending: Pending,
    key: (String, CallKind),
}

impl AgentCalls {
    /// The slot for `device_id`'s call of `kind`, or `None` while one is still under way.
    pub(super) fn claim(&self, device_id: &str, kind: CallKind) -> Option<CallSlot> {
        let key = (device_id.to_owned(), kind);
        if !self.pending.borrow_mut().insert(key.clone()) {
            return None;
        }
        Some(CallSlot {
            pending: self.pending.clone(),
            key,
        })
    }

    /// The device's slot for a call of `kind` to the agent, or the `rate_limited` refusal
    /// while its previous one is still under way.
    pub(super) fn slot(&self, device_id: &str, kind: CallKind) -> Result<CallSlot, Refusal> {
        self.claim(device_id, kind).ok_or_else(|| {
            Refusal::rate_limited(format!(
                "{} from this device is still on its way to the agent; send this again once it is answered",
                kind.described()
            ))
        })
    }
}

impl CallSlot {
    /// Runs `work` (which waits on the agent) beside the device's reader, holding this slot
    /// until it ends, so the device's other frames are answered meanwhile. Its answer reaches
    /// the device the way every answer does (through the committer or the outlet); a refusal
    /// comes back as an `error` carrying the request's `id`.
    pub(super) fn beside(
        self,
        outlet: &Rc<Outlet>,
        id: Option<i64>,
        work: impl Future<Output = Result<(), Refusal>> + 'static,
    ) {
        let outlet = outlet.clone();
        tokio::task::spawn_local(async move {
            let _slot = self;
            if let Err(refusal) = work.await {
                outlet.push_frame(&Frame::error(id, refusal.code, refusal.message));
            }
        });
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        self.pending.borrow_mut().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_call_per_device_and_kind_until_its_slot_is_dropped() {
        let calls = AgentCalls::default();
        let steer = calls.claim("d1", CallKind::Steer).expect("a free slot");
        assert!(calls.claim("d1", CallKind::Steer).is_none());
        let _other_kind = calls
            .claim("d1", CallKind::Models)
            .expect("kinds are apart");
        let _other_device = calls
            .claim("d2", CallKind::Steer)
            .expect("devices are apart");
        drop(steer);
        assert!(calls.claim("d1", CallKind::Steer).is_some());
    }
}
