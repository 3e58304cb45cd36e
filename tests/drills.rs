//! The essay's drills, end to end: a real PostgreSQL, the simulated provider over real HTTP, the real
//! worker loop, and real worker processes wherever a process has to die.

#[path = "support/mod.rs"]
mod support;

use jobtrail_core::{CancelRequest, State};
use std::time::{Duration, Instant};
use support::Env;

/// A person resumes `held`, an operation held in `result_stalled`, as `jobtrail-admin resume` does
/// (alice, on the view `held` is, for `reason`).
fn resume_stalled(env: &Env, held: &jobtrail_store::OperationRecord, reason: &str) {
    let out = support::run_bin(
        &support::admin_bin(),
        &env.url,
        &env.providers,
        &[
            "resume",
            &held.id.to_string(),
            "--seen",
            &format!("result_stalled@{}", held.history_seq),
            "--actor",
            "alice",
            "--reason",
            reason,
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const T: Duration = Duration::from_secs(40);

/// A job whose result is past 256 KiB, so it is checked on a thread handed over from the runtime
/// (and waits for one of the worker's turns at checking large results).
fn large_result() -> serde_json::Value {
    serde_json::json!({"duration_ms": 100, "items": 8000})
}

/// Drill 1: the create response is lost after the provider accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_lost_create_response_makes_exactly_one_remote_job() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"create": ["drop_after_accept"], "duration_ms": 300}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded);
    let ledger = env.sim.ledger();
    assert_eq!(
        ledger.tokens[op.token.as_str()].len(),
        1,
        "one logical operation, one remote job"
    );
    let history = env.history_states(&env.store.history(op.id).await.unwrap());
    assert!(
        history.contains(&"create_ambiguous:create_unknown".to_string()),
        "{history:?}"
    );
    assert!(
        history.contains(&"reconciliation_started:reconciliation".to_string()),
        "{history:?}"
    );
    env.stop_workers().await;
}

/// Drill 1, and the resend answers otherwise: refused (a provider that refuses a replayed key, say),
/// or with the finished result. Neither says anything against the job the first send created: the
/// refusal leaves the operation on the job the lookup found (never `failed` with a job running
/// unwatched), and the synchronous answer is collected at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_refused_or_synchronous_resend_settles_on_the_one_job() {
    let mut env = Env::new().await;
    let mut sync = vec!["drop_after_accept"];
    sync.extend(["sync"; 30]);
    let refused = env
        .submit(
            "sim",
            serde_json::json!({"create": ["drop_after_accept", "reject"], "duration_ms": 300}),
            |_| {},
        )
        .await;
    let answered = env
        .submit(
            "sim",
            serde_json::json!({"create": sync, "duration_ms": 300}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    for op in [&refused, &answered] {
        let done = env.wait_settled(op.id, T).await;
        let history = env.history_states(&env.store.history(op.id).await.unwrap());
        assert_eq!(done.state, State::Succeeded, "{history:?}");
        let ledger = env.sim.ledger();
        assert_eq!(ledger.tokens[op.token.as_str()].len(), 1, "one remote job");
        assert_eq!(
            ledger.create_requests[op.token.as_str()],
            2,
            "the first send and one resend: {history:?}"
        );
        assert!(
            !history.iter().any(|h| h.starts_with("create_rejected")),
            "{history:?}"
        );
    }
    let history = env.history_states(&env.store.history(answered.id).await.unwrap());
    assert!(
        history.contains(&"create_completed:result_collecting".to_string()),
        "the resend's result is the result: {history:?}"
    );
    env.stop_workers().await;
}

/// Drill 2: a worker process is SIGKILLed after saving the job id and before scheduling the first
/// poll. Another worker resumes after the lease expires; no second create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_worker_killed_after_saving_the_job_id_resumes_without_a_second_create() {
    let env = Env::new().await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 300}), |_| {})
        .await;
    let mut a = env.spawn_worker(
        "doomed",
        "2s",
        &[("JOBTRAIL_FAULT", "kill_after:after_create_accepted")],
    );
    let status = a
        .wait_exit(Duration::from_secs(30))
        .expect("the worker killed itself at the fault point");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "died by SIGKILL");
    let saved = env.store.get(op.id).await.unwrap();
    assert_eq!(
        saved.state,
        State::Accepted,
        "the job id was saved before the kill"
    );
    assert!(saved.remote_job_id.is_some());
    assert_eq!(
        saved.lease_owner.as_deref(),
        Some("doomed"),
        "its lease outlives it"
    );

    let _b = env.spawn_worker("survivor", "2s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded);
    let ledger = env.sim.ledger();
    let job = &ledger.jobs[saved.remote_job_id.as_ref().unwrap()];
    assert_eq!(job.calls.get("create"), Some(&1), "no second create");
    assert_eq!(ledger.tokens[op.token.as_str()].len(), 1);
    let calls = env.store.calls(op.id).await.unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c.actor == "survivor" && c.kind == "status"),
        "the survivor polled"
    );
}

/// A result whose check outlasts the lease (a large one checked on a busy worker, slowed here to
/// 24 s: the lease, 2 s, was made to cover the fetch's 20 s wait for room, so it has some 22 s left
/// when the check starts) keeps its lease while it is checked: the other worker never takes it
/// over, no holder is counted lost, it is fetched once and collected, never held for a person as
/// `result_stalled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_check_that_outlasts_the_lease_keeps_it() {
    let env = Env::new().await;
    let op = env.submit("sim", large_result(), |_| {}).await;
    let slow = [("JOBTRAIL_FAULT", "slow_at:result_checking:24000")];
    let _a = env.spawn_worker("slow-a", "2s", &slow);
    let _b = env.spawn_worker("slow-b", "2s", &slow);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let job = done.remote_job_id.clone().unwrap();
    assert_eq!(
        env.sim.ledger().jobs[&job].calls.get("result").copied(),
        Some(1),
        "fetched once: never taken over mid-check"
    );
    let history = env.store.history(op.id).await.unwrap();
    let holders: std::collections::BTreeSet<_> = history
        .iter()
        .filter(|h| h.to_state == "result_collecting" || h.to_state == "succeeded")
        .map(|h| h.actor.clone())
        .collect();
    assert_eq!(holders.len(), 1, "one holder collected it: {holders:?}");
}

