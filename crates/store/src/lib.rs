//! # jobtrail-store
//!
//! The PostgreSQL side of jobtrail, and the only crate that holds SQL (in `src/sql/*.sql`, one file
//! per query, named entity_verb_guard).
//!
//! The model: an operation row is written (with the first link of its hash-chained history) before
//! anything reaches a provider. Workers claim due rows in batches with `FOR UPDATE SKIP LOCKED`, in a
//! transaction that commits at once and hands out a lease (owner, expiry, a new fencing epoch). Every
//! later write by that worker is one short transaction that re-locks the row *by id and epoch*: if the
//! lease expired or was taken over, the write finds nothing and returns [`StoreError::LeaseLost`]. No
//! transaction is ever held open across an HTTP call.
//!
//! State changes are decided by `jobtrail_core::transition` against the state locked in the same
//! transaction, so a cancel request or a person's decision that landed meanwhile is never overwritten.
//! History, provider calls and operations refuse DELETE (and history and calls refuse UPDATE) in the
//! database itself.

mod audit;
mod bench;
pub use bench::TableUpdates;
pub mod cluster;
pub mod error;
mod front;
mod queue;
pub mod record;
pub mod testing;
mod write;

use chrono::{DateTime, Utc};
use jobtrail_core::chain::{ChainEntry, GENESIS, storable};
use jobtrail_core::{
    CancelRequest, Entropy, Event, Intent, OperationId, ProviderTerms, State, Submission,
    SubmitError, SubmitLimits,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

pub use audit::{
    Anchor, AnchorNotFound, ChainedResult, MAX_BREAKS_LISTED, Unanchored, VerifyReport,
};
pub use error::StoreError;
pub use front::{
    Delivery, DeliveryOutcome, LIST_SCAN_MOST, ListFilter, ListPage, NewToken, STATE_CHANNEL,
    StateListener, TokenRecord,
};
pub use queue::{LeaseHolder, ProviderDue, ProviderPause};
pub use record::{CallKind, CallRecord, HistoryRecord, OperationRecord, StoredCall};
pub use write::{
    Applied, Counters, FailureCount, Observation, ResultBytes, SendMark, Step, WEBHOOK_READ_FLOOR,
};

use record::{ClaimedRow, HistoryRow, LockedRow, OperationRow};

/// The migrations, embedded in every binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// How long a connection given back to the pool may take to answer its check before it is closed.
const RELEASE_PING_WITHIN: Duration = Duration::from_secs(2);

/// How long a migration that alters a table waits for each lock before it gives way and tries
/// again (see `Store::run_pending`): every statement on the table queues behind its request.
pub const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(5);

/// How often it tries (a minute in all) before `migrate` fails, applying nothing of it.
pub const MIGRATION_LOCK_TRIES: u32 = 10;

/// Wake-ups for workers: new submissions, cancel requests and decisions.
pub struct WorkListener(sqlx::postgres::PgListener);

impl WorkListener {
    /// Wait for the next notification. `None` when the connection broke (listen again later);
    /// otherwise when it was sent by the database's clock, if the payload says.
    pub async fn wait(&mut self) -> Option<Option<DateTime<Utc>>> {
        match self.0.try_recv().await {
            Ok(Some(n)) => Some(
                n.payload()
                    .rsplit_once('@')
                    .and_then(|(_, ms)| ms.parse::<i64>().ok())
                    .and_then(DateTime::from_timestamp_millis),
            ),
            _ => None,
        }
    }
}

/// A worker's proof of ownership of one operation. Every write by the worker repeats it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub operation_id: OperationId,
    pub owner: String,
    pub epoch: i64,
}

/// A claimed operation: the lease, the row as it was at the claim, and the database clock of the
/// claim (the worker's one decision clock starts from it).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub lease: Lease,
    /// Boxed: it moves from the claim into the task that drives it without a copy, and a task
    /// waiting on its provider holds the record once (a record is about 1 KiB inline).
    pub operation: Box<OperationRecord>,
    pub db_now: DateTime<Utc>,
    /// How long after it came due the claim took it (notification and scan lag, or a full fleet).
    pub late: Duration,
    /// The row still named another owner whose lease had run out: a takeover.
    pub taken_over: bool,
}

/// One provider's part of a worker's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimShare {
    pub provider: String,
    /// Rows of this provider that come before any provider's extra rows (its fair share, less what
    /// this worker already drives for it).
    pub fair: i32,
    /// The most rows of this provider this claim may take.
    pub cap: i32,
    /// The most steps of this provider in flight across the fleet (contract
    /// `limits.fleet_max_in_flight`), counted against leases held right now.
    pub fleet_cap: Option<i32>,
    /// Free slots kept for this provider's next due work (its reserve, less what it drives now):
    /// no provider's extra rows take them, however many providers borrow at once.
    pub reserve: i32,
}

/// How a database's schema compares with the one this binary was built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaState {
    Current,
    /// Migrations this binary carries are missing: run `jobtrail migrate`.
    Behind(String),
    /// The database has migrations this binary does not know (a newer release migrated it), and
    /// one of them breaks what this binary does: refused.
    Ahead(String),
    /// The database has newer migrations this binary does not know, none of which breaks it (the
    /// database's `oldest_reader` is no newer than this binary): it may start, with a warning.
    AheadReadable(String),
    /// A migration was changed after it was applied.
    Edited(String),
}

/// What submit did.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub operation: OperationRecord,
    /// False when the operation already existed with the same fingerprint (an idempotent re-submit).
    pub created: bool,
}

/// The operation store.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

