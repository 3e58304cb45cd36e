//! Audit: recompute hash chains, and anchor every chain head so that even a whole operation deleted
//! (or a chain rewritten from its first link) is found.

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use jobtrail_core::OperationId;
use jobtrail_core::chain::{self, ChainBreak, GENESIS, HeadsHasher};

use crate::record::{HistoryRecord, HistoryRow};
use crate::{Store, StoreError};

/// The result of verifying chains (and, when checked, the latest anchor).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    pub operations: u64,
    pub rows: u64,
    pub breaks: Vec<ChainBreak>,
    /// The anchor that was checked, if any.
    pub anchor: Option<Anchor>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.breaks.is_empty()
    }
}

/// A checkpoint over every operation's chain head.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Anchor {
    pub id: i64,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub operations: i64,
    pub digest: String,
}

/// An anchored head that no longer holds.
#[derive(sqlx::FromRow)]
struct BrokenHead {
    operation_id: uuid::Uuid,
    seq: i64,
    anchored: Vec<u8>,
    current: Option<Vec<u8>>,
    operation_exists: bool,
}

impl Store {
    // ----------------------------------------------------------------------------------------------
    // Audit
    // ----------------------------------------------------------------------------------------------

    /// Recompute one operation's chain and compare its end with the head recorded on the operation.
    pub async fn verify_operation(&self, id: OperationId) -> Result<VerifyReport, StoreError> {
        let (_, head_seq, head): (uuid::Uuid, i64, Vec<u8>) =
            sqlx::query_as(include_str!("sql/operation_get_head.sql"))
                .bind(id.as_uuid())
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound(id))?;
        let rows = self.history(id).await?;
        let mut report = VerifyReport {
            operations: 1,
            rows: rows.len() as u64,
            ..Default::default()
        };
        check_chain(&id.to_string(), head_seq, &head, &rows, &mut report);
        Ok(report)
    }

    /// Recompute every chain (streamed, so memory stays flat however large history grows): a merge
    /// of the operations' recorded heads with the history rows, both in operation order.
    pub async fn verify_all(&self) -> Result<VerifyReport, StoreError> {
        let heads: Vec<(uuid::Uuid, i64, Vec<u8>)> =
            sqlx::query_as(include_str!("sql/operation_list_heads.sql"))
                .fetch_all(&self.pool)
                .await?;
        let mut report = VerifyReport::default();
        let mut stream = sqlx::query_as::<_, HistoryRow>(include_str!("sql/history_list_all.sql"))
            .fetch(&self.pool);
        let mut next = stream.try_next().await?.map(HistoryRecord::from);
        let orphan = |r: &HistoryRecord, report: &mut VerifyReport| {
            report.rows += 1;
            report.breaks.push(ChainBreak {
                operation_id: r.operation_id.to_string(),
                seq: r.seq,
                problem: "history row of an operation that does not exist".into(),
                expected: "an operations row".into(),
                stored: "none".into(),
            });
        };
        for (id, head_seq, head_hash) in heads {
            while let Some(r) = next.as_ref().filter(|r| r.operation_id.as_uuid() < id) {
                orphan(r, &mut report);
                next = stream.try_next().await?.map(HistoryRecord::from);
            }
            let mut rows = Vec::new();
            while let Some(r) = next.take() {
                if r.operation_id.as_uuid() != id {
                    next = Some(r);
                    break;
                }
                rows.push(r);
                next = stream.try_next().await?.map(HistoryRecord::from);
            }
            report.operations += 1;
            report.rows += rows.len() as u64;
            let op = OperationId::from_uuid(id).to_string();
            check_chain(&op, head_seq, &head_hash, &rows, &mut report);
        }
        while let Some(r) = next {
            orphan(&r, &mut report);
            next = stream.try_next().await?.map(HistoryRecord::from);
        }
        Ok(report)
    }

    /// Anchor every chain head: one digest over all heads, stored with its time, in one consistent
    /// snapshot. Print the digest and keep it outside the database.
    pub async fn anchor(&self, created_by: &str) -> Result<Anchor, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await?;
        let mut hasher = HeadsHasher::default();
        {
            let mut heads = sqlx::query_as::<_, (uuid::Uuid, i64, Vec<u8>)>(include_str!(
                "sql/operation_list_heads.sql"
            ))
            .fetch(&mut *tx);
            while let Some((id, seq, hash)) = heads.try_next().await? {
                hasher.add(&OperationId::from_uuid(id).to_string(), seq, &hash);
            }
        }
        let count = hasher.count() as i64;
        let digest = hex::encode(hasher.finish());
        let (id, created_at): (i64, DateTime<Utc>) =
            sqlx::query_as(include_str!("sql/anchor_insert.sql"))
                .bind(created_by)
                .bind(count)
                .bind(&digest)
                .fetch_one(&mut *tx)
                .await?;
        sqlx::query(include_str!("sql/anchor_heads_insert_from_operations.sql"))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Anchor {
            id,
            created_at,
            created_by: created_by.to_owned(),
            operations: count,
            digest,
        })
    }

    pub async fn latest_anchor(&self) -> Result<Option<Anchor>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/anchor_get_latest.sql"))
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Check an anchor: its recorded heads must still hash to its digest (and to `expected_digest`, a
    /// copy kept outside the database, when given), and every anchored link must still exist with the
    /// anchored hash.
    pub async fn verify_anchor(
        &self,
        anchor: &Anchor,
        expected_digest: Option<&str>,
    ) -> Result<Vec<ChainBreak>, StoreError> {
        let mut breaks = Vec::new();
        let tag = format!("anchor #{}", anchor.id);
        if let Some(want) = expected_digest
            && !want.eq_ignore_ascii_case(&anchor.digest)
        {
            breaks.push(ChainBreak {
                operation_id: tag.clone(),
                seq: 0,
                problem: "the anchor in the database is not the one kept outside it".into(),
                expected: want.to_ascii_lowercase(),
                stored: anchor.digest.clone(),
            });
        }
        let mut hasher = HeadsHasher::default();
        let mut heads = sqlx::query_as::<_, (uuid::Uuid, i64, Vec<u8>)>(include_str!(
            "sql/anchor_heads_list.sql"
        ))
        .bind(anchor.id)
        .fetch(&self.pool);
        while let Some((id, seq, hash)) = heads.try_next().await? {
            hasher.add(&OperationId::from_uuid(id).to_string(), seq, &hash);
        }
        drop(heads);
        let count = hasher.count() as i64;
        let digest = hex::encode(hasher.finish());
        if digest != anchor.digest || count != anchor.operations {
            breaks.push(ChainBreak {
                operation_id: tag.clone(),
                seq: 0,
                problem: "the anchor's recorded heads no longer hash to its digest (heads altered)"
                    .into(),
                expected: format!("{} over {} heads", anchor.digest, anchor.operations),
                stored: format!("{digest} over {count} heads"),
            });
        }
        let broken: Vec<BrokenHead> =
            sqlx::query_as(include_str!("sql/anchor_list_broken_heads.sql"))
                .bind(anchor.id)
                .fetch_all(&self.pool)
                .await?;
        for BrokenHead {
            operation_id: id,
            seq,
            anchored,
            current,
            operation_exists: exists,
        } in broken
        {
            let problem = if !exists {
                format!("operation deleted since {tag}")
            } else if current.is_none() {
                format!("history link anchored by {tag} is missing")
            } else {
                format!("history link anchored by {tag} was rewritten")
            };
            breaks.push(ChainBreak {
                operation_id: OperationId::from_uuid(id).to_string(),
                seq,
                problem,
                expected: hex::encode(anchored),
                stored: current.map(hex::encode).unwrap_or_else(|| "none".into()),
            });
        }
        Ok(breaks)
    }

    /// Verify every chain and the latest anchor.
    pub async fn verify_everything(
        &self,
        expected_digest: Option<&str>,
    ) -> Result<VerifyReport, StoreError> {
        let mut report = self.verify_all().await?;
        if let Some(anchor) = self.latest_anchor().await? {
            report
                .breaks
                .extend(self.verify_anchor(&anchor, expected_digest).await?);
            report.anchor = Some(anchor);
        }
        Ok(report)
    }
}

fn check_chain(
    op: &str,
    head_seq: i64,
    head_hash: &[u8],
    rows: &[HistoryRecord],
    report: &mut VerifyReport,
) {
    let links: Vec<_> = rows.iter().map(HistoryRecord::link).collect();
    report.breaks.extend(chain::verify(&links));
    let (last_seq, last_hash) = rows
        .last()
        .map(|r| (r.seq, r.hash.clone()))
        .unwrap_or((0, GENESIS.to_vec()));
    if last_seq != head_seq || last_hash != head_hash {
        report.breaks.push(ChainBreak {
            operation_id: op.to_owned(),
            seq: last_seq,
            problem: "chain end does not match the head recorded on the operation (rows removed or appended out of band)".into(),
            expected: format!("#{head_seq} {}", hex::encode(head_hash)),
            stored: format!("#{last_seq} {}", hex::encode(&last_hash)),
        });
    }
}
