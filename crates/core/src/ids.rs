//! Identifiers. Ours (operation id), the provider's (remote job id, a plain string), the idempotency
//! token and the trace id are distinct types so they cannot be confused: the trace id is not the token,
//! and the job id is not an approval.
//!
//! Randomness comes in as bytes: the core never draws it.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Our id for one logical operation: `op_` + a ULID rendering of a UUIDv7 (sortable by creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OperationId(Uuid);

/// An id that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is malformed: expected {expected}")]
pub struct BadId {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// At most this much of a malformed id is repeated in its error (an id of megabytes is refused,
/// not echoed back whole).
const SHOWN_ID_CHARS: usize = 80;

/// `s` as an error may repeat it: at most 80 characters, cut with an ellipsis.
pub fn shown(s: &str) -> String {
    cut(s, SHOWN_ID_CHARS)
}

/// `s`, at most `chars` characters of it, cut with an ellipsis.
pub fn cut(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

impl OperationId {
    pub const PREFIX: &'static str = "op_";

    /// A new id, time-ordered and random (UUIDv7), minted by a door before it submits, so that a
    /// submit whose answer is lost can be sent again under it.
    pub fn fresh() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wrap a UUID made by the caller (UUIDv7 from `Uuid::now_v7()` in the store).
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The time the id names: its first 48 bits, milliseconds since the Unix epoch (in a UUIDv7
    /// and a ULID alike), which is what lists sort by.
    pub fn time(&self) -> chrono::DateTime<chrono::Utc> {
        let b = self.0.as_bytes();
        let ms = b[..6]
            .iter()
            .fold(0i64, |acc, &x| (acc << 8) | i64::from(x));
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
    }
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl std::fmt::Display for OperationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            Self::PREFIX,
            ulid::Ulid::from_bytes(self.0.into_bytes())
        )
    }
}

impl std::str::FromStr for OperationId {
    type Err = BadId;
    fn from_str(s: &str) -> Result<Self, BadId> {
        let bad = || BadId {
            what: "operation id",
            value: shown(s),
            expected: "op_ followed by 26 Crockford base32 characters (e.g. op_01J7Q5X4D4PA3DZ2V6K8M9N0PQ)",
        };
        let rest = s.strip_prefix(Self::PREFIX).ok_or_else(bad)?;
        // 26 base32 characters hold 130 bits; a first character above 7 names more than 128 and
        // would alias a smaller id.
        if rest.len() != 26 || !rest.as_bytes()[0].is_ascii_digit() || rest.as_bytes()[0] > b'7' {
            return Err(bad());
        }
        let ulid = ulid::Ulid::from_string(rest).map_err(|_| bad())?;
        Ok(Self(Uuid::from_bytes(ulid.to_bytes())))
    }
}

impl TryFrom<String> for OperationId {
    type Error = BadId;
    fn try_from(s: String) -> Result<Self, BadId> {
        s.parse()
    }
}

impl From<OperationId> for String {
    fn from(id: OperationId) -> String {
        id.to_string()
    }
}

/// Why a provider's job id cannot be used: it must be usable as one path segment and one line of
/// text (a person reads it; URLs are built from it).
pub fn check_remote_job_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("an empty job id".into());
    }
    if id.len() > MAX_LOCATOR_BYTES {
        return Err(format!(
            "a job id of {} bytes (at most {MAX_LOCATOR_BYTES})",
            id.len()
        ));
    }
    if id == "." || id == ".." {
        return Err(format!(
            "the job id {id:?}, which a URL path resolves to another resource"
        ));
    }
    // Nor what a terminal or a reader does instead of printing: a bidi override shows an id
    // reversed in every listing and error that names it, a zero-width space makes two ids look one.
    if id.chars().any(crate::text::acts_instead_of_printing) {
        return Err(format!(
            "the job id {:?}, which holds control, invisible or reordering characters",
            id.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// The longest job id, or URL a provider names (a status URL, a result URL), jobtrail keeps. One
/// limit for both: a job known only by its status URL has that URL as its id.
pub const MAX_LOCATOR_BYTES: usize = 8192;

/// The idempotency token sent with every create of one operation: `idem_` + 32 hex (128 bits from a
/// CSPRNG, drawn by the caller). Bound to exactly one fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdempotencyToken(String);

impl IdempotencyToken {
    pub const PREFIX: &'static str = "idem_";

    pub fn from_random(bytes: [u8; 16]) -> Self {
        Self(format!("{}{}", Self::PREFIX, hex::encode(bytes)))
    }
    /// Rebuild from storage.
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A W3C trace id: 16 bytes, lowercase hex, not all zero. One per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TraceId([u8; 16]);

impl TraceId {
    /// From caller-drawn random bytes. All-zero is invalid in W3C trace context; it is nudged.
    pub fn from_random(mut bytes: [u8; 16]) -> Self {
        if bytes == [0; 16] {
            bytes[15] = 1;
        }
        Self(bytes)
    }
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::str::FromStr for TraceId {
    type Err = BadId;
    fn from_str(s: &str) -> Result<Self, BadId> {
        nonzero_hex(s, "trace id", "32 lowercase hex characters, not all zero").map(Self)
    }
}

/// `N` bytes from `2N` lowercase hex characters, not all zero (W3C trace context's ids).
fn nonzero_hex<const N: usize>(
    s: &str,
    what: &'static str,
    expected: &'static str,
) -> Result<[u8; N], BadId> {
    let bad = || BadId {
        what,
        value: shown(s),
        expected,
    };
    if s.len() != 2 * N || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(bad());
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|_| bad())?;
    if out == [0; N] {
        return Err(bad());
    }
    Ok(out)
}

/// A W3C span id: 8 bytes, lowercase hex, not all zero. Kept for one span only: the caller's,
/// which the operation's root span is recorded under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SpanId([u8; 8]);

impl SpanId {
    /// `None` for all zero, which W3C trace context does not allow.
    pub fn from_bytes(bytes: [u8; 8]) -> Option<Self> {
        (bytes != [0; 8]).then_some(Self(bytes))
    }
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl std::fmt::Display for SpanId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::str::FromStr for SpanId {
    type Err = BadId;
    fn from_str(s: &str) -> Result<Self, BadId> {
        nonzero_hex(s, "span id", "16 lowercase hex characters, not all zero").map(Self)
    }
}

impl TryFrom<String> for SpanId {
    type Error = BadId;
    fn try_from(s: String) -> Result<Self, BadId> {
        s.parse()
    }
}

impl From<SpanId> for String {
    fn from(id: SpanId) -> String {
        id.to_string()
    }
}

/// A caller's W3C trace context (`traceparent`): the operation joins its trace, and the
/// operation's root span is recorded as a child of the caller's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace: TraceId,
    pub span: SpanId,
    /// The caller's sampled flag: a parent-based sampler follows it.
    pub sampled: bool,
}

impl TryFrom<String> for TraceId {
    type Error = BadId;
    fn try_from(s: String) -> Result<Self, BadId> {
        s.parse()
    }
}

impl From<TraceId> for String {
    fn from(id: TraceId) -> String {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_round_trip_and_sort_by_time() {
        let a = OperationId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001));
        let b = OperationId::from_uuid(Uuid::from_u128(0x0190_0000_0001_7000_8000_0000_0000_0000));
        assert!(a.to_string() < b.to_string());
        assert_eq!(a.to_string().parse::<OperationId>().unwrap(), a);
        assert_eq!(a.to_string().len(), 3 + 26);
        assert!("op_nothex!".parse::<OperationId>().is_err());
        assert!("01J7Q5X4D4PA3DZ2V6K8M9N0PQ".parse::<OperationId>().is_err());
    }

    #[test]
    fn a_malformed_id_is_repeated_cut_not_whole() {
        let huge = format!("op_{}", "é".repeat(1 << 20));
        let e = huge.parse::<OperationId>().unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(e.contains("op_éé") && e.contains('…'), "{e}");
        let e = "x"
            .repeat(1 << 20)
            .parse::<TraceId>()
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
    }

    #[test]
    fn operation_ids_past_128_bits_are_refused_not_aliased() {
        let max = OperationId::from_uuid(Uuid::from_u128(u128::MAX));
        assert_eq!(max.to_string(), "op_7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
        assert_eq!(max.to_string().parse::<OperationId>().unwrap(), max);
        for past in [
            "op_8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "op_ZZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "op_80000000000000000000000000",
        ] {
            assert!(past.parse::<OperationId>().is_err(), "{past}");
        }
        assert!(
            "op_01J7Q5X4D4PA3DZ2V6K8M9N0P"
                .parse::<OperationId>()
                .is_err()
        );
    }

    #[test]
    fn job_ids_that_would_move_a_url_or_a_terminal_are_refused() {
        assert!(check_remote_job_id("job_7ad2").is_ok());
        assert!(check_remote_job_id("a.b").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "job\n2",
            "job\u{1b}[2J",
            "job_\u{202e}7ad2",
            "job\u{200b}_7",
        ] {
            assert!(check_remote_job_id(bad).is_err(), "{bad:?}");
        }
        // As long as a status URL may be (a job known by its URL has it as its id), no longer.
        assert!(check_remote_job_id(&"x".repeat(MAX_LOCATOR_BYTES)).is_ok());
        assert!(check_remote_job_id(&"x".repeat(MAX_LOCATOR_BYTES + 1)).is_err());
    }

    #[test]
    fn trace_ids_are_w3c_shaped() {
        let s: SpanId = "00f067aa0ba902b7".parse().unwrap();
        assert_eq!(s.to_string(), "00f067aa0ba902b7");
        for bad in [
            "0000000000000000",
            "00F067AA0BA902B7",
            "00f067aa0ba902",
            "00f067aa0ba902b7z",
        ] {
            assert!(bad.parse::<SpanId>().is_err(), "{bad}");
        }
        assert!(SpanId::from_bytes([0; 8]).is_none());
        let t = TraceId::from_random([0xab; 16]);
        assert_eq!(t.to_string(), "ab".repeat(16));
        assert_eq!(t.to_string().parse::<TraceId>().unwrap(), t);
        assert!("0".repeat(32).parse::<TraceId>().is_err());
        assert!("AB".repeat(16).parse::<TraceId>().is_err());
        assert_ne!(TraceId::from_random([0; 16]).to_bytes(), [0; 16]);
    }

    #[test]
    fn tokens_carry_128_bits() {
        let t = IdempotencyToken::from_random([7; 16]);
        assert_eq!(t.as_str().len(), 5 + 32);
    }
}
