//! Result validation: a 200 is not a result. Content type, size, checksum, schema, counts and
//! per-item outcomes are checked against the contract before an operation may succeed.

use crate::contract::{ResultFormat, ResultSpec};
use crate::outcome::{Checked, FetchedResult, ResultHints};
use sha2::{Digest, Sha256};

/// Check `fetched` against `spec`, with the facts the status read gave (`hints`).
pub fn check(spec: &ResultSpec, fetched: &FetchedResult, hints: &ResultHints) -> Checked {
    if spec.format == ResultFormat::None {
        return no_result(fetched);
    }
    let mut checks = Vec::new();
    let mut violations = Vec::new();

    if let Some(want) = &spec.content_type {
        let got = fetched.content_type.as_deref().unwrap_or("");
        let essence = got.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case(want) {
            checks.push(format!("content_type={want}"));
        } else {
            violations.push(format!("content type is {got:?}, expected {want:?}"));
        }
    }

    let size = fetched.bytes.len() as u64;
    if size > spec.max_bytes {
        violations.push(format!(
            "result is {size} bytes, over the limit of {}",
            spec.max_bytes
        ));
    } else {
        checks.push(format!("size<={}", spec.max_bytes));
    }

    // Every checksum given must match: the one the result's own answer carries (from storage the
    // contract may name as unauthenticated) never stands in for the one the provider's
    // credentialed status answer gave.
    let digest = hex::encode(Sha256::digest(&fetched.bytes));
    let given = [
        ("the result's checksum header", fetched.checksum.as_deref()),
        ("the provider's status answer", hints.checksum.as_deref()),
    ];
    for (whose, want) in given {
        let Some(want) = want else { continue };
        let want = want
            .trim()
            .trim_start_matches("sha256:")
            .to_ascii_lowercase();
        if want == digest {
            checks.push(format!("sha256 matches the checksum {whose} gave"));
        } else {
            violations.push(format!(
                "sha256 is {digest}, the checksum {whose} gave says {want}"
            ));
        }
    }
    if let Some(what) = &hints.unreadable {
        violations.push(format!(
            "the provider's status answer gave {what}, which cannot be read: the result is not checked without it"
        ));
    } else if given.iter().all(|(_, w)| w.is_none()) {
        checks.push("sha256 recorded (provider gave no checksum)".into());
    }

    let mut summary = serde_json::json!({ "bytes": size, "sha256": digest });
    match spec.format {
        ResultFormat::Json => check_json(
            spec,
            fetched,
            hints,
            &mut checks,
            &mut violations,
            &mut summary,
        ),
        ResultFormat::Csv => check_csv(
            spec,
            fetched,
            hints,
            &mut checks,
            &mut violations,
            &mut summary,
        ),
        ResultFormat::Bytes | ResultFormat::None => {}
    }

    if violations.is_empty() {
        // Kept in the chain, whose hash reads every number as a double.
        jobtrail_core::json::integers_beyond_double_as_text(&mut summary);
        Checked::Valid { checks, summary }
    } else {
        Checked::Invalid { violations }
    }
}

/// A contract whose jobs have no result: the provider's success is the outcome, recorded as an
/// empty result that says so. Bytes where none may be are not quietly dropped.
fn no_result(fetched: &FetchedResult) -> Checked {
    if !fetched.bytes.is_empty() {
        return Checked::Invalid {
            violations: vec![format!(
                "{} bytes where the contract says the job has no result",
                fetched.bytes.len()
            )],
        };
    }
    Checked::Valid {
        checks: vec!["no result by contract (result.format = \"none\")".into()],
        summary: serde_json::json!({
            "bytes": 0,
            "sha256": hex::encode(Sha256::digest(b"")),
            "result": "none by contract",
        }),
    }
}

fn expected_count(spec: &ResultSpec, hints: &ResultHints) -> Option<u64> {
    hints.expected_count.or(spec.expected_count)
}

/// How many failed items the summary describes one by one (all are counted).
const DESCRIBED_FAILURES: usize = 20;

/// The most failed items the summary names in `failed_refs` (all are counted, and the result's
/// bytes name every one): a hostile or broken provider's millions of failed rows must not become
/// millions of strings in a worker's memory and a history link.
const LISTED_FAILURES: usize = 1000;

