//! # jobtrail-service
//!
//! The operations service every door uses: the CLI (with database credentials), the HTTP API and the
//! MCP server (with bearer tokens). It holds the domain logic the doors share: who may do what
//! ([`Principal`], [`Scope`]), submit with the contract's checks, reads limited to the caller's own
//! operations, a bounded `wait` woken by PostgreSQL notifications, cancel requests, results served
//! only as the evidence chain records them, the provider catalogue, and (separately, in
//! [`operator`]) the decisions people make and the audit reads.
//!
//! [`Operations`] is the agent-facing surface as a trait, implemented here over the database
//! ([`Bound`]: a service and the principal it acts for) and in [`client`] over the HTTP API, so the
//! CLI and the MCP server work the same whether they hold a database URL or only a token.

pub mod auth;
pub mod client;
pub mod error;
pub mod model;
pub mod operator;
mod per_caller;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jobtrail_core::{OperationId, ProviderTerms, State, Submission, SubmitLimits, TraceParent};
use jobtrail_provider::Registry;
use jobtrail_store::{ListFilter, OperationRecord, Store, StoreError};

pub use auth::{Principal, Scope};
pub use error::{Kind, ServiceError};
pub use model::*;

/// The longest a single wait may last (a proxy or an MCP client gives up on longer requests; wait
/// again for longer).
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// How long one request to a server (an HTTP route, an MCP tool call) may run before it is stopped
/// and answered `unavailable`; a wait, its own timeout more. `jobtrail serve --request-timeout`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a caller whose request ran out of time is asked to wait before it comes back.
const STOPPED_RETRY_SECS: u64 = 5;
/// The header that carries a served result's sha256 (as the evidence chain records it).
pub const RESULT_SHA256_HEADER: &str = "jobtrail-result-sha256";
/// The largest request body a network door (HTTP, MCP) reads: the largest provider request any
/// contract may allow, plus room for the envelope.
pub const MAX_REQUEST_BYTES: usize = jobtrail_core::operation::MAX_BODY_BYTES + 64 * 1024;
/// Default and largest page sizes.
pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 200;
/// The most JSON one page of operations carries: a page ends early (with its `next_cursor`) rather
/// than grow past it. Each operation's text fields may hold kilobytes (a target, an approval
/// reference), and an answer is held in memory while it is sent (and, over MCP, while its session
/// keeps it): 200 padded operations made one answer of megabytes, which a caller could ask for
/// at its request rate.
pub const PAGE_BYTES: usize = 256 * 1024;

/// A view a person gave (`STATE@SEQ[:HEAD]`) as written, and parsed.
type GivenView<'a> = (&'a str, (State, Option<i64>, Option<String>));

/// The operations service: a store, the provider contracts, and the state watcher.
pub struct Service {
    store: Store,
    /// The store operator decisions and audit reads use (a `jobtrail_operator` login); `None`: those
    /// routes are unavailable in this process.
    operator_store: Option<Store>,
    registry: Arc<Registry>,
    terms: BTreeMap<String, ProviderTerms>,
    /// Started by the first wait (a one-shot CLI command never opens the listening connection).
    watcher: std::sync::OnceLock<watch::Watcher>,
    /// Waits open now, by caller.
    waiting: per_caller::PerCaller,
    /// One verify of every chain at a time in this process: each holds several operator
    /// connections for as long as it reads, and an audit-scoped caller could start many.
    verifying_everything: tokio::sync::Semaphore,
    /// Results being sent now, by caller.
    sending: per_caller::PerCaller,
    /// The budget for looking up tokens not found live lately.
    token_lookups: Arc<auth::TokenLookups>,
    /// Request bodies being read now, by caller.
    receiving: per_caller::PerCaller,
    /// Webhook bodies being read now, by provider (a webhook's sender is unknown until its
    /// signature is checked, which needs the whole body)...
    hinting: per_caller::PerCaller,
    /// ... and by provider and sending address, so one address holds a part of them only.
    hinting_from: per_caller::PerCaller,
    /// Operations one caller may hold open at once ([`SubmitLimits::max_open_per_caller`]).
    open_per_caller: std::sync::atomic::AtomicU32,
    /// How long a request through a [`Bound`] door may run, in milliseconds; 0: no bound (the
    /// CLI's own door over the database, whose person sees it and may stop it). A server sets it.
    request_timeout_ms: std::sync::atomic::AtomicU64,
    /// Bytes of results and request bodies this process holds at once, across every caller.
    held: per_caller::HeldBytes,
}

/// Bytes of results being sent and request bodies being read the API holds at once by default,
/// across every caller, one caller at most half (each is also held to its own turns): 8 results
/// of 16 MiB each per caller would otherwise let three callers take 400 MiB between them.
pub const HELD_BYTES: usize = 128 * 1024 * 1024;

/// Bytes of a result or request body held (against [`HELD_BYTES`]), given back when dropped.
pub struct Held {
    service: Arc<Service>,
    holder: String,
    counted: usize,
}

impl Held {
    /// What is held is now `n` bytes, if that is less (a body read whole that declared no length
    /// held the most a body may be until then).
    pub fn shrink_to(&mut self, n: usize) {
        let n = self.service.held.counted(n);
        if n < self.counted {
            self.service.held.give_back(&self.holder, self.counted - n);
            self.counted = n;
        }
    }

    /// What `more` holds is held with this from now on (given back with it).
    pub fn join(&mut self, mut more: Held) {
        debug_assert_eq!(self.holder, more.holder);
        self.counted += std::mem::take(&mut more.counted);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.service.held.give_back(&self.holder, self.counted);
    }
}

/// What an answer holds until the last of it has been sent (a result's turn and bytes): put in a
/// request's extensions by the HTTP door that streams the answer, filled by whoever builds the
/// answer behind that stream (MCP's tools), and dropped with the answer's body, when its last
/// byte has gone or the connection has been closed.
#[derive(Clone, Default)]
pub struct HeldUntilSent(Arc<std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>>);

impl HeldUntilSent {
    pub fn keep(&self, what: impl Send + 'static) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(what));
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} bytes for {})", self.counted, self.holder)
    }
}

/// Operations one caller may hold open (not yet terminal) at once by default: a runaway agent
/// cannot start paid jobs without end, nor fill the database, while its operations pile up.
pub const OPEN_PER_CALLER: u32 = 10_000;

/// Results one caller may be sent at once by default: each is held in memory until the last of it
/// is handed to the connection, so a reader that stops reading holds one.
pub const RESULTS_PER_CALLER: usize = 8;

/// Request bodies one caller may be sending at once by default: each is read whole into memory
/// (up to [`MAX_REQUEST_BYTES`]) before it is parsed, and a sender that stops sending holds one.
pub const BODIES_PER_CALLER: usize = 4;

/// Webhook bodies being read at once for one provider by default: a delivery is read before its
/// signature can be checked, so anyone may send one, and a sender that stops sending holds one.
/// A webhook only hints (status reads go on without it), so one refused costs only a delay.
pub const WEBHOOK_BODIES_PER_PROVIDER: usize = 16;

/// Webhook bodies of one provider one address may be sending at once: a quarter of the provider's
/// (at least 1), so that one address alone cannot hold them all.
fn per_sender(per_provider: usize) -> usize {
    (per_provider / 4).max(1)
}

/// One of a caller's turns (a result being sent, a request body being read) or a provider's (a
/// webhook body being read), given back when dropped: when the last of it has passed, or the
/// connection went away.
pub struct Slot {
    service: Arc<Service>,
    holder: String,
    of: fn(&Service) -> &per_caller::PerCaller,
}

