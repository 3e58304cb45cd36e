//! `jobtrail demo`: everything at once, with no configuration. A fresh database on the private
//! PostgreSQL cluster, the simulated provider on a loopback port, a few real worker processes, and a
//! few hundred operations with a realistic mix of the essay's faults; then a report.

use crate::fleet::Fleet;
use jobtrail_console::shell::{CmdResult, exit, print_json};
use jobtrail_core::{CancelRequest, OperationId, State, Submission, SubmitLimits};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Operations to submit (1-100000).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    operations: u64,
    /// Worker processes (1-32).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=32))]
    workers: u64,
    /// Give up waiting after this many seconds (1-86400).
    #[arg(long, default_value_t = 55, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout_secs: u64,
}

/// One kind of operation in the mix: how many per hundred, how it is scripted, where it must end.
struct Scenario {
    name: &'static str,
    weight: usize,
    provider: &'static str,
    script: serde_json::Value,
    result_deadline_secs: u64,
    cancel_window_secs: Option<u64>,
    /// Request a cancel this long after submitting.
    cancel_after_ms: Option<u64>,
    expect: &'static [State],
}

fn scenarios() -> Vec<Scenario> {
    use State::*;
    use serde_json::json;
    let s = |name, weight, provider, script, expect| Scenario {
        name,
        weight,
        provider,
        script,
        result_deadline_secs: 45,
        cancel_window_secs: None,
        cancel_after_ms: None,
        expect,
    };
    let mut v = vec![
        s("ok", 27, "sim", json!({"duration_ms": 600}), &[Succeeded]),
        s(
            "ok, Retry-After seconds",
            8,
            "sim",
            json!({"duration_ms": 1500, "poll_retry_after": 1}),
            &[Succeeded],
        ),
        s(
            "ok, Retry-After HTTP-date",
            2,
            "sim",
            json!({"duration_ms": 1500, "poll_retry_after": 1, "poll_retry_after_as_date": true}),
            &[Succeeded],
        ),
        s(
            "ok, bursty progress",
            3,
            "sim",
            json!({"duration_ms": 1000, "progress": "bursty"}),
            &[Succeeded],
        ),
        s(
            "create response lost after accept",
            5,
            "sim",
            json!({"create": ["drop_after_accept"]}),
            &[Succeeded],
        ),
        s(
            "create answered after our timeout",
            3,
            "sim",
            json!({"create": ["slow_accept"], "create_delay_ms": 2500}),
            &[Succeeded],
        ),
        s(
            "create 500 after accept",
            3,
            "sim",
            json!({"create": ["ambiguous_after_accept"]}),
            &[Succeeded],
        ),
        s(
            "create 429 Retry-After",
            4,
            "sim",
            json!({"create": ["retry_after_seconds"]}),
            &[Succeeded],
        ),
        s(
            "create 503 Retry-After date",
            2,
            "sim",
            json!({"create": ["retry_after_date"]}),
            &[Succeeded],
        ),
        s(
            "create rejected",
            3,
            "sim",
            json!({"create": ["reject"]}),
            &[Failed],
        ),
        s(
            "same token, different job id",
            2,
            "sim",
            json!({"create": ["ambiguous_after_accept", "different_job_id"]}),
            &[ContractViolation],
        ),
        s(
            "duplicate reported as 409",
            2,
            "sim",
            json!({"create": ["drop_after_accept", "already_exists_error"]}),
            &[Succeeded],
        ),
        s(
            "synchronous result",
            3,
            "sim",
            json!({"create": ["sync"]}),
            &[Succeeded],
        ),
        s(
            "remote failure",
            4,
            "sim",
            json!({"outcome": "failed"}),
            &[Failed],
        ),
        s(
            "malformed / 500 / unknown status",
            4,
            "sim",
            json!({"duration_ms": 1200, "status_faults": {"1": "malformed_json", "2": "error_500", "3": "unknown_state"}}),
            &[Succeeded],
        ),
        s(
            "partial batch",
            3,
            "sim",
            json!({"result": "partial_batch"}),
            &[Succeeded],
        ),
        s(
            "bad checksum",
            1,
            "sim",
            json!({"result": "bad_checksum"}),
            &[ResultValidationFailed],
        ),
        s(
            "wrong content type",
            1,
            "sim",
            json!({"result": "wrong_content_type"}),
            &[ResultValidationFailed],
        ),
        s(
            "schema violation",
            1,
            "sim",
            json!({"result": "schema_violation"}),
            &[ResultValidationFailed],
        ),
        s(
            "oversized result",
            1,
            "sim",
            json!({"result": "oversized"}),
            &[ResultValidationFailed],
        ),
        s(
            "result URL fails",
            1,
            "sim",
            json!({"result": "fails"}),
            &[ResultUnavailable],
        ),
        s(
            "result gone",
            1,
            "sim",
            json!({"result": "gone"}),
            &[ResultUnavailable],
        ),
        s(
            "no idempotency (legacy)",
            3,
            "sim-legacy",
            json!({}),
            &[Succeeded],
        ),
        s(
            "no idempotency, response lost",
            1,
            "sim-legacy",
            json!({"create": ["drop_after_accept"]}),
            &[Succeeded],
        ),
        s(
            "CSV rows say ERROR",
            2,
            "sim-csv",
            json!({"format": "csv", "result": "error_rows"}),
            &[ResultValidationFailed],
        ),
    ];
    let mut timeout = s(
        "never finishes",
        2,
        "sim",
        json!({"never_finish": true}),
        &[ResultTimedOut],
    );
    timeout.result_deadline_secs = 4;
    v.push(timeout);
    let mut c = s(
        "cancel confirmed",
        3,
        "sim",
        json!({"never_finish": true}),
        &[Cancelled],
    );
    c.cancel_after_ms = Some(1000);
    v.push(c);
    let mut c = s(
        "cancel never confirmed",
        2,
        "sim",
        json!({"never_finish": true, "cancel": "ignore"}),
        &[CancellationUnconfirmed],
    );
    c.cancel_after_ms = Some(1000);
    c.cancel_window_secs = Some(2);
    v.push(c);
    let mut c = s(
        "cancel loses the race",
        2,
        "sim",
        json!({"never_finish": true, "cancel": "lose_race"}),
        &[Succeeded],
    );
    c.cancel_after_ms = Some(1000);
    v.push(c);
    let mut c = s(
        "cancel at once",
        1,
        "sim",
        json!({"never_finish": true}),
        &[Withdrawn, Cancelled],
    );
    c.cancel_after_ms = Some(0);
    v.push(c);
    v
}

