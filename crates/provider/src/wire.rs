//! One HTTP exchange with a provider, and the sanitized record of it.
//!
//! Secrets are resolved here, at send time, and go only into the outgoing request (marked sensitive
//! so no debug output prints them). The call record keeps the URL without credentials or secret-looking
//! query values, an allow-list of response headers, and a digest of the body; never request headers.

use chrono::Utc;
use jobtrail_core::{CallKind, CallRecord, SecretRef, TraceId};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceState};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

/// Response headers worth keeping as evidence. Nothing else is stored.
const KEPT_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "location",
    "operation-location",
    "azure-asyncoperation",
    "retry-after",
    "date",
    "etag",
    "x-request-id",
    "request-id",
    "x-ms-request-id",
    "x-amzn-requestid",
    "x-checksum-sha256",
    "idempotent-replayed",
];

/// Headers that carry the provider's own request id, in order of preference.
const REQUEST_ID_HEADERS: &[&str] = &[
    "x-request-id",
    "request-id",
    "x-ms-request-id",
    "x-amzn-requestid",
];

/// Query parameter names whose values are never stored.
const SECRET_QUERY_HINTS: &[&str] = &[
    "token",
    "key",
    "secret",
    "sig",
    "signature",
    "password",
    "auth",
    "code",
    "credential",
];

/// Resolve a secret reference. The value is returned to the caller only; errors never contain it.
pub fn resolve_secret(r: &SecretRef) -> Result<String, String> {
    match r {
        SecretRef::Env(name) => {
            std::env::var(name).map_err(|_| format!("secret env:{name} is not set"))
        }
        SecretRef::File(path) => std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
            .map_err(|e| format!("secret file:{path} cannot be read: {}", e.kind())),
    }
}

/// Replace every `{"$secret": "..."}` object in a request body by the secret's value.
pub fn resolve_body_secrets(v: &serde_json::Value) -> Result<serde_json::Value, String> {
    if let Some(r) = SecretRef::from_value(v) {
        return Ok(serde_json::Value::String(resolve_secret(&r?)?));
    }
    Ok(match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), resolve_body_secrets(v)?)))
                .collect::<Result<_, String>>()?,
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(
            a.iter()
                .map(resolve_body_secrets)
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

/// The URL as it may be stored: no user info, secret-looking query values redacted.
pub fn sanitize_url(u: &url::Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let lower = k.to_ascii_lowercase();
                let secret = SECRET_QUERY_HINTS.iter().any(|h| lower.contains(h));
                (
                    k.into_owned(),
                    if secret {
                        "REDACTED".to_owned()
                    } else {
                        v.into_owned()
                    },
                )
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// A fresh span id for one call (8 random bytes, never zero).
pub fn new_span_id() -> SpanId {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    if b == [0; 8] {
        b[7] = 1;
    }
    SpanId::from_bytes(b)
}

/// W3C trace context for this operation's trace id and this call's span id.
pub fn inject_trace(headers: &mut http::HeaderMap, trace: TraceId, span: SpanId) {
    let sc = SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(trace.to_bytes()),
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);
    let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
    propagator.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
}

/// A finished exchange: what came back (if anything) and the record to log.
#[derive(Debug)]
pub struct Exchange {
    pub status: Option<u16>,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
    /// Set when no complete response arrived (or the body was cut at the limit).
    pub error: Option<WireError>,
    pub record: CallRecord,
}

/// How an exchange failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// The connection was never made: nothing was sent.
    Connect,
    /// No answer in time: the request may have been processed.
    Timeout,
    /// The connection broke after the request went out (reset, closed, incomplete response).
    ConnectionLost,
    /// The response body exceeded the limit we read.
    TooLarge,
    /// A secret reference could not be resolved: nothing was sent.
    Secret,
    /// The caller's lease would end before the call could: nothing was sent.
    LeaseTooShort,
}