/// A check that never ends (a result directory whose fsync hangs; slowed here to 90 s) keeps the
/// lease only for `--check-within` (3 s): the lease (stretched to cover the fetch's wait for
/// room, some 22 s) then lapses, another worker takes the operation over and collects the result,
/// and the stuck worker says why it let go. Kept alive for as long as the check ran, the operation
/// was the stuck worker's for the whole 90 s. (One slot, which the stuck check holds: it cannot
/// claim the operation back itself, as a worker with free slots would, counting itself lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_check_that_never_ends_lets_its_lease_lapse() {
    let env = Env::new().await;
    let op = env.submit("sim", large_result(), |_| {}).await;
    let stuck = env.spawn_worker(
        "stuck",
        "2s",
        &[
            ("JOBTRAIL_FAULT", "slow_at:result_checking:90000"),
            ("JOBTRAIL_CHECK_WITHIN", "3s"),
            ("JOBTRAIL_CONCURRENCY", "1"),
        ],
    );
    env.wait_for(op.id, "the stuck worker collecting", T, |o| {
        o.state == State::ResultCollecting && o.lease_owner.as_deref() == Some("stuck")
    })
    .await;
    let _taker = env.spawn_worker("taker", "2s", &[]);
    let done = env.wait_settled(op.id, Duration::from_secs(60)).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let history = env.store.history(op.id).await.unwrap();
    let collector = history
        .iter()
        .find(|h| h.to_state == "succeeded")
        .map(|h| h.actor.clone());
    assert_eq!(
        collector.as_deref(),
        Some("taker"),
        "taken over and collected"
    );
    let said = std::fs::read_to_string(&stuck.log).unwrap();
    assert!(
        said.contains("longer than --check-within"),
        "the stuck worker says why it let the lease lapse"
    );
}

/// Large results queue for the worker's two turns at checking, and a wait for a turn is no part of
/// a check: a result whose own check fits `--check-within` keeps its lease however long it waited.
/// The third of three here waits some 15 s for a turn and is then checked for 15 s, against a
/// `--check-within` of 20 s and a lease the fetch stretched to some 22 s: each is fetched once.
/// Counted from when the keeping began, the third let its lease lapse, and its worker, with slots
/// free, took it back as a lost holder's and fetched it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_result_waiting_for_a_turn_to_be_checked_keeps_its_lease() {
    let env = Env::new().await;
    let mut ops = Vec::new();
    for _ in 0..3 {
        ops.push(env.submit("sim", large_result(), |_| {}).await);
    }
    let _w = env.spawn_worker(
        "queued",
        "2s",
        &[
            ("JOBTRAIL_FAULT", "slow_at:result_checking:15000"),
            ("JOBTRAIL_CHECK_WITHIN", "20s"),
        ],
    );
    for op in &ops {
        let done = env.wait_settled(op.id, Duration::from_secs(90)).await;
        assert_eq!(done.state, State::Succeeded, "{}", env.logs());
        let job = done.remote_job_id.clone().unwrap();
        assert_eq!(
            env.sim.ledger().jobs[&job].calls.get("result").copied(),
            Some(1),
            "fetched once: its lease kept while it waited for a turn"
        );
    }
}

/// A result whose collection kills the worker collecting it (one too large for its memory, say)
/// is not taken up again for ever: a claim counts each holder lost before it, the claim after the
/// third lost in a row holds the operation for a person without fetching again, and the person's
/// resume has it collected afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_result_that_keeps_killing_its_workers_is_held_for_a_person() {
    use jobtrail_core::decide::STALLED_AFTER_TAKEOVERS;
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new().await;
    let op = env
        .submit("sim", serde_json::json!({"duration_ms": 100}), |_| {})
        .await;
    for n in 1..=STALLED_AFTER_TAKEOVERS {
        let mut doomed = env.spawn_worker(
            &format!("doomed-{n}"),
            "2s",
            &[("JOBTRAIL_FAULT", "kill_after:result_fetched")],
        );
        let status = doomed
            .wait_exit(Duration::from_secs(30))
            .expect("the worker killed itself collecting the result");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "died by SIGKILL");
        let lost = env.store.get(op.id).await.unwrap();
        assert_eq!(lost.state, State::ResultCollecting);
        assert_eq!(lost.lease_owner, Some(format!("doomed-{n}")));
        assert_eq!(
            lost.takeovers,
            n - 1,
            "its claim counted the holders lost before it"
        );
    }
    let _survivor = env.spawn_worker("survivor", "2s", &[]);
    let held = env.wait_settled(op.id, T).await;
    assert_eq!(held.state, State::ResultStalled, "{}", env.logs());
    let reason = held.escalation_reason.clone().unwrap();
    assert!(reason.contains("3 workers in a row"), "{reason}");
    // A lost holder's call is never recorded (it goes in with the step it never wrote): the
    // provider's own count tells.
    let job = held.remote_job_id.clone().unwrap();
    let fetched = || env.sim.ledger().jobs[&job].calls.get("result").copied();
    assert_eq!(fetched(), Some(3), "one fetch per lost holder, no fourth");

    // A person made room for the result and resumes it: fetched and checked again, and kept.
    resume_stalled(&env, &held, "raised the workers' memory limit");
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    assert_eq!(fetched(), Some(4));
    let calls = env.store.calls(op.id).await.unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c.kind == "result" && c.actor == "survivor"),
        "the survivor's fetch is recorded"
    );
    let history = env.store.history(op.id).await.unwrap();
    let events: Vec<&str> = history.iter().map(|h| h.event.as_str()).collect();
    let stalled = events.iter().position(|e| *e == "result_stalled").unwrap();
    assert_eq!(
        &events[stalled..],
        ["result_stalled", "resume", "result_validated"],
        "{events:?}"
    );
}

