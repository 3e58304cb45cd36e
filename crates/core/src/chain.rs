//! The hash chains over an operation's evidence.
//!
//! Two chains per operation, of the same construction: its history (every transition and the
//! submission that opened it) and its provider calls (every request sent, or refused before it left,
//! with what came back). Each row carries the hash of the previous row of the same chain and its own
//! hash: `sha256(prev_hash || JCS(entry))`, where `entry` holds every recorded column of the row.
//! Chains are per operation so writers of different operations never contend on one head. The first
//! row's `prev_hash` is 32 zero bytes. Timestamps are encoded at microsecond precision
//! (PostgreSQL's), so a row read back from the database hashes exactly as it did when written.
//!
//! What the chains commit to beyond their own rows: the submission link holds the operation's
//! submitted facts (provider, target, fingerprint, caller, approver, approval reference, trace id),
//! every stored result's sha256 is named by a link ([`SubmittedFacts`], `audit verify`), and anchors
//! hash both heads of every operation ([`HeadsHasher`]).

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The `prev_hash` of an operation's first history row.
pub const GENESIS: [u8; 32] = [0; 32];

/// A row of one of the chains.
pub trait Linked: Serialize + Sized {
    fn operation_id(&self) -> &str;
    fn seq(&self) -> i64;

    /// `sha256(prev_hash || JCS(self))`.
    fn hash(&self, prev_hash: &[u8; 32]) -> [u8; 32] {
        let canonical =
            serde_json_canonicalizer::to_vec(self).expect("chain entries always serialise");
        let mut h = Sha256::new();
        h.update(prev_hash);
        h.update(&canonical);
        h.finalize().into()
    }
}

/// Every column of a history row that the hash covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainEntry {
    pub operation_id: String,
    pub seq: i64,
    #[serde(serialize_with = "micros")]
    pub at: DateTime<Utc>,
    pub actor: String,
    pub from_state: Option<String>,
    pub to_state: String,
    pub event: String,
    pub cause: String,
    pub remote_job_id: Option<String>,
    pub call_id: Option<String>,
    pub detail: serde_json::Value,
}

fn micros<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
}

/// Truncate a timestamp to what PostgreSQL stores, so hashing before and after storage agrees.
/// A leap second (`23:59:60`, which chrono holds as second 59 with a nanosecond count past a
/// billion) is stored by PostgreSQL as the next minute's `:00`: it is moved there first, or the
/// chain would say `:60` where the row says `:00`, and `audit verify` would call that an alteration.
pub fn storable(at: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::Timelike;
    let at = match at.nanosecond().checked_sub(1_000_000_000) {
        Some(past) => at.with_nanosecond(past).unwrap_or(at) + chrono::Duration::seconds(1),
        None => at,
    };
    at.trunc_subsecs(6)
}

impl Linked for ChainEntry {
    fn operation_id(&self) -> &str {
        &self.operation_id
    }
    fn seq(&self) -> i64 {
        self.seq
    }
}

impl ChainEntry {
    /// `sha256(prev_hash || JCS(self))`.
    pub fn hash(&self, prev_hash: &[u8; 32]) -> [u8; 32] {
        Linked::hash(self, prev_hash)
    }
}

/// Every column of a provider-call row that its chain covers: who called, under which lease, what
/// was sent where, and what came back (already sanitized).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallEntry {
    pub operation_id: String,
    pub seq: i64,
    pub id: String,
    pub kind: String,
    pub attempt: i32,
    pub actor: String,
    pub lease_epoch: i64,
    #[serde(serialize_with = "micros")]
    pub started_at: DateTime<Utc>,
    pub duration_ms: f64,
    pub method: String,
    pub url: String,
    pub http_status: Option<i32>,
    pub response_headers: serde_json::Value,
    pub provider_request_id: Option<String>,
    pub error_class: Option<String>,
    pub outcome: String,
    pub trace_id: String,
    pub span_id: String,
    pub response_sha256: Option<String>,
}

impl Linked for CallEntry {
    fn operation_id(&self) -> &str {
        &self.operation_id
    }
    fn seq(&self) -> i64 {
        self.seq
    }
}

