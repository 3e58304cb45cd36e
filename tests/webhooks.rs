//! Invariant 8, webhooks only hint: the simulated provider sends real webhooks to `jobtrail serve`
//! (Standard Webhooks and a plain HMAC header). A verified delivery makes the operation due for a
//! status read now; duplicates, replays, forgeries, stale timestamps and an early "succeeded" while
//! the job still runs change nothing else. Success is declared only from a status read and a
//! validated result.

mod support;

use jobtrail_core::State;
use jobtrail_sim::webhook::{Signing, Target};
use serde_json::json;
use std::time::{Duration, Instant};
use support::Env;

/// `sim.toml` with status reads far apart (20 s), so that only a webhook explains a quick finish.
async fn slow_polling_env(scheme: &str) -> Env {
    let mut edits = vec![
        ("sim.toml", "initial_ms = 200", "initial_ms = 20000"),
        ("sim.toml", "cap_ms = 2000", "cap_ms = 20000"),
    ];
    if scheme == "standard" {
        edits.push((
            "sim.toml",
            "signature = \"hmac-sha256\"\nsignature_header = \"X-Sim-Signature\"",
            "signature = \"standard-webhooks\"",
        ));
    }
    Env::with_edited_contracts(&edits).await
}

/// The simulator's deliveries to `server`, signed as `sim.toml` checks them by default.
fn hmac_target(server: &support::Server) -> Target {
    Target {
        url: server.url("/v1/webhooks/sim"),
        signing: Signing::Hmac {
            secret: support::WEBHOOK_SECRET.into(),
            header: "X-Sim-Signature".into(),
        },
    }
}

