//! API tokens: created with a caller and scopes (the token is printed once; only its SHA-256 is
//! kept), listed, revoked.

use clap::Subcommand;
use jobtrail_console::shell::{self, CmdResult, exit, fail, print_json};
use jobtrail_service::auth;
use jobtrail_store::{NewToken, Store, TokenRecord};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum TokensCmd {
    /// Create a token for a caller. Printed once on stdout: store it in the agent's secret store.
    /// Or make the token yourself and hand it over on stdin (--token-stdin): then nothing secret is
    /// printed, for a one-off pod whose output the cluster's log pipeline keeps.
    #[command(
        after_help = "Examples:\n  jobtrail-admin tokens create --caller agent-7 --scopes submit,read,cancel --created-by alice\n  jobtrail-admin tokens create --caller alice --scopes read,decide --expires +30d --created-by alice\n  echo \"jtk_$(openssl rand -hex 32)\" | tee agent-7.token | jobtrail-admin tokens create --token-stdin --caller agent-7 --scopes submit,read --created-by alice\n\nScopes: submit, read, cancel (own operations); decide (operator: the escalation queue,\ndecisions, approval; with read, see every operation); audit (auditor: verify the evidence; with\nread, see every operation, not another caller's result bytes)."
    )]
    Create {
        /// The caller recorded for everything done with this token.
        #[arg(long)]
        caller: String,
        /// Comma-separated: submit, read, cancel, decide, audit.
        #[arg(long)]
        scopes: String,
        /// Who creates it (recorded).
        #[arg(long)]
        created_by: String,
        /// When it stops working (RFC 3339 or +30d), at least a minute ahead. Default: never (revoke
        /// it).
        #[arg(long)]
        expires: Option<String>,
        /// What it is for.
        #[arg(long)]
        note: Option<String>,
        /// Take the token from stdin's first line (`jtk_` and 64 random hex digits, as `openssl
        /// rand -hex 32` makes them) instead of making one: only its digest is stored, and the
        /// token is never printed.
        #[arg(long)]
        token_stdin: bool,
    },
    /// Every token: id, caller, scopes, status, created (when, by whom), note (never the token).
    List,
    /// Revoke a token at once: by the id `list` shows, or, for a leaked token whose id you do not
    /// know, by the token itself read from stdin (never an argument: process lists and shell
    /// history keep those).
    #[command(
        after_help = "Examples:\n  jobtrail-admin tokens revoke 0193a5c4-1f2e-7d3b-9a8c-5e6f7a8b9c0d --actor alice     (the id `tokens list` prints)\n  jobtrail-admin tokens revoke --token-stdin --actor alice < leaked.txt"
    )]
    Revoke {
        #[arg(
            required_unless_present = "token_stdin",
            conflicts_with = "token_stdin"
        )]
        id: Option<uuid::Uuid>,
        /// Read the token to revoke from stdin (its first line).
        #[arg(long)]
        token_stdin: bool,
        /// Who revokes it (recorded).
        #[arg(long)]
        actor: String,
    },
}

fn row(t: &TokenRecord) -> String {
    let status = match (&t.revoked_at, &t.expires_at) {
        (Some(at), _) => format!(
            "revoked {} by {}",
            at.format("%Y-%m-%d %H:%MZ"),
            jobtrail_console::visible::text(t.revoked_by.as_deref().unwrap_or("-"))
        ),
        (None, Some(e)) if *e <= chrono::Utc::now() => {
            format!("expired {}", e.format("%Y-%m-%d %H:%MZ"))
        }
        (None, Some(e)) => format!("live until {}", e.format("%Y-%m-%d %H:%MZ")),
        (None, None) => "live".into(),
    };
    format!(
        "{}  {:<16} {:<28} {:<36} created {} by {}{}",
        t.id,
        jobtrail_console::visible::text(&t.caller),
        t.scopes.join(","),
        status,
        t.created_at.format("%Y-%m-%d %H:%MZ"),
        jobtrail_console::visible::text(&t.created_by),
        t.note
            .as_deref()
            .map(|n| format!(": {}", jobtrail_console::visible::text(n)))
            .unwrap_or_default()
    )
}

