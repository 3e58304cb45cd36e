//! Who is asking: a principal is a caller name and the scopes its token grants. The caller recorded in
//! history for anything done through the API or MCP is the token's caller, never a field of a
//! request.

use sha2::{Digest, Sha256};

use crate::error::{Kind, ServiceError};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Submit operations.
    Submit,
    /// Read, wait for and fetch the results of its own operations.
    Read,
    /// Request cancels of its own operations.
    Cancel,
    /// Operator: see every operation, the escalation queue, record decisions, approve submissions.
    Decide,
    /// Auditor: see every operation and verify the evidence.
    Audit,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Submit,
        Scope::Read,
        Scope::Cancel,
        Scope::Decide,
        Scope::Audit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Cancel => "cancel",
            Scope::Decide => "decide",
            Scope::Audit => "audit",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Scope::ALL
            .into_iter()
            .find(|x| x.as_str() == s.trim())
            .ok_or_else(|| {
                format!("unknown scope {s:?} (scopes: submit, read, cancel, decide, audit)")
            })
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    caller: String,
    scopes: Vec<Scope>,
    /// The bearer token it was authenticated by (`None`: database credentials), so that a request
    /// that runs long (a wait) can see the token revoked.
    token: Option<TokenDigest>,
}

/// A token's digest, never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest(pub [u8; 32]);

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(…)")
    }
}

impl Principal {
    pub fn new(caller: impl Into<String>, scopes: impl IntoIterator<Item = Scope>) -> Self {
        let mut scopes: Vec<Scope> = scopes.into_iter().collect();
        scopes.sort();
        scopes.dedup();
        Self {
            caller: caller.into(),
            scopes,
            token: None,
        }
    }

    /// The principal as authenticated by the token with this digest.
    pub fn by_token(mut self, digest: [u8; 32]) -> Self {
        self.token = Some(TokenDigest(digest));
        self
    }

    pub fn token(&self) -> Option<TokenDigest> {
        self.token
    }

    /// Whoever holds database credentials (the CLI and jobtrail-admin with `DATABASE_URL`): every
    /// scope. What they may really do is bounded by their database role.
    pub fn trusted(caller: impl Into<String>) -> Self {
        Self::new(caller, Scope::ALL)
    }

    pub fn caller(&self) -> &str {
        &self.caller
    }

    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }

    /// The same caller and token without `scope` (a door that must not use it).
    pub fn without(mut self, scope: Scope) -> Self {
        self.scopes.retain(|s| *s != scope);
        self
    }

    /// Refused unless the principal holds `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ServiceError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(ServiceError::new(
                Kind::Forbidden,
                format!(
                    "this token (caller {}) lacks the {} scope",
                    self.caller,
                    scope.as_str()
                ),
            ))
        }
    }

    /// Operators and auditors see every operation; everyone else only their own caller's.
    pub fn sees_all(&self) -> bool {
        self.has(Scope::Decide) || self.has(Scope::Audit)
    }
}

/// The prefix every token carries (so a leaked one is recognisable in a scan).
pub const TOKEN_PREFIX: &str = "jtk_";

/// A new token: `jtk_` and 256 random bits in hex. Shown once; only its digest is stored.
pub fn new_token() -> Result<(String, [u8; 32]), ServiceError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| ServiceError::unavailable(format!("the OS random source failed: {e}")))?;
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
    let digest = token_digest(&token);
    Ok((token, digest))
}

