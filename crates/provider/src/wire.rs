//! One HTTP exchange with a provider, and the sanitized record of it.
//!
//! Secrets are resolved here, at send time, and go only into the outgoing request (marked sensitive
//! so no debug output prints them). The call record keeps the URL without credentials or secret-looking
//! query values, an allow-list of response headers, and a digest of the body; never request headers.

use chrono::Utc;
use jobtrail_core::{CallKind, CallRecord, SecretRef, TraceId};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceState};
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
    "x-ms-client-request-id",
    "client-request-id",
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

/// Query parameter names whose values are never stored (and which a contract's fixed `query` may
/// not name: see [`secret_looking_query_name`]).
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

/// The largest secret a file may hold.
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;
/// The longest reading one secret may take (a stalled network mount must not stall a worker).
pub const SECRET_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Resolve an operator-configured secret reference. The value is returned to the caller only; errors
/// never contain it. A file is read off the async threads, with a timeout, and only if it is a
/// regular file of at most [`MAX_SECRET_BYTES`]: `/dev/zero` or a FIFO is refused, never read.
pub async fn resolve_secret(r: &SecretRef) -> Result<String, String> {
    match r {
        // A line end is trimmed as from a file: a Kubernetes Secret made from a file usually
        // ends in one, which would sign every webhook wrongly or make a header unsendable.
        SecretRef::Env(name) => match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => Ok(v.trim_end_matches(['\n', '\r']).to_owned()),
            // An empty (or blank) credential is a missing one (the worker's readiness says so too).
            _ => Err(format!("secret env:{name} is not set (or empty)")),
        },
        SecretRef::File(path) => {
            let p = path.clone();
            match tokio::time::timeout(
                SECRET_READ_TIMEOUT,
                tokio::task::spawn_blocking(move || read_secret_file(&p)),
            )
            .await
            {
                Ok(Ok(read)) => read,
                Ok(Err(_)) => Err(format!("secret file:{path} could not be read")),
                Err(_) => Err(format!(
                    "secret file:{path} took over {} s to read",
                    SECRET_READ_TIMEOUT.as_secs()
                )),
            }
        }
    }
}

/// A secret file, opened without blocking (opening a FIFO for reading must not wait for a
/// writer) and only if the open handle is a regular file: its size too.
fn open_secret_file(path: &str) -> Result<(std::fs::File, u64), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("secret file:{path} cannot be read: {}", e.kind()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("secret file:{path} cannot be read: {}", e.kind()))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "secret file:{path} is not a regular file (devices, FIFOs and directories are never read)"
        ));
    }
    Ok((f, meta.len()))
}

/// Whether a secret file holds no usable credential: empty, or a few bytes of whitespace (a
/// newline an editor added), read as it would be when used. Only files of at most 4 bytes are
/// read to tell: a credential's value never is. `Err` if it is no regular file that can be read.
pub fn secret_file_is_blank(path: &str) -> Result<bool, String> {
    use std::io::Read;
    let (f, len) = open_secret_file(path)?;
    if len > 4 {
        return Ok(false);
    }
    let mut buf = Vec::new();
    f.take(5)
        .read_to_end(&mut buf)
        .map_err(|e| format!("secret file:{path} cannot be read: {}", e.kind()))?;
    Ok(std::str::from_utf8(&buf).is_ok_and(|t| t.trim().is_empty()))
}

