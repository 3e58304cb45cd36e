//! The `jobtrail-sim` binary as the README runs it: it refuses a token variable that is not set,
//! serves jobs and its ledger on the address it prints, and stops on SIGTERM (a container runtime's
//! stop) as on Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_token_variable_that_is_not_set_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--token-env",
            "JOBTRAIL_SIM_TEST_UNSET",
        ])
        .env_remove("JOBTRAIL_SIM_TEST_UNSET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JOBTRAIL_SIM_TEST_UNSET"));
}

#[test]
fn it_serves_on_the_address_it_prints_asks_for_the_token_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_jobtrail-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--token-env",
            "JOBTRAIL_SIM_TEST_TOKEN",
        ])
        .env("JOBTRAIL_SIM_TEST_TOKEN", "test-token-not-a-secret")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .split("listening on ")
        .nth(1)
        .expect("the address is printed")
        .trim()
        .to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let without = http.post(format!("{base}/v1/jobs")).send().await.unwrap();
        assert_eq!(without.status().as_u16(), 401);
        let ledger = http
            .get(format!("{base}/_sim/ledger"))
            .send()
            .await
            .unwrap();
        assert!(ledger.status().is_success());
        let ledger: serde_json::Value = ledger.json().await.unwrap();
        assert_eq!(ledger["unauthorized"], 1, "{ledger}");
    });
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "jobtrail-sim ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}