pub async fn run(args: DemoArgs, json: bool, database_url: Option<&str>) -> CmdResult {
    let started = Instant::now();
    let stamp = chrono::Utc::now().format("%Y%m%d_%H%M%S").to_string();
    let mut fleet = Fleet::start("demo", database_url).await?;
    for i in 0..args.workers {
        fleet.spawn_worker(
            &format!("demo-worker-{i}"),
            &["--lease", "5s", "--idle", "100ms"],
        )?;
    }
    let store = fleet.store.clone();
    let terms = fleet.registry.terms();
    let url = fleet.shown_url();

    // 4. Submit the mix.
    let all = scenarios();
    let mut deck: Vec<usize> = Vec::new();
    for (i, s) in all.iter().enumerate() {
        deck.extend(std::iter::repeat_n(i, s.weight));
    }
    // Bounded by its flag (clap's range), so the conversion cannot lose anything.
    let operations = args.operations as usize;
    let mut ops: Vec<(OperationId, usize)> = Vec::with_capacity(operations);
    let mut cancels = Vec::new();
    for n in 0..operations {
        let k = deck[(n * 37) % deck.len()];
        let sc = &all[k];
        let mut script = sc.script.clone();
        script["status_delay_ms"] = serde_json::json!(10);
        let body = serde_json::json!({"report": "usage", "account": format!("acct_{n:04}"), "sim": script});
        let now = chrono::Utc::now();
        let sub = Submission {
            provider: sc.provider.into(),
            target: "reports".into(),
            body: serde_json::to_vec(&body).expect("json"),
            caller: "jobtrail-demo".into(),
            approved_by: "demo-operator".into(),
            approval_ref: Some(format!("DEMO-{stamp}")),
            create_deadline: Some(
                now + chrono::Duration::seconds(sc.result_deadline_secs.min(20) as i64),
            ),
            result_deadline: Some(now + chrono::Duration::seconds(sc.result_deadline_secs as i64)),
            cancel_window: sc.cancel_window_secs.map(Duration::from_secs),
            ..Default::default()
        };
        let s = store
            .submit_new(&sub, &terms, SubmitLimits::default())
            .await?;
        ops.push((s.operation.id, k));
        if let Some(ms) = sc.cancel_after_ms {
            let store = store.clone();
            let id = s.operation.id;
            cancels.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                // A scenario about cancelling a running job waits (bounded) until the job is known
                // to run: on a loaded machine its create may not have left yet, and a cancel then
                // rightly ends `withdrawn`, which is another scenario ("cancel at once").
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while ms > 0 && std::time::Instant::now() < deadline {
                    match store.get(id).await {
                        Ok(op) if op.remote_job_id.is_none() && !op.state.is_terminal() => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        _ => break,
                    }
                }
                let req = CancelRequest::new("demo-operator", "changed my mind").expect("evidence");
                let _ = store.request_cancel(id, req).await;
            }));
        }
    }

    // 5. Progress until everything is terminal or held for a person.
    let total = ops.len() as u64;
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} settled  {msg}",
            )
            .expect("template"),
        );
        b
    });
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut last_line = Instant::now();
    let mut timed_out = false;
    loop {
        let open = store.count_unsettled().await?.max(0) as u64;
        let settled = total.saturating_sub(open);
        let (_, history, calls) = store.totals().await?;
        match &bar {
            Some(b) => {
                b.set_position(settled);
                b.set_message(format!("{history} transitions, {calls} provider calls"));
            }
            None if last_line.elapsed() >= Duration::from_secs(2) => {
                eprintln!(
                    "[{:>5.1}s] {settled}/{total} settled, {history} transitions, {calls} provider calls",
                    started.elapsed().as_secs_f64()
                );
                last_line = Instant::now();
            }
            None => {}
        }
        if open == 0 && cancels.iter().all(|c| c.is_finished()) {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if let Some(b) = &bar {
        b.finish();
    }
    let elapsed = started.elapsed();
    fleet.stop_workers();
    let ledger = fleet.sim.ledger();

    // 6. The report.
    let by_state = store.count_by_state().await?;
    let (n_ops, n_history, n_calls) = store.totals().await?;
    let verify = store.verify_all().await?;
    let mut unexpected = Vec::new();
    let mut escalations: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut violation_ops = 0;
    // Operations whose provider takes an idempotency key, that reached it, and the jobs it made.
    let (mut idem_ops, mut idem_jobs) = (0u64, 0u64);
    for (id, k) in &ops {
        let op = store.get(*id).await?;
        if op.at_most_once
            && let Some(jobs) = ledger.tokens.get(op.token.as_str())
        {
            idem_ops += 1;
            idem_jobs += jobs.len() as u64;
        }
        if !all[*k].expect.contains(&op.state) {
            unexpected.push(format!("{id} ({}) ended {}", all[*k].name, op.state));
        }
        if op.state.needs_human() {
            let e = escalations
                .entry(op.state.to_string())
                .or_insert((0, op.escalation_reason.clone().unwrap_or_default()));
            e.0 += 1;
        }
        if op.state == State::ContractViolation {
            violation_ops += 1;
        }
    }
    let tokens_multi = ledger.tokens.values().filter(|j| j.len() > 1).count();
    let jobs_created = ledger.jobs.len();
    let max_polls = ledger.max_status_in_flight();
    let report = serde_json::json!({
        "operations_submitted": n_ops,
        "elapsed_secs": elapsed.as_secs_f64(),
        "timed_out": timed_out,
        "final_states": by_state.iter().map(|(s, p, n)| serde_json::json!({"state": s, "provider": p, "count": n})).collect::<Vec<_>>(),
        "escalations": escalations.iter().map(|(s, (n, why))| serde_json::json!({"state": s, "count": n, "example_reason": why})).collect::<Vec<_>>(),
        "remote_jobs_created": jobs_created,
        "idempotent_operations_that_reached_the_provider": idem_ops,
        "remote_jobs_for_them": idem_jobs,
        "tokens_with_more_than_one_job": tokens_multi,
        "contract_violation_operations": violation_ops,
        "provider_calls": n_calls,
        "provider_calls_per_operation": n_calls as f64 / n_ops.max(1) as f64,
        "max_concurrent_polls_one_job": max_polls,
        "early_polls": ledger.early_polls(),
        "transitions": n_history,
        "transitions_per_sec": n_history as f64 / elapsed.as_secs_f64(),
        "chains_verified": verify.operations,
        "chain_breaks": verify.break_count(),
        "unexpected_outcomes": unexpected,
        "database_url": url,
        // Kept, like the database, to look into afterwards: the workers' logs and the contracts.
        "work_dir": fleet.work.display().to_string(),
    });
    if json {
        print_json(&report);
    } else {
        print_report(&report, &by_state, &escalations);
    }
    let ok = !timed_out
        && unexpected.is_empty()
        && verify.is_clean()
        && max_polls <= 1
        && tokens_multi <= violation_ops;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::NOT_SUCCEEDED)
    })
}

