//! The `agent.busy` extension: which lanes have a turn running, told to the devices that asked
//! for it when a turn starts and ends (whoever started it: a device, a cron job, a webhook) and
//! in their `hello.ack`. The state is the lanes' own (`LaneState::busy`); this file only keeps
//! the flag and what devices were told in step.

use crate::outlet::Outlet;
use crate::protocol::{Frame, Lane, LaneRef};

use super::{TurnPort, Turns};

impl<P: TurnPort> Turns<P> {
    /// A turn starts (`busy`) or ends in `lane`. Only a change is sent, so a device never sees
    /// two `agent.idle` in a row for one lane.
    pub(super) fn set_lane_busy(&self, lane: &Lane, busy: bool) {
        if !self.lanes.set_busy(lane, busy) {
            return;
        }
        let frame = Frame::agent_busy(busy).in_lane(&lane.chat_id, lane.thread());
        self.hub().broadcast_to(&frame, Outlet::wants_busy_frames);
    }

    /// The lanes with a turn running, sorted, for `hello.ack.agent_busy`. Turns run only with
    /// a turn slot, so there are at most `limits.max_running_turns` of them.
    pub(in crate::hub) fn busy_lanes(&self) -> Vec<LaneRef> {
        let mut lanes: Vec<LaneRef> = self
            .lanes
            .busy_lanes()
            .into_iter()
            .map(|lane| LaneRef {
                chat_id: lane.chat_id,
                thread_id: lane.thread_id,
            })
            .collect();
        lanes.sort();
        lanes
    }
}
