//! What every subcommand shares: the database, the provider contracts, exit codes, time parsing.

use anyhow::Context;

use jobtrail_provider::Registry;
use jobtrail_store::{Store, StoreError};
use std::path::PathBuf;
use std::process::ExitCode;

/// The options every jobtrail command line shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// PostgreSQL URL (required by every command that reads or writes operations; `jobtrail demo`,
    /// `bench`, `dev-db` and `contract check` need none: demo and bench start a private one, or
    /// use this one only if it holds no operation). TLS: add `sslmode=require`, or
    /// `sslmode=verify-full&sslrootcert=/path/ca.pem`. As a flag, no password in it (the process
    /// list shows it): use DATABASE_URL, PGPASSWORD or a .pgpass file.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Most database connections per pool (a process opens one pool per login; a worker or an API
    /// server also one connection for notifications and, with --ops-listen, two for its probes;
    /// `audit verify --all` needs at least 4). 1 to 1000.
    #[arg(long, env = "JOBTRAIL_DB_POOL", global = true, default_value_t = 16)]
    pub db_pool: u32,
    /// Directory of provider contracts (*.toml). Default: ./providers, then /etc/jobtrail/providers.
    #[arg(long, env = "JOBTRAIL_PROVIDERS", global = true, value_parser = path_or_none())]
    pub providers: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The parser of a path flag with a variable: a variable set to nothing (`JOBTRAIL_PROVIDERS=`, a
/// chart value left blank) parses as an empty path, which the command takes as unset, as for every
/// other setting. (clap's own path parser refuses it, and every command with it.)
pub fn path_or_none() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser as _;
    clap::builder::OsStringValueParser::new().map(PathBuf::from)
}

/// A path flag's value, `None` when empty (see [`path_or_none`]).
pub fn given_path(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.filter(|p| !p.as_os_str().is_empty())
}

/// A reader that goes away (`jobtrail list | head -1`) ends the command as it ends any Unix tool,
/// by SIGPIPE, instead of with a panic, a backtrace and exit 101. Only a write to stdout is
/// concerned: the signal stays ignored otherwise, so a socket whose peer went away is an error
/// as before. Call first in `main`.
pub fn end_quietly_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let said = info.to_string();
        // The error's code, not its text (which follows the locale).
        if said.contains("failed printing to stdout")
            && said.contains(&format!("(os error {})", libc::EPIPE))
        {
            stdout_closed();
        }
        default(info);
    }));
}

/// The reader of stdout went away: end as a Unix tool does, by SIGPIPE (exit 141 where signals
/// cannot be raised). For writes to stdout that do not go through `print!` (which the panic hook
/// of [`end_quietly_when_stdout_closes`] covers). Nothing after this runs, `Drop`s included: call
/// it only where nothing is left to clean up.
pub fn stdout_closed() -> ! {
    // SAFETY: restoring a signal's default action and raising it; nothing else runs after this in
    // this process.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

/// Who a flag names as acting (an actor, a creator): checked like a decision's actor — printable,
/// one line, bounded — and refused as bad input naming the flag.
pub fn actor(flag: &str, value: &str) -> Result<String, Failure> {
    jobtrail_core::text::ACTOR
        .check(value)
        .map_err(|e| fail(exit::BAD_INPUT, format!("{flag} must name who acts: {e}")))
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
    /// The evidence disagrees with its chain.
    pub const TAMPERED: u8 = 8;
    /// `result` of an operation that has not finished (it runs, or is held for a person).
    pub const NOT_FINISHED: u8 = 9;
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
        StoreError::Submit(
            jobtrail_core::SubmitError::FingerprintConflict { .. }
            | jobtrail_core::SubmitError::TermsConflict { .. },
        ) => exit::CONFLICT,
        StoreError::Submit(_) | StoreError::BadUrl(_) => exit::BAD_INPUT,
        StoreError::Stale { .. }
        | StoreError::Illegal { .. }
        | StoreError::LeaseLost { .. }
        | StoreError::Moved { .. }
        | StoreError::Conflict(_) => exit::CONFLICT,
        StoreError::Tampered(_) => exit::TAMPERED,
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

/// Flags that take a database URL: one given a password on the command line is refused (exit 2),
/// since every user of the machine reads a process's arguments (`ps`, `/proc`) for as long as it
/// runs; the same URL in the environment (`DATABASE_URL`), or its password in `PGPASSWORD` or a
/// `.pgpass`, is taken.
pub fn refuse_passwords_in_arguments(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(), Failure> {
    const FLAGS: [&str; 2] = ["--database-url", "--operator-database-url"];
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    for (i, arg) in args.iter().enumerate() {
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) if FLAGS.contains(&f) => (f, Some(v)),
            _ if FLAGS.contains(&arg.as_str()) => {
                (arg.as_str(), args.get(i + 1).map(String::as_str))
            }
            _ => continue,
        };
        // In the login part, or as the driver's `password` parameter.
        if value
            .and_then(|v| url::Url::parse(v.trim()).ok())
            .is_some_and(|u| {
                u.password().is_some() || u.query_pairs().any(|(k, _)| k == "password")
            })
        {
            let env = if flag == "--database-url" {
                "DATABASE_URL"
            } else {
                "JOBTRAIL_OPERATOR_DATABASE_URL"
            };
            return Err(fail(
                exit::BAD_INPUT,
                format!(
                    "{flag} holds a password, which every user of this machine can read in the process list: give the URL in {env} instead, or its password in PGPASSWORD or a .pgpass file"
                ),
            ));
        }
    }
    Ok(())
}

/// The process exit for a command's result: its code, or the error on stderr and the error's code.
pub fn exit_with(result: CmdResult) -> ExitCode {
    result.unwrap_or_else(|f| {
        eprintln!("error: {:#}", f.error);
        ExitCode::from(f.code)
    })
}

/// Connect for any command but `migrate`: DATABASE_URL's database must already hold this binary's
/// schema (checked with one read; `jobtrail migrate` is the only command that changes it, so no role
/// but the owner needs DDL rights).
pub async fn store(common: &Common) -> Result<Store, Failure> {
    store_at(common.database_url.as_deref(), common.db_pool).await
}

/// [`store`] for a URL other than DATABASE_URL (the API's operator login).
pub async fn store_at(url: Option<&str>, pool: u32) -> Result<Store, Failure> {
    let store = connect(url, pool).await?;
    store.check_schema().await.map_err(|e| Failure {
        code: exit::UNAVAILABLE,
        // Connected, then lost or held up before one read: an outage, waited out at start.
        error: anyhow::Error::new(e.met_after_connecting()).context("checking the database schema"),
    })?;
    Ok(store)
}

/// `migrate`'s flags (the same in both binaries).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MigrateArgs {
    /// Migrate a database that holds another application's tables and no jobtrail schema yet
    /// (refused without it: the usual cause is DATABASE_URL naming the wrong database).
    #[arg(long, env = "JOBTRAIL_MIGRATE_BESIDE_OTHER_TABLES")]
    pub beside_other_tables: bool,
}

