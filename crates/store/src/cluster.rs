//! PostgreSQL for trying jobtrail on one machine (`jobtrail dev-db`, `demo`, `bench`) and for the
//! tests: a private cluster run from the machine's own PostgreSQL server binaries. Every other
//! command requires `DATABASE_URL`.
//!
//! * Binaries are found on `PATH` or where Debian/Ubuntu, Fedora/PGDG and Homebrew install them
//!   (`JOBTRAIL_PG_BIN` overrides). None found: a clear error naming the package to install.
//! * The cluster listens on a Unix socket in a private directory only (no TCP), with trust auth: only
//!   the owner of the directory (and root) can connect.
//! * PostgreSQL refuses to run as root, so when we are root the server runs as the unprivileged
//!   `postgres` system user (through `runuser`), and its directories are owned by that user.
//! * [`Cluster::persistent`] keeps its data under the user's data directory (started once, reused by
//!   every binary, serialised by a lock file). [`Cluster::throwaway`] lives in a temporary directory
//!   with fsync off, and a watchdog process stops and deletes it when the process that made it exits,
//!   however it exits.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a private cluster could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH or in the usual places \
         (/usr/lib/postgresql/*/bin, /usr/pgsql-*/bin, /usr/bin, /opt/homebrew/opt/postgresql@*/bin). \
         Install them (Debian/Ubuntu: `apt-get install postgresql`; Fedora: `dnf install postgresql-server`; \
         macOS: `brew install postgresql@16`), point JOBTRAIL_PG_BIN at their directory, \
         or set DATABASE_URL to a server you already run"
    )]
    NoBinaries,
    #[error(
        "running as root, and PostgreSQL refuses to run as root; the unprivileged `postgres` user it would run as does not exist (install the postgresql package, which creates it, or run as a normal user)"
    )]
    NoPostgresUser,
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError + '_ {
    move |source| ClusterError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A directory holding `initdb`, `pg_ctl` and `postgres`, and its major version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub dir: PathBuf,
    pub major: u32,
}

impl Binaries {
    /// Find the newest usable installation: `$JOBTRAIL_PG_BIN`, else `PATH` and the usual places.
    pub fn find() -> Result<Self, ClusterError> {
        Self::find_in(
            std::env::var_os("JOBTRAIL_PG_BIN").map(PathBuf::from),
            std::env::var_os("PATH"),
            &[
                "/usr/lib/postgresql",
                "/opt/homebrew/opt",
                "/usr/local/opt",
                "/usr",
            ],
            &["/usr/bin", "/usr/local/bin", "/opt/homebrew/bin"],
        )
    }

    /// [`Binaries::find`] with its inputs spelled out (tests use it without touching the environment).
    pub fn find_in(
        pg_bin: Option<PathBuf>,
        path_var: Option<std::ffi::OsString>,
        versioned_roots: &[&str],
        plain_dirs: &[&str],
    ) -> Result<Self, ClusterError> {
        if let Some(dir) = pg_bin {
            return Self::at(&dir).ok_or(ClusterError::NoBinaries);
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(path) = path_var {
            for d in std::env::split_paths(&path) {
                let pg_ctl = d.join("pg_ctl");
                if pg_ctl.exists() {
                    // Debian links some binaries into PATH; the real directory has them all.
                    if let Ok(real) = fs::canonicalize(&pg_ctl)
                        && let Some(parent) = real.parent()
                    {
                        candidates.push(parent.to_path_buf());
                    }
                    candidates.push(d);
                }
            }
        }
        for root in versioned_roots {
            if let Ok(entries) = fs::read_dir(root) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    // Debian: /usr/lib/postgresql/<ver>/bin; PGDG: /usr/pgsql-<ver>/bin;
                    // Homebrew: <prefix>/opt/postgresql@<ver>/bin.
                    let versioned = name.starts_with("postgresql") || name.starts_with("pgsql-");
                    if *root == "/usr/lib/postgresql" || versioned {
                        candidates.push(e.path().join("bin"));
                    }
                }
            }
        }
        candidates.extend(plain_dirs.iter().map(PathBuf::from));
        candidates
            .iter()
            .filter_map(|d| Self::at(d))
            .max_by_key(|b| b.major)
            .ok_or(ClusterError::NoBinaries)
    }

    fn at(dir: &Path) -> Option<Self> {
        for b in ["initdb", "pg_ctl", "postgres"] {
            if !dir.join(b).is_file() {
                return None;
            }
        }
        let out = Command::new(dir.join("postgres"))
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "postgres (PostgreSQL) 15.19 (Debian ...)"
        let major = text
            .split_whitespace()
            .find_map(|w| w.split('.').next().and_then(|m| m.parse::<u32>().ok()))?;
        Some(Self {
            dir: dir.to_path_buf(),
            major,
        })
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The unprivileged user the server runs as when we are root.
#[derive(Debug, Clone)]
struct RunAs {
    name: String,
    uid: u32,
    gid: u32,
}

fn run_as() -> Result<Option<RunAs>, ClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new("postgres").expect("static string");
    // SAFETY: getpwnam returns a pointer into static storage or null; we copy out at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(ClusterError::NoPostgresUser);
    }
    // SAFETY: pw is non-null and points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some(RunAs {
        name: "postgres".into(),
        uid,
        gid,
    }))
}

