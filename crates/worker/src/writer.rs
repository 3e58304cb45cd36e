//! Group commit: the steps of many operations written in one transaction.
//!
//! Each operation's step still writes all of itself or nothing, fenced by its own lease; what is
//! shared is the transaction and its commit (one WAL flush for many transitions). Batches form
//! naturally: while one batch is being written, the next queues up; a lone write goes at once.

use jobtrail_store::{Applied, Lease, Step, Store, StoreError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Reply = oneshot::Sender<Result<Applied, StoreError>>;

/// A handle to the writer tasks.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<(Lease, Step, Reply)>,
    counts: std::sync::Arc<Counts>,
}

/// How many transactions carried how many steps.
#[derive(Debug, Default)]
pub struct Counts {
    pub transactions: std::sync::atomic::AtomicU64,
    pub steps: std::sync::atomic::AtomicU64,
}

impl Writer {
    /// Start `lanes` writer tasks, each taking up to `max_batch` queued writes per transaction.
    ///
    /// A batch not answered `within` (`WorkerConfig::db_answer_within`) is given up, each of its writes answered
    /// `CommitUnknown`: its COMMIT may have been applied, its answer lost on a connection whose
    /// server went silent (see [`crate::answered_within`]). Without the bound that one lost answer
    /// would hold this lane, and every step queued behind it, for ever.
    pub fn start(store: Store, lanes: usize, max_batch: usize, within: Duration) -> Self {
        let (tx, rx) = mpsc::channel::<(Lease, Step, Reply)>(4096);
        let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
        let counts = std::sync::Arc::new(Counts::default());
        for _ in 0..lanes.max(1) {
            let (store, rx, counts) = (store.clone(), rx.clone(), counts.clone());
            tokio::spawn(async move {
                loop {
                    let mut batch = Vec::new();
                    {
                        let mut rx = rx.lock().await;
                        match rx.recv().await {
                            Some(first) => batch.push(first),
                            None => return,
                        }
                        while batch.len() < max_batch {
                            match rx.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                    }
                    let (writes, replies): (Vec<_>, Vec<_>) =
                        batch.into_iter().map(|(l, s, r)| ((l, s), r)).unzip();
                    counts
                        .transactions
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    counts
                        .steps
                        .fetch_add(writes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    let (steps, began) = (writes.len(), std::time::Instant::now());
                    let results = match tokio::time::timeout(within, store.apply_many(writes)).await
                    {
                        Ok(results) => results,
                        Err(_) => {
                            let why = crate::no_answer(within);
                            tracing::error!(
                                steps,
                                "{why}: the steps may or may not be written; whoever holds each operation next reads it afresh"
                            );
                            (0..steps)
                                .map(|_| Err(StoreError::CommitUnknown(why.clone())))
                                .collect()
                        }
                    };
                    crate::metrics::written(steps, began.elapsed());
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                }
            });
        }
        Self { tx, counts }
    }

    /// (transactions, steps) written so far.
    pub fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.counts.transactions.load(Relaxed),
            self.counts.steps.load(Relaxed),
        )
    }

    /// Write one step (batched with whatever else is waiting).
    pub async fn apply(&self, lease: &Lease, step: Step) -> Result<Applied, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((lease.clone(), step, reply))
            .await
            .map_err(|_| StoreError::Unavailable("the writer stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the writer dropped a write".into()))?
    }
}
