//! The config-driven adapter against the simulated provider over real HTTP: every scripted behaviour
//! becomes the right closed outcome. Records come from a real PostgreSQL.

use jobtrail_core::*;
use jobtrail_provider::contract::{Contract, HttpVersion};
use jobtrail_provider::*;
use jobtrail_store::testing::TestDb;
use jobtrail_store::testing::heap;
use jobtrail_store::{OperationRecord, Store};
use std::path::Path;
use std::time::Duration;

const SECRET: &str = "s3cr3t-bearer-DO-NOT-LEAK-7f3a";

// The stub provider and the client's connection tasks run on the test's own thread too.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

struct H {
    sim: jobtrail_sim::Running,
    provider: HttpProvider,
    store: Store,
    _db: TestDb,
}

fn contract(name: &str, base: &str) -> Contract {
    let mut c = Contract::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../providers/{name}.toml")),
    )
    .unwrap();
    c.base_url = url::Url::parse(base).unwrap();
    c
}

async fn harness(contract_name: &str) -> H {
    harness_over(contract_name, HttpVersion::Auto, false).await
}

/// The contract called in `http`, against a simulator that speaks HTTP/1.1 only when `http1_only`.
async fn harness_over(contract_name: &str, http: HttpVersion, http1_only: bool) -> H {
    let config = jobtrail_sim::Config {
        http1_only,
        ..Default::default()
    };
    harness_with(config, |base| {
        let mut c = contract(contract_name, base);
        c.http_version = http;
        c
    })
    .await
}

/// The contract `make` builds for the simulator's base URL, against a simulator started with
/// `config` and the test's bearer token.
async fn harness_with(config: jobtrail_sim::Config, make: impl FnOnce(&str) -> Contract) -> H {
    // SAFETY: every test in this binary sets the same value.
    unsafe { std::env::set_var("JOBTRAIL_SIM_TOKEN", SECRET) };
    let sim = jobtrail_sim::Sim::new(jobtrail_sim::Config {
        bearer_token: Some(SECRET.into()),
        ..config
    })
    .start("127.0.0.1:0".parse().unwrap())
    .await
    .unwrap();
    let provider = HttpProvider::new(make(&sim.base_url())).unwrap();
    let db = TestDb::new().await;
    let store = db.store().await;
    H {
        sim,
        provider,
        store,
        _db: db,
    }
}

impl H {
    async fn op(&self, sim_script: serde_json::Value) -> OperationRecord {
        self.op_with_body(serde_json::json!({"report": "usage", "sim": sim_script}))
            .await
    }

    async fn op_with_body(&self, body: serde_json::Value) -> OperationRecord {
        let mut terms = std::collections::BTreeMap::new();
        terms.insert(
            self.provider.contract().name.clone(),
            self.provider.contract().terms(),
        );
        let s = Submission {
            provider: self.provider.contract().name.clone(),
            target: "reports".into(),
            body: serde_json::to_vec(&body).unwrap(),
            caller: "test".into(),
            approved_by: "tester".into(),
            ..Default::default()
        };
        self.store
            .submit_new(&s, &terms, SubmitLimits::default())
            .await
            .unwrap()
            .operation
    }

    /// Create and adopt the job id into a copy of the record, as the worker would.
    async fn created(&self, sim_script: serde_json::Value) -> OperationRecord {
        let mut op = self.op(sim_script).await;
        let c = self.provider.create(&op, 1.into()).await;
        match c.outcome {
            CreateOutcome::Accepted {
                job_id, status_url, ..
            } => {
                op.remote_job_id = Some(job_id);
                op.status_url = status_url;
            }
            other => panic!("create: {other:?}"),
        }
        if let Some(ctx) = c.context {
            op.provider_context = ctx;
        }
        op
    }

    /// Poll until the phase is terminal (bounded), keeping context and the followed URL.
    async fn poll_to_end(&self, op: &mut OperationRecord) -> RemoteStatus {
        for n in 1..200 {
            let c = self.provider.status(op, n.into()).await;
            if let Some(ctx) = c.context {
                op.provider_context = ctx;
            }
            if let StatusOutcome::Observed(s) = c.outcome {
                if let Some(u) = &s.status_url {
                    op.status_url = Some(u.clone());
                }
                if matches!(
                    s.phase,
                    Some(Phase::Succeeded | Phase::Failed | Phase::Cancelled)
                ) {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job did not end");
    }
}

#[tokio::test]
async fn a_well_behaved_job_is_accepted_observed_and_its_result_validates() {
    let h = harness("sim").await;
    let mut op = h.created(serde_json::json!({"duration_ms": 300})).await;
    assert!(op.remote_job_id.as_deref().unwrap().starts_with("job_"));
    let end = h.poll_to_end(&mut op).await;
    assert_eq!(end.phase, Some(Phase::Succeeded));
    assert!(end.hints.result_url.is_some() && end.hints.expected_count == Some(5));
    let r = h.provider.fetch_result(&op, 1.into()).await;
    let ResultOutcome::Fetched(f) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    match h.provider.check_result(&op, &f) {
        Checked::Valid { checks, summary } => {
            assert!(checks.iter().any(|c| c.contains("schema")), "{checks:?}");
            assert!(
                checks.iter().any(|c| c.contains("sha256 matches")),
                "{checks:?}"
            );
            assert_eq!(summary["items"]["total"], 5);
            assert_eq!(summary["items"]["failed"], 0);
        }
        other => panic!("{other:?}"),
    }
    // The call record is sanitized evidence.
    assert_eq!(r.call.http_status, Some(200));
    assert!(
        r.call
            .provider_request_id
            .as_deref()
            .unwrap()
            .starts_with("req_result_")
    );
    assert_eq!(r.call.trace_id, op.trace_id.to_string());
}

#[tokio::test]
async fn create_faults_become_the_right_outcomes() {
    let h = harness("sim").await;
    let one = |acts: &[&str]| serde_json::json!({"create": acts, "create_delay_ms": 3000, "retry_after_secs": 2});

    // Dropped after the provider accepted: ambiguous, never rejected; the job exists.
    let op = h.op(one(&["drop_after_accept"])).await;
    let c = h.provider.create(&op, 1.into()).await;
    assert_eq!(
        c.outcome,
        CreateOutcome::Ambiguous {
            error_class: "connection_lost".into()
        }
    );
    assert_eq!(
        h.sim.ledger().jobs_for_reference(&op.id.to_string()).len(),
        1
    );
    // The same token again returns the original job: one remote job.
    let c2 = h.provider.create(&op, 2.into()).await;
    let CreateOutcome::Accepted { job_id, .. } = c2.outcome else {
        panic!("{:?}", c2.outcome)
    };
    assert_eq!(h.sim.ledger().tokens[op.token.as_str()], vec![job_id]);

    // A job named `..` (a URL built from it would address another resource): the job may exist,
    // but that name cannot be used. Ambiguous, and the reason says why.
    let op = h.op(one(&["dot_dot_job_id"])).await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::Ambiguous { error_class } => {
            assert!(error_class.starts_with("unusable_job_id"), "{error_class}")
        }
        other => panic!("{other:?}"),
    }

    // A call that could not end before the caller's lease does is not sent at all.
    let op = h.op(one(&[])).await;
    let before = h.sim.ledger().requests;
    let late = CallCtx {
        end_by: Some(std::time::Instant::now() + Duration::from_millis(500)),
        ..CallCtx::attempt(1)
    };
    assert_eq!(
        h.provider.create(&op, late).await.outcome,
        CreateOutcome::NotSent {
            error_class: "lease_too_short_to_send".into()
        }
    );
    assert_eq!(
        h.sim.ledger().requests,
        before,
        "nothing reached the provider"
    );

    // A call is dated by the database's clock the caller carries (history links are too), not by
    // this host's, which may be skewed: here the database is an hour behind.
    let op = h.op(one(&[])).await;
    let behind = chrono::Utc::now() - chrono::Duration::hours(1);
    let dated = CallCtx {
        clock: Some((behind, std::time::Instant::now())),
        ..CallCtx::attempt(1)
    };
    let started = h.provider.create(&op, dated).await.call.started_at;
    assert!(
        (started - behind).num_seconds().abs() < 30,
        "dated {started}, the database's clock says {behind}"
    );

    // Answered only after our timeout: ambiguous (timeout).
    let op = h.op(one(&["slow_accept"])).await;
    assert_eq!(
        h.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Ambiguous {
            error_class: "timeout".into()
        }
    );

    // A call its caller abandons (a worker whose shutdown grace ran out) ends at once, recorded:
    // the request reached the provider, so the create is ambiguous, never forgotten.
    let op = h.op(one(&["slow_accept"])).await;
    let abandon = tokio_util::sync::CancellationToken::new();
    let at = CallCtx {
        abandon: Some(abandon.clone()),
        ..CallCtx::attempt(1)
    };
    let before = h.sim.ledger().create_requests.values().sum::<u32>();
    let t0 = std::time::Instant::now();
    let call = h.provider.create(&op, at);
    let stop = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while h.sim.ledger().create_requests.values().sum::<u32>() == before
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        abandon.cancel();
    };
    let (called, ()) = tokio::join!(call, stop);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "ended only after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        called.outcome,
        CreateOutcome::Ambiguous {
            error_class: "abandoned_worker_stopping".into()
        }
    );
    assert_eq!(
        called.call.error_class.as_deref(),
        Some("abandoned_worker_stopping")
    );
    assert_eq!(called.call.http_status, None);
    // Once its caller has given up, a call that has not left is not sent at all, and says so.
    let op = h.op(one(&[])).await;
    let before = h.sim.ledger().requests;
    let stopped = CallCtx {
        abandon: Some(abandon.clone()),
        ..CallCtx::attempt(1)
    };
    assert_eq!(
        h.provider.create(&op, stopped).await.outcome,
        CreateOutcome::NotSent {
            error_class: "not_sent_worker_stopping".into()
        }
    );
    assert_eq!(
        h.sim.ledger().requests,
        before,
        "nothing reached the provider"
    );

    // A 500 after creating: ambiguous.
    let op = h.op(one(&["ambiguous_after_accept"])).await;
    assert_eq!(
        h.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Ambiguous {
            error_class: "http_500".into()
        }
    );