/// A running private cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub data_dir: PathBuf,
    pub socket_dir: PathBuf,
    bins: Binaries,
    run_as: Option<RunAs>,
}

impl Cluster {
    /// The persistent cluster of this user, started if it is not running. Data lives in
    /// `$JOBTRAIL_PGDATA`, else `$XDG_DATA_HOME/jobtrail/postgres` (`~/.local/share/...`), or
    /// `/var/lib/jobtrail/postgres` when running as root.
    pub fn persistent() -> Result<Self, ClusterError> {
        // Set to nothing, it names none (as every setting); relative, it is made absolute here:
        // PostgreSQL reads the socket directory written into its configuration from inside the
        // data directory, and a relative one there never starts.
        let root = match std::env::var_os("JOBTRAIL_PGDATA").filter(|d| !d.is_empty()) {
            Some(d) => {
                std::path::absolute(PathBuf::from(d)).map_err(|e| ClusterError::Command {
                    what: "finding the data directory".into(),
                    detail: format!("JOBTRAIL_PGDATA: {e}"),
                })?
            }
            None => default_data_root()?,
        };
        Self::persistent_at(&root)
    }

    /// The persistent cluster kept under `root`, started if it is not running.
    pub fn persistent_at(root: &Path) -> Result<Self, ClusterError> {
        let root = root.to_path_buf();
        let bins = Binaries::find()?;
        let run_as = run_as()?;
        fs::create_dir_all(&root).map_err(io_err(&root))?;
        let _lock = FileLock::acquire(&root.join("cluster.lock"))?;
        let cluster = Self::layout(&root, bins, run_as)?;
        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.initdb(false)?;
        }
        if !cluster.is_running() {
            cluster.start()?;
        }
        Ok(cluster)
    }

    /// A fresh cluster in a temporary directory, fsync off, removed when `watch_pid` exits.
    pub fn throwaway(watch_pid: u32) -> Result<Self, ClusterError> {
        let bins = Binaries::find()?;
        let run_as = run_as()?;
        let base = std::env::temp_dir().join(format!(
            "jobtrail-pg-{}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        fs::create_dir_all(&base).map_err(io_err(&base))?;
        let cluster = Self::layout(&base, bins, run_as)?;
        cluster.spawn_watchdog(watch_pid, &base)?;
        cluster.initdb(true)?;
        cluster.start()?;
        Ok(cluster)
    }

    fn layout(root: &Path, bins: Binaries, run_as: Option<RunAs>) -> Result<Self, ClusterError> {
        let data_dir = root.join("data");
        let socket_dir = root.join("socket");
        for d in [root, socket_dir.as_path()] {
            fs::create_dir_all(d).map_err(io_err(d))?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).map_err(io_err(d))?;
        }
        if let Some(u) = &run_as {
            for d in [root, socket_dir.as_path()] {
                chown(d, u)?;
            }
            if data_dir.exists() {
                chown(&data_dir, u)?;
            }
        }
        Ok(Self {
            data_dir,
            socket_dir,
            bins,
            run_as,
        })
    }

    /// The connection URL of database `db` (over the private socket).
    pub fn url(&self, db: &str) -> String {
        // A directory holding `&`, `#`, `+`, a space (…) would end or change the value:
        // percent-encoded then; as it is otherwise, to be read at a glance.
        let raw = self.socket_dir.as_os_str().as_encoded_bytes();
        let plain = raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-~".contains(b));
        let dir: String = if plain {
            self.socket_dir.display().to_string()
        } else {
            // `%20` for a space, not form encoding's `+`, which libpq (psql) reads as a `+`.
            url::form_urlencoded::byte_serialize(raw)
                .collect::<String>()
                .replace('+', "%20")
        };
        format!("postgres://postgres@localhost/{db}?host={dir}")
    }

    fn command(&self, program: &str) -> Command {
        let mut c = match &self.run_as {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.arg("-u")
                    .arg(&u.name)
                    .arg("--")
                    .arg(self.bins.bin(program));
                c
            }
            None => Command::new(self.bins.bin(program)),
        };
        c.env("LC_ALL", "C").env("LANG", "C").stdin(Stdio::null());
        c
    }

    fn run(&self, what: &str, mut c: Command) -> Result<(), ClusterError> {
        let out = c.output().map_err(|e| ClusterError::Command {
            what: what.to_owned(),
            detail: e.to_string(),
        })?;
        if out.status.success() {
            return Ok(());
        }
        Err(ClusterError::Command {
            what: what.to_owned(),
            detail: format!(
                "{}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }

    fn initdb(&self, throwaway: bool) -> Result<(), ClusterError> {
        let mut c = self.command("initdb");
        c.arg("-D").arg(&self.data_dir).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        if throwaway {
            c.arg("--no-sync");
        }
        self.run("initdb", c)?;
        let conf = self.data_dir.join("postgresql.conf");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(io_err(&conf))?;
        let mut settings = format!(
            "\n# jobtrail private cluster\nlisten_addresses = ''\nunix_socket_directories = '{}'\nunix_socket_permissions = 0700\nmax_connections = 300\nshared_buffers = 128MB\n",
            self.socket_dir.display()
        );
        if throwaway {
            settings.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        }
        f.write_all(settings.as_bytes()).map_err(io_err(&conf))?;
        Ok(())
    }

    fn is_running(&self) -> bool {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(&self.data_dir)
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c.status().map(|s| s.success()).unwrap_or(false)
    }

    /// Start the server (waits until it accepts connections).
    pub fn start(&self) -> Result<(), ClusterError> {
        let log = self.data_dir.join("server.log");
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null());
        // The server must not die with the terminal that started it (Ctrl-C in a shell).
        c.process_group(0);
        self.run("pg_ctl start", c)
    }

    /// Serve TLS on a loopback TCP port as well as the private socket, with this certificate and
    /// key (PEM), refusing TCP connections without TLS; restarts the server. For trying and
    /// testing `sslmode=require` / `verify-full` on one machine.
    pub fn serve_tls_on_loopback(
        &self,
        port: u16,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<(), ClusterError> {
        let cert = self.data_dir.join("server.crt");
        let key = self.data_dir.join("server.key");
        for (path, text) in [(&cert, cert_pem), (&key, key_pem)] {
            fs::write(path, text).map_err(io_err(path))?;
            // PostgreSQL refuses a key others can read.
            fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io_err(path))?;
            if let Some(u) = &self.run_as {
                chown(path, u)?;
            }
        }
        let append = |name: &str, text: String| -> Result<(), ClusterError> {
            let path = self.data_dir.join(name);
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io_err(&path))?;
            f.write_all(text.as_bytes()).map_err(io_err(&path))
        };
        append(
            "postgresql.conf",
            format!(
                "\n# TLS on loopback\nlisten_addresses = '127.0.0.1'\nport = {port}\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                cert.display(),
                key.display()
            ),
        )?;
        // pg_hba.conf is read top down: these lines come before initdb's `host ... trust`.
        let hba = self.data_dir.join("pg_hba.conf");
        let old = fs::read_to_string(&hba).map_err(io_err(&hba))?;
        fs::write(
            &hba,
            format!(
                "hostnossl all all 127.0.0.1/32 reject\nhostssl all all 127.0.0.1/32 trust\n{old}"
            ),
        )
        .map_err(io_err(&hba))?;
        self.stop()?;
        self.start()
    }

    /// Stop the server (fast shutdown).
    pub fn stop(&self) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        self.run("pg_ctl stop", c)
    }

    fn spawn_watchdog(&self, pid: u32, base: &Path) -> Result<(), ClusterError> {
        let stop = match &self.run_as {
            Some(u) => format!(
                "runuser -u {} -- '{}'",
                u.name,
                self.bins.bin("pg_ctl").display()
            ),
            None => format!("'{}'", self.bins.bin("pg_ctl").display()),
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} -D '{data}' -m immediate stop >/dev/null 2>&1; rm -rf '{base}'",
            data = self.data_dir.display(),
            base = base.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| ClusterError::Command {
                what: "watchdog".into(),
                detail: e.to_string(),
            })?;
        Ok(())
    }
}