/// What an operation was submitted with. The submission link (seq 1) records them in its detail
/// (its actor is the caller, or the person who retried the caller's operation: `retried_by`), so an operation row whose facts were changed later (an owner
/// editing `approved_by`, say) disagrees with its own chain, and `audit verify` names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedFacts {
    pub provider: String,
    pub target: String,
    pub fingerprint: String,
    pub caller: String,
    pub approved_by: String,
    pub approval_ref: Option<String>,
    /// The person whose edit the request carries, whose grants each create sent checks too.
    pub edited_by: Option<String>,
    pub trace_id: String,
    pub idempotency: String,
}

impl SubmittedFacts {
    /// The facts as the submission link records them (`None` if this is not one).
    pub fn from_first_link(e: &ChainEntry) -> Option<Self> {
        if e.seq != 1 || e.event != "submitted" {
            return None;
        }
        let d = &e.detail;
        let text = |k: &str| d.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        // Links written before the approver had its own field name it only in the cause.
        let approved_by = text("approved_by").or_else(|| {
            e.cause
                .rsplit_once(", approved by ")
                .map(|(_, a)| a.to_owned())
        })?;
        Some(Self {
            provider: text("provider")?,
            target: text("target")?,
            fingerprint: text("fingerprint")?,
            caller: text("caller").unwrap_or_else(|| e.actor.clone()),
            approved_by,
            approval_ref: text("approval_ref"),
            edited_by: text("edited_by"),
            trace_id: text("trace_id")?,
            idempotency: text("idempotency")?,
        })
    }

    /// Every field in which `stored` differs from these chained facts: (field, chained, stored).
    pub fn differences(&self, stored: &SubmittedFacts) -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        let mut cmp = |field: &'static str, a: &str, b: &str| {
            if a != b {
                out.push((field, a.to_owned(), b.to_owned()));
            }
        };
        cmp("provider", &self.provider, &stored.provider);
        cmp("target", &self.target, &stored.target);
        cmp(
            "request_fingerprint",
            &self.fingerprint,
            &stored.fingerprint,
        );
        cmp("caller", &self.caller, &stored.caller);
        cmp("approved_by", &self.approved_by, &stored.approved_by);
        cmp(
            "approval_ref",
            self.approval_ref.as_deref().unwrap_or(""),
            stored.approval_ref.as_deref().unwrap_or(""),
        );
        cmp(
            "edited_by",
            self.edited_by.as_deref().unwrap_or(""),
            stored.edited_by.as_deref().unwrap_or(""),
        );
        cmp("trace_id", &self.trace_id, &stored.trace_id);
        cmp("idempotency_mode", &self.idempotency, &stored.idempotency);
        out
    }
}

/// The result digests a chain names: the sha256 of every validated result, of every result kept for
/// inspection, and of a synchronous answer kept at create.
pub fn named_result_digests(entries: &[ChainEntry]) -> std::collections::HashSet<String> {
    // A set: each stored result is looked up in it, and a chain may name a great many.
    let mut out = std::collections::HashSet::new();
    for e in entries {
        let d = &e.detail;
        for v in [
            d.get("sha256"),
            d.pointer("/evidence/sha256"),
            d.pointer("/evidence/sync_result/sha256"),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(s) = v.as_str() {
                out.insert(s.to_owned());
            }
        }
    }
    out
}

/// The result a chain stands behind: what its last `result_validated` link records (what
/// `jobtrail result` may serve). A field the link lacks is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainedResult<'a> {
    pub seq: i64,
    pub location: Option<&'a str>,
    pub size: Option<i64>,
    pub sha256: Option<&'a str>,
    /// The provider's content type, as validated.
    pub content_type: Option<&'a str>,
}

