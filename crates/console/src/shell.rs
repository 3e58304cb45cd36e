//! What every subcommand shares: the database, the provider contracts, exit codes, time parsing.

use anyhow::Context;
use chrono::{DateTime, Utc};
use jobtrail_provider::Registry;
use jobtrail_store::{Store, StoreError};
use std::path::PathBuf;
use std::process::ExitCode;

/// The options every jobtrail command line shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// PostgreSQL URL. Unset: jobtrail's private cluster, started on demand from the machine's PostgreSQL binaries.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory of provider contracts (*.toml). Default: ./providers, then /etc/jobtrail/providers.
    #[arg(long, env = "JOBTRAIL_PROVIDERS", global = true)]
    pub providers: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Documented exit codes (README "Exit codes").
pub mod exit {
    pub const OK: u8 = 0;
    /// The operation ended other than succeeded (wait), or verification found a problem.
    pub const NOT_SUCCEEDED: u8 = 1;
    /// Bad input or usage: nothing was written.
    pub const BAD_INPUT: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    /// A conflict: another fingerprint under this id, a stale view, a move the state machine refuses.
    pub const CONFLICT: u8 = 4;
    /// The database or the provider configuration is unavailable.
    pub const UNAVAILABLE: u8 = 5;
    /// `wait` timed out.
    pub const TIMEOUT: u8 = 6;
    /// The operation is held for a person (escalation queue).
    pub const NEEDS_HUMAN: u8 = 7;
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error: anyhow::Error = e.into();
        let code = error
            .chain()
            .find_map(|c| c.downcast_ref::<StoreError>())
            .map(code_for)
            .unwrap_or(exit::UNAVAILABLE);
        Self { code, error }
    }
}

pub fn code_for(e: &StoreError) -> u8 {
    match e {
        StoreError::NotFound(_) => exit::NOT_FOUND,
        StoreError::Submit(jobtrail_core::SubmitError::FingerprintConflict { .. }) => {
            exit::CONFLICT
        }
        StoreError::Submit(_) => exit::BAD_INPUT,
        StoreError::Stale { .. } | StoreError::Illegal { .. } | StoreError::LeaseLost { .. } => {
            exit::CONFLICT
        }
        _ => exit::UNAVAILABLE,
    }
}

pub fn fail(code: u8, msg: impl std::fmt::Display) -> Failure {
    Failure {
        code,
        error: anyhow::anyhow!("{msg}"),
    }
}

pub type CmdResult = Result<ExitCode, Failure>;

/// The process exit for a command's result: its code, or the error on stderr and the error's code.
pub fn exit_with(result: CmdResult) -> ExitCode {
    result.unwrap_or_else(|f| {
        eprintln!("error: {:#}", f.error);
        ExitCode::from(f.code)
    })
}

/// Connect (DATABASE_URL or the private cluster) and apply migrations.
pub async fn store(database_url: &Option<String>) -> Result<Store, Failure> {
    let url = match database_url {
        Some(u) => u.clone(),
        None => jobtrail_store::cluster::database_url()
            .await
            .map_err(|e| fail(exit::UNAVAILABLE, e))?,
    };
    let store = Store::connect(&url)
        .await
        .context("connecting to the database")
        .map_err(|e| Failure {
            code: exit::UNAVAILABLE,
            error: e,
        })?;
    store
        .migrate()
        .await
        .context("applying migrations")
        .map_err(|e| Failure {
            code: exit::UNAVAILABLE,
            error: e,
        })?;
    Ok(store)
}

/// The providers directory: `--providers`, `$JOBTRAIL_PROVIDERS`, `./providers`, `/etc/jobtrail/providers`.
pub fn providers_dir(flag: &Option<PathBuf>) -> PathBuf {
    if let Some(p) = flag {
        return p.clone();
    }
    for candidate in ["providers", "/etc/jobtrail/providers"] {
        let p = PathBuf::from(candidate);
        if p.is_dir() {
            return p;
        }
    }
    PathBuf::from("providers")
}

pub fn registry(flag: &Option<PathBuf>) -> Result<Registry, Failure> {
    let dir = providers_dir(flag);
    Registry::load_dir(&dir).map_err(|e| {
        fail(
            exit::UNAVAILABLE,
            format!("loading provider contracts from {}: {e}", dir.display()),
        )
    })
}

/// An absolute RFC 3339 time, or a relative one: `+90s`, `+5m`, `+2h`, `+1d`.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Some(rel) = s.strip_prefix('+') {
        return parse_duration(rel)
            .map(|d| Utc::now() + chrono::Duration::from_std(d).unwrap_or_default());
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!(
                "{s:?} is not RFC 3339 (2026-01-31T12:00:00Z) or relative (+90s, +5m, +2h): {e}"
            )
        })
}

/// `90s`, `5m`, `2h`, `1d`, `250ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s, 5m, 2h"))?;
    let secs = match unit {
        "ms" => return Ok(std::time::Duration::from_millis(n)),
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m, h, d)")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

pub fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times_parse() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert_eq!(parse_duration("7").unwrap().as_secs(), 7);
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_time("+1h").unwrap() > Utc::now());
        assert!(parse_time("2026-01-31T12:00:00Z").is_ok());
        assert!(parse_time("tomorrow").is_err());
    }
}
