//! # jobtrail-mcp
//!
//! jobtrail as MCP tools, so an agent starts, waits for and cancels paid remote work without a
//! polling loop in its prompt and without credentials for the provider or the database.
//!
//! * Tools: `submit_operation`, `get_operation`, `wait_operation` (bounded), `cancel_operation`,
//!   `get_result`, `list_operations`, `list_providers`. Never the operator decisions: approvals stay
//!   human. Over `/mcp` a token's `decide` scope is not used (a person's token configured in an
//!   agent's host would otherwise let the model approve its own submits as that person, or read
//!   every caller's operations); over stdio the API sees the token, so give agents none with it.
//! * MCP Tasks (the `io.modelcontextprotocol/tasks` extension, as rmcp implements it): a
//!   `submit_operation` call from a client that declares the extension answers with a task whose id
//!   is the operation id; `tasks/get` maps jobtrail's state to a task status (see [`task_of`]),
//!   `tasks/cancel` is a cancel request, and `tasks/list` (the 2025-11-25 method, kept for clients
//!   that use it) lists the caller's tasks. Tasks are operations: they live in PostgreSQL, survive a
//!   restart of the MCP server, and any instance serves them.
//! * Transports: stdio ([`Backend::Api`]: the server talks to jobtrail's HTTP API with a token, so the
//!   agent's machine holds nothing else), and Streamable HTTP inside the API server
//!   ([`Backend::Service`]: the caller comes from the request's bearer token).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use jobtrail_service::client::ApiClient;
use jobtrail_service::{
    Door, Kind, ListQuery, OperationView, Operations, Principal, Service, ServiceError,
    SubmitRequest, Timeline,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

/// Largest result returned inline by `get_result` (larger: fetch it over the HTTP API). An answer
/// carries it twice (as structured content and as its text, for clients without structured
/// output); the session keeps no answer once it is sent.
pub const MAX_INLINE_RESULT: usize = 1024 * 1024;

/// How long a result sent over MCP holds one of its caller's result turns (`--results-per-caller`,
/// as over HTTP) after it is answered where no HTTP door says when its answer's last byte has gone
/// (over `/mcp`, `jobtrail_api::require_bearer` holds them with the answer's body instead).
pub const ANSWER_KEPT: Duration = Duration::from_secs(10);
/// How often a client should poll `tasks/get`, while working and while held for a person.
const POLL_WORKING_MS: u64 = 1_000;
const POLL_HELD_MS: u64 = 30_000;
/// The JSON-RPC error code of a task whose operation ended without a result (server-defined range).
pub const OPERATION_FAILED: i32 = -32001;

/// Where the tools' answers come from.
#[derive(Clone)]
pub enum Backend {
    /// The database, for the caller the HTTP request's bearer token names (Streamable HTTP inside
    /// the API server).
    Service(Arc<Service>),
    /// jobtrail's HTTP API, with one token (stdio on the agent's machine).
    Api(ApiClient),
}

/// The MCP server.
#[derive(Clone)]
pub struct JobtrailMcp {
    backend: Backend,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperationRef {
    /// The operation id `submit_operation` returned.
    pub operation_id: String,
    /// Include the operation's history (get_operation only): its newest 200 links, oldest first.
    #[serde(default)]
    pub timeline: bool,
    /// With `timeline`: the links before this sequence number instead (the answer's
    /// `timeline_earlier` says when there are any).
    #[serde(default)]
    pub timeline_before: Option<i64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    pub operation_id: String,
    /// Seconds to wait at most (default 30, at most 300). Call again to wait longer.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Return as soon as the state is no longer this one (default: wait until the operation is
    /// settled: finished or held for a person).
    #[serde(default)]
    pub seen: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    pub operation_id: String,
    /// Why (recorded in the operation's history with your caller name).
    pub reason: String,
    /// The view you saw (`seen` in the operation's view, `STATE@SEQ:HEAD`): needed to cancel
    /// another caller's operation held for a person; a stale one, or another operation's, is
    /// refused.
    #[serde(default)]
    pub seen: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only operations in this state.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub provider: Option<String>,
    /// The `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

fn to_value<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// A service error as a tool result the agent reads (not a protocol error it never sees).
fn tool_error(e: ServiceError) -> CallToolResult {
    logged(&e);
    let mut v = serde_json::json!({
        "error": e.kind.as_str(),
        "message": e.shown(),
    });
    if let Some(d) = e.detail {
        v["detail"] = d;
    }
    CallToolResult::structured_error(v)
}

fn answer<T: serde::Serialize>(r: Result<T, ServiceError>) -> CallToolResult {
    match r {
        Ok(v) => CallToolResult::structured(to_value(&v)),
        Err(e) => tool_error(e),
    }
}

/// A task's view of an operation: the status rmcp's Tasks extension knows, and what is known.
///
/// | jobtrail | task |
/// | --- | --- |
/// | automated states (create_pending … cancelling) | `working`, the state and its advice as the message |
/// | held for a person (create_unresolved, contract_violation, cancellation_unconfirmed, result_timed_out, url_refused, result_stalled) | `input_required`, "held for a person: …" with the reason; no `inputRequests`: the input is a jobtrail operator's decision, which no MCP tool can make |
/// | succeeded | `completed`, with the validated result's description (fetch the bytes with `get_result`) |
/// | failed, result_unavailable, result_validation_failed, not_created | `failed`, a JSON-RPC error object whose `data` is the operation |
/// | cancelled, withdrawn, abandoned | `cancelled` |
pub fn task_of(op: &OperationView) -> DetailedTask {
    let state = op.state();
    let mut message = if op.needs_human {
        format!("held for a person: {}: {}", op.state, op.advice)
    } else {
        format!("{}: {}", op.state, op.advice)
    };
    if let Some(r) = &op.escalation_reason {
        message = format!("{message} ({r})");
    }
    let task = Task::new(
        op.id.clone(),
        TaskStatus::Working,
        op.created_at.to_rfc3339(),
        op.state_changed_at.to_rfc3339(),
    )
    .with_status_message(message.clone())
    .with_poll_interval_ms(if op.needs_human {
        POLL_HELD_MS
    } else {
        POLL_WORKING_MS
    });
    use jobtrail_core::State as S;
    let payload = match state {
        Some(S::Succeeded) => TaskPayload::Completed {
            result: as_object(to_value(&CallToolResult::structured(
                serde_json::json!({ "operation": op }),
            ))),
        },
        Some(S::Cancelled | S::Withdrawn | S::Abandoned) => TaskPayload::Cancelled,
        Some(s) if s.is_terminal() => TaskPayload::Failed {
            error: as_object(serde_json::json!({
                "code": OPERATION_FAILED,
                "message": message,
                "data": { "operation": op },
            })),
        },
        _ if op.needs_human => TaskPayload::InputRequired {
            input_requests: Default::default(),
        },
        _ => TaskPayload::Working,
    };
    DetailedTask::new(task, payload)
}

/// A task as `tasks/list` answers it: the extension's names (`ttlMs`, `pollIntervalMs`) and, for
/// the clients of MCP 2025-11-25 that call `tasks/list`, that revision's (`ttl`, required, null for
/// unlimited; `pollInterval`).
fn listed(task: Task) -> serde_json::Value {
    let mut v = to_value(&task);
    v["ttl"] = task.ttl_ms.into();
    if let Some(ms) = task.poll_interval_ms {
        v["pollInterval"] = ms.into();
    }
    v
}

fn as_object(v: serde_json::Value) -> JsonObject {
    match v {
        serde_json::Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

/// Every refusal a tool answers is counted as the HTTP routes count theirs (by kind, in
/// `jobtrail_api_problems_total`): an agent refused over MCP is as visible to an operator as one
/// refused over HTTP. An error about our insides is logged here and never shown to the agent (see
/// [`ServiceError::shown`]).
fn logged(e: &ServiceError) {
    metrics::counter!("jobtrail_api_problems_total", "kind" => e.kind.as_str()).increment(1);
    if e.internal {
        tracing::warn!(kind = e.kind.as_str(), detail = %e.message, "MCP request failed");
    }
}

/// A service error as a JSON-RPC error (the task methods, which have no tool result to carry it).
/// Its `data` says what a tool's error says: the kind (`rate-limited`, `not-found`, …) and the
/// details beside it (`retry_after_secs`, a stale view's `current`), so a client can tell "slow
/// down" from "broken" without reading the message.
fn mcp_error(e: ServiceError) -> McpError {
    logged(&e);
    let message = e.shown();
    let mut data = serde_json::json!({ "error": e.kind.as_str() });
    if let Some(serde_json::Value::Object(detail)) = e.detail {
        for (k, v) in detail {
            data[k.as_str()] = v;
        }
    }
    match e.kind {
        Kind::NotFound => {
            McpError::invalid_params("Failed to retrieve task: Task not found", Some(data))
        }
        Kind::BadInput | Kind::Conflict => McpError::invalid_params(message, Some(data)),
        Kind::Unauthenticated | Kind::Forbidden => McpError::invalid_request(message, Some(data)),
        _ => McpError::internal_error(message, Some(data)),
    }
}

/// At most this much of rmcp's own refusal of a tool call is sent: it quotes what it refused (an
/// argument that does not deserialize, an unknown argument's name), which may be megabytes long.
const SHOWN_ERROR_CHARS: usize = 300;

/// A tool call's answer as sent. rmcp answers arguments that do not deserialize itself, with a
/// tool error whose text quotes them: that becomes a `bad-input` error as the tools' own are
/// (structured, counted, its message cut to [`SHOWN_ERROR_CHARS`]). A protocol error is cut alike.
fn as_sent(answer: Result<CallToolResponse, McpError>) -> Result<CallToolResponse, McpError> {
    let cut = |text: &str| jobtrail_core::ids::cut(text, SHOWN_ERROR_CHARS);
    match answer {
        Ok(CallToolResponse::Complete(r))
            if r.is_error == Some(true) && r.structured_content.is_none() =>
        {
            let said = r
                .content
                .iter()
                .find_map(|c| c.as_text())
                .map(|t| cut(&t.text))
                .unwrap_or_else(|| "the tool call's arguments were refused".into());
            Ok(tool_error(ServiceError::bad_input(said)).into())
        }
        Err(mut e) => {
            if e.message.chars().nth(SHOWN_ERROR_CHARS).is_some() {
                e.message = cut(&e.message).into();
            }
            Err(e)
        }
        answer => answer,
    }
}

/// The caller's trace, which the operation's provider calls then join: the W3C `traceparent` in
/// the call's `_meta` (MCP SEP-414: it names the tool call's own span), else the HTTP request's
/// `traceparent` header (Streamable HTTP). One that is not valid is ignored, as the W3C spec asks:
/// the operation then starts a trace of its own.
fn caller_trace(ctx: &RequestContext<RoleServer>) -> Option<jobtrail_core::TraceParent> {
    let from = |v: &str| {
        let mut h = http::HeaderMap::new();
        h.insert("traceparent", http::HeaderValue::from_str(v).ok()?);
        jobtrail_provider::wire::extract_trace(&h)
    };
    ctx.meta.get_traceparent().and_then(from).or_else(|| {
        let parts = ctx.extensions.get::<http::request::Parts>()?;
        jobtrail_provider::wire::extract_trace(&parts.headers)
    })
}

#[tool_router]
impl JobtrailMcp {
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    /// The operations for this request's caller.
    fn ops(&self, ctx: &RequestContext<RoleServer>) -> Result<Door, ServiceError> {
        match &self.backend {
            Backend::Api(a) => Ok(Door::Remote(a.clone())),
            Backend::Service(s) => {
                let principal = ctx
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|p| p.extensions.get::<Principal>())
                    .cloned()
                    .ok_or_else(|| {
                        ServiceError::new(Kind::Unauthenticated, "no bearer token on this session")
                    })?
                    // Approvals stay human: an agent's door never decides.
                    .without(jobtrail_service::Scope::Decide);
                Ok(Door::Local(s.bind(principal)))
            }
        }
    }

    #[tool(
        description = "Start a remote asynchronous job at a provider, on your behalf, without you holding its credentials. Returns at once with the operation (and, for clients with MCP Tasks, a task whose id is the operation id). Name your own `id` (op_<ULID>) so that a retried call never starts a second job: the same id with the same request returns the existing operation. Then use wait_operation (or tasks/get) and get_result. See list_providers for what each provider needs.",
        annotations(
            destructive_hint = true,
            // Only with an `id` of the caller's own: without one, each call starts a new job.
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn submit_operation(
        &self,
        Parameters(req): Parameters<SubmitRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let ops = match self.ops(&ctx) {
            Ok(o) => o,
            Err(e) => return Ok(tool_error(e).into()),
        };
        // An id of our own when the agent gave none (as the CLI makes one): a submit stopped at its
        // time bound, or whose answer is lost, may have landed, and is sent again safely only
        // under the id it was sent with, which the refusal names.
        let mut req = req;
        let minted = match &req.id {
            Some(_) => None,
            None => {
                let id = jobtrail_core::OperationId::fresh().to_string();
                req.id = Some(id.clone());
                Some(id)
            }
        };
        let r = match ops.submit(req, caller_trace(&ctx)).await {
            Ok(r) => r,
            Err(e) => return Ok(tool_error(jobtrail_service::maybe_submitted(e, minted)).into()),
        };
        if ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            return Ok(CallToolResponse::Task(CreateTaskResult::new(
                task_of(&r.operation).task,
            )));
        }
        Ok(CallToolResult::structured(to_value(&r)).into())
    }

    #[tool(
        description = "What jobtrail knows about an operation, and what it does not: its state, what the state means, and what to do now (`advice`). A state like create_unknown means the provider may or may not have created the job: do not submit again, wait.",
        annotations(read_only_hint = true)
    )]
    async fn get_operation(
        &self,
        Parameters(a): Parameters<OperationRef>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        match self.ops(&ctx) {
            Ok(ops) => answer(match Timeline::of(a.timeline, a.timeline_before) {
                Ok(t) => ops.get(&a.operation_id, t).await,
                Err(e) => Err(e),
            }),
            Err(e) => tool_error(e),
        }
    }

    #[tool(
        description = "Wait (without polling) until the operation is settled — finished, or held for a person — or its state leaves `seen`, at most `timeout_secs` (default 30, at most 300). `timed_out: true` means nothing changed yet: call it again.",
        annotations(read_only_hint = true)
    )]
    async fn wait_operation(
        &self,
        Parameters(a): Parameters<WaitArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ops = match self.ops(&ctx) {
            Ok(o) => o,
            Err(e) => return tool_error(e),
        };
        let timeout =
            Duration::from_secs(a.timeout_secs.unwrap_or(30)).min(jobtrail_service::MAX_WAIT);
        match &a.seen {
            Some(seen) => answer(ops.wait(&a.operation_id, Some(seen), timeout).await),
            None => answer(jobtrail_service::wait_settled(&ops, &a.operation_id, timeout).await),
        }
    }

    #[tool(
        description = "Ask to cancel an operation. Recorded at once with your reason; the operation is cancelled only when the provider confirms (or withdrawn if nothing was sent yet). The job may still finish first: wait_operation tells.",
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn cancel_operation(
        &self,
        Parameters(a): Parameters<CancelArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        match self.ops(&ctx) {
            Ok(ops) => answer(
                ops.cancel(&a.operation_id, &a.reason, a.seen.as_deref())
                    .await,
            ),
            Err(e) => tool_error(e),
        }
    }

    #[tool(
        description = "The validated result of a succeeded operation (of one not finished yet: the error `not-finished`; wait for it first), exactly as recorded (its sha256 is checked against the evidence chain). Text results come as `text`, others as `base64`; one over 1 MiB is refused here (fetch it over the HTTP API). Each call holds one of your result turns until its answer has been sent.",
        annotations(read_only_hint = true)
    )]
    async fn get_result(
        &self,
        Parameters(a): Parameters<OperationRef>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let ops = match self.ops(&ctx) {
            Ok(o) => o,
            Err(e) => return tool_error(e),
        };
        // One of the caller's result turns, as over HTTP, held while the answer is built and for
        // ANSWER_KEPT after, as it is sent (over stdio the API's own route holds one).
        let turn = match &ops {
            Door::Local(b) => match b.service.result_slot(&b.principal) {
                Ok(turn) => Some(turn),
                Err(e) => return tool_error(e),
            },
            Door::Remote(_) => None,
        };
        let (answer, held) = Self::result_answer(&ops, &a.operation_id).await;
        let Some(turn) = turn else {
            return answer;
        };
        // What is held is the answer as it is sent, not the result: a tool result carries the
        // value twice (structured, and as JSON text, escaped once more in the message), so text
        // of quotes or control characters grows many times over.
        let (answer, held) = match (&ops, held) {
            (Door::Local(b), Some(held)) => {
                let sent = serde_json::to_vec(&answer).map_or(0, |v| v.len());
                drop(held);
                match b.service.hold_result(b.principal.caller(), sent) {
                    Ok(whole) => (answer, Some(whole)),
                    Err(e) => return tool_error(e),
                }
            }
            (_, held) => (answer, held),
        };
        // Held until the answer's last byte has gone (the HTTP door drops it with the answer's
        // body); where no door says when, for ANSWER_KEPT.
        match ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<jobtrail_service::HeldUntilSent>())
        {
            Some(until_sent) => until_sent.keep((turn, held)),
            None => {
                tokio::spawn(async move {
                    tokio::time::sleep(ANSWER_KEPT).await;
                    drop((turn, held));
                });
            }
        }
        answer
    }

    /// The answer, and the bytes it holds against the server's bound (a local door's).
    async fn result_answer(
        ops: &Door,
        operation_id: &str,
    ) -> (CallToolResult, Option<jobtrail_service::Held>) {
        // The size is known before any byte is read: a result too large for a tool result is
        // refused without loading it (up to a store's whole limit) into this process.
        let too_large = |size: usize| {
            tool_error(ServiceError::new(
                Kind::TooLarge,
                format!(
                    "the result is {size} bytes, more than a tool result carries ({MAX_INLINE_RESULT}); fetch it with GET /v1/operations/{}/result",
                    operation_id
                ),
            ))
        };
        if let Ok(view) = ops.get(operation_id, Timeline::Omit).await
            && let Some(size) = view.result.as_ref().and_then(|r| r.size)
            && usize::try_from(size).is_ok_and(|n| n > MAX_INLINE_RESULT)
        {
            return (too_large(size as usize), None);
        }
        match ops.result(operation_id).await {
            Ok(r) if r.bytes.len() > MAX_INLINE_RESULT => (too_large(r.bytes.len()), None),
            Ok(mut r) => {
                let held = r.held.take();
                let mut v = serde_json::json!({
                    "operation_id": operation_id,
                    "sha256": r.sha256,
                    "size": r.bytes.len(),
                    "content_type": r.content_type,
                });
                match String::from_utf8(r.bytes) {
                    Ok(text) => v["text"] = text.into(),
                    Err(e) => {
                        v["base64"] = base64::engine::general_purpose::STANDARD
                            .encode(e.into_bytes())
                            .into()
                    }
                }
                (CallToolResult::structured(v), held)
            }
            Err(e) => (tool_error(e), None),
        }
    }

    #[tool(
        description = "The operations your token may read, newest first: your own (a token that may audit reads every caller's, each naming its `caller`), optionally filtered by state or provider; pass `next_cursor` back as `cursor` for the next page.",
        annotations(read_only_hint = true)
    )]
    async fn list_operations(
        &self,
        Parameters(a): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        match self.ops(&ctx) {
            Ok(ops) => answer(
                ops.list(ListQuery {
                    state: a.state,
                    provider: a.provider,
                    cursor: a.cursor,
                    limit: a.limit,
                    ..ListQuery::default()
                })
                .await,
            ),
            Err(e) => tool_error(e),
        }
    }

    #[tool(
        description = "The providers you can submit to: what each does, the request shape (and JSON Schema when the contract gives one), fields that take secrets (name a granted secret as {\"$secret\": \"name\"}, never the value), whether creation is at-most-once, and whether a person must approve.",
        annotations(read_only_hint = true)
    )]
    async fn list_providers(
        &self,
        Parameters(_): Parameters<NoArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        match self.ops(&ctx) {
            Ok(ops) => answer(ops.providers().await),
            Err(e) => tool_error(e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for JobtrailMcp {
    /// As `tool_handler` writes it, with rmcp's refusals answered as ours (see [`as_sent`]).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        as_sent(self.tool_router.call(tcc).await)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("jobtrail", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "jobtrail runs paid, irreversible remote jobs for you and keeps the evidence. Submit with \
             submit_operation (name your own id so a retry is harmless), then wait_operation until it \
             is settled, then get_result. Never submit again because a state is uncertain: \
             create_unknown means we do not yet know whether the job exists. States held for a \
             person are decided by an operator, not by you.",
        )
    }

    async fn get_task(
        &self,
        p: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let ops = self.ops(&ctx).map_err(mcp_error)?;
        let op = ops
            .get(&p.task_id, Timeline::Omit)
            .await
            .map_err(mcp_error)?;
        Ok(GetTaskResult::new(task_of(&op)))
    }

    async fn update_task(
        &self,
        p: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // jobtrail never asks the client for input (people decide through jobtrail-admin): the task
        // must exist; its answers are ignored, as the extension asks for keys never issued.
        let ops = self.ops(&ctx).map_err(mcp_error)?;
        ops.get(&p.task_id, Timeline::Omit)
            .await
            .map_err(mcp_error)?;
        Ok(())
    }

    async fn cancel_task(
        &self,
        p: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // A cancel as the cancel tool makes it (the cancel scope, not read): a task already
        // terminal is refused with -32602, as the Tasks extension asks, and nothing is written.
        let ops = self.ops(&ctx).map_err(mcp_error)?;
        ops.cancel(&p.task_id, "tasks/cancel from the MCP client", None)
            .await
            .map_err(mcp_error)?;
        Ok(())
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if request.method != "tasks/list" {
            return Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        }
        let cursor = match request.params.as_ref().and_then(|p| p.get("cursor")) {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(c)) => Some(c.clone()),
            // Not ignored: listing from the start again would loop a client for good.
            Some(_) => {
                return Err(McpError::invalid_params(
                    "invalid cursor",
                    Some(serde_json::json!({ "error": "bad-input" })),
                ));
            }
        };
        let ops = self.ops(&ctx).map_err(mcp_error)?;
        let page = ops
            .list(ListQuery {
                cursor,
                ..ListQuery::default()
            })
            .await
            .map_err(|e| match e.kind {
                Kind::BadInput => McpError::invalid_params(
                    "invalid cursor",
                    Some(serde_json::json!({ "error": "bad-input" })),
                ),
                _ => mcp_error(e),
            })?;
        let tasks: Vec<serde_json::Value> = page
            .operations
            .iter()
            .map(|o| listed(task_of(o).task))
            .collect();
        let mut v = serde_json::json!({ "tasks": tasks });
        if let Some(c) = page.next_cursor {
            v["nextCursor"] = c.into();
        }
        Ok(CustomResult(v))
    }
}

