//! The provider contract: one TOML file per provider, holding everything the essay says differs
//! between providers. Parsed strictly (unknown keys are errors) and validated at load; every error
//! names the file, the key and what was expected. See `docs/provider-contracts.md`.

use jobtrail_core::schedule::{Backoff, RetryAfterBounds};
use jobtrail_core::{BodyShape, IdempotencyMode, ProviderTerms, SecretRef};

pub use jobtrail_core::decide::LEASE_MARGIN;
pub use jobtrail_core::outcome::{Phase, ReconcileMethod};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A contract that did not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: {key}: expected {expected}")]
    Invalid {
        file: String,
        key: String,
        expected: String,
    },
    #[error("{file}: {message}")]
    Io { file: String, message: String },
}

/// Where a value is found in a response: `body:/json/pointer` or `header:Name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locator {
    Body(String),
    Header(String),
}

impl Locator {
    fn parse(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("body:") {
            if p.is_empty() || p.starts_with('/') {
                return Ok(Locator::Body(p.to_owned()));
            }
        } else if let Some(h) = s.strip_prefix("header:")
            && http::HeaderName::from_bytes(h.as_bytes()).is_ok()
        {
            return Ok(Locator::Header(h.to_owned()));
        }
        Err(format!(
            "`body:/json/pointer` or `header:Header-Name`, got {s:?}"
        ))
    }
}

/// What a response means, when a rule matches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Meaning {
    /// Definitive: the provider will not do this.
    Reject,
    /// We cannot tell whether it took effect.
    Ambiguous,
    /// Not done; try again later (honouring Retry-After).
    RetryLater,
    /// A duplicate create reported as an error: read it as the original job.
    AlreadyExists,
    /// Success, whatever the status says.
    Success,
}

/// Which call a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallName {
    Create,
    Status,
    Cancel,
    Result,
    Lookup,
}

/// Where the result is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ResultFrom {
    /// `result.url`, or the URL the status body names (`status.result_url`).
    #[default]
    Url,
    /// The status URL once more after success (the last one the provider gave, else the
    /// `status.url` template): the final status body is the result (Google's `Operation` with its
    /// `response`; Azure's `final-state-via: operation-location` / `azure-async-operation`).
    Status,
    /// The created resource itself (the `status.url` template; Azure's `final-state-via:
    /// original-uri`).
    Resource,
}

/// The format of a result body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultFormat {
    Json,
    Csv,
    Bytes,
    /// The job has no result (a DELETE, a POST answered without a body): the provider's success
    /// is the outcome, recorded as an empty result, and nothing is fetched.
    None,
}

/// Which HTTP the contract's own origins are called with (`http_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
pub enum HttpVersion {
    /// HTTP/1.1, or HTTP/2 where the provider's TLS offers it (ALPN).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// HTTP/1.1 only: for a provider whose HTTP/2 misbehaves.
    #[serde(rename = "1.1")]
    Http1,
    /// HTTP/2 only, every call of a worker to one origin multiplexed over one connection:
    /// negotiated over https, by prior knowledge over plain http (h2c).
    #[serde(rename = "2")]
    Http2,
}

// ---- raw TOML shape (strict) -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: String,
    /// A built-in protocol profile the contract starts from (merged before this is read).
    #[serde(default)]
    #[allow(dead_code)]
    protocol: Option<String>,
    /// Profile keys the contract does without (applied before this is read).
    #[serde(default)]
    #[allow(dead_code)]
    unset: Vec<String>,
    #[serde(default)]
    description: Option<String>,
    base_url: String,
    /// Credentials (`auth`, `secrets`) may go over plain http to a host that is not loopback.
    #[serde(default)]
    allow_plain_http: bool,
    #[serde(default)]
    untested: bool,
    #[serde(default)]
    requires_approval: bool,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    http_version: HttpVersion,
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    query: BTreeMap<String, String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    trace_header: Option<String>,
    #[serde(default)]
    client_request_id_header: Option<String>,
    #[serde(default)]
    cookies: bool,
    #[serde(default)]
    origins: Option<Vec<String>>,
    #[serde(default)]
    unauthenticated_origins: Vec<String>,
    create: RawCreate,
    status: RawStatus,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    polling: RawPolling,
    #[serde(default)]
    deadlines: RawDeadlines,
    #[serde(default)]
    cancel: Option<RawCancel>,
    #[serde(default)]
    result: Option<RawResult>,
    #[serde(default)]
    reconcile: RawReconcile,
    #[serde(default)]
    webhook: Option<RawWebhook>,
    #[serde(default)]
    redact: Vec<String>,
    #[serde(default)]
    secrets: BTreeMap<String, RawSecret>,
    #[serde(default)]
    limits: RawLimits,
}

/// `[limits]`: how much of the fleet one provider may use (see docs/provider-contracts.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default)]
    max_in_flight: Option<u32>,
    #[serde(default)]
    fleet_max_in_flight: Option<u32>,
    #[serde(default)]
    rate_per_sec: Option<f64>,
    #[serde(default)]
    burst: Option<u32>,
}