fn read_secret_file(path: &str) -> Result<String, String> {
    use std::io::Read;
    let (f, len) = open_secret_file(path)?;
    if len > MAX_SECRET_BYTES {
        return Err(format!(
            "secret file:{path} is larger than {MAX_SECRET_BYTES} bytes"
        ));
    }
    let mut buf = Vec::new();
    f.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("secret file:{path} cannot be read: {}", e.kind()))?;
    if buf.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!(
            "secret file:{path} is larger than {MAX_SECRET_BYTES} bytes"
        ));
    }
    let text = String::from_utf8(buf).map_err(|_| format!("secret file:{path} is not UTF-8"))?;
    if text.trim().is_empty() {
        // A file created empty (a secret mounted before it was filled) holds no credential.
        return Err(format!("secret file:{path} is empty"));
    }
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// The create body with every granted secret a sensitive field names resolved to its value, and the
/// values (so everything recorded about the call can be scrubbed of them). Submit already checked
/// each reference against the grants of every holder (the caller; a person whose edit the request
/// carries); a grant removed or narrowed since, for any of them, is refused here. `holders: None`:
/// the values are read only to be scrubbed from a later call's record, never sent, so no grant is
/// asked for (a grant narrowed after the create must not stop the job being watched or cancelled).
pub async fn resolve_body_secrets(
    body: &serde_json::Value,
    sensitive: &[String],
    secrets: &std::collections::BTreeMap<String, crate::contract::GrantedSecret>,
    holders: Option<&[jobtrail_core::Holder<'_>]>,
) -> Result<(serde_json::Value, Vec<String>), String> {
    let mut out = body.clone();
    let mut values = Vec::new();
    for pointer in sensitive {
        let Some(name) = out
            .pointer(pointer)
            .and_then(jobtrail_core::request::reference_name)
            .map(str::to_owned)
        else {
            continue;
        };
        let granted = secrets.get(&name);
        if let Some(h) = holders
            .unwrap_or_default()
            .iter()
            .find(|h| !granted.is_some_and(|g| g.grant.allows(h.name())))
        {
            return Err(format!(
                "secret {name:?} is no longer granted to {h} for this provider"
            ));
        }
        let Some(granted) = granted else {
            return Err(format!(
                "secret {name:?} is no longer granted for this provider"
            ));
        };
        let value = resolve_secret(&granted.from).await?;
        values.push(value.clone());
        if let Some(slot) = out.pointer_mut(pointer) {
            *slot = serde_json::Value::String(value);
        }
    }
    Ok((out, values))
}

/// Removes the values of the secrets a call sent from everything recorded about the call: a provider
/// that quotes the request back (a 422 repeating the body, a header echoing the token) must not put a
/// credential into the call log or the append-only history. Each value is matched raw and as it
/// appears inside a JSON string.
#[derive(Debug, Default)]
pub struct Scrubber {
    needles: Vec<Vec<u8>>,
}

/// What a scrubbed value is replaced with.
pub const SCRUBBED: &str = "[secret]";

/// The most an answer that repeats a secret behind JSON escapes may take parsed to be scrubbed as
/// JSON (a status answer within the default 1 MiB limit fits unless it is mostly tiny values);
/// past it, the whole body is replaced.
const SCRUB_PARSED_MOST: usize = 16 * 1024 * 1024;

impl Scrubber {
    /// Each value, as sent and in the spellings a provider's echo commonly takes: JSON-quoted, JSON
    /// with `/` escaped (PHP's `json_encode`), percent-encoded (a URL or a form). A JSON body is
    /// also read as JSON (see [`Scrubber::exchange`]), which catches every other JSON escape.
    pub fn new(values: &[String]) -> Self {
        use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
        let mut needles: Vec<Vec<u8>> = Vec::new();
        for v in values.iter().filter(|v| !v.is_empty()) {
            let quoted = serde_json::to_string(v).unwrap_or_default();
            let inner = quoted[1..quoted.len().saturating_sub(1).max(1)].to_owned();
            let spellings = [
                v.clone(),
                inner.replace('/', "\\/"),
                utf8_percent_encode(v, NON_ALPHANUMERIC).to_string(),
                inner,
            ];
            needles.extend(spellings.into_iter().map(String::into_bytes));
        }
        // Longest first, so a value containing another is replaced whole.
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles.dedup();
        Self { needles }
    }

    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    pub fn contains(&self, hay: &[u8]) -> bool {
        self.needles
            .iter()
            .any(|n| memchr::memmem::find(hay, n).is_some())
    }

    pub fn bytes(&self, hay: &[u8]) -> Vec<u8> {
        let mut out = hay.to_vec();
        for n in &self.needles {
            if memchr::memmem::find(&out, n).is_none() {
                continue;
            }
            let mut next = Vec::with_capacity(out.len());
            let mut last = 0;
            for at in memchr::memmem::find_iter(&out, n) {
                next.extend_from_slice(&out[last..at]);
                next.extend_from_slice(SCRUBBED.as_bytes());
                last = at + n.len();
            }
            next.extend_from_slice(&out[last..]);
            out = next;
        }
        out
    }

    pub fn text(&self, s: &str) -> String {
        if !self.contains(s.as_bytes()) {
            return s.to_owned();
        }
        String::from_utf8_lossy(&self.bytes(s.as_bytes())).into_owned()
    }

    pub fn json(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => *s = self.text(s),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.json(x)),
            serde_json::Value::Object(m) => {
                if m.keys().any(|k| self.contains(k.as_bytes())) {
                    *m = std::mem::take(m)
                        .into_iter()
                        .map(|(k, v)| (self.text(&k), v))
                        .collect();
                }
                m.values_mut().for_each(|x| self.json(x));
            }
            _ => {}
        }
    }

    /// Whether a body holds a secret behind JSON escapes no byte search knows (`\u0061`, `\/`),
    /// wherever they stand: in a JSON document, in one behind a prefix (a byte-order mark, an
    /// anti-hijacking `)]}'`), in one cut short or trailed by other text, in many (JSON lines).
    /// Escapes are decoded left to right, as JSON decodes them inside a string (escapes outside
    /// one mean nothing to any reader: decoding them too can only find more).
    fn escaped_in_json(&self, body: &[u8]) -> bool {
        self.hidden_behind(body, b'\\', unescape_one)
    }

    /// Whether a body holds a secret behind the escapes a URL, a form or an HTML page writes that
    /// no byte search for the usual spelling finds: percent-escapes in either case and of any
    /// choice of bytes (`%2f`, or `encodeURIComponent`'s `a-b%2Bc` beside the `%2D` searched for),
    /// and character references (`&#43;`, as Go's html/template writes `+`; `&#x2F;`; `&amp;`).
    /// No JSON reading undoes these, so an answer hiding an echo behind them is not kept.
    fn escaped_for_the_web(&self, body: &[u8]) -> bool {
        self.hidden_behind(body, b'%', unpercent_one)
            || self.hidden_behind(body, b'&', unreference_one)
    }

    /// Whether `body`, its escapes (each starting with the byte `escape`) decoded by `decode` left
    /// to right, holds a secret. Decoded into a window that is searched and moved on keeping its
    /// tail, so nothing the size of the body is built. Only a body with the escape byte can hide
    /// one; others are not read.
    fn hidden_behind(
        &self,
        body: &[u8],
        escape: u8,
        decode: fn(&[u8], &mut Vec<u8>) -> usize,
    ) -> bool {
        const WINDOW: usize = 64 * 1024;
        if memchr::memchr(escape, body).is_none() {
            return false;
        }
        // A secret that straddles two windows is found in the second: each keeps the last
        // window's tail, as long as the longest spelling less one byte.
        let tail = self.needles.iter().map(Vec::len).max().unwrap_or(1) - 1;
        let mut window = Vec::with_capacity(WINDOW + tail + 4);
        let mut at = 0;
        while at < body.len() {
            // Text up to the next escape is copied as it is, a window's worth at most.
            let plain = memchr::memchr(escape, &body[at..]).unwrap_or(body.len() - at);
            if plain > 0 {
                let run = plain.min(WINDOW);
                window.extend_from_slice(&body[at..at + run]);
                at += run;
            } else {
                at += decode(&body[at..], &mut window);
            }
            if window.len() >= WINDOW + tail {
                if self.contains(&window) {
                    return true;
                }
                window.drain(..window.len() - tail);
            }
        }
        self.contains(&window)
    }

    /// Scrub an exchange: its record, its headers and — unless `keep_body` (a result, kept exactly as
    /// sent) — its body. Returns whether the body repeats a secret.
    pub fn exchange(&self, ex: &mut Exchange, keep_body: bool) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut echoed = self.contains(&ex.body);
        if echoed && !keep_body {
            ex.body = self.bytes(&ex.body).into();
        }
        if self.escaped_in_json(&ex.body) {
            echoed = true;
            // Scrubbed as JSON where it can be parsed within a bound; replaced whole otherwise:
            // an answer the wire found wanting (too large, cut off, another request's), one whose
            // small values would take many times its text parsed (parsing it to scrub it would
            // let an echo cost what the wire's measure refuses), and one that is JSON only up to
            // the secret (cut short, or trailed by other text).
            if !keep_body {
                let parsed = (ex.error.is_none()
                    && jobtrail_core::json::footprint_within(&ex.body, SCRUB_PARSED_MOST).is_ok())
                .then(|| serde_json::from_slice::<serde_json::Value>(&ex.body).ok())
                .flatten();
                ex.body = match parsed {
                    Some(mut v) => {
                        self.json(&mut v);
                        serde_json::to_vec(&v).unwrap_or_default().into()
                    }
                    None => bytes::Bytes::from_static(SCRUBBED.as_bytes()),
                };
            }
        }
        if self.escaped_for_the_web(&ex.body) {
            echoed = true;
            if !keep_body {
                ex.body = bytes::Bytes::from_static(SCRUBBED.as_bytes());
            }
        }
        let mut headers = http::HeaderMap::new();
        for (name, value) in ex.headers.iter() {
            let v = value.as_bytes();
            let clean = if self.contains(v) {
                http::HeaderValue::from_bytes(&self.bytes(v))
                    .unwrap_or_else(|_| http::HeaderValue::from_static(SCRUBBED))
            } else if self.escaped_in_json(v) || self.escaped_for_the_web(v) {
                // A `Location` naming the key in lowercase escapes, say: small, so kept as nothing.
                http::HeaderValue::from_static(SCRUBBED)
            } else {
                value.clone()
            };
            headers.append(name.clone(), clean);
        }
        ex.headers = headers;
        let r = &mut ex.record;
        // Kept again from the scrubbed headers: the record's copies were cut to a length first,
        // and a cut can leave a secret's first part that no search for the whole secret finds.
        if ex.status.is_some() {
            r.response_headers = kept_headers(&ex.headers);
            r.provider_request_id = provider_request_id(&ex.headers);
        } else {
            self.json(&mut r.response_headers);
        }
        r.url = self.text(&r.url);
        r.outcome = self.text(&r.outcome);
        r.error_class = r.error_class.as_deref().map(|e| self.text(e));
        if echoed && r.response_sha256.is_some() {
            // The digest of what was sent would let a reader of the record test guesses at the
            // secret in it (a card number is a small space) against the words kept around it.
            // It is the digest of what is kept instead; of a refused result, nothing.
            r.response_sha256 = (!keep_body).then(|| hex::encode(Sha256::digest(&ex.body)));
        }
        echoed
    }
}

/// A URL a provider wrote, absolute or relative, as it may be stored (see [`sanitize_url`]); a
/// relative one stays relative.
pub fn sanitize_url_text(u: &str) -> String {
    sanitized_text(u, |_| REDACTED.to_owned())
}

/// A URL that names a job, as it may be stored ([`sanitize_url_text`]), but each redacted query
/// value replaced by `REDACTED-` and the first 16 hex digits of its SHA-256: two jobs whose URLs
/// differ only there (`?exportKey=A`, `?exportKey=B`: a name that merely contains `key`) stay
/// two, and no value is kept.
pub fn job_url_text(u: &str) -> String {
    sanitized_text(u, |v| {
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(v.as_bytes()));
        format!("{REDACTED}-{}", &digest[..16])
    })
}

/// A job id as it is recorded: one that is a URL (absolute with a host, or a path from the root:
/// OGC's `Location`) as [`job_url_text`] keeps it, any other as given (Google's `operations/abc`).
/// Every id compared with a recorded one (a create's answer, a lookup's list, a webhook's, one a
/// person adopts) is made so, and the same job is the same id.
pub fn recorded_job_id(id: String) -> String {
    if id.starts_with('/') || url::Url::parse(&id).is_ok_and(|u| u.has_host()) {
        job_url_text(&id)
    } else {
        id
    }
}

/// What a redacted query value is stored as.
const REDACTED: &str = "REDACTED";

fn sanitized_text(u: &str, redacted: impl Fn(&str) -> String) -> String {
    const BASE: &str = "http://relative.invalid";
    match url::Url::parse(u) {
        Ok(abs) => sanitized(&abs, redacted),
        // Relative: resolved against a stand-in to be read, then written relative again. One that
        // names its own host (`//host/x`, or `/\host/x`, which a URL parser reads alike) stays
        // scheme-relative, sanitized like any other: never stored as written, query and all.
        Err(_) => url::Url::parse(BASE)
            .and_then(|b| b.join(u))
            .map(|j| {
                let s = sanitized(&j, redacted);
                // Told by the host and port it resolved to, not by text: `//relative.invalid.x/`
                // names another host.
                let stand_in = j.host_str() == Some("relative.invalid") && j.port().is_none();
                match s.strip_prefix(BASE).filter(|_| stand_in) {
                    Some(relative) => relative.to_owned(),
                    None => s.strip_prefix("http:").unwrap_or(&s).to_owned(),
                }
            })
            .unwrap_or_else(|_| u.split(['?', '#']).next().unwrap_or_default().to_owned()),
    }
}

/// Whether a query parameter's name says it carries a credential anywhere in it (`code`,
/// `api_key`, `sig`): its value is redacted before a URL is stored.
pub fn secret_looking_query_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_QUERY_HINTS.iter().any(|h| lower.contains(h))
}

