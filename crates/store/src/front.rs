//! What the front door (HTTP API, MCP server, webhook receiver) needs from the database: pages of
//! operations, API tokens by digest, webhook deliveries recorded once, and the state channel waiters
//! listen on.

use chrono::{DateTime, Utc};
use jobtrail_core::{OperationId, State};

use crate::record::{OperationRecord, OperationRow};
use crate::{Store, StoreError};

/// The channel every state change is announced on (see `sql/notify_state.sql`).
pub const STATE_CHANNEL: &str = "jobtrail_state";

/// The most operations one page of a listing reads (its caller's, below the cursor) to find those
/// its filters match: ten of the largest pages. A listing's cost is bounded by it, not by how many
/// operations there are.
pub const LIST_SCAN_MOST: i64 = 2_000;

/// A page of operations as read: those that matched, and, for a page that came back short (fewer
/// than asked for) because it read [`LIST_SCAN_MOST`] of them, the last one it read, below which
/// the next page starts. `None`: nothing past what was read (or a full page: the next starts
/// below its last operation).
#[derive(Debug)]
pub struct ListPage {
    pub operations: Vec<OperationRecord>,
    pub scanned_past: Option<OperationId>,
}

/// Filters for a page of operations; `None` is "any".
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<State>,
    pub provider: Option<String>,
    pub caller: Option<String>,
    pub created_from: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only ids below this one (the previous page's last id).
    pub before: Option<OperationId>,
}

/// An API token as stored (never the token itself: only its SHA-256 is kept).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct TokenRecord {
    pub id: uuid::Uuid,
    pub caller: String,
    pub scopes: Vec<String>,
    pub note: Option<String>,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
}

/// A new token's row.
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    pub caller: &'a str,
    pub scopes: &'a [String],
    pub sha256: [u8; 32],
    pub note: Option<&'a str>,
    pub created_by: &'a str,
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a webhook delivery led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryOutcome {
    /// The operation was made due for a status read (or, while a worker holds its lease, marked so
    /// that its next read is due as soon as that worker records the one in flight).
    Scheduled,
    /// No operation of this provider holds the job.
    NoOperation,
    /// The operation is not waiting for a status read (finished, held for a person), or is due
    /// for one already.
    NotObserving,
}

impl DeliveryOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::NoOperation => "no_operation",
            Self::NotObserving => "not_observing",
        }
    }
}

/// A webhook delivery, recorded once per (provider, event id).
#[derive(Debug, Clone)]
pub enum Delivery {
    /// First time this event id was seen.
    New {
        outcome: DeliveryOutcome,
        operation_id: Option<OperationId>,
    },
    /// A duplicate or replay: nothing was done.
    Duplicate,
}

/// Wake-ups for waiters: the ids of operations whose state changed.
pub struct StateListener(sqlx::postgres::PgListener);

impl StateListener {
    /// The next operation whose state changed; `None` when anything may have changed (the connection
    /// was lost and is re-established on the next call, or a payload was not an id). `Err` when
    /// listening failed altogether.
    pub async fn next(&mut self) -> Result<Option<OperationId>, StoreError> {
        Ok(self
            .0
            .try_recv()
            .await?
            .and_then(|n| n.payload().parse().ok()))
    }
}

impl Store {
    /// One operation as the doors show it: its request body is `null` (see the SQL).
    pub async fn get_shown(&self, id: OperationId) -> Result<OperationRecord, StoreError> {
        let row: Option<OperationRow> = sqlx::query_as(include_str!("sql/operation_get_shown.sql"))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
        row.ok_or(StoreError::NotFound(id))?.try_into()
    }

    /// One page of operations, newest first, each **without its request body** (`null`): a page is
    /// for listing; read an operation on its own for its request. It holds at most `limit`
    /// operations from the next [`LIST_SCAN_MOST`] of the caller's (any caller's, with none given)
    /// below the cursor: a filter that matches few gives a short page, and
    /// [`ListPage::scanned_past`] says where the next one starts.
    pub async fn list_page(&self, filter: &ListFilter, limit: i64) -> Result<ListPage, StoreError> {
        let mut tx = self
            .pool
            .begin_with(include_str!("sql/begin_listing.sql"))
            .await?;
        let before = filter.before.map(|b| b.as_uuid());
        let rows: Vec<OperationRow> = sqlx::query_as(include_str!("sql/operation_list_page.sql"))
            .bind(before)
            .bind(filter.state.map(|s| s.as_str()))
            .bind(filter.provider.as_deref())
            .bind(filter.caller.as_deref())
            .bind(filter.created_from)
            .bind(filter.created_before)
            .bind(limit)
            .bind(LIST_SCAN_MOST)
            .fetch_all(&mut *tx)
            .await?;
        // A full page ends at its last operation; a short one scanned LIST_SCAN_MOST, or to the end.
        let scanned_past = if (rows.len() as i64) < limit {
            sqlx::query_scalar(include_str!("sql/operation_list_scan_end.sql"))
                .bind(before)
                .bind(filter.caller.as_deref())
                .bind(LIST_SCAN_MOST)
                .fetch_optional(&mut *tx)
                .await?
                .map(OperationId::from_uuid)
        } else {
            None
        };
        tx.commit().await?;
        Ok(ListPage {
            operations: rows
                .into_iter()
                .map(TryInto::try_into)
                .collect::<Result<_, _>>()?,
            scanned_past,
        })
    }

    /// A listener on the state channel.
    pub async fn listen_states(&self) -> Result<StateListener, StoreError> {
        let mut l = self.listener().await?;
        l.listen(STATE_CHANNEL).await?;
        Ok(StateListener(l))
    }

