//! README.md's "Using it" block, run as written on this machine: the one change is that the
//! binaries come from this build instead of `cargo install` (the first line), and the simulator
//! listens on a free port instead of 8700 (the contract's base URL is pointed at it through its
//! documented override), so the test cannot collide with anything already running.

use std::process::{Command, Stdio};
use std::time::Duration;

fn using_it_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let section = readme
        .split("## Using it\n")
        .nth(1)
        .expect("a 'Using it' section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a sh block in 'Using it'");
    block.to_owned()
}

#[test]
fn the_readme_using_it_section_runs_as_written() {
    let block = using_it_block();
    let first = block.lines().next().unwrap();
    assert!(first.starts_with("cargo install"), "{first}");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_jobtrail"))
        .parent()
        .unwrap()
        .to_path_buf();
    for b in ["jobtrail", "jobtrail-sim", "jobtrail-admin"] {
        assert!(
            bin_dir.join(b).exists(),
            "{b} is not built in {}: build the workspace (cargo test --workspace)",
            bin_dir.display()
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = block
        .replacen(first, "", 1)
        .replace("127.0.0.1:8700", &format!("127.0.0.1:{port}"));
    assert!(script.contains("jobtrail dev-db"));

    // A `+` in the directory and JOBTRAIL_PGDATA relative to it, as a careless setup has them: the
    // URL `dev-db` prints must still name the socket (a `+` read as a space, a relative directory
    // PostgreSQL reads from inside its data directory, were a cluster nothing could reach).
    let work = std::env::temp_dir().join(format!("jobtrail-readme+{}", std::process::id()));
    let pgdata = work.join("pg");
    std::fs::create_dir_all(&work).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args(["300", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(&work)
        .env("PATH", path)
        .env("JOBTRAIL_PGDATA", "pg")
        .env(
            "JOBTRAIL_PROVIDERS",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers"),
        )
        .env(
            "JOBTRAIL_PROVIDER_SIM_BASE_URL",
            format!("http://127.0.0.1:{port}"),
        )
        .env_remove("DATABASE_URL")
        .env_remove("JOBTRAIL_API")
        .env_remove("JOBTRAIL_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Stop the private cluster the block started, whatever happened.
    let stopped = jobtrail_store::cluster::Cluster::persistent_at(&pgdata).and_then(|c| c.stop());
    assert!(
        out.status.success(),
        "the block failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stopped.expect("the private cluster stops");
    // What the block promises: an id printed, the operation shown, a validated result on disk.
    assert!(stdout.lines().any(|l| l.starts_with("op_")), "{stdout}");
    assert!(stdout.contains("succeeded"), "{stdout}");
    // The second operation ended cancelled (the provider confirmed), and wait said so with exit 1.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("op_") && l.contains(" cancelled")),
        "{stdout}"
    );
    assert!(stdout.contains("wait: exit 1"), "{stdout}");
    let report = std::fs::read(work.join("report.json")).expect("report.json written");
    assert!(!report.is_empty());
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_dir_all(&work).unwrap();
}

/// Each binary's `--help` names every exit code README.md's table (or line) for it names: a
/// script reading `--help` must not meet a code it was never told of.
#[test]
fn every_exit_code_the_readme_names_is_in_the_help() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let table = readme
        .split("### Exit codes (`jobtrail`)\n")
        .nth(1)
        .expect("the exit code table");
    let cli_codes: Vec<&str> = table
        .lines()
        .skip(3)
        .take_while(|l| l.starts_with("| "))
        .filter_map(|l| l.split(" | ").next()?.strip_prefix("| "))
        .collect();
    assert!(cli_codes.contains(&"9"), "{cli_codes:?}");
    let admin_line = readme
        .split("`jobtrail-admin` exit codes: ")
        .nth(1)
        .and_then(|r| r.split("\n\n").next())
        .expect("the admin exit code line");
    let admin_codes: Vec<String> = admin_line
        .split([';', ':'])
        .filter_map(|part| {
            let n = part.split_whitespace().next()?;
            (n.len() == 1 && n.chars().all(|c| c.is_ascii_digit())).then(|| n.to_owned())
        })
        .collect();
    assert!(admin_codes.contains(&"8".to_owned()), "{admin_codes:?}");
    for (bin, codes) in [
        (
            env!("CARGO_BIN_EXE_jobtrail"),
            cli_codes.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        ),
        (
            concat!(env!("CARGO_BIN_EXE_jobtrail"), "-admin"),
            admin_codes,
        ),
    ] {
        let out = Command::new(bin)
            .arg("--help")
            .output()
            .expect("run --help");
        let help = String::from_utf8(out.stdout).unwrap();
        for code in codes {
            assert!(
                help.contains(&format!("\n  {code}  ")),
                "{bin} --help does not name exit code {code}:\n{help}"
            );
        }
    }
}