/// Serve over stdio until the client goes away.
pub async fn serve_stdio(backend: Backend) -> Result<(), String> {
    serve_lines(backend, tokio::io::stdin(), tokio::io::stdout()).await
}

/// The longest message read from stdio, as rmcp's own line limit (what is longer it would drop).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// MCP over newline-delimited JSON-RPC. Each message is checked before rmcp reads it, as `/mcp`
/// checks a body: two equal keys or an inexact number are refused with a JSON-RPC error naming the
/// message's id (rmcp's parser takes the last key and rounds the number, so
/// `{"provider": "a", "provider": "b"}` would start a job other than the one a reader of the call
/// saw). A message longer than [`MAX_LINE_BYTES`] is dropped unread, as rmcp drops one, and so is
/// a refused notification (no id). A refused message whose id cannot be read (given twice) is
/// answered with a null id, as JSON-RPC answers one. What is not JSON at all goes on to
/// rmcp, which answers it.
async fn serve_lines(
    backend: Backend,
    input: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    mut output: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
) -> Result<(), String> {
    use rmcp::ServiceExt;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (mut to_rmcp, rmcp_in) = tokio::io::duplex(64 * 1024);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(64 * 1024);
    let (refuse, mut refusals) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reader = tokio::spawn(async move {
        let mut input = tokio::io::BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let refusal = if line.len() > MAX_LINE_BYTES && line.last() != Some(&b'\n') {
                // Skip the rest of the message, bounded by the reader: never held whole.
                loop {
                    let mut rest = Vec::new();
                    match (&mut input)
                        .take(MAX_LINE_BYTES as u64)
                        .read_until(b'\n', &mut rest)
                        .await
                    {
                        Ok(0) | Err(_) => break,
                        Ok(_) if rest.last() == Some(&b'\n') => break,
                        Ok(_) => {}
                    }
                }
                Some((None, format!("message longer than {MAX_LINE_BYTES} bytes")))
            } else {
                refused(&line)
            };
            match refusal {
                None => {
                    if to_rmcp.write_all(&line).await.is_err() {
                        break;
                    }
                }
                // A notification (no id) cannot be answered: it is dropped.
                Some((None, why)) => {
                    tracing::warn!("MCP message over stdio refused: {why}");
                }
                Some((Some(id), why)) => {
                    let mut answer = serde_json::to_vec(&serde_json::json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": {"code": -32602, "message": why},
                    }))
                    .unwrap_or_default();
                    answer.push(b'\n');
                    if refuse.send(answer).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `to_rmcp` ends rmcp's input: the session ends as it would at stdin's end.
    });
    let writer = tokio::spawn(async move {
        let mut from_rmcp = tokio::io::BufReader::new(from_rmcp);
        // rmcp's line as read so far: `read_until` cancelled by a refusal keeps what it read in
        // here, and the next read goes on from there (never a line cut in two).
        let mut rmcp_line = Vec::new();
        let (mut rmcp_open, mut refusals_open) = (true, true);
        while rmcp_open || refusals_open {
            let out = tokio::select! {
                read = from_rmcp.read_until(b'\n', &mut rmcp_line), if rmcp_open => {
                    if matches!(read, Ok(0) | Err(_)) {
                        rmcp_open = false;
                    }
                    // A whole line, or what is left at rmcp's end.
                    if rmcp_line.last() != Some(&b'\n') && rmcp_open {
                        continue;
                    }
                    std::mem::take(&mut rmcp_line)
                }
                answer = refusals.recv(), if refusals_open => match answer {
                    Some(a) => a,
                    None => {
                        refusals_open = false;
                        continue;
                    }
                },
            };
            if !out.is_empty()
                && (output.write_all(&out).await.is_err() || output.flush().await.is_err())
            {
                break;
            }
        }
    });
    let session = async {
        let running = JobtrailMcp::new(backend)
            .serve((rmcp_in, rmcp_out))
            .await
            .map_err(|e| format!("MCP session: {e}"))?;
        running
            .waiting()
            .await
            .map_err(|e| format!("MCP session: {e}"))?;
        Ok::<_, String>(())
    };
    let ended = session.await;
    reader.abort();
    let _ = writer.await;
    ended
}