impl WireError {
    pub const fn class(self) -> &'static str {
        match self {
            WireError::Connect => "connect_failed",
            WireError::Timeout => "timeout",
            WireError::ConnectionLost => "connection_lost",
            WireError::TooLarge => "response_too_large",
            WireError::Secret => "secret_unresolved",
            WireError::LeaseTooShort => "lease_too_short_to_send",
        }
    }
    /// Nothing reached the provider.
    pub const fn not_sent(self) -> bool {
        matches!(
            self,
            WireError::Connect | WireError::Secret | WireError::LeaseTooShort
        )
    }
}

/// What to send.
pub struct Outgoing<'a> {
    pub kind: CallKind,
    pub attempt: i32,
    pub method: http::Method,
    pub url: url::Url,
    pub headers: http::HeaderMap,
    pub body: Option<Vec<u8>>,
    pub trace: TraceId,
    pub trace_header: Option<&'a http::HeaderName>,
    pub max_body: u64,
    /// The instant by which the call must have ended (the caller's lease), and the longest the call
    /// can take: if it could not end in time it is not sent.
    pub end_by: Option<Instant>,
    pub budget: Duration,
}

/// Send one request and read the response up to `max_body` bytes.
pub async fn exchange(client: &reqwest::Client, out: Outgoing<'_>) -> Exchange {
    let span = new_span_id();
    let mut headers = out.headers;
    inject_trace(&mut headers, out.trace, span);
    if let Some(h) = out.trace_header
        && let Ok(v) = http::HeaderValue::from_str(&out.trace.to_string())
    {
        headers.insert(h.clone(), v);
    }
    // The last check before the bytes leave: a worker that was paused (SIGSTOP, a long GC-like
    // stall, a VM freeze) past its lease must not send on an operation another worker may own now.
    if let Some(end_by) = out.end_by
        && Instant::now() + out.budget > end_by
    {
        return not_sent(
            out.kind,
            out.attempt,
            &out.method,
            &out.url,
            out.trace,
            WireError::LeaseTooShort,
            "the lease would end before the call could",
        );
    }
    let started_at = Utc::now();
    let t0 = Instant::now();
    let mut req = client
        .request(out.method.clone(), out.url.clone())
        .headers(headers);
    if let Some(b) = out.body {
        req = req.body(b);
    }
    let mut status = None;
    let mut resp_headers = http::HeaderMap::new();
    let mut body = Vec::new();
    let mut error = None;
    match req.send().await {
        Err(e) => error = Some(classify(&e)),
        Ok(mut resp) => {
            status = Some(resp.status().as_u16());
            resp_headers = resp.headers().clone();
            loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        if (body.len() + chunk.len()) as u64 > out.max_body {
                            let room = (out.max_body as usize).saturating_sub(body.len());
                            body.extend_from_slice(&chunk[..room]);
                            error = Some(WireError::TooLarge);
                            break;
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(if e.is_timeout() {
                            WireError::Timeout
                        } else {
                            WireError::ConnectionLost
                        });
                        break;
                    }
                }
            }
        }
    }
    let record = CallRecord {
        id: uuid::Uuid::now_v7(),
        kind: out.kind,
        attempt: out.attempt.max(1),
        started_at,
        duration_ms: t0.elapsed().as_secs_f64() * 1000.0,
        method: out.method.to_string(),
        url: sanitize_url(&out.url),
        http_status: status.map(i32::from),
        response_headers: kept_headers(&resp_headers),
        provider_request_id: REQUEST_ID_HEADERS.iter().find_map(|h| {
            resp_headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        }),
        error_class: error.map(|e| e.class().to_owned()),
        outcome: String::new(),
        trace_id: out.trace.to_string(),
        span_id: span.to_string(),
        response_sha256: status.map(|_| hex::encode(Sha256::digest(&body))),
    };
    Exchange {
        status,
        headers: resp_headers,
        body: body.into(),
        error,
        record,
    }
}

/// An exchange that never left: a secret could not be resolved.
pub fn unsent(
    kind: CallKind,
    attempt: i32,
    method: &http::Method,
    url: &url::Url,
    trace: TraceId,
    why: &str,
) -> Exchange {
    not_sent(kind, attempt, method, url, trace, WireError::Secret, why)
}

