//! Truthful states under hostile interleavings: each test is one way jobtrail used to tell an untruth
//! (or call a provider more often than it allowed), over a real PostgreSQL, the simulated provider
//! over real HTTP, and real worker processes wherever one must die or stall.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::{CancelRequest, State};
use std::time::{Duration, Instant};
use support::Env;

const T: Duration = Duration::from_secs(45);

/// Wait (bounded) until `pred` holds, polling every 20 ms.
async fn until(what: &str, timeout: Duration, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|f| f == "T"))
        })
        .unwrap_or(false)
}

/// Item 1: a worker sends create and is killed before it records the outcome; an agent cancels.
/// The job exists at the provider, so the operation is never `withdrawn`: the next worker settles
/// the create (same token), cancels the job it found, and waits for the provider's confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_a_worker_died_mid_create_cancels_the_job_instead_of_withdrawing() {
    let env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"create": ["slow_accept"], "create_delay_ms": 1500, "never_finish": true}),
            |_| {},
        )
        .await;
    let doomed = env.spawn_worker("doomed", "2s", &[]);
    let reference = op.id.to_string();
    until("the create to reach the provider", T, || {
        env.sim.ledger().references.contains_key(&reference)
    })
    .await;
    doomed.signal(libc::SIGKILL);
    env.store
        .request_cancel(op.id, CancelRequest::new("agent-7", "wrong range").unwrap())
        .await
        .unwrap();
    let noted = env.store.get(op.id).await.unwrap();
    assert_eq!(
        noted.state,
        State::CreatePending,
        "a send may be in flight: the cancel is noted, nothing is withdrawn"
    );
    assert!(noted.create_sent_epoch.is_some());
    drop(doomed);

    let _survivor = env.spawn_worker("survivor", "2s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Cancelled, "{}", env.logs());
    let ledger = env.sim.ledger();
    let jobs = &ledger.tokens[op.token.as_str()];
    assert_eq!(jobs.len(), 1, "one job for the token");
    let job = &ledger.jobs[&jobs[0]];
    assert_eq!(done.remote_job_id.as_ref(), Some(&jobs[0]));
    assert_eq!(job.state, "cancelled", "the provider cancelled the job");
    assert!(job.cancel_requests >= 1);
    let events: Vec<String> = env
        .store
        .history(op.id)
        .await
        .unwrap()
        .iter()
        .map(|h| h.event.clone())
        .collect();
    assert!(!events.contains(&"withdraw".to_string()), "{events:?}");
    assert!(
        events.contains(&"remote_cancelled".to_string()),
        "{events:?}"
    );
}

/// Item 2: the provider said `Retry-After: 3` on a status read; a cancel follows. The first poll
/// after the cancel call still waits for it (and so does every later one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_poll_after_a_cancel_waits_for_the_last_retry_after() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "poll_retry_after": 3, "cancel_delay_ms": 100}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    env.wait_state(op.id, State::Observing, T).await;
    env.store
        .request_cancel(op.id, CancelRequest::new("alice", "stop").unwrap())
        .await
        .unwrap();
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Cancelled);
    assert_eq!(
        env.sim.ledger().early_polls(),
        0,
        "a status read came before the provider's Retry-After"
    );
    env.stop_workers().await;
}

/// Item 3: status reads answered 429 without `Retry-After` back off (capped, jittered), each read
/// is counted, and every call carries its own attempt number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_429s_on_status_back_off_and_every_read_is_counted() {
    let mut env = Env::new().await;
    let faults: serde_json::Map<String, serde_json::Value> = (1..=200)
        .map(|n| (n.to_string(), serde_json::json!("too_many_requests_bare")))
        .collect();
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "status_faults": faults}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    env.wait_for(op.id, "the first status read", T, |o| o.poll_count >= 1)
        .await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    env.stop_workers().await;
    let window = started.elapsed();
    let op = env.store.get(op.id).await.unwrap();
    let job = &env.sim.ledger().jobs[op.remote_job_id.as_ref().unwrap()];
    let reads = job.calls["status"];
    // Backoff 200 ms doubling to a 2 s cap: about eight reads in those six seconds and the one
    // before; polling at the initial interval would have made thirty.
    assert!(
        reads <= 11,
        "{reads} status reads in {window:?} without Retry-After"
    );
    assert_eq!(op.poll_count as u32, reads, "every read is counted");
    let calls = env.store.calls(op.id).await.unwrap();
    let mut attempts: Vec<i32> = calls
        .iter()
        .filter(|c| c.kind == "status")
        .map(|c| c.attempt)
        .collect();
    let n = attempts.len();
    attempts.dedup();
    assert_eq!(
        attempts.len(),
        n,
        "status calls numbered 1..n: {attempts:?}"
    );
    assert_eq!(attempts, (1..=n as i32).collect::<Vec<_>>());
    assert_eq!(op.failure_count, 0, "a 429 is not a failure");
    // And `show` tells the same: the reads counted, each call under its own number.
    let show = support::run_bin(
        std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail")),
        &env.url,
        &support::providers_dir(),
        &["show", &op.id.to_string()],
        None,
    );
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "{text}");
    assert!(text.contains(&format!("polls {reads},")), "{text}");
    let mut shown: Vec<usize> = text
        .split("call status #")
        .skip(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        })
        .collect();
    shown.sort_unstable();
    assert_eq!(shown, (1..=n).collect::<Vec<_>>(), "{text}");
}

