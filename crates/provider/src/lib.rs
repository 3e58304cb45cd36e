//! # jobtrail-provider
//!
//! The wire side of jobtrail. A [`Provider`] is the seam: it makes one call (create, status, cancel,
//! result, lookup) for one operation and returns a *closed* outcome ([`outcome`]) plus the sanitized
//! record of the call. The worker maps each outcome to exactly one transition.
//!
//! [`HttpProvider`] is the implementation driven by a TOML [`Contract`], so an operator adds a provider
//! by writing a file, not Rust; a provider can also be written in code against the same trait.
//!
//! Every request carries the operation's W3C `traceparent` (its trace id, a new span id per call),
//! and that span is exported when an OTLP endpoint is configured ([`spans`]).
//! Credentials are resolved from secret references at send time and exist only in the outgoing
//! request: never in the record, the call log, or a log line.

pub mod contract;
pub mod http;
pub mod outcome;
pub mod spans;
mod text;
pub mod validate;
pub mod wire;

use jobtrail_core::OperationRecord;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use contract::{Contract, ContractError, Phase, ReconcileMethod};
pub use http::HttpProvider;
pub use outcome::*;

/// A boxed future of one call's outcome (object-safe, so providers can live in a registry).
pub type ProviderFuture<'a, T> = Pin<Box<dyn Future<Output = Called<T>> + Send + 'a>>;

/// One call's circumstances: its attempt number, and the instant by which it must have ended (the
/// caller's lease, by its monotonic clock). A call that could not end in time is not sent at all:
/// the check is made immediately before the bytes leave, with the whole call budget as margin.
#[derive(Debug, Clone)]
pub struct CallCtx {
    pub attempt: i32,
    pub end_by: Option<std::time::Instant>,
    /// The database's clock (a time it gave, and this process's monotonic instant then): a call
    /// is dated by it, as history links are, not by this host's clock, which may be skewed.
    /// `None`: this host's clock (tests, tools).
    pub clock: Option<(chrono::DateTime<chrono::Utc>, std::time::Instant)>,
    /// Cancelled when the caller gives up on its calls in flight (a worker whose shutdown grace
    /// ran out): the call ends at once as `abandoned_worker_stopping` (it may have reached the
    /// provider), so its step can still be written, instead of vanishing with its task.
    pub abandon: Option<tokio_util::sync::CancellationToken>,
}

impl CallCtx {
    /// Attempt `n`, with no lease to respect (tests, tools).
    pub fn attempt(n: i32) -> Self {
        Self {
            attempt: n,
            end_by: None,
            clock: None,
            abandon: None,
        }
    }

    /// Now, by the clock the call is dated by.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        match self.clock {
            Some((at, since)) => {
                at + chrono::Duration::from_std(since.elapsed()).unwrap_or_default()
            }
            None => chrono::Utc::now(),
        }
    }
}

impl From<i32> for CallCtx {
    fn from(n: i32) -> Self {
        Self::attempt(n)
    }
}

/// One provider: the calls jobtrail makes, each returning a closed outcome.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// The contract (schedule, deadlines, reconciliation, result rules).
    fn contract(&self) -> &Contract;
    fn create<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, CreateOutcome>;
    fn status<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, StatusOutcome>;
    /// The final GET of the created resource after remote success (contracts with `status.final_get`).
    fn final_get<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, StatusOutcome>;
    fn cancel<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, CancelOutcome>;
    fn fetch_result<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, ResultOutcome>;
    fn lookup<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, LookupOutcome>;

    /// Whether checking `op`'s result parses it as JSON (its memory is then measured first).
    fn result_is_json(&self, op: &OperationRecord) -> bool {
        self.contract().result.as_ref().is_some_and(|spec| {
            spec.for_request(&op.request_body).format == contract::ResultFormat::Json
        })
    }

    /// Validate a fetched result against the contract, with the hints the status reads left.
    fn check_result(&self, op: &OperationRecord, fetched: &FetchedResult) -> Checked {
        let hints: ResultHints = op
            .provider_context
            .get("result")
            .and_then(|r| serde_json::from_value(r.clone()).ok())
            .unwrap_or_default();
        match &self.contract().result {
            Some(spec) => validate::check(spec.for_request(&op.request_body), fetched, &hints),
            None => Checked::Invalid {
                violations: vec!["the contract has no result rules".into()],
            },
        }
    }
}

