//! One listening connection per process on the state channel, fanned out to the waiters of the
//! operation each notification names (a registry keyed by operation: a change wakes its own
//! waiters, not every waiter of the process, and a burst of changes to other operations never makes
//! a waiter re-read). A notification is a hint to re-read the row, never the truth: every waiter
//! also re-reads when the listener (re)connects (notifications may have been lost meanwhile) and, as
//! a last resort, after [`FALLBACK`] without any notification for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobtrail_core::OperationId;
use jobtrail_store::Store;
use tokio::sync::watch;

/// A waiter re-reads at least this often, whatever the channel says.
const FALLBACK: Duration = Duration::from_secs(30);
/// Pause before listening again after the connection failed.
const RECONNECT: Duration = Duration::from_secs(1);

/// The waiters of each operation someone waits for: a counter bumped at each notification about it.
#[derive(Default)]
pub(crate) struct Registry {
    waiting: Mutex<HashMap<OperationId, watch::Sender<u64>>>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<OperationId, watch::Sender<u64>>> {
        // A panic while holding the lock leaves the map whole (every change is one insert or
        // remove): go on with it.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wake the waiters of `id` (none: nothing to do).
    pub(crate) fn changed(&self, id: OperationId) {
        if let Some(tx) = self.map().get(&id) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wake every waiter (anything may have changed).
    pub(crate) fn all_changed(&self) {
        for tx in self.map().values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Waiting for `id` from now on: a change after this call is not missed.
    pub(crate) fn subscribe(self: &Arc<Self>, id: OperationId) -> Subscription {
        let rx = self
            .map()
            .entry(id)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Subscription {
            registry: self.clone(),
            id,
            rx: Some(rx),
        }
    }

    /// Operations with a waiter now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

pub(crate) struct Watcher {
    registry: Arc<Registry>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub(crate) fn start(store: Store) -> Self {
        let registry = Arc::new(Registry::default());
        let wake = registry.clone();
        let task = tokio::spawn(async move {
            loop {
                match store.listen_states().await {
                    Ok(mut l) => {
                        wake.all_changed();
                        loop {
                            match l.next().await {
                                Ok(Some(id)) => wake.changed(id),
                                Ok(None) => wake.all_changed(),
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
        Self { registry, task }
    }

    pub(crate) fn subscribe(&self, id: OperationId) -> Subscription {
        self.registry.subscribe(id)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One waiter of one operation; the operation leaves the registry with its last waiter.
pub(crate) struct Subscription {
    registry: Arc<Registry>,
    id: OperationId,
    rx: Option<watch::Receiver<u64>>,
}

impl Subscription {
    /// Resolves when the operation may have changed since the last call (or the subscription):
    /// re-read it.
    pub(crate) async fn changed(&mut self) {
        let Some(rx) = self.rx.as_mut() else {
            return;
        };
        // The sender lives in the registry as long as this receiver does: an error cannot happen,
        // and would only mean "re-read".
        let _ = tokio::time::timeout(FALLBACK, rx.changed()).await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut map = self.registry.map();
        if map.get(&self.id).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> OperationId {
        OperationId::from_uuid(uuid::Uuid::now_v7())
    }

    const SOON: Duration = Duration::from_millis(100);

    async fn woken(s: &mut Subscription) -> bool {
        tokio::time::timeout(SOON, s.changed()).await.is_ok()
    }

    #[tokio::test]
    async fn a_change_wakes_only_its_own_waiters_and_a_burst_of_others_none() {
        let r = Arc::new(Registry::default());
        let (a, b) = (id(), id());
        let mut wa = r.subscribe(a);
        let mut wa2 = r.subscribe(a);
        let mut wb = r.subscribe(b);
        // Ten thousand changes to other operations (more than any channel's capacity) wake no one.
        for _ in 0..10_000 {
            r.changed(b);
            r.changed(id());
        }
        assert!(
            !woken(&mut wa).await,
            "a waiter of a woken by changes to others"
        );
        assert!(woken(&mut wb).await);
        // A change before the waiter awaits is not missed; both waiters of `a` wake.
        r.changed(a);
        assert!(woken(&mut wa).await && woken(&mut wa2).await);
        assert!(!woken(&mut wa).await, "one change, one wake");
        // Reconnected: everyone re-reads.
        r.all_changed();
        assert!(woken(&mut wa).await && woken(&mut wb).await);
        // The registry holds only operations someone waits for.
        assert_eq!(r.len(), 2);
        drop(wa);
        assert_eq!(r.len(), 2, "a still has a waiter");
        drop(wa2);
        drop(wb);
        assert_eq!(r.len(), 0);
    }
}