/// Whether a query parameter's whole name is a credential's (`code`, `api_key`, `sig`; not
/// `languageCode` or `pageToken`, which only contain such a word): refused in a contract's fixed
/// query.
pub fn credential_query_name(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "code",
        "key",
        "apikey",
        "token",
        "accesstoken",
        "authtoken",
        "idtoken",
        "sig",
        "signature",
        "secret",
        "clientsecret",
        "password",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "subscriptionkey",
    ];
    let bare: String = name
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.'))
        .collect::<String>()
        .to_ascii_lowercase();
    NAMES.contains(&bare.as_str())
}

/// The URL as it may be stored: no user info, secret-looking query values redacted, no fragment
/// (never sent, and where a sign-in leaves its `#access_token=`).
pub fn sanitize_url(u: &url::Url) -> String {
    sanitized(u, |_| REDACTED.to_owned())
}

fn sanitized(u: &url::Url, redacted: impl Fn(&str) -> String) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_fragment(None);
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let secret = secret_looking_query_name(&k);
                (
                    k.into_owned(),
                    if secret { redacted(&v) } else { v.into_owned() },
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

/// W3C trace context for this operation's trace id and this call's span id, flagged sampled as
/// the operation's trace is (`sampled`, [`crate::spans::operation_sampled`]).
pub fn inject_trace(headers: &mut http::HeaderMap, trace: TraceId, span: SpanId, sampled: bool) {
    let sc = SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(trace.to_bytes()),
        span,
        crate::spans::as_flags(sampled),
        true,
        TraceState::default(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);
    let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
    propagator.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
}

/// The trace context of a caller's W3C `traceparent`, if it carries a valid one (an invalid header
/// is ignored, as the W3C spec asks: the operation then starts a trace of its own).
pub fn extract_trace(headers: &http::HeaderMap) -> Option<jobtrail_core::TraceParent> {
    let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
    let cx = propagator.extract(&opentelemetry_http::HeaderExtractor(headers));
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    Some(jobtrail_core::TraceParent {
        trace: TraceId::from_random(sc.trace_id().to_bytes()),
        span: jobtrail_core::SpanId::from_bytes(sc.span_id().to_bytes())?,
        sampled: sc.is_sampled(),
    })
}

/// The span of one provider call, exported under the operation's trace: its id is the one the
/// `traceparent` header carries, its parent the worker's step (or, outside a step, none).
fn call_span(
    kind: CallKind,
    method: &http::Method,
    url: String,
    attempt: i32,
    trace: TraceId,
    span: SpanId,
) -> opentelemetry::global::BoxedSpan {
    use opentelemetry::trace::{SpanKind, Tracer as _};
    let tracer = crate::spans::tracer();
    let parent = opentelemetry::Context::current();
    let orphan = !parent.span().span_context().is_valid();
    crate::spans::with_ids(orphan.then_some(trace), span, || {
        tracer
            .span_builder(format!("provider {}", kind.as_str()))
            .with_kind(SpanKind::Client)
            .with_attributes([
                opentelemetry::KeyValue::new("http.request.method", method.to_string()),
                opentelemetry::KeyValue::new("url.full", url),
                opentelemetry::KeyValue::new("jobtrail.attempt", i64::from(attempt)),
            ])
            .start_with_context(&tracer, &parent)
    })
}

/// A finished exchange: what came back (if anything) and the record to log.
#[derive(Debug)]
pub struct Exchange {
    /// The body repeated a secret this call sent (results: the bytes are refused, not kept).
    pub echoed_secret: bool,
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
    /// The call could not be built (a value its URL or body needs is missing, a URL is
    /// malformed, the contract has no such call): nothing was sent.
    NotBuilt,
    /// The answer echoed another request's client request id: it is not the answer to ours
    /// (which may or may not have been processed).
    NotOurAnswer,
    /// The caller's lease would end before the call could: nothing was sent.
    LeaseTooShort,
    /// The URL is outside the origins the contract declares: nothing was sent.
    Origin,
    /// The caller gave up waiting (its worker is stopping): the request may have been processed.
    Abandoned,
    /// The caller had given up before the request was sent (its worker is stopping): nothing was
    /// sent.
    Stopping,
}

impl WireError {
    pub const fn class(self) -> &'static str {
        match self {
            WireError::Connect => "connect_failed",
            WireError::Timeout => "timeout",
            WireError::ConnectionLost => "connection_lost",
            WireError::TooLarge => "response_too_large",
            WireError::Secret => "secret_unresolved",
            WireError::NotBuilt => "call_not_built",
            WireError::NotOurAnswer => "answer_to_another_request",
            WireError::LeaseTooShort => "lease_too_short_to_send",
            WireError::Origin => "url_outside_origins",
            WireError::Abandoned => "abandoned_worker_stopping",
            WireError::Stopping => "not_sent_worker_stopping",
        }
    }
    /// Whether a call recorded with this error class never left this process (not even a
    /// connection was tried): nothing of the provider's is in its outcome or its duration.
    pub fn never_left(class: &str) -> bool {
        Self::ALL
            .iter()
            .any(|e| e.class() == class && e.not_sent() && *e != WireError::Connect)
    }

    const ALL: [WireError; 11] = [
        WireError::Connect,
        WireError::Timeout,
        WireError::ConnectionLost,
        WireError::TooLarge,
        WireError::Secret,
        WireError::NotBuilt,
        WireError::NotOurAnswer,
        WireError::LeaseTooShort,
        WireError::Origin,
        WireError::Abandoned,
        WireError::Stopping,
    ];

    /// Nothing reached the provider.
    pub const fn not_sent(self) -> bool {
        matches!(
            self,
            WireError::Connect
                | WireError::Secret
                | WireError::NotBuilt
                | WireError::LeaseTooShort
                | WireError::Origin
                | WireError::Stopping
        )
    }
}

/// What to send.
pub struct Outgoing<'a> {
    pub kind: CallKind,
    pub attempt: i32,
    pub method: http::Method,
    pub url: url::Url,
    /// The URL as the call's span exports it: sanitised and scrubbed of this call's secrets, as
    /// the record's is (a provider may name a URL that holds one under any name).
    pub shown_url: String,
    pub headers: http::HeaderMap,
    pub body: Option<Vec<u8>>,
    pub trace: TraceId,
    /// Whether the operation's trace is sampled ([`crate::spans::operation_sampled`]): its `traceparent`
    /// says so.
    pub sampled: bool,
    pub trace_header: Option<&'a http::HeaderName>,
    /// Where the call's own id goes (Azure's `x-ms-client-request-id`): an answer that echoes
    /// another id is not the answer to this call.
    pub client_request_id: Option<&'a http::HeaderName>,
    pub max_body: u64,
    /// The most memory the answer's JSON may take parsed ([`parsed_most`]); `None`: unchecked.
    pub parsed_most: Option<usize>,
    /// The instant by which the call must have ended (the caller's lease), and the longest the call
    /// can take: if it could not end in time it is not sent.
    pub end_by: Option<Instant>,
    pub budget: Duration,
    /// The clock the call is dated by ([`crate::CallCtx::clock`]).
    pub clock: crate::CallCtx,
}