/// The validated result the chain records last, if any.
pub fn validated_result(entries: &[ChainEntry]) -> Option<ChainedResult<'_>> {
    // The link that moved the operation into `succeeded`: the only place the state machine lets a
    // result be validated. A later `result_validated` (appended by a writer role to name other
    // bytes) is an illegal move, never the result.
    let e = entries.iter().rev().find(|e| {
        e.event == "result_validated"
            && e.to_state == "succeeded"
            && e.from_state.as_deref() == Some("result_collecting")
    })?;
    Some(ChainedResult {
        seq: e.seq,
        location: e.detail.get("location").and_then(|v| v.as_str()),
        size: e.detail.get("size").and_then(|v| v.as_i64()),
        sha256: e.detail.get("sha256").and_then(|v| v.as_str()),
        content_type: e.detail.get("content_type").and_then(|v| v.as_str()),
    })
}

/// The operation columns a chain determines beyond the submitted facts, replayed link by link the
/// way the store applies each step: when the state last changed, when the operation finished, why
/// and since when it waits for a person, the job id it did not choose, and its deadlines. A row
/// whose column was edited without a link (a worker's login moving a deadline, clearing an
/// escalation's reason) then disagrees with its own chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedColumns {
    pub state_changed_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub escalated_at: Option<DateTime<Utc>>,
    pub escalation_reason: Option<String>,
    pub conflicting_remote_job_id: Option<String>,
    /// `None` where a link written before deadlines were recorded in the chain moved them (or the
    /// submission predates them): then they are not checked.
    pub deadlines: Option<Deadlines>,
    /// What the agent is told of its result: the last validated result's summary, the rules a
    /// result broke, or why it could not be had.
    pub result_summary: Option<serde_json::Value>,
    /// The content type the last validated result was served with.
    pub result_content_type: Option<String>,
}

/// An operation's deadlines as its chain sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub create: DateTime<Utc>,
    pub result: DateTime<Utc>,
    pub cancel: Option<DateTime<Utc>>,
}

/// The detail key under which a link records the deadlines its step set (a resume's, even none).
pub const DEADLINES_SET: &str = "deadlines_set";

/// Whether a link dated `at` may be an earlier build's (see [`illegal_moves`]). Links are dated
/// by the database's clock (migration 0021), so one written today cannot pass as older.
fn older(old_shapes_until: Option<DateTime<Utc>>, at: DateTime<Utc>) -> bool {
    old_shapes_until.is_none_or(|until| at < until)
}

