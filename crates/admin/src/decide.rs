//! Recorded human decisions, through the operations service (the same code the HTTP API's operator
//! routes run). Each is one transition with a required actor and reason, applied only if the
//! operation is still as the person saw it; the state machine refuses what it does not allow, and
//! either way nothing is written.

use crate::Decided;
use jobtrail_console::shell::{CmdResult, Failure, exit, fail, print_json};
use jobtrail_service::{DecideRequest, DecideResponse, Decision, Principal, Service, ServiceError};
use jobtrail_store::Store;
use std::process::ExitCode;

fn failure(e: ServiceError) -> Failure {
    fail(e.kind.exit_code(), e.message)
}

/// Apply `decision` as `d.actor`, on the view `d.seen`.
pub async fn decide(
    store: &Store,
    registry: jobtrail_provider::Registry,
    id: &str,
    decision: Decision,
    d: Decided,
    json: bool,
) -> CmdResult {
    let seen = d.seen.clone();
    let service = Service::new(store.clone(), registry);
    let r = service
        .decide(
            &Principal::trusted(d.actor.clone()),
            id,
            DecideRequest {
                seen: d.seen,
                reason: d.reason,
                decision,
            },
        )
        .await
        .map_err(failure)?;
    // After the decision, not before: where a bare state is refused (adopt, declare-not-created,
    // a cancel of a held operation) the refusal alone is said.
    warn_bare(&seen);
    report(&r, json);
    Ok(ExitCode::SUCCESS)
}

/// Said, not refused (scripts pass the bare state): only the state was compared, so another
/// operation held in the same state, or this one after it left and came back, would have passed.
fn warn_bare(seen: &str) {
    if !seen.contains('@') {
        eprintln!(
            "warning: --seen {} checked only the state; give the STATE@SEQ:HEAD that `escalations` and `show` print to decide on exactly what you saw",
            seen.trim()
        );
    }
}

fn report(r: &DecideResponse, json: bool) {
    if json {
        let op = &r.operation;
        let v = match &r.retry {
            // A retry's answer is the new operation (and the one it retries).
            Some(n) => serde_json::json!({
                "operation_id": n.id, "supersedes": op.id, "fingerprint": n.fingerprint,
            }),
            None => serde_json::json!({
                "operation_id": op.id,
                "state": op.state,
                "history_seq": jobtrail_service::operator::parse_seen_pinned(&op.seen)
                    .ok()
                    .and_then(|(_, seq, _)| seq),
                "moved": r.moved,
            }),
        };
        print_json(&v);
        return;
    }
    match &r.retry {
        Some(n) => println!(
            "{} (retries {}; new token, fingerprint {})",
            n.id, r.operation.id, n.fingerprint
        ),
        None => println!(
            "{}: {} (recorded as {})",
            r.operation.id, r.moved, r.operation.seen
        ),
    }
}

/// A cancel request by a person.
pub async fn cancel(
    store: &Store,
    id: &str,
    (actor, reason): (&str, &str),
    seen: Option<&str>,
    json: bool,
) -> CmdResult {
    let service = Service::new(store.clone(), jobtrail_provider::Registry::default());
    let r = service
        .cancel_as_seen(&Principal::trusted(actor), id, reason, seen)
        .await
        .map_err(|e| match e.kind {
            jobtrail_service::Kind::Conflict => {
                fail(exit::CONFLICT, format!("refused: {}", e.message))
            }
            _ => failure(e),
        })?;
    if let Some(seen) = seen {
        warn_bare(seen);
    }
    if json {
        print_json(&serde_json::json!({
            "operation_id": r.operation.id, "state": r.operation.state, "note": r.note,
        }));
    } else {
        println!("{}: {}", r.operation.id, r.note);
    }
    Ok(ExitCode::SUCCESS)
}

/// A retry's request body from a file (`-`: stdin), read up to the largest body a request may be
/// (`/dev/zero` is refused, not read until memory runs out), parsed as strictly as any request.
pub fn retry_body(path: Option<std::path::PathBuf>) -> Result<Option<serde_json::Value>, Failure> {
    use std::io::Read;
    path.map(|p| {
        let limit = jobtrail_core::operation::MAX_BODY_BYTES;
        let mut bytes = Vec::new();
        let read = if p.as_os_str() == "-" {
            std::io::stdin()
                .take(limit as u64 + 1)
                .read_to_end(&mut bytes)
        } else {
            std::fs::File::open(&p).and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut bytes))
        };
        read.map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))?;
        if bytes.len() > limit {
            return Err(fail(
                exit::BAD_INPUT,
                format!(
                    "{}: larger than a request may be ({limit} bytes)",
                    p.display()
                ),
            ));
        }
        jobtrail_core::json::parse_strict(&bytes)
            .map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))
    })
    .transpose()
}
