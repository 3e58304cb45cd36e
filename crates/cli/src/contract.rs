//! `jobtrail contract check FILE`: a contract as jobtrail reads it — its protocol profile expanded,
//! the timings that follow from it, and every problem that stops it loading (file and key named).

use crate::common::{CmdResult, exit, fail};
use jobtrail_core::decide::LEASE_MARGIN;
use jobtrail_provider::contract::{self, Contract};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

pub fn check(file: &Path, json: bool) -> CmdResult {
    let name = file.display().to_string();
    // A file that cannot be read, or is not TOML at all: in JSON too, the problem is a document a
    // script can read.
    let unreadable = |problem: String| {
        if json {
            print_doc(&name, None, None, &[], None, std::slice::from_ref(&problem));
        }
        fail(exit::BAD_INPUT, problem)
    };
    let text = jobtrail_provider::contract::read_text_file(
        file,
        jobtrail_provider::contract::CONFIG_FILE_MOST,
    )
    .map_err(|e| unreadable(format!("{name}: {e}")))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| unreadable(format!("{name}: {e}")))?;
    let profile = table
        .get("protocol")
        .and_then(|p| p.as_str())
        .map(str::to_owned);
    // A profile that cannot be expanded (an unknown protocol, a bad `unset`) is a problem to
    // report like any other, in text and JSON alike.
    let effective = contract::effective(table, &name);
    let loaded = Contract::parse(&text, file);
    let timings = loaded.as_ref().ok().map(timings);
    let problems: Vec<String> = match (&loaded, &effective) {
        (Ok(_), _) => Vec::new(),
        (Err(_), Err(e)) => vec![e.to_string()],
        (Err(_), Ok(_)) => contract::problems(&text, file)
            .iter()
            .map(ToString::to_string)
            .collect(),
    };
    let mut effective = effective.ok();
    let notes = effective
        .as_mut()
        .map(|t| shown_safely(t, &name))
        .unwrap_or_default();
    if json {
        print_doc(
            &name,
            profile.as_deref(),
            effective.as_ref(),
            &notes,
            timings.as_ref(),
            &problems,
        );
    } else {
        match (&profile, &effective) {
            (Some(p), Some(_)) => {
                println!("# {name}: the effective contract (profile {p:?} expanded)")
            }
            (Some(p), None) => println!("# {name}: the profile {p:?} cannot be expanded"),
            (None, _) => println!("# {name}: the effective contract (no protocol profile)"),
        }
        for note in &notes {
            println!("# {note}");
        }
        if let Some(effective) = &effective {
            println!(
                "{}",
                toml::to_string_pretty(effective)
                    .unwrap_or_else(|e| format!("# (not printable: {e})"))
            );
        }
        if let Some(t) = &timings {
            println!("# timings");
            for (k, v) in t.as_object().into_iter().flatten() {
                println!("#   {k}: {}", v.as_str().unwrap_or_default());
            }
        }
    }
    if problems.is_empty() {
        if !json {
            println!("# no problems: the contract loads");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let n = problems.len();
    Err(fail(
        exit::BAD_INPUT,
        format!(
            "{n} problem{}:\n{}",
            if n == 1 { "" } else { "s" },
            problems.join("\n")
        ),
    ))
}

/// The effective contract as it may be printed (to a terminal, a CI log): a `base_url` with a user,
/// a password or a secret-looking query value is shown without them, as the loader's own error
/// shows it; and what the environment overrides it with is said. The notes say both.
fn shown_safely(effective: &mut toml::Table, file: &str) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(toml::Value::String(base)) = effective.get_mut("base_url") {
        // The loader's own test (a user, a password, a credential's name in the query), not a
        // comparison with the sanitised text, which also rewrites harmless forms (a trailing
        // `/`, a host's case, `?languageCode=`).
        let with_credentials = url::Url::parse(base)
            .is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
            || contract::credential_in_query(base).is_some();
        if with_credentials {
            let shown = jobtrail_provider::wire::sanitize_url_text(base);
            notes.push(format!(
                "{file}: base_url holds credentials, not shown (and refused: name the secret in [auth])"
            ));
            *base = shown;
        }
    }
    if let Some(name) = effective.get("name").and_then(|n| n.as_str()) {
        let key = contract::base_url_env_key(name);
        if let Some(over) = std::env::var(&key).ok().filter(|s| !s.is_empty()) {
            notes.push(format!(
                "{key} overrides base_url with {:?}: that is the one checked and called",
                jobtrail_provider::wire::sanitize_url_text(&over)
            ));
        }
    }
    notes
}

/// `contract check --json`'s document.
fn print_doc(
    file: &str,
    protocol: Option<&str>,
    effective: Option<&toml::Table>,
    notes: &[String],
    timings: Option<&serde_json::Value>,
    problems: &[String],
) {
    let doc = serde_json::json!({
        "file": file,
        "protocol": protocol,
        "effective": effective,
        "notes": notes,
        "timings": timings,
        "problems": problems,
    });
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// What the contract's numbers mean for a worker: the longest call, the lease it needs, how many
/// such calls the create window holds, and the polling bounds.
fn timings(c: &Contract) -> serde_json::Value {
    let call = c.call_budget();
    let lease = call + LEASE_MARGIN;
    let fits = c.create_window.as_millis() / lease.as_millis().max(1);
    let p = &c.polling;
    serde_json::json!({
        "longest_call": format!("{} (connect {} + request {})", ms(call), ms(c.connect_timeout), ms(c.request_timeout)),
        "lease_for_one_call": format!("{} (the call + a {} margin)", ms(lease), ms(LEASE_MARGIN)),
        "create_window": format!("{}: holds {fits} call(s) with their lease margin (at least 1 is required)", ms(c.create_window)),
        "result_window": ms(c.result_window),
        "polling": format!("from {} ×{} up to {}, jitter ±{}%", ms(p.backoff.initial), p.backoff.factor, ms(p.backoff.cap), (p.backoff.jitter * 100.0).round()),
        "retry_after_bounds": format!("{} to {}", ms(p.retry_after.min), ms(p.retry_after.max)),
        "cancel_window": c.cancel.as_ref().map_or_else(|| "no cancel endpoint".to_owned(), |x| ms(x.window)),
    })
}