/// Replay a chain into the columns it determines; `None` if it does not open with a submission.
/// `old_shapes_until` as for [`illegal_moves`]: a resume that does not say what it moved leaves
/// the deadlines unchecked only if an earlier build may have written it.
pub fn chained_columns(
    entries: &[ChainEntry],
    old_shapes_until: Option<DateTime<Utc>>,
) -> Option<ChainedColumns> {
    use crate::state::State;
    let first = entries
        .first()
        .filter(|e| e.seq == 1 && e.event == "submitted")?;
    let time = |v: &serde_json::Value, k: &str| {
        v.get(k)
            .and_then(|t| t.as_str())
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| storable(t.with_timezone(&Utc)))
    };
    let d = &first.detail;
    let cancel_window = d
        .get("cancel_window_ms")
        .and_then(|v| v.as_i64())
        .map(chrono::Duration::milliseconds);
    let mut deadlines = match (time(d, "create_deadline"), time(d, "result_deadline")) {
        (Some(create), Some(result)) => Some(Deadlines {
            create,
            result,
            cancel: None,
        }),
        _ => None,
    };
    let mut out = ChainedColumns {
        state_changed_at: storable(first.at),
        finished_at: None,
        escalated_at: None,
        escalation_reason: None,
        conflicting_remote_job_id: None,
        deadlines: None,
        result_summary: None,
        result_content_type: None,
    };
    let mut remote_job_id = first.remote_job_id.as_deref();
    for e in &entries[1..] {
        let d = &e.detail;
        let from = e.from_state.as_deref().unwrap_or("none");
        let moved = from != e.to_state;
        // The deadlines the step set, then the event's own effects: the store's order.
        match (d.get(DEADLINES_SET), &mut deadlines) {
            (Some(set), Some(dl)) => {
                dl.create = time(set, "create_deadline").unwrap_or(dl.create);
                dl.result = time(set, "result_deadline").unwrap_or(dl.result);
                dl.cancel = time(set, "cancel_deadline").or(dl.cancel);
            }
            (None, _) if e.event == "resume" && older(old_shapes_until, e.at) => deadlines = None,
            _ => {}
        }
        match e.event.as_str() {
            "choose_remote_job" => {
                let chosen = d.get("remote_job_id").and_then(|v| v.as_str());
                if chosen.is_some() && out.conflicting_remote_job_id.as_deref() == chosen {
                    out.conflicting_remote_job_id = remote_job_id.map(str::to_owned);
                }
            }
            "contract_violated" => {
                out.conflicting_remote_job_id = d
                    .get("other_job_id")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
            }
            "job_held_elsewhere" => {
                out.conflicting_remote_job_id = d
                    .get("remote_job_id")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
            }
            "result_validated" => {
                out.result_summary = d.get("summary").cloned();
                out.result_content_type = d
                    .get("content_type")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
            }
            "result_invalid" => {
                out.result_summary = d
                    .get("violations")
                    .map(|v| serde_json::json!({ "violations": v }));
            }
            "result_unavailable" => {
                out.result_summary = d
                    .get("why")
                    .map(|v| serde_json::json!({ "unavailable": v }));
            }
            "cancel_requested" | "withdraw" => {
                if let Some(dl) = &mut deadlines
                    && (moved || dl.cancel.is_none())
                {
                    match cancel_window {
                        Some(w) => dl.cancel = Some(storable(e.at) + w),
                        None => deadlines = None,
                    }
                }
            }
            _ => {}
        }
        if moved {
            out.state_changed_at = storable(e.at);
            let to = e.to_state.parse::<State>().ok();
            if to.is_some_and(State::is_terminal) {
                out.finished_at = Some(storable(e.at));
            }
            (out.escalated_at, out.escalation_reason) = if to.is_some_and(State::needs_human) {
                (Some(storable(e.at)), Some(e.cause.clone()))
            } else {
                (None, None)
            };
        }
        remote_job_id = e.remote_job_id.as_deref();
    }
    out.deadlines = deadlines;
    Some(out)
}

/// A stored row as read back for verification.
#[derive(Debug, Clone)]
pub struct StoredLink<E = ChainEntry> {
    pub entry: E,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

/// One place where a chain does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    pub operation_id: String,
    pub seq: i64,
    pub problem: String,
    pub expected: String,
    pub stored: String,
}

/// Recompute a chain (rows in `seq` order) and report every break: an edited row (its hash no longer
/// matches), a removed or reordered row (a gap in `seq` or a `prev_hash` that is not the previous
/// row's hash), a forged start.
pub fn verify<E: Linked>(links: &[StoredLink<E>]) -> Vec<ChainBreak> {
    let mut breaks = Vec::new();
    let mut prev: [u8; 32] = GENESIS;
    let mut expected_seq = 1;
    for link in links {
        let e = &link.entry;
        let br = |problem: &str, expected: String, stored: String| ChainBreak {
            operation_id: e.operation_id().to_owned(),
            seq: e.seq(),
            problem: problem.to_owned(),
            expected,
            stored,
        };
        if e.seq() != expected_seq {
            breaks.push(br(
                "sequence gap or reorder (a row was removed or inserted)",
                expected_seq.to_string(),
                e.seq().to_string(),
            ));
        }
        if link.prev_hash != prev {
            breaks.push(br(
                "prev_hash does not match the previous row's hash",
                hex::encode(prev),
                hex::encode(&link.prev_hash),
            ));
        }
        let recomputed = e.hash(&prev_array(&link.prev_hash));
        if link.hash != recomputed {
            breaks.push(br(
                "row content does not match its hash (edited)",
                hex::encode(recomputed),
                hex::encode(&link.hash),
            ));
        }
        prev = prev_array(&link.hash);
        expected_seq = e.seq() + 1;
    }
    breaks
}

