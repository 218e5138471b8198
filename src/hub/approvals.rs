//! Approvals on the phone: a command the agent flags as dangerous waits for a person.
//!
//! An `approval.request` from a run becomes, in its lane, an outboxed `picker.choice` (every
//! device sees it, also after a reconnect or a gateway restart) and an outboxed
//! `notification{kind:"approval"}` (pushed to away phones). The first `picker.select` wins: the
//! record is taken out of the pending set before anything is awaited, so a second answer
//! finds nothing and is told the request is no longer open. The outcome is a `system` message
//! in the lane saying who answered what. When the agent stops waiting on its own (Hermes'
//! `approvals.timeout`) the picker is closed with a message; so it is when the turn ends.
//!
//! `always` is never offered: in Hermes it allow-lists the command's whole pattern in its
//! config.yaml, for every session and every endpoint, for ever. That is an operator's decision
//! for config.yaml, not one tap on a locked phone. Answers never set Hermes' `all` (which would
//! approve every request of the run at once).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::{json, Value};
use tracing::{info, warn};

use super::commands::post_system;
use super::errors::Refusal;
use super::port::Port;
use crate::agent::{Agent, ApprovalRequest};
use crate::ids;
use crate::protocol::{fit, ErrorCode, Frame, Lane};
use crate::store::{ApprovalRecord, Change, Record, Store};

/// Approval pickers' ids start with this (other pickers' with `pk_`).
pub(super) const PICKER_PREFIX: &str = "ap_";
/// The command as shown in a picker's title or a notification: a line, not a page.
const COMMAND_BYTES: usize = 1 << 10;
const DESCRIPTION_BYTES: usize = 256;
/// What a device that answers a closed request is told.
pub(super) const NOT_OPEN: &str = "this approval request is no longer open: it was answered, Hermes stopped waiting for it, or its task ended";

/// The answer a picker value stands for: Hermes' choice, or stopping the whole task.
fn label(value: &str) -> &'static str {
    match value {
        "once" => "Allow once",
        "session" => "Allow for this task",
        "deny" => "Deny",
        "stop" => "Stop the task",
        _ => "?",
    }
}

/// The picker's values, in the order shown: what Hermes offers, without `always`, then stop.
fn values(req: &ApprovalRequest) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = ["once", "session", "deny"]
        .into_iter()
        .filter(|v| req.choices.iter().any(|c| c == v))
        .collect();
    if !out.contains(&"deny") {
        out.push("deny"); // a person can always refuse
    }
    out.push("stop");
    out
}

/// The command as the approval shows it: one line, within a label's size.
fn shown_command(req: &ApprovalRequest) -> String {
    let mut command = req.command.trim().replace('`', "'");
    fit::cut_in_place(&mut command, COMMAND_BYTES);
    command
}

/// The picker's title: what Hermes asks to run, and why, when it says.
fn title(req: &ApprovalRequest) -> String {
    let mut why = req.description.trim().to_owned();
    fit::cut_in_place(&mut why, DESCRIPTION_BYTES);
    if why.is_empty() {
        format!("Run `{}`? Hermes flags it as dangerous", shown_command(req))
    } else {
        format!("Run `{}`? Hermes flags it: {why}", shown_command(req))
    }
}

/// What open approvals ask of the hub beyond the core: stopping the run an answer refused.
pub(super) trait ApprovalsPort: Port {
    /// Stops the running turn of `lane` if it runs `run_id`; `false` when that one is not
    /// running.
    fn stop_turn_of_run(&self, lane: &Lane, run_id: &str) -> bool;
}

/// Approvals offered and not answered yet, by picker id (also in the store: they survive
/// restarts, unlike the settings pickers), and what offers, answers and closes them. Their one
/// owner; each is taken out to be answered, and put back when the answer could not be
/// delivered. It reaches the rest of the hub through the port (commit, the lanes' turns).
pub(super) struct OpenApprovals {
    open: RefCell<HashMap<String, ApprovalRecord>>,
    /// For the answering device's name.
    store: Store,
    agent: Rc<dyn Agent>,
}

