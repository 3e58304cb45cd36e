//! jobtrail-admin against a real PostgreSQL: the escalation queue, every decision path, refusals,
//! tamper detection (edits, deletions, out-of-order inserts, a whole operation deleted after an
//! anchor), and the read-only auditor role running every documented query.

use jobtrail_core::*;
use jobtrail_store::testing::TestDb;
use jobtrail_store::{OperationRecord, Step, Store};
use sqlx::Connection;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

fn terms() -> BTreeMap<String, ProviderTerms> {
    let mut m = BTreeMap::new();
    m.insert(
        "sim".to_string(),
        ProviderTerms::new("sim", IdempotencyMode::Header),
    );
    m
}

async fn submit(store: &Store, n: u32) -> OperationRecord {
    let s = Submission {
        provider: "sim".into(),
        target: "reports".into(),
        body: format!(r#"{{"n":{n}}}"#).into_bytes(),
        caller: "agent-7".into(),
        approved_by: "alice".into(),
        approval_ref: Some("CHG-1".into()),
        ..Default::default()
    };
    store
        .submit_new(&s, &terms(), SubmitLimits::default())
        .await
        .unwrap()
        .operation
}

/// Drive a fresh operation through `events` under one lease, as a worker would.
async fn driven(store: &Store, n: u32, events: Vec<Event>) -> OperationRecord {
    let op = submit(store, n).await;
    let mut claimed = None;
    for _ in 0..100 {
        // Other operations may be due (a decision made them so): put them back for later.
        for c in store
            .claim_due("setup-worker", 10, Duration::from_secs(60))
            .await
            .unwrap()
        {
            if c.lease.operation_id == op.id {
                claimed = Some(c);
            } else {
                store
                    .release(&c.lease, std::time::Duration::from_secs(3600), "test")
                    .await
                    .unwrap();
            }
        }
        if claimed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = claimed.expect("claimed");
    let last = events.len();
    for (i, e) in events.into_iter().enumerate() {
        let mut step = Step::event(e).next_in(Duration::from_secs(3600), "test");
        step.keep_lease = i + 1 < last;
        store.apply(&c.lease, step).await.unwrap();
    }
    store.get(op.id).await.unwrap()
}

fn accepted(job: &str) -> Event {
    Event::CreateAccepted {
        remote_job_id: job.into(),
        remote_state: Some("queued".into()),
    }
}

async fn unresolved(store: &Store, n: u32) -> OperationRecord {
    driven(
        store,
        n,
        vec![
            Event::CreateAmbiguous {
                error_class: "timeout".into(),
            },
            Event::ReconciliationStarted {
                method: "resend".into(),
            },
            Event::ReconciliationExhausted {
                why: "create deadline passed".into(),
            },
        ],
    )
    .await
}

async fn violation(store: &Store, n: u32) -> OperationRecord {
    driven(
        store,
        n,
        vec![
            accepted("job_a"),
            Event::ContractViolated {
                recorded_job_id: "job_a".into(),
                other_job_id: "job_b".into(),
            },
        ],
    )
    .await
}

async fn unconfirmed(store: &Store, n: u32) -> OperationRecord {
    driven(
        store,
        n,
        vec![
            accepted(&format!("job_c{n}")),
            Event::CancelRequested(CancelRequest::new("bob", "budget").unwrap()),
            Event::CancelSent {
                http_status: Some(202),
            },
            Event::CancelDeadlinePassed,
        ],
    )
    .await
}

async fn timed_out(store: &Store, n: u32) -> OperationRecord {
    driven(
        store,
        n,
        vec![
            accepted(&format!("job_d{n}")),
            Event::RemoteProgress {
                remote_state: "running".into(),
                known: true,
            },
            Event::ResultDeadlinePassed,
        ],
    )
    .await
}

fn admin(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env(
            "JOBTRAIL_PROVIDERS",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers"),
        )
        .output()
        .unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

async fn exec(db: &TestDb, sql: &str) {
    try_exec(db, sql).await.unwrap();
}

/// Run `sql` (statements, maybe a `SET ROLE` first) on a connection of its own.
async fn try_exec(db: &TestDb, sql: &str) -> Result<(), sqlx::Error> {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
        .map(|_| ())
}

#[tokio::test]
async fn escalations_list_exactly_the_operations_that_need_a_person() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let held = [
        unresolved(&store, 1).await,
        violation(&store, 2).await,
        unconfirmed(&store, 3).await,
        timed_out(&store, 4).await,
    ];
    driven(
        &store,
        5,
        vec![
            accepted("job_e"),
            Event::RemoteProgress {
                remote_state: "running".into(),
                known: true,
            },
        ],
    )
    .await;
    driven(
        &store,
        6,
        vec![Event::CreateRejected {
            http_status: Some(422),
            reason: "bad".into(),
        }],
    )
    .await;

    let out = admin(&db, &["escalations", "--json"]);
    assert_eq!(code(&out), 0);
    let list = json(&out);
    let ids: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["operation_id"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = held.iter().map(|o| o.id.to_string()).collect();
    assert_eq!(ids, want, "exactly the held operations, oldest first");
    for (e, op) in list.as_array().unwrap().iter().zip(&held) {
        assert_eq!(e["state"], op.state.as_str());
        assert!(e["reason"].as_str().is_some_and(|r| !r.is_empty()));
        assert_eq!(e["trace_id"], op.trace_id.to_string());
        assert_eq!(
            e["caller"],
            op.caller.as_str(),
            "--caller's help says each names it"
        );
        assert_eq!(
            e["seen"],
            format!(
                "{}@{}:{}",
                op.state,
                op.history_seq,
                &hex::encode(&op.history_head)[..8]
            )
        );
        assert!(!e["decisions"].as_array().unwrap().is_empty());
    }
    assert_eq!(list[1]["conflicting_remote_job_id"], "job_b");
    // A listing is bounded (the API and this binary show the oldest 500 and say there are more),
    // and never loads request bodies.
    let first_two = store.escalations(None, None, None, 2).await.unwrap();
    let first_two_ids: Vec<String> = first_two.iter().map(|o| o.id.to_string()).collect();
    assert_eq!(first_two_ids, want[..2]);
    assert!(first_two.iter().all(|o| o.request_body.is_null()));
    let filtered = json(&admin(
        &db,
        &["escalations", "--state", "result_timed_out", "--json"],
    ));
    assert_eq!(filtered.as_array().unwrap().len(), 1);
    assert_eq!(
        code(&admin(&db, &["escalations", "--state", "observing"])),
        2
    );
    let human = admin(&db, &["escalations"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("4 operation(s) wait for a person"));
    // One caller's at a time (an agent whose deadlines were too short for its jobs can fill the
    // queue).
    let theirs = json(&admin(
        &db,
        &["escalations", "--caller", "agent-7", "--json"],
    ));
    assert_eq!(theirs.as_array().unwrap().len(), 4);
    let none = admin(&db, &["escalations", "--caller", "agent-8"]);
    let said = String::from_utf8_lossy(&none.stdout);
    assert!(said.contains("no held operation of caller"), "{said}");
    // A filter that matches nothing (a misspelt provider) is not "the queue is empty".
    let none = admin(&db, &["escalations", "--provider", "sim-csvv"]);
    let said = String::from_utf8_lossy(&none.stdout);
    assert!(
        said.contains("no held operation for provider \"sim-csvv\"") && !said.contains("empty"),
        "{said}"
    );
}

#[tokio::test]
async fn each_decision_moves_the_operation_and_records_who_and_why() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let check = |op: &OperationRecord, args: &[&str], want: State| {
        let out = admin(&db, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 0, "{args:?}: {err}");
        // A bare state is taken with a warning (only the state is compared); STATE@SEQ without.
        let bare = args
            .windows(2)
            .any(|w| w[0] == "--seen" && !w[1].contains('@'));
        assert_eq!(
            err.contains("checked only the state"),
            bare,
            "{args:?}: {err}"
        );
        (op.id, want)
    };
    let last = |store: Store, id: OperationId| async move {
        store.history(id).await.unwrap().pop().unwrap()
    };

    let a = unresolved(&store, 1).await;
    // A job id pasted with what prints as nothing, a line break, or a page of text: refused,
    // nothing written (it would be kept for good and polled at as a job that does not exist).
    let long = "j".repeat(9000);
    for pasted in [
        "job_\u{200b}found",
        "job_found\njob_other",
        "..",
        long.as_str(),
    ] {
        let seen = format!("create_unresolved@{}", a.history_seq);
        let out = admin(
            &db,
            &[
                "adopt",
                &a.id.to_string(),
                "--job-id",
                pasted,
                "--seen",
                &seen,
                "--actor",
                "alice",
                "--reason",
                "r",
            ],
        );
        assert_eq!(
            code(&out),
            2,
            "{pasted:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        store.history(a.id).await.unwrap().len() as i64,
        a.history_seq
    );
    // A lease's owner is a row's text, which a writer login sets: the refusal naming it shows an
    // escape in it as text (it could erase the refusal's line and print a forged "recorded").
    let leased = unresolved(&store, 43).await;
    exec(
        &db,
        &format!(
            "UPDATE operations SET lease_owner = E'\\x1b[2K\\rforged', lease_expires_at = now() + interval '1 hour' WHERE id = '{}'",
            leased.id.as_uuid()
        ),
    )
    .await;
    let out = admin(
        &db,
        &[
            "adopt",
            &leased.id.to_string(),
            "--job-id",
            "job_found",
            "--seen",
            &format!("create_unresolved@{}", leased.history_seq),
            "--actor",
            "alice",
            "--reason",
            "r",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 4, "{err:?}");
    assert!(
        err.contains("holds") && err.contains("\\u{1b}[2K\\rforged") && !err.contains('\u{1b}'),
        "{err:?}"
    );
    let (id, want) = check(
        &a,
        &[
            "adopt",
            &a.id.to_string(),
            "--job-id",
            "job_found",
            "--seen",
            &format!("create_unresolved@{}", a.history_seq),
            "--actor",
            "alice",
            "--reason",
            "found it in the console",
        ],
        State::Observing,
    );
    let now = store.get(id).await.unwrap();
    assert_eq!(
        (now.state, now.remote_job_id.as_deref()),
        (want, Some("job_found"))
    );
    assert!(now.escalated_at.is_none());
    let h = last(store.clone(), id).await;
    assert_eq!(
        (h.actor.as_str(), h.event.as_str()),
        ("alice", "adopt_remote_job")
    );
    assert_eq!(h.detail["decision"]["reason"], "found it in the console");
    // A job named by a URL that carries a capability is recorded as the provider's answer would
    // be: the token blanked (never on the record), the same job the same id.
    let u = unresolved(&store, 41).await;
    let out = admin(
        &db,
        &[
            "adopt",
            &u.id.to_string(),
            "--job-id",
            "https://jobs.test/v1/jobs/7?access_token=tok-pasted-1",
            "--seen",
            &format!("create_unresolved@{}", u.history_seq),
            "--actor",
            "alice",
            "--reason",
            "the console's link",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let job = store.get(u.id).await.unwrap().remote_job_id.unwrap();
    assert_eq!(
        job,
        jobtrail_provider::wire::recorded_job_id(
            "https://jobs.test/v1/jobs/7?access_token=tok-pasted-1".into()
        )
    );
    let kept = format!("{job} {:?}", store.history(u.id).await.unwrap());
    assert!(!kept.contains("tok-pasted-1"), "the token is on the record");

    let b = unresolved(&store, 2).await;
    check(
        &b,
        &[
            "declare-not-created",
            &b.id.to_string(),
            "--seen",
            &format!("create_unresolved@{}", b.history_seq),
            "--actor",
            "alice",
            "--reason",
            "provider support: no such request",
        ],
        State::NotCreated,
    );
    assert_eq!(store.get(b.id).await.unwrap().state, State::NotCreated);
    // …after which a new, linked operation may be submitted.
    let out = admin(
        &db,
        &[
            "retry",
            &b.id.to_string(),
            "--seen",
            "not_created",
            "--actor",
            "alice",
            "--reason",
            "never reached them",
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let new_id: OperationId = json(&out)["operation_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (old, new) = (
        store.get(b.id).await.unwrap(),
        store.get(new_id).await.unwrap(),
    );
    assert_eq!(old.superseded_by, Some(new_id));
    assert_eq!(new.supersedes, Some(b.id));
    assert_ne!(
        old.token, new.token,
        "a retry is a new operation with a new token"
    );
    assert_eq!(old.fingerprint, new.fingerprint, "same request");
    assert_eq!(
        (&new.approved_by, &new.approval_ref),
        (&old.approved_by, &old.approval_ref),
        "no job ran: the retry is the run the original approval approved"
    );
    assert_eq!(old.state, State::NotCreated, "terminal states never change");
    assert_eq!(last(store.clone(), b.id).await.event, "superseded");

    // An edited request is the retrying person's: they are recorded as its approver, not the
    // person who approved the original request.
    let e = unresolved(&store, 9).await;
    check(
        &e,
        &[
            "declare-not-created",
            &e.id.to_string(),
            "--seen",
            &format!("create_unresolved@{}", e.history_seq),
            "--actor",
            "alice",
            "--reason",
            "no such request",
        ],
        State::NotCreated,
    );
    let mut edited_body = store.get(e.id).await.unwrap().request_body;
    edited_body["note"] = serde_json::json!("corrected");
    let edited_file = std::env::temp_dir().join(format!("jobtrail-retry-{}.json", e.id));
    std::fs::write(&edited_file, edited_body.to_string()).unwrap();
    let out = admin(
        &db,
        &[
            "retry",
            &e.id.to_string(),
            "--body",
            edited_file.to_str().unwrap(),
            "--seen",
            "not_created",
            "--actor",
            "carol",
            "--reason",
            "corrected the request",
            "--json",
        ],
    );
    let _ = std::fs::remove_file(&edited_file);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // A body without end is refused at the largest a request may be, not read until memory runs
    // out; a missing file is bad input before any database is looked for.
    for (body, says) in [
        ("/dev/zero", "larger than"),
        ("/nonexistent/body.json", "No such file"),
    ] {
        let refused = std::process::Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
            .args([
                "retry",
                &e.id.to_string(),
                "--body",
                body,
                "--seen",
                "not_created",
                "--actor",
                "carol",
                "--reason",
                "r",
            ])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(code(&refused), 2, "{body}: {err}");
        assert!(err.contains(says), "{body}: {err}");
    }
    let edited: OperationId = json(&out)["operation_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (was, now) = (
        store.get(e.id).await.unwrap(),
        store.get(edited).await.unwrap(),
    );
    assert_ne!(was.fingerprint, now.fingerprint);
    assert_ne!(was.approved_by, "carol");
    assert_eq!(now.approved_by, "carol");
    assert_eq!(now.approval_ref, None);

    // After a job ran, the same request again is a new paid run: approved by whoever retries it,
    // never recorded under the original approval.
    let done = succeeded_with_result(&store, 10, br#"{"items":[10]}"#).await;
    let out = admin(
        &db,
        &[
            "retry",
            &done.id.to_string(),
            "--seen",
            &format!("succeeded@{}", done.history_seq),
            "--actor",
            "dave",
            "--reason",
            "run it again for the new quarter",
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let rerun: OperationId = json(&out)["operation_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let rerun = store.get(rerun).await.unwrap();
    assert_eq!(rerun.fingerprint, done.fingerprint, "the same request");
    assert_eq!(
        (rerun.approved_by.as_str(), rerun.approval_ref.as_deref()),
        ("dave", None)
    );

    let c = unconfirmed(&store, 3).await;
    check(
        &c,
        &[
            "confirm-cancel",
            &c.id.to_string(),
            "--evidence",
            "ticket 4411",
            "--seen",
            "cancellation_unconfirmed",
            "--actor",
            "bob",
            "--reason",
            "support confirmed",
        ],
        State::Cancelled,
    );
    assert_eq!(store.get(c.id).await.unwrap().state, State::Cancelled);

    let v = violation(&store, 4).await;
    assert_eq!(
        code(&admin(
            &db,
            &[
                "choose-job",
                &v.id.to_string(),
                "--job-id",
                "job_zzz",
                "--seen",
                "contract_violation",
                "--actor",
                "alice",
                "--reason",
                "x"
            ]
        )),
        2,
        "only one of the provider's answers"
    );
    check(
        &v,
        &[
            "choose-job",
            &v.id.to_string(),
            "--job-id",
            "job_b",
            "--seen",
            "contract_violation",
            "--actor",
            "alice",
            "--reason",
            "job_a was their duplicate",
        ],
        State::Observing,
    );
    let now = store.get(v.id).await.unwrap();
    assert_eq!(
        (
            now.state,
            now.remote_job_id.as_deref(),
            now.conflicting_remote_job_id.as_deref()
        ),
        (State::Observing, Some("job_b"), Some("job_a")),
        "both answers are still kept"
    );

    let t = timed_out(&store, 5).await;
    assert_eq!(
        code(&admin(
            &db,
            &[
                "resume",
                &t.id.to_string(),
                "--seen",
                "result_timed_out",
                "--actor",
                "alice",
                "--reason",
                "x"
            ]
        )),
        2,
        "resume needs a new deadline"
    );
    // A deadline a typo away from now (`+5ms` meant `+5m`) would pass before anyone saw the
    // decision's effect: refused, nothing written.
    let out = admin(
        &db,
        &[
            "resume",
            &t.id.to_string(),
            "--result-deadline",
            "+5ms",
            "--seen",
            "result_timed_out",
            "--actor",
            "alice",
            "--reason",
            "x",
        ],
    );
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("less than a minute"));
    assert_eq!(
        store.get(t.id).await.unwrap().history_seq,
        t.history_seq,
        "nothing written"
    );
    check(
        &t,
        &[
            "resume",
            &t.id.to_string(),
            "--result-deadline",
            "+2h",
            "--seen",
            "result_timed_out",
            "--actor",
            "alice",
            "--reason",
            "provider is slow today",
        ],
        State::Observing,
    );
    let now = store.get(t.id).await.unwrap();
    assert_eq!(now.state, State::Observing);
    assert!(now.result_deadline > chrono::Utc::now() + chrono::Duration::minutes(100));
    assert!(now.next_action_at <= chrono::Utc::now(), "due at once");

    let t2 = timed_out(&store, 6).await;
    // Held for a person, a cancel is a decision like the others: on a named view only.
    let cancel = |seen: Option<&str>| {
        let id = t2.id.to_string();
        let mut args = vec![
            "cancel",
            &id,
            "--actor",
            "bob",
            "--reason",
            "no longer needed",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        if let Some(s) = seen {
            args.extend(["--seen".to_owned(), s.to_owned()]);
        }
        admin(&db, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let before = store.get(t2.id).await.unwrap();
    let blind = cancel(None);
    assert_eq!(
        code(&blind),
        4,
        "{}",
        String::from_utf8_lossy(&blind.stderr)
    );
    assert!(String::from_utf8_lossy(&blind.stderr).contains("--seen"));
    // A bare state names no view (the operation may have been resumed and come back since):
    // refused, nothing written.
    let bare = cancel(Some("result_timed_out"));
    let said = String::from_utf8_lossy(&bare.stderr);
    assert_eq!(code(&bare), 4, "{said}");
    assert!(said.contains("a bare state names no view"), "{said}");
    // The refusal alone: no warning that the bare state was checked, as if it had been taken.
    assert!(!said.contains("warning"), "{said}");
    assert_eq!(
        store.get(t2.id).await.unwrap().history_seq,
        before.history_seq,
        "nothing written"
    );
    // A view that is out of date (another person resumed it, and a status read came in, since):
    // refused, nothing written.
    let stale = format!("result_timed_out@{}", before.history_seq - 1);
    let refused = cancel(Some(&stale));
    assert_eq!(
        code(&refused),
        4,
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        store.get(t2.id).await.unwrap().history_seq,
        before.history_seq,
        "nothing written"
    );
    let seen = format!("result_timed_out@{}", before.history_seq);
    check(
        &t2,
        &[
            "cancel",
            &t2.id.to_string(),
            "--seen",
            &seen,
            "--actor",
            "bob",
            "--reason",
            "no longer needed",
        ],
        State::CancelRequested,
    );
    assert_eq!(
        store.get(t2.id).await.unwrap().state,
        State::CancelRequested
    );

    let u = unconfirmed(&store, 7).await;
    check(
        &u,
        &[
            "abandon",
            &u.id.to_string(),
            "--seen",
            "cancellation_unconfirmed",
            "--actor",
            "carol",
            "--reason",
            "written off",
        ],
        State::Abandoned,
    );
    let now = store.get(u.id).await.unwrap();
    assert_eq!(now.state, State::Abandoned);
    assert_eq!(last(store.clone(), u.id).await.actor, "carol");
    assert!(store.verify_all().await.unwrap().is_clean());
}

#[tokio::test]
async fn a_decision_on_a_stale_view_or_not_allowed_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = unresolved(&store, 1).await;
    let before = (
        store.get(op.id).await.unwrap(),
        store.history(op.id).await.unwrap().len(),
    );

    // The operation moved since the operator looked (wrong state, or wrong history position).
    let stale = admin(
        &db,
        &[
            "adopt",
            &op.id.to_string(),
            "--job-id",
            "j",
            "--seen",
            &format!("reconciliation@{}", op.history_seq),
            "--actor",
            "a",
            "--reason",
            "r",
        ],
    );
    assert_eq!(code(&stale), 4);
    assert!(String::from_utf8_lossy(&stale.stderr).contains("changed since you looked"));
    let seq = format!("create_unresolved@{}", op.history_seq - 1);
    assert_eq!(
        code(&admin(
            &db,
            &[
                "abandon",
                &op.id.to_string(),
                "--seen",
                &seq,
                "--actor",
                "a",
                "--reason",
                "r"
            ]
        )),
        4
    );
    // A decision the state machine does not allow here.
    let illegal = admin(
        &db,
        &[
            "confirm-cancel",
            &op.id.to_string(),
            "--evidence",
            "e",
            "--seen",
            "create_unresolved",
            "--actor",
            "a",
            "--reason",
            "r",
        ],
    );
    assert_eq!(code(&illegal), 4);
    assert!(String::from_utf8_lossy(&illegal.stderr).contains("not allowed"));
    // Retry of an operation that is not terminal; the refusal does not send the person to
    // abandon it (which stops tracking a job that may exist, leaving it beside the retry's).
    let live = admin(
        &db,
        &[
            "retry",
            &op.id.to_string(),
            "--seen",
            "create_unresolved",
            "--actor",
            "a",
            "--reason",
            "r",
        ],
    );
    assert_eq!(code(&live), 4);
    let said = String::from_utf8_lossy(&live.stderr);
    assert!(
        said.contains("declare_not_created only if") && said.contains("without cancelling"),
        "{said}"
    );
    // Missing actor or reason is a usage error.
    assert_eq!(
        code(&admin(
            &db,
            &[
                "abandon",
                &op.id.to_string(),
                "--seen",
                "create_unresolved",
                "--actor",
                " ",
                "--reason",
                "r"
            ]
        )),
        2
    );
    assert_eq!(
        code(&admin(
            &db,
            &[
                "abandon",
                &op.id.to_string(),
                "--seen",
                "create_unresolved",
                "--reason",
                "r"
            ]
        )),
        2
    );

    assert_eq!(
        (
            store.get(op.id).await.unwrap(),
            store.history(op.id).await.unwrap().len()
        ),
        before,
        "nothing was written"
    );
    assert_eq!(store.totals().await.unwrap().0, 1);
}

async fn some_history(store: &Store) -> Vec<OperationRecord> {
    vec![
        timed_out(store, 1).await,
        driven(
            store,
            2,
            vec![
                accepted("job_x"),
                Event::RemoteProgress {
                    remote_state: "running".into(),
                    known: true,
                },
                Event::RemoteFailed {
                    remote_state: "failed".into(),
                    reason: None,
                },
            ],
        )
        .await,
        unresolved(store, 3).await,
    ]
}

#[tokio::test]
async fn tampering_with_history_is_found_at_the_exact_row() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let ops = some_history(&store).await;
    let clean = admin(&db, &["audit", "verify", "--all"]);
    assert_eq!(
        code(&clean),
        0,
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );

    let (a, b, c) = (ops[0].id, ops[1].id, ops[2].id);
    // Edit a row's content.
    exec(&db, &format!("SET session_replication_role = replica; UPDATE operation_history SET cause = 'nothing to see' WHERE operation_id = '{}' AND seq = 2", a.as_uuid())).await;
    // Delete a row from the middle of a chain.
    exec(&db, &format!("SET session_replication_role = replica; DELETE FROM operation_history WHERE operation_id = '{}' AND seq = 3", b.as_uuid())).await;
    // Insert a row out of order (a forged link with a made-up hash).
    exec(&db, &format!(
        "SET session_replication_role = replica; INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, detail, prev_hash, hash) \
         VALUES ('{}', 99, now(), 'mallory', 'create_unresolved', 'succeeded', 'result_validated', 'forged', '{{}}', decode(repeat('00', 32), 'hex'), decode(repeat('11', 32), 'hex'))",
        c.as_uuid()
    ))
    .await;

    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 1);
    let report = json(&out);
    let breaks = report["breaks"].as_array().unwrap();
    let at = |op: OperationId, seq: i64| {
        breaks
            .iter()
            .any(|b| b["operation_id"] == op.to_string() && b["seq"] == seq)
    };
    assert!(at(a, 2), "the edited row is named: {breaks:#?}");
    assert!(
        at(b, 4),
        "the row after the deleted one is named (a gap): {breaks:#?}"
    );
    assert!(at(c, 99), "the inserted row is named: {breaks:#?}");
    let edited = breaks
        .iter()
        .find(|x| x["operation_id"] == a.to_string() && x["seq"] == 2)
        .unwrap();
    assert_ne!(edited["expected"], edited["stored"]);
    let human = admin(&db, &["audit", "verify", "--all"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains(&format!("BREAK {a} #2")), "{text}");
    // One operation at a time works too.
    assert_eq!(code(&admin(&db, &["audit", "verify", &a.to_string()])), 1);
}

#[tokio::test]
async fn a_whole_operation_deleted_after_an_anchor_is_found_through_the_anchor() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let ops = some_history(&store).await;
    let out = admin(
        &db,
        &["audit", "anchor", "--actor", "auditor-jane", "--json"],
    );
    assert_eq!(code(&out), 0);
    let digest = json(&out)["anchor"]["digest"].as_str().unwrap().to_owned();
    assert_eq!(json(&out)["anchor"]["operations"], 3);
    assert_eq!(
        code(&admin(
            &db,
            &["audit", "verify", "--all", "--expect-anchor", &digest]
        )),
        0,
        "clean with the anchor"
    );
    // The operator's login cannot spoil the kept anchor: a row of its own with the kept digest
    // and no heads is refused with an id of its choosing, and, taken from the sequence, is later
    // than the kept anchor, which is still the one checked.
    let forge = |id: &str| {
        let (cols, vals) = if id.is_empty() {
            ("", String::new())
        } else {
            ("id, ", format!("{id}, "))
        };
        format!(
            "SET ROLE jobtrail_operator; INSERT INTO audit_anchors ({cols}created_by, operations, digest, version) VALUES ({vals}'mallory', 3, '{digest}', 2)"
        )
    };
    let refused = try_exec(&db, &forge("9223372036854775000")).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied")),
        "{refused:?}"
    );
    exec(&db, &forge("")).await;
    assert_eq!(
        code(&admin(
            &db,
            &["audit", "verify", "--all", "--expect-anchor", &digest]
        )),
        0,
        "a later row with the kept digest does not displace the kept anchor"
    );
    // Nor an earlier one (written before anchors took their ids from the sequence, or with the
    // digest foreseen in a quiet hour): the anchor checked is the earliest whose heads hash to it.
    exec(
        &db,
        &format!(
            "INSERT INTO audit_anchors (id, created_by, operations, digest, version) VALUES (0, 'mallory', 3, '{digest}', 2)"
        ),
    )
    .await;
    assert_eq!(
        code(&admin(
            &db,
            &["audit", "verify", "--all", "--expect-anchor", &digest]
        )),
        0,
        "an earlier row with the kept digest and no heads does not stand in for the kept anchor"
    );

    // Remove an operation with its whole history, as a superuser with triggers off. Its own chain
    // is gone, so only the anchor can tell.
    let gone = ops[1].id;
    exec(&db, &format!(
        "SET session_replication_role = replica; DELETE FROM operation_history WHERE operation_id = '{0}'; DELETE FROM provider_calls WHERE operation_id = '{0}'; DELETE FROM operation_schedule WHERE operation_id = '{0}'; DELETE FROM operations WHERE id = '{0}'",
        gone.as_uuid()
    ))
    .await;
    let out = admin(
        &db,
        &[
            "audit",
            "verify",
            "--all",
            "--json",
            "--expect-anchor",
            &digest,
        ],
    );
    assert_eq!(code(&out), 1);
    let breaks = json(&out)["breaks"].as_array().unwrap().clone();
    assert!(
        breaks.iter().any(|b| b["operation_id"] == gone.to_string()
            && b["problem"].as_str().unwrap().contains("deleted")),
        "{breaks:#?}"
    );
    // Checked by its id against the anchor, it is the same finding (exit 1), not "not found"
    // (exit 3, a mistyped id); an id the anchor never recorded is still not found.
    let one = |id: &str| {
        admin(
            &db,
            &["audit", "verify", id, "--json", "--expect-anchor", &digest],
        )
    };
    let out = one(&gone.to_string());
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        json(&out)["breaks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["operation_id"] == gone.to_string()
                && b["problem"].as_str().unwrap().contains("deleted")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let never = OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    assert_eq!(code(&one(&never)), 3);

    // A forged anchor (heads rewritten to hide it) no longer matches the digest kept outside.
    exec(
        &db,
        "SET session_replication_role = replica; DELETE FROM audit_anchor_heads",
    )
    .await;
    let out = admin(
        &db,
        &[
            "audit",
            "verify",
            "--all",
            "--json",
            "--expect-anchor",
            &digest,
        ],
    );
    assert_eq!(code(&out), 1);
    let breaks = json(&out)["breaks"].as_array().unwrap().clone();
    assert!(
        breaks.iter().any(|b| b["problem"]
            .as_str()
            .unwrap()
            .contains("no longer hash to its digest")),
        "{breaks:#?}"
    );
    // The deleted operation checked by its id, its anchored head deleted too: still the finding
    // (exit 1), the anchor's heads altered, not "not found".
    let out = one(&gone.to_string());
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no longer hash to its digest"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // An operation's row deleted and its history left, checked by its id with no anchor: the
    // rows left are the finding (exit 1), as `--all` reports them.
    let orphaned = ops[2].id;
    exec(
        &db,
        &format!(
            "SET session_replication_role = replica; DELETE FROM operation_schedule WHERE operation_id = '{0}'; DELETE FROM operations WHERE id = '{0}'",
            orphaned.as_uuid()
        ),
    )
    .await;
    let out = admin(&db, &["audit", "verify", &orphaned.to_string(), "--json"]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        json(&out)["breaks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["operation_id"] == orphaned.to_string()
                && b["problem"]
                    .as_str()
                    .unwrap()
                    .contains("of an operation that does not exist")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A succeeded operation with a stored, validated result and a logged call, as a worker would leave it.
async fn succeeded_with_result(store: &Store, n: u32, bytes: &'static [u8]) -> OperationRecord {
    use sha2::Digest;
    let op = submit(store, n).await;
    let mut claimed = None;
    for _ in 0..100 {
        let got = store
            .claim_due("setup-worker", 10, Duration::from_secs(60))
            .await
            .unwrap();
        claimed = got.into_iter().find(|c| c.lease.operation_id == op.id);
        if claimed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = claimed.expect("claimed within two seconds");
    for e in [
        accepted(&format!("job_r{n}")),
        Event::RemoteSucceeded {
            remote_state: "done".into(),
        },
    ] {
        let step = Step {
            keep_lease: true,
            ..Step::event(e)
        };
        store.apply(&c.lease, step).await.unwrap();
    }
    let sha = hex::encode(sha2::Sha256::digest(bytes));
    let rb = ResultBytes {
        sha256: sha.clone(),
        content_type: Some("application/json".into()),
        bytes: bytes::Bytes::from_static(bytes),
    };
    let v = ValidatedResult::new(
        &rb.location(op.id),
        bytes.len() as u64,
        &sha,
        Some("application/json".into()),
        vec!["sha256".into()],
        serde_json::json!({}),
    )
    .unwrap();
    let call = CallRecord {
        id: uuid::Uuid::now_v7(),
        kind: CallKind::Result,
        attempt: 1,
        started_at: chrono::Utc::now(),
        duration_ms: 1.5,
        method: "GET".into(),
        url: "http://127.0.0.1:9/result".into(),
        http_status: Some(200),
        response_headers: serde_json::json!({"content-type": "application/json"}),
        provider_request_id: Some("req_1".into()),
        error_class: None,
        outcome: "fetched".into(),
        trace_id: op.trace_id.to_string(),
        span_id: "00f067aa0ba902b7".into(),
        response_sha256: Some(sha.clone()),
    };
    let step = Step {
        result_bytes: Some(rb),
        call: Some(call),
        ..Step::event(Event::ResultValidated(v))
    };
    store.apply(&c.lease, step).await.unwrap();
    store.get(op.id).await.unwrap()
}

/// Records the chain does not cover can no longer be forged: an approver or caller changed on the
/// operation, a call-log row rewritten, result bytes swapped together with their digest — each is
/// named by `audit verify`, and the swapped result is not served. Deleting the anchors defeats
/// nothing: a named anchor that is not there is its own failure (exit 8).
#[tokio::test]
async fn forged_rows_of_every_kind_are_found_and_a_missing_anchor_is_a_failure() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = succeeded_with_result(&store, 1, br#"{"items":[1,2,3]}"#).await;
    let other = succeeded_with_result(&store, 2, br#"{"items":[4]}"#).await;
    let keep = std::env::temp_dir().join(format!("anchor-{}.json", uuid::Uuid::now_v7().simple()));
    let key = std::env::temp_dir().join(format!("anchor-{}.key", uuid::Uuid::now_v7().simple()));
    std::fs::write(&key, "7".repeat(64)).unwrap();
    let out = admin(
        &db,
        &[
            "audit",
            "anchor",
            "--out",
            keep.to_str().unwrap(),
            "--signing-key",
            key.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let anchor = json(&out);
    let public = anchor["signature"]["public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept = keep.to_str().unwrap();
    let clean = admin(
        &db,
        &[
            "audit",
            "verify",
            "--all",
            "--json",
            "--expect-anchor",
            kept,
            "--anchor-public-key",
            &public,
        ],
    );
    assert_eq!(
        code(&clean),
        0,
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );
    assert_eq!(
        json(&clean)["calls"],
        2,
        "calls are verified through their chain"
    );
    // A path named by mistake (a device, a disk image) is refused, not read until memory ends.
    for args in [
        &["audit", "verify", "--all", "--expect-anchor", "/dev/zero"][..],
        &["audit", "anchor", "--signing-key", "/dev/zero"],
    ] {
        let out = admin(&db, args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {said}");
        assert!(said.contains("larger than"), "{args:?}: {said}");
    }
    assert_eq!(json(&clean)["results"], 2);
    assert_eq!(json(&clean)["unanchored"]["links"], 0);
    // One operation against the anchor says what of it lies after the anchor: nothing of one it
    // covers, all of one submitted since.
    let later = submit(&store, 9).await;
    let after = admin(
        &db,
        &[
            "audit",
            "verify",
            &later.id.to_string(),
            "--expect-anchor",
            kept,
            "--json",
        ],
    );
    assert_eq!(
        code(&after),
        0,
        "{}",
        String::from_utf8_lossy(&after.stdout)
    );
    assert_eq!(json(&after)["unanchored"]["operations"], 1);
    assert_eq!(json(&after)["unanchored"]["links"], 1);
    let covered = admin(
        &db,
        &[
            "audit",
            "verify",
            &op.id.to_string(),
            "--expect-anchor",
            kept,
            "--json",
        ],
    );
    assert_eq!(json(&covered)["unanchored"]["operations"], 0);
    assert_eq!(json(&covered)["unanchored"]["links"], 0);
    // A pool too small for the four streams of --all is refused at once, not waited out.
    let small = admin(&db, &["audit", "verify", "--all", "--db-pool", "3"]);
    assert_eq!(code(&small), 2);
    assert!(String::from_utf8_lossy(&small.stderr).contains("--db-pool must be at least 4"));
    assert_eq!(
        code(&admin(
            &db,
            &["audit", "verify", &op.id.to_string(), "--db-pool", "1"]
        )),
        0
    );
    // A signed file checked without a key the auditor holds says its signature went unchecked.
    let unkeyed = admin(&db, &["audit", "verify", "--all", "--expect-anchor", kept]);
    assert_eq!(code(&unkeyed), 0);
    let said = String::from_utf8_lossy(&unkeyed.stderr);
    assert!(
        said.contains("signature was not checked") && said.contains(&public),
        "{said}"
    );
    // A rewritten file's words reach no terminal: a key that would erase the warning's line, a
    // digest that would print a forged one in the error.
    let mut hostile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&keep).unwrap()).unwrap();
    hostile["signature"]["public_key"] = serde_json::json!("\r\u{1b}[2Kaudit: intact");
    let rewritten = keep.with_extension("hostile.json");
    let verify_with = |file: &serde_json::Value| {
        std::fs::write(&rewritten, file.to_string()).unwrap();
        let out = admin(
            &db,
            &[
                "audit",
                "verify",
                "--all",
                "--expect-anchor",
                rewritten.to_str().unwrap(),
            ],
        );
        (
            code(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (exit, said) = verify_with(&hostile);
    assert_eq!(exit, 0, "{said}");
    assert!(
        said.contains("signature was not checked")
            && !said.contains('\u{1b}')
            && !said.contains('\r'),
        "{said:?}"
    );
    hostile["anchor"]["digest"] = serde_json::json!(format!("{}\u{1b}[2K", "a".repeat(64)));
    let (exit, said) = verify_with(&hostile);
    assert_eq!(exit, 2, "{said:?}");
    assert!(
        said.contains("not 64 hex digits") && !said.contains('\u{1b}'),
        "{said:?}"
    );
    let _ = std::fs::remove_file(&rewritten);
    // A key with no anchor file would check nothing: refused, not ignored (an auditor who set
    // JOBTRAIL_ANCHOR_PUBLIC_KEY believed signatures were checked while none was).
    let keyless = admin(
        &db,
        &["audit", "verify", "--all", "--anchor-public-key", &public],
    );
    assert_eq!(
        code(&keyless),
        2,
        "{}",
        String::from_utf8_lossy(&keyless.stderr)
    );
    assert!(String::from_utf8_lossy(&keyless.stderr).contains("--expect-anchor"));
    // Set to nothing beside an anchor file, it is refused, not taken as unset: the file's
    // signature would go unchecked in silence.
    let blank_with_file = Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
        .args(["audit", "verify", "--all", "--expect-anchor"])
        .arg(&keep)
        .env("DATABASE_URL", &db.url)
        .env("JOBTRAIL_ANCHOR_PUBLIC_KEY", "")
        .output()
        .unwrap();
    assert_eq!(
        code(&blank_with_file),
        2,
        "{}",
        String::from_utf8_lossy(&blank_with_file.stderr)
    );
    // The variable set to nothing (a chart or cron value left blank) is unset, not a key.
    let blank = Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
        .args(["audit", "verify", "--all"])
        .env("DATABASE_URL", &db.url)
        .env("JOBTRAIL_ANCHOR_PUBLIC_KEY", "")
        .output()
        .unwrap();
    assert_eq!(
        code(&blank),
        0,
        "{}",
        String::from_utf8_lossy(&blank.stderr)
    );
    // An anchor file whose signature another key made is refused.
    let wrong = ed25519_public_of(&"8".repeat(64));
    assert_eq!(
        code(&admin(
            &db,
            &[
                "audit",
                "verify",
                "--all",
                "--expect-anchor",
                kept,
                "--anchor-public-key",
                &wrong
            ]
        )),
        8
    );

    let (a, b) = (op.id.as_uuid(), other.id.as_uuid());
    // The approver and the caller, edited on the row (an owner with triggers off).
    exec(&db, &format!("SET session_replication_role = replica; UPDATE operations SET approved_by = 'security team', caller = 'nobody', edited_by = 'someone' WHERE id = '{a}'")).await;
    // A call-log row rewritten.
    exec(&db, &format!("SET session_replication_role = replica; UPDATE provider_calls SET outcome = 'nothing happened', http_status = 404 WHERE operation_id = '{b}'")).await;
    // Result bytes swapped together with their digest, on the result row and the operation.
    let forged = br#"{"items":["forged"]}"#;
    let forged_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(forged))
    };
    exec(&db, &format!(
        "SET session_replication_role = replica;          UPDATE operation_results SET bytes = decode('{}', 'hex'), size = {}, sha256 = '{forged_sha}' WHERE operation_id = '{b}';          UPDATE operations SET result_sha256 = '{forged_sha}', result_location = 'postgres:operation_results/{}/{forged_sha}' WHERE id = '{b}'",
        hex::encode(forged), forged.len(), other.id
    )).await;

    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 1);
    let breaks = json(&out)["breaks"].as_array().unwrap().clone();
    let named = |op: OperationId, words: &str| {
        breaks.iter().any(|x| {
            x["operation_id"] == op.to_string() && x["problem"].as_str().unwrap().contains(words)
        })
    };
    assert!(
        named(op.id, "approved_by differs from the chained submission"),
        "{breaks:#?}"
    );
    assert!(named(op.id, "caller differs"), "{breaks:#?}");
    // Whose grants each send checks besides the caller's: a person's edit, chained too.
    assert!(named(op.id, "edited_by differs"), "{breaks:#?}");
    assert!(
        named(other.id, "row content does not match its hash"),
        "the rewritten call: {breaks:#?}"
    );
    assert!(
        named(other.id, "no history link names"),
        "the swapped bytes: {breaks:#?}"
    );
    assert!(
        named(other.id, "result digest differs"),
        "the swapped digest: {breaks:#?}"
    );
    // The swapped result is not served.
    let err = store
        .chained_result(other.id)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("altered"), "{err}");
    assert!(store.chained_result(op.id).await.is_ok());
    // One operation at a time, against the kept anchor.
    assert_eq!(
        code(&admin(
            &db,
            &[
                "audit",
                "verify",
                &op.id.to_string(),
                "--expect-anchor",
                kept
            ]
        )),
        1
    );

    // Deleting every anchor does not turn "altered" into "no anchor yet": the anchor kept outside
    // names one that is not there.
    exec(&db, "SET session_replication_role = replica; DELETE FROM audit_anchor_heads; DELETE FROM audit_anchors").await;
    let out = admin(&db, &["audit", "verify", "--all", "--expect-anchor", kept]);
    assert_eq!(code(&out), 8, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no anchor with digest"));
    assert_eq!(
        code(&admin(
            &db,
            &[
                "audit",
                "verify",
                &op.id.to_string(),
                "--expect-anchor",
                kept
            ]
        )),
        8
    );
    // Without one, what lies after no anchor is reported as unanchored, not as intact.
    let out = admin(&db, &["audit", "verify", &other.id.to_string()]);
    assert_eq!(code(&out), 1);
    let text =
        String::from_utf8_lossy(&admin(&db, &["audit", "verify", "--all"]).stdout).to_string();
    assert!(
        text.contains("unanchored:") && text.contains("no anchor at all"),
        "{text}"
    );
    let _ = std::fs::remove_file(&keep);
    let _ = std::fs::remove_file(&key);
}

/// The next link of `op`'s history, well hashed, as a writer role could append it: the SQL that
/// inserts it (run it as that role) and the new head, in hex.
async fn next_link(
    store: &Store,
    op: OperationId,
    (from, event, to): (&str, &str, &str),
    actor: &str,
    cause: &str,
    detail: serde_json::Value,
) -> (i64, String, String) {
    next_link_at(
        store,
        op,
        (from, event, to),
        (actor, cause),
        detail,
        chrono::Utc::now(),
    )
    .await
}

/// [`next_link`], dated `at`.
async fn next_link_at(
    store: &Store,
    op: OperationId,
    (from, event, to): (&str, &str, &str),
    (actor, cause): (&str, &str),
    detail: serde_json::Value,
    at: chrono::DateTime<chrono::Utc>,
) -> (i64, String, String) {
    let last = store.history(op).await.unwrap().pop().unwrap();
    let entry = chain::ChainEntry {
        operation_id: op.to_string(),
        seq: last.seq + 1,
        at: chain::storable(at),
        actor: actor.into(),
        from_state: Some(from.into()),
        to_state: to.into(),
        event: event.into(),
        cause: cause.into(),
        remote_job_id: last.remote_job_id.clone(),
        call_id: None,
        detail,
    };
    let head = hex::encode(entry.hash(&last.hash.clone().try_into().unwrap()));
    let job = entry
        .remote_job_id
        .as_deref()
        .map(|j| format!("'{j}'"))
        .unwrap_or_else(|| "NULL".into());
    let insert = format!(
        "INSERT INTO operation_history (operation_id, seq, at, actor, from_state, to_state, event, cause, remote_job_id, call_id, detail, prev_hash, hash) \
         VALUES ('{}', {}, '{}', '{actor}', '{from}', '{to}', '{event}', '{cause}', {job}, NULL, '{}', decode('{}', 'hex'), decode('{head}', 'hex'))",
        op.as_uuid(),
        entry.seq,
        entry.at.format("%Y-%m-%dT%H:%M:%S%.6fZ"),
        entry.detail,
        hex::encode(&last.hash),
    );
    (entry.seq, insert, head)
}

/// Append a well-hashed link to `op`'s history as the API's role (which may append and move the
/// row's state and head), as an agent's credentials could.
async fn append_as_api(
    db: &TestDb,
    store: &Store,
    op: OperationId,
    from: &str,
    event: &str,
    to: &str,
) {
    let cause = "withdrawn by alice";
    let (seq, insert, head) = next_link(
        store,
        op,
        (from, event, to),
        "alice",
        cause,
        serde_json::json!({}),
    )
    .await;
    exec(db, &format!(
        "SET ROLE jobtrail_api; {insert}; \
         UPDATE operations SET state = '{to}', cancel_requested_at = now(), cancel_requested_by = 'alice', \
         cancel_reason = '{cause}', cancel_deadline = now(), history_seq = {seq}, \
         history_head = decode('{head}', 'hex') WHERE id = '{}'",
        op.as_uuid()
    ))
    .await;
}

/// An older build's resume did not say which deadlines it moved, and `audit verify` excuses that
/// shape; a resume of that shape written today (links are dated by the database's clock) is no
/// older build's: the deadline it moved on the row is reported.
#[tokio::test]
async fn an_older_builds_shape_written_today_is_not_excused() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let held = unconfirmed(&store, 1).await;
    let (seq, insert, head) = next_link(
        &store,
        held.id,
        ("cancellation_unconfirmed", "resume", "cancelling"),
        "alice",
        "resumed",
        serde_json::json!({}),
    )
    .await;
    exec(&db, &format!(
        "SET ROLE jobtrail_operator; {insert}; \
         UPDATE operations SET state = 'cancelling', escalated_at = NULL, escalation_reason = NULL, \
         cancel_deadline = cancel_deadline + interval '1 day', history_seq = {seq}, history_head = decode('{head}', 'hex') WHERE id = '{}'",
        held.id.as_uuid()
    ))
    .await;
    let out = admin(&db, &["audit", "verify", &held.id.to_string(), "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 1, "{text}");
    assert!(
        text.contains("cancel_deadline differs from what its history records"),
        "{text}"
    );
}

#[tokio::test]
async fn a_link_dated_away_from_the_database_clock_is_refused() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let asked = unconfirmed(&store, 1).await;
    let state = asked.state.to_string();
    let links = store.history(asked.id).await.unwrap().len();
    // The worker's credentials append a well-hashed, well-placed link (a progress note, which its
    // role may record), dated a week ago, then a minute and a half ahead: both refused.
    let append = |at: chrono::DateTime<chrono::Utc>| {
        let (store, state) = (&store, &state);
        async move {
            let (seq, insert, head) = next_link_at(
                store,
                asked.id,
                (state, "remote_progress", state),
                ("worker-x", "progress"),
                serde_json::json!({}),
                at,
            )
            .await;
            format!(
                "SET ROLE jobtrail_worker; BEGIN; {insert}; \
                 UPDATE operations SET history_seq = {seq}, history_head = decode('{head}', 'hex') WHERE id = '{}'; COMMIT",
                asked.id.as_uuid()
            )
        }
    };
    let now = chrono::Utc::now();
    for at in [
        now - chrono::Duration::days(7),
        now + chrono::Duration::seconds(90),
    ] {
        let e = try_exec(&db, &append(at).await)
            .await
            .expect_err("a link dated away from the database's clock is refused");
        assert!(e.to_string().contains("not by the database's clock"), "{e}");
        assert_eq!(store.history(asked.id).await.unwrap().len(), links);
    }
    // The same link dated now is taken: the date is what was refused.
    try_exec(&db, &append(chrono::Utc::now()).await)
        .await
        .unwrap();
    assert_eq!(store.history(asked.id).await.unwrap().len(), links + 1);
}

#[tokio::test]
async fn a_well_hashed_record_of_a_move_the_machine_forbids_is_found() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let done = succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let jumped = succeeded_with_result(&store, 2, br#"{"items":[2]}"#).await;
    let emptied = succeeded_with_result(&store, 3, br#"{"items":[3]}"#).await;
    let intact = succeeded_with_result(&store, 4, br#"{"items":[4]}"#).await;
    let quiet = succeeded_with_result(&store, 5, br#"{"items":[5]}"#).await;
    let asked = unconfirmed(&store, 6).await;
    let asked_too = unconfirmed(&store, 7).await;
    let asked_when = unconfirmed(&store, 8).await;
    let resized = succeeded_with_result(&store, 9, br#"{"items":[9]}"#).await;
    let split = driven(
        &store,
        10,
        vec![
            accepted("job_s"),
            Event::CancelRequested(CancelRequest::new("bob", "per ops: stop").unwrap()),
        ],
    )
    .await;
    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));

    // Hashes, heads and the row all agree, but the moves are ones no engine makes: a succeeded
    // operation withdrawn, and one "withdrawn" from a state it was not in.
    append_as_api(&db, &store, done.id, "succeeded", "withdraw", "withdrawn").await;
    append_as_api(
        &db,
        &store,
        jumped.id,
        "create_pending",
        "withdraw",
        "withdrawn",
    )
    .await;
    // The validated result's bytes deleted (an owner with triggers off).
    exec(&db, &format!(
        "SET session_replication_role = replica; DELETE FROM operation_results WHERE operation_id = '{}'",
        emptied.id.as_uuid()
    ))
    .await;

    // Who asked for a cancel, edited on the row by the API's role: named on an operation nobody
    // asked to cancel, and renamed on one somebody did.
    exec(&db, &format!(
        "SET ROLE jobtrail_api; UPDATE operations SET cancel_requested_at = now(), cancel_requested_by = 'mallory', cancel_reason = 'policy', cancel_deadline = now() WHERE id = '{}'; UPDATE operations SET cancel_requested_by = 'mallory' WHERE id = '{}'",
        quiet.id.as_uuid(),
        asked.id.as_uuid()
    ))
    .await;
    // Text moved from the reason into who asked: "bob" + "per ops: stop" reads as the same cause
    // as "bob: per ops" + "stop".
    exec(&db, &format!(
        "SET ROLE jobtrail_api; UPDATE operations SET cancel_requested_by = 'bob: per ops', cancel_reason = 'stop' WHERE id = '{}'",
        split.id.as_uuid()
    ))
    .await;
    // The validated result's size, edited by the worker's role.
    exec(&db, &format!(
        "SET ROLE jobtrail_worker; UPDATE operations SET result_size = result_size + 1 WHERE id = '{}'",
        resized.id.as_uuid()
    ))
    .await;
    // ... and only when it was asked for.
    exec(&db, &format!(
        "SET ROLE jobtrail_api; UPDATE operations SET cancel_requested_at = cancel_requested_at + interval '1 hour' WHERE id = '{}'",
        asked_when.id.as_uuid()
    ))
    .await;

    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let breaks = json(&out)["breaks"].as_array().unwrap().clone();
    let named = |op: OperationId, words: &str| {
        breaks.iter().any(|x| {
            x["operation_id"] == op.to_string() && x["problem"].as_str().unwrap().contains(words)
        })
    };
    assert!(
        named(done.id, "does not allow withdraw in succeeded"),
        "{breaks:#?}"
    );
    assert!(
        named(jumped.id, "does not start where the previous link led"),
        "{breaks:#?}"
    );
    assert!(named(emptied.id, "stored bytes are missing"), "{breaks:#?}");
    assert!(named(quiet.id, "cancel request differs"), "{breaks:#?}");
    assert!(named(asked.id, "cancel request differs"), "{breaks:#?}");
    assert!(named(split.id, "cancel request differs"), "{breaks:#?}");
    assert!(
        named(resized.id, "result location and size differs"),
        "{breaks:#?}"
    );
    assert!(
        named(asked_when.id, "cancel request differs"),
        "{breaks:#?}"
    );
    for untouched in [intact.id, asked_too.id] {
        assert!(
            !breaks
                .iter()
                .any(|x| x["operation_id"] == untouched.to_string()),
            "an untouched operation has no break: {breaks:#?}"
        );
    }
    // One operation at a time too.
    assert_eq!(
        code(&admin(&db, &["audit", "verify", &done.id.to_string()])),
        1
    );
    assert_eq!(
        code(&admin(&db, &["audit", "verify", &intact.id.to_string()])),
        0
    );
}

/// The columns a step sets beside the state (when it changed and finished, why it waits for a
/// person, the job id not chosen, the deadlines) are replayed from the chain: a resume records
/// the deadlines it moved, and a row edited beside its chain by a role that may update it is found.
#[tokio::test]
async fn a_step_column_edited_beside_the_chain_is_found() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let decide = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([
            "--actor",
            "alice",
            "--reason",
            "provider confirmed by phone",
        ]);
        let out = admin(&db, &all);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    };
    // Resumes that move each deadline, through the operator's door.
    let windowed = unconfirmed(&store, 1).await;
    decide(&[
        "resume",
        &windowed.id.to_string(),
        "--cancel-window",
        "10m",
        "--seen",
        "cancellation_unconfirmed",
    ]);
    let recreated = unresolved(&store, 2).await;
    decide(&[
        "resume",
        &recreated.id.to_string(),
        "--create-deadline",
        "+30d",
        "--seen",
        "create_unresolved",
    ]);
    let escalated = timed_out(&store, 3).await;
    let finished = succeeded_with_result(&store, 4, br#"{"items":[4]}"#).await;
    let intact = succeeded_with_result(&store, 5, br#"{"items":[5]}"#).await;
    let moved = |id: OperationId| {
        let store = store.clone();
        async move { store.history(id).await.unwrap().pop().unwrap().detail }
    };
    let set = moved(windowed.id).await;
    let now = store.get(windowed.id).await.unwrap();
    assert_eq!(
        set[chain::DEADLINES_SET]["cancel_deadline"],
        serde_json::json!(now.cancel_deadline.unwrap()),
        "the resume link says to what the cancel deadline moved: {set}"
    );
    let set = moved(recreated.id).await;
    let now = store.get(recreated.id).await.unwrap();
    assert_eq!(
        (
            &set[chain::DEADLINES_SET]["create_deadline"],
            &set[chain::DEADLINES_SET]["result_deadline"]
        ),
        (
            &serde_json::json!(now.create_deadline),
            &serde_json::json!(now.result_deadline)
        ),
        "{set}"
    );
    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));

    // Each column edited by a role that may update it, no link written.
    let edits = [
        (
            windowed.id,
            "cancel_deadline = cancel_deadline + interval '1 day'",
            "cancel_deadline",
        ),
        (
            recreated.id,
            "result_deadline = result_deadline + interval '1 day'",
            "result_deadline",
        ),
        (
            recreated.id,
            "create_deadline = create_deadline - interval '1 day'",
            "create_deadline",
        ),
        (
            escalated.id,
            "escalation_reason = 'routine'",
            "escalation_reason",
        ),
        (
            escalated.id,
            "escalated_at = escalated_at - interval '1 hour'",
            "escalated_at",
        ),
        (
            finished.id,
            "finished_at = finished_at + interval '1 hour'",
            "finished_at",
        ),
        (finished.id, "state_changed_at = now()", "state_changed_at"),
        (
            finished.id,
            "conflicting_remote_job_id = 'job_other'",
            "conflicting_remote_job_id",
        ),
        // A megabyte written into a column is shown cut, not kept whole in the report.
        (
            finished.id,
            r#"result_summary = jsonb_build_object('items', 4, 'verdict', repeat('all clear ', 100000))"#,
            "result_summary",
        ),
        (
            finished.id,
            "result_content_type = 'text/html'",
            "result_content_type",
        ),
    ];
    for (id, set, _) in &edits {
        exec(
            &db,
            &format!(
                "SET ROLE jobtrail_worker; UPDATE operations SET {set} WHERE id = '{}'",
                id.as_uuid()
            ),
        )
        .await;
    }
    let out = admin(&db, &["audit", "verify", "--all", "--json"]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let breaks = json(&out)["breaks"].as_array().unwrap().clone();
    for (id, _, field) in edits {
        assert!(
            breaks.iter().any(|x| x["operation_id"] == id.to_string()
                && x["problem"]
                    == format!("the operation's {field} differs from what its history records")),
            "{field} on {id}: {breaks:#?}"
        );
    }
    assert!(
        !breaks
            .iter()
            .any(|x| x["operation_id"] == intact.id.to_string()),
        "{breaks:#?}"
    );
    for x in &breaks {
        let stored = x["stored"].as_str().unwrap();
        assert!(stored.len() < 1100, "{} bytes shown", stored.len());
    }
    // A row edited to hold terminal escapes cannot erase its own BREAK line, or print a forged
    // summary, on the reader's screen: what a row holds is shown escaped.
    exec(
        &db,
        &format!(
            "SET ROLE jobtrail_worker; UPDATE operations SET escalation_reason = E'x\\r\\033[2K\\033[1A0 breaks: intact' WHERE id = '{}'",
            escalated.id.as_uuid()
        ),
    )
    .await;
    let out = admin(&db, &["audit", "verify", &escalated.id.to_string()]);
    assert_eq!(code(&out), 1);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\r'),
        "{shown:?}"
    );
    assert!(shown.contains("\\u{1b}[2K"), "{shown}");
    // The auditor's role reads what it compares (verify runs as the owner here).
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("SET ROLE jobtrail_auditor; SELECT state_changed_at, finished_at, escalated_at, escalation_reason, conflicting_remote_job_id, create_deadline, result_deadline, cancel_deadline, result_summary, result_content_type FROM operations")
        .execute(&mut c)
        .await
        .unwrap();
}

fn ed25519_public_of(seed_hex: &str) -> String {
    let seed: [u8; 32] = hex::decode(seed_hex).unwrap().try_into().unwrap();
    hex::encode(
        ed25519_dalek::SigningKey::from_bytes(&seed)
            .verifying_key()
            .to_bytes(),
    )
}

/// The SQL blocks of docs/audit.md.
fn documented_queries() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/audit.md"))
        .unwrap();
    doc.split("```sql")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().trim().to_owned())
        .collect()
}

#[tokio::test]
async fn the_auditor_role_runs_every_documented_query_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store().await;
    some_history(&store).await;
    store.anchor("test").await.unwrap();
    let queries = documented_queries();
    assert!(queries.len() >= 6, "the doc has {} queries", queries.len());
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("SET ROLE jobtrail_auditor")
        .execute(&mut c)
        .await
        .unwrap();
    for q in &queries {
        sqlx::raw_sql(sqlx::AssertSqlSafe(q.clone()))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{q}"));
    }
    let rows: Vec<(String,)> = sqlx::query_as("SELECT operation_id FROM audit_escalation_queue")
        .fetch_all(&mut c)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    for w in [
        "UPDATE operations SET state = 'succeeded'",
        "DELETE FROM operation_history",
        "INSERT INTO audit_anchors (created_by, operations, digest) VALUES ('x', 0, repeat('0', 64))",
        "UPDATE provider_calls SET url = 'x'",
        "SELECT request_body FROM operations",
        "SELECT provider_context FROM operations",
        "CREATE TABLE mine (x int)",
    ] {
        let err = sqlx::raw_sql(w).execute(&mut c).await.expect_err(w);
        assert!(err.to_string().contains("permission denied"), "{w}: {err}");
    }
}

#[tokio::test]
async fn public_ids_in_sql_match_the_rust_rendering() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let samples = [
        0u128,
        1,
        u128::MAX,
        0x0190_0000_0000_7000_8000_0000_0000_0001,
        0xDEAD_BEEF_0123_4567_89AB_CDEF_F00D_CAFE,
    ];
    for n in samples
        .into_iter()
        .chain((0..15).map(|_| uuid::Uuid::now_v7().as_u128()))
    {
        let id = OperationId::from_uuid(uuid::Uuid::from_u128(n));
        let (sql,): (String,) = sqlx::query_as("SELECT jobtrail_public_id($1)")
            .bind(id.as_uuid())
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(sql, id.to_string());
    }
    let op = submit(&store, 1).await;
    let (seen,): (String,) = sqlx::query_as("SELECT operation_id FROM audit_operations")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(seen, op.id.to_string());
}

/// Two operations that failed the same way share STATE@SEQ: the view `show` prints carries its
/// operation's head, so one pasted onto the other (a tired operator's wrong id) is refused, with
/// nothing written. Each operation's own view is taken, and a bare STATE@SEQ still is.
#[tokio::test]
async fn a_view_pasted_onto_another_operation_is_refused() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let a = unresolved(&store, 31).await;
    let b = unresolved(&store, 32).await;
    assert_eq!((a.state, a.history_seq), (b.state, b.history_seq));
    let view = |id: &OperationId| {
        json(&admin(&db, &["show", &id.to_string(), "--json"]))["seen"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (seen_a, seen_b) = (view(&a.id), view(&b.id));
    assert_ne!(seen_a, seen_b);
    // A person's move on the view they name.
    let on_view = |verb: &str, reason: &str, id: &OperationId, seen: &str| {
        let id = id.to_string();
        admin(
            &db,
            &[
                verb, &id, "--seen", seen, "--actor", "alice", "--reason", reason,
            ],
        )
    };
    let declare = |id: &OperationId, seen: &str| {
        on_view("declare-not-created", "support: no such request", id, seen)
    };
    let out = declare(&b.id, &seen_a);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 4, "{said}");
    assert!(said.contains("not") && said.contains(&seen_b), "{said}");
    assert_eq!(
        store.get(b.id).await.unwrap().history_seq,
        b.history_seq,
        "nothing written"
    );
    // A cancel is sent to the job and cannot be taken back: refused alike, and taken on the
    // operation's own view.
    let cancel = |id: &OperationId, seen: &str| on_view("cancel", "support: not wanted", id, seen);
    let out = cancel(&b.id, &seen_a);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 4, "{said}");
    assert!(said.contains(&seen_b), "{said}");
    let now = store.get(b.id).await.unwrap();
    assert_eq!(now.history_seq, b.history_seq, "nothing written");
    assert_eq!(now.cancel_requested_by, None);
    // A number the operation has not reached is no view of it, whatever its head: it could be
    // reached before the write takes its lock, which compares no head.
    let ahead = format!(
        "create_unresolved@{}:{}",
        b.history_seq + 1,
        &seen_b[seen_b.len() - 8..]
    );
    let out = cancel(&b.id, &ahead);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 4, "{said}");
    assert!(said.contains("copied from another operation"), "{said}");
    assert_eq!(store.get(b.id).await.unwrap().history_seq, b.history_seq);
    let c = unresolved(&store, 33).await;
    let out = cancel(&c.id, &view(&c.id));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        store
            .get(c.id)
            .await
            .unwrap()
            .cancel_requested_by
            .as_deref(),
        Some("alice")
    );
    // A head that is no hex is a typo, not a view.
    assert_eq!(
        code(&declare(
            &b.id,
            &format!("create_unresolved@{}:zz", b.history_seq)
        )),
        2
    );
    assert_eq!(code(&declare(&b.id, &seen_b)), 0);
    assert_eq!(store.get(b.id).await.unwrap().state, State::NotCreated);
    let bare = format!("create_unresolved@{}", a.history_seq);
    assert_eq!(code(&declare(&a.id, &bare)), 0);
}

#[tokio::test]
async fn stats_report_states_the_queue_and_lease_holders() {
    let db = TestDb::new().await;
    let store = db.store().await;
    some_history(&store).await;
    submit(&store, 9).await;
    store
        .claim_due("busy-worker", 5, Duration::from_secs(60))
        .await
        .unwrap();
    // One provider told the fleet to wait; another's pause has already ended.
    store
        .pause_provider("sim", Duration::from_secs(45))
        .await
        .unwrap();
    store
        .pause_provider("other", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let text = admin(&db, &["stats"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("provider sim paused fleet-wide") && !text.contains("provider other"),
        "{text}"
    );
    let out = admin(&db, &["stats", "--json"]);
    assert_eq!(code(&out), 0);
    let s = json(&out);
    assert_eq!(s["operations"], 4);
    assert_eq!(s["escalations"]["open"], 2);
    assert_eq!(s["lease_holders"][0]["lease_owner"], "busy-worker");
    let pauses = s["provider_pauses"].as_array().unwrap();
    assert_eq!(pauses.len(), 1, "{pauses:?}");
    assert_eq!(pauses[0]["provider"], "sim");
    let left = pauses[0]["remaining_secs"].as_f64().unwrap();
    assert!(left > 30.0 && left <= 45.0, "{left}");
    assert!(
        s["by_state"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["state"] == "failed")
    );
    let help = admin(&db, &["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit codes"));

    // An operation of a contract since renamed: due ten minutes ago and claimed by no worker.
    // Named, with how long it has waited.
    let stranded = Submission {
        provider: "acme-old".into(),
        target: "reports".into(),
        body: br#"{"n":1}"#.to_vec(),
        caller: "agent-7".into(),
        approved_by: "alice".into(),
        ..Default::default()
    };
    // (Submitted while the contract was loaded under that name.)
    let mut then = terms();
    then.insert(
        "acme-old".into(),
        ProviderTerms::new("acme-old", IdempotencyMode::Header),
    );
    let op = store
        .submit_new(&stranded, &then, SubmitLimits::default())
        .await
        .unwrap()
        .operation;
    // And one of `sim`, as long overdue, but `sim` is paused fleet-wide (said above): its wait is
    // the pause, not a missing worker.
    let paused = submit(&store, 10).await;
    for id in [op.id, paused.id] {
        exec(
            &db,
            &format!(
                "UPDATE operations SET next_action_at = now() - interval '10 minutes' WHERE id = '{}'",
                id.as_uuid()
            ),
        )
        .await;
    }
    let text = admin(&db, &["stats"]);
    let text = String::from_utf8_lossy(&text.stdout);
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("no worker has claimed"))
        .collect();
    assert_eq!(named.len(), 1, "{text}");
    assert!(
        named[0].starts_with("provider acme-old: 1 operations due"),
        "{text}"
    );
    let s = json(&admin(&db, &["stats", "--json"]));
    let old = s["due"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["provider"] == "acme-old")
        .unwrap_or_else(|| panic!("{s}"));
    assert_eq!(old["due"], 1);
    let waited = old["oldest_secs"].as_f64().unwrap();
    assert!((600.0..900.0).contains(&waited), "{waited}");
}

/// A retry of an operation abandoned before anyone settled whether its create made a job is a new
/// create beside a job that may exist: refused, nothing written, until the person says they
/// accept that (`--job-may-exist`). One abandoned with its job known is retried as before.
#[tokio::test]
async fn a_retry_after_abandoning_an_unsettled_create_needs_the_person_to_accept_a_second_job() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let decide = |verb: &str, op: &OperationRecord, seen: String, more: &[&str]| {
        let id = op.id.to_string();
        let mut args = vec![verb, id.as_str(), "--seen", seen.as_str()];
        args.extend_from_slice(&["--actor", "alice", "--reason", "checked"]);
        args.extend_from_slice(more);
        admin(&db, &args)
    };
    let mut both = Vec::new();
    for op in [unresolved(&store, 1).await, timed_out(&store, 2).await] {
        let seen = format!("{}@{}", op.state, op.history_seq);
        let out = decide("abandon", &op, seen, &[]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        both.push(store.get(op.id).await.unwrap());
    }
    let [unsettled, known] = <[OperationRecord; 2]>::try_from(both).unwrap();
    let seen = |op: &OperationRecord| format!("abandoned@{}", op.history_seq);
    let totals = store.totals().await.unwrap().0;
    let refused = decide("retry", &unsettled, seen(&unsettled), &[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 4, "{err}");
    assert!(
        err.contains("abandoned in create_unresolved") && err.contains("--job-may-exist"),
        "{err}"
    );
    assert_eq!(store.totals().await.unwrap().0, totals, "nothing written");
    assert_eq!(
        store.get(unsettled.id).await.unwrap().history_seq,
        unsettled.history_seq
    );
    // Nor may the agent start one by submitting a new operation that supersedes it.
    let service = jobtrail_service::Service::new(
        store.clone(),
        jobtrail_provider::Registry::load_dir(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../providers"
        )))
        .unwrap(),
    );
    let agent = jobtrail_service::Principal::new(
        unsettled.caller.clone(),
        [
            jobtrail_service::Scope::Submit,
            jobtrail_service::Scope::Read,
        ],
    );
    let own = jobtrail_service::SubmitRequest {
        id: None,
        provider: unsettled.provider.clone(),
        target: unsettled.target.clone(),
        request: unsettled.request_body.clone(),
        approved_by: "alice".into(),
        approval_ref: None,
        create_deadline: None,
        result_deadline: None,
        cancel_window: None,
        supersedes: Some(unsettled.id.to_string()),
    };
    let err = service.submit(&agent, own, None).await.unwrap_err();
    assert_eq!(err.kind, jobtrail_service::Kind::Conflict, "{err}");
    assert!(err.message.contains("only a person may retry it"), "{err}");
    assert_eq!(store.totals().await.unwrap().0, totals, "nothing written");
    let out = decide("retry", &unsettled, seen(&unsettled), &["--job-may-exist"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let out = decide("retry", &known, seen(&known), &["--job-may-exist"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(store.totals().await.unwrap().0, totals + 2);
    // The person's word stays in the record of the retried operation, with their name; where it
    // was not asked for (the job known), it says nothing.
    for (op, said) in [(&unsettled, Some(true)), (&known, None)] {
        let link = store.history(op.id).await.unwrap().pop().unwrap();
        assert_eq!(link.event, "superseded");
        assert_eq!(link.actor, "alice");
        let evidence = &link.detail["evidence"];
        assert_eq!(evidence["job_may_exist"].as_bool(), said, "{}", link.detail);
        assert_eq!(
            evidence["abandoned_in"].as_str(),
            said.map(|_| "create_unresolved"),
            "{}",
            link.detail
        );
    }
}

/// Decisions a careless operator (or a hostile one) could make, refused with nothing written: a
/// second retry of the same operation, adopting a job another operation owns (or a job id that
/// would address another resource), resuming with no cancel window, and a submission superseding an
/// operation that is still live.
#[tokio::test]
async fn careless_decisions_are_refused_and_write_nothing() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let decide = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        admin(&db, &args)
    };
    // A second retry of one finished operation.
    let b = unresolved(&store, 1).await;
    let id = b.id.to_string();
    let base = ["--actor", "alice", "--reason", "checked"];
    let with = |head: &[&str]| -> Vec<String> {
        head.iter()
            .chain(base.iter())
            .map(|s| s.to_string())
            .collect()
    };
    // Whether a job exists is not decided on a bare state (it would pass an operation that left
    // create_unresolved and came back).
    let bare = decide(&with(&[
        "declare-not-created",
        &id,
        "--seen",
        "create_unresolved",
    ]));
    assert_eq!(code(&bare), 2, "{}", String::from_utf8_lossy(&bare.stderr));
    assert!(String::from_utf8_lossy(&bare.stderr).contains("STATE@SEQ"));
    assert_eq!(
        store.get(b.id).await.unwrap().state,
        State::CreateUnresolved
    );
    assert_eq!(
        code(&decide(&with(&[
            "declare-not-created",
            &id,
            "--seen",
            &format!("create_unresolved@{}", b.history_seq),
        ]))),
        0
    );
    assert_eq!(
        code(&decide(&with(&["retry", &id, "--seen", "not_created"]))),
        0
    );
    let again = decide(&with(&["retry", &id, "--seen", "not_created"]));
    assert_eq!(
        code(&again),
        4,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("already retried"));

    // Adopting a job another operation owns, or a job id that is not one.
    let owner = violation(&store, 2).await; // holds job_a (and job_b as the other answer)
    let a = unresolved(&store, 3).await;
    let seen = format!("create_unresolved@{}", a.history_seq);
    for (job, want) in [("job_a", 4), ("job_b", 4), ("..", 2)] {
        let out = decide(&with(&[
            "adopt",
            &a.id.to_string(),
            "--job-id",
            job,
            "--seen",
            &seen,
        ]));
        assert_eq!(
            code(&out),
            want,
            "{job}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        String::from_utf8_lossy(
            &decide(&with(&[
                "adopt",
                &a.id.to_string(),
                "--job-id",
                "job_a",
                "--seen",
                &seen
            ]))
            .stderr
        )
        .contains(&owner.id.to_string())
    );
    assert_eq!(
        store.get(a.id).await.unwrap().history_seq,
        a.history_seq,
        "nothing written"
    );

    // Resuming an unconfirmed cancel with a window of nothing.
    let u = unconfirmed(&store, 4).await;
    let out = decide(&with(&[
        "resume",
        &u.id.to_string(),
        "--cancel-window",
        "0s",
        "--seen",
        "cancellation_unconfirmed",
    ]));
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));

    // A deadline the resumed state does not use is refused, not ignored.
    for (flag, field) in [
        ("--result-deadline", "result_deadline"),
        ("--create-deadline", "create_deadline"),
    ] {
        let out = decide(&with(&[
            "resume",
            &u.id.to_string(),
            flag,
            "+2h",
            "--cancel-window",
            "10m",
            "--seen",
            "cancellation_unconfirmed",
        ]));
        assert_eq!(
            code(&out),
            2,
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains(field));
    }
    assert_eq!(
        store.get(u.id).await.unwrap().history_seq,
        u.history_seq,
        "nothing written"
    );

    // Resuming an unresolved create where the provider offers no reconciliation would hold it
    // again at once: refused, naming what to do instead, nothing written.
    let none = std::env::temp_dir().join(format!("jobtrail-no-reconcile-{}", std::process::id()));
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../providers");
    std::fs::create_dir_all(none.join("schemas")).unwrap();
    for dir in ["", "schemas"] {
        for e in std::fs::read_dir(std::path::Path::new(shipped).join(dir))
            .unwrap()
            .flatten()
        {
            if e.path().is_file() {
                std::fs::copy(e.path(), none.join(dir).join(e.file_name())).unwrap();
            }
        }
    }
    let sim = std::fs::read_to_string(none.join("sim.toml")).unwrap();
    let edited = sim.replace(
        "[reconcile]\nmethod = \"resend\"",
        "[reconcile]\nmethod = \"none\"",
    );
    assert_ne!(
        sim, edited,
        "the shipped sim contract reconciles by resending"
    );
    std::fs::write(none.join("sim.toml"), edited).unwrap();
    let held = unresolved(&store, 5).await;
    let resume = |providers: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
            .args(with(&[
                "resume",
                &held.id.to_string(),
                "--create-deadline",
                "+1h",
                "--seen",
                &format!("create_unresolved@{}", held.history_seq),
                "--json",
            ]))
            .env("DATABASE_URL", &db.url)
            .env("JOBTRAIL_PROVIDERS", providers)
            .output()
            .unwrap()
    };
    // Nor is it offered: `show` and `escalations` leave it out where the contract cannot
    // reconcile, and offer it where it can.
    let offered = |providers: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .env("JOBTRAIL_PROVIDERS", providers)
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let listed = match v.as_array() {
            Some(list) => list
                .iter()
                .find(|e| e["operation_id"] == held.id.to_string())
                .expect("the held operation is listed")
                .clone(),
            None => v,
        };
        listed["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == "resume")
    };
    let held_id = held.id.to_string();
    for args in [
        &["show", &held_id, "--json"][..],
        &["escalations", "--state", "create_unresolved", "--json"],
    ] {
        assert!(!offered(&none, args), "{args:?}");
        assert!(offered(std::path::Path::new(shipped), args), "{args:?}");
    }
    let out = resume(&none);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 4, "{err}");
    assert!(
        err.contains("no way to find a job") && err.contains("adopt"),
        "{err}"
    );
    assert_eq!(
        store.get(held.id).await.unwrap().history_seq,
        held.history_seq,
        "nothing written"
    );
    // Where the contracts cannot be read, or are read without this provider's, whether it can be
    // reconciled cannot be told: refused too (exit 5), not spent on a resume held again at once.
    std::fs::rename(none.join("sim.toml"), none.join("sim.toml.off")).unwrap();
    for providers in [
        std::env::temp_dir().join("jobtrail-no-such-providers-dir"),
        none.clone(),
    ] {
        let out = resume(&providers);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 5, "{err}");
        assert!(err.contains("nothing was decided"), "{err}");
        assert_eq!(
            store.get(held.id).await.unwrap().history_seq,
            held.history_seq,
            "nothing written"
        );
    }
    let _ = std::fs::remove_dir_all(&none);
    // Where it reconciles (the shipped contract resends), the same resume is taken.
    let out = resume(std::path::Path::new(shipped));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let now = store.get(held.id).await.unwrap();
    assert_eq!(now.state, State::Reconciliation);
    // The answer names where its history now stands.
    let answer = json(&out);
    assert_eq!(answer["state"], "reconciliation", "{answer}");
    assert_eq!(answer["history_seq"], now.history_seq, "{answer}");

    // A new operation may supersede only a finished one.
    let live = timed_out(&store, 5).await;
    let mut s = Submission {
        provider: "sim".into(),
        target: "reports".into(),
        body: br#"{"n": 6}"#.to_vec(),
        caller: "agent-7".into(),
        approved_by: "alice".into(),
        supersedes: Some(live.id),
        ..Default::default()
    };
    let err = store
        .submit_new(&s, &terms(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, jobtrail_store::StoreError::Conflict(_)),
        "{err}"
    );
    s.supersedes = Some(b.id);
    let err = store
        .submit_new(&s, &terms(), SubmitLimits::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already retried"), "{err}");
}

#[test]
fn without_database_url_it_refuses_and_starts_no_database_of_its_own() {
    let data = std::env::temp_dir().join(format!("jobtrail-admin-no-db-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
        .arg("escalations")
        .env_remove("DATABASE_URL")
        .env("XDG_DATA_HOME", &data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 5, "{err}");
    assert!(err.contains("DATABASE_URL is not set"), "{err}");
    assert!(!data.exists(), "a private cluster was started");
}

/// Its warnings go to stderr through the same log settings as `jobtrail`'s: a misspelt filter is
/// refused before anything is done, naming the variable.
#[test]
fn its_log_settings_are_jobtrails() {
    let run = |var: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
            .arg("escalations")
            .env_remove("DATABASE_URL")
            .env_remove("JOBTRAIL_LOG")
            .env_remove("JOBTRAIL_LOG_FORMAT")
            .env(var, value)
            .output()
            .unwrap()
    };
    for (var, value) in [
        ("JOBTRAIL_LOG", "jobtrail=loud"),
        ("JOBTRAIL_LOG_FORMAT", "jsn"),
    ] {
        let out = run(var, value);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{var}={value}: {err}");
        assert!(err.contains(var), "{var}={value}: {err}");
    }
    // Taken: on to the missing database.
    let out = run("JOBTRAIL_LOG", "info");
    assert_eq!(code(&out), 5, "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn an_anchor_never_covers_less_of_a_chain_than_there_is() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let id = op.id.as_uuid();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let heads =
        "SELECT history_seq, history_head, calls_seq, calls_head FROM operations WHERE id = $1";
    let kept: (i64, Vec<u8>, i64, Vec<u8>) = sqlx::query_as(heads)
        .bind(id)
        .fetch_one(&mut c)
        .await
        .unwrap();
    let made_up = "decode(repeat('ab', 32), 'hex')";
    for (edit, said_part) in [
        // A writer's login sets the row's head back two links (its columns are a step's), so that
        // an anchor taken now would leave the last two for an owner to remove later, unseen.
        (
            format!(
                "UPDATE operations SET history_seq = history_seq - 2, \
                 history_head = (SELECT hash FROM operation_history h \
                                 WHERE h.operation_id = '{id}' AND h.seq = operations.history_seq - 2) \
                 WHERE id = '{id}'"
            ),
            "runs past the head",
        ),
        // Or names a head its chain never had: anchored, every later verify would blame the chain.
        (
            format!("UPDATE operations SET history_head = {made_up} WHERE id = '{id}'"),
            "no link of its chain",
        ),
        (
            format!("UPDATE operations SET calls_head = {made_up} WHERE id = '{id}'"),
            "no link of its chain",
        ),
    ] {
        exec(
            &db,
            &format!("SET session_replication_role = replica; {edit}"),
        )
        .await;
        let out = admin(&db, &["audit", "anchor"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 8, "{edit}: {said}");
        assert!(
            said.contains(said_part) && said.contains(&op.id.to_string()),
            "{edit}: {said}"
        );
        let anchors: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_anchors")
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(anchors, 0, "{edit}: nothing was anchored");
        // Put back as it was for the next edit.
        exec(
            &db,
            &format!(
                "SET session_replication_role = replica; UPDATE operations SET history_seq = {}, \
                 history_head = decode('{}', 'hex'), calls_seq = {}, calls_head = decode('{}', 'hex') \
                 WHERE id = '{id}'",
                kept.0,
                hex::encode(&kept.1),
                kept.2,
                hex::encode(&kept.3)
            ),
        )
        .await;
    }
    // The row as its chains are: anchored.
    let out = admin(&db, &["audit", "anchor"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn an_anchor_that_cannot_be_kept_or_named_is_not_recorded() {
    let db = TestDb::new().await;
    let store = db.store().await;
    succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let anchors = || async {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_anchors")
            .fetch_one(&mut c)
            .await
            .unwrap()
    };
    let missing = std::env::temp_dir()
        .join(format!("no-such-dir-{}", uuid::Uuid::now_v7().simple()))
        .join("anchor.json");
    let out = admin(
        &db,
        &["audit", "anchor", "--out", missing.to_str().unwrap()],
    );
    assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out"));
    for actor in ["", "  ", "jane\u{7}"] {
        let out = admin(&db, &["audit", "anchor", "--actor", actor]);
        assert_eq!(
            code(&out),
            2,
            "{actor:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("--actor"));
    }
    assert_eq!(anchors().await, 0, "nothing was recorded");
    // An existing file is never overwritten, and refusing it records nothing either.
    let kept = std::env::temp_dir().join(format!("anchor-{}.json", uuid::Uuid::now_v7().simple()));
    std::fs::write(&kept, "keep me").unwrap();
    let out = admin(&db, &["audit", "anchor", "--out", kept.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "keep me");
    assert_eq!(anchors().await, 0);
    std::fs::remove_file(&kept).unwrap();
    // A run killed mid-way (Ctrl-C) left its partial file behind: it does not block the next.
    let mut stale = kept.as_os_str().to_owned();
    stale.push(".partial");
    std::fs::write(&stale, "half").unwrap();
    let out = admin(&db, &["audit", "anchor", "--out", kept.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(&stale).unwrap();
    assert!(
        std::fs::read_to_string(&kept)
            .unwrap()
            .contains("\"digest\"")
    );
    assert_eq!(anchors().await, 1);
    std::fs::remove_file(&kept).unwrap();
    // A directory (a scheduled job with no shell to name files): one file per anchor, by its id
    // and time, each one `verify` takes back.
    let dir = std::env::temp_dir().join(format!("anchors-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir(&dir).unwrap();
    for _ in 0..2 {
        let out = admin(&db, &["audit", "anchor", "--out", dir.to_str().unwrap()]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}: no partial file is left");
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("anchor-") && name.ends_with(".json"),
            "{name}"
        );
        let out = admin(
            &db,
            &[
                "audit",
                "verify",
                "--all",
                "--expect-anchor",
                f.to_str().unwrap(),
            ],
        );
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    }
    assert_eq!(anchors().await, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A mistyped id, view, actor or reason is bad input (exit 2) before any database is looked for,
/// not "database unavailable" (exit 5) because none was set; well-formed input gets that far.
#[test]
fn bad_input_is_refused_before_looking_for_a_database() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_jobtrail-admin"))
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        (
            code(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let op = "op_01JZZZZZZZZZZZZZZZZZZZZZZZ";
    let decided = |verb: &str, seen: &str, actor: &str| {
        run(&[
            verb, op, "--seen", seen, "--actor", actor, "--reason", "checked",
        ])
    };
    for (args, (got, err)) in [
        ("show", run(&["show", "op_nope"])),
        ("audit verify", run(&["audit", "verify", "12345"])),
        ("abandon --seen", decided("abandon", "finished", "alice")),
        (
            "abandon --seen @",
            decided("abandon", "result_timed_out@x", "alice"),
        ),
        (
            "abandon --actor",
            decided("abandon", "result_timed_out", "al\u{7}ice"),
        ),
        (
            "cancel --reason",
            run(&["cancel", op, "--actor", "bob", "--reason", ""]),
        ),
        (
            "audit anchor --actor",
            run(&["audit", "anchor", "--actor", " "]),
        ),
    ] {
        assert_eq!(got, 2, "{args}: {err}");
        assert!(!err.contains("DATABASE_URL"), "{args}: {err}");
    }
    let (got, err) = decided("abandon", "result_timed_out@4", "alice");
    assert_eq!(
        got, 5,
        "well-formed input reaches the missing database: {err}"
    );
}

/// The result served is the one the chain validated on the way into `succeeded`, from a chain the
/// state machine could have made: the worker's role may append links and move the row, so a
/// well-hashed `result_validated` appended after success, naming other bytes it stored, was served
/// by `jobtrail result` and the API although `audit verify` named the move.
#[tokio::test]
async fn a_result_validated_again_after_success_is_not_served() {
    use sha2::Digest;
    let db = TestDb::new().await;
    let store = db.store().await;
    let done = succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let served = store.chained_result(done.id).await.unwrap();
    let (location, sha) = (served.location.clone(), served.sha256.clone());
    assert_eq!(done.result_sha256.as_deref(), Some(sha.as_str()));
    // The content type served is the validated one, not the row's (which the worker's role may
    // update: a JSON result served as text/html).
    exec(&db, &format!(
        "SET ROLE jobtrail_worker; UPDATE operations SET result_content_type = 'text/html' WHERE id = '{}'",
        done.id.as_uuid()
    ))
    .await;
    assert_eq!(
        store.chained_result(done.id).await.unwrap().content_type,
        served.content_type
    );
    assert_ne!(served.content_type.as_deref(), Some("text/html"));

    let forged = br#"{"items":["forged"]}"#;
    let forged_sha = hex::encode(sha2::Sha256::digest(forged));
    let id = done.id.as_uuid();
    let forged_location = location.replace(&sha, &forged_sha);
    let actor = store.history(done.id).await.unwrap().pop().unwrap().actor;
    let (seq, insert, head) = next_link(
        &store,
        done.id,
        ("succeeded", "result_validated", "succeeded"),
        &actor,
        "result validated",
        serde_json::json!({
            "location": forged_location, "sha256": forged_sha, "size": forged.len(),
        }),
    )
    .await;
    exec(&db, &format!(
        "SET ROLE jobtrail_worker; \
         INSERT INTO operation_results (operation_id, sha256, size, bytes) VALUES ('{id}', '{forged_sha}', {}, decode('{}', 'hex')); \
         {insert}; \
         UPDATE operations SET result_sha256 = '{forged_sha}', result_location = '{forged_location}', result_size = {}, history_seq = {seq}, history_head = decode('{head}', 'hex') WHERE id = '{id}'",
        forged.len(),
        hex::encode(forged),
        forged.len(),
    ))
    .await;
    // The row and the chain's last link agree on the forged bytes, and every hash holds...
    let row = store.get(done.id).await.unwrap();
    assert_eq!(row.result_sha256.as_deref(), Some(forged_sha.as_str()));
    // ...but the move is one no engine makes: nothing is served.
    let refused = store.chained_result(done.id).await.unwrap_err().to_string();
    assert!(refused.contains("never makes"), "{refused}");
    assert_eq!(
        code(&admin(&db, &["audit", "verify", &done.id.to_string()])),
        1
    );
}

/// An anchor's heads are written with it, in the transaction that records it: the operator's role
/// (which may write anchors) cannot add a head to an anchor kept long ago, which would make every
/// later `verify --expect-anchor` of the kept anchor report its heads altered, for good.
#[tokio::test]
async fn a_head_added_to_an_old_anchor_is_refused() {
    let db = TestDb::new().await;
    let store = db.store().await;
    succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let out = admin(
        &db,
        &["audit", "anchor", "--actor", "auditor-jane", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let kept = json(&out)["anchor"]["digest"].as_str().unwrap().to_owned();
    let later = succeeded_with_result(&store, 2, br#"{"items":[2]}"#).await;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let refused = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET ROLE jobtrail_operator; \
         INSERT INTO audit_anchor_heads (anchor_id, operation_id, seq, hash, calls_seq, calls_hash) \
         SELECT (SELECT max(id) FROM audit_anchors), id, history_seq, history_head, calls_seq, calls_head \
         FROM operations WHERE id = '{}'",
        later.id.as_uuid()
    )))
    .execute(&mut c)
    .await
    .expect_err("a head was added to an old anchor");
    assert!(
        refused.to_string().contains("written with the anchor"),
        "{refused}"
    );
    // The kept anchor still holds, and a new anchor still records its heads.
    let out = admin(&db, &["audit", "verify", "--all", "--expect-anchor", &kept]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    let out = admin(&db, &["audit", "anchor", "--actor", "auditor-jane"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
}

/// One remote job, one operation, when two people decide at once: two adopts of the same job onto
/// two operations (two terminals, the same minute) leave it adopted by exactly one, every time;
/// and a person cannot choose, for a contract violation, a job another operation holds.
#[tokio::test]
async fn one_job_is_adopted_by_one_operation_when_two_people_decide_at_once() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let adopt = |op: &OperationRecord, job: &str, who: &str| {
        let store = store.clone();
        let (id, job, who) = (op.id, job.to_owned(), who.to_owned());
        async move {
            store
                .decide(
                    id,
                    State::CreateUnresolved,
                    None,
                    Step::event(Event::AdoptRemoteJob {
                        decision: Decision::new(&who, "found it in the console").unwrap(),
                        remote_job_id: job,
                    }),
                )
                .await
        }
    };
    for round in 0..12u32 {
        let a = unresolved(&store, 100 + 2 * round).await;
        let b = unresolved(&store, 101 + 2 * round).await;
        let job = format!("job_shared_{round}");
        let (x, y) = tokio::join!(adopt(&a, &job, "alice"), adopt(&b, &job, "bob"));
        assert_eq!(
            usize::from(x.is_ok()) + usize::from(y.is_ok()),
            1,
            "round {round}: {:?} / {:?}",
            x.as_ref().err(),
            y.as_ref().err()
        );
        let refused = if x.is_ok() { y } else { x };
        assert!(
            matches!(&refused, Err(jobtrail_store::StoreError::Conflict(m)) if m.contains("one remote job, one operation")),
            "{refused:?}"
        );
    }
    // A contract violation's other answer that another operation holds is not chosen.
    let held = driven(&store, 200, vec![accepted("job_b")]).await;
    let v = violation(&store, 201).await;
    let e = store
        .decide(
            v.id,
            State::ContractViolation,
            None,
            Step::event(Event::ChooseRemoteJob {
                decision: Decision::new("alice", "the provider says b").unwrap(),
                remote_job_id: "job_b".into(),
            }),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&held.id.to_string()), "{e}");
}

/// No role, the owner included, can move an operation back into `create_pending` with plain SQL
/// (where a worker would send the create again: a second paid job): the database refuses it and
/// the row stays as it was.
#[tokio::test]
async fn no_role_rewinds_an_operation_to_be_created_again() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let done = succeeded_with_result(&store, 1, br#"{"items":[1]}"#).await;
    let not_created = unresolved(&store, 2).await;
    for (op, role) in [
        (&done, "SET ROLE jobtrail_operator; "),
        (&done, "SET ROLE jobtrail_worker; "),
        (&done, "SET ROLE jobtrail_api; "),
        (&not_created, ""),
    ] {
        let e = try_exec(
            &db,
            &format!(
                // The job is left as it is: clearing it is refused on its own (a job changes
                // only with a link that names it), before this refusal is reached.
                "{role}UPDATE operations SET state = 'create_pending', \
                 finished_at = NULL, escalated_at = NULL, escalation_reason = NULL, \
                 create_attempts = 0, next_action_at = now() WHERE id = '{}'",
                op.id.as_uuid()
            ),
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string().contains("back into create_pending"),
            "{role}{e}"
        );
        let now = store.get(op.id).await.unwrap();
        assert_eq!((now.state, now.history_seq), (op.state, op.history_seq));
    }
}

/// A deadline a person sets is in the future by the database's clock, whatever the deciding
/// machine's clock says: one already past is refused and nothing is written.
#[tokio::test]
async fn a_deadline_a_person_sets_is_checked_by_the_database_clock() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let op = timed_out(&store, 1).await;
    let resume = |at: chrono::DateTime<chrono::Utc>| {
        let mut step = Step::event(Event::Resume {
            decision: Decision::new("alice", "the provider needs another hour").unwrap(),
        });
        step.set_result_deadline = Some(at);
        step
    };
    let now = store.db_now().await.unwrap();
    let e = store
        .decide(
            op.id,
            State::ResultTimedOut,
            None,
            resume(now - chrono::Duration::seconds(5)),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("database's clock"), "{e}");
    assert_eq!(store.get(op.id).await.unwrap().history_seq, op.history_seq);
    let applied = store
        .decide(
            op.id,
            State::ResultTimedOut,
            None,
            resume(now + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    assert_eq!(applied.record.state, State::Observing);
}
