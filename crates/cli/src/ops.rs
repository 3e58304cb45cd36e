//! The agent-facing commands: submit, show, cancel, result, wait.

use jobtrail_console::shell::{CmdResult, exit, fail, print_json};
use jobtrail_core::{CancelRequest, OperationId, State, Submission, SubmitLimits};
use jobtrail_store::{OperationRecord, Store, StoreError};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct SubmitArgs {
    #[arg(long)]
    pub provider: String,
    /// What the operation acts on (part of the fingerprint).
    #[arg(long)]
    pub target: String,
    /// Request body (JSON) file; `-` or absent: stdin.
    #[arg(long)]
    pub body: Option<std::path::PathBuf>,
    /// Your own operation id (op_<ULID>). Re-submitting the same id with the same request is a no-op.
    #[arg(long)]
    pub id: Option<String>,
    /// Who asks (agent run, tool, person).
    #[arg(long, env = "JOBTRAIL_CALLER")]
    pub caller: String,
    /// Who authorised the work.
    #[arg(long)]
    pub approved_by: String,
    /// A reference to the approval (ticket, change request).
    #[arg(long)]
    pub approval_ref: Option<String>,
    /// RFC 3339 or relative (+2m). Default: the provider's create window.
    #[arg(long)]
    pub create_deadline: Option<String>,
    /// RFC 3339 or relative (+1h). Default: the provider's result window.
    #[arg(long)]
    pub result_deadline: Option<String>,
    /// How long a cancel may take to be confirmed (90s, 5m). Default: the provider's.
    #[arg(long)]
    pub cancel_window: Option<String>,
    /// The operation this one retries (a new operation linked to the old; it must be finished).
    #[arg(long)]
    pub supersedes: Option<String>,
}

fn parse_id(s: &str) -> Result<OperationId, jobtrail_console::shell::Failure> {
    s.parse().map_err(|e| fail(exit::BAD_INPUT, e))
}