/// Why a message read over stdio is refused, with the id to answer it under (`None` for a
/// notification, which is not answered; `Null` for an id that cannot be read, as JSON-RPC answers
/// a request whose id it could not tell), or `None` to pass it on.
fn refused(line: &[u8]) -> Option<(Option<serde_json::Value>, String)> {
    // A byte-order mark first is read past by rmcp (RFC 8259 §8.1 lets a parser ignore it), so
    // what follows it is what must be checked.
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    let text = line.strip_prefix(BOM).unwrap_or(line).trim_ascii();
    if text.is_empty() {
        return None;
    }
    let e = jobtrail_core::json::parse_exact(text).err()?;
    // Not JSON at all: rmcp answers that itself. (Read without building it: a refused message may
    // be one too large to parse.)
    serde_json::from_slice::<serde::de::IgnoredAny>(text).ok()?;
    #[derive(serde::Deserialize)]
    struct Id {
        id: Option<serde_json::Value>,
    }
    let id = match serde_json::from_slice::<Id>(text) {
        Ok(m) => m.id,
        // The id given twice (or the message not an object): a request whose id is unknown.
        Err(_) => Some(serde_json::Value::Null),
    };
    Some((id, format!("refused: {}", e.message)))
}

/// MCP sessions a caller may hold open at once over Streamable HTTP by default (each is a task and
/// its channels until the client closes it or it idles for 5 minutes).
pub const SESSIONS_PER_CALLER: u32 = 32;

