//! The config-driven HTTP adapter: a [`Contract`] turned into calls and closed outcomes.

use crate::contract::{
    Access, CallName, Contract, HttpVersion, Locator, Meaning, ResultFrom, TokenPlacement,
};
use crate::outcome::*;
use crate::wire::{self, Exchange, Outgoing, WireError};
use crate::{CallCtx, Provider, ProviderFuture, text};
use jobtrail_core::outcome::Phase;
use jobtrail_core::{CallKind, OperationRecord};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::sync::Arc;

const PATH_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The most of a provider's state (and `updated_at`) text a record keeps: longer than any state a
/// contract names, so a longer one is recorded cut, as the unknown state it is.
const MAX_STATE_BYTES: usize = 256;
/// The most of a provider's progress value a record keeps, as JSON text.
const MAX_PROGRESS_BYTES: usize = 2048;
/// The longest URL or checksum taken from a provider's answer; a longer one is treated as absent.
use jobtrail_core::ids::MAX_LOCATOR_BYTES;
/// An operation's cookie jar: at most this many cookies (browsers keep about 50 per domain), each
/// `Set-Cookie` at most this long (RFC 6265's minimum a client must support), the jar as stored at
/// most this many bytes.
/// The most of an answer's body a call's recorded reason quotes.
const REASON_CHARS: usize = 200;
const MAX_COOKIES: usize = 50;
const MAX_COOKIE_BYTES: usize = 4096;
const MAX_JAR_BYTES: usize = 64 * 1024;

