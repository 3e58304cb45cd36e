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

    let digest = hex::encode(Sha256::digest(&fetched.bytes));
    let expected = fetched.checksum.as_deref().or(hints.checksum.as_deref());
    match expected {
        Some(want) => {
            let want = want
                .trim()
                .trim_start_matches("sha256:")
                .to_ascii_lowercase();
            if want == digest {
                checks.push("sha256 matches the provider's checksum".into());
            } else {
                violations.push(format!(
                    "sha256 is {digest}, the provider's checksum says {want}"
                ));
            }
        }
        None => checks.push("sha256 recorded (provider gave no checksum)".into()),
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

fn judge_items(
    spec: &ResultSpec,
    hints: &ResultHints,
    total: u64,
    failed: Vec<String>,
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
    let n_failed = failed.len() as u64;
    summary["items"] = serde_json::json!({
        "total": total,
        "succeeded": total - n_failed.min(total),
        "failed": n_failed,
        "failed_refs": failed,
    });
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
    let whole: serde_json::Value = match serde_json::from_slice(&fetched.bytes) {
        Ok(v) => v,
        Err(e) => {
            violations.push(format!("result is not valid JSON: {e}"));
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
            .map(|e| format!("schema: {} at {}", e, e.instance_path()))
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
    let failed: Vec<String> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| {
            spec.item_error
                .as_ref()
                .and_then(|p| item.pointer(p))
                .is_some_and(|e| !e.is_null() && e != &serde_json::Value::Bool(false))
        })
        .map(|(i, item)| {
            spec.item_ref
                .as_ref()
                .and_then(|p| item.pointer(p))
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string())
                })
                .unwrap_or_else(|| format!("#{i}"))
        })
        .collect();
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
        Ok(h) => h.clone(),
        Err(e) => {
            violations.push(format!("result is not valid CSV: {e}"));
            return;
        }
    };
    let status_col = match &spec.csv_status_column {
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
    let mut failed = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                violations.push(format!("CSV row {}: {e}", i + 2));
                return;
            }
        };
        total += 1;
        if let Some(col) = status_col
            && spec
                .csv_error_values
                .iter()
                .any(|v| rec.get(col) == Some(v.as_str()))
        {
            // Refer to a failed row by its line number (header is line 1).
            failed.push(format!("line {}", i + 2));
        }
    }
    checks.push("csv".into());
    judge_items(spec, hints, total, failed, checks, violations, summary);
}
