//! What waits for a person, one operation's whole story, and the fleet's numbers.

use chrono::Utc;
use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use jobtrail_console::shell::{CmdResult, exit, fail, print_json};
use jobtrail_core::{OperationId, State};
use jobtrail_store::{OperationRecord, Store};
use std::process::ExitCode;

/// The provider contracts, where they could be read: they tell which decisions a provider can
/// act on (a `resume` of an unresolved create needs reconciliation).
pub type Contracts = Result<jobtrail_provider::Registry, String>;

/// The admin commands that fit `op` (the service's decisions, as commands). Where the contracts
/// could not be read, a `resume` of an unresolved create is offered unchecked (and said).
fn decisions_for(op: &OperationRecord, contracts: &Contracts) -> Vec<String> {
    let fitting = match contracts {
        Ok(registry) => jobtrail_service::operator::decisions_for_op(op, registry),
        Err(_) => jobtrail_service::operator::decisions_for(op.state),
    };
    fitting.into_iter().map(|d| d.replace('_', "-")).collect()
}

/// Says, once, that the decisions shown for `ops` were not checked against the contracts.
fn unchecked_warning<'a>(
    ops: impl IntoIterator<Item = &'a OperationRecord>,
    contracts: &Contracts,
) {
    if let Err(e) = contracts
        && ops
            .into_iter()
            .any(|op| op.state == State::CreateUnresolved)
    {
        eprintln!(
            "warning: the provider contracts were not read ({e}): `resume` is offered for create_unresolved whether or not the provider can reconcile (it is refused until the contracts can be read)"
        );
    }
}

/// `STATE@SEQ`: what to pass as `--seen` to decide on exactly this view.
pub fn seen_token(op: &OperationRecord) -> String {
    jobtrail_service::operator::seen_token(op.state, op.history_seq, &op.history_head)
}

