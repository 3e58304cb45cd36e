//! The store's errors. Expected cases are variants; database errors are translated in one place
//! ([`StoreError::from_db`]).

use jobtrail_core::machine::IllegalTransition;
use jobtrail_core::{OperationId, State, SubmitError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("operation {0} not found")]
    NotFound(OperationId),
    /// The write was conditioned on a lease this worker no longer holds (expired or re-claimed).
    /// Nothing was written.
    #[error("lease lost on {operation_id} (epoch {epoch}, owner {owner}): nothing was written")]
    LeaseLost {
        operation_id: OperationId,
        owner: String,
        epoch: i64,
    },
    /// The state machine does not allow this event in the row's current state. Nothing was written.
    #[error("operation {operation_id}: {source}")]
    Illegal {
        operation_id: OperationId,
        #[source]
        source: IllegalTransition,
    },
    /// A person decided on a view that is no longer current. Nothing was written.
    #[error(
        "operation {operation_id} changed since you looked: you saw {seen}, it is now {current} (history #{seq}); look again and decide on the current state"
    )]
    Stale {
        operation_id: OperationId,
        seen: String,
        current: State,
        seq: i64,
        /// The history head now (the view token's pin: `STATE@SEQ:HEAD`).
        head: Vec<u8>,
    },
    /// The operation left the state a worker's step assumed (a person decided meanwhile). Nothing
    /// was written.
    #[error("operation {operation_id} moved to {state} meanwhile: nothing was written")]
    Moved {
        operation_id: OperationId,
        state: State,
    },
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Connecting found no server that accepted a connection in time (refused, no route, no such
    /// host yet), or lost or held up the read that follows it: an outage that
    /// may end, unlike a refused login or certificate. Only connecting (and the read right after
    /// it, [`StoreError::met_after_connecting`]) says this; a process starting during it may wait
    /// (`jobtrail worker --db-wait`).
    #[error("database unavailable: {0}")]
    Unreachable(String),
    /// A commit's answer was lost and whether it committed could not be read back in time (a
    /// failover longer than the check): the write may or may not be there. Never retried by the
    /// writer (it would apply a second time); its operation is read afresh by whoever holds it
    /// next.
    #[error("the commit's answer was lost and whether it committed cannot be told yet: {0}")]
    CommitUnknown(String),
    /// The database URL itself is wrong (not a `postgres://` URL, malformed, an unknown
    /// parameter): bad input, not an outage. Nothing was sent anywhere.
    #[error("bad database URL: {0}")]
    BadUrl(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The request conflicts with another record (a job another operation owns, an operation already
    /// retried, a retry of one still live). Nothing was written.
    #[error("{0}")]
    Conflict(String),
    /// Evidence disagrees with its chain; what depends on it is refused.
    #[error("{0}")]
    Tampered(String),
    /// An anchor kept outside the database names a digest no anchor in it has.
    #[error(transparent)]
    AnchorNotFound(#[from] crate::audit::AnchorNotFound),
    /// The database's schema is not the one this binary was built for.
    #[error("{0}")]
    Schema(String),
    /// The database role this command connects as may not do this (a least-privilege role used for
    /// another role's command). Nothing was written.
    #[error("permission denied: {0} (see docs/roles.md for what each role may do)")]
    Denied(String),
}

impl StoreError {
    /// The one place where database errors are classified.
    pub fn from_db(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db)
                if db
                    .code()
                    .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")) =>
            {
                StoreError::Unavailable(e.to_string())
            }
            // A lock wait past the transaction's bound: another session holds the row.
            sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03") => {
                StoreError::Unavailable(format!(
                    "another database session has held a lock this write needs for longer than it waits ({}); try again",
                    db.message()
                ))
            }
            // Insufficient privilege, or a read-only role's session.
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("42501" | "25006")) =>
            {
                StoreError::Denied(db.message().to_owned())
            }
            _ => StoreError::Database(e),
        }
    }

    /// Worth retrying after a pause (the database went away); everything else is not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Unreachable(_)
        )
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::from_db(e)
    }
}