async fn rows(env: &Env) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT event_id, outcome FROM webhook_deliveries ORDER BY received_at, event_id",
    )
    .fetch_all(&sqlx::PgPool::connect(&env.url).await.unwrap())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_webhook_twice_a_forgery_and_a_stale_one_change_nothing_but_one_status_read() {
    let mut env = slow_polling_env("standard").await;
    let server = env.serve("api");
    env.sim.sim.set_webhook(Some(Target {
        url: server.url("/v1/webhooks/sim"),
        signing: Signing::Standard {
            secret: support::WEBHOOK_SECRET.into(),
        },
    }));
    env.start_worker("w1", Duration::from_secs(5));
    let started = Instant::now();
    let op = env
        .submit(
            "sim",
            json!({"duration_ms": 1500, "webhooks": {"duplicates": 2, "forged": true, "stale": true}}),
            |_| {},
        )
        .await;
    let done = env
        .wait_state(op.id, State::Succeeded, Duration::from_secs(15))
        .await;
    // Polling alone would have read the status 20 s after the first read: the webhook made it due.
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "finished after {:?}: the webhook did not schedule a status read",
        started.elapsed()
    );
    assert!(done.result_sha256.is_some());

    // Give the duplicates and the stale one time to arrive, then read what the provider saw.
    let job = done.remote_job_id.clone().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sent = loop {
        let l = env.sim.ledger();
        let mine: Vec<_> = l
            .webhooks
            .iter()
            .filter(|w| w.job_id == job)
            .cloned()
            .collect();
        if mine.len() >= 5 || Instant::now() > deadline {
            break mine;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let by_kind = |k: &str| -> Vec<Option<u16>> {
        sent.iter()
            .filter(|w| w.kind == k)
            .map(|w| w.status)
            .collect()
    };
    assert_eq!(by_kind("forged"), vec![Some(401)], "a forgery is refused");
    assert_eq!(by_kind("finish"), vec![Some(200)]);
    assert_eq!(
        by_kind("duplicate"),
        vec![Some(200), Some(200)],
        "duplicates are acknowledged"
    );
    assert_eq!(
        by_kind("stale"),
        vec![Some(401)],
        "a stale timestamp is refused"
    );
    // One row per event id ever accepted: the end announcement, once.
    let recorded = rows(&env).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].0, format!("evt_{job}_end"));
    // The history shows status reads and the result, nothing moved by a webhook.
    let h = env.store.history(op.id).await.unwrap();
    assert!(h.iter().all(|l| l.actor != "webhook"));
    assert!(env.store.verify_operation(op.id).await.unwrap().is_clean());
    env.stop_workers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_succeeded_webhook_while_the_job_runs_declares_nothing() {
    let mut env = slow_polling_env("hmac").await;
    let server = env.serve("api");
    env.sim.sim.set_webhook(Some(hmac_target(&server)));
    env.start_worker("w1", Duration::from_secs(5));
    let op = env
        .submit(
            "sim",
            json!({"duration_ms": 4000, "webhooks": {"early": true, "on_finish": false}}),
            |_| {},
        )
        .await;
    // The early delivery arrives right after create and says "succeeded"; the status read it
    // triggers says queued or running. The operation stays observing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = env.sim.ledger();
        if l.webhooks
            .iter()
            .any(|w| w.kind == "early" && w.status.is_some())
        {
            break;
        }
        assert!(Instant::now() < deadline, "no early webhook was delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let now = env.store.get(op.id).await.unwrap();
    assert!(
        matches!(now.state, State::Accepted | State::Observing),
        "an early webhook moved the state to {}",
        now.state
    );
    let remote = now.remote_state.as_deref().unwrap_or("queued");
    assert!(
        matches!(remote, "queued" | "running"),
        "remote state {remote}"
    );
    let early = env
        .sim
        .ledger()
        .webhooks
        .iter()
        .find(|w| w.kind == "early")
        .cloned()
        .unwrap();
    assert_eq!(early.status, Some(200));
    let h = env.store.history(op.id).await.unwrap();
    assert!(
        !h.iter()
            .any(|l| l.to_state == "succeeded" || l.to_state == "result_collecting")
    );
    env.stop_workers().await;
}

/// A provider (or whoever holds its secret) that sends "still running" under a new event id every
/// 25 ms: each delivery is recorded once, but status reads, each a call and a link kept for good,
/// come no closer than two seconds after the last one. Before, every delivery made the job due at
/// once and the worker read as fast as it could turn round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_webhooks_reads_the_status_no_faster_than_the_floor() {
    let mut env = slow_polling_env("hmac").await;
    // The secret as an env var from a Kubernetes Secret made from a file: with its line end. It is
    // trimmed as a file's is; signed with the newline, every delivery was refused.
    let with_line_end = format!("{}\n", support::WEBHOOK_SECRET);
    let server = env.serve_with("api", &[("JOBTRAIL_SIM_WEBHOOK_SECRET", &with_line_end)]);
    env.sim.sim.set_webhook(Some(hmac_target(&server)));
    env.start_worker("w1", Duration::from_secs(5));
    let started = Instant::now();
    let op = env
        .submit(
            "sim",
            json!({"duration_ms": 6000, "webhooks": {"flood": 200, "flood_every_ms": 25}}),
            |_| {},
        )
        .await;
    env.wait_state(op.id, State::Succeeded, Duration::from_secs(30))
        .await;
    let took = started.elapsed();
    // The end announcement still brings the read forward: polling alone would take 20 s.
    assert!(took < Duration::from_secs(15), "finished after {took:?}");
    // Every delivery answered (on a busy machine some may still be on their way at the finish).
    let deadline = Instant::now() + Duration::from_secs(30);
    let flooded = loop {
        let l = env.sim.ledger();
        let answered: Vec<_> = l
            .webhooks
            .iter()
            .filter(|w| w.kind == "progress" && w.status.is_some())
            .collect();
        if answered.len() >= 200 || Instant::now() > deadline {
            break answered.iter().filter(|w| w.status == Some(200)).count();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(flooded >= 100, "{flooded} deliveries accepted");
    let reads = env
        .store
        .calls(op.id)
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind == "status")
        .count();
    // One read per two seconds, until the job ended and since, and the one the end announcement
    // brings.
    let most = usize::try_from(started.elapsed().as_secs() / 2).unwrap() + 2;
    assert!(
        reads <= most,
        "{reads} status reads in {took:?} under {flooded} deliveries (at most {most})"
    );
    env.stop_workers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_deliveries_are_refused_before_anything_is_recorded() {
    let env = slow_polling_env("hmac").await;
    let server = env.serve("api");
    let c = support::http();
    let sign = |body: &str| {
        use hmac::{KeyInit, Mac};
        let mut m =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(support::WEBHOOK_SECRET.as_bytes()).unwrap();
        m.update(body.as_bytes());
        format!("sha256={}", hex::encode(m.finalize().into_bytes()))
    };
    let post = |path: &str, body: String, sig: Option<String>| {
        let mut r = c
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(s) = sig {
            r = r.header("X-Sim-Signature", s);
        }
        r.send()
    };
    let body =
        json!({"event_id": "evt_1", "job_id": "job_unknown", "state": "succeeded"}).to_string();
    // Unsigned, wrongly signed, signed for another body, an unknown provider.
    assert_eq!(
        post("/v1/webhooks/sim", body.clone(), None)
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post("/v1/webhooks/sim", body.clone(), Some("sha256=00".into()))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post("/v1/webhooks/sim", body.clone(), Some("zz".into()))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post("/v1/webhooks/sim", body.clone(), Some(sign("{}")))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post("/v1/webhooks/nobody", body.clone(), Some(sign(&body)))
            .await
            .unwrap()
            .status(),
        404
    );
    // A body far over the webhook limit is refused before it is buffered or verified.
    let huge = "x".repeat(2 * 1024 * 1024);
    // The server answers 413 and closes as soon as the declared length is over the limit; a
    // client still sending may see that as the connection closing under it instead (a race of
    // the two directions of one socket, seen under load). Either is the refusal; a timeout or any
    // other status is not.
    match post("/v1/webhooks/sim", huge, None).await {
        // ... and says it closes, so the client's next request takes a new connection.
        Ok(r) => {
            assert_eq!(r.status(), 413);
            assert_eq!(r.headers()["connection"], "close");
        }
        Err(e) => assert!(
            !e.is_timeout() && (e.is_request() || e.is_body()),
            "not a refusal: {e:?}"
        ),
    }
    assert!(
        rows(&env).await.is_empty(),
        "nothing recorded for a refused delivery"
    );
    // Signed but not a payload the contract describes: no event id, a huge id, a job id longer
    // than any jobtrail keeps or one that prints as another, not JSON.
    for b in [
        json!({"job_id": "j"}).to_string(),
        json!({"event_id": "e".repeat(500), "job_id": "j"}).to_string(),
        json!({"event_id": "e", "job_id": "j".repeat(8193)}).to_string(),
        json!({"event_id": "e", "job_id": "job\u{202e}1"}).to_string(),
        "not json".to_owned(),
        r#"{"event_id":"a","event_id":"b","job_id":"j"}"#.to_owned(),
    ] {
        let r = post("/v1/webhooks/sim", b.clone(), Some(sign(&b)))
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{b}");
    }
    assert!(rows(&env).await.is_empty());
    // A job id as long as an Azure resource path (or a job known by its URL) is one.
    let long = json!({
        "event_id": "evt_long",
        "job_id": format!("/subscriptions/{}/resourceGroups/rg/providers/Example.Jobs/jobs/1", "0".repeat(300)),
    })
    .to_string();
    let r = post("/v1/webhooks/sim", long.clone(), Some(sign(&long)))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sqlx::query("DELETE FROM webhook_deliveries")
        .execute(&sqlx::PgPool::connect(&env.url).await.unwrap())
        .await
        .unwrap();
    // Signed and about no operation of ours: acknowledged, recorded once, nothing scheduled.
    let r = post("/v1/webhooks/sim", body.clone(), Some(sign(&body)))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ack: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ack["outcome"], "no_operation");
    let r = post("/v1/webhooks/sim", body.clone(), Some(sign(&body)))
        .await
        .unwrap();
    let ack: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ack["outcome"], "duplicate");
    assert_eq!(
        rows(&env).await,
        vec![("evt_1".to_owned(), "no_operation".to_owned())]
    );
    // A delivery recorded is acknowledged, even when pruning old ones fails after it.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no'; END $$; \
         CREATE TRIGGER no_prune BEFORE DELETE ON webhook_deliveries EXECUTE FUNCTION refuse()",
    )
    .execute(&sqlx::PgPool::connect(&env.url).await.unwrap())
    .await
    .unwrap();
    let second = json!({"event_id": "evt_2", "job_id": "job_unknown"}).to_string();
    let r = post("/v1/webhooks/sim", second.clone(), Some(sign(&second)))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(rows(&env).await.len(), 2);
    // The secret never reaches the log.
    assert!(!server.log_text().contains(support::WEBHOOK_SECRET));
}