/// Results' bytes are held from their fetch until their step is written, within a room of the
/// worker's (half its check room): a fetch first takes the most its contract lets the result be.
/// With room for one 1 MiB result (the sim contract's `max_bytes`), four due results are fetched
/// one at a time, and every one succeeds; a worker with room for them fetches them together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_results_bytes_in_flight_stay_within_the_workers_room() {
    let env = Env::new().await;
    let slow_download = serde_json::json!({"duration_ms": 100, "result_delay_ms": 700});
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(env.submit("sim", slow_download.clone(), |_| {}).await.id);
    }
    // A lease shorter than the call's budget and a margin: the wait for room extends it rather
    // than put the fetch off (one put off would show its reason in the row for 5 s).
    let mut narrow = env.spawn_worker("narrow-bytes", "5s", &[("JOBTRAIL_CHECK_MIB", "2")]);
    let deadline = Instant::now() + T;
    loop {
        let mut settled = 0;
        for id in &ids {
            let op = env.store.get(*id).await.unwrap();
            assert!(
                !op.next_action_reason.contains("room for results' bytes"),
                "a fetch was put off for room it could have waited for"
            );
            settled += usize::from(!op.state.is_automated());
        }
        if settled == ids.len() {
            break;
        }
        assert!(Instant::now() < deadline, "{}", env.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        let done = env.wait_settled(*id, T).await;
        assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    }
    assert_eq!(
        env.sim.ledger().max_results_in_flight,
        1,
        "a 1 MiB room holds one 1 MiB result at a time"
    );
    narrow.signal(libc::SIGTERM);
    assert!(narrow.wait_exit(Duration::from_secs(30)).is_some());

    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(env.submit("sim", slow_download.clone(), |_| {}).await.id);
    }
    let _roomy = env.spawn_worker("roomy-bytes", "30s", &[("JOBTRAIL_CHECK_MIB", "64")]);
    for id in &ids {
        let done = env.wait_settled(*id, T).await;
        assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    }
    assert!(
        env.sim.ledger().max_results_in_flight > 1,
        "a 32 MiB room fetches them together"
    );
}

/// A result whose parse would take more memory than the worker gives the results it checks is
/// never parsed: it is held for a person at once, no worker killed, while a small result on the
/// same worker is checked as ever; resumed where there is room, it is collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_result_beyond_the_workers_check_memory_is_held_not_parsed() {
    let env = Env::new().await;
    // 5 000 items of about 45 bytes: some 220 KiB of text, a few MiB parsed.
    let large = env
        .submit("sim", serde_json::json!({"items": 5000}), |_| {})
        .await;
    let small = env
        .submit("sim", serde_json::json!({"items": 3}), |_| {})
        .await;
    let mut narrow = env.spawn_worker("narrow", "5s", &[("JOBTRAIL_CHECK_MIB", "1")]);
    let held = env.wait_settled(large.id, T).await;
    assert_eq!(held.state, State::ResultStalled, "{}", env.logs());
    let last = env.store.history(large.id).await.unwrap().pop().unwrap();
    assert_eq!(last.event, "result_beyond_check_memory");
    let kept = last.detail["evidence"]["kept_for_inspection"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", last.detail));
    assert!(
        kept.starts_with("postgres:operation_results/"),
        "kept for inspection: {kept}"
    );
    let reason = held.escalation_reason.clone().unwrap();
    assert!(reason.contains("more than the 1 MiB"), "{reason}");
    let log = std::fs::read_to_string(env.dir.join("narrow.log")).unwrap();
    assert!(
        log.contains("room for checking results: 1 MiB (--check-mib)"),
        "the room is said at start"
    );
    assert_eq!(
        env.wait_settled(small.id, T).await.state,
        State::Succeeded,
        "a result that fits is checked on the same worker"
    );
    assert!(
        narrow.wait_exit(Duration::from_millis(100)).is_none(),
        "no worker was killed"
    );
    narrow.signal(libc::SIGTERM);
    assert!(narrow.wait_exit(Duration::from_secs(30)).is_some());

    let _roomy = env.spawn_worker("roomy", "5s", &[]);
    resume_stalled(&env, &held, "a worker with room for it");
    let done = env.wait_settled(large.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    let summary = done.result_summary.unwrap();
    assert_eq!(summary["items"]["total"], 5000, "{summary}");
}

/// Drill 3: a terminal success races a cancel. The outcome and the order are recorded truthfully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_success_racing_a_cancel_is_recorded_truthfully() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "cancel": "lose_race"}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    env.wait_state(op.id, State::Observing, T).await;
    env.store
        .request_cancel(
            op.id,
            CancelRequest::new("alice", "wrong date range").unwrap(),
        )
        .await
        .unwrap();
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(
        done.state,
        State::Succeeded,
        "the job crossed its commit point first"
    );
    assert!(done.finished_before_cancel());
    assert_eq!(done.cancel_requested_by.as_deref(), Some("alice"));
    let states: Vec<String> = env
        .store
        .history(op.id)
        .await
        .unwrap()
        .iter()
        .map(|h| h.to_state.clone())
        .collect();
    let pos = |s: &str| {
        states
            .iter()
            .position(|x| x == s)
            .unwrap_or_else(|| panic!("{s} missing from {states:?}"))
    };
    assert!(pos("cancel_requested") < pos("cancelling"));
    assert!(pos("cancelling") < pos("result_collecting"));
    assert!(pos("result_collecting") < pos("succeeded"));
    assert!(
        !states.contains(&"cancelled".to_string()),
        "never claims a cancel the provider did not confirm"
    );
    env.stop_workers().await;
}

/// A cancel asked for while a status read is out: the read's answer (decided before the cancel
/// arrived, with a Retry-After of 8 s) does not hold the cancel past its 6 s window. The cancel is
/// sent at once, and the operation is never "unconfirmed" without the provider having been asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asked_while_a_status_read_is_out_is_sent_at_once() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "status_delay_ms": 1500, "poll_retry_after": 8}),
            |s| s.cancel_window = Some(Duration::from_secs(6)),
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    // `accepted` lasts while the first status read is out (1.5 s).
    let accepted = env.wait_state(op.id, State::Accepted, T).await;
    env.cancel(op.id).await;
    let job = accepted.remote_job_id.expect("accepted names the job");
    let asked = std::time::Instant::now();
    while env.sim.ledger().jobs[&job].cancel_requests == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(4),
            "the cancel was not sent within 4 s: {:?}",
            env.history_states(&env.store.history(op.id).await.unwrap())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(env.sim.ledger().jobs[&job].cancel_requests, 1);
    // The provider's Retry-After holds the next read past the window: unconfirmed, but asked.
    assert!(
        matches!(
            done.state,
            State::CancellationUnconfirmed | State::Cancelled
        ),
        "{:?}",
        done.state
    );
    env.stop_workers().await;
}