/// A turn to be sent one result.
pub type ResultSlot = Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        (self.of)(&self.service).give_back(&self.holder);
    }
}

/// Waits one caller may hold open at once by default (each holds a request, a connection and a
/// subscription for up to [`MAX_WAIT`]).
pub const WAITS_PER_CALLER: usize = 64;

/// One open wait of a caller, given back when dropped.
struct WaitSlot<'a> {
    service: &'a Service,
    caller: String,
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.service.waiting.give_back(&self.caller);
    }
}

impl Service {
    /// A service over `store` with the contracts of `registry`.
    pub fn new(store: Store, registry: Registry) -> Arc<Self> {
        Self::build(store, None, registry)
    }

    /// As [`Service::new`], with a store for operator decisions and audit reads.
    pub fn with_operator(store: Store, operator: Store, registry: Registry) -> Arc<Self> {
        Self::build(store, Some(operator), registry)
    }

    fn build(store: Store, operator_store: Option<Store>, registry: Registry) -> Arc<Self> {
        Arc::new(Self {
            watcher: std::sync::OnceLock::new(),
            waiting: per_caller::PerCaller::new(WAITS_PER_CALLER),
            verifying_everything: tokio::sync::Semaphore::new(1),
            sending: per_caller::PerCaller::new(RESULTS_PER_CALLER),
            token_lookups: Arc::default(),
            receiving: per_caller::PerCaller::new(BODIES_PER_CALLER),
            hinting: per_caller::PerCaller::new(WEBHOOK_BODIES_PER_PROVIDER),
            hinting_from: per_caller::PerCaller::new(per_sender(WEBHOOK_BODIES_PER_PROVIDER)),
            open_per_caller: std::sync::atomic::AtomicU32::new(OPEN_PER_CALLER),
            request_timeout_ms: std::sync::atomic::AtomicU64::new(0),
            held: per_caller::HeldBytes::new(HELD_BYTES),
            store,
            operator_store,
            terms: registry.terms(),
            registry: Arc::new(registry),
        })
    }

