//! What a simulated job does: a script carried in the create request body under `"sim"`.
//! Every field is optional; the default is a well-behaved job that succeeds after `duration_ms`.

use serde::Deserialize;
use std::collections::BTreeMap;

/// What the simulator does with one create attempt (by idempotency token, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CreateAct {
    /// 202 with the job (the original job again for a repeated token).
    #[default]
    Ok,
    /// Create the job, then drop the connection without answering.
    DropAfterAccept,
    /// Drop the connection without creating anything.
    DropBeforeAccept,
    /// Create the job, answer only after `create_delay_ms` (past the client's timeout).
    SlowAccept,
    /// Create the job, answer 500 (an ambiguous failure).
    AmbiguousAfterAccept,
    /// 429 with `Retry-After: <seconds>`; nothing created.
    RetryAfterSeconds,
    /// 503 with `Retry-After: <HTTP-date>`; nothing created.
    RetryAfterDate,
    /// 422: a definitive rejection; nothing created.
    Reject,
    /// 422 quoting the whole request body back (a provider that echoes what it was sent).
    RejectEcho,
    /// Create a *new* job under the same token and answer with it (a contract violation).
    DifferentJobId,
    /// Answer a repeated token with 409 "already exists" and the original job id.
    AlreadyExistsError,
    /// 200 with the finished result inline.
    Sync,
    /// 200 with the finished result inline, quoting the create request back inside it (a
    /// provider that echoes what it was sent, secrets included).
    SyncEcho,
    /// 200 with the finished result inline, the answer marked `Content-Encoding: gzip` though
    /// its bytes are not (a proxy that mislabels what it passes on): bytes nobody can trust.
    SyncEncoded,
    /// 422 whose body is binary: NUL and escape bytes (a provider's error page in UTF-16, say).
    RejectBinary,
    /// Create the job; the answer's state holds NUL and escape characters and is 64 KiB long.
    HostileState,
    /// Create the job, but name it `..` in the answer (a hostile or broken provider: a URL built
    /// from that name addresses another resource).
    DotDotJobId,
    /// With `protocol = "ogc"`: create the job and answer it 200 (not 201), its statusInfo
    /// (`{"status": "accepted"}`) as the body and the job in `Location`: a server that says 200
    /// for an asynchronous job, which is not the finished result its 200 otherwise is.
    #[serde(rename = "status_info_as_200")]
    StatusInfoAs200,
    /// As `status_info_as_200`, its statusInfo saying `successful`: still a status document, the
    /// results are at the job's `/results`.
    #[serde(rename = "successful_status_info_as_200")]
    SuccessfulStatusInfoAs200,
}

/// What a cancel request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CancelAct {
    /// Accept, confirm (state `cancelled`) after `cancel_delay_ms`.
    #[default]
    Confirm,
    /// Accept and never act on it.
    Ignore,
    /// Accept, but the job crosses its commit point first: it succeeds.
    LoseRace,
}

/// What the result endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ResultAct {
    #[default]
    Valid,
    BadChecksum,
    WrongContentType,
    SchemaViolation,
    Oversized,
    /// CSV rows that say ERROR (with `format = "csv"`).
    ErrorRows,
    /// A batch manifest in which some items failed.
    PartialBatch,
    /// The result URL answers 500.
    Fails,
    /// The result URL answers 404.
    Gone,
    /// The result URL answers 404 quoting what it was sent: the Authorization header and the
    /// create request (an error page that echoes credentials).
    GoneEcho,
    /// A valid result that also quotes the create request body back.
    EchoRequest,
}

/// A fault injected into one status response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusFault {
    MalformedJson,
    MissingState,
    UnknownState,
    #[serde(rename = "error_500")]
    Error500,
    TooManyRequests,
    /// 429 without a `Retry-After` header: the client must back off on its own.
    TooManyRequestsBare,
    /// A normal answer that echoes another request's `x-ms-client-request-id` (a proxy that
    /// mixed up its answers).
    OtherClientRequestId,
    /// A normal answer whose every text is hostile: NUL and escape characters in the state, the
    /// update time, the progress and the status URL, a state of 64 KiB, a progress of 128 KiB
    /// (within the sim contract's 256 KiB answers).
    HostileText,
    /// A normal answer that sets 200 cookies, one of them 16 KiB long.
    CookieFlood,
    /// An answer whose progress holds 30 000 small objects: 240 KB of text, within the sim
    /// contract's 256 KiB answers, that would take about 19 MB of a worker's memory parsed.
    ValueFlood,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    #[default]
    Linear,
    Bursty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    #[default]
    Succeeded,
    Failed,
    /// The job ends `cancelled` on the provider's side without any cancel request (cancelled in
    /// the provider's console, pre-empted, expired).
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    Json,
    Csv,
}