/// `/mcp`: MCP over Streamable HTTP for the API server. Requests must reach it authenticated (the
/// [`Principal`] in their extensions: `jobtrail_api::require_bearer`); a caller holds at most
/// `sessions_per_caller` sessions, open or opening, past which an `initialize` is refused with 429
/// `rate-limited`.
pub fn http_router(
    service: Arc<Service>,
    shutdown: tokio_util::sync::CancellationToken,
    allowed_hosts: Vec<String>,
    sessions_per_caller: usize,
) -> axum::Router {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    // The HTTP API's limit: a request a provider accepts is never refused only for its door.
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_max_request_body_bytes(jobtrail_service::MAX_REQUEST_BYTES);
    // Named hosts are allowed besides loopback (rmcp's default list), not instead of it: a local
    // client keeps working when the server is also published under a name.
    if !allowed_hosts.is_empty() {
        let hosts: Vec<String> = config
            .allowed_hosts
            .iter()
            .cloned()
            .chain(allowed_hosts)
            .collect();
        config = config.with_allowed_hosts(hosts);
    }
    let mut manager = LocalSessionManager::default();
    // No answer is kept for a resume once its stream is complete (rmcp's default keeps one 60 s,
    // and only drops it on the session's next message; an idle session lives 5 minutes): a
    // client whose stream is lost calls again. Tested by `a_session_keeps_no_answer_it_has_sent`.
    manager.session_config.completed_cache_ttl = Duration::ZERO;
    let manager = Arc::new(manager);
    let mcp = StreamableHttpService::new(
        move || Ok(JobtrailMcp::new(Backend::Service(service.clone()))),
        manager.clone(),
        config,
    );
    let limit = SessionLimit {
        manager,
        per_caller: sessions_per_caller,
        open: Arc::default(),
    };
    axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(limit, limit_sessions))
}