/// Send one request and read the response up to `max_body` bytes. (`out` is boxed: an async fn
/// keeps a by-value argument twice, and this future lives as long as the call.)
pub async fn exchange(client: &reqwest::Client, mut out: Box<Outgoing<'_>>) -> Exchange {
    let span = new_span_id();
    let id = uuid::Uuid::now_v7();
    let mut headers = out.headers;
    // Never over a header already set (a load-time check keeps the names apart; this keeps it so).
    let id_header = out.client_request_id.filter(|h| !headers.contains_key(*h));
    if let Some(h) = id_header {
        headers.insert(
            h.clone(),
            http::HeaderValue::from_str(&id.to_string()).expect("a UUID is a header value"),
        );
    }
    inject_trace(&mut headers, out.trace, span, out.sampled);
    if let Some(h) = out.trace_header
        && !headers.contains_key(h)
        && let Ok(v) = http::HeaderValue::from_str(&out.trace.to_string())
    {
        headers.insert(h.clone(), v);
    }
    // The last checks before the bytes leave: a worker that was paused (SIGSTOP, a long GC-like
    // stall, a VM freeze) past its lease must not send on an operation another worker may own now;
    // one past its shutdown grace starts no call (one never sent is not an ambiguous create).
    let refused = if out
        .end_by
        .is_some_and(|end_by| Instant::now() + out.budget > end_by)
    {
        Some((
            WireError::LeaseTooShort,
            "the lease would end before the call could",
        ))
    } else if out.clock.abandon.as_ref().is_some_and(|a| a.is_cancelled()) {
        Some((WireError::Stopping, "the worker is stopping"))
    } else {
        None
    };
    if let Some((error, why)) = refused {
        let mut ex = not_sent(
            out.kind,
            out.attempt,
            &out.method,
            &out.url,
            out.trace,
            error,
            why,
        );
        ex.record.started_at = out.clock.now();
        return ex;
    }
    let started_at = out.clock.now();
    let t0 = Instant::now();
    let mut call_span = call_span(
        out.kind,
        &out.method,
        std::mem::take(&mut out.shown_url),
        out.attempt,
        out.trace,
        span,
    );
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
    let read = async {
        match req.send().await {
            Err(e) => error = Some(classify(&e)),
            Ok(mut resp) => {
                status = Some(resp.status().as_u16());
                resp_headers = resp.headers().clone();
                // Room for the length the answer declares, up to the most it may be, at once:
                // grown by doubling instead, the buffer would hold up to twice the answer (and
                // three times it while it moved), beyond what the result bytes' room counts.
                if let Some(declared) = resp.content_length() {
                    body.reserve_exact(declared.min(out.max_body) as usize);
                }
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
    };
    let abandoned = match &out.clock.abandon {
        Some(abandon) => tokio::select! {
            biased;
            () = read => false,
            () = abandon.cancelled() => true,
        },
        None => {
            read.await;
            false
        }
    };
    // Whatever arrived is not an answer: the connection is dropped mid-call.
    if abandoned {
        (status, error) = (None, Some(WireError::Abandoned));
        resp_headers.clear();
        body.clear();
    }
    // An answer whose JSON would take many times its text parsed (an object takes some 640 bytes)
    // is refused as one over its size: every call in flight may hold one parsed. (A result is the
    // contract's own limit's business: it is kept as bytes, and parsed once, to be checked.) No
    // text takes more than `MOST_PER_BYTE` times its length: a short answer is not measured.
    if error.is_none()
        && let Some(most) = out.parsed_most
        && parsed_beyond(&body, most)
    {
        error = Some(WireError::TooLarge);
    }
    // An echo of another id: a proxy or a provider that mixed up its answers.
    if error.is_none()
        && let Some(h) = id_header
        && let Some(echo) = resp_headers.get(h)
        && echo.to_str().ok() != Some(id.to_string().as_str())
    {
        error = Some(WireError::NotOurAnswer);
    }
    {
        use opentelemetry::trace::{Span as _, Status};
        if let Some(s) = status {
            call_span.set_attribute(opentelemetry::KeyValue::new(
                "http.response.status_code",
                i64::from(s),
            ));
        }
        if let Some(e) = error {
            call_span.set_attribute(opentelemetry::KeyValue::new("error.type", e.class()));
            call_span.set_status(Status::error(e.class()));
        } else if status.is_some_and(|s| s >= 500) {
            call_span.set_status(Status::error("server error"));
        }
        call_span.end();
    }
    let record = CallRecord {
        id,
        kind: out.kind,
        attempt: out.attempt.max(1),
        started_at,
        duration_ms: t0.elapsed().as_secs_f64() * 1000.0,
        method: out.method.to_string(),
        url: sanitize_url(&out.url),
        http_status: status.map(i32::from),
        response_headers: kept_headers(&resp_headers),
        provider_request_id: provider_request_id(&resp_headers),
        error_class: error.map(|e| e.class().to_owned()),
        outcome: String::new(),
        trace_id: out.trace.to_string(),
        span_id: span.to_string(),
        response_sha256: status
            .map(|_| sized_work(body.len(), || hex::encode(Sha256::digest(&body)))),
    };
    Exchange {
        echoed_secret: false,
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

/// An exchange that could not be built, so never left (`about:blank` stands for its URL).
pub fn not_built(
    kind: CallKind,
    attempt: i32,
    method: &http::Method,
    trace: TraceId,
    why: &str,
) -> Exchange {
    let blank = url::Url::parse("about:blank").expect("static URL");
    not_sent(
        kind,
        attempt,
        method,
        &blank,
        trace,
        WireError::NotBuilt,
        why,
    )
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
        echoed_secret: false,
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

/// Bytes from which work in proportion to their size (hashing, measuring, searching, checking) is
/// done off the runtime's thread: it would otherwise stall every other operation on the thread.
pub const BLOCKING_BYTES: usize = 256 << 10;

/// Work in proportion to an answer's size (its digest, its measure, the search for a secret in
/// it): past [`BLOCKING_BYTES`] (a result may be a gigabyte), done with this runtime thread handed
/// over to the others first (`block_in_place`), so the calls and steps of every other operation on
/// the thread go on. (How many large answers are read at once is the result room's to bound.)
pub fn sized_work<T>(size: usize, work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let multi =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if size >= BLOCKING_BYTES && multi {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// Whether `body`, parsed, would take more than `most` bytes. No text takes more than
/// `MOST_PER_BYTE` times its length: a short one is not measured, a long one is measured off the
/// async threads.
pub fn parsed_beyond(body: &[u8], most: usize) -> bool {
    body.len()
        .saturating_mul(jobtrail_core::json::MOST_PER_BYTE)
        > most
        && sized_work(body.len(), || {
            jobtrail_core::json::footprint_within(body, most).is_err_and(|e| e.too_large)
        })
}

/// The most memory an answer of at most `max_body` bytes may take parsed: sixteen times its
/// limit (an array of numbers, at its worst), at least 1 MiB.
pub fn parsed_most(max_body: u64) -> usize {
    usize::try_from(max_body.saturating_mul(16))
        .unwrap_or(usize::MAX)
        .max(1024 * 1024)
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

/// The provider's id for this request, from the first of its usual headers it sent.
fn provider_request_id(h: &http::HeaderMap) -> Option<String> {
    REQUEST_ID_HEADERS.iter().find_map(|name| {
        h.get(*name)
            .and_then(|v| v.to_str().ok())
            .map(|v| crate::text::truncate(v.to_owned(), KEPT_HEADER_BYTES))
    })
}

/// The most of one response header a call's record keeps (and a result's content type or
/// checksum, which its steps keep).
pub(crate) const KEPT_HEADER_BYTES: usize = 1024;

fn kept_headers(h: &http::HeaderMap) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for name in KEPT_HEADERS {
        if let Some(v) = h.get(*name).and_then(|v| v.to_str().ok()) {
            let v = if name.contains("location") || *name == "azure-asyncoperation" {
                sanitize_url_text(v)
            } else {
                v.to_owned()
            };
            // Every call's record keeps these: a provider's megabyte header is kept cut.
            let v = crate::text::truncate(v, KEPT_HEADER_BYTES);
            m.insert((*name).to_owned(), serde_json::Value::String(v));
        }
    }
    serde_json::Value::Object(m)
}

/// The largest value at a pointer a sparse read builds. A larger one (a status's `metadata` of
/// megabytes, which parsed takes some thirty times its text) is kept as the start of its JSON text,
/// as a string: every reader of a status keeps far less of a value than this anyway (progress, an
/// error's text), and a state, a URL or a checksum that long is no usable one.
pub const SPARSE_LEAF_MOST: usize = 64 * 1024;

/// The values at `pointers` in the JSON document `body`, parsed, in a document of their own in
/// which the same pointers lead to them: what a reader of a large answer needs, without the rest
/// built (a status answer that carries the job's whole result). Nothing but the values at the
/// pointers is held (each object on a pointer's way is read key by key, each array element by
/// element, not into a map or a list), and none of those larger than [`SPARSE_LEAF_MOST`]. An
/// array on a pointer's way becomes an object keyed by the index in the document built
/// (`/jobs/0/id` leads to the same value; the array's other elements are not built), also where an
/// outer pointer names that array and it is too large to keep whole. `None` when `body` is no JSON
/// object, or a pointer is the whole document.
pub fn sparse<'p>(
    body: &[u8],
    pointers: impl IntoIterator<Item = &'p str>,
) -> Option<serde_json::Value> {
    use serde_json::value::RawValue;
    let root: &RawValue = serde_json::from_slice(body).ok()?;
    if !root.get().trim_start().starts_with('{') {
        return None;
    }
    let pointers: Vec<Vec<String>> = pointers
        .into_iter()
        .map(|p| {
            Some(
                p.strip_prefix('/')?
                    .split('/')
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect(),
            )
        })
        .collect::<Option<_>>()?;
    // The top level is read once (the body is scanned once for it, not once per pointer).
    let wanted: std::collections::HashSet<&str> = pointers.iter().map(|t| t[0].as_str()).collect();
    let top = fields(root, &wanted)?;
    let mut out = serde_json::Map::new();
    'pointers: for tokens in &pointers {
        let Some(mut here) = top.get(tokens[0].as_str()).copied() else {
            continue;
        };
        for token in &tokens[1..] {
            here = match here.get().trim_start().as_bytes().first()? {
                b'{' => match field(here, token)? {
                    Some(v) => v,
                    None => continue 'pointers,
                },
                b'[' => match element(here, token)? {
                    Some(v) => v,
                    None => continue 'pointers,
                },
                _ => continue 'pointers,
            };
        }
        let raw = here.get();
        // Set when this value is kept only as a sign that it is there, not whole.
        let mut marker = false;
        let leaf = if raw.len() > SPARSE_LEAF_MOST {
            // Cut, it is no object: a pointer inside it (Google's `/error/code` beside `/error`)
            // is read on its own instead, and must not be overwritten by the cut text. An object
            // is still there, empty but for what those pointers read: dropped, a large error
            // without a code would read as the `done: true` beside it, a success.
            if pointers
                .iter()
                .any(|inner| inner.len() > tokens.len() && inner.starts_with(tokens))
            {
                if !raw.trim_start().starts_with('{') {
                    continue;
                }
                marker = true;
                serde_json::Value::Object(serde_json::Map::new())
            } else {
                let mut end = SPARSE_LEAF_MOST;
                while !raw.is_char_boundary(end) {
                    end -= 1;
                }
                serde_json::Value::String(format!("{}…", &raw[..end]))
            }
        } else {
            serde_json::from_str(raw).ok()?
        };
        let (last, parents) = tokens.split_last()?;
        let mut at = &mut out;
        for token in parents {
            match at
                .entry(token.clone())
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()))
            {
                serde_json::Value::Object(inner) => at = inner,
                // An outer pointer's value, there whole (an array): this one's is in it.
                _ => continue 'pointers,
            }
        }
        // (A pointer and one inside it: either way round, the outer value is there whole; a
        // marker never replaces what an inner pointer already put there.)
        if marker {
            at.entry(last.clone()).or_insert(leaf);
        } else {
            at.insert(last.clone(), leaf);
        }
    }
    Some(serde_json::Value::Object(out))
}

/// The values under `keys` in the JSON object `object` (the last of a key written twice, as a
/// parsed document keeps), read in one pass: nothing else is built. `None`: no object.
fn fields<'a>(
    object: &'a serde_json::value::RawValue,
    keys: &std::collections::HashSet<&str>,
) -> Option<std::collections::HashMap<String, &'a serde_json::value::RawValue>> {
    use serde::de::{DeserializeSeed, MapAccess, Visitor};
    struct Wanted<'k>(&'k std::collections::HashSet<&'k str>);
    impl<'de> DeserializeSeed<'de> for Wanted<'_> {
        type Value = Option<String>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl Visitor<'_> for Wanted<'_> {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a key")
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(self.0.contains(v).then(|| v.to_owned()))
        }
    }
    struct Fields<'k>(&'k std::collections::HashSet<&'k str>);
    impl<'de> Visitor<'de> for Fields<'_> {
        type Value = std::collections::HashMap<String, &'de serde_json::value::RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = std::collections::HashMap::new();
            while let Some(key) = map.next_key_seed(Wanted(self.0))? {
                let v: &'de serde_json::value::RawValue = map.next_value()?;
                if let Some(key) = key {
                    found.insert(key, v);
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object.get());
    serde::Deserializer::deserialize_map(&mut de, Fields(keys)).ok()
}

/// The value under `key` in the JSON object `object` (as [`fields`] reads it). `None`: no object;
/// `Some(None)`: no such key.
fn field<'a>(
    object: &'a serde_json::value::RawValue,
    key: &str,
) -> Option<Option<&'a serde_json::value::RawValue>> {
    Some(fields(object, &std::collections::HashSet::from([key]))?.remove(key))
}