    /// A token whose digest is already stored (live or revoked: a leaked one is never made live
    /// again) is refused as a conflict.
    pub async fn insert_token(&self, t: &NewToken<'_>) -> Result<TokenRecord, StoreError> {
        sqlx::query_as(include_str!("sql/token_insert.sql"))
            .bind(uuid::Uuid::now_v7())
            .bind(t.caller)
            .bind(t.scopes)
            .bind(t.sha256.as_slice())
            .bind(t.note)
            .bind(t.created_by)
            .bind(t.expires_at)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(db)
                    if db.constraint() == Some("api_tokens_token_sha256_key") =>
                {
                    StoreError::Conflict(
                        "a token with this value is stored already (live or revoked): make another"
                            .into(),
                    )
                }
                e => e.into(),
            })
    }

    /// The live (not revoked, not expired) token with this digest.
    pub async fn live_token(&self, sha256: &[u8; 32]) -> Result<Option<TokenRecord>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/token_find_live.sql"))
            .bind(sha256.as_slice())
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/token_list.sql"))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Revoke a token (idempotent); `None` if there is no such token.
    pub async fn revoke_token(
        &self,
        id: uuid::Uuid,
        by: &str,
    ) -> Result<Option<TokenRecord>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/token_revoke.sql"))
            .bind(id)
            .bind(by)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The digests of the live tokens, at most `most` of them.
    pub async fn live_token_digests(&self, most: i64) -> Result<Vec<[u8; 32]>, StoreError> {
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(include_str!("sql/token_live_digests.sql"))
            .bind(most)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(d,)| <[u8; 32]>::try_from(d.as_slice()).ok())
            .collect())
    }

    /// Revoke the token with this digest (idempotent); `None` if no token has it.
    pub async fn revoke_token_by_digest(
        &self,
        sha256: &[u8; 32],
        by: &str,
    ) -> Result<Option<TokenRecord>, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/token_revoke_by_digest.sql"))
                .bind(&sha256[..])
                .bind(by)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Record a verified webhook delivery and, the first time its event id is seen, make the
    /// operation holding the job due for a status read. One transaction: a delivery is either
    /// recorded with its effect or not at all (the provider retries it).
    pub async fn webhook_delivered(
        &self,
        provider: &str,
        event_id: &str,
        remote_job_id: Option<&str>,
        retention: std::time::Duration,
    ) -> Result<Delivery, StoreError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<(uuid::Uuid, String)> = match remote_job_id {
            Some(job) => {
                sqlx::query_as(include_str!("sql/operation_find_by_provider_job.sql"))
                    .bind(provider)
                    .bind(job)
                    .fetch_optional(&mut *tx)
                    .await?
            }
            None => None,
        };
        // Marked for the worker holding it: no other worker needs waking.
        let mut held = false;
        let (outcome, op) = match (&found, remote_job_id) {
            (Some((id, _)), Some(job)) => {
                let poked: Option<(uuid::Uuid, bool)> =
                    sqlx::query_as(include_str!("sql/operation_poke_by_remote_job.sql"))
                        .bind(provider)
                        .bind(job)
                        .bind(crate::write::WEBHOOK_READ_FLOOR.as_millis() as i64)
                        .fetch_optional(&mut *tx)
                        .await?;
                let outcome = if poked.is_some() {
                    DeliveryOutcome::Scheduled
                } else {
                    DeliveryOutcome::NotObserving
                };
                held = poked.is_some_and(|(_, held)| held);
                (outcome, Some(*id))
            }
            _ => (DeliveryOutcome::NoOperation, None),
        };
        let inserted: Option<(DateTime<Utc>,)> =
            sqlx::query_as(include_str!("sql/webhook_delivery_insert.sql"))
                .bind(provider)
                .bind(event_id)
                .bind(remote_job_id)
                .bind(op)
                .bind(outcome.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if inserted.is_none() {
            // Seen before: undo the schedule (a replay must change nothing).
            tx.rollback().await?;
            return Ok(Delivery::Duplicate);
        }
        if outcome == DeliveryOutcome::Scheduled
            && !held
            && let Some(id) = op
        {
            sqlx::query(include_str!("sql/notify_work.sql"))
                .bind(id.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        // The delivery is recorded: a prune that fails (the next one catches up) must not answer
        // it as if nothing was, or the provider's redelivery would be taken for a duplicate.
        if let Err(e) = self.prune_deliveries(retention).await {
            tracing::warn!(error = %e, "old webhook deliveries were not pruned; the next delivery tries again");
        }
        Ok(Delivery::New {
            outcome,
            operation_id: op.map(OperationId::from_uuid),
        })
    }

    async fn prune_deliveries(&self, retention: std::time::Duration) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/webhook_delivery_prune.sql"))
            .bind(retention.as_secs_f64())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

impl Store {
    /// Wake whoever waits on these operations (a long poll, an MCP wait): their state changed.
    ///
    /// Sent after the write committed, in a statement of its own, never inside the write: a
    /// transaction that notifies takes a cluster-wide lock at commit, held through its WAL flush, so
    /// notifying inside the workers' writes serialised their commits (the batched ceiling of
    /// `jobtrail bench` fell by 40 %). A lost announcement costs a waiter at most its fallback
    /// re-read, so a failure here is logged, not returned.
    pub(crate) async fn announce(&self, moved: Vec<String>) {
        if moved.is_empty() {
            return;
        }
        if let Err(e) = sqlx::query(include_str!("sql/notify_state.sql"))
            .bind(moved)
            .execute(&self.pool)
            .await
        {
            tracing::debug!(error = %e, "state announcement not sent; waiters fall back to re-reading");
        }
    }
}
