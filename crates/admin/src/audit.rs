//! `audit verify` and `audit anchor`.
//!
//! An anchor is only worth what is kept outside the database: a writer with database rights can
//! append to any chain, and could rewrite everything after the last anchor it cannot reach. So
//! `anchor` writes the anchor to a file or stdout (Ed25519-signed when given a key), and `verify`
//! takes that copy back (`--expect-anchor`): the named anchor must be in the database (else exit 8),
//! must still hash to its digest, and every link and call it anchored must still be there.

use ed25519_dalek::Signer;
use jobtrail_console::shell::{self, CmdResult, exit, fail, print_json};
use jobtrail_core::OperationId;
use jobtrail_store::{Anchor, Store, StoreError};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code: the named anchor is not in the database, or its signature does not verify.
pub const ANCHOR_NOT_FOUND: u8 = 8;

/// An anchor as kept outside the database.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct AnchorFile {
    pub jobtrail_anchor: u32,
    pub anchor: Anchor,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Signature {
    pub alg: String,
    /// Hex Ed25519 public key.
    pub public_key: String,
    /// Hex signature over the RFC 8785 form of `anchor`.
    pub value: String,
}

fn signed_bytes(a: &Anchor) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(a).expect("an anchor serialises")
}

/// How often `audit verify --all` says how far it has come.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

fn hex32(text: &str, what: &str) -> Result<[u8; 32], jobtrail_console::shell::Failure> {
    let bytes = hex::decode(text.trim())
        .map_err(|_| fail(exit::BAD_INPUT, format!("{what}: expected 64 hex digits")))?;
    bytes.try_into().map_err(|_| {
        fail(
            exit::BAD_INPUT,
            format!("{what}: expected 32 bytes (64 hex digits)"),
        )
    })
}

/// The digest an `--expect-anchor` value names: a digest, or an anchor file (whose signature is
/// checked when a public key is given).
fn expected_digest(
    value: &str,
    public_key: Option<&str>,
) -> Result<String, jobtrail_console::shell::Failure> {
    let v = value.trim();
    if hex_of(v, 64) {
        if public_key.is_some() {
            return Err(fail(
                exit::BAD_INPUT,
                "--anchor-public-key checks an anchor file's signature: pass the file, not a bare digest",
            ));
        }
        return Ok(v.to_ascii_lowercase());
    }
    // An anchor file is a few hundred bytes: a path named by mistake is not read to the end.
    let text =
        jobtrail_provider::contract::read_text_file(Path::new(v), 64 << 10).map_err(|e| {
            fail(
                exit::BAD_INPUT,
                format!(
                    "--expect-anchor: neither a 64-hex digest nor a readable anchor file ({v}: {e})"
                ),
            )
        })?;
    let file: AnchorFile = serde_json::from_str(&text).map_err(|e| {
        fail(
            exit::BAD_INPUT,
            format!("--expect-anchor: {v} is not an anchor file: {e}"),
        )
    })?;
    // What the file says is printed (the digest, in errors; the key it names): whoever rewrote the
    // file could make either a terminal's escape that hides a warning or forges a line.
    if !hex_of(&file.anchor.digest, 64) {
        return Err(fail(
            exit::BAD_INPUT,
            format!("--expect-anchor: {v} is not an anchor file: its digest is not 64 hex digits"),
        ));
    }
    if let Some(key) = public_key {
        let key = ed25519_dalek::VerifyingKey::from_bytes(&hex32(key, "--anchor-public-key")?)
            .map_err(|e| fail(exit::BAD_INPUT, format!("--anchor-public-key: {e}")))?;
        let Some(sig) = &file.signature else {
            return Err(fail(ANCHOR_NOT_FOUND, format!("{v} is not signed")));
        };
        let bytes: [u8; 64] = hex::decode(&sig.value)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| fail(ANCHOR_NOT_FOUND, format!("{v}: the signature is malformed")))?;
        // Strict: no weak public key, no non-canonical signature.
        key.verify_strict(
            &signed_bytes(&file.anchor),
            &ed25519_dalek::Signature::from_bytes(&bytes),
        )
        .map_err(|_| {
            fail(
                ANCHOR_NOT_FOUND,
                format!("{v}: the signature does not verify with the given public key"),
            )
        })?;
    } else if let Some(sig) = &file.signature {
        // Checked against the key the file itself names, a signature proves nothing (whoever
        // rewrote the file could sign it): only a key the auditor holds does.
        let named = if hex_of(&sig.public_key, 64) {
            sig.public_key.as_str()
        } else {
            "that is not 64 hex digits"
        };
        eprintln!(
            "warning: {v} is signed (ed25519 key {named}) but its signature was not checked: pass --anchor-public-key with the key you trust"
        );
    }
    Ok(file.anchor.digest.to_ascii_lowercase())
}