    // 429 with Retry-After seconds; 503 with an HTTP-date.
    // A 429 says nothing was done; a 503 (a gateway's, perhaps after forwarding the create) does
    // not: sent again only under the token, and reconciled, never concluded "not created".
    let op = h.op(one(&["retry_after_seconds"])).await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::RetryLater {
            delay: Some(d),
            maybe_processed: false,
            ..
        } => assert_eq!(d, Duration::from_secs(2)),
        other => panic!("{other:?}"),
    }
    let op = h.op(one(&["retry_after_date"])).await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::RetryLater {
            delay: Some(d),
            maybe_processed: true,
            ..
        } => assert!(
            d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
            "{d:?}"
        ),
        other => panic!("{other:?}"),
    }

    // Without an idempotency key, a 503 does not say the job was not made (a gateway may answer
    // it after forwarding the create): ambiguous, never sent again blind. A 429 still is "not
    // now".
    let legacy = harness("sim-legacy").await;
    let op = legacy.op(one(&["retry_after_date"])).await;
    assert_eq!(
        legacy.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Ambiguous {
            error_class: "http_503".into()
        }
    );
    let op = legacy.op(one(&["retry_after_seconds"])).await;
    assert!(matches!(
        legacy.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::RetryLater { .. }
    ));

    // A definitive rejection.
    let op = h.op(one(&["reject"])).await;
    assert!(matches!(
        h.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Rejected {
            http_status: Some(422),
            ..
        }
    ));

    // The same token answered with a different job id (a contract violation the worker escalates).
    let op = h.op(one(&["ok", "different_job_id"])).await;
    let CreateOutcome::Accepted { job_id: first, .. } =
        h.provider.create(&op, 1.into()).await.outcome
    else {
        panic!()
    };
    let CreateOutcome::Accepted { job_id: second, .. } =
        h.provider.create(&op, 2.into()).await.outcome
    else {
        panic!()
    };
    assert_ne!(first, second);

    // A duplicate reported as 409 "already exists" is read as the original job.
    let op = h.op(one(&["ok", "already_exists_error"])).await;
    let CreateOutcome::Accepted { job_id: first, .. } =
        h.provider.create(&op, 1.into()).await.outcome
    else {
        panic!()
    };
    match h.provider.create(&op, 2.into()).await.outcome {
        CreateOutcome::Accepted {
            job_id,
            duplicate: true,
            ..
        } => assert_eq!(job_id, first),
        other => panic!("{other:?}"),
    }

    // A body changed under the same token is refused by the (careful) provider.
    let mut op = h.op(one(&["ok"])).await;
    assert!(matches!(
        h.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Accepted { .. }
    ));
    op.request_body["report"] = serde_json::json!("changed");
    // (jobtrail never sends a body that does not match its fingerprint: re-fingerprinted here so
    // that the provider's own refusal is what is shown.)
    op.fingerprint = Fingerprint::of(&op.provider, &op.target, &op.request_body);
    assert!(matches!(
        h.provider.create(&op, 2.into()).await.outcome,
        CreateOutcome::Rejected {
            http_status: Some(422),
            ..
        }
    ));

    // A synchronous answer is a result, not an async acceptance.
    let op = h.op(one(&["sync"])).await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::Completed {
            job_id: Some(_),
            result,
        } => assert!(!result.bytes.is_empty()),
        other => panic!("{other:?}"),
    }
    // One marked encoded (none was asked for) is not the result: ambiguous, not kept.
    let op = h.op(one(&["sync_encoded"])).await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::Ambiguous { error_class } => {
            assert_eq!(error_class, "sync_result_encoded")
        }
        other => panic!("{other:?}"),
    }
    // One over the contract's answer limit (256 KiB) but within its result limit (1 MiB) is read
    // whole: the answer is the result (`create.sync_result`, no `sync_codes` needed).
    let op = h
        .op(serde_json::json!({"create": ["sync"], "items": 4000}))
        .await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::Completed {
            job_id: Some(_),
            result,
        } => assert!(result.bytes.len() > 262_144, "{}", result.bytes.len()),
        other => panic!("{other:?}"),
    }
}

/// What the provider sees is the HTTP the contract names: HTTP/2 by prior knowledge over plain
/// http, every concurrent call a stream of one connection; HTTP/1.1 by default and with "1.1", a
/// connection per concurrent call.
#[tokio::test]
async fn calls_go_in_the_http_version_the_contract_names() {
    for (version, seen) in [
        (HttpVersion::Http2, "HTTP/2.0"),
        (HttpVersion::Http1, "HTTP/1.1"),
        (HttpVersion::Auto, "HTTP/1.1"),
    ] {
        let h = harness_over("sim", version, false).await;
        let mut op = h.created(serde_json::json!({"duration_ms": 200})).await;
        let end = h.poll_to_end(&mut op).await;
        assert_eq!(end.phase, Some(Phase::Succeeded), "{version:?}");
        let r = h.provider.fetch_result(&op, 1.into()).await;
        assert!(
            matches!(r.outcome, ResultOutcome::Fetched(_)),
            "{version:?}: {:?}",
            r.outcome
        );
        // Twenty status calls at once, each held 300 ms by the provider.
        let slow = h
            .created(serde_json::json!({"duration_ms": 60_000, "status_delay_ms": 300}))
            .await;
        let before = h.sim.ledger().connections;
        let calls = (0..20).map(|n| h.provider.status(&slow, (n + 1).into()));
        for c in futures::future::join_all(calls).await {
            assert!(
                matches!(c.outcome, StatusOutcome::Observed(_)),
                "{version:?}: {:?}",
                c.outcome
            );
        }
        let ledger = h.sim.ledger();
        let by = &ledger.requests_by_version;
        assert_eq!(by.keys().collect::<Vec<_>>(), [seen], "{version:?}: {by:?}");
        assert!(by[seen] >= 24, "{version:?}: {by:?}");
        let opened = ledger.connections - before;
        if version == HttpVersion::Http2 {
            assert_eq!(ledger.connections, 1, "one connection carries every call");
        } else {
            assert!(
                opened >= 19,
                "{version:?}: {opened} connections for 20 calls at once"
            );
        }
    }
}

/// A contract that says HTTP/2 against a provider that speaks only HTTP/1.1 (an operator's
/// mistake): no request reaches it, and the create fails at once, not after its timeout.
#[tokio::test]
async fn http2_against_a_provider_that_speaks_only_http1_fails_at_once() {
    let h = harness_over("sim", HttpVersion::Http2, true).await;
    let op = h.op(serde_json::json!({})).await;
    let t0 = std::time::Instant::now();
    let c = h.provider.create(&op, 1.into()).await;
    assert!(
        t0.elapsed() < h.provider.contract().request_timeout,
        "failed only at its timeout: {:?}",
        t0.elapsed()
    );
    // The request's bytes may have left: whether it was read is not ours to know, so the create is
    // ambiguous (reconciled, never resent blind), never an answer.
    assert_eq!(
        c.outcome,
        CreateOutcome::Ambiguous {
            error_class: "connection_lost".into()
        }
    );
    assert!(c.call.http_status.is_none(), "{:?}", c.call);
    assert_eq!(h.sim.ledger().requests, 0);
    assert!(h.sim.ledger().connections >= 1);
}

#[tokio::test]
async fn a_provider_that_is_down_means_nothing_was_sent() {
    let h = harness("sim").await;
    let op = h.op(serde_json::json!({})).await;
    let dead = HttpProvider::new(contract("sim", "http://127.0.0.1:1")).unwrap();
    assert_eq!(
        dead.create(&op, 1.into()).await.outcome,
        CreateOutcome::NotSent {
            error_class: "connect_failed".into()
        }
    );
    // A cancel that never left asked nothing of the job: "not now", not a spent attempt.
    let mut created = op.clone();
    created.remote_job_id = Some("job_1".into());
    created.state = jobtrail_core::State::CancelRequested;
    assert_eq!(
        dead.cancel(&created, 1.into()).await.outcome,
        CancelOutcome::NotSent {
            error_class: "connect_failed".into()
        }
    );
}