/// A status read out when a cancel request lands, answering "cancelled" (the job was cancelled on
/// the provider's side): its step, decided before the request, no longer fits and is dropped. The
/// worker gives its lease back at once, so the operation goes on to its cancel now, not when a
/// 10 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_dropped_because_a_cancel_landed_gives_its_lease_back() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"outcome": "cancelled", "duration_ms": 300, "status_delay_ms": 800}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    env.wait_state(op.id, State::Accepted, T).await;
    env.cancel(op.id).await;
    let asked = std::time::Instant::now();
    let done = env.wait_settled(op.id, T).await;
    let history = env.history_states(&env.store.history(op.id).await.unwrap());
    assert_eq!(done.state, State::Cancelled, "{history:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(7),
        "settled {:?} after the cancel request: {history:?}",
        asked.elapsed()
    );
    env.stop_workers().await;
}

/// A never-finishing job's cancel under a contract whose cancel is `idempotent` (or not), the sim
/// scripted with `script`: the operation ends cancelled, and the cancel calls the provider got.
async fn cancel_calls(idempotent: bool, script: serde_json::Value) -> u32 {
    let mut env = Env::with_edited_contracts(&[(
        "sim.toml",
        "idempotent = true",
        &format!("idempotent = {idempotent}"),
    )])
    .await;
    let op = env
        .submit("sim", script, |s| {
            s.cancel_window = Some(Duration::from_secs(20))
        })
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let observing = env.wait_state(op.id, State::Observing, T).await;
    env.cancel(op.id).await;
    let done = env.wait_settled(op.id, T).await;
    let history = env.history_states(&env.store.history(op.id).await.unwrap());
    assert_eq!(
        done.state,
        State::Cancelled,
        "idempotent {idempotent}: {history:?}"
    );
    let job = observing.remote_job_id.expect("a job");
    let sent = env.sim.ledger().jobs[&job].cancel_requests;
    env.stop_workers().await;
    sent
}

/// A cancel the provider defers ("429, retry after 1 s", twice) under a contract whose cancel is not
/// idempotent: a deferral did nothing, so the cancel is sent again after the wait and confirmed (it
/// was never sent again: the operation polled until its window ran out, unconfirmed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_cancel_is_sent_again_even_when_not_idempotent() {
    let script = serde_json::json!({"never_finish": true, "cancel_throttled": 2});
    assert_eq!(cancel_calls(false, script).await, 3);
}

/// A cancel answered 503 with `Retry-After` (a gateway that gave up waiting after it forwarded
/// the cancel; the provider made it) is no "not now": where the contract says cancel is not
/// idempotent it is never sent again, and the status reads see the job cancelled. Where it is
/// idempotent it is sent again after the wait. Before, the 503 read as a deferral and a cancel
/// that may not be repeated was sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_answered_503_is_sent_again_only_where_the_contract_allows() {
    for (idempotent, sent) in [(false, 1), (true, 2)] {
        let script = serde_json::json!({"never_finish": true, "cancel_unavailable": 1});
        assert_eq!(
            cancel_calls(idempotent, script).await,
            sent,
            "idempotent {idempotent}"
        );
    }
}

/// A finished job whose result download is refused `refusals` times (script knob `knob`): it is
/// still collected, each refusal recorded, `spent` of them from the failure budget.
async fn collected_after_refusals(knob: &str, refusals: usize, spent: i32) {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"duration_ms": 200, knob: refusals}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    let history = env.history_states(&env.store.history(op.id).await.unwrap());
    assert_eq!(done.state, State::Succeeded, "{knob}: {history:?}");
    let refused = history
        .iter()
        .filter(|h| h.starts_with("result_fetch_failed"))
        .count();
    assert_eq!(refused, refusals, "{knob}: each is recorded: {history:?}");
    assert_eq!(done.failure_count, spent, "{knob}: failures spent");
    env.stop_workers().await;
}

/// A provider that answers the result download "429, retry after 1 s" eight times (more than the
/// sim contract's six failures): the finished job's result is still collected, each "not now" waited
/// out, none spent from the failure budget (it ended `result_unavailable`, terminal, for a job that
/// had succeeded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_rate_limits_downloads_still_delivers_the_result() {
    collected_after_refusals("result_throttled", 8, 0).await;
}

/// A result URL that answers 403 for a while (a storage gateway's or a CDN's passing refusal)
/// does not say the finished job's result is gone: it is read again within the failure budget and
/// collected, each 403 spent from the budget. Before, any 4xx ended the paid job
/// `result_unavailable` on one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_refused_with_a_403_is_read_again_and_collected() {
    collected_after_refusals("result_forbidden", 2, 2).await;
}

/// A result URL the status names that has expired by the time it is read (a pre-signed URL: the
/// store answers 403 "Request has expired"): the status is read again for a fresh URL and the
/// result collected from that one. Before, the dead URL was read again until the failure budget
/// ran out, and a paid job that had succeeded ended without its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_result_url_is_renewed_from_the_status_and_the_result_collected() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            // Each status answer names where to read it next, and each is followed: the status
            // read for a fresh URL too.
            serde_json::json!({"duration_ms": 200, "result_urls_expired": 2, "moving_status_url": true}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    let history = env.history_states(&env.store.history(op.id).await.unwrap());
    assert_eq!(done.state, State::Succeeded, "{history:?}");
    let tail: Vec<&str> = history
        .iter()
        .map(String::as_str)
        .skip_while(|h| !h.starts_with("result_fetch_failed"))
        .collect();
    assert_eq!(
        tail,
        [
            "result_fetch_failed:result_collecting",
            "result_url_renewed:result_collecting",
            "result_fetch_failed:result_collecting",
            "result_url_renewed:result_collecting",
            "result_validated:succeeded",
        ],
        "{history:?}"
    );
    assert_eq!(done.failure_count, 2, "each refused download is spent");
    // Each dead URL was read once, then the status for a fresh one (the signature in the recorded
    // URL is redacted: which URL was read is the adapter test's to show).
    let calls = env.store.calls(op.id).await.unwrap();
    let collecting: Vec<(&str, Option<i32>)> = calls
        .iter()
        .skip_while(|c| c.kind != "result")
        .map(|c| (c.kind.as_str(), c.http_status))
        .collect();
    assert_eq!(
        collecting,
        [
            ("result", Some(403)),
            ("status", Some(200)),
            ("result", Some(403)),
            ("status", Some(200)),
            ("result", Some(200)),
        ]
    );
    let status_reads: Vec<&str> = calls
        .iter()
        .filter(|c| c.kind == "status")
        .map(|c| c.url.as_str())
        .collect();
    let mut distinct = status_reads.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        status_reads.len(),
        "a status URL read twice: {status_reads:?}"
    );
    let last = status_reads.last().unwrap();
    let n: u32 = last.rsplit('/').next().unwrap().parse().unwrap();
    assert_eq!(
        done.status_url.as_deref(),
        Some(format!("{}/{}", last.rsplit_once('/').unwrap().0, n + 1).as_str()),
        "the URL the last status read named is the one kept: {status_reads:?}"
    );
    env.stop_workers().await;
}