/// Whether `s` is `len` hex digits (a digest, a key).
fn hex_of(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

pub async fn verify(
    store: &Store,
    operation: Option<String>,
    all: bool,
    expect_anchor: Option<String>,
    anchor_public_key: Option<String>,
    json: bool,
) -> CmdResult {
    if operation.is_some() && all {
        return Err(fail(
            exit::BAD_INPUT,
            "name one operation or --all, not both",
        ));
    }
    if operation.is_none() && !store.can_verify_all() {
        return Err(fail(
            exit::BAD_INPUT,
            format!(
                "audit verify --all reads {} streams at once, each on its own connection: --db-pool must be at least {0}",
                Store::VERIFY_ALL_CONNECTIONS
            ),
        ));
    }
    let expected = expect_anchor
        .as_deref()
        .map(|v| expected_digest(v, anchor_public_key.as_deref()))
        .transpose()?;
    let checked = match &operation {
        Some(op) => {
            let id: OperationId = op.trim().parse().map_err(|e| fail(exit::BAD_INPUT, e))?;
            store
                .verify_operation_anchored(id, expected.as_deref())
                .await
        }
        None => {
            // Minutes on a large database: how far it has come, on stderr, every few seconds (the
            // report itself goes to stdout).
            let started = std::time::Instant::now();
            let mut said = started;
            let mut tell = |r: &jobtrail_store::VerifyReport| {
                if said.elapsed() >= PROGRESS_EVERY {
                    said = std::time::Instant::now();
                    eprintln!(
                        "verified {} operations, {} history links, {} calls so far ({} breaks) in {} s",
                        r.operations,
                        r.rows,
                        r.calls,
                        r.break_count(),
                        started.elapsed().as_secs()
                    );
                }
            };
            store
                .verify_everything_telling(expected.as_deref(), &mut tell)
                .await
        }
    };
    let report = match checked {
        Ok(r) => r,
        Err(StoreError::AnchorNotFound(e)) => return Err(fail(ANCHOR_NOT_FOUND, e)),
        Err(e) => return Err(e.into()),
    };
    if json {
        print_json(&report);
    } else {
        // What a row holds is shown escaped: a row edited to hold terminal escapes must not
        // erase its own BREAK line, or print a forged summary, on the reader's screen.
        use jobtrail_console::visible::text as shown;
        for b in &report.breaks {
            println!(
                "BREAK {} #{}: {}\n      expected {}\n      stored   {}",
                b.operation_id,
                b.seq,
                shown(&b.problem),
                shown(&b.expected),
                shown(&b.stored)
            );
        }
        if report.breaks_omitted > 0 {
            println!(
                "... and {} more breaks, not listed (a report lists the first {})",
                report.breaks_omitted,
                jobtrail_store::MAX_BREAKS_LISTED
            );
        }
        let anchor = match &report.anchor {
            Some(a) => format!(
                "; anchor #{} ({} operations, {}{}) checked",
                a.id,
                a.operations,
                a.created_at.format("%Y-%m-%d %H:%M:%SZ"),
                if expected.is_some() {
                    ", as --expect-anchor names it"
                } else {
                    ": the latest in the database, not one kept elsewhere (--expect-anchor)"
                }
            ),
            None => "; no anchor yet (run `jobtrail-admin audit anchor --out FILE`)".into(),
        };
        println!(
            "{} operations, {} history links, {} calls ({} logged before calls were chained), {} stored results verified{anchor}: {}",
            report.operations,
            report.rows,
            report.calls,
            report.unchained_calls,
            report.results,
            if report.is_clean() {
                "intact".to_owned()
            } else {
                format!("{} BREAKS", report.break_count())
            }
        );
        if let Some(u) = report.unanchored {
            println!(
                "unanchored: {} operations, {} history links and {} calls lie after {} — intact as far as the chains tell, but only an anchor kept outside the database bounds what a writer with database rights could have rewritten",
                u.operations,
                u.links,
                u.calls,
                if report.anchor.is_some() {
                    "that anchor"
                } else {
                    "no anchor at all"
                }
            );
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::NOT_SUCCEEDED)
    })
}