/// Item 4: every create attempt so far was definitively not created (429 with Retry-After); a
/// cancel withdraws the operation and no further create is sent. Here the cancel lands between
/// attempts, while no worker holds the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_create_retries_withdraws_without_another_create() {
    let env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"create": ["retry_after_seconds", "retry_after_seconds", "retry_after_seconds"], "retry_after_secs": 2}),
            |_| {},
        )
        .await;
    let _w = env.spawn_worker("w1", "5s", &[]);
    env.wait_for(op.id, "a first refused create", T, |o| {
        o.create_attempts >= 1
    })
    .await;
    let sent_before_cancel = env.sim.ledger().create_requests[op.token.as_str()];
    env.store
        .request_cancel(op.id, CancelRequest::new("alice", "not needed").unwrap())
        .await
        .unwrap();
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Withdrawn);
    // Past the provider's Retry-After: a worker that still meant to retry would have by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let ledger = env.sim.ledger();
    assert!(
        ledger.jobs_for_reference(&op.id.to_string()).is_empty(),
        "no job was created"
    );
    assert_eq!(
        ledger.create_requests[op.token.as_str()],
        sent_before_cancel,
        "no create after the cancel"
    );
}

/// Item 4, the worker's side: the cancel lands while a worker holds the lease and its create is at
/// the provider, which then refuses it (429). The worker, not the store, withdraws the operation
/// from what it learnt, and sends no second create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_noted_during_a_refused_create_is_withdrawn_by_the_worker() {
    let env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"create": ["retry_after_seconds", "retry_after_seconds"], "retry_after_secs": 1, "create_hold_ms": 1500}),
            |_| {},
        )
        .await;
    let _w = env.spawn_worker("w1", "10s", &[]);
    env.wait_for(
        op.id,
        "a worker holding the lease with a create marked",
        T,
        |o| o.lease_owner.is_some() && o.create_sent_epoch.is_some() && o.create_attempts == 0,
    )
    .await;
    let noted = env
        .store
        .request_cancel(op.id, CancelRequest::new("alice", "not needed").unwrap())
        .await
        .unwrap();
    assert_eq!(
        noted.record.state,
        State::CreatePending,
        "a create may be in flight: the cancel is only noted"
    );
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Withdrawn, "{}", env.logs());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let ledger = env.sim.ledger();
    assert_eq!(
        ledger.create_requests[op.token.as_str()],
        1,
        "the refused create was the only one"
    );
    assert!(ledger.jobs_for_reference(&op.id.to_string()).is_empty());
    let history = env.store.history(op.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.to_state, "withdrawn");
    assert_eq!(last.actor, "w1", "the worker withdrew it: {history:?}");
}