/// Every link that is not a move the engine could have made, in `seq` order: a first link that is
/// not a submission into `create_pending`, a link that does not start where the previous one led, an
/// event the state machine does not allow in the state it starts from, or one leading elsewhere than
/// the machine says. The hashes show a chain was not changed after it was anchored; this shows each
/// link is a legal move, so a role that may append (the API's, a worker's) cannot record one that
/// is not — withdrawing a running job, say — and have `audit verify` call the record intact.
///
/// `old_shapes_until`: links dated before it may have been written by an earlier build, so a rule
/// since retired still makes them legal; `None` where the database does not say since when its
/// writers are this build's (every link may be an earlier build's).
pub fn illegal_moves(
    entries: &[ChainEntry],
    old_shapes_until: Option<DateTime<Utc>>,
) -> Vec<ChainBreak> {
    use crate::event::EventKind;
    use crate::machine::{To, rule_ever, rule_for};
    use crate::state::State;
    let mut breaks = Vec::new();
    let mut led_to: Option<&str> = None;
    let mut job_before: Option<Option<&str>> = None;
    for e in entries {
        let mut br = |problem: String, expected: String, stored: String| {
            breaks.push(ChainBreak {
                operation_id: e.operation_id.clone(),
                seq: e.seq,
                problem,
                expected,
                stored,
            })
        };
        // A link carries the job its operation follows; only an event that names a job changes
        // it. A job written onto the row by hand is carried into the next link by the worker's
        // step, whose hash is then right: this is how it is found.
        let job = e.remote_job_id.as_deref();
        if let Some(was) = job_before.replace(job)
            && was != job
            && !names_a_job(&e.event, was.is_some())
        {
            br(
                format!("the job changed on a {} link, which names no job", e.event),
                was.unwrap_or("none").to_owned(),
                job.unwrap_or("none").to_owned(),
            );
        }
        let from = e.from_state.as_deref().unwrap_or("none");
        match led_to {
            None => {
                let submission = format!("submitted: none -> {}", State::CreatePending.as_str());
                let stored = format!("{}: {from} -> {}", e.event, e.to_state);
                if stored != submission {
                    br(
                        "the first link is not a submission into create_pending".into(),
                        submission,
                        stored,
                    );
                }
            }
            Some(prev) => {
                if from != prev {
                    br(
                        "the link does not start where the previous link led".into(),
                        prev.to_owned(),
                        from.to_owned(),
                    );
                }
                let (Ok(state), Ok(on)) = (from.parse::<State>(), e.event.parse::<EventKind>())
                else {
                    br(
                        "the link names a state or event the state machine does not know".into(),
                        "a known state and event".into(),
                        format!("{} in {from}", e.event),
                    );
                    led_to = Some(&e.to_state);
                    continue;
                };
                let rule = if older(old_shapes_until, e.at) {
                    rule_ever(state, on)
                } else {
                    rule_for(state, on)
                };
                match rule {
                    None => br(
                        format!("the state machine does not allow {} in {from}", e.event),
                        "an allowed event".into(),
                        e.event.clone(),
                    ),
                    Some(rule) => {
                        let to = match rule.to {
                            To::State(s) => s,
                            To::Same => state,
                        };
                        if to.as_str() != e.to_state {
                            br(
                                format!(
                                    "{} in {from} leads elsewhere than the state machine says",
                                    e.event
                                ),
                                to.as_str().to_owned(),
                                e.to_state.clone(),
                            );
                        }
                    }
                }
            }
        }
        led_to = Some(&e.to_state);
    }
    breaks
}

/// Whether a link of `event` may change the job its operation follows: the provider's answer to
/// a create, a person's adopt or choice, and a contract violation when no job was known yet (it
/// keeps the first answer as the operation's).
fn names_a_job(event: &str, had_one: bool) -> bool {
    matches!(
        event,
        "create_accepted" | "create_completed" | "adopt_remote_job" | "choose_remote_job"
    ) || (event == "contract_violated" && !had_one)
}

fn prev_array(v: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if v.len() == 32 {
        out.copy_from_slice(v);
    }
    out
}