    /// How long one request may run from now on (at least a millisecond), through the HTTP routes
    /// and through a [`Bound`] door (MCP's tool calls): see [`REQUEST_TIMEOUT`]. Unset, a [`Bound`]
    /// door waits as long as its work takes, and the routes take [`REQUEST_TIMEOUT`].
    pub fn set_request_timeout(&self, d: Duration) {
        self.request_timeout_ms.store(
            (d.as_millis() as u64).max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The bound set by [`Service::set_request_timeout`], if any.
    pub fn request_timeout(&self) -> Option<Duration> {
        match self
            .request_timeout_ms
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Operations one caller may hold open at once from now on (at least 1).
    pub fn set_open_per_caller(&self, n: u32) {
        self.open_per_caller
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    fn submit_limits(&self) -> SubmitLimits {
        SubmitLimits {
            max_open_per_caller: Some(
                self.open_per_caller
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
            ..SubmitLimits::default()
        }
    }

    /// Bytes of results and request bodies held at once across callers from now on.
    pub fn set_held_bytes(&self, n: usize) {
        self.held.set_most(n);
    }

    /// `bytes` more held for `holder` (a caller, or a provider's webhooks) for a result being sent
    /// or a body being read, or refused (503, try again in a second) when the process, or the
    /// holder's half of it, holds as much as it may.
    pub fn hold(self: &Arc<Self>, holder: &str, bytes: usize) -> Result<Held, ServiceError> {
        let counted = self.held.counted(bytes);
        self.held.take(holder, counted).map_err(|held| {
            ServiceError::unavailable(format!(
                "this server holds {} MiB of results and request bodies for its callers, the most it may (--held-mib; one caller at most half): try again in a moment",
                held.div_ceil(1024 * 1024)
            ))
            .with_detail(serde_json::json!({ "retry_after_secs": 1 }))
        })?;
        Ok(Held {
            service: self.clone(),
            holder: holder.to_owned(),
            counted,
        })
    }

    /// Hold a result (or an answer carrying one) of `bytes` for `holder`, counted whole
    /// ([`per_caller::HeldBytes::take_whole`]).
    pub fn hold_result(self: &Arc<Self>, holder: &str, bytes: usize) -> Result<Held, ServiceError> {
        match self.held.take_whole(holder, bytes) {
            Ok(()) => Ok(Held {
                service: self.clone(),
                holder: holder.to_owned(),
                counted: bytes,
            }),
            Err(Some(held)) => Err(ServiceError::unavailable(format!(
                "this server holds {} MiB of results and request bodies for its callers and this result ({} MiB) does not fit beside them (--held-mib; one caller at most half, or one result alone): try again in a moment",
                held.div_ceil(1024 * 1024),
                bytes.div_ceil(1024 * 1024)
            ))
            .with_detail(serde_json::json!({ "retry_after_secs": 1 }))),
            Err(None) => Err(ServiceError::unavailable(format!(
                "this result ({} MiB) is larger than this server may hold at once for its callers (--held-mib): it is not served here; an operator serves it by raising --held-mib (and the server's memory with it), or reads it with `jobtrail result`",
                bytes.div_ceil(1024 * 1024)
            ))),
        }
    }

    /// Waits one caller may hold open at once from now on (at least 1).
    pub fn set_waits_per_caller(&self, n: usize) {
        self.waiting.set_most(n);
    }

    /// Results one caller may be sent at once from now on (at least 1).
    pub fn set_results_per_caller(&self, n: usize) {
        self.sending.set_most(n);
    }

    /// Request bodies one caller may be sending at once from now on (at least 1).
    pub fn set_bodies_per_caller(&self, n: usize) {
        self.receiving.set_most(n);
    }

    /// Webhook bodies one provider may be sent at once from now on (at least 1; a quarter of them,
    /// at least 1, from one address).
    pub fn set_webhook_bodies_per_provider(&self, n: usize) {
        self.hinting.set_most(n);
        self.hinting_from.set_most(per_sender(n));
    }

    /// A slot to send `p` one result, or refused when it is being sent as many as it may (a
    /// reader that stops reading holds its result in memory: the bound is per caller).
    pub fn result_slot(self: &Arc<Self>, p: &Principal) -> Result<ResultSlot, ServiceError> {
        self.slot(p, |s| &s.sending, |caller, n| {
            format!(
                "caller {caller} is being sent {n} results, the most at once: read them to the end (or close them) first"
            )
        })
    }

    /// A slot to read one request body from `p`, or refused when it is sending as many as it may
    /// (a sender that stops sending holds what it sent so far in memory: the bound is per caller).
    pub fn body_slot(self: &Arc<Self>, p: &Principal) -> Result<Slot, ServiceError> {
        self.slot(p, |s| &s.receiving, |caller, n| {
            format!(
                "caller {caller} is sending {n} request bodies, the most at once: finish (or close) one first"
            )
        })
    }

    /// Turns to read one webhook body for `provider` (a name from the registry) sent from
    /// `sender` (an address, when known), or refused when as many are being read for it, or for it
    /// from that address, as may be.
    pub fn webhook_body_slot(
        self: &Arc<Self>,
        provider: &str,
        sender: Option<std::net::IpAddr>,
    ) -> Result<(Slot, Option<Slot>), ServiceError> {
        let from = sender
            .map(|ip| {
                self.slot_for(&format!("{provider} {ip}"), |s| &s.hinting_from, |_, n| {
                    format!(
                        "{n} webhook bodies for {provider} are being read from this address, the most at once: deliver again later"
                    )
                })
            })
            .transpose()?;
        let all = self.slot_for(provider, |s| &s.hinting, |provider, n| {
            format!(
                "{n} webhook bodies for {provider} are being read, the most at once: deliver again later"
            )
        })?;
        Ok((all, from))
    }

    fn slot(
        self: &Arc<Self>,
        p: &Principal,
        of: fn(&Service) -> &per_caller::PerCaller,
        refusal: impl FnOnce(&str, usize) -> String,
    ) -> Result<Slot, ServiceError> {
        self.slot_for(p.caller(), of, refusal)
    }

    fn slot_for(
        self: &Arc<Self>,
        holder: &str,
        of: fn(&Service) -> &per_caller::PerCaller,
        refusal: impl FnOnce(&str, usize) -> String,
    ) -> Result<Slot, ServiceError> {
        of(self)
            .take(holder)
            .map_err(|n| ServiceError::rate_limited(refusal(holder, n), 1))?;
        Ok(Slot {
            service: self.clone(),
            holder: holder.to_owned(),
            of,
        })
    }

    /// A wait slot for `caller`, or refused when it holds as many as it may.
    fn wait_slot(&self, caller: &str) -> Result<WaitSlot<'_>, ServiceError> {
        self.waiting.take(caller).map_err(|n| {
            ServiceError::rate_limited(
                format!(
                    "caller {caller} has {n} waits open, the most it may: wait for fewer operations at once (list_operations shows many states in one read)"
                ),
                1,
            )
        })?;
        Ok(WaitSlot {
            service: self,
            caller: caller.to_owned(),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Act for `principal`.
    pub fn bind(self: &Arc<Self>, principal: Principal) -> Bound {
        Bound {
            service: self.clone(),
            principal,
        }
    }

    /// The principal a bearer token stands for. Anything but a live token is `Unauthenticated`,
    /// with the same message whatever was wrong (no oracle for guessing).
    pub async fn authenticate(&self, bearer: &str) -> Result<Principal, ServiceError> {
        let refused = || {
            ServiceError::new(
                Kind::Unauthenticated,
                "a valid bearer token is needed (jobtrail-admin tokens create)",
            )
        };
        if !auth::token_shaped(bearer) {
            return Err(refused());
        }
        let digest = auth::token_digest(bearer);
        self.list_live_tokens_when_due();
        if let Err(wait) = self.token_lookups.may_look_up(&digest) {
            return Err(ServiceError::rate_limited(
                "too many requests with tokens this server has not seen lately: try again shortly",
                wait.as_secs_f64().ceil() as u64,
            ));
        }
        let t = self.store.live_token(&digest).await?.ok_or_else(refused)?;
        self.token_lookups.found_live(digest);
        let scopes = t
            .scopes
            .iter()
            .filter_map(|s| s.parse::<Scope>().ok())
            .collect::<Vec<_>>();
        Ok(Principal::new(t.caller, scopes).by_token(digest))
    }

    /// Refused when the token `p` was authenticated by has been revoked (or has expired) since (a
    /// database that does not answer refuses nothing).
    pub(crate) async fn still_authenticated(&self, p: &Principal) -> Result<(), ServiceError> {
        let Some(token) = p.token() else {
            return Ok(());
        };
        match self.store.live_token(&token.0).await {
            Ok(Some(t)) if t.caller == p.caller() => Ok(()),
            // The database is away for now: the wait's own reads say so if it stays away; a
            // moment's outage does not end every wait open.
            Err(e) => {
                tracing::debug!(error = %e, "could not look at a waiting caller's token again");
                Ok(())
            }
            Ok(_) => Err(ServiceError::new(
                Kind::Unauthenticated,
                "this token was revoked (or expired) while the request ran",
            )),
        }
    }

    /// Read every live token's digest again, in the background, when the last read is old: those
    /// are looked up without the budget for unknown tokens. A read that fails leaves the last list.
    fn list_live_tokens_when_due(&self) {
        if !self.token_lookups.list_due() {
            return;
        }
        let (store, lookups) = (self.store.clone(), Arc::clone(&self.token_lookups));
        tokio::spawn(async move {
            let digests = store.live_token_digests(auth::LISTED_MOST).await;
            if let Err(e) = &digests {
                tracing::warn!(error = %e, "could not list the live tokens");
            }
            lookups.listed(digests.ok());
        });
    }

    // ---------------------------------------------------------------------------------------------
    // Agent operations
    // ---------------------------------------------------------------------------------------------

    /// A request checked for this principal (approval, request schema, times, ids, and that no id
    /// it names is another caller's), as a submission.
    /// The time relative deadlines (`+2h`) count from: the database's clock, which the store then
    /// checks every deadline against, not this host's (which may be skewed from it). Read once, and
    /// only when some request names a relative time.
    async fn deadline_clock<'a>(
        &self,
        reqs: impl IntoIterator<Item = &'a SubmitRequest>,
    ) -> Result<chrono::DateTime<chrono::Utc>, ServiceError> {
        let relative = reqs.into_iter().any(|r| {
            [&r.create_deadline, &r.result_deadline]
                .into_iter()
                .any(|t| {
                    t.as_deref()
                        .is_some_and(|t| t.trim_start().starts_with('+'))
                })
        });
        Ok(if relative {
            self.store.db_now().await?
        } else {
            chrono::Utc::now()
        })
    }

    async fn submission(
        &self,
        p: &Principal,
        req: SubmitRequest,
        trace: Option<TraceParent>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Submission, ServiceError> {
        let provider = req.provider.trim();
        let contract = self.registry.get(provider).map(|x| x.contract());
        if let Some(c) = contract {
            if c.requires_approval {
                if !p.has(Scope::Decide) {
                    return Err(ServiceError::forbidden(format!(
                        "provider {provider} requires a person's approval: a person submits it with a token that has the decide scope (over /mcp that scope is not used)"
                    )));
                }
                if req.approved_by.trim() != p.caller() {
                    return Err(ServiceError::bad_input(format!(
                        "provider {provider} requires approval by the submitting person: approved_by must be {:?}",
                        p.caller()
                    )));
                }
            }
            if let Some(schema) = &c.create.request_schema {
                check_request(&schema.validator, &c.redact, &req.request)?;
            }
        }
        let time = |s: &Option<String>, what: &str| {
            s.as_deref()
                .map(|t| {
                    jobtrail_core::when::parse_time_at(t, now)
                        .map_err(|e| ServiceError::bad_input(format!("{what}: {e}")))
                })
                .transpose()
        };
        let id = |s: &Option<String>, what: &str| {
            s.as_deref()
                .map(|t| {
                    t.parse::<OperationId>()
                        .map_err(|e| ServiceError::bad_input(format!("{what}: {e}")))
                })
                .transpose()
        };
        let submission = Submission {
            operation_id: id(&req.id, "id")?,
            provider: req.provider.clone(),
            target: req.target.clone(),
            body: serde_json::to_vec(&req.request)
                .map_err(|e| ServiceError::bad_input(format!("request: {e}")))?,
            caller: p.caller().to_owned(),
            approved_by: req.approved_by.clone(),
            approval_ref: req.approval_ref.clone(),
            create_deadline: time(&req.create_deadline, "create_deadline")?,
            result_deadline: time(&req.result_deadline, "result_deadline")?,
            cancel_window: req
                .cancel_window
                .as_deref()
                .map(|d| {
                    jobtrail_core::when::parse_duration_within(
                        "cancel_window",
                        d,
                        Duration::from_secs(1),
                        jobtrail_core::operation::MAX_CANCEL_WINDOW,
                    )
                    .map_err(ServiceError::bad_input)
                })
                .transpose()?,
            supersedes: id(&req.supersedes, "supersedes")?,
            trace,
            resends_stored_request: false,
            edited_by: None,
            retried_by: None,
        };
        // A predecessor of another caller's is "not found", whatever else the request says. (An id
        // of another caller's is found out only after the request is validated, in `submit`: a bad
        // request is refused alike whether or not its id exists.)
        // Only the caller's own: a submit names its own caller, so the decide scope (which may act
        // on anyone's operation through a decision, `retry`) does not let a submit mark another
        // caller's failed operation superseded and shut its own retry out.
        if let Some(old) = submission.supersedes {
            let was = self.visible(p, &old.to_string()).await?;
            if was.caller != p.caller() {
                return Err(StoreError::NotFound(old).into());
            }
            // Abandoned before anyone settled whether its create made a job: a new create may be
            // a second paid job beside it, which only a person may accept (a retry decision). A
            // retry already linked to it is this same submission again, answered as ever.
            if was.state == State::Abandoned
                && was.remote_job_id.is_none()
                && was.superseded_by.is_none()
                && let Some(from) = self.store.abandoned_unsettled(old).await?
            {
                return Err(ServiceError::conflict(format!(
                    "{old} was abandoned in {from}, before anyone settled whether its create made a job at the provider: a new operation superseding it may start a second paid job beside that one, so only a person may retry it (a retry decision with job_may_exist, after looking in the provider's console)"
                ))
                .with_detail(serde_json::json!({ "abandoned_in": from })));
            }
        }
        Ok(submission)
    }

    pub async fn submit(
        &self,
        p: &Principal,
        req: SubmitRequest,
        trace: Option<TraceParent>,
    ) -> Result<SubmitResponse, ServiceError> {
        p.require(Scope::Submit)?;
        let now = self.deadline_clock([&req]).await?;
        let submission = self.submission(p, req, trace, now).await?;
        // The store answers an id that exists as "not found" if it is another caller's (neither
        // what it holds nor that it differs is revealed), a conflict if it is this caller's with
        // other terms.
        let s = self
            .store
            .submit_new(&submission, &self.terms, self.submit_limits())
            .await?;
        Ok(SubmitResponse {
            created: s.created,
            operation: OperationView::of(&s.operation),
        })
    }

    /// Submit many operations at once, all or none (one transaction). A refused item refuses the
    /// batch, and the error names it (`item N: …`, `detail.item`); nothing is written then.
    pub async fn submit_batch(
        &self,
        p: &Principal,
        reqs: Vec<SubmitRequest>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<SubmitResponse>, ServiceError> {
        p.require(Scope::Submit)?;
        if reqs.is_empty() || reqs.len() > MAX_BATCH {
            return Err(ServiceError::bad_input(format!(
                "a batch holds 1 to {MAX_BATCH} operations, got {}",
                reqs.len()
            )));
        }
        let item = |i: usize, e: ServiceError| ServiceError {
            message: format!("item {i}: {}", e.message),
            detail: Some(serde_json::json!({ "item": i, "detail": e.detail })),
            ..e
        };
        let now = self.deadline_clock(&reqs).await?;
        let mut submissions = Vec::with_capacity(reqs.len());
        for (i, req) in reqs.into_iter().enumerate() {
            submissions.push(
                self.submission(p, req, trace, now)
                    .await
                    .map_err(|e| item(i, e))?,
            );
        }
        let written = self
            .store
            .submit_new_batch(&submissions, &self.terms, self.submit_limits())
            .await
            .map_err(|(i, e)| match i {
                Some(i) => item(i, e.into()),
                // The batch as a whole (over the caller's cap, the database away), not one item.
                None => e.into(),
            })?;
        Ok(written
            .into_iter()
            .map(|s| SubmitResponse {
                created: s.created,
                operation: OperationView::of(&s.operation),
            })
            .collect())
    }

    /// The operation, if this principal may see it (another caller's is "not found": its existence
    /// is not revealed).
    async fn visible(&self, p: &Principal, id: &str) -> Result<OperationRecord, ServiceError> {
        let id = parse_id(id)?;
        // Without its request body: no door shows it, and a wait holds this for minutes.
        let op = self.store.get_shown(id).await?;
        if !p.sees_all() && op.caller != p.caller() {
            return Err(StoreError::NotFound(id).into());
        }
        Ok(op)
    }

    /// The operation, if this principal may act on it (cancel it, retry it): its own caller's, or
    /// any with the decide scope. Seeing every operation (audit) is not acting on it.
    async fn own(&self, p: &Principal, id: &str) -> Result<OperationRecord, ServiceError> {
        let op = self.visible(p, id).await?;
        if op.caller != p.caller() && !p.has(Scope::Decide) {
            return Err(ServiceError::forbidden(format!(
                "{} is another caller's operation: only its caller or a token with the decide scope may act on it",
                op.id
            )));
        }
        Ok(op)
    }

    pub async fn get(
        &self,
        p: &Principal,
        id: &str,
        timeline: Timeline,
    ) -> Result<OperationView, ServiceError> {
        p.require(Scope::Read)?;
        let op = self.visible(p, id).await?;
        let view = OperationView::of(&op);
        let before = match timeline {
            Timeline::Omit => return Ok(view),
            Timeline::Newest => None,
            Timeline::Before(seq) => Some(seq),
        };
        // One more than a page: whether earlier links exist, without counting them.
        let mut page = self
            .store
            .history_before(op.id, before, TIMELINE_PAGE + 1)
            .await?;
        let earlier = page.len() as i64 > TIMELINE_PAGE;
        if earlier {
            page.remove(0);
        }
        Ok(view.with_timeline(&page, earlier))
    }

    /// The operation's record, history and provider calls (the CLI's `show`).
    pub async fn evidence(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<
        (
            OperationRecord,
            Vec<jobtrail_store::HistoryRecord>,
            Vec<jobtrail_store::StoredCall>,
        ),
        ServiceError,
    > {
        p.require(Scope::Read)?;
        // The whole record, request included (`show --json` promises it), once it may be seen.
        let op = self.store.get(self.visible(p, id).await?.id).await?;
        let history = self.store.history(op.id).await?;
        let calls = self.store.calls(op.id).await?;
        Ok((op, history, calls))
    }

    /// The most of a filter's text: longer than any provider or caller name.
    const MAX_FILTER_BYTES: usize = 1024;

    pub async fn list(&self, p: &Principal, q: ListQuery) -> Result<OperationPage, ServiceError> {
        p.require(Scope::Read)?;
        filter_text("provider", q.provider.as_deref())?;
        filter_text("caller", q.caller.as_deref())?;
        let caller = match (&q.caller, p.sees_all()) {
            (Some(c), false) if c != p.caller() => {
                return Err(ServiceError::forbidden(
                    "this token sees only its own caller's operations",
                ));
            }
            (_, false) => Some(p.caller().to_owned()),
            (c, true) => c.clone(),
        };
        let state = q
            .state
            .as_deref()
            .map(|s| s.parse::<State>())
            .transpose()
            .map_err(|e| ServiceError::bad_input(format!("state: {e}")))?;
        let before = q
            .cursor
            .as_deref()
            .map(|c| {
                c.parse::<OperationId>()
                    .map_err(|_| ServiceError::bad_input("cursor: not a cursor this API gave out"))
            })
            .transpose()?;
        let limit = q.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(ServiceError::bad_input(format!(
                "limit: 1 to {MAX_PAGE}, got {limit}"
            )));
        }
        // PostgreSQL's timestamps start in 4713 BC, chrono's reach further: a time no operation
        // can have is the caller's mistake (400), not the database refusing (a 503, and a warning
        // logged, for every such request).
        for (name, at) in [
            ("created_from", q.created_from),
            ("created_before", q.created_before),
        ] {
            if at.is_some_and(|t| !(1..=9999).contains(&chrono::Datelike::year(&t))) {
                return Err(ServiceError::bad_input(format!(
                    "{name}: a time between the years 1 and 9999"
                )));
            }
        }
        let filter = ListFilter {
            state,
            provider: q.provider.clone(),
            caller,
            created_from: q.created_from,
            created_before: q.created_before,
            before,
        };
        // One more than the page: whether there is a next page, without a count.
        let page = self.store.list_page(&filter, i64::from(limit) + 1).await?;
        let mut ops = page.operations;
        let mut more = ops.len() > limit as usize;
        ops.truncate(limit as usize);
        let mut operations = Vec::with_capacity(ops.len());
        let mut bytes = 0;
        for op in &ops {
            let view = OperationView::of(op);
            let size = serde_json::to_vec(&view).map_or(0, |v| v.len());
            if !operations.is_empty() && bytes + size > PAGE_BYTES {
                more = true;
                break;
            }
            bytes += size;
            operations.push(view);
        }
        // Full (or cut by size): the next page starts below the last operation shown. Short,
        // because the page read as far as one page may: below the last one it read, which may be
        // past everything shown (an empty page with a cursor is not the end).
        let next_cursor = if more {
            operations.last().map(|o| o.id.clone())
        } else {
            page.scanned_past.map(|id| id.to_string())
        };
        Ok(OperationPage {
            operations,
            next_cursor,
        })
    }

    /// Wait until the operation's state differs from `seen` (default: its state now) or it is
    /// settled (finished or held for a person), at most `timeout` (capped at [`MAX_WAIT`]). Woken by
    /// the state channel, never by polling the row in a loop.
    pub async fn wait(
        &self,
        p: &Principal,
        id: &str,
        seen: Option<&str>,
        timeout: Duration,
    ) -> Result<WaitResponse, ServiceError> {
        p.require(Scope::Read)?;
        let _slot = self.wait_slot(p.caller())?;
        let seen = seen.map(operator::parse_seen).transpose()?;
        // Subscribe before the first read: a change between the two is not missed.
        let mut wake = self
            .watcher
            .get_or_init(|| watch::Watcher::start(self.store.clone()))
            .subscribe(parse_id(id)?);
        let op = self.visible(p, id).await?;
        // What the caller saw: a state, and with `@SEQ` the history position (so a state left and
        // come back to — observing, held, resumed, observing — counts as a change).
        let (seen, seen_seq) = seen.unwrap_or((op.state, None));
        let moved = |op: &OperationRecord| {
            op.state != seen || seen_seq.is_some_and(|q| op.history_seq != q)
        };
        let done =
            |op: &OperationRecord| moved(op) || op.state.is_terminal() || op.state.needs_human();
        if done(&op) {
            return Ok(WaitResponse {
                changed: moved(&op),
                timed_out: false,
                operation: OperationView::of(&op),
            });
        }
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
        // A wait may last minutes: its token is looked at again as often as the live tokens are
        // listed, and a wait whose token was revoked ends refused.
        let mut recheck = tokio::time::interval_at(
            tokio::time::Instant::now() + auth::LISTED_EVERY,
            auth::LISTED_EVERY,
        );
        loop {
            let woke = tokio::select! {
                woke = tokio::time::timeout_at(deadline, wake.changed()) => woke,
                _ = recheck.tick() => {
                    self.still_authenticated(p).await?;
                    continue;
                }
            };
            match woke {
                Err(_) => {
                    let op = self.store.get_shown(op.id).await?;
                    return Ok(WaitResponse {
                        changed: moved(&op),
                        timed_out: !done(&op),
                        operation: OperationView::of(&op),
                    });
                }
                Ok(()) => {
                    let now = self.store.get_shown(op.id).await?;
                    if done(&now) {
                        return Ok(WaitResponse {
                            changed: moved(&now),
                            timed_out: false,
                            operation: OperationView::of(&now),
                        });
                    }
                }
            }
        }
    }

    /// An agent's cancel; on `seen` (`STATE@SEQ`), a cancel on that view. Another caller's
    /// operation (the decide scope) is cancelled as a person cancels it: one held for a person
    /// only on the view seen, as `jobtrail-admin cancel --seen` does.
    pub async fn cancel(
        &self,
        p: &Principal,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> Result<CancelResponse, ServiceError> {
        match seen {
            Some(_) => self.cancel_as_seen(p, id, reason, seen).await,
            None => self.cancel_as(p, id, reason, None).await,
        }
    }

    /// A person's cancel (`jobtrail-admin cancel`) on the view `seen` (`STATE@SEQ`, or a bare
    /// state), checked under the row lock; an operation held for a person is refused without a
    /// whole `STATE@SEQ`. One pinned to another operation (`STATE@SEQ:HEAD`, its head not this
    /// one's) is refused as a decision's is: a cancel is sent to a job, and cannot be taken back.
    pub async fn cancel_as_seen(
        &self,
        p: &Principal,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> Result<CancelResponse, ServiceError> {
        let seen = seen
            .map(|s| operator::parse_seen_pinned(s).map(|v| (s, v)))
            .transpose()?;
        self.cancel_as(p, id, reason, Some(seen)).await
    }

    /// `person`: `Some(view)` for a person's cancel (the view as given, parsed), `None` for an
    /// agent's.
    async fn cancel_as(
        &self,
        p: &Principal,
        id: &str,
        reason: &str,
        person: Option<Option<GivenView<'_>>>,
    ) -> Result<CancelResponse, ServiceError> {
        p.require(Scope::Cancel)?;
        let op = self.own(p, id).await?;
        let req = jobtrail_core::CancelRequest::new(p.caller(), reason)
            .map_err(|e| ServiceError::bad_input(e.to_string()))?;
        if let Some(Some((given, (_, seq, head)))) = &person {
            operator::refuse_pasted(given, *seq, head.as_deref(), &op)?;
        }
        let person = person.map(|seen| seen.map(|(_, (state, seq, _))| (state, seq)));
        // Another caller's operation (the decide scope): a person's cancel.
        let person = match person {
            None if op.caller != p.caller() => Some(None),
            other => other,
        };
        let asked = match person {
            None => self.store.request_cancel(op.id, req).await,
            Some(seen) => self.store.request_cancel_as_seen(op.id, req, seen).await,
        };
        let applied = match asked {
            Ok(a) => a,
            Err(StoreError::Illegal { source, .. }) => {
                return Err(ServiceError::conflict(format!(
                    "cannot cancel {}: it is {} ({source})",
                    op.id, source.from
                )));
            }
            Err(e) => return Err(e.into()),
        };
        let rec = &applied.record;
        // A row's text (a writer login sets it), put into a note a person reads: shown escaped.
        let requested_by = rec
            .cancel_requested_by
            .as_deref()
            .map_or("someone".into(), jobtrail_core::text::visible);
        let note = match rec.state {
            // Asked again while the first request waits: nothing was written, and saying "noted"
            // would pass this one's reason off as recorded.
            State::CancelRequested | State::Cancelling if applied.transition.is_none() => format!(
                "a cancel was already requested by {requested_by}: nothing new was recorded (the first request stands); it is under way, and the operation is cancelled only when the provider confirms"
            ),
            _ if applied.transition.is_none() => format!(
                "a cancel was already requested by {requested_by}: nothing new was recorded (the first request stands); it is acted on as soon as the remote job id is known"
            ),
            State::Withdrawn => "withdrawn: no create can have reached the provider".to_owned(),
            State::CancelRequested => {
                "cancel requested: the lease owner sends one cancel call; cancelled only when the provider confirms".to_owned()
            }
            _ => "cancel noted: it is acted on as soon as the remote job id is known".to_owned(),
        };
        Ok(CancelResponse {
            note,
            operation: OperationView::of(rec),
        })
    }

    /// The validated result, as the history chain records it: bytes or a row changed behind
    /// jobtrail's back are refused, not served.
    pub async fn result(
        self: &Arc<Self>,
        p: &Principal,
        id: &str,
    ) -> Result<ResultBytes, ServiceError> {
        p.require(Scope::Read)?;
        let op = self.visible(p, id).await?;
        // An auditor verifies the evidence, which names the result's digest; the bytes themselves
        // (a customer's report, a payment's receipt) are its caller's and the operators', as the
        // auditor's database role never reads them either.
        if op.caller != p.caller() && !p.has(Scope::Decide) {
            return Err(ServiceError::forbidden(format!(
                "{} is another caller's operation: its result is served to its caller and to tokens with the decide scope, not to audit",
                op.id
            )));
        }
        // Not finished is not failed: an agent told "no result" of a job still running must not
        // take it for one that ended without one.
        if op.state != State::Succeeded {
            let kind = match op.state.is_terminal() {
                true => Kind::NotSucceeded,
                false => Kind::NotFinished,
            };
            return Err(ServiceError::new(
                kind,
                format!(
                    "{} is {}: there is no validated result ({})",
                    op.id,
                    op.state,
                    model::advice(op.state)
                ),
            ));
        }
        let chained = self.store.chained_result(op.id).await?;
        // Held whole before a byte is read, as long as the answer holds them: the result is read
        // into memory whole, so a server that serves one larger than it may hold is a server
        // killed for memory, every caller's waits and sessions with it.
        // The chain's size, not the row's: a writer's login can edit the row.
        let size = chained
            .size
            .or_else(|| op.result_size.and_then(|n| u64::try_from(n).ok()))
            .unwrap_or(0);
        let held = self.hold_result(p.caller(), usize::try_from(size).unwrap_or(usize::MAX))?;
        let (loc, sha) = (&chained.location, &chained.sha256);
        let bytes = jobtrail_worker::ResultStore::read_verified(&self.store, loc, sha)
            .await
            .map_err(|e| read_refused(op.id, loc, e))?;
        Ok(ResultBytes {
            bytes,
            sha256: chained.sha256,
            content_type: chained.content_type,
            held: Some(held),
        })
    }

    /// What each provider does and what a request to it needs.
    pub fn providers(&self, p: &Principal) -> ProviderList {
        let providers = self
            .registry
            .names()
            .filter_map(|n| self.registry.get(n))
            .map(|prov| {
                let c = prov.contract();
                let t = c.terms();
                ProviderView {
                    name: c.name.clone(),
                    description: c.description.clone(),
                    request_shape: match t.body {
                        jobtrail_core::operation::BodyShape::Object => "object".into(),
                        jobtrail_core::operation::BodyShape::Any => "any".into(),
                    },
                    request_schema: c.create.request_schema.as_ref().map(|s| s.document.clone()),
                    sensitive_fields: c.redact.clone(),
                    secrets: t
                        .secret_grants
                        .iter()
                        .filter(|(_, g)| g.allows(p.caller()))
                        .map(|(n, _)| n.clone())
                        .collect(),
                    at_most_once: t.idempotency != jobtrail_core::IdempotencyMode::None,
                    requires_approval: c.requires_approval,
                    max_request_bytes: t.max_body_bytes,
                    default_create_window_secs: t.default_create_window.as_secs(),
                    default_result_window_secs: t.default_result_window.as_secs(),
                    default_cancel_window_secs: t.default_cancel_window.as_secs(),
                }
            })
            .collect();
        ProviderList { providers }
    }
}

/// Why a validated result could not be served. Only bytes that are not the ones the chain
/// validated (or, kept in the database, are gone from it) are evidence that disagrees; a database
/// that could not be asked, or a result file this host cannot see (a worker's `--result-dir` not
/// mounted here), is unavailable. Paths and database errors stay in the server's log.
fn read_refused(
    id: OperationId,
    location: &str,
    e: jobtrail_worker::results::ReadError,
) -> ServiceError {
    use jobtrail_worker::results::ReadError;
    let kept_in_database = jobtrail_core::ResultBytes::parse_location(location).is_some();
    match e {
        ReadError::Database(e) => e.into(),
        ReadError::Missing(m) if !kept_in_database => {
            let mut err = ServiceError::new(
                Kind::Unavailable,
                format!("the result of {id} is not readable here: {m}"),
            );
            err.internal = true;
            err
        }
        ReadError::Missing(m) | ReadError::Altered(m) => {
            tracing::warn!(operation = %id, "result refused: {m}");
            ServiceError::new(
                Kind::Tampered,
                format!(
                    "the result of {id} is not the one its history validated (its bytes differ or are gone), so it is not served; jobtrail-admin audit verify names the break"
                ),
            )
        }
    }
}

fn parse_id(s: &str) -> Result<OperationId, ServiceError> {
    s.trim()
        .parse()
        .map_err(|e: jobtrail_core::ids::BadId| ServiceError::bad_input(e.to_string()))
}

/// Check a request against the contract's request schema. A granted secret named at a sensitive
/// field (`{"$secret": …}`) stands for a string the schema cannot see.
fn check_request(
    schema: &jsonschema::Validator,
    sensitive: &[String],
    request: &serde_json::Value,
) -> Result<(), ServiceError> {
    let mut seen = request.clone();
    // Sensitive fields holding a value of their own, not a secret reference: an error about them,
    // or about a value holding them, does not repeat what it judged.
    let mut literal = Vec::new();
    for ptr in sensitive {
        if let Some(v) = seen.pointer_mut(ptr) {
            if v.get("$secret").is_some() {
                *v = serde_json::Value::String("(secret)".into());
            } else {
                literal.push(ptr.as_str());
            }
        }
    }
    // `a` is `b` or lies under it, pointer segment by segment.
    let within = |a: &str, b: &str| {
        a.strip_prefix(b)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let problems: Vec<String> = schema
        .iter_errors(&seen)
        .take(10)
        .map(|e| {
            let at = e.instance_path().to_string();
            // A value is repeated only when short: the caller's megabytes are not echoed back
            // (once per error, in the message and again in its detail).
            let short = match e.instance().as_ref() {
                serde_json::Value::String(s) => s.len() <= SHOWN_VALUE_BYTES,
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => false,
                _ => true,
            };
            let said = if literal.iter().any(|s| within(s, &at) || within(&at, s)) {
                e.masked_with("(a sensitive value)").to_string()
            } else if !short {
                e.masked_with("(a value too long to repeat)").to_string()
            } else {
                e.to_string()
            };
            // Property names are the caller's too (an unexpected one is named): cut whatever said.
            format!(
                "{} at {:?}",
                jobtrail_core::ids::cut(&said, SHOWN_PROBLEM_CHARS),
                jobtrail_core::ids::shown(&at)
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ServiceError::bad_input(format!(
            "the request does not fit the provider's request schema: {}",
            problems.join("; ")
        ))
        .with_detail(serde_json::json!({ "schema_errors": problems })))
    }
}

/// The longest string value a schema error repeats.
const SHOWN_VALUE_BYTES: usize = 120;
/// The most of one schema error that is said.
const SHOWN_PROBLEM_CHARS: usize = 400;

/// The most operations one batch submit may hold.
pub const MAX_BATCH: usize = 1000;

/// A service acting for one principal: the [`Operations`] implementation over the database.
#[derive(Clone)]
pub struct Bound {
    pub service: Arc<Service>,
    pub principal: Principal,
}

/// The agent-facing operations, whether over the database or over the HTTP API.
pub trait Operations: Send + Sync {
    fn submit(
        &self,
        req: SubmitRequest,
        trace: Option<TraceParent>,
    ) -> impl Future<Output = Result<SubmitResponse, ServiceError>> + Send;
    /// Many submissions at once, all or none.
    fn submit_batch(
        &self,
        reqs: Vec<SubmitRequest>,
        trace: Option<TraceParent>,
    ) -> impl Future<Output = Result<Vec<SubmitResponse>, ServiceError>> + Send;
    fn get(
        &self,
        id: &str,
        timeline: Timeline,
    ) -> impl Future<Output = Result<OperationView, ServiceError>> + Send;
    fn list(
        &self,
        q: ListQuery,
    ) -> impl Future<Output = Result<OperationPage, ServiceError>> + Send;
    fn wait(
        &self,
        id: &str,
        seen: Option<&str>,
        timeout: Duration,
    ) -> impl Future<Output = Result<WaitResponse, ServiceError>> + Send;
    /// `seen`: the view the caller saw (`STATE@SEQ`), checked under the row lock; needed to
    /// cancel another caller's operation held for a person.
    fn cancel(
        &self,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> impl Future<Output = Result<CancelResponse, ServiceError>> + Send;
    fn result(&self, id: &str) -> impl Future<Output = Result<ResultBytes, ServiceError>> + Send;
    fn providers(&self) -> impl Future<Output = Result<ProviderList, ServiceError>> + Send;
    /// Refused if the token this door acts by was revoked (or expired) since it was authenticated:
    /// for work that spans many requests' worth of time on one authentication ([`wait_settled`]).
    fn still_authenticated(&self) -> impl Future<Output = Result<(), ServiceError>> + Send;
    /// Whether work on one authentication must call [`Operations::still_authenticated`] (a door
    /// whose every request is authenticated as it arrives need not).
    fn rests_on_one_authentication(&self) -> bool {
        true
    }
}

/// The answer to a request stopped at its bound (`limit`): unavailable, with when to come back.
/// The work is dropped there: a change it had committed stands, one it had not is not made.
pub fn stopped(limit: Duration) -> ServiceError {
    ServiceError::unavailable(format!(
        "the request did not finish within {limit:?} and was stopped; a change it had made \
         before then stands: a submit with the same id is safe to repeat, and read the \
         operation before repeating a cancel or decision (verifying every chain of a large \
         database is `jobtrail-admin audit verify --all`'s to do)",
    ))
    .with_detail(serde_json::json!({ "retry_after_secs": STOPPED_RETRY_SECS }))
}

/// A submit refused as unavailable (stopped at its bound, the database away) may have landed all
/// the same, under the id it was sent with. Where the door made that id up (`minted`; the agent
/// named none), the refusal names it, in the words and as `detail.operation_id`, to be sent again
/// with the same request: without it, the resend could start a second job.
pub fn maybe_submitted(e: ServiceError, minted: Option<String>) -> ServiceError {
    match minted {
        Some(id) => unsure(
            e,
            format!(
                "It may have been submitted all the same, under the id {id} made up for it: send it again with \"id\": \"{id}\" and the same request (never without it, which could start a second job)."
            ),
            ("operation_id", id.into()),
        ),
        None => e,
    }
}

/// As [`maybe_submitted`], for a batch some of whose items named no id: `ids` is every item's id
/// in order (given or made up), named as `operation_ids`, all to be sent again as they are.
pub fn maybe_submitted_batch(e: ServiceError, ids: Vec<String>, any_minted: bool) -> ServiceError {
    if !any_minted {
        return e;
    }
    unsure(
        e,
        "It may have been submitted all the same, under ids made up for the items that named none: send the batch again with each item's \"id\" set as operation_ids lists them, in order (never without, which could start second jobs).".to_owned(),
        ("operation_ids", ids.into()),
    )
}

fn unsure(
    mut e: ServiceError,
    note: String,
    (key, ids): (&str, serde_json::Value),
) -> ServiceError {
    if e.kind == Kind::Unavailable {
        e.note = Some(note);
        let mut detail = e.detail.take().unwrap_or_else(|| serde_json::json!({}));
        detail[key] = ids;
        e.detail = Some(detail);
    }
    e
}

impl Bound {
    /// `work`, stopped after the server's request bound and `more` (a wait's own timeout): a
    /// server's door that is no HTTP route (an MCP tool call) is bounded as the routes are, so a
    /// database gone silent on a connection holds no call, and what it holds, for ever.
    async fn within<T>(
        &self,
        more: Duration,
        work: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<T, ServiceError> {
        let Some(bound) = self.service.request_timeout() else {
            return work.await;
        };
        let limit = bound + more;
        match tokio::time::timeout(limit, work).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::warn!(caller = %self.principal.caller(), ?limit, "a call ran past its time bound and was stopped");
                Err(stopped(limit))
            }
        }
    }

    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<T, ServiceError> {
        self.within(Duration::ZERO, work).await
    }
}

impl Operations for Bound {
    async fn submit(
        &self,
        req: SubmitRequest,
        trace: Option<TraceParent>,
    ) -> Result<SubmitResponse, ServiceError> {
        self.bounded(self.service.submit(&self.principal, req, trace))
            .await
    }
    async fn submit_batch(
        &self,
        reqs: Vec<SubmitRequest>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<SubmitResponse>, ServiceError> {
        self.bounded(self.service.submit_batch(&self.principal, reqs, trace))
            .await
    }
    async fn get(&self, id: &str, timeline: Timeline) -> Result<OperationView, ServiceError> {
        self.bounded(self.service.get(&self.principal, id, timeline))
            .await
    }
    async fn list(&self, q: ListQuery) -> Result<OperationPage, ServiceError> {
        self.bounded(self.service.list(&self.principal, q)).await
    }
    async fn wait(
        &self,
        id: &str,
        seen: Option<&str>,
        timeout: Duration,
    ) -> Result<WaitResponse, ServiceError> {
        self.within(
            timeout.min(MAX_WAIT),
            self.service.wait(&self.principal, id, seen, timeout),
        )
        .await
    }
    async fn cancel(
        &self,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> Result<CancelResponse, ServiceError> {
        self.bounded(self.service.cancel(&self.principal, id, reason, seen))
            .await
    }
    async fn result(&self, id: &str) -> Result<ResultBytes, ServiceError> {
        self.bounded(self.service.result(&self.principal, id)).await
    }
    async fn providers(&self) -> Result<ProviderList, ServiceError> {
        Ok(self.service.providers(&self.principal))
    }
    async fn still_authenticated(&self) -> Result<(), ServiceError> {
        self.bounded(self.service.still_authenticated(&self.principal))
            .await
    }
}

/// Either door: the database (with credentials, for a principal) or the HTTP API (with a token).
/// The CLI and the MCP server hold one of these and do not care which.
#[derive(Clone)]
pub enum Door {
    Local(Bound),
    Remote(client::ApiClient),
}

impl Operations for Door {
    async fn submit(
        &self,
        req: SubmitRequest,
        trace: Option<TraceParent>,
    ) -> Result<SubmitResponse, ServiceError> {
        match self {
            Door::Local(b) => b.submit(req, trace).await,
            Door::Remote(c) => c.submit(req, trace).await,
        }
    }
    async fn submit_batch(
        &self,
        reqs: Vec<SubmitRequest>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<SubmitResponse>, ServiceError> {
        match self {
            Door::Local(b) => b.submit_batch(reqs, trace).await,
            Door::Remote(c) => c.submit_batch(reqs, trace).await,
        }
    }
    async fn get(&self, id: &str, timeline: Timeline) -> Result<OperationView, ServiceError> {
        match self {
            Door::Local(b) => b.get(id, timeline).await,
            Door::Remote(c) => c.get(id, timeline).await,
        }
    }
    async fn list(&self, q: ListQuery) -> Result<OperationPage, ServiceError> {
        match self {
            Door::Local(b) => b.list(q).await,
            Door::Remote(c) => c.list(q).await,
        }
    }
    async fn wait(
        &self,
        id: &str,
        seen: Option<&str>,
        timeout: Duration,
    ) -> Result<WaitResponse, ServiceError> {
        match self {
            Door::Local(b) => b.wait(id, seen, timeout).await,
            Door::Remote(c) => c.wait(id, seen, timeout).await,
        }
    }
    async fn cancel(
        &self,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> Result<CancelResponse, ServiceError> {
        match self {
            Door::Local(b) => b.cancel(id, reason, seen).await,
            Door::Remote(c) => c.cancel(id, reason, seen).await,
        }
    }
    async fn result(&self, id: &str) -> Result<ResultBytes, ServiceError> {
        match self {
            Door::Local(b) => b.result(id).await,
            Door::Remote(c) => c.result(id).await,
        }
    }
    async fn providers(&self) -> Result<ProviderList, ServiceError> {
        match self {
            Door::Local(b) => b.providers().await,
            Door::Remote(c) => c.providers().await,
        }
    }
    async fn still_authenticated(&self) -> Result<(), ServiceError> {
        match self {
            Door::Local(b) => b.still_authenticated().await,
            Door::Remote(c) => c.still_authenticated().await,
        }
    }
    fn rests_on_one_authentication(&self) -> bool {
        match self {
            Door::Local(b) => b.rests_on_one_authentication(),
            Door::Remote(c) => c.rests_on_one_authentication(),
        }
    }
}

/// Wait until the operation is settled (finished or held for a person) or `timeout` passes,
/// re-arming on each intermediate state change. Each step is one bounded, notification-woken wait.
/// The whole wait rests on one authentication: its token is looked at again as often as a single
/// wait's is (each step lasts at most that long), so a token revoked while the state moves on
/// every few seconds still ends the wait, refused, within that time.
pub async fn wait_settled(
    ops: &impl Operations,
    id: &str,
    timeout: Duration,
) -> Result<WaitResponse, ServiceError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut checked = tokio::time::Instant::now();
    let mut seen: Option<String> = None;
    loop {
        let one_authentication = ops.rests_on_one_authentication();
        if one_authentication && checked.elapsed() >= auth::LISTED_EVERY {
            ops.still_authenticated().await?;
            checked = tokio::time::Instant::now();
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let until_check = if one_authentication {
            auth::LISTED_EVERY.saturating_sub(checked.elapsed())
        } else {
            MAX_WAIT
        };
        let w = ops
            .wait(id, seen.as_deref(), left.min(MAX_WAIT).min(until_check))
            .await?;
        if w.operation.settled || left.is_zero() {
            return Ok(WaitResponse {
                timed_out: !w.operation.settled,
                ..w
            });
        }
        seen = Some(w.operation.state.clone());
    }
}

/// A list filter's text, refused before any database read when no stored value could match it: a
/// NUL (PostgreSQL refuses it in text: the read would fail as if the database were down) or text
/// longer than any name.
pub(crate) fn filter_text(name: &str, value: Option<&str>) -> Result<(), ServiceError> {
    match value {
        Some(v) if v.contains('\0') => Err(ServiceError::bad_input(format!(
            "{name}: holds the NUL character, which no {name} holds"
        ))),
        Some(v) if v.len() > Service::MAX_FILTER_BYTES => Err(ServiceError::bad_input(format!(
            "{name}: {} bytes, longer than any {name} ({} at most)",
            v.len(),
            Service::MAX_FILTER_BYTES
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_request;
    use serde_json::json;

    #[test]
    fn schema_errors_never_repeat_a_sensitive_fields_value() {
        let schema = jsonschema::validator_for(&json!({
            "type": "object",
            "properties": {
                "payment": {"type": "object", "properties": {"card_number": {"type": "string"}}},
                "card": {"type": "string"},
                "note": {"type": "string"}
            }
        }))
        .unwrap();
        let sensitive = ["/payment/card_number".to_owned(), "/card/pan".to_owned()];
        // The field itself of the wrong type, and a value holding one of the wrong type.
        let e = check_request(
            &schema,
            &sensitive,
            &json!({"payment": {"card_number": 4111111111111111_u64},
                    "card": {"pan": "5500000000000004"}, "note": 7}),
        )
        .unwrap_err();
        let said = format!("{} {}", e.message, e.detail.unwrap());
        assert!(!said.contains("4111111111111111"), "{said}");
        assert!(!said.contains("5500000000000004"), "{said}");
        assert!(said.contains("(a sensitive value)"), "{said}");
        assert!(
            said.contains("\"/payment/card_number\"") && said.contains("\"/card\""),
            "{said}"
        );
        // What is not sensitive is still shown, so the caller can mend it.
        assert!(said.contains("7 is not of type"), "{said}");
        // A secret reference is checked as the text it stands for.
        check_request(
            &schema,
            &sensitive,
            &json!({"payment": {"card_number": {"$secret": "card"}}}),
        )
        .unwrap();
    }

    /// A caller's megabytes are not echoed back: a long string value, a large object and a long
    /// unexpected property name each give an error of a few hundred bytes, while a short value is
    /// still shown so that the caller can mend it.
    #[test]
    fn schema_errors_never_repeat_a_long_value() {
        let schema = jsonschema::validator_for(&json!({
            "type": "object",
            "properties": {
                "note": {"type": "string", "maxLength": 10},
                "count": {"type": "integer"},
                "items": {"type": "array", "maxItems": 1}
            },
            "additionalProperties": false
        }))
        .unwrap();
        let long = "x".repeat(1 << 20);
        let e = check_request(
            &schema,
            &[],
            &json!({"note": long, "count": "seven", "items": vec![long.clone(); 4], long.clone(): 1}),
        )
        .unwrap_err();
        let said = format!("{} {}", e.message, e.detail.unwrap());
        assert!(said.len() < 8 * 1024, "{} bytes said", said.len());
        assert!(
            said.contains("(a value too long to repeat)"),
            "{}",
            jobtrail_core::ids::cut(&said, 500)
        );
        assert!(
            said.contains("\"seven\" is not of type"),
            "{}",
            jobtrail_core::ids::cut(&said, 500)
        );
    }
}