/// The element at the index `token` names (RFC 6901: `0` or digits without a leading zero) in the
/// JSON array `array`, the ones before it skipped unbuilt. `None`: no array; `Some(None)`: no such
/// element.
fn element<'a>(
    array: &'a serde_json::value::RawValue,
    token: &str,
) -> Option<Option<&'a serde_json::value::RawValue>> {
    use serde::de::{SeqAccess, Visitor};
    struct At(Option<usize>);
    impl<'de> Visitor<'de> for At {
        type Value = Option<&'de serde_json::value::RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            let mut i = 0usize;
            // Read to the end: an array cut short is no array.
            while let Some(v) = seq.next_element::<&'de serde_json::value::RawValue>()? {
                if Some(i) == self.0 {
                    found = Some(v);
                }
                i += 1;
            }
            Ok(found)
        }
    }
    let canonical =
        token.bytes().all(|b| b.is_ascii_digit()) && (token == "0" || !token.starts_with('0'));
    let index = canonical.then(|| token.parse::<usize>().ok()).flatten();
    let mut de = serde_json::Deserializer::from_str(array.get());
    serde::Deserializer::deserialize_seq(&mut de, At(index)).ok()
}

/// Decodes the percent-escape (or the byte) at the start of `text` into `out`, returning the bytes
/// read: `%` and two hex digits of either case is the byte they name; anything else, itself.
fn unpercent_one(text: &[u8], out: &mut Vec<u8>) -> usize {
    match text {
        [b'%', hi, lo, ..] if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
            let hex = [*hi, *lo];
            // Two ASCII hex digits always parse.
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).unwrap_or("0"), 16).unwrap_or(0));
            3
        }
        _ => {
            out.push(text[0]);
            1
        }
    }
}

/// Decodes the character reference (or the byte) at the start of `text` into `out`, returning the
/// bytes read: a numeric one (`&#43;`, `&#x2F;`, its `;` optional as HTML reads it) and the five
/// names an escaper writes for ASCII (`&amp;` `&lt;` `&gt;` `&quot;` `&apos;`); anything else,
/// itself. Not an HTML decoder (a crate's would decode the whole body into a copy): only what
/// stands for the characters a credential is made of.
fn unreference_one(text: &[u8], out: &mut Vec<u8>) -> usize {
    const NAMED: [(&[u8], u8); 5] = [
        (b"&amp;", b'&'),
        (b"&lt;", b'<'),
        (b"&gt;", b'>'),
        (b"&quot;", b'"'),
        (b"&apos;", b'\''),
    ];
    if let Some((name, byte)) = NAMED.iter().find(|(n, _)| text.starts_with(n)) {
        out.push(*byte);
        return name.len();
    }
    let numeric = text.strip_prefix(b"&#").and_then(|rest| {
        let (hex, digits) = match rest {
            [b'x' | b'X', more @ ..] => (true, more),
            _ => (false, rest),
        };
        let len = digits
            .iter()
            .take(8)
            .take_while(|d| {
                if hex {
                    d.is_ascii_hexdigit()
                } else {
                    d.is_ascii_digit()
                }
            })
            .count();
        let code = u32::from_str_radix(
            std::str::from_utf8(&digits[..len]).ok()?,
            if hex { 16 } else { 10 },
        )
        .ok()?;
        let c = char::from_u32(code)?;
        let semi = usize::from(digits.get(len) == Some(&b';'));
        Some((c, 2 + usize::from(hex) + len + semi))
    });
    match numeric {
        Some((c, read)) => {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            read
        }
        None => {
            out.push(text[0]);
            1
        }
    }
}

/// Decodes the escape (or the byte) at the start of `text` into `out` as JSON decodes it inside a
/// string, returning the bytes read: `\uXXXX` (a surrogate pair as one character, a lone
/// surrogate as U+FFFD), `\"`, `\\`, `\/` and the control escapes; anything else, itself.
fn unescape_one(text: &[u8], out: &mut Vec<u8>) -> usize {
    fn hex4(t: &[u8]) -> Option<u16> {
        // Four hex digits, as JSON has them (`from_str_radix` alone would take a sign too).
        let digits = t.get(..4).filter(|d| d.iter().all(u8::is_ascii_hexdigit))?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    }
    let [b'\\', escape, ..] = text else {
        out.push(text[0]);
        return 1;
    };
    let (decoded, read) = match escape {
        b'u' => match hex4(&text[2..]) {
            None => (None, 1),
            Some(high @ 0xD800..=0xDBFF) => {
                match (text.get(6..8), hex4(text.get(8..).unwrap_or(&[]))) {
                    (Some(br"\u"), Some(low @ 0xDC00..=0xDFFF)) => (
                        char::from_u32(
                            0x10000
                                + ((u32::from(high) - 0xD800) << 10)
                                + (u32::from(low) - 0xDC00),
                        ),
                        12,
                    ),
                    _ => (Some(char::REPLACEMENT_CHARACTER), 6),
                }
            }
            Some(unit) => (
                Some(char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER)),
                6,
            ),
        },
        b'"' | b'\\' | b'/' => (Some(char::from(*escape)), 2),
        b'b' => (Some('\u{8}'), 2),
        b'f' => (Some('\u{c}'), 2),
        b'n' => (Some('\n'), 2),
        b'r' => (Some('\r'), 2),
        b't' => (Some('\t'), 2),
        _ => (None, 1),
    };
    match decoded {
        Some(c) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        None => out.push(b'\\'),
    }
    read
}