/// The token on stdin's first line (at most a line's worth is read: `/dev/zero` is no token).
fn token_from_stdin() -> Result<String, shell::Failure> {
    use std::io::{BufRead, IsTerminal, Read};
    // Typed at a terminal, the secret would be echoed on the screen (and kept by its scrollback).
    if std::io::stdin().is_terminal() {
        return Err(fail(
            exit::BAD_INPUT,
            "--token-stdin reads the token from a pipe, not a terminal (where it would be echoed): pipe it in, e.g. from a secrets manager or a file",
        ));
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .take(1024)
        .read_line(&mut line)
        .map_err(|e| fail(exit::BAD_INPUT, format!("stdin: {e}")))?;
    let token = line.trim();
    if !auth::token_shaped(token) {
        // Never echoed: it may be a secret pasted in the wrong place.
        return Err(fail(
            exit::BAD_INPUT,
            "--token-stdin: stdin's first line is no jobtrail token (jtk_ and 64 hex digits)",
        ));
    }
    Ok(token.to_owned())
}

/// A token the operator made, from stdin: shaped as jobtrail's own, and not obviously made up
/// (256 random bits written in hex use nearly all sixteen digits; `jtk_` and `ab` thirty-two times
/// would be guessed).
fn token_made_by_hand() -> Result<String, shell::Failure> {
    let token = token_from_stdin()?;
    // Lowercase only, as jobtrail and `openssl rand -hex` write them: the digest is of the text,
    // and a revoked token written in capitals must not come back as a new one.
    if token.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(fail(
            exit::BAD_INPUT,
            "--token-stdin: write the token's hex digits in lowercase (as openssl rand -hex 32 does)",
        ));
    }
    let digits: std::collections::BTreeSet<u8> = token[auth::TOKEN_PREFIX.len()..]
        .bytes()
        .map(|b| b.to_ascii_lowercase())
        .collect();
    if digits.len() < 10 {
        return Err(fail(
            exit::BAD_INPUT,
            "--token-stdin: that token is not random (make one with: echo \"jtk_$(openssl rand -hex 32)\")",
        ));
    }
    Ok(token)
}

pub async fn run(store: &Store, what: TokensCmd, json: bool) -> CmdResult {
    match what {
        TokensCmd::Create {
            caller,
            scopes,
            created_by,
            expires,
            note,
            token_stdin,
        } => {
            let caller = jobtrail_core::text::TOKEN_CALLER
                .check(&caller)
                .map_err(|e| fail(exit::BAD_INPUT, e))?;
            let caller = caller.as_str();
            // Checked here, not left to the database's constraint (whose refusal read as the
            // database being unavailable, exit 5).
            let note = note
                .as_deref()
                .filter(|n| !n.trim().is_empty())
                .map(|n| jobtrail_core::text::TOKEN_NOTE.check(n))
                .transpose()
                .map_err(|e| fail(exit::BAD_INPUT, e))?;
            let created_by = shell::actor("--created-by", &created_by)?;
            let scopes = auth::parse_scopes(&scopes)
                .map_err(|e| fail(exit::BAD_INPUT, format!("--scopes: {e}")))?;
            let expires_at = expires
                .as_deref()
                .map(|e| {
                    jobtrail_core::when::parse_future_at(e, chrono::Utc::now())
                        .map_err(|m| fail(exit::BAD_INPUT, format!("--expires: {m}")))
                })
                .transpose()?;
            let given = token_stdin.then(token_made_by_hand).transpose()?;
            let (token, sha256) = match &given {
                Some(t) => (String::new(), auth::token_digest(t)),
                None => auth::new_token().map_err(|e| fail(e.kind.exit_code(), e.message))?,
            };
            let names: Vec<String> = scopes.iter().map(|s| s.as_str().to_owned()).collect();
            let rec = store
                .insert_token(&NewToken {
                    caller,
                    scopes: &names,
                    sha256,
                    note: note.as_deref(),
                    created_by: &created_by,
                    expires_at,
                })
                .await?;
            if given.is_some() {
                if json {
                    print_json(&serde_json::json!({ "record": rec }));
                } else {
                    println!("{}", rec.id);
                    eprintln!(
                        "token {} for caller {} with scopes {}: the token you gave is live (only its digest is stored)",
                        rec.id,
                        jobtrail_console::visible::text(&rec.caller),
                        rec.scopes.join(",")
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            // Shown once: a token that could not be written out (a full disk, a closed pipe)
            // would be live with nobody holding it, so it is revoked and the command fails.
            let shown = if json {
                serde_json::to_string_pretty(&serde_json::json!({ "token": token, "record": rec }))
                    .unwrap_or_default()
            } else {
                token.to_string()
            };
            if let Err(e) = {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                writeln!(out, "{shown}").and_then(|()| out.flush())
            } {
                store.revoke_token(rec.id, &created_by).await?;
                return Err(fail(
                    exit::UNAVAILABLE,
                    format!(
                        "the token could not be written out ({e}): token {} is revoked; create another",
                        rec.id
                    ),
                ));
            }
            if !json {
                eprintln!(
                    "token {} for caller {} with scopes {}: shown once, keep it in a secret store",
                    rec.id,
                    rec.caller,
                    rec.scopes.join(",")
                );
            }
        }
        TokensCmd::List => {
            let all = store.tokens().await?;
            if json {
                print_json(&all);
            } else if all.is_empty() {
                println!("no tokens (jobtrail-admin tokens create)");
            } else {
                for t in &all {
                    println!("{}", row(t));
                }
            }
        }
        TokensCmd::Revoke {
            id,
            token_stdin,
            actor,
        } => {
            let actor = shell::actor("--actor", &actor)?;
            let t = match id {
                Some(id) if !token_stdin => store
                    .revoke_token(id, &actor)
                    .await?
                    .ok_or_else(|| fail(exit::NOT_FOUND, format!("no token {id}")))?,
                _ => {
                    let token = token_from_stdin()?;
                    store
                        .revoke_token_by_digest(&auth::token_digest(&token), &actor)
                        .await?
                        .ok_or_else(|| fail(exit::NOT_FOUND, "no token is that one"))?
                }
            };
            if json {
                print_json(&t);
            } else {
                println!("{}", row(&t));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