/// `[secrets.NAME]`: a secret callers may name at a sensitive field (operator configuration).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    from: String,
    #[serde(default)]
    callers: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    #[serde(default = "d_connect")]
    connect_ms: u64,
    #[serde(default = "d_request")]
    request_ms: u64,
    #[serde(default = "d_body")]
    max_response_bytes: u64,
}
fn d_connect() -> u64 {
    2_000
}
fn d_request() -> u64 {
    10_000
}
fn d_body() -> u64 {
    1024 * 1024
}
impl Default for RawTimeouts {
    fn default() -> Self {
        Self {
            connect_ms: d_connect(),
            request_ms: d_request(),
            max_response_bytes: d_body(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(default = "d_auth_header")]
    header: String,
    #[serde(default)]
    scheme: Option<String>,
    secret: String,
}
fn d_auth_header() -> String {
    "Authorization".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCreate {
    #[serde(default = "d_post")]
    method: String,
    path: String,
    idempotency: String,
    #[serde(default)]
    idempotency_header: Option<String>,
    #[serde(default)]
    idempotency_field: Option<String>,
    #[serde(default)]
    client_reference_field: Option<String>,
    #[serde(default)]
    job_id: Option<String>,
    #[serde(default)]
    initial_state: Option<String>,
    #[serde(default)]
    status_url: Option<String>,
    #[serde(default)]
    sync_result: Option<String>,
    #[serde(default)]
    result_url: Option<String>,
    #[serde(default)]
    sync_codes: Vec<u16>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    max_body_bytes: Option<u64>,
    #[serde(default)]
    request_schema: Option<String>,
    #[serde(default)]
    request_schema_file: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}
fn d_post() -> String {
    "POST".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatus {
    url: String,
    #[serde(default)]
    follow: Option<Vec<String>>,
    #[serde(default)]
    state: Option<OneOrMany>,
    #[serde(default)]
    state_absent: Option<String>,
    #[serde(default)]
    done: Option<String>,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default)]
    updated_at: Option<String>,
    #[serde(default)]
    progress: Option<String>,
    #[serde(default)]
    result_url: Option<String>,
    #[serde(default)]
    expected_count: Option<String>,
    #[serde(default)]
    checksum: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    final_get: bool,
    #[serde(default)]
    states: RawStates<String>,
    #[serde(default)]
    codes: RawStates<u16>,
}

/// One JSON pointer, or several (the first one present in the body wins).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// What says each phase: provider state names (`[status.states]`) or HTTP status codes of the
/// status response (`[status.codes]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStates<T> {
    #[serde(default)]
    queued: Vec<T>,
    #[serde(default)]
    running: Vec<T>,
    #[serde(default)]
    succeeded: Vec<T>,
    #[serde(default)]
    failed: Vec<T>,
    #[serde(default)]
    cancelled: Vec<T>,
}

impl<T> Default for RawStates<T> {
    fn default() -> Self {
        Self {
            queued: Vec::new(),
            running: Vec::new(),
            succeeded: Vec::new(),
            failed: Vec::new(),
            cancelled: Vec::new(),
        }
    }
}

impl<T> RawStates<T> {
    /// Each phase with its values and its key under `table`.
    fn by_phase(&self, table: &str) -> [(Phase, &Vec<T>, String); 5] {
        [
            (Phase::Queued, &self.queued, format!("{table}.queued")),
            (Phase::Running, &self.running, format!("{table}.running")),
            (
                Phase::Succeeded,
                &self.succeeded,
                format!("{table}.succeeded"),
            ),
            (Phase::Failed, &self.failed, format!("{table}.failed")),
            (
                Phase::Cancelled,
                &self.cancelled,
                format!("{table}.cancelled"),
            ),
        ]
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    calls: Vec<CallName>,
    #[serde(default)]
    status: Vec<u16>,
    #[serde(default)]
    body_contains: Option<String>,
    means: Meaning,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolling {
    #[serde(default = "d_initial")]
    initial_ms: u64,
    #[serde(default = "d_factor")]
    factor: f64,
    #[serde(default = "d_cap")]
    cap_ms: u64,
    #[serde(default = "d_jitter")]
    jitter: f64,
    /// Unset: a second, or `retry_after_max_ms` if that is less.
    #[serde(default)]
    retry_after_min_ms: Option<u64>,
    #[serde(default = "d_ra_max")]
    retry_after_max_ms: u64,
    #[serde(default = "d_failures")]
    max_failures: u32,
}
fn d_initial() -> u64 {
    2_000
}
fn d_factor() -> f64 {
    2.0
}
fn d_cap() -> u64 {
    60_000
}
fn d_jitter() -> f64 {
    0.2
}
/// A `Retry-After: 0` (or a date gone by) waits this long: `Retry-After` counts whole seconds, and a
/// provider answering "now" to every read would otherwise set the poll rate, and how fast the
/// record grows, by itself.
fn d_ra_min() -> u64 {
    1000
}
fn d_ra_max() -> u64 {
    300_000
}
fn d_failures() -> u32 {
    8
}
impl Default for RawPolling {
    fn default() -> Self {
        Self {
            initial_ms: d_initial(),
            factor: d_factor(),
            cap_ms: d_cap(),
            jitter: d_jitter(),
            retry_after_min_ms: None,
            retry_after_max_ms: d_ra_max(),
            max_failures: d_failures(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadlines {
    #[serde(default = "d_create_ms")]
    create_ms: u64,
    #[serde(default = "d_result_ms")]
    result_ms: u64,
}
fn d_create_ms() -> u64 {
    120_000
}
fn d_result_ms() -> u64 {
    3_600_000
}
impl Default for RawDeadlines {
    fn default() -> Self {
        Self {
            create_ms: d_create_ms(),
            result_ms: d_result_ms(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCancel {
    #[serde(default = "d_post")]
    method: String,
    path: String,
    #[serde(default)]
    idempotent: bool,
    #[serde(default = "d_cancel_ms")]
    window_ms: u64,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<toml::Value>,
}
fn d_cancel_ms() -> u64 {
    300_000
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawResult {
    /// A pointer into the request body naming one of `formats` (absent: the keys here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format_from: Option<String>,
    /// Result keys per format name, over the keys here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    formats: BTreeMap<String, toml::Table>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    body: Option<toml::Value>,
    #[serde(default)]
    from: ResultFrom,
    #[serde(default)]
    within: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default = "d_result_bytes")]
    max_bytes: u64,
    #[serde(default = "d_format")]
    format: ResultFormat,
    #[serde(default)]
    checksum_header: Option<String>,
    #[serde(default = "d_algorithm")]
    checksum_algorithm: String,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    schema_file: Option<String>,
    #[serde(default)]
    items: Option<String>,
    #[serde(default)]
    item_error: Option<String>,
    #[serde(default)]
    item_ref: Option<String>,
    #[serde(default)]
    item_status: Option<String>,
    #[serde(default)]
    item_failed_values: Vec<String>,
    #[serde(default)]
    item_succeeded_values: Vec<String>,
    #[serde(default)]
    csv_status_column: Option<String>,
    #[serde(default)]
    csv_error_values: Vec<String>,
    #[serde(default)]
    csv_succeeded_values: Vec<String>,
    #[serde(default)]
    expected_count: Option<u64>,
    #[serde(default)]
    max_failed_items: Option<u64>,
}
fn d_result_bytes() -> u64 {
    16 * 1024 * 1024
}
fn d_format() -> ResultFormat {
    ResultFormat::Json
}
fn d_algorithm() -> String {
    "sha256".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReconcile {
    #[serde(default = "d_reconcile")]
    method: ReconcileMethod,
    #[serde(default)]
    lookup_url: Option<String>,
    #[serde(default)]
    lookup_method: Option<String>,
    #[serde(default)]
    lookup_body: Option<toml::Value>,
    #[serde(default)]
    lookup_jobs: Option<String>,
    #[serde(default)]
    lookup_job_id: Option<String>,
    #[serde(default)]
    lookup_reference: Option<String>,
    #[serde(default = "d_reconcile_interval")]
    interval_ms: u64,
}
fn d_reconcile() -> ReconcileMethod {
    ReconcileMethod::None
}
fn d_reconcile_interval() -> u64 {
    2_000
}
impl Default for RawReconcile {
    fn default() -> Self {
        Self {
            method: d_reconcile(),
            lookup_url: None,
            lookup_method: None,
            lookup_body: None,
            lookup_jobs: None,
            lookup_job_id: None,
            lookup_reference: None,
            interval_ms: d_reconcile_interval(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    signature: String,
    #[serde(default)]
    signature_header: Option<String>,
    #[serde(default)]
    timestamp_header: Option<String>,
    secret: String,
    #[serde(default)]
    event_id: Option<String>,
    job_id: String,
    #[serde(default)]
    tolerance_ms: Option<u64>,
}

// ---- the validated contract ---------------------------------------------------------------------

/// Authentication injected at send time from a secret reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub header: http::HeaderName,
    pub scheme: Option<String>,
    pub secret: SecretRef,
}

/// A secret callers may name (by its grant name) at the contract's sensitive fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedSecret {
    /// Where the worker reads it: the operator's choice, never the caller's.
    pub from: SecretRef,
    pub grant: jobtrail_core::SecretGrant,
}

/// How a URL may be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// With the contract's credentials and the operation's cookies.
    Credentials,
    /// Without credentials or cookies.
    Anonymous,
}

/// Where the idempotency token goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenPlacement {
    Header(http::HeaderName),
    BodyField(String),
    None,
    /// No token: the create is a PUT to a URL the operation chooses, so a resend names the same
    /// resource (HTTP's own idempotency).
    Natural,
}

impl TokenPlacement {
    /// Whether a token goes with the create (so `{idempotency_key}` can look it up).
    pub fn sends_token(&self) -> bool {
        matches!(
            self,
            TokenPlacement::Header(_) | TokenPlacement::BodyField(_)
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateSpec {
    pub method: http::Method,
    pub path: String,
    pub token: TokenPlacement,
    pub client_reference_field: Option<String>,
    /// Where the job's id is; `None`: the job is known by the status URL the answer names
    /// (Azure's `Operation-Location`, OGC's `Location`).
    pub job_id: Option<Locator>,
    pub initial_state: Option<Locator>,
    pub status_url: Option<Locator>,
    pub sync_result: Option<Locator>,
    /// Where the create's answer names the result's URL (Azure's `final-state-via: location`:
    /// the `Location` header of the first answer), fetched once the job succeeded.
    pub result_url: Option<Locator>,
    /// Status codes of a create answer that is the finished job itself (OGC's 200: executed
    /// synchronously), its result the body (or the `sync_result` part of it).
    pub sync_codes: Vec<u16>,
    /// Which JSON values submit accepts as the body (`create.body`: "object", the default, or "any").
    pub body: BodyShape,
    /// The largest request body submit accepts for this provider.
    pub max_body_bytes: usize,
    /// The JSON Schema a request must satisfy (`create.request_schema` or `request_schema_file`),
    /// checked at submit; shown to agents in the provider catalogue.
    pub request_schema: Option<Schema>,
    /// Fixed headers on the create call (OGC's `Prefer: respond-async`).
    pub headers: http::HeaderMap,
}

/// A JSON Schema document and its compiled validator.
#[derive(Debug, Clone)]
pub struct Schema {
    pub document: serde_json::Value,
    pub validator: std::sync::Arc<jsonschema::Validator>,
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.document == other.document
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatusSpec {
    pub url: String,
    /// Where the provider may give (or change) the status URL, highest precedence first.
    pub follow: Vec<Locator>,
    /// JSON pointers to the provider's state, the first present wins (a value that is not a
    /// string is read as its JSON text: `true`, `3`).
    pub state: Vec<String>,
    /// The state when none of the pointers is present (Google's `done` is left out while false).
    pub state_absent: Option<String>,
    /// A pointer to a flag that must be JSON `true` before a status document says anything but
    /// `state_absent` (no state, without one) (AIP-151: `error` and `response` mean nothing until `done`; a provider that
    /// sends an error code beside `done: false` has not ended the job, nor cancelled it).
    pub done: Option<String>,
    /// State names compare without regard to case (Azure: `Succeeded`, `succeeded`).
    pub ignore_case: bool,
    /// Status codes of the status response that are the state by themselves (Azure's `Location`
    /// polling: 202 running, 200/201/204 done); read before any rule and before the body.
    pub codes: BTreeMap<u16, Phase>,
    pub updated_at: Option<String>,
    pub progress: Option<String>,
    pub result_url: Option<String>,
    pub expected_count: Option<String>,
    pub checksum: Option<String>,
    pub error: Option<String>,
    pub final_get: bool,
    pub states: BTreeMap<String, Phase>,
}

impl StatusSpec {
    /// The phase of a provider state name; `None` for a name the contract does not know (recorded as
    /// such, never guessed).
    /// The state a body states: the first of the `state` pointers present and not null, a
    /// non-string (`true`, `3`) read as its JSON text.
    pub fn state_in(&self, body: &serde_json::Value) -> Option<String> {
        if let Some(done) = &self.done
            && body.pointer(done) != Some(&serde_json::Value::Bool(true))
        {
            return self.state_absent.clone();
        }
        self.stated(body)
    }

    /// The state a document states at the `state` pointers, `done` or not: the created resource
    /// (read after success, at a URL that is not the job's status) has no `done` of its own.
    pub fn stated(&self, body: &serde_json::Value) -> Option<String> {
        self.state
            .iter()
            .find_map(|p| body.pointer(p).filter(|v| !v.is_null()))
            .map(crate::text::of_json)
    }

    pub fn phase(&self, remote_state: &str) -> Option<Phase> {
        if self.ignore_case {
            return self.states.get(&remote_state.to_lowercase()).copied();
        }
        self.states.get(remote_state).copied()
    }
}

impl ResultSpec {
    /// The spec for the format the request names (`format_from`), else this one. A name the
    /// contract does not know never reaches here: submit refuses it.
    pub fn for_request(&self, request: &serde_json::Value) -> &ResultSpec {
        self.format_from
            .as_deref()
            .and_then(|p| request.pointer(p))
            .and_then(|v| v.as_str())
            .and_then(|name| self.formats.get(name))
            .unwrap_or(self)
    }

    /// The largest result any format of this contract allows.
    pub fn largest(&self) -> u64 {
        self.formats
            .values()
            .map(|f| f.max_bytes)
            .fold(self.max_bytes, u64::max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub calls: Vec<CallName>,
    pub status: Vec<u16>,
    pub body_contains: Option<String>,
    pub means: Meaning,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Polling {
    pub backoff: Backoff,
    pub retry_after: RetryAfterBounds,
    pub max_failures: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CancelSpec {
    pub method: http::Method,
    pub path: String,
    pub idempotent: bool,
    pub window: Duration,
    /// Fixed headers on the cancel call.
    pub headers: http::HeaderMap,
    /// A JSON body template (placeholders in its strings); `None`: an empty body.
    pub body: Option<serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct ResultSpec {
    /// Where the request names its result format, and each format's spec (this one is the
    /// request's when it names none).
    pub format_from: Option<String>,
    pub formats: BTreeMap<String, ResultSpec>,
    pub url: Option<String>,
    /// How `url` is fetched: GET, or POST with `body` (a JSON template).
    pub method: http::Method,
    pub body: Option<serde_json::Value>,
    pub from: ResultFrom,
    /// JSON pointer to the result inside the fetched document: the rules apply there, the bytes
    /// are kept whole.
    pub within: Option<String>,
    pub content_type: Option<String>,
    pub max_bytes: u64,
    pub format: ResultFormat,
    pub checksum_header: Option<http::HeaderName>,
    pub schema: Option<std::sync::Arc<jsonschema::Validator>>,
    pub items: Option<String>,
    pub item_error: Option<String>,
    pub item_ref: Option<String>,
    /// Each item's status value: failed when it is one of `item_failed_values`, or, when
    /// `item_succeeded_values` is set, when it is not one of those (a value nobody listed is not
    /// a success).
    pub item_status: Option<String>,
    pub item_failed_values: Vec<String>,
    pub item_succeeded_values: Vec<String>,
    /// Each CSV row's status column: the row fails when its value is one of `csv_error_values`,
    /// or, when `csv_succeeded_values` is set, when it is not one of those.
    pub csv_status_column: Option<String>,
    pub csv_error_values: Vec<String>,
    pub csv_succeeded_values: Vec<String>,
    pub expected_count: Option<u64>,
    pub max_failed_items: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileSpec {
    pub method: ReconcileMethod,
    pub lookup_url: Option<String>,
    /// How the lookup is sent: GET, or POST with `lookup_body` (a JSON template).
    pub lookup_method: http::Method,
    pub lookup_body: Option<serde_json::Value>,
    pub lookup_jobs: Option<String>,
    pub lookup_job_id: Option<String>,
    /// Where, in each job listed, the provider repeats what we looked it up by (our reference or
    /// idempotency key): a listed job that does not is not ours (a provider that ignored the
    /// filter lists jobs of others).
    pub lookup_reference: Option<String>,
    pub interval: Duration,
}

/// How a provider's webhooks are received: verified, deduplicated by event id, mapped to an
/// operation by job id, and then only a reason to read the job's status now.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookSpec {
    pub scheme: WebhookScheme,
    /// The signing secret (for Standard Webhooks, `whsec_` and base64, as providers hand it out).
    pub secret: SecretRef,
    /// Pointer to the event id in the payload (the plain HMAC scheme; Standard Webhooks carry it in
    /// the `webhook-id` header).
    pub event_id: Option<String>,
    /// Pointer to the remote job id in the payload.
    pub job_id: String,
    /// How far a delivery's timestamp may be from now (Standard Webhooks: the library's five
    /// minutes).
    pub tolerance: Duration,
}

/// A webhook signature scheme.
#[derive(Debug, Clone, PartialEq)]
pub enum WebhookScheme {
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature` (`v1,<base64>`
    /// HMAC-SHA256 of `id.timestamp.body`).
    StandardWebhooks,
    /// A hex HMAC-SHA256 in one header (optionally `sha256=`-prefixed), of the body, or of
    /// `timestamp.body` when a timestamp header is named.
    HmacSha256 {
        signature_header: http::HeaderName,
        timestamp_header: Option<http::HeaderName>,
    },
}

/// How much of the fleet one provider may use.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// Steps in flight for this provider on one worker (`None`: its fair share while other
    /// providers have due work, every slot otherwise).
    pub max_in_flight: Option<u32>,
    /// Steps in flight for this provider across every worker sharing the database.
    pub fleet_max_in_flight: Option<u32>,
    /// Calls per second across the fleet, and how many may go at once after a quiet spell.
    pub rate: Option<Rate>,
}

/// A fleet-wide token bucket: `per_sec` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u32,
}

/// A validated provider contract.
#[derive(Debug, Clone)]
pub struct Contract {
    pub file: PathBuf,
    pub name: String,
    pub description: Option<String>,
    pub untested: bool,
    /// Submissions need a person's approval: through the API, a token with the `decide` scope.
    pub requires_approval: bool,
    pub base_url: url::Url,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub max_response_bytes: u64,
    /// How the contract's own origins are called (unauthenticated origins: always `Auto`).
    pub http_version: HttpVersion,
    pub auth: Option<Auth>,
    pub query: BTreeMap<String, String>,
    /// Fixed headers on every call (not secrets: they are printed by `contract check`).
    pub headers: http::HeaderMap,
    pub trace_header: Option<http::HeaderName>,
    /// Where each call's own id goes (Azure's `x-ms-client-request-id`); an answer echoing another
    /// id is not the answer to that call.
    pub client_request_id_header: Option<http::HeaderName>,
    pub cookies: bool,
    /// Origins the credentials and cookies may go to (`None`: the base URL's origin only).
    pub origins: Option<Vec<url::Origin>>,
    /// Origins called without credentials or cookies (pre-signed object-storage URLs).
    pub unauthenticated_origins: Vec<url::Origin>,
    pub create: CreateSpec,
    pub status: StatusSpec,
    pub rules: Vec<Rule>,
    pub polling: Polling,
    pub create_window: Duration,
    pub result_window: Duration,
    pub cancel: Option<CancelSpec>,
    pub result: Option<ResultSpec>,
    pub reconcile: ReconcileSpec,
    pub webhook: Option<WebhookSpec>,
    pub redact: Vec<String>,
    /// Secrets callers may name, by grant name.
    pub secrets: BTreeMap<String, GrantedSecret>,
    pub limits: Limits,
}

/// The most a contract or a schema file it names may hold: far beyond any real one, and a path
/// named by mistake (`/dev/zero`, a log, a disk image) is refused instead of read until memory ends.
pub const CONFIG_FILE_MOST: u64 = 4 << 20;

/// A text file of at most `most` bytes, read whole; a larger one, or one that is not UTF-8, is an
/// error naming why (nothing past `most` is read).
pub fn read_text_file(path: &Path, most: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(most.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > most {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the {most} bytes such a file may hold"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

impl Contract {
    /// What submit needs to know.
    pub fn terms(&self) -> ProviderTerms {
        let mut t = ProviderTerms::new(&self.name, self.idempotency());
        t.body = self.create.body;
        t.max_body_bytes = self.create.max_body_bytes;
        t.sensitive_fields = self.redact.clone();
        t.secret_grants = self
            .secrets
            .iter()
            .map(|(n, s)| (n.clone(), s.grant.clone()))
            .collect();
        t.default_create_window = self.create_window;
        t.default_result_window = self.result_window;
        if let Some(c) = &self.cancel {
            t.default_cancel_window = c.window;
        }
        if let Some(r) = &self.result
            && let Some(pointer) = &r.format_from
        {
            t.result_formats = Some(jobtrail_core::operation::ResultFormats {
                pointer: pointer.clone(),
                names: r.formats.keys().cloned().collect(),
            });
        }
        if let TokenPlacement::BodyField(p) = &self.create.token {
            t.written_fields.push(p.clone());
        }
        t.written_fields
            .extend(self.create.client_reference_field.iter().cloned());
        t
    }

    /// Whether a URL may be called, and with the contract's credentials or without any. A URL at an
    /// origin the contract does not declare is refused: the provider named it, and neither our
    /// credentials nor a request of ours go there.
    pub fn access(&self, u: &url::Url) -> Option<Access> {
        if !matches!(u.scheme(), "http" | "https")
            || !u.username().is_empty()
            || u.password().is_some()
        {
            return None;
        }
        let origin = u.origin();
        let trusted = match &self.origins {
            Some(list) => list.contains(&origin),
            None => origin == self.base_url.origin(),
        };
        if trusted {
            Some(Access::Credentials)
        } else if self.unauthenticated_origins.contains(&origin) {
            Some(Access::Anonymous)
        } else {
            None
        }
    }

    /// What the step decisions need: schedule, retry budget, reconciliation, cancel.
    pub fn policy(&self) -> jobtrail_core::decide::Policy {
        jobtrail_core::decide::Policy {
            backoff: self.polling.backoff,
            retry_after: self.polling.retry_after,
            max_failures: self.polling.max_failures,
            reconcile: self.reconcile.method,
            lookup: self.reconcile.lookup_url.is_some(),
            reconcile_interval: self.reconcile.interval,
            cancel_idempotent: self.cancel.as_ref().is_some_and(|c| c.idempotent),
            final_get: self.status.final_get,
            no_result: self.no_result(),
        }
    }

    /// The contract says its jobs have no result (`result.format = "none"`).
    pub fn no_result(&self) -> bool {
        self.result
            .as_ref()
            .is_some_and(|r| r.format == ResultFormat::None)
    }

    /// The most of a status answer that is read: the result's own limit too where the final status
    /// answer is the result (`result.from = "status"`: Google's `Operation` with its `response`) or
    /// the polls read the result itself (`"resource"`), else a result within its limit would fail
    /// every poll that sees it as too large.
    pub fn status_read_limit(&self) -> u64 {
        let whole = |f: ResultFrom| matches!(f, ResultFrom::Status | ResultFrom::Resource);
        match &self.result {
            Some(r) if whole(r.from) || r.formats.values().any(|f| whole(f.from)) => {
                self.max_response_bytes.max(r.largest())
            }
            _ => self.max_response_bytes,
        }
    }

    /// The most of a create answer that is read: the result's own limit too where an answer may be
    /// the result (`create.sync_codes`, or `create.sync_result` naming it inside the answer).
    pub fn create_read_limit(&self) -> u64 {
        match &self.result {
            Some(r) if !self.create.sync_codes.is_empty() || self.create.sync_result.is_some() => {
                self.max_response_bytes.max(r.largest())
            }
            _ => self.max_response_bytes,
        }
    }

    /// The longest one call may take: connect plus request timeout.
    pub fn call_budget(&self) -> Duration {
        self.connect_timeout + self.request_timeout
    }

    pub fn idempotency(&self) -> IdempotencyMode {
        match self.create.token {
            TokenPlacement::Header(_) => IdempotencyMode::Header,
            TokenPlacement::BodyField(_) => IdempotencyMode::BodyField,
            TokenPlacement::None => IdempotencyMode::None,
            TokenPlacement::Natural => IdempotencyMode::Natural,
        }
    }

    /// Load and validate one contract file. `JOBTRAIL_PROVIDER_<NAME>_BASE_URL` overrides `base_url`
    /// (name upper-cased, `-` as `_`), so one contract serves every environment.
    pub fn load(path: &Path) -> Result<Self, ContractError> {
        let file = path.display().to_string();
        let text = read_text_file(path, CONFIG_FILE_MOST).map_err(|e| ContractError::Io {
            file: file.clone(),
            message: e.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Parse and validate contract text; `path` names it in errors and anchors relative files.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ContractError> {
        let file = path.display().to_string();
        let parse_err = |e: toml::de::Error| ContractError::Parse {
            file: file.clone(),
            message: e.to_string(),
        };
        let table: toml::Table = toml::from_str(text).map_err(parse_err)?;
        // Without a profile, parse the text itself: its errors point at lines and columns.
        let raw: Raw = if table.contains_key("protocol") || table.contains_key("unset") {
            effective(table, &file)?.try_into().map_err(parse_err)?
        } else {
            toml::from_str(text).map_err(parse_err)?
        };
        Validator {
            file: &file,
            dir: path.parent().unwrap_or(Path::new(".")),
        }
        .contract(raw, path)
    }
}

/// The built-in protocol profiles: contract text a contract naming one (`protocol = "…"`) starts
/// from. See docs/provider-contracts.md.
pub const PROFILES: &[(&str, &str)] = &[
    (
        "google-aip-151",
        include_str!("profiles/google-aip-151.toml"),
    ),
    ("azure-lro", include_str!("profiles/azure-lro.toml")),
    (
        "azure-resource",
        include_str!("profiles/azure-resource.toml"),
    ),
    (
        "azure-location",
        include_str!("profiles/azure-location.toml"),
    ),
    ("ogc-processes", include_str!("profiles/ogc-processes.toml")),
];

/// A contract's effective text: its profile's keys with the contract's own over them (tables merge
/// key by key; a value or array of the contract replaces the profile's).
pub fn effective(mut contract: toml::Table, file: &str) -> Result<toml::Table, ContractError> {
    let unset = match contract.remove("unset") {
        None => Vec::new(),
        Some(toml::Value::Array(keys)) => keys,
        Some(_) => {
            return Err(ContractError::Invalid {
                file: file.to_owned(),
                key: "unset".into(),
                expected: "a list of the profile's keys, like [\"status.error\"]".into(),
            });
        }
    };
    let Some(name) = contract.get("protocol") else {
        if unset.is_empty() {
            return Ok(contract);
        }
        return Err(ContractError::Invalid {
            file: file.to_owned(),
            key: "unset".into(),
            expected: "a protocol beside it (unset drops keys a profile sets)".into(),
        });
    };
    let names: Vec<&str> = PROFILES.iter().map(|(n, _)| *n).collect();
    let wrong = || ContractError::Invalid {
        file: file.to_owned(),
        key: "protocol".into(),
        expected: format!("one of {}, got {name}", names.join(", ")),
    };
    let text = name
        .as_str()
        .and_then(|n| PROFILES.iter().find(|(p, _)| *p == n))
        .map(|(_, t)| *t)
        .ok_or_else(wrong)?;
    let mut base: toml::Table = toml::from_str(text).expect("a built-in profile parses");
    // An operation without a result takes none of the profile's result keys.
    let no_result = contract
        .get("result")
        .and_then(|r| r.get("format"))
        .and_then(|f| f.as_str())
        == Some("none");
    if no_result {
        base.remove("result");
    }
    // Keys of the profile this contract does without (a default cannot be unset by overriding it).
    for (i, key) in unset.iter().enumerate() {
        let removed = key.as_str().is_some_and(|k| remove_key(&mut base, k));
        if !removed {
            return Err(ContractError::Invalid {
                file: file.to_owned(),
                key: format!("unset[{i}]"),
                expected: format!("a key the profile {name} sets, got {key}"),
            });
        }
    }
    merge(&mut base, contract);
    Ok(base)
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Every problem a contract has, not only the first (an empty list: it loads). Each problem's key
/// is set aside and the rest checked again, until the contract loads, or a problem cannot be set
/// aside (text that is not TOML, a key the contract needs), or what is left only follows from a key
/// already set aside (not reported: it would be an echo of the first).
pub fn problems(text: &str, path: &Path) -> Vec<ContractError> {
    let mut found: Vec<ContractError> = Vec::new();
    let first = match Contract::parse(text, path) {
        Ok(_) => return found,
        Err(e) => e,
    };
    let Ok(mut table) = toml::from_str::<toml::Table>(text) else {
        return vec![first];
    };
    let mut removed: Vec<String> = Vec::new();
    let mut next = Some(first);
    // Bounded: a contract has far fewer keys than this.
    for _ in 0..64 {
        let Some(e) = next.take() else { break };
        let (key, expected) = match &e {
            // A list is set aside whole: taking one element out would renumber the others.
            ContractError::Invalid { key, expected, .. } => (
                key_path(key)
                    .split('[')
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
                expected.clone(),
            ),
            // Not a key we can set aside; a parse error after one was set aside is its echo.
            _ => {
                if removed.is_empty() {
                    found.push(e);
                }
                break;
            }
        };
        // An echo: about a key already set aside, or naming one (as a whole key) in what it
        // expects. Not reported; its own key is set aside in turn and the search goes on.
        let echo = removed.iter().any(|r| {
            key == *r
                || key.starts_with(&format!("{r}."))
                || key.starts_with(&format!("{r}["))
                || names_key(&expected, r)
        });
        if found.contains(&e) {
            break;
        }
        if !echo {
            found.push(e);
        }
        if !remove_key(&mut table, &key) {
            break;
        }
        removed.push(key);
        let Ok(rest) = toml::to_string(&table) else {
            break;
        };
        next = Contract::parse(&rest, path).err();
    }
    found
}

/// Whether `text` names `key` as a whole key (not a part of a longer one).
fn names_key(text: &str, key: &str) -> bool {
    text.match_indices(key).any(|(i, _)| {
        let after = text[i + key.len()..].chars().next();
        let before = text[..i].chars().next_back();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '['))
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
    })
}

/// A problem's key as a path into the contract's table (`result.formats.csv: result.items` is
/// `result.formats.csv.items`).
fn key_path(key: &str) -> String {
    match key.split_once(": ") {
        Some((outer, inner)) => {
            let inner = inner.split_once('.').map_or(inner, |(_, rest)| rest);
            format!("{outer}.{inner}")
        }
        None => key.to_owned(),
    }
}

/// Remove `a.b[2].c` from a TOML table; `false` when it is not there.
fn remove_key(table: &mut toml::Table, key: &str) -> bool {
    let segs: Vec<(&str, Vec<usize>)> = key
        .split('.')
        .map(|seg| {
            let mut parts = seg.split('[');
            let name = parts.next().unwrap_or_default();
            let idx = parts
                .filter_map(|p| p.strip_suffix(']').and_then(|n| n.parse().ok()))
                .collect();
            (name, idx)
        })
        .collect();
    remove_in(table, &segs)
}

fn remove_in(table: &mut toml::Table, segs: &[(&str, Vec<usize>)]) -> bool {
    let Some(((name, idx), rest)) = segs.split_first() else {
        return false;
    };
    if !rest.is_empty() {
        return match table
            .get_mut(*name)
            .and_then(|v| index(v, idx))
            .and_then(|v| v.as_table_mut())
        {
            Some(t) => remove_in(t, rest),
            None => false,
        };
    }
    match idx.split_last() {
        None => table.remove(*name).is_some(),
        Some((i, outer)) => match table
            .get_mut(*name)
            .and_then(|v| index(v, outer))
            .and_then(|v| v.as_array_mut())
        {
            Some(a) if *i < a.len() => {
                a.remove(*i);
                true
            }
            _ => false,
        },
    }
}

fn index<'a>(mut v: &'a mut toml::Value, idx: &[usize]) -> Option<&'a mut toml::Value> {
    for i in idx {
        v = v.as_array_mut()?.get_mut(*i)?;
    }
    Some(v)
}

/// Load every `*.toml` contract in a directory. Names must be unique.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Contract>, ContractError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ContractError::Io {
        file: dir.display().to_string(),
        message: format!(
            "cannot read the providers directory: {e} (name the directory of contracts with --providers or JOBTRAIL_PROVIDERS)"
        ),
    })?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        if p.extension().is_some_and(|x| x == "toml") {
            paths.push(p);
        } else if p.is_file()
            && !p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            // A contract saved as acme.tml, or a Helm key whose dot became nesting, would
            // otherwise be missing without a word.
            tracing::warn!(
                "{}: not loaded as a contract (contracts are *.toml files)",
                p.display()
            );
        }
    }
    paths.sort();
    let mut out: BTreeMap<String, Contract> = BTreeMap::new();
    for p in paths {
        let c = Contract::load(&p)?;
        // Two names that differ only in case or in '-' against '_' would share one base URL
        // override: setting it for one would move the other's calls, credentials and all.
        let key = base_url_env_key(&c.name);
        if let Some(prev) = out
            .values()
            .find(|prev| base_url_env_key(&prev.name) == key)
        {
            return Err(ContractError::Invalid {
                file: p.display().to_string(),
                key: "name".into(),
                expected: if prev.name == c.name {
                    format!("a name not already used by {}", prev.file.display())
                } else {
                    format!(
                        "a name that is not {:?} of {} but for case or '-' and '_' (both would read {key})",
                        prev.name,
                        prev.file.display()
                    )
                },
            });
        }
        out.insert(c.name.clone(), c);
    }
    Ok(out)
}

/// The environment variable that overrides a contract's `base_url`: its name in capitals, '-' as
/// '_'.
pub fn base_url_env_key(name: &str) -> String {
    format!(
        "JOBTRAIL_PROVIDER_{}_BASE_URL",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;
/// The shortest wait between calls a contract may set (backoff, `Retry-After`'s floor, reconcile).
const MIN_WAIT_MS: u64 = 10;
/// The largest status, create or cancel answer a contract may allow: each is read whole into a
/// worker's memory, once per call in flight (a typo of a few zeros must not allow gigabytes).
const MAX_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;
/// The largest result a contract may allow: read whole before it is checked, and PostgreSQL keeps
/// at most 1 GB in one value (results in the database are held to less when a worker starts).
const MAX_RESULT_BYTES: u64 = 1024 * 1024 * 1024;

/// The first parameter named as a credential whose value the contract writes out in the query of a
/// URL (or URL template), without its value. One filled from a placeholder is not written there.
pub fn credential_in_query(url: &str) -> Option<String> {
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .filter(|pair| !pair.contains('{'))
        .map(|pair| pair.split('=').next().unwrap_or_default())
        .find(|name| crate::wire::credential_query_name(name))
        .map(|name| crate::text::truncate(name.to_owned(), 64))
}

/// Why a URL the contract writes may not carry `name`.
fn credential_in_url(name: &str) -> String {
    format!(
        "no credential in a URL the contract writes ({name:?} in its query; the contract file is kept in clear text, in a ConfigMap, and printed by `contract check`): send it as a header through [auth] with secret = \"env:…\" or \"file:…\" (Azure Functions: header = \"x-functions-key\"; Google APIs: header = \"x-goog-api-key\")"
    )
}
/// The most failed calls a contract may tolerate (a count the database keeps as an integer).
const MAX_FAILURES: u32 = 1_000_000;

/// A character of an HTTP token (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Validator<'a> {
    file: &'a str,
    dir: &'a Path,
}

impl Validator<'_> {
    /// Refused when a value is in both of a result's lists (failed and succeeded): it cannot mean
    /// both.
    fn apart(
        &self,
        (failed, failed_values): (&str, &[String]),
        (succeeded, succeeded_values): (&str, &[String]),
    ) -> Result<(), ContractError> {
        match failed_values.iter().find(|v| succeeded_values.contains(v)) {
            Some(v) => Err(self.err(
                &format!("result.{failed}"),
                format!("values not also in {succeeded}, got {v:?} in both"),
            )),
            None => Ok(()),
        }
    }

    fn err(&self, key: &str, expected: impl Into<String>) -> ContractError {
        ContractError::Invalid {
            file: self.file.to_owned(),
            key: key.to_owned(),
            expected: expected.into(),
        }
    }

    fn pointer(&self, key: &str, p: &Option<String>) -> Result<Option<String>, ContractError> {
        match p {
            Some(p) if !(p.is_empty() || p.starts_with('/')) => {
                Err(self.err(key, format!("a JSON pointer starting with '/', got {p:?}")))
            }
            other => Ok(other.clone()),
        }
    }

    /// A JSON Schema given inline or as a file next to the contract (not both).
    fn schema(
        &self,
        (inline_key, inline): (&str, &Option<String>),
        (file_key, file): (&str, &Option<String>),
    ) -> Result<Option<(serde_json::Value, std::sync::Arc<jsonschema::Validator>)>, ContractError>
    {
        let (key, text) = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    inline_key,
                    format!("either {inline_key} or {file_key}, not both"),
                ));
            }
            (Some(s), None) => (inline_key, s.clone()),
            (None, Some(f)) => {
                let p = self.dir.join(f);
                let text = read_text_file(&p, CONFIG_FILE_MOST).map_err(|e| {
                    self.err(file_key, format!("a readable file ({}: {e})", p.display()))
                })?;
                (file_key, text)
            }
            (None, None) => return Ok(None),
        };
        // A key written twice is refused, as in every document a provider writes: kept silently,
        // the last `required` or `type` would win and the schema check less than it says.
        let v = jobtrail_core::json::parse_unique_keys(text.as_bytes())
            .map_err(|e| self.err(key, format!("a JSON Schema document ({e})")))?;
        let validator = jsonschema::validator_for(&v)
            .map_err(|e| self.err(key, format!("a valid JSON Schema ({e})")))?;
        Ok(Some((v, std::sync::Arc::new(validator))))
    }

    fn locator(&self, key: &str, s: &str) -> Result<Locator, ContractError> {
        Locator::parse(s).map_err(|e| self.err(key, e))
    }

    fn method(&self, key: &str, m: &str) -> Result<http::Method, ContractError> {
        match m.to_ascii_uppercase().as_str() {
            "GET" | "POST" | "PUT" | "PATCH" | "DELETE" => {
                Ok(http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).expect("valid"))
            }
            _ => Err(self.err(
                key,
                format!("one of GET, POST, PUT, PATCH, DELETE, got {m:?}"),
            )),
        }
    }

    /// A read call's method: GET (the default) or POST, which alone carries a body.
    fn read_method(
        &self,
        key: &str,
        m: Option<&str>,
        body: &Option<toml::Value>,
    ) -> Result<http::Method, ContractError> {
        let method = match m {
            None if body.is_some() => http::Method::POST,
            None => http::Method::GET,
            Some(m) => match self.method(key, m)? {
                x @ (http::Method::GET | http::Method::POST) => x,
                _ => return Err(self.err(key, format!("GET or POST, got {m:?}"))),
            },
        };
        if method == http::Method::GET && body.is_some() {
            return Err(self.err(key, "POST when a body is given (a GET carries none)"));
        }
        Ok(method)
    }

    /// Fixed headers from the contract: valid names and values, none of those jobtrail sets itself.
    fn fixed_headers(
        &self,
        key: &str,
        raw: &BTreeMap<String, String>,
        reserved: &[String],
    ) -> Result<http::HeaderMap, ContractError> {
        let mut out = http::HeaderMap::new();
        for (name, value) in raw {
            let k = format!("{key}.{name}");
            let h = self.header(&k, name)?;
            if reserved.iter().any(|r| r.eq_ignore_ascii_case(h.as_str())) {
                return Err(self.err(
                    &k,
                    "a header jobtrail does not set itself (credentials go in [auth], the idempotency token in create.idempotency_header, the trace in traceparent)",
                ));
            }
            let v = http::HeaderValue::from_str(value)
                .map_err(|_| self.err(&k, "a header value of visible ASCII"))?;
            out.insert(h, v);
        }
        Ok(out)
    }

    fn header(&self, key: &str, h: &str) -> Result<http::HeaderName, ContractError> {
        http::HeaderName::from_bytes(h.as_bytes())
            .map_err(|_| self.err(key, format!("a valid HTTP header name, got {h:?}")))
    }

    /// Every placeholder in `t` is one jobtrail fills (`{status_url}` only opening a URL
    /// template, never in a body).
    fn placeholders(&self, key: &str, t: &str, in_body: bool) -> Result<(), ContractError> {
        let known = [
            "{job_id}",
            "{job_id_path}",
            "{operation_id}",
            "{target}",
            "{target_path}",
            "{client_reference}",
            "{idempotency_key}",
            "{request:/pointer}",
            "{status_url}",
        ];
        let mut rest = t;
        while let Some(i) = rest.find('{') {
            let end = rest[i..].find('}').ok_or_else(|| {
                self.err(key, format!("a template with closed braces, got {t:?}"))
            })?;
            let ph = &rest[i..i + end + 1];
            if ph == "{status_url}" && (in_body || !t.starts_with(ph)) {
                return Err(self.err(key, "{status_url} only at the start of a URL template"));
            }
            let request = ph
                .strip_prefix("{request:")
                .is_some_and(|p| p.starts_with('/') && p.len() > 2);
            if !request && (!known.contains(&ph) || ph == "{request:/pointer}") {
                return Err(self.err(
                    key,
                    format!("placeholders among {}, got {ph}", known.join(", ")),
                ));
            }
            rest = &rest[i + end + 1..];
        }
        Ok(())
    }

    /// A JSON body template: the TOML value as JSON, every string's placeholders checked.
    fn body_template(
        &self,
        key: &str,
        v: &Option<toml::Value>,
    ) -> Result<Option<serde_json::Value>, ContractError> {
        let Some(v) = v else { return Ok(None) };
        let json = serde_json::to_value(v)
            .map_err(|e| self.err(key, format!("a value JSON can carry ({e})")))?;
        fn strings<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::String(s) => out.push(s),
                serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
                serde_json::Value::Object(m) => m.values().for_each(|x| strings(x, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        strings(&json, &mut all);
        for t in all {
            self.placeholders(key, t, true)?;
        }
        Ok(Some(json))
    }

    fn template(&self, key: &str, t: &str) -> Result<String, ContractError> {
        self.placeholders(key, t, false)?;
        if !(t.starts_with('/')
            || t.starts_with("http://")
            || t.starts_with("https://")
            || t.starts_with("{status_url}"))
        {
            return Err(self.err(
                key,
                format!("a path starting with '/' or an absolute http(s) URL, got {t:?}"),
            ));
        }
        Ok(t.to_owned())
    }

    fn secret(&self, key: &str, s: &str) -> Result<SecretRef, ContractError> {
        let r = SecretRef::parse(s).map_err(|e| self.err(key, e))?;
        if let Some(why) = own_credential(&r) {
            return Err(self.err(key, why));
        }
        Ok(r)
    }

    /// A duration in milliseconds within `[min, max]`: a typo of extra zeros is an error at load,
    /// not a lease or deadline years away.
    fn ms_within(&self, key: &str, v: u64, min: u64, max: u64) -> Result<Duration, ContractError> {
        if v < min || v > max {
            return Err(self.err(key, format!("{min} to {max} ms, got {v}")));
        }
        Ok(Duration::from_millis(v))
    }
    fn ms(&self, key: &str, v: u64, min: u64) -> Result<Duration, ContractError> {
        self.ms_within(key, v, min, DAY_MS)
    }
    fn bytes_within(&self, key: &str, v: u64, max: u64) -> Result<(), ContractError> {
        if v == 0 || v > max {
            return Err(self.err(key, format!("1 to {max} bytes, got {v}")));
        }
        Ok(())
    }

    /// The create writes our operation id (`client_reference_field`) and the token
    /// (`idempotency_field`) into the body, one after the other, after the caller's secrets are
    /// put in: one place under (or at) another would overwrite the token, or fail every create
    /// ("not an object on the way"), and the empty pointer would replace the whole request.
    fn written_fields_apart(
        &self,
        create: &CreateSpec,
        redact: &[String],
    ) -> Result<(), ContractError> {
        let under =
            |a: &str, b: &str| a == b || a.strip_prefix(b).is_some_and(|x| x.starts_with('/'));
        let token = match &create.token {
            TokenPlacement::BodyField(t) => Some(("create.idempotency_field", t.as_str())),
            _ => None,
        };
        let reference = create
            .client_reference_field
            .as_deref()
            .map(|r| ("create.client_reference_field", r));
        if let Some((key, _)) = reference.filter(|(_, r)| r.is_empty()) {
            return Err(self.err(
                key,
                "a JSON pointer to a field of the body (\"\" is the whole request)",
            ));
        }
        if let (Some((_, t)), Some((key, r))) = (token, reference)
            && (under(t, r) || under(r, t))
        {
            return Err(self.err(
                key,
                format!("a field apart from create.idempotency_field ({t}), got {r}: both are written into the body, and one would overwrite the other"),
            ));
        }
        for (key, field) in token.into_iter().chain(reference) {
            if let Some(s) = redact.iter().find(|s| under(field, s) || under(s, field)) {
                return Err(self.err(
                    key,
                    format!("a field apart from the sensitive field {s} (redact), got {field}: a secret named there is put in first, and the create's own value would replace it or could not be written under it"),
                ));
            }
        }
        Ok(())
    }

    fn contract(&self, r: Raw, path: &Path) -> Result<Contract, ContractError> {
        if r.name.is_empty()
            || !r
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(self.err(
                "name",
                format!("letters, digits, '-' and '_', got {:?}", r.name),
            ));
        }
        let env_key = base_url_env_key(&r.name);
        let base = std::env::var(&env_key)
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or(r.base_url);
        let base_url = url::Url::parse(&base)
            .ok()
            .filter(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.username().is_empty()
                    && u.password().is_none()
            })
            .ok_or_else(|| {
                // Never echo a credential someone put into the URL.
                let shown = url::Url::parse(&base)
                    .map(|u| {
                        let had = !u.username().is_empty() || u.password().is_some();
                        format!(
                            "{:?}{}",
                            crate::wire::sanitize_url(&u),
                            if had {
                                " (with credentials, not shown)"
                            } else {
                                ""
                            }
                        )
                    })
                    .unwrap_or_else(|_| "a value that is not a URL".into());
                self.err(
                    "base_url",
                    format!("an absolute http(s) URL without credentials, got {shown}"),
                )
            })?;

        if let Some(name) = credential_in_query(base_url.as_str()) {
            return Err(self.err("base_url", credential_in_url(&name)));
        }
        // Paths are appended to the base URL as text: behind a query or a fragment every one
        // would land inside it (`?api-version=1/jobs`), each call sent to the base path.
        if base_url.query().is_some() || base_url.fragment().is_some() {
            return Err(self.err(
                "base_url",
                format!(
                    "a URL without a query or fragment (paths are appended to it; parameters every call sends go in `query`), got {:?}{}",
                    crate::wire::sanitize_url(&base_url),
                    if std::env::var(&env_key).is_ok_and(|v| !v.is_empty()) {
                        format!(" from {env_key}")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        let origin_of = |key: &str, text: &str| -> Result<url::Origin, ContractError> {
            url::Url::parse(text)
                .ok()
                .filter(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.username().is_empty()
                        && u.password().is_none()
                        && u.path() == "/"
                        && u.query().is_none()
                        && u.fragment().is_none()
                })
                .map(|u| u.origin())
                .ok_or_else(|| {
                    self.err(
                        key,
                        format!("an origin: http(s)://host[:port] with no path, query or credentials, got {text:?}"),
                    )
                })
        };
        let origins = match &r.origins {
            Some(list) => {
                let list = list
                    .iter()
                    .enumerate()
                    .map(|(i, o)| origin_of(&format!("origins[{i}]"), o))
                    .collect::<Result<Vec<_>, _>>()?;
                if !list.contains(&base_url.origin()) {
                    return Err(self.err(
                        "origins",
                        format!(
                            "a list that includes base_url's origin {}",
                            base_url.origin().ascii_serialization()
                        ),
                    ));
                }
                Some(list)
            }
            None => None,
        };
        let unauthenticated_origins = r
            .unauthenticated_origins
            .iter()
            .enumerate()
            .map(|(i, o)| origin_of(&format!("unauthenticated_origins[{i}]"), o))
            .collect::<Result<Vec<_>, _>>()?;
        let t = &r.timeouts;
        // Floors against a unit slip (`request_ms = 10` meant as seconds): every call would time out
        // after it was sent, and every create be ambiguous, one paid job each for a person.
        let connect_timeout = self.ms_within("timeouts.connect_ms", t.connect_ms, 50, HOUR_MS)?;
        let request_timeout = self.ms_within("timeouts.request_ms", t.request_ms, 250, HOUR_MS)?;
        self.bytes_within(
            "timeouts.max_response_bytes",
            t.max_response_bytes,
            MAX_RESPONSE_BYTES,
        )?;

        let auth = match &r.auth {
            Some(a) => Some(Auth {
                header: self.header("auth.header", &a.header)?,
                scheme: match &a.scheme {
                    // RFC 9110's auth-scheme is a token: anything else (a space, CR/LF) would make
                    // every call unsendable, found only when the first one is tried.
                    Some(s) if s.is_empty() || !s.bytes().all(is_tchar) => {
                        return Err(self.err(
                            "auth.scheme",
                            format!("an authentication scheme such as \"Bearer\", got {s:?}"),
                        ));
                    }
                    s => s.clone(),
                },
                secret: self.secret("auth.secret", &a.secret)?,
            }),
            None => None,
        };
        let client_request_id_header = r
            .client_request_id_header
            .as_deref()
            .map(|h| self.header("client_request_id_header", h))
            .transpose()?;
        let trace_header = match &r.trace_header {
            Some(h) => Some(self.header("trace_header", h)?),
            None => None,
        };

        let c = &r.create;
        let token = match c.idempotency.as_str() {
            "header" => TokenPlacement::Header(self.header(
                "create.idempotency_header",
                c.idempotency_header.as_deref().ok_or_else(|| {
                    self.err(
                        "create.idempotency_header",
                        "a header name when create.idempotency = \"header\"",
                    )
                })?,
            )?),
            "body_field" => TokenPlacement::BodyField(
                self.pointer("create.idempotency_field", &c.idempotency_field)?
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        self.err(
                            "create.idempotency_field",
                            "a JSON pointer when create.idempotency = \"body_field\"",
                        )
                    })?,
            ),
            "none" => TokenPlacement::None,
            "natural" => {
                // Only a PUT to a URL this operation names is idempotent by itself: the same
                // request again names the same resource.
                if !c.method.eq_ignore_ascii_case("PUT") {
                    return Err(self.err(
                        "create.method",
                        format!(
                            "PUT when create.idempotency = \"natural\", got {:?}",
                            c.method
                        ),
                    ));
                }
                // The operation's own id in the path (not the query): two operations never
                // name one resource, and a caller cannot name another's.
                let path_part = c.path.split('?').next().unwrap_or_default();
                if !["{operation_id}", "{client_reference}"]
                    .iter()
                    .any(|n| path_part.contains(n))
                {
                    return Err(self.err(
                        "create.path",
                        "a URL the operation itself names when create.idempotency = \"natural\" ({operation_id} or {client_reference} in its path: a target or a request value may be shared by two operations)",
                    ));
                }
                TokenPlacement::Natural
            }
            other => {
                return Err(self.err(
                    "create.idempotency",
                    format!(
                        "one of \"header\", \"body_field\", \"natural\", \"none\", got {other:?}"
                    ),
                ));
            }
        };
        if (c.idempotency_header.is_some() && !matches!(token, TokenPlacement::Header(_)))
            || (c.idempotency_field.is_some() && !matches!(token, TokenPlacement::BodyField(_)))
        {
            return Err(self.err(
                "create.idempotency",
                "\"header\" beside idempotency_header, \"body_field\" beside idempotency_field",
            ));
        }
        let create = CreateSpec {
            method: self.method("create.method", &c.method)?,
            path: self.template("create.path", &c.path)?,
            token,
            client_reference_field: self
                .pointer("create.client_reference_field", &c.client_reference_field)?,
            job_id: c
                .job_id
                .as_deref()
                .map(|s| self.locator("create.job_id", s))
                .transpose()?,
            initial_state: c
                .initial_state
                .as_deref()
                .map(|s| self.locator("create.initial_state", s))
                .transpose()?,
            status_url: c
                .status_url
                .as_deref()
                .map(|s| self.locator("create.status_url", s))
                .transpose()?,
            sync_result: c
                .sync_result
                .as_deref()
                .map(|s| self.locator("create.sync_result", s))
                .transpose()?,
            result_url: c
                .result_url
                .as_deref()
                .map(|s| self.locator("create.result_url", s))
                .transpose()?,
            sync_codes: match c.sync_codes.iter().find(|c| !(200..=299).contains(*c)) {
                Some(bad) => {
                    return Err(
                        self.err("create.sync_codes", format!("2xx status codes, got {bad}"))
                    );
                }
                None => c.sync_codes.clone(),
            },
            max_body_bytes: match c.max_body_bytes {
                None => jobtrail_core::operation::DEFAULT_BODY_BYTES,
                Some(n) if n >= 1 && n <= jobtrail_core::operation::MAX_BODY_BYTES as u64 => {
                    n as usize
                }
                Some(n) => {
                    return Err(self.err(
                        "create.max_body_bytes",
                        format!(
                            "1 to {} bytes, got {n}",
                            jobtrail_core::operation::MAX_BODY_BYTES
                        ),
                    ));
                }
            },
            body: match c.body.as_deref() {
                None | Some("object") => BodyShape::Object,
                Some("any") => BodyShape::Any,
                Some(other) => {
                    return Err(self.err(
                        "create.body",
                        format!("\"object\" or \"any\", got {other:?}"),
                    ));
                }
            },
            request_schema: self
                .schema(
                    ("create.request_schema", &c.request_schema),
                    ("create.request_schema_file", &c.request_schema_file),
                )?
                .map(|(document, validator)| Schema {
                    document,
                    validator,
                }),
            headers: http::HeaderMap::new(),
        };
        self.written_fields_apart(&create, &r.redact)?;

        let s = &r.status;
        let mut states = BTreeMap::new();
        for (phase, names, key) in s.states.by_phase("status.states") {
            for n in names {
                if n.is_empty() {
                    return Err(self.err(&key, "non-empty state names"));
                }
                let n = if s.ignore_case {
                    n.to_lowercase()
                } else {
                    n.clone()
                };
                if let Some(prev) = states.insert(n.clone(), phase) {
                    return Err(self.err(
                        &key,
                        format!("each state name in one phase only; {n:?} is also {prev:?}"),
                    ));
                }
            }
        }
        let mut codes = BTreeMap::new();
        for (phase, list, key) in s.codes.by_phase("status.codes") {
            for c in list {
                // Codes that say "not now", "look elsewhere" or "something broke" are never a
                // job's state: rules and Retry-After handle them.
                if !(200..=499).contains(c)
                    || (300..=399).contains(c)
                    || [408, 425, 429].contains(c)
                {
                    return Err(self.err(
                        &key,
                        format!("a 2xx or 4xx status code other than 408, 425 and 429, got {c}"),
                    ));
                }
                if let Some(prev) = codes.insert(*c, phase) {
                    return Err(self.err(
                        &key,
                        format!("each status code in one phase only; {c} is also {prev:?}"),
                    ));
                }
            }
        }
        let says = |p: Phase| states.values().any(|x| *x == p) || codes.values().any(|x| *x == p);
        if !says(Phase::Succeeded) || !says(Phase::Failed) {
            return Err(self.err(
                "status.states",
                "at least one succeeded and one failed state name (or status.codes)",
            ));
        }
        let state: Vec<String> = match &s.state {
            None => Vec::new(),
            Some(OneOrMany::One(p)) => vec![p.clone()],
            Some(OneOrMany::Many(ps)) => ps.clone(),
        };
        for p in &state {
            if self.pointer("status.state", &Some(p.clone()))?.is_none() {
                return Err(self.err("status.state", "a JSON pointer"));
            }
        }
        if state.is_empty() && (codes.is_empty() || !states.is_empty()) {
            return Err(self.err(
                "status.state",
                "a JSON pointer (or a list of them) to the provider's state; only status.codes alone can do without",
            ));
        }
        if s.state_absent.is_some() && state.is_empty() {
            return Err(self.err("status.state_absent", "status.state beside it"));
        }
        // A document that states nothing (a provider's error envelope, `{}`, an answer cut short)
        // must never end the job: succeeded would fetch and keep a result nobody confirmed,
        // failed or cancelled would give up on paid work (or confirm a cancel) on no word at all.
        if let Some(absent) = &s.state_absent {
            let key = if s.ignore_case {
                absent.to_lowercase()
            } else {
                absent.clone()
            };
            if let Some(phase) = states.get(&key)
                && !matches!(phase, Phase::Queued | Phase::Running)
            {
                return Err(self.err(
                    "status.state_absent",
                    format!(
                        "a state the job is still in (queued or running): {absent:?} is {phase:?}, and a document that states nothing must not end the job"
                    ),
                ));
            }
        }
        let done = self.pointer("status.done", &s.done)?;
        // While the flag is not true a document states nothing, and a status read that states
        // nothing is a failed read: with no state for "not done", every read of a running job
        // would fail until the job was held for a person.
        if done.is_some() && s.state_absent.is_none() {
            return Err(self.err(
                "status.state_absent",
                "a state beside status.done, for documents whose flag is not yet true (Google's profile: \"false\")",
            ));
        }
        let follow = match &s.follow {
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, l)| self.locator(&format!("status.follow[{i}]"), l))
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let mut v = vec![
                    Locator::Header("Azure-AsyncOperation".into()),
                    Locator::Header("Operation-Location".into()),
                ];
                if let Some(Locator::Body(p)) = &create.status_url {
                    v.push(Locator::Body(p.clone()));
                }
                v
            }
        };
        let status = StatusSpec {
            url: self.template("status.url", &s.url)?,
            follow,
            state,
            state_absent: s.state_absent.clone(),
            done,
            ignore_case: s.ignore_case,
            codes,
            updated_at: self.pointer("status.updated_at", &s.updated_at)?,
            progress: self.pointer("status.progress", &s.progress)?,
            result_url: self.pointer("status.result_url", &s.result_url)?,
            expected_count: self.pointer("status.expected_count", &s.expected_count)?,
            checksum: self.pointer("status.checksum", &s.checksum)?,
            error: self.pointer("status.error", &s.error)?,
            final_get: s.final_get,
            states,
        };

        let mut rules = Vec::new();
        for (i, rr) in r.rules.iter().enumerate() {
            if rr.status.is_empty() && rr.body_contains.is_none() {
                return Err(self.err(
                    &format!("rules[{i}]"),
                    "a `status` list or `body_contains` (or both)",
                ));
            }
            if let Some(bad) = rr.status.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(self.err(
                    &format!("rules[{i}].status"),
                    format!("HTTP status codes 100-599, got {bad}"),
                ));
            }
            if rr.means == Meaning::AlreadyExists
                && !(rr.calls.is_empty() || rr.calls == [CallName::Create])
            {
                return Err(self.err(
                    &format!("rules[{i}].means"),
                    "already_exists only for calls = [\"create\"]",
                ));
            }
            rules.push(Rule {
                calls: rr.calls.clone(),
                status: rr.status.clone(),
                body_contains: rr.body_contains.clone(),
                means: rr.means,
            });
        }

        let p = &r.polling;
        if !(p.factor >= 1.0 && p.factor <= 10.0) {
            return Err(self.err(
                "polling.factor",
                format!("a number from 1 to 10, got {}", p.factor),
            ));
        }
        if !(0.0..=1.0).contains(&p.jitter) {
            return Err(self.err(
                "polling.jitter",
                format!("a fraction from 0 to 1, got {}", p.jitter),
            ));
        }
        let initial = self.ms("polling.initial_ms", p.initial_ms, MIN_WAIT_MS)?;
        let cap = self.ms("polling.cap_ms", p.cap_ms, MIN_WAIT_MS)?;
        if cap < initial {
            return Err(self.err("polling.cap_ms", "at least polling.initial_ms"));
        }
        // A provider's `Retry-After: 0` (or one in the past) waits at least this long: never a
        // loop of reads as fast as the worker can send them.
        let ra_min = self.ms(
            "polling.retry_after_min_ms",
            p.retry_after_min_ms
                .unwrap_or_else(|| d_ra_min().min(p.retry_after_max_ms).max(MIN_WAIT_MS)),
            MIN_WAIT_MS,
        )?;
        if p.max_failures > MAX_FAILURES {
            return Err(self.err(
                "polling.max_failures",
                format!("at most {MAX_FAILURES}, got {}", p.max_failures),
            ));
        }
        let ra_max = self.ms("polling.retry_after_max_ms", p.retry_after_max_ms, 1)?;
        if ra_max < ra_min {
            return Err(self.err(
                "polling.retry_after_max_ms",
                "at least polling.retry_after_min_ms",
            ));
        }
        let polling = Polling {
            backoff: Backoff {
                initial,
                factor: p.factor,
                cap,
                jitter: p.jitter,
            },
            retry_after: RetryAfterBounds {
                min: ra_min,
                max: ra_max,
            },
            max_failures: p.max_failures,
        };

        let horizon = jobtrail_core::operation::MAX_HORIZON.as_millis() as u64;
        let create_window =
            self.ms_within("deadlines.create_ms", r.deadlines.create_ms, 1000, horizon)?;
        let result_window =
            self.ms_within("deadlines.result_ms", r.deadlines.result_ms, 1000, horizon)?;
        // A worker extends its lease to cover a call plus a margin before it sends; a create window
        // shorter than that ends before a worker that died mid-call can be taken over, and nobody
        // could reconcile in time.
        let one_call = connect_timeout + request_timeout + LEASE_MARGIN;
        if create_window < one_call {
            return Err(self.err(
                "deadlines.create_ms",
                format!(
                    "at least {} ms: one call (timeouts.connect_ms {} + timeouts.request_ms {}) plus the lease margin of {} ms, got {}",
                    one_call.as_millis(),
                    connect_timeout.as_millis(),
                    request_timeout.as_millis(),
                    LEASE_MARGIN.as_millis(),
                    create_window.as_millis()
                ),
            ));
        }

        let cancel = match &r.cancel {
            Some(c) => Some(CancelSpec {
                method: self.method("cancel.method", &c.method)?,
                path: self.template("cancel.path", &c.path)?,
                idempotent: c.idempotent,
                window: self.ms_within(
                    "cancel.window_ms",
                    c.window_ms,
                    1000,
                    jobtrail_core::operation::MAX_CANCEL_WINDOW.as_millis() as u64,
                )?,
                headers: http::HeaderMap::new(),
                body: self.body_template("cancel.body", &c.body)?,
            }),
            None => None,
        };
        if let Some(c) = &cancel
            && c.body.is_some()
            && matches!(c.method, http::Method::GET | http::Method::DELETE)
        {
            return Err(self.err(
                "cancel.body",
                format!("no body with {} (POST, PUT or PATCH carry one)", c.method),
            ));
        }

        if let Some(rr) = &r.result
            && create.result_url.is_some()
            && (rr.url.is_some() || rr.from != ResultFrom::Url || rr.format == ResultFormat::None)
        {
            return Err(self.err(
                "create.result_url",
                "nothing beside result.url, result.from = \"status\" or \"resource\", or format = \"none\" (one place says where the result is)",
            ));
        }
        let result = match r.result {
            Some(rr) => Some(self.results(
                rr,
                status.result_url.is_some() || create.result_url.is_some(),
            )?),
            None => None,
        };
        if result
            .as_ref()
            .is_some_and(|r| r.format == ResultFormat::None)
            && create.sync_result.is_some()
        {
            return Err(self.err(
                "create.sync_result",
                "no synchronous result when result.format = \"none\" (the job has no result)",
            ));
        }
        // A count the status gives is checked against a JSON result's items: a JSON result (or
        // a JSON format a request may choose) without an items pointer would fail every time.
        // (CSV counts its rows; bytes are checked for digest, size and type only.)
        if status.expected_count.is_some()
            && let Some(r) = &result
        {
            let counts = |f: &ResultSpec| f.format != ResultFormat::Json || f.items.is_some();
            let uncounted = std::iter::once(("[result]".to_owned(), r))
                .chain(
                    r.formats
                        .iter()
                        .map(|(n, f)| (format!("[result.formats.{n}]"), f)),
                )
                .find(|(_, f)| !counts(f));
            if let Some((which, _)) = uncounted {
                return Err(self.err(
                    "status.expected_count",
                    format!(
                        "nothing unless every JSON result names its items (result.items): {which} names none, so every result would fail"
                    ),
                ));
            }
        }

        let rc = &r.reconcile;
        let reconcile = ReconcileSpec {
            method: rc.method,
            lookup_url: rc
                .lookup_url
                .as_deref()
                .map(|u| self.template("reconcile.lookup_url", u))
                .transpose()?,
            lookup_method: self.read_method(
                "reconcile.lookup_method",
                rc.lookup_method.as_deref(),
                &rc.lookup_body,
            )?,
            lookup_body: self.body_template("reconcile.lookup_body", &rc.lookup_body)?,
            lookup_jobs: self.pointer("reconcile.lookup_jobs", &rc.lookup_jobs)?,
            lookup_job_id: self.pointer("reconcile.lookup_job_id", &rc.lookup_job_id)?,
            lookup_reference: self.pointer("reconcile.lookup_reference", &rc.lookup_reference)?,
            interval: self.ms("reconcile.interval_ms", rc.interval_ms, MIN_WAIT_MS)?,
        };
        if reconcile.method == ReconcileMethod::Lookup && reconcile.lookup_url.is_none() {
            return Err(self.err(
                "reconcile.lookup_url",
                "a URL template when reconcile.method = \"lookup\"",
            ));
        }
        if let Some(url) = &reconcile.lookup_url {
            // A lookup finds our job by what we sent: our reference, or the idempotency token.
            let lookup = format!(
                "{url} {}",
                reconcile
                    .lookup_body
                    .as_ref()
                    .map(|b| b.to_string())
                    .unwrap_or_default()
            );
            if lookup.contains("{client_reference}") && create.client_reference_field.is_none() {
                return Err(self.err(
                    "create.client_reference_field",
                    "a JSON pointer (where our reference goes) when the lookup names {client_reference}",
                ));
            }
            if !lookup.contains("{client_reference}") && !lookup.contains("{idempotency_key}") {
                return Err(self.err(
                    "reconcile.lookup_url",
                    "a lookup naming {client_reference} or {idempotency_key} (what we sent with the create), in its URL or lookup_body",
                ));
            }
            // A list is filtered by the provider; one that ignored the filter lists others' jobs,
            // and a job taken from it would be watched, collected and cancelled as ours.
            if reconcile.lookup_jobs.is_some() && reconcile.lookup_reference.is_none() {
                return Err(self.err(
                    "reconcile.lookup_reference",
                    "a JSON pointer (where each listed job repeats what we looked it up by) when the lookup answers a list (lookup_jobs)",
                ));
            }
        } else if rc.lookup_body.is_some() || rc.lookup_method.is_some() {
            return Err(self.err(
                "reconcile.lookup_url",
                "a URL template beside lookup_method and lookup_body",
            ));
        }
        if reconcile.method == ReconcileMethod::Resend && create.token == TokenPlacement::None {
            return Err(self.err("reconcile.method", "not \"resend\" when create.idempotency = \"none\": a resend without a token may create a second job"));
        }

        let webhook = match &r.webhook {
            Some(w) => {
                let scheme = match w.signature.as_str() {
                    "standard-webhooks" => {
                        if w.signature_header.is_some() || w.timestamp_header.is_some() {
                            return Err(self.err(
                                "webhook.signature_header",
                                "no header names with standard-webhooks (its headers are fixed)",
                            ));
                        }
                        WebhookScheme::StandardWebhooks
                    }
                    "hmac-sha256" => WebhookScheme::HmacSha256 {
                        signature_header: self.header(
                            "webhook.signature_header",
                            w.signature_header.as_deref().ok_or_else(|| {
                                self.err("webhook.signature_header", "a header name")
                            })?,
                        )?,
                        timestamp_header: w
                            .timestamp_header
                            .as_deref()
                            .map(|h| self.header("webhook.timestamp_header", h))
                            .transpose()?,
                    },
                    other => {
                        return Err(self.err(
                            "webhook.signature",
                            format!("\"standard-webhooks\" or \"hmac-sha256\", got {other:?}"),
                        ));
                    }
                };
                let event_id = self.pointer("webhook.event_id", &w.event_id)?;
                if matches!(scheme, WebhookScheme::HmacSha256 { .. }) && event_id.is_none() {
                    return Err(self.err(
                        "webhook.event_id",
                        "a JSON pointer to the event id (deliveries are deduplicated by it)",
                    ));
                }
                let tolerance = match (&scheme, w.tolerance_ms) {
                    (WebhookScheme::StandardWebhooks, Some(_)) => {
                        return Err(self.err(
                            "webhook.tolerance_ms",
                            "not set with standard-webhooks (five minutes, fixed)",
                        ));
                    }
                    (
                        WebhookScheme::HmacSha256 {
                            timestamp_header: None,
                            ..
                        },
                        Some(_),
                    ) => {
                        return Err(self.err(
                            "webhook.tolerance_ms",
                            "only with webhook.timestamp_header: without a signed timestamp there is nothing to hold to it (replays are then refused only by event id, for 24 hours)",
                        ));
                    }
                    (_, Some(ms)) => {
                        self.ms_within("webhook.tolerance_ms", ms, 1_000, 3_600_000)?
                    }
                    (_, None) => Duration::from_secs(300),
                };
                Some(WebhookSpec {
                    scheme,
                    secret: self.secret("webhook.secret", &w.secret)?,
                    event_id,
                    job_id: self
                        .pointer("webhook.job_id", &Some(w.job_id.clone()))?
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| {
                            self.err("webhook.job_id", "a JSON pointer to the job id")
                        })?,
                    tolerance,
                })
            }
            None => None,
        };
        for (i, p) in r.redact.iter().enumerate() {
            if !p.starts_with('/') {
                return Err(self.err(
                    &format!("redact[{i}]"),
                    format!("a JSON pointer starting with '/', got {p:?}"),
                ));
            }
        }
        let mut secrets = BTreeMap::new();
        for (name, raw) in &r.secrets {
            let key = format!("secrets.{name}");
            if !jobtrail_core::request::is_grant_name(name) {
                return Err(self.err(&key, "a name of letters, digits, '_', '-', '.'"));
            }
            if r.redact.is_empty() {
                return Err(self.err(
                    &key,
                    "a `redact` list naming the fields where callers may name secrets",
                ));
            }
            if raw.callers.as_ref().is_some_and(|c| c.is_empty()) {
                return Err(self.err(
                    &format!("{key}.callers"),
                    "at least one caller (or no `callers` key: any caller)",
                ));
            }
            secrets.insert(
                name.clone(),
                GrantedSecret {
                    from: self.secret(&format!("{key}.from"), &raw.from)?,
                    grant: jobtrail_core::SecretGrant {
                        callers: raw.callers.clone(),
                    },
                },
            );
        }
        let limits = self.limits(&r.limits)?;

        // Fixed headers may not carry what jobtrail sends itself: credentials go in [auth], the
        // token in its own key, the trace in traceparent.
        let mut reserved: Vec<String> = [
            "authorization",
            "proxy-authorization",
            "cookie",
            "host",
            "content-length",
            "content-type",
            "transfer-encoding",
            "connection",
            "traceparent",
            "tracestate",
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(a) = &auth {
            reserved.push(a.header.as_str().to_owned());
        }
        if let TokenPlacement::Header(h) = &create.token {
            reserved.push(h.as_str().to_owned());
        }
        // `Accept` too: jobtrail sets it on every call.
        let taken = |reserved: &[String], h: &http::HeaderName| {
            h.as_str() == "accept" || reserved.iter().any(|r| r.eq_ignore_ascii_case(h.as_str()))
        };
        if let Some(h) = &trace_header {
            if taken(&reserved, h) {
                return Err(self.err(
                    "trace_header",
                    format!(
                        "a header of its own, not one jobtrail sends for something else (auth, idempotency token), got {h}"
                    ),
                ));
            }
            reserved.push(h.as_str().to_owned());
        }
        // The call's own id must not stand in for anything else jobtrail sends (the idempotency
        // token, the trace, the credential): each header says one thing.
        if let Some(h) = &client_request_id_header {
            if taken(&reserved, h) {
                return Err(self.err(
                    "client_request_id_header",
                    format!(
                        "a header of its own, not one jobtrail sends for something else (auth, idempotency token, trace), got {h} (a profile sets it: `unset = [\"client_request_id_header\"]` to do without)"
                    ),
                ));
            }
            reserved.push(h.as_str().to_owned());
        }
        let headers = self.fixed_headers("headers", &r.headers, &reserved)?;
        // A fixed query is text in the contract file, which a cluster keeps in a ConfigMap and
        // `contract check` prints: no credential goes there (jobtrail reads credentials from the
        // environment or a file, through [auth], and sends them as a header).
        if let Some(name) = r
            .query
            .keys()
            .find(|k| crate::wire::credential_query_name(k))
        {
            return Err(self.err(
                &format!("query.{name}"),
                "no credential in a fixed query (the contract file is kept in clear text, in a ConfigMap, and printed by `contract check`): send it as a header through [auth] with secret = \"env:…\" or \"file:…\" (Azure Functions: header = \"x-functions-key\"; Google APIs: header = \"x-goog-api-key\")",
            ));
        }
        let mut create = create;
        create.headers = self.fixed_headers("create.headers", &r.create.headers, &reserved)?;
        let mut cancel = cancel;
        if let (Some(c), Some(rc)) = (cancel.as_mut(), r.cancel.as_ref()) {
            c.headers = self.fixed_headers("cancel.headers", &rc.headers, &reserved)?;
        }
        // A credential sent over plain http can be read on the way: only to this machine, or where
        // the contract says the network between is the operator's own.
        if (auth.is_some() || !secrets.is_empty()) && !r.allow_plain_http {
            let mut trusted = origins.clone().unwrap_or_else(|| vec![base_url.origin()]);
            // Granted secrets go in the create's body wherever it is sent, an origin that gets
            // no credentials included.
            if !secrets.is_empty()
                && let Ok(u) = url::Url::parse(&create.path)
            {
                trusted.push(u.origin());
            }
            if let Some(o) = trusted.iter().find(|o| plain_and_remote(o)) {
                return Err(self.err(
                    if r.origins.is_some() { "origins" } else { "base_url" },
                    format!(
                        "https where credentials (auth, secrets) are sent, or a loopback host; got {} (set allow_plain_http = true only where the network between is your own, a cluster-internal service say)",
                        o.ascii_serialization()
                    ),
                ));
            }
        }
        let c = Contract {
            file: path.to_path_buf(),
            name: r.name,
            description: r.description,
            untested: r.untested,
            requires_approval: r.requires_approval,
            base_url,
            connect_timeout,
            request_timeout,
            max_response_bytes: t.max_response_bytes,
            http_version: r.http_version,
            auth,
            query: r.query,
            headers,
            trace_header,
            client_request_id_header,
            cookies: r.cookies,
            origins,
            unauthenticated_origins,
            create,
            status,
            rules,
            polling,
            create_window,
            result_window,
            cancel,
            result,
            reconcile,
            webhook,
            redact: r.redact,
            secrets,
            limits,
        };
        // Every call jobtrail builds from the contract: its URL template, its JSON body template
        // (if any), each with its key, and whether the call is about our job (all but create).
        let body_text = |b: &Option<serde_json::Value>| b.as_ref().map(|b| b.to_string());
        let mut calls: Vec<(String, String, String, Option<String>, bool)> = vec![
            (
                "create.path".into(),
                c.create.path.clone(),
                String::new(),
                None,
                false,
            ),
            (
                "status.url".into(),
                c.status.url.clone(),
                String::new(),
                None,
                true,
            ),
        ];
        if let Some(x) = &c.cancel {
            calls.push((
                "cancel.path".into(),
                x.path.clone(),
                "cancel.body".into(),
                body_text(&x.body),
                true,
            ));
        }
        if let Some(r) = &c.result {
            let formats = r
                .formats
                .iter()
                .map(|(n, f)| (format!("result.formats.{n}"), f));
            for (key, f) in std::iter::once(("result".to_owned(), r)).chain(formats) {
                if let Some(u) = &f.url {
                    calls.push((
                        format!("{key}.url"),
                        u.clone(),
                        format!("{key}.body"),
                        body_text(&f.body),
                        true,
                    ));
                }
            }
        }
        if let Some(u) = &c.reconcile.lookup_url {
            calls.push((
                "reconcile.lookup_url".into(),
                u.clone(),
                "reconcile.lookup_body".into(),
                body_text(&c.reconcile.lookup_body),
                true,
            ));
        }
        let templates = calls.iter().flat_map(|(uk, u, bk, b, _)| {
            std::iter::once((uk, u, true)).chain(b.as_ref().map(|b| (bk, b, false)))
        });
        for (key, t, url) in templates {
            self.placeholder_sources(&c, key, t)?;
            if url && let Some(name) = credential_in_query(t) {
                return Err(self.err(key, credential_in_url(&name)));
            }
            // Without create.job_id the job is known by its status URL: there is no id to place.
            if c.create.job_id.is_none() && (t.contains("{job_id}") || t.contains("{job_id_path}"))
            {
                return Err(self.err(
                    key,
                    "no {job_id} or {job_id_path} without create.job_id (the job is then known by the status URL the create answer names: use {status_url})",
                ));
            }
            // A template that names a whole URL must stay within the declared origins too.
            if url
                && (t.starts_with("http://") || t.starts_with("https://"))
                && url::Url::parse(t).ok().and_then(|u| c.access(&u)).is_none()
            {
                return Err(self.err(
                    key,
                    format!("a URL within origins or unauthenticated_origins, got {t:?}"),
                ));
            }
        }
        // A request value in a call about our job (status, cancel, result, lookup) only where the
        // call also names our job, in its URL's path or its body: else a caller's value alone
        // could point the call at another job, with our credentials.
        let names_ours = |t: &str| {
            [
                "{job_id}",
                "{job_id_path}",
                "{operation_id}",
                "{client_reference}",
                "{idempotency_key}",
            ]
            .iter()
            .any(|p| t.contains(p))
        };
        for (key, url, _, body, _) in calls.iter().filter(|call| call.4) {
            let path = url.split('?').next().unwrap_or_default();
            let uses_request = url.contains("{request:")
                || body.as_deref().is_some_and(|b| b.contains("{request:"));
            let named = url.starts_with("{status_url}")
                || names_ours(path)
                || body.as_deref().is_some_and(names_ours);
            if uses_request && !named {
                return Err(self.err(
                    key,
                    "a {request:/…} value only in a call that also names our job in its URL's path or its body ({job_id}, {job_id_path}, {status_url} opening the URL, {operation_id}, {client_reference} or {idempotency_key}): a request value alone could name another job",
                ));
            }
        }
        // A status, cancel or result call names the job somewhere, or every operation would read
        // (or cancel) one resource: `/v1/jobs/job_id`, its braces forgotten. (A lookup may list
        // every job, and pick ours by its reference.)
        let names_any = |t: &str| {
            names_ours(t)
                || ["{status_url}", "{target}", "{target_path}"]
                    .iter()
                    .any(|p| t.contains(p))
        };
        for (key, url, _, body, _) in calls.iter().filter(|call| call.4) {
            if key != "reconcile.lookup_url"
                && !names_any(url)
                && !body.as_deref().is_some_and(names_any)
            {
                return Err(self.err(
                    key,
                    "a placeholder that names the job in its URL or body ({job_id}, {job_id_path}, {status_url}, {operation_id}, {client_reference}, {idempotency_key}, {target} or {target_path}): as written, every operation would call the same resource",
                ));
            }
        }
        // A lookup answers the provider's ids, which a job known by its status URL never equals.
        if c.create.job_id.is_none() && c.reconcile.lookup_url.is_some() {
            return Err(self.err(
                "reconcile.lookup_url",
                "nothing without create.job_id (a lookup finds provider job ids; this job is known by its status URL)",
            ));
        }
        if c.create.result_url.is_some() && c.result.is_none() {
            return Err(self.err(
                "create.result_url",
                "a [result] beside it (what the result at that URL must be)",
            ));
        }
        Ok(c)
    }

    /// What a template's placeholders read must exist and be safe to send: an idempotency key
    /// only where one goes with the create, a request value never from a field that carries a
    /// secret (its reference, or the value a caller wrongly put there).
    fn placeholder_sources(&self, c: &Contract, key: &str, t: &str) -> Result<(), ContractError> {
        if t.contains("{idempotency_key}") && !c.create.token.sends_token() {
            return Err(self.err(
                key,
                "no {idempotency_key} unless create.idempotency is \"header\" or \"body_field\" (no key is sent, so none can be looked up)",
            ));
        }
        let mut rest = t;
        while let Some(i) = rest.find("{request:") {
            let tail = &rest[i + "{request:".len()..];
            let end = tail.find('}').unwrap_or(tail.len());
            let ptr = &tail[..end];
            let overlaps = |r: &String| {
                let under = |a: &str, b: &str| {
                    a == b || a.strip_prefix(b).is_some_and(|x| x.starts_with('/'))
                };
                under(ptr, r) || under(r, ptr)
            };
            if let Some(r) = c.redact.iter().find(|r| overlaps(r)) {
                return Err(self.err(
                    key,
                    format!("no {{request:{ptr}}}: it reads the sensitive field {r} (redact)"),
                ));
            }
            rest = &tail[end..];
        }
        Ok(())
    }

    fn limits(&self, r: &RawLimits) -> Result<Limits, ContractError> {
        const MOST: u32 = 100_000;
        let count = |key: &str, v: Option<u32>| match v {
            Some(n) if n == 0 || n > MOST => Err(self.err(key, format!("1 to {MOST}, got {n}"))),
            other => Ok(other),
        };
        let max_in_flight = count("limits.max_in_flight", r.max_in_flight)?;
        let fleet_max_in_flight = count("limits.fleet_max_in_flight", r.fleet_max_in_flight)?;
        if let (Some(w), Some(f)) = (max_in_flight, fleet_max_in_flight)
            && w > f
        {
            return Err(self.err(
                "limits.max_in_flight",
                format!("at most limits.fleet_max_in_flight ({f}), got {w}"),
            ));
        }
        let burst = count("limits.burst", r.burst)?;
        let rate = match (r.rate_per_sec, burst) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(self.err("limits.burst", "limits.rate_per_sec beside it"));
            }
            (Some(per_sec), burst) => {
                // Below one call an hour is a typo; above 100 000 a second no provider publishes.
                if !(per_sec.is_finite() && (1.0 / 3600.0..=100_000.0).contains(&per_sec)) {
                    return Err(self.err(
                        "limits.rate_per_sec",
                        format!("calls per second from 1/3600 to 100000, got {per_sec}"),
                    ));
                }
                Some(Rate {
                    per_sec,
                    burst: burst.unwrap_or_else(|| (per_sec.ceil() as u32).max(1)),
                })
            }
        };
        Ok(Limits {
            max_in_flight,
            fleet_max_in_flight,
            rate,
        })
    }

    /// `format = "none"`: nothing to fetch and nothing to check, so every key that would say where
    /// a result is or what it must look like is a mistake, refused by name.
    fn no_result(&self, r: RawResult, status_gives_url: bool) -> Result<ResultSpec, ContractError> {
        let set = [
            ("result.url", r.url.is_some()),
            ("result.method", r.method.is_some()),
            ("result.body", r.body.is_some()),
            ("result.content_type", r.content_type.is_some()),
            ("result.checksum_header", r.checksum_header.is_some()),
            ("result.schema", r.schema.is_some()),
            ("result.schema_file", r.schema_file.is_some()),
            ("result.from", r.from != ResultFrom::Url),
            ("result.within", r.within.is_some()),
            ("status.result_url", status_gives_url),
        ];
        let inside = inside_checks(&r);
        if let Some((key, _)) = set.iter().chain(&inside).find(|(_, is_set)| *is_set) {
            return Err(self.err(
                key,
                "nothing: result.format = \"none\" says the job has no result",
            ));
        }
        Ok(ResultSpec {
            format_from: None,
            formats: BTreeMap::new(),
            url: None,
            method: http::Method::GET,
            body: None,
            from: ResultFrom::Url,
            within: None,
            content_type: None,
            max_bytes: r.max_bytes,
            format: ResultFormat::None,
            checksum_header: None,
            schema: None,
            items: None,
            item_error: None,
            item_ref: None,
            item_status: None,
            item_failed_values: Vec::new(),
            item_succeeded_values: Vec::new(),
            csv_status_column: None,
            csv_error_values: Vec::new(),
            csv_succeeded_values: Vec::new(),
            expected_count: None,
            max_failed_items: None,
        })
    }

    /// `[result]` with its formats: each `[result.formats.NAME]` is its keys over the ones beside
    /// it, checked as a whole result of its own.
    fn results(
        &self,
        mut r: RawResult,
        status_gives_url: bool,
    ) -> Result<ResultSpec, ContractError> {
        let formats = std::mem::take(&mut r.formats);
        let format_from = r.format_from.take();
        match (&format_from, formats.is_empty()) {
            (None, true) => return self.result(r, status_gives_url),
            (Some(_), true) => {
                return Err(self.err(
                    "result.formats",
                    "at least one [result.formats.NAME] beside result.format_from",
                ));
            }
            (None, false) => {
                return Err(self.err(
                    "result.format_from",
                    "a JSON pointer into the request naming one of result.formats",
                ));
            }
            (Some(_), false) => {}
        }
        let format_from = self.pointer("result.format_from", &format_from)?;
        // A format inherits where and how the result is fetched, never what the other format's
        // bytes must look like (a CSV has no items pointer, a JSON no status column).
        let mut base_table = toml::Table::try_from(&r)
            .map_err(|e| self.err("result", format!("a result table ({e})")))?;
        base_table.retain(|k, _| {
            [
                "url",
                "method",
                "body",
                "from",
                "max_bytes",
                "checksum_header",
                "checksum_algorithm",
                "expected_count",
                "max_failed_items",
            ]
            .contains(&k)
        });
        let mut spec = self.result(r, status_gives_url)?;
        if spec.format == ResultFormat::None {
            return Err(self.err(
                "result.formats",
                "nothing beside format = \"none\" (a job without a result has one way to end)",
            ));
        }
        for (name, over) in formats {
            let key = format!("result.formats.{name}");
            if name.is_empty() || name.len() > 64 {
                return Err(self.err(&key, "a name of 1 to 64 characters"));
            }
            let mut table = base_table.clone();
            let own = |k: &str| over.contains_key(k);
            let (own_count, own_bound) = (own("expected_count"), own("max_failed_items"));
            merge(&mut table, over);
            let mut raw: RawResult = table
                .try_into()
                .map_err(|e: toml::de::Error| self.err(&key, e.message().to_owned()))?;
            // An item count or bound inherited by a format that counts no items (bytes, JSON
            // without an items pointer) is not its own: dropped, where set on the format itself
            // it is refused by name.
            let counts_items = match raw.format {
                ResultFormat::Csv => true,
                ResultFormat::Json => raw.items.is_some(),
                ResultFormat::Bytes | ResultFormat::None => false,
            };
            if !counts_items {
                if !own_count {
                    raw.expected_count = None;
                }
                if !own_bound {
                    raw.max_failed_items = None;
                }
            }
            if raw.format == ResultFormat::None
                || raw.format_from.is_some()
                || !raw.formats.is_empty()
            {
                return Err(self.err(
                    &key,
                    "result keys of one format (not format = \"none\", format_from or formats)",
                ));
            }
            let variant = self.result(raw, status_gives_url).map_err(|e| match e {
                ContractError::Invalid {
                    file,
                    key: inner,
                    expected,
                } => ContractError::Invalid {
                    file,
                    key: format!("{key}: {inner}"),
                    expected,
                },
                other => other,
            })?;
            spec.formats.insert(name, variant);
        }
        spec.format_from = format_from;
        Ok(spec)
    }

    fn result(&self, r: RawResult, status_gives_url: bool) -> Result<ResultSpec, ContractError> {
        if r.format == ResultFormat::None {
            return self.no_result(r, status_gives_url);
        }
        let url = r
            .url
            .as_deref()
            .map(|u| self.template("result.url", u))
            .transpose()?;
        match r.from {
            ResultFrom::Url if url.is_none() && !status_gives_url => {
                return Err(self.err(
                    "result.url",
                    "a URL template, or status.result_url pointing into the status body (or result.from = \"status\" or \"resource\")",
                ));
            }
            ResultFrom::Status | ResultFrom::Resource if url.is_some() => {
                return Err(self.err(
                    "result.url",
                    "nothing when result.from names where the result is",
                ));
            }
            _ => {}
        }
        if url.is_none() && (r.method.is_some() || r.body.is_some()) {
            return Err(self.err(
                "result.method",
                "nothing without a result.url template (a URL the provider names, the status and the resource are read with GET)",
            ));
        }
        let method = self.read_method("result.method", r.method.as_deref(), &r.body)?;
        let body = self.body_template("result.body", &r.body)?;
        if r.within.is_some() && r.format != ResultFormat::Json {
            return Err(self.err(
                "result.within",
                "format = \"json\" (a pointer into a JSON document)",
            ));
        }
        self.bytes_within("result.max_bytes", r.max_bytes, MAX_RESULT_BYTES)?;
        if r.checksum_algorithm != "sha256" {
            return Err(self.err(
                "result.checksum_algorithm",
                format!("\"sha256\", got {:?}", r.checksum_algorithm),
            ));
        }
        let schema = self
            .schema(
                ("result.schema", &r.schema),
                ("result.schema_file", &r.schema_file),
            )?
            .map(|(_, v)| v);
        if schema.is_some() && r.format != ResultFormat::Json {
            return Err(self.err(
                "result.schema",
                "format = \"json\" (a schema validates JSON results)",
            ));
        }
        if r.format == ResultFormat::Csv && r.items.is_some() {
            return Err(self.err(
                "result.items",
                "no items pointer for CSV results (rows are the items)",
            ));
        }
        // Keys the format never checks are refused by name: accepted, they would read as checks
        // that pass every result (a batch whose every item failed `succeeded`).
        let inside = inside_checks(&r);
        let unchecked: &[(&str, bool)] = match r.format {
            ResultFormat::Bytes => &inside,
            ResultFormat::Json => &inside[CSV_CHECKS],
            ResultFormat::Csv | ResultFormat::None => &[],
        };
        if let Some((key, _)) = unchecked.iter().find(|(_, set)| *set) {
            let format = match r.format {
                ResultFormat::Bytes => "bytes",
                _ => "json",
            };
            return Err(self.err(
                key,
                format!(
                    "nothing: result.format = \"{format}\" never checks it (items are checked in \"json\" results with result.items, rows in \"csv\" ones)"
                ),
            ));
        }
        if r.format == ResultFormat::Json && r.items.is_none() && r.max_failed_items.is_some() {
            return Err(self.err(
                "result.items",
                "a JSON pointer to the item array when max_failed_items is set",
            ));
        }
        let item_keys = r.item_error.is_some()
            || r.item_ref.is_some()
            || r.item_status.is_some()
            || !r.item_failed_values.is_empty()
            || !r.item_succeeded_values.is_empty();
        if item_keys && r.items.is_none() {
            return Err(self.err(
                "result.items",
                "a JSON pointer to the item array when per-item keys (item_error, item_ref, item_status, …) are set",
            ));
        }
        let status_values = !r.item_failed_values.is_empty() || !r.item_succeeded_values.is_empty();
        if status_values != r.item_status.is_some() {
            return Err(self.err(
                "result.item_status",
                "a JSON pointer to each item's status together with item_failed_values or item_succeeded_values (neither without the other)",
            ));
        }
        self.apart(
            ("item_failed_values", &r.item_failed_values),
            ("item_succeeded_values", &r.item_succeeded_values),
        )?;
        let csv_values = !r.csv_error_values.is_empty() || !r.csv_succeeded_values.is_empty();
        if csv_values && r.csv_status_column.is_none() {
            return Err(self.err(
                "result.csv_status_column",
                "a column name when csv_error_values or csv_succeeded_values is set",
            ));
        }
        self.apart(
            ("csv_error_values", &r.csv_error_values),
            ("csv_succeeded_values", &r.csv_succeeded_values),
        )?;
        Ok(ResultSpec {
            format_from: None,
            formats: BTreeMap::new(),
            url,
            method,
            body,
            from: r.from,
            within: self.pointer("result.within", &r.within)?,
            content_type: r.content_type,
            max_bytes: r.max_bytes,
            format: r.format,
            checksum_header: r
                .checksum_header
                .as_deref()
                .map(|h| self.header("result.checksum_header", h))
                .transpose()?,
            schema,
            items: self.pointer("result.items", &r.items)?,
            item_error: self.pointer("result.item_error", &r.item_error)?,
            item_ref: self.pointer("result.item_ref", &r.item_ref)?,
            item_status: self.pointer("result.item_status", &r.item_status)?,
            item_failed_values: r.item_failed_values,
            item_succeeded_values: r.item_succeeded_values,
            csv_status_column: r.csv_status_column,
            csv_error_values: r.csv_error_values,
            csv_succeeded_values: r.csv_succeeded_values,
            expected_count: r.expected_count,
            max_failed_items: r.max_failed_items,
        })
    }
}

/// The checks a result's keys ask for inside its bytes (items, CSV rows, counts), each with
/// whether the contract sets it: refused by name where the format never makes them.
fn inside_checks(r: &RawResult) -> [(&'static str, bool); 11] {
    [
        ("result.items", r.items.is_some()),
        ("result.item_error", r.item_error.is_some()),
        ("result.item_ref", r.item_ref.is_some()),
        ("result.item_status", r.item_status.is_some()),
        (
            "result.item_failed_values",
            !r.item_failed_values.is_empty(),
        ),
        (
            "result.item_succeeded_values",
            !r.item_succeeded_values.is_empty(),
        ),
        ("result.csv_status_column", r.csv_status_column.is_some()),
        ("result.csv_error_values", !r.csv_error_values.is_empty()),
        (
            "result.csv_succeeded_values",
            !r.csv_succeeded_values.is_empty(),
        ),
        ("result.expected_count", r.expected_count.is_some()),
        ("result.max_failed_items", r.max_failed_items.is_some()),
    ]
}

/// Where the CSV keys are in [`inside_checks`].
const CSV_CHECKS: std::ops::Range<usize> = 6..8;

/// An `http://` origin on a host other than this machine's loopback.
fn plain_and_remote(o: &url::Origin) -> bool {
    let url::Origin::Tuple(scheme, host, _) = o else {
        return false;
    };
    scheme == "http"
        && !match host {
            url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
            url::Host::Ipv4(ip) => ip.is_loopback(),
            url::Host::Ipv6(ip) => ip.is_loopback(),
        }
}

/// Why `r` is not a provider's secret but jobtrail's own: its database logins and libpq's password
/// variables, its anchor signing key, or a kernel file (`/proc/self/environ` reads as a regular file
/// and holds every variable above). A contract naming one would send it to the provider.
fn own_credential(r: &SecretRef) -> Option<String> {
    match r {
        SecretRef::Env(name) => {
            let n = name.to_ascii_uppercase();
            let own = n == "DATABASE_URL"
                || n.ends_with("_DATABASE_URL")
                || matches!(n.as_str(), "PGPASSWORD" | "PGPASSFILE" | "JOBTRAIL_TOKEN")
                || n.starts_with("JOBTRAIL_ANCHOR_")
                // The telemetry backend's key (`OTEL_EXPORTER_OTLP_HEADERS`, and per signal).
                || (n.starts_with("OTEL_EXPORTER_OTLP") && n.ends_with("HEADERS"));
            own.then(|| {
                format!(
                    "env:{name} holds jobtrail's own credential: it is never sent to a provider"
                )
            })
        }
        // Devices and FIFOs are refused when read (not regular files); kernel files pass as
        // regular ones, so they are refused here.
        SecretRef::File(path) => ["/proc/", "/sys/"]
            .iter()
            .any(|p| path.starts_with(p))
            .then(|| format!("file:{path} is a kernel file, not a secret file")),
    }
}
