//! The agents' front door, over real HTTP: `jobtrail serve` against a real database, the simulated
//! provider, an in-process worker. Tokens decide who the caller is; a caller sees and acts on only
//! its own operations; errors are RFC 9457 problems with the CLI's meanings; waiting is a long poll;
//! the CLI works through the API with no database URL and no contracts.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Connection;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::Env;

const PROBLEM: &str = "application/problem+json";

fn body(script: Value) -> Value {
    json!({"report": "usage", "sim": script})
}

async fn problem(r: reqwest::Response, status: StatusCode, kind: &str) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(
        r.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap(),
        PROBLEM
    );
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["kind"], kind, "{p}");
    assert_eq!(p["status"], status.as_u16());
    assert_eq!(p["type"], format!("urn:jobtrail:problem:{kind}"));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_submit_wait_fetch_and_cancel_over_http_as_their_token_says() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api");
    let c = support::http();
    let alice = env
        .token("agent-alice", &["submit", "read", "cancel"])
        .await;
    let bob = env.token("agent-bob", &["read"]).await;

    // Submit with a caller-chosen id and the agent's trace: 201, the intent durable, the caller the
    // token's (a caller field in the request is refused, not obeyed).
    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let req = json!({
        "id": id, "provider": "sim", "target": "reports", "approved_by": "alice",
        "request": body(json!({"duration_ms": 300})),
    });
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // The 201 names what it created (RFC 9110 §15.3.2), where a GET reads it.
    let location = r.headers()[reqwest::header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(location, format!("/v1/operations/{id}"));
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["created"], true);
    assert_eq!(s["operation"]["caller"], "agent-alice");
    assert_eq!(s["operation"]["trace_id"], trace);
    let op_id = s["operation"]["id"].as_str().unwrap().to_owned();
    // The caller's span is kept: the operation's root span is recorded under it.
    let stored = env.store.get(op_id.parse().unwrap()).await.unwrap();
    assert_eq!(
        stored.parent_span.map(|s| s.to_string()).as_deref(),
        Some("00f067aa0ba902b7")
    );

    // The same request again: 200, the same operation, nothing new.
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let again: Value = r.json().await.unwrap();
    assert_eq!(again["created"], false);
    assert_eq!(again["operation"]["id"], op_id.as_str());
    let at_location = c
        .get(server.url(&location))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(at_location.status(), StatusCode::OK);

    // A different request under the same id: 409 naming both fingerprints.
    let mut other = req.clone();
    other["request"] = body(json!({"duration_ms": 999}));
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(&other)
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::CONFLICT, "conflict").await;
    assert_eq!(p["exit_code"], 4);
    assert_eq!(
        p["extra"]["stored_fingerprint"],
        s["operation"]["fingerprint"]
    );
    assert_ne!(
        p["extra"]["submitted_fingerprint"],
        p["extra"]["stored_fingerprint"]
    );

    // Refusals: no token, a forged one, a revoked scope; a caller named in the body.
    let r = c.get(server.url("/v1/operations")).send().await.unwrap();
    assert!(r.headers().contains_key(reqwest::header::WWW_AUTHENTICATE));
    problem(r, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let forged = format!("jtk_{}", "0".repeat(64));
    for bad in [forged.as_str(), "jtk_short", "", "Basic abc"] {
        let r = c
            .get(server.url("/v1/operations"))
            .header("authorization", format!("Bearer {bad}"))
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    }
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&bob)
        .json(&req)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    let mut impostor = req.clone();
    impostor["caller"] = json!("agent-bob");
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(&impostor)
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    assert!(p["detail"].as_str().unwrap().contains("caller"), "{p}");

    // Another caller cannot see, wait on, fetch or cancel it: not found, not "forbidden".
    for path in [
        format!("/v1/operations/{op_id}"),
        format!("/v1/operations/{op_id}/wait?timeout=1s"),
        format!("/v1/operations/{op_id}/result"),
    ] {
        let r = c
            .get(server.url(&path))
            .bearer_auth(&bob)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::NOT_FOUND, "not-found").await;
    }
    // Nor learn of it through its id: submitting under it (the same request or another),
    // superseding it or cancelling it answers "not found", with no fingerprint or state.
    let mallory = env
        .token("agent-mallory", &["submit", "read", "cancel"])
        .await;
    let mut supersede = req.clone();
    supersede.as_object_mut().unwrap().remove("id");
    supersede["supersedes"] = json!(op_id);
    for attempt in [&req, &other, &supersede] {
        let r = c
            .post(server.url("/v1/operations"))
            .bearer_auth(&mallory)
            .json(attempt)
            .send()
            .await
            .unwrap();
        let p = problem(r, StatusCode::NOT_FOUND, "not-found").await;
        assert!(p.get("extra").is_none_or(Value::is_null), "{p}");
        assert!(!p.to_string().contains("sha256:"), "{p}");
    }
    // A bad request under its id is refused as bad, as under a free id: the answer does not
    // depend on whether the id exists (it was "not found" for a taken id, bad input for a free one).
    let mut bad = req.clone();
    bad["create_deadline"] = json!("2000-01-01T00:00:00Z");
    let mut free = bad.clone();
    free["id"] = json!(jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string());
    for attempt in [&bad, &free] {
        let r = c
            .post(server.url("/v1/operations"))
            .bearer_auth(&mallory)
            .json(attempt)
            .send()
            .await
            .unwrap();
        let p = problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
        assert!(
            p["detail"].as_str().unwrap().contains("create_deadline"),
            "{p}"
        );
    }
    let cancel_as = |token: &str| {
        c.post(server.url(&format!("/v1/operations/{op_id}/cancel")))
            .bearer_auth(token)
            .json(&json!({"reason": "mine now"}))
            .send()
    };
    problem(
        cancel_as(&mallory).await.unwrap(),
        StatusCode::NOT_FOUND,
        "not-found",
    )
    .await;
    // An auditor sees every operation; that is not a licence to act on them.
    let snoop = env
        .token("auditor-jane", &["audit", "read", "cancel"])
        .await;
    let r = c
        .get(server.url(&format!("/v1/operations/{op_id}")))
        .bearer_auth(&snoop)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    problem(
        cancel_as(&snoop).await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert!(
        env.store
            .get(op_id.parse().unwrap())
            .await
            .unwrap()
            .cancel_requested_at
            .is_none()
    );

    let page: Value = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["operations"].as_array().unwrap().len(), 0);
    let r = c
        .get(server.url("/v1/operations?caller=agent-alice"))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;

    // Wait without polling: the long poll returns when it is settled.
    let started = std::time::Instant::now();
    let mut w: Value = Value::Null;
    for _ in 0..10 {
        w = c
            .get(server.url(&format!("/v1/operations/{op_id}/wait?timeout=30s")))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if w["operation"]["settled"] == true {
            break;
        }
        assert_eq!(w["changed"], true, "a wait returned without a change: {w}");
    }
    assert_eq!(w["operation"]["state"], "succeeded", "{w}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // `seen` with a history position: a state left and come back to is a change; garbage is not
    // a position.
    let r = c
        .get(server.url(&format!(
            "/v1/operations/{op_id}/wait?timeout=1s&seen=succeeded@nonsense"
        )))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    let w: Value = c
        .get(server.url(&format!(
            "/v1/operations/{op_id}/wait?timeout=5s&seen=succeeded@1"
        )))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(w["changed"], true, "{w}");

    // The validated result, with the chained digest in a header.
    let r = c
        .get(server.url(&format!("/v1/operations/{op_id}/result")))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let sha = r.headers()["jobtrail-result-sha256"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        r.headers()["repr-digest"]
            .to_str()
            .unwrap()
            .starts_with("sha-256=:")
    );
    // The content type is the provider's word: never sniffed, never rendered in place.
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.headers()["content-disposition"], "attachment");
    let bytes = r.bytes().await.unwrap();
    // The auditor sees the operation and its result's digest, not the bytes: they are the
    // caller's (and the operators'), as the auditor's database role never reads them either.
    let r = c
        .get(server.url(&format!("/v1/operations/{op_id}/result")))
        .bearer_auth(&snoop)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    let op = env.store.get(op_id.parse().unwrap()).await.unwrap();
    assert_eq!(op.result_sha256.as_deref(), Some(sha.as_str()));
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        sha
    );
    // The provider saw the agent's trace on every call of this operation.
    let ledger = env.sim.ledger();
    let job = &ledger.jobs[op.remote_job_id.as_deref().unwrap()];
    assert_eq!(job.trace_ids.iter().collect::<Vec<_>>(), vec![trace]);

    // A long poll on a settled operation answers at once; a bad timeout is a problem.
    let r = c
        .get(server.url(&format!("/v1/operations/{op_id}/wait?timeout=5m1s")))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;

    // Cancel: accepted, recorded with the token's caller, cancelled only by the provider.
    let r: Value = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(
            &json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "request": body(json!({"never_finish": true}))}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let long = r["operation"]["id"].as_str().unwrap().to_owned();
    env.wait_for(
        long.parse().unwrap(),
        "a job id",
        Duration::from_secs(20),
        |o| o.remote_job_id.is_some(),
    )
    .await;
    // Running is not failed: no result yet, said so (exit 9), not "ended other than succeeded".
    let long_result = async || {
        c.get(server.url(&format!("/v1/operations/{long}/result")))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap()
    };
    let p = problem(long_result().await, StatusCode::CONFLICT, "not-finished").await;
    assert_eq!(p["exit_code"], 9, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("wait"), "{p}");
    let r = c
        .post(server.url(&format!("/v1/operations/{long}/cancel")))
        .bearer_auth(&bob)
        .json(&json!({"reason": "not mine"}))
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    let r = c
        .post(server.url(&format!("/v1/operations/{long}/cancel")))
        .bearer_auth(&alice)
        .json(&json!({"reason": "over budget"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let w: Value = c
        .get(server.url(&format!(
            "/v1/operations/{long}/wait?timeout=30s&seen=cancel_requested"
        )))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(w["operation"]["state"], "cancel_requested", "{w}");
    let done = env
        .wait_state(
            long.parse().unwrap(),
            jobtrail_core::State::Cancelled,
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(done.cancel_requested_by.as_deref(), Some("agent-alice"));
    let p = problem(long_result().await, StatusCode::CONFLICT, "not-succeeded").await;
    assert_eq!(p["exit_code"], 1, "{p}");

    // Pages: newest first, with a cursor.
    let p1: Value = c
        .get(server.url("/v1/operations?limit=1"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(p1["operations"][0]["id"], long.as_str());
    let cursor = p1["next_cursor"].as_str().unwrap();
    let p2: Value = c
        .get(server.url(&format!("/v1/operations?limit=1&cursor={cursor}")))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(p2["operations"][0]["id"], op_id.as_str());
    assert!(p2["next_cursor"].is_null());
    // A page never loads the request bodies (up to 16 MiB each, 200 to a page): only one read does.
    let page = env
        .store
        .list_page(&Default::default(), 200)
        .await
        .unwrap()
        .operations;
    assert!(!page.is_empty() && page.iter().all(|o| o.request_body.is_null()));
    let one = env.store.get(page[0].id).await.unwrap();
    assert!(one.request_body.is_object());
    // Nor does a read, a wait, a cancel or a result through the doors: the rest is the same row.
    let shown = env.store.get_shown(page[0].id).await.unwrap();
    assert!(shown.request_body.is_null());
    assert_eq!(
        serde_json::to_value(jobtrail_service::OperationView::of(&shown)).unwrap(),
        serde_json::to_value(jobtrail_service::OperationView::of(&one)).unwrap()
    );
    for q in [
        "limit=0",
        "limit=201",
        "cursor=nonsense",
        "state=bogus",
        "mystery=1",
        // Text no provider or caller holds: refused before the database is asked (a NUL was
        // answered 503, as if it were down, and logged).
        "provider=%00",
        "provider=sim%00",
        // A time no operation can have (before PostgreSQL's 4713 BC, or after 9999) is the
        // caller's mistake, not the database being away (503, and a warning logged).
        "created_from=-5000-01-01T00:00:00Z",
        "created_before=%2B20000-01-01T00:00:00Z",
    ] {
        let r = c
            .get(server.url(&format!("/v1/operations?{q}")))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        let p = problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
        if q.starts_with("created_from") {
            let detail = p["detail"].as_str().unwrap();
            assert!(detail.contains("between the years 1 and 9999"), "{p}");
        }
    }

    // Careless bodies: not JSON, duplicate keys, too large, the wrong media type.
    for (ct, b) in [
        ("application/json", "{not json".to_owned()),
        (
            "application/json",
            r#"{"provider":"sim","provider":"sim-csv","target":"t","approved_by":"a","request":{}}"#
                .to_owned(),
        ),
        ("text/plain", req.to_string()),
    ] {
        let r = c
            .post(server.url("/v1/operations"))
            .bearer_auth(&alice)
            .header("content-type", ct)
            .body(b)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    }
    // An integer a double cannot hold: kept exactly, but fingerprinted as 2^53, so a resend that
    // changed it would have been answered with the first operation as the same one.
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .body(r#"{"provider":"sim","target":"t","approved_by":"a","request":{"account":9007199254740993}}"#)
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("send it as a string"),
        "{p}"
    );
    // 800 KB of tiny objects (within the provider's 1 MiB) would take over 60 MiB parsed:
    // refused before they are built.
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"provider":"sim","target":"t","approved_by":"a","request":{{"v":[{}0]}}}}"#,
            r#"{"a":0},"#.repeat(100_000)
        ))
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::PAYLOAD_TOO_LARGE, "too-large").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("MiB of memory a body may"),
        "{p}"
    );
    // A body over the limit is refused without being read: written by hand, since the server
    // answers and closes while a client would still be sending (a client may see a broken pipe).
    let addr = server.base.trim_start_matches("http://");
    let huge = format!(
        "POST /v1/operations HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {alice}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        jobtrail_api::MAX_REQUEST_BYTES + 1
    );
    assert_eq!(
        support::raw_status(addr, &huge, br#"{"provider":"sim","request":{"x":"aaaa"#).await,
        413
    );

    // Every documented route answers (with 401 here: none is the fallback), and an undocumented one
    // is the fallback's 404 problem.
    let doc = serde_json::to_value(jobtrail_api::openapi()).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            let url = server.url(&path.replace("{id}", &op_id).replace("{provider}", "nobody"));
            let r = c
                .request(method.to_uppercase().parse().unwrap(), url)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = r.status();
            let p: Value = r.json().await.unwrap();
            assert!(
                !p["detail"].as_str().unwrap_or("").contains("no such route"),
                "{method} {path} is documented but not served"
            );
            assert!(status.is_client_error(), "{method} {path}: {status}");
        }
    }
    let r = c.get(server.url("/v1/nothing")).send().await.unwrap();
    let p = problem(r, StatusCode::NOT_FOUND, "not-found").await;
    assert!(p["detail"].as_str().unwrap().contains("no such route"));
    // A route asked with a method it does not take, and an id that is not UTF-8 once decoded:
    // problem documents too, never a bare status or plain text.
    for (path, bounded) in [("/v1/operations", true), ("/v1/operations/x/wait", false)] {
        let r = c
            .delete(server.url(path))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        let allow = r.headers()[reqwest::header::ALLOW]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(allow.contains("GET"), "{path} (bounded {bounded}): {allow}");
        problem(r, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
    }
    let r = c
        .get(server.url("/v1/operations/%FF%FE"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    let r = c
        .post(server.url("/v1/webhooks/%FF%FE"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    let served = c.get(server.url("/openapi.json")).send().await.unwrap();
    assert_eq!(served.headers()["content-type"], "application/json");
    let served: Value = served.json().await.unwrap();
    assert_eq!(served, doc);

    // Nothing secret in the server's log.
    let log = server.log_text();
    for secret in [alice.as_str(), bob.as_str(), support::TOKEN] {
        assert!(!log.contains(secret), "a secret in the server log");
    }
    assert!(server.stop().is_some_and(|s| s.success()), "graceful stop");
    env.stop_workers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_works_through_the_api_with_a_token_and_nothing_else() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api");
    let token = env
        .token("agent-remote", &["submit", "read", "cancel"])
        .await;
    let empty = env.dir.join("no-contracts-here");
    let jobtrail = |args: &[&str], token: &str, stdin: Option<&str>| {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env("JOBTRAIL_PROVIDERS", &empty)
            .env("JOBTRAIL_API", &server.base)
            .env("JOBTRAIL_TOKEN", token)
            .env("JOBTRAIL_CALLER", "someone-else")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    };
    // A database named on the command line beside an API is two ways in: refused, not ignored.
    let both = jobtrail(&["--database-url", &env.url, "list"], &token, None);
    assert_eq!(both.status.code(), Some(2));
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(
        err.contains("--database-url") && err.contains("JOBTRAIL_API"),
        "{err}"
    );
    let request = body(json!({"duration_ms": 200})).to_string();
    let out = jobtrail(
        &[
            "submit",
            "--provider",
            "sim",
            "--target",
            "reports",
            "--approved-by",
            "alice",
            "--traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ],
        &token,
        Some(&request),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let op = env.store.get(id.parse().unwrap()).await.unwrap();
    assert_eq!(
        op.caller, "agent-remote",
        "the token names the caller, not JOBTRAIL_CALLER"
    );
    assert_eq!(op.trace_id.to_string(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(
        op.parent_span.map(|s| s.to_string()).as_deref(),
        Some("b7ad6b7169203331"),
        "the CLI passes the caller's span on, not a span of its own no one records"
    );

    let out = jobtrail(&["wait", &id, "--timeout", "60s"], &token, None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = jobtrail(&["result", &id], &token, None);
    assert!(out.status.success());
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.stdout));
    assert_eq!(op_sha(&env, &id).await, sha);
    let out = jobtrail(&["show", &id], &token, None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("succeeded"));
    let seen = env.store.get(id.parse().unwrap()).await.unwrap();
    let seen =
        jobtrail_service::operator::seen_token(seen.state, seen.history_seq, &seen.history_head);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("view: {seen}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = jobtrail(&["list", "--json"], &token, None);
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["operations"][0]["id"], id.as_str());

    // Refusals keep the CLI's exit codes: a bad token is 5, an unknown operation 3, bad input 2.
    let out = jobtrail(&["show", &id], &format!("jtk_{}", "f".repeat(64)), None);
    assert_eq!(out.status.code(), Some(5));
    let other = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    assert_eq!(
        jobtrail(&["show", &other], &token, None).status.code(),
        Some(3)
    );
    // A wrong API URL (with /v1 on it, or another server's) is no missing operation: exit 5,
    // naming the URL's fault, never 3.
    let with_v1 = format!("{}/v1", server.base.trim_end_matches('/'));
    for base in [with_v1.as_str(), env.sim.base_url().as_str()] {
        for args in [&["show", &id][..], &["list"][..]] {
            let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
                .args(args)
                .env_remove("DATABASE_URL")
                .env("JOBTRAIL_API", base)
                .env("JOBTRAIL_TOKEN", &token)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(5), "{base} {args:?}: {said}");
            if base == with_v1 {
                assert!(said.contains("without /v1"), "{said}");
            }
        }
    }
    let out = jobtrail(
        &[
            "submit",
            "--provider",
            "sim",
            "--target",
            "t",
            "--approved-by",
            "a",
        ],
        &token,
        Some("[1,2"),
    );
    assert_eq!(out.status.code(), Some(2));
    let out = jobtrail(&["show", &id], "", None);
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JOBTRAIL_TOKEN"));
    // Nothing secret on any output.
    let out = jobtrail(&["show", &id, "--json"], &token, None);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&token));
    // `show --json` reads one way whichever door it went through: the API's view (with the whole
    // timeline) both ways; the database door adds the record, the chain's links and the calls.
    let remote: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = support::run_bin(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        &env.url,
        &env.providers,
        &["show", &id, "--json"],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local: Value = serde_json::from_slice(&out.stdout).unwrap();
    let remote = remote.as_object().unwrap();
    assert!(remote.contains_key("timeline") && remote["state"] == "succeeded");
    for (k, v) in remote {
        assert_eq!(&local[k], v, "{k}: the two doors disagree");
    }
    assert_eq!(local["operation"]["state"], "succeeded");
    assert_eq!(
        local["history"].as_array().unwrap().len(),
        remote["timeline"].as_array().unwrap().len()
    );
    assert!(local["calls"].as_array().is_some_and(|c| !c.is_empty()));
    assert!(
        !remote.contains_key("calls"),
        "provider calls stay with operators"
    );
    env.stop_workers().await;
}

async fn op_sha(env: &Env, id: &str) -> String {
    env.store
        .get(id.parse().unwrap())
        .await
        .unwrap()
        .result_sha256
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_decide_through_the_api_and_approvals_come_from_a_person() {
    let mut env = Env::with_edited_contracts(&[(
        "sim-legacy.toml",
        "description = ",
        "requires_approval = true\ndescription = ",
    )])
    .await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api");
    let c = support::http();
    let agent = env.token("agent-7", &["submit", "read", "cancel"]).await;
    let alice = env.token("alice", &["submit", "read", "decide"]).await;
    let auditor = env.token("jane", &["audit"]).await;

    // A provider that requires approval: an agent's token cannot submit; a person's can, as the
    // approver.
    let req = json!({"provider": "sim-legacy", "target": "reports", "approved_by": "alice",
                     "request": body(json!({"duration_ms": 100}))});
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(&req)
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(p["detail"].as_str().unwrap().contains("approval"), "{p}");
    let mut claimed = req.clone();
    claimed["approved_by"] = json!("the-ceo");
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(&claimed)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let providers: Value = c
        .get(server.url("/v1/providers"))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let legacy = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sim-legacy")
        .unwrap();
    assert_eq!(legacy["requires_approval"], true);
    assert_eq!(legacy["at_most_once"], false);

    // An operation held for a person: the queue and a decision need the decide scope; a stale view
    // is refused; the actor recorded is the token's caller.
    let held: Value = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(&json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "request": body(json!({"never_finish": true})), "create_deadline": "+2s", "result_deadline": "+3s"}))
        .send().await.unwrap().json().await.unwrap();
    let held_id = held["operation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{held}"))
        .to_owned();
    let op = env
        .wait_state(
            held_id.parse().unwrap(),
            jobtrail_core::State::ResultTimedOut,
            Duration::from_secs(30),
        )
        .await;
    let r = c
        .get(server.url("/v1/escalations"))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    let r = c
        .get(server.url("/v1/escalations?provider=%00"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
    let q: Value = c
        .get(server.url("/v1/escalations"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(q["more"], false, "{q}");
    // One caller's at a time: the held operation's caller's list has it, another's does not.
    for (caller, has) in [(op.caller.as_str(), true), ("someone-else", false)] {
        let theirs: Value = c
            .get(server.url("/v1/escalations"))
            .query(&[("caller", caller)])
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let listed = theirs["escalations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["operation"]["id"] == held_id.as_str());
        assert_eq!(listed, has, "{caller}: {theirs}");
    }
    let entry = q["escalations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["operation"]["id"] == held_id.as_str())
        .unwrap();
    assert!(
        entry["decisions"]
            .as_array()
            .unwrap()
            .contains(&json!("abandon"))
    );
    let seen = format!("result_timed_out@{}", op.history_seq);
    let decide = |who: &str, seen: &str| {
        c.post(server.url(&format!("/v1/operations/{held_id}/decisions")))
            .bearer_auth(who)
            .json(&json!({"seen": seen, "reason": "customer withdrew", "decision": {"kind": "abandon"}}))
            .send()
    };
    problem(
        decide(&agent, &seen).await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let stale = format!("result_timed_out@{}", op.history_seq - 1);
    let p = problem(
        decide(&alice, &stale).await.unwrap(),
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    // The view to decide on, pinned to this operation's head as `show` prints it.
    assert_eq!(
        p["extra"]["current"],
        jobtrail_service::operator::seen_token(op.state, op.history_seq, &op.history_head)
    );
    assert!(
        p["extra"]["current"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{seen}:"))
    );
    // A decision with a key of another kind's (an adopt miswritten as a decision that takes no
    // job id) is refused, not decided without it.
    for kind in ["abandon", "declare_not_created"] {
        let r = c
            .post(server.url(&format!("/v1/operations/{held_id}/decisions")))
            .bearer_auth(&alice)
            .json(&json!({"seen": seen, "reason": "checked", "decision": {"kind": kind, "job_id": "J-1"}}))
            .send()
            .await
            .unwrap();
        let p = problem(r, StatusCode::BAD_REQUEST, "bad-input").await;
        assert!(
            p["detail"].as_str().unwrap().contains("job_id"),
            "{kind}: {p}"
        );
    }
    assert_eq!(
        env.store
            .get(held_id.parse().unwrap())
            .await
            .unwrap()
            .history_seq,
        op.history_seq,
        "nothing written"
    );
    // A cancel of another caller's operation held for a person is a decision on a view too (the
    // provider's cancel cannot be taken back, and another person may have resumed the job to keep
    // it): without `seen`, with a stale one or a malformed one it is refused, and nothing is
    // written; on the view seen it is recorded.
    let carol = env.token("carol", &["read", "decide", "cancel"]).await;
    let cancel = |id: &str, body: Value| {
        c.post(server.url(&format!("/v1/operations/{id}/cancel")))
            .bearer_auth(&carol)
            .json(&body)
            .send()
    };
    let p = problem(
        cancel(&held_id, json!({"reason": "no longer needed"}))
            .await
            .unwrap(),
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("seen"), "{p}");
    problem(
        cancel(&held_id, json!({"reason": "x", "seen": stale}))
            .await
            .unwrap(),
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    problem(
        cancel(&held_id, json!({"reason": "x", "seen": "held@@1"}))
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    let still = env.store.get(held_id.parse().unwrap()).await.unwrap();
    assert_eq!(
        (still.state, still.history_seq),
        (jobtrail_core::State::ResultTimedOut, op.history_seq),
        "nothing written"
    );
    let other: Value = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(&json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                      "request": body(json!({"never_finish": true})), "create_deadline": "+2s", "result_deadline": "+3s"}))
        .send().await.unwrap().json().await.unwrap();
    let other_id = other["operation"]["id"].as_str().unwrap().to_owned();
    let other_op = env
        .wait_state(
            other_id.parse().unwrap(),
            jobtrail_core::State::ResultTimedOut,
            Duration::from_secs(30),
        )
        .await;
    let r = cancel(
        &other_id,
        json!({"reason": "customer withdrew", "seen": format!("result_timed_out@{}", other_op.history_seq)}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let d: Value = r.json().await.unwrap();
    assert_eq!(d["operation"]["state"], "cancel_requested", "{d}");
    assert_eq!(d["operation"]["cancel_requested_by"], "carol", "{d}");
    let r = decide(&alice, &seen).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let d: Value = r.json().await.unwrap();
    assert_eq!(d["operation"]["state"], "abandoned");
    let h = env.store.history(held_id.parse().unwrap()).await.unwrap();
    assert_eq!(h.last().unwrap().actor, "alice");
    let r = c
        .post(server.url(&format!("/v1/operations/{held_id}/decisions")))
        .bearer_auth(&alice)
        .json(&json!({"seen": "abandoned", "reason": "x", "decision": {"kind": "launch_missiles"}}))
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "bad-input").await;

    // The auditor verifies; nobody else may.
    let r = c
        .get(server.url("/v1/audit/verify"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;
    let v: Value = c
        .get(server.url("/v1/audit/verify"))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["breaks"].as_array().unwrap().len(), 0, "{v}");
    assert!(v["operations"].as_u64().unwrap() >= 2);
    // Against an anchor: an operation deleted with its whole history (a superuser, triggers off)
    // leaves no chain to break, and only the anchor can tell. One operation's verify names the
    // deletion, as the admin tool does, not "not found"; so does every chain's against the digest
    // the auditor kept. A digest the database lacks is the finding "tampered"; a malformed one is
    // bad input.
    let anchor = env.store.anchor("auditor").await.unwrap();
    let gone = other_id.parse::<jobtrail_core::OperationId>().unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET session_replication_role = replica; DELETE FROM operation_history WHERE operation_id = '{0}'; DELETE FROM provider_calls WHERE operation_id = '{0}'; DELETE FROM operation_schedule WHERE operation_id = '{0}'; DELETE FROM operations WHERE id = '{0}'",
        gone.as_uuid()
    )))
    .execute(&mut sqlx::PgConnection::connect(&env.url).await.unwrap())
    .await
    .unwrap();
    let verify = |query: String| {
        let c = c.clone();
        let url = server.url(&format!("/v1/audit/verify{query}"));
        let auditor = auditor.clone();
        async move { c.get(url).bearer_auth(&auditor).send().await.unwrap() }
    };
    for query in [
        format!("?operation={other_id}"),
        format!("?operation={other_id}&expect_anchor={}", anchor.digest),
        format!("?expect_anchor={}", anchor.digest.to_ascii_uppercase()),
    ] {
        let r = verify(query.clone()).await;
        assert_eq!(r.status(), StatusCode::OK, "{query}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["breaks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["operation_id"] == other_id.as_str()
                    && b["problem"].as_str().unwrap().contains("deleted")),
            "{query}: {v}"
        );
    }
    problem(
        verify(format!("?expect_anchor={}", "0".repeat(64))).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "tampered",
    )
    .await;
    problem(
        verify("?expect_anchor=latest".to_owned()).await,
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    // One verify of everything at a time: a second is refused at once while the first reads (held
    // here behind a lock on the history), instead of taking more database connections.
    let mut lock = sqlx::PgConnection::connect(&env.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE operation_history IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await
        .unwrap();
    let first = tokio::spawn(
        c.get(server.url("/v1/audit/verify"))
            .bearer_auth(&auditor)
            .send(),
    );
    let mut blocked = false;
    for _ in 0..200 {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'operation_history' AND NOT l.granted",
        )
        .fetch_one(&mut lock)
        .await
        .unwrap();
        if n > 0 {
            blocked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(blocked, "the first verify reached the history within 10 s");
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        c.get(server.url("/v1/audit/verify"))
            .bearer_auth(&auditor)
            .send(),
    )
    .await
    .expect("a second verify is answered at once, not queued behind the first")
    .unwrap();
    assert_eq!(second.headers()[reqwest::header::RETRY_AFTER], "10");
    let p = problem(second, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    assert!(
        p["detail"].as_str().unwrap().contains("already running"),
        "{p}"
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut lock).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the first verify ends once the lock is gone")
        .unwrap()
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let again = c
        .get(server.url("/v1/audit/verify"))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK, "the slot is given back");
    // An auditor reads every operation, but cannot submit.
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&auditor)
        .json(&req)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::FORBIDDEN, "forbidden").await;

    // A revoked token stops at once.
    let tokens = env.store.tokens().await.unwrap();
    let agent_token = tokens.iter().find(|t| t.caller == "agent-7").unwrap();
    env.store
        .revoke_token(agent_token.id, "alice")
        .await
        .unwrap();
    let r = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    env.stop_workers().await;
}

/// `jobtrail-admin tokens`: a token is printed once and works at once; the list never shows a token;
/// careless input writes nothing; a revoked token stops on the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_issue_list_and_revoke_tokens_with_jobtrail_admin() {
    let env = Env::new().await;
    let server = env.serve("api");
    let c = support::http();
    let admin = support::admin_bin();
    let run = |args: &[&str]| support::run_bin(&admin, &env.url, &env.providers, args, None);

    // Careless input: nothing written.
    let long_note = "n".repeat(501);
    // A token create that is fine but for `extra`.
    fn valid_token<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "tokens",
            "create",
            "--caller",
            "agent-7",
            "--scopes",
            "read",
            "--created-by",
            "alice",
        ];
        args.extend_from_slice(extra);
        args
    }
    for (args, says) in [
        (
            vec![
                "tokens",
                "create",
                "--caller",
                "agent-7",
                "--scopes",
                "submit,root",
                "--created-by",
                "alice",
            ],
            "--scopes",
        ),
        (
            vec![
                "tokens",
                "create",
                "--caller",
                "agent-7",
                "--scopes",
                "",
                "--created-by",
                "alice",
            ],
            "--scopes",
        ),
        (
            vec![
                "tokens",
                "create",
                "--caller",
                "",
                "--scopes",
                "read",
                "--created-by",
                "alice",
            ],
            "--caller",
        ),
        (
            vec![
                "tokens",
                "create",
                "--caller",
                "a\u{1b}[2J",
                "--scopes",
                "read",
                "--created-by",
                "alice",
            ],
            "--caller",
        ),
        (
            valid_token(&["--expires", "2020-01-01T00:00:00Z"]),
            "--expires",
        ),
        // A note past what the database keeps was refused by its constraint, as exit 5.
        (valid_token(&["--note", &long_note]), "--note"),
        // `+30` meant as days was a token that died in 30 seconds, shown once: a unit is needed.
        (valid_token(&["--expires", "+30"]), "no unit"),
        // `+30ms` meant `+30m`: a token dead before anyone could use it.
        (valid_token(&["--expires", "+30ms"]), "less than a minute"),
        (
            vec!["tokens", "revoke", "not-a-uuid", "--actor", "alice"],
            "invalid",
        ),
        (
            vec![
                "tokens",
                "create",
                "--caller",
                "agent-7",
                "--scopes",
                "read",
                "--created-by",
                "ali\u{7}ce",
            ],
            "--created-by",
        ),
        (
            vec![
                "tokens",
                "revoke",
                "01234567-89ab-cdef-0123-456789abcdef",
                "--actor",
                "\u{1b}[2J",
            ],
            "--actor",
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(env.store.tokens().await.unwrap().is_empty());

    // A token that cannot be written out (stdout a full device) would be live with nobody holding
    // it: it is revoked, and the command fails.
    let full = std::process::Command::new(&admin)
        .args([
            "tokens",
            "create",
            "--caller",
            "agent-lost",
            "--scopes",
            "read",
            "--created-by",
            "alice",
        ])
        .env("DATABASE_URL", &env.url)
        .env("JOBTRAIL_PROVIDERS", &env.providers)
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_eq!(
        full.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&full.stderr)
    );
    let lost = env.store.tokens().await.unwrap();
    assert_eq!(lost.len(), 1);
    assert!(lost[0].revoked_at.is_some(), "{lost:?}");

    // Created: printed once on stdout, usable at once.
    let out = run(&[
        "tokens",
        "create",
        "--caller",
        "agent-7",
        "--scopes",
        "submit,read",
        "--created-by",
        "alice",
        "--note",
        "CI agent",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(jobtrail_service::auth::token_shaped(&token), "{token}");
    let r = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Listed without the token itself; revoked by id; refused from then on.
    let out = run(&["tokens", "list", "--json"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !listed.contains(&token) && !listed.contains(&token[4..]),
        "a token in the list"
    );
    let list: Value = serde_json::from_str(&listed).unwrap();
    let ours = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["caller"] == "agent-7")
        .unwrap();
    let id = ours["id"].as_str().unwrap().to_owned();
    let out = run(&["tokens", "revoke", &id, "--actor", "alice"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    let unknown = uuid::Uuid::now_v7().to_string();
    assert_eq!(
        run(&["tokens", "revoke", &unknown, "--actor", "alice"])
            .status
            .code(),
        Some(3)
    );

    // A leaked token whose id nobody knows: revoked by the token itself, read from stdin; the
    // caller's other token stays live.
    let kept = env.token("agent-8", &["read"]).await;
    let leaked = env.token("agent-8", &["read"]).await;
    let list = |token: &str| {
        c.get(server.url("/v1/operations"))
            .bearer_auth(token)
            .send()
    };
    let revoke_stdin = |input: &str| {
        support::run_bin(
            &admin,
            &env.url,
            &env.providers,
            &["tokens", "revoke", "--token-stdin", "--actor", "alice"],
            Some(input),
        )
    };
    let out = revoke_stdin(&format!("{leaked}\n"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&leaked));
    problem(
        list(&leaked).await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    )
    .await;
    assert_eq!(list(&kept).await.unwrap().status(), StatusCode::OK);
    // Something else pasted there is refused, and not repeated back.
    let out = revoke_stdin("hunter2-my-password\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    let made_up = format!("jtk_{}", "cd".repeat(32));
    assert_eq!(revoke_stdin(&made_up).status.code(), Some(3));
    // The list says who made each and why, beside its status.
    let out = run(&["tokens", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("created "));
}

/// An agent fanning out submits many operations in one request, all or none: every item is durable
/// and runs; a retried batch returns the same operations; one bad item (named by its index), an id of
/// another caller's, an empty or oversized batch or a token without the submit scope writes nothing.
/// The CLI sends JSON lines the same way, and refuses a bad line before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_submits_all_or_nothing() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api");
    let c = support::http();
    let alice = env.token("agent-alice", &["submit", "read"]).await;
    let reader = env.token("agent-reader", &["read"]).await;
    let mallory = env.token("agent-mallory", &["submit", "read"]).await;
    let new_id = || jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    let item = |id: &str, provider: &str| {
        json!({"id": id, "provider": provider, "target": "reports", "approved_by": "alice",
               "request": body(json!({"duration_ms": 100}))})
    };
    let ids: Vec<String> = (0..3).map(|_| new_id()).collect();
    let batch = json!({"operations": ids.iter().map(|i| item(i, "sim")).collect::<Vec<_>>()});
    let post = |token: &str, b: &Value| {
        c.post(server.url("/v1/operations:batch"))
            .bearer_auth(token)
            .json(b)
            .send()
    };
    let r = post(&alice, &batch).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let s: Value = r.json().await.unwrap();
    let got: Vec<&str> = s["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        s["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["created"] == true && o["operation"]["caller"] == "agent-alice")
    );
    // Retried: the same operations, nothing new.
    let s: Value = post(&alice, &batch).await.unwrap().json().await.unwrap();
    assert!(
        s["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["created"] == false),
        "{s}"
    );
    for id in &ids {
        let op = env
            .wait_settled(id.parse().unwrap(), Duration::from_secs(30))
            .await;
        assert_eq!(op.state, jobtrail_core::State::Succeeded);
    }

    let before = env.store.totals().await.unwrap().0;
    let fresh: Vec<String> = (0..3).map(|_| new_id()).collect();
    // Item 2 names a provider nobody has: the batch is refused, its first two items not written.
    let bad = json!({"operations": [item(&fresh[0], "sim"), item(&fresh[1], "sim"), item(&fresh[2], "nope")]});
    let p = problem(
        post(&alice, &bad).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().starts_with("item 2:"), "{p}");
    assert_eq!(p["extra"]["item"], 2, "{p}");
    // Item 1 reuses an id of alice's: "not found" for mallory, nothing of the batch written.
    let foreign = json!({"operations": [item(&fresh[0], "sim"), item(&ids[0], "sim")]});
    let p = problem(
        post(&mallory, &foreign).await.unwrap(),
        StatusCode::NOT_FOUND,
        "not-found",
    )
    .await;
    assert_eq!(p["extra"]["item"], 1, "{p}");
    // Item 1 reuses an id with another request: a conflict.
    let mut changed = item(&ids[1], "sim");
    changed["target"] = json!("other");
    let conflict = json!({"operations": [item(&fresh[0], "sim"), changed]});
    problem(
        post(&alice, &conflict).await.unwrap(),
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    problem(
        post(&alice, &json!({"operations": []})).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    let many = json!({"operations": (0..1001).map(|_| json!({"provider": "sim", "target": "t", "approved_by": "a", "request": {}})).collect::<Vec<_>>()});
    problem(
        post(&alice, &many).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    problem(
        post(&reader, &batch).await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    problem(
        post(
            &alice,
            &json!({"operations": [item(&fresh[0], "sim")], "caller": "root"}),
        )
        .await
        .unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    assert_eq!(
        env.store.totals().await.unwrap().0,
        before,
        "a refused batch wrote something"
    );

    // The CLI, through the database: JSON lines; a bad line refuses the whole input up front.
    let run = |input: String| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(["submit-batch", "--caller", "agent-cli"])
            .env("DATABASE_URL", &env.url)
            .env("JOBTRAIL_PROVIDERS", &env.providers)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let lines = format!("{}\n\n{}\n", item(&fresh[0], "sim"), item(&fresh[1], "sim"));
    let out = run(format!("{lines}{{\"provider\": \"sim\",\n"));
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 4"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(env.store.totals().await.unwrap().0, before);
    // A submission the service refuses is named by its line (here the third, after a blank one),
    // not by its place among the submissions counted from 0.
    let out = run(format!(
        "{}\n\n{}\n",
        item(&fresh[0], "sim"),
        item(&fresh[1], "no-such-provider")
    ));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("line 3: ") && !said.contains("item 1"),
        "{said}"
    );
    // More submissions than a batch holds: refused at the line past the limit, nothing sent.
    let many: String = (0..=jobtrail_service::MAX_BATCH)
        .map(|_| format!("{}\n", item(&fresh[0], "sim")))
        .collect();
    let out = run(many);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("line 1001: a batch holds at most 1000"),
        "{said}"
    );
    assert_eq!(env.store.totals().await.unwrap().0, before);
    let out = run(lines);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(printed, fresh[..2].to_vec());
    assert_eq!(
        env.store
            .get(fresh[0].parse().unwrap())
            .await
            .unwrap()
            .caller,
        "agent-cli"
    );
}

/// Text the record keeps for ever is checked at the door: a target, approver or approval reference
/// that is too long or holds a control, invisible or reordering character is refused as bad input with nothing written, and
/// so is a cancel reason. A cancel asked again while the first is still only noted (the create is
/// in flight) writes nothing: no new history link, and the first request stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn careless_text_is_refused_and_a_repeated_cancel_writes_nothing() {
    let mut env = Env::new().await;
    let server = env.serve("api");
    let c = support::http();
    let alice = env
        .token("agent-alice", &["submit", "read", "cancel"])
        .await;
    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7());
    let good = json!({
        "id": id.to_string(), "provider": "sim", "target": "reports", "approved_by": "alice",
        "request": body(json!({"create": ["slow_accept"], "create_delay_ms": 60000})),
    });
    let submit = |req: Value| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(&alice)
            .json(&req)
            .send()
    };
    for (field, value) in [
        ("target", "t".repeat(1025)),
        ("approved_by", "alice\nbob".to_owned()),
        ("approval_ref", "ref\u{7f}".to_owned()),
        // Reads as "alice" and is not: invisible and reordering characters in a name.
        ("approved_by", "alice\u{200b}".to_owned()),
        ("target", "reports\u{202e}fdp.exe".to_owned()),
        // A leap second: PostgreSQL would keep the next minute's :00, a time not written.
        ("create_deadline", "2031-01-01T00:00:60Z".to_owned()),
    ] {
        let mut req = good.clone();
        req[field] = json!(value);
        let p = problem(
            submit(req).await.unwrap(),
            StatusCode::BAD_REQUEST,
            "bad-input",
        )
        .await;
        assert!(p["detail"].as_str().unwrap().contains(field), "{p}");
    }
    // A caller's megabytes in a field are refused without being echoed back (the problem
    // document was several times their size, built whole in the server).
    let huge = "1".repeat(2 << 20);
    for (field, value) in [
        ("cancel_window", huge.clone()),
        ("cancel_window", format!("{huge}x")),
        // Leading zeros parse (as 0 ms): refused as out of range, and not echoed either.
        ("cancel_window", format!("{}ms", "0".repeat(2 << 20))),
        ("create_deadline", format!("+{huge}")),
        ("create_deadline", huge.clone()),
        ("provider", huge.clone()),
    ] {
        let mut req = good.clone();
        req[field] = json!(value);
        let r = submit(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{field}");
        let said = r.bytes().await.unwrap();
        assert!(said.len() < 4096, "{field}: {} bytes answered", said.len());
    }
    // Nor in a key the body may not have, or a value of the wrong type (serde repeats both whole).
    let mut unknown = good.clone();
    unknown[huge.as_str()] = json!(1);
    let batch = c
        .post(server.url("/v1/operations:batch"))
        .bearer_auth(&alice)
        .json(&json!({"operations": huge}))
        .send();
    for r in [submit(unknown).await.unwrap(), batch.await.unwrap()] {
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let said = r.bytes().await.unwrap();
        assert!(said.len() < 4096, "{} bytes answered", said.len());
    }
    assert!(env.store.get(id).await.is_err(), "nothing written");
    assert_eq!(submit(good).await.unwrap().status(), StatusCode::CREATED);

    // The create leaves and hangs: a cancel can only be noted until the job id is known.
    env.start_worker("w1", Duration::from_secs(30));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while env.sim.ledger().create_requests.values().sum::<u32>() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the create never left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = |reason: String| {
        c.post(server.url(&format!("/v1/operations/{id}/cancel")))
            .bearer_auth(&alice)
            .json(&json!({"reason": reason}))
            .send()
    };
    let p = problem(
        cancel("r".repeat(4097)).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad-input",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("reason"), "{p}");
    let r = cancel("over budget".into()).await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let first = env.store.get(id).await.unwrap();
    assert_eq!(first.state, jobtrail_core::State::CreatePending);
    assert_eq!(first.cancel_reason.as_deref(), Some("over budget"));
    for _ in 0..3 {
        let r = cancel("again, louder".into()).await.unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let v: Value = r.json().await.unwrap();
        // Said as it is: the first request stands, this one's reason was not recorded.
        let note = v["note"].as_str().unwrap();
        assert!(
            note.contains("already requested by agent-alice") && note.contains("nothing new"),
            "{v}"
        );
    }
    let after = env.store.get(id).await.unwrap();
    assert_eq!(after.history_seq, first.history_seq, "nothing written");
    assert_eq!(after.cancel_reason.as_deref(), Some("over budget"));
    env.stop_workers().await;
}

/// An operation observed for days has tens of thousands of history links: the API answers them a
/// page (200) at a time, newest first, and says where the earlier ones start; the CLI through the
/// API pages back to the first link. A careless page number is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_is_read_a_page_at_a_time() {
    use jobtrail_core::{Event, Step};
    let env = Env::new().await;
    let op = env
        .submit("sim", json!({}), |s| s.caller = "agent-pages".into())
        .await;
    // A job accepted, then 249 progress observations (each a link, as a long job's polls make).
    let due_now = |step: Step| Step {
        next_in: Some((Duration::ZERO, "test")),
        ..step
    };
    let accepted = jobtrail_store::testing::accepted_create("http://127.0.0.1:1/v1/jobs");
    let mut step = Some(
        Step::event(Event::CreateAccepted {
            remote_job_id: "job_pages".into(),
            remote_state: None,
        })
        .with_call(accepted),
    );
    for _ in 0..250 {
        let claimed = env
            .store
            .claim_due("w", 1, Duration::from_secs(60))
            .await
            .unwrap();
        let lease = claimed.into_iter().next().expect("due again at once").lease;
        let next = step.take().unwrap_or_else(|| {
            Step::event(Event::RemoteProgress {
                remote_state: "running".into(),
                known: true,
            })
        });
        env.store.apply(&lease, due_now(next)).await.unwrap();
    }
    let links = env.store.history(op.id).await.unwrap().len() as i64;
    assert_eq!(links, 251);

    let server = env.serve("api");
    let c = support::http();
    let token = env.token("agent-pages", &["read"]).await;
    let get = |query: String| {
        c.get(server.url(&format!("/v1/operations/{}{query}", op.id)))
            .bearer_auth(&token)
            .send()
    };
    let seqs = |v: &Value| -> Vec<i64> {
        v["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["seq"].as_i64().unwrap())
            .collect()
    };
    let newest: Value = get("?timeline=true".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seqs(&newest), (52..=251).collect::<Vec<_>>());
    assert_eq!(newest["timeline_earlier"], 52);
    let earlier: Value = get("?timeline_before=52".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seqs(&earlier), (1..=51).collect::<Vec<_>>());
    assert!(earlier.get("timeline_earlier").is_none(), "{earlier}");
    let plain: Value = get(String::new()).await.unwrap().json().await.unwrap();
    assert!(plain.get("timeline").is_none() && plain.get("timeline_earlier").is_none());
    for bad in [
        "?timeline_before=0",
        "?timeline_before=-3",
        "?timeline_before=ten",
    ] {
        problem(
            get(bad.into()).await.unwrap(),
            StatusCode::BAD_REQUEST,
            "bad-input",
        )
        .await;
    }

    // The CLI through the API shows every link, oldest first.
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .args(["show", &op.id.to_string()])
        .env_remove("DATABASE_URL")
        .env("JOBTRAIL_PROVIDERS", env.dir.join("no-contracts-here"))
        .env("JOBTRAIL_API", &server.base)
        .env("JOBTRAIL_TOKEN", &token)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with('#'))
        .collect();
    assert_eq!(shown.len(), 251, "{text}");
    assert!(shown[0].trim_start().starts_with("#1 "), "{}", shown[0]);
    assert!(!text.contains("earlier links not shown"), "{text}");
}

/// Rates at the door. Past its address's rate a request is refused before its token is looked up
/// (a made-up token gets 429, not 401: no database read); past its token's rate one agent is
/// refused while another is still served; a 429 says when to come back and nothing is written.
/// A careless rate is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_door_limits_rates_per_address_and_per_token() {
    let env = Env::new().await;
    let c = support::http();
    let made_up = format!("jtk_{}", "ab".repeat(32));

    let server = env.serve_with(
        "per-address",
        &[
            ("JOBTRAIL_RATE_PER_ADDRESS", "5/s,5"),
            ("JOBTRAIL_RATE_PER_TOKEN", "off"),
        ],
    );
    let mut answers = Vec::new();
    for n in 0..20 {
        // X-Forwarded-For from a client that is no trusted proxy changes nothing.
        let r = c
            .get(server.url("/v1/operations"))
            .bearer_auth(&made_up)
            .header("x-forwarded-for", format!("198.51.100.{n}"))
            .send()
            .await
            .unwrap();
        answers.push(r.status());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let wait: u64 = r.headers()[reqwest::header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=2).contains(&wait), "{wait}");
            let p = problem(r, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
            assert_eq!(p["exit_code"], 5);
            assert_eq!(p["extra"]["retry_after_secs"], wait);
        }
    }
    assert_eq!(answers[0], StatusCode::UNAUTHORIZED, "{answers:?}");
    assert!(
        answers.contains(&StatusCode::TOO_MANY_REQUESTS),
        "20 requests at once from one address, 5/s allowed: {answers:?}"
    );

    // Behind a trusted proxy each client is counted by the address the proxy names.
    let server = env.serve_with(
        "behind-a-proxy",
        &[
            ("JOBTRAIL_RATE_PER_ADDRESS", "1/s,3"),
            ("JOBTRAIL_RATE_PER_TOKEN", "off"),
            ("JOBTRAIL_TRUSTED_PROXIES", "127.0.0.0/8"),
        ],
    );
    let from = |client: &'static str| {
        c.get(server.url("/v1/operations"))
            .bearer_auth(&made_up)
            .header("x-forwarded-for", format!("6.6.6.6, {client}"))
            .send()
    };
    let mut limited = 0;
    for _ in 0..10 {
        if from("203.0.113.7").await.unwrap().status() == StatusCode::TOO_MANY_REQUESTS {
            limited += 1;
        }
    }
    assert!(limited >= 6, "a burst of 3 at 1/s: {limited} of 10 refused");
    assert_eq!(
        from("203.0.113.8").await.unwrap().status(),
        StatusCode::UNAUTHORIZED,
        "another client behind the same proxy is not held back"
    );

    let server = env.serve_with(
        "per-token",
        &[
            ("JOBTRAIL_RATE_PER_ADDRESS", "off"),
            ("JOBTRAIL_RATE_PER_TOKEN", "1/s,3"),
        ],
    );
    let alice = env.token("agent-alice", &["submit", "read"]).await;
    let bob = env.token("agent-bob", &["read"]).await;
    let list = |token: &str| {
        c.get(server.url("/v1/operations"))
            .bearer_auth(token)
            .send()
    };
    let mut refused = 0;
    for _ in 0..10 {
        match list(&alice).await.unwrap().status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}"),
        }
    }
    assert!(
        refused >= 6,
        "10 requests at once, a burst of 3 at 1/s allowed: {refused} refused"
    );
    assert_eq!(list(&bob).await.unwrap().status(), StatusCode::OK);
    // A submission refused for its rate writes nothing.
    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7());
    let submitted = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&alice)
        .json(
            &json!({"id": id.to_string(), "provider": "sim", "target": "reports",
                      "approved_by": "alice", "request": body(json!({}))}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(env.store.get(id).await.is_err(), "nothing written");

    for (bad, says) in [
        ("0/s", "at least 1/s"),
        ("lots", "RATE/s"),
        ("5/s,0", "RATE/s"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(["serve", "--listen", "127.0.0.1:0", "--rate-per-token", bad])
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(says) && err.contains("--rate-per-token"),
            "{bad}: {err}"
        );
    }
}

/// Anyone may send a random token-shaped string, and each is a database lookup; the rate per token
/// counts each apart and the rate per address may be off (behind an Ingress, as the chart runs it).
/// Lookups of tokens not found live lately are bounded per process (50/s, bursts of 200): past it,
/// 429 before any query. An agent whose token was found live lately is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_tokens_is_looked_up_at_a_bounded_rate() {
    let env = Env::new().await;
    let server = env.serve_with("flood", &[("JOBTRAIL_RATE_PER_ADDRESS", "off")]);
    let c = support::http();
    let alice = env.token("agent-alice", &["read"]).await;
    // Bob's token is live but has not been used here: the server knows it from its list of every
    // live token, read when the first request comes (and every 30 s).
    let bob = env.token("agent-bob", &["read"]).await;
    let list = |token: String| {
        c.get(server.url("/v1/operations"))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(list(alice.clone()).await.unwrap().status(), StatusCode::OK);
    let made_up = || {
        format!(
            "jtk_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )
    };
    let began = std::time::Instant::now();
    let (mut looked_up, mut refused) = (0u32, 0u32);
    for round in 0..8 {
        let answers = futures::future::join_all((0..40).map(|_| list(made_up()))).await;
        for a in answers {
            match a.unwrap().status() {
                StatusCode::UNAUTHORIZED => looked_up += 1,
                StatusCode::TOO_MANY_REQUESTS => refused += 1,
                other => panic!("{other}"),
            }
        }
        // Between the rounds, while the budget is spent: alice is looked up all the same.
        assert_eq!(
            list(alice.clone()).await.unwrap().status(),
            StatusCode::OK,
            "round {round}"
        );
    }
    let most = 200 + 50 * (began.elapsed().as_secs() as u32 + 1);
    assert!(
        refused > 0 && looked_up <= most,
        "320 made-up tokens: {looked_up} looked up (at most {most}), {refused} refused"
    );
    // The budget is spent: bob, listed, is looked up all the same.
    for _ in 0..3 {
        let answers = futures::future::join_all((0..40).map(|_| list(made_up()))).await;
        assert!(
            answers
                .iter()
                .any(|a| a.as_ref().unwrap().status() == StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(list(bob.clone()).await.unwrap().status(), StatusCode::OK);
    }
}

/// A caller holds at most `--waits-per-caller` waits open at once: past it, another is refused at
/// once (429 `rate-limited`, Retry-After), another caller still waits, and a wait that ends gives
/// its turn back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_holds_a_bounded_number_of_waits() {
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_WAITS_PER_CALLER", "2")]);
    let c = support::http();
    let mut ids = Vec::new();
    for caller in ["agent-alice", "agent-bob"] {
        let op = env
            .submit("sim", json!({}), |s| s.caller = caller.into())
            .await;
        ids.push(op.id);
    }
    let alice = env.token("agent-alice", &["read"]).await;
    let bob = env.token("agent-bob", &["read"]).await;
    let wait = |token: &str, id: jobtrail_core::OperationId, secs: u32| {
        c.get(server.url(&format!("/v1/operations/{id}/wait?timeout={secs}s")))
            .bearer_auth(token)
            .send()
    };
    // No worker runs: the operations stay submitted, so each wait holds until its timeout.
    let first = tokio::spawn(wait(&alice, ids[0], 3));
    let second = tokio::spawn(wait(&alice, ids[0], 3));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let refused = wait(&alice, ids[0], 3).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    problem(refused, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    let other = wait(&bob, ids[1], 1).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "another caller still waits");
    for w in [first, second] {
        let r = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("bounded")
            .unwrap()
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert_eq!(
        wait(&alice, ids[0], 1).await.unwrap().status(),
        StatusCode::OK,
        "the turns came back"
    );
}

/// A caller is sent a bounded number of results at once (each is held in memory until the last of
/// it is handed to the connection, and a reader that stops reading holds one): past it, another is
/// refused (429), another caller is not held back, and a result sent to the end, or one whose
/// reader went away, gives its turn back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_is_sent_a_bounded_number_of_results_at_once() {
    let mut env = Env::new().await;
    let op = env.submit("sim", json!({"items": 200}), |_| {}).await;
    env.start_worker("w1", Duration::from_secs(10));
    let op = env.wait_settled(op.id, Duration::from_secs(40)).await;
    env.stop_workers().await;
    assert_eq!(op.state, jobtrail_core::State::Succeeded);

    // The bookkeeping, held open as a stalled reader holds it.
    let service = jobtrail_service::Service::new(env.store.clone(), env.registry.clone());
    service.set_results_per_caller(1);
    let e2e = jobtrail_service::Principal::trusted("e2e");
    let held = service.result_slot(&e2e).expect("a first slot");
    let Err(refused) = service.result_slot(&e2e) else {
        panic!("a second slot was given");
    };
    assert_eq!(refused.kind, jobtrail_service::Kind::RateLimited);
    assert!(
        service
            .result_slot(&jobtrail_service::Principal::trusted("other"))
            .is_ok(),
        "another caller is not held back"
    );
    drop(held);
    assert!(service.result_slot(&e2e).is_ok(), "the turn is given back");

    // Over HTTP with one at a time: results read to the end, or abandoned, give their turn back.
    let server = env.serve_with("api", &[("JOBTRAIL_RESULTS_PER_CALLER", "1")]);
    let token = env.token("e2e", &["read"]).await;
    let c = support::http();
    let fetch = || {
        c.get(server.url(&format!("/v1/operations/{}/result", op.id)))
            .bearer_auth(&token)
            .send()
    };
    for _ in 0..3 {
        let r = fetch().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let len: usize = r.headers()[reqwest::header::CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let body = r.bytes().await.unwrap();
        assert_eq!(body.len(), len);
        assert_eq!(len as i64, op.result_size.unwrap());
    }
    drop(fetch().await.unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fetch().await.unwrap().status() != StatusCode::OK {
        assert!(
            std::time::Instant::now() < deadline,
            "an abandoned result never gave its turn back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A caller may be sending a bounded number of request bodies at once (each is held in memory
/// until its last byte arrives, and a sender that stops sending holds one): past it, another body
/// is refused (429, over HTTP and MCP), a request without one and another caller are not held
/// back, and a sender that goes away gives its turn back. A body is read only for a caller whose
/// scope allows the route, and one declared over the route's limit is refused unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_sends_a_bounded_number_of_bodies_at_once() {
    use tokio::io::AsyncWriteExt;
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_BODIES_PER_CALLER", "1")]);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let token = env.token("e2e", &["submit", "read", "cancel"]).await;
    let other = env.token("other", &["submit"]).await;
    let reader = env.token("reader", &["read"]).await;
    let c = support::http();
    let submit = |token: &str| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
    };
    // Its turn free, an empty submit is read and refused as bad input.
    assert_eq!(
        submit(&token).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );

    // A sender that stops: the head and a part of the body, then nothing.
    let stall = || async {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(
            format!(
                "POST /v1/operations HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"provider\":"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        conn
    };
    let mut stalled = stall().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let r = submit(&token).await.unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            break r;
        }
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(
            std::time::Instant::now() < deadline,
            "a stalled body never held its sender's turn"
        );
        // Answered (it asked while this probe held the one turn): stall again.
        if !matches!(stalled.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        {
            stalled = stall().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused.headers().contains_key("retry-after"));
    let p: Value = refused.json().await.unwrap();
    assert_eq!(p["kind"], "rate-limited", "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("request bodies"),
        "{p}"
    );
    let opened = c
        .post(server.url("/mcp"))
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .json(&support::mcp_initialize())
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::TOO_MANY_REQUESTS, "MCP too");
    let listed = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::OK, "no body, no turn needed");
    assert_eq!(
        submit(&other).await.unwrap().status(),
        StatusCode::BAD_REQUEST,
        "another caller is not held back"
    );

    // Gone: the turn is given back.
    drop(stalled);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while submit(&token).await.unwrap().status() != StatusCode::BAD_REQUEST {
        assert!(
            std::time::Instant::now() < deadline,
            "a sender that went away never gave its turn back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Refused without waiting for a byte of the body: a scope that does not allow the route, and
    // lengths over the route's limit (a submit's 16 MiB and change; a cancel's 64 KiB).
    let head = |path: &str, token: &str, len: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let id = "op_00000000000000000000000000";
    for (path, token, len, status) in [
        ("/v1/operations", &reader, 1_000_000, 403),
        // Over MCP, a token that may not submit sends a few words at most.
        ("/mcp", &reader, 64 * 1024 + 1, 413),
        (
            "/v1/operations",
            &token,
            jobtrail_api::MAX_REQUEST_BYTES + 1,
            413,
        ),
        (
            &*format!("/v1/operations/{id}/cancel"),
            &token,
            64 * 1024 + 1,
            413,
        ),
    ] {
        assert_eq!(
            support::raw_status(&addr, &head(path, token, len), b"{").await,
            status,
            "{path} {len}"
        );
    }
    // Sent, not declared: a cancel whose reason runs past 64 KiB in chunks is refused too.
    let chunked = format!(
        "POST /v1/operations/{id}/cancel HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let chunk = format!("{:x}\r\n{}\r\n", 70_000, "a".repeat(70_000));
    assert_eq!(
        support::raw_status(&addr, &chunked, chunk.as_bytes()).await,
        413
    );
    // The turn is held until the route has answered, not only while the body arrives (what was
    // parsed from it is held as long): a submit waiting for the database holds it.
    let lock = support::WriteLock::on_operations(&env.url).await;
    let waiting = tokio::spawn({
        let (c, url, token) = (c.clone(), server.url("/v1/operations"), token.clone());
        let req = json!({"provider": "sim", "target": "reports", "approved_by": "e2e",
                         "request": body(json!({"duration_ms": 300}))});
        async move {
            c.post(url)
                .bearer_auth(token)
                .json(&req)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    // Once it waits for the lock (nothing else asks meanwhile: there is one turn), it holds it.
    support::until_blocked_on(&env.url, "operations").await;
    assert_eq!(
        submit(&token).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a submit waiting for the database gave its turn back before answering"
    );
    lock.release().await;
    let created = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the submit never answered once the lock was gone")
        .unwrap();
    assert_eq!(created, StatusCode::CREATED);
    assert_eq!(
        submit(&token).await.unwrap().status(),
        StatusCode::BAD_REQUEST,
        "answered, the turn is free"
    );
}

/// A caller holds at most `--open-per-caller` operations open (not yet finished) at once, counted
/// by the database across servers: a submit past it is refused with 429 `too-many-open` and writes
/// nothing, a batch as a whole; the same id again is answered as ever; other callers are not held
/// back; an operation that finishes makes room. Concurrent submits through two servers never open
/// more than the cap between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_holds_at_most_its_cap_of_open_operations() {
    let mut env = Env::new().await;
    let cap = [
        ("JOBTRAIL_OPEN_PER_CALLER", "3"),
        ("JOBTRAIL_BODIES_PER_CALLER", "32"),
    ];
    let one = env.serve_with("api-1", &cap);
    let two = env.serve_with("api-2", &cap);
    let c = support::http();
    let alice = env
        .token("agent-alice", &["submit", "read", "cancel"])
        .await;
    let bob = env.token("agent-bob", &["submit", "read"]).await;
    let new_id = || jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    let item = |id: &str| {
        json!({"id": id, "provider": "sim", "target": "reports", "approved_by": "alice",
               "request": body(json!({"duration_ms": 200}))})
    };
    let submit = |server: &support::Server, token: &str, id: &str| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(token)
            .json(&item(id))
            .send()
    };
    let db_url = env.url.clone();
    let open_of = async |caller: &str| {
        let mut conn = sqlx::PgConnection::connect(&db_url).await.unwrap();
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM operations WHERE caller = $1 AND finished_at IS NULL",
        )
        .bind(caller)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        n
    };

    // Concurrent submits of one caller through both servers: three are taken, the rest refused.
    let ids: Vec<String> = (0..12).map(|_| new_id()).collect();
    let answers = futures::future::join_all(
        ids.iter()
            .enumerate()
            .map(|(i, id)| submit(if i % 2 == 0 { &one } else { &two }, &alice, id)),
    )
    .await;
    let mut taken = Vec::new();
    for (id, r) in ids.iter().zip(answers) {
        let r = r.unwrap();
        if r.status() == StatusCode::CREATED {
            taken.push(id.clone());
            continue;
        }
        let p = problem(r, StatusCode::TOO_MANY_REQUESTS, "too-many-open").await;
        assert_eq!(
            (&p["extra"]["open"], &p["extra"]["limit"]),
            (&json!(4), &json!(3)),
            "{p}"
        );
        assert!(
            p["detail"].as_str().unwrap().contains("--open-per-caller"),
            "{p}"
        );
    }
    assert_eq!(taken.len(), 3, "{taken:?}");
    assert_eq!(open_of("agent-alice").await, 3);
    assert_eq!(
        env.store.totals().await.unwrap().0,
        3,
        "a refused submit wrote nothing"
    );

    // The same id again is the same operation, at the cap or over it (a server whose cap was
    // lowered below what the caller holds): alone or as a batch that opens nothing.
    let again = submit(&one, &alice, &taken[0]).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let lowered = env.serve_with(
        "api-low",
        &[
            ("JOBTRAIL_OPEN_PER_CALLER", "2"),
            ("JOBTRAIL_BODIES_PER_CALLER", "32"),
        ],
    );
    assert_eq!(
        submit(&lowered, &alice, &taken[1]).await.unwrap().status(),
        StatusCode::OK
    );
    let resent = c
        .post(lowered.url("/v1/operations:batch"))
        .bearer_auth(&alice)
        .json(&json!({"operations": taken.iter().map(|id| item(id)).collect::<Vec<_>>()}))
        .send()
        .await
        .unwrap();
    // Nothing of it new: 200, as one submit sent again is answered.
    assert_eq!(resent.status(), StatusCode::OK);
    let resent: Value = resent.json().await.unwrap();
    assert!(
        resent["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["created"] == false),
        "{resent}"
    );
    drop(lowered);
    // Refused without Retry-After: when room comes is the providers' doing, not a rate.
    let r = submit(&two, &alice, &new_id()).await.unwrap();
    assert!(r.headers().get(reqwest::header::RETRY_AFTER).is_none());
    problem(r, StatusCode::TOO_MANY_REQUESTS, "too-many-open").await;
    // Another caller is not held back; its batch past the cap is refused whole, nothing of it
    // written, as the batch's refusal (not an item's).
    let batch = || json!({"operations": [item(&new_id()), item(&new_id())]});
    let post_batch = |b: Value| {
        c.post(one.url("/v1/operations:batch"))
            .bearer_auth(&bob)
            .json(&b)
            .send()
    };
    assert_eq!(
        post_batch(batch()).await.unwrap().status(),
        StatusCode::CREATED
    );
    let p = problem(
        post_batch(batch()).await.unwrap(),
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-open",
    )
    .await;
    assert!(!p["detail"].as_str().unwrap().starts_with("item"), "{p}");
    assert_eq!(
        (&p["extra"]["open"], &p["extra"]["limit"]),
        (&json!(4), &json!(3)),
        "{p}"
    );
    assert_eq!(open_of("agent-bob").await, 2);

    // Finished operations make room.
    env.start_worker("w1", Duration::from_secs(5));
    for id in &taken {
        let op = env
            .wait_settled(id.parse().unwrap(), Duration::from_secs(30))
            .await;
        assert_eq!(op.state, jobtrail_core::State::Succeeded);
    }
    assert_eq!(open_of("agent-alice").await, 0);
    for server in [&one, &two, &one] {
        let r = submit(server, &alice, &new_id()).await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    problem(
        submit(&two, &alice, &new_id()).await.unwrap(),
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-open",
    )
    .await;
    env.stop_workers().await;
}

/// A page of operations ends early rather than carry more than `PAGE_BYTES` of JSON, and its
/// cursor walks every operation exactly once. Before, 200 operations with padded text fields made
/// one answer of megabytes, held in memory while it was sent, at the caller's request rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_large_operations_ends_early_and_its_cursor_walks_them_all() {
    let env = Env::new().await;
    let server = env.serve("api");
    let c = support::http();
    let token = env.token("agent-padded", &["read"]).await;
    let pad = "é".repeat(1024);
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..120 {
        let op = env
            .submit("sim", json!({}), |s| {
                s.caller = "agent-padded".into();
                s.target = pad.clone();
                s.approval_ref = Some(pad.clone());
            })
            .await;
        ids.insert(op.id.to_string());
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &cursor {
            None => "/v1/operations?limit=200".to_owned(),
            Some(c) => format!("/v1/operations?limit=200&cursor={c}"),
        };
        let r = c
            .get(server.url(&url))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.bytes().await.unwrap();
        assert!(
            body.len() <= jobtrail_service::PAGE_BYTES + 1024,
            "a page of {} bytes",
            body.len()
        );
        let page: Value = serde_json::from_slice(&body).unwrap();
        for o in page["operations"].as_array().unwrap() {
            assert!(seen.insert(o["id"].as_str().unwrap().to_owned()), "{o}");
        }
        pages += 1;
        assert!(pages <= 20, "the cursor does not end");
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    assert!(pages >= 3, "{pages} pages");
}

/// A result counts whole against `--held-mib`, since it is read into the server's memory whole:
/// one larger than the bound is never served (503 without Retry-After, naming the flag; served, it
/// took the server's memory and every caller's waits with it), one larger than half is served on
/// its own. Before, a result counted at most a quarter of the bound, however large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_larger_than_the_server_may_hold_is_refused_before_it_is_read() {
    let mut env =
        Env::with_edited_contracts(&[("sim.toml", "max_bytes = 1048576", "max_bytes = 4194304")])
            .await;
    // About 47 bytes an item: some 1.8 MiB, and some 0.7 MiB.
    let large = env.submit("sim", json!({"items": 40000}), |_| {}).await;
    let half = env.submit("sim", json!({"items": 15000}), |_| {}).await;
    env.start_worker("w1", Duration::from_secs(10));
    for id in [large.id, half.id] {
        let done = env.wait_settled(id, Duration::from_secs(60)).await;
        assert_eq!(done.state, jobtrail_core::State::Succeeded);
    }
    let large_size = env.store.get(large.id).await.unwrap().result_size.unwrap();
    let half_size = env.store.get(half.id).await.unwrap().result_size.unwrap();
    assert!(large_size > 1 << 20, "{large_size}");
    assert!(half_size > 1 << 19 && half_size < 1 << 20, "{half_size}");
    let server = env.serve_with("api", &[("JOBTRAIL_HELD_MIB", "1")]);
    let ops = env.token("ops", &["read", "decide"]).await;
    let c = support::http();
    let get = async |id: jobtrail_core::OperationId| {
        c.get(server.url(&format!("/v1/operations/{id}/result")))
            .bearer_auth(&ops)
            .send()
            .await
            .unwrap()
    };
    let r = get(large.id).await;
    assert!(
        r.headers().get("retry-after").is_none(),
        "a result that never fits is not worth retrying"
    );
    let p = problem(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("--held-mib"), "{detail}");
    let r = get(half.id).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.bytes().await.unwrap().len() as i64,
        half_size,
        "more than half, served on its own"
    );
    // The size held is the chain's: a writer's login that makes the row say a small size for the
    // large result gets it refused as altered, never read into the server under a small hold.
    let db = sqlx::PgPool::connect(&env.url).await.unwrap();
    sqlx::query("UPDATE operations SET result_size = 1 WHERE id = $1")
        .bind(large.id.as_uuid())
        .execute(&db)
        .await
        .unwrap();
    db.close().await;
    let p = problem(
        get(large.id).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "tampered",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("altered"), "{p}");
    env.stop_workers().await;
}

/// The bytes of request bodies (and results) a server holds at once are bounded across callers,
/// each of them within its own turns: one caller holds at most half (so it cannot shut the others
/// out), the process at most `--held-mib`; past either, another body is refused before it is read
/// (503 with Retry-After), and a sender that goes away gives its bytes back. Before, three callers
/// within their turns could make a server hold 400 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_a_server_holds_at_once_are_bounded_across_callers() {
    use tokio::io::AsyncWriteExt;
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_HELD_MIB", "1")]);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let (a, b, c3) = (
        env.token("agent-a", &["submit"]).await,
        env.token("agent-b", &["submit"]).await,
        env.token("agent-c", &["submit"]).await,
    );
    // Each declares more than a quarter of the 1 MiB: it counts a quarter.
    let declared = 300 * 1024;
    // A head declaring a large body, and a part of it; the rest never follows.
    let start = |token: &str| {
        let (addr, token) = (addr.clone(), token.to_owned());
        async move {
            let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
            conn.write_all(
                format!(
                    "POST /v1/operations HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
                     Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{{\"provider\":"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            conn
        }
    };
    // Held: the server waits for the rest of its body (it answers nothing).
    let hold = async |token: &str| {
        let conn = start(token).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            matches!(conn.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a large body of {token} was not waited for"
        );
        conn
    };
    // Refused at once, before its body is read.
    let refused = async |token: &str| {
        use tokio::io::AsyncReadExt;
        let mut conn = start(token).await;
        let mut head = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut head))
            .await
            .expect("refused in time")
            .unwrap();
        let answer = String::from_utf8_lossy(&head[..n]).into_owned();
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("retry-after: 1"), "{answer}");
        // Its body is left unread: the client is told not to send another request on it.
        assert!(lower.contains("connection: close"), "{answer}");
        assert!(answer.contains("--held-mib"), "{answer}");
    };
    let c = support::http();
    let small = async |token: &str| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .status()
    };
    // One caller holds at most half: a third large body of its is refused, another caller's
    // small one is read (and refused as bad input).
    let a1 = hold(&a).await;
    // What a body takes parsed is held too: 60 KiB of zeros take about 1 MiB as values (counted
    // a quarter), which with the quarter a1 holds passes a's half; the same body of b's, which
    // holds nothing, is read and parsed.
    let zeros = format!(
        r#"{{"provider":"sim","request":[{}0]}}"#,
        "0,".repeat(30 * 1024)
    );
    let numbers = async |token: &str| {
        c.post(server.url("/v1/operations"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(zeros.clone())
            .send()
            .await
            .unwrap()
    };
    let r = numbers(&a).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.text().await.unwrap().contains("--held-mib"));
    assert_ne!(numbers(&b).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let a2 = hold(&a).await;
    refused(&a).await;
    assert_eq!(small(&b).await, StatusCode::BAD_REQUEST);
    // The process holds at most the bound: with another caller's half held too, a third
    // caller's body is refused.
    let b1 = hold(&b).await;
    let b2 = hold(&b).await;
    refused(&c3).await;
    // Senders that go away give their bytes back: a large body is read again.
    drop((a1, a2, b1, b2));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .post(server.url("/v1/operations"))
            .bearer_auth(&c3)
            .header("content-type", "application/json")
            .body(vec![b' '; declared])
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::BAD_REQUEST {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            std::time::Instant::now() < deadline,
            "senders that went away never gave their bytes back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Three refusals for load or more, said once in the log (they come in floods).
    let said = server.log_text().matches("refused for load").count();
    assert_eq!(said, 1, "{}", server.log_text());
}

/// A token the operator made (`openssl rand -hex 32`) and handed over on stdin, for a one-off pod
/// whose output the cluster's log pipeline keeps: only its digest is stored, nothing secret is
/// printed, and it works at once. One that is not random, or one already in use, is refused with
/// nothing written.
#[tokio::test]
async fn a_token_the_operator_made_is_taken_from_stdin_and_never_printed() {
    let env = Env::new().await;
    let server = env.serve("api");
    let c = support::http();
    let admin = support::admin_bin();
    let create = |input: &str| {
        support::run_bin(
            &admin,
            &env.url,
            &env.providers,
            &[
                "tokens",
                "create",
                "--token-stdin",
                "--caller",
                "agent-9",
                "--scopes",
                "read",
                "--created-by",
                "alice",
            ],
            Some(input),
        )
    };
    let hex = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mine = format!("jtk_{hex}");
    let out = create(&format!("{mine}\n"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for printed in [&stdout, &stderr] {
        assert!(!printed.contains(&hex[..16]), "the token was printed");
    }
    let id: uuid::Uuid = stdout.trim().parse().expect("the record's id on stdout");
    let list = c
        .get(server.url("/v1/operations"))
        .bearer_auth(&mine)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), reqwest::StatusCode::OK);
    let tokens = env.store.tokens().await.unwrap();
    assert!(tokens.iter().any(|t| t.id == id && t.caller == "agent-9"));

    // Made up, not random; the same token again: refused, nothing written, never echoed.
    let weak = format!("jtk_{}", "ab".repeat(32));
    let shouted = format!("jtk_{}", hex.to_uppercase());
    for (input, code) in [
        (weak.as_str(), 2),
        (shouted.as_str(), 2),
        (mine.as_str(), 4),
    ] {
        let out = create(&format!("{input}\n"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(!stderr.contains(&input[4..20]), "{stderr}");
    }
    assert_eq!(env.store.tokens().await.unwrap().len(), tokens.len());
}

/// A wait may last five minutes: one whose token is revoked meanwhile ends refused (401) within
/// the 30 s the server takes to look at it again, while another caller's wait on the same
/// operation runs on to its own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_token_is_revoked_meanwhile_ends_refused() {
    let env = Env::new().await;
    let server = env.serve("api");
    let c = support::http();
    let agent = env.token("agent-revoked", &["submit", "read"]).await;
    let operator = env.token("operator-kept", &["read", "decide"]).await;
    // No worker: the operation stays as submitted, and a wait on it waits.
    let r = c
        .post(server.url("/v1/operations"))
        .bearer_auth(&agent)
        .json(
            &json!({"provider": "sim", "target": "reports", "approved_by": "alice",
            "request": body(json!({"duration_ms": 300}))}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let id = r.json::<Value>().await.unwrap()["operation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let wait = |token: String| {
        let (c, url) = (
            c.clone(),
            server.url(&format!("/v1/operations/{id}/wait?timeout=90s")),
        );
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = c.get(url).bearer_auth(token).send().await.unwrap();
            (r, started.elapsed())
        })
    };
    let revoked = wait(agent.clone());
    let kept = wait(operator);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = env.store.tokens().await.unwrap();
    let t = t.iter().find(|t| t.caller == "agent-revoked").unwrap();
    env.store.revoke_token(t.id, "alice").await.unwrap();
    let (r, took) = tokio::time::timeout(Duration::from_secs(45), revoked)
        .await
        .expect("the revoked token's wait ended within the recheck")
        .unwrap();
    let p = problem(r, StatusCode::UNAUTHORIZED, "unauthenticated").await;
    assert!(p["detail"].as_str().unwrap().contains("revoked"), "{p}");
    assert!(took < Duration::from_secs(40), "{took:?}");
    assert!(!kept.is_finished(), "the other caller's wait runs on");
    kept.abort();
}

/// A proxy on loopback that passes each request to `upstream` and lets the server answer, then
/// closes the connection without passing the answer on: a submit that landed, whose answer was
/// lost (a timeout, a load balancer cutting the connection).
async fn answer_dropping_proxy(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                // The request, then the answer read to its first bytes and dropped.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    let n = client.read(&mut buf).await.unwrap_or(0);
                    let _ = server.write_all(&buf[..n]).await;
                    // The rest of the request, if any, until the server answers.
                    let mut answer = [0u8; 1];
                    loop {
                        tokio::select! {
                            n = client.read(&mut buf) => match n {
                                Ok(n) if n > 0 => { let _ = server.write_all(&buf[..n]).await; }
                                _ => return,
                            },
                            _ = server.read_exact(&mut answer) => return,
                        }
                    }
                })
                .await;
            });
        }
    });
    addr
}

/// A submit without `--id` whose answer is lost: the CLI made the id up, names it, and the same
/// submit sent again under it does not start a second operation (a second paid job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_answer_is_lost_names_its_id_and_is_not_submitted_twice() {
    let env = Env::new().await;
    let server = env.serve("api");
    let token = env.token("agent-lossy", &["submit", "read"]).await;
    let upstream: std::net::SocketAddr = server
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let proxy = answer_dropping_proxy(upstream).await;
    let submit = |base: String, id: Option<String>| {
        let mut args: Vec<String> = [
            "submit",
            "--provider",
            "sim",
            "--target",
            "t-lossy",
            "--approved-by",
            "ops",
            "--body",
            "-",
        ]
        .map(String::from)
        .into();
        args.extend(id.into_iter().flat_map(|id| ["--id".to_owned(), id]));
        jobtrail_through(
            base,
            token.clone(),
            args,
            br#"{"duration_ms": 100}"#.to_vec(),
        )
    };
    let out = submit(format!("http://{proxy}"), None).await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(5), "{err}");
    let id = err
        .split_whitespace()
        .find_map(|w| {
            w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .parse::<jobtrail_core::OperationId>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no id named: {err}"));
    assert!(err.contains(&format!("--id {id}")), "{err}");
    // It landed, under that id.
    assert_eq!(env.store.get(id).await.unwrap().caller, "agent-lossy");
    let out = submit(server.base.clone(), Some(id.to_string())).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id.to_string());
    let n: (i64,) = sqlx::query_as("SELECT count(*) FROM operations WHERE caller = 'agent-lossy'")
        .fetch_one(&sqlx::PgPool::connect(&env.url).await.unwrap())
        .await
        .unwrap();
    assert_eq!(n.0, 1, "one operation, not two");

    // A batch larger than the API takes in one request is refused before it is sent, with what to
    // do (the same file works through the database, whose limit is the batch's own).
    let big = "x".repeat(9 << 20);
    let line = serde_json::json!({"provider": "sim", "target": "t-big", "approved_by": "ops", "request": {"pad": big}});
    let input = format!("{line}\n{line}\n");
    let out = jobtrail_through(
        server.base.clone(),
        token,
        vec!["submit-batch".into()],
        input.into_bytes(),
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("split it"), "{err}");
}

/// `jobtrail ARGS` through the API at `base` with `token` and nothing else, `stdin` piped in.
async fn jobtrail_through(
    base: String,
    token: String,
    args: Vec<String>,
    stdin: Vec<u8>,
) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobtrail"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env("JOBTRAIL_API", base)
            .env("JOBTRAIL_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(&stdin).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}