/// How much of an item's reference the summary keeps.
const REF_BYTES: usize = 200;

/// One failed item: its reference (the item's id, or its place: `#3`, `line 7`) and why, in the
/// provider's words (status value, error), cut to a readable length.
struct Failure {
    reference: String,
    why: String,
}

/// The failed items of a result: every one counted, the first [`LISTED_FAILURES`] named and the
/// first [`DESCRIBED_FAILURES`] described.
#[derive(Default)]
struct Failures {
    count: u64,
    refs: Vec<String>,
    described: Vec<Failure>,
}

impl Failures {
    fn add(&mut self, reference: impl FnOnce() -> String, why: String) {
        self.count += 1;
        if self.refs.len() >= LISTED_FAILURES {
            return;
        }
        let reference = crate::text::truncate(reference(), REF_BYTES);
        if self.described.len() < DESCRIBED_FAILURES {
            self.described.push(Failure {
                reference: reference.clone(),
                why,
            });
        }
        self.refs.push(reference);
    }
}

fn judge_items(
    spec: &ResultSpec,
    hints: &ResultHints,
    total: u64,
    failed: Failures,
    checks: &mut Vec<String>,
    violations: &mut Vec<String>,
    summary: &mut serde_json::Value,
) {
    if let Some(want) = expected_count(spec, hints) {
        if want == total {
            checks.push(format!("count={want}"));
        } else {
            violations.push(format!("{total} items, expected {want}"));
        }
    }
    let n_failed = failed.count;
    let described: Vec<serde_json::Value> = failed
        .described
        .iter()
        .map(|f| serde_json::json!({"ref": f.reference, "why": f.why}))
        .collect();
    let omitted = n_failed - failed.refs.len() as u64;
    summary["items"] = serde_json::json!({
        "total": total,
        "succeeded": total - n_failed.min(total),
        "failed": n_failed,
        "failed_refs": failed.refs,
        "failures": described,
    });
    if omitted > 0 {
        summary["items"]["failed_refs_omitted"] = omitted.into();
    }
    if n_failed > 0 {
        checks.push(format!(
            "{n_failed} of {total} items failed (partly failed batch)"
        ));
    }
    match spec.max_failed_items {
        Some(max) if n_failed > max => {
            violations.push(format!("{n_failed} items failed, at most {max} allowed"));
        }
        Some(max) => checks.push(format!("failed_items<={max}")),
        None => checks.push("per-item outcomes recorded".into()),
    }
}

fn check_json(
    spec: &ResultSpec,
    fetched: &FetchedResult,
    hints: &ResultHints,
    checks: &mut Vec<String>,
    violations: &mut Vec<String>,
    summary: &mut serde_json::Value,
) {
    // A key twice in one object is refused: the schema would check one value (serde_json keeps
    // the last) and the caller's reader might take the other.
    let whole = match jobtrail_core::json::parse_unique_keys(&fetched.bytes) {
        Ok(v) => v,
        Err(e) => {
            // Cut: the message may quote a key, which a provider may make as long as the result.
            violations.push(crate::text::storable(format!(
                "result is not valid JSON: {}",
                cut(e.to_string())
            )));
            return;
        }
    };
    checks.push("json".into());
    // The result inside a larger document (Google's Operation.response): the provider's bytes are
    // kept whole; the rules apply to the part.
    let doc = match &spec.within {
        None => &whole,
        Some(p) => match whole.pointer(p) {
            Some(v) if !v.is_null() => {
                checks.push(format!("result at {p}"));
                v
            }
            _ => {
                violations.push(format!("the document has no result at {p}"));
                return;
            }
        },
    };
    if let Some(schema) = &spec.schema {
        let errors: Vec<String> = schema
            .iter_errors(doc)
            .take(5)
            // Masked: the library's message holds the offending value itself, which may be the
            // whole result (megabytes, into the history, the row and every answer that shows it).
            .map(|e| {
                let at = cut(e.instance_path().to_string());
                let why = e.masked_with("the value").to_string();
                crate::text::storable(format!("schema: {} at {at}", cut(why)))
            })
            .collect();
        if errors.is_empty() {
            checks.push("schema".into());
        } else {
            violations.extend(errors);
        }
    }
    let Some(ptr) = &spec.items else {
        if expected_count(spec, hints).is_some() {
            violations
                .push("an expected count is set but the contract names no items pointer".into());
        }
        return;
    };
    let Some(items) = doc.pointer(ptr).and_then(|v| v.as_array()) else {
        violations.push(format!("no item array at {ptr}"));
        return;
    };
    let mut failed = Failures::default();
    for (i, item) in items.iter().enumerate() {
        if let Some(why) = item_failure(spec, item) {
            let reference = || {
                spec.item_ref
                    .as_ref()
                    .and_then(|p| item.pointer(p))
                    .map(crate::text::of_json)
                    .unwrap_or_else(|| format!("#{i}"))
            };
            failed.add(reference, why);
        }
    }
    judge_items(
        spec,
        hints,
        items.len() as u64,
        failed,
        checks,
        violations,
        summary,
    );
}

