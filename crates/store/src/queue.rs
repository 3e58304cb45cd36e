//! What operators look at: the escalation queue and the fleet's numbers.

use chrono::{DateTime, Utc};
use jobtrail_core::{OperationId, State};

use crate::record::{OperationRecord, OperationRow, StoredCall};
use crate::{Store, StoreError};

/// Who holds leases.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct LeaseHolder {
    pub lease_owner: String,
    pub held: i64,
    /// Leases past their expiry (their owner is probably dead; any worker will take them over).
    pub expired: i64,
}

/// A provider the whole fleet is holding back: it answered `429` with `Retry-After`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ProviderPause {
    pub provider: String,
    pub paused_until: DateTime<Utc>,
    pub remaining_secs: f64,
}

/// A provider's operations that a worker should be acting on now, and how long the oldest waited.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ProviderDue {
    pub provider: String,
    pub due: i64,
    /// Since the oldest came due, by the database's clock.
    pub oldest_secs: f64,
}

impl Store {
    /// Per provider, operations due now (or past a lease whose owner is gone) and the oldest's
    /// wait: a provider no worker claims (its contract renamed or removed, no worker running)
    /// shows here as a wait that keeps growing.
    pub async fn due_by_provider(&self) -> Result<Vec<ProviderDue>, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/stats_due_by_provider.sql"))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Operations held for a person (of `caller`'s, if named), oldest first, at most `limit`,
    /// each **without its request body** (`null`, as [`Store::list_page`]).
    pub async fn escalations(
        &self,
        state: Option<State>,
        provider: Option<&str>,
        caller: Option<&str>,
        limit: i64,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        let rows: Vec<OperationRow> =
            sqlx::query_as(include_str!("sql/operation_list_escalated.sql"))
                .bind(state.map(|s| s.as_str()))
                .bind(provider)
                .bind(limit)
                .bind(caller)
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// An operation's most recent calls, newest first.
    pub async fn recent_calls(
        &self,
        id: OperationId,
        limit: i64,
    ) -> Result<Vec<StoredCall>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/call_list_recent.sql"))
            .bind(id.as_uuid())
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The queue's size and its oldest entry.
    pub async fn escalation_stats(&self) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
        Ok(sqlx::query_as(include_str!("sql/stats_escalations.sql"))
            .fetch_one(&self.pool)
            .await?)
    }

    /// Providers paused fleet-wide right now, soonest to resume first.
    pub async fn provider_pauses(&self) -> Result<Vec<ProviderPause>, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/stats_provider_pauses.sql"))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    pub async fn lease_holders(&self) -> Result<Vec<LeaseHolder>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/stats_lease_holders.sql"))
            .fetch_all(&self.pool)
            .await?)
    }
}
