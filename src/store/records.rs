//! The gateway's small records (devices, todo lists, agent runs and approvals, a lane's agent
//! session, the user's agent settings), written only through a commit (`Change::Record`).
//!
//! Each write is carried in the commit record as a redo entry and applied after it, like a
//! channel or a pending turn: so it is atomic with the rest of its commit, a failing disk is
//! noticed (`note_failure`) wherever it happens, and a crash between the record and its apply is
//! healed by the next open replaying the record. Every apply writes absolute values, so applying
//! one twice changes nothing.

use serde::{Deserialize, Serialize};

use super::agent_jobs::agent_job_key;
use super::agent_jobs::AgentJob;
use super::approvals::{approval_key, run_key};
use super::approvals::{ApprovalRecord, RunRecord};
use super::base::to_json;
use super::devices::Device;
use super::engine::handle::Sled;
use super::keys::lane_prefix;
use super::media::{ref_key, MediaRecord};
use super::sessions::{AgentSession, META_AGENT_SETTINGS};
use crate::config::AgentSettings;
use crate::protocol::{Lane, TodoItem};

/// One small-record write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// A new device with its token hash, or an updated one (last seen, push target).
    PutDevice(Device),
    /// A device and its token go (nothing when it is not there).
    RemoveDevice(String),
    /// A lane's latest todo list; an empty one removes the record.
    PutTodos(Lane, Vec<TodoItem>),
    /// The agent took a user message's turn as this run.
    PutRun(RunRecord),
    /// The turn of this user message is settled.
    RemoveRun(String),
    /// An approval offered and not answered yet.
    PutApproval(ApprovalRecord),
    /// The approval (its picker id) is answered or closed.
    RemoveApproval(String),
    /// The lane's conversation at the agent.
    PutAgentSession(Lane, AgentSession),
    /// The lane was deleted: its conversation goes with it.
    RemoveAgentSession(Lane),
    /// The user's `/reasoning` and `/fast` choices.
    PutAgentSettings(AgentSettings),
    /// A stored file's record, its uploader's ref to it (device id, ref) and how many records
    /// now share its bytes (`Change::AddMedia`, counted at commit).
    PutMedia {
        record: MediaRecord,
        device_ref: Option<(String, String)>,
        blob_count: u64,
    },
    /// A file's record goes, and how many records still share its bytes (none: the blob goes).
    DropMedia {
        media_id: String,
        sha256: String,
        blob_count: u64,
    },
    /// An agent job the gateway delivers, with its newest delivered run.
    PutAgentJob(AgentJob),
    /// The agent no longer has the job.
    RemoveAgentJob(String),
}

impl Record {
    /// Roughly what it writes, for the free-space check.
    pub(super) fn approx_bytes(&self) -> usize {
        match self {
            Record::PutTodos(_, todos) => todos.iter().map(|t| t.content.len() + 48).sum(),
            Record::PutApproval(a) => a.request.command.len() + a.request.description.len() + 256,
            Record::PutMedia { record, .. } => record.filename.len() + record.mime.len() + 256,
            Record::RemoveDevice(_)
            | Record::DropMedia { .. }
            | Record::RemoveRun(_)
            | Record::RemoveApproval(_)
            | Record::RemoveAgentSession(_)
            | Record::RemoveAgentJob(_) => 64,
            _ => 512,
        }
    }

    /// Writes it: what differs only (applied twice, the second time writes nothing).
    pub(super) fn apply(&self, t: &Sled) -> Result<(), sled::Error> {
        match self {
            Record::PutDevice(d) => {
                put(&t.devices, d.device_id.as_bytes(), to_json(d))?;
                put(&t.tokens, &d.token_hash, d.device_id.as_bytes().to_vec())
            }
            Record::RemoveDevice(id) => {
                if let Some(v) = t.devices.get(id.as_bytes())? {
                    if let Ok(d) = serde_json::from_slice::<Device>(&v) {
                        t.tokens.remove(d.token_hash.as_slice())?;
                    }
                    t.devices.remove(id.as_bytes())?;
                }
                Ok(())
            }
            Record::PutTodos(lane, todos) if todos.is_empty() => {
                remove(&t.todos, &lane_prefix(lane))
            }
            Record::PutTodos(lane, todos) => put(&t.todos, &lane_prefix(lane), to_json(todos)),
            Record::PutRun(run) => put(&t.meta, &run_key(&run.user_message_id), to_json(run)),
            Record::RemoveRun(id) => remove(&t.meta, &run_key(id)),
            Record::PutApproval(a) => put(&t.meta, &approval_key(&a.picker_id), to_json(a)),
            Record::RemoveApproval(id) => remove(&t.meta, &approval_key(id)),
            Record::PutAgentSession(lane, s) => put(&t.sessions, &lane_prefix(lane), to_json(s)),
            Record::RemoveAgentSession(lane) => remove(&t.sessions, &lane_prefix(lane)),
            Record::PutAgentSettings(s) => put(&t.meta, META_AGENT_SETTINGS, to_json(s)),
            Record::PutAgentJob(j) => put(&t.meta, &agent_job_key(&j.job_id), to_json(j)),
            Record::RemoveAgentJob(id) => remove(&t.meta, &agent_job_key(id)),
            Record::PutMedia {
                record,
                device_ref,
                blob_count,
            } => {
                put(&t.media, record.media_id.as_bytes(), to_json(record))?;
                let count = blob_count.to_be_bytes().to_vec();
                put(&t.blobs, record.sha256.as_bytes(), count)?;
                match device_ref {
                    Some((device, r)) => put(
                        &t.media_refs,
                        &ref_key(device, r),
                        record.media_id.as_bytes().to_vec(),
                    ),
                    None => Ok(()),
                }
            }
            Record::DropMedia {
                media_id,
                sha256,
                blob_count,
            } => {
                remove(&t.media, media_id.as_bytes())?;
                // Device refs to it are dropped lazily: a lookup finds no record.
                match blob_count {
                    0 => remove(&t.blobs, sha256.as_bytes()),
                    n => put(&t.blobs, sha256.as_bytes(), n.to_be_bytes().to_vec()),
                }
            }
        }
    }
}

