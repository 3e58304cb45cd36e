//! Fresh, migrated databases for tests, one per test, safe to use in parallel.
//!
//! The server is `DATABASE_URL` when set; otherwise a throwaway private cluster started once per test
//! process (see [`crate::cluster`]) and removed when the process exits. A template database is
//! migrated once; each test gets `CREATE DATABASE … TEMPLATE`, which takes milliseconds.

use crate::Store;
use crate::cluster::Cluster;
use sqlx::Connection;
use std::sync::OnceLock;

struct Server {
    /// URL of database `{db}` on this server: `prefix + db + suffix`.
    prefix: String,
    suffix: String,
    template: String,
    external: bool,
}

impl Server {
    fn url(&self, db: &str) -> String {
        format!("{}{db}{}", self.prefix, self.suffix)
    }
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

fn split_url(url: &str) -> Result<(String, String), String> {
    // postgres://user@host:port/db?params → ("postgres://user@host:port/", "?params")
    let after_scheme = url
        .find("://")
        .map(|i| i + 3)
        .ok_or("DATABASE_URL has no scheme")?;
    let path_start = url[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i + 1)
        .unwrap_or(url.len());
    let (prefix, rest) = url.split_at(path_start);
    let prefix = if prefix.ends_with('/') {
        prefix.to_owned()
    } else {
        format!("{prefix}/")
    };
    let suffix = rest
        .find('?')
        .map(|i| rest[i..].to_owned())
        .unwrap_or_default();
    Ok((prefix, suffix))
}

fn start_server() -> Result<Server, String> {
    let (prefix, suffix, external) =
        match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
            Some(url) => {
                let (p, s) = split_url(&url)?;
                (p, s, true)
            }
            None => {
                let cluster = Cluster::throwaway(std::process::id()).map_err(|e| e.to_string())?;
                let (p, s) = split_url(&cluster.url("postgres"))?;
                (p, s, false)
            }
        };
    let template = format!("jobtrail_tpl_{}", uuid::Uuid::now_v7().simple());
    let server = Server {
        prefix,
        suffix,
        template,
        external,
    };
    // The template is built on a runtime of its own: tests each have theirs, and a connection must not
    // outlive the runtime it was made on.
    let admin = server.url("postgres");
    let tpl_name = server.template.clone();
    let tpl_url = server.url(&server.template);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            crate::cluster::ensure_database(&admin, &tpl_name)
                .await
                .map_err(|e| e.to_string())?;
            let store = Store::connect_with(&tpl_url, 1)
                .await
                .map_err(|e| e.to_string())?;
            store.migrate().await.map_err(|e| e.to_string())?;
            store.close().await;
            Ok::<_, String>(())
        })
    })
    .join()
    .map_err(|_| "template setup panicked".to_string())??;
    Ok(server)
}

/// A fresh database, migrated, private to one test.
pub struct TestDb {
    pub name: String,
    pub url: String,
    admin_url: String,
    external: bool,
}

impl TestDb {
    /// Create a fresh database from the migrated template.
    pub async fn new() -> Self {
        let server = SERVER
            .get_or_init(start_server)
            .as_ref()
            .unwrap_or_else(|e| panic!("no PostgreSQL for tests: {e}"));
        let name = format!("jobtrail_t_{}", uuid::Uuid::now_v7().simple());
        let admin_url = server.url("postgres");
        let mut conn = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("connecting to the test server: {e}"));
        let sql = format!("CREATE DATABASE {name} TEMPLATE {}", server.template);
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating test database: {e}"));
        let _ = conn.close().await;
        Self {
            url: server.url(&name),
            name,
            admin_url,
            external: server.external,
        }
    }

    /// A store on this database.
    pub async fn store(&self) -> Store {
        Store::connect(&self.url)
            .await
            .expect("connect to test database")
    }

    /// The admin URL of the server (database `postgres`), for tests that act as a superuser.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// A URL for this database as a new login role that is a member of `group` (one of jobtrail's
    /// roles), as an operator would create it (docs/roles.md). Auditors' logins default to
    /// read-only transactions. The test server trusts local logins, so no password is involved.
    pub async fn login(&self, group: &str) -> String {
        let user = format!(
            "jt_{}_{}",
            group.trim_start_matches("jobtrail_"),
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        let mut sql = format!("CREATE ROLE {user} LOGIN IN ROLE {group};");
        if group == "jobtrail_auditor" {
            sql.push_str(&format!(
                "ALTER ROLE {user} SET default_transaction_read_only = on;"
            ));
        }
        let mut conn = sqlx::PgConnection::connect(&self.url)
            .await
            .expect("connect as the owner");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating a {group} login: {e}"));
        let _ = conn.close().await;
        // postgres://user@host/db?params → postgres://<login>@host/db?params
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let rest = rest.split_once('@').map(|(_, r)| r).unwrap_or(rest);
        format!("{scheme}://{user}@{rest}")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // A throwaway cluster disappears with the process; on a shared server, clean up after us.
        if !self.external {
            return;
        }
        let admin = self.admin_url.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut c)
                        .await;
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}

/// The record of a create call the provider accepted (202), to write a `CreateAccepted` step with
/// in tests that build an operation's history without a provider.
pub fn accepted_create(url: &str) -> jobtrail_core::CallRecord {
    jobtrail_core::CallRecord {
        id: uuid::Uuid::now_v7(),
        kind: jobtrail_core::CallKind::Create,
        attempt: 1,
        started_at: chrono::Utc::now(),
        duration_ms: 1.0,
        method: "POST".into(),
        url: url.into(),
        http_status: Some(202),
        response_headers: serde_json::json!({}),
        provider_request_id: None,
        error_class: None,
        outcome: "accepted".into(),
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
        span_id: "00f067aa0ba902b7".into(),
        response_sha256: None,
    }
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls_split_around_the_database_name() {
        assert_eq!(
            split_url("postgres://postgres@127.0.0.1:5432/test").unwrap(),
            ("postgres://postgres@127.0.0.1:5432/".into(), "".into())
        );
        assert_eq!(
            split_url("postgres://postgres@localhost/postgres?host=/tmp/x").unwrap(),
            (
                "postgres://postgres@localhost/".into(),
                "?host=/tmp/x".into()
            )
        );
        assert_eq!(
            split_url("postgres://u@h:1").unwrap(),
            ("postgres://u@h:1/".into(), "".into())
        );
    }
}

/// What the current thread has allocated and not yet freed, and the most it reached: a call's
/// memory, measured on the current-thread runtime a `#[tokio::test]` runs everything on. A test
/// binary counts with `#[global_allocator] static HEAP: heap::Counting = heap::Counting;`.
pub mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn add(n: isize) {
        // No destructor and no allocation: safe to reach from inside the allocator.
        let _ = LIVE.try_with(|l| {
            let now = l.get() + n;
            l.set(now);
            let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        });
    }

    pub struct Counting;

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            add(l.size() as isize);
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            add(-(l.size() as isize));
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            add(new as isize - l.size() as isize);
            unsafe { System.realloc(p, l, new) }
        }
    }

    /// `f`'s output, and the most it had allocated at once on this thread beyond what was live
    /// when it began.
    pub async fn peak_of<F: std::future::Future>(f: F) -> (F::Output, usize) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let out = f.await;
        (
            out,
            usize::try_from(PEAK.with(Cell::get) - base).unwrap_or(0),
        )
    }
}