/// The stored form of a token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Whether a string is shaped like a token (checked before any database lookup).
pub fn token_shaped(token: &str) -> bool {
    token
        .strip_prefix(TOKEN_PREFIX)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Parse a comma-separated scope list (`submit,read`).
pub fn parse_scopes(s: &str) -> Result<Vec<Scope>, String> {
    let scopes = s
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Scope>, String>>()?;
    if scopes.is_empty() {
        return Err("at least one scope is needed (submit, read, cancel, decide, audit)".into());
    }
    Ok(scopes)
}

/// Lookups of tokens not found live lately, per second, across every caller of this process (and
/// the burst): each is a database query, and anyone may send a random token-shaped string; the
/// per-token rate counts each such string apart, and the per-address rate may be off (behind an
/// Ingress). Tokens found live lately are always looked up (a revoked one is refused at once).
const UNKNOWN_LOOKUPS_PER_SEC: u32 = 50;
const UNKNOWN_LOOKUPS_BURST: u32 = 200;
/// How long, and how many, tokens found live are remembered as such.
const LIVE_FOR: std::time::Duration = std::time::Duration::from_secs(600);
const LIVE_KEPT: usize = 10_000;
/// How often the list of every live token's digest is read again (a token created since is looked
/// up within the budget until then), and the most it holds.
pub(crate) const LISTED_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
/// (32 bytes each: 3.2 MB at most, held once more while a read replaces it.)
pub(crate) const LISTED_MOST: i64 = 100_000;

/// Bounds the database lookups a flood of unknown tokens can cause, without holding back the
/// agents whose tokens are live: those listed by the last read of every live token's digest (a
/// rollout's new servers know every agent at once), and those found live since.
pub(crate) struct TokenLookups {
    unknown: governor::DefaultDirectRateLimiter,
    live: std::sync::Mutex<std::collections::HashMap<[u8; 32], std::time::Instant>>,
    /// Sorted, for a binary search.
    listed: std::sync::RwLock<Vec<[u8; 32]>>,
    /// When the list was last asked for (`None`: never), and whether a read is under way (one at
    /// a time, however long it takes).
    listed_at: std::sync::Mutex<(Option<std::time::Instant>, bool)>,
}

impl Default for TokenLookups {
    fn default() -> Self {
        let quota = governor::Quota::per_second(
            std::num::NonZeroU32::new(UNKNOWN_LOOKUPS_PER_SEC).expect("non-zero"),
        )
        .allow_burst(std::num::NonZeroU32::new(UNKNOWN_LOOKUPS_BURST).expect("non-zero"));
        Self {
            unknown: governor::RateLimiter::direct(quota),
            live: Default::default(),
            listed: Default::default(),
            listed_at: Default::default(),
        }
    }
}

impl TokenLookups {
    /// Whether `digest` may be looked up now; else how long until one more unknown may be.
    pub(crate) fn may_look_up(&self, digest: &[u8; 32]) -> Result<(), std::time::Duration> {
        let known = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .is_some_and(|at| at.elapsed() < LIVE_FOR)
            || self
                .listed
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .binary_search(digest)
                .is_ok();
        if known {
            return Ok(());
        }
        use governor::clock::{Clock, DefaultClock};
        self.unknown
            .check()
            .map_err(|w| w.wait_time_from(DefaultClock::default().now()))
    }

    /// Whether the list of live tokens is due to be read again; if so, it is taken as being read
    /// now (one read at a time).
    pub(crate) fn list_due(&self) -> bool {
        let mut at = self.listed_at.lock().unwrap_or_else(|p| p.into_inner());
        if at.1 || at.0.is_some_and(|t| t.elapsed() < LISTED_EVERY) {
            return false;
        }
        *at = (Some(std::time::Instant::now()), true);
        true
    }

    /// The digests of every live token, as just read (`None`: the read failed; the last list
    /// stays).
    pub(crate) fn listed(&self, digests: Option<Vec<[u8; 32]>>) {
        if let Some(mut digests) = digests {
            digests.sort_unstable();
            *self.listed.write().unwrap_or_else(|p| p.into_inner()) = digests;
        }
        self.listed_at.lock().unwrap_or_else(|p| p.into_inner()).1 = false;
    }

    /// `digest` was found live: looked up without the budget for a while.
    pub(crate) fn found_live(&self, digest: [u8; 32]) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.len() >= LIVE_KEPT {
            live.retain(|_, at| at.elapsed() < LIVE_FOR);
        }
        if live.len() < LIVE_KEPT || live.contains_key(&digest) {
            live.insert(digest, std::time::Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_shaped_and_stored_as_digests() {
        let (a, da) = new_token().unwrap();
        let (b, db) = new_token().unwrap();
        assert_ne!(a, b);
        assert_ne!(da, db);
        assert!(token_shaped(&a));
        assert_eq!(token_digest(&a), da);
        assert!(!token_shaped("jtk_short"));
        assert!(!token_shaped(&a.replace(TOKEN_PREFIX, "xyz_")));
        assert!(!token_shaped(&format!("{a}0")));
    }

    #[test]
    fn scopes_parse_and_gate() {
        assert_eq!(
            parse_scopes("submit, read").unwrap(),
            vec![Scope::Submit, Scope::Read]
        );
        assert!(parse_scopes("").is_err());
        assert!(parse_scopes("submit,admin").is_err());
        let p = Principal::new("agent-7", [Scope::Read, Scope::Submit, Scope::Read]);
        assert_eq!(p.scopes(), &[Scope::Submit, Scope::Read]);
        assert!(p.require(Scope::Read).is_ok());
        assert_eq!(p.require(Scope::Cancel).unwrap_err().kind, Kind::Forbidden);
        assert!(!p.sees_all());
        assert!(Principal::trusted("alice").sees_all());
    }
}