fn default_data_root() -> Result<PathBuf, ClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // The postgres user cannot traverse /root, so root's cluster lives in the system data dir.
        return Ok(PathBuf::from("/var/lib/jobtrail/postgres"));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("jobtrail/postgres"));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".local/share/jobtrail/postgres")),
        None => Err(ClusterError::Command {
            what: "finding a data directory".into(),
            detail: "neither XDG_DATA_HOME nor HOME is set; set JOBTRAIL_PGDATA or DATABASE_URL"
                .into(),
        }),
    }
}

fn chown(path: &Path, u: &RunAs) -> Result<(), ClusterError> {
    std::os::unix::fs::chown(path, Some(u.uid), Some(u.gid)).map_err(io_err(path))
}

/// An exclusive advisory lock on a file, released on drop.
struct FileLock(fs::File);

impl FileLock {
    fn acquire(path: &Path) -> Result<Self, ClusterError> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        f.lock().map_err(io_err(path))?;
        Ok(Self(f))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// The persistent private cluster's `jobtrail` database (cluster started and database created on
/// first use), whatever `DATABASE_URL` says.
pub async fn private_database_url() -> Result<String, ClusterError> {
    let cluster = tokio::task::spawn_blocking(Cluster::persistent)
        .await
        .map_err(|e| ClusterError::Command {
            what: "starting the private cluster".into(),
            detail: e.to_string(),
        })??;
    ensure_database(&cluster.url("postgres"), "jobtrail").await?;
    Ok(cluster.url("jobtrail"))
}

/// Create database `name` on the server at `admin_url` if it does not exist.
pub async fn ensure_database(admin_url: &str, name: &str) -> Result<(), ClusterError> {
    use sqlx::Connection;
    let fail = |e: sqlx::Error| ClusterError::Command {
        what: format!("creating database {name}"),
        detail: e.to_string(),
    };
    let mut conn = sqlx::PgConnection::connect(admin_url).await.map_err(fail)?;
    let exists: Option<(i32,)> = sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(&mut conn)
        .await
        .map_err(fail)?;
    if exists.is_none() {
        // Identifiers cannot be bound; `name` is ours and checked to be a plain identifier.
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let sql = format!("CREATE DATABASE {name}");
        match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
        {
            Ok(_) => {}
            // Another process created it first.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(fail(e)),
        }
    }
    let _ = conn.close().await;
    Ok(())
}

/// Drop database `name` (disconnecting whoever is still in it) if it exists.
pub async fn drop_database(admin_url: &str, name: &str) -> Result<(), ClusterError> {
    use sqlx::Connection;
    let fail = |e: sqlx::Error| ClusterError::Command {
        what: format!("dropping database {name}"),
        detail: e.to_string(),
    };
    // Identifiers cannot be bound; `name` is ours and checked to be a plain identifier.
    assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    let mut conn = sqlx::PgConnection::connect(admin_url).await.map_err(fail)?;
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .map_err(fail)?;
    let _ = conn.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_binaries_is_a_clear_error_naming_the_package() {
        let empty = std::env::temp_dir().join(format!("jobtrail-nobin-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = Binaries::find_in(Some(empty.clone()), None, &[], &[]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("apt-get install postgresql") && msg.contains("DATABASE_URL"),
            "{msg}"
        );
        let e = Binaries::find_in(
            None,
            Some(empty.clone().into_os_string()),
            &[],
            &[empty.to_str().unwrap()],
        )
        .unwrap_err();
        assert!(matches!(e, ClusterError::NoBinaries));
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn this_machine_has_a_server_to_run() {
        let b = Binaries::find().expect("the test machine has PostgreSQL server binaries");
        assert!(b.major >= 12, "{b:?}");
    }
}
