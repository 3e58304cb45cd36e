//! Audit: recompute both hash chains of every operation, check the operation rows and the stored
//! result bytes against what the chains say, and anchor every chain head so that even a whole
//! operation deleted (or a chain rewritten from its first link) is found.
//!
//! What a verification covers, per operation:
//! * the history chain, end to end, against the head recorded on the operation;
//! * the call chain, end to end, against its head (calls logged before calls were chained are
//!   counted as unchained, and must still exist when a history link names them);
//! * the submitted facts (provider, target, fingerprint, caller, approver, approval reference, trace
//!   id, idempotency mode) against the submission link; the state and remote job id against the last
//!   link; the result digest against the last validated result the chain records;
//! * every stored result's bytes against their digest (computed by the database, so a role that may
//!   not read results can verify them), and that digest against the chain.
//!
//! And, with an anchor: that the anchor still hashes to its digest (and to the copy kept outside the
//! database, when given), that every anchored link and call still exists with its anchored hash, and
//! how much evidence lies after it ("unanchored": a writer with database rights could have appended
//! or rewritten it without an anchor noticing).

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use futures::stream::BoxStream;
use jobtrail_core::chain::{
    self, ANCHOR_VERSION, ChainBreak, GENESIS, HeadsHasher, SubmittedFacts,
};
use jobtrail_core::{OperationId, ResultBytes};

use crate::record::{HistoryRecord, HistoryRow, StoredCall};
use crate::{Store, StoreError};

/// The result of verifying chains (and, when checked, an anchor).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    pub operations: u64,
    /// History links verified.
    pub rows: u64,
    /// Provider calls verified through their chain.
    pub calls: u64,
    /// Calls with no chain link (no `seq`, `prev_hash` or `hash`): logged before calls were chained
    /// (checked for existence only), or, in an operation submitted since, also a break.
    pub unchained_calls: u64,
    /// Stored results checked against their digests and the chain.
    pub results: u64,
    /// The breaks found, the first [`MAX_BREAKS_LISTED`] of them.
    pub breaks: Vec<ChainBreak>,
    /// Breaks found beyond those listed (counted, not kept).
    pub breaks_omitted: u64,
    /// The anchor that was checked, if any.
    pub anchor: Option<Anchor>,
    /// Evidence no anchor covers yet (after the checked anchor, or all of it without one).
    pub unanchored: Option<Unanchored>,
}

/// Breaks a report lists at most. One bulk edit can break every operation in the database, and a
/// report is built whole (by an API server, among others): what it holds must not grow with the
/// database. The first breaks name where to look; the rest are counted.
pub const MAX_BREAKS_LISTED: usize = 1000;

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.break_count() == 0
    }

    /// Every break found, listed or not.
    pub fn break_count(&self) -> u64 {
        self.breaks.len() as u64 + self.breaks_omitted
    }

    /// Keep the first [`MAX_BREAKS_LISTED`] breaks, count the rest.
    fn cap_breaks(&mut self) {
        if self.breaks.len() > MAX_BREAKS_LISTED {
            self.breaks_omitted += (self.breaks.len() - MAX_BREAKS_LISTED) as u64;
            self.breaks.truncate(MAX_BREAKS_LISTED);
        }
    }
}

/// Evidence appended after an anchor: intact as far as the chains can tell, but only an anchor kept
/// outside the database bounds what a writer with database rights could have rewritten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Unanchored {
    pub operations: i64,
    pub links: i64,
    pub calls: i64,
}

/// A checkpoint over every operation's chain heads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct Anchor {
    pub id: i64,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub operations: i64,
    pub digest: String,
    /// 1: history heads only; 2: history and call heads.
    pub version: i16,
}

/// An anchor that was named and is not in the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no anchor with digest {0} is in the database: anchors were removed, or this digest belongs to another database"
)]
pub struct AnchorNotFound(pub String);

/// An anchored head that no longer holds.
#[derive(sqlx::FromRow)]
struct BrokenHead {
    operation_id: uuid::Uuid,
    seq: i64,
    anchored: Vec<u8>,
    current: Option<Vec<u8>>,
    operation_exists: bool,
    chain: String,
}

/// An operation row's chain heads, as an anchor takes them.
#[derive(sqlx::FromRow)]
struct Head {
    id: uuid::Uuid,
    history_seq: i64,
    history_head: Vec<u8>,
    calls_seq: i64,
    calls_head: Vec<u8>,
    /// A link or call lies after the head the row names.
    runs_past: bool,
    /// The row's head is no link of its chain (or the calls' genesis hash while it names none).
    off_chain: bool,
}

/// An operation row: its heads and the facts the chain commits to.
#[derive(sqlx::FromRow)]
struct Facts {
    id: uuid::Uuid,
    provider: String,
    target: String,
    request_fingerprint: String,
    caller: String,
    approved_by: String,
    approval_ref: Option<String>,
    edited_by: Option<String>,
    trace_id: String,
    idempotency_mode: String,
    at_most_once: bool,
    created_at: DateTime<Utc>,
    supersedes: Option<uuid::Uuid>,
    superseded_by: Option<uuid::Uuid>,
    state: String,
    remote_job_id: Option<String>,
    result_location: Option<String>,
    result_size: Option<i64>,
    result_sha256: Option<String>,
    result_summary: Option<crate::record::ReadableJson>,
    result_content_type: Option<String>,
    cancel_requested_at: Option<DateTime<Utc>>,
    cancel_requested_by: Option<String>,
    cancel_reason: Option<String>,
    state_changed_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    escalated_at: Option<DateTime<Utc>>,
    escalation_reason: Option<String>,
    conflicting_remote_job_id: Option<String>,
    create_deadline: DateTime<Utc>,
    result_deadline: DateTime<Utc>,
    cancel_deadline: Option<DateTime<Utc>>,
    history_seq: i64,
    history_head: Vec<u8>,
    calls_seq: i64,
    calls_head: Vec<u8>,
}

