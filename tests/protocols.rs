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