/// Drill 4: a cancel the provider never confirms ends in cancellation_unconfirmed, with the evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_unconfirmed_cancel_escalates_with_the_evidence_bundle() {
    let mut env = Env::new().await;
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "cancel": "ignore"}),
            |s| s.cancel_window = Some(Duration::from_secs(2)),
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    env.wait_state(op.id, State::Observing, T).await;
    env.store
        .request_cancel(op.id, CancelRequest::new("bob", "budget exceeded").unwrap())
        .await
        .unwrap();
    let done = env
        .wait_state(op.id, State::CancellationUnconfirmed, T)
        .await;
    assert!(done.escalated_at.is_some());
    let last = env.store.history(op.id).await.unwrap().pop().unwrap();
    assert_eq!(last.event, "cancel_deadline_passed");
    let bundle = &last.detail["evidence"];
    assert_eq!(
        bundle["remote_job_id"].as_str(),
        done.remote_job_id.as_deref()
    );
    assert_eq!(bundle["trace_id"], done.trace_id.to_string());
    let calls = bundle["calls"].as_array().unwrap();
    assert!(
        calls.iter().any(|c| c["kind"] == "cancel"
            && c["provider_request_id"]
                .as_str()
                .is_some_and(|r| r.starts_with("req_cancel_"))),
        "{calls:?}"
    );
    let ledger = env.sim.ledger();
    assert_eq!(
        ledger.jobs[done.remote_job_id.as_ref().unwrap()].cancel_requests,
        1,
        "one cancel call"
    );
    env.stop_workers().await;
}

/// Drill 5: a worker paused (SIGSTOP) past its lease while another takes over, then resumed: its
/// write is refused and it makes no further call for that operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_stale_lease_after_sigstop_is_fenced_out() {
    let env = Env::new().await;
    let op = env.submit("sim", serde_json::json!({"create": ["slow_accept"], "create_delay_ms": 1500, "duration_ms": 300}), |_| {}).await;
    let a = env.spawn_worker("stale", "2s", &[]);
    // Pause the worker while its create is in flight at the provider.
    let deadline = std::time::Instant::now() + T;
    while !env.sim.ledger().references.contains_key(&op.id.to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the create never arrived\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.signal(libc::SIGSTOP);
    let paused_at = chrono::Utc::now();
    let stale_epoch = env.store.get(op.id).await.unwrap().lease_epoch;
    let _b = env.spawn_worker("fresh", "2s", &[]);
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded);
    assert!(done.lease_epoch > stale_epoch);
    a.signal(libc::SIGCONT);
    // Give the resumed worker time to finish its stale step and try to write.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let calls = env.store.calls(op.id).await.unwrap();
        if calls.iter().any(|c| c.actor == "stale") || std::time::Instant::now() > give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = env.store.calls(op.id).await.unwrap();
    let stale: Vec<_> = calls.iter().filter(|c| c.actor == "stale").collect();
    assert!(
        stale.iter().all(|c| c.started_at < paused_at),
        "the stale worker called after losing its lease: {stale:?}"
    );
    assert!(stale.iter().all(|c| c.lease_epoch == stale_epoch));
    let history = env.store.history(op.id).await.unwrap();
    assert!(
        history
            .iter()
            .all(|h| h.actor != "stale" || h.at < paused_at),
        "a stale write landed"
    );
    assert_eq!(
        env.sim.ledger().tokens[op.token.as_str()].len(),
        1,
        "still one remote job"
    );
    assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
}

/// Drill 6: the same token answered with a different job id: escalated, both answers kept, no more
/// calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_same_token_different_job_id_stops_automation() {
    let mut env = Env::new().await;
    let op = env.submit("sim", serde_json::json!({"create": ["ambiguous_after_accept", "different_job_id"], "never_finish": true}), |_| {}).await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_state(op.id, State::ContractViolation, T).await;
    let (a, b) = (
        done.remote_job_id.clone().unwrap(),
        done.conflicting_remote_job_id.clone().unwrap(),
    );
    assert_ne!(a, b, "both answers are kept");
    let mut jobs = env.sim.ledger().tokens[op.token.as_str()].clone();
    jobs.sort();
    let mut ours = vec![a, b];
    ours.sort();
    assert_eq!(jobs, ours);
    let requests = env.sim.ledger().requests;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        env.sim.ledger().requests,
        requests,
        "no more calls after the violation"
    );
    assert_eq!(
        env.store.get(op.id).await.unwrap().state,
        State::ContractViolation
    );
    env.stop_workers().await;
}

