//! One shutdown signal every long-lived task listens to, and a completion guard the server awaits
//! before the final flush.
//!
//! Why both halves: telling tasks to stop is not enough on a box that may lose power a second
//! later. The store's last flush and the clean-stop witness must come after the committer has
//! written what it accepted, after each socket has sent its close frame, and after the cron, the
//! agent monitor and the control socket have let go; otherwise the flush races work still under
//! way. Each task holds a [`Listener`]; dropping it (by returning) is how the task says it is done,
//! so a task cannot forget to report, and the server's wait ends exactly when the last one returns,
//! or at its bound.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// The server's side: starts the shutdown and waits for every listener to be dropped.
pub struct Shutdown {
    notify: watch::Sender<bool>,
    /// Cloned into every [`Listener`]; the server's own copy is dropped when it starts waiting.
    done_tx: mpsc::Sender<()>,
    /// Yields `None` once every sender (every listener) is gone: nothing is ever sent on it.
    done_rx: mpsc::Receiver<()>,
}

/// A task's side: tells the task to stop, and (dropped) tells the server it has.
#[derive(Clone)]
pub struct Listener {
    notify: watch::Receiver<bool>,
    _done: mpsc::Sender<()>,
}

/// Tasks still running when the bound ran out (the server flushes anyway; they are logged).
#[derive(Debug, thiserror::Error)]
#[error("{0} task(s) had not finished within the shutdown bound")]
pub struct Lingering(pub usize);

impl Shutdown {
    pub fn new() -> Shutdown {
        let (notify, _) = watch::channel(false);
        let (done_tx, done_rx) = mpsc::channel(1);
        Shutdown {
            notify,
            done_tx,
            done_rx,
        }
    }

    /// A listener for one more task. Taken before the task is spawned, so a task that has not
    /// started yet is still waited for.
    pub fn listener(&self) -> Listener {
        Listener {
            notify: self.notify.subscribe(),
            _done: self.done_tx.clone(),
        }
    }

    /// Tells every listener, present and future, to stop.
    pub fn begin(&self) {
        self.notify.send_replace(true);
    }

    /// Begins the shutdown (if not yet) and waits until every listener is dropped, for at most
    /// `bound`.
    pub async fn complete(self, bound: Duration) -> Result<(), Lingering> {
        self.begin();
        let Shutdown {
            notify: _notify,
            done_tx,
            mut done_rx,
        } = self;
        // Our own sender would keep the channel open forever.
        let weak = done_tx.downgrade();
        drop(done_tx);
        match tokio::time::timeout(bound, done_rx.recv()).await {
            Ok(_) => Ok(()),
            Err(_) => Err(Lingering(weak.strong_count())),
        }
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Listener {
    /// Whether the shutdown has begun (for loops that check between steps).
    pub fn is_shutdown(&self) -> bool {
        *self.notify.borrow()
    }

    /// Resolves once the shutdown has begun; at once if it already has. Cancel-safe, so it can
    /// stand in a `select!` beside the task's own work.
    pub async fn recv(&mut self) {
        // An error means the `Shutdown` is gone, which only happens on the way out: stop too.
        let _ = self.notify.wait_for(|begun| *begun).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn complete_waits_for_every_listener_and_no_longer() {
        let shutdown = Shutdown::new();
        let mut quick = shutdown.listener();
        let mut slow = shutdown.listener();
        let finished = std::rc::Rc::new(std::cell::Cell::new(0));
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let f = finished.clone();
                tokio::task::spawn_local(async move {
                    quick.recv().await;
                    f.set(f.get() + 1);
                });
                let f = finished.clone();
                tokio::task::spawn_local(async move {
                    slow.recv().await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    f.set(f.get() + 1);
                });
                shutdown.complete(Duration::from_secs(2)).await.unwrap();
                assert_eq!(
                    finished.get(),
                    2,
                    "complete returned before a listener was done"
                );
            })
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_does_not_stop_is_counted_after_the_bound() {
        let shutdown = Shutdown::new();
        let stuck = shutdown.listener();
        let _also = stuck.clone();
        let started = tokio::time::Instant::now();
        let err = shutdown.complete(Duration::from_secs(3)).await.unwrap_err();
        assert_eq!(err.0, 2);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        drop(stuck);
    }

    #[tokio::test]
    async fn a_listener_taken_after_begin_sees_it_at_once() {
        let shutdown = Shutdown::new();
        shutdown.begin();
        let mut late = shutdown.listener();
        assert!(late.is_shutdown());
        late.recv().await;
    }
}
