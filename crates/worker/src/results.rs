//! The result store: validated result bytes on disk (a local directory by default), content-addressed
//! per operation. The operation record keeps the location, size and sha256; history never holds the
//! bytes.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where result bytes go.
#[derive(Debug, Clone)]
pub struct ResultStore {
    root: PathBuf,
}

/// What was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub location: String,
    pub size: u64,
    pub sha256: String,
}

impl ResultStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The default: `$JOBTRAIL_RESULT_DIR`, else `results/` under the user's data directory.
    pub fn default_root() -> PathBuf {
        if let Some(d) = std::env::var_os("JOBTRAIL_RESULT_DIR").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return PathBuf::from("/var/lib/jobtrail/results");
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("jobtrail/results")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Write `bytes` for `operation` (atomically: temp file, fsync, rename). Idempotent: the same
    /// bytes land at the same path.
    pub fn put(&self, operation: &str, bytes: &[u8]) -> std::io::Result<Stored> {
        let sha = hex::encode(Sha256::digest(bytes));
        let dir = self.root.join(operation);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(&sha);
        if !path.exists() {
            let tmp = dir.join(format!(".{sha}.{}.tmp", std::process::id()));
            {
                use std::io::Write;
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(bytes)?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, &path)?;
        }
        let abs = std::fs::canonicalize(&path)?;
        Ok(Stored {
            location: format!("file://{}", abs.display()),
            size: bytes.len() as u64,
            sha256: sha,
        })
    }

    /// [`ResultStore::put`] off the async threads (it writes and fsyncs a file).
    pub async fn put_blocking(
        &self,
        operation: String,
        bytes: bytes::Bytes,
    ) -> std::io::Result<Stored> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.put(&operation, &bytes))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Read a stored result back and check it against the recorded digest.
    pub fn get_verified(location: &str, sha256: &str) -> Result<Vec<u8>, String> {
        let path = location
            .strip_prefix("file://")
            .ok_or_else(|| format!("unsupported result location {location:?}"))?;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let got = hex::encode(Sha256::digest(&bytes));
        if got != sha256 {
            return Err(format!(
                "{path}: sha256 is {got}, the record says {sha256}: the stored result was altered"
            ));
        }
        Ok(bytes)
    }
}