fn print_report(
    r: &serde_json::Value,
    by_state: &[(String, String, i64)],
    esc: &BTreeMap<String, (u64, String)>,
) {
    use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
    println!(
        "\njobtrail demo: {} operations in {:.1} s{}",
        r["operations_submitted"],
        r["elapsed_secs"].as_f64().unwrap_or(0.0),
        if r["timed_out"].as_bool() == Some(true) {
            " (TIMED OUT)"
        } else {
            ""
        }
    );
    let mut t = Table::new();
    t.load_style(UTF8_BORDERS_ONLY)
        .set_header(vec!["final state", "provider", "operations"]);
    for (s, p, n) in by_state {
        t.add_row(vec![s.clone(), p.clone(), n.to_string()]);
    }
    println!("{t}");
    if !esc.is_empty() {
        let mut t = Table::new();
        t.load_style(UTF8_BORDERS_ONLY).set_header(vec![
            "escalated (held for a person)",
            "count",
            "why (example)",
        ]);
        for (s, (n, why)) in esc {
            t.add_row(vec![s.clone(), n.to_string(), why.clone()]);
        }
        println!("{t}");
    }
    let mut t = Table::new();
    t.load_style(UTF8_BORDERS_ONLY)
        .set_header(vec!["measure", "value"]);
    let rows = [
        (
            "remote jobs created (simulator ledger)",
            r["remote_jobs_created"].to_string(),
        ),
        (
            "jobs vs operations, idempotent providers",
            format!(
                "{} jobs for {} operations that reached the provider (a contract violation is a second job)",
                r["remote_jobs_for_them"], r["idempotent_operations_that_reached_the_provider"]
            ),
        ),
        (
            "tokens answered with more than one job",
            format!(
                "{} (all {} held as contract violations)",
                r["tokens_with_more_than_one_job"], r["contract_violation_operations"]
            ),
        ),
        (
            "provider calls per operation",
            format!(
                "{:.2}",
                r["provider_calls_per_operation"].as_f64().unwrap_or(0.0)
            ),
        ),
        (
            "most status calls in flight for one job",
            format!("{} (must be 1)", r["max_concurrent_polls_one_job"]),
        ),
        (
            "polls earlier than Retry-After",
            r["early_polls"].to_string(),
        ),
        ("transitions recorded", r["transitions"].to_string()),
        (
            "transitions per second",
            format!("{:.0}", r["transitions_per_sec"].as_f64().unwrap_or(0.0)),
        ),
        (
            "history chains verified",
            format!("{} ({} breaks)", r["chains_verified"], r["chain_breaks"]),
        ),
        (
            "elapsed",
            format!("{:.1} s", r["elapsed_secs"].as_f64().unwrap_or(0.0)),
        ),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_owned(), v]);
    }
    println!("{t}");
    let unexpected = r["unexpected_outcomes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if unexpected.is_empty() {
        println!("every operation ended where its scenario says it must.");
    } else {
        println!("UNEXPECTED OUTCOMES:");
        for u in unexpected {
            println!("  {}", u.as_str().unwrap_or_default());
        }
    }
    let shown = r["database_url"].as_str().unwrap_or_default();
    println!("\nexplore: DATABASE_URL='{shown}' jobtrail-admin escalations");
    if shown.contains("***") {
        println!("  (the password is not shown: put your own DATABASE_URL's back)");
    }
    println!(
        "worker logs: {} (remove it when done)",
        r["work_dir"].as_str().unwrap_or_default()
    );
}