/// Drill 7: result_timed_out, result_validation_failed, result_unavailable and a partial batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_result_endings_land_where_the_state_machine_says() {
    let mut env = Env::new().await;
    let timeout = env
        .submit("sim", serde_json::json!({"never_finish": true}), |s| {
            let now = chrono::Utc::now();
            s.create_deadline = Some(now + chrono::Duration::seconds(2));
            s.result_deadline = Some(now + chrono::Duration::seconds(2));
        })
        .await;
    let invalid = env
        .submit("sim", serde_json::json!({"result": "bad_checksum"}), |_| {})
        .await;
    let gone = env
        .submit("sim", serde_json::json!({"result": "gone"}), |_| {})
        .await;
    let partial = env
        .submit(
            "sim",
            serde_json::json!({"result": "partial_batch", "items": 6}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));

    let t = env.wait_settled(timeout.id, T).await;
    assert_eq!(t.state, State::ResultTimedOut);
    assert!(
        t.remote_job_id.is_some(),
        "the record keeps what is needed to reconcile or cancel later"
    );
    assert!(t.escalated_at.is_some());

    let v = env.wait_settled(invalid.id, T).await;
    assert_eq!(v.state, State::ResultValidationFailed);
    assert!(
        v.result_summary
            .as_ref()
            .unwrap()
            .to_string()
            .contains("checksum")
    );

    // The rejected bytes are kept for whoever investigates, where the history link says.
    let rejected = env
        .store
        .history(invalid.id)
        .await
        .unwrap()
        .into_iter()
        .find_map(|h| {
            let kept = &h.detail["evidence"];
            Some((
                kept["kept_for_inspection"].as_str()?.to_owned(),
                kept["sha256"].as_str()?.to_owned(),
            ))
        })
        .expect("the rejected result's location is in its history");
    assert!(
        jobtrail_worker::ResultStore::read_verified(&env.store, &rejected.0, &rejected.1)
            .await
            .is_ok(),
        "{rejected:?}"
    );

    let g = env.wait_settled(gone.id, T).await;
    assert_eq!(g.state, State::ResultUnavailable);

    let p = env.wait_settled(partial.id, T).await;
    assert_eq!(
        p.state,
        State::Succeeded,
        "a partial batch is a success with its failures named"
    );
    let summary = p.result_summary.clone().unwrap();
    assert_eq!(summary["items"]["total"], 6);
    assert_eq!(summary["items"]["failed"], 3);
    assert_eq!(
        summary["items"]["failed_refs"],
        serde_json::json!(["item_2", "item_4", "item_6"])
    );
    // Each failure says why, in the provider's words: its status value and its error.
    assert_eq!(
        summary["items"]["failures"][0]["why"],
        "status \"failed\"; error: upstream timeout"
    );
    let bytes = jobtrail_worker::ResultStore::read_verified(
        &env.store,
        p.result_location.as_deref().unwrap(),
        p.result_sha256.as_deref().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(bytes.len() as i64, p.result_size.unwrap());
    // What each row tells its agent of the result is what its chain records.
    for id in [timeout.id, invalid.id, gone.id, partial.id] {
        let report = env.store.verify_operation(id).await.unwrap();
        assert!(report.is_clean(), "{id}: {:#?}", report.breaks);
    }
    env.stop_workers().await;
}

/// Results are kept in the database by default, with the step that records them: readable from any
/// host, checked against the recorded digest on the way out, synchronous answers included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_kept_in_the_database_and_checked_on_the_way_out() {
    let mut env = Env::new().await;
    let polled = env.submit("sim", serde_json::json!({}), |_| {}).await;
    let sync = env
        .submit("sim", serde_json::json!({"create": ["sync"]}), |_| {})
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    for id in [polled.id, sync.id] {
        let op = env.wait_settled(id, T).await;
        assert_eq!(op.state, State::Succeeded, "{id}");
        let loc = op.result_location.clone().unwrap();
        assert!(loc.starts_with("postgres:operation_results/"), "{loc}");
        let bytes = jobtrail_worker::ResultStore::read_verified(
            &env.store,
            &loc,
            op.result_sha256.as_deref().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(bytes.len() as i64, op.result_size.unwrap());
        if id == sync.id {
            // A synchronous result is the provider's own bytes (here pretty-printed), not a
            // re-serialisation of them: its digest is a digest of what the provider sent.
            let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(doc["items"].as_array().unwrap().len(), 5);
            assert_eq!(
                String::from_utf8(bytes.to_vec()).unwrap(),
                serde_json::to_string_pretty(&doc).unwrap(),
                "kept as sent"
            );
        }
    }
    env.stop_workers().await;
    // Bytes altered behind jobtrail's back (the table refuses changes, so only an owner who first
    // disables its triggers can do it) are caught by the digest.
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&env.url).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE operation_results DISABLE TRIGGER USER; \
         UPDATE operation_results SET bytes = bytes || '\\x00'::bytea, size = size + 1; \
         ALTER TABLE operation_results ENABLE TRIGGER USER;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let op = env.store.get(polled.id).await.unwrap();
    let err = jobtrail_worker::ResultStore::read_verified(
        &env.store,
        op.result_location.as_deref().unwrap(),
        op.result_sha256.as_deref().unwrap(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("altered"), "{err}");
}

/// With `--result-dir`, results are durable files under that directory instead, and nothing is kept
/// in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_directory_keeps_results_as_files() {
    let mut env = Env::new().await;
    let root = env.dir.join("results");
    env.results = jobtrail_worker::ResultStore::directory(&root);
    let op = env.submit("sim", serde_json::json!({}), |_| {}).await;
    env.start_worker("w1", Duration::from_secs(10));
    let op = env.wait_settled(op.id, T).await;
    env.stop_workers().await;
    assert_eq!(op.state, State::Succeeded);
    let loc = op.result_location.clone().unwrap();
    let path = loc.strip_prefix("file://").expect("a file location");
    assert!(path.starts_with(root.to_str().unwrap()), "{path}");
    let sha = op.result_sha256.as_deref().unwrap();
    let bytes = jobtrail_worker::ResultStore::read_verified(&env.store, &loc, sha)
        .await
        .unwrap();
    assert_eq!(bytes.len() as i64, op.result_size.unwrap());
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&env.url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM operation_results")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 0);
    // Over HTTP (the API reads the worker's file on this host): served while intact.
    let server = env.serve_with("api", &[]);
    let token = env.token("e2e", &["read"]).await;
    let c = support::http();
    let fetch = || {
        c.get(server.url(&format!("/v1/operations/{}/result", op.id)))
            .bearer_auth(&token)
            .send()
    };
    assert_eq!(fetch().await.unwrap().status(), reqwest::StatusCode::OK);
    std::fs::write(path, b"tampered").unwrap();
    let err = jobtrail_worker::ResultStore::read_verified(&env.store, &loc, sha)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("altered"), "{err}");
    // Altered bytes are evidence that disagrees; the caller is not told where they are kept.
    let r = fetch().await.unwrap();
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["kind"], "tampered", "{p}");
    assert!(!p.to_string().contains(path), "{p}");
    // A file this host cannot see is not evidence of anything: unavailable, path unsaid.
    std::fs::remove_file(path).unwrap();
    let r = fetch().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["kind"], "unavailable", "{p}");
    assert!(!p.to_string().contains(path), "{p}");
}

