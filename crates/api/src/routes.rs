//! The routes: each one parses, calls the service, and renders. No domain logic here.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jobtrail_service::*;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::deadline::Minted;
use crate::problem::{PROBLEM_JSON, Problem, ProblemDoc};
use crate::{AppState, Caller};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    // Every route but wait is bounded by the server's request bound; a wait by its own timeout
    // besides.
    let bounded = OpenApiRouter::new()
        .routes(routes!(submit, list))
        .routes(routes!(submit_batch))
        .routes(routes!(get_operation))
        .routes(routes!(cancel))
        .routes(routes!(result))
        .routes(routes!(providers))
        .routes(routes!(escalations))
        .routes(routes!(decide))
        .routes(routes!(verify))
        // A webhook is unauthenticated until verified: its body is read by the handler, only for a
        // provider that takes webhooks, at most 256 KiB, a bounded number at once.
        .routes(routes!(crate::webhook::receive))
        .layer(axum::middleware::from_fn(crate::deadline::route));
    OpenApiRouter::new()
        .merge(bounded)
        .routes(routes!(wait))
        .layer(axum::middleware::from_fn(crate::deadline::wait_route))
}

/// The caller's JSON body, read with one of its turns ([`crate::body`]) and at most `limit` bytes,
/// then parsed strictly (duplicate keys, numbers beyond exact range and NUL refused, as for any
/// request jobtrail records) into `T` (unknown fields refused). A body that is not said to be JSON
/// is refused before it is read. The turn comes back with `T`: hold it while `T` is held.
async fn json_body<T: serde::de::DeserializeOwned>(
    s: &AppState,
    p: &Principal,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<(T, (Slot, jobtrail_service::Held)), Problem> {
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| {
            let m = m.trim().to_ascii_lowercase();
            m == "application/json" || m.ends_with("+json")
        })
        .unwrap_or(false);
    if !json_type {
        return Err(Problem::new(
            Kind::BadInput,
            "send the body as JSON with Content-Type: application/json",
        ));
    }
    let (body, (slot, mut held)) = crate::body::read(&s.service, p, headers, body, limit).await?;
    // What it takes parsed is held too, before it is built (many small values take many times
    // their text).
    let parsed = jobtrail_core::json::footprint(&body).map_err(crate::body::refused_json)?;
    held.join(s.service.hold(p.caller(), parsed)?);
    let v = jobtrail_core::json::parse_strict(&body).map_err(crate::body::refused_json)?;
    drop(body);
    // Cut: serde repeats an unknown key or a wrongly typed string whole, and a caller's
    // megabytes are not echoed back (nor held in an answer a client that does not read keeps).
    let t = serde_json::from_value(v).map_err(|e| {
        Problem::new(
            Kind::BadInput,
            format!("the body: {}", jobtrail_core::ids::cut(&e.to_string(), 300)),
        )
    })?;
    Ok((t, (slot, held)))
}

