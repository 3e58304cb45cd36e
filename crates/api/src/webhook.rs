//! The webhook receiver. A delivery is verified by the provider contract's scheme (Standard
//! Webhooks, or a plain HMAC header), deduplicated by its event id, mapped to an operation by the
//! remote job id, and then only makes that operation due for a status read under the normal lease
//! rules. It never moves a state: success is still declared only from a status read and a validated
//! result, so out-of-order, late, replayed and forged deliveries change nothing else.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use hmac::{KeyInit, Mac};
use jobtrail_provider::contract::{WebhookScheme, WebhookSpec};
use jobtrail_service::{Kind, Service};
use jobtrail_store::{Delivery, DeliveryOutcome};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::limit::Sender;
use crate::problem::{PROBLEM_JSON, Problem, ProblemDoc};

/// Deliveries are remembered this long (far beyond any timestamp tolerance).
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The largest payload accepted.
pub const MAX_PAYLOAD: usize = 256 * 1024;
/// How long a payload may take to arrive: a provider sends a few kilobytes at once, so one that
/// trickles is someone holding a turn.
pub const PAYLOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest event id accepted. (A job id may be as long as any job id jobtrail keeps: a job
/// known by its URL, an Azure resource path.)
const MAX_ID: usize = 200;

/// The receiver's shared part.
#[derive(Clone)]
pub struct Receiver {
    service: Arc<Service>,
    /// When each provider's refused deliveries were last logged (at most once a minute each: an
    /// anonymous sender must not flood the log, nor a rotated secret go unsaid).
    warned: Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

impl Receiver {
    pub fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            warned: Arc::default(),
        }
    }

    /// Count a delivery to a provider that takes webhooks, and say once a minute per provider
    /// that its deliveries are refused (a secret rotated on one side only shows as this).
    fn account(&self, provider: &str, outcome: &Result<(StatusCode, Json<WebhookAck>), Problem>) {
        let label = match outcome {
            Ok((_, Json(ack))) => ack.outcome.clone(),
            Err(p) => match p.0.kind {
                Kind::Unauthenticated => "refused_signature",
                Kind::BadInput => "refused_payload",
                Kind::TooLarge => "refused_size",
                Kind::RateLimited => "busy",
                _ => "unavailable",
            }
            .to_owned(),
        };
        metrics::counter!("jobtrail_webhooks_total", "provider" => provider.to_owned(), "outcome" => label.clone())
            .increment(1);
        // A refused signature (a secret rotated on one side), a signed payload the contract does
        // not describe (the provider changed its shape), or no usable secret here.
        if let Err(p) = outcome
            && matches!(
                p.0.kind,
                Kind::Unauthenticated | Kind::BadInput | Kind::Unavailable
            )
        {
            let now = std::time::Instant::now();
            // Once a minute for each provider and kind of refusal: unsigned junk arriving first
            // every minute must not hide that this server cannot check any delivery.
            let key = format!("{provider} {label}");
            let due = {
                let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
                let due = warned
                    .get(&key)
                    .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(60));
                if due {
                    warned.insert(key, now);
                }
                due
            };
            if due {
                tracing::warn!(provider = %provider, outcome = %label, detail = %p.0.message, "webhook deliveries are refused (said at most once a minute; jobtrail_webhooks_total counts them)");
            }
        }
    }
}

/// What a delivery led to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookAck {
    /// `scheduled` (a status read is due now, or as soon as the worker holding the operation
    /// records the read in flight), `duplicate` (seen before: nothing done), `no_operation` (no
    /// operation holds this job), `not_observing` (the operation is not waiting for a status read,
    /// or is due for one already).
    pub outcome: String,
}

fn unauthorized(why: &str) -> Problem {
    Problem::new(Kind::Unauthenticated, format!("webhook refused: {why}"))
}

/// A webhook key shorter than this is refused (the server answers 503 and logs why): a signature
/// made with an empty or guessable key proves nothing, and an empty one is what a secret file
/// created empty or a chart value left as `whsec_` gives.
const MIN_WEBHOOK_KEY_BYTES: usize = 16;
/// Standard Webhooks' tolerance for the timestamp, fixed by the scheme.
const STANDARD_TOLERANCE_SECS: u64 = 300;