/// Every configured provider, by name.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    providers: BTreeMap<String, Arc<dyn Provider>>,
}

impl Registry {
    /// Load every contract in `dir` as an HTTP provider.
    pub fn load_dir(dir: &std::path::Path) -> Result<Self, ContractError> {
        let mut r = Self::default();
        for (name, c) in contract::load_dir(dir)? {
            let p = HttpProvider::new(c).map_err(|e| ContractError::Io {
                file: name.clone(),
                message: e,
            })?;
            r.insert(Arc::new(p));
        }
        Ok(r)
    }

    pub fn insert(&mut self, p: Arc<dyn Provider>) {
        self.providers.insert(p.contract().name.clone(), p);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.providers.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    /// Every secret a loaded contract names that cannot be read now (an `env:` variable not set, a
    /// `file:` that does not exist), as "provider P: env:NAME is not set": a misspelt variable in a
    /// deployment is then seen when the worker starts, not as every call failing unsent. Only
    /// whether it is there and not blank is checked: no value is read (a file of at most 4 bytes
    /// is, to tell a blank one).
    pub fn unresolvable_secrets(&self, role: SecretsFor) -> Vec<String> {
        let mut out = Vec::new();
        for (name, p) in &self.providers {
            let c = p.contract();
            let named: Vec<&jobtrail_core::SecretRef> = match role {
                SecretsFor::Calls => c.auth.iter().map(|a| &a.secret).collect(),
                SecretsFor::Grants => c.secrets.values().map(|g| &g.from).collect(),
                SecretsFor::Webhooks => c.webhook.iter().map(|w| &w.secret).collect(),
            };
            for r in named {
                let missing = match r {
                    jobtrail_core::SecretRef::Env(v) => std::env::var_os(v)
                        .is_none_or(|x| x.to_string_lossy().trim().is_empty())
                        .then(|| format!("env:{v} is not set (or empty)")),
                    jobtrail_core::SecretRef::File(f) => wire::secret_file_is_blank(f)
                        .unwrap_or(true)
                        .then(|| format!("file:{f} is not a readable file (or is empty)")),
                };
                if let Some(m) = missing {
                    out.push(format!("provider {name}: {m}"));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// What submit needs, per provider.
    pub fn terms(&self) -> BTreeMap<String, jobtrail_core::ProviderTerms> {
        self.providers
            .iter()
            .map(|(k, p)| (k.clone(), p.contract().terms()))
            .collect()
    }
}

/// Which of a contract's secrets: what every call needs (its credential), what only requests that
/// name a grant need, or what the API's webhook receiver needs (signing secrets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsFor {
    Calls,
    Grants,
    Webhooks,
}

/// reqwest is built without a default crypto provider; install ring's once per process.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    /// A secret file holding nothing, or only the newline an editor added, is missing; one with a
    /// value is there (and is not read: it is longer than a few bytes).
    #[test]
    fn a_blank_secret_file_is_a_missing_one() {
        let dir = std::env::temp_dir().join(format!("jt-blank-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (text, blank) in [
            ("", true),
            ("\n", true),
            (" \r\n", true),
            ("s3cret-value\n", false),
        ] {
            let f = dir.join("secret");
            std::fs::write(&f, text).unwrap();
            let p = f.display().to_string();
            assert_eq!(
                crate::wire::secret_file_is_blank(&p).unwrap(),
                blank,
                "{text:?}"
            );
        }
        assert!(crate::wire::secret_file_is_blank("/dev/zero").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