fn put(tree: &sled::Tree, key: &[u8], value: Vec<u8>) -> Result<(), sled::Error> {
    if tree.get(key)?.as_deref() != Some(&value[..]) {
        tree.insert(key, value)?;
    }
    Ok(())
}

fn remove(tree: &sled::Tree, key: &[u8]) -> Result<(), sled::Error> {
    if tree.get(key)?.is_some() {
        tree.remove(key)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::devices::DeviceOrigin;
    use super::super::tests::temp_store;
    use super::super::{Change, Store};
    use super::*;

    fn device(id: &str, hash: &[u8]) -> Device {
        Device {
            device_id: id.into(),
            name: "phone".into(),
            origin: DeviceOrigin::Pair,
            created_ms: 1,
            last_seen_ms: None,
            app_device_id: None,
            last_pushed_cursor: 0,
            fcm_token: None,
            ntfy_topic: None,
            token_hash: hash.to_vec(),
            seen_cursor: 0,
            last_address: None,
            push_via: None,
            user_agent: None,
        }
    }

    #[test]
    fn records_written_by_commit_are_read_back_and_survive_a_reopen() {
        let (dir, store) = temp_store();
        let lane = Lane::new("default", None);
        let session = AgentSession {
            session_id: "iris-1".into(),
            started_ms: 5,
        };
        let settings = AgentSettings {
            fast: true,
            ..AgentSettings::default()
        };
        let records = [
            Record::PutDevice(device("dev_1", b"h1")),
            Record::PutDevice(device("dev_2", b"h2")),
            Record::RemoveDevice("dev_2".into()),
            Record::RemoveDevice("dev_none".into()),
            Record::PutAgentSession(lane.clone(), session.clone()),
            Record::PutAgentSettings(settings.clone()),
        ];
        let changes: Vec<Change> = records.iter().cloned().map(Change::Record).collect();
        store.commit(&changes).unwrap();
        // Applied twice (a start replaying the last commit record), nothing changes.
        let t = store.t().unwrap();
        for r in &records {
            r.apply(&t).unwrap();
        }
        drop(t);
        store.sync_blocking().unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1 << 20, std::time::Duration::from_secs(1)).unwrap();
        let ids: Vec<String> = store
            .devices()
            .unwrap()
            .into_iter()
            .map(|d| d.device_id)
            .collect();
        assert_eq!(ids, ["dev_1"]);
        assert!(store.device_by_token_hash(b"h2").unwrap().is_none());
        assert_eq!(
            store
                .device_by_token_hash(b"h1")
                .unwrap()
                .map(|d| d.device_id),
            Some("dev_1".into())
        );
        assert_eq!(store.agent_session(&lane).unwrap(), Some(session));
        assert_eq!(store.agent_settings().unwrap(), settings);
        store
            .commit(&[Change::Record(Record::RemoveAgentSession(lane.clone()))])
            .unwrap();
        assert_eq!(store.agent_session(&lane).unwrap(), None);
    }

    #[test]
    fn a_blob_is_counted_once_per_record_and_kept_while_one_remains() {
        let (_dir, store) = temp_store();
        let file = |id: &str| MediaRecord {
            media_id: id.into(),
            sha256: "ab".repeat(32),
            kind: "image".into(),
            mime: "image/png".into(),
            size: 3,
            filename: "a.png".into(),
            created_ms: 1,
        };
        let add = |id: &str, device: &str| Change::AddMedia {
            record: file(id),
            device_id: device.into(),
            media_ref: format!("ref-{id}"),
        };
        // Two records of one file in one commit.
        store
            .commit(&[add("med_1", "dev_1"), add("med_2", "")])
            .unwrap();
        assert_eq!(
            store.media_by_ref("dev_1", "ref-med_1").unwrap(),
            Some(file("med_1"))
        );
        let sha = "ab".repeat(32);
        store
            .commit(&[Change::RemoveMedia("med_1".into())])
            .unwrap();
        assert!(store.blob_is_kept(&sha).unwrap());
        assert_eq!(store.media("med_1").unwrap(), None);
        // Unknown ids change nothing; the last record takes the blob.
        store
            .commit(&[
                Change::RemoveMedia("med_none".into()),
                Change::RemoveMedia("med_2".into()),
            ])
            .unwrap();
        assert!(!store.blob_is_kept(&sha).unwrap());
    }
}