/// Verify a delivery's signature (and timestamp) and return its event id if the scheme carries it.
fn verify(
    spec: &WebhookSpec,
    secret: &str,
    headers: &HeaderMap,
    payload: &[u8],
) -> Result<Option<String>, Problem> {
    let header = |name: &str| -> Result<&str, Problem> {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| unauthorized(&format!("no {name} header")))
    };
    match &spec.scheme {
        WebhookScheme::StandardWebhooks => {
            use base64::Engine as _;
            let text = secret.trim();
            let key = base64::engine::general_purpose::STANDARD
                .decode(text.strip_prefix("whsec_").unwrap_or(text))
                .map_err(|_| {
                    unusable(
                        "the contract's webhook secret is not a Standard Webhooks secret (whsec_<base64>)",
                    )
                })?;
            too_short(key.len())?;
            // The timestamp is checked here first: the library subtracts it from the clock
            // unchecked, which overflows (a panic where overflow is checked) on i64::MIN.
            let at: i64 = header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP)?
                .trim()
                .parse()
                .map_err(|_| unauthorized("the timestamp is not unix seconds"))?;
            if chrono::Utc::now().timestamp().abs_diff(at) > STANDARD_TOLERANCE_SECS {
                return Err(unauthorized("the timestamp is outside the tolerance"));
            }
            let wh = standardwebhooks::Webhook::from_bytes(key)
                .map_err(|_| unusable("the webhook secret is unusable"))?;
            wh.verify(payload, headers).map_err(|e| {
                use standardwebhooks::WebhookError as E;
                unauthorized(match e {
                    E::TimestampTooOldError | E::FutureTimestampError => {
                        "the timestamp is outside the tolerance"
                    }
                    E::MissingHeader(_) | E::InvalidHeader(_) => {
                        "webhook-id, webhook-timestamp and webhook-signature are required"
                    }
                    _ => "the signature does not verify",
                })
            })?;
            Ok(Some(
                header(standardwebhooks::HEADER_WEBHOOK_ID)?.to_owned(),
            ))
        }
        WebhookScheme::HmacSha256 {
            signature_header,
            timestamp_header,
        } => {
            // The key first, as above: with it too short, no delivery could prove anything,
            // signed or not, and the operator is told so.
            too_short(secret.len())?;
            let given = header(signature_header.as_str())?;
            let given = given.trim();
            let given = given.strip_prefix("sha256=").unwrap_or(given);
            let given = hex::decode(given).map_err(|_| unauthorized("the signature is not hex"))?;
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
                .map_err(|_| unusable("the webhook secret is unusable"))?;
            if let Some(th) = timestamp_header {
                let ts = header(th.as_str())?;
                let at: i64 = ts
                    .trim()
                    .parse()
                    .map_err(|_| unauthorized("the timestamp is not unix seconds"))?;
                let now = chrono::Utc::now().timestamp();
                if now.abs_diff(at) > spec.tolerance.as_secs() {
                    return Err(unauthorized("the timestamp is outside the tolerance"));
                }
                mac.update(ts.trim().as_bytes());
                mac.update(b".");
            }
            mac.update(payload);
            // Constant-time comparison.
            mac.verify_slice(&given)
                .map_err(|_| unauthorized("the signature does not verify"))?;
            Ok(None)
        }
    }
}

/// Refuse a key too short to prove anything: the server's fault, not the sender's (503, logged).
fn too_short(len: usize) -> Result<(), Problem> {
    if len < MIN_WEBHOOK_KEY_BYTES {
        return Err(unusable(format!(
            "the webhook secret is {len} bytes: at least {MIN_WEBHOOK_KEY_BYTES} are needed for a signature to prove anything"
        )));
    }
    Ok(())
}

/// This server cannot check any delivery (its secret or contract): a 503 whose cause is kept from
/// the sender (anyone may send one, and how long the secret is, or where it is kept, is ours), and
/// logged by [`Receiver::account`] at most once a minute, not once per delivery.
fn unusable(why: impl Into<String>) -> Problem {
    let mut e = jobtrail_service::ServiceError::new(Kind::Unavailable, why);
    e.internal = true;
    e.logged_by_door = true;
    Problem(e)
}

/// A string (or integer) at `pointer`, unchecked.
fn id_at(v: &serde_json::Value, pointer: &str, what: &str) -> Result<String, Problem> {
    let s = match v.pointer(pointer) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        _ => {
            return Err(Problem::new(
                Kind::BadInput,
                format!("the payload has no {what} at {pointer}"),
            ));
        }
    };
    Ok(s)
}

fn check_id(s: &str, what: &str) -> Result<(), Problem> {
    if s.is_empty() || s.len() > MAX_ID || s.chars().any(char::is_control) {
        return Err(Problem::new(
            Kind::BadInput,
            format!("the {what} is empty, longer than {MAX_ID} bytes, or holds control characters"),
        ));
    }
    Ok(())
}

