//! The committer: the one path by which durable changes reach devices.
//!
//! Requests queue their changes here. The committer applies everything queued as one group,
//! fsyncs once for the whole group (group commit: a burst of messages costs one SD-card flush,
//! not one each), and only then publishes the group's outbox frames to every device, in cursor
//! order. So a frame a device has seen is always on disk, and every device sees frames in the
//! order of their cursors.

use std::rc::Rc;

use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::errors::CommitError;
use super::state::{CommitJob, Hub, Origin};
use crate::outlet::{encode_text, ConnId, FrameText, Mode};
use crate::protocol::Frame;
use crate::shutdown::Listener;
use crate::store::Change;

/// Most jobs folded into one fsync.
const MAX_GROUP: usize = 64;

impl Hub {
    /// Makes `changes` durable, publishes their outbox frames, and returns their cursors.
    pub async fn commit(
        &self,
        changes: Vec<Change>,
        origin: Option<Origin>,
    ) -> Result<Vec<u64>, CommitError> {
        let (done, rx) = oneshot::channel();
        self.committer
            .send(CommitJob {
                changes,
                origin,
                done,
            })
            .await
            .map_err(|_| CommitError::ShuttingDown)?;
        rx.await.map_err(|_| CommitError::ShuttingDown)?
    }

    /// Queues `changes` for the committer without waiting: for records no device is told about
    /// when they are written (a device's hello details, where it left off), so a caller that
    /// cannot await (the hello gate, a socket closing) still writes through the one path. They
    /// go durable with the next group; a full queue or a failing disk is logged, naming `what`.
    pub(super) fn commit_soon(&self, changes: Vec<Change>, what: &'static str) {
        let (done, rx) = oneshot::channel();
        let job = CommitJob {
            changes,
            origin: None,
            done,
        };
        if self.committer.try_send(job).is_err() {
            warn!("could not store {what}: the commit queue is full or closed");
            return;
        }
        tokio::task::spawn_local(async move {
            if let Ok(Err(e)) = rx.await {
                warn!("could not store {what}: {e}");
            }
        });
    }

    /// Fans one durable outbox frame out. Devices replaying the outbox (`sync`) skip it: their
    /// replay reads it from the store. The requester always gets its answer.
    fn publish(
        &self,
        cursor: u64,
        text: &FrameText,
        delivery_for_origin: Option<(ConnId, &Frame)>,
    ) {
        self.fanout.published(cursor);
        let outlets = self.fanout.all();
        let delivery = crate::protocol::Delivery::NeverDropped;
        for o in outlets {
            match delivery_for_origin {
                Some((conn, reply)) if conn == o.conn_id => o.push_frame(reply),
                _ if o.mode() == Mode::Live && o.takes_outboxed(text.as_bytes()) => {
                    o.push(text, delivery, None)
                }
                _ => {}
            }
        }
    }
}

impl Hub {
    /// The committer task: group commit of everything queued, one flush, then publication in
    /// cursor order. It stops last (`stop`, after every door and task is done), and only once its
    /// queue is empty, so what it accepted is written before the server's final flush.
    pub async fn run_committer(
        self: Rc<Self>,
        mut rx: mpsc::Receiver<CommitJob>,
        mut stop: Listener,
    ) {
        let retain = self.config.store.outbox_retain_frames;
        loop {
            let first = tokio::select! {
                // Queued work before the stop: nothing accepted is left behind.
                biased;
                job = rx.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
                _ = stop.recv() => break,
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            let applied: Vec<_> = group
                .iter()
                .map(|j| self.store.commit(&j.changes))
                .collect();
            // One flush for the group: its failure is every job's, so it is shared, not copied.
            let synced = self.store.sync().await.map_err(Rc::new);
            // A full or read-only disk refuses a commit before its flush (`Store::writable`), so
            // the health follows the commits' results too, not only the flush's: clearing it on a
            // flush that had nothing to write would report `online` while every write is refused.
            let failure = match &synced {
                Err(e) => Some(e.to_string()),
                Ok(()) => applied
                    .iter()
                    .filter_map(|r| r.as_ref().err())
                    .find(|e| e.is_storage_failure())
                    .map(|e| e.to_string())
                    // Durable in sled, but not yet in the history database (docs/storage.md).
                    .or_else(|| self.store.history_behind()),
            };
            match failure {
                Some(e) => {
                    warn!("storage write failed: {e}");
                    self.set_storage_error(Some(e));
                }
                None if applied.iter().any(Result::is_ok) => self.set_storage_error(None),
                None => {}
            }
            for (job, result) in group.into_iter().zip(applied) {
                let result = match (result, &synced) {
                    (Ok(cursors), Ok(())) => Ok(cursors),
                    (Err(e), _) => Err(CommitError::from(e)),
                    (_, Err(e)) => Err(CommitError::Store(e.clone())),
                };
                if let Ok(cursors) = &result {
                    self.publish_job(&job, cursors);
                }
                let _ = job.done.send(result);
            }
            if let Err(e) = self.store.prune_outbox(retain) {
                if !e.is_storage_failure() {
                    warn!("outbox pruning failed: {e}");
                }
            }
            // Between groups no commit is half-way: sled may be reopened for its snapshot.
            self.store.bound_replay();
        }
    }

    /// Publishes one job's outbox frames, with the requester's own answer first or in place of its frame.
    fn publish_job(&self, job: &CommitJob, cursors: &[u64]) {
        let origin_outlet = job.origin.as_ref().and_then(|o| self.fanout.get(o.conn));
        if let (Some(o), Some(outlet)) = (&job.origin, &origin_outlet) {
            if let Some(before) = &o.before {
                outlet.push_frame(before);
            }
        }
        let frames = job.changes.iter().filter_map(|c| match c {
            Change::Outbox(frame) | Change::OutboxOf { frame, .. } => Some(frame),
            _ => None,
        });
        for (i, (frame, cursor)) in frames.zip(cursors).enumerate() {
            let text = encode_text(frame.bytes.clone());
            let reply = job.origin.as_ref().and_then(|o| match &o.reply {
                Some((idx, frame)) if *idx == i => Some((o.conn, frame)),
                _ => None,
            });
            self.publish(*cursor, &text, reply);
            if let Some(note) = &frame.push {
                self.push.push_if_away(*cursor, note);
            }
        }
    }
}