/// How much of a provider's text one failure's description carries.
const WHY_BYTES: usize = 200;

/// Text from the provider, cut to a length a summary can carry.
fn cut(s: String) -> String {
    crate::text::truncate(s, WHY_BYTES)
}

/// Why one JSON item failed, or `None` when it did not: a non-null, non-false error, a status
/// value the contract lists as failed, or (when it lists the succeeded ones) any other value —
/// an item whose status nobody listed, or that has none, is not counted as a success.
fn item_failure(spec: &ResultSpec, item: &serde_json::Value) -> Option<String> {
    let error = spec
        .item_error
        .as_ref()
        .and_then(|p| item.pointer(p))
        .filter(|e| !e.is_null() && *e != &serde_json::Value::Bool(false));
    let status = spec
        .item_status
        .as_ref()
        .map(|p| item.pointer(p).map(crate::text::of_json));
    let status_failed = match &status {
        None => false,
        Some(value) => {
            let v = value.as_deref();
            v.is_some_and(|v| spec.item_failed_values.iter().any(|f| f == v))
                || (!spec.item_succeeded_values.is_empty()
                    && !v.is_some_and(|v| spec.item_succeeded_values.iter().any(|s| s == v)))
        }
    };
    if error.is_none() && !status_failed {
        return None;
    }
    let mut why = Vec::new();
    match status {
        Some(Some(v)) if status_failed => why.push(format!("status {v:?}")),
        Some(None) if status_failed => why.push("no status".to_owned()),
        _ => {}
    }
    if let Some(e) = error {
        why.push(format!("error: {}", crate::text::of_json(e)));
    }
    Some(cut(why.join("; ")))
}

/// Whether a CSV row with this status value failed: a listed error value, or, when the contract
/// lists the succeeded ones, any value it does not list (`Error` where it lists `OK` and `ERROR`).
fn row_failed(spec: &ResultSpec, value: &str) -> bool {
    spec.csv_error_values.iter().any(|e| e == value)
        || (!spec.csv_succeeded_values.is_empty()
            && !spec.csv_succeeded_values.iter().any(|s| s == value))
}