/// A webhook secret too short to prove anything (blank, a few bytes, a bare `whsec_`: a secret file
/// created empty, a chart value left unset) refuses every delivery (503, the server's fault, logged):
/// anyone could sign with it. And a Standard Webhooks timestamp of i64::MIN is a refusal, not a
/// panic in the library's arithmetic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_secret_too_short_to_prove_anything_refuses_every_delivery() {
    let c = support::http();
    let body =
        json!({"event_id": "evt_1", "job_id": "job_unknown", "state": "succeeded"}).to_string();
    let env = slow_polling_env("hmac").await;
    for key in ["   ", "short-key"] {
        let server = env.serve_with("api", &[("JOBTRAIL_SIM_WEBHOOK_SECRET", key)]);
        let sig = {
            use hmac::{KeyInit, Mac};
            let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
            m.update(body.as_bytes());
            format!("sha256={}", hex::encode(m.finalize().into_bytes()))
        };
        // Unsigned junk and junk signatures are refused alike: nothing could be checked.
        for signature in [None, Some("sha256=zz")] {
            let mut junk = c
                .post(server.url("/v1/webhooks/sim"))
                .header("content-type", "application/json");
            if let Some(s) = signature {
                junk = junk.header("X-Sim-Signature", s);
            }
            let junk = junk.body(body.clone()).send().await.unwrap();
            assert_eq!(junk.status(), 503, "{key:?} {signature:?}");
        }
        for _ in 0..3 {
            let r = c
                .post(server.url("/v1/webhooks/sim"))
                .header("content-type", "application/json")
                .header("X-Sim-Signature", &sig)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 503, "a delivery signed with {key:?}");
            // The sender is told to come later, not how long our secret is.
            let detail = r.json::<serde_json::Value>().await.unwrap()["detail"].to_string();
            assert!(
                !detail.contains("bytes") && !detail.contains("secret"),
                "{detail}"
            );
        }
        // Logged by the receiver (at most once a minute), not once per delivery.
        let log = server.log_text();
        assert_eq!(
            log.matches("webhook deliveries are refused").count(),
            1,
            "{log}"
        );
        assert!(!log.contains("request failed"), "{log}");
        let why = match key {
            "short-key" => "at least 16 are needed",
            _ => "the webhook secret is unavailable",
        };
        assert!(log.contains(why), "{log}");
    }
    assert!(rows(&env).await.is_empty(), "nothing recorded");

    let env = slow_polling_env("standard").await;
    let now = chrono::Utc::now().timestamp().to_string();
    let post = |server: &support::Server, ts: String| {
        c.post(server.url("/v1/webhooks/sim"))
            .header("content-type", "application/json")
            .header("webhook-id", "msg_1")
            .header("webhook-timestamp", ts)
            .header("webhook-signature", "v1,AAAA")
            .body(body.clone())
            .send()
    };
    let bare = env.serve_with("api", &[("JOBTRAIL_SIM_WEBHOOK_SECRET", "whsec_")]);
    assert_eq!(post(&bare, now.clone()).await.unwrap().status(), 503);
    drop(bare);
    let server = env.serve("api");
    for ts in [i64::MIN.to_string(), i64::MAX.to_string(), "soon".into()] {
        assert_eq!(
            post(&server, ts.clone()).await.unwrap().status(),
            401,
            "{ts}"
        );
    }
    assert_eq!(
        post(&server, now).await.unwrap().status(),
        401,
        "a wrong signature"
    );
    assert!(
        !server.log_text().contains("panicked"),
        "{}",
        server.log_text()
    );
    assert!(rows(&env).await.is_empty(), "nothing recorded");
}