/// Which long-running-operation protocol the job's provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// The simulator's own: a job id, `/v1/jobs/{id}` with a `state` string.
    #[default]
    Native,
    /// Google AIP-151: create answers an `Operation` (`name` = `operations/{id}`, `done` left out
    /// while false, `metadata`); `GET /v1/operations/{id}` answers it with `done: true` and
    /// `response` or `error` (google.rpc.Status; code 1 when cancelled);
    /// `POST /v1/operations/{id}:cancel`.
    Aip,
    /// OGC API – Processes (asynchronous execution): `POST /processes/{id}/execution` with `Prefer:
    /// respond-async` (refused with 400 without it) answers 201 with only `Location: /jobs/{id}`
    /// useful; `GET /jobs/{id}` answers a statusInfo (`accepted`, `running`, `successful`,
    /// `failed`, `dismissed`); `GET /jobs/{id}/results`; dismiss with `DELETE /jobs/{id}`.
    Ogc,
    /// Azure's status monitor: create answers 202 with `Operation-Location:
    /// /v1/operations/{id}/0` (and, with `bogus_async_header`, an `Azure-AsyncOperation` that is no
    /// URL); the monitor's body has `status` (`NotStarted`, `Running`, `Succeeded`, `Failed`,
    /// `Canceled`), `error` when failed, and the job's result under `result` when it succeeded.
    AzureMonitor,
    /// Azure's `Location` polling: create answers 202 with `Location: /v1/monitors/{id}/0`; the
    /// monitor answers 202 (with `Retry-After`, and a new `Location` when `moving_status_url`)
    /// while the job runs, 200 when it succeeded, 400 with an `error` object when it failed.
    Location,
    /// Azure's resource PUT: `PUT /v1/resources/{name}` answers 201 with the resource (`id`,
    /// `properties.provisioningState` = `Accepted`); `GET /v1/resources/{name}` answers it with
    /// `Provisioning` while the job runs, then `Succeeded` (the job's result under
    /// `properties.output`), `Failed` (with `error`) or `Canceled`.
    AzureResource,
}

/// The per-job script.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Script {
    pub protocol: Protocol,
    /// With `protocol = "azure_monitor"`: also send an `Azure-AsyncOperation` header that is no URL.
    pub bogus_async_header: bool,
    /// With `protocol = "azure_monitor"`: name the monitor in `Azure-AsyncOperation`, and in
    /// `Operation-Location` a URL that is no monitor (404): a client must prefer the former.
    pub async_operation_header: bool,
    pub create: Vec<CreateAct>,
    pub create_delay_ms: u64,
    pub retry_after_secs: u64,
    pub duration_ms: u64,
    pub progress: Progress,
    pub never_finish: bool,
    pub outcome: Outcome,
    /// `Retry-After` (seconds) on status responses while the job runs.
    pub poll_retry_after: Option<u64>,
    /// Send that `Retry-After` as an HTTP-date instead of seconds.
    pub poll_retry_after_as_date: bool,
    pub cancel: CancelAct,
    pub cancel_delay_ms: u64,
    pub result: ResultAct,
    pub format: Format,
    pub items: u32,
    /// The item count a finished job's status answer gives, written this way instead of as a
    /// number (`"5"`, `5.0`, `{"n": 5}`: a provider's count in some other form).
    pub expected_items_as: Option<serde_json::Value>,
    /// Faults by status-call number (1-based).
    pub status_faults: BTreeMap<u32, StatusFault>,
    /// Delay every status response (makes overlapping polls visible in the ledger).
    pub status_delay_ms: u64,
    /// Delay every result response (makes overlapping downloads, across jobs, visible in the
    /// ledger's `max_results_in_flight`).
    pub result_delay_ms: u64,
    /// The first this many cancel calls are answered 429 with `Retry-After: 1`, nothing done.
    pub cancel_throttled: u32,
    /// The next this many cancel calls (after the throttled ones) take effect and are then
    /// answered 503 with `Retry-After: 1` (a gateway that gave up waiting after it forwarded the
    /// cancel): the answer does not say the cancel was not made.
    pub cancel_unavailable: u32,
    /// The create's `202` says `Retry-After: <seconds>` (Azure's long-running operations do): a
    /// status read before it is counted early.
    pub create_retry_after: Option<u64>,
    /// The first this many result calls are answered 429 with `Retry-After: 1` (a provider that
    /// rate-limits downloads).
    pub result_throttled: u32,
    /// The first this many result calls are answered 403 (a storage gateway's or a CDN's
    /// passing refusal): the result is there when read again.
    pub result_forbidden: u32,
    /// The first this many result URLs the status names have expired when they are read (403,
    /// as a pre-signed URL past its time). Set, every status read that says succeeded names a new
    /// URL (`?sig=<n>`), as a store that signs URLs on each read does.
    pub result_urls_expired: u32,
    /// The first this many lookups by client reference that find this job are answered 429 with
    /// `Retry-After: 1`, nothing listed (a provider that rate-limits its list endpoint).
    pub lookup_throttled: u32,
    /// Hold every create request this long before deciding what it does (the request is in
    /// flight and the worker holds its lease meanwhile, whatever the answer will be).
    pub create_hold_ms: u64,
    /// Each status response names a new status URL (`/v1/operations/{id}/{n}`).
    pub moving_status_url: bool,
    /// Name the status URL in an `Operation-Location` header on create.
    pub status_via_header: bool,
    /// Status calls without the session cookie set at create are refused.
    pub require_cookie: bool,
    /// Name this URL (anywhere, any origin) as the status URL on create: a provider pointing away.
    pub status_url_elsewhere: Option<String>,
    /// With `protocol = "ogc"`: a query the create's `Location` carries (`access_token=…`: a
    /// provider that hands out capability URLs), which the job's URLs must keep and no record may.
    pub location_query: Option<String>,
    /// Name this URL as the result URL when the job succeeds.
    pub result_url_elsewhere: Option<String>,
    /// The create answer carries partial output in `result` beside its `queued` state (as APIs
    /// that stream output do): not the job's result.
    pub partial_output: bool,
    /// The webhooks this job's provider sends (when the simulator has a webhook target).
    pub webhooks: WebhookPlan,
    /// The simulator's path prefix (set by the simulator, never by a script): every URL it names
    /// for this job starts with it.
    #[serde(skip)]
    pub path_prefix: String,
}