/// A synchronous answer's result kept in one host's `--result-dir`, its worker lost before reading
/// it back: the worker that takes over cannot read that directory (another host's; moved away
/// here), and the provider will not send the result again. The operation is held for a person
/// (`result_not_readable`), not ended `result_unavailable` as if there were no result; put back
/// where it was kept and resumed, the result is read, checked and collected, the job created once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_synchronous_result_kept_on_another_host_is_held_not_lost() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new().await;
    let op = env
        .submit("sim", serde_json::json!({"create": ["sync"]}), |_| {})
        .await;
    let (here, away) = (env.dir.join("host-a"), env.dir.join("host-a-away"));
    let mut a = env.spawn_worker(
        "host-a",
        "2s",
        &[
            ("JOBTRAIL_RESULT_DIR", here.to_str().unwrap()),
            ("JOBTRAIL_FAULT", "kill_after:after_create_completed"),
        ],
    );
    let status = a
        .wait_exit(Duration::from_secs(30))
        .expect("the worker killed itself after keeping the result");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "died by SIGKILL");
    let kept = env.store.get(op.id).await.unwrap();
    assert_eq!(kept.state, State::ResultCollecting);
    // The worker that takes over runs on another host: host-a's directory is not there.
    std::fs::rename(&here, &away).unwrap();
    let there = env.dir.join("host-b");
    let _b = env.spawn_worker(
        "host-b",
        "2s",
        &[("JOBTRAIL_RESULT_DIR", there.to_str().unwrap())],
    );
    let held = env.wait_settled(op.id, T).await;
    assert_eq!(held.state, State::ResultStalled, "{}", env.logs());
    let history = env.store.history(op.id).await.unwrap();
    assert_eq!(history.last().unwrap().event, "result_not_readable");
    let reason = held.escalation_reason.clone().unwrap();
    assert!(reason.contains("restores it where it was kept"), "{reason}");

    // A person puts the file back where it was kept and resumes: read, checked, collected.
    std::fs::rename(&away, &here).unwrap();
    resume_stalled(&env, &held, "restored host-a's results");
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded, "{}", env.logs());
    assert_eq!(
        done.result_sha256.as_deref(),
        kept.provider_context["sync_result"]["sha256"].as_str(),
        "the result kept at create is the result"
    );
    assert_eq!(
        env.sim.ledger().tokens[op.token.as_str()].len(),
        1,
        "one remote job"
    );
}

/// Drill 8: Retry-After is honoured, in seconds and as an HTTP-date: no early polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_retry_after_is_honoured() {
    let mut env = Env::new().await;
    let secs = env
        .submit(
            "sim",
            serde_json::json!({"duration_ms": 3000, "poll_retry_after": 1}),
            |_| {},
        )
        .await;
    let date = env.submit("sim", serde_json::json!({"duration_ms": 3000, "poll_retry_after": 1, "poll_retry_after_as_date": true}), |_| {}).await;
    // The create's own 202 says when to look first (Azure's long-running operations do).
    let first = env
        .submit(
            "sim",
            serde_json::json!({"duration_ms": 200, "create_retry_after": 2}),
            |_| {},
        )
        .await;
    env.start_worker("w1", Duration::from_secs(10));
    let a = env.wait_settled(secs.id, T).await;
    let b = env.wait_settled(date.id, T).await;
    assert_eq!((a.state, b.state), (State::Succeeded, State::Succeeded));
    assert_eq!(env.wait_settled(first.id, T).await.state, State::Succeeded);
    let ledger = env.sim.ledger();
    assert_eq!(
        ledger.early_polls(),
        0,
        "a poll came before the Retry-After the provider sent"
    );
    let polls = ledger.jobs[a.remote_job_id.as_ref().unwrap()].calls["status"];
    assert!(
        (2..=5).contains(&polls),
        "{polls} status calls for a 3 s job with Retry-After: 1"
    );
    let reasons: Vec<String> = env
        .store
        .history(secs.id)
        .await
        .unwrap()
        .iter()
        .map(|h| h.event.clone())
        .collect();
    assert!(reasons.iter().filter(|e| *e == "remote_progress").count() >= 1);
    assert_eq!(a.next_action_reason, "none");
    env.stop_workers().await;
}

/// A provider that hands out an operation URL (Operation-Location) and wants the created resource read
/// once after success: the worker follows the URL while polling, then makes the final GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followed_status_urls_and_the_final_get_of_the_created_resource() {
    let mut env = Env::with_contracts(|c| c.status.final_get = true).await;
    let op = env.submit("sim", serde_json::json!({"status_via_header": true, "moving_status_url": true, "duration_ms": 600}), |_| {}).await;
    env.start_worker("w1", Duration::from_secs(10));
    let done = env.wait_settled(op.id, T).await;
    assert_eq!(done.state, State::Succeeded);
    let job = done.remote_job_id.clone().unwrap();
    let paths = env.sim.ledger().jobs[&job].status_paths.clone();
    assert!(
        paths.iter().any(|p| p.starts_with("/v1/operations/")),
        "the operation URL was followed: {paths:?}"
    );
    assert!(
        paths.contains(&format!("/v1/jobs/{job}")),
        "the created resource was read: {paths:?}"
    );
    let calls = env.store.calls(op.id).await.unwrap();
    let last_status = calls.iter().rev().find(|c| c.kind == "status").unwrap();
    assert!(
        last_status.url.ends_with(&format!("/v1/jobs/{job}")),
        "{}",
        last_status.url
    );
    env.stop_workers().await;
}

/// New submissions and cancel requests wake a worker at once (LISTEN/NOTIFY), long before its idle
/// scan would have found them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_wake_an_idle_worker() {
    let mut env = Env::new().await;
    env.start_worker_idle("sleepy", Duration::from_secs(10), Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(500)).await; // the worker is now waiting
    let started = std::time::Instant::now();
    let op = env
        .submit(
            "sim",
            serde_json::json!({"never_finish": true, "poll_retry_after": 60}),
            |_| {},
        )
        .await;
    env.wait_state(op.id, State::Observing, Duration::from_secs(10))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the submission waited for the idle scan"
    );
    // The next poll is a minute away; a cancel request must not wait for it.
    let started = std::time::Instant::now();
    env.cancel(op.id).await;
    let op = env
        .wait_state(op.id, State::Cancelling, Duration::from_secs(10))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the cancel waited for the poll schedule"
    );
    assert_eq!(op.cancel_attempts, 1, "the one cancel call went out");
    env.stop_workers().await;
}