pub async fn anchor(
    store: &Store,
    actor: &str,
    out: Option<PathBuf>,
    signing_key: Option<PathBuf>,
    json: bool,
) -> CmdResult {
    // Everything that can be refused is refused before the anchor is recorded.
    let actor = shell::actor("--actor", actor)?;
    let key = match &signing_key {
        Some(path) => {
            let text = jobtrail_provider::contract::read_text_file(path, 4 << 10).map_err(|e| {
                fail(
                    exit::BAD_INPUT,
                    format!("--signing-key {}: {e}", path.display()),
                )
            })?;
            Some(ed25519_dalek::SigningKey::from_bytes(&hex32(
                &text,
                "--signing-key",
            )?))
        }
        None => None,
    };
    // The file is started (beside where it goes, as `<out>.<run>.partial`) before the anchor is recorded:
    // a directory that is not there, or not writable, records nothing. It takes its name only
    // once it is whole, and never over an existing file.
    let partial = match &out {
        Some(path) => Some(Partial::start(path)?),
        None => None,
    };
    let a = store.anchor(&actor).await?;
    let kept_as = partial.as_ref().map(|p| p.name_for(&a));
    let signature = key.map(|k| Signature {
        alg: "ed25519".into(),
        public_key: hex::encode(k.verifying_key().to_bytes()),
        value: hex::encode(k.sign(&signed_bytes(&a)).to_bytes()),
    });
    let file = AnchorFile {
        jobtrail_anchor: 1,
        anchor: a,
        signature,
    };
    if let (Some(partial), Some(name)) = (partial, &kept_as) {
        let text = serde_json::to_string_pretty(&file).expect("an anchor serialises");
        partial.finish(text.as_bytes(), name).map_err(|e| {
            fail(
                exit::UNAVAILABLE,
                format!(
                    "{e} (anchor #{} is recorded in the database; rerun to record and keep a new one)",
                    file.anchor.id
                ),
            )
        })?;
    }
    let a = &file.anchor;
    if json {
        print_json(&file);
    } else {
        println!(
            "anchor #{} at {} over {} operations by {}",
            a.id,
            a.created_at.to_rfc3339(),
            a.operations,
            a.created_by
        );
        println!("digest {}", a.digest);
        if let Some(s) = &file.signature {
            println!("signed by ed25519 key {}", s.public_key);
        }
        eprintln!(
            "keep this digest (or the --out file) outside the database; check it with `jobtrail-admin audit verify --all --expect-anchor {}`",
            kept_as
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| a.digest.clone())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An anchor file being written: `<out>.<run>.partial` (or, for a directory, a partial file in it),
/// removed unless it takes its name.
struct Partial {
    /// The file named, or the directory the anchor's own file name goes into.
    out: PathBuf,
    into_directory: bool,
    tmp: PathBuf,
    file: Option<std::fs::File>,
}

impl Partial {
    fn start(out: &std::path::Path) -> Result<Self, jobtrail_console::shell::Failure> {
        let refused =
            |why: String| fail(exit::BAD_INPUT, format!("--out {}: {why}", out.display()));
        // A directory (a scheduled job's volume: no shell to name each file) gets one file per
        // anchor, named by its id and time.
        let into_directory = out.is_dir();
        if out.exists() && !into_directory {
            return Err(refused(
                "the file exists; anchors are never overwritten".into(),
            ));
        }
        let tmp = if into_directory {
            // Unique per run: in a container every run is PID 1, and a run killed mid-way leaves
            // its partial file behind, which must not block the next.
            out.join(format!(
                ".anchor-{}-{}.partial",
                std::process::id(),
                uuid::Uuid::now_v7().simple()
            ))
        } else {
            // Beside the file named (its name is taken by a hard link, on the same file system),
            // unique per run for the same reason.
            let mut tmp = out.as_os_str().to_owned();
            tmp.push(format!(".{}.partial", uuid::Uuid::now_v7().simple()));
            PathBuf::from(tmp)
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| refused(format!("{e} (making {})", tmp.display())))?;
        Ok(Self {
            out: out.to_owned(),
            into_directory,
            tmp,
            file: Some(file),
        })
    }

    /// Where anchor `a` is kept: the file named, or `anchor-<id>-<time>.json` in the directory.
    fn name_for(&self, a: &Anchor) -> PathBuf {
        if self.into_directory {
            self.out.join(format!(
                "anchor-{}-{}.json",
                a.id,
                a.created_at.format("%Y%m%dT%H%M%SZ")
            ))
        } else {
            self.out.clone()
        }
    }

    /// Write, sync, then give the file its name, never over an existing one: a hard link refuses
    /// an existing name; where the file system has no hard links (some object-store mounts), a
    /// rename to a name checked free.
    fn finish(mut self, bytes: &[u8], name: &std::path::Path) -> Result<(), String> {
        let mut f = self.file.take().expect("started");
        let named = std::io::Write::write_all(&mut f, bytes)
            .and_then(|()| f.sync_all())
            .and_then(|()| match std::fs::hard_link(&self.tmp, name) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists && !name.exists() => {
                    std::fs::rename(&self.tmp, name)
                }
                other => other,
            });
        named.map_err(|e| format!("--out {}: {e}", name.display()))
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}