#[tokio::test]
async fn status_faults_and_retry_after_become_the_right_outcomes() {
    let h = harness("sim").await;
    let mut op = h
        .created(serde_json::json!({
            "never_finish": true,
            "poll_retry_after": 1,
            "status_faults": {"1": "malformed_json", "2": "missing_state", "3": "unknown_state", "4": "error_500", "5": "too_many_requests"},
            "progress": "bursty",
        }))
        .await;
    let mut outcomes = Vec::new();
    for n in 1..=6 {
        outcomes.push(h.provider.status(&op, n.into()).await.outcome);
    }
    assert_eq!(
        outcomes[0],
        StatusOutcome::Failed {
            error_class: "malformed_json".into()
        }
    );
    assert_eq!(
        outcomes[1],
        StatusOutcome::Failed {
            error_class: "missing_state".into()
        }
    );
    match &outcomes[2] {
        StatusOutcome::Observed(s) => {
            assert_eq!(s.remote_state, "warming_up");
            assert_eq!(
                s.phase, None,
                "an unknown state is recorded as such, never guessed"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        outcomes[3],
        StatusOutcome::Failed {
            error_class: "http_500".into()
        }
    );
    assert!(
        matches!(outcomes[4], StatusOutcome::RetryLater { delay: Some(d), .. } if d == Duration::from_secs(1))
    );
    match &outcomes[5] {
        StatusOutcome::Observed(s) => {
            assert!(matches!(s.phase, Some(Phase::Queued | Phase::Running)));
            assert_eq!(s.retry_after, Some(Duration::from_secs(1)));
            assert!(s.progress.is_some());
        }
        other => panic!("{other:?}"),
    }

    // Retry-After as an HTTP-date on status.
    op = h.created(serde_json::json!({"never_finish": true, "poll_retry_after": 2, "poll_retry_after_as_date": true})).await;
    match h.provider.status(&op, 1.into()).await.outcome {
        StatusOutcome::Observed(s) => {
            let d = s.retry_after.expect("an HTTP-date Retry-After");
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
                "{d:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A provider behind a path prefix (`http://host/gateway`) names its URLs as absolute paths that
/// carry the prefix (`/gateway/v1/jobs/1`): they are resolved against the request they answered
/// (RFC 3986), not put under the base URL's path a second time, while the contract's own paths
/// (`/v1/jobs`) still extend it. Status URLs from a body, a header and a moving monitor, a result
/// URL from a status body, and OGC's `Location`.
#[tokio::test]
async fn urls_a_provider_names_under_a_path_prefix_are_resolved_not_nested() {
    let prefixed = || jobtrail_sim::Config {
        path_prefix: "/gateway/api".into(),
        ..Default::default()
    };
    let h = harness_with(prefixed(), |base| contract("sim", base)).await;
    let base = h.sim.base_url();
    assert!(base.ends_with("/gateway/api"), "{base}");
    for script in [
        serde_json::json!({"duration_ms": 300}),
        serde_json::json!({"duration_ms": 400, "moving_status_url": true}),
        serde_json::json!({"duration_ms": 300, "status_via_header": true}),
    ] {
        let mut op = h.created(script.clone()).await;
        let job = op.remote_job_id.clone().unwrap();
        let followed = op.status_url.clone().unwrap();
        assert!(
            followed.starts_with(&format!("{base}/v1/")),
            "{script}: {followed}"
        );
        let end = h.poll_to_end(&mut op).await;
        assert_eq!(end.phase, Some(Phase::Succeeded), "{script}");
        assert_eq!(
            end.hints.result_url.as_deref(),
            Some(format!("{base}/v1/jobs/{job}/result").as_str()),
            "{script}"
        );
        let r = h.provider.fetch_result(&op, 1.into()).await;
        let ResultOutcome::Fetched(f) = r.outcome else {
            panic!("{script}: {:?}", r.outcome)
        };
        assert!(
            matches!(h.provider.check_result(&op, &f), Checked::Valid { .. }),
            "{script}"
        );
        let paths = &h.sim.ledger().jobs[&job].status_paths;
        assert!(
            !paths.is_empty(),
            "{script}: no status read reached the job"
        );
    }

    let h = harness_with(prefixed(), ogc_contract).await;
    let base = h.sim.base_url();
    let mut op = h
        .created(serde_json::json!({"protocol": "ogc", "duration_ms": 300}))
        .await;
    // The job is known by its `Location` as given; it is called where that resolves.
    let job = op.remote_job_id.clone().unwrap();
    assert!(job.starts_with("/gateway/api/jobs/"), "{job}");
    assert_eq!(
        op.status_url.as_deref(),
        Some(format!("http://{}{job}", h.sim.addr).as_str())
    );
    assert!(base.ends_with("/gateway/api"));
    let end = h.poll_to_end(&mut op).await;
    assert_eq!(end.phase, Some(Phase::Succeeded));
    let r = h.provider.fetch_result(&op, 1.into()).await;
    assert!(
        matches!(r.outcome, ResultOutcome::Fetched(_)),
        "{:?}",
        r.outcome
    );
}

/// An OGC server that answers 200 for an asynchronous job, its statusInfo as the body: a job to
/// follow, not the finished result (kept as the result, the job would run on unwatched and
/// uncancellable, and its statusInfo checked as the result).
#[tokio::test]
async fn an_ogc_job_answered_200_with_its_status_info_is_followed() {
    let h = harness_with(jobtrail_sim::Config::default(), ogc_contract).await;
    let op = h
        .op(serde_json::json!({"protocol": "ogc", "duration_ms": 300, "create": ["status_info_as_200"]}))
        .await;
    let c = h.provider.create(&op, 1.into()).await;
    let CreateOutcome::Accepted { job_id, .. } = &c.outcome else {
        panic!("an accepted job read as {:?}", c.outcome)
    };
    assert!(job_id.ends_with(&format!("/jobs/{}", job_id.rsplit('/').next().unwrap())));
    assert!(
        h.sim
            .ledger()
            .jobs
            .contains_key(job_id.rsplit('/').next().unwrap())
    );

    // Its statusInfo saying `successful` is still a status document, not the results: the job is
    // followed, and its results are read where the job says.
    let mut op = h
        .created(serde_json::json!({"protocol": "ogc", "duration_ms": 0, "create": ["successful_status_info_as_200"]}))
        .await;
    let end = h.poll_to_end(&mut op).await;
    assert_eq!(end.phase, Some(Phase::Succeeded));
    let r = h.provider.fetch_result(&op, 1.into()).await;
    let ResultOutcome::Fetched(f) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert!(
        matches!(h.provider.check_result(&op, &f), Checked::Valid { .. }),
        "the results, not the statusInfo"
    );

    // A synchronous execution (200 with the results document) is still the finished job.
    let op = h
        .op(serde_json::json!({"protocol": "ogc", "create": ["sync"]}))
        .await;
    let c = h.provider.create(&op, 1.into()).await;
    assert!(
        matches!(c.outcome, CreateOutcome::Completed { .. }),
        "{:?}",
        c.outcome
    );
}

/// An OGC API – Processes contract: the job is known by the `Location` its create answers.
fn ogc_contract(base: &str) -> Contract {
    let text = format!(
        r#"
protocol = "ogc-processes"
name = "ogc"
base_url = "{base}"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/processes/{{target}}/execution"
idempotency = "header"
idempotency_header = "Idempotency-Key"
[result]
content_type = "application/json"
items = "/items"
"#
    );
    Contract::parse(&text, Path::new("ogc.toml")).unwrap()
}

/// A job known only by its status URL, and that URL long (a gateway's deep path): accepted and
/// followed, not refused as a job id longer than a URL may be.
#[tokio::test]
async fn a_job_known_by_a_long_status_url_is_followed() {
    let deep = jobtrail_sim::Config {
        path_prefix: format!("/{}", "segment/".repeat(250).trim_end_matches('/')),
        ..Default::default()
    };
    let h = harness_with(deep, ogc_contract).await;
    let mut op = h
        .created(serde_json::json!({"protocol": "ogc", "duration_ms": 300}))
        .await;
    let job = op.remote_job_id.clone().expect("the create was accepted");
    assert!(job.len() > 2000, "{}", job.len());
    let end = h.poll_to_end(&mut op).await;
    assert_eq!(end.phase, Some(Phase::Succeeded));
}

#[tokio::test]
async fn failing_jobs_moving_status_urls_and_cookies() {
    let h = harness("sim").await;
    let mut op = h
        .created(serde_json::json!({"duration_ms": 200, "outcome": "failed"}))
        .await;
    let end = h.poll_to_end(&mut op).await;
    assert_eq!(end.phase, Some(Phase::Failed));
    assert!(end.error.is_some());

    // The provider names a new status URL every poll; the adapter follows it.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 400, "moving_status_url": true}))
        .await;
    h.poll_to_end(&mut op).await;
    let job = op.remote_job_id.clone().unwrap();
    let paths = &h.sim.ledger().jobs[&job].status_paths;
    assert!(
        paths.iter().any(|p| p.starts_with("/v1/operations/")),
        "{paths:?}"
    );

    // A session cookie set at create is kept per operation, in a real cookie store, and sent back
    // where its domain, path and expiry say: not the one scoped to another path, not the expired one.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 200, "require_cookie": true}))
        .await;
    assert!(
        op.provider_context["cookie_jar"]
            .as_str()
            .is_some_and(|j| j.contains("sim_session")),
        "{}",
        op.provider_context
    );
    h.poll_to_end(&mut op).await;
    let job = &h.sim.ledger().jobs[op.remote_job_id.as_ref().unwrap()];
    assert!(job.cookie_seen >= 1);
    for sent in &job.cookie_headers {
        assert!(
            !sent.contains("sim_scoped") && !sent.contains("sim_expired"),
            "{sent}"
        );
    }
}

#[tokio::test]
async fn cancel_confirmed_ignored_and_lost_race() {
    let h = harness("sim").await;
    let mut op = h
        .created(
            serde_json::json!({"never_finish": true, "cancel": "confirm", "cancel_delay_ms": 100}),
        )
        .await;
    assert!(matches!(
        h.provider.cancel(&op, 1.into()).await.outcome,
        CancelOutcome::Accepted { .. }
    ));
    assert_eq!(h.poll_to_end(&mut op).await.phase, Some(Phase::Cancelled));

    let op = h
        .created(serde_json::json!({"never_finish": true, "cancel": "ignore"}))
        .await;
    assert!(matches!(
        h.provider.cancel(&op, 1.into()).await.outcome,
        CancelOutcome::Accepted { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    match h.provider.status(&op, 1.into()).await.outcome {
        StatusOutcome::Observed(s) => assert_eq!(s.phase, Some(Phase::Running)),
        other => panic!("{other:?}"),
    }

    let mut op = h
        .created(serde_json::json!({"never_finish": true, "cancel": "lose_race"}))
        .await;
    assert!(matches!(
        h.provider.cancel(&op, 1.into()).await.outcome,
        CancelOutcome::Accepted { .. }
    ));
    assert_eq!(h.poll_to_end(&mut op).await.phase, Some(Phase::Succeeded));
    // Cancelling a finished job is refused; polling tells the truth.
    assert!(matches!(
        h.provider.cancel(&op, 2.into()).await.outcome,
        CancelOutcome::Rejected {
            http_status: Some(409),
            ..
        }
    ));
}

/// A download of the URL the status named that is refused (a pre-signed URL past its time answers
/// 403; some stores 404) is remembered, and the next attempt reads the status again for a fresh URL
/// instead of the dead one. The same URL named again after a 404 is a result that is gone.
#[tokio::test]
async fn a_refused_result_url_is_asked_of_the_status_again() {
    let h = harness("sim").await;
    let refused_mark = |op: &OperationRecord| {
        op.provider_context["result"]
            .get("refused")
            .map(|r| r["status"].clone())
    };
    let take = |op: &mut OperationRecord, ctx: Option<serde_json::Value>| {
        if let Some(c) = ctx {
            op.provider_context = c;
        }
    };

    // Signed URLs: the first one named has expired; the status names a new one on each read.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result_urls_expired": 1}))
        .await;
    h.poll_to_end(&mut op).await;
    let first_url = op.provider_context["result"]["result_url"].clone();
    assert!(
        first_url.as_str().is_some_and(|u| u.ends_with("?sig=1")),
        "{first_url}"
    );
    let r = h.provider.fetch_result(&op, 1.into()).await;
    assert_eq!(r.call.kind, CallKind::Result);
    assert_eq!(
        r.outcome,
        ResultOutcome::Failed {
            error_class: "http_403".into()
        }
    );
    take(&mut op, r.context);
    assert_eq!(refused_mark(&op), Some(serde_json::json!(403)));
    // The next attempt is a status read, not the dead URL again.
    let r = h.provider.fetch_result(&op, 2.into()).await;
    assert_eq!(r.call.kind, CallKind::Status, "{:?}", r.call);
    assert!(
        matches!(&r.outcome, ResultOutcome::Renewed { fresh: true, seen } if seen.phase == Some(Phase::Succeeded)),
        "{:?}",
        r.outcome
    );
    take(&mut op, r.context);
    assert_eq!(
        refused_mark(&op),
        None,
        "the mark goes with the URL it was about"
    );
    let fresh_url = op.provider_context["result"]["result_url"].clone();
    assert!(
        fresh_url.as_str().is_some_and(|u| u.ends_with("?sig=2")),
        "{fresh_url}"
    );
    let r = h.provider.fetch_result(&op, 3.into()).await;
    assert_eq!(r.call.kind, CallKind::Result);
    assert!(
        matches!(r.outcome, ResultOutcome::Fetched(_)),
        "{:?}",
        r.call
    );

    // Gone (404), and the status names the same URL again: unavailable, after one status read.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result": "gone"}))
        .await;
    h.poll_to_end(&mut op).await;
    let r = h.provider.fetch_result(&op, 1.into()).await;
    assert_eq!(
        r.outcome,
        ResultOutcome::Failed {
            error_class: "result_url_refused".into()
        }
    );
    assert!(r.call.outcome.contains("result expired"), "{:?}", r.call);
    take(&mut op, r.context);
    assert_eq!(refused_mark(&op), Some(serde_json::json!(404)));
    let r = h.provider.fetch_result(&op, 2.into()).await;
    assert_eq!(r.call.kind, CallKind::Status);
    // The provider's words on the refused download are the reason given in the end.
    assert!(
        matches!(
            &r.outcome,
            ResultOutcome::Unavailable {
                http_status: Some(404),
                reason,
            } if reason.contains("result expired") && reason.contains("names no other place")
        ),
        "{:?}",
        r.outcome
    );
    take(&mut op, r.context);
    assert_eq!(refused_mark(&op), None);

    // Gone (404) behind URLs signed anew on each read: the status names another URL each time,
    // but the same place (its signature aside): unavailable, not the budget spent going round.
    let mut op = h
        .created(
            serde_json::json!({"duration_ms": 100, "result": "gone", "result_urls_expired": 1}),
        )
        .await;
    h.poll_to_end(&mut op).await;
    for (n, kind) in [
        (1, CallKind::Result),
        (2, CallKind::Status),
        (3, CallKind::Result),
    ] {
        let r = h.provider.fetch_result(&op, n.into()).await;
        assert_eq!(r.call.kind, kind, "{n}: {:?}", r.call);
        take(&mut op, r.context);
    }
    assert_eq!(refused_mark(&op), Some(serde_json::json!(404)));
    let r = h.provider.fetch_result(&op, 4.into()).await;
    assert!(
        matches!(
            r.outcome,
            ResultOutcome::Unavailable {
                http_status: Some(404),
                ..
            }
        ),
        "{:?}",
        r.outcome
    );

    // The status read for a fresh URL fails, or says "not now": the mark stays, and the next
    // attempt asks the status again (never the dead URL).
    let mut op = h
        .created(
            serde_json::json!({"duration_ms": 50, "result_urls_expired": 1,
            "status_faults": {"2": "error_500", "3": "too_many_requests"}}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.poll_to_end(&mut op).await;
    let job = op.remote_job_id.clone().unwrap();
    assert_eq!(
        h.sim.ledger().jobs[&job].calls.get("status"),
        Some(&1),
        "one read to the end"
    );
    let r = h.provider.fetch_result(&op, 1.into()).await;
    take(&mut op, r.context);
    for (n, expect) in [(2, "Failed"), (3, "RetryLater"), (4, "Renewed")] {
        let r = h.provider.fetch_result(&op, n.into()).await;
        assert_eq!(r.call.kind, CallKind::Status, "{n}");
        assert!(
            format!("{:?}", r.outcome).starts_with(expect),
            "{n}: {:?}",
            r.outcome
        );
        take(&mut op, r.context);
        assert_eq!(refused_mark(&op).is_some(), expect != "Renewed", "{n}");
    }
    assert!(matches!(
        h.provider.fetch_result(&op, 5.into()).await.outcome,
        ResultOutcome::Fetched(_)
    ));

    // A URL the contract builds (`result.url`) is as good as it gets: never renewed.
    let templated = harness_with(jobtrail_sim::Config::default(), |base| {
        let mut c = contract("sim", base);
        c.result.as_mut().unwrap().url = Some("/v1/jobs/{job_id}/result".into());
        c
    })
    .await;
    let mut op = templated
        .created(serde_json::json!({"duration_ms": 100, "result_urls_expired": 1}))
        .await;
    templated.poll_to_end(&mut op).await;
    for n in 1..=2 {
        let r = templated.provider.fetch_result(&op, n.into()).await;
        assert_eq!(r.call.kind, CallKind::Result, "{n}");
        assert_eq!(
            r.outcome,
            ResultOutcome::Failed {
                error_class: "http_403".into()
            }
        );
        take(&mut op, r.context);
        assert_eq!(refused_mark(&op), None);
    }
}

#[tokio::test]
async fn results_that_fail_each_rule_are_caught() {
    let h = harness("sim").await;
    let verdict = |op: &OperationRecord, r: ResultOutcome| match r {
        ResultOutcome::Fetched(f) => match h.provider.check_result(op, &f) {
            Checked::Valid { summary, .. } => Ok(summary),
            Checked::Invalid { violations } => Err(violations.join("; ")),
        },
        other => Err(format!("{other:?}")),
    };
    for (result, expect) in [
        ("bad_checksum", "checksum"),
        ("wrong_content_type", "content type"),
        ("schema_violation", "schema"),
    ] {
        let mut op = h
            .created(serde_json::json!({"duration_ms": 100, "result": result}))
            .await;
        h.poll_to_end(&mut op).await;
        let r = h.provider.fetch_result(&op, 1.into()).await.outcome;
        let err = verdict(&op, r).expect_err(result);
        assert!(err.contains(expect), "{result}: {err}");
    }

    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result": "oversized"}))
        .await;
    h.poll_to_end(&mut op).await;
    assert_eq!(
        h.provider.fetch_result(&op, 1.into()).await.outcome,
        ResultOutcome::TooLarge { limit: 1024 * 1024 }
    );

    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result": "fails"}))
        .await;
    h.poll_to_end(&mut op).await;
    assert_eq!(
        h.provider.fetch_result(&op, 1.into()).await.outcome,
        ResultOutcome::Failed {
            error_class: "http_500".into()
        }
    );

    // A 403 (a pre-signed URL expired) is no result gone: a failure, to be read again.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result_forbidden": 1}))
        .await;
    h.poll_to_end(&mut op).await;
    assert_eq!(
        h.provider.fetch_result(&op, 1.into()).await.outcome,
        ResultOutcome::Failed {
            error_class: "http_403".into()
        }
    );
    assert!(matches!(
        h.provider.fetch_result(&op, 2.into()).await.outcome,
        ResultOutcome::Fetched(_)
    ));

    // A partial batch is valid, with the failed items named in the summary.
    let mut op = h
        .created(serde_json::json!({"duration_ms": 100, "result": "partial_batch", "items": 5}))
        .await;
    h.poll_to_end(&mut op).await;
    let summary = verdict(&op, h.provider.fetch_result(&op, 1.into()).await.outcome).unwrap();
    assert_eq!(summary["items"]["failed"], 2);
    assert_eq!(
        summary["items"]["failed_refs"],
        serde_json::json!(["item_2", "item_4"])
    );
}

/// A count the status answer gives in another form is read when it is a whole number (`"5"`,
/// `5.0`) and refused when it is not: before, an unreadable count (or checksum) was skipped and
/// the result checked without it, the record saying none was given.
#[tokio::test]
async fn a_count_in_another_form_is_read_or_the_result_refused() {
    let h = harness("sim").await;
    for (written, valid) in [
        (serde_json::json!("5"), true),
        (serde_json::json!(5.0), true),
        (serde_json::json!("4"), false),
        (serde_json::json!({"n": 5}), false),
        (serde_json::json!(5.5), false),
        (serde_json::json!(-5), false),
    ] {
        let mut op = h
            .created(
                serde_json::json!({"duration_ms": 100, "items": 5, "expected_items_as": written}),
            )
            .await;
        h.poll_to_end(&mut op).await;
        let ResultOutcome::Fetched(f) = h.provider.fetch_result(&op, 1.into()).await.outcome else {
            panic!("{written}: no result fetched");
        };
        match h.provider.check_result(&op, &f) {
            Checked::Valid { checks, summary } => {
                assert!(valid, "{written}: taken: {summary}");
                assert!(
                    checks.iter().any(|c| c == "count=5"),
                    "{written}: {checks:?}"
                );
            }
            Checked::Invalid { violations } => {
                assert!(!valid, "{written}: refused: {violations:?}");
                let v = violations.join("; ");
                assert!(
                    v.contains("expected") || v.contains("count"),
                    "{written}: {v}"
                );
            }
        }
    }
}

/// An idempotency key that cannot be a header value (a row edited since submit) is never dropped
/// from the create: sent without it, a resend could make a second paid job. Nothing is sent.
#[tokio::test]
async fn a_create_whose_key_cannot_be_a_header_is_not_sent_without_it() {
    let h = harness("sim").await;
    let mut op = h.op(serde_json::json!({})).await;
    op.token = IdempotencyToken::from_stored("idem_\r\nX-Injected: 1".into());
    let before = h.sim.ledger().requests;
    let called = h.provider.create(&op, 1.into()).await;
    assert_eq!(
        called.outcome,
        CreateOutcome::NotSent {
            error_class: "token_unsendable".into()
        }
    );
    assert_eq!(
        h.sim.ledger().requests,
        before,
        "the provider heard from us"
    );
}

/// A request body edited on the row after it was submitted (by a login with the schema's rights:
/// the fingerprint chained in the history still names the approved one) is never sent: the
/// create is not sent, and the provider sees nothing.
#[tokio::test]
async fn a_request_that_no_longer_matches_its_fingerprint_is_not_sent() {
    let h = harness("sim").await;
    let mut op = h.op(serde_json::json!({})).await;
    op.request_body["report"] = serde_json::json!("payroll");
    let before = h.sim.ledger().requests;
    let called = h.provider.create(&op, 1.into()).await;
    assert_eq!(
        called.outcome,
        CreateOutcome::NotSent {
            error_class: "request_altered".into()
        }
    );
    assert!(
        called.call.outcome.contains("fingerprint"),
        "{}",
        called.call.outcome
    );
    assert_eq!(
        h.sim.ledger().requests,
        before,
        "the provider heard from us"
    );
    // The same operation, as submitted, is sent.
    let op = h.op(serde_json::json!({})).await;
    assert!(matches!(
        h.provider.create(&op, 1.into()).await.outcome,
        CreateOutcome::Accepted { .. }
    ));
}

#[tokio::test]
async fn csv_rows_that_say_error_fail_the_result() {
    let h = harness("sim-csv").await;
    let mut op = h.created(serde_json::json!({"duration_ms": 100, "format": "csv", "result": "error_rows", "items": 4})).await;
    h.poll_to_end(&mut op).await;
    let ResultOutcome::Fetched(f) = h.provider.fetch_result(&op, 1.into()).await.outcome else {
        panic!()
    };
    match h.provider.check_result(&op, &f) {
        Checked::Invalid { violations } => assert!(
            violations.iter().any(|v| v.contains("2 items failed")),
            "{violations:?}"
        ),
        other => panic!("{other:?}"),
    }
    let mut ok = h
        .created(serde_json::json!({"duration_ms": 100, "format": "csv", "items": 4}))
        .await;
    h.poll_to_end(&mut ok).await;
    let ResultOutcome::Fetched(f) = h.provider.fetch_result(&ok, 1.into()).await.outcome else {
        panic!()
    };
    assert!(matches!(
        h.provider.check_result(&ok, &f),
        Checked::Valid { .. }
    ));
}

#[tokio::test]
async fn lookup_by_client_reference_finds_the_job() {
    let h = harness("sim").await;
    let op = h.created(serde_json::json!({"never_finish": true})).await;
    match h.provider.lookup(&op, 1.into()).await.outcome {
        LookupOutcome::Found { job_ids } => {
            assert_eq!(job_ids, vec![op.remote_job_id.clone().unwrap()])
        }
        other => panic!("{other:?}"),
    }
    let never = h.op(serde_json::json!({})).await;
    assert_eq!(
        h.provider.lookup(&never, 1.into()).await.outcome,
        LookupOutcome::NotFound
    );
}

#[tokio::test]
async fn every_request_carries_the_operation_trace_id() {
    let h = harness("sim").await;
    let mut op = h.created(serde_json::json!({"duration_ms": 200})).await;
    h.poll_to_end(&mut op).await;
    h.provider.fetch_result(&op, 1.into()).await;
    h.provider.cancel(&op, 1.into()).await;
    h.provider.lookup(&op, 1.into()).await;
    let ledger = h.sim.ledger();
    let job = &ledger.jobs[op.remote_job_id.as_ref().unwrap()];
    for kind in ["create", "status", "result", "cancel", "lookup"] {
        assert!(
            job.calls.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} call recorded"
        );
    }
    assert_eq!(
        job.trace_ids.iter().cloned().collect::<Vec<_>>(),
        vec![op.trace_id.to_string()]
    );
    assert_eq!(ledger.requests_without_traceparent, 0);
}

#[tokio::test]
async fn a_missing_secret_means_nothing_is_sent_and_the_secret_is_never_named() {
    let h = harness("sim").await;
    let op = h.op(serde_json::json!({})).await;
    let mut c = contract("sim", &h.sim.base_url());
    c.auth.as_mut().unwrap().secret = SecretRef::Env("JOBTRAIL_TEST_UNSET_SECRET".into());
    let p = HttpProvider::new(c).unwrap();
    let called = p.create(&op, 1.into()).await;
    assert_eq!(
        called.outcome,
        CreateOutcome::NotSent {
            error_class: "secret_unresolved".into()
        }
    );
    assert!(called.call.outcome.contains("JOBTRAIL_TEST_UNSET_SECRET"));
    assert_eq!(h.sim.ledger().requests, 0);
}

/// Request values placed into a URL: a string or number as one encoded path segment (a hostile
/// `../..` cannot move the request), and a value that is missing or not a scalar leaves the call
/// unsent rather than sent somewhere else.
#[tokio::test]
async fn request_values_in_a_url_are_one_segment_or_the_call_is_not_sent() {
    let h = harness("sim").await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../providers");
    let text = std::fs::read_to_string(dir.join("sim.toml"))
        .unwrap()
        .replacen(
            "path = \"/v1/jobs\"",
            "path = \"/v1/{request:/collection}\"",
            1,
        );
    let mut c = Contract::parse(&text, &dir.join("sim.toml")).unwrap();
    c.base_url = url::Url::parse(&h.sim.base_url()).unwrap();
    let provider = HttpProvider::new(c).unwrap();
    let op_with = |collection: Option<serde_json::Value>| {
        let mut terms = std::collections::BTreeMap::new();
        terms.insert("sim".to_owned(), provider.contract().terms());
        let mut body = serde_json::json!({"report": "usage", "sim": {"never_finish": true}});
        if let Some(v) = collection {
            body["collection"] = v;
        }
        let s = Submission {
            provider: "sim".into(),
            target: "reports".into(),
            body: serde_json::to_vec(&body).unwrap(),
            caller: "test".into(),
            approved_by: "tester".into(),
            ..Default::default()
        };
        let store = h.store.clone();
        async move {
            store
                .submit_new(&s, &terms, SubmitLimits::default())
                .await
                .unwrap()
                .operation
        }
    };

    // The value names the collection: the create reaches it.
    let op = op_with(Some("jobs".into())).await;
    let c = provider.create(&op, 1.into()).await;
    assert!(
        matches!(c.outcome, CreateOutcome::Accepted { .. }),
        "{:?}",
        c.outcome
    );
    assert!(c.call.url.ends_with("/v1/jobs"), "{}", c.call.url);

    // A hostile value stays one segment: nothing but a 404 from the simulator.
    let before = h.sim.ledger().jobs.len();
    let op = op_with(Some("../_sim/ledger?x=".into())).await;
    let c = provider.create(&op, 1.into()).await;
    assert!(
        c.call.url.ends_with("/v1/..%2F_sim%2Fledger%3Fx%3D"),
        "{}",
        c.call.url
    );
    assert_eq!(c.call.http_status, Some(404));
    assert_eq!(h.sim.ledger().jobs.len(), before);

    // Missing, null, not a scalar, empty or all dots: nothing is sent, and the create is known
    // never to have left.
    let before = h.sim.ledger().requests;
    for value in [
        None,
        Some(serde_json::Value::Null),
        Some(serde_json::json!({"a": 1})),
        Some(serde_json::json!([1])),
        Some(serde_json::json!(true)),
        Some("..".into()),
        Some(".".into()),
        Some("".into()),
    ] {
        let op = op_with(value.clone()).await;
        let c = provider.create(&op, 1.into()).await;
        assert!(
            matches!(c.outcome, CreateOutcome::NotSent { .. }),
            "{value:?}: {:?}",
            c.outcome
        );
        assert_eq!(
            c.call.error_class.as_deref(),
            Some("call_not_built"),
            "{value:?}"
        );
    }
    assert_eq!(h.sim.ledger().requests, before, "no request left");
}

/// A later call scrubs the operation's own secrets from whatever the provider answers; a secret
/// that can no longer be read (rotated, removed) could not be scrubbed, so the call is not sent at
/// all (tried again later) rather than sent with its answer unscrubbed. A grant narrowed since
/// stops the create (where the secret is sent), never the watching of a job already made.
#[tokio::test]
async fn a_call_whose_secrets_cannot_be_read_to_scrub_is_not_sent() {
    let h = harness("sim").await;
    // SAFETY: the only test in this binary that reads or sets it.
    unsafe { std::env::set_var("JOBTRAIL_SIM_CARD", "4111-1111-1111-1111") };
    let mut op = h
        .op_with_body(serde_json::json!({
            "report": "usage", "payment": {"card_number": {"$secret": "customer_card"}},
            "sim": {"never_finish": true},
        }))
        .await;
    match h.provider.create(&op, 1.into()).await.outcome {
        CreateOutcome::Accepted { job_id, .. } => op.remote_job_id = Some(job_id),
        other => panic!("create: {other:?}"),
    }
    assert!(matches!(
        h.provider.status(&op, 1.into()).await.outcome,
        StatusOutcome::Observed(_)
    ));

    let mut c = contract("sim", &h.sim.base_url());
    c.secrets.get_mut("customer_card").unwrap().from =
        SecretRef::Env("JOBTRAIL_TEST_UNSET_CARD".into());
    let p = HttpProvider::new(c).unwrap();
    let before = h.sim.ledger().requests;
    let called = p.status(&op, 2.into()).await;
    assert!(
        matches!(called.outcome, StatusOutcome::Failed { .. }),
        "{:?}",
        called.outcome
    );
    assert!(
        called.call.outcome.contains("could not be read"),
        "{}",
        called.call.outcome
    );
    assert!(!called.call.outcome.contains("4111"));
    assert_eq!(h.sim.ledger().requests, before, "nothing sent");

    // A request a person edited on retry is theirs too: every create sent checks their grant as well as
    // the caller's, so a grant narrowed to the caller since the retry sends nothing.
    let mut c = contract("sim", &h.sim.base_url());
    c.secrets.get_mut("customer_card").unwrap().grant.callers = Some(vec!["test".into()]);
    let narrowed = HttpProvider::new(c).unwrap();
    let mut edited = h
        .op_with_body(serde_json::json!({
            "report": "usage", "payment": {"card_number": {"$secret": "customer_card"}},
            "sim": {"never_finish": true},
        }))
        .await;
    edited.edited_by = Some("mallory".into());
    let before = h.sim.ledger().requests;
    let called = narrowed.create(&edited, 1.into()).await;
    assert!(
        matches!(called.outcome, CreateOutcome::NotSent { .. }),
        "{:?}",
        called.outcome
    );
    assert!(
        called
            .call
            .outcome
            .contains("no longer granted to \"mallory\", who edited the request"),
        "{}",
        called.call.outcome
    );
    assert_eq!(h.sim.ledger().requests, before, "nothing sent");
    // Read only to be scrubbed (never sent), the secret's value is still had under the narrowed
    // grant: an answer quoting it is still scrubbed.
    let narrowed_contract = narrowed.contract();
    let (_, values) = jobtrail_provider::wire::resolve_body_secrets(
        &edited.request_body,
        &narrowed_contract.redact,
        &narrowed_contract.secrets,
        None,
    )
    .await
    .unwrap();
    assert_eq!(values.len(), 1, "the card, to scrub");
    // A job already made is still watched (its secrets read only to be scrubbed, never sent).
    edited.remote_job_id = op.remote_job_id.clone();
    let called = narrowed.status(&edited, 1.into()).await;
    assert!(
        matches!(called.outcome, StatusOutcome::Observed(_)),
        "{:?}",
        called.call
    );
    // The caller's own request (nobody edited it) is sent under the caller's grant.
    edited.edited_by = None;
    edited.remote_job_id = None;
    assert!(matches!(
        narrowed.create(&edited, 1.into()).await.outcome,
        CreateOutcome::Accepted { .. }
    ));
}

/// Serve `app` on a port of its own on 127.0.0.1: its address, and the server's task.
async fn serve_router(
    app: axum::Router,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (
        addr,
        tokio::spawn(async move { axum::serve(listener, app).await }),
    )
}

/// A provider on 127.0.0.1 that answers GETs of `route` with whatever JSON the test puts in the
/// returned cell (its address, the cell, the server's task).
async fn stub_provider(
    route: &str,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<String>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let answer = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let app = axum::Router::new().route(
        route,
        axum::routing::get({
            let answer = answer.clone();
            move || {
                let body = answer.lock().unwrap().clone();
                async move { ([("content-type", "application/json")], body) }
            }
        }),
    );
    let (addr, server) = serve_router(app).await;
    (addr, answer, server)
}

/// A lookup's answer says "none of ours" only when it is a readable, empty list: "none found"
/// lets a second job be created. A provider that ignored the filter and listed only another's job,
/// or a job naming no reference, is no answer; one
/// that listed ours twice, one with a numeric id, and answers with no list or a listed job without
/// an id, each over real HTTP from a provider on 127.0.0.1.
#[tokio::test]
async fn a_lookup_answer_that_is_no_clear_list_of_our_jobs_is_no_answer() {
    lookup_answers(true, |ours| {
        vec![
            // A list without any of ours: none found.
            (
                serde_json::json!({"jobs": []}),
                Some(LookupOutcome::NotFound),
            ),
            // A list of only others' jobs: the provider did not filter, and ours may be on its
            // next page. A listed job that names no reference may be ours.
            (
                serde_json::json!({"jobs": [{"job_id": "j-theirs", "client_reference": "op_someone_else"}]}),
                None,
            ),
            (serde_json::json!({"jobs": [{"job_id": "j-1"}]}), None),
            (
                serde_json::json!({"jobs": [{"job_id": "j-1", "client_reference": null}]}),
                None,
            ),
            // Ours beside a job that names no reference (made in the provider's console): ours.
            (
                serde_json::json!({"jobs": [{"job_id": "j-console"}, {"job_id": "j-1", "client_reference": ours}]}),
                Some(found(&["j-1"])),
            ),
            // Ours, once, whatever else is listed.
            (
                serde_json::json!({"jobs": [
                    {"job_id": "j-theirs", "client_reference": "op_someone_else"},
                    {"job_id": "j-1", "client_reference": ours},
                    {"job_id": "j-1", "client_reference": ours}]}),
                Some(found(&["j-1"])),
            ),
            (
                serde_json::json!({"jobs": [{"job_id": 123, "client_reference": ours}]}),
                Some(found(&["123"])),
            ),
            // No answer: no list, a list that is none, a job of ours without an id.
            (serde_json::json!({"items": []}), None),
            (serde_json::json!({"jobs": {"job_id": "j-1"}}), None),
            (
                serde_json::json!({"jobs": [{"client_reference": ours}]}),
                None,
            ),
            (
                serde_json::json!({"jobs": [{"job_id": {"id": "j-1"}, "client_reference": ours}]}),
                None,
            ),
        ]
    })
    .await;

    // A lookup that answers one job (no list): that job, when it is ours; anything else (another's,
    // an empty object from a broken gateway, `null`) is no answer, never "none found".
    lookup_answers(false, |ours| {
        vec![
            (
                serde_json::json!({"job_id": "j-1", "client_reference": ours}),
                Some(found(&["j-1"])),
            ),
            (
                serde_json::json!({"job_id": "j-theirs", "client_reference": "op_someone_else"}),
                None,
            ),
            (serde_json::json!({}), None),
            (serde_json::json!(null), None),
            (serde_json::json!([]), None),
        ]
    })
    .await;
}

/// A lookup found these jobs.
fn found(ids: &[&str]) -> LookupOutcome {
    LookupOutcome::Found {
        job_ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

/// Each answer `cases` gives (made for our reference) to a lookup by client reference, of a list
/// (`lookup_jobs`) or of one job, over real HTTP from a provider on 127.0.0.1, and what the lookup
/// must make of it: `Some` outcome, or `None` for no answer (`malformed_lookup`).
async fn lookup_answers(
    list: bool,
    cases: impl FnOnce(&str) -> Vec<(serde_json::Value, Option<LookupOutcome>)>,
) {
    let (addr, answer, server) = stub_provider("/v1/jobs").await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        if !list {
            c.reconcile.lookup_jobs = None;
        }
        c.reconcile.lookup_reference = Some("/client_reference".into());
        c
    })
    .await;
    let op = h.op(serde_json::json!({})).await;
    for (body, expected) in cases(&op.id.to_string()) {
        *answer.lock().unwrap() = body.to_string();
        let got = h.provider.lookup(&op, 1.into()).await.outcome;
        match expected {
            Some(e) => assert_eq!(got, e, "{body}"),
            None => assert!(
                matches!(&got, LookupOutcome::Failed { error_class } if error_class.starts_with("malformed_lookup")),
                "{body}: {got:?}"
            ),
        }
    }
    server.abort();
}

/// A lookup answered `429` with `Retry-After` (a provider that rate-limits its list endpoint) is
/// "not now" with the provider's wait, never a failure or "none found". Over real HTTP.
#[tokio::test]
async fn a_lookup_told_not_now_says_how_long_to_wait() {
    let app = axum::Router::new().route(
        "/v1/jobs",
        axum::routing::get(|| async {
            (
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "3"), ("content-type", "application/json")],
                r#"{"error": "slow down"}"#,
            )
        }),
    );
    let (addr, server) = serve_router(app).await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        contract("sim", &format!("http://{addr}"))
    })
    .await;
    let op = h.op(serde_json::json!({})).await;
    let got = h.provider.lookup(&op, 1.into()).await;
    assert_eq!(got.call.http_status, Some(429));
    match got.outcome {
        LookupOutcome::RetryLater { delay, .. } => {
            assert_eq!(delay, Some(std::time::Duration::from_secs(3)))
        }
        other => panic!("{other:?}"),
    }
    server.abort();
}

/// A lookup by path answers "none" with a 404; but where the contract's rules say what its 404s
/// mean (a gateway's page, a misrouted call), the rule decides, and an answer it calls ambiguous
/// is no "none found". Over real HTTP, from a provider on 127.0.0.1 that knows no such path.
#[tokio::test]
async fn a_lookup_404_is_none_found_unless_a_rule_says_otherwise() {
    use jobtrail_provider::contract::{CallName, Meaning, Rule};
    let (addr, _answer, server) = stub_provider("/elsewhere").await;
    for (ruled, none_found) in [(false, true), (true, false)] {
        let h = harness_with(jobtrail_sim::Config::default(), |_| {
            let mut c = contract("sim", &format!("http://{addr}"));
            if ruled {
                c.rules.insert(
                    0,
                    Rule {
                        calls: vec![CallName::Lookup],
                        status: vec![404],
                        body_contains: None,
                        means: Meaning::Ambiguous,
                    },
                );
            }
            c
        })
        .await;
        let op = h.op(serde_json::json!({})).await;
        let got = h.provider.lookup(&op, 1.into()).await;
        assert_eq!(got.call.http_status, Some(404));
        match got.outcome {
            LookupOutcome::NotFound if none_found => {}
            LookupOutcome::Failed { error_class } if !none_found => {
                assert_eq!(error_class, "http_404")
            }
            other => panic!("ruled {ruled}: {other:?}"),
        }
    }
    server.abort();
}

/// A status answer may be read up to the result's size where the result is read from it (Google's
/// Operation). Only what a status says is built from it: a megabyte of progress is kept cut, a
/// state inside a list is read without the list's other elements, and an answer that cannot be
/// read so (a list) is a failed read, never parsed whole on every poll (a list of small numbers
/// parsed takes some thirty times its text). Over real HTTP.
#[tokio::test]
async fn a_large_status_answer_is_read_for_what_a_status_says_only() {
    use jobtrail_provider::contract::ResultFrom;
    let (addr, answer, server) = stub_provider("/v1/jobs/{id}").await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.result.as_mut().unwrap().from = ResultFrom::Status;
        c.status.state.push("/jobs/0/state".into());
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    let zeros = "0,".repeat(150_000);
    *answer.lock().unwrap() = format!(r#"{{"jobs": [{{"state": "succeeded"}}, [{zeros}0]]}}"#);
    let (read, peak) = heap::peak_of(h.provider.status(&op, 3.into())).await;
    match read.outcome {
        StatusOutcome::Observed(s) => assert_eq!(s.remote_state, "succeeded"),
        other => panic!("{other:?}"),
    }
    // The 300 KB answer itself is held; its list of 150 000 numbers is not built (some 5 MB).
    assert!(peak < 2 << 20, "peak heap {peak} bytes");
    *answer.lock().unwrap() = format!(r#"{{"state": "running", "progress": [{zeros}0]}}"#);
    match h.provider.status(&op, 1.into()).await.outcome {
        StatusOutcome::Observed(s) => {
            assert_eq!(s.remote_state, "running");
            assert!(s.progress.unwrap().to_string().len() < 70_000, "kept cut");
        }
        other => panic!("{other:?}"),
    }
    *answer.lock().unwrap() = format!("[{zeros}0]");
    match h.provider.status(&op, 2.into()).await.outcome {
        StatusOutcome::Failed { error_class } => assert_eq!(error_class, "large_status_unreadable"),
        other => panic!("{other:?}"),
    }
    server.abort();
}

/// A rule that names no status codes never turns a create's 2xx (the job accepted) away: read as
/// refused the job would run unwatched, as "not now" it would be sent again. A rule that lists the
/// code does (a provider that answers its errors with a 2xx). Against the simulator, over HTTP.
#[tokio::test]
async fn a_rule_without_codes_never_turns_an_accepted_create_away() {
    use jobtrail_provider::contract::{CallName, Meaning, Rule};
    let rule = |means, status: Vec<u16>| Rule {
        calls: vec![CallName::Create],
        status,
        body_contains: Some("job_id".into()),
        means,
    };
    let mut code = 0;
    for means in [Meaning::Reject, Meaning::RetryLater] {
        let h = harness_with(jobtrail_sim::Config::default(), |base| {
            let mut c = contract("sim", base);
            c.rules.insert(0, rule(means, vec![]));
            c
        })
        .await;
        let op = h.op(serde_json::json!({})).await;
        let c = h.provider.create(&op, 1.into()).await;
        assert!(
            matches!(c.outcome, CreateOutcome::Accepted { .. }),
            "{means:?}: {:?}",
            c.outcome
        );
        code = c.call.http_status.unwrap() as u16;
    }
    let h = harness_with(jobtrail_sim::Config::default(), |base| {
        let mut c = contract("sim", base);
        c.rules.insert(0, rule(Meaning::Reject, vec![code]));
        c
    })
    .await;
    let op = h.op(serde_json::json!({})).await;
    let c = h.provider.create(&op, 1.into()).await;
    assert!(
        matches!(c.outcome, CreateOutcome::Rejected { .. }),
        "{:?}",
        c.outcome
    );
}

/// A result call's 2xx is kept unscrubbed, since it may be the result. One the contract's rules
/// call "not ready yet" or "no result" is not: its words become the recorded reason, so one that
/// quotes the bearer token is recorded without them, in the outcome and in the call log.
#[tokio::test]
async fn a_result_answer_a_rule_turns_away_is_never_quoted_with_a_credential_in_it() {
    use jobtrail_provider::contract::{CallName, Meaning, ResultFrom, Rule};
    let (addr, answer, server) = stub_provider("/v1/jobs/{id}").await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.result.as_mut().unwrap().from = ResultFrom::Status;
        for (needle, means) in [
            ("preparing", Meaning::RetryLater),
            ("refused", Meaning::Reject),
        ] {
            c.rules.push(Rule {
                calls: vec![CallName::Result],
                status: vec![200],
                body_contains: Some(needle.into()),
                means,
            });
        }
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.state = jobtrail_core::State::ResultCollecting;
    for word in ["preparing", "refused"] {
        *answer.lock().unwrap() =
            serde_json::json!({"state": word, "seen": {"authorization": format!("Bearer {SECRET}")}})
                .to_string();
        let r = h.provider.fetch_result(&op, 1.into()).await;
        let reason = match &r.outcome {
            ResultOutcome::RetryLater { reason, .. } if word == "preparing" => reason,
            ResultOutcome::Unavailable { reason, .. } if word == "refused" => reason,
            other => panic!("{word}: {other:?}"),
        };
        assert!(reason.contains("repeats a credential"), "{reason}");
        for recorded in [reason.as_str(), &r.call.outcome, &format!("{:?}", r.call)] {
            assert!(!recorded.contains(SECRET), "{word}: {recorded}");
        }
    }
    // Without the credential, the words are the reason, as for any answer turned away.
    *answer.lock().unwrap() = serde_json::json!({"state": "preparing"}).to_string();
    match h.provider.fetch_result(&op, 1.into()).await.outcome {
        ResultOutcome::RetryLater { reason, .. } => {
            assert!(reason.contains("preparing"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    server.abort();
}

/// A result is a whole representation, sent as it was made. A result URL that answers 202 (not
/// ready yet) is asked again after its `Retry-After`; a 204, a 206 nobody asked for or another 2xx
/// is no result; bytes sent with a content encoding nobody asked for are not the result either.
/// Kept, each would pass as valid wherever no checksum says otherwise. Over real HTTP from a
/// provider on 127.0.0.1.
#[tokio::test]
async fn a_result_answer_that_is_not_the_whole_result_is_not_kept() {
    use jobtrail_provider::contract::ResultFrom;
    type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);
    let answer: std::sync::Arc<std::sync::Mutex<Answer>> =
        std::sync::Arc::new(std::sync::Mutex::new((200, vec![], "")));
    let app = axum::Router::new().route(
        "/v1/jobs/{id}",
        axum::routing::get({
            let answer = answer.clone();
            move || {
                let (status, headers, body) = answer.lock().unwrap().clone();
                async move {
                    let mut r = axum::response::Response::new(axum::body::Body::from(body));
                    *r.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                    for (k, v) in headers {
                        r.headers_mut().append(k, v.parse().unwrap());
                    }
                    r
                }
            }
        }),
    );
    let (addr, server) = serve_router(app).await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.result.as_mut().unwrap().from = ResultFrom::Resource;
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.state = jobtrail_core::State::ResultCollecting;
    let whole = r#"{"state": "succeeded", "items": []}"#;
    let json = ("content-type", "application/json");
    for (status, headers, body, want) in [
        (200, vec![json], whole, "fetched"),
        (203, vec![json], whole, "fetched"),
        (
            200,
            vec![json, ("content-encoding", "identity")],
            whole,
            "fetched",
        ),
        (202, vec![json, ("retry-after", "7")], "", "retry after 7 s"),
        (204, vec![], "", "failed: http_204"),
        (
            206,
            vec![json, ("content-range", "bytes 0-9/36")],
            &whole[..10],
            "failed: http_206",
        ),
        (
            200,
            vec![json, ("content-encoding", "gzip")],
            whole,
            "failed: result_encoded",
        ),
        // A second header line is read too: a first `identity` does not hide the `gzip`.
        (
            200,
            vec![
                json,
                ("content-encoding", "identity"),
                ("content-encoding", "gzip"),
            ],
            whole,
            "failed: result_encoded",
        ),
        // So is a coding listed after another in one line.
        (
            200,
            vec![json, ("content-encoding", "identity, gzip")],
            whole,
            "failed: result_encoded",
        ),
        // Only a 404 or a 410 says the result is gone; another 4xx (an expired pre-signed URL's
        // 403, a CDN's 401) is read again within the failure budget.
        (404, vec![], "", "unavailable: 404"),
        (410, vec![], "", "unavailable: 410"),
        (403, vec![], "", "failed: http_403"),
        (401, vec![], "", "failed: http_401"),
        (409, vec![], "", "failed: http_409"),
    ] {
        *answer.lock().unwrap() = (status, headers, body);
        let r = h.provider.fetch_result(&op, 1.into()).await;
        let got = match &r.outcome {
            ResultOutcome::Fetched(f) => {
                assert_eq!(f.bytes, whole.as_bytes(), "{status}");
                "fetched".to_owned()
            }
            ResultOutcome::RetryLater { delay, .. } => {
                format!("retry after {} s", delay.unwrap_or_default().as_secs())
            }
            ResultOutcome::Failed { error_class } => format!("failed: {error_class}"),
            ResultOutcome::Unavailable {
                http_status: Some(s),
                ..
            } => format!("unavailable: {s}"),
            other => format!("{other:?}"),
        };
        assert_eq!(got, want, "{status}");
    }
    server.abort();
}

/// A rule that does not name the result call (`body_contains = "\"error\""`, written for status
/// answers, with or without codes) never judges a result's 2xx: its bytes are the job's output,
/// and `"error": null` in them is not the provider speaking; a rule naming the result call does.
/// Nor does such a rule make a success of a result call's error (`success` for a cancel's 409,
/// `already_exists` for a create's duplicate): the error would be kept as the result. Over real
/// HTTP from a provider on 127.0.0.1.
#[tokio::test]
async fn rules_meant_for_other_calls_never_judge_a_results_bytes() {
    use jobtrail_provider::contract::{CallName, Meaning, ResultFrom, Rule};
    let answer = std::sync::Arc::new(std::sync::Mutex::new((200u16, "")));
    let app = axum::Router::new().route(
        "/v1/jobs/{id}",
        axum::routing::get({
            let answer = answer.clone();
            move || {
                let (status, body) = *answer.lock().unwrap();
                async move {
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        [("content-type", "application/json")],
                        body,
                    )
                }
            }
        }),
    );
    let (addr, server) = serve_router(app).await;
    let error_rule = |calls| Rule {
        calls,
        status: vec![],
        body_contains: Some("\"error\"".into()),
        means: Meaning::Reject,
    };
    let duplicate = Rule {
        calls: vec![],
        status: vec![404],
        body_contains: None,
        means: Meaning::AlreadyExists,
    };
    // Written for status answers, for a provider that answers its errors with a 200.
    let error_200 = Rule {
        calls: vec![],
        status: vec![200],
        body_contains: Some("\"error\"".into()),
        means: Meaning::Reject,
    };
    // Written for cancels: "already cancelled".
    let cancelled_409 = Rule {
        calls: vec![],
        status: vec![409],
        body_contains: None,
        means: Meaning::Success,
    };
    let whole = r#"{"state": "succeeded", "error": null, "items": []}"#;
    let error = r#"{"error": "no such job"}"#;
    for (rules, status, body, kept) in [
        (vec![error_rule(vec![])], 200, whole, true),
        (vec![error_200], 200, whole, true),
        (vec![error_rule(vec![CallName::Status])], 200, whole, true),
        (vec![error_rule(vec![CallName::Result])], 200, whole, false),
        (vec![duplicate], 404, error, false),
        (vec![cancelled_409], 409, error, false),
    ] {
        *answer.lock().unwrap() = (status, body);
        let h = harness_with(jobtrail_sim::Config::default(), |_| {
            let mut c = contract("sim", &format!("http://{addr}"));
            c.result.as_mut().unwrap().from = ResultFrom::Resource;
            c.rules = rules;
            c
        })
        .await;
        let mut op = h.op(serde_json::json!({})).await;
        op.remote_job_id = Some("job_1".into());
        op.state = jobtrail_core::State::ResultCollecting;
        let r = h.provider.fetch_result(&op, 1.into()).await;
        assert_eq!(
            matches!(r.outcome, ResultOutcome::Fetched(_)),
            kept,
            "{status} {body}: {:?}",
            r.outcome
        );
    }
    server.abort();
}

/// A result read from the status document (or the resource) is that document read again: if it
/// no longer says the job succeeded (a provider gone back to "running", or a stale replica that
/// says "failed"), it is no result, and is read again within the failure budget; never kept as
/// one. A document that names no state, or one the contract does not map, says nothing against
/// the success already seen. Over real HTTP from a provider on 127.0.0.1.
#[tokio::test]
async fn a_status_read_for_the_result_that_no_longer_says_succeeded_is_no_result() {
    use jobtrail_provider::contract::ResultFrom;
    let (addr, answer, server) = stub_provider("/v1/jobs/{id}").await;
    for from in [ResultFrom::Status, ResultFrom::Resource] {
        let h = harness_with(jobtrail_sim::Config::default(), |_| {
            let mut c = contract("sim", &format!("http://{addr}"));
            c.result.as_mut().unwrap().from = from;
            c
        })
        .await;
        let mut op = h.op(serde_json::json!({})).await;
        op.remote_job_id = Some("job_1".into());
        op.state = jobtrail_core::State::ResultCollecting;
        for (body, kept) in [
            (serde_json::json!({"state": "running"}), false),
            (
                serde_json::json!({"state": "failed", "error": "late"}),
                false,
            ),
            (serde_json::json!({"state": "cancelled"}), false),
            (serde_json::json!({"state": "succeeded", "items": []}), true),
            (serde_json::json!({"items": []}), true),
            (serde_json::json!({"state": "archived", "items": []}), true),
        ] {
            *answer.lock().unwrap() = body.to_string();
            let r = h.provider.fetch_result(&op, 1.into()).await;
            match (&r.outcome, kept) {
                (ResultOutcome::Fetched(f), true) => assert_eq!(f.bytes, body.to_string()),
                (ResultOutcome::Failed { error_class }, false) => {
                    assert_eq!(error_class, "status_no_longer_succeeded")
                }
                (other, _) => panic!("{from:?} {body}: {other:?}"),
            }
        }
    }
    // Read at a URL the provider named, a status code the contract maps is the state, whatever
    // the body says (a resource's own "status" field), as a status read takes it.
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.result.as_mut().unwrap().from = ResultFrom::Status;
        c.status.codes.insert(200, Phase::Succeeded);
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.status_url = Some(format!("http://{addr}/v1/jobs/job_1"));
    op.state = jobtrail_core::State::ResultCollecting;
    *answer.lock().unwrap() = serde_json::json!({"state": "running"}).to_string();
    let r = h.provider.fetch_result(&op, 1.into()).await;
    assert!(
        matches!(r.outcome, ResultOutcome::Fetched(_)),
        "{:?}",
        r.outcome
    );
    // Where the contract says what a status without a state means (Google leaves `done` out while
    // it is false), a status document read for the result that names none is in that state, as a
    // status read takes it: running, no result. A created resource may name none after success.
    for (from, kept) in [(ResultFrom::Status, false), (ResultFrom::Resource, true)] {
        let h = harness_with(jobtrail_sim::Config::default(), |_| {
            let mut c = contract("sim", &format!("http://{addr}"));
            c.result.as_mut().unwrap().from = from;
            c.status.state_absent = Some("running".into());
            c
        })
        .await;
        let mut op = h.op(serde_json::json!({})).await;
        op.remote_job_id = Some("job_1".into());
        op.state = jobtrail_core::State::ResultCollecting;
        *answer.lock().unwrap() = serde_json::json!({"items": []}).to_string();
        match (h.provider.fetch_result(&op, 1.into()).await.outcome, kept) {
            (ResultOutcome::Fetched(_), true) => {}
            (ResultOutcome::Failed { error_class }, false) => {
                assert_eq!(error_class, "status_no_longer_succeeded")
            }
            (other, _) => panic!("{from:?}: {other:?}"),
        }
    }
    server.abort();
}

/// A hostile provider's answer costs a call what its bounds allow, not what parsing it whole would
/// (a JSON object of no keys takes some 640 bytes parsed for its 7 of text):
/// - an error answer to a result call (which no wire measure bounds: a result is kept as bytes)
///   repeating the key behind a JSON escape, among a megabyte of small values: scrubbed as JSON, it
///   was parsed whole to scrub it (some 90 MiB); now the whole body is replaced;
/// - a status-served result of that shape: read whole for its state, it was parsed whole.
///
/// And a result store the contract calls without credentials (pre-signed URLs) that serves the key
/// gets it into no record: the credential is resolved to scrub every call, sent or not.
#[tokio::test]
async fn a_flood_of_small_values_or_a_key_from_a_store_costs_and_leaks_nothing() {
    use axum::http::StatusCode;
    use jobtrail_provider::contract::ResultFrom;
    let flood = |tail: &str| format!("[{}{tail}]", r#"{"":0},"#.repeat(140_000));
    let escaped = format!("\\u0073{}", &SECRET[1..]);
    let store = axum::Router::new()
        .route(
            "/gone",
            axum::routing::get({
                let body = flood(&format!("\"{escaped}\""));
                move || async move { (StatusCode::NOT_FOUND, body) }
            }),
        )
        .route(
            "/echo",
            axum::routing::get(|| async {
                (
                    [("content-type", "application/json")],
                    format!(r#"{{"items":[],"key":"{SECRET}"}}"#),
                )
            }),
        );
    let (store_addr, store_server) = serve_router(store).await;
    let store_at = format!("http://{store_addr}");
    let (addr, answer, server) = stub_provider("/v1/jobs/{id}").await;

    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.unauthenticated_origins = vec![url::Url::parse(&store_at).unwrap().origin()];
        c
    })
    .await;
    for (path, expect_status) in [("/gone", 404), ("/echo", 200)] {
        let mut op = h.op(serde_json::json!({})).await;
        op.remote_job_id = Some("job_1".into());
        op.state = jobtrail_core::State::ResultCollecting;
        op.provider_context =
            serde_json::json!({"result": {"result_url": format!("{store_at}{path}")}});
        let (r, peak) = heap::peak_of(h.provider.fetch_result(&op, 1.into())).await;
        let seen = format!("{:?} {:?}", r.outcome, r.call);
        // The 404 of a URL the status named is first asked of the status again.
        assert!(
            r.call.http_status == Some(expect_status)
                && matches!(
                    (&r.outcome, expect_status),
                    (ResultOutcome::Unavailable { .. }, 200) | (ResultOutcome::Failed { .. }, 404)
                ),
            "{path}: {seen}"
        );
        assert!(
            !seen.contains(&SECRET[1..]),
            "{path}: the key is in the record: {seen}"
        );
        assert!(peak < 24 << 20, "{path}: the call took {} MiB", peak >> 20);
    }

    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        c.result.as_mut().unwrap().from = ResultFrom::Status;
        // The default: a megabyte (the simulator's own contract says 256 KiB).
        c.max_response_bytes = 1 << 20;
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.state = jobtrail_core::State::ResultCollecting;
    *answer.lock().unwrap() = flood("0");
    let (r, peak) = heap::peak_of(h.provider.fetch_result(&op, 1.into())).await;
    assert!(
        matches!(r.outcome, ResultOutcome::Fetched(_)),
        "an array names no state: its own checks read it: {:?}",
        r.outcome
    );
    assert!(
        peak < 24 << 20,
        "the read for its state took {} MiB",
        peak >> 20
    );
    // A poll's answer within the answers' own megabyte, of that shape beside its state: the wire
    // bounds its parse by the result's limit (it may carry the result), sixteen times larger, so
    // built whole it took some 90 MiB, on every poll in flight. It is read for its state only.
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        let mut c = contract("sim", &format!("http://{addr}"));
        let r = c.result.as_mut().unwrap();
        r.from = ResultFrom::Status;
        r.max_bytes = 16 << 20;
        c.max_response_bytes = 1 << 20;
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.state = jobtrail_core::State::Observing;
    let body = format!(r#"{{"state": "running", "pad": {}}}"#, flood("0"));
    assert!(body.len() < 1 << 20);
    *answer.lock().unwrap() = body;
    let (r, peak) = heap::peak_of(h.provider.status(&op, 1.into())).await;
    match r.outcome {
        StatusOutcome::Observed(s) => assert_eq!(s.phase, Some(Phase::Running)),
        other => panic!("{other:?}"),
    }
    assert!(peak < 24 << 20, "the poll took {} MiB", peak >> 20);
    server.abort();
    store_server.abort();
}

/// A create answered with up to the result's limit (the contract takes synchronous results) that is
/// a job still to follow, padded with a flood of small values, is read for what a create's answer
/// says only (the job id, its state): parsed whole, it took some thirty times its size, on every
/// create in flight and outside any bound on results (the wire lets an answer that may be a result
/// take up to sixteen times the result's limit parsed). Over real HTTP from a provider on 127.0.0.1.
#[tokio::test]
async fn a_large_create_answer_is_read_for_what_it_says_only() {
    let pad = format!("[{}0]", "0,".repeat(150_000));
    let body = format!(r#"{{"job_id": "job_big", "state": "queued", "pad": {pad}}}"#);
    assert!(
        body.len() > 256 << 10 && body.len() < 1 << 20,
        "{}",
        body.len()
    );
    let app = axum::Router::new().route(
        "/v1/jobs",
        axum::routing::post(move || async move { ([("content-type", "application/json")], body) }),
    );
    let (addr, server) = serve_router(app).await;
    let h = harness_with(jobtrail_sim::Config::default(), |_| {
        contract("sim", &format!("http://{addr}"))
    })
    .await;
    let op = h.op(serde_json::json!({})).await;
    let (c, peak) = heap::peak_of(h.provider.create(&op, 1.into())).await;
    match c.outcome {
        CreateOutcome::Accepted {
            job_id,
            remote_state,
            ..
        } => {
            assert_eq!(job_id, "job_big");
            assert_eq!(remote_state.as_deref(), Some("queued"));
        }
        other => panic!("{other:?}"),
    }
    assert!(peak < 3 << 20, "the create took {} KiB", peak >> 10);
    server.abort();
}

/// A large result costs about its own size in memory, not three or four times it. A result of
/// 32 MiB that is not UTF-8 (any binary result; here every byte 0xFF) was copied whole as text to
/// check the contract's rules against it and to quote its first 200 characters (three bytes for
/// each byte: 96 MiB more, on the runtime's thread, counted by no bound), and its buffer, grown by
/// doubling, kept up to twice its length for the result's life.
#[tokio::test]
async fn a_large_result_costs_about_its_own_size() {
    const SIZE: usize = 32 << 20;
    // Made before the measure starts and served without a copy: only the client's memory counts.
    let blob: &'static [u8] = vec![0xFF_u8; SIZE].leak();
    let store = axum::Router::new().route(
        "/blob",
        axum::routing::get(move || async move {
            ([("content-type", "application/octet-stream")], blob)
        }),
    );
    let (store_addr, store_server) = serve_router(store).await;
    let store_at = format!("http://{store_addr}");
    let h = harness_with(jobtrail_sim::Config::default(), |base| {
        let mut c = contract("sim", base);
        c.unauthenticated_origins = vec![url::Url::parse(&store_at).unwrap().origin()];
        c.result.as_mut().unwrap().max_bytes = 64 << 20;
        c
    })
    .await;
    let mut op = h.op(serde_json::json!({})).await;
    op.remote_job_id = Some("job_1".into());
    op.state = jobtrail_core::State::ResultCollecting;
    op.provider_context = serde_json::json!({"result": {"result_url": format!("{store_at}/blob")}});
    let (r, peak) = heap::peak_of(h.provider.fetch_result(&op, 1.into())).await;
    // Fetched whole (the worker's checks come after); never printed: it is 32 MiB.
    let fetched = match &r.outcome {
        ResultOutcome::Fetched(f) => f.bytes.len(),
        _ => 0,
    };
    assert_eq!(fetched, SIZE, "the result was not fetched whole");
    assert!(
        peak < SIZE + SIZE / 2,
        "a result of {} MiB took {} MiB",
        SIZE >> 20,
        peak >> 20
    );
    store_server.abort();
}