/// A provider without idempotency keys: a worker dies after durably marking "a create may be in
/// flight" and before learning its outcome. The next worker does not send create again blindly: the
/// attempt is ambiguous, reconciliation looks the job up, and without an answer a person decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_no_idempotency_crash_mid_create_is_never_resent_blindly() {
    let env = Env::new().await;
    let op = env
        .submit("sim-legacy", serde_json::json!({"duration_ms": 300}), |s| {
            // The dead worker extended its lease to cover its call (connect 1 s + request 2 s):
            // the next one takes over after about 5 s, with time left to reconcile.
            s.create_deadline = Some(chrono::Utc::now() + chrono::Duration::seconds(12));
        })
        .await;
    assert!(
        !op.at_most_once,
        "the record says at-most-once cannot be guaranteed"
    );
    let mut a = env.spawn_worker(
        "marked",
        "2s",
        &[("JOBTRAIL_FAULT", "kill_after:after_create_marked")],
    );
    a.wait_exit(Duration::from_secs(30))
        .expect("the worker killed itself after marking the send");
    let _b = env.spawn_worker("careful", "2s", &[]);
    let done = env.wait_state(op.id, State::CreateUnresolved, T).await;
    assert!(
        done.escalation_reason
            .as_deref()
            .unwrap_or("")
            .contains("create deadline")
    );
    let history = env.store.history(op.id).await.unwrap();
    let events: Vec<String> = history
        .iter()
        .map(|h| format!("{}: {}", h.event, h.cause))
        .collect();
    let first = history
        .iter()
        .find(|h| h.event == "create_ambiguous")
        .unwrap_or_else(|| panic!("no ambiguous create in {events:#?}"));
    assert!(first.cause.contains("never recorded"), "{}", first.cause);
    assert!(
        history
            .iter()
            .any(|h| h.event == "reconciliation_inconclusive"),
        "it looked the job up"
    );
    let ledger = env.sim.ledger();
    assert_eq!(
        ledger.jobs_for_reference(&op.id.to_string()).len(),
        0,
        "no create was sent again"
    );
    let calls = env.store.calls(op.id).await.unwrap();
    assert!(calls.iter().all(|c| c.kind != "create"), "{calls:?}");
    assert!(
        calls
            .iter()
            .any(|c| c.kind == "lookup" && c.actor == "careful")
    );
}

/// A worker whose every slot is taken keeps reading its work channel. Notifications sent meanwhile
/// (here 20 000 of 1 KiB, far past what a socket's buffers hold) are read as they come: left
/// unread, the database's session behind the listener blocks on its write to the worker and stops
/// reading the notification queue every session of the cluster shares, which then only grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_keeps_reading_its_notifications() {
    use sqlx::Connection;
    let env = Env::with_contracts(|c| c.request_timeout = Duration::from_secs(30)).await;
    let op = env
        .submit("sim", serde_json::json!({"create_hold_ms": 20000}), |_| {})
        .await;
    let mut w = env.spawn_worker("busy", "40s", &[("JOBTRAIL_CONCURRENCY", "1")]);
    let started = Instant::now();
    while env.store.get(op.id).await.unwrap().lease_owner.is_none() {
        assert!(started.elapsed() < T, "the create was never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = sqlx::PgConnection::connect(&env.url).await.unwrap();
    async fn waits(c: &mut sqlx::PgConnection) -> Vec<Option<String>> {
        sqlx::query_scalar(
            "SELECT wait_event FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN %'",
        )
        .fetch_all(c)
        .await
        .unwrap()
    }
    assert_eq!(waits(&mut c).await.len(), 1, "one listening session");
    let channel: String =
        sqlx::query_scalar("SELECT value FROM jobtrail_settings WHERE key = 'work_channel'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    // Each payload its own: equal ones in one transaction are sent once.
    sqlx::query("SELECT pg_notify($1, repeat('x', 1000) || i) FROM generate_series(1, 20000) AS i")
        .bind(&channel)
        .execute(&mut c)
        .await
        .unwrap();
    // The create is held for 20 s from its start: all this while the one slot is taken. Past the
    // time the session takes to fill the buffers (and, unread, to block on them), it reads again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let flooded = Instant::now();
    let mut seen = Vec::new();
    loop {
        let now = waits(&mut c).await;
        if now == [Some("ClientRead".to_owned())] {
            break;
        }
        seen.push(now);
        assert!(
            flooded.elapsed() < Duration::from_secs(5),
            "the listening session never went back to reading: {:?}",
            seen.last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.store.get(op.id).await.unwrap().lease_owner.is_some(),
        "still busy with the create"
    );
    w.signal(libc::SIGTERM);
    let _ = w.wait_exit(Duration::from_secs(40));
}

/// A worker whose every slot waits on a slow call is alive, and says so: its loop still beats (a
/// contract's call may last up to an hour, past what `/livez` allows a silent loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_every_slot_waits_on_a_slow_call_still_beats() {
    let env = Env::with_contracts(|c| c.request_timeout = Duration::from_secs(10)).await;
    let op = env
        .submit("sim", serde_json::json!({"create_hold_ms": 4000}), |_| {})
        .await;
    let mut config = jobtrail_worker::WorkerConfig::named_default();
    config.id = "w-busy".into();
    config.lease = Duration::from_secs(30);
    config.idle = Duration::from_millis(50);
    config.concurrency = 1;
    let w = std::sync::Arc::new(jobtrail_worker::Worker::new(
        env.store.clone(),
        env.registry.clone(),
        env.results.clone(),
        config,
    ));
    let beat = w.heartbeat();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let (w, stop) = (w.clone(), stop.clone());
        async move { w.run(stop).await }
    });
    // The one slot takes the create, which the provider holds for 4 s.
    let started = std::time::Instant::now();
    while env.store.get(op.id).await.unwrap().lease_owner.is_none() {
        assert!(started.elapsed() < T, "the create was never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut loudest = Duration::ZERO;
    let sampled = std::time::Instant::now();
    while sampled.elapsed() < Duration::from_millis(3000) {
        loudest = loudest.max(beat.silence());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    assert!(
        loudest < Duration::from_millis(2000),
        "the loop fell silent for {loudest:?} while its slot waited"
    );
}