/// A webhook request written by hand: `len` declared, from `from` (named by the trusted proxy's
/// `X-Forwarded-For`).
fn webhook_head(addr: &str, provider: &str, len: usize, from: &str) -> String {
    format!(
        "POST /v1/webhooks/{provider} HTTP/1.1\r\nHost: {addr}\r\nX-Forwarded-For: {from}\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
}

/// What a whole unsigned payload from `from` is answered (401 when read; 429 when no turn).
async fn unsigned(addr: &str, from: &str) -> u16 {
    support::raw_status(addr, &webhook_head(addr, "sim", 2, from), b"{}").await
}

/// A payload from `from` that stops after its first bytes, holding a turn: sent again until a
/// probe from the same address is refused (a probe that held the turn when it arrived let it be
/// read and answered). Returns the connection and when its payload began.
async fn stalled_from(addr: &str, from: &str) -> (tokio::net::TcpStream, Instant) {
    let mut stalled = [stall(addr, from).await];
    until_refused(addr, from, &mut stalled).await;
    let [stalled] = stalled;
    stalled
}

/// A payload from `from` that stops after its first bytes.
async fn stall(addr: &str, from: &str) -> (tokio::net::TcpStream, Instant) {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = webhook_head(addr, "sim", 1000, from);
    conn.write_all(format!("{head}{{\"event_id\":").as_bytes())
        .await
        .unwrap();
    (conn, Instant::now())
}

/// Probe from `from` until refused (at most 10 s), stalling again any of `stalled` that was read
/// and answered (it arrived while a probe held the turn it needed).
async fn until_refused(addr: &str, from: &str, stalled: &mut [(tokio::net::TcpStream, Instant)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = unsigned(addr, from).await;
        if status == 429 {
            return;
        }
        assert_eq!(status, 401);
        assert!(
            Instant::now() < deadline,
            "stalled payloads never held their turns"
        );
        for s in stalled.iter_mut() {
            if !matches!(s.0.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            {
                *s = stall(addr, from).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Anyone may send a webhook (its signature is checked once the payload is whole), so the server
/// reads one only for a provider that takes webhooks, at most 256 KiB (declared or sent), a
/// bounded number at once per provider and fewer per sending address, each within 10 s: a sender
/// that stops sending holds one turn; past its address's share, another delivery from it is
/// refused (429: the provider delivers again later) while another address's is read; past the
/// provider's bound every one is refused; the trickler is cut off and its turn given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anyone_may_send_a_webhook_but_few_payloads_arrive_at_once() {
    let env = Env::new().await;
    // Two for the provider, so one (a quarter, at least 1) per address; the test's requests come
    // through a "proxy" at 127.0.0.1 that names the client.
    let server = env.serve_with(
        "api",
        &[
            ("JOBTRAIL_WEBHOOK_BODIES_PER_PROVIDER", "2"),
            ("JOBTRAIL_TRUSTED_PROXIES", "127.0.0.1"),
        ],
    );
    let addr = server.base.trim_start_matches("http://").to_owned();
    let addr = addr.as_str();
    // Refused without waiting for the payload: no such provider, a length over 256 KiB.
    let from = "10.0.0.1";
    assert_eq!(
        support::raw_status(addr, &webhook_head(addr, "nosuch", 1_000_000, from), b"{").await,
        404
    );
    assert_eq!(
        support::raw_status(addr, &webhook_head(addr, "sim", 256 * 1024 + 1, from), b"{").await,
        413
    );
    // Sent, not declared: chunks running past 256 KiB.
    let chunked = format!(
        "POST /v1/webhooks/sim HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let chunk = format!("{:x}\r\n{}\r\n", 300_000, "a".repeat(300_000));
    assert_eq!(
        support::raw_status(addr, &chunked, chunk.as_bytes()).await,
        413
    );
    // A whole payload without a signature is read, and refused as unverified.
    assert_eq!(unsigned(addr, from).await, 401);

    // One address's share held: its next delivery is refused, another address's is read.
    let (mut first, since) = stalled_from(addr, "10.0.0.1").await;
    assert_eq!(
        unsigned(addr, "10.0.0.2").await,
        401,
        "another address held back"
    );
    // The provider's bound held (by two addresses): every delivery is refused.
    let (second, _) = stalled_from(addr, "10.0.0.2").await;
    assert_eq!(
        unsigned(addr, "10.0.0.3").await,
        429,
        "past the provider's bound"
    );

    // The trickler is answered 400 once 10 s have passed since it began, and its turn is free.
    let answer = support::status_line(&mut first, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        since.elapsed() >= Duration::from_secs(9),
        "cut off after {:?}, before its 10 s",
        since.elapsed()
    );
    assert_eq!(
        unsigned(addr, "10.0.0.1").await,
        401,
        "the turn was not given back"
    );
    drop(second);
}

/// Where addresses are not told apart (the rate per address off and no proxy trusted, as behind an
/// Ingress with the chart's defaults: every request has the Ingress's address), only the
/// provider's bound applies; a bound per address would be one bound for every sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_addresses_told_apart_only_the_providers_bound_applies() {
    let env = Env::new().await;
    let server = env.serve_with(
        "api",
        &[
            ("JOBTRAIL_WEBHOOK_BODIES_PER_PROVIDER", "2"),
            ("JOBTRAIL_RATE_PER_ADDRESS", "off"),
        ],
    );
    let addr = server.base.trim_start_matches("http://").to_owned();
    let addr = addr.as_str();
    // Both turns held (by one address): refused.
    let mut stalled = [stall(addr, "x").await, stall(addr, "x").await];
    until_refused(addr, "x", &mut stalled).await;
    // Both are being read, neither was refused: one address holds them both.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (s, _) in &stalled {
        assert!(
            matches!(s.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a payload from the one address was answered, not read"
        );
    }
    // One given back: the same address is read again, though it still holds the other.
    let [held, second] = stalled;
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while unsigned(addr, "x").await != 401 {
        assert!(
            Instant::now() < deadline,
            "one address was held to a share of the provider's turns"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        held.1.elapsed() < Duration::from_secs(9),
        "read only once the held payload ran out of time"
    );
    drop(held);
}

/// What a signed payload takes parsed is held against `--held-mib` beside its text, as a request
/// body's is: 200 KiB of tiny objects (some 14 MB parsed) is refused while another payload holds
/// its share, not built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_is_held_for_what_it_takes_parsed() {
    use tokio::io::AsyncWriteExt;
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_HELD_MIB", "1")]);
    let addr = server.base.trim_start_matches("http://").to_owned();
    // A payload declared at 250 KiB that stops after its first byte: its bytes are held.
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(format!("{}{{", webhook_head(&addr, "sim", 250 * 1024, "10.0.0.9")).as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = format!(
        r#"{{"event_id":"evt_parsed","job_id":"job_none","pad":[{}0]}}"#,
        r#"{"a":0},"#.repeat(200 * 1024 / 8)
    );
    let sig = {
        use hmac::{KeyInit, Mac};
        let mut m =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(support::WEBHOOK_SECRET.as_bytes()).unwrap();
        m.update(body.as_bytes());
        format!("sha256={}", hex::encode(m.finalize().into_bytes()))
    };
    let post = || {
        support::http()
            .post(server.url("/v1/webhooks/sim"))
            .header("content-type", "application/json")
            .header("X-Sim-Signature", &sig)
            .body(body.clone())
            .send()
    };
    let r = post().await.unwrap();
    assert_eq!(r.status(), 503, "{:?}", r.text().await);
    // Once the other payload has gone, the same delivery is taken.
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = post().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