#[utoipa::path(
    post, path = "/v1/webhooks/{provider}", tag = "webhooks",
    params(("provider" = String, Path, description = "The provider's name, as in its contract")),
    request_body(content = Object, content_type = "application/json", description = "The provider's payload, verified by the contract's signature scheme"),
    responses(
        (status = 200, description = "Verified; a status read is due now, or nothing was needed (a duplicate, an unknown job)", body = WebhookAck),
        (status = 400, description = "Not a payload this contract describes", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 401, description = "The signature or timestamp does not verify: nothing was recorded", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 404, description = "No provider of this name takes webhooks", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 413, description = "Body too large: nothing was written", body = ProblemDoc, content_type = PROBLEM_JSON),
        (status = 503, description = "Nothing was recorded: the contract's webhook secret is missing, unusable or too short (under 16 bytes) for a signature to prove anything, the contract names no event id, or the database is away (the provider should deliver again later)", body = ProblemDoc, content_type = PROBLEM_JSON),
    )
)]
pub(crate) async fn receive(
    State(s): State<AppState>,
    provider: Result<Path<String>, axum::extract::rejection::PathRejection>,
    sender: Option<Extension<Sender>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<WebhookAck>), Problem> {
    let provider = crate::routes::path(provider)?;
    let spec = s
        .webhooks
        .service
        .registry()
        .get(&provider)
        .and_then(|p| p.contract().webhook.clone())
        .ok_or_else(|| {
            // Not counted: the name is the sender's, not a contract's.
            Problem::new(
                Kind::NotFound,
                format!(
                    "no provider {:?} takes webhooks here",
                    jobtrail_core::ids::shown(&provider)
                ),
            )
        })?;
    let outcome = deliver(&s.webhooks, &provider, &spec, sender, &headers, body).await;
    s.webhooks.account(&provider, &outcome);
    outcome
}

/// A delivery to a provider that takes webhooks, from its read to its record.
async fn deliver(
    receiver: &Receiver,
    provider: &str,
    spec: &WebhookSpec,
    sender: Option<Extension<Sender>>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<WebhookAck>), Problem> {
    let service = &receiver.service;
    // Read only for a provider that takes webhooks, with one of its turns held to the answer:
    // anyone may send a payload (its signature is checked once it is whole), and one that
    // trickles holds its turn.
    let (payload, (_turns, mut held)) = crate::body::read_holding(
        |bytes| {
            let turns =
                service.webhook_body_slot(provider, sender.map(|Extension(Sender(ip))| ip))?;
            Ok((
                turns,
                service.hold(&format!("webhooks of {provider}"), bytes)?,
            ))
        },
        headers,
        body,
        MAX_PAYLOAD,
        PAYLOAD_TIMEOUT,
    )
    .await?;
    // The reason may name the secret's location: neither sent nor logged per delivery (the
    // readiness check and the start name it; `account` says once a minute that deliveries fail).
    let secret = jobtrail_provider::wire::resolve_secret(&spec.secret)
        .await
        .map_err(|_| unusable("the webhook secret is unavailable"))?;
    let header_event_id = verify(spec, &secret, headers, &payload)?;
    // What it takes parsed is held too, before it is built (many small values take many times
    // their text), as a request body's is.
    let parsed = jobtrail_core::json::footprint(&payload).map_err(crate::body::refused_json)?;
    held.join(service.hold(&format!("webhooks of {provider}"), parsed)?);
    let v = jobtrail_core::json::parse_strict(&payload).map_err(|e| {
        Problem::new(
            Kind::BadInput,
            format!("the payload is not acceptable JSON: {e}"),
        )
    })?;
    let event_id = match (header_event_id, &spec.event_id) {
        (Some(id), _) => {
            check_id(&id, "event id")?;
            id
        }
        (None, Some(p)) => {
            let id = id_at(&v, p, "event id")?;
            check_id(&id, "event id")?;
            id
        }
        (None, None) => {
            return Err(unusable("the contract names no event id"));
        }
    };
    let job = match v.pointer(&spec.job_id) {
        None | Some(serde_json::Value::Null) => None,
        Some(_) => {
            // Recorded as the create's answer records it (a URL's capability blanked), or a
            // job named by its URL would never be found.
            let job = jobtrail_provider::wire::recorded_job_id(id_at(&v, &spec.job_id, "job id")?);
            jobtrail_core::ids::check_remote_job_id(&job)
                .map_err(|why| Problem::new(Kind::BadInput, format!("the payload names {why}")))?;
            Some(job)
        }
    };
    let outcome = match service
        .store()
        .webhook_delivered(provider, &event_id, job.as_deref(), RETENTION)
        .await
        .map_err(jobtrail_service::ServiceError::from)?
    {
        Delivery::Duplicate => "duplicate",
        Delivery::New { outcome, .. } => match outcome {
            DeliveryOutcome::Scheduled => "scheduled",
            DeliveryOutcome::NoOperation => "no_operation",
            DeliveryOutcome::NotObserving => "not_observing",
        },
    };
    tracing::info!(provider = %provider, event_id = %event_id, outcome, "webhook");
    Ok((
        StatusCode::OK,
        Json(WebhookAck {
            outcome: outcome.to_owned(),
        }),
    ))
}