/// A stored result's recorded digest and the digest of its bytes.
#[derive(sqlx::FromRow)]
struct ResultDigest {
    operation_id: uuid::Uuid,
    sha256: String,
    actual_sha256: String,
}

/// Rows of one query, streamed in operation order, handed out one operation at a time.
struct PerOperation<'a, T> {
    stream: BoxStream<'a, Result<T, sqlx::Error>>,
    next: Option<T>,
    key: fn(&T) -> uuid::Uuid,
}

impl<'a, T> PerOperation<'a, T> {
    async fn new(
        stream: BoxStream<'a, Result<T, sqlx::Error>>,
        key: fn(&T) -> uuid::Uuid,
    ) -> Result<Self, StoreError> {
        let mut s = Self {
            stream,
            next: None,
            key,
        };
        s.next = s.stream.try_next().await?;
        Ok(s)
    }

    /// Rows of operations before `id` (they have no operation row), then the rows of `id`.
    async fn take(&mut self, id: Option<uuid::Uuid>) -> Result<(Vec<T>, Vec<T>), StoreError> {
        let (mut orphans, mut rows) = (Vec::new(), Vec::new());
        while let Some(r) = self.next.take() {
            let k = (self.key)(&r);
            match id {
                Some(id) if k == id => rows.push(r),
                Some(id) if k > id => {
                    self.next = Some(r);
                    break;
                }
                _ => orphans.push(r),
            }
            self.next = self.stream.try_next().await?;
        }
        Ok((orphans, rows))
    }
}

/// How an anchor's own findings are filed (where an operation's id would be).
fn anchor_tag(anchor: &Anchor) -> String {
    format!("anchor #{}", anchor.id)
}

fn orphan(report: &mut VerifyReport, id: uuid::Uuid, seq: i64, what: &str) {
    report.breaks.push(ChainBreak {
        operation_id: OperationId::from_uuid(id).to_string(),
        seq,
        problem: format!("{what} of an operation that does not exist"),
        expected: "an operations row".into(),
        stored: "none".into(),
    });
}

impl Store {
    // ----------------------------------------------------------------------------------------------
    // Audit
    // ----------------------------------------------------------------------------------------------

    /// Verify one operation: both chains, its row's facts, its stored results.
    pub async fn verify_operation(&self, id: OperationId) -> Result<VerifyReport, StoreError> {
        // All four reads as of one instant (see `one_snapshot`).
        let [mut tx] = self.one_snapshot().await?;
        let facts: Option<Facts> = sqlx::query_as(include_str!("sql/operation_get_facts.sql"))
            .bind(id.as_uuid())
            .fetch_optional(&mut *tx)
            .await?;
        let history = crate::history_of(&mut *tx, id).await?;
        let calls = crate::calls_of(&mut *tx, id).await?;
        let results: Vec<ResultDigest> =
            sqlx::query_as(include_str!("sql/result_list_digests.sql"))
                .bind(Some(id.as_uuid()))
                .fetch_all(&mut *tx)
                .await?;
        let mut report = VerifyReport::default();
        let Some(facts) = facts else {
            // The row gone and its evidence left: the deletion is the finding (exit 1), as
            // `--all` reports it, not "no such operation" (exit 3, which a script reads as a
            // mistyped id).
            for l in &history {
                report.rows += 1;
                orphan(&mut report, id.as_uuid(), l.seq, "history row");
            }
            for c in &calls {
                report.calls += 1;
                orphan(
                    &mut report,
                    id.as_uuid(),
                    c.seq.unwrap_or(0),
                    "provider call",
                );
            }
            for _ in &results {
                report.results += 1;
                orphan(&mut report, id.as_uuid(), 0, "stored result");
            }
            if report.breaks.is_empty() {
                return Err(StoreError::NotFound(id));
            }
            report.cap_breaks();
            return Ok(report);
        };
        let cut = cutovers(&mut tx).await?;
        check_operation(&facts, (&history, &calls, &results), cut, &mut report);
        report.cap_breaks();
        Ok(report)
    }