/// An operation id (or a name) from the path, with a problem document (not axum's plain text)
/// when it cannot be read (percent-encoding that is not UTF-8).
pub(crate) fn path(
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<String, Problem> {
    id.map(|Path(id)| id)
        .map_err(|e| Problem::new(Kind::BadInput, e.body_text()))
}

/// Query parameters, with a problem document (not axum's plain text) when they do not parse.
fn query<T: serde::de::DeserializeOwned>(
    q: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, Problem> {
    q.map(|Query(v)| v)
        .map_err(|e| Problem::new(Kind::BadInput, e.body_text()))
}

#[utoipa::path(
    post, path = "/v1/operations", tag = "operations",
    request_body(content = SubmitRequest, content_type = "application/json"),
    params(("traceparent" = Option<String>, Header, description = "W3C trace context: the operation's provider calls join this trace")),
    responses(
        (status = 201, description = "Submitted: the intent is durable; nothing may have been sent yet", body = SubmitResponse,
            headers(("Location" = String, description = "The new operation: `/v1/operations/{id}`"))),
        (status = 200, description = "This id already holds the same request: nothing new was written", body = SubmitResponse),
        (status = 400, description = "Bad input: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the submit scope, or the provider needs approval", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "The id is another caller's, or `supersedes` names no operation of this caller: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 409, description = "This id holds a different request (both fingerprints in `extra`), or the same request under another approved_by, approval_ref or supersedes (`extra.field` names it)", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 413, description = "Body too large", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn submit(
    State(s): State<AppState>,
    Caller(p): Caller,
    minted: Option<axum::Extension<Minted>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    p.require(Scope::Submit)?;
    let (mut req, _turn): (SubmitRequest, _) =
        json_body(&s, &p, &headers, body, crate::MAX_REQUEST_BYTES).await?;
    let trace = jobtrail_provider::wire::extract_trace(&headers);
    // An id made up here when the agent named none (as the CLI and MCP make one): a submit
    // stopped at its bound, or refused unavailable after it committed, may have landed, and is
    // sent again safely only under the id it went with, which the refusal names.
    let minted = minted.unwrap_or_default().0;
    let mut made_up = None;
    if req.id.is_none() {
        let id = jobtrail_core::OperationId::fresh().to_string();
        minted.one(&id);
        req.id = Some(id.clone());
        made_up = Some(id);
    }
    let r = s
        .service
        .submit(&p, req, trace)
        .await
        .map_err(|e| Problem(maybe_submitted(e, made_up)))?;
    if !r.created {
        return Ok((StatusCode::OK, Json(r)).into_response());
    }
    // RFC 9110 §15.3.2: a 201 names what it created. (The id is ours, `op_` and a UUID.)
    let location = HeaderValue::try_from(format!("/v1/operations/{}", r.operation.id))
        .map_err(|_| Problem::new(Kind::Unavailable, "an operation id that is not a header"))?;
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(r)).into_response())
}

#[utoipa::path(
    post, path = "/v1/operations:batch", tag = "operations",
    request_body(content = BatchSubmitRequest, content_type = "application/json"),
    params(("traceparent" = Option<String>, Header, description = "W3C trace context: every operation of the batch joins this trace")),
    responses(
        (status = 201, description = "Every operation is durable, at least one of them new (each says whether it was); nothing may have been sent yet", body = BatchSubmitResponse),
        (status = 200, description = "Every item's id already held the same request: nothing new was written", body = BatchSubmitResponse),
        (status = 400, description = "An item (named in the message and `extra.item`) is bad input, or the batch is empty or over 1000: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the submit scope, or an item's provider needs approval", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "An item names another caller's id: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 409, description = "An item's id holds a different request: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 413, description = "Body too large (the whole batch counts)", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn submit_batch(
    State(s): State<AppState>,
    Caller(p): Caller,
    minted: Option<axum::Extension<Minted>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<BatchSubmitResponse>), Problem> {
    p.require(Scope::Submit)?;
    let (mut req, _turn): (BatchSubmitRequest, _) =
        json_body(&s, &p, &headers, body, crate::MAX_REQUEST_BYTES).await?;
    let trace = jobtrail_provider::wire::extract_trace(&headers);
    // As for one submit: every item that named no id goes with one made up here (not for a batch
    // the service refuses for its size).
    let mut any_made_up = false;
    let sized = (1..=MAX_BATCH).contains(&req.operations.len());
    let ids: Vec<String> = req
        .operations
        .iter_mut()
        .filter(|_| sized)
        .map(|item| {
            item.id
                .get_or_insert_with(|| {
                    any_made_up = true;
                    jobtrail_core::OperationId::fresh().to_string()
                })
                .clone()
        })
        .collect();
    let minted = minted.unwrap_or_default().0;
    if any_made_up {
        minted.batch(ids.clone());
    }
    let operations = s
        .service
        .submit_batch(&p, req.operations, trace)
        .await
        .map_err(|e| Problem(maybe_submitted_batch(e, ids, any_made_up)))?;
    // As one submit answers: 201 when something was created, 200 for a batch sent again whole.
    let status = if operations.iter().any(|o| o.created) {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(BatchSubmitResponse { operations })))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct GetParams {
    /// Include the history, oldest first: its newest 200 links (`timeline_earlier` in the
    /// answer says when there are more).
    #[serde(default)]
    timeline: bool,
    /// The 200 links before this sequence number instead (implies `timeline`).
    timeline_before: Option<i64>,
}

#[utoipa::path(
    get, path = "/v1/operations/{id}", tag = "operations",
    params(("id" = String, Path, description = "Operation id"), GetParams),
    responses(
        (status = 200, description = "The operation: its state, what is known and what is not", body = OperationView),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the scope this route needs", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation of this caller", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn get_operation(
    State(s): State<AppState>,
    Caller(p): Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<GetParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OperationView>, Problem> {
    let id = path(id)?;
    let q = query(q)?;
    let timeline = Timeline::of(q.timeline, q.timeline_before)?;
    Ok(Json(s.service.get(&p, &id, timeline).await?))
}

#[utoipa::path(
    get, path = "/v1/operations", tag = "operations",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of operations, newest first", body = OperationPage),
        (status = 400, description = "Bad input: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the scope this route needs", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn list(
    State(s): State<AppState>,
    Caller(p): Caller,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OperationPage>, Problem> {
    let q = query(q)?;
    Ok(Json(s.service.list(&p, q).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct WaitParams {
    /// How long to wait at most (`30s`, `2m`, `500ms`; default 30s, at most 5m).
    #[serde(default)]
    timeout: Option<String>,
    /// The state (or `STATE@SEQ`) you last saw; default: the state now.
    #[serde(default)]
    seen: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/operations/{id}/wait", tag = "operations",
    params(("id" = String, Path, description = "Operation id"), WaitParams),
    responses(
        (status = 200, description = "The state changed, the operation is settled, or the timeout passed (`timed_out`)", body = WaitResponse),
        (status = 400, description = "Bad input: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid bearer token, or it was revoked while the wait was open", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the scope this route needs", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation of this caller", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn wait(
    State(s): State<AppState>,
    Caller(p): Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<WaitParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<WaitResponse>, Problem> {
    let id = path(id)?;
    let q = query(q)?;
    let timeout = match q.timeout.as_deref() {
        None => Duration::from_secs(30),
        Some(t) => {
            // A wait's bare number is seconds, as HTTP's own timeouts are (and it is bounded by
            // five minutes, so no reading of it is far from another).
            let t = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                format!("{t}s")
            } else {
                t.to_owned()
            };
            jobtrail_core::when::parse_duration_within("timeout", &t, Duration::ZERO, MAX_WAIT)
                .map_err(|e| Problem::new(Kind::BadInput, e))?
        }
    };
    Ok(Json(
        s.service.wait(&p, &id, q.seen.as_deref(), timeout).await?,
    ))
}

#[utoipa::path(
    post, path = "/v1/operations/{id}/cancel", tag = "operations",
    params(("id" = String, Path, description = "Operation id")),
    request_body(content = CancelBody, content_type = "application/json"),
    responses(
        (status = 202, description = "Recorded; cancelled only when the provider confirms", body = CancelResponse),
        (status = 400, description = "Bad input: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the scope this route needs", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation of this caller", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 409, description = "The state machine refuses a cancel in this state; or `seen` is stale; or another caller's operation held for a person was named without `seen`", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 413, description = "Body too large (at most 64 KiB: a reason, not a document)", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn cancel(
    State(s): State<AppState>,
    Caller(p): Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<CancelResponse>), Problem> {
    let id = path(id)?;
    p.require(Scope::Cancel)?;
    let (b, _turn): (CancelBody, _) =
        json_body(&s, &p, &headers, body, crate::body::SMALL_REQUEST_BYTES).await?;
    let done = s
        .service
        .cancel(&p, &id, &b.reason, b.seen.as_deref())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(done)))
}

/// A result's bytes as a body handed to the connection a slice at a time (as the connection takes
/// them), holding the caller's result slot until the last slice is taken or the connection goes.
fn sent_holding(
    bytes: bytes::Bytes,
    slot: (jobtrail_service::ResultSlot, Option<jobtrail_service::Held>),
) -> axum::body::Body {
    const SLICE: usize = 64 * 1024;
    let slices = futures::stream::unfold((bytes, 0, slot), |(bytes, at, slot)| async move {
        (at < bytes.len()).then(|| {
            let end = (at + SLICE).min(bytes.len());
            (
                Ok::<_, std::convert::Infallible>(bytes.slice(at..end)),
                (bytes, end, slot),
            )
        })
    });
    axum::body::Body::from_stream(slices)
}

#[utoipa::path(
    get, path = "/v1/operations/{id}/result", tag = "operations",
    params(("id" = String, Path, description = "Operation id")),
    responses(
        (status = 200, description = "The validated result's bytes, exactly as recorded; `jobtrail-result-sha256` and `Repr-Digest` carry the digest the evidence chain holds",
         content_type = "application/octet-stream",
         headers(("jobtrail-result-sha256" = String, description = "hex sha256 of the body, as the history chain records it"),
                 ("repr-digest" = String, description = "RFC 9530 digest of the body"))),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "Another caller's operation, and the token has no decide scope (an audit token sees operations, not their result bytes)", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation of this caller", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 409, description = "No validated result: the operation ended other than succeeded (`not-succeeded`), or has not finished yet (`not-finished`: wait for it, then ask again)", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 500, description = "The stored bytes disagree with the chain: refused", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn result(
    State(s): State<AppState>,
    Caller(p): Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Response, Problem> {
    let id = path(id)?;
    use base64::Engine;
    let slot = s.service.result_slot(&p)?;
    let r = s.service.result(&p, &id).await?;
    let raw = hex::decode(&r.sha256).unwrap_or_default();
    let repr = format!(
        "sha-256=:{}:",
        base64::engine::general_purpose::STANDARD.encode(raw)
    );
    let content_type = r
        .content_type
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let len = r.bytes.len();
    let mut resp = sent_holding(bytes::Bytes::from(r.bytes), (slot, r.held)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        RESULT_SHA256_HEADER,
        HeaderValue::from_str(&r.sha256).map_err(|_| {
            Problem::new(Kind::Tampered, "the recorded digest is not a header value")
        })?,
    );
    if let Ok(v) = HeaderValue::from_str(&repr) {
        h.insert("repr-digest", v);
    }
    // Results are caller data: never cached by an intermediary.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The type is the provider's word: a browser must not sniff a page out of it, nor render it.
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment"),
    );
    Ok(resp)
}

#[utoipa::path(
    get, path = "/v1/providers", tag = "operations",
    responses(
        (status = 200, description = "What each provider does and what a request to it needs", body = ProviderList),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn providers(State(s): State<AppState>, Caller(p): Caller) -> Json<ProviderList> {
    Json(s.service.providers(&p))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EscalationParams {
    /// Only this held state.
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    /// Only this caller's operations.
    #[serde(default)]
    caller: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/escalations", tag = "operator",
    params(EscalationParams),
    responses(
        (status = 200, description = "Operations held for a person, oldest first, with the decisions that fit", body = EscalationList),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the decide scope", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn escalations(
    State(s): State<AppState>,
    Caller(p): Caller,
    q: Result<Query<EscalationParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EscalationList>, Problem> {
    let q = query(q)?;
    Ok(Json(
        s.service
            .escalations(
                &p,
                q.state.as_deref(),
                q.provider.as_deref(),
                q.caller.as_deref(),
            )
            .await?,
    ))
}

#[utoipa::path(
    post, path = "/v1/operations/{id}/decisions", tag = "operator",
    params(("id" = String, Path, description = "Operation id")),
    request_body(content = DecideRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Recorded, with the token's caller as actor", body = DecideResponse),
        (status = 400, description = "Bad input: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the decide scope", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation of this caller", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 409, description = "Stale view (`seen` no longer current) or a decision the state machine refuses", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 413, description = "Body too large (at most 64 KiB)", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn decide(
    State(s): State<AppState>,
    Caller(p): Caller,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<DecideResponse>, Problem> {
    let id = path(id)?;
    p.require(Scope::Decide)?;
    let (req, _turn): (DecideRequest, _) =
        json_body(&s, &p, &headers, body, crate::body::SMALL_REQUEST_BYTES).await?;
    Ok(Json(s.service.decide(&p, &id, req).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct VerifyParams {
    /// One operation; absent: every chain.
    #[serde(default)]
    operation: Option<String>,
    /// The digest of an anchor you kept outside the database (64 hex digits): its recorded heads
    /// are checked, and it must be there. Absent: the latest anchor in the database.
    #[serde(default)]
    expect_anchor: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/audit/verify", tag = "audit",
    params(VerifyParams),
    responses(
        (status = 200, description = "What was checked and the breaks found: the first 1000 (the anchor's own first), the rest counted in `breaks_omitted` (an empty `breaks` is a clean record), against the anchor checked (`anchor`; `unanchored` counts what no anchor covers yet)", body = Object),
        (status = 400, description = "A malformed operation id or anchor digest", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No such operation, nor one an anchor recorded", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 500, description = "The anchor named is not in the database (`tampered`)", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "No valid bearer token", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 403, description = "The token lacks the audit scope", body = ProblemDoc, content_type = PROBLEM_JSON),
    ),
    security(("bearer" = []))
)]
async fn verify(
    State(s): State<AppState>,
    Caller(p): Caller,
    q: Result<Query<VerifyParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, Problem> {
    let q = query(q)?;
    let report = s
        .service
        .verify(&p, q.operation.as_deref(), q.expect_anchor.as_deref())
        .await?;
    Ok(Json(serde_json::to_value(report).map_err(|e| {
        Problem::new(Kind::Unavailable, e.to_string())
    })?))
}
