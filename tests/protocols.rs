//! Provider contracts for the standard long-running-operation shapes, over real HTTP against the
//! simulator with real workers: what each contract feature makes of a provider's answers.

mod support;

use jobtrail_core::State;
use sha2::Digest;
use std::time::Duration;
use support::Env;

const T: Duration = Duration::from_secs(40);

/// `sim.toml` edited into a contract whose jobs have no result (`result.format = "none"`).
fn no_result_edits() -> Vec<(&'static str, String, String)> {
    let sim = std::fs::read_to_string(support::providers_dir().join("sim.toml")).unwrap();
    let start = sim.find("[result]\n").unwrap();
    let end = sim.find("[reconcile]").unwrap();
    vec![
        (
            "sim.toml",
            sim[start..end].to_owned(),
            "[result]\nformat = \"none\"\n\n".into(),
        ),
        (
            "sim.toml",
            "result_url = \"/result_url\"\n".into(),
            String::new(),
        ),
        (
            "sim.toml",
            "sync_result = \"body:/result\"\n".into(),
            String::new(),
        ),
    ]
}

/// A job with no result (a DELETE, a POST answered without a body) succeeds on the provider's word:
/// `succeeded` with "no result by contract", nothing fetched, and the record's result is the empty
/// byte string whose digest the chain verifies, not `result_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_a_result_succeeds_by_contract_and_nothing_is_fetched() {
    let edits = no_result_edits();
    let edits: Vec<(&str, &str, &str)> = edits
        .iter()
        .map(|(f, a, b)| (*f, a.as_str(), b.as_str()))
        .collect();
    let mut env = Env::with_edited_contracts(&edits).await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{done:?}");
    assert_eq!(
        done.result_sha256.as_deref(),
        Some(hex::encode(sha2::Sha256::digest(b"")).as_str())
    );
    let calls = env.store.calls(op.id).await.unwrap();
    assert!(
        calls.iter().all(|c| c.kind != "result"),
        "nothing is fetched: {:?}",
        calls.iter().map(|c| &c.kind).collect::<Vec<_>>()
    );
    let job = done.remote_job_id.clone().unwrap();
    assert_eq!(env.sim.ledger().jobs[&job].calls.get("result"), None);
    let history = env.store.history(op.id).await.unwrap();
    let validated = history
        .iter()
        .find(|h| h.event == "result_validated")
        .expect("a validated (empty) result");
    assert!(
        validated
            .detail
            .to_string()
            .contains("no result by contract"),
        "{}",
        validated.detail
    );
    assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
    env.stop_workers().await;
}

/// A Google AIP-151 API in a dozen lines: the profile knows the `Operation` — its `name`
/// (`operations/…`) is a path, `done` is left out while false, the outcome is `response` (the
/// result) or `error` (code 1: cancelled).
const AIP: &str = r#"
protocol = "google-aip-151"
name = "aip"
base_url = "http://127.0.0.1:1/v1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
[result]
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// Azure's `Location` polling from its profile: the monitor's status code is the state, and a 202
/// may move it.
const LOCATION: &str = r#"
protocol = "azure-location"
name = "azure-location"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
job_id = "body:/job_id"
[status]
url = "/v1/jobs/{job_id}"
[result]
url = "/v1/jobs/{job_id}/result"
content_type = "application/json"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// Azure's status monitor from its profile: `Operation-Location` (or `Azure-AsyncOperation`), a
/// `status` in any case, the result in the monitor's final body.
const AZURE: &str = r#"
protocol = "azure-lro"
name = "azure-lro"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
job_id = "body:/job_id"
[status]
url = "/v1/jobs/{job_id}"
[cancel]
path = "/v1/jobs/{job_id}/cancel"
idempotent = true
[result]
within = "/result"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// OGC API – Processes from its profile: `Prefer: respond-async` sent (the simulator refuses
/// without it), the job from `Location` only, results at `…/results`, dismiss with `DELETE`.
const OGC: &str = r#"
protocol = "ogc-processes"
name = "ogc"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/processes/{target}/execution"
idempotency = "header"
idempotency_header = "Idempotency-Key"
[polling]
initial_ms = 100
cap_ms = 400
max_failures = 3
[result]
content_type = "application/json"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// Azure's status monitor with no job id in the contract: the job is known by the
/// `Operation-Location` its create answer names, and every call is built on it.
const AZURE_NO_ID: &str = r#"
protocol = "azure-lro"
name = "azure-no-id"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
[status]
url = "{status_url}"
[result]
within = "/result"
items = "/items"
"#;

/// A workflow engine's style: cancel, result and lookup are POSTs with JSON bodies built from the
/// job, the operation and the request; the lookup finds runs by the idempotency key we sent.
const WORKFLOW: &str = r#"
name = "workflow"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
job_id = "body:/job_id"
[status]
url = "/v1/jobs/{job_id}"
state = "/state"
[status.states]
queued = ["queued"]
running = ["running", "cancelling"]
succeeded = ["succeeded"]
failed = ["failed"]
cancelled = ["cancelled"]
[polling]
initial_ms = 100
cap_ms = 400
[cancel]
method = "POST"
path = "/v2/runs:stop"
idempotent = true
body = { run = "{job_id}", reason = "stopped for operation {operation_id}", labels = "{request:/labels}" }
[result]
url = "/v2/runs:output"
body = { run = "{job_id}" }
content_type = "application/json"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
lookup_url = "/v2/runs:lookup"
lookup_body = { request_id = "{idempotency_key}" }
lookup_jobs = "/runs"
lookup_job_id = "/id"
lookup_reference = "/request_id"
"#;