/// An exchange that never left, and why.
pub fn not_sent(
    kind: CallKind,
    attempt: i32,
    method: &http::Method,
    url: &url::Url,
    trace: TraceId,
    error: WireError,
    why: &str,
) -> Exchange {
    Exchange {
        status: None,
        headers: http::HeaderMap::new(),
        body: bytes::Bytes::new(),
        error: Some(error),
        record: CallRecord {
            id: uuid::Uuid::now_v7(),
            kind,
            attempt: attempt.max(1),
            started_at: Utc::now(),
            duration_ms: 0.0,
            method: method.to_string(),
            url: sanitize_url(url),
            http_status: None,
            response_headers: serde_json::json!({}),
            provider_request_id: None,
            error_class: Some(error.class().to_owned()),
            outcome: format!("not sent: {why}"),
            trace_id: trace.to_string(),
            span_id: new_span_id().to_string(),
            response_sha256: None,
        },
    }
}

fn classify(e: &reqwest::Error) -> WireError {
    if e.is_connect() {
        WireError::Connect
    } else if e.is_timeout() {
        WireError::Timeout
    } else {
        WireError::ConnectionLost
    }
}

fn kept_headers(h: &http::HeaderMap) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for name in KEPT_HEADERS {
        if let Some(v) = h.get(*name).and_then(|v| v.to_str().ok()) {
            let v = if name.contains("location") || *name == "azure-asyncoperation" {
                url::Url::parse(v)
                    .map(|u| sanitize_url(&u))
                    .unwrap_or_else(|_| v.to_owned())
            } else {
                v.to_owned()
            };
            m.insert((*name).to_owned(), serde_json::Value::String(v));
        }
    }
    serde_json::Value::Object(m)
}

/// `Retry-After` as a delay: delta-seconds or an HTTP-date (parsed by `httpdate`). A number of
/// seconds too large for 64 bits means "a very long time": it becomes the largest delay (which the
/// contract's bounds then clamp), never "no Retry-After".
pub fn retry_after(h: &http::HeaderMap) -> Option<Duration> {
    let v = h.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            v.parse::<u64>()
                .map(Duration::from_secs)
                .unwrap_or(Duration::MAX),
        );
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_credentials_and_secret_query_values() {
        let u = url::Url::parse(
            "https://user:pw@api.example.test/v1/jobs?api-version=2024&sig=abc&access_token=xyz",
        )
        .unwrap();
        let s = sanitize_url(&u);
        assert!(
            !s.contains("pw") && !s.contains("abc") && !s.contains("xyz"),
            "{s}"
        );
        assert!(s.contains("api-version=2024"));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = http::HeaderMap::new();
        h.insert("retry-after", "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        h.insert(
            "retry-after",
            httpdate::fmt_http_date(later).parse().unwrap(),
        );
        let d = retry_after(&h).unwrap();
        assert!(
            d > Duration::from_secs(27) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
        // Beyond u64: the longest wait, not none at all.
        h.insert("retry-after", "99999999999999999999999999".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::MAX));
    }

    #[test]
    fn traceparent_carries_the_operation_trace() {
        let trace: TraceId = "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap();
        let mut h = http::HeaderMap::new();
        inject_trace(
            &mut h,
            trace,
            SpanId::from_bytes([0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]),
        );
        assert_eq!(
            h.get("traceparent").unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn body_secrets_resolve_only_at_send_time() {
        // SAFETY: tests in this module do not read this variable concurrently.
        unsafe { std::env::set_var("JOBTRAIL_TEST_CARD", "4111") };
        let body = serde_json::json!({"card": {"$secret": "env:JOBTRAIL_TEST_CARD"}, "n": [1]});
        assert_eq!(
            resolve_body_secrets(&body).unwrap(),
            serde_json::json!({"card": "4111", "n": [1]})
        );
        let missing = serde_json::json!({"card": {"$secret": "env:JOBTRAIL_TEST_NOPE"}});
        assert!(
            resolve_body_secrets(&missing)
                .unwrap_err()
                .contains("JOBTRAIL_TEST_NOPE")
        );
    }
}