/// Which webhook deliveries a job makes: the honest one when it ends, and the bad ones a receiver
/// must shrug off.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookPlan {
    /// Announce the job's state when its duration is over.
    pub on_finish: bool,
    /// Send that announcement this many more times, with the same event id.
    pub duplicates: u32,
    /// Announce "succeeded" right after create, while the job still runs (out of order: a status
    /// read says otherwise).
    pub early: bool,
    /// Also send a delivery claiming success with a signature made with the wrong key.
    pub forged: bool,
    /// Also send the end announcement under a new event id with a timestamp an hour old (a late
    /// replay, outside any tolerance).
    pub stale: bool,
    /// Send this many "still running" deliveries, each under a new event id, from the start (a
    /// provider that floods its receiver).
    pub flood: u32,
    /// The pause between them.
    pub flood_every_ms: u64,
}

impl Default for WebhookPlan {
    fn default() -> Self {
        Self {
            on_finish: true,
            duplicates: 0,
            early: false,
            forged: false,
            stale: false,
            flood: 0,
            flood_every_ms: 20,
        }
    }
}

impl Default for Script {
    fn default() -> Self {
        Self {
            protocol: Protocol::Native,
            bogus_async_header: false,
            async_operation_header: false,
            create: Vec::new(),
            create_delay_ms: 5_000,
            retry_after_secs: 1,
            duration_ms: 300,
            progress: Progress::Linear,
            never_finish: false,
            outcome: Outcome::Succeeded,
            poll_retry_after: None,
            poll_retry_after_as_date: false,
            cancel: CancelAct::Confirm,
            cancel_delay_ms: 200,
            result: ResultAct::Valid,
            format: Format::Json,
            items: 5,
            expected_items_as: None,
            status_faults: BTreeMap::new(),
            status_delay_ms: 0,
            result_delay_ms: 0,
            result_throttled: 0,
            result_forbidden: 0,
            result_urls_expired: 0,
            lookup_throttled: 0,
            create_retry_after: None,
            cancel_throttled: 0,
            cancel_unavailable: 0,
            create_hold_ms: 0,
            moving_status_url: false,
            status_via_header: false,
            require_cookie: false,
            status_url_elsewhere: None,
            location_query: None,
            result_url_elsewhere: None,
            partial_output: false,
            webhooks: WebhookPlan::default(),
            path_prefix: String::new(),
        }
    }
}

impl Script {
    /// A path of the simulator's API as it names it: under its prefix.
    pub fn at(&self, path: impl std::fmt::Display) -> String {
        format!("{}{path}", self.path_prefix)
    }

    /// The act for create attempt `n` (1-based) under one token: the list, then `Ok`.
    pub fn create_act(&self, n: usize) -> CreateAct {
        self.create
            .get(n.saturating_sub(1))
            .copied()
            .unwrap_or_default()
    }
}