/// A create that is a PUT to a URL the operation names: idempotent by HTTP's own semantics, so it
/// may be resent without a token.
const NATURAL: &str = r#"
name = "natural"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
method = "PUT"
path = "/v1/resources/{operation_id}"
idempotency = "natural"
job_id = "body:/job_id"
[status]
url = "/v1/jobs/{job_id}"
state = "/state"
[status.states]
queued = ["queued"]
running = ["running"]
succeeded = ["succeeded"]
failed = ["failed"]
[polling]
initial_ms = 100
cap_ms = 400
[result]
url = "/v1/jobs/{job_id}/result"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// An Azure resource made by PUT, its `properties.provisioningState` the state, from its profile.
const AZURE_RESOURCE: &str = r#"
protocol = "azure-resource"
name = "azure-resource"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/resources/{operation_id}"
[status]
url = "/v1/resources/{operation_id}"
[polling]
initial_ms = 100
cap_ms = 400
[result]
within = "/properties/output"
items = "/items"
[reconcile]
method = "resend"
interval_ms = 200
"#;

/// Azure's status monitor with `final-state-via: location`: the result is at the `Location` the
/// create's answer named, fetched once the monitor says `Succeeded`.
const AZURE_FINAL_LOCATION: &str = r#"
protocol = "azure-lro"
name = "azure-final-location"
base_url = "http://127.0.0.1:1"
[auth]
header = "Authorization"
scheme = "Bearer"
secret = "env:JOBTRAIL_SIM_TOKEN"
[create]
path = "/v1/jobs"
idempotency = "header"
idempotency_header = "Idempotency-Key"
job_id = "body:/job_id"
result_url = "header:Location"
[status]
url = "/v1/jobs/{job_id}"
[result]
from = "url"
content_type = "application/json"
items = "/items"
"#;

async fn protocols_env() -> Env {
    Env::with_contract_files(
        &[],
        &[
            ("aip.toml", AIP),
            ("azure-location.toml", LOCATION),
            ("azure-lro.toml", AZURE),
            ("azure-no-id.toml", AZURE_NO_ID),
            ("workflow.toml", WORKFLOW),
            ("natural.toml", NATURAL),
            ("azure-resource.toml", AZURE_RESOURCE),
            ("azure-final-location.toml", AZURE_FINAL_LOCATION),
            ("ogc.toml", OGC),
        ],
    )
    .await
}