/// A worker told to stop (SIGTERM) between its claim and the operation's first call sends
/// nothing: the operation goes back, its create unsent and not marked as maybe sent, so the next
/// worker creates the job rather than reconciling one that was never asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopping_as_it_claims_gives_the_operation_back_unsent() {
    let env = Env::new().await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await;
    // The claim's thread is held 3 s before the first round, long enough for the signal.
    let mut w = env.spawn_worker(
        "stopping",
        "30s",
        &[("JOBTRAIL_FAULT", "slow_at:claimed:3000")],
    );
    let deadline = Instant::now() + T;
    while env.store.get(op.id).await.unwrap().lease_owner.is_none() {
        assert!(Instant::now() < deadline, "never claimed\n{}", env.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.signal(libc::SIGTERM);
    assert_eq!(
        w.wait_exit(Duration::from_secs(30)).and_then(|s| s.code()),
        Some(0),
        "{}",
        env.logs()
    );
    assert!(
        env.sim.ledger().create_requests.is_empty(),
        "no create left after the signal"
    );
    let back = env.store.get(op.id).await.unwrap();
    assert_eq!(back.state, State::CreatePending);
    assert_eq!(back.lease_owner, None, "given back");
    assert_eq!(back.create_sent_epoch, None, "not marked as maybe sent");
    // The next worker sends the create: no reconciliation of one never sent.
    let _next = env.spawn_worker("next", "5s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let history = env.store.history(op.id).await.unwrap();
    assert!(
        !history.iter().any(|h| h.event == "create_ambiguous"),
        "{history:#?}"
    );
}

/// Item 5: a worker stopped (SIGSTOP) after its claim marked the create and before it sent, for
/// longer than its lease. Another worker takes the operation over and settles it. On SIGCONT the
/// stale worker checks its lease against its monotonic clock right before the bytes would leave,
/// and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_does_not_send_when_it_resumes() {
    let env = Env::new().await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 200}), |_| {})
        .await;
    let paused = env.spawn_worker(
        "paused",
        "2s",
        &[("JOBTRAIL_FAULT", "stop_at:after_create_marked")],
    );
    until("the worker to stop before sending", T, || {
        stopped(paused.pid())
    })
    .await;
    let _fresh = env.spawn_worker("fresh", "2s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let before = env.sim.ledger().create_requests[op.token.as_str()];
    paused.signal(libc::SIGCONT);
    let calls_by = |who: &'static str| {
        let env = &env;
        async move {
            env.store
                .calls(op.id)
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.actor == who)
                .collect::<Vec<_>>()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls_by("paused").await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stale = calls_by("paused").await;
    assert_eq!(stale.len(), 1, "the resumed worker logged its one attempt");
    assert_eq!(
        stale[0].error_class.as_deref(),
        Some("lease_too_short_to_send"),
        "{stale:?}"
    );
    assert!(stale[0].http_status.is_none());
    assert_eq!(
        env.sim.ledger().create_requests[op.token.as_str()],
        before,
        "nothing reached the provider after SIGCONT"
    );
    assert_eq!(env.sim.ledger().tokens[op.token.as_str()].len(), 1);
    let after = env.store.get(op.id).await.unwrap();
    assert_eq!(after.state, State::Succeeded, "nothing stale landed");
    // The paused worker's mark was the guard: the fresh owner treated its unrecorded send as
    // ambiguous (settled by resending the token) rather than as never sent.
    let history = env.store.history(op.id).await.unwrap();
    assert!(
        history.iter().any(|h| h.event == "create_ambiguous"
            && h.actor == "fresh"
            && h.cause.contains("never recorded")),
        "{history:#?}"
    );
}