/// The database URL parameters the driver understands (its spellings). Any other is refused: the
/// driver would only log it and go on, so `?ssl_mode=verify-full` connected without verifying
/// anything, and a misspelt `?pasword=` put its value in the log.
const URL_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Refuse a URL that is not PostgreSQL's, or names a parameter the driver does not know, before
/// anything is sent (the driver reads any scheme as its own: `mysql://host/db` logged in to the
/// PostgreSQL at `host`).
fn refuse_bad_url(url: &str) -> Result<(), StoreError> {
    let Ok(parsed) = url::Url::parse(url) else {
        // The driver's own parse says what is wrong with it.
        return Ok(());
    };
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(StoreError::BadUrl(format!(
            "it must start with postgres:// or postgresql://, not {}:",
            // Before the first `:`, which a URL's scheme cannot hold: never a password.
            parsed.scheme()
        )));
    }
    for (key, _) in parsed.query_pairs() {
        let known =
            URL_PARAMETERS.contains(&&*key) || (key.starts_with("options[") && key.ends_with(']'));
        if !known {
            // A "name" with a colon, or a long one, may be a value typed without its `=`
            // (`?password:…`): not shown.
            let shown = if key.contains(':') || key.len() > 40 {
                "(not shown: it may be a value)".to_owned()
            } else {
                format!("{key:?}")
            };
            return Err(StoreError::BadUrl(format!(
                "unknown parameter {shown} (known: {})",
                URL_PARAMETERS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Why a connection per `opts` would not be verified although it may cross a network (a host that
/// is not this machine, with an `sslmode` that encrypts without checking whom it talks to, or
/// falls back to plain TCP); `None` when verified, local, or plain TCP said on purpose
/// (`sslmode=disable`).
fn unverified_tls(opts: &PgConnectOptions) -> Option<String> {
    use sqlx::postgres::PgSslMode;
    let host = opts.get_host();
    let local = opts.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    let mode = match opts.get_ssl_mode() {
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer (the default)",
        PgSslMode::Require => "require",
        // The driver trusts the bundled public roots beside `sslrootcert`, and verify-ca checks no
        // name: any host with a publicly trusted certificate for any site passes.
        PgSslMode::VerifyCa => {
            return (!local).then(|| {
                format!(
                    "the database connection to {host} checks the certificate's chain but not \
                     its name (sslmode=verify-ca), and the public web roots are trusted beside \
                     sslrootcert: whoever holds any publicly trusted certificate can sit on the \
                     path; set sslmode=verify-full"
                )
            });
        }
        PgSslMode::Disable | PgSslMode::VerifyFull => return None,
    };
    (!local).then(|| {
        format!(
            "the database connection to {host} is not verified (sslmode={mode}): whoever sits on \
             the path can read and change what jobtrail records; set sslmode=verify-full (with \
             sslrootcert= your provider's CA), or sslmode=disable where plain TCP is meant"
        )
    })
}

/// How long connecting keeps trying before it gives up (the pool retries a refused or failed
/// connection with a backoff meanwhile: a database restarting under a starting worker is waited for).
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Where `opts` connects, as an operator would name it (never the password).
fn server_of(opts: &PgConnectOptions) -> String {
    match opts.get_socket() {
        Some(dir) => format!("the socket in {}", dir.display()),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    }
}

/// Whether an I/O error while connecting says no server is there now (refused, reset, no route,
/// a name that does not resolve yet, no socket file): an outage that may end. Not a certificate
/// refused, a key or CA file missing or unreadable, permission denied: rustls reports those as
/// I/O errors too, and waiting would not mend them.
fn unreachable(e: &std::io::Error, opts: &PgConnectOptions) -> bool {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | BrokenPipe
        | TimedOut | UnexpectedEof | HostUnreachable | NetworkUnreachable | AddrNotAvailable => {
            true
        }
        // A stopped local server leaves no socket file; over TCP a missing file is a TLS one.
        NotFound => opts.get_socket().is_some() || opts.get_host().starts_with('/'),
        // getaddrinfo's failures have no kind of their own on stable Rust.
        _ => e
            .to_string()
            .starts_with("failed to lookup address information"),
    }
}

/// Whether a pooler's refusal of a connection says its server is away for now. PgBouncer answers
/// `08P01` alike for that and for what waiting never mends (`No such database`, `No such user`,
/// `Unsupported startup parameter`, `SSL required`, a login it refused): only its words tell them
/// apart, so only the words of an outage are waited for, and not even those when the cause they
/// carry is a refused login (`server login has been failing, cached error: password
/// authentication failed`).
fn pooler_away(code: &str, message: &str) -> bool {
    // PgBouncer's words, then other poolers' (Odyssey, pgcat, Supavisor) for the same.
    const AWAY: [&str; 10] = [
        "server login has been failing",
        "cannot connect to server",
        "server conn crashed",
        "server dns lookup failed",
        "no more connections allowed",
        "query_wait_timeout",
        "failed to connect",
        "could not connect",
        "connection refused",
        "shutting down",
    ];
    let m = message.to_ascii_lowercase();
    code.starts_with("08") && AWAY.iter().any(|w| m.contains(w)) && !names_what_no_wait_mends(&m)
}

/// Whether a refusal's words (a pooler's cached error, carried whole) name what waiting never
/// mends: a login, a certificate, a database or a rule.
fn names_what_no_wait_mends(message: &str) -> bool {
    const NEVER: [&str; 9] = [
        "auth",
        "password",
        "does not exist",
        "pg_hba",
        "permission denied",
        "not permitted",
        "ssl",
        "tls",
        "certificate",
    ];
    let m = message.to_ascii_lowercase();
    NEVER.iter().any(|w| m.contains(w))
}

impl StoreError {
    /// This error, met on the first read after connecting, as a process at start should take it:
    /// a connection lost or held up then (a restart, a failover, a lock a migration holds) is an
    /// outage like a refused connection ([`StoreError::Unreachable`]), unless its words name what
    /// no wait mends (a pooler's second login refused, a certificate).
    pub fn met_after_connecting(self) -> Self {
        match self {
            StoreError::Unavailable(why) if !names_what_no_wait_mends(&why) => {
                StoreError::Unreachable(why)
            }
            e => e,
        }
    }
}

/// Why a connection per `opts` fails: the pool's retries end in "timed out" whatever the cause, so
/// one more attempt of its own, bounded, names it (refused, no such host, TLS, ...).
async fn why_no_connection(opts: &PgConnectOptions) -> String {
    let attempt = <sqlx::PgConnection as sqlx::Connection>::connect_with(opts);
    match tokio::time::timeout(Duration::from_secs(5), attempt).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            "it answers now: try again".to_owned()
        }
        Err(_) => "an attempt to connect did not finish within 5 s".to_owned(),
    }
}

impl Store {
    /// Connect with sane pool settings (bounded waits everywhere).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, 16).await
    }

    pub async fn connect_with(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let (pool, opts) = Self::pool_options(url, max_connections)?;
        match pool.connect_with(opts.clone()).await {
            Ok(pool) => Ok(Self { pool }),
            // No server there accepted a connection: an outage, which may end (a worker or a
            // server starting while it lasts waits for it; see `StoreError::Unreachable`). The
            // pool itself retries only a refused connection, until its bound.
            Err(sqlx::Error::PoolTimedOut) => Err(StoreError::Unreachable(format!(
                "no connection to {} within {} s: {}",
                server_of(&opts),
                CONNECT_WITHIN.as_secs(),
                why_no_connection(&opts).await
            ))),
            Err(sqlx::Error::Io(e)) if unreachable(&e, &opts) => Err(StoreError::Unreachable(
                format!("no connection to {}: {e}", server_of(&opts)),
            )),
            // A server starting up or shutting down (57P*), out of connections (53300), or a
            // pooler in front of a server that is away.
            Err(sqlx::Error::Database(db))
                if db.code().is_some_and(|c| {
                    c.starts_with("57P") || c == "53300" || pooler_away(&c, db.message())
                }) =>
            {
                Err(StoreError::Unreachable(format!(
                    "{} does not take connections now: {}",
                    server_of(&opts),
                    db.message()
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A pool that connects on first use, not now: for the probes of a process that is still
    /// waiting for its database at start (`/readyz` then says why the database does not answer).
    /// A bad URL is still refused here.
    pub fn connect_lazy_with(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let (pool, opts) = Self::pool_options(url, max_connections)?;
        Ok(Self {
            pool: pool.connect_lazy_with(opts),
        })
    }

    /// The pool's settings for `url`: bounded waits everywhere, and the session set-up every
    /// connection gets.
    fn pool_options(
        url: &str,
        max_connections: u32,
    ) -> Result<(PgPoolOptions, PgConnectOptions), StoreError> {
        refuse_bad_url(url)?;
        let mut opts =
            PgConnectOptions::from_str(url).map_err(|e| StoreError::BadUrl(e.to_string()))?;
        // Sessions show up as "jobtrail" in pg_stat_activity unless the URL's application_name or
        // the standard PGAPPNAME says otherwise (an operator naming each worker's sessions).
        if let Some(warning) = unverified_tls(&opts) {
            // Once per server per process: a server connects a pool per login and one for its
            // probes, and the operator login may name another server.
            static SAID: std::sync::Mutex<BTreeSet<(String, u16)>> =
                std::sync::Mutex::new(BTreeSet::new());
            let server = (opts.get_host().to_owned(), opts.get_port());
            if SAID
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(server)
            {
                tracing::warn!("{warning}");
            }
        }
        if opts.get_application_name().is_none_or(str::is_empty) {
            opts = opts.application_name("jobtrail");
        }
        // sqlx sends `extra_float_digits` at startup, which PgBouncer refuses ("unsupported
        // startup parameter") unless told to ignore it. Rows are read in binary and PostgreSQL
        // 12+ prints floats exactly by default: nothing here needs it.
        opts = opts.extra_float_digits(None);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(CONNECT_WITHIN)
            .idle_timeout(Duration::from_secs(60))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query(include_str!("sql/session_lock_timeout_default.sql"))
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            // A connection given back while its answer was lost (a caller gave up on a server
            // gone silent) fails this bounded ping and is closed at once; sqlx's own check on
            // release waits without a bound, and would hold the pool slot for as long as the
            // silent socket stays open (for ever behind a proxy that keeps it so).
            .after_release(|conn, _| {
                Box::pin(async move {
                    match tokio::time::timeout(RELEASE_PING_WITHIN, sqlx::Connection::ping(conn))
                        .await
                    {
                        Ok(Ok(())) => Ok(true),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(sqlx::Error::PoolTimedOut),
                    }
                })
            });
        Ok((pool, opts))
    }

    /// Apply pending migrations: the only thing that changes the schema (`jobtrail migrate`, run
    /// as the owner role once per release). Concurrent runs serialise on an exclusive lock of
    /// `jobtrail_migration_lock`, a table only its owner may lock — unlike a session advisory lock,
    /// which any role (an auditor) could take to stall every migration. The wait is bounded.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_from(&MIGRATOR).await
    }

    /// [`Store::migrate`] with another set of migrations (a test's: this binary's and one more).
    #[doc(hidden)]
    pub async fn migrate_from(&self, migrator: &sqlx::migrate::Migrator) -> Result<(), StoreError> {
        // A connection of its own (not the pool's: a pool of one must still run the migrations).
        let mut guard: sqlx::PgConnection =
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&self.pool.connect_options())
                .await?;
        for attempt in 0..3 {
            // Two first-ever runs may race to create the lock table; the loser sees a duplicate.
            match sqlx::raw_sql(include_str!("sql/migration_lock_create.sql"))
                .execute(&mut guard)
                .await
            {
                Ok(_) => break,
                Err(sqlx::Error::Database(db))
                    if attempt < 2
                        && matches!(db.code().as_deref(), Some("23505" | "42P07" | "42710")) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Another run holds the lock: try again, each time in a new transaction, for up to 60 s
        // (never waiting inside the statement: see migration_lock_take.sql).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let lock = loop {
            let mut lock = sqlx::Connection::begin(&mut guard).await?;
            match sqlx::raw_sql(include_str!("sql/migration_lock_take.sql"))
                .execute(&mut *lock)
                .await
            {
                Ok(_) => break lock,
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                    lock.rollback().await?;
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Unavailable(
                            "another migration holds jobtrail_migration_lock for over 60 s".into(),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        // On a connection of its own, with no bound on its lock waits (see the SQL), closed after:
        // both a concurrent build and the drop of an interrupted one wait for the transactions
        // before them.
        let mut conn = self.pool.acquire().await?.detach();
        sqlx::query(include_str!("sql/session_lock_timeout_none.sql"))
            .execute(&mut conn)
            .await?;
        Self::drop_interrupted_index_builds(&mut conn, migrator).await?;
        let applied = Self::run_pending(&mut conn, migrator).await;
        let _ = sqlx::Connection::close(conn).await;
        lock.commit().await?;
        applied?;
        let _ = sqlx::Connection::close(guard).await;
        Ok(())
    }

    /// Apply the pending migrations one at a time, in order. One that runs in a transaction (it
    /// alters a table) waits at most [`MIGRATION_LOCK_WAIT`] for each lock and is tried again, up
    /// to [`MIGRATION_LOCK_TRIES`] times: its queued request for an exclusive lock would stop every
    /// read and write of the table behind it for as long as something else holds the table (a
    /// `pg_dump`, an `audit verify --all`, an anti-wraparound vacuum), and a worker's steps would
    /// fail meanwhile. A concurrent index build (no transaction) waits as long as it needs: it
    /// waits for the transactions before it, and blocks no writer while it does.
    async fn run_pending(
        conn: &mut sqlx::PgConnection,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), StoreError> {
        let applied = Self::applied_versions(conn).await?;
        let unlocked = sqlx::migrate::Migrator {
            migrations: migrator.migrations.clone(),
            locking: false,
            ..sqlx::migrate::Migrator::DEFAULT
        };
        let pending = migrator
            .iter()
            .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version));
        let mut applied_any = false;
        for m in pending {
            applied_any = true;
            let bound = if m.no_tx {
                include_str!("sql/session_lock_timeout_none.sql")
            } else {
                include_str!("sql/session_lock_timeout_migration.sql")
            };
            for attempt in 1.. {
                sqlx::query(bound).execute(&mut *conn).await?;
                // `run_direct`, as `run_to` is: the latter's `Acquire` bound makes the future
                // not `Send`.
                match unlocked
                    .run_direct(Some(m.version), &mut *conn, false)
                    .await
                {
                    Ok(()) => break,
                    Err(
                        sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(db))
                        | sqlx::migrate::MigrateError::ExecuteMigration(sqlx::Error::Database(db), _),
                    ) if db.code().as_deref() == Some("55P03") => {
                        if attempt >= MIGRATION_LOCK_TRIES {
                            return Err(StoreError::Unavailable(format!(
                                "migration {} ({}) could not take its locks in {attempt} tries of {} s: another session holds the table (see pg_stat_activity and pg_locks for who); nothing of it was applied, run migrate again",
                                m.version,
                                m.description,
                                MIGRATION_LOCK_WAIT.as_secs()
                            )));
                        }
                        tracing::warn!(
                            migration = m.version,
                            attempt,
                            "another session holds a table this migration alters; giving way to the writers queued behind it and trying again"
                        );
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if !applied_any {
            // Nothing to apply: still check what is applied against what this binary carries (a
            // migration it does not know, one edited, one left dirty), as a whole run would: an
            // older release's migration Job must fail, not pass and leave its pods to refuse.
            unlocked.run_direct(None, &mut *conn, false).await?;
        }
        sqlx::query(include_str!("sql/session_lock_timeout_none.sql"))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// The versions applied so far (none on a database never migrated).
    async fn applied_versions(conn: &mut sqlx::PgConnection) -> Result<Vec<i64>, StoreError> {
        match sqlx::query_as::<_, (i64, Vec<u8>)>(include_str!("sql/schema_versions.sql"))
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => Ok(rows.into_iter().map(|(v, _)| v).collect()),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
                Ok(Vec::new())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Drop what an interrupted run left of an index a pending migration builds `CONCURRENTLY`:
    /// PostgreSQL keeps such a build as an INVALID index, and the migration, run again, fails on
    /// its name ("already exists") until a person drops it. Called under the migration lock, so no
    /// other run is building it; only names a pending migration creates are touched.
    async fn drop_interrupted_index_builds(
        conn: &mut sqlx::PgConnection,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), StoreError> {
        let applied = Self::applied_versions(conn).await?;
        let names: Vec<String> = migrator
            .iter()
            .filter(|m| m.no_tx && !applied.contains(&m.version))
            .flat_map(|m| concurrent_index_names(m.sql.as_str()))
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let invalid: Vec<(String,)> =
            sqlx::query_as(include_str!("sql/interrupted_index_builds.sql"))
                .bind(&names)
                .fetch_all(&mut *conn)
                .await?;
        for (name,) in invalid {
            tracing::warn!(
                index = %name,
                "an earlier migration's build of this index was interrupted and left it INVALID: dropping it to build it again"
            );
            // The name is one a migration file of this binary spells, quoted as an identifier.
            let drop = format!(
                "DROP INDEX CONCURRENTLY IF EXISTS \"{}\"",
                name.replace('"', "\"\"")
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Check that the database holds exactly the schema this binary was built for (one read). Every
    /// command but `migrate` runs this instead of migrating: behind means "run `jobtrail migrate`",
    /// ahead means "this binary is older than the database", either way it refuses to run.
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        match self.schema_state().await? {
            SchemaState::Current => Ok(()),
            SchemaState::AheadReadable(m) => {
                tracing::warn!("{m}");
                Ok(())
            }
            SchemaState::Behind(m) | SchemaState::Ahead(m) | SchemaState::Edited(m) => {
                Err(StoreError::Schema(m))
            }
        }
    }

    /// How the database's schema compares with this binary's (one read).
    pub async fn schema_state(&self) -> Result<SchemaState, StoreError> {
        let applied: Vec<(i64, Vec<u8>)> =
            match sqlx::query_as(include_str!("sql/schema_versions.sql"))
                .fetch_all(&self.pool)
                .await
            {
                Ok(rows) => rows,
                // No migrations table at all: an empty database.
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
                    Vec::new()
                }
                Err(e) => return Err(e.into()),
            };
        let known: Vec<(i64, &[u8])> = MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| (m.version, m.checksum.as_ref()))
            .collect();
        let newest_known = known.last().map(|(v, _)| *v).unwrap_or(0);
        let newest_applied = applied.last().map(|(v, _)| *v).unwrap_or(0);
        if let Some((v, _)) = applied
            .iter()
            .find(|(v, _)| !known.iter().any(|(k, _)| k == v))
        {
            // Only newer migrations beyond every one this binary carries, all of them applied as
            // this binary has them, and none that breaks it: an old pod of a rolling upgrade.
            let only_newer = applied
                .iter()
                .all(|(a, _)| *a > newest_known || known.iter().any(|(k, _)| k == a));
            let all_known_as_carried = known.iter().all(|(k, ks)| {
                applied
                    .iter()
                    .any(|(a, sum)| a == k && sum.as_slice() == *ks)
            });
            if only_newer && all_known_as_carried {
                let oldest_reader: Option<i64> =
                    sqlx::query_scalar(include_str!("sql/schema_oldest_reader.sql"))
                        .fetch_optional(&self.pool)
                        .await
                        .ok()
                        .flatten();
                if oldest_reader.is_some_and(|o| o <= newest_known) {
                    return Ok(SchemaState::AheadReadable(format!(
                        "the database has migration {newest_applied}, newer than this jobtrail (it knows up to {newest_known}), whose changes this binary can still run with: a newer release migrated it; replace this binary with that release"
                    )));
                }
            }
            return Ok(SchemaState::Ahead(format!(
                "the database has migration {v}, which this binary does not know (it knows up to {newest_known}): the database is newer than this jobtrail; upgrade the binary"
            )));
        }
        if let Some((v, _)) = applied
            .iter()
            .find(|(v, sum)| known.iter().any(|(k, ks)| k == v && *ks != sum.as_slice()))
        {
            return Ok(SchemaState::Edited(format!(
                "migration {v} in the database differs from the one this binary carries (edited after it was applied)"
            )));
        }
        if let Some((v, _)) = known
            .iter()
            .find(|(k, _)| !applied.iter().any(|(v, _)| v == k))
        {
            return Ok(SchemaState::Behind(format!(
                "the database schema is behind this binary (applied up to {newest_applied}, missing {v}): run `jobtrail migrate` as the database owner"
            )));
        }
        Ok(SchemaState::Current)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Wake every worker listening for work (`what` says why): operations were given back due at
    /// once (a worker stopping), which the others would otherwise find only at their next look.
    pub async fn wake_workers(&self, what: &str) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind(what)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A listener on this database's work channel (its name is a secret only jobtrail's writing
    /// roles can read). Notifications are hints; the due-time scan is the truth.
    pub async fn listen(&self) -> Result<WorkListener, StoreError> {
        let (channel,): (String,) = sqlx::query_as(include_str!("sql/settings_work_channel.sql"))
            .fetch_one(&self.pool)
            .await?;
        let mut l = self.listener().await?;
        l.listen(&channel).await?;
        Ok(WorkListener(l))
    }

    /// A listener on a connection of its own, outside the pool: sqlx's listener would hold one of
    /// the pool's connections for as long as it lives, and a pool of one (`--db-pool 1`) would
    /// then have none left for the claims and steps (or, in the API, the requests) it exists for.
    pub(crate) async fn listener(&self) -> Result<sqlx::postgres::PgListener, StoreError> {
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CONNECT_WITHIN)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with((*self.pool.connect_options()).clone());
        Ok(sqlx::postgres::PgListener::connect_with(&own).await?)
    }

    // ----------------------------------------------------------------------------------------------
    // Submit
    // ----------------------------------------------------------------------------------------------

    /// Validate untrusted input against the provider catalogue and submit it. Randomness for the
    /// token (128 bits from the OS CSPRNG), the trace id and the operation id is drawn here. Bad input
    /// is refused before anything is written.
    pub async fn submit_new(
        &self,
        submission: &Submission,
        providers: &BTreeMap<String, ProviderTerms>,
        limits: SubmitLimits,
    ) -> Result<Submitted, StoreError> {
        let terms = providers.get(submission.provider.trim()).ok_or_else(|| {
            SubmitError::UnknownProvider {
                name: jobtrail_core::ids::shown(&submission.provider),
                known: providers.keys().cloned().collect::<Vec<_>>().join(", "),
            }
        })?;
        // Deadlines come from the database's clock, the one every later decision uses.
        let mut tx = self.begin_write().await?;
        let (now,): (DateTime<Utc>,) = sqlx::query_as(include_str!("sql/db_now.sql"))
            .fetch_one(&mut *tx)
            .await?;
        let intent = match submission.validate(terms, limits, now, draw_entropy()?) {
            Ok(intent) => intent,
            Err(refused) => {
                as_first_submitted(&mut *tx, submission, terms, limits, refused).await?
            }
        };
        self.submit_in(tx, &intent, limits.max_open_per_caller)
            .await
    }

    /// Submit many operations in one transaction (an agent fanning out): all are written, or none.
    /// Each is validated as [`Store::submit_new`] validates one; an item whose id already holds the
    /// same request is returned as it is (`created: false`), one whose id holds another request
    /// refuses the whole batch. One notification wakes the workers. `Err((Some(index), error))` names
    /// the item that refused it; `Err((None, error))` is the batch as a whole (over the caller's
    /// cap, the database away).
    pub async fn submit_new_batch(
        &self,
        submissions: &[Submission],
        providers: &BTreeMap<String, ProviderTerms>,
        limits: SubmitLimits,
    ) -> Result<Vec<Submitted>, (Option<usize>, StoreError)> {
        let whole = |e: StoreError| (None, e);
        let mut tx = self.begin_write().await.map_err(whole)?;
        let (now,): (DateTime<Utc>,) = sqlx::query_as(include_str!("sql/db_now.sql"))
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| whole(e.into()))?;
        // Every item is validated before any is written or looked up: which item refuses a batch
        // must not depend on what other callers' ids exist.
        let mut intents = Vec::with_capacity(submissions.len());
        for (i, submission) in submissions.iter().enumerate() {
            let at = |e: StoreError| (item_or_whole(i, &e), e);
            let terms = providers.get(submission.provider.trim()).ok_or_else(|| {
                at(SubmitError::UnknownProvider {
                    name: jobtrail_core::ids::shown(&submission.provider),
                    known: providers.keys().cloned().collect::<Vec<_>>().join(", "),
                }
                .into())
            })?;
            let intent = match submission.validate(terms, limits, now, draw_entropy().map_err(at)?)
            {
                Ok(intent) => intent,
                Err(refused) => as_first_submitted(&mut *tx, submission, terms, limits, refused)
                    .await
                    .map_err(at)?,
            };
            intents.push(intent);
        }
        let mut written = Vec::with_capacity(submissions.len());
        for (i, (submission, intent)) in submissions.iter().zip(&intents).enumerate() {
            let at = |e: StoreError| (item_or_whole(i, &e), e);
            let superseded = match intent.supersedes {
                Some(old) => lock_superseded(&mut tx, old, intent.operation_id)
                    .await
                    .map_err(at)?,
                None => None,
            };
            let created = insert_intent(&mut tx, intent).await.map_err(at)?;
            if let (true, Some(old)) = (created, superseded) {
                link_superseded(&mut tx, old, intent).await.map_err(at)?;
            }
            if !created {
                let existing: OperationRecord = lock(&mut tx, intent.operation_id)
                    .await
                    .map_err(at)?
                    .row
                    .try_into()
                    .map_err(at)?;
                // Another caller's id is "not found", and refuses the batch like any bad item.
                if existing.caller != submission.caller {
                    return Err(at(StoreError::NotFound(intent.operation_id)));
                }
                if let Some(e) = intent.conflict_with(&existing) {
                    return Err(at(e.into()));
                }
            }
            written.push((intent.operation_id, created));
        }
        // Counted once the batch is written (all of it, or none, is taken); each caller once. A
        // batch that opens nothing (every item already there) is answered as ever.
        if let Some(cap) = limits
            .max_open_per_caller
            .filter(|_| written.iter().any(|(_, created)| *created))
        {
            let mut callers: Vec<&str> = submissions.iter().map(|s| s.caller.as_str()).collect();
            callers.sort_unstable();
            callers.dedup();
            for caller in callers {
                within_open_cap(&mut tx, caller, cap).await.map_err(whole)?;
            }
        }
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind("batch")
            .execute(&mut *tx)
            .await
            .map_err(|e| whole(e.into()))?;
        // Read before the commit, as a single submit does: once the batch is written, its answer
        // cannot fail (an agent told "unavailable" would send it again, and items without an id
        // would then start their jobs twice).
        let ids: Vec<uuid::Uuid> = written.iter().map(|(id, _)| id.as_uuid()).collect();
        let rows: Vec<OperationRow> = sqlx::query_as(include_str!("sql/operation_get_many.sql"))
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| whole(e.into()))?;
        let mut records = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            let record: OperationRecord = row.try_into().map_err(whole)?;
            records.insert(record.id, record);
        }
        let mut out = Vec::with_capacity(written.len());
        for (id, created) in written {
            // An id twice in one batch is answered twice, from the one row.
            let operation = records.get(&id).cloned().ok_or((
                None,
                StoreError::Corrupt(format!(
                    "{id} was written by this batch and cannot be read back"
                )),
            ))?;
            out.push(Submitted { operation, created });
        }
        tx.commit().await.map_err(|e| whole(e.into()))?;
        Ok(out)
    }

    /// Write an intent and its first history link in one transaction, or return the existing record
    /// if the same id was submitted with the same fingerprint. A different fingerprint under the same
    /// id is refused and nothing is written.
    pub async fn submit(&self, intent: &Intent) -> Result<Submitted, StoreError> {
        let tx = self.begin_write().await?;
        self.submit_in(tx, intent, None).await
    }

    async fn submit_in(
        &self,
        mut tx: Transaction<'_, Postgres>,
        intent: &Intent,
        open_cap: Option<u32>,
    ) -> Result<Submitted, StoreError> {
        let superseded = match intent.supersedes {
            Some(old) => lock_superseded(&mut tx, old, intent.operation_id).await?,
            None => None,
        };
        if !insert_intent(&mut tx, intent).await? {
            tx.rollback().await?;
            // Compared without the stored body (the fingerprint stands for it): a tiny request
            // under another's id must not make the server read and parse up to 16 MiB.
            let existing = self.get_shown(intent.operation_id).await?;
            // Another caller's id is "not found": neither what it holds nor that it differs.
            if existing.caller != intent.caller {
                return Err(StoreError::NotFound(intent.operation_id));
            }
            if let Some(e) = intent.conflict_with(&existing) {
                return Err(e.into());
            }
            // The same request again: it is read whole, as its submitter just sent it whole.
            return Ok(Submitted {
                operation: self.get(intent.operation_id).await?,
                created: false,
            });
        }
        if let Some(cap) = open_cap {
            within_open_cap(&mut tx, &intent.caller, cap).await?;
        }
        if let Some(old) = superseded {
            link_superseded(&mut tx, old, intent).await?;
        }
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind(intent.operation_id.to_string())
            .execute(&mut *tx)
            .await?;
        // Read before the commit: once the retry is written, its answer cannot fail (a person
        // told "unavailable" would not know a new operation exists).
        let row: Option<OperationRow> = sqlx::query_as(include_str!("sql/operation_get.sql"))
            .bind(intent.operation_id.as_uuid())
            .fetch_optional(&mut *tx)
            .await?;
        let operation = row
            .ok_or(StoreError::NotFound(intent.operation_id))?
            .try_into()?;
        tx.commit().await?;
        Ok(Submitted {
            operation,
            created: true,
        })
    }

    // ----------------------------------------------------------------------------------------------
    // Reads
    // ----------------------------------------------------------------------------------------------

    pub async fn get(&self, id: OperationId) -> Result<OperationRecord, StoreError> {
        let row: Option<OperationRow> = sqlx::query_as(include_str!("sql/operation_get.sql"))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
        row.ok_or(StoreError::NotFound(id))?.try_into()
    }

    pub async fn history(&self, id: OperationId) -> Result<Vec<HistoryRecord>, StoreError> {
        history_of(&self.pool, id).await
    }

    /// Up to `limit` of an operation's history links before `before` (the newest when `None`), in
    /// chain order.
    pub async fn history_before(
        &self,
        id: OperationId,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let rows: Vec<HistoryRow> = sqlx::query_as(include_str!("sql/history_before.sql"))
            .bind(id.as_uuid())
            .bind(before)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().rev().map(HistoryRecord::from).collect())
    }

    /// Operations per (state, provider).
    pub async fn count_by_state(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/operation_count_by_state.sql"))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Row totals: (operations, history links, provider calls).
    pub async fn totals(&self) -> Result<(i64, i64, i64), StoreError> {
        Ok(sqlx::query_as(include_str!("sql/stats_totals.sql"))
            .fetch_one(&self.pool)
            .await?)
    }

    /// How many operations a worker still has to act on.
    /// Operations not yet in a terminal state, per state and provider (the metrics' gauge: terminal
    /// rows only grow, and counting them would scan the whole table; these use the state index).
    pub async fn count_open_by_state(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        let open: Vec<&str> = jobtrail_core::State::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        Ok(
            sqlx::query_as(include_str!("sql/operation_count_open_by_state.sql"))
                .bind(open)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Escalations open (held for a person) and when the oldest was raised.
    pub async fn escalations_open(&self) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
        Ok(
            sqlx::query_as(include_str!("sql/operation_escalations_open.sql"))
                .fetch_one(&self.pool)
                .await?,
        )
    }

    pub async fn count_unsettled(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(include_str!("sql/operation_count_unsettled.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }

    /// Whether the database holds any operation (of any state), before or after it was migrated:
    /// for a tool that writes throwaway operations, which must not land beside real ones.
    pub async fn holds_operations(&self) -> Result<bool, StoreError> {
        let (exists,): (bool,) = sqlx::query_as(include_str!("sql/operation_table_exists.sql"))
            .fetch_one(&self.pool)
            .await?;
        if !exists {
            return Ok(false);
        }
        let (any,): (bool,) = sqlx::query_as(include_str!("sql/operation_any.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(any)
    }

    /// Which database this store writes to, as an operator names it (never the password):
    /// `database on host:port`.
    pub fn database_shown(&self) -> String {
        let opts = self.pool.connect_options();
        format!(
            "database {:?} on {}",
            opts.get_database().unwrap_or("(the user's default)"),
            server_of(&opts)
        )
    }

    /// Whether the database, without jobtrail's schema, holds another application's tables: a
    /// tool that migrates into it and writes throwaway operations must not land beside them.
    /// jobtrail's schema is there when its first migration is recorded applied: a table named
    /// `operations` alone may be another application's (migrating beside it would fail half-way).
    pub async fn holds_other_tables(&self) -> Result<bool, StoreError> {
        if self.has_jobtrail_schema().await? {
            return Ok(false);
        }
        let (other,): (bool,) = sqlx::query_as(include_str!("sql/database_holds_other_tables.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(other)
    }

    /// Whether jobtrail's first migration is recorded applied in this database.
    async fn has_jobtrail_schema(&self) -> Result<bool, StoreError> {
        let (bookkept,): (bool,) = sqlx::query_as(include_str!("sql/migrations_table_exists.sql"))
            .fetch_one(&self.pool)
            .await?;
        let Some(first) = MIGRATOR.iter().next() else {
            return Ok(bookkept);
        };
        if !bookkept {
            return Ok(false);
        }
        let (applied,): (bool,) = sqlx::query_as(include_str!("sql/migration_applied.sql"))
            .bind(first.version)
            .fetch_one(&self.pool)
            .await?;
        Ok(applied)
    }

    /// Whether any operation is left for workers (cheap: reads at most one index entry).
    pub async fn any_unsettled(&self) -> Result<bool, StoreError> {
        let (any,): (bool,) = sqlx::query_as(include_str!("sql/operation_any_unsettled.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(any)
    }

    /// The bytes of a result kept in the database (see [`ResultBytes`]); `None` if there are none for
    /// this operation and digest. The caller checks them against the digest.
    pub async fn result_bytes(
        &self,
        id: OperationId,
        sha256: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let row: Option<(Vec<u8>,)> = sqlx::query_as(include_str!("sql/result_get.sql"))
            .bind(id.as_uuid())
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(b,)| b))
    }

    pub async fn calls(&self, id: OperationId) -> Result<Vec<StoredCall>, StoreError> {
        calls_of(&self.pool, id).await
    }

    // ----------------------------------------------------------------------------------------------
    // Leases
    // ----------------------------------------------------------------------------------------------

    /// Claim up to `limit` due operations of any provider for `owner` with a lease of `ttl`. One
    /// short transaction.
    pub async fn claim_due(
        &self,
        owner: &str,
        limit: i64,
        ttl: Duration,
    ) -> Result<Vec<Claimed>, StoreError> {
        claim_due_with(&self.pool, owner, limit, ttl).await
    }

    /// A transaction that writes evidence. Its statements, and the foreign-key checks they fire, find
    /// rows by key only (sequential scans ruled out): a check plan cached by a long-lived session
    /// while a table was empty (freshly migrated, or analysed empty) would otherwise read the table
    /// sequentially on every insert for as long as the session lives, however large it has grown.
    pub(crate) async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self
            .pool
            .begin_with(include_str!("sql/begin_key_lookups.sql"))
            .await?)
    }

    /// A worker's fenced write: a row lock waits at most 1 s (`begin_fenced_write.sql`).
    async fn begin_fenced(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self
            .pool
            .begin_with(include_str!("sql/begin_fenced_write.sql"))
            .await?)
    }

    /// A transaction that reads the schedule in due order (a claim, the next-due read): the first
    /// rows of each provider's due index, whatever the statistics say (`begin_due_in_order.sql`).
    pub(crate) async fn begin_due_in_order(
        &self,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self
            .pool
            .begin_with(include_str!("sql/begin_due_in_order.sql"))
            .await?)
    }

    /// The worker's claim: up to `limit` due operations of the providers in `shares` only (a worker
    /// never holds work it cannot do), each provider within its caps, its fair rows first, none of a
    /// provider the fleet was told to wait for, and the extra rows within the worker's `free` slots
    /// less every provider's reserve. One short transaction; with a fleet-wide cap, the
    /// capped providers' claims are serialised across the fleet by an advisory lock held only for
    /// that transaction (two claimers counting the same leases would both take the last slots).
    pub async fn claim_shares(
        &self,
        owner: &str,
        (limit, free): (i64, i64),
        ttl: Duration,
        shares: &[ClaimShare],
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut capped: Vec<&str> = shares
            .iter()
            .filter(|s| s.fleet_cap.is_some() && s.cap > 0)
            .map(|s| s.provider.as_str())
            .collect();
        let mut tx = self.begin_due_in_order().await?;
        if !capped.is_empty() {
            capped.sort_unstable(); // one order for every claimer: no deadlock between them
            sqlx::query(include_str!("sql/session_lock_timeout.sql"))
                .execute(&mut *tx)
                .await?;
            sqlx::query(include_str!("sql/provider_fleet_lock.sql"))
                .bind(&capped)
                .execute(&mut *tx)
                .await?;
        }
        let claimed = claim_shares_with(&mut *tx, owner, (limit, free), ttl, shares).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// How long until one of `providers`' operations could be claimed (`None`: none is open). An
    /// idle worker sleeps that long instead of scanning.
    pub async fn next_due(&self, providers: &[String]) -> Result<Option<Duration>, StoreError> {
        let mut tx = self.begin_due_in_order().await?;
        let (secs,): (Option<f64>,) = sqlx::query_as(include_str!("sql/operation_next_due.sql"))
            .bind(providers)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(secs.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0))))
    }

    /// Make sure a provider's fleet-wide token bucket exists (full when new).
    pub async fn seed_throttle(&self, provider: &str, burst: u32) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/provider_throttle_seed.sql"))
            .bind(provider)
            .bind(f64::from(burst))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Take `calls` calls from a provider's fleet-wide bucket: `None` if they may go now, otherwise
    /// how long until they may.
    pub async fn take_calls(
        &self,
        provider: &str,
        per_sec: f64,
        burst: u32,
        calls: u32,
    ) -> Result<Option<Duration>, StoreError> {
        let calls = calls.clamp(1, burst.max(1));
        let row: Option<(bool, f64)> =
            sqlx::query_as(include_str!("sql/provider_throttle_take.sql"))
                .bind(provider)
                .bind(per_sec)
                .bind(f64::from(burst))
                .bind(f64::from(calls))
                .fetch_optional(&self.pool)
                .await?;
        match row {
            Some((true, _)) => Ok(None),
            Some((false, wait)) => Ok(Some(Duration::from_secs_f64(wait.clamp(0.001, 86_400.0)))),
            // The bucket is missing (created after this worker started, or removed): make it, and
            // let the caller ask again.
            None => {
                self.seed_throttle(provider, burst).await?;
                Ok(Some(Duration::from_millis(1)))
            }
        }
    }

    /// A provider asked the fleet to wait (`429` with `Retry-After`): no worker claims its
    /// operations, and its bucket grants nothing, for `wait`.
    pub async fn pause_provider(&self, provider: &str, wait: Duration) -> Result<(), StoreError> {
        sqlx::query(include_str!("sql/provider_throttle_pause.sql"))
            .bind(provider)
            .bind(wait.as_secs_f64().min(86_400.0))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Extend a live lease. Returns the new expiry, or `LeaseLost`.
    pub async fn extend_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        let row: Option<(DateTime<Utc>,)> =
            sqlx::query_as(include_str!("sql/operation_extend_lease_if_leased.sql"))
                .bind(lease.operation_id.as_uuid())
                .bind(&lease.owner)
                .bind(lease.epoch)
                .bind(ttl.as_secs_f64())
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| r.0).ok_or_else(|| lost(lease))
    }

    /// Give a lease back without a transition, with the next action time. `LeaseLost` if not held.
    /// A create this lease may have sent stays marked as such (see [`Store::release_unsent`]).
    pub async fn release(
        &self,
        lease: &Lease,
        after: Duration,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.release_marked(lease, after, reason, false).await
    }

    /// [`Store::release`] by a holder that sent no create its steps did not record (it could not
    /// plan its call, or stopped before it): the claim's "a create may leave under this epoch" mark
    /// is cleared with the lease, so the next holder sends the create rather than reconciling one
    /// never sent.
    pub async fn release_unsent(
        &self,
        lease: &Lease,
        after: Duration,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.release_marked(lease, after, reason, true).await
    }

    async fn release_marked(
        &self,
        lease: &Lease,
        after: Duration,
        reason: &str,
        unsent: bool,
    ) -> Result<(), StoreError> {
        let row: Option<(uuid::Uuid,)> =
            sqlx::query_as(include_str!("sql/operation_release_if_leased.sql"))
                .bind(lease.operation_id.as_uuid())
                .bind(&lease.owner)
                .bind(lease.epoch)
                .bind(i64::try_from(after.as_millis()).unwrap_or(i64::MAX))
                .bind(reason)
                .bind(unsent)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|_| ()).ok_or_else(|| lost(lease))
    }

    /// A fenced write: apply one step as the holder of `lease`. `LeaseLost` if the lease expired or
    /// was taken over; `Illegal` if the event is not allowed in the row's current state (a person's
    /// decision landed meanwhile). In both cases the row is untouched, but the provider call the step
    /// reports did happen, so it is still appended to the call log (with the stale epoch).
    pub async fn apply(&self, lease: &Lease, step: Step) -> Result<Applied, StoreError> {
        let call = step.call.clone();
        let retry_after = step.retry_after;
        let result = self.apply_fenced(lease, step).await;
        if let (Err(e), Some(call)) = (&result, call)
            && refuses_only_the_step(e)
        {
            self.log_refused_call(lease, &call, retry_after).await?;
        }
        result
    }

    /// Log the call of a refused write as the next link of its operation's call chain, in a
    /// transaction of its own: the call happened, whoever owns the operation now. The provider's
    /// `Retry-After` in its answer is kept too (it only delays status reads, so it needs no lease):
    /// a worker that lost its lease while the call was out must not leave the next owner free to
    /// read again at once. (Also for the calls of a plan's later steps, once an earlier one was
    /// refused: they happened too.)
    pub async fn log_refused_call(
        &self,
        lease: &Lease,
        call: &CallRecord,
        retry_after: Option<std::time::Duration>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let locked = lock(&mut tx, lease.operation_id).await?;
        let rec: OperationRecord = locked.row.try_into()?;
        let link = write::next_call_link(&rec, lease.epoch, &lease.owner, call)?;
        write::insert_call(&mut *tx, rec.id, lease.epoch, &lease.owner, call, link).await?;
        sqlx::query(include_str!("sql/operation_advance_calls_head.sql"))
            .bind(rec.id.as_uuid())
            .bind(link.seq)
            .bind(link.hash.as_slice())
            .bind(retry_after.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The database's clock: what a person's relative times (`+2h`, a cancel window) count from,
    /// as every step is dated by it.
    pub async fn db_now(&self) -> Result<DateTime<Utc>, StoreError> {
        let (now,): (DateTime<Utc>,) = sqlx::query_as(include_str!("sql/db_now.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(now)
    }

    /// Whether writes whose commit failed committed after all (its answer lost with the
    /// connection): every history link they planned is there (by operation, place and hash;
    /// history is append-only, so what was written after it does not matter), and the call row of
    /// each that logged a call without a link (a lookup logged before its resend). A write with
    /// neither says nothing: `Some(false)`, not committed as far as anyone can tell (applying it
    /// again moves only its schedule). `None`: they could not be read within 5 s in all (a
    /// failover), and the writes may or may not be there. `applied`: each write's result, and the
    /// id of the call it logged.
    async fn committed_after_all(
        &self,
        applied: &[(&Applied, Option<uuid::Uuid>)],
    ) -> Option<bool> {
        let linked: Vec<&Applied> = applied
            .iter()
            .filter(|(a, _)| a.transition.is_some())
            .map(|(a, _)| *a)
            .collect();
        let calls: Vec<uuid::Uuid> = applied
            .iter()
            .filter(|(a, _)| a.transition.is_none())
            .filter_map(|(_, call)| *call)
            .collect();
        if linked.is_empty() && calls.is_empty() {
            return Some(false);
        }
        let ids: Vec<uuid::Uuid> = linked.iter().map(|a| a.record.id.as_uuid()).collect();
        let seqs: Vec<i64> = linked.iter().map(|a| a.record.history_seq).collect();
        let hashes: Vec<&[u8]> = linked
            .iter()
            .map(|a| a.record.history_head.as_slice())
            .collect();
        let read = async {
            loop {
                let links =
                    sqlx::query_as::<_, (uuid::Uuid,)>(include_str!("sql/history_links_exist.sql"))
                        .bind(&ids)
                        .bind(&seqs)
                        .bind(&hashes)
                        .fetch_all(&self.pool)
                        .await;
                let logged =
                    sqlx::query_as::<_, (uuid::Uuid,)>(include_str!("sql/calls_exist.sql"))
                        .bind(&calls)
                        .fetch_all(&self.pool)
                        .await;
                match (links, logged) {
                    (Ok(l), Ok(c)) => return l.len() == linked.len() && c.len() == calls.len(),
                    _ => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        };
        tokio::time::timeout(COMMIT_CHECK, read).await.ok()
    }

    /// Many fenced writes in one transaction (group commit): one lock statement for all rows, one
    /// commit for all. Each write gets its own result, exactly as [`Store::apply`] would give it:
    /// `LeaseLost` and `Illegal` refuse only that write (its call is still logged). If the batch as a
    /// whole fails, each write is retried on its own, so one bad write cannot sink the others.
    pub async fn apply_many(&self, writes: Vec<(Lease, Step)>) -> Vec<Result<Applied, StoreError>> {
        if writes.len() <= 1 {
            let mut out = Vec::new();
            for (lease, step) in writes {
                out.push(self.apply(&lease, step).await);
            }
            return out;
        }
        match self.apply_batch(&writes).await {
            Ok(results) => results,
            Err(_) => {
                let mut out = Vec::with_capacity(writes.len());
                for (lease, step) in writes {
                    out.push(self.apply(&lease, step).await);
                }
                out
            }
        }
    }

    async fn apply_batch(
        &self,
        writes: &[(Lease, Step)],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        let mut tx = self.begin_fenced().await?;
        let mut results = write_batch_in(&mut tx, writes).await?;
        if let Err(e) = tx.commit().await {
            // A commit whose answer was lost (the connection dropped, a failover) may have
            // committed: then the batch must never be applied again.
            let applied: Vec<(&Applied, Option<uuid::Uuid>)> = results
                .iter()
                .zip(writes)
                .filter_map(|(r, (_, step))| {
                    Some((r.as_ref().ok()?, step.call.as_ref().map(|c| c.id)))
                })
                .collect();
            match self.committed_after_all(&applied).await {
                Some(true) => {
                    tracing::warn!(error = %e, "the commit's answer was lost, but the batch committed")
                }
                Some(false) => return Err(e.into()),
                // Whether the batch is there cannot be told: its writes are answered so (never
                // applied again), and the calls of the writes it refused, which it wrote nothing
                // of either way, are logged below.
                None => {
                    for r in results.iter_mut().filter(|r| r.is_ok()) {
                        *r = Err(StoreError::CommitUnknown(e.to_string()));
                    }
                }
            }
        }
        self.announce(write::moved(results.iter().filter_map(|r| r.as_ref().ok())))
            .await;
        // The calls of refused writes, each after the batch (never holding the batch's locks while
        // waiting for another worker's row). The batch is committed: a call that cannot be logged
        // now fails only its own write, as in `apply` (the batch is never applied a second time).
        for ((lease, step), result) in writes.iter().zip(results.iter_mut()) {
            if let (Err(e), Some(call)) = (&*result, &step.call)
                && refuses_only_the_step(e)
                && let Err(e) = self.log_refused_call(lease, call, step.retry_after).await
            {
                *result = Err(e);
            }
        }
        Ok(results)
    }

    async fn apply_fenced(&self, lease: &Lease, step: Step) -> Result<Applied, StoreError> {
        let mut tx = self.begin_fenced().await?;
        let locked = lock_if_leased(&mut tx, lease).await?;
        let step = match held_elsewhere(&mut tx, &[Some((&locked, &step))])
            .await?
            .pop()
        {
            Some(Some(instead)) => instead,
            _ => step,
        };
        let call = step.call.as_ref().map(|c| c.id);
        let applied = write::apply_locked(&mut tx, locked, &lease.owner, step).await?;
        if let Err(e) = tx.commit().await {
            match self.committed_after_all(&[(&applied, call)]).await {
                Some(true) => {
                    tracing::warn!(error = %e, "the commit's answer was lost, but the write committed")
                }
                Some(false) => return Err(e.into()),
                None => return Err(StoreError::CommitUnknown(e.to_string())),
            }
        }
        self.announce(write::moved([&applied])).await;
        Ok(applied)
    }

    // ----------------------------------------------------------------------------------------------
    // Writes by people and agents (not lease holders)
    // ----------------------------------------------------------------------------------------------

    /// Record a cancel request. Before any create could have been sent (no attempt recorded, nobody
    /// holding a lease) the operation is withdrawn and nothing is ever sent. While the create may be in
    /// flight the request is noted and acted on once the job id is known. Otherwise the operation moves
    /// to `cancel_requested` and is due at once for the lease owner's single cancel call.
    pub async fn request_cancel(
        &self,
        id: OperationId,
        request: CancelRequest,
    ) -> Result<Applied, StoreError> {
        self.cancel(id, request, None, false).await
    }

    /// A person's cancel: as [`Store::request_cancel`], on the view `seen` (`STATE`, and the history
    /// position when given) checked under the row lock. Without a whole view (`STATE@SEQ`), an
    /// operation held for a person is refused: cancelling it is a decision like any other on the queue, and another
    /// person may have resumed it since (a job someone chose to keep would be cancelled).
    pub async fn request_cancel_as_seen(
        &self,
        id: OperationId,
        request: CancelRequest,
        seen: Option<(State, Option<i64>)>,
    ) -> Result<Applied, StoreError> {
        self.cancel(id, request, seen, true).await
    }

    async fn cancel(
        &self,
        id: OperationId,
        request: CancelRequest,
        seen: Option<(State, Option<i64>)>,
        by_person: bool,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.begin_write().await?;
        let locked = match seen {
            Some((state, seq)) => lock_as_seen(&mut tx, id, state, seq).await?,
            None => lock(&mut tx, id).await?,
        };
        let state: State = locked
            .row_state()
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
        // A bare state is not a view here: the operation may have left this state and come back
        // (resumed by someone who chose to keep the job), and the provider's cancel cannot be
        // taken back.
        if by_person && state.needs_human() && !matches!(seen, Some((_, Some(_)))) {
            let given = match seen {
                None => "no view was named",
                Some(_) => "a bare state names no view",
            };
            return Err(StoreError::Conflict(format!(
                "{id} is held for a person ({state}): cancelling it is a decision on what you saw, and {given}; look at it (`show`) and name that view with its number (`--seen STATE@SEQ`, or `seen` in the API's cancel body or the MCP tool's arguments), as `escalations` and `show` print it"
            )));
        }
        // A cancel already noted where the state cannot move yet: asking again writes nothing.
        // (Each request would be a permanent history link, and would make a person's STATE@SEQ
        // stale.) The first request stands, with its actor and reason.
        let noted_only =
            jobtrail_core::machine::rule_for(state, jobtrail_core::EventKind::CancelRequested)
                .is_some_and(|r| r.to == jobtrail_core::machine::To::Same);
        // A cancel already under way (asked, or sent and awaiting the provider's word): the same.
        let under_way = matches!(state, State::CancelRequested | State::Cancelling);
        if under_way || (noted_only && locked.row_cancel_requested()) {
            let at = locked.db_now;
            let record: OperationRecord = locked.row.try_into()?;
            tx.rollback().await?;
            return Ok(Applied {
                record,
                transition: None,
                at,
            });
        }
        // Withdrawn only when no create can have created a job: every attempt so far was
        // definitively not created (the state says so) and no send is marked in flight. A worker
        // holding the lease decides for itself once its call is answered.
        let never_sent = state == State::CreatePending
            && locked.row_create_sent_epoch().is_none()
            && locked.row_lease_owner().is_none();
        let event = if never_sent {
            Event::Withdraw(request.clone())
        } else {
            Event::CancelRequested(request.clone())
        };
        let step = Step {
            event: Some(event),
            keep_lease: true,
            ..Default::default()
        };
        let applied = write::apply_locked(&mut tx, locked, request.actor(), step).await?;
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.announce(write::moved([&applied])).await;
        Ok(applied)
    }

    /// Retry as a new operation linked to the old one: the new intent (a new token; the same or an
    /// edited request) and its first history link, and on the old operation a `superseded` link and
    /// `superseded_by`, all in one transaction. The old operation must be terminal and still as the
    /// person saw it. The new intent is validated against the database's clock, as a submit is.
    /// `evidence`: what the person stated beside the decision, kept in the `superseded` link.
    pub async fn supersede(
        &self,
        old: OperationId,
        (seen_state, seen_seq): (State, Option<i64>),
        decision: jobtrail_core::Decision,
        evidence: Option<serde_json::Value>,
        submission: &Submission,
        terms: &ProviderTerms,
    ) -> Result<Submitted, StoreError> {
        let mut tx = self.begin_write().await?;
        let locked = lock_as_seen(&mut tx, old, seen_state, seen_seq).await?;
        let intent = &submission.validate(
            terms,
            SubmitLimits::default(),
            locked.db_now,
            draw_entropy()?,
        )?;
        if let Some(by) = locked.row_superseded_by() {
            return Err(StoreError::Conflict(format!(
                "{old} was already retried as {}: retry that one, or look at it first",
                OperationId::from_uuid(by)
            )));
        }
        let actor = decision.actor().to_owned();
        let step = Step {
            detail: evidence,
            ..Step::event(Event::Superseded {
                decision,
                new_operation_id: intent.operation_id.to_string(),
            })
        };
        // The table decides (only terminal operations may be superseded); the new operation must
        // exist before the old one can point at it.
        let planned = write::plan(locked, &actor, &step)?;
        insert_intent(&mut tx, intent).await?;
        write::execute(&mut tx, &planned).await?;
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind(intent.operation_id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Submitted {
            operation: self.get(intent.operation_id).await?,
            created: true,
        })
    }

    /// A person's decision, applied only if the operation is still in the state (and, if given, at the
    /// history position) the person saw. Refused with `Stale` otherwise, and with `Illegal` if the
    /// table does not allow it; either way nothing is written.
    pub async fn decide(
        &self,
        id: OperationId,
        seen_state: State,
        seen_seq: Option<i64>,
        mut step: Step,
    ) -> Result<Applied, StoreError> {
        let actor = match &step.event {
            Some(ev) => decision_actor(ev).unwrap_or("admin").to_owned(),
            None => "admin".to_owned(),
        };
        let mut tx = self.begin_write().await?;
        let locked = lock_as_seen(&mut tx, id, seen_state, seen_seq).await?;
        // An abandon before anyone settled whether the create made a job says so in its link
        // (read under the lock: a send marked in flight is cleared by the abandon itself), so a
        // retry, a new create, is not started beside a job that may exist without a person's
        // say-so (see `Store::abandoned_unsettled`).
        if matches!(step.event, Some(Event::Abandon { .. }))
            && locked.row_remote_job_id().is_none()
            && match locked.row_state().parse::<State>() {
                Ok(State::CreateUnknown | State::Reconciliation | State::CreateUnresolved) => true,
                Ok(State::CreatePending) => locked.row_create_sent_epoch().is_some(),
                Ok(State::ContractViolation) => true,
                _ => false,
            }
        {
            let mut detail = step.detail.take().unwrap_or_else(|| serde_json::json!({}));
            detail[CREATE_UNSETTLED] = true.into();
            step.detail = Some(detail);
        }
        // A deadline a person sets is in the future by the database's clock, the one every step
        // is dated and scheduled by (not the deciding machine's, which may be off).
        for (name, at) in [
            ("create_deadline", step.set_create_deadline),
            ("result_deadline", step.set_result_deadline),
            ("cancel_deadline", step.set_cancel_deadline),
        ] {
            if let Some(at) = at
                && at <= locked.db_now
            {
                return Err(StoreError::Conflict(format!(
                    "{name} {at} is not in the future by the database's clock (now {}): nothing was written",
                    locked.db_now
                )));
            }
        }
        // What a person found at the provider settles the create only if no worker is creating
        // or looking up the job this moment: its answer (a job it just created) would land after
        // the decision, be refused, and a retry of a "not created" operation start a second job.
        // Abandoning a create still open is the same: the job a worker starts this moment would
        // be on no operation, and a retry would start another.
        let settles_the_create = match step.event {
            Some(Event::AdoptRemoteJob { .. } | Event::DeclareNotCreated { .. }) => true,
            Some(Event::Abandon { .. }) => matches!(
                locked.row_state().parse::<State>(),
                Ok(State::CreatePending | State::CreateUnknown | State::Reconciliation)
            ),
            _ => false,
        };
        if settles_the_create && let Some((owner, until)) = locked.live_lease() {
            // The owner is a row's text, which a writer login sets: shown, never acted on.
            let owner = jobtrail_core::text::visible(owner);
            return Err(StoreError::Conflict(format!(
                "worker {owner} holds {id} until {until}: it may be creating or looking up the job at this moment, so what you found may already be out of date; wait until it settles the create (create_unresolved comes to a person) or its lease ends, then decide again"
            )));
        }
        if let Some(
            Event::AdoptRemoteJob { remote_job_id, .. }
            | Event::ChooseRemoteJob { remote_job_id, .. },
        ) = &step.event
        {
            job_not_owned_elsewhere(&mut tx, id, locked.row_provider(), remote_job_id).await?;
        }
        let applied = write::apply_locked(&mut tx, locked, &actor, step).await?;
        sqlx::query(include_str!("sql/notify_work.sql"))
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.announce(write::moved([&applied])).await;
        Ok(applied)
    }
}

/// The key an abandon's evidence holds `true` under when whether its create made a job was never
/// settled.
const CREATE_UNSETTLED: &str = "create_unsettled";

impl Store {
    /// Where `id` is abandoned before anyone settled whether its create made a job: the state it
    /// was abandoned in. Its abandon link says so (an older build's link: its state does); an
    /// abandoned operation whose abandon cannot be found among its newest links counts as
    /// unsettled, as nothing says otherwise.
    pub async fn abandoned_unsettled(&self, id: OperationId) -> Result<Option<String>, StoreError> {
        let newest = self.history_before(id, None, 20).await?;
        let abandoned = State::Abandoned.as_str();
        let Some(link) = newest
            .iter()
            .rev()
            .find(|h| h.to_state == abandoned && h.from_state.as_deref() != Some(abandoned))
        else {
            return Ok(Some("an unknown state".to_owned()));
        };
        let from = link.from_state.clone().unwrap_or_default();
        let flagged = link.detail["evidence"][CREATE_UNSETTLED] == true;
        let unsettled_state = matches!(
            from.parse::<State>(),
            Ok(State::CreateUnknown | State::Reconciliation | State::CreateUnresolved)
        );
        Ok((flagged || unsettled_state).then_some(from))
    }
}

/// A retry may link only to a finished operation not retried yet: the operation `new` would
/// supersede, locked until the link is written. `None` when it already names `new` (the same
/// submission again: nothing more to write).
async fn lock_superseded(
    tx: &mut Transaction<'_, Postgres>,
    old: OperationId,
    new: OperationId,
) -> Result<Option<LockedRow>, StoreError> {
    let locked = match lock(tx, old).await {
        Err(StoreError::NotFound(_)) => return Err(SubmitError::SupersededMissing(old).into()),
        other => other?,
    };
    let state: State = locked
        .row_state()
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    if !state.is_terminal() {
        return Err(StoreError::Conflict(format!(
            "{old} is {state}, not finished: a new operation may supersede only a finished one (cancel it, or wait)"
        )));
    }
    match locked.row_superseded_by() {
        Some(by) if by == new.as_uuid() => Ok(None),
        Some(by) => Err(StoreError::Conflict(format!(
            "{old} was already retried as {}",
            OperationId::from_uuid(by)
        ))),
        None => Ok(Some(locked)),
    }
}

/// The superseded operation's side of a retry an agent submitted: its `superseded` link and
/// `superseded_by`, written after the new operation (which it names) and in the same transaction,
/// exactly as a person's retry writes them. One operation is superseded by one other, or none.
async fn link_superseded(
    tx: &mut Transaction<'_, Postgres>,
    old: LockedRow,
    intent: &Intent,
) -> Result<(), StoreError> {
    let decision = jobtrail_core::Decision::new(
        &intent.caller,
        &format!("submitted {} to supersede it", intent.operation_id),
    )
    .map_err(|e| StoreError::Submit(e.into()))?;
    let step = Step::event(Event::Superseded {
        decision,
        new_operation_id: intent.operation_id.to_string(),
    });
    let planned = write::plan(old, &intent.caller, &step)?;
    write::execute(tx, &planned).await
}

/// How long a write whose commit answer was lost is looked for before it counts as unknown.
const COMMIT_CHECK: Duration = Duration::from_secs(5);

/// The job a worker's step names for this operation for the first time: a create's answer, a
/// lookup's find, or the answer a contract violation records as this operation's when it has none.
fn job_named<'s>(row: &LockedRow, step: &'s Step) -> Option<&'s str> {
    let job = match step.event.as_ref()? {
        e @ (Event::CreateAccepted { .. } | Event::CreateCompleted { .. }) => e.remote_job_id()?,
        Event::ContractViolated {
            recorded_job_id, ..
        } if row.row_remote_job_id().is_none() => recorded_job_id,
        _ => return None,
    };
    (row.row_remote_job_id() != Some(job)).then_some(job)
}

/// Every worker step that names a job for its operation is checked against the other operations
/// of the provider that are not finished (or finished, but another caller's), under the jobs'
/// locks held to commit: one held by another is never taken (the second caller would read the
/// first's result, and could cancel its job). Such a step is replaced by the contract violation that keeps the job as the conflicting
/// answer, with the call, counters and send mark of the step it replaces (the call was made and is
/// logged). `steps`: each write's locked row and step (`None`: a write refused already); the
/// answer holds the replacements, by position. A job named twice in one transaction goes to the
/// first that names it. The locks are taken in one statement, sorted, and the holders found in
/// one more: two round trips for a batch, none when no step names a job.
async fn held_elsewhere(
    tx: &mut Transaction<'_, Postgres>,
    steps: &[Option<(&LockedRow, &Step)>],
) -> Result<Vec<Option<Step>>, StoreError> {
    let named: Vec<(usize, &LockedRow, &str)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let (row, step) = (*s)?;
            Some((i, row, job_named(row, step)?))
        })
        .collect();
    let mut instead: Vec<Option<Step>> = vec![None; steps.len()];
    if named.is_empty() {
        return Ok(instead);
    }
    let mut keys: Vec<(&str, &str)> = named
        .iter()
        .map(|(_, r, j)| (r.row_provider(), *j))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let (providers, jobs): (Vec<&str>, Vec<&str>) = keys.into_iter().unzip();
    sqlx::query(include_str!("sql/remote_jobs_lock.sql"))
        .bind(&providers)
        .bind(&jobs)
        .execute(&mut **tx)
        .await?;
    let held: Vec<(i64, uuid::Uuid)> =
        sqlx::query_as(include_str!("sql/operations_live_by_remote_jobs.sql"))
            .bind(
                named
                    .iter()
                    .map(|(_, r, _)| r.row_provider())
                    .collect::<Vec<_>>(),
            )
            .bind(named.iter().map(|(_, _, j)| *j).collect::<Vec<_>>())
            .bind(named.iter().map(|(_, r, _)| r.row_id()).collect::<Vec<_>>())
            .bind(
                named
                    .iter()
                    .map(|(_, r, _)| r.row_caller())
                    .collect::<Vec<_>>(),
            )
            .fetch_all(&mut **tx)
            .await?;
    // (WITH ORDINALITY counts from 1.)
    let held: std::collections::HashMap<usize, uuid::Uuid> = held
        .into_iter()
        .map(|(n, id)| (n as usize - 1, id))
        .collect();
    let mut taken: std::collections::HashMap<(&str, &str), uuid::Uuid> = Default::default();
    for (k, (i, row, job)) in named.iter().enumerate() {
        let key = (row.row_provider(), *job);
        let owner = match taken.get(&key) {
            Some(&first) if first != row.row_id() => Some(first),
            _ => held.get(&k).copied(),
        };
        let Some(owner) = owner else {
            taken.insert(key, row.row_id());
            continue;
        };
        let (_, step) = steps[*i].expect("named from a step");
        let held_by = OperationId::from_uuid(owner).to_string();
        // The holder is named in the link's detail (operators and auditors read it), never in its
        // cause, which the operation's own caller reads: the holder may be another caller's.
        let mut detail = match &step.detail {
            Some(serde_json::Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        detail.insert("held_by".into(), held_by.clone().into());
        instead[*i] = Some(Step {
            call: step.call.clone(),
            counters: step.counters,
            send_mark: step.send_mark,
            decided_in: step.decided_in,
            detail: Some(detail.into()),
            ..Step::event(Event::JobHeldElsewhere {
                remote_job_id: (*job).to_owned(),
                held_by,
            })
        });
    }
    Ok(instead)
}

/// Another operation of `provider` that holds `job` (as its job or as a conflicting answer), with
/// the job's lock taken until commit: two transactions naming the same job cannot each see it
/// unowned.
async fn job_owner_elsewhere(
    tx: &mut Transaction<'_, Postgres>,
    id: uuid::Uuid,
    provider: &str,
    job: &str,
) -> Result<Option<uuid::Uuid>, StoreError> {
    sqlx::query(include_str!("sql/remote_job_lock.sql"))
        .bind(provider)
        .bind(job)
        .execute(&mut **tx)
        .await?;
    let owner: Option<(uuid::Uuid,)> =
        sqlx::query_as(include_str!("sql/operation_find_by_remote_job.sql"))
            .bind(provider)
            .bind(job)
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(owner.map(|(o,)| o))
}

/// A person may adopt a job only if no other operation of the provider already holds it.
async fn job_not_owned_elsewhere(
    tx: &mut Transaction<'_, Postgres>,
    id: OperationId,
    provider: &str,
    job: &str,
) -> Result<(), StoreError> {
    jobtrail_core::ids::check_remote_job_id(job)
        .map_err(|why| StoreError::Submit(SubmitError::UnusableJobId(why)))?;
    match job_owner_elsewhere(tx, id.as_uuid(), provider, job).await? {
        Some(other) => Err(StoreError::Conflict(format!(
            "job {job} belongs to operation {} of provider {provider}: one remote job, one operation",
            OperationId::from_uuid(other)
        ))),
        None => Ok(()),
    }
}

/// Insert an intent and its first history link. False when the id already exists (nothing written).
/// Refuse (the caller's transaction then rolls back) if `caller` now holds more than `cap` open
/// operations, counting what this transaction wrote. Taken under a lock per caller held until
/// commit, so concurrent submits of one caller (through any server) are counted one after the other.
async fn within_open_cap(
    tx: &mut Transaction<'_, Postgres>,
    caller: &str,
    cap: u32,
) -> Result<(), StoreError> {
    sqlx::query(include_str!("sql/caller_open_lock.sql"))
        .bind(caller)
        .execute(&mut **tx)
        .await?;
    let (open,): (i64,) = sqlx::query_as(include_str!("sql/caller_open_count.sql"))
        .bind(caller)
        .fetch_one(&mut **tx)
        .await?;
    if open > i64::from(cap) {
        return Err(SubmitError::TooManyOpen {
            caller: caller.to_owned(),
            open,
            limit: cap,
        }
        .into());
    }
    Ok(())
}

async fn insert_intent(
    tx: &mut Transaction<'_, Postgres>,
    intent: &Intent,
) -> Result<bool, StoreError> {
    // A person's retry is the caller's operation, submitted by the person: the link's actor and
    // cause name who did it, its `caller` whose it is.
    let (actor, submitted) = match &intent.retried_by {
        Some(person) => (
            person.clone(),
            format!("retried by {person} for {}", intent.caller),
        ),
        None => (
            intent.caller.clone(),
            format!("submitted by {}", intent.caller),
        ),
    };
    let mut first = ChainEntry {
        operation_id: intent.operation_id.to_string(),
        seq: 1,
        at: storable(intent.created_at),
        actor,
        from_state: None,
        to_state: State::INITIAL.as_str().to_owned(),
        event: "submitted".to_owned(),
        cause: format!("{submitted}, approved by {}", intent.approved_by),
        remote_job_id: None,
        call_id: None,
        detail: serde_json::json!({
            "provider": intent.provider,
            "target": intent.target,
            "caller": intent.caller,
            "approved_by": intent.approved_by,
            "fingerprint": intent.fingerprint.as_str(),
            "idempotency": intent.idempotency.as_str(),
            "at_most_once": intent.idempotency.guarantees_at_most_once(),
            "approval_ref": intent.approval_ref,
            "trace_id": intent.trace_id.to_string(),
            "create_deadline": intent.create_deadline,
            "result_deadline": intent.result_deadline,
            "cancel_window_ms": intent.cancel_window.as_millis() as i64,
            "supersedes": intent.supersedes.map(|s| s.to_string()),
        }),
    };
    if let Some(person) = &intent.retried_by {
        first.detail["retried_by"] = person.as_str().into();
    }
    if let Some(person) = &intent.edited_by {
        first.detail["edited_by"] = person.as_str().into();
    }
    let hash = first.hash(&GENESIS);
    let inserted = sqlx::query(include_str!("sql/operation_insert_if_absent.sql"))
        .bind(intent.operation_id.as_uuid())
        .bind(&intent.provider)
        .bind(&intent.target)
        .bind(&intent.body)
        .bind(intent.fingerprint.as_str())
        .bind(intent.token.as_str())
        .bind(intent.idempotency.as_str())
        .bind(intent.idempotency.guarantees_at_most_once())
        .bind(&intent.caller)
        .bind(&intent.approved_by)
        .bind(&intent.approval_ref)
        .bind(intent.trace_id.to_string())
        .bind(first.at)
        .bind(storable(intent.create_deadline))
        .bind(storable(intent.result_deadline))
        .bind(intent.cancel_window.as_millis() as i64)
        .bind(intent.supersedes.map(|s| s.as_uuid()))
        .bind(hash.as_slice())
        .bind(intent.parent_span.map(|s| s.to_string()))
        .bind(&intent.edited_by)
        .bind(intent.parent_sampled)
        .fetch_optional(&mut **tx)
        .await;
    match inserted {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(false),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {
            let missing = intent.supersedes.unwrap_or(intent.operation_id);
            return Err(SubmitError::SupersededMissing(missing).into());
        }
        Err(e) => return Err(e.into()),
    }
    write::insert_history(tx, &first, None, &GENESIS, &hash).await?;
    Ok(true)
}

/// The steps of many leases, fenced and written in the caller's transaction: one lock statement for
/// all rows, one statement per table (see [`Store::apply_many`]).
pub(crate) async fn write_batch_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    writes: &[(Lease, Step)],
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    let ids: Vec<uuid::Uuid> = writes
        .iter()
        .map(|(l, _)| l.operation_id.as_uuid())
        .collect();
    let owners: Vec<String> = writes.iter().map(|(l, _)| l.owner.clone()).collect();
    let epochs: Vec<i64> = writes.iter().map(|(l, _)| l.epoch).collect();
    let locked: Vec<LockedRow> =
        sqlx::query_as(include_str!("sql/operation_lock_many_if_leased.sql"))
            .bind(&ids)
            .bind(&owners)
            .bind(&epochs)
            .fetch_all(&mut **tx)
            .await?;
    // Keyed by lease, not by id alone: one batch can hold a step of a lease since lost and one
    // of the lease that replaced it (the same worker claimed the operation again while the old
    // step waited for the writer), and the row locked is the current lease's only.
    let held = |lease: &Lease| (lease.operation_id.as_uuid(), lease.epoch);
    let mut by_id: std::collections::HashMap<(uuid::Uuid, i64), LockedRow> = locked
        .into_iter()
        .map(|l| ((l.row_id(), l.row_lease_epoch()), l))
        .collect();
    // The steps naming a job another operation holds, each replaced (two statements for a batch
    // that names jobs, none for the status reads that make up most steps).
    let named: Vec<_> = writes
        .iter()
        .map(|(lease, step)| Some((by_id.get(&held(lease))?, step)))
        .collect();
    let instead = held_elsewhere(tx, &named).await?;
    let mut planned = Vec::new();
    let mut slots: Vec<Result<usize, StoreError>> = Vec::with_capacity(writes.len());
    for ((lease, step), instead) in writes.iter().zip(&instead) {
        let step = instead.as_ref().unwrap_or(step);
        let outcome = match by_id.remove(&held(lease)) {
            None => Err(lost(lease)),
            Some(row) => write::plan(row, &lease.owner, step),
        };
        match outcome {
            Ok(p) => {
                planned.push(p);
                slots.push(Ok(planned.len() - 1));
            }
            // A refused step's call is logged by the caller after this transaction.
            Err(e) => slots.push(Err(e)),
        }
    }
    write::execute_many(tx, &planned).await?;
    let mut planned: Vec<Option<write::Planned>> = planned.into_iter().map(Some).collect();
    let results = slots
        .into_iter()
        .map(|s| s.map(|i| planned[i].take().expect("each planned write once").applied))
        .collect();
    Ok(results)
}

/// Claim up to `limit` due operations of any provider for `owner` (tests, benchmarks and the
/// operator's tools; workers claim by provider share). Its own transaction unless `db` is one.
pub(crate) async fn claim_due_with<'c, E: sqlx::PgExecutor<'c>>(
    db: E,
    owner: &str,
    limit: i64,
    ttl: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    let rows: Vec<ClaimedRow> = sqlx::query_as(include_str!("sql/operation_claim_due_any.sql"))
        .bind(owner)
        .bind(limit)
        .bind(ttl.as_secs_f64())
        .fetch_all(db)
        .await?;
    rows.into_iter().map(|r| r.claimed(owner)).collect()
}

/// A submission refused only because a deadline it names has passed since it was first sent is a
/// retry when its id is already the caller's: it is validated again as of the moment that id was
/// first submitted, so the same request is answered with the operation it started (and a changed
/// one is refused as changed). Told "nothing was written", an agent would submit again under a new
/// id and start the paid job twice. Another caller's id, or no id, keeps the refusal as it was:
/// whether an id exists is never told.
async fn as_first_submitted<'c, E: sqlx::PgExecutor<'c>>(
    db: E,
    submission: &Submission,
    terms: &ProviderTerms,
    limits: SubmitLimits,
    refused: SubmitError,
) -> Result<Intent, StoreError> {
    let (SubmitError::DeadlineInPast { .. }, Some(id)) = (&refused, submission.operation_id) else {
        return Err(refused.into());
    };
    let row: Option<OperationRow> = sqlx::query_as(include_str!("sql/operation_get_shown.sql"))
        .bind(id.as_uuid())
        .fetch_optional(db)
        .await?;
    let Some(first) = row.map(OperationRecord::try_from).transpose()? else {
        return Err(refused.into());
    };
    if first.caller != submission.caller {
        return Err(refused.into());
    }
    submission
        .validate(terms, limits, first.created_at, draw_entropy()?)
        .map_err(|_| refused.into())
}

/// The worker's claim query (see [`Store::claim_shares`]), in `db`'s transaction or its own.
pub(crate) async fn claim_shares_with<'c, E: sqlx::PgExecutor<'c>>(
    db: E,
    owner: &str,
    (limit, free): (i64, i64),
    ttl: Duration,
    shares: &[ClaimShare],
) -> Result<Vec<Claimed>, StoreError> {
    let names: Vec<&str> = shares.iter().map(|s| s.provider.as_str()).collect();
    let fair: Vec<i32> = shares.iter().map(|s| s.fair).collect();
    let cap: Vec<i32> = shares.iter().map(|s| s.cap).collect();
    let fleet: Vec<Option<i32>> = shares.iter().map(|s| s.fleet_cap).collect();
    let reserve: Vec<i32> = shares.iter().map(|s| s.reserve).collect();
    let rows: Vec<ClaimedRow> = sqlx::query_as(include_str!("sql/operation_claim_shares.sql"))
        .bind(owner)
        .bind(limit)
        .bind(ttl.as_secs_f64())
        .bind(&names)
        .bind(&fair)
        .bind(&cap)
        .bind(&fleet)
        .bind(&reserve)
        .bind(free)
        .fetch_all(db)
        .await?;
    rows.into_iter().map(|r| r.claimed(owner)).collect()
}

impl ClaimedRow {
    fn claimed(self, owner: &str) -> Result<Claimed, StoreError> {
        let db_now = self.locked.db_now;
        let op: OperationRecord = self.locked.row.try_into()?;
        Ok(Claimed {
            late: (db_now - self.was_due).to_std().unwrap_or_default(),
            taken_over: self.taken_over,
            lease: Lease {
                operation_id: op.id,
                owner: owner.to_owned(),
                epoch: op.lease_epoch,
            },
            operation: Box::new(op),
            db_now,
        })
    }
}

/// An error that refuses one step and leaves its call to be logged (the call happened).
fn refuses_only_the_step(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::LeaseLost { .. } | StoreError::Illegal { .. } | StoreError::Moved { .. }
    )
}

fn decision_actor(ev: &Event) -> Option<&str> {
    match ev {
        Event::AdoptRemoteJob { decision, .. }
        | Event::DeclareNotCreated { decision }
        | Event::ConfirmCancellation { decision, .. }
        | Event::ChooseRemoteJob { decision, .. }
        | Event::Resume { decision }
        | Event::Abandon { decision }
        | Event::Superseded { decision, .. } => Some(decision.actor()),
        Event::CancelRequested(r) | Event::Withdraw(r) => Some(r.actor()),
        _ => None,
    }
}

/// Fresh randomness for a new intent, from the operating system's CSPRNG.
pub fn draw_entropy() -> Result<Entropy, StoreError> {
    let mut token = [0u8; 16];
    let mut trace = [0u8; 16];
    getrandom::fill(&mut token)
        .and_then(|_| getrandom::fill(&mut trace))
        .map_err(|e| StoreError::Corrupt(format!("no randomness from the OS: {e}")))?;
    Ok(Entropy {
        operation_uuid: uuid::Uuid::now_v7(),
        token,
        trace,
    })
}

fn lost(lease: &Lease) -> StoreError {
    StoreError::LeaseLost {
        operation_id: lease.operation_id,
        owner: lease.owner.clone(),
        epoch: lease.epoch,
    }
}

async fn lock_if_leased(
    tx: &mut Transaction<'_, Postgres>,
    lease: &Lease,
) -> Result<LockedRow, StoreError> {
    let row: Option<LockedRow> = sqlx::query_as(include_str!("sql/operation_lock_if_leased.sql"))
        .bind(lease.operation_id.as_uuid())
        .bind(&lease.owner)
        .bind(lease.epoch)
        .fetch_optional(&mut **tx)
        .await?;
    row.ok_or_else(|| lost(lease))
}

/// Lock a row for a person's decision, refusing with `Stale` if it is no longer in the state (and, if
/// given, at the history position) the person saw.
async fn lock_as_seen(
    tx: &mut Transaction<'_, Postgres>,
    id: OperationId,
    seen_state: State,
    seen_seq: Option<i64>,
) -> Result<LockedRow, StoreError> {
    let locked = lock(tx, id).await?;
    let current: State = locked
        .row_state()
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    let seq = locked.row_history_seq();
    if current != seen_state || seen_seq.is_some_and(|s| s != seq) {
        return Err(StoreError::Stale {
            operation_id: id,
            seen: match seen_seq {
                Some(s) => format!("{seen_state} (history #{s})"),
                None => seen_state.to_string(),
            },
            current,
            seq,
            head: locked.row_history_head().to_vec(),
        });
    }
    Ok(locked)
}

async fn lock(
    tx: &mut Transaction<'_, Postgres>,
    id: OperationId,
) -> Result<LockedRow, StoreError> {
    let row: Option<LockedRow> = sqlx::query_as(include_str!("sql/operation_lock.sql"))
        .bind(id.as_uuid())
        .fetch_optional(&mut **tx)
        .await?;
    row.ok_or(StoreError::NotFound(id))
}

/// An operation's whole history, in chain order, read through `exec` (the pool, or a transaction).
pub(crate) async fn history_of<'c, E: sqlx::PgExecutor<'c>>(
    exec: E,
    id: OperationId,
) -> Result<Vec<HistoryRecord>, StoreError> {
    let rows: Vec<HistoryRow> = sqlx::query_as(include_str!("sql/history_list.sql"))
        .bind(id.as_uuid())
        .fetch_all(exec)
        .await?;
    Ok(rows.into_iter().map(HistoryRecord::from).collect())
}

/// An operation's provider calls, in chain order, read through `exec`.
pub(crate) async fn calls_of<'c, E: sqlx::PgExecutor<'c>>(
    exec: E,
    id: OperationId,
) -> Result<Vec<StoredCall>, StoreError> {
    Ok(sqlx::query_as(include_str!("sql/call_list.sql"))
        .bind(id.as_uuid())
        .fetch_all(exec)
        .await?)
}

/// Which item of a batch an error is about: one the item's own content explains (its request,
/// its id, its terms), not the database failing under the whole batch.
fn item_or_whole(i: usize, e: &StoreError) -> Option<usize> {
    match e {
        StoreError::Database(_)
        | StoreError::Unavailable(_)
        | StoreError::Unreachable(_)
        | StoreError::Corrupt(_) => None,
        _ => Some(i),
    }
}

/// The names of the indexes a migration's SQL creates `CONCURRENTLY` (comments skipped).
fn concurrent_index_names(sql: &str) -> Vec<String> {
    let code: Vec<&str> = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect();
    let words: Vec<String> = code
        .join(" ")
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    let mut names = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let before = |n: usize| i.checked_sub(n).map(|j| words[j].as_str());
        let creates = matches!(
            (before(3), before(2), before(1)),
            (_, Some("create"), Some("index")) | (Some("create"), Some("unique"), Some("index"))
        );
        if w != "concurrently" || !creates {
            continue;
        }
        let after: Vec<&str> = words[i + 1..].iter().map(String::as_str).collect();
        let name = match after.as_slice() {
            ["if", "not", "exists", name, ..] | [name, ..] => *name,
            [] => continue,
        };
        if name != "on" {
            names.push(name.trim_matches('"').to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pooler_saying_its_server_is_away_is_waited_for() {
        for away in [
            "server login has been failing, try again later (server_login_retry)",
            "pgbouncer cannot connect to server",
            "server conn crashed?",
            "no more connections allowed (max_client_conn)",
            "query_wait_timeout",
            "failed to connect to remote server",
        ] {
            assert!(pooler_away("08P01", away), "{away}");
        }
        for mended_by_no_wait in [
            "No such database: jobtral",
            "No such user: jobtrail_wroker",
            "Unsupported startup parameter: options",
            "SSL required",
            "login rejected",
            "password authentication failed",
            "server login has been failing, cached error: password authentication failed for user \"pgbouncer\" (server_login_retry)",
            "server login has been failing, cached error: role \"x\" is not permitted to log in (server_login_retry)",
            "server login has been failing, cached error: SSL connection is required (server_login_retry)",
            "server login has been failing, cached error: database \"jobtral\" does not exist (server_login_retry)",
            "server login has been failing, cached error: no pg_hba.conf entry for host (server_login_retry)",
        ] {
            assert!(
                !pooler_away("08P01", mended_by_no_wait),
                "{mended_by_no_wait}"
            );
        }
        assert!(!pooler_away("28P01", "query_wait_timeout"));
        // The read right after connecting: lost or held up is an outage, a refused login is not.
        let after = |why: &str| StoreError::Unavailable(why.into()).met_after_connecting();
        assert!(matches!(
            after("error communicating with database: Connection reset by peer"),
            StoreError::Unreachable(_)
        ));
        for never in [
            "08P01: server login has been failing, cached error: password authentication failed",
            "error occurred while attempting to establish a TLS connection: invalid peer certificate",
        ] {
            assert!(
                matches!(after(never), StoreError::Unavailable(_)),
                "{never}"
            );
        }
    }

    #[test]
    fn only_io_errors_that_say_no_server_is_there_are_waited_for() {
        use std::io::{Error, ErrorKind};
        let tcp = PgConnectOptions::from_str("postgres://u@db.example/j").unwrap();
        let socket =
            PgConnectOptions::from_str("postgres://u@%2Fvar%2Frun%2Fpostgresql/j").unwrap();
        let by_host = PgConnectOptions::new_without_pgpass().host("/var/run/postgresql");
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::TimedOut,
            ErrorKind::HostUnreachable,
        ] {
            assert!(unreachable(&Error::from(kind), &tcp), "{kind:?}");
        }
        let no_name =
            Error::other("failed to lookup address information: Name or service not known");
        assert!(unreachable(&no_name, &tcp));
        // No socket file: the local server is stopped. Over TCP a missing file is a CA file.
        for local in [&socket, &by_host] {
            assert!(unreachable(&Error::from(ErrorKind::NotFound), local));
        }
        assert!(!unreachable(&Error::from(ErrorKind::NotFound), &tcp));
        // A refused certificate (rustls says it as InvalidData), a key it may not read.
        for kind in [ErrorKind::InvalidData, ErrorKind::PermissionDenied] {
            assert!(!unreachable(&Error::from(kind), &tcp), "{kind:?}");
        }
    }

    #[test]
    fn the_indexes_a_migration_builds_concurrently_are_named() {
        assert_eq!(
            concurrent_index_names(
                "-- CREATE INDEX CONCURRENTLY commented ON t (x)\nCREATE INDEX CONCURRENTLY a_b ON t (x) WHERE y IS NULL;\ncreate unique index concurrently if not exists \"c\" on t (z);\nDROP INDEX CONCURRENTLY d;"
            ),
            ["a_b", "c"]
        );
        assert!(concurrent_index_names("CREATE INDEX CONCURRENTLY ON t (x)").is_empty());
        assert!(concurrent_index_names("CREATE INDEX a ON t (x)").is_empty());
    }

    #[test]
    fn an_unverified_connection_across_a_network_is_named() {
        let said = |url: &str| unverified_tls(&PgConnectOptions::from_str(url).unwrap());
        for url in [
            "postgres://u@db.example/j",
            "postgres://u@db.example/j?sslmode=prefer",
            "postgres://u@db.example/j?sslmode=require",
            "postgres://u@10.1.2.3:5432/j?sslmode=allow",
            "postgres://u@[2001:db8::1]/j",
            "postgres://u@db.example/j?sslmode=verify-ca",
        ] {
            let w = said(url).unwrap_or_else(|| panic!("{url}: not named"));
            assert!(w.contains("sslmode=verify-full"), "{w}");
        }
        for url in [
            "postgres://u@db.example/j?sslmode=verify-full",
            "postgres://u@db.example/j?sslmode=disable",
            "postgres://u@localhost/j",
            "postgres://u@127.0.0.1:5432/j?sslmode=require",
            "postgres://u@[::1]/j",
            "postgres://u@db.example/j?host=/var/run/postgresql",
        ] {
            assert_eq!(said(url), None, "{url}");
        }
        assert_eq!(said("postgres://u@127.0.0.1/j?sslmode=verify-ca"), None);
        // The password is never in it.
        let w = said("postgres://u:hunter2@db.example/j").unwrap();
        assert!(!w.contains("hunter2"), "{w}");
    }
}