/// The bytes of the JSON value at `pointer` inside `body`, exactly as the provider wrote them
/// (no re-serialisation: a digest of them is a digest of the provider's bytes). `None` when the
/// body is not JSON, the pointer leads nowhere, or the value there is `null`.
pub fn raw_at<'a>(body: &'a [u8], pointer: &str) -> Option<&'a [u8]> {
    use serde_json::value::RawValue;
    let mut here: &RawValue = serde_json::from_slice(body).ok()?;
    if !pointer.is_empty() {
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            // One member found by walking past the others, none of them kept: a map of every key
            // (or a list of every item) of a provider's megabytes would cost many times them.
            let step = match here.get().trim_start().as_bytes().first()? {
                b'{' => Member::Key(&token),
                // RFC 6901: an index is digits without a leading zero.
                b'[' if !token.is_empty()
                    && token.bytes().all(|b| b.is_ascii_digit())
                    && (token.len() == 1 || !token.starts_with('0')) =>
                {
                    Member::Index(token.parse::<usize>().ok()?)
                }
                _ => return None,
            };
            let mut de = serde_json::Deserializer::from_str(here.get());
            here = serde::de::DeserializeSeed::deserialize(step, &mut de).ok()??;
            de.end().ok()?;
        }
    }
    let text = here.get();
    if text == "null" {
        return None;
    }
    // `text` borrows from `body`: hand back that very slice.
    let start = text.as_ptr() as usize - body.as_ptr() as usize;
    Some(&body[start..start + text.len()])
}

/// One member of a JSON object (by key; the last of a key given twice, as a map would keep) or
/// array (by index), read by [`raw_at`] without building the others.
enum Member<'t> {
    Key(&'t str),
    Index(usize),
}

impl<'de> serde::de::DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de serde_json::value::RawValue>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match self {
            Member::Key(_) => d.deserialize_map(self),
            Member::Index(_) => d.deserialize_seq(self),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Member<'_> {
    type Value = Option<&'de serde_json::value::RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object or array")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let Member::Key(key) = self else {
            return Err(serde::de::Error::custom("an index into an object"));
        };
        let mut found = None;
        while let Some(this) = m.next_key_seed(IsKey(key))? {
            if this {
                found = Some(m.next_value()?);
            } else {
                m.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(found)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        let Member::Index(at) = self else {
            return Err(serde::de::Error::custom("a key into an array"));
        };
        let (mut found, mut i) = (None, 0usize);
        loop {
            if i == at {
                match s.next_element()? {
                    Some(v) => found = Some(v),
                    None => break,
                }
            } else if s.next_element::<serde::de::IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }
}

/// Whether an object's key is this one, compared as read (an escaped key is unescaped into a
/// buffer of the reader's; nothing is kept).
struct IsKey<'t>(&'t str);

impl<'de> serde::de::DeserializeSeed<'de> for IsKey<'_> {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for IsKey<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