/// A hash over many chain heads (for anchors): sha256 over one line per operation in operation id
/// order — `operation_id:seq:hash_hex\n` (anchor version 1: history only) or
/// `operation_id:seq:hash_hex:calls_seq:calls_hash_hex\n` (version 2: both chains). Feed heads in
/// ascending id order ([`OperationId`](crate::OperationId) strings sort like their UUIDs), so a
/// database can stream them.
#[derive(Default)]
pub struct HeadsHasher {
    h: Sha256,
    count: u64,
}

/// The anchor format that covers both chains of every operation.
pub const ANCHOR_VERSION: i16 = 2;

impl HeadsHasher {
    pub fn add(&mut self, operation_id: &str, seq: i64, hash: &[u8]) {
        self.h
            .update(format!("{operation_id}:{seq}:{}\n", hex::encode(hash)).as_bytes());
        self.count += 1;
    }
    /// One operation's heads in anchor `version` (calls ignored in version 1).
    pub fn add_heads(
        &mut self,
        version: i16,
        operation_id: &str,
        (seq, hash): (i64, &[u8]),
        (calls_seq, calls_hash): (i64, &[u8]),
    ) {
        if version < 2 {
            return self.add(operation_id, seq, hash);
        }
        self.h.update(
            format!(
                "{operation_id}:{seq}:{}:{calls_seq}:{}\n",
                hex::encode(hash),
                hex::encode(calls_hash)
            )
            .as_bytes(),
        );
        self.count += 1;
    }
    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn finish(self) -> [u8; 32] {
        self.h.finalize().into()
    }
}

