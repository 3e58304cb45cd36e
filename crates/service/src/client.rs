//! The agent-facing operations over the HTTP API, for a machine that holds a token and nothing
//! else: no database URL, no provider contracts. The CLI's `--api` mode and the MCP server's stdio
//! mode use it.

use std::time::Duration;

use jobtrail_core::TraceParent;
use reqwest::{Method, StatusCode};

use crate::error::{Kind, ServiceError};
use crate::model::*;
use crate::{MAX_WAIT, Operations};

/// Bound on everything but a wait (which gets its own timeout plus this): the server's default
/// bound and a margin, so that at the default the server's answer (503 naming what ran out, and
/// that a change it made stands) arrives before this client gives up. A server started with a
/// longer `--request-timeout` may still be working when this client gives up.
const REQUEST_TIMEOUT: Duration = crate::REQUEST_TIMEOUT.saturating_add(Duration::from_secs(10));
/// Largest answer read into memory (a result may be large; the API caps what it serves).
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// A client of jobtrail's HTTP API, acting with one bearer token.
#[derive(Clone)]
pub struct ApiClient {
    base: url::Url,
    token: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ApiClient")
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

/// An RFC 9457 problem document as the API writes it.
#[derive(Debug, serde::Deserialize)]
struct Problem {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    extra: Option<serde_json::Value>,
}

/// What to say when `base` would carry the token in the clear across a network: plain `http://` to
/// a host other than this machine. (Not refused: a cluster-internal Service over a mesh that
/// encrypts is plain http:// to the client.)
pub fn cleartext_warning(base: &url::Url) -> Option<String> {
    if base.scheme() != "http" {
        return None;
    }
    let this_machine = match base.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        None => false,
    };
    (!this_machine).then(|| {
        format!(
            "the API URL {base} is plain http:// to another machine: JOBTRAIL_TOKEN travels unencrypted, and anyone on the path can take it; use https:// (or a tunnel)"
        )
    })
}

impl ApiClient {
    /// A client for the API at `base` (`http://127.0.0.1:8080`), with `token`.
    pub fn new(base: &str, token: &str) -> Result<Self, ServiceError> {
        // Never echoed with what may be a password in it (`https://user:pw@host`).
        let shown = if base.contains('@') {
            "(not shown: it holds an @)".to_owned()
        } else {
            format!("{:?}", base.trim())
        };
        let mut base = url::Url::parse(base.trim())
            .map_err(|e| ServiceError::bad_input(format!("API URL {shown}: {e}")))?;
        if !base.username().is_empty() || base.password().is_some() {
            return Err(ServiceError::bad_input(
                "API URL: put the token in JOBTRAIL_TOKEN, not in the URL",
            ));
        }
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(ServiceError::bad_input(format!(
                "API URL {shown}: an http:// or https:// URL"
            )));
        }
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        if let Some(w) = cleartext_warning(&base) {
            tracing::warn!("{w}");
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(ServiceError::new(
                Kind::Unauthenticated,
                "a token is needed with the API (JOBTRAIL_TOKEN; jobtrail-admin tokens create)",
            ));
        }
        jobtrail_provider::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            // Let idle connections go before the server closes them (its --head-timeout: 90 s by
            // default, 30 s at least), rather than race it with the next request.
            .pool_idle_timeout(Duration::from_secs(20))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ServiceError::unavailable(format!("HTTP client: {e}")))?;
        Ok(Self {
            base,
            token: token.to_owned(),
            http,
        })
    }

    fn url(&self, path: &str) -> Result<url::Url, ServiceError> {
        self.base
            .join(path.trim_start_matches('/'))
            .map_err(|e| ServiceError::bad_input(format!("{path}: {e}")))
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&impl serde::Serialize>,
        timeout: Duration,
        trace: Option<TraceParent>,
    ) -> Result<reqwest::Response, ServiceError> {
        let mut req = self
            .http
            .request(method, self.url(path)?)
            .bearer_auth(&self.token)
            .timeout(timeout)
            .query(query);
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(t) = trace {
            // The caller's context as given, its sampled flag too: this client records no span
            // of its own, so the operation's root span is recorded under the caller's.
            let mut headers = reqwest::header::HeaderMap::new();
            jobtrail_provider::wire::inject_trace(
                &mut headers,
                t.trace,
                opentelemetry::trace::SpanId::from_bytes(t.span.to_bytes()),
                t.sampled,
            );
            req = req.headers(headers);
        }
        let resp = req.send().await.map_err(|e| {
            ServiceError::unavailable(format!(
                "the jobtrail API at {} did not answer: {}",
                self.base,
                without_url(&e)
            ))
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(problem(resp, &self.base).await)
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&impl serde::Serialize>,
        timeout: Duration,
        trace: Option<TraceParent>,
    ) -> Result<T, ServiceError> {
        let resp = self.send(method, path, query, body, timeout, trace).await?;
        let bytes = read_bounded(resp).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ServiceError::unavailable(format!("the API's answer is not what was expected: {e}"))
        })
    }
}

