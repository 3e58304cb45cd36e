//! The whole story of one operation, in order: every transition and every provider call.

use comfy_table::{Table, presets::UTF8_BORDERS_ONLY};
use jobtrail_store::{HistoryRecord, OperationRecord, StoredCall};
use std::fmt::Write;

/// Rows of the story shown from its start, and from its end, when it is longer than both.
const SHOWN_FIRST: usize = 20;
const SHOWN_LAST: usize = 400;

fn t(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

/// A terminal rendering of an operation, its history and its calls. Text callers and providers
/// supplied is shown with control characters escaped (see [`crate::visible`]).
pub fn render(op: &OperationRecord, history: &[HistoryRecord], calls: &[StoredCall]) -> String {
    let op = &crate::visible::operation(op);
    let history: &[HistoryRecord] = &history
        .iter()
        .map(crate::visible::history)
        .collect::<Vec<_>>();
    let calls: &[StoredCall] = &calls.iter().map(crate::visible::call).collect::<Vec<_>>();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  {}  (provider {}, target {})",
        op.id, op.state, op.provider, op.target
    );
    let _ = writeln!(out, "  meaning        {}", op.state.meaning());
    let approval = op
        .approval_ref
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  requested by   {}, approved by {}{approval}",
        op.caller, op.approved_by
    );
    let _ = writeln!(out, "  fingerprint    {}", op.fingerprint);
    let _ = writeln!(out, "  trace id       {}", op.trace_id);
    let guarantee = if op.at_most_once {
        "at-most-once guaranteed by the provider's token"
    } else {
        "NO idempotency: at-most-once cannot be guaranteed"
    };
    let _ = writeln!(
        out,
        "  idempotency    {} ({guarantee})",
        op.idempotency.as_str()
    );
    let _ = writeln!(
        out,
        "  remote job     {}{}",
        op.remote_job_id.as_deref().unwrap_or("(none yet)"),
        op.conflicting_remote_job_id
            .as_deref()
            .map(|c| format!("  CONFLICTING ANSWER: {c}"))
            .unwrap_or_default()
    );
    if let Some(rs) = &op.remote_state {
        let upd = op
            .remote_updated_at
            .as_deref()
            .map(|u| format!(", provider time {u}"))
            .unwrap_or_default();
        let obs = op
            .observed_at
            .map(|o| format!(", observed {}", t(&o)))
            .unwrap_or_default();
        let _ = writeln!(out, "  remote state   {rs}{upd}{obs}");
    }
    // A provider's JSON, shown escaped: JSON leaves a direction override or a line separator as
    // it is, and a terminal acts on them.
    if let Some(p) = &op.remote_progress {
        let _ = writeln!(
            out,
            "  progress       {}",
            crate::visible::text(&p.to_string())
        );
    }
    let cancel = op
        .cancel_deadline
        .map(|d| format!(", cancel {}", t(&d)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  deadlines      create {}, result {}{cancel}",
        t(&op.create_deadline),
        t(&op.result_deadline)
    );
    if op.state.is_automated() {
        let _ = writeln!(
            out,
            "  next action    {} ({})",
            t(&op.next_action_at),
            op.next_action_reason
        );
    }
    let _ = writeln!(
        out,
        "  attempts       create {}, polls {}, failures {}, cancel {}, result {}",
        op.create_attempts, op.poll_count, op.failure_count, op.cancel_attempts, op.result_attempts
    );
    if let (Some(o), Some(e)) = (&op.lease_owner, &op.lease_expires_at) {
        let _ = writeln!(
            out,
            "  lease          {o} until {} (epoch {})",
            t(e),
            op.lease_epoch
        );
    }
    if let Some(by) = &op.cancel_requested_by {
        let _ = writeln!(
            out,
            "  cancel         requested by {by}: {}",
            op.cancel_reason.as_deref().unwrap_or("")
        );
    }
    if let (Some(loc), Some(sha)) = (&op.result_location, &op.result_sha256) {
        let _ = writeln!(
            out,
            "  result         {loc} ({} bytes, sha256 {sha})",
            op.result_size.unwrap_or(0)
        );
    }
    if let Some(s) = &op.result_summary {
        let _ = writeln!(
            out,
            "  result summary {}",
            crate::visible::text(&s.to_string())
        );
    }
    if let Some(r) = &op.escalation_reason {
        let _ = writeln!(out, "  ESCALATED      {r}");
    }
    for (label, link) in [
        ("supersedes", op.supersedes),
        ("superseded by", op.superseded_by),
    ] {
        if let Some(l) = link {
            let _ = writeln!(out, "  {label:<14} {l}");
        }
    }

    // One story: history rows and calls, by time.
    enum Item<'a> {
        H(&'a HistoryRecord),
        C(&'a StoredCall),
    }
    let mut items: Vec<(chrono::DateTime<chrono::Utc>, u8, Item)> =
        history.iter().map(|h| (h.at, 1, Item::H(h))).collect();
    items.extend(calls.iter().map(|c| (c.started_at, 0, Item::C(c))));
    items.sort_by_key(|a| (a.0, a.1));
    let mut table = Table::new();
    table.load_style(UTF8_BORDERS_ONLY);
    table.set_header(vec!["at", "who", "what", "detail"]);
    // A job polled for days has tens of thousands of reads: its start and its latest are shown,
    // and between them every step that moved the state or was not a read (a person's decision, an
    // escalation); the reads and calls left out are counted where they were (a terminal is not an
    // archive; --json has every one).
    let total = items.len();
    let middle = SHOWN_FIRST..total.saturating_sub(SHOWN_LAST).max(SHOWN_FIRST);
    let mut left_out = 0usize;
    let gap = |table: &mut Table, n: &mut usize| {
        if *n > 0 {
            table.add_row(vec![
                String::new(),
                String::new(),
                format!("… {n} more"),
                "reads and calls not shown here: `show --json` has every one".to_owned(),
            ]);
            *n = 0;
        }
    };
    for (i, (_, _, item)) in items.into_iter().enumerate() {
        if middle.contains(&i) {
            let kept = matches!(&item, Item::H(h)
                if h.from_state.as_deref() != Some(h.to_state.as_str())
                    || !matches!(h.event.as_str(), "remote_progress" | "call_failed"));
            if !kept {
                left_out += 1;
                continue;
            }
        }
        gap(&mut table, &mut left_out);
        match item {
            Item::H(h) => {
                let moved = match &h.from_state {
                    Some(f) if *f != h.to_state => format!("#{} {f} → {}", h.seq, h.to_state),
                    Some(f) => format!("#{} {f} (stays)", h.seq),
                    None => format!("#{} → {}", h.seq, h.to_state),
                };
                // The actor the writer named, and the login the database saw write it.
                let who = match &h.recorded_by {
                    Some(login) => format!("{} [{login}]", h.actor),
                    None => h.actor.clone(),
                };
                table.add_row(vec![
                    t(&h.at),
                    who,
                    moved,
                    format!("{}: {}", h.event, h.cause),
                ]);
            }
            Item::C(c) => {
                let status = c
                    .http_status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| c.error_class.clone().unwrap_or_else(|| "-".into()));
                let rid = c
                    .provider_request_id
                    .as_deref()
                    .map(|r| format!(" req {r}"))
                    .unwrap_or_default();
                table.add_row(vec![
                    t(&c.started_at),
                    format!("{} (epoch {})", c.actor, c.lease_epoch),
                    format!("call {} #{}", c.kind, c.attempt),
                    format!(
                        "{} {} → {status} in {:.0} ms{rid}: {}",
                        c.method, c.url, c.duration_ms, c.outcome
                    ),
                ]);
            }
        }
    }
    gap(&mut table, &mut left_out);
    let _ = writeln!(out, "\n{table}");
    out
}