/// The sessions each caller opened that may still be open (pruned against the session manager's
/// own table, which drops a session when it closes or idles out), and the openings in flight.
#[derive(Clone)]
struct SessionLimit {
    manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    per_caller: usize,
    open: Arc<std::sync::Mutex<std::collections::HashMap<String, Held>>>,
}

#[derive(Default)]
struct Held {
    sessions: Vec<Arc<str>>,
    opening: usize,
}

impl SessionLimit {
    /// The session a response opened, if any, as `caller`'s.
    fn record(&self, caller: &str, response: &axum::response::Response) {
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            let mut held = self.held();
            let sessions = &mut held.entry(caller.to_owned()).or_default().sessions;
            if !sessions.iter().any(|s| &**s == id) {
                sessions.push(Arc::from(id));
            }
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Held>> {
        // Every change is one push or one counter: a panic while holding the lock leaves it whole.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An opening in flight, counted against its caller until it ends (a cancelled request too).
struct Opening {
    limit: SessionLimit,
    caller: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        if let Some(h) = self.limit.held().get_mut(&self.caller) {
            h.opening = h.opening.saturating_sub(1);
        }
    }
}

/// Whether `body` may be an MCP `initialize`: the one request that opens a session (others without
/// a session id are stateless, or refused by rmcp). Read as rmcp reads it (an escaped
/// `"initializ\u0065"` is `initialize` too); what is not one JSON object naming another method
/// counts as an opening, so the count never depends on parsing the body differently from rmcp.
fn initializes(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Message {
        method: Option<String>,
    }
    serde_json::from_slice::<Message>(body)
        .map_or(true, |m| m.method.as_deref() == Some("initialize"))
}

async fn limit_sessions(
    axum::extract::State(l): axum::extract::State<SessionLimit>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    const SESSION: &str = "mcp-session-id";
    // A POST without a usable session id (rmcp reads a header that is not text as none) may open
    // one; only an `initialize` does, which its body says.
    let unnamed = req
        .headers()
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .is_none();
    let caller = req
        .extensions()
        .get::<Principal>()
        .map(|p| p.caller().to_owned());
    // A session is its opener's: another caller's id (read, resumed with Last-Event-ID, closed)
    // is no session to this one.
    if let (Some(caller), Some(id)) = (
        &caller,
        req.headers().get(SESSION).and_then(|v| v.to_str().ok()),
    ) && !l
        .held()
        .get(caller)
        .is_some_and(|h| h.sessions.iter().any(|s| &**s == id))
    {
        return jobtrail_api::Problem::new(Kind::NotFound, "no such MCP session for this caller")
            .into_response();
    }
    let (Some(caller), true) = (caller, req.method() == http::Method::POST && unnamed) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, jobtrail_service::MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return jobtrail_api::Problem::new(
                Kind::TooLarge,
                format!(
                    "an MCP request is at most {} bytes",
                    jobtrail_service::MAX_REQUEST_BYTES
                ),
            )
            .into_response();
        }
    };
    let opens = initializes(&body);
    let req = axum::extract::Request::from_parts(parts, axum::body::Body::from(body));
    if !opens {
        let response = next.run(req).await;
        // Whatever opened a session anyway is counted from now on.
        l.record(&caller, &response);
        return response;
    }
    // Counted before it is served (sessions held and openings in flight), so openings sent at once
    // cannot all pass a count of zero.
    let _opening = {
        let live = l.manager.sessions.read().await;
        let mut open = l.held();
        open.retain(|_, h| {
            h.sessions.retain(|id| live.contains_key(id));
            !h.sessions.is_empty() || h.opening > 0
        });
        let h = open.entry(caller.clone()).or_default();
        let held = h.sessions.len() + h.opening;
        if held >= l.per_caller {
            return jobtrail_api::Problem(ServiceError::rate_limited(
                format!(
                    "caller {caller} holds {held} MCP sessions open, the most it may: close one (DELETE /mcp with its Mcp-Session-Id) or let one idle out (5 minutes)"
                ),
                60,
            ))
            .into_response();
        }
        h.opening += 1;
        Opening {
            limit: l.clone(),
            caller: caller.clone(),
        }
    };
    let response = next.run(req).await;
    l.record(&caller, &response);
    response
}