/// A reqwest error without the URL (a URL may carry what should not be printed).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "(url)");
    }
    if e.is_timeout() {
        s = "timed out".into();
    } else if e.is_connect() {
        s = "connection refused or unreachable".into();
    }
    s
}

async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, ServiceError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| {
        ServiceError::unavailable(format!("reading the API's answer: {}", without_url(&e)))
    })? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ServiceError::unavailable("the API's answer is too large"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// What the API's answer `resp` (not a success) says went wrong.
///
/// A `404` for a route the server does not have (its `extra.route` says so), or one with no
/// jobtrail problem at all (another server at that address), is the API URL's fault, not a missing
/// operation's: `JOBTRAIL_API=http://host:8080/v1` sent every request to `/v1/v1/…`, and a script
/// reading exit 3 took its operation for gone.
async fn problem(resp: reqwest::Response, base: &url::Url) -> ServiceError {
    let status = resp.status();
    let path = resp.url().path().to_owned();
    let bytes = read_bounded(resp).await.unwrap_or_default();
    let p: Option<Problem> = serde_json::from_slice(&bytes).ok();
    let no_route = p.as_ref().is_none_or(|p| {
        p.kind.is_none()
            || p.extra.as_ref().and_then(|e| e.get("route")) == Some(&serde_json::json!("unknown"))
    });
    if status == StatusCode::NOT_FOUND && no_route {
        return ServiceError::unavailable(format!(
            "the server at {base} has no route {:?}: is JOBTRAIL_API (--api) the jobtrail API's base URL, as http://host:8080, without /v1?",
            jobtrail_core::ids::shown(&path)
        ));
    }
    let kind = p
        .as_ref()
        .and_then(|p| p.kind.as_deref())
        .and_then(Kind::from_name)
        .unwrap_or(match status {
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => Kind::BadInput,
            StatusCode::UNAUTHORIZED => Kind::Unauthenticated,
            StatusCode::FORBIDDEN => Kind::Forbidden,
            StatusCode::NOT_FOUND => Kind::NotFound,
            StatusCode::CONFLICT => Kind::Conflict,
            StatusCode::PAYLOAD_TOO_LARGE => Kind::TooLarge,
            StatusCode::TOO_MANY_REQUESTS => Kind::RateLimited,
            _ => Kind::Unavailable,
        });
    let message = p
        .as_ref()
        .and_then(|p| p.detail.clone().or_else(|| p.title.clone()))
        .unwrap_or_else(|| format!("the API answered {status}"));
    let mut e = ServiceError::new(kind, message);
    e.detail = p.and_then(|p| p.extra);
    e
}

impl Operations for ApiClient {
    async fn submit(
        &self,
        req: SubmitRequest,
        trace: Option<TraceParent>,
    ) -> Result<SubmitResponse, ServiceError> {
        self.json(
            Method::POST,
            "v1/operations",
            &[],
            Some(&req),
            REQUEST_TIMEOUT,
            trace,
        )
        .await
    }

    async fn submit_batch(
        &self,
        reqs: Vec<SubmitRequest>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<SubmitResponse>, ServiceError> {
        let r: BatchSubmitResponse = self
            .json(
                Method::POST,
                "v1/operations:batch",
                &[],
                Some(&BatchSubmitRequest { operations: reqs }),
                REQUEST_TIMEOUT,
                trace,
            )
            .await?;
        Ok(r.operations)
    }

    async fn get(&self, id: &str, timeline: Timeline) -> Result<OperationView, ServiceError> {
        let q = match timeline {
            Timeline::Omit => vec![],
            Timeline::Newest => vec![("timeline", "true".to_owned())],
            Timeline::Before(seq) => vec![
                ("timeline", "true".to_owned()),
                ("timeline_before", seq.to_string()),
            ],
        };
        self.json(
            Method::GET,
            &format!("v1/operations/{}", segment(id)?),
            &q,
            None::<&()>,
            REQUEST_TIMEOUT,
            None,
        )
        .await
    }

    async fn list(&self, q: ListQuery) -> Result<OperationPage, ServiceError> {
        let mut query = Vec::new();
        let mut put = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                query.push((k, v));
            }
        };
        put("state", q.state);
        put("provider", q.provider);
        put("caller", q.caller);
        put("created_from", q.created_from.map(|t| t.to_rfc3339()));
        put("created_before", q.created_before.map(|t| t.to_rfc3339()));
        put("cursor", q.cursor);
        put("limit", q.limit.map(|l| l.to_string()));
        self.json(
            Method::GET,
            "v1/operations",
            &query,
            None::<&()>,
            REQUEST_TIMEOUT,
            None,
        )
        .await
    }

    async fn wait(
        &self,
        id: &str,
        seen: Option<&str>,
        timeout: Duration,
    ) -> Result<WaitResponse, ServiceError> {
        let timeout = timeout.min(MAX_WAIT);
        let mut q = vec![("timeout", format!("{}ms", timeout.as_millis()))];
        if let Some(s) = seen {
            q.push(("seen", s.to_owned()));
        }
        self.json(
            Method::GET,
            &format!("v1/operations/{}/wait", segment(id)?),
            &q,
            None::<&()>,
            timeout + REQUEST_TIMEOUT,
            None,
        )
        .await
    }

    async fn cancel(
        &self,
        id: &str,
        reason: &str,
        seen: Option<&str>,
    ) -> Result<CancelResponse, ServiceError> {
        self.json(
            Method::POST,
            &format!("v1/operations/{}/cancel", segment(id)?),
            &[],
            Some(&CancelBody {
                reason: reason.to_owned(),
                seen: seen.map(str::to_owned),
            }),
            REQUEST_TIMEOUT,
            None,
        )
        .await
    }

    async fn result(&self, id: &str) -> Result<ResultBytes, ServiceError> {
        let resp = self
            .send(
                Method::GET,
                &format!("v1/operations/{}/result", segment(id)?),
                &[],
                None::<&()>,
                Duration::from_secs(300),
                None,
            )
            .await?;
        let sha = resp
            .headers()
            .get(crate::RESULT_SHA256_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                ServiceError::unavailable("the API sent a result without its sha256 header")
            })?;
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = read_bounded(resp).await?;
        // Checked here too: what arrives is what the chain records.
        let got = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
        if got != sha {
            return Err(ServiceError::new(
                Kind::Tampered,
                format!("the result's bytes hash to {got}, not the recorded {sha}"),
            ));
        }
        Ok(ResultBytes {
            bytes,
            sha256: sha,
            content_type,
            held: None,
        })
    }

    /// Every request to the API is authenticated as it arrives: nothing to look at again here.
    async fn still_authenticated(&self) -> Result<(), ServiceError> {
        Ok(())
    }
    fn rests_on_one_authentication(&self) -> bool {
        false
    }

    async fn providers(&self) -> Result<ProviderList, ServiceError> {
        self.json(
            Method::GET,
            "v1/providers",
            &[],
            None::<&()>,
            REQUEST_TIMEOUT,
            None,
        )
        .await
    }
}

/// An operation id as one path segment (refused if it could leave the segment).
fn segment(id: &str) -> Result<String, ServiceError> {
    let id = id.trim();
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ServiceError::bad_input(format!(
            "{id:?} is not an operation id"
        )));
    }
    Ok(id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::cleartext_warning;

    /// The token in the clear across a network is said; to this machine, or over TLS, it is not.
    /// (Only parsed: nothing is sent anywhere.)
    #[test]
    fn a_token_sent_in_the_clear_to_another_machine_is_warned_of() {
        let warned = |u: &str| cleartext_warning(&url::Url::parse(u).unwrap()).is_some();
        for u in [
            "http://api.example:8080/",
            "http://10.0.0.7:8080/",
            "http://[2001:db8::1]:8080/",
            "http://jobtrail-api.agents.svc:8080/",
            "http://localhost.example/",
        ] {
            assert!(warned(u), "{u}");
        }
        for u in [
            "https://api.example/",
            "http://127.0.0.1:8080/",
            "http://127.9.9.9/",
            "http://[::1]:8080/",
            "http://localhost:8080/",
            "http://LOCALHOST./",
            "http://api.localhost/",
        ] {
            assert!(!warned(u), "{u}");
        }
    }
}