fn age(op: &OperationRecord) -> String {
    let secs = op
        .escalated_at
        .map(|e| (Utc::now() - e).num_seconds().max(0))
        .unwrap_or(0);
    match secs {
        s if s >= 86400 => format!("{}d{}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

pub async fn escalations(
    store: &Store,
    state: Option<String>,
    provider: Option<String>,
    caller: Option<String>,
    contracts: &Contracts,
    json: bool,
) -> CmdResult {
    let state = match state {
        Some(s) => {
            let st: State = s.parse().map_err(|e| fail(exit::BAD_INPUT, e))?;
            if !st.needs_human() {
                return Err(fail(
                    exit::BAD_INPUT,
                    format!(
                        "{st} is not an escalation state (those are {})",
                        State::ALL
                            .iter()
                            .filter(|s| s.needs_human())
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            Some(st)
        }
        None => None,
    };
    let shown = jobtrail_service::operator::ESCALATIONS_SHOWN;
    let mut ops = store
        .escalations(state, provider.as_deref(), caller.as_deref(), shown + 1)
        .await?;
    if ops.len() > shown as usize {
        ops.truncate(shown as usize);
        eprintln!(
            "more than {shown} operations are held: the oldest {shown} are shown; decide these first, or narrow with --state, --provider or --caller"
        );
    }
    let mut entries = Vec::new();
    for op in &ops {
        let calls = store.recent_calls(op.id, 3).await?;
        entries.push((op, calls));
    }
    unchecked_warning(&ops, contracts);
    if json {
        let v: Vec<_> = entries
            .iter()
            .map(|(op, calls)| {
                serde_json::json!({
                    "operation_id": op.id.to_string(),
                    "state": op.state,
                    "reason": op.escalation_reason,
                    "escalated_at": op.escalated_at,
                    "age_secs": op.escalated_at.map(|e| (Utc::now() - e).num_seconds()),
                    "provider": op.provider,
                    "caller": op.caller,
                    "remote_job_id": op.remote_job_id,
                    "conflicting_remote_job_id": op.conflicting_remote_job_id,
                    "trace_id": op.trace_id.to_string(),
                    "seen": seen_token(op),
                    "decisions": decisions_for(op, contracts),
                    "last_calls": calls.iter().map(|c| serde_json::json!({
                        "kind": c.kind, "at": c.started_at, "http_status": c.http_status,
                        "provider_request_id": c.provider_request_id, "outcome": c.outcome,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        print_json(&v);
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        // A filter that matches nothing is not "nothing waits".
        match (&state, provider.as_deref(), caller.as_deref()) {
            (None, None, None) => println!("the escalation queue is empty"),
            _ => println!(
                "no held operation{}{}{}",
                state.map(|s| format!(" in {s}")).unwrap_or_default(),
                provider
                    .as_deref()
                    .map(|p| format!(" for provider {p:?} (a name as contracts spell it)"))
                    .unwrap_or_default(),
                caller
                    .as_deref()
                    .map(|c| format!(" of caller {:?}", jobtrail_console::visible::text(c)))
                    .unwrap_or_default()
            ),
        }
        return Ok(ExitCode::SUCCESS);
    }
    for (op, calls) in &entries {
        // Whatever a caller or provider wrote is shown, never obeyed by the terminal.
        let op = &jobtrail_console::visible::operation(op);
        let calls: Vec<_> = calls.iter().map(jobtrail_console::visible::call).collect();
        println!(
            "{}  {}  waiting {}  provider {}  --seen {}",
            op.id,
            op.state,
            age(op),
            op.provider,
            seen_token(op)
        );
        println!(
            "  why        {}",
            op.escalation_reason.as_deref().unwrap_or("-")
        );
        println!("  caller     {}", op.caller);
        let jobs = match (&op.remote_job_id, &op.conflicting_remote_job_id) {
            (Some(a), Some(b)) => format!("{a} and {b} (the same token answered twice)"),
            (Some(a), None) => a.clone(),
            (None, _) => "(unknown)".into(),
        };
        println!("  remote job {jobs}   trace {}", op.trace_id);
        for c in &calls {
            println!(
                "  call       {} {} #{} → {} {}",
                c.started_at.format("%Y-%m-%d %H:%M:%SZ"),
                c.kind,
                c.attempt,
                c.http_status
                    .map(|s| s.to_string())
                    .or_else(|| c.error_class.clone())
                    .unwrap_or_else(|| "-".into()),
                c.provider_request_id
                    .as_deref()
                    .map(|r| format!("(provider request {r})"))
                    .unwrap_or_default()
            );
        }
        println!("  decide     {}\n", decisions_for(op, contracts).join(", "));
    }
    println!("{} operation(s) wait for a person", entries.len());
    Ok(ExitCode::SUCCESS)
}

pub async fn show(store: &Store, id: &str, contracts: &Contracts, json: bool) -> CmdResult {
    // Trimmed as the check before connecting trims it (an id pasted with a space).
    let id: OperationId = id.trim().parse().map_err(|e| fail(exit::BAD_INPUT, e))?;
    let op = store.get(id).await?;
    let history = store.history(id).await?;
    let calls = store.calls(id).await?;
    unchecked_warning([&op], contracts);
    if json {
        print_json(
            &serde_json::json!({ "operation": op, "history": history, "calls": calls, "seen": seen_token(&op), "decisions": decisions_for(&op, contracts) }),
        );
    } else {
        print!(
            "{}",
            jobtrail_console::timeline::render(&op, &history, &calls)
        );
        let d = decisions_for(&op, contracts);
        if !d.is_empty() {
            println!(
                "decisions that fit: {}   (pass --seen {})",
                d.join(", "),
                seen_token(&op)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A due operation waiting this long is named by `stats` (a working fleet claims within seconds).
const WAITING_TOO_LONG_SECS: f64 = 60.0;

pub async fn stats(store: &Store, json: bool) -> CmdResult {
    let by_state = store.count_by_state().await?;
    let (queue, oldest) = store.escalation_stats().await?;
    let leases = store.lease_holders().await?;
    let (ops, history, calls) = store.totals().await?;
    let pauses = store.provider_pauses().await?;
    let due = store.due_by_provider().await?;
    if json {
        print_json(&serde_json::json!({
            "operations": ops, "history_rows": history, "provider_calls": calls,
            "by_state": by_state.iter().map(|(s, p, n)| serde_json::json!({"state": s, "provider": p, "count": n})).collect::<Vec<_>>(),
            "escalations": {"open": queue, "oldest": oldest, "oldest_age_secs": oldest.map(|o| (Utc::now() - o).num_seconds())},
            "lease_holders": leases,
            "provider_pauses": pauses,
            "due": due,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new();
    t.load_style(UTF8_BORDERS_ONLY)
        .set_header(vec!["state", "provider", "operations"]);
    for (s, p, n) in &by_state {
        t.add_row(vec![
            s.clone(),
            jobtrail_console::visible::text(p).into_owned(),
            n.to_string(),
        ]);
    }
    println!("{t}");
    println!("{ops} operations, {history} history rows, {calls} provider calls");
    match oldest {
        Some(o) => println!(
            "escalation queue: {queue} open, oldest since {} ({}s)",
            o.format("%Y-%m-%d %H:%M:%SZ"),
            (Utc::now() - o).num_seconds()
        ),
        None => println!("escalation queue: empty"),
    }
    for p in &pauses {
        println!(
            "provider {} paused fleet-wide (429 with Retry-After) until {} ({:.0}s more)",
            jobtrail_console::visible::text(&p.provider),
            p.paused_until.format("%Y-%m-%d %H:%M:%SZ"),
            p.remaining_secs.ceil()
        );
    }
    // A provider paused fleet-wide is said above: its wait is the pause, not a missing worker.
    let waiting = due.iter().filter(|d| {
        d.oldest_secs >= WAITING_TOO_LONG_SECS && !pauses.iter().any(|p| p.provider == d.provider)
    });
    for d in waiting {
        let name = jobtrail_console::visible::text(&d.provider);
        println!(
            "provider {name}: {} operations due, the oldest waiting {:.0}s: no worker has claimed them (is one running with a contract named {name}? A renamed or removed contract strands its operations; a contract's max_in_flight or too few workers keep them waiting too)",
            d.due, d.oldest_secs,
        );
    }
    if leases.is_empty() {
        println!("lease holders: none");
    }
    for l in leases {
        println!(
            "lease holder {}: {} held, {} expired",
            jobtrail_console::visible::text(&l.lease_owner),
            l.held,
            l.expired
        );
    }
    Ok(ExitCode::SUCCESS)
}