impl OpenApprovals {
    pub(super) fn new(
        records: Vec<ApprovalRecord>,
        store: Store,
        agent: Rc<dyn Agent>,
    ) -> OpenApprovals {
        OpenApprovals {
            open: RefCell::new(
                records
                    .into_iter()
                    .map(|a| (a.picker_id.clone(), a))
                    .collect(),
            ),
            store,
            agent,
        }
    }

    fn insert(&self, record: ApprovalRecord) {
        self.open
            .borrow_mut()
            .insert(record.picker_id.clone(), record);
    }

    fn take(&self, picker_id: &str) -> Option<ApprovalRecord> {
        self.open.borrow_mut().remove(picker_id)
    }

    /// Approvals waiting for an answer, for `/status`.
    pub(super) fn count(&self) -> usize {
        self.open.borrow().len()
    }

    /// Offers an approval the running turn of `lane` waits for.
    pub(super) async fn offer(
        &self,
        hub: &impl ApprovalsPort,
        lane: &Lane,
        run_id: &str,
        request: ApprovalRequest,
    ) {
        let record = ApprovalRecord {
            picker_id: ids::time_ordered("ap"),
            lane: lane.clone(),
            run_id: run_id.to_owned(),
            request,
            created_ms: ids::now_ms(),
        };
        // Stored before the picker goes out, so an answer after a restart still finds it.
        let put = Change::Record(Record::PutApproval(record.clone()));
        if let Err(e) = hub.commit(vec![put], None).await {
            warn!(%lane, "could not store an approval (it will not survive a restart): {e}");
        }
        info!(%lane, run = %run_id, picker = %record.picker_id, "approval requested");
        let choices: Vec<Value> = values(&record.request)
            .into_iter()
            .map(|v| json!({ "value": v, "label": label(v), "is_current": false }))
            .collect();
        let title = title(&record.request);
        let picker = Frame::picker_choice(&record.picker_id, &title, Value::Array(choices))
            .in_lane(&lane.chat_id, lane.thread());
        let notice = Frame::notification("approval", "Approval needed", &title, ids::now_ms())
            .in_lane(&lane.chat_id, lane.thread());
        self.insert(record);
        let changes = vec![
            Change::Outbox(picker.outboxed()),
            Change::Outbox(notice.outboxed()),
        ];
        if let Err(e) = hub.commit(changes, None).await {
            warn!(%lane, "could not send an approval picker: {e}");
        }
    }

    /// Takes every pending approval of a run out of the pending set (and the store).
    async fn take_of_run(&self, hub: &impl ApprovalsPort, run_id: &str) -> Vec<ApprovalRecord> {
        let taken = {
            let mut open = self.open.borrow_mut();
            let ids: Vec<String> = open
                .values()
                .filter(|a| a.run_id == run_id)
                .map(|a| a.picker_id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| open.remove(id))
                .collect::<Vec<_>>()
        };
        let gone: Vec<Change> = taken
            .iter()
            .map(|a| Change::Record(Record::RemoveApproval(a.picker_id.clone())))
            .collect();
        if !gone.is_empty() {
            if let Err(e) = hub.commit(gone, None).await {
                warn!("could not forget an approval: {e}");
            }
        }
        taken
    }

    /// Closes a run's open approvals with a message in their lane; `why` gets the command.
    pub(super) async fn close_of_run(
        &self,
        hub: &impl ApprovalsPort,
        run_id: &str,
        why: impl Fn(&str) -> String,
    ) {
        for a in self.take_of_run(hub, run_id).await {
            info!(lane = %a.lane, picker = %a.picker_id, "approval closed unanswered");
            if hub.lane_exists(&a.lane) {
                let text = why(&shown_command(&a.request));
                post_system(hub, &a.lane, text).await;
            }
        }
    }

    /// Hermes stopped waiting (its timeout): the command did not run.
    pub(super) async fn expired(&self, hub: &impl ApprovalsPort, run_id: &str) {
        self.close_of_run(hub, run_id, not_in_time).await;
    }

    /// The run ids approvals wait for (for a restart: which are still worth following).
    pub(super) fn runs(&self) -> Vec<String> {
        self.open
            .borrow()
            .values()
            .map(|a| a.run_id.clone())
            .collect()
    }