fn check_csv(
    spec: &ResultSpec,
    fetched: &FetchedResult,
    hints: &ResultHints,
    checks: &mut Vec<String>,
    violations: &mut Vec<String>,
    summary: &mut serde_json::Value,
) {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(fetched.bytes.as_ref());
    let headers = match reader.headers() {
        Ok(h) if h.is_empty() => {
            violations.push("result is not a CSV table: it has no header row".into());
            return;
        }
        Ok(h) => h.clone(),
        Err(e) => {
            violations.push(format!("result is not valid CSV: {e}"));
            return;
        }
    };
    let status_col = match &spec.csv_status_column {
        // Named twice, one column is checked here and a reader by name (Python's DictReader keeps
        // the last) may take the other: refused, as a JSON key given twice is.
        Some(name) if headers.iter().filter(|h| h == name).count() > 1 => {
            violations.push(format!(
                "CSV names its status column {name:?} more than once: which one a reader takes is not agreed"
            ));
            return;
        }
        Some(name) => match headers.iter().position(|h| h == name) {
            Some(i) => Some(i),
            None => {
                violations.push(format!("CSV has no column {name:?}"));
                return;
            }
        },
        None => None,
    };
    let mut total = 0u64;
    let mut failed = Failures::default();
    for rec in reader.records() {
        let rec = match rec {
            Ok(r) => r,
            // The csv error names the line itself.
            Err(e) => {
                violations.push(format!("result is not valid CSV: {e}"));
                return;
            }
        };
        total += 1;
        if let Some(col) = status_col
            && let Some(value) = rec.get(col).filter(|v| row_failed(spec, v))
        {
            // The line the row starts on in the provider's file (a quoted field may span lines,
            // so the row's index is not its line).
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            failed.add(
                || format!("line {line}"),
                cut(format!("{} = {value:?}", headers.get(col).unwrap_or(""))),
            );
        }
    }
    checks.push("csv".into());
    judge_items(spec, hints, total, failed, checks, violations, summary);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Contract;

    /// A small contract whose `[result]` holds `result`, parsed.
    fn parsed(result: &str) -> Result<Contract, crate::contract::ContractError> {
        let text = format!(
            r#"
name = "t"
base_url = "http://127.0.0.1:9"
[create]
path = "/jobs"
idempotency = "none"
job_id = "body:/id"
[status]
url = "/jobs/{{job_id}}"
state = "/state"
[status.states]
succeeded = ["done"]
failed = ["failed"]
[result]
url = "/jobs/{{job_id}}/result"
{result}
"#
        );
        Contract::parse(&text, std::path::Path::new("t.toml"))
    }

    fn spec(result: &str) -> ResultSpec {
        parsed(result).unwrap().result.unwrap()
    }

    fn summary(spec: &ResultSpec, body: &str) -> serde_json::Value {
        let fetched = FetchedResult {
            bytes: bytes::Bytes::from(body.to_owned()),
            content_type: None,
            checksum: None,
        };
        match check(spec, &fetched, &ResultHints::default()) {
            Checked::Valid { summary, .. } => summary,
            Checked::Invalid { violations } => panic!("{violations:?}"),
        }
    }

    /// A hint the status answer gave but in a form that cannot be read refuses the result: checked
    /// without it, the record would say the provider gave none.
    #[test]
    fn an_unreadable_hint_refuses_the_result() {
        let spec = spec(r#"format = "json""#);
        let fetched = FetchedResult {
            bytes: bytes::Bytes::from_static(b"{}"),
            content_type: None,
            checksum: None,
        };
        let hints = ResultHints {
            unreadable: Some("a checksum {\"value\":\"ab\"}".into()),
            ..ResultHints::default()
        };
        let Checked::Invalid { violations } = check(&spec, &fetched, &hints) else {
            panic!("taken with an unreadable checksum");
        };
        assert!(violations[0].contains("a checksum"), "{violations:?}");
        assert!(matches!(
            check(&spec, &fetched, &ResultHints::default()),
            Checked::Valid { .. }
        ));
    }

    /// A result that breaks its schema is described by where and how, not by its own value: the
    /// library's message held the whole value (a megabyte result, once per violation, went into
    /// the history, the operation's row and every answer showing them).
    #[test]
    fn a_schema_violation_does_not_carry_the_result() {
        let mut spec = spec(r#"format = "json""#);
        spec.schema = Some(std::sync::Arc::new(
            jsonschema::validator_for(&serde_json::json!({
                "type": "object",
                "properties": {"rows": {"type": "array", "maxItems": 1}},
                "additionalProperties": false
            }))
            .unwrap(),
        ));
        let huge = "x".repeat(1 << 20);
        for body in [
            serde_json::json!([huge]),
            serde_json::json!({ "rows": [huge, huge] }),
            serde_json::json!({ huge.clone(): 1 }),
        ] {
            let fetched = FetchedResult {
                bytes: bytes::Bytes::from(body.to_string()),
                content_type: None,
                checksum: None,
            };
            let Checked::Invalid { violations } = check(&spec, &fetched, &ResultHints::default())
            else {
                panic!("a result breaking its schema was taken");
            };
            assert!(!violations.is_empty());
            let total: usize = violations.iter().map(String::len).sum();
            assert!(total < 2048, "{} bytes of violations", total);
            assert!(
                violations.iter().all(|v| v.starts_with("schema: ")),
                "{violations:?}"
            );
        }
    }

    /// A key twice in one object, at any depth: the schema would check the last value (what
    /// serde_json keeps) while the caller's reader may take the first. A long key is quoted cut.
    /// Numbers no request may hold (beyond a double's exact integers) are a provider's own.
    #[test]
    fn a_result_read_two_ways_is_refused() {
        let mut spec = spec(r#"format = "json""#);
        spec.schema = Some(std::sync::Arc::new(
            jsonschema::validator_for(&serde_json::json!({
                "properties": {"amount": {"maximum": 100}}
            }))
            .unwrap(),
        ));
        let long = "k".repeat(1 << 20);
        let check_of = |body: String| {
            let fetched = FetchedResult {
                bytes: bytes::Bytes::from(body),
                content_type: None,
                checksum: None,
            };
            check(&spec, &fetched, &ResultHints::default())
        };
        for body in [
            r#"{"amount": 1000000, "amount": 5}"#.to_owned(),
            r#"{"rows": [{"id": 1, "id": 2}]}"#.to_owned(),
            format!(r#"{{"{long}": 1, "{long}": 2}}"#),
        ] {
            let Checked::Invalid { violations } = check_of(body) else {
                panic!("a result with a key twice was taken");
            };
            assert_eq!(violations.len(), 1, "{}", violations[0].len());
            assert!(
                violations[0].contains("appears twice") && violations[0].len() < 400,
                "{}",
                &violations[0][..violations[0].len().min(400)]
            );
        }
        for body in [
            r#"{"amount": 5, "rows": [{"amount": 5}], "big": 18446744073709551616, "x": 1e300, "s": "a\u0000b"}"#,
            r#"[{"id": 1}, {"id": 1}]"#,
        ] {
            assert!(
                matches!(check_of(body.to_owned()), Checked::Valid { .. }),
                "{body}"
            );
        }
    }

    #[test]
    fn an_item_fails_by_its_status_value_and_an_unlisted_value_is_no_success() {
        let listed = spec(
            r#"items = "/items"
item_ref = "/id"
item_status = "/status"
item_failed_values = ["FAILED", "ERROR"]"#,
        );
        let body = r#"{"items": [
            {"id": "a", "status": "SUCCEEDED"},
            {"id": "b", "status": "FAILED", "error": {"message": "quota"}},
            {"id": "c", "status": "ERROR"},
            {"id": "d", "status": "SKIPPED"}
        ]}"#;
        let s = summary(&listed, body);
        assert_eq!(s["items"]["failed"], 2, "{s}");
        assert_eq!(s["items"]["failed_refs"], serde_json::json!(["b", "c"]));
        assert_eq!(s["items"]["failures"][0]["why"], "status \"FAILED\"");

        // With the succeeded values listed, SKIPPED and a missing status are not successes.
        let strict = spec(
            r#"items = "/items"
item_ref = "/id"
item_status = "/status"
item_succeeded_values = ["SUCCEEDED"]
item_error = "/error""#,
        );
        let body = r#"{"items": [
            {"id": "a", "status": "SUCCEEDED"},
            {"id": "b", "status": "SKIPPED"},
            {"id": "c"},
            {"id": "d", "status": "SUCCEEDED", "error": "partial write"},
            {"id": 7, "status": true}
        ]}"#;
        let s = summary(&strict, body);
        assert_eq!(
            s["items"]["failed_refs"],
            serde_json::json!(["b", "c", "d", "7"]),
            "{s}"
        );
        assert_eq!(s["items"]["succeeded"], 1);
        assert_eq!(s["items"]["failures"][1]["why"], "no status");
        assert_eq!(s["items"]["failures"][2]["why"], "error: partial write");
        assert_eq!(s["items"]["failures"][3]["why"], "status \"true\"");
    }

    #[test]
    fn a_partly_failed_batch_says_so_and_its_descriptions_are_bounded() {
        let spec = spec(
            r#"items = "/items"
item_status = "/s"
item_error = "/e"
item_failed_values = ["bad"]"#,
        );
        let long = "x".repeat(5000);
        let items: Vec<_> = (0..100)
            .map(|i| serde_json::json!({"s": if i % 2 == 0 { "bad" } else { "ok" }, "e": long}))
            .collect();
        let body = serde_json::json!({ "items": items }).to_string();
        let fetched = FetchedResult {
            bytes: bytes::Bytes::from(body),
            content_type: None,
            checksum: None,
        };
        let Checked::Valid { checks, summary } = check(&spec, &fetched, &ResultHints::default())
        else {
            panic!()
        };
        assert!(
            checks.iter().any(|c| c.contains("100 of 100 items failed")),
            "{checks:?}"
        );
        assert_eq!(summary["items"]["failed"], 100);
        assert_eq!(summary["items"]["failures"].as_array().unwrap().len(), 20);
        assert_eq!(summary["items"]["failures"][0]["ref"], "#0");
        // Every item has an error here; the odd ones' status is fine but the error fails them.
        let why = summary["items"]["failures"][0]["why"].as_str().unwrap();
        assert!(
            why.starts_with("status \"bad\"; error: xxx") && why.len() <= 204,
            "{why}"
        );
    }

    #[test]
    fn every_checksum_given_must_match() {
        let spec = spec(r#"format = "bytes""#);
        let bytes = bytes::Bytes::from_static(b"the report");
        let right = hex::encode(Sha256::digest(&bytes));
        let wrong = "0".repeat(64);
        let judge = |header: Option<&str>, status: Option<&str>| {
            let fetched = FetchedResult {
                bytes: bytes.clone(),
                content_type: None,
                checksum: header.map(str::to_owned),
            };
            let hints = ResultHints {
                checksum: status.map(str::to_owned),
                ..ResultHints::default()
            };
            matches!(check(&spec, &fetched, &hints), Checked::Valid { .. })
        };
        assert!(judge(None, None));
        assert!(judge(Some(&right), None));
        assert!(judge(
            None,
            Some(&format!("sha256:{}", right.to_uppercase()))
        ));
        assert!(judge(Some(&right), Some(&right)));
        // Storage that serves other bytes with a checksum of its own does not overrule the
        // checksum the provider's (credentialed) status answer gave.
        assert!(!judge(Some(&right), Some(&wrong)));
        assert!(!judge(Some(&wrong), Some(&right)));
        assert!(!judge(None, Some(&wrong)));
    }

    #[test]
    fn a_result_of_many_failed_items_is_counted_whole_and_named_in_part() {
        // 200 000 failed rows (a hostile provider's 1.2 MB; the default limit allows 16 MiB):
        // every one counted, a thousand named, the summary a few tens of KiB.
        let csv = spec(
            r#"format = "csv"
csv_status_column = "s"
csv_error_values = ["E"]"#,
        );
        let body = format!("s\n{}", "E\n".repeat(200_000));
        let s = summary(&csv, &body);
        assert_eq!(s["items"]["failed"], 200_000);
        assert_eq!(
            s["items"]["failed_refs"].as_array().unwrap().len(),
            LISTED_FAILURES
        );
        assert_eq!(
            s["items"]["failed_refs_omitted"],
            200_000 - LISTED_FAILURES as u64
        );
        assert!(s.to_string().len() < 64 * 1024, "{}", s.to_string().len());
        // A provider's megabyte item id is cut in what the summary keeps.
        let json = spec(
            r#"items = "/items"
item_ref = "/id"
item_status = "/s"
item_failed_values = ["bad"]"#,
        );
        let body =
            serde_json::json!({"items": [{"id": "i".repeat(1 << 20), "s": "bad"}]}).to_string();
        let s = summary(&json, &body);
        let r = s["items"]["failed_refs"][0].as_str().unwrap();
        assert!(r.len() <= REF_BYTES + 3, "{}", r.len());
        assert!(s.to_string().len() < 4096);
        assert!(s["items"].get("failed_refs_omitted").is_none());
    }

    /// An empty body is no CSV table (no header row), whatever else the contract asks of one; a
    /// header row with no data rows is a table of none.
    #[test]
    fn an_empty_csv_result_is_no_table() {
        let spec = spec(r#"format = "csv""#);
        let fetched = |body: &'static [u8]| FetchedResult {
            bytes: bytes::Bytes::from_static(body),
            content_type: None,
            checksum: None,
        };
        for body in [&b""[..], b"\n"] {
            let Checked::Invalid { violations } =
                check(&spec, &fetched(body), &ResultHints::default())
            else {
                panic!("{body:?} passed");
            };
            assert!(violations[0].contains("no header row"), "{violations:?}");
        }
        assert_eq!(summary(&spec, "id,status\n")["items"]["total"], 0);
    }

    #[test]
    fn a_failing_csv_row_is_named_by_the_line_it_starts_on() {
        let spec = spec(
            r#"format = "csv"
csv_status_column = "status"
csv_error_values = ["ERROR"]"#,
        );
        // Row 2's note spans two lines, so row 3 starts on line 5, not line 4.
        let body = "id,note,status\nr1,fine,OK\nr2,\"two\nlines\",OK\nr3,bad,ERROR\n";
        let s = summary(&spec, body);
        assert_eq!(s["items"]["total"], 3);
        assert_eq!(s["items"]["failed_refs"], serde_json::json!(["line 5"]));
        assert_eq!(s["items"]["failures"][0]["why"], "status = \"ERROR\"");
    }

    /// A status column named twice is refused: the check would read the first, and a reader by
    /// name (Python's `csv.DictReader`) the last, which here says the row failed.
    #[test]
    fn a_csv_naming_its_status_column_twice_is_refused() {
        let spec = spec(
            r#"format = "csv"
csv_status_column = "status"
csv_error_values = ["ERROR"]"#,
        );
        let fetched = FetchedResult {
            bytes: bytes::Bytes::from_static(b"id,status,status\n1,OK,ERROR\n"),
            content_type: None,
            checksum: None,
        };
        let Checked::Invalid { violations } = check(&spec, &fetched, &ResultHints::default())
        else {
            panic!("passed");
        };
        assert!(violations[0].contains("more than once"), "{violations:?}");
    }

    /// A deny-list passes what it does not name (`Error` where it lists `ERROR`); an allow-list
    /// fails every row whose value it does not name, an empty one included.
    #[test]
    fn a_csv_row_fails_unless_its_status_is_one_the_contract_calls_succeeded() {
        let body = "id,status\nr1,OK\nr2,Error\nr3,\nr4,ok \nr5,ERROR\n";
        let denied = spec(
            r#"format = "csv"
csv_status_column = "status"
csv_error_values = ["ERROR"]"#,
        );
        assert_eq!(
            summary(&denied, body)["items"]["failed_refs"],
            serde_json::json!(["line 6"])
        );
        let allowed = spec(
            r#"format = "csv"
csv_status_column = "status"
csv_succeeded_values = ["OK"]"#,
        );
        let s = summary(&allowed, body);
        assert_eq!(s["items"]["total"], 5);
        assert_eq!(
            s["items"]["failed_refs"],
            serde_json::json!(["line 3", "line 4", "line 5", "line 6"])
        );
        for (result, key) in [
            (
                "format = \"csv\"\ncsv_succeeded_values = [\"OK\"]",
                "result.csv_status_column",
            ),
            (
                "format = \"csv\"\ncsv_status_column = \"s\"\ncsv_succeeded_values = [\"OK\"]\ncsv_error_values = [\"OK\"]",
                "result.csv_error_values",
            ),
            (
                "format = \"json\"\ncsv_status_column = \"s\"\ncsv_succeeded_values = [\"OK\"]",
                "never checks it",
            ),
        ] {
            let err = parsed(result).unwrap_err().to_string();
            assert!(err.contains(key), "{result}: {err}");
        }
    }

    #[test]
    fn item_status_keys_come_together_and_only_beside_items() {
        for (result, key) in [
            ("item_status = \"/s\"", "result.items"),
            ("items = \"/i\"\nitem_status = \"/s\"", "result.item_status"),
            (
                "items = \"/i\"\nitem_failed_values = [\"x\"]",
                "result.item_status",
            ),
            (
                "items = \"/i\"\nitem_status = \"/s\"\nitem_failed_values = [\"x\"]\nitem_succeeded_values = [\"x\"]",
                "result.item_failed_values",
            ),
            (
                "items = \"/i\"\nitem_status = \"s\"\nitem_failed_values = [\"x\"]",
                "result.item_status",
            ),
        ] {
            let err = parsed(result).unwrap_err().to_string();
            assert!(err.contains(key), "{result}: {err}");
        }
    }
}