/// A create answer with a state is synchronous only when that state is a terminal success: output
/// beside a job still `queued` is partial, not the result (it is polled and its result fetched),
/// while an answer already `succeeded` is the result (nothing polled). A 2xx naming no job id but
/// a status URL (Azure's `Operation-Location`) starts a job known by that URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_answer_is_the_result_only_when_already_finished_and_a_status_url_can_name_the_job()
 {
    let mut env = protocols_env().await;
    let partial = env
        .submit(
            "sim",
            serde_json::json!({"partial_output": true, "duration_ms": 300}),
            |_| {},
        )
        .await;
    let sync = env
        .submit("sim", serde_json::json!({"create": ["sync"]}), |_| {})
        .await;
    let no_id = env
        .submit(
            "azure-no-id",
            script("azure_monitor", serde_json::json!({})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let partial = env.wait_settled(partial.id, T).await;
    assert_eq!(partial.state, State::Succeeded, "{partial:?}");
    assert_eq!(
        partial.result_summary.as_ref().unwrap()["items"]["total"],
        5,
        "the fetched result, not the empty partial output"
    );
    let kinds: Vec<String> = env
        .store
        .calls(partial.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.kind)
        .collect();
    assert!(
        kinds.contains(&"status".into()) && kinds.contains(&"result".into()),
        "{kinds:?}"
    );

    let sync = env.wait_settled(sync.id, T).await;
    assert_eq!(sync.state, State::Succeeded, "{sync:?}");
    let kinds: Vec<String> = env
        .store
        .calls(sync.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.kind)
        .collect();
    assert_eq!(kinds, ["create"], "already finished: nothing to poll");

    let no_id = env.wait_settled(no_id.id, T).await;
    assert_eq!(no_id.state, State::Succeeded, "{no_id:?}");
    let name = no_id.remote_job_id.clone().unwrap();
    assert!(name.starts_with("/v1/operations/"), "{name}");
    let calls = env.store.calls(no_id.id).await.unwrap();
    assert!(
        calls
            .iter()
            .filter(|c| c.kind != "create")
            .all(|c| c.url.contains("/v1/operations/")),
        "every call built on the monitor: {:?}",
        calls.iter().map(|c| &c.url).collect::<Vec<_>>()
    );
    for id in [partial.id, sync.id, no_id.id] {
        assert!(env.store.verify_operation(id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

fn script(protocol: &str, more: serde_json::Value) -> serde_json::Value {
    let mut s = serde_json::json!({"protocol": protocol, "duration_ms": 400});
    for (k, v) in more.as_object().unwrap() {
        s[k] = v.clone();
    }
    s
}

/// AIP-151: success (`done: true` with `response`), failure (`error` with code 13: the job failed,
/// its error kept), and a cancel sent to `…:cancel` confirmed by `error.code = 1`. The job's name is
/// a path (`operations/job_N`), used as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn google_aip_151_operations_succeed_fail_and_cancel() {
    let mut env = protocols_env().await;
    let ok = env
        .submit("aip", script("aip", serde_json::json!({})), |_| {})
        .await;
    let bad = env
        .submit(
            "aip",
            script("aip", serde_json::json!({"outcome": "failed"})),
            |_| {},
        )
        .await;
    let stop = env
        .submit(
            "aip",
            script("aip", serde_json::json!({"never_finish": true})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    // The result is the final Operation, kept exactly as the provider sent it, judged at
    // `/response` (its five items counted).
    let digest = ok.result_sha256.clone().expect("a result");
    let result = env
        .store
        .result_bytes(ok.id, &digest)
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(hex::encode(sha2::Sha256::digest(&result)), digest);
    let doc: serde_json::Value = serde_json::from_slice(&result).unwrap();
    assert_eq!(doc["done"], true);
    assert_eq!(doc["response"]["items"].as_array().unwrap().len(), 5);
    let name = ok.remote_job_id.clone().unwrap();
    assert!(name.starts_with("operations/"), "{name}");
    let job = name.trim_start_matches("operations/");
    let paths = env.sim.ledger().jobs[job].status_paths.clone();
    assert!(paths.contains(&format!("/v1/{name}")), "{paths:?}");

    let bad = env.wait_settled(bad.id, T).await;
    assert_eq!(bad.state, State::Failed, "{bad:?}");
    let history = env.store.history(bad.id).await.unwrap();
    let failed = history.iter().find(|h| h.to_state == "failed").unwrap();
    let text = format!("{} {}", failed.cause, failed.detail);
    assert!(
        text.contains("simulated failure"),
        "the provider's error is kept: {text}"
    );

    env.wait_state(stop.id, State::Observing, T).await;
    env.store
        .request_cancel(
            stop.id,
            jobtrail_core::CancelRequest::new("alice", "not needed").unwrap(),
        )
        .await
        .unwrap();
    let stop = env.wait_settled(stop.id, T).await;
    assert_eq!(stop.state, State::Cancelled, "{stop:?}");
    let job = stop.remote_job_id.clone().unwrap();
    let job = job.trim_start_matches("operations/");
    assert_eq!(env.sim.ledger().jobs[job].cancel_requests, 1);
    let calls = env.store.calls(stop.id).await.unwrap();
    let cancel = calls.iter().find(|c| c.kind == "cancel").unwrap();
    assert!(
        cancel
            .url
            .ends_with(&format!("/v1/operations/{job}:cancel")),
        "{}",
        cancel.url
    );
    for id in [ok.id, bad.id, stop.id] {
        assert!(env.store.verify_operation(id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

/// Where the final status answer is the result (AIP-151's `Operation` with its `response`), a
/// status read takes it up to the result's own limit: read only up to the answers' limit
/// (`max_response_bytes`, here 4 KiB), every poll that saw it done failed as too large and the
/// job, finished and within its result's limit, ended failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_inside_the_final_status_answer_is_read_to_the_results_limit() {
    let small = format!(
        "{}\n[timeouts]\nmax_response_bytes = 4096\n",
        AIP.replace("name = \"aip\"", "name = \"aip-small\"")
    );
    let mut env = Env::with_contract_files(&[], &[("aip-small.toml", &small)]).await;
    let op = env
        .submit(
            "aip-small",
            script("aip", serde_json::json!({"items": 400})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let op = env.wait_settled(op.id, T).await;
    assert_eq!(op.state, State::Succeeded, "{op:?}");
    let digest = op.result_sha256.clone().expect("a result");
    let result = env
        .store
        .result_bytes(op.id, &digest)
        .await
        .unwrap()
        .expect("kept");
    assert!(result.len() > 4096, "{} bytes", result.len());
    let doc: serde_json::Value = serde_json::from_slice(&result).unwrap();
    assert_eq!(doc["response"]["items"].as_array().unwrap().len(), 400);
    env.stop_workers().await;
}

/// A status answer that may be the result is read to the result's limit (16 MiB here), so each
/// read in flight first takes that much of the worker's room for results' bytes: with a 1 MiB room
/// the polls go one at a time (a provider dripping 16 MiB into every poll in flight would hold
/// that many times over and kill the worker, then every worker that claimed the operations after
/// it); with room for two they overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_that_may_carry_the_result_stay_within_the_workers_room() {
    let env = Env::with_contract_files(&[], &[("aip.toml", AIP)]).await;
    let slow = script(
        "aip",
        serde_json::json!({"duration_ms": 1200, "status_delay_ms": 250}),
    );
    for (worker, check_mib, most) in [("narrow", "2", 1), ("roomy", "64", 2)] {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(env.submit("aip", slow.clone(), |_| {}).await.id);
        }
        let before = env.sim.ledger().requests;
        let base = format!("{}/v1", env.sim.base_url());
        let mut w = env.spawn_worker(
            worker,
            "5s",
            &[
                ("JOBTRAIL_CHECK_MIB", check_mib),
                ("JOBTRAIL_PROVIDER_AIP_BASE_URL", &base),
            ],
        );
        for id in &ids {
            let done = env.wait_settled(*id, T).await;
            assert_eq!(done.state, State::Succeeded, "{}", env.logs());
        }
        let ledger = env.sim.ledger();
        assert!(ledger.requests > before + 8, "polled");
        // The most at once so far, over both runs: the narrow run's, then the roomy one's.
        assert_eq!(
            ledger.max_status_reads_in_flight, most,
            "{worker}: status reads in flight at once"
        );
        w.signal(libc::SIGTERM);
        assert!(w.wait_exit(Duration::from_secs(30)).is_some());
    }
}

/// Azure `Location` polling: 202 is "running" (a new `Location` on a 202 is followed), 200 is
/// done and the result is collected; 400 from the monitor is the job's failure, not a read to
/// retry until a person is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_location_polling_reads_the_status_code_and_follows_a_moving_location() {
    let mut env = protocols_env().await;
    let ok = env
        .submit(
            "azure-location",
            script(
                "location",
                serde_json::json!({"moving_status_url": true, "duration_ms": 700}),
            ),
            |_| {},
        )
        .await;
    let bad = env
        .submit(
            "azure-location",
            script("location", serde_json::json!({"outcome": "failed"})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    let job = ok.remote_job_id.clone().unwrap();
    let paths = env.sim.ledger().jobs[&job].status_paths.clone();
    assert!(
        paths.contains(&format!("/v1/monitors/{job}/0")),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .filter(|p| p.starts_with("/v1/monitors/"))
            .count()
            >= 2,
        "each new Location was followed: {paths:?}"
    );
    assert!(
        !paths.contains(&format!("/v1/jobs/{job}")),
        "never the template once a Location was given: {paths:?}"
    );
    let calls = env.store.calls(ok.id).await.unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c.kind == "result" && c.http_status == Some(200))
    );

    let bad = env.wait_settled(bad.id, T).await;
    assert_eq!(bad.state, State::Failed, "{bad:?}");
    let statuses = env
        .store
        .calls(bad.id)
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind == "status" && c.http_status == Some(400))
        .count();
    assert_eq!(statuses, 1, "one 400 from the monitor ends it");
    env.stop_workers().await;
}

/// Azure's status monitor: followed from `Operation-Location` although a broken
/// `Azure-AsyncOperation` (higher in the profile's precedence) came with it; `Succeeded` with the
/// result in the monitor's final body, `Failed` with its `error` kept, `Canceled` after our cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_status_monitor_succeeds_fails_and_cancels_past_a_broken_header() {
    let mut env = protocols_env().await;
    let azure = |more: serde_json::Value| script("azure_monitor", more);
    let ok = env
        .submit(
            "azure-lro",
            azure(serde_json::json!({
                "bogus_async_header": true,
                "status_faults": {"1": "other_client_request_id"},
            })),
            |_| {},
        )
        .await;
    let bad = env
        .submit(
            "azure-lro",
            azure(serde_json::json!({"outcome": "failed"})),
            |_| {},
        )
        .await;
    let stop = env
        .submit(
            "azure-lro",
            azure(serde_json::json!({"never_finish": true})),
            |_| {},
        )
        .await;
    let unasked = env
        .submit(
            "azure-lro",
            azure(serde_json::json!({"outcome": "cancelled"})),
            |_| {},
        )
        .await;
    let both = env
        .submit(
            "azure-lro",
            azure(serde_json::json!({"async_operation_header": true})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    let job = ok.remote_job_id.clone().unwrap();
    let paths = env.sim.ledger().jobs[&job].status_paths.clone();
    assert!(
        !paths.is_empty() && paths.iter().all(|p| p.starts_with("/v1/operations/")),
        "the monitor named in Operation-Location: {paths:?}"
    );
    let calls = env.store.calls(ok.id).await.unwrap();
    let result = calls
        .iter()
        .find(|c| c.kind == "result")
        .expect("collected");
    assert!(result.url.contains("/v1/operations/"), "{}", result.url);
    // Every call carried its own x-ms-client-request-id and its answer echoed it, but for the
    // first read, whose answer echoed another request's id: not ours, so read again.
    let foreign: Vec<_> = calls
        .iter()
        .filter(|c| c.error_class.as_deref() == Some("answer_to_another_request"))
        .collect();
    assert_eq!(foreign.len(), 1, "{calls:?}");
    assert_eq!(foreign[0].kind, "status");
    for c in calls.iter().filter(|c| c.http_status.is_some()) {
        let echo = c.response_headers["x-ms-client-request-id"]
            .as_str()
            .unwrap();
        if c.error_class.is_none() {
            assert_eq!(echo, c.id.to_string(), "{c:?}");
        } else {
            assert_ne!(echo, c.id.to_string(), "{c:?}");
        }
    }

    let bad = env.wait_settled(bad.id, T).await;
    assert_eq!(bad.state, State::Failed, "{bad:?}");
    let history = env.store.history(bad.id).await.unwrap();
    let failed = history.iter().find(|h| h.to_state == "failed").unwrap();
    assert!(
        format!("{} {}", failed.cause, failed.detail).contains("JobFailed"),
        "the error object is kept: {} {}",
        failed.cause,
        failed.detail
    );

    env.wait_state(stop.id, State::Observing, T).await;
    env.store
        .request_cancel(
            stop.id,
            jobtrail_core::CancelRequest::new("alice", "not needed").unwrap(),
        )
        .await
        .unwrap();
    let stop = env.wait_settled(stop.id, T).await;
    assert_eq!(stop.state, State::Cancelled, "{stop:?}");

    // `Canceled` nobody here asked for (the provider's console, a pre-emption) is not the
    // confirmation of a cancel: the job did not do its work, and the record says why.
    let unasked = env.wait_settled(unasked.id, T).await;
    assert_eq!(unasked.state, State::Failed, "{unasked:?}");
    let history = env.store.history(unasked.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.event, "remote_cancelled_unasked", "{history:?}");
    assert!(
        last.cause.contains("nobody asked") && last.cause.contains("Canceled"),
        "{}",
        last.cause
    );
    assert!(
        history.iter().all(|h| h.event != "remote_cancelled"),
        "never recorded as a confirmed cancel"
    );
    let job = unasked.remote_job_id.clone().unwrap();
    assert_eq!(env.sim.ledger().jobs[&job].cancel_requests, 0);

    // Both headers usable: `Azure-AsyncOperation` wins (the profile's precedence); the
    // `Operation-Location` beside it (here no monitor at all) is never read.
    let both = env.wait_settled(both.id, T).await;
    assert_eq!(both.state, State::Succeeded, "{both:?}");
    let calls = env.store.calls(both.id).await.unwrap();
    assert!(
        calls.iter().all(|c| !c.url.contains("-nowhere")),
        "{:?}",
        calls.iter().map(|c| &c.url).collect::<Vec<_>>()
    );
    assert!(calls.iter().any(|c| c.kind == "status"));
    for id in [ok.id, bad.id, stop.id, unasked.id, both.id] {
        assert!(env.store.verify_operation(id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

/// OGC API – Processes: a 201 with only `Location`, the statusInfo polled there, the results at
/// `/jobs/{id}/results`, a failed job `failed`, and a dismiss (`DELETE /jobs/{id}`) confirmed by
/// `dismissed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ogc_processes_jobs_run_fail_and_are_dismissed() {
    let mut env = protocols_env().await;
    let ogc = |more: serde_json::Value| script("ogc", more);
    let ok = env.submit("ogc", ogc(serde_json::json!({})), |_| {}).await;
    let sync = env
        .submit("ogc", ogc(serde_json::json!({"create": ["sync"]})), |_| {})
        .await;
    let bad = env
        .submit("ogc", ogc(serde_json::json!({"outcome": "failed"})), |_| {})
        .await;
    let stop = env
        .submit(
            "ogc",
            ogc(serde_json::json!({"never_finish": true})),
            |_| {},
        )
        .await;
    // A capability URL as the job's Location: the job is addressed with it, and its token is in
    // no record (the job id was the Location as sent, token and all, in the history and the
    // caller's view).
    let capability = env
        .submit(
            "ogc",
            ogc(serde_json::json!({"location_query": "access_token=cap-s3cr3t-77&page=1"})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    let location = ok.remote_job_id.clone().unwrap();
    assert!(location.starts_with("/jobs/"), "{location}");
    let calls = env.store.calls(ok.id).await.unwrap();
    let create = calls.iter().find(|c| c.kind == "create").unwrap();
    assert!(
        create.url.ends_with("/processes/reports/execution"),
        "{}",
        create.url
    );
    assert_eq!(create.http_status, Some(201));
    let result = calls.iter().find(|c| c.kind == "result").unwrap();
    assert!(
        result.url.ends_with(&format!("{location}/results")),
        "{}",
        result.url
    );

    let bad = env.wait_settled(bad.id, T).await;
    assert_eq!(bad.state, State::Failed, "{bad:?}");

    // Polled and fetched with the token (it succeeded), recorded without it.
    let capability = env.wait_settled(capability.id, T).await;
    assert_eq!(capability.state, State::Succeeded);
    let job = capability.remote_job_id.clone().unwrap();
    // The token's place holds a digest of it (two jobs stay two), never the token.
    let digest = job
        .split_once("?access_token=REDACTED-")
        .and_then(|(_, rest)| rest.strip_suffix("&page=1"))
        .unwrap_or_default();
    assert!(
        job.starts_with("/jobs/")
            && digest.len() == 16
            && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{job}"
    );
    let kept = format!(
        "{job} {:?} {:?}",
        env.store.history(capability.id).await.unwrap(),
        env.store.calls(capability.id).await.unwrap()
    );
    assert!(!kept.contains("cap-s3cr3t"), "the token is in the record");

    env.wait_state(stop.id, State::Observing, T).await;
    env.store
        .request_cancel(
            stop.id,
            jobtrail_core::CancelRequest::new("alice", "not needed").unwrap(),
        )
        .await
        .unwrap();
    let stop = env.wait_settled(stop.id, T).await;
    assert_eq!(stop.state, State::Cancelled, "{stop:?}");
    let calls = env.store.calls(stop.id).await.unwrap();
    let dismiss = calls.iter().find(|c| c.kind == "cancel").unwrap();
    assert_eq!(dismiss.method, "DELETE");
    assert!(
        dismiss
            .url
            .ends_with(stop.remote_job_id.as_deref().unwrap()),
        "{}",
        dismiss.url
    );
    // A server that executed synchronously all the same (200 with the results document): the
    // finished job, its bytes kept as sent, nothing polled and nothing sent twice.
    let sync = env.wait_settled(sync.id, T).await;
    assert_eq!(sync.state, State::Succeeded, "{sync:?}");
    let kinds: Vec<String> = env
        .store
        .calls(sync.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.kind)
        .collect();
    assert_eq!(kinds, ["create"]);
    assert_eq!(sync.result_summary.as_ref().unwrap()["items"]["total"], 5);
    assert_eq!(env.sim.ledger().create_requests[sync.token.as_str()], 1);
    // The DELETE's answer (the job, `dismissed`) is the confirmation: no read after it, which a
    // real server would answer 404 (the dismissed job is gone).
    let after: Vec<_> = calls
        .iter()
        .filter(|c| c.kind == "status" && c.started_at > dismiss.started_at)
        .collect();
    assert!(after.is_empty(), "{after:?}");
    let history = env.store.history(stop.id).await.unwrap();
    let events: Vec<&str> = history.iter().map(|h| h.event.as_str()).collect();
    assert!(
        events.ends_with(&["cancel_sent", "remote_cancelled"]),
        "{events:?}"
    );
    assert!(
        env.store
            .verify_operation(stop.id)
            .await
            .unwrap()
            .is_clean()
    );
    env.stop_workers().await;
}

/// A job whose only handle is a `Location` that is no usable URL: every call built on the status
/// URL (status, cancel, results) is not sent — never a GET or a DELETE of the API's root — and the
/// operation is held for a person once its read budget is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_is_built_on_a_status_url_the_provider_never_usably_gave() {
    let mut env = protocols_env().await;
    let op = env
        .submit(
            "ogc",
            script(
                "ogc",
                serde_json::json!({"status_url_elsewhere": "https://127.0.0.1:99999/jobs/x"}),
            ),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let held = env
        .wait_for(op.id, "held or ended", T, |r| {
            r.state.needs_human() || r.state.is_terminal()
        })
        .await;
    assert!(held.state.needs_human(), "{held:?}");
    let calls = env.store.calls(op.id).await.unwrap();
    let sent: Vec<_> = calls
        .iter()
        .filter(|c| c.kind != "create" && c.http_status.is_some())
        .map(|c| (&c.kind, &c.url))
        .collect();
    assert!(sent.is_empty(), "calls reached a server: {sent:?}");
    assert!(calls.iter().any(|c| c.kind == "status"));
    assert_eq!(
        env.sim.ledger().requests,
        1,
        "only the create reached the provider"
    );
    env.stop_workers().await;
}

/// A workflow engine's POSTs: the result is fetched and the run stopped with JSON bodies built from
/// the job id, the operation and a request value (kept whole: a list stays a list); a lost create
/// answer is looked up by the idempotency key we sent, so one run results; and the same key
/// answered with a second run is a contract violation, not a silent orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_engine_is_driven_with_post_bodies_and_looked_up_by_our_key() {
    let mut env = protocols_env().await;
    let with_labels = |script: serde_json::Value| {
        move |s: &mut jobtrail_core::Submission| {
            s.body = serde_json::to_vec(&serde_json::json!({"sim": script, "labels": ["a", "b"]}))
                .unwrap();
        }
    };
    let ok = env
        .submit("workflow", serde_json::json!({"duration_ms": 300}), |_| {})
        .await;
    let stop = env
        .submit(
            "workflow",
            serde_json::json!({}),
            with_labels(serde_json::json!({"never_finish": true})),
        )
        .await;
    let lost = env
        .submit(
            "workflow",
            serde_json::json!({"create": ["drop_after_accept"], "duration_ms": 300}),
            |_| {},
        )
        .await;
    let twice = env
        .submit(
            "workflow",
            serde_json::json!({"create": ["drop_after_accept", "different_job_id"], "never_finish": true}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    let run = ok.remote_job_id.clone().unwrap();
    assert_eq!(
        env.sim.ledger().jobs[&run].posted["output"],
        [serde_json::json!({"run": run})]
    );
    let result = env
        .store
        .calls(ok.id)
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.kind == "result")
        .unwrap();
    assert_eq!(result.method, "POST");

    env.wait_state(stop.id, State::Observing, T).await;
    env.store
        .request_cancel(
            stop.id,
            jobtrail_core::CancelRequest::new("alice", "not needed").unwrap(),
        )
        .await
        .unwrap();
    let stopped = env.wait_settled(stop.id, T).await;
    assert_eq!(stopped.state, State::Cancelled, "{stopped:?}");
    let run = stopped.remote_job_id.clone().unwrap();
    assert_eq!(
        env.sim.ledger().jobs[&run].posted["stop"],
        [serde_json::json!({
            "run": run,
            "reason": format!("stopped for operation {}", stop.id),
            "labels": ["a", "b"],
        })]
    );

    let lost = env.wait_settled(lost.id, T).await;
    assert_eq!(lost.state, State::Succeeded, "{lost:?}");
    let ledger = env.sim.ledger();
    assert_eq!(ledger.tokens[lost.token.as_str()].len(), 1, "one run");
    let run = lost.remote_job_id.clone().unwrap();
    assert_eq!(
        ledger.jobs[&run].posted["lookup"],
        [serde_json::json!({"request_id": lost.token.as_str()})],
        "looked up by the key we sent"
    );

    let twice = env.wait_state(twice.id, State::ContractViolation, T).await;
    let (a, b) = (
        twice.remote_job_id.clone().unwrap(),
        twice.conflicting_remote_job_id.clone().unwrap(),
    );
    assert_ne!(a, b, "both runs are kept");
    for id in [ok.id, stopped.id, lost.id, twice.id] {
        assert!(env.store.verify_operation(id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

/// A PUT to a URL the operation names is idempotent without a token: an answer lost after the
/// provider made the job is settled by sending the same PUT again, which names the same job — one
/// job, and the record says creation is at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_to_a_url_the_operation_names_is_resent_safely_without_a_token() {
    let mut env = protocols_env().await;
    let op = env
        .submit(
            "natural",
            serde_json::json!({"create": ["drop_after_accept"], "duration_ms": 300}),
            |_| {},
        )
        .await;
    assert!(op.at_most_once, "a natural PUT is at most once");
    assert_eq!(op.idempotency, jobtrail_core::IdempotencyMode::Natural);
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{done:?}");
    let ledger = env.sim.ledger();
    let key = format!("put:{}", op.id);
    assert_eq!(ledger.tokens[&key].len(), 1, "one job");
    assert_eq!(ledger.create_requests[&key], 2, "the PUT was sent again");
    let creates: Vec<_> = env
        .store
        .calls(op.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == "create")
        .collect();
    assert_eq!(creates.len(), 2);
    assert!(
        creates
            .iter()
            .all(|c| c.method == "PUT" && c.url.ends_with(&format!("/v1/resources/{}", op.id)))
    );
    assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
    env.stop_workers().await;
}

/// One contract, two result formats chosen by the request (`result.format_from`): a CSV request is
/// judged as CSV (its failing rows named by line), a JSON one as JSON, and a request naming a
/// format the contract does not know is refused at submit with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_chooses_among_the_contracts_result_formats() {
    let formats = "[result.formats.json]\nformat = \"json\"\ncontent_type = \"application/json\"\nschema_file = \"schemas/sim-result.json\"\nitems = \"/items\"\nitem_ref = \"/id\"\nitem_status = \"/status\"\nitem_succeeded_values = [\"ok\"]\n\n[result.formats.csv]\nformat = \"csv\"\ncontent_type = \"text/csv\"\ncsv_status_column = \"status\"\ncsv_error_values = [\"ERROR\"]\n\n[reconcile]\n";
    let mut env = Env::with_edited_contracts(&[
        (
            "sim.toml",
            "[result]\n",
            "[result]\nformat_from = \"/sim/format\"\n",
        ),
        ("sim.toml", "[reconcile]\n", formats),
    ])
    .await;
    let csv = env
        .submit(
            "sim",
            serde_json::json!({"format": "csv", "result": "error_rows", "items": 4, "duration_ms": 200}),
            |_| {},
        )
        .await;
    let json = env
        .submit(
            "sim",
            serde_json::json!({"format": "json", "result": "partial_batch", "items": 4, "duration_ms": 200}),
            |_| {},
        )
        .await;
    let default = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await;

    // A format the contract does not name: refused, nothing written.
    let before = env.store.totals().await.unwrap();
    let body = serde_json::json!({"report": "usage", "sim": {"format": "xml"}});
    let err = env
        .store
        .submit_new(
            &jobtrail_core::Submission {
                provider: "sim".into(),
                target: "reports".into(),
                body: serde_json::to_vec(&body).unwrap(),
                caller: "e2e".into(),
                approved_by: "tester".into(),
                ..Default::default()
            },
            &env.registry.terms(),
            jobtrail_core::SubmitLimits::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/sim/format") && err.contains("\"xml\"") && err.contains("csv, json"),
        "{err}"
    );
    assert_eq!(env.store.totals().await.unwrap(), before, "nothing written");

    env.start_worker("w1", Duration::from_secs(10));
    let csv = env.wait_settled(csv.id, T).await;
    let json = env.wait_settled(json.id, T).await;
    let default = env.wait_settled(default.id, T).await;
    // CSV rules for the CSV request: two rows say ERROR, named by their lines.
    assert_eq!(csv.state, State::Succeeded, "{csv:?}");
    let s = csv.result_summary.clone().unwrap();
    assert_eq!(
        s["items"]["failed_refs"],
        serde_json::json!(["line 3", "line 5"]),
        "{s}"
    );
    // JSON rules for the JSON request: the items that failed, by id.
    assert_eq!(json.state, State::Succeeded, "{json:?}");
    let s = json.result_summary.clone().unwrap();
    assert_eq!(
        s["items"]["failed_refs"],
        serde_json::json!(["item_2", "item_4"]),
        "{s}"
    );
    // A request naming no format takes the keys beside the formats.
    assert_eq!(default.state, State::Succeeded, "{default:?}");
    env.stop_workers().await;
}

/// Each protocol through its faults: the create's answer lost after the job was made (settled by
/// resending the same key: one job), then a 500 and a 429 on the status reads before the job is
/// followed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_survives_a_lost_answer_and_failing_reads() {
    let mut env = protocols_env().await;
    let faults = serde_json::json!({
        "create": ["drop_after_accept"],
        "status_faults": {"1": "error_500", "2": "too_many_requests"},
    });
    let mut ops = Vec::new();
    for (provider, protocol) in [
        ("aip", "aip"),
        ("azure-lro", "azure_monitor"),
        ("azure-location", "location"),
        ("ogc", "ogc"),
    ] {
        let op = env
            .submit(provider, script(protocol, faults.clone()), |_| {})
            .await;
        ops.push((provider, op));
    }
    env.start_worker("w1", Duration::from_secs(10));
    for (provider, op) in ops {
        let done = env.wait_settled(op.id, T).await;
        assert_eq!(done.state, State::Succeeded, "{provider}: {done:?}");
        let ledger = env.sim.ledger();
        assert_eq!(
            ledger.tokens[op.token.as_str()].len(),
            1,
            "{provider}: one job"
        );
        assert!(ledger.create_requests[op.token.as_str()] >= 2, "{provider}");
        let events: Vec<String> = env
            .store
            .history(op.id)
            .await
            .unwrap()
            .into_iter()
            .map(|h| h.event)
            .collect();
        assert!(
            events.contains(&"create_ambiguous".into()),
            "{provider}: {events:?}"
        );
        let failed_reads = env
            .store
            .calls(op.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.kind == "status" && matches!(c.http_status, Some(500 | 429)))
            .count();
        assert_eq!(failed_reads, 2, "{provider}");
        assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

/// Azure's resource PUT: the resource's `provisioningState` is the state (`Accepted`, then
/// `Provisioning`, then `Succeeded` or `Failed`), the result is the resource itself read once more,
/// a failure keeps its `error`, and an answer lost after the resource was made is settled by the
/// same PUT again (no token: the URL names the resource).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_resource_put_is_followed_by_its_provisioning_state() {
    let mut env = protocols_env().await;
    let resource = |more: serde_json::Value| script("azure_resource", more);
    let ok = env
        .submit("azure-resource", resource(serde_json::json!({})), |_| {})
        .await;
    let bad = env
        .submit(
            "azure-resource",
            resource(serde_json::json!({"outcome": "failed"})),
            |_| {},
        )
        .await;
    let lost = env
        .submit(
            "azure-resource",
            resource(serde_json::json!({"create": ["drop_after_accept"]})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let ok = env.wait_settled(ok.id, T).await;
    assert_eq!(ok.state, State::Succeeded, "{ok:?}");
    assert_eq!(
        ok.remote_job_id.as_deref(),
        Some(format!("/v1/resources/{}", ok.id).as_str())
    );
    assert_eq!(ok.result_summary.as_ref().unwrap()["items"]["total"], 5);
    let calls = env.store.calls(ok.id).await.unwrap();
    let result = calls.iter().find(|c| c.kind == "result").unwrap();
    assert_eq!(result.method, "GET");
    assert!(
        result.url.contains(&format!("/v1/resources/{}", ok.id)),
        "{}",
        result.url
    );
    let history = env.store.history(ok.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|h| h.cause.contains("Provisioning") || h.cause.contains("Accepted")),
        "the provisioning states are recorded: {:?}",
        history.iter().map(|h| &h.cause).collect::<Vec<_>>()
    );

    let bad = env.wait_settled(bad.id, T).await;
    assert_eq!(bad.state, State::Failed, "{bad:?}");
    let failed = env
        .store
        .history(bad.id)
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.to_state == "failed")
        .unwrap();
    assert!(
        format!("{} {}", failed.cause, failed.detail).contains("ProvisioningFailed"),
        "{} {}",
        failed.cause,
        failed.detail
    );

    let lost = env.wait_settled(lost.id, T).await;
    assert_eq!(lost.state, State::Succeeded, "{lost:?}");
    let key = format!("put:{}", lost.id);
    assert_eq!(env.sim.ledger().tokens[&key].len(), 1, "one resource");
    for id in [ok.id, bad.id, lost.id] {
        assert!(env.store.verify_operation(id).await.unwrap().is_clean());
    }
    env.stop_workers().await;
}

/// Azure's `final-state-via: location`: the create's answer names in `Location` where the result
/// will be; the monitor is polled to `Succeeded`, then that URL is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_can_be_where_the_create_answer_said() {
    let mut env = protocols_env().await;
    let op = env
        .submit(
            "azure-final-location",
            script("azure_monitor", serde_json::json!({})),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{done:?}");
    let job = done.remote_job_id.clone().unwrap();
    let calls = env.store.calls(op.id).await.unwrap();
    let result = calls.iter().find(|c| c.kind == "result").unwrap();
    assert!(
        result.url.contains(&format!("/v1/jobs/{job}/result")),
        "{}",
        result.url
    );
    assert!(
        calls
            .iter()
            .filter(|c| c.kind == "status")
            .all(|c| c.url.contains("/v1/operations/")),
        "polled at the monitor"
    );
    assert_eq!(done.result_summary.as_ref().unwrap()["items"]["total"], 5);
    env.stop_workers().await;
}

/// A hostile provider's text cannot make a step unwritable or the record unbounded: a status answer
/// whose state, update time, progress and status URL hold NUL and escape characters (PostgreSQL
/// refuses NUL in `text` and `jsonb`), a 64 KiB state and a 128 KiB progress; an answer that sets
/// 200 cookies; a rejection whose body is binary; an answer of 30 000 small objects, within the
/// answers' 256 KiB but some 19 MB parsed (refused as too large, and read again). Each step is
/// written (cleaned and cut), the job goes on to its end, and the cookie jar stays within its
/// bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_provider_text_is_recorded_cleaned_and_bounded() {
    let mut env = Env::new().await;
    let hostile = env
        .submit(
            "sim",
            serde_json::json!({
                "duration_ms": 600,
                "status_faults": {"1": "hostile_text", "2": "cookie_flood"},
            }),
            |_| {},
        )
        .await;
    let binary = env
        .submit(
            "sim",
            serde_json::json!({"create": ["reject_binary"]}),
            |_| {},
        )
        .await;
    let created = env
        .submit(
            "sim",
            serde_json::json!({"create": ["hostile_state"], "duration_ms": 300}),
            |_| {},
        )
        .await;
    let flood = env
        .submit(
            "sim",
            serde_json::json!({"duration_ms": 300, "status_faults": {"1": "value_flood"}}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let flooded = env.wait_settled(flood.id, T).await;
    assert_eq!(flooded.state, State::Succeeded, "{flooded:?}");
    let statuses: Vec<_> = env
        .store
        .calls(flood.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == "status")
        .collect();
    assert_eq!(
        statuses[0].error_class.as_deref(),
        Some("response_too_large"),
        "{statuses:?}"
    );
    assert!(statuses.len() >= 2, "read again: {statuses:?}");

    let done = env.wait_settled(hostile.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{done:?}");
    let history = env.store.history(done.id).await.unwrap();
    let unknown = history
        .iter()
        .find(|h| h.cause.contains("running\u{FFFD}"))
        .unwrap_or_else(|| panic!("the hostile state is recorded, cleaned: {history:#?}"));
    assert!(
        unknown.cause.len() < 1024,
        "cut: {} bytes",
        unknown.cause.len()
    );
    assert!(
        unknown.detail.to_string().len() < 8 * 1024,
        "progress and state cut: {} bytes",
        unknown.detail.to_string().len()
    );
    for h in &history {
        assert!(
            !h.cause.chars().any(|c| c.is_control() && c != '\n'),
            "{:?}",
            h.cause
        );
    }
    let calls = env.store.calls(done.id).await.unwrap();
    assert!(
        calls.iter().all(|c| !c.outcome.contains('\u{0}')),
        "{calls:?}"
    );
    let jar = done.provider_context["cookie_jar"].as_str().unwrap_or("");
    assert!(jar.len() <= 64 * 1024, "cookie jar of {} bytes", jar.len());
    assert!(!jar.contains("flood199"), "a flood of cookies is not kept");

    // A create answer's hostile state: the job is adopted, its state stored cleaned and cut.
    let adopted = env.wait_settled(created.id, T).await;
    assert_eq!(adopted.state, State::Succeeded, "{adopted:?}");
    let history = env.store.history(adopted.id).await.unwrap();
    let accepted = history
        .iter()
        .find(|h| h.event == "create_accepted")
        .unwrap();
    let state = accepted.detail["remote_state"].as_str().unwrap();
    assert!(state.starts_with("queued\u{FFFD}\u{FFFD}[2J"), "{state:?}");
    assert!(state.len() < 1024, "cut: {} bytes", state.len());

    let rejected = env.wait_settled(binary.id, T).await;
    assert_eq!(rejected.state, State::Failed, "{rejected:?}");
    let history = env.store.history(rejected.id).await.unwrap();
    let last = history.last().unwrap();
    assert!(
        last.cause.contains("r\u{FFFD}e\u{FFFD}j"),
        "the binary rejection is kept as text: {:?}",
        last.cause
    );
    env.stop_workers().await;
}
