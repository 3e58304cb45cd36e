//! `audit verify` and `audit anchor`.

use jobtrail_console::shell::{CmdResult, exit, fail, print_json};
use jobtrail_core::OperationId;
use jobtrail_store::Store;
use std::process::ExitCode;

pub async fn verify(
    store: &Store,
    operation: Option<String>,
    all: bool,
    expect_anchor: Option<String>,
    json: bool,
) -> CmdResult {
    if operation.is_some() && all {
        return Err(fail(
            exit::BAD_INPUT,
            "name one operation or --all, not both",
        ));
    }
    let report = match &operation {
        Some(op) => {
            let id: OperationId = op.parse().map_err(|e| fail(exit::BAD_INPUT, e))?;
            store.verify_operation(id).await?
        }
        None => store.verify_everything(expect_anchor.as_deref()).await?,
    };
    if json {
        print_json(&report);
    } else {
        for b in &report.breaks {
            println!(
                "BREAK {} #{}: {}\n      expected {}\n      stored   {}",
                b.operation_id, b.seq, b.problem, b.expected, b.stored
            );
        }
        let anchor = match &report.anchor {
            Some(a) => format!(
                ", anchor #{} ({} heads, {}) checked",
                a.id,
                a.operations,
                a.created_at.format("%Y-%m-%d %H:%M:%S")
            ),
            None if operation.is_none() => {
                ", no anchor yet (run `jobtrail-admin audit anchor`)".into()
            }
            None => String::new(),
        };
        println!(
            "{} operations, {} history rows verified{anchor}: {}",
            report.operations,
            report.rows,
            if report.is_clean() {
                "intact".to_owned()
            } else {
                format!("{} BREAKS", report.breaks.len())
            }
        );
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::NOT_SUCCEEDED)
    })
}

pub async fn anchor(store: &Store, actor: &str, json: bool) -> CmdResult {
    let a = store.anchor(actor).await?;
    if json {
        print_json(&a);
    } else {
        println!(
            "anchor #{} at {} over {} operations by {}",
            a.id,
            a.created_at.to_rfc3339(),
            a.operations,
            a.created_by
        );
        println!("digest {}", a.digest);
        eprintln!(
            "keep this digest outside the database; check it with `jobtrail-admin audit verify --all --expect-anchor {}`",
            a.digest
        );
    }
    Ok(ExitCode::SUCCESS)
}