    /// Read-only transactions that all see one snapshot: evidence read through them is as of one
    /// instant, so a step that commits while `verify` reads (a link and the head that names it)
    /// is seen whole or not at all, never as a break.
    async fn one_snapshot<const N: usize>(
        &self,
    ) -> Result<[sqlx::Transaction<'static, sqlx::Postgres>; N], StoreError> {
        let mut first = self.pool.begin().await?;
        sqlx::query(include_str!("sql/snapshot_begin.sql"))
            .execute(&mut *first)
            .await?;
        let (id,): (String,) = sqlx::query_as(include_str!("sql/snapshot_export.sql"))
            .fetch_one(&mut *first)
            .await?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(StoreError::Corrupt(format!(
                "the database named its snapshot {id:?}"
            )));
        }
        let mut all = vec![first];
        while all.len() < N {
            let mut tx = self.pool.begin().await?;
            sqlx::query(include_str!("sql/snapshot_begin.sql"))
                .execute(&mut *tx)
                .await?;
            // Not prepared: each verification names another snapshot.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SET TRANSACTION SNAPSHOT '{id}'"
            )))
            .persistent(false)
            .execute(&mut *tx)
            .await?;
            all.push(tx);
        }
        Ok(all
            .try_into()
            .unwrap_or_else(|_| unreachable!("N transactions")))
    }

    /// The connections [`verify_all`](Self::verify_all) holds at once (one per stream it merges).
    pub const VERIFY_ALL_CONNECTIONS: u32 = 4;

    /// Whether this store's pool can hold what [`verify_all`](Self::verify_all) needs at once
    /// (with fewer it would wait for a connection it holds itself until the pool's timeout).
    pub fn can_verify_all(&self) -> bool {
        self.pool.options().get_max_connections() >= Self::VERIFY_ALL_CONNECTIONS
    }

    /// Verify every operation (streamed, so memory stays flat however large history grows): a merge
    /// of the operation rows with their history, calls and result digests, all in operation order,
    /// all read as of one instant.
    pub async fn verify_all(&self) -> Result<VerifyReport, StoreError> {
        self.verify_all_telling(&mut |_| {}).await
    }

    /// [`verify_all`](Self::verify_all), telling `progress` the report so far after each
    /// operation (a whole database takes minutes: a person is told how far it has come).
    pub async fn verify_all_telling(
        &self,
        progress: &mut (dyn FnMut(&VerifyReport) + Send),
    ) -> Result<VerifyReport, StoreError> {
        if !self.can_verify_all() {
            // Refused at once: it would wait for a connection it holds itself until the pool's
            // timeout, and hold the rest of the pool meanwhile.
            return Err(StoreError::Unavailable(format!(
                "verifying every operation reads {} streams at once, each on its own connection: this pool holds {}",
                Self::VERIFY_ALL_CONNECTIONS,
                self.pool.options().get_max_connections()
            )));
        }
        let mut report = VerifyReport::default();
        let [mut t_ops, mut t_history, mut t_calls, mut t_results] = self
            .one_snapshot::<{ Self::VERIFY_ALL_CONNECTIONS as usize }>()
            .await?;
        let cut = cutovers(&mut t_ops).await?;
        let mut ops = sqlx::query_as::<_, Facts>(include_str!("sql/operation_list_facts.sql"))
            .fetch(&mut *t_ops);
        let mut history = PerOperation::new(
            sqlx::query_as::<_, HistoryRow>(include_str!("sql/history_list_all.sql"))
                .fetch(&mut *t_history),
            HistoryRow::operation_uuid,
        )
        .await?;
        let mut calls = PerOperation::new(
            sqlx::query_as::<_, StoredCall>(include_str!("sql/call_list_all.sql"))
                .fetch(&mut *t_calls),
            |c: &StoredCall| c.operation_id,
        )
        .await?;
        let mut results = PerOperation::new(
            sqlx::query_as::<_, ResultDigest>(include_str!("sql/result_list_digests.sql"))
                .bind(None::<uuid::Uuid>)
                .fetch(&mut *t_results),
            |r: &ResultDigest| r.operation_id,
        )
        .await?;
        loop {
            let op = ops.try_next().await?;
            let id = op.as_ref().map(|o| o.id);
            let (lost_links, links) = history.take(id).await?;
            let (lost_calls, op_calls) = calls.take(id).await?;
            let (lost_results, op_results) = results.take(id).await?;
            for r in lost_links {
                report.rows += 1;
                orphan(&mut report, r.operation_uuid(), r.seq(), "history row");
            }
            for c in lost_calls {
                report.calls += 1;
                orphan(
                    &mut report,
                    c.operation_id,
                    c.seq.unwrap_or(0),
                    "provider call",
                );
            }
            for r in lost_results {
                report.results += 1;
                orphan(&mut report, r.operation_id, 0, "stored result");
            }
            report.cap_breaks();
            let Some(op) = op else { break };
            let links: Vec<HistoryRecord> = links.into_iter().map(HistoryRecord::from).collect();
            check_operation(&op, (&links, &op_calls, &op_results), cut, &mut report);
            report.cap_breaks();
            progress(&report);
        }
        Ok(report)
    }

    /// Anchor every operation's chain heads (history and calls): one digest over all of them,
    /// stored with its time, in one consistent snapshot. Keep the returned anchor outside the
    /// database (`jobtrail-admin audit anchor --out`).
    pub async fn anchor(&self, created_by: &str) -> Result<Anchor, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await?;
        let mut hasher = HeadsHasher::default();
        {
            let mut heads = sqlx::query_as::<_, Head>(include_str!("sql/operation_list_heads.sql"))
                .fetch(&mut *tx);
            while let Some(Head {
                id,
                history_seq: seq,
                history_head: hash,
                calls_seq,
                calls_head: calls_hash,
                runs_past,
                off_chain,
            }) = heads.try_next().await?
            {
                if runs_past {
                    return Err(StoreError::Tampered(format!(
                        "{}'s chain runs past the head its row names (history link {seq}, call {calls_seq}): nothing was anchored; run `jobtrail-admin audit verify` on it",
                        OperationId::from_uuid(id)
                    )));
                }
                if off_chain {
                    return Err(StoreError::Tampered(format!(
                        "{}'s row names a head that is no link of its chain (history link {seq}, call {calls_seq}): nothing was anchored; run `jobtrail-admin audit verify` on it",
                        OperationId::from_uuid(id)
                    )));
                }
                hasher.add_heads(
                    ANCHOR_VERSION,
                    &OperationId::from_uuid(id).to_string(),
                    (seq, &hash),
                    (calls_seq, &calls_hash),
                );
            }
        }
        let count = hasher.count() as i64;
        let digest = hex::encode(hasher.finish());
        let (id, created_at): (i64, DateTime<Utc>) =
            sqlx::query_as(include_str!("sql/anchor_insert.sql"))
                .bind(created_by)
                .bind(count)
                .bind(&digest)
                .bind(ANCHOR_VERSION)
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
            version: ANCHOR_VERSION,
        })
    }

    pub async fn latest_anchor(&self) -> Result<Option<Anchor>, StoreError> {
        Ok(sqlx::query_as(include_str!("sql/anchor_get_latest.sql"))
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The anchor with this digest (a copy kept outside the database names it): of the anchors
    /// recorded with it (the operator's login may add one, with heads of its own making), the
    /// earliest whose heads still hash to it; the earliest of all when none do (reported as
    /// altered). Any anchor whose heads hash to the digest holds the kept copy's heads.
    pub async fn anchor_by_digest(&self, digest: &str) -> Result<Option<Anchor>, StoreError> {
        let candidates: Vec<Anchor> = sqlx::query_as(include_str!("sql/anchor_list_by_digest.sql"))
            .bind(digest.to_ascii_lowercase())
            .fetch_all(&self.pool)
            .await?;
        for a in &candidates {
            if self.heads_digest(a).await? == (a.digest.clone(), a.operations) {
                return Ok(Some(a.clone()));
            }
        }
        Ok(candidates.into_iter().next())
    }

    /// What an anchor's recorded heads hash to now, and how many there are.
    async fn heads_digest(&self, anchor: &Anchor) -> Result<(String, i64), StoreError> {
        let mut hasher = HeadsHasher::default();
        let mut heads =
            sqlx::query_as::<_, (uuid::Uuid, i64, Vec<u8>, Option<i64>, Option<Vec<u8>>)>(
                include_str!("sql/anchor_heads_list.sql"),
            )
            .bind(anchor.id)
            .fetch(&self.pool);
        while let Some((id, seq, hash, calls_seq, calls_hash)) = heads.try_next().await? {
            hasher.add_heads(
                anchor.version,
                &OperationId::from_uuid(id).to_string(),
                (seq, &hash),
                (
                    calls_seq.unwrap_or(0),
                    calls_hash.as_deref().unwrap_or(&GENESIS),
                ),
            );
        }
        let count = hasher.count() as i64;
        Ok((hex::encode(hasher.finish()), count))
    }

    /// Check an anchor: its recorded heads must still hash to its digest, and every anchored link
    /// and call must still exist with the anchored hash. `only`: check one operation's anchored
    /// heads (the digest is always recomputed over all of them).
    /// Breaks go into `report` (streamed, and capped as every report's are).
    pub async fn verify_anchor(
        &self,
        anchor: &Anchor,
        only: Option<OperationId>,
        report: &mut VerifyReport,
    ) -> Result<(), StoreError> {
        let tag = anchor_tag(anchor);
        let (digest, count) = self.heads_digest(anchor).await?;
        if digest != anchor.digest || count != anchor.operations {
            report.breaks.push(ChainBreak {
                operation_id: tag.clone(),
                seq: 0,
                problem: "the anchor's recorded heads no longer hash to its digest (heads altered)"
                    .into(),
                expected: format!("{} over {} heads", anchor.digest, anchor.operations),
                stored: format!("{digest} over {count} heads"),
            });
        }
        let mut broken =
            sqlx::query_as::<_, BrokenHead>(include_str!("sql/anchor_list_broken_heads.sql"))
                .bind(anchor.id)
                .bind(only.map(|o| o.as_uuid()))
                .fetch(&self.pool);
        while let Some(b) = broken.try_next().await? {
            let problem = if !b.operation_exists {
                format!("operation deleted since {tag}")
            } else if b.current.is_none() {
                format!("{} anchored by {tag} is missing", b.chain)
            } else {
                format!("{} anchored by {tag} was rewritten", b.chain)
            };
            report.breaks.push(ChainBreak {
                operation_id: OperationId::from_uuid(b.operation_id).to_string(),
                seq: b.seq,
                problem,
                expected: hex::encode(b.anchored),
                stored: b.current.map(hex::encode).unwrap_or_else(|| "none".into()),
            });
            report.cap_breaks();
        }
        Ok(())
    }

    /// How much evidence lies after `anchor` (all of it without one): of operation `only`, or of
    /// every operation.
    pub async fn unanchored(
        &self,
        anchor: Option<&Anchor>,
        only: Option<OperationId>,
    ) -> Result<Unanchored, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/anchor_count_unanchored.sql"))
                .bind(anchor.map(|a| a.id))
                .bind(only.map(|o| o.as_uuid()))
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Verify every operation and an anchor: the one whose digest `expected_digest` names (kept
    /// outside the database; refused with [`AnchorNotFound`] when it is not there), else the latest.
    pub async fn verify_everything(
        &self,
        expected_digest: Option<&str>,
    ) -> Result<VerifyReport, StoreError> {
        self.verify_everything_telling(expected_digest, &mut |_| {})
            .await
    }

    /// [`verify_everything`](Self::verify_everything), telling `progress` as
    /// [`verify_all_telling`](Self::verify_all_telling) does.
    pub async fn verify_everything_telling(
        &self,
        expected_digest: Option<&str>,
        progress: &mut (dyn FnMut(&VerifyReport) + Send),
    ) -> Result<VerifyReport, StoreError> {
        let anchor = self.anchor_to_check(expected_digest).await?;
        // The anchor's findings (its heads altered, operations deleted since) are listed first:
        // after a bulk edit the chains' breaks alone fill the list, and these say the most.
        let mut found = VerifyReport::default();
        if let Some(anchor) = &anchor {
            self.verify_anchor(anchor, None, &mut found).await?;
        }
        let mut report = self.verify_all_telling(progress).await?;
        found.breaks_omitted += report.breaks_omitted;
        found.breaks.append(&mut report.breaks);
        report.breaks = found.breaks;
        report.breaks_omitted = found.breaks_omitted;
        report.cap_breaks();
        report.unanchored = Some(self.unanchored(anchor.as_ref(), None).await?);
        report.anchor = anchor;
        Ok(report)
    }

    /// Verify one operation, and its heads in the anchor `expected_digest` names (or the latest).
    pub async fn verify_operation_anchored(
        &self,
        id: OperationId,
        expected_digest: Option<&str>,
    ) -> Result<VerifyReport, StoreError> {
        let anchor = self.anchor_to_check(expected_digest).await?;
        let mut report = match (self.verify_operation(id).await, &anchor) {
            (Ok(r), _) => r,
            // Gone, but the anchor recorded it: the deletion is the finding (exit 1), not "no
            // such operation" (exit 3, which a script reads as a mistyped id).
            (Err(StoreError::NotFound(_)), Some(a)) => {
                let mut report = VerifyReport::default();
                self.verify_anchor(a, Some(id), &mut report).await?;
                // Its own findings, and the anchor's (its heads altered: this operation's head
                // deleted with it, say), which are every operation's.
                let tag = anchor_tag(a);
                report
                    .breaks
                    .retain(|b| b.operation_id == id.to_string() || b.operation_id == tag);
                if report.breaks.is_empty() {
                    return Err(StoreError::NotFound(id));
                }
                report.unanchored = Some(self.unanchored(Some(a), Some(id)).await?);
                report.anchor = anchor;
                return Ok(report);
            }
            (Err(e), _) => return Err(e),
        };
        if let Some(anchor) = &anchor {
            // Only `id`'s heads are listed; the digest (over all of them) is checked too.
            self.verify_anchor(anchor, Some(id), &mut report).await?;
        }
        report.unanchored = Some(self.unanchored(anchor.as_ref(), Some(id)).await?);
        report.anchor = anchor;
        Ok(report)
    }

    /// Where a succeeded operation's result is, its digest and its content type, as its (verified)
    /// history chain records them: what may be served (the row's content type is not: a role that
    /// may update the row could make a JSON result `text/html`). `Tampered` if the chain does not
    /// verify or the row names other bytes than the chain does.
    pub async fn chained_result(&self, id: OperationId) -> Result<ChainedResult, StoreError> {
        let history = self.history(id).await?;
        let links: Vec<_> = history.iter().map(HistoryRecord::link).collect();
        if let Some(b) = chain::verify(&links).first() {
            return Err(StoreError::Tampered(format!(
                "the history of {id} does not verify (#{}: {}); its result is not served",
                b.seq, b.problem
            )));
        }
        let entries: Vec<_> = links.into_iter().map(|l| l.entry).collect();
        // Well hashed is not enough: a writer role can append links that hash (the trigger checks
        // only their place in the chain), so a chain with a move the state machine never makes
        // serves nothing.
        // Given back before the next read takes one: as many results served at once as the pool
        // holds must not each hold one connection while waiting for another.
        let old_shapes_until = {
            let mut conn = self.pool.acquire().await?;
            cutovers(&mut conn).await?.link_shapes
        };
        if let Some(b) = chain::illegal_moves(&entries, old_shapes_until).first() {
            return Err(StoreError::Tampered(format!(
                "the history of {id} holds a move the state machine never makes (#{}: {}); its result is not served",
                b.seq, b.problem
            )));
        }
        let validated = chain::validated_result(&entries)
            .and_then(|v| {
                Some(ChainedResult {
                    location: v.location?.to_owned(),
                    sha256: v.sha256?.to_owned(),
                    size: v.size.and_then(|n| u64::try_from(n).ok()),
                    content_type: v.content_type.map(str::to_owned),
                })
            })
            .ok_or_else(|| {
                StoreError::Tampered(format!("the history of {id} records no validated result"))
            })?;
        let op = self.get_shown(id).await?;
        // The size too: what a server holds for the bytes before reading them is the chain's,
        // and a row whose size was edited (to pass a small one for a large result) serves nothing.
        let size_differs = validated
            .size
            .is_some_and(|n| op.result_size.and_then(|m| u64::try_from(m).ok()) != Some(n));
        if op.result_sha256.as_deref() != Some(validated.sha256.as_str())
            || op.result_location.as_deref() != Some(validated.location.as_str())
            || size_differs
        {
            return Err(StoreError::Tampered(format!(
                "{id} names result {} ({} bytes) but its history validated {} ({} bytes): the record was altered; the result is not served",
                op.result_sha256.as_deref().unwrap_or("none"),
                op.result_size
                    .map_or_else(|| "no size".to_owned(), |n| n.to_string()),
                validated.sha256,
                validated
                    .size
                    .map_or_else(|| "no size".to_owned(), |n| n.to_string()),
            )));
        }
        Ok(validated)
    }

    async fn anchor_to_check(&self, expected: Option<&str>) -> Result<Option<Anchor>, StoreError> {
        match expected {
            Some(d) => match self.anchor_by_digest(d).await? {
                Some(a) => Ok(Some(a)),
                None => Err(StoreError::AnchorNotFound(AnchorNotFound(
                    d.to_ascii_lowercase(),
                ))),
            },
            None => self.latest_anchor().await,
        }
    }
}

/// A result as the chain validated it: what may be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedResult {
    pub location: String,
    pub sha256: String,
    /// The size the chain validated (`None` in a link that did not say one).
    pub size: Option<u64>,
    pub content_type: Option<String>,
}

/// Since when every writer of this database records links in their current shapes (see
/// `chain::illegal_moves`); `None` in a database that does not say.
async fn cutovers(db: &mut sqlx::PgConnection) -> Result<Cutovers, StoreError> {
    let mut since = async |name: &str| -> Result<Option<DateTime<Utc>>, StoreError> {
        let row: Option<(DateTime<Utc>,)> = sqlx::query_as(include_str!("sql/cutover_since.sql"))
            .bind(name)
            .fetch_optional(&mut *db)
            .await?;
        Ok(row.map(|(since,)| since))
    };
    Ok(Cutovers {
        link_shapes: since("current_link_shapes").await?,
        exact_numbers: since("exact_numbers").await?,
    })
}

/// Since when every writer of this database records links as the verifier expects them (see the
/// migrations that add each `jobtrail_cutovers` row); `None` where the database does not say.
#[derive(Debug, Clone, Copy)]
struct Cutovers {
    /// Links in their current shapes (migration 0022; see `chain::illegal_moves`).
    link_shapes: Option<DateTime<Utc>>,
    /// Integers beyond ±2^53 a provider sent recorded as text (migration 0037).
    exact_numbers: Option<DateTime<Utc>>,
}

/// The most of a stored or expected value a break shows (the start of it, marked as cut).
const SHOWN_BYTES: usize = 1024;

fn shown(s: String) -> String {
    if s.len() <= SHOWN_BYTES {
        return s;
    }
    let total = s.len();
    format!(
        "{} ({total} bytes in all)",
        jobtrail_core::text::truncate(s, SHOWN_BYTES)
    )
}

/// Everything one operation's evidence must agree on.
fn check_operation(
    f: &Facts,
    (history, calls, results): (&[HistoryRecord], &[StoredCall], &[ResultDigest]),
    cut: Cutovers,
    report: &mut VerifyReport,
) {
    let old_shapes_until = cut.link_shapes;
    let op = OperationId::from_uuid(f.id).to_string();
    report.operations += 1;
    report.rows += history.len() as u64;
    // What a row holds is shown cut to a bound: a writer's edit to a column of megabytes must
    // not take the verifier's memory (or the API's, behind `GET /v1/audit/verify`) with it.
    let br = |seq: i64, problem: String, expected: String, stored: String| ChainBreak {
        operation_id: op.clone(),
        seq,
        problem,
        expected: shown(expected),
        stored: shown(stored),
    };

    // The history chain, and its end against the head on the row.
    let links: Vec<_> = history.iter().map(HistoryRecord::link).collect();
    report.breaks.extend(chain::verify(&links));
    let (last_seq, last_hash) = history
        .last()
        .map(|r| (r.seq, r.hash.clone()))
        .unwrap_or((0, GENESIS.to_vec()));
    if last_seq != f.history_seq || last_hash != f.history_head {
        report.breaks.push(br(
            last_seq,
            "chain end does not match the head recorded on the operation (rows removed or appended out of band)".into(),
            format!("#{} {}", f.history_seq, hex::encode(&f.history_head)),
            format!("#{last_seq} {}", hex::encode(&last_hash)),
        ));
    }

    // A number the hash read as a double it is not exactly: another could stand in its place
    // unseen. An integer beyond ±2^53 is excused in a link dated before writers record such
    // integers as text (a provider's, kept as it came); any other such number no writer writes.
    for r in history {
        let Some(n) = &r.detail_number_beyond_double else {
            continue;
        };
        if n.integer && cut.exact_numbers.is_none_or(|since| r.at < since) {
            continue;
        }
        report.breaks.push(br(
            r.seq,
            "the link's detail holds a number its hash cannot tell from the numbers nearest it (beyond a double's precision): it may have been put in the place of the one hashed".into(),
            "a number a double holds exactly".into(),
            n.token.clone(),
        ));
    }

    // Every link a move the state machine allows, each from where the last one led.
    let entries: Vec<_> = links.iter().map(|l| l.entry.clone()).collect();
    report
        .breaks
        .extend(chain::illegal_moves(&entries, old_shapes_until));

    // The row's facts against the chain.
    match entries.first().and_then(SubmittedFacts::from_first_link) {
        Some(chained) => {
            let stored = SubmittedFacts {
                provider: f.provider.clone(),
                target: f.target.clone(),
                fingerprint: f.request_fingerprint.clone(),
                caller: f.caller.clone(),
                approved_by: f.approved_by.clone(),
                approval_ref: f.approval_ref.clone(),
                edited_by: f.edited_by.clone(),
                trace_id: f.trace_id.clone(),
                idempotency: f.idempotency_mode.clone(),
            };
            for (field, expected, found) in chained.differences(&stored) {
                report.breaks.push(br(
                    1,
                    format!("the operation's {field} differs from the chained submission"),
                    expected,
                    found,
                ));
            }
        }
        None if !history.is_empty() => report.breaks.push(br(
            1,
            "the first history link is not a submission recording the submitted facts".into(),
            "submitted".into(),
            entries[0].event.clone(),
        )),
        None => {}
    }
    if let Some(last) = entries.last() {
        if last.to_state != f.state {
            report.breaks.push(br(
                last.seq,
                "the operation's state differs from where its last history link leads".into(),
                last.to_state.clone(),
                f.state.clone(),
            ));
        }
        if last.remote_job_id != f.remote_job_id {
            report.breaks.push(br(
                last.seq,
                "the operation's remote job id differs from the one its history records".into(),
                last.remote_job_id.clone().unwrap_or_else(|| "none".into()),
                f.remote_job_id.clone().unwrap_or_else(|| "none".into()),
            ));
        }
    }
    // Who asked for a cancel, why and when (what "cancelled by a person" queries read) against the
    // first cancel request the history records: a row edited after the fact disagrees.
    let asked = entries
        .iter()
        .find(|e| e.event == "cancel_requested" || e.event == "withdraw");
    let recorded = f.cancel_requested_by.as_ref().map(|by| {
        let cause = format!(
            "cancel requested by {by}: {}",
            f.cancel_reason.as_deref().unwrap_or("")
        );
        (cause, f.cancel_requested_at.map(chain::storable))
    });
    // The link's evidence names the actor and the reason apart (links that predate it, only
    // their cause): text moved from one to the other across the cause's `: ` is found.
    let apart = |link: &chain::ChainEntry| {
        let (Some(actor), Some(reason)) = (
            link.detail.get("actor").and_then(|v| v.as_str()),
            link.detail.get("reason").and_then(|v| v.as_str()),
        ) else {
            return true;
        };
        f.cancel_requested_by.as_deref() == Some(actor)
            && f.cancel_reason.as_deref().unwrap_or("") == reason
    };
    let differs = match (asked, &recorded) {
        (None, None) => None,
        (Some(link), Some((cause, at)))
            if *cause == link.cause && *at == Some(link.at) && apart(link) =>
        {
            None
        }
        (Some(link), _) => Some((link.seq, format!("{} at {}", link.cause, link.at))),
        (None, Some(_)) => Some((last_seq, "no cancel request".to_owned())),
    };
    if let Some((seq, expected)) = differs {
        report.breaks.push(br(
            seq,
            "the operation's cancel request differs from the one its history records".into(),
            expected,
            recorded
                .map(|(cause, at)| match at {
                    Some(at) => format!("{cause} at {at}"),
                    None => cause,
                })
                .unwrap_or_else(|| "no cancel request".into()),
        ));
    }

    // What else the row says it was submitted with (links written before a field was recorded
    // leave it unchecked), where the validated result is, and what retried it.
    let public = |id: Option<uuid::Uuid>| {
        id.map(|i| OperationId::from_uuid(i).to_string())
            .unwrap_or_else(|| "none".into())
    };
    let mut facts: Vec<(i64, &str, Option<String>, String)> = Vec::new();
    if let Some(first) = entries.first().filter(|e| e.event == "submitted") {
        let d = &first.detail;
        facts.push((
            1,
            "created_at",
            Some(first.at.to_rfc3339()),
            chain::storable(f.created_at).to_rfc3339(),
        ));
        facts.push((
            1,
            "at_most_once",
            d.get("at_most_once")
                .and_then(|v| v.as_bool())
                .map(|b| b.to_string()),
            f.at_most_once.to_string(),
        ));
        facts.push((
            1,
            "supersedes",
            d.get("supersedes")
                .map(|v| v.as_str().unwrap_or("none").to_owned()),
            public(f.supersedes),
        ));
    }
    let validated = chain::validated_result(&entries);
    facts.push((
        validated.map_or(last_seq, |v| v.seq),
        "result location and size",
        Some(validated.map_or_else(
            || "none".to_owned(),
            |v| {
                format!(
                    "{} ({} bytes)",
                    v.location.unwrap_or("?"),
                    v.size.unwrap_or(-1)
                )
            },
        )),
        match (&f.result_location, f.result_size) {
            (None, None) => "none".to_owned(),
            (l, s) => format!(
                "{} ({} bytes)",
                l.as_deref().unwrap_or("?"),
                s.unwrap_or(-1)
            ),
        },
    ));
    let superseded = entries.iter().rev().find(|e| e.event == "superseded");
    facts.push((
        superseded.map_or(last_seq, |e| e.seq),
        "superseded_by",
        Some(superseded.map_or_else(
            || "none".to_owned(),
            |e| {
                e.detail
                    .get("new_operation_id")
                    .and_then(|v| v.as_str())
                    .unwrap_or("?")
                    .to_owned()
            },
        )),
        public(f.superseded_by),
    ));
    // The columns each step sets beside the state: replayed from the chain.
    if let Some(c) = chain::chained_columns(&entries, old_shapes_until) {
        let time = |t: Option<DateTime<Utc>>| {
            t.map(|t| chain::storable(t).to_rfc3339())
                .unwrap_or_else(|| "none".into())
        };
        let text = |t: &Option<String>| t.clone().unwrap_or_else(|| "none".into());
        // Compared as JSON values (both went through `jsonb`), shown as their text.
        let json = |v: &Option<serde_json::Value>| {
            v.as_ref().map_or_else(|| "none".into(), |v| v.to_string())
        };
        let mut replayed = vec![
            (
                "state_changed_at",
                time(Some(c.state_changed_at)),
                time(Some(f.state_changed_at)),
            ),
            ("finished_at", time(c.finished_at), time(f.finished_at)),
            ("escalated_at", time(c.escalated_at), time(f.escalated_at)),
            (
                "escalation_reason",
                text(&c.escalation_reason),
                text(&f.escalation_reason),
            ),
            (
                "conflicting_remote_job_id",
                text(&c.conflicting_remote_job_id),
                text(&f.conflicting_remote_job_id),
            ),
            (
                "result_summary",
                json(&c.result_summary),
                json(&f.result_summary.as_ref().map(|j| j.0.clone())),
            ),
            (
                "result_content_type",
                text(&c.result_content_type),
                text(&f.result_content_type),
            ),
        ];
        if let Some(d) = c.deadlines {
            replayed.extend([
                (
                    "create_deadline",
                    time(Some(d.create)),
                    time(Some(f.create_deadline)),
                ),
                (
                    "result_deadline",
                    time(Some(d.result)),
                    time(Some(f.result_deadline)),
                ),
                ("cancel_deadline", time(d.cancel), time(f.cancel_deadline)),
            ]);
        }
        facts.extend(
            replayed
                .into_iter()
                .map(|(field, chained, stored)| (last_seq, field, Some(chained), stored)),
        );
    }
    for (seq, field, chained, stored) in facts {
        if let Some(chained) = chained
            && chained != stored
        {
            report.breaks.push(br(
                seq,
                format!("the operation's {field} differs from what its history records"),
                chained,
                stored,
            ));
        }
    }

    let validated_sha256 = validated.and_then(|v| v.sha256);
    if f.result_sha256.as_deref() != validated_sha256 {
        report.breaks.push(br(
            last_seq,
            "the operation's result digest differs from the validated result its history records"
                .into(),
            validated_sha256.unwrap_or("none").to_owned(),
            f.result_sha256.clone().unwrap_or_else(|| "none".into()),
        ));
    }

    // The call chain, and its end against the call head on the row.
    let chained: Vec<_> = calls.iter().filter_map(StoredCall::link).collect();
    report.calls += chained.len() as u64;
    report.unchained_calls += (calls.len() - chained.len()) as u64;
    report.breaks.extend(chain::verify(&chained));
    let (calls_seq, calls_hash) = chained
        .last()
        .map(|l| (l.entry.seq, l.hash.clone()))
        .unwrap_or((0, GENESIS.to_vec()));
    if calls_seq != f.calls_seq || calls_hash != f.calls_head {
        report.breaks.push(br(
            calls_seq,
            "the call chain's end does not match the call head recorded on the operation (calls removed or logged out of band)".into(),
            format!("#{} {}", f.calls_seq, hex::encode(&f.calls_head)),
            format!("#{calls_seq} {}", hex::encode(&calls_hash)),
        ));
    }
    // Every writer has chained its calls since migration 0007, and the schema has refused a call
    // missing any of its link's columns since 0015: an operation submitted after the link-shapes cutover (0022, later
    // than both) has none. One there was logged around the database's checks, a call no chain
    // covers (it changes no head, so only this finds it).
    let submitted = history.iter().find(|h| h.seq == 1).map(|h| h.at);
    if let (Some(since), Some(at)) = (cut.link_shapes, submitted)
        && at >= since
    {
        for c in calls.iter().filter(|c| c.link().is_none()) {
            report.breaks.push(br(
                0,
                "a provider call that no chain covers, in an operation submitted after every call was chained (logged around the database's checks)".into(),
                "none".into(),
                format!("call {} ({} at {})", c.id, c.kind, c.started_at),
            ));
        }
    }
    // A job polled for weeks has a link and a call per read: looked up, not scanned per link.
    let call_ids: std::collections::HashSet<uuid::Uuid> = calls.iter().map(|c| c.id).collect();
    for link in history.iter().filter(|h| h.call_id.is_some()) {
        if !link.call_id.is_some_and(|c| call_ids.contains(&c)) {
            report.breaks.push(br(
                link.seq,
                "the provider call this history link names is missing".into(),
                link.call_id.map(|c| c.to_string()).unwrap_or_default(),
                "none".into(),
            ));
        }
    }

    // The validated result's bytes, where the chain says the database keeps them, are there.
    if let Some(v) = validated
        && let Some(location) = v.location
        && let Some((_, sha)) = ResultBytes::parse_location(location)
        && !results.iter().any(|r| r.sha256 == sha)
    {
        report.breaks.push(br(
            v.seq,
            "the validated result's stored bytes are missing (deleted out of band)".into(),
            sha.to_owned(),
            "none".into(),
        ));
    }

    // Stored result bytes: intact, and named by the chain.
    let named = chain::named_result_digests(&entries);
    for r in results {
        report.results += 1;
        if r.actual_sha256 != r.sha256 {
            report.breaks.push(br(
                0,
                "stored result bytes do not match their recorded digest (bytes altered)".into(),
                r.sha256.clone(),
                r.actual_sha256.clone(),
            ));
        }
        if !named.contains(&r.sha256) {
            report.breaks.push(br(
                0,
                "stored result bytes that no history link names (bytes swapped or added out of band)"
                    .into(),
                "a digest named by the chain".into(),
                r.sha256.clone(),
            ));
        }
    }
}
