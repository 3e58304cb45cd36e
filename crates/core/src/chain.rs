//! The hash chain over an operation's history.
//!
//! Each history row carries the hash of the previous row of the same operation and its own hash:
//! `sha256(prev_hash || JCS(entry))`, where `entry` holds every recorded column of the row. Chains are
//! per operation so writers of different operations never contend on one head. The first row's
//! `prev_hash` is 32 zero bytes. Timestamps are encoded at microsecond precision (PostgreSQL's), so a
//! row read back from the database hashes exactly as it did when written.

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The `prev_hash` of an operation's first history row.
pub const GENESIS: [u8; 32] = [0; 32];

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
pub fn storable(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(6)
}

impl ChainEntry {
    /// `sha256(prev_hash || JCS(self))`.
    pub fn hash(&self, prev_hash: &[u8; 32]) -> [u8; 32] {
        let canonical =
            serde_json_canonicalizer::to_vec(self).expect("chain entries always serialise");
        let mut h = Sha256::new();
        h.update(prev_hash);
        h.update(&canonical);
        h.finalize().into()
    }
}

/// A stored row as read back for verification.
#[derive(Debug, Clone)]
pub struct StoredLink {
    pub entry: ChainEntry,
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
pub fn verify(links: &[StoredLink]) -> Vec<ChainBreak> {
    let mut breaks = Vec::new();
    let mut prev: [u8; 32] = GENESIS;
    let mut expected_seq = 1;
    for link in links {
        let e = &link.entry;
        let br = |problem: &str, expected: String, stored: String| ChainBreak {
            operation_id: e.operation_id.clone(),
            seq: e.seq,
            problem: problem.to_owned(),
            expected,
            stored,
        };
        if e.seq != expected_seq {
            breaks.push(br(
                "sequence gap or reorder (a row was removed or inserted)",
                expected_seq.to_string(),
                e.seq.to_string(),
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
        expected_seq = e.seq + 1;
    }
    breaks
}

fn prev_array(v: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if v.len() == 32 {
        out.copy_from_slice(v);
    }
    out
}

/// A hash over many chain heads (for anchors): sha256 over the lines `operation_id:seq:hash_hex\n`
/// in operation id order. Feed heads in ascending id order ([`OperationId`](crate::OperationId)
/// strings sort like their UUIDs), so a database can stream them.
#[derive(Default)]
pub struct HeadsHasher {
    h: Sha256,
    count: u64,
}

impl HeadsHasher {
    pub fn add(&mut self, operation_id: &str, seq: i64, hash: &[u8]) {
        self.h
            .update(format!("{operation_id}:{seq}:{}\n", hex::encode(hash)).as_bytes());
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

    #[test]
    fn microsecond_truncation_is_stable() {
        let at = DateTime::from_timestamp(1, 999_999_999).unwrap();
        assert_eq!(storable(storable(at)), storable(at));
    }
}