/// A lookup and its cross-checked resend are two calls under one lease, written as two steps. A
/// worker stopped (SIGSTOP) after the resend was answered, past its lease, has both refused when
/// it resumes; the resend (which started the job) is in the call log all the same, beside the
/// lookup: every create that reached the provider is on the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_answered_after_the_lease_ran_out_is_still_in_the_call_log() {
    let env = Env::new().await;
    // The first create's connection dropped, nothing created: the worker reconciles (a lookup that
    // finds nothing, then a resend that creates the job).
    let script = serde_json::json!({"create": ["drop_before_accept", "ok"], "duration_ms": 200});
    let op = env.submit("sim", script, |_| {}).await;
    let paused = env.spawn_worker(
        "paused",
        "2s",
        &[("JOBTRAIL_FAULT", "stop_at:after_resend")],
    );
    until("the worker to stop after its resend", T, || {
        stopped(paused.pid())
    })
    .await;
    // The next owner settles it.
    let _fresh = env.spawn_worker("fresh", "2s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    paused.signal(libc::SIGCONT);
    // The paused worker's calls, in the order it made them: the dropped create (written before
    // it stopped), then the lookup and the resend (logged after it resumed).
    let by_paused = || {
        let env = &env;
        async move {
            let mut calls: Vec<_> = env
                .store
                .calls(op.id)
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.actor == "paused")
                .collect();
            calls.sort_by_key(|c| c.started_at);
            calls
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while by_paused().await.len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = env.store.calls(op.id).await.unwrap();
    let summary: Vec<_> = calls
        .iter()
        .map(|c| (c.actor.as_str(), c.kind.as_str(), c.http_status))
        .collect();
    let paused_calls: Vec<_> = by_paused()
        .await
        .into_iter()
        .map(|c| {
            (
                c.kind,
                c.http_status.is_some_and(|s| (200..300).contains(&s)),
            )
        })
        .collect();
    assert_eq!(
        paused_calls,
        [
            ("create".to_owned(), false),
            ("lookup".to_owned(), true),
            ("create".to_owned(), true)
        ],
        "{summary:?}"
    );
    // Every create the provider received is in the call log (the dropped one too).
    let creates = calls.iter().filter(|c| c.kind == "create").count();
    assert_eq!(
        creates,
        env.sim.ledger().create_requests[op.token.as_str()] as usize,
        "{summary:?}"
    );
    // The late links keep the call chain whole.
    assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
}

/// Item 6: the worker that died mid-create had extended its lease past the create deadline. The
/// next owner still tries the reconciliation the contract offers once before asking a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_is_tried_once_even_when_the_takeover_comes_after_the_create_deadline() {
    let env = Env::new().await;
    let op = env
        .submit("sim-legacy", serde_json::json!({"duration_ms": 300}), |s| {
            s.create_deadline = Some(chrono::Utc::now() + chrono::Duration::seconds(3));
        })
        .await;
    let mut doomed = env.spawn_worker(
        "doomed",
        "2s",
        &[("JOBTRAIL_FAULT", "kill_after:after_create_marked")],
    );
    doomed
        .wait_exit(Duration::from_secs(30))
        .expect("the worker killed itself mid-create");
    let _late = env.spawn_worker("late", "2s", &[]);
    let done = env.wait_state(op.id, State::CreateUnresolved, T).await;
    let calls = env.store.calls(op.id).await.unwrap();
    let lookups: Vec<_> = calls
        .iter()
        .filter(|c| c.kind == "lookup" && c.actor == "late")
        .collect();
    assert_eq!(lookups.len(), 1, "one lookup, then a person: {calls:?}");
    assert!(lookups[0].started_at > done.create_deadline);
    assert!(
        calls.iter().all(|c| c.kind != "create"),
        "never resent blindly"
    );
    let history = env.store.history(op.id).await.unwrap();
    assert!(
        history
            .iter()
            .any(|h| h.event == "reconciliation_inconclusive"),
        "{:?}",
        history.iter().map(|h| &h.event).collect::<Vec<_>>()
    );
}

/// Item 7: a worker without a provider's contract does not claim that provider's operations; one
/// with it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_claims_only_providers_it_has_contracts_for() {
    let env = Env::new().await;
    let op = env
        .submit("sim-csv", serde_json::json!({"format": "csv"}), |_| {})
        .await;
    let mut only_sim = jobtrail_provider::Registry::default();
    only_sim.insert(env.registry.get("sim").unwrap().clone());
    let w = jobtrail_worker::Worker::new(
        env.store.clone(),
        only_sim,
        env.results.clone(),
        jobtrail_worker::WorkerConfig::named_default(),
    );
    let did = w.run_once().await.unwrap();
    assert_eq!(did.claimed, 0);
    let untouched = env.store.get(op.id).await.unwrap();
    assert_eq!(untouched.lease_epoch, 0, "never claimed, never deferred");
    assert!(untouched.next_action_at <= chrono::Utc::now());
    let all = jobtrail_worker::Worker::new(
        env.store.clone(),
        env.registry.clone(),
        env.results.clone(),
        jobtrail_worker::WorkerConfig::named_default(),
    );
    assert_eq!(all.run_once().await.unwrap().claimed, 1);
}

/// Item 8: the provider is down (every create attempt: connection refused, definitively never
/// sent). When the create deadline passes, jobtrail knows no job exists: `not_created`, final, with
/// the cause, not a question for a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_was_never_reached_ends_not_created_not_escalated() {
    let env = Env::new().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let op = env
        .submit("sim", serde_json::json!({}), |s| {
            s.create_deadline = Some(chrono::Utc::now() + chrono::Duration::seconds(3));
        })
        .await;
    let down = format!("http://127.0.0.1:{closed}");
    let _w = env.spawn_worker(
        "w1",
        "5s",
        &[("JOBTRAIL_PROVIDER_SIM_BASE_URL", down.as_str())],
    );
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::NotCreated, "{}", env.logs());
    assert!(done.escalated_at.is_none(), "nobody is asked");
    assert!(done.create_attempts >= 1);
    let last = env.store.history(op.id).await.unwrap().pop().unwrap();
    assert_eq!(last.event, "create_expired");
    assert!(
        last.cause.starts_with("create deadline passed"),
        "{}",
        last.cause
    );
    let calls = env.store.calls(op.id).await.unwrap();
    assert!(
        calls
            .iter()
            .all(|c| c.error_class.as_deref() == Some("connect_failed")),
        "{calls:?}"
    );
}