/// `Retry-After` as a delay: delta-seconds or an HTTP-date (parsed by `httpdate`). A number of
/// seconds too large for 64 bits means "a very long time": it becomes the largest delay (which the
/// contract's bounds then clamp), never "no Retry-After". A date is counted from the answer's own
/// `Date` when it has one (the provider's clock against the provider's clock: a worker whose clock
/// is off does not shorten or stretch the wait), else from this host's clock.
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
    let now = h
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d.trim()).ok())
        .unwrap_or_else(std::time::SystemTime::now);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sparse read finds at every pointer what the whole document has there (and nothing where
    /// it has nothing), and leaves the rest unbuilt.
    #[test]
    fn a_sparse_read_agrees_with_the_whole_document_at_its_pointers() {
        let body = br#"{"status": "Running", "meta": {"a~b": {"c/d": 5}, "when": "now", "n": null},
            "dup": 1, "dup": 2, "s": "text", "response": {"items": [1, 2, 3]},
            "error": {"code": "X", "details": [{"k": 1}]}}"#;
        let whole: serde_json::Value = serde_json::from_slice(body).unwrap();
        let pointers = [
            "/status",
            "/meta/a~0b/c~1d",
            "/meta/when",
            "/meta/n",
            "/dup",
            "/s/x",
            "/missing",
            "/meta/missing/x",
            "/error",
            "/error/code",
            "/response/items/0",
            "/response/items/2",
            "/response/items/3",
            "/response/items/01",
            "/response/items/-",
            "/response/items/x",
            "/error/details/0/k",
            "/s/0",
        ];
        let sparse = sparse(body, pointers).unwrap();
        for p in pointers {
            assert_eq!(sparse.pointer(p), whole.pointer(p), "{p}");
        }
        // Of an array on the way, only the elements a pointer names are built.
        assert_eq!(
            sparse["response"],
            serde_json::json!({"items": {"0": 1, "2": 3}})
        );
        // An array and a pointer into it, either way round: the array whole, the pointer leads in.
        for order in [
            ["/error/details", "/error/details/0/k"],
            ["/error/details/0/k", "/error/details"],
        ] {
            let read = super::sparse(body, order).unwrap();
            assert_eq!(
                read["error"]["details"], whole["error"]["details"],
                "{order:?}"
            );
            assert_eq!(
                read.pointer("/error/details/0/k"),
                Some(&serde_json::json!(1))
            );
        }
        // An array cut short is no document.
        assert!(super::sparse(br#"{"a": [1, 2"#, ["/a/0"]).is_none());
        // The outer value whole whichever pointer came first.
        let inner_first = super::sparse(body, ["/meta/when", "/meta"]).unwrap();
        assert_eq!(inner_first["meta"], whole["meta"]);
        // The whole document, or not an object: read it whole instead.
        assert!(super::sparse(body, [""]).is_none());
        assert!(super::sparse(b"[1]", ["/0"]).is_none());
        assert!(super::sparse(b"{\"a\": ", ["/a"]).is_none());
        // A value past the bound is kept as the start of its text, not built.
        let huge = format!(
            r#"{{"done": false, "metadata": [{}0], "x": {{"done": true}}}}"#,
            "0,".repeat(100_000)
        );
        let read = super::sparse(huge.as_bytes(), ["/done", "/metadata", "/x/done"]).unwrap();
        assert_eq!(read["done"], false);
        assert_eq!(read["x"]["done"], true);
        let kept = read["metadata"].as_str().unwrap();
        assert!(
            kept.len() <= super::SPARSE_LEAF_MOST + 4 && kept.starts_with("[0,0,"),
            "{}",
            kept.len()
        );
        // A pointer inside a value cut for its size is read on its own, whichever comes first.
        let error = format!(
            r#"{{"done": true, "error": {{"code": 3, "details": [{}0]}}}}"#,
            "0,".repeat(50_000)
        );
        for order in [["/error/code", "/error"], ["/error", "/error/code"]] {
            let read = super::sparse(error.as_bytes(), order).unwrap();
            assert_eq!(read["error"]["code"], 3, "{order:?}");
        }
        // A large object cut, without the inner value a pointer looks for, is still there: a
        // large error without a code must not read as the `done: true` beside it.
        let error = format!(
            r#"{{"done": true, "error": {{"message": "{}"}}, "response": {{"a": 1}}}}"#,
            "x".repeat(70_000)
        );
        for order in [
            ["/error/code", "/error", "/done"],
            ["/done", "/error", "/error/code"],
        ] {
            let read = super::sparse(error.as_bytes(), order).unwrap();
            let state = ["/error/code", "/error", "/done"]
                .iter()
                .find_map(|p| read.pointer(p).filter(|v| !v.is_null()));
            assert_eq!(state, Some(&serde_json::json!({})), "{order:?}");
        }
        // The last of a key written twice, as a parsed document keeps; escaped keys are read.
        let twice = br#"{"s": "a", "\u0073": "b", "t": {"k": 1, "k": 2}}"#;
        let read = super::sparse(twice, ["/s", "/t/k"]).unwrap();
        assert_eq!(
            (read["s"].as_str(), read["t"]["k"].as_i64()),
            (Some("b"), Some(2))
        );
    }

    #[test]
    fn the_value_at_a_pointer_is_the_providers_own_bytes() {
        let body = br#"{"id": "j1", "result": {"b": 1.50,  "a": "\u00e9", "n": [1, 2e3]},
            "a/b": {"~x": [true, null]}, "dup": 1, "dup": 2, "e\u0073c": 7}"#;
        let at = |p: &str| raw_at(body, p).map(|b| String::from_utf8(b.to_vec()).unwrap());
        // Spacing, number spelling and escapes as sent: re-serialising would change all three.
        assert_eq!(
            at("/result").as_deref(),
            Some(r#"{"b": 1.50,  "a": "\u00e9", "n": [1, 2e3]}"#)
        );
        assert_eq!(at("/result/n/1").as_deref(), Some("2e3"));
        assert_eq!(at("/esc").as_deref(), Some("7"), "a key read unescaped");
        assert_eq!(at("/a~1b/~0x/0").as_deref(), Some("true"));
        assert_eq!(
            at("/dup").as_deref(),
            Some("2"),
            "the last of duplicate keys, as serde_json reads it"
        );
        assert_eq!(
            at("").as_deref().map(|s| s.starts_with("{\"id\"")),
            Some(true)
        );
        for nowhere in [
            "/a~1b/~0x/1",
            "/missing",
            "/result/n/01",
            "/result/n/-",
            "/result/n/9",
            "/id/x",
            "result",
        ] {
            assert_eq!(at(nowhere), None, "{nowhere}");
        }
        assert_eq!(raw_at(b"not json", ""), None);
        assert_eq!(
            raw_at(b"{\"a\": 1", "/a"),
            None,
            "a truncated document has no parts"
        );
    }

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
        // Counted from the answer's own Date: a provider (or a worker) whose clock is off by
        // years still means "30 s".
        h.insert("date", "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap());
        h.insert(
            "retry-after",
            "Sun, 06 Nov 1994 08:50:07 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), Some(Duration::from_secs(30)));
        h.remove("date");
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
        // Beyond u64: the longest wait, not none at all.
        h.insert("retry-after", "99999999999999999999999999".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::MAX));
    }

    #[test]
    fn traceparent_carries_the_operation_trace() {
        let trace: TraceId = "4bf92f3577b34da6a3ce929d0e0e4736".parse().unwrap();
        let span = SpanId::from_bytes([0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        for (sampled, flags) in [(true, "01"), (false, "00")] {
            let mut h = http::HeaderMap::new();
            inject_trace(&mut h, trace, span, sampled);
            assert_eq!(
                h.get("traceparent").unwrap(),
                &format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}")
            );
            // Read back as it was sent, its flag too.
            let back = extract_trace(&h).unwrap();
            assert_eq!((back.trace, back.sampled), (trace, sampled));
        }
    }

    #[test]
    fn a_job_id_is_recorded_with_a_urls_capability_blanked_and_others_as_given() {
        for plain in ["job_1", "operations/abc-1", "projects/p/operations/9?x"] {
            assert_eq!(recorded_job_id(plain.into()), plain);
        }
        for (url, token) in [
            ("https://h.test/jobs/7?access_token=tok-1&page=2", "tok-1"),
            ("/jobs/7?sig=sig-2", "sig-2"),
        ] {
            let id = recorded_job_id(url.into());
            assert!(id.contains("REDACTED-") && !id.contains(token), "{id}");
            assert_eq!(id, recorded_job_id(url.into()), "the same job, the same id");
        }
    }

    #[test]
    fn echoed_secrets_are_scrubbed_raw_and_inside_json() {
        let s = Scrubber::new(&["4111-1111".into(), "tok\"en".into()]);
        assert_eq!(
            s.text("card 4111-1111 refused"),
            format!("card {SCRUBBED} refused")
        );
        // A value with a quote, as a provider's JSON would quote it.
        let echoed = serde_json::json!({"error": "bad secret tok\"en"}).to_string();
        let clean = s.text(&echoed);
        assert!(
            !clean.contains("tok\\\"en") && !clean.contains("tok\"en"),
            "{clean}"
        );
        assert!(clean.contains(SCRUBBED), "{clean}");
        let mut v = serde_json::json!({"a": ["x 4111-1111 y", {"b": "4111-1111"}]});
        s.json(&mut v);
        assert!(!v.to_string().contains("4111"));
        assert_eq!(Scrubber::new(&[String::new()]).text("anything"), "anything");
    }

    fn exchange_with_body(body: &str) -> Exchange {
        let trace = jobtrail_core::TraceId::from_random([7; 16]);
        let mut ex = not_built(CallKind::Status, 1, &http::Method::GET, trace, "test");
        ex.status = Some(200);
        ex.error = None;
        ex.body = bytes::Bytes::from(body.to_owned());
        ex
    }

    #[test]
    fn secrets_echoed_in_other_spellings_are_caught() {
        let s = Scrubber::new(&["ab/cd+ef=".into()]);
        // PHP's json_encode escapes the slash; a URL or a form percent-encodes it.
        for echo in [
            r#"{"error":"token ab\/cd+ef= refused"}"#,
            "https://p.example/cb?token=ab%2Fcd%2Bef%3D",
        ] {
            assert!(s.contains(echo.as_bytes()), "{echo}");
            assert!(!s.text(echo).contains("cd"), "{}", s.text(echo));
        }
        // Any other JSON escape: read as JSON, scrubbed as JSON (keys too).
        let mut ex = exchange_with_body(r#"{"error": "\u0061b/cd+ef= refused", "ab\/cd+ef=": 1}"#);
        assert!(s.exchange(&mut ex, false));
        let body = String::from_utf8(ex.body.to_vec()).unwrap();
        assert!(!body.contains("cd+ef") && body.contains(SCRUBBED), "{body}");
        // A kept result is not rewritten, but the echo is reported (and the result refused).
        let mut ex = exchange_with_body(r#"["\u0061b/cd+ef="]"#);
        assert!(s.exchange(&mut ex, true));
        assert_eq!(&ex.body[..], br#"["\u0061b/cd+ef="]"#);
        // JSON only up to the echo (trailed by other text, or cut short): not kept at all.
        for cut in [
            r#"{"e": "\u0061b/cd+ef="} and more"#,
            r#"{"e": "\u0061b/cd+ef=", "f": "#,
        ] {
            let mut ex = exchange_with_body(cut);
            assert!(s.exchange(&mut ex, false), "{cut}");
            assert_eq!(&ex.body[..], SCRUBBED.as_bytes(), "{cut}");
        }
        // No backslash, no secret: the body is left alone, unparsed.
        let mut ex = exchange_with_body(r#"{"ok": true}"#);
        assert!(!s.exchange(&mut ex, false));
        // Behind the escapes of a URL, a form or a page, in spellings no byte search lists:
        // lowercase percent-escapes, some bytes escaped and not others (`encodeURIComponent`
        // leaves `-` as it is, which the searched spelling escapes), character references
        // (Go's html/template writes `+` as `&#43;`). The answer is not kept; a result is refused.
        let s3 = Scrubber::new(&["ab-cd+ef/gh=".into()]);
        for hidden in [
            "https://p.example/cb?token=ab%2dcd%2bef%2fgh%3d",
            "<a href=\"/cb?t=ab-cd%2Bef%2Fgh%3D\">retry</a>",
            "<p>key ab-cd&#43;ef/gh= refused</p>",
            "<p>key ab&#x2D;cd&#X2b;ef&#47gh&#61; refused</p>",
        ] {
            assert!(!s3.contains(hidden.as_bytes()), "{hidden}");
            let mut ex = exchange_with_body(hidden);
            assert!(s3.exchange(&mut ex, false), "{hidden}");
            assert_eq!(&ex.body[..], SCRUBBED.as_bytes(), "{hidden}");
            let mut ex = exchange_with_body(hidden);
            assert!(s3.exchange(&mut ex, true), "{hidden}");
            assert_eq!(&ex.body[..], hidden.as_bytes());
        }
        // A header naming it so is kept as nothing.
        let mut ex = exchange_with_body("{}");
        ex.headers.insert(
            http::header::LOCATION,
            http::HeaderValue::from_static("/jobs/1?key=ab-cd%2bef%2fgh%3d"),
        );
        s3.exchange(&mut ex, false);
        assert_eq!(ex.headers[http::header::LOCATION], SCRUBBED);
        // Escapes that name no secret, and escapes cut short at the end, leave the answer alone.
        for plain in [
            "100% done &amp; 50%2 &#43;",
            "ab-cd+ef/gh%",
            "ab-cd+ef/gh&#",
            "ab-cd+ef/gh&#x",
            "&#99999999999; &#x110000; &#; %zz ab-cd+ef/g%",
        ] {
            let mut ex = exchange_with_body(plain);
            assert!(!s3.exchange(&mut ex, false), "{plain}");
            assert_eq!(&ex.body[..], plain.as_bytes());
        }
        // Wherever the escapes stand, a kept result is refused: behind a byte-order mark or an
        // anti-hijacking prefix (which a lenient reader strips), in the second of JSON lines,
        // across the scan's windows, as a surrogate pair or a non-ASCII character escaped.
        let across = (65_500..65_560).map(|pad| {
            format!(
                r#"{{"pad": "{}", "k": "\u0061b\/cd+ef="}}"#,
                "x".repeat(pad)
            )
        });
        for kept in [
            "\u{feff}{\"k\": \"\\u0061b/cd+ef=\"}".to_owned(),
            ")]}'\n{\"k\": \"a\\u0062/cd+ef=\"}".to_owned(),
            "{\"a\": 1}\n{\"k\": [\"ab\\/cd\\u002bef=\"]}\n".to_owned(),
        ]
        .into_iter()
        .chain(across)
        {
            let mut ex = exchange_with_body(&kept);
            assert!(s.exchange(&mut ex, true), "{}", &kept[..kept.len().min(60)]);
        }
        let s2 = Scrubber::new(&["p\u{e4}ss\u{1f511}".into()]);
        for hidden in [r#"["p\u00e4ss\ud83d\udd11"]"#, r#"["\u0070ä\u0073s🔑"]"#] {
            let mut ex = exchange_with_body(hidden);
            assert!(s2.exchange(&mut ex, true), "{hidden}");
        }
        // `\u` takes four hex digits, no sign (JSON refuses `\u+061`: no reader decodes it).
        let mut ex = exchange_with_body(r#"["\u+061b/cd+ef="]"#);
        assert!(!s.exchange(&mut ex, true));
        // An escaped backslash before `u0061` is a backslash and the letters, as JSON reads it.
        let mut ex = exchange_with_body(r#"["\\u0061b/cd+ef="]"#);
        assert!(!s.exchange(&mut ex, true));
        // An echo behind an escape in an answer of many small values (an error page to a result
        // call, which no wire measure bounds): 1 MiB of them would take some 100 MiB parsed to
        // scrub, so the body is not parsed but replaced whole. So is one the wire refused.
        let flood = format!(r#"[{}"\u0061b/cd+ef="]"#, r#"{"":0},"#.repeat(150_000));
        let mut ex = exchange_with_body(&flood);
        assert!(s.exchange(&mut ex, false));
        assert_eq!(&ex.body[..], SCRUBBED.as_bytes());
        let mut ex = exchange_with_body(r#"{"e": "\u0061b/cd+ef="}"#);
        ex.error = Some(WireError::TooLarge);
        assert!(s.exchange(&mut ex, false));
        assert_eq!(&ex.body[..], SCRUBBED.as_bytes());
    }

    /// A secret a provider echoes in a header the record keeps is scrubbed before the header is
    /// cut to the record's length (cut first, its first part was kept: no search for the whole
    /// secret finds a part); a relative Location keeps no secret-looking query value; no recorded
    /// URL keeps a fragment; and an escaped echo is found in a large answer, and in a kept result
    /// of any size (searched without building it), even among a flood of small values.
    #[test]
    fn what_a_record_keeps_of_an_answer_holds_no_secret() {
        let secret = "sk-live-0123456789abcdef";
        let s = Scrubber::new(&[secret.into()]);
        let mut ex = exchange_with_body("{}");
        let padded = format!("{}{secret}", "x".repeat(KEPT_HEADER_BYTES - 10));
        ex.headers.insert("x-request-id", padded.parse().unwrap());
        ex.headers.insert(
            "location",
            format!("/jobs/1?sig={secret}&page=2#access_token={secret}")
                .parse()
                .unwrap(),
        );
        ex.record.response_headers = kept_headers(&ex.headers);
        ex.record.provider_request_id = provider_request_id(&ex.headers);
        assert!(!s.exchange(&mut ex, false));
        // The digest of an answer that repeats the secret is of what is kept: the one of what was
        // sent is a test for guesses at the secret. Of a result refused for it, none.
        let digest = |b: &[u8]| Some(hex::encode(Sha256::digest(b)));
        for keep_body in [false, true] {
            let sent = format!(r#"{{"error":"card {secret} declined"}}"#);
            let mut echo = exchange_with_body(&sent);
            echo.record.response_sha256 = digest(sent.as_bytes());
            assert!(s.exchange(&mut echo, keep_body));
            let kept = &echo.record.response_sha256;
            assert_ne!(*kept, digest(sent.as_bytes()), "keep_body {keep_body}");
            if keep_body {
                assert_eq!(*kept, None);
            } else {
                assert_eq!(*kept, digest(&echo.body));
            }
        }
        let kept = format!(
            "{} {:?}",
            ex.record.response_headers, ex.record.provider_request_id
        );
        assert!(!kept.contains("sk-live"), "{kept}");
        assert!(kept.contains("/jobs/1?sig=REDACTED&page=2"), "{kept}");
        assert!(!kept.contains("access_token"), "{kept}");
        // Even with no secret to scrub, a relative URL is sanitised and a fragment dropped.
        let raw = "/jobs/1?token=abc#frag";
        assert_eq!(sanitize_url_text(raw), "/jobs/1?token=REDACTED");
        assert_eq!(
            sanitize_url_text("https://u:p@p.example/a#x"),
            "https://p.example/a"
        );
        // A reference to another host without a scheme (`Location: //host/x` is legal) is sanitized
        // as any other and stays scheme-relative; so is a job id of that form.
        assert_eq!(
            sanitize_url_text("//h.test/x?sig=s3cr3t"),
            "//h.test/x?sig=REDACTED"
        );
        assert_eq!(
            sanitize_url_text("/\\h.test/x?sig=s3cr3t"),
            "//h.test/x?sig=REDACTED"
        );
        for other in [
            "//relative.invalid.h.test/x?sig=s3cr3t",
            "//relative.invalid:81/x?sig=s3cr3t",
        ] {
            let kept = sanitize_url_text(other);
            assert_eq!(
                kept,
                other.replace("s3cr3t", "REDACTED"),
                "another host stays one"
            );
        }
        let id = recorded_job_id("//h.test/jobs/1?access_token=s3cr3t".into());
        assert!(
            id.starts_with("//h.test/jobs/1?access_token=REDACTED-"),
            "{id}"
        );
        // A URL that does not parse keeps no query.
        assert_eq!(
            sanitize_url_text("https://h.test:99999/r?sig=s3cr3t"),
            "https://h.test:99999/r"
        );
        // An escaped echo in a large answer that is no result.
        let large = format!(
            r#"{{"pad":"{}","error":"sk-live-0123456789abcdef"}}"#,
            "y".repeat(5 << 20)
        );
        let mut ex = exchange_with_body(&large);
        assert!(s.exchange(&mut ex, false));
        assert!(!String::from_utf8_lossy(&ex.body).contains("0123456789abcdef"));
        // A kept result of 6 MiB of small objects with the echo escaped at its end (before, a
        // result over 4 MiB was not searched for escapes at all).
        let result = format!(
            r#"[{}{{"k":"sk-live-0123456789abcdef"}}]"#,
            r#"{"a":0},"#.repeat(800_000)
        );
        let mut ex = exchange_with_body(&result);
        assert!(s.exchange(&mut ex, true));
        assert_eq!(&ex.body[..], result.as_bytes(), "kept as sent");
    }

    /// Work on a large answer hands its runtime thread over: another task runs meanwhile, even
    /// on a runtime of one thread (done inline, it waited for the work, which waits for it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_on_a_large_answer_lets_other_tasks_run() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // Both on the runtime's one worker thread (the test's own body is not on it).
        let seen = tokio::spawn(async {
            let ran = std::sync::Arc::new(AtomicBool::new(false));
            let other = {
                let ran = ran.clone();
                tokio::spawn(async move { ran.store(true, Ordering::SeqCst) })
            };
            let seen = sized_work(BLOCKING_BYTES, || {
                let until = Instant::now() + Duration::from_secs(5);
                while !ran.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
                ran.load(Ordering::SeqCst)
            });
            other.await.unwrap();
            seen
        })
        .await
        .unwrap();
        assert!(seen, "the other task waited for the work");
        // A small answer's work is done in place (no thread handed over for a few bytes).
        assert_eq!(sized_work(10, || 1), 1);
    }

    #[tokio::test]
    async fn secret_files_are_read_only_when_regular_and_small() {
        let dir = std::env::temp_dir().join(format!("jt-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("token");
        std::fs::write(&ok, "s3cret\n").unwrap();
        let file = |p: &std::path::Path| SecretRef::File(p.display().to_string());
        assert_eq!(resolve_secret(&file(&ok)).await.unwrap(), "s3cret");
        // A file created empty (or holding only a newline) is no credential.
        for blank in ["", "\n", " \r\n"] {
            let empty = dir.join("empty");
            std::fs::write(&empty, blank).unwrap();
            assert!(
                resolve_secret(&file(&empty))
                    .await
                    .unwrap_err()
                    .contains("is empty"),
                "{blank:?}"
            );
        }
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; MAX_SECRET_BYTES as usize + 1]).unwrap();
        assert!(
            resolve_secret(&file(&big))
                .await
                .unwrap_err()
                .contains("larger")
        );
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
        // SAFETY: creating a FIFO at a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        assert!(
            resolve_secret(&file(&fifo))
                .await
                .unwrap_err()
                .contains("not a regular file")
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a FIFO never blocks"
        );
        let zero = SecretRef::File("/dev/zero".into());
        assert!(
            resolve_secret(&zero)
                .await
                .unwrap_err()
                .contains("not a regular file")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