pub async fn submit(
    store: &Store,
    registry: &jobtrail_provider::Registry,
    a: SubmitArgs,
    json: bool,
) -> CmdResult {
    // The body limit is the operator's (the provider contract's `create.max_body_bytes`), never the
    // caller's to raise.
    let terms = registry.terms();
    let limit = terms
        .get(a.provider.trim())
        .map(|t| t.max_body_bytes)
        .unwrap_or(jobtrail_core::operation::DEFAULT_BODY_BYTES);
    let mut body = Vec::new();
    match &a.body {
        Some(p) if p.as_os_str() != "-" => {
            // At most one byte over the limit, whatever the file's size.
            std::fs::File::open(p)
                .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut body))
                .map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))?;
        }
        _ => {
            // Read at most one byte over the limit: enough to refuse, never more into memory.
            std::io::stdin()
                .take(limit as u64 + 1)
                .read_to_end(&mut body)
                .map_err(|e| fail(exit::BAD_INPUT, format!("reading the body from stdin: {e}")))?;
        }
    }
    let time = |s: &Option<String>, what: &str| {
        s.as_deref()
            .map(|t| {
                jobtrail_console::shell::parse_time(t)
                    .map_err(|e| fail(exit::BAD_INPUT, format!("--{what}: {e}")))
            })
            .transpose()
    };
    let submission = Submission {
        operation_id: a.id.as_deref().map(parse_id).transpose()?,
        provider: a.provider.clone(),
        target: a.target.clone(),
        body,
        caller: a.caller.clone(),
        approved_by: a.approved_by.clone(),
        approval_ref: a.approval_ref.clone(),
        create_deadline: time(&a.create_deadline, "create-deadline")?,
        result_deadline: time(&a.result_deadline, "result-deadline")?,
        cancel_window: a
            .cancel_window
            .as_deref()
            .map(|d| {
                jobtrail_console::shell::parse_duration_within(
                    "--cancel-window",
                    d,
                    Duration::from_secs(1),
                    jobtrail_core::operation::MAX_CANCEL_WINDOW,
                )
            })
            .transpose()?,
        supersedes: a.supersedes.as_deref().map(parse_id).transpose()?,
    };
    let s = store
        .submit_new(&submission, &terms, SubmitLimits::default())
        .await?;
    let op = &s.operation;
    if json {
        print_json(&serde_json::json!({
            "operation_id": op.id.to_string(),
            "created": s.created,
            "state": op.state,
            "fingerprint": op.fingerprint.as_str(),
            "trace_id": op.trace_id.to_string(),
            "at_most_once": op.at_most_once,
        }));
    } else {
        println!("{}", op.id);
        if !s.created {
            eprintln!("(already submitted with the same request: nothing new was written)");
        }
        if !op.at_most_once {
            eprintln!(
                "warning: provider {} takes no idempotency key: at-most-once creation cannot be guaranteed",
                op.provider
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn show(store: &Store, id: &str, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    let op = store.get(id).await?;
    let history = store.history(id).await?;
    let calls = store.calls(id).await?;
    if json {
        print_json(&serde_json::json!({ "operation": op, "history": history, "calls": calls }));
        return Ok(ExitCode::SUCCESS);
    }
    print!(
        "{}",
        jobtrail_console::timeline::render(&op, &history, &calls)
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(store: &Store, id: &str, actor: &str, reason: &str, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    let req = CancelRequest::new(actor, reason).map_err(|e| fail(exit::BAD_INPUT, e))?;
    let applied = match store.request_cancel(id, req).await {
        Ok(a) => a,
        Err(StoreError::Illegal { source, .. }) => {
            return Err(fail(
                exit::CONFLICT,
                format!("cannot cancel {id}: it is {} ({source})", source.from),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let op = &applied.record;
    let what = match op.state {
        State::Withdrawn => "withdrawn: no create can have reached the provider",
        State::CancelRequested => {
            "cancel requested: the lease owner sends one cancel call and waits for the provider's confirmation"
        }
        _ => "cancel noted: it is acted on as soon as the remote job id is known",
    };
    if json {
        print_json(
            &serde_json::json!({"operation_id": id.to_string(), "state": op.state, "note": what}),
        );
    } else {
        println!("{id}: {what}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn result(store: &Store, id: &str, output: Option<&std::path::Path>) -> CmdResult {
    let id = parse_id(id)?;
    let op = store.get(id).await?;
    if op.state != State::Succeeded {
        return Err(fail(
            exit::NOT_SUCCEEDED,
            format!("{id} is {}: there is no validated result", op.state),
        ));
    }
    // Served only as the (verified) history chain records it: a row or bytes changed behind
    // jobtrail's back are refused, not served.
    let (loc, sha) = store.chained_result(id).await?;
    let bytes = jobtrail_worker::ResultStore::read_verified(store, &loc, &sha)
        .await
        .map_err(|e| fail(exit::UNAVAILABLE, e))?;
    match output {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::write(p, &bytes)
                .map_err(|e| fail(exit::UNAVAILABLE, format!("{}: {e}", p.display())))?;
            eprintln!(
                "wrote {} bytes (sha256 {sha}) to {}",
                bytes.len(),
                p.display()
            );
        }
        _ => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&bytes)
                .map_err(|e| fail(exit::UNAVAILABLE, e))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Block until the operation is terminal or held for a person, or the timeout. Polls with a gentle
/// backoff (100 ms doubling to 2 s) rather than hammering the database.
pub async fn wait(store: &Store, id: &str, timeout: Duration, json: bool) -> CmdResult {
    let id = parse_id(id)?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(100);
    loop {
        let op = store.get(id).await?;
        if op.state.is_terminal() || op.state.needs_human() {
            report(&op, json);
            let code = match op.state {
                State::Succeeded => exit::OK,
                s if s.needs_human() => exit::NEEDS_HUMAN,
                _ => exit::NOT_SUCCEEDED,
            };
            return Ok(ExitCode::from(code));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            report(&op, json);
            return Err(fail(
                exit::TIMEOUT,
                format!("{id} is still {} after {}s", op.state, timeout.as_secs()),
            ));
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn report(op: &OperationRecord, json: bool) {
    if json {
        print_json(&serde_json::json!({
            "operation_id": op.id.to_string(),
            "state": op.state,
            "remote_job_id": op.remote_job_id,
            "remote_state": op.remote_state,
            "escalation_reason": op.escalation_reason,
            "result_sha256": op.result_sha256,
            "result_summary": op.result_summary,
            "finished_before_cancel": op.finished_before_cancel(),
        }));
    } else {
        let extra = op
            .escalation_reason
            .as_deref()
            .map(|r| format!(" — {}", jobtrail_console::visible::text(r)))
            .unwrap_or_default();
        println!("{} {}{extra}", op.id, op.state);
    }
}
