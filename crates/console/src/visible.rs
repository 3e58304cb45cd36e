//! Text from callers and providers, made safe for a terminal.
//!
//! A caller name, a provider's job id or state, an error text: any of them may hold terminal escapes
//! (clearing the screen, moving the cursor), line breaks (forging a line such as "approved by
//! security team"), or bidirectional overrides (reordering what is read). Every human rendering
//! shows such characters visibly, escaped, instead of letting the terminal act on them. JSON output
//! needs nothing: JSON escapes them itself.

use jobtrail_store::{HistoryRecord, OperationRecord, StoredCall};
use std::borrow::Cow;

/// `s` with every control, line-break and direction-override character shown escaped (`\u{1b}`,
/// `\n`).
pub fn text(s: &str) -> Cow<'_, str> {
    jobtrail_core::text::visible(s)
}

fn fix(s: &mut String) {
    if let Cow::Owned(o) = text(s) {
        *s = o;
    }
}

fn fix_opt(s: &mut Option<String>) {
    if let Some(s) = s {
        fix(s);
    }
}

/// A copy of an operation with every free-text field made visible.
pub fn operation(op: &OperationRecord) -> OperationRecord {
    let mut o = op.clone();
    for s in [
        &mut o.provider,
        &mut o.target,
        &mut o.caller,
        &mut o.approved_by,
        &mut o.next_action_reason,
    ] {
        fix(s);
    }
    for s in [
        &mut o.approval_ref,
        &mut o.escalation_reason,
        &mut o.remote_job_id,
        &mut o.conflicting_remote_job_id,
        &mut o.remote_state,
        &mut o.remote_updated_at,
        &mut o.status_url,
        &mut o.lease_owner,
        &mut o.cancel_requested_by,
        &mut o.cancel_reason,
        &mut o.result_location,
        &mut o.result_content_type,
    ] {
        fix_opt(s);
    }
    o
}

/// A copy of a history row with every free-text field made visible.
pub fn history(h: &HistoryRecord) -> HistoryRecord {
    let mut h = h.clone();
    for s in [&mut h.actor, &mut h.to_state, &mut h.event, &mut h.cause] {
        fix(s);
    }
    fix_opt(&mut h.from_state);
    fix_opt(&mut h.remote_job_id);
    fix_opt(&mut h.recorded_by);
    h
}

/// A copy of a call with every free-text field made visible.
pub fn call(c: &StoredCall) -> StoredCall {
    let mut c = c.clone();
    for s in [
        &mut c.kind,
        &mut c.actor,
        &mut c.method,
        &mut c.url,
        &mut c.outcome,
    ] {
        fix(s);
    }
    fix_opt(&mut c.provider_request_id);
    fix_opt(&mut c.error_class);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_shown_not_obeyed() {
        assert_eq!(text("agent-7"), "agent-7");
        assert_eq!(text("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(
            text("x\napproved by security team"),
            "x\\napproved by security team"
        );
        assert_eq!(text("\u{202e}evil"), "\\u{202e}evil");
        assert_eq!(text("tab\there"), "tab\\there");
        assert_eq!(text("żółw ✓"), "żółw ✓", "printable text is untouched");
        // Characters that read as nothing, or break a line without a control character.
        for (hidden, shown) in [
            ("job\u{200b}_1", "job\\u{200b}_1"),
            ("a\u{2028}approved", "a\\u{2028}approved"),
            ("\u{2067}x\u{2069}", "\\u{2067}x\\u{2069}"),
            ("\u{feff}id", "\\u{feff}id"),
            ("\u{061c}id", "\\u{61c}id"),
            ("job\u{00ad}_1", "job\\u{ad}_1"),
            ("\u{3164}", "\\u{3164}"),
            ("id\u{e0041}", "id\\u{e0041}"),
        ] {
            assert_eq!(text(hidden), shown);
        }
    }
}