    /// Answers an approval picker for the device `device_id`. The first answer wins; any later
    /// one (or one to a closed request) is refused with a clear `error`, changing nothing.
    pub(super) async fn answer(
        &self,
        hub: &impl ApprovalsPort,
        device_id: &str,
        picker_id: &str,
        value: &str,
    ) -> Result<(), Refusal> {
        let value = value.trim().to_ascii_lowercase();
        let record = self.take(picker_id);
        let Some(record) = record else {
            return Err(Refusal::not_found(NOT_OPEN));
        };
        let offered = values(&record.request);
        if !offered.contains(&value.as_str()) {
            let why = if value == "always" {
                "`always` is not answered from the phone: it would allow this kind of command in Hermes for ever (add it to Hermes' command_allowlist in its config.yaml if you mean that)".to_owned()
            } else {
                format!(
                    "`{}` is not an answer to this approval; choose one of: {}",
                    value.chars().take(40).collect::<String>(),
                    offered.join(", ")
                )
            };
            self.insert(record);
            return Err(Refusal::unsupported(why));
        }
        let who = self
            .store
            .device(device_id)
            .ok()
            .flatten()
            .map(|d| d.name)
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "A device".to_owned());
        let command = shown_command(&record.request);
        let lane = record.lane.clone();
        if value == "stop" {
            forget(hub, &record).await;
            info!(%lane, run = %record.run_id, "approval answered: stop the task");
            // The turn's end stops the run at Hermes and says "Stopped." in the answer.
            if !hub.stop_turn_of_run(&lane, &record.run_id) {
                self.agent.stop_run(&record.run_id).await;
            }
            let text = format!("{who} stopped the task: Hermes did not run `{command}`.");
            post_system(hub, &lane, text).await;
            return Ok(());
        }
        match self.agent.answer_approval(&record.run_id, &value).await {
            Ok(true) => {
                forget(hub, &record).await;
                info!(%lane, run = %record.run_id, choice = %value, "approval answered");
                let text = match value.as_str() {
                    "deny" => format!("{who} denied `{command}`: Hermes will not run it."),
                    "session" => format!(
                    "{who} allowed `{command}` for this task (Hermes asks again in the next one)."
                ),
                    _ => format!("{who} allowed `{command}` once."),
                };
                post_system(hub, &lane, text).await;
                Ok(())
            }
            Ok(false) => {
                // Hermes had already stopped waiting (timeout, or the run is over).
                forget(hub, &record).await;
                post_system(hub, &lane, not_in_time(&command)).await;
                Err(Refusal::not_found(NOT_OPEN))
            }
            Err(e) => {
                // Not delivered: the request stays open for another try.
                self.insert(record);
                Err(Refusal::new(
                    ErrorCode::Internal,
                    format!(
                    "could not give Hermes the answer ({e}); the request is still open, try again"
                ),
                ))
            }
        }
    }
}

/// The message when Hermes gave up waiting.
pub(super) fn not_in_time(command: &str) -> String {
    format!("\u{23f1}\u{fe0f} `{command}` was not approved in time; Hermes did not run it.")
}

/// An answered (or no longer answerable) approval leaves the store, so a restart does not offer it again.
async fn forget(hub: &impl ApprovalsPort, record: &ApprovalRecord) {
    let gone = Change::Record(Record::RemoveApproval(record.picker_id.clone()));
    if let Err(e) = hub.commit(vec![gone], None).await {
        warn!("could not forget an answered approval: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(choices: &[&str]) -> ApprovalRequest {
        ApprovalRequest {
            command: "rm -rf ~/old-photos".into(),
            description: "delete in root path".into(),
            choices: choices.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn always_is_never_one_tap_and_stop_is_always_there() {
        assert_eq!(
            values(&req(&["once", "session", "always", "deny"])),
            ["once", "session", "deny", "stop"]
        );
        assert_eq!(values(&req(&["once", "deny"])), ["once", "deny", "stop"]);
        assert_eq!(
            title(&req(&["once"])),
            "Run `rm -rf ~/old-photos`? Hermes flags it: delete in root path"
        );
    }
}