/// [`HeadsHasher`] over heads in any order.
pub fn heads_digest<'a>(heads: impl IntoIterator<Item = (&'a str, i64, &'a [u8])>) -> [u8; 32] {
    let mut v: Vec<_> = heads.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = HeadsHasher::default();
    for (id, seq, hash) in v {
        h.add(id, seq, hash);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: i64, cause: &str) -> ChainEntry {
        ChainEntry {
            operation_id: "op_x".into(),
            seq,
            at: storable(DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap()),
            actor: "worker-1".into(),
            from_state: None,
            to_state: "create_pending".into(),
            event: "submitted".into(),
            cause: cause.into(),
            remote_job_id: None,
            call_id: None,
            detail: serde_json::json!({"b": 1, "a": [1, 2]}),
        }
    }

    fn chain(n: i64) -> Vec<StoredLink> {
        let mut prev = GENESIS;
        (1..=n)
            .map(|seq| {
                let e = entry(seq, &format!("c{seq}"));
                let h = e.hash(&prev);
                let link = StoredLink {
                    entry: e,
                    prev_hash: prev.to_vec(),
                    hash: h.to_vec(),
                };
                prev = h;
                link
            })
            .collect()
    }

    #[test]
    fn an_intact_chain_verifies() {
        assert!(verify(&chain(5)).is_empty());
    }

    #[test]
    fn an_edit_is_found_at_its_row() {
        let mut c = chain(5);
        c[2].entry.cause = "rewritten".into();
        let b = verify(&c);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].seq, 3);
    }

    #[test]
    fn a_removed_row_is_found() {
        let mut c = chain(5);
        c.remove(1);
        let b = verify(&c);
        assert!(
            b.iter()
                .any(|b| b.seq == 3 && b.problem.contains("sequence"))
        );
    }

    fn moved(seq: i64, from: &str, event: &str, to: &str) -> ChainEntry {
        ChainEntry {
            from_state: Some(from.into()),
            event: event.into(),
            to_state: to.into(),
            ..entry(seq, "")
        }
    }

    #[test]
    fn the_columns_a_step_sets_are_replayed_from_the_chain() {
        let at = |secs: i64| storable(DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap());
        let link =
            |seq: i64, from: &str, event: &str, to: &str, job: Option<&str>, detail| ChainEntry {
                at: at(seq),
                remote_job_id: job.map(str::to_owned),
                detail,
                cause: format!("cause {seq}"),
                ..moved(seq, from, event, to)
            };
        let submitted = ChainEntry {
            detail: serde_json::json!({
                "create_deadline": at(100), "result_deadline": at(200), "cancel_window_ms": 5000,
            }),
            ..entry(1, "submitted")
        };
        let mut c = vec![
            submitted,
            link(
                2,
                "create_pending",
                "contract_violated",
                "contract_violation",
                Some("job_a"),
                serde_json::json!({"recorded_job_id": "job_a", "other_job_id": "job_b"}),
            ),
        ];
        let held = chained_columns(&c, None).unwrap();
        assert_eq!(
            (held.escalated_at, held.escalation_reason.as_deref()),
            (Some(at(2)), Some("cause 2"))
        );
        assert_eq!(held.conflicting_remote_job_id.as_deref(), Some("job_b"));
        // A person chooses the other answer: the one not chosen is kept; the hold ends.
        c.push(link(
            3,
            "contract_violation",
            "choose_remote_job",
            "observing",
            Some("job_b"),
            serde_json::json!({"remote_job_id": "job_b"}),
        ));
        let chosen = chained_columns(&c, None).unwrap();
        assert_eq!(chosen.conflicting_remote_job_id.as_deref(), Some("job_a"));
        assert_eq!(
            (chosen.escalated_at, chosen.state_changed_at),
            (None, at(3))
        );
        // A progress read moves nothing; a cancel request opens the cancel window.
        c.push(link(
            4,
            "observing",
            "remote_progress",
            "observing",
            Some("job_b"),
            serde_json::json!({}),
        ));
        c.push(link(
            5,
            "observing",
            "cancel_requested",
            "cancel_requested",
            Some("job_b"),
            serde_json::json!({}),
        ));
        let asked = chained_columns(&c, None).unwrap();
        assert_eq!(asked.state_changed_at, at(5));
        assert_eq!(
            asked.deadlines,
            Some(Deadlines {
                create: at(100),
                result: at(200),
                cancel: Some(at(5) + chrono::Duration::seconds(5))
            })
        );
        // A resume records what it moved; one that does not (an older build's) leaves the
        // deadlines unchecked.
        c.push(link(
            6,
            "cancel_requested",
            "resume",
            "observing",
            Some("job_b"),
            serde_json::json!({DEADLINES_SET: {"result_deadline": at(900)}}),
        ));
        assert_eq!(
            chained_columns(&c, None).unwrap().deadlines.unwrap().result,
            at(900)
        );
        c.push(link(
            7,
            "observing",
            "resume",
            "observing",
            Some("job_b"),
            serde_json::json!({}),
        ));
        assert_eq!(chained_columns(&c, None).unwrap().deadlines, None);
        // Dated after this database's writers were all this build's (links are dated by the
        // database's clock), it is no older build's: the deadlines are still held to the row.
        assert_eq!(chained_columns(&c, Some(at(8))).unwrap().deadlines, None);
        assert_eq!(
            chained_columns(&c, Some(at(7)))
                .unwrap()
                .deadlines
                .unwrap()
                .result,
            at(900)
        );
        c.push(link(
            8,
            "observing",
            "remote_succeeded",
            "succeeded",
            Some("job_b"),
            serde_json::json!({}),
        ));
        assert_eq!(chained_columns(&c, None).unwrap().finished_at, Some(at(8)));
        assert_eq!(
            chained_columns(&c[1..], None),
            None,
            "no submission, nothing to replay"
        );
    }

    #[test]
    fn a_history_is_replayed_through_the_state_machine() {
        let legal = vec![
            entry(1, "submitted"),
            moved(2, "create_pending", "create_accepted", "accepted"),
            moved(3, "accepted", "remote_progress", "observing"),
            moved(4, "observing", "remote_progress", "observing"),
        ];
        assert_eq!(illegal_moves(&legal, None), vec![]);
        // Withdrawn while the remote job runs: the machine allows withdraw only before a create.
        let mut withdrawn = legal.clone();
        withdrawn.push(moved(5, "observing", "withdraw", "withdrawn"));
        let b = illegal_moves(&withdrawn, None);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].seq, 5);
        assert!(
            b[0].problem
                .contains("does not allow withdraw in observing")
        );
        // A link that starts from a state the previous one did not lead to.
        let mut jumped = legal.clone();
        jumped.push(moved(5, "create_pending", "withdraw", "withdrawn"));
        let b = illegal_moves(&jumped, None);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].problem.contains("does not start where"));
        assert_eq!(
            (b[0].expected.as_str(), b[0].stored.as_str()),
            ("observing", "create_pending")
        );
        // An allowed event recorded as leading somewhere else.
        let mut elsewhere = legal.clone();
        elsewhere.push(moved(5, "observing", "remote_progress", "succeeded"));
        let b = illegal_moves(&elsewhere, None);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].expected, "observing");
        // A move an earlier build made by a rule since retired is still legal history.
        let retired = vec![
            entry(1, "submitted"),
            moved(
                2,
                "create_pending",
                "reconciliation_exhausted",
                "create_unresolved",
            ),
        ];
        assert_eq!(illegal_moves(&retired, None), vec![]);
        // ... but not one dated after this database's writers were all this build's.
        let written = retired[1].at;
        let later = written + chrono::Duration::seconds(1);
        assert_eq!(illegal_moves(&retired, Some(later)), vec![]);
        let b = illegal_moves(&retired, Some(written));
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].problem.contains("does not allow"), "{b:?}");
        // A rule that keeps the state: an observation recorded as a move is found.
        let mut cancelling = legal.clone();
        cancelling.push(moved(
            5,
            "observing",
            "cancel_requested",
            "cancel_requested",
        ));
        cancelling.push(moved(
            6,
            "cancel_requested",
            "remote_progress",
            "cancel_requested",
        ));
        assert_eq!(illegal_moves(&cancelling, None), vec![]);
        cancelling.push(moved(7, "cancel_requested", "remote_progress", "observing"));
        assert_eq!(
            illegal_moves(&cancelling, None)[0].expected,
            "cancel_requested"
        );
        // Names the machine does not know, and a first link that is no submission.
        let mut unknown = legal.clone();
        unknown.push(moved(5, "observing", "teleported", "succeeded"));
        assert!(
            illegal_moves(&unknown, None)[0]
                .problem
                .contains("does not know")
        );
        let b = illegal_moves(&legal[1..], None);
        assert!(b[0].problem.contains("not a submission"), "{b:?}");

        // The job changes only where a link names one: a provider's answer, a person's adopt or
        // choice, a contract violation while none was known.
        let job = |mut e: ChainEntry, j: &str| {
            e.remote_job_id = Some(j.into());
            e
        };
        let named = vec![
            entry(1, "submitted"),
            moved(2, "create_pending", "create_ambiguous", "create_unknown"),
            job(
                moved(
                    3,
                    "create_unknown",
                    "contract_violated",
                    "contract_violation",
                ),
                "job_a",
            ),
            job(
                moved(4, "contract_violation", "choose_remote_job", "observing"),
                "job_b",
            ),
            job(
                moved(5, "observing", "remote_progress", "observing"),
                "job_b",
            ),
        ];
        assert_eq!(illegal_moves(&named, None), vec![]);
        // Another caller's job written onto the row, then carried into the next step's link.
        let mut laundered = named.clone();
        laundered.push(job(
            moved(6, "observing", "remote_progress", "observing"),
            "job_of_another",
        ));
        let b = illegal_moves(&laundered, None);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].seq, 6);
        assert!(b[0].problem.contains("names no job"), "{b:?}");
        assert_eq!(
            (b[0].expected.as_str(), b[0].stored.as_str()),
            ("job_b", "job_of_another")
        );
        // Nor is a job dropped, or a second contract violation a choice.
        let mut dropped = named.clone();
        dropped.push(moved(6, "observing", "remote_progress", "observing"));
        assert_eq!(illegal_moves(&dropped, None)[0].stored, "none");
        let mut violated = named.clone();
        violated.push(job(
            moved(6, "observing", "contract_violated", "contract_violation"),
            "job_c",
        ));
        let b = illegal_moves(&violated, None);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].problem.contains("names no job"), "{b:?}");
    }

    #[test]
    fn microsecond_truncation_is_stable() {
        let at = DateTime::from_timestamp(1, 999_999_999).unwrap();
        assert_eq!(storable(storable(at)), storable(at));
    }
}