/// Say what `migrate` did, and where (never the password).
pub fn print_migrated(store: &Store, json: bool) {
    let database = store.database_shown();
    if json {
        println!(
            "{}",
            serde_json::json!({ "migrated": true, "database": database })
        );
    } else {
        println!("migrations applied: jobtrail's schema is current in {database}");
    }
}

/// Connect and apply every pending migration (`jobtrail migrate`, as the owner role). A database
/// with another application's tables and no jobtrail schema is refused unless `beside_other_tables`:
/// pointed at the wrong database, a tired operator would add jobtrail's schema and its roles beside
/// another application's tables (its other commands all say "run migrate" to a database with no
/// jobtrail schema, and migrations are never undone).
pub async fn store_migrated(common: &Common, beside_other_tables: bool) -> Result<Store, Failure> {
    let store = connect(common.database_url.as_deref(), common.db_pool).await?;
    let other = store.holds_other_tables().await.map_err(|e| Failure {
        code: exit::UNAVAILABLE,
        error: anyhow::Error::new(e.met_after_connecting())
            .context("looking at the database before migrating"),
    })?;
    if other && !beside_other_tables {
        return Err(fail(
            exit::BAD_INPUT,
            format!(
                "{} holds another application's tables and no jobtrail schema: nothing was migrated. Check DATABASE_URL names the database meant for jobtrail (an empty one: createdb); to add jobtrail's schema beside those tables all the same, run migrate again with --beside-other-tables",
                store.database_shown()
            ),
        ));
    }
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

/// What a command that needs the database says when DATABASE_URL is missing. The private cluster
/// is for trying jobtrail on one machine (`jobtrail dev-db`, `demo`, `bench`); a worker or a server
/// that silently started its own database would split a fleet across databases.
pub const NO_DATABASE: &str = "DATABASE_URL is not set: point it at the PostgreSQL jobtrail runs on (postgres://user@host/db?sslmode=verify-full&sslrootcert=ca.pem). To try jobtrail on this machine: export DATABASE_URL=$(jobtrail dev-db)";

async fn connect(url: Option<&str>, pool: u32) -> Result<Store, Failure> {
    let url = url_and_pool(url, pool)?;
    Store::connect_with(url, pool).await.map_err(connecting)
}

/// A pool for `url` that connects on first use (the probes of a process still waiting for its
/// database at start); a missing or bad URL is refused now all the same.
pub fn store_lazy(url: Option<&str>, pool: u32) -> Result<Store, Failure> {
    let url = url_and_pool(url, pool)?;
    Store::connect_lazy_with(url, pool).map_err(connecting)
}

/// Bad input is named before anything is looked for (a missing URL is exit 5).
fn url_and_pool(url: Option<&str>, pool: u32) -> Result<&str, Failure> {
    if !(1..=MAX_DB_POOL).contains(&pool) {
        return Err(fail(
            exit::BAD_INPUT,
            format!("--db-pool must be between 1 and {MAX_DB_POOL}, not {pool}"),
        ));
    }
    url.map(str::trim)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| fail(exit::UNAVAILABLE, NO_DATABASE))
}

fn connecting(e: StoreError) -> Failure {
    Failure {
        code: match e {
            StoreError::BadUrl(_) => exit::BAD_INPUT,
            _ => exit::UNAVAILABLE,
        },
        error: anyhow::Error::new(e).context("connecting to the database"),
    }
}

/// The most database connections one process may open (PostgreSQL's own default limit is 100).
pub const MAX_DB_POOL: u32 = 1000;

/// The providers directory: `--providers`, `$JOBTRAIL_PROVIDERS`, `./providers`, `/etc/jobtrail/providers`.
pub fn providers_dir(flag: &Option<PathBuf>) -> PathBuf {
    if let Some(p) = given_path(flag.clone()) {
        return p;
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

pub use jobtrail_core::when::{MAX_FLAG_DURATION, parse_duration, parse_time};

/// A duration flag within `[min, max]`, with a message that names the flag and the range.
pub fn parse_duration_within(
    flag: &str,
    s: &str,
    min: std::time::Duration,
    max: std::time::Duration,
) -> Result<std::time::Duration, Failure> {
    jobtrail_core::when::parse_duration_within(flag, s, min, max)
        .map_err(|e| fail(exit::BAD_INPUT, e))
}

pub fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