/// A job id or target that is a resource name (Google's `operations/123`, Azure's
/// `subscriptions/…/resourcegroups/…`) as path segments, each encoded. An empty, `.` or `..`
/// segment (even percent-encoded, URL parsers read `%2E` as a dot) could move the request
/// elsewhere: such a value is sent as one encoded segment instead, which stays in place.
fn as_path(job: &str) -> String {
    let enc = |s: &str| utf8_percent_encode(s, PATH_VALUE).to_string();
    let segments: Vec<&str> = job.split('/').collect();
    if segments.iter().any(|s| {
        let decoded = percent_encoding::percent_decode_str(s).decode_utf8_lossy();
        decoded.is_empty() || decoded == "." || decoded == ".."
    }) {
        return enc(job);
    }
    segments
        .iter()
        .map(|s| enc(s))
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether two URLs name the same place: scheme, host, port and path, whatever their query and
/// fragment (a pre-signed URL's signature and expiry). Unparsable, only the same text is.
fn same_place(a: &str, b: &str) -> bool {
    let place = |u: &str| {
        url::Url::parse(u).ok().map(|mut u| {
            u.set_query(None);
            u.set_fragment(None);
            u
        })
    };
    match (place(a), place(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// Whether a URL a provider named can be a status URL at all: an absolute http(s) URL or an
/// absolute path (not `null`, not a bare word that would be read as a path under the base URL).
fn followable(s: &str) -> bool {
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    // `/\host` is `//host` to a URL parser: another host, not a path.
    (s.starts_with('/') && !s.starts_with("//") && !s.starts_with("/\\"))
        || lower.starts_with("http://")
        || lower.starts_with("https://")
}

/// A URL a provider named ([`followable`]) as one to call: an absolute path is resolved against the
/// URL of the request it answered (RFC 3986 §5.2, as RFC 9110 says of `Location`), so a provider
/// behind a path prefix (`https://host/ogcapi`, naming `/ogcapi/jobs/1`) is called at
/// `https://host/ogcapi/jobs/1`, not under its base URL again. A contract's own paths are
/// different: they extend the base URL's path (see `url`).
fn resolved(ex: &Exchange, given: String) -> String {
    if !given.starts_with('/') {
        return given;
    }
    url::Url::parse(&ex.record.url)
        .and_then(|request| request.join(&given))
        .map(String::from)
        .unwrap_or(given)
}

/// A status URL as a job id for the record: credentials and secret-looking query values blanked
/// (as every recorded URL), a relative one kept relative.
fn job_id_of_url(u: &str) -> String {
    wire::job_url_text(u)
}

/// What a template becomes when a value it needs is missing (no status URL from the provider, a
/// request field that is absent): `call` sends nothing for it, and the reason follows the mark (a
/// NUL cannot come from a provider's header, a contract, or a percent-encoded value).
const UNRESOLVED: &str = "\u{0}unresolved: ";

fn unresolved(why: &str) -> String {
    format!("{UNRESOLVED}{why}")
}

/// A placeholder's value: text for paths and strings, or (for `{request:/…}`) the JSON value
/// itself, which a body string that is only that placeholder takes whole.
enum Filled {
    Text(String),
    Json(serde_json::Value),
}

/// `url` (absolute or a path) with `rest` added to its path, its query kept after it and any
/// fragment dropped: `…/jobs/1?f=json` + `/results` is `…/jobs/1/results?f=json`.
fn with_path(url: &str, rest: &str) -> String {
    let url = url.split('#').next().unwrap_or_default();
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (url, None),
    };
    let mut out = if rest.is_empty() {
        path.to_owned()
    } else {
        format!("{}{rest}", path.trim_end_matches('/'))
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// What one exchange says, whatever the call (see `HttpProvider::verdict`).
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// No complete response arrived.
    Wire(WireError),
    Success,
    AlreadyExists,
    Reject {
        status: Option<u16>,
        reason: String,
    },
    RetryLater {
        delay: Option<std::time::Duration>,
        reason: String,
    },
    Ambiguous {
        class: String,
    },
}

/// Where one call goes.
struct Target<'a> {
    kind: CallKind,
    at: CallCtx,
    method: http::Method,
    /// A template already filled, or a URL the provider gave.
    path: &'a str,
    max_body: u64,
}

/// One request to send.
struct Req {
    kind: CallKind,
    at: CallCtx,
    method: http::Method,
    url: url::Url,
    access: Access,
    body: Option<Vec<u8>>,
    extra: http::HeaderMap,
    max_body: u64,
    /// Values of the secrets the body carries (scrubbed from what is recorded).
    secrets: Vec<String>,
}

/// A URL that is not called.
enum Refused {
    Malformed(String),
    /// At an origin the contract does not declare (or not http(s)).
    Foreign(url::Url),
}

/// The HTTP client for one contract's calls in one HTTP version. Redirects are not followed (a
/// provider's URL is checked against the contract's origins before anything is sent to it).
fn http_client(contract: &Contract, version: HttpVersion) -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder()
        .connect_timeout(contract.connect_timeout)
        .timeout(contract.request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        // One HTTP/2 connection carries every call of this worker to an origin: a ping finds a
        // connection that died silently before each call on it waits out its own timeout.
        .http2_keep_alive_interval(std::time::Duration::from_secs(15))
        .http2_keep_alive_timeout(std::time::Duration::from_secs(5))
        .user_agent(concat!("jobtrail/", env!("CARGO_PKG_VERSION")));
    let builder = match version {
        HttpVersion::Auto => builder,
        HttpVersion::Http1 => builder.http1_only(),
        HttpVersion::Http2 => builder.http2_prior_knowledge(),
    };
    builder
        .build()
        .map_err(|e| format!("building the HTTP client for {}: {e}", contract.name))
}

/// A provider driven entirely by its contract file.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    contract: Arc<Contract>,
    /// For the contract's own origins, speaking its `http_version`.
    client: reqwest::Client,
    /// For its unauthenticated origins (object storage, say), whatever HTTP they speak: HTTP/1.1,
    /// or HTTP/2 where TLS negotiates it. The same client when the contract says `auto`.
    anonymous: reqwest::Client,
}

impl HttpProvider {
    pub fn new(contract: Contract) -> Result<Self, String> {
        crate::install_crypto();
        let client = http_client(&contract, contract.http_version)?;
        let anonymous = match contract.http_version {
            HttpVersion::Auto => client.clone(),
            _ => http_client(&contract, HttpVersion::Auto)?,
        };
        Ok(Self {
            contract: Arc::new(contract),
            client,
            anonymous,
        })
    }

    pub fn contract(&self) -> &Contract {
        &self.contract
    }

    fn fill(&self, template: &str, op: &OperationRecord) -> String {
        // `{status_url}` opens a template (checked at load): the rest is filled on its own and
        // added to the URL's path, before its query; the provider's URL itself is never filled
        // (a `{target}` in it stays text).
        if let Some(rest) = template.strip_prefix("{status_url}") {
            let base = match &op.status_url {
                Some(u) => u.clone(),
                None if !self.contract.status.url.starts_with("{status_url}") => {
                    self.fill(&self.contract.status.url, op)
                }
                // No URL to build this call from: the call is not sent (see `call`).
                None => {
                    return unresolved("the provider gave no status URL to build this call from");
                }
            };
            return with_path(&base, &self.fill_placeholders(rest, op, true));
        }
        self.fill_placeholders(template, op, true)
    }

    /// One placeholder's value (`name` without braces); `None` for a name that is none of ours
    /// (left as text: the contract's check makes that impossible for a loaded contract).
    fn placeholder(&self, name: &str, op: &OperationRecord) -> Option<Result<Filled, String>> {
        let job = op.remote_job_id.as_deref().unwrap_or("");
        let text = |s: &str| Some(Ok(Filled::Text(s.to_owned())));
        match name {
            "job_id" | "job_id_path" => text(job),
            "target" | "target_path" => text(&op.target),
            "operation_id" | "client_reference" => text(&op.id.to_string()),
            "idempotency_key" => text(op.token.as_str()),
            _ => {
                let ptr = name.strip_prefix("request:")?;
                Some(match op.request_body.pointer(ptr) {
                    None | Some(serde_json::Value::Null) => {
                        Err(format!("the request has no value at {ptr}"))
                    }
                    Some(v) => Ok(Filled::Json(v.clone())),
                })
            }
        }
    }

    /// A template's placeholders filled in one pass (a value is never read as a placeholder).
    /// For a URL (`in_url`) each value is percent-encoded as one path segment, except
    /// `{…_path}`, a path; a request value must then be a string or a number.
    fn fill_placeholders(&self, template: &str, op: &OperationRecord, in_url: bool) -> String {
        let enc = |s: &str| utf8_percent_encode(s, PATH_VALUE).to_string();
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(i) = rest.find('{') {
            out.push_str(&rest[..i]);
            let Some(end) = rest[i..].find('}') else {
                break;
            };
            let name = &rest[i + 1..i + end];
            rest = &rest[i + end + 1..];
            let value = match self.placeholder(name, op) {
                None => {
                    out.push_str(&format!("{{{name}}}"));
                    continue;
                }
                Some(Err(why)) => return unresolved(&why),
                Some(Ok(Filled::Text(t))) => t,
                Some(Ok(Filled::Json(v))) => match v {
                    serde_json::Value::String(t) => t,
                    serde_json::Value::Number(n) => n.to_string(),
                    serde_json::Value::Bool(b) if !in_url => b.to_string(),
                    other if !in_url => other.to_string(),
                    _ => return unresolved(&format!("{{{name}}} is not a string or a number")),
                },
            };
            if !in_url {
                out.push_str(&value);
                continue;
            }
            let piece = if matches!(name, "job_id_path" | "target_path") {
                as_path(&value)
            } else {
                enc(&value)
            };
            // Dots are not encoded (and `%2E` is read as one): a value that is all dots, or
            // nothing, would move the request to another resource.
            if matches!(piece.as_str(), "" | "." | "..") {
                return unresolved(&format!(
                    "{{{name}}} is {value:?}, which a URL path resolves to another resource"
                ));
            }
            out.push_str(&piece);
        }
        out.push_str(rest);
        out
    }

    /// A call's target and JSON body (with its content type) from an optional body template. A
    /// body that cannot be built makes the call unsendable, as a URL that cannot be built does.
    #[allow(clippy::type_complexity)]
    fn with_body(
        &self,
        target: String,
        template: Option<&serde_json::Value>,
        op: &OperationRecord,
    ) -> (String, Option<(Vec<u8>, Vec<String>)>, http::HeaderMap) {
        let mut headers = http::HeaderMap::new();
        let Some(template) = template else {
            return (target, None, headers);
        };
        match self.render_body(template, op) {
            Ok(body) => {
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                (target, Some((body, Vec::new())), headers)
            }
            Err(why) => (unresolved(&why), None, headers),
        }
    }

    /// A call's JSON body from its template: each string filled as text, and a string that is only
    /// `{request:/…}` replaced by that JSON value whole. `Err`: a value it needs is missing.
    fn render_body(
        &self,
        template: &serde_json::Value,
        op: &OperationRecord,
    ) -> Result<Vec<u8>, String> {
        fn walk(
            p: &HttpProvider,
            v: &serde_json::Value,
            op: &OperationRecord,
        ) -> Result<serde_json::Value, String> {
            Ok(match v {
                serde_json::Value::String(t) => {
                    let whole = t
                        .strip_prefix('{')
                        .and_then(|x| x.strip_suffix('}'))
                        .filter(|x| !x.contains(['{', '}']));
                    match whole.and_then(|name| p.placeholder(name, op)) {
                        Some(Ok(Filled::Json(j))) => j,
                        Some(Err(why)) => return Err(why),
                        _ => {
                            let filled = p.fill_placeholders(t, op, false);
                            if let Some(why) = filled.strip_prefix(UNRESOLVED) {
                                return Err(why.to_owned());
                            }
                            serde_json::Value::String(filled)
                        }
                    }
                }
                serde_json::Value::Array(a) => serde_json::Value::Array(
                    a.iter().map(|x| walk(p, x, op)).collect::<Result<_, _>>()?,
                ),
                serde_json::Value::Object(m) => serde_json::Value::Object(
                    m.iter()
                        .map(|(k, x)| Ok((k.clone(), walk(p, x, op)?)))
                        .collect::<Result<_, String>>()?,
                ),
                other => other.clone(),
            })
        }
        serde_json::to_vec(&walk(self, template, op)?).map_err(|e| e.to_string())
    }

    /// An absolute URL from a template path or a URL the provider gave, with the contract's query
    /// parameters added, and how it may be called. A URL at an origin the contract does not declare
    /// is refused, whoever named it.
    fn url(&self, path_or_url: &str) -> Result<(url::Url, Access), Refused> {
        let scheme = path_or_url
            .get(..8)
            .unwrap_or(path_or_url)
            .to_ascii_lowercase();
        let mut u = if scheme.starts_with("http://") || scheme.starts_with("https://") {
            url::Url::parse(path_or_url)
        } else {
            let base = self.contract.base_url.as_str().trim_end_matches('/');
            let path = if path_or_url.starts_with('/') {
                path_or_url.to_owned()
            } else {
                format!("/{path_or_url}")
            };
            url::Url::parse(&format!("{base}{path}"))
        }
        // Quoted as it may be stored: a pre-signed URL that does not parse still carries its
        // signature in its query.
        .map_err(|e| {
            Refused::Malformed(format!(
                "bad URL {:?}: {e}",
                jobtrail_core::ids::shown(&wire::sanitize_url_text(path_or_url))
            ))
        })?;
        let access = self
            .contract
            .access(&u)
            .ok_or_else(|| Refused::Foreign(u.clone()))?;
        // The contract's query goes where its credentials go: it is the credentialed API's (its
        // `api-version`; never a key, refused at load), and a pre-signed URL's signature covers
        // its query, so an added `api-version` would void it.
        if access == Access::Credentials {
            for (k, v) in &self.contract.query {
                if !u.query_pairs().any(|(qk, _)| qk == k.as_str()) {
                    u.query_pairs_mut().append_pair(k, v);
                }
            }
        }
        Ok((u, access))
    }

    /// The operation's cookie jar (domain, path and expiry kept), from its provider context.
    fn jar(op: &OperationRecord) -> cookie_store::CookieStore {
        op.provider_context
            .get("cookie_jar")
            .and_then(|j| j.as_str())
            .and_then(|text| cookie_store::serde::json::load_all(text.as_bytes()).ok())
            .unwrap_or_default()
    }

    /// The request headers, with the credential resolved now (never earlier), and the secret values
    /// they carry (to scrub from what is recorded).
    async fn headers(
        &self,
        op: &OperationRecord,
        url: &url::Url,
        access: Access,
    ) -> Result<(http::HeaderMap, Vec<String>), String> {
        let mut h = http::HeaderMap::new();
        let mut secrets = Vec::new();
        h.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/json, */*;q=0.5"),
        );
        // Credentials and cookies go to the contract's own origins only. The credential is
        // resolved for every call all the same: an answer from an origin called without it (a
        // result store serving what quotes the key) must not put it into the record either.
        if let Some(auth) = &self.contract.auth {
            let secret = wire::resolve_secret(&auth.secret).await?;
            secrets.push(secret.clone());
            if access == Access::Credentials {
                let value = match &auth.scheme {
                    Some(s) => format!("{s} {secret}"),
                    None => secret,
                };
                let mut v = http::HeaderValue::from_str(&value)
                    .map_err(|_| "the auth secret is not a valid header value".to_owned())?;
                v.set_sensitive(true);
                h.insert(auth.header.clone(), v);
            }
        }
        if access == Access::Anonymous {
            return Ok((h, secrets));
        }
        if self.contract.cookies {
            let jar = Self::jar(op);
            let pairs: Vec<String> = jar
                .get_request_values(url)
                .map(|(k, v)| cookie::Cookie::new(k, v).stripped().to_string())
                .collect();
            if !pairs.is_empty()
                && let Ok(mut v) = http::HeaderValue::from_str(&pairs.join("; "))
            {
                v.set_sensitive(true);
                h.insert(http::header::COOKIE, v);
            }
        }
        Ok((h, secrets))
    }

    /// Send a built request. The future is held as long as the provider takes to answer, so what
    /// only the sending needs is dropped before the exchange: `req` is boxed (an async fn keeps a
    /// by-value argument twice), and the headers and body are moved into the boxed `Outgoing` in a
    /// block (a moved-from local keeps its room until its scope ends).
    async fn send(&self, op: &OperationRecord, mut req: Box<Req>) -> Exchange {
        let (kind, at, access) = (req.kind, req.at.clone(), req.access);
        let mut secrets = std::mem::take(&mut req.secrets);
        let (out, scrubber) = {
            // Moved in: the box is freed when the block ends, before the exchange.
            let req = req;
            let unsent =
                |why: &str| wire::unsent(kind, at.attempt, &req.method, &req.url, op.trace_id, why);
            let mut headers = match self.headers(op, &req.url, access).await {
                Ok((h, auth)) => {
                    secrets.extend(auth);
                    h
                }
                Err(why) => return unsent(&why),
            };
            // The operation's own secrets too, whatever this call sends: a provider may echo the
            // create body in any later answer, and a caller granted a secret may have it used,
            // never read back. A secret that cannot be read now could not be kept out of the
            // record: nothing is sent (the call is tried again later, as any unsent one). Read to
            // be scrubbed only, never sent: no grant is asked for.
            if kind != CallKind::Create {
                match wire::resolve_body_secrets(
                    &op.request_body,
                    &self.contract.redact,
                    &self.contract.secrets,
                    None,
                )
                .await
                {
                    Ok((_, body_secrets)) => secrets.extend(body_secrets),
                    Err(why) => {
                        return unsent(&format!(
                            "the operation's secrets could not be read to keep them out of the record: {why}"
                        ));
                    }
                }
            }
            let Req {
                method,
                url,
                body,
                extra,
                max_body,
                ..
            } = *req;
            headers.extend(extra);
            let scrubber = wire::Scrubber::new(&secrets);
            let shown_url = scrubber.text(&wire::sanitize_url(&url));
            let out = Box::new(Outgoing {
                kind,
                attempt: at.attempt,
                method,
                url,
                shown_url,
                headers,
                body,
                trace: op.trace_id,
                sampled: crate::spans::operation_sampled(
                    op.id,
                    op.trace_id,
                    op.parent_span,
                    op.parent_sampled,
                ),
                trace_header: self.contract.trace_header.as_ref(),
                client_request_id: self
                    .contract
                    .client_request_id_header
                    .as_ref()
                    .filter(|_| access == Access::Credentials),
                max_body,
                // Every answer but a result's (kept as bytes, and parsed under the worker's bound on
                // large checks): each call in flight may hold its answer parsed. An answer that
                // may be the result is read, and held, to the result's limit.
                parsed_most: (kind != CallKind::Result).then(|| wire::parsed_most(max_body)),
                end_by: at.end_by,
                clock: at,
                budget: self.contract.call_budget(),
            });
            (out, scrubber)
        };
        let client = match access {
            Access::Credentials => &self.client,
            Access::Anonymous => &self.anonymous,
        };
        let mut ex = wire::exchange(client, out).await;
        // Nothing a secret of this call was resolved to is recorded, whatever the provider echoes.
        // A result is kept exactly as sent, so one that repeats a credential is refused instead;
        // an answer to a result call that is no result (a 401 quoting the key) is scrubbed like
        // any other, since its words become the reason recorded.
        let result = kind == CallKind::Result && Self::kept_as_sent(&ex);
        ex.echoed_secret = wire::sized_work(ex.body.len(), || scrubber.exchange(&mut ex, result));
        ex
    }

    /// The provider context after this exchange: cookies it set are kept per operation.
    fn context_after(
        &self,
        op: &OperationRecord,
        ex: &Exchange,
        hints: Option<&ResultHints>,
    ) -> Option<serde_json::Value> {
        // Copied only when something changes: most calls leave the context as it was.
        fn edit<'c>(
            ctx: &'c mut Option<serde_json::Value>,
            was: &serde_json::Value,
        ) -> &'c mut serde_json::Value {
            ctx.get_or_insert_with(|| match was {
                c @ serde_json::Value::Object(_) => c.clone(),
                _ => serde_json::json!({}),
            })
        }
        let mut ctx = None;
        // Cookies from the contract's own origins only, kept with their domain, path and expiry.
        if self.contract.cookies {
            let set: Vec<cookie::Cookie<'static>> = ex
                .headers
                .get_all(http::header::SET_COOKIE)
                .iter()
                .filter(|v| v.len() <= MAX_COOKIE_BYTES)
                .take(MAX_COOKIES)
                .filter_map(|v| cookie::Cookie::parse(v.to_str().ok()?.to_owned()).ok())
                .collect();
            if !set.is_empty()
                && let Some(from) = url::Url::parse(&ex.record.url)
                    .ok()
                    .filter(|u| self.contract.access(u) == Some(Access::Credentials))
            {
                let mut jar = Self::jar(op);
                jar.store_response_cookies(set.into_iter(), &from);
                let mut text = Vec::new();
                // The jar is part of the operation's row and read back on every call: a provider
                // that sets cookie after cookie keeps the jar it had.
                if jar.iter_any().count() <= MAX_COOKIES
                    && cookie_store::serde::json::save_incl_expired_and_nonpersistent(
                        &jar, &mut text,
                    )
                    .is_ok()
                    && text.len() <= MAX_JAR_BYTES
                {
                    edit(&mut ctx, &op.provider_context)["cookie_jar"] =
                        serde_json::Value::String(String::from_utf8_lossy(&text).into_owned());
                }
            }
        }
        if let Some(h) = hints
            && *h != ResultHints::default()
        {
            edit(&mut ctx, &op.provider_context)["result"] =
                serde_json::to_value(h).unwrap_or_default();
        }
        ctx
    }

    /// What a complete response means for this call, by the contract's rules then the defaults.
    fn meaning(&self, call: CallName, ex: &Exchange) -> Meaning {
        if let Some(means) = self.ruled(call, ex) {
            return means;
        }
        // A create sent with nothing that would make a second one the same job: a 503 (a gateway's,
        // after it forwarded the create) or a 408 does not say the job was not made, so sending
        // again could start paid work twice. 425 and 429 say the request was not processed. (A
        // contract rule that names the code says otherwise, above.) The same holds for a cancel
        // the contract says may not be repeated: "not now" would send it again.
        let unrepeatable = match call {
            CallName::Create => matches!(self.contract.create.token, TokenPlacement::None),
            CallName::Cancel => !self.contract.cancel.as_ref().is_some_and(|c| c.idempotent),
            _ => false,
        };
        match ex.status.unwrap_or(0) {
            // A result is a whole representation: 202 says it is not ready yet, and a 204, a 206
            // nobody asked for or any other 2xx is not the result (kept, it would pass as valid
            // with no checksum to say otherwise).
            200 | 203 if call == CallName::Result => Meaning::Success,
            202 if call == CallName::Result => Meaning::RetryLater,
            200..=299 if call == CallName::Result => Meaning::Ambiguous,
            200..=299 => Meaning::Success,
            408 | 503 if unrepeatable => Meaning::Ambiguous,
            408 | 425 | 429 => Meaning::RetryLater,
            503 if wire::retry_after(&ex.headers).is_some() => Meaning::RetryLater,
            500..=599 => Meaning::Ambiguous,
            // A result that is gone says so: 404 or 410. Any other refusal of a result read (a
            // storage gateway's or a CDN's passing 403 or 401, a proxy's 400) does not say the
            // finished job's result is lost: it is read again within the failure budget, not
            // given up on one answer. (A contract rule that names the code says otherwise, above.)
            404 | 410 if call == CallName::Result => Meaning::Reject,
            400..=499 if call == CallName::Result => Meaning::Ambiguous,
            400..=499 => Meaning::Reject,
            _ => Meaning::Ambiguous,
        }
    }

    /// What the contract's first matching rule says this response means, if one matches.
    fn ruled(&self, call: CallName, ex: &Exchange) -> Option<Meaning> {
        let status = ex.status.unwrap_or(0);
        // A rule that names no codes never turns a create's 2xx (the job accepted) away: read as
        // refused the job would run unwatched, as "not now" a token-less provider would start it
        // twice. Only a rule that lists the 2xx code says so.
        let accepted_create = call == CallName::Create && (200..300).contains(&status);
        let two_xx = (200..300).contains(&status);
        self.contract
            .rules
            .iter()
            .find(|r| {
                // A rule for every call judges a result's answer only where it cannot lose or
                // fake the job's output: never a 2xx (its bytes are the output, and text in them,
                // `"error": null`, is not the provider speaking), and never as a success (an
                // error's body would be kept as the result). Only a rule naming `result` does.
                // `already_exists` says a create's duplicate is the original job: of any other
                // call's answer it would make a success of an error.
                let applies = r.calls.contains(&call)
                    || (r.calls.is_empty()
                        && match call {
                            CallName::Create => true,
                            CallName::Result => {
                                !two_xx
                                    && !matches!(r.means, Meaning::Success | Meaning::AlreadyExists)
                            }
                            _ => r.means != Meaning::AlreadyExists,
                        });
                applies
                    && (r.status.contains(&status)
                        || (r.status.is_empty()
                            && !(accepted_create
                                && matches!(r.means, Meaning::Reject | Meaning::RetryLater))))
                    // Searched in the bytes as sent: a copy of the body as text (every answer's,
                    // a result of hundreds of MiB too, three bytes for each one not UTF-8) would be
                    // made on the runtime's thread and counted by no bound.
                    && r.body_contains.as_ref().is_none_or(|needle| {
                        memchr::memmem::find(&ex.body, needle.as_bytes()).is_some()
                    })
            })
            .map(|r| r.means)
    }

    fn locate(
        &self,
        loc: &Locator,
        ex: &Exchange,
        body: Option<&serde_json::Value>,
    ) -> Option<String> {
        match loc {
            Locator::Header(h) => ex
                .headers
                .get(h.as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            Locator::Body(p) => body.and_then(|b| b.pointer(p)).and_then(id_text),
        }
    }

    /// Whether an answer to a result call is kept exactly as sent (unscrubbed): a 2xx, which may
    /// be the result. Any other is scrubbed like every answer.
    fn kept_as_sent(ex: &Exchange) -> bool {
        ex.status.is_some_and(|s| (200..300).contains(&s))
    }

    fn reason(ex: &Exchange) -> String {
        // The first 200 characters are at most 800 bytes: only those are read as text.
        let head = &ex.body[..ex.body.len().min(REASON_CHARS * 4)];
        let text = String::from_utf8_lossy(head);
        let short: String = text.chars().take(REASON_CHARS).collect();
        let short = text::storable(short);
        format!("HTTP {}: {}", ex.status.unwrap_or(0), short.trim())
    }

    fn ambiguous_class(ex: &Exchange) -> String {
        match (ex.error, ex.status) {
            (Some(e), _) => e.class().to_owned(),
            (None, Some(s)) => format!("http_{s}"),
            (None, None) => "no_response".to_owned(),
        }
    }

    fn finish<T>(
        mut ex: Exchange,
        outcome: T,
        describe: String,
        context: Option<serde_json::Value>,
    ) -> Called<T> {
        // An exchange that never left already says why; keep that.
        if ex.record.outcome.is_empty() {
            ex.record.outcome = describe;
        }
        Called {
            outcome,
            call: ex.record,
            context,
        }
    }

    async fn create_body(&self, op: &OperationRecord) -> Result<(Vec<u8>, Vec<String>), String> {
        let (mut body, secrets) = wire::resolve_body_secrets(
            &op.request_body,
            &self.contract.redact,
            &self.contract.secrets,
            Some(&op.secret_holders()),
        )
        .await?;
        if let TokenPlacement::BodyField(p) = &self.contract.create.token {
            set_pointer(
                &mut body,
                p,
                serde_json::Value::String(op.token.as_str().to_owned()),
            )?;
        }
        if let Some(p) = &self.contract.create.client_reference_field {
            set_pointer(&mut body, p, serde_json::Value::String(op.id.to_string()))?;
        }
        Ok((
            serde_json::to_vec(&body).map_err(|e| e.to_string())?,
            secrets,
        ))
    }

    /// What one exchange says, before it becomes the outcome of a particular call.
    fn verdict(&self, call: CallName, ex: &Exchange) -> Verdict {
        if let Some(e) = ex.error {
            return Verdict::Wire(e);
        }
        // A result call's 2xx is kept unscrubbed (it may be the result): when the contract calls
        // it something else, its words are the recorded reason, so one that repeats a credential
        // is not quoted at all.
        let reason = || {
            if ex.echoed_secret && call == CallName::Result && Self::kept_as_sent(ex) {
                format!(
                    "HTTP {}: the answer repeats a credential this call sent; it is not kept",
                    ex.status.unwrap_or(0)
                )
            } else {
                Self::reason(ex)
            }
        };
        match self.meaning(call, ex) {
            Meaning::Success => Verdict::Success,
            Meaning::AlreadyExists => Verdict::AlreadyExists,
            Meaning::Reject => Verdict::Reject {
                status: ex.status,
                reason: reason(),
            },
            Meaning::RetryLater => Verdict::RetryLater {
                delay: wire::retry_after(&ex.headers),
                reason: reason(),
            },
            Meaning::Ambiguous => Verdict::Ambiguous {
                class: Self::ambiguous_class(ex),
            },
        }
    }

    /// Send one call to a URL built from a template (or a URL the provider gave). A URL that cannot
    /// be built never leaves: the answer is the unsent exchange.
    ///
    /// The request is built before the future is made, so nothing only the building needs (the
    /// arguments, the header maps merged) is held while the call waits on the provider.
    fn call<'a>(
        &'a self,
        op: &'a OperationRecord,
        t: Target<'_>,
        body: Option<(Vec<u8>, Vec<String>)>,
        extra: http::HeaderMap,
    ) -> impl Future<Output = Exchange> + use<'a> {
        let at = t.at.clone();
        match self.request(op, t, body, extra) {
            Ok(req) => futures::future::Either::Left(self.send(op, req)),
            Err(unsent) => {
                let mut unsent = *unsent;
                unsent.record.started_at = at.now();
                futures::future::Either::Right(std::future::ready(unsent))
            }
        }
    }

    /// The request [`HttpProvider::call`] sends, or the exchange that records why it is not sent.
    fn request(
        &self,
        op: &OperationRecord,
        t: Target<'_>,
        body: Option<(Vec<u8>, Vec<String>)>,
        extra: http::HeaderMap,
    ) -> Result<Box<Req>, Box<Exchange>> {
        let Target {
            kind,
            at,
            method,
            path: target,
            max_body,
        } = t;
        // The contract's fixed headers, then the call's own, then what this call sets itself.
        let own_only = extra.clone();
        let mut headers = self.contract.headers.clone();
        let own = match kind {
            CallKind::Create => Some(&self.contract.create.headers),
            CallKind::Cancel => self.contract.cancel.as_ref().map(|c| &c.headers),
            _ => None,
        };
        for (k, v) in own.into_iter().flatten() {
            headers.insert(k.clone(), v.clone());
        }
        for k in extra.keys() {
            headers.remove(k);
        }
        headers.extend(extra);
        let extra = headers;
        if let Some(i) = target.find(UNRESOLVED) {
            let why = &target[i + UNRESOLVED.len()..];
            return Err(Box::new(wire::not_built(
                kind,
                at.attempt,
                &method,
                op.trace_id,
                why,
            )));
        }
        match self.url(target) {
            // Fixed headers go only where the credentials go (not to pre-signed storage URLs).
            Ok((url, access)) => {
                let extra = match access {
                    Access::Credentials => extra,
                    Access::Anonymous => own_only,
                };
                let (body, secrets) = match body {
                    Some((b, s)) => (Some(b), s),
                    None => (None, Vec::new()),
                };
                Ok(Box::new(Req {
                    kind,
                    at,
                    method,
                    url,
                    access,
                    body,
                    extra,
                    max_body,
                    secrets,
                }))
            }
            Err(Refused::Malformed(e)) => Err(Box::new(wire::not_built(
                kind,
                at.attempt,
                &method,
                op.trace_id,
                &e,
            ))),
            Err(Refused::Foreign(u)) => Err(Box::new(wire::not_sent(
                kind,
                at.attempt,
                &method,
                &u,
                op.trace_id,
                WireError::Origin,
                "the URL is outside the origins the contract declares",
            ))),
        }
    }

    async fn do_create(&self, op: &OperationRecord, at: CallCtx) -> Called<CreateOutcome> {
        // What is sent is what was fingerprinted when it was submitted and approved: a body
        // edited on the row since (by a login with the schema's rights) is never sent.
        if jobtrail_core::Fingerprint::of(&op.provider, &op.target, &op.request_body)
            != op.fingerprint
        {
            return unsent_called(
                CallKind::Create,
                at,
                op,
                "the stored request no longer matches the fingerprint it was submitted with",
                CreateOutcome::NotSent {
                    error_class: "request_altered".into(),
                },
            );
        }
        let spec = &self.contract.create;
        let target = self.fill(&spec.path, op);
        let body = match self.create_body(op).await {
            Ok(b) => b,
            Err(why) => {
                let url = self
                    .url(&target)
                    .map(|(u, _)| u)
                    .unwrap_or_else(|_| url::Url::parse("about:blank").expect("static URL"));
                let ex = wire::unsent(
                    CallKind::Create,
                    at.attempt,
                    &spec.method,
                    &url,
                    op.trace_id,
                    &why,
                );
                let class = WireError::Secret.class().to_owned();
                return Self::finish(
                    ex,
                    CreateOutcome::NotSent { error_class: class },
                    String::new(),
                    None,
                );
            }
        };
        let mut extra = http::HeaderMap::new();
        extra.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        if let TokenPlacement::Header(h) = &spec.token {
            // A key that cannot be a header value (a row edited since submit) is never dropped
            // silently: sent without it, a resend could make a second paid job.
            let Ok(v) = http::HeaderValue::from_str(op.token.as_str()) else {
                return unsent_called(
                    CallKind::Create,
                    at,
                    op,
                    "the operation's idempotency key cannot be sent as a header value",
                    CreateOutcome::NotSent {
                        error_class: "token_unsendable".into(),
                    },
                );
            };
            extra.insert(h.clone(), v);
        }
        let max = self.contract.create_read_limit();
        let ex = self
            .call(
                op,
                Target {
                    kind: CallKind::Create,
                    at,
                    method: spec.method.clone(),
                    path: &target,
                    max_body: max,
                },
                Some(body),
                extra,
            )
            .await;
        let json = self.create_answer(&ex);
        // Where the result will be, when the create's answer says (Azure's final-state-via:
        // location): kept with the operation until the job has succeeded.
        let hints = self
            .contract
            .create
            .result_url
            .as_ref()
            .filter(|_| ex.error.is_none() && ex.status.is_some_and(|s| (200..300).contains(&s)))
            .and_then(|l| self.locate(l, &ex, json.as_ref()))
            .filter(|u| followable(u) && text::usable(u, MAX_LOCATOR_BYTES))
            .map(|u| ResultHints {
                result_url: Some(resolved(&ex, u)),
                ..ResultHints::default()
            });
        let ctx = self.context_after(op, &ex, hints.as_ref());
        let (outcome, d) = match self.verdict(CallName::Create, &ex) {
            Verdict::Wire(e) if e.not_sent() => (
                CreateOutcome::NotSent {
                    error_class: e.class().into(),
                },
                format!("not sent: {}", e.class()),
            ),
            Verdict::Wire(e) => (
                CreateOutcome::Ambiguous {
                    error_class: e.class().into(),
                },
                format!("ambiguous: {}", e.class()),
            ),
            Verdict::Reject { status, reason } => (
                CreateOutcome::Rejected {
                    http_status: status,
                    reason: reason.clone(),
                },
                format!("rejected: {reason}"),
            ),
            Verdict::RetryLater { delay, reason } => (
                CreateOutcome::RetryLater {
                    delay,
                    reason: reason.clone(),
                    // Unless the contract's own rule says what this code means.
                    maybe_processed: matches!(ex.status, Some(408 | 503))
                        && self.ruled(CallName::Create, &ex).is_none(),
                },
                format!("retry later: {reason}"),
            ),
            Verdict::Ambiguous { class } => (
                CreateOutcome::Ambiguous {
                    error_class: class.clone(),
                },
                format!("ambiguous: {class}"),
            ),
            v @ (Verdict::Success | Verdict::AlreadyExists) => {
                self.accepted(&ex, json.as_ref(), v == Verdict::AlreadyExists)
            }
        };
        drop(json);
        Self::finish(ex, outcome, d, ctx)
    }

    /// Whether an answer may be built whole: within the answers' own limit (`max_response_bytes`),
    /// and within what such an answer may take parsed. An answer that may carry the result is
    /// read to the result's limit, and the wire bounds its parse by that; a small one of many
    /// tiny values would otherwise take sixteen times the result's limit, on every poll in flight.
    fn within_answer_bounds(&self, body: &[u8]) -> bool {
        let most = self.contract.max_response_bytes;
        body.len() as u64 <= most && !wire::parsed_beyond(body, wire::parsed_most(most))
    }

    /// A create's answer as JSON, for what the contract reads in it. One larger than the answers'
    /// own limit (a synchronous result, read to the result's limit) is read for those values only:
    /// parsed whole, a few megabytes of small values would take some thirty times their size, on
    /// every create in flight, outside any bound on results (whose own parse is bounded later).
    fn create_answer(&self, ex: &Exchange) -> Option<serde_json::Value> {
        if self.within_answer_bounds(&ex.body) {
            return serde_json::from_slice(&ex.body).ok();
        }
        let create = &self.contract.create;
        let pointers = [&create.job_id, &create.initial_state, &create.result_url]
            .into_iter()
            .flatten()
            .chain(&self.contract.status.follow)
            .filter_map(|l| match l {
                Locator::Body(p) => Some(p.as_str()),
                Locator::Header(_) => None,
            });
        wire::sparse(&ex.body, pointers)
    }

    /// A successful create: the job it names, or the result it carries synchronously.
    fn accepted(
        &self,
        ex: &Exchange,
        json: Option<&serde_json::Value>,
        duplicate: bool,
    ) -> (CreateOutcome, String) {
        let spec = &self.contract.create;
        // Without a job id in the contract, the job is known by the status URL the answer names.
        let job_id = match &spec.job_id {
            // A job named by a URL (OGC's `Location`) is recorded as a status URL is: a
            // capability's token in its query (`?access_token=…`) or credentials in it are
            // blanked. The id addresses nothing (a `{job_id}` is filled percent-encoded): the
            // status URL, kept apart, does.
            Some(l) => self.locate(l, ex, json).map(wire::recorded_job_id),
            // Sanitised: a query may carry a key (`?code=…`), and the id is on the record for
            // auditors; the full URL is kept only as the status URL. Other query values stay (a
            // provider may name the job there: `?id=A` and `?id=B` are two jobs).
            None => self.status_url_given(ex, json).map(|u| job_id_of_url(&u)),
        };
        let remote_state = spec
            .initial_state
            .as_ref()
            .and_then(|l| self.locate(l, ex, json))
            .map(|s| text::truncate(text::storable(s), MAX_STATE_BYTES));
        if let Some(Err(why)) = job_id
            .as_deref()
            .map(jobtrail_core::ids::check_remote_job_id)
        {
            // A hostile or broken answer: the job may exist, but this name cannot address it.
            return (
                CreateOutcome::Ambiguous {
                    error_class: format!("unusable_job_id: {why}"),
                },
                format!("ambiguous: the provider named {why}"),
            );
        }
        // A status code that says the job ran synchronously: the answer is the finished job,
        // unless it states a state that is not a success, or any state beside a job to follow
        // (OGC's statusInfo, `successful` included: a status document, not the results, which
        // are then read where the job says).
        let a_job_to_follow = remote_state.as_deref().is_some_and(|s| {
            job_id.is_some() || self.contract.status.phase(s) != Some(Phase::Succeeded)
        });
        if let Some(code) = ex.status
            && spec.sync_codes.contains(&code)
            && !a_job_to_follow
        {
            return self.synchronous(ex, job_id);
        }
        // With a state in the answer, only a terminal success makes it synchronous: a result
        // beside a job still running is partial output, not the result.
        let finished = match (&spec.initial_state, &remote_state) {
            (None, _) => true,
            (Some(_), Some(s)) => self.contract.status.phase(s) == Some(Phase::Succeeded),
            (Some(_), None) => false,
        };
        if finished
            && let Some(Locator::Body(p)) = &spec.sync_result
            && wire::raw_at(&ex.body, p).is_some()
        {
            return self.synchronous(ex, job_id);
        }
        match job_id {
            Some(job_id) => {
                let status_url = self.status_url_in(ex, json);
                let d = format!(
                    "{} {job_id}",
                    if duplicate {
                        "already exists as"
                    } else {
                        "accepted as"
                    }
                );
                (
                    CreateOutcome::Accepted {
                        job_id,
                        remote_state,
                        status_url,
                        duplicate,
                        retry_after: wire::retry_after(&ex.headers),
                    },
                    d,
                )
            }
            // A success without the job id we were promised: we cannot tell what exists.
            None => (
                CreateOutcome::Ambiguous {
                    error_class: "missing_job_id".into(),
                },
                "ambiguous: success without a job id".into(),
            ),
        }
    }

    /// A create answered with a status code the contract names synchronous: its result is the
    /// provider's bytes (the `sync_result` part, or the whole body), or nothing for a job without
    /// a result.
    fn synchronous(&self, ex: &Exchange, job_id: Option<String>) -> (CreateOutcome, String) {
        let spec = &self.contract.create;
        let no_result = self.contract.no_result();
        // Nothing is kept for a job without a result, so an echo there costs nothing.
        if ex.echoed_secret && !no_result {
            return (
                CreateOutcome::Ambiguous {
                    error_class: "sync_result_repeats_a_credential".into(),
                },
                "ambiguous: the synchronous answer repeats a credential this call sent; it is not kept".into(),
            );
        }
        // As for a fetched result: bytes sent encoded, unasked, are not the result the job made.
        if encoded(&ex.headers) && !no_result {
            return (
                CreateOutcome::Ambiguous {
                    error_class: "sync_result_encoded".into(),
                },
                "ambiguous: the synchronous answer came with a content encoding nobody asked for; it is not kept".into(),
            );
        }
        let bytes = if no_result {
            bytes::Bytes::new()
        } else {
            match &spec.sync_result {
                Some(Locator::Body(p)) => match wire::raw_at(&ex.body, p) {
                    Some(part) => ex.body.slice_ref(part),
                    None => {
                        return (
                            CreateOutcome::Ambiguous {
                                error_class: "sync_answer_without_result".into(),
                            },
                            format!(
                                "ambiguous: a synchronous answer ({}) without its result at {p}",
                                ex.status.unwrap_or_default()
                            ),
                        );
                    }
                },
                _ => ex.body.clone(),
            }
        };
        let content_type = if matches!(spec.sync_result, Some(Locator::Body(_))) && !no_result {
            Some("application/json".into())
        } else {
            ex.headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|v| text::truncate(v.to_owned(), wire::KEPT_HEADER_BYTES))
        };
        let d = format!(
            "completed synchronously ({}){}",
            ex.status.unwrap_or_default(),
            job_id
                .as_ref()
                .map(|j| format!(" as {j}"))
                .unwrap_or_default()
        );
        (
            CreateOutcome::Completed {
                job_id,
                result: FetchedResult {
                    bytes,
                    content_type,
                    checksum: None,
                },
            },
            d,
        )
    }

    /// A status URL the provider gave in this response, by the contract's precedence, resolved
    /// against the request's URL (see [`resolved`]).
    fn status_url_in(&self, ex: &Exchange, json: Option<&serde_json::Value>) -> Option<String> {
        self.status_url_given(ex, json).map(|u| resolved(ex, u))
    }

    /// Every pointer a status answer is read at ([`Self::observed`]).
    fn status_pointers(&self) -> impl Iterator<Item = &str> {
        let s = &self.contract.status;
        let followed = s.follow.iter().filter_map(|l| match l {
            Locator::Body(p) => Some(p.as_str()),
            Locator::Header(_) => None,
        });
        s.state
            .iter()
            .map(String::as_str)
            .chain(
                [
                    &s.done,
                    &s.updated_at,
                    &s.progress,
                    &s.error,
                    &s.result_url,
                    &s.checksum,
                    &s.expected_count,
                ]
                .into_iter()
                .filter_map(|p| p.as_deref()),
            )
            .chain(followed)
    }

    /// A status URL the provider gave in this response, as it gave it.
    fn status_url_given(&self, ex: &Exchange, json: Option<&serde_json::Value>) -> Option<String> {
        self.contract
            .status
            .follow
            .iter()
            .filter_map(|l| self.locate(l, ex, json))
            .filter(|s| text::usable(s, MAX_LOCATOR_BYTES))
            // A value that is no URL at all (both of Azure's headers sent, one of them broken) is
            // passed over for the next; one at a foreign origin is not: it is refused when used.
            .find(|s| followable(s) && !matches!(self.url(s), Err(Refused::Malformed(_))))
    }

    /// A status read. `resource`: the final GET of the created resource itself (the `status.url`
    /// template, never a followed operation URL); its body need not carry a state.
    async fn do_status(
        &self,
        op: &OperationRecord,
        at: CallCtx,
        resource: bool,
    ) -> Called<StatusOutcome> {
        let spec = &self.contract.status;
        let target = match &op.status_url {
            Some(u) if !resource => u.clone(),
            _ => self.fill(&spec.url, op),
        };
        let max = self.contract.status_read_limit();
        let ex = self
            .call(
                op,
                Target {
                    kind: CallKind::Status,
                    at,
                    method: http::Method::GET,
                    path: &target,
                    max_body: max,
                },
                None,
                http::HeaderMap::new(),
            )
            .await;
        let failed = |class: String| {
            (
                StatusOutcome::Failed {
                    error_class: class.clone(),
                },
                format!("failed: {class}"),
                None,
            )
        };
        // A status code the contract maps is the state by itself, before any rule and whatever the
        // body (Azure's Location polling; a 204 has none).
        // Only on a URL the provider named for this (Location): the created resource read at the
        // template may answer 200 while it is still being made.
        let by_code = match (&ex.error, ex.status, resource, &op.status_url) {
            (None, Some(c), false, Some(_)) => spec.codes.get(&c).copied(),
            _ => None,
        };
        let (outcome, d, hints) = match by_code
            .map(|_| Verdict::Success)
            .unwrap_or_else(|| self.verdict(CallName::Status, &ex))
        {
            Verdict::Wire(WireError::Origin) => (
                StatusOutcome::Refused {
                    url: ex.record.url.clone(),
                },
                "refused: outside the contract's origins".into(),
                None,
            ),
            Verdict::Wire(e) => failed(e.class().into()),
            Verdict::Ambiguous { class } => failed(class),
            Verdict::RetryLater { delay, reason } => (
                StatusOutcome::RetryLater {
                    delay,
                    reason: reason.clone(),
                },
                format!("retry later: {reason}"),
                None,
            ),
            Verdict::Reject { status, reason } => (
                StatusOutcome::Rejected {
                    http_status: status,
                    reason: reason.clone(),
                },
                format!("rejected: {reason}"),
                None,
            ),
            Verdict::Success | Verdict::AlreadyExists => {
                match self.observed(op, &ex, resource, by_code) {
                    Ok(s) => {
                        let d = match s.phase {
                            Some(p) => format!("observed {} ({p:?})", s.remote_state),
                            None => format!("observed unknown state {:?}", s.remote_state),
                        };
                        let hints = s.hints.clone();
                        (StatusOutcome::Observed(s), d, Some(hints))
                    }
                    Err(class) => failed(class),
                }
            }
        };
        let ctx = self.context_after(op, &ex, hints.as_ref());
        Self::finish(ex, outcome, d, ctx)
    }

    /// Read a status response. `by_code`: the phase its status code says (the body then need not
    /// be JSON, nor carry a state). `Err` holds the error class of a body that cannot be read.
    fn observed(
        &self,
        op: &OperationRecord,
        ex: &Exchange,
        resource: bool,
        by_code: Option<Phase>,
    ) -> Result<RemoteStatus, String> {
        let spec = &self.contract.status;
        // An answer larger than the answers' own limit may carry the result (read to its limit):
        // only what a status says is built from it, not the result, on every poll in flight; one
        // that cannot be read so (no object) is not built whole either
        // (a list of small numbers parsed takes some thirty times its text, on every poll).
        // So is one within that size whose parse would pass the answers' own bound (the wire
        // measured it against the result's, sixteen times larger).
        let large = !self.within_answer_bounds(&ex.body);
        let parsed = if large {
            wire::sparse(&ex.body, self.status_pointers()).ok_or("large_status_unreadable")
        } else {
            serde_json::from_slice::<serde_json::Value>(&ex.body).map_err(|_| "malformed_json")
        };
        let (json, remote_state, phase) = match by_code {
            Some(phase) => (
                parsed.unwrap_or(serde_json::Value::Null),
                format!("HTTP {}", ex.status.unwrap_or_default()),
                Some(phase),
            ),
            None => {
                let json = parsed.map_err(str::to_owned)?;
                // The created resource has no `done` of its own: only a status document waits on it.
                let state_here = if resource {
                    spec.stated(&json)
                } else {
                    spec.state_in(&json)
                };
                // The created resource after success may not say a state: success is already
                // known. Otherwise a body without one is in the contract's absent state, if any.
                let remote_state = match (state_here, resource) {
                    (Some(s), _) => s,
                    (None, true) => op.remote_state.clone().ok_or("missing_state")?,
                    (None, false) => spec.state_absent.clone().ok_or("missing_state")?,
                };
                // A state longer than any a contract names is kept cut, as an unknown one.
                let remote_state = text::truncate(remote_state, MAX_STATE_BYTES);
                let phase = spec.phase(&remote_state);
                (json, remote_state, phase)
            }
        };
        let get_str = |p: &Option<String>| {
            p.as_ref()
                .and_then(|p| json.pointer(p))
                .and_then(|v| v.as_str())
                .filter(|s| text::usable(s, MAX_LOCATOR_BYTES))
                .map(str::to_owned)
        };
        let mut hints = op
            .provider_context
            .get("result")
            .and_then(|r| serde_json::from_value::<ResultHints>(r.clone()).ok())
            .unwrap_or_default();
        // Only a URL or an absolute path: `//host/x` would be resolved to another host (which the
        // origins check then refuses, or reads without the credential), as create's is kept.
        if let Some(u) = get_str(&spec.result_url).filter(|u| followable(u)) {
            hints.result_url = Some(resolved(ex, u));
        }
        // A checksum or a count that is there but cannot be read is said, not skipped: skipped,
        // the result would be checked without it and the record would say none was given.
        let given = |p: &Option<String>| {
            p.as_ref()
                .and_then(|p| json.pointer(p))
                .filter(|v| !v.is_null())
        };
        hints.unreadable = None;
        let unreadable = |what: &str, v: &serde_json::Value| {
            format!("{what} {}", text::truncate(text::of_json(v), 100))
        };
        if let Some(v) = given(&spec.checksum) {
            match v.as_str().map(str::trim) {
                Some(c) if text::usable(c, MAX_LOCATOR_BYTES) => {
                    hints.checksum = Some(c.to_owned())
                }
                _ => hints.unreadable = Some(unreadable("a checksum", v)),
            }
        }
        if let Some(v) = given(&spec.expected_count) {
            match count_of(v) {
                Some(n) => hints.expected_count = Some(n),
                None => hints.unreadable = Some(unreadable("an expected count", v)),
            }
        }
        Ok(RemoteStatus {
            phase,
            updated_at: spec
                .updated_at
                .as_ref()
                .and_then(|p| json.pointer(p))
                .map(|v| text::truncate(text::of_json(v), MAX_STATE_BYTES)),
            progress: spec
                .progress
                .as_ref()
                .and_then(|p| json.pointer(p))
                .map(|v| text::bounded_json(v, MAX_PROGRESS_BYTES)),
            // An error object (Google's google.rpc.Status, Azure's error) is kept as its JSON text.
            error: spec
                .error
                .as_ref()
                .and_then(|p| json.pointer(p))
                .filter(|v| !v.is_null())
                .map(|v| text::truncate(text::of_json(v), 2048)),
            status_url: self.status_url_in(ex, Some(&json)),
            retry_after: wire::retry_after(&ex.headers),
            hints,
            remote_state,
        })
    }

    /// The state a status document names when the contract maps it to another phase than
    /// succeeded (running, failed, cancelled). A status document that names no state is in the
    /// contract's `state_absent`; a resource that names none, or a state the contract does not
    /// map, says nothing against the success already seen. `named_url`: a status read at a URL the
    /// provider named, where a status code the contract maps is the state whatever the body (as a
    /// status read takes it).
    fn not_succeeded_in(&self, ex: &Exchange, from: ResultFrom, named_url: bool) -> Option<String> {
        let spec = &self.contract.status;
        let from_status = from == ResultFrom::Status;
        if let Some(phase) = ex
            .status
            .filter(|_| from_status && named_url)
            .and_then(|c| spec.codes.get(&c))
        {
            return (*phase != Phase::Succeeded)
                .then(|| format!("HTTP {}", ex.status.unwrap_or_default()));
        }
        // The result itself, maybe: only its state is built (a large one that cannot be read so is
        // not built whole here: the result's own checks read it, a few at a time). One that can
        // be read only whole (an array) is built only within a status answer's bounds: its size,
        // and what it may take parsed, as the wire measures a status answer.
        let pointers = spec.state.iter().chain(&spec.done).map(String::as_str);
        let json = wire::sparse(&ex.body, pointers).or_else(|| {
            let most = self.contract.max_response_bytes;
            (ex.body.len() as u64 <= most
                && jobtrail_core::json::footprint_within(&ex.body, wire::parsed_most(most)).is_ok())
            .then(|| serde_json::from_slice::<serde_json::Value>(&ex.body).ok())
            .flatten()
        })?;
        // A status document that names no state is in the contract's absent state, as a status
        // read takes it (Google's `done` left out: still running); the created resource may
        // name none after success.
        let state = if from_status {
            spec.state_in(&json).or_else(|| spec.state_absent.clone())?
        } else {
            spec.stated(&json)?
        };
        spec.phase(&state)
            .is_some_and(|p| p != Phase::Succeeded)
            .then_some(state)
    }

    /// The state a cancel's answer names, when the contract maps it to cancelled: only a state
    /// the body states (never a status code, never `state_absent`: an empty answer confirms
    /// nothing).
    fn cancelled_in(&self, ex: &Exchange) -> Option<String> {
        let spec = &self.contract.status;
        let json = serde_json::from_slice::<serde_json::Value>(&ex.body).ok()?;
        let state = spec.state_in(&json)?;
        (spec.phase(&state) == Some(Phase::Cancelled)).then_some(state)
    }

    async fn do_cancel(&self, op: &OperationRecord, at: CallCtx) -> Called<CancelOutcome> {
        let Some(spec) = &self.contract.cancel else {
            let why = "the contract has no cancel endpoint";
            let outcome = CancelOutcome::Rejected {
                http_status: None,
                reason: why.into(),
            };
            return unsent_called(CallKind::Cancel, at, op, why, outcome);
        };
        let max = self.contract.max_response_bytes;
        let (target, body, extra) =
            self.with_body(self.fill(&spec.path, op), spec.body.as_ref(), op);
        let ex = self
            .call(
                op,
                Target {
                    kind: CallKind::Cancel,
                    at,
                    method: spec.method.clone(),
                    path: &target,
                    max_body: max,
                },
                body,
                extra,
            )
            .await;
        let ctx = self.context_after(op, &ex, None);
        let (outcome, d) = match self.verdict(CallName::Cancel, &ex) {
            // Nothing reached the provider (refused connection, a secret missing): the job was not
            // asked, so this is no attempt; the cancel goes again (within the window), even where
            // the contract does not let a sent cancel be repeated.
            Verdict::Wire(e) if e.not_sent() => (
                CancelOutcome::NotSent {
                    error_class: e.class().into(),
                },
                format!("not sent: {}", e.class()),
            ),
            Verdict::Wire(e) => (
                CancelOutcome::Failed {
                    error_class: e.class().into(),
                    retry_after: None,
                },
                format!("failed: {}", e.class()),
            ),
            Verdict::Ambiguous { class } => (
                CancelOutcome::Failed {
                    error_class: class.clone(),
                    retry_after: wire::retry_after(&ex.headers),
                },
                format!("failed: {class}"),
            ),
            Verdict::Success | Verdict::AlreadyExists => match self.cancelled_in(&ex) {
                // The answer is the job, already cancelled (OGC's dismiss): the confirmation.
                Some(remote_state) => {
                    let d = format!("cancel confirmed in the answer ({remote_state})");
                    (
                        CancelOutcome::Confirmed {
                            http_status: ex.status,
                            remote_state,
                        },
                        d,
                    )
                }
                None => (
                    CancelOutcome::Accepted {
                        http_status: ex.status,
                        retry_after: wire::retry_after(&ex.headers),
                    },
                    "cancel accepted".into(),
                ),
            },
            Verdict::Reject { status, reason } => (
                CancelOutcome::Rejected {
                    http_status: status,
                    reason: reason.clone(),
                },
                format!("cancel refused: {reason}"),
            ),
            Verdict::RetryLater { delay, reason } => (
                CancelOutcome::RetryLater {
                    delay,
                    reason: reason.clone(),
                },
                format!("retry later: {reason}"),
            ),
        };
        Self::finish(ex, outcome, d, ctx)
    }

    async fn do_fetch_result(&self, op: &OperationRecord, at: CallCtx) -> Called<ResultOutcome> {
        let Some(spec) = &self.contract.result else {
            let outcome = ResultOutcome::Unavailable {
                http_status: None,
                reason: "the contract names no result".into(),
            };
            return unsent_called(
                CallKind::Result,
                at,
                op,
                "the contract has no result",
                outcome,
            );
        };
        let spec = spec.for_request(&op.request_body);
        let hints: ResultHints = op
            .provider_context
            .get("result")
            .and_then(|r| serde_json::from_value(r.clone()).ok())
            .unwrap_or_default();
        let status = &self.contract.status;
        // A URL the status names may be pre-signed, and expire before it is read (or between a
        // failed read and the next): after a refused download the status is read again for a
        // fresh one before the next download. Not a URL the contract builds: that one is as good
        // as it will ever be.
        let renewable =
            spec.from == ResultFrom::Url && spec.url.is_none() && status.result_url.is_some();
        if renewable
            && hints.result_url.is_some()
            && let Some(refused) = &hints.refused
        {
            return self.renew_result_url(op, at, &hints, refused).await;
        }
        // Only the contract's own result URL is fetched its way; every other read is a GET.
        let get = |t: String| (t, http::Method::GET, None, http::HeaderMap::new());
        let target = match (spec.from, &spec.url, &hints.result_url) {
            (ResultFrom::Status, _, _) => get(match &op.status_url {
                Some(u) => u.clone(),
                None => self.fill(&status.url, op),
            }),
            (ResultFrom::Resource, _, _) => get(self.fill(&status.url, op)),
            (ResultFrom::Url, Some(t), _) => {
                let (target, body, extra) =
                    self.with_body(self.fill(t, op), spec.body.as_ref(), op);
                (target, spec.method.clone(), body, extra)
            }
            (ResultFrom::Url, None, Some(u)) => get(u.clone()),
            (ResultFrom::Url, None, None) => {
                let outcome = ResultOutcome::Unavailable {
                    http_status: None,
                    reason: "the provider gave no result URL".into(),
                };
                return unsent_called(CallKind::Result, at, op, "no result URL", outcome);
            }
        };
        let (target, method, body, extra) = target;
        let ex = self
            .call(
                op,
                Target {
                    kind: CallKind::Result,
                    at,
                    method,
                    path: &target,
                    max_body: spec.max_bytes,
                },
                body,
                extra,
            )
            .await;
        let verdict = self.verdict(CallName::Result, &ex);
        // A refusal (not a "not now") of a URL the status named, unless a contract rule says what
        // the answer means: remembered, so the next attempt asks the status for a fresh URL.
        let refused = match &verdict {
            Verdict::Reject { .. } | Verdict::Ambiguous { .. }
                if renewable && self.ruled(CallName::Result, &ex).is_none() =>
            {
                ex.status.filter(|c| (400..500).contains(c))
            }
            _ => None,
        };
        let marked = refused.map(|status| ResultHints {
            refused: Some(RefusedDownload {
                status,
                reason: Self::reason(&ex),
            }),
            ..hints.clone()
        });
        let ctx = self.context_after(op, &ex, marked.as_ref());
        let (outcome, d) = match verdict {
            // Not gone yet: the status may name a fresh URL (counted against the failure budget).
            Verdict::Reject { reason, .. } if refused.is_some() => (
                ResultOutcome::Failed {
                    error_class: "result_url_refused".into(),
                },
                format!(
                    "failed: result URL refused ({reason}); the status is read for a fresh one"
                ),
            ),
            Verdict::Wire(WireError::TooLarge) => (
                ResultOutcome::TooLarge {
                    limit: spec.max_bytes,
                },
                format!("result larger than {} bytes", spec.max_bytes),
            ),
            Verdict::Wire(WireError::Origin) => (
                ResultOutcome::Refused {
                    url: ex.record.url.clone(),
                },
                "refused: outside the contract's origins".into(),
            ),
            Verdict::Wire(e) => (
                ResultOutcome::Failed {
                    error_class: e.class().into(),
                },
                format!("failed: {}", e.class()),
            ),
            Verdict::Success | Verdict::AlreadyExists if ex.echoed_secret => (
                ResultOutcome::Unavailable {
                    http_status: ex.status,
                    reason: "the result repeats a credential this call sent; it is not kept".into(),
                },
                "refused: the result repeats a credential".into(),
            ),
            // A result read from the status (or the resource) is that document read again: it
            // must still say the job succeeded, or it is no result (a provider that went back to
            // "running", or answered from a stale replica). Read again, within the failure budget.
            Verdict::Success | Verdict::AlreadyExists
                if matches!(spec.from, ResultFrom::Status | ResultFrom::Resource)
                    && let Some(state) =
                        self.not_succeeded_in(&ex, spec.from, op.status_url.is_some()) =>
            {
                (
                    ResultOutcome::Failed {
                        error_class: "status_no_longer_succeeded".into(),
                    },
                    format!(
                        "failed: the status read for the result says {:?}, not a success",
                        text::truncate(state, MAX_STATE_BYTES)
                    ),
                )
            }
            // We ask for no encoding: bytes sent encoded anyway are not the result the provider
            // made (its checksum, its CSV rows, its JSON are of the decoded form).
            Verdict::Success | Verdict::AlreadyExists if encoded(&ex.headers) => (
                ResultOutcome::Failed {
                    error_class: "result_encoded".into(),
                },
                "failed: the result came with a content encoding nobody asked for".into(),
            ),
            Verdict::Success | Verdict::AlreadyExists => {
                let header = |name: &http::HeaderName| {
                    ex.headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(|v| text::truncate(v.to_owned(), wire::KEPT_HEADER_BYTES))
                };
                let fetched = FetchedResult {
                    bytes: ex.body.clone(),
                    content_type: header(&http::header::CONTENT_TYPE),
                    checksum: spec
                        .checksum_header
                        .as_ref()
                        .and_then(|name| given_checksum(&ex.headers, name)),
                };
                let d = format!("fetched {} bytes", fetched.bytes.len());
                (ResultOutcome::Fetched(fetched), d)
            }
            Verdict::Reject { status, reason } => (
                ResultOutcome::Unavailable {
                    http_status: status,
                    reason: reason.clone(),
                },
                format!("unavailable: {reason}"),
            ),
            Verdict::RetryLater { delay, reason } => (
                ResultOutcome::RetryLater {
                    delay,
                    reason: reason.clone(),
                },
                format!("retry later: {reason}"),
            ),
            Verdict::Ambiguous { .. } => {
                let class = Self::ambiguous_class(&ex);
                // A refusal read again (a 403, a 401) keeps the provider's words in the record,
                // as the refusal that ended it did: the budget spent, they say why.
                let d = match ex.status {
                    Some(400..=499) => format!("failed: {class} ({})", Self::reason(&ex)),
                    _ => format!("failed: {class}"),
                };
                (
                    ResultOutcome::Failed {
                        error_class: class.clone(),
                    },
                    d,
                )
            }
        };
        Self::finish(ex, outcome, d, ctx)
    }

    /// The download of the URL the status named was refused (`refused`: how): the
    /// status is read again for a fresh URL, and the download follows at once. The same URL again,
    /// after a 404 or a 410, is a result that is gone; after any other refusal it is read again
    /// within the failure budget (the refusal counted already).
    async fn renew_result_url(
        &self,
        op: &OperationRecord,
        at: CallCtx,
        old: &ResultHints,
        refused: &RefusedDownload,
    ) -> Called<ResultOutcome> {
        let Called {
            outcome,
            call,
            context,
        } = self.do_status(op, at, false).await;
        let outcome = match outcome {
            StatusOutcome::Observed(s) if s.phase == Some(Phase::Succeeded) => {
                let fresh = s.hints.result_url.is_some() && s.hints.result_url != old.result_url;
                // A store that signs a URL on each read names a new one for a result that is gone
                // too: only the place (its query, a signature, aside) says whether it moved.
                let moved = fresh
                    && match (&s.hints.result_url, &old.result_url) {
                        (Some(new), Some(was)) => !same_place(new, was),
                        _ => true,
                    };
                if !moved && matches!(refused.status, 404 | 410) {
                    ResultOutcome::Unavailable {
                        http_status: Some(refused.status),
                        reason: format!(
                            "{}; the status names no other place for the result",
                            refused.reason
                        ),
                    }
                } else {
                    ResultOutcome::Renewed {
                        fresh,
                        seen: Box::new(s),
                    }
                }
            }
            // Asked again at the next attempt: the mark stays.
            StatusOutcome::Observed(_) => ResultOutcome::Failed {
                error_class: "status_no_longer_succeeded".into(),
            },
            StatusOutcome::Failed { error_class } => ResultOutcome::Failed { error_class },
            StatusOutcome::RetryLater { delay, reason } => {
                ResultOutcome::RetryLater { delay, reason }
            }
            // A status read refused (a gateway's passing 403, a job the provider forgot) does not
            // lose a finished job's result on one answer: asked again within the failure budget.
            StatusOutcome::Rejected { http_status, .. } => ResultOutcome::Failed {
                error_class: format!("status_refused_{}", http_status.unwrap_or_default()),
            },
            StatusOutcome::Refused { url } => ResultOutcome::Refused { url },
        };
        // Answered: the next attempt downloads (the mark goes with the URL it was about). Cleared
        // from whatever context the read left, or the one it had: a mark left standing would renew
        // again at once, and a renewal spends nothing.
        let context = match (&outcome, context) {
            (ResultOutcome::Renewed { .. } | ResultOutcome::Unavailable { .. }, c) => {
                let mut c = c.unwrap_or_else(|| op.provider_context.clone());
                if let Some(r) = c.get_mut("result").and_then(|r| r.as_object_mut()) {
                    r.remove("refused");
                }
                Some(c)
            }
            (_, c) => c,
        };
        Called {
            outcome,
            call,
            context,
        }
    }

    async fn do_lookup(&self, op: &OperationRecord, at: CallCtx) -> Called<LookupOutcome> {
        let rc = &self.contract.reconcile;
        let Some(t) = &rc.lookup_url else {
            return unsent_called(
                CallKind::Lookup,
                at,
                op,
                "no lookup",
                LookupOutcome::Failed {
                    error_class: "no_lookup".into(),
                },
            );
        };
        let max = self.contract.max_response_bytes;
        let (target, body, extra) = self.with_body(self.fill(t, op), rc.lookup_body.as_ref(), op);
        let ex = self
            .call(
                op,
                Target {
                    kind: CallKind::Lookup,
                    at,
                    method: rc.lookup_method.clone(),
                    path: &target,
                    max_body: max,
                },
                body,
                extra,
            )
            .await;
        let ctx = self.context_after(op, &ex, None);
        let failed = |class: String| {
            (
                LookupOutcome::Failed {
                    error_class: class.clone(),
                },
                format!("failed: {class}"),
            )
        };
        let (outcome, d) = match self.verdict(CallName::Lookup, &ex) {
            Verdict::Wire(e) => failed(e.class().into()),
            // A lookup by path (`/jobs/by-reference/{client_reference}`) says "none" with a 404,
            // unless the contract's rules say what its 404s mean (a gateway's page, say).
            _ if ex.status == Some(404) && self.ruled(CallName::Lookup, &ex).is_none() => {
                (LookupOutcome::NotFound, "not found".into())
            }
            Verdict::RetryLater { delay, reason } => (
                LookupOutcome::RetryLater {
                    delay,
                    reason: reason.clone(),
                },
                format!("retry later: {reason}"),
            ),
            Verdict::Success => match serde_json::from_slice::<serde_json::Value>(&ex.body) {
                Err(_) => failed("malformed_json".into()),
                Ok(json) => {
                    let ours = [op.id.to_string(), op.token.as_str().to_owned()];
                    match listed_jobs(rc, &json, &ours) {
                        Err(why) => failed(why),
                        Ok(job_ids) if job_ids.is_empty() => {
                            (LookupOutcome::NotFound, "not found".into())
                        }
                        Ok(job_ids) => {
                            let d = format!("found {}", job_ids.join(", "));
                            (LookupOutcome::Found { job_ids }, d)
                        }
                    }
                }
            },
            _ => failed(Self::ambiguous_class(&ex)),
        };
        Self::finish(ex, outcome, d, ctx)
    }
}

/// An id or a reference a provider wrote in JSON: a string, or a number as written.
fn id_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        // Only a whole number read exactly: beyond 64 bits, or written with a fraction or an
        // exponent, it was rounded to a double, and two jobs could share the id it prints as.
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => Some(n.to_string()),
        _ => None,
    }
}

/// A count as a provider may write it: a whole number, also written with a zero fraction (`10.0`)
/// or as a string of digits (`"10"`).
fn count_of(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(f))
                .map(|f| f as u64)
        }),
        serde_json::Value::String(s) => {
            let s = s.trim();
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        }
        _ => None,
    }
}

/// The most jobs a lookup's answer is read for: one is the answer, two or more a violation, and
/// each is kept in the record (a provider that lists thousands would fill it, and its lookup
/// would cost the square of their number).
const MOST_LISTED: usize = 20;

/// The jobs a lookup's answer lists as ours, each once, in the order listed, the first
/// [`MOST_LISTED`] of them; `Err` (an error class) for an answer that is no clear list: "none
/// found" lets a second job be created, so only a list that is there and readable says it. A
/// listed job without a usable id is no answer. One that does not repeat what we looked it up by
/// (`lookup_reference`, when the contract names it) is another's, or names none: listed by a
/// provider that ignored the filter. Ours are taken from beside them, but a list of only such is
/// no answer, since an unfiltered list may be one page of many and ours on the next.
fn listed_jobs(
    rc: &crate::contract::ReconcileSpec,
    json: &serde_json::Value,
    ours: &[String],
) -> Result<Vec<String>, String> {
    let id_ptr = rc.lookup_job_id.as_deref().unwrap_or("/job_id");
    let items: Vec<&serde_json::Value> = match &rc.lookup_jobs {
        Some(p) => match json.pointer(p) {
            Some(serde_json::Value::Array(a)) => a.iter().collect(),
            _ => return Err(format!("malformed_lookup: no job list at {p}")),
        },
        None => vec![json],
    };
    let mut job_ids: Vec<String> = Vec::new();
    let mut others = 0usize;
    for item in items {
        if let Some(p) = &rc.lookup_reference {
            let theirs = item.pointer(p).and_then(id_text);
            if !theirs.as_ref().is_some_and(|t| ours.contains(t)) {
                // One job answered (no list) is the job found: one that is not ours, or says
                // nothing (`{}` from a broken gateway), is no answer. Only a readable list, or a
                // 404, says none was found; a listed job that names no reference (one made in the
                // provider's console) may be ours, so a list of only such is none found neither.
                if rc.lookup_jobs.is_none() {
                    return Err(format!(
                        "malformed_lookup: the job answered does not carry our reference at {p}"
                    ));
                }
                others += 1;
                continue;
            }
        }
        // Read as `create` reads an id: a string, or a number as written.
        let id = item
            .pointer(id_ptr)
            .and_then(id_text)
            .ok_or_else(|| format!("malformed_lookup: a listed job has no id at {id_ptr}"))?;
        // A URL is recorded as the create's answer records one, so the two compare.
        let id = wire::recorded_job_id(id);
        jobtrail_core::ids::check_remote_job_id(&id)
            .map_err(|why| format!("unusable_job_id: {why}"))?;
        if !job_ids.contains(&id) {
            job_ids.push(id);
            if job_ids.len() == MOST_LISTED {
                break;
            }
        }
    }
    if job_ids.is_empty() && others > 0 {
        return Err(format!(
            "malformed_lookup: the provider listed {others} job(s) not of our reference and none of ours: it did not filter, so its list does not say none of ours exists"
        ));
    }
    Ok(job_ids)
}

fn unsent_called<T>(
    kind: CallKind,
    at: CallCtx,
    op: &OperationRecord,
    why: &str,
    outcome: T,
) -> Called<T> {
    let mut ex = wire::not_built(kind, at.attempt, &http::Method::GET, op.trace_id, why);
    ex.record.started_at = at.now();
    Called {
        outcome,
        call: ex.record,
        context: None,
    }
}

fn set_pointer(
    doc: &mut serde_json::Value,
    pointer: &str,
    value: serde_json::Value,
) -> Result<(), String> {
    if pointer.is_empty() {
        *doc = value;
        return Ok(());
    }
    let mut cur = doc;
    let parts: Vec<String> = pointer[1..]
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let obj = cur
            .as_object_mut()
            .ok_or_else(|| format!("cannot set {pointer}: not an object on the way"))?;
        if i + 1 == parts.len() {
            obj.insert(part.clone(), value);
            return Ok(());
        }
        cur = obj
            .entry(part.clone())
            .or_insert_with(|| serde_json::json!({}));
    }
    Ok(())
}

impl Provider for HttpProvider {
    fn contract(&self) -> &Contract {
        &self.contract
    }
    fn create<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, CreateOutcome> {
        Box::pin(self.do_create(op, at))
    }
    fn status<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, StatusOutcome> {
        Box::pin(self.do_status(op, at, false))
    }
    fn final_get<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, StatusOutcome> {
        Box::pin(self.do_status(op, at, true))
    }
    fn cancel<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, CancelOutcome> {
        Box::pin(self.do_cancel(op, at))
    }
    fn fetch_result<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, ResultOutcome> {
        Box::pin(self.do_fetch_result(op, at))
    }
    fn lookup<'a>(
        &'a self,
        op: &'a OperationRecord,
        at: CallCtx,
    ) -> ProviderFuture<'a, LookupOutcome> {
        Box::pin(self.do_lookup(op, at))
    }
}

/// Whether an answer's bytes came encoded (`Content-Encoding` other than `identity`, in any of
/// its values): none is asked for, so such bytes are not the result the provider made (its
/// checksum, its rows, its JSON are of the decoded form). Every header line is read: a first
/// `identity` does not hide a `gzip` after it.
fn encoded(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|coding| {
            let coding = coding.trim_ascii();
            !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
        })
}

/// The checksum a result's answer gives in `name`: one that is there but cannot be read (not
/// text), or given twice over with different values, stands as a checksum no digest matches, so
/// the result is refused rather than recorded as given without one.
fn given_checksum(headers: &http::HeaderMap, name: &http::HeaderName) -> Option<String> {
    let given: Vec<_> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().map(str::trim))
        .collect();
    match given.as_slice() {
        [] => None,
        _ if given.iter().any(Result::is_err) => Some("(a value that is not text)".to_owned()),
        // (Kept in the record: a provider's megabyte header is kept cut, and matches no digest.)
        [Ok(a), rest @ ..] if rest.iter().all(|v| v.as_ref().is_ok_and(|b| b == a)) => Some(
            text::truncate((*a).to_owned(), crate::wire::KEPT_HEADER_BYTES),
        ),
        _ => Some(format!("{} different values", given.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        as_path, followable, given_checksum, id_text, job_id_of_url, listed_jobs, with_path,
    };

    /// A provider's answer cannot make an id out of a rounded number, fill the record with the
    /// jobs a lookup lists, or keep a megabyte checksum header.
    #[test]
    fn hostile_answers_give_no_rounded_id_no_endless_list_and_no_huge_header() {
        let v = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(id_text(&v("123")).as_deref(), Some("123"));
        assert_eq!(id_text(&v("-7")).as_deref(), Some("-7"));
        assert_eq!(id_text(&v(r#""1e3""#)).as_deref(), Some("1e3"));
        for rounded in ["123456789012345678901234", "1e3", "12.5"] {
            assert_eq!(id_text(&v(rounded)), None, "{rounded}");
        }

        let rc = crate::contract::ReconcileSpec {
            method: crate::contract::ReconcileMethod::Lookup,
            lookup_url: None,
            lookup_method: http::Method::GET,
            lookup_body: None,
            lookup_jobs: Some("/jobs".into()),
            lookup_job_id: Some("/id".into()),
            lookup_reference: Some("/ref".into()),
            interval: std::time::Duration::from_secs(1),
        };
        let jobs: Vec<_> = (0..20_000)
            .map(|i| serde_json::json!({"id": format!("j{}", i % 10_000), "ref": "op_1"}))
            .collect();
        let listed = listed_jobs(&rc, &serde_json::json!({ "jobs": jobs }), &["op_1".into()]);
        assert_eq!(listed.unwrap().len(), 20);
        let twice = serde_json::json!({"jobs": [{"id": "a", "ref": "op_1"}, {"id": "a", "ref": "op_1"}, {"id": "b", "ref": "other"}]});
        assert_eq!(listed_jobs(&rc, &twice, &["op_1".into()]).unwrap(), ["a"]);
        // A job listed by its URL is recorded as a create's answer records one: its capability
        // blanked, so the two compare (and the token is not kept).
        let url = "https://h.test/jobs/7?access_token=tok-123";
        let by_url = serde_json::json!({"jobs": [{"id": url, "ref": "op_1"}]});
        assert_eq!(
            listed_jobs(&rc, &by_url, &["op_1".into()]).unwrap(),
            [job_id_of_url(url)]
        );
        assert!(!job_id_of_url(url).contains("tok-123"));

        let mut h = http::HeaderMap::new();
        h.insert("x-checksum", "a".repeat(100_000).parse().unwrap());
        let kept = given_checksum(&h, &http::HeaderName::from_static("x-checksum")).unwrap();
        assert!(
            kept.len() <= crate::wire::KEPT_HEADER_BYTES + 8,
            "{}",
            kept.len()
        );
    }

    /// A checksum header that is there is never read as none: one that is not text, or two that
    /// disagree, give a checksum no digest matches (the result is refused, not recorded as given
    /// without one); two that agree, or one, are the checksum.
    #[test]
    fn a_checksum_header_that_cannot_be_read_is_no_missing_checksum() {
        let name = http::HeaderName::from_static("x-checksum-sha256");
        let with = |values: &[&[u8]]| {
            let mut h = http::HeaderMap::new();
            for v in values {
                h.append(&name, http::HeaderValue::from_bytes(v).unwrap());
            }
            given_checksum(&h, &name)
        };
        let hex = "ab".repeat(32);
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[hex.as_bytes()]), Some(hex.clone()));
        assert_eq!(with(&[hex.as_bytes(), hex.as_bytes()]), Some(hex.clone()));
        for bad in [
            with(&[b"\x80abc"]),
            with(&[hex.as_bytes(), b"\xff"]),
            with(&[hex.as_bytes(), "cd".repeat(32).as_bytes()]),
        ] {
            let bad = bad.expect("a checksum was given");
            assert!(bad.len() != 64 && !bad.is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_status_url_as_a_job_id_keeps_what_names_the_job_and_no_key() {
        let id = job_id_of_url("https://h.test/api/status?id=A&code=s3cret#frag");
        assert!(id.contains("id=A") && !id.contains("s3cret"), "{id}");
        assert_ne!(
            job_id_of_url("https://h.test/api/status?id=A"),
            job_id_of_url("https://h.test/api/status?id=B"),
            "two jobs stay two"
        );
        // A name that only contains a secret's word (`key`) has its value blanked too, but each
        // blanked value leaves its own digest: two jobs stay two, and the values are not kept.
        let (a, b) = (
            job_id_of_url("https://h.test/v1/exports/status?exportKey=first-export"),
            job_id_of_url("https://h.test/v1/exports/status?exportKey=second-export"),
        );
        assert_ne!(a, b, "two jobs stay two");
        assert!(!a.contains("first") && !b.contains("second"), "{a} {b}");
        assert_eq!(
            a,
            job_id_of_url("https://h.test/v1/exports/status?exportKey=first-export"),
            "the same job is the same id"
        );
        assert_eq!(job_id_of_url("/v1/operations/j1/0"), "/v1/operations/j1/0");
        let rel = job_id_of_url("/v1/ops/1?sig=abc&n=2");
        assert!(
            rel.starts_with("/v1/ops/1?") && !rel.contains("abc") && rel.contains("n=2"),
            "{rel}"
        );
    }

    #[test]
    fn a_path_added_to_a_provider_url_goes_before_its_query() {
        assert_eq!(with_path("/jobs/1", "/results"), "/jobs/1/results");
        assert_eq!(
            with_path("https://h/jobs/1/", "/results"),
            "https://h/jobs/1/results"
        );
        assert_eq!(
            with_path("https://h/jobs/1?f=json#x/y", "/results"),
            "https://h/jobs/1/results?f=json"
        );
        assert_eq!(
            with_path("https://h/ops/1?api-version=2024-01-01", ""),
            "https://h/ops/1?api-version=2024-01-01"
        );
    }

    #[test]
    fn only_absolute_urls_and_paths_are_followed() {
        for ok in ["/v1/ops/1", "http://h/x", "HTTPS://h/x"] {
            assert!(followable(ok), "{ok}");
        }
        for bad in [
            "null",
            "",
            "ops/1",
            "//evil/x",
            "/\\evil/x",
            "ftp://h/x",
            "javascript:x",
        ] {
            assert!(!followable(bad), "{bad}");
        }
    }

    #[test]
    fn a_job_name_is_a_path_only_when_no_segment_could_move_it() {
        assert_eq!(as_path("operations/job_1"), "operations/job_1");
        assert_eq!(as_path("operations/a b?c#d"), "operations/a%20b%3Fc%23d");
        for hostile in [
            "operations/../admin",
            "operations//x",
            "./x",
            "a/..",
            "",
            "a/%2E%2E/b",
        ] {
            let p = as_path(hostile);
            assert!(!p.contains('/'), "{hostile:?} became {p:?}");
            let u = url::Url::parse(&format!("http://h/v1/{p}")).unwrap();
            assert!(
                u.path().starts_with("/v1/"),
                "{hostile:?} moved to {}",
                u.path()
            );
            assert_eq!(
                u.path().matches('/').count(),
                2,
                "{hostile:?}: {}",
                u.path()
            );
        }
    }
}
