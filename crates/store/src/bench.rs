//! Queries only the benchmark uses (`jobtrail bench`). They write synthetic rows: never run them on a
//! database you care about — the benchmark makes its own.

use crate::{Store, StoreError};
use chrono::{DateTime, Utc};

/// A table's update counters (`pg_stat_user_tables`): name, updates, HOT updates, dead tuples, and
/// its size with indexes in bytes.
pub type TableUpdates = (String, i64, i64, i64, i64);

impl Store {
    /// Insert `n` synthetic operations in `state` (`observing`: due now; `succeeded`: ballast).
    pub async fn bench_seed(&self, n: i64, state: &str) -> Result<u64, StoreError> {
        assert!(
            matches!(state, "observing" | "succeeded"),
            "bench_seed: observing or succeeded"
        );
        Ok(sqlx::query(include_str!("sql/bench_seed_operations.sql"))
            .bind(n)
            .bind(state)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// Statistics for the seeded tables (bench_analyze.sql), after seeding and before measuring.
    pub async fn bench_analyze(&self) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/bench_analyze.sql"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// One ceiling transaction made of jobtrail's own statements and code: the claim query, then the
    /// fenced batch write a worker's writer lane makes (lock with owner and epoch, the planned
    /// transition with its hash-chained history link, one `UNNEST` statement per table), for up to
    /// `batch` rows, then one commit. Only the provider call (and so the call log row) is missing.
    /// Returns the transitions written.
    pub async fn bench_ceiling_jobtrail(&self, owner: &str, batch: i64) -> Result<u64, StoreError> {
        // The writes' settings (sequential scans ruled out); sorts stay allowed, as in the worker's
        // write transactions: the seeded tables are analysed, so the claim's plan is its steady one.
        let mut tx = self.begin_write().await?;
        // The worker's own claim query, for the one provider the seeded rows belong to.
        let share = crate::ClaimShare {
            provider: "bench".into(),
            fair: batch as i32,
            cap: batch as i32,
            fleet_cap: None,
            reserve: 0,
        };
        let claimed = crate::claim_shares_with(
            &mut *tx,
            owner,
            (batch, batch),
            std::time::Duration::from_secs(60),
            std::slice::from_ref(&share),
        )
        .await?;
        let writes: Vec<(crate::Lease, crate::Step)> = claimed
            .into_iter()
            .map(|c| {
                let step = crate::Step {
                    observation: Some(crate::Observation {
                        remote_state: Some("running".into()),
                        ..Default::default()
                    }),
                    counters: crate::Counters {
                        polls: 1,
                        ..Default::default()
                    },
                    ..crate::Step::event(jobtrail_core::Event::RemoteProgress {
                        remote_state: "running".into(),
                        known: true,
                    })
                };
                (c.lease, step)
            })
            .collect();
        let written = crate::write_batch_in(&mut tx, &writes)
            .await?
            .iter()
            .filter(|r| r.is_ok())
            .count();
        tx.commit().await?;
        Ok(written as u64)
    }

    /// One lean ceiling transaction: claim and history insert for up to `batch` rows in one
    /// hand-tuned statement, then one narrow update moving their heads (no fencing read, no
    /// planning). A bound no real write path reaches; printed for comparison.
    pub async fn bench_ceiling_step(&self, batch: i64) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let linked: Vec<(uuid::Uuid,)> =
            sqlx::query_as(include_str!("sql/bench_ceiling_history.sql"))
                .bind(batch)
                .fetch_all(&mut *tx)
                .await?;
        let ids: Vec<uuid::Uuid> = linked.into_iter().map(|(id,)| id).collect();
        let n = sqlx::query(include_str!("sql/bench_ceiling_advance.sql"))
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    /// Write transactions so far (transaction ids consumed on the server; see bench_commits.sql).
    pub async fn bench_commits(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(include_str!("sql/bench_commits.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }

    /// (commits pg_stat_database has counted for this database, sessions named `application`
    /// still connected to it).
    pub async fn bench_stat_commits(&self, application: &str) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(include_str!("sql/bench_stat_commits.sql"))
            .bind(application)
            .fetch_one(&self.pool)
            .await?)
    }

    pub async fn bench_dead_tuples(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(include_str!("sql/bench_dead_tuples.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }

    /// `(table, updates, HOT updates, dead tuples, bytes with indexes)` for `operations` and
    /// `operation_schedule` (bench_table_updates.sql).
    pub async fn bench_table_updates(&self) -> Result<Vec<TableUpdates>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/bench_table_updates.sql"))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Whether the server records per-statement times (pg_stat_statements preloaded); if so, the
    /// extension is created in this database so its figures can be read.
    pub async fn bench_statements_enable(&self) -> Result<bool, StoreError> {
        let (loaded,): (bool,) = sqlx::query_as(include_str!("sql/bench_statements_enable.sql"))
            .fetch_one(&self.pool)
            .await?;
        if loaded {
            sqlx::query(include_str!("sql/bench_statements_create.sql"))
                .execute(&self.pool)
                .await?;
        }
        Ok(loaded)
    }

    /// Forget this database's per-statement figures.
    pub async fn bench_statements_reset(&self) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/bench_statements_reset.sql"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The `limit` statements that took most of this database's time since the reset:
    /// `(first line, calls, rows, milliseconds)`.
    pub async fn bench_statements_top(
        &self,
        limit: i64,
    ) -> Result<Vec<(String, i64, i64, f64)>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/bench_statements_top.sql"))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn bench_make_due(&self) -> Result<u64, StoreError> {
        Ok(sqlx::query(include_str!("sql/bench_make_due.sql"))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// Operations created since `since`: (id, state, finished_at).
    pub async fn bench_run(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(uuid::Uuid, String, Option<DateTime<Utc>>)>, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/operation_list_finished_since.sql"))
                .bind(since)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// VACUUM (ANALYZE) the operations table.
    pub async fn bench_vacuum(&self) -> Result<(), StoreError> {
        sqlx::raw_sql("VACUUM (ANALYZE) operations")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// End every unfinished operation created since `since` (benchmark phases clean up after themselves).
    pub async fn bench_retire_since(&self, since: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let linked: Vec<(uuid::Uuid,)> =
            sqlx::query_as(include_str!("sql/bench_retire_history.sql"))
                .bind(since)
                .fetch_all(&mut *tx)
                .await?;
        let ids: Vec<uuid::Uuid> = linked.into_iter().map(|(id,)| id).collect();
        let n = sqlx::query(include_str!("sql/bench_retire_since.sql"))
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    /// (id, lease owner, lease expiry) of operations created since `since`.
    pub async fn bench_leases_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<(uuid::Uuid, Option<String>, Option<DateTime<Utc>>)>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/bench_leases_since.sql"))
            .bind(since)
            .fetch_all(&self.pool)
            .await?)
    }
}
