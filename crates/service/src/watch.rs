//! One listening connection per process on the state channel, fanned out to every waiter. A
//! notification is a hint to re-read the row, never the truth: a waiter also re-reads when the
//! listener (re)connects (notifications may have been lost meanwhile) and, as a last resort, after
//! [`FALLBACK`] without any notification for it.

use std::time::Duration;

use jobtrail_core::OperationId;
use jobtrail_store::Store;
use tokio::sync::broadcast;

/// A waiter re-reads at least this often, whatever the channel says.
const FALLBACK: Duration = Duration::from_secs(30);
/// Pause before listening again after the connection failed.
const RECONNECT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
enum Wake {
    One(OperationId),
    /// Anything may have changed (the listener reconnected, or a payload was not an id).
    All,
}

pub(crate) struct Watcher {
    tx: broadcast::Sender<Wake>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub(crate) fn start(store: Store) -> Self {
        let (tx, _) = broadcast::channel(4096);
        let sender = tx.clone();
        let task = tokio::spawn(async move {
            loop {
                match store.listen_states().await {
                    Ok(mut l) => {
                        let _ = sender.send(Wake::All);
                        loop {
                            match l.next().await {
                                Ok(Some(id)) => {
                                    let _ = sender.send(Wake::One(id));
                                }
                                Ok(None) => {
                                    let _ = sender.send(Wake::All);
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "state listener lost; listening again");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot listen for state changes"),
                }
                tokio::time::sleep(RECONNECT).await;
            }
        });
        Self { tx, task }
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.tx.subscribe(),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) struct Subscription {
    rx: broadcast::Receiver<Wake>,
}

impl Subscription {
    /// Resolves when `id` may have changed: re-read it.
    pub(crate) async fn changed(&mut self, id: OperationId) {
        let fallback = tokio::time::sleep(FALLBACK);
        tokio::pin!(fallback);
        loop {
            tokio::select! {
                r = self.rx.recv() => match r {
                    Ok(Wake::One(x)) if x != id => continue,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        (&mut fallback).await;
                        return;
                    }
                },
                _ = &mut fallback => return,
            }
        }
    }
}
