//! An agent over MCP, with rmcp's own client, over both transports: Streamable HTTP (`/mcp` inside
//! `jobtrail serve`, bearer token) and stdio (`jobtrail mcp`, which talks to the HTTP API with a
//! token). Plain tool calls, then the same through MCP Tasks, with the MCP server restarted between
//! `tools/call` and `tasks/get`: tasks are operations, kept in PostgreSQL.

mod support;

use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use std::time::Duration;
use support::{Env, Server};

type Client = RunningService<RoleClient, ClientConfig>;

fn config(tasks: bool) -> ClientConfig {
    let caps = if tasks {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    ClientConfig::new(caps, Implementation::new("jobtrail-test-agent", "0"))
}

async fn over_http(server: &Server, token: &str, tasks: bool) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url("/mcp")).auth_header(token),
    );
    tokio::time::timeout(Duration::from_secs(20), config(tasks).serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

async fn over_stdio(server: &Server, token: &str, tasks: bool) -> Client {
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_jobtrail")).configure(|c| {
            c.arg("mcp")
                .env_remove("DATABASE_URL")
                .env("JOBTRAIL_API", &server.base)
                .env("JOBTRAIL_TOKEN", token)
                .env("JOBTRAIL_LOG", "warn");
        }),
    )
    .expect("spawn jobtrail mcp");
    tokio::time::timeout(Duration::from_secs(20), config(tasks).serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    tokio::time::timeout(Duration::from_secs(90), client.call_tool(params))
        .await
        .expect("tool call in time")
        .expect("tool call")
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().expect("structured content")
}

fn request(script: Value) -> Value {
    json!({"report": "usage", "sim": script})
}

/// initialize, tools/list, submit → wait → result, a cancel, and the refusals an agent meets.
async fn plain_session(env: &Env, client: &Client, caller: &str) {
    let info = client.peer_info().expect("initialized");
    assert_eq!(info.server_info.as_ref().unwrap().name, "jobtrail");
    let tools = client.list_all_tools().await.unwrap();
    let names: std::collections::BTreeSet<String> =
        tools.iter().map(|t| t.name.to_string()).collect();
    let expected: std::collections::BTreeSet<String> = [
        "submit_operation",
        "get_operation",
        "wait_operation",
        "cancel_operation",
        "get_result",
        "list_operations",
        "list_providers",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(names, expected, "never the operator decisions");
    for t in &tools {
        assert!(
            t.description.as_ref().is_some_and(|d| d.len() > 40),
            "{}",
            t.name
        );
        assert!(!t.input_schema.is_empty(), "{}", t.name);
    }
    // A host may retry a tool marked idempotent: submitting is not, unless the agent names its id.
    let submit = tools.iter().find(|t| t.name == "submit_operation").unwrap();
    assert_eq!(
        submit.annotations.as_ref().and_then(|a| a.idempotent_hint),
        Some(false)
    );

    let providers = structured(&call(client, "list_providers", json!({})).await);
    assert!(
        providers["providers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "sim")
    );

    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    let r = call(
        client,
        "submit_operation",
        json!({"id": id, "provider": "sim", "target": "reports", "approved_by": "alice",
               "request": request(json!({"duration_ms": 300}))}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let s = structured(&r);
    assert_eq!(s["operation"]["caller"], caller);
    let w = structured(
        &call(
            client,
            "wait_operation",
            json!({"operation_id": id, "timeout_secs": 60}),
        )
        .await,
    );
    assert_eq!(w["operation"]["state"], "succeeded", "{w}");
    let res = structured(&call(client, "get_result", json!({"operation_id": id})).await);
    let op = env.store.get(id.parse().unwrap()).await.unwrap();
    assert_eq!(res["sha256"].as_str(), op.result_sha256.as_deref());
    let text = res["text"].as_str().unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes())),
        res["sha256"].as_str().unwrap()
    );

    // Uncertainty is said plainly.
    let g = structured(
        &call(
            client,
            "get_operation",
            json!({"operation_id": id, "timeline": true}),
        )
        .await,
    );
    assert!(g["timeline"].as_array().unwrap().len() >= 3);
    assert!(g.get("timeline_earlier").is_none(), "{g}");
    // A page before a link: only the links before it.
    let g = structured(
        &call(
            client,
            "get_operation",
            json!({"operation_id": id, "timeline": true, "timeline_before": 2}),
        )
        .await,
    );
    assert_eq!(g["timeline"].as_array().unwrap().len(), 1, "{g}");
    assert_eq!(g["timeline"][0]["seq"], 1);

    // A cancel: recorded at once, cancelled when the provider confirms.
    let long = structured(
        &call(
            client,
            "submit_operation",
            json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                   "request": request(json!({"never_finish": true}))}),
        )
        .await,
    )["operation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    env.wait_for(
        long.parse().unwrap(),
        "a job id",
        Duration::from_secs(20),
        |o| o.remote_job_id.is_some(),
    )
    .await;
    // Running is not failed: the error says there is no result yet.
    let r = call(client, "get_result", json!({"operation_id": long})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"], "not-finished");
    let c = structured(
        &call(
            client,
            "cancel_operation",
            json!({"operation_id": long, "reason": "over budget"}),
        )
        .await,
    );
    assert!(
        c["note"].as_str().unwrap().contains("provider confirms"),
        "{c}"
    );
    let w = structured(
        &call(
            client,
            "wait_operation",
            json!({"operation_id": long, "timeout_secs": 60}),
        )
        .await,
    );
    assert_eq!(w["operation"]["state"], "cancelled", "{w}");

    // Refusals are tool errors an agent can read, not protocol errors.
    let r = call(client, "get_result", json!({"operation_id": long})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"], "not-succeeded");
    let r = call(
        client,
        "get_operation",
        json!({"operation_id": "op_nonsense"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    let r = call(
        client,
        "submit_operation",
        json!({"provider": "sim", "target": "reports", "approved_by": "a", "caller": "someone-else",
               "request": {}}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "a caller field is refused: {r:?}");

    // Text PostgreSQL cannot store (NUL), a terminal escape, or a novel as a name: refused as bad
    // input at this door as at the HTTP one (not "unavailable", and never the database's words),
    // with nothing written.
    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    for (field, value) in [
        ("target", "rep\u{0}orts".to_owned()),
        ("approved_by", "alice\u{1b}[2J".to_owned()),
        ("approval_ref", "x".repeat(5000)),
    ] {
        let mut args = json!({"id": id, "provider": "sim", "target": "reports",
                              "approved_by": "alice", "request": request(json!({}))});
        args[field] = json!(value);
        let r = call(client, "submit_operation", args).await;
        assert_eq!(r.is_error, Some(true), "{field}: {r:?}");
        let e = structured(&r);
        assert_eq!(e["error"], "bad-input", "{field}: {e}");
        let message = e["message"].as_str().unwrap();
        // (Through the HTTP API, stdio's way, a NUL is already refused by its strict JSON reader.)
        assert!(
            message.contains(field) || message.contains("NUL character"),
            "{field}: {message}"
        );
        assert!(
            !message.contains("22021") && !message.contains("database"),
            "{message}"
        );
    }
    assert!(
        env.store.get(id.parse().unwrap()).await.is_err(),
        "nothing written"
    );
    let r = call(
        client,
        "cancel_operation",
        json!({"operation_id": long, "reason": "stop\u{0}"}),
    )
    .await;
    assert_eq!(structured(&r)["error"], "bad-input", "{r:?}");
    let r = call(client, "list_operations", json!({"provider": "sim\u{0}"})).await;
    assert_eq!(structured(&r)["error"], "bad-input", "{r:?}");

    // A request over the provider's size limit (1 MiB for sim) but under the HTTP API's is refused
    // by jobtrail with a reason the agent can read, not cut off by the transport (rmcp's own limit
    // was 4 MiB).
    let r = call(
        client,
        "submit_operation",
        json!({"provider": "sim", "target": "reports", "approved_by": "alice",
               "request": {"report": "usage", "pad": "x".repeat(5 << 20)}}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"], "too-large", "{:?}", structured(&r));
}

/// submit_operation as a task; the MCP server restarted (`restart` gives a new session on a new
/// instance); tasks/get, the result in the completed task, tasks/cancel, tasks/list.
async fn tasks_session(env: &Env, first: &Client, restart: impl AsyncFnOnce() -> Client) {
    let created = match first
        .call_tool_once(
            CallToolRequestParams::new("submit_operation").with_arguments(
                json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                       "request": request(json!({"duration_ms": 1500}))})
                .as_object()
                .cloned()
                .unwrap(),
            ),
        )
        .await
        .unwrap()
    {
        CallToolResponse::Task(t) => t,
        other => panic!("a tasks client gets a task: {other:?}"),
    };
    let task_id = created.task.task_id.clone();
    assert!(
        task_id.parse::<jobtrail_core::OperationId>().is_ok(),
        "the task id is the operation id"
    );
    assert_eq!(created.task.status, TaskStatus::Working);
    let long = match first
        .call_tool_once(
            CallToolRequestParams::new("submit_operation").with_arguments(
                json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                       "request": request(json!({"never_finish": true}))})
                .as_object()
                .cloned()
                .unwrap(),
            ),
        )
        .await
        .unwrap()
    {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("{other:?}"),
    };

    let held = match first
        .call_tool_once(
            CallToolRequestParams::new("submit_operation").with_arguments(
                json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                       "create_deadline": "+2s", "result_deadline": "+3s",
                       "request": request(json!({"never_finish": true}))})
                .as_object()
                .cloned()
                .unwrap(),
            ),
        )
        .await
        .unwrap()
    {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("{other:?}"),
    };

    let client = restart().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let done = loop {
        let t = client
            .get_task(GetTaskParams::new(task_id.clone()))
            .await
            .unwrap();
        if t.task.status().is_terminal() {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "task never completed: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(
            t.task.task.poll_interval_ms.unwrap_or(500).min(500),
        ))
        .await;
    };
    assert_eq!(done.task.status(), TaskStatus::Completed);
    match &done.task.payload {
        TaskPayload::Completed { result } => {
            let r: CallToolResult = serde_json::from_value(Value::Object(result.clone())).unwrap();
            let s = r.structured_content.unwrap();
            assert_eq!(s["operation"]["state"], "succeeded");
            let op = env.store.get(task_id.parse().unwrap()).await.unwrap();
            assert_eq!(
                s["operation"]["result"]["sha256"].as_str(),
                op.result_sha256.as_deref()
            );
        }
        other => panic!("{other:?}"),
    }

    // Held for a person: input_required, saying why, and nothing the client could send.
    env.wait_state(
        held.parse().unwrap(),
        jobtrail_core::State::ResultTimedOut,
        Duration::from_secs(30),
    )
    .await;
    let t = client
        .get_task(GetTaskParams::new(held.clone()))
        .await
        .unwrap();
    assert_eq!(t.task.status(), TaskStatus::InputRequired);
    let says = t.task.task.status_message.clone().unwrap_or_default();
    assert!(
        says.starts_with("held for a person: result_timed_out"),
        "{says}"
    );
    match &t.task.payload {
        TaskPayload::InputRequired { input_requests } => assert!(input_requests.is_empty()),
        other => panic!("{other:?}"),
    }

    // tasks/cancel is a cancel request: acked at once, cancelled when the provider confirms.
    env.wait_for(
        long.parse().unwrap(),
        "a job id",
        Duration::from_secs(20),
        |o| o.remote_job_id.is_some(),
    )
    .await;
    client
        .cancel_task(CancelTaskParams::new(long.clone()))
        .await
        .unwrap();
    let op = env
        .wait_state(
            long.parse().unwrap(),
            jobtrail_core::State::Cancelled,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        op.cancel_reason.as_deref(),
        Some("tasks/cancel from the MCP client")
    );
    let t = client
        .get_task(GetTaskParams::new(long.clone()))
        .await
        .unwrap();
    assert_eq!(t.task.status(), TaskStatus::Cancelled);
    // A terminal task is not cancelled again: -32602, as the Tasks extension asks, nothing written.
    let links = env.store.history(op.id).await.unwrap().len();
    let e = client
        .cancel_task(CancelTaskParams::new(long.clone()))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("-32602"), "{e:?}");
    assert_eq!(env.store.history(op.id).await.unwrap().len(), links);

    // An unknown task is -32602; the list is the caller's.
    let e = client
        .get_task(GetTaskParams::new(
            jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string(),
        ))
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("-32602") || format!("{e:?}").contains("Task not found"),
        "{e:?}"
    );
    // Its data says what kind of refusal it is, as a tool's error does.
    assert!(format!("{e:?}").contains("not-found"), "{e:?}");
    let listed = client
        .send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "tasks/list",
            Some(json!({})),
        )))
        .await
        .unwrap();
    let listed = serde_json::to_value(&listed).unwrap();
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&task_id.as_str()) && ids.contains(&long.as_str()),
        "{listed}"
    );
    // Each listed task carries MCP 2025-11-25's names (the revision whose clients call
    // tasks/list) beside the extension's: `ttl` (null: kept for good) and `pollInterval`.
    for t in listed["tasks"].as_array().unwrap() {
        assert_eq!(t.get("ttl"), Some(&json!(null)), "{t}");
        assert_eq!(t["pollInterval"], t["pollIntervalMs"], "{t}");
        assert!(t["pollInterval"].as_u64().is_some(), "{t}");
    }
    // A cursor that is not a string is refused, not read as "from the start" (a client paging
    // with it would never end).
    let e = client
        .send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "tasks/list",
            Some(json!({"cursor": 5})),
        )))
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("invalid cursor") && format!("{e:?}").contains("bad-input"),
        "{e:?}"
    );
    let _ = client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_streamable_http_submits_waits_fetches_and_cancels_with_durable_tasks() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api-1");
    let token = env.token("agent-http", &["submit", "read", "cancel"]).await;

    // No token, or a bad one: the MCP endpoint refuses before any session.
    let c = support::http();
    let r = c
        .post(server.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED);

    let client = over_http(&server, &token, false).await;
    plain_session(&env, &client, "agent-http").await;
    let _ = client.cancel().await;

    let first = over_http(&server, &token, true).await;
    // Another caller's tasks are not found.
    let other = env.token("agent-other", &["read"]).await;
    let second_server = env.serve("api-2");
    tasks_session(&env, &first, async || {
        // The first server stops; another instance serves the same tasks.
        drop(server);
        let c = over_http(&second_server, &token, true).await;
        let stranger = over_http(&second_server, &other, true).await;
        let mine = env
            .store
            .list_page(&Default::default(), 1)
            .await
            .unwrap()
            .operations;
        let e = stranger
            .get_task(GetTaskParams::new(mine[0].id.to_string()))
            .await;
        assert!(e.is_err(), "another caller's task is not found");
        let theirs = stranger
            .send_request(ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/list",
                Some(json!({})),
            )))
            .await
            .unwrap();
        let theirs = serde_json::to_value(&theirs).unwrap();
        assert_eq!(
            theirs["tasks"],
            json!([]),
            "another caller lists none of mine"
        );
        let _ = stranger.cancel().await;
        c
    })
    .await;
    let _ = first.cancel().await;
    env.stop_workers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_stdio_needs_only_the_api_and_a_token() {
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve("api");
    let token = env
        .token("agent-stdio", &["submit", "read", "cancel"])
        .await;

    let client = over_stdio(&server, &token, false).await;
    plain_session(&env, &client, "agent-stdio").await;
    let _ = client.cancel().await;

    let first = over_stdio(&server, &token, true).await;
    tasks_session(&env, &first, async || {
        // The stdio server process ends; a new one serves the same tasks.
        over_stdio(&server, &token, true).await
    })
    .await;
    let _ = first.cancel().await;

    // Without a token the stdio server refuses to start a useful session: every call says so.
    let bad = over_stdio(&server, &format!("jtk_{}", "a".repeat(64)), false).await;
    let r = call(&bad, "list_operations", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["error"], "unauthenticated");
    let _ = bad.cancel().await;
    env.stop_workers().await;
}

/// A caller holds at most `--mcp-sessions-per-caller` MCP sessions open at once (each is a task
/// and its channels until closed or idle for 5 minutes): past it, opening another is refused with
/// 429 `rate-limited`, while another caller still opens one; closing one makes room.
/// DNS-rebinding protection: `/mcp` answers a Host it was told of, and loopback besides, never
/// another name (a page on evil.example that resolved its name to this server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_named_hosts_besides_loopback_and_no_other() {
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_MCP_ALLOWED_HOSTS", "jobtrail.example")]);
    let token = env.token("agent-alice", &["read"]).await;
    let c = support::http();
    for (host, allowed) in [
        (None, true),
        (Some("jobtrail.example"), true),
        (Some("localhost"), true),
        (Some("evil.example"), false),
    ] {
        let mut r = c
            .post(server.url("/mcp"))
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .json(&support::mcp_initialize());
        if let Some(h) = host {
            r = r.header("host", h);
        }
        let status = r.send().await.unwrap().status();
        assert_eq!(
            status == reqwest::StatusCode::OK,
            allowed,
            "{host:?}: {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_holds_a_bounded_number_of_mcp_sessions() {
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_MCP_SESSIONS_PER_CALLER", "2")]);
    let alice = env.token("agent-alice", &["read"]).await;
    let bob = env.token("agent-bob", &["read"]).await;
    let c = support::http();
    let open = |token: &str| {
        c.post(server.url("/mcp"))
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .json(&support::mcp_initialize())
            .send()
    };
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let r = open(&alice).await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::OK);
        sessions.push(r.headers()["mcp-session-id"].to_str().unwrap().to_owned());
    }
    let refused = open(&alice).await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let p: Value = refused.json().await.unwrap();
    assert_eq!(p["kind"], "rate-limited", "{p}");
    // An `initialize` spelt with a JSON escape is one to rmcp: counted, refused.
    let escaped = c
        .post(server.url("/mcp"))
        .bearer_auth(&alice)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            r#"{"jsonrpc": "2.0", "id": 1, "method": "initializ\u0065", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}"#,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(escaped.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    // A session is its opener's: another caller cannot close (or read) it.
    let stolen = c
        .delete(server.url("/mcp"))
        .bearer_auth(&bob)
        .header("mcp-session-id", &sessions[1])
        .send()
        .await
        .unwrap();
    assert_eq!(stolen.status(), reqwest::StatusCode::NOT_FOUND);
    let replayed = c
        .get(server.url("/mcp"))
        .bearer_auth(&bob)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &sessions[1])
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), reqwest::StatusCode::NOT_FOUND);
    // A session id that is not text is no session id to rmcp: still an opening, still refused.
    let junk = c
        .post(server.url("/mcp"))
        .bearer_auth(&alice)
        .header("accept", "application/json, text/event-stream")
        .header(
            "mcp-session-id",
            reqwest::header::HeaderValue::from_bytes(b"\x80junk").unwrap(),
        )
        .json(&support::mcp_initialize())
        .send()
        .await
        .unwrap();
    assert_eq!(junk.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    // What opens no session is not counted (rmcp answers it as it does).
    let other = c
        .post(server.url("/mcp"))
        .bearer_auth(&alice)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_ne!(other.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        open(&bob).await.unwrap().status(),
        reqwest::StatusCode::OK,
        "another caller is not held back"
    );
    let closed = c
        .delete(server.url("/mcp"))
        .bearer_auth(&alice)
        .header("mcp-session-id", &sessions[0])
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let untouched = c
        .delete(server.url("/mcp"))
        .bearer_auth(&alice)
        .header("mcp-session-id", &sessions[1])
        .send()
        .await
        .unwrap();
    assert!(
        untouched.status().is_success(),
        "the session another caller tried to close is still its opener's: {}",
        untouched.status()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = open(&alice).await.unwrap();
        if r.status() == reqwest::StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no room after closing a session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A large request body's turn (`--bodies-per-caller`) is held until the answer has been sent to
/// its end: over MCP the call is answered as a stream at once and runs behind it, so a submit of
/// more than 64 KiB waiting for the database still holds its caller's turn (and what it parsed
/// from the body). A small body's turn is given back once it has arrived: a long MCP wait holds
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_holds_its_body_turn_until_it_is_answered() {
    let env = Env::new().await;
    let server = env.serve_with("api", &[("JOBTRAIL_BODIES_PER_CALLER", "1")]);
    let token = env.token("agent-alice", &["submit", "read"]).await;
    let client = std::sync::Arc::new(over_http(&server, &token, false).await);
    let c = support::http();
    let probe = || async {
        c.post(server.url("/v1/operations"))
            .bearer_auth(&token)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .status()
    };
    // Free once the client's own opening requests are done with theirs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while probe().await != reqwest::StatusCode::BAD_REQUEST {
        assert!(std::time::Instant::now() < deadline, "no turn came free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let lock = support::WriteLock::on_operations(&env.url).await;
    let submitted = tokio::spawn({
        let client = client.clone();
        async move {
            call(
                &client,
                "submit_operation",
                json!({"provider": "sim", "target": "reports", "approved_by": "alice",
                       "request": {"report": "usage", "sim": {"duration_ms": 300},
                                   "notes": "n".repeat(70 * 1024)}}),
            )
            .await
        }
    });
    support::until_blocked_on(&env.url, "operations").await;
    assert_eq!(
        probe().await,
        reqwest::StatusCode::TOO_MANY_REQUESTS,
        "an MCP submit waiting for the database gave its turn back"
    );
    lock.release().await;
    let r = tokio::time::timeout(Duration::from_secs(30), submitted)
        .await
        .expect("the MCP submit never answered once the lock was gone")
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let id = structured(&r)["operation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // A wait (a small body) holds no turn while it waits: no worker runs, so it waits its 3 s.
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            call(
                &client,
                "wait_operation",
                json!({"operation_id": id, "timeout_secs": 3}),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        assert!(!waiting.is_finished(), "the wait did not wait");
        assert_eq!(
            probe().await,
            reqwest::StatusCode::BAD_REQUEST,
            "an MCP wait held its caller's turn"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the wait did not end")
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while probe().await != reqwest::StatusCode::BAD_REQUEST {
        assert!(
            std::time::Instant::now() < deadline,
            "an answered MCP call kept its turn"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A result sent over MCP holds one of its caller's result turns, as over HTTP, and its answer's
/// bytes as sent, until the last of the answer has gone: a client that leaves its answer unread
/// holds its turn (until `--send-timeout` closes the connection), and one that read it has its turn
/// back at once. Before, the turn was held for 10 s after the answer was built, whether it had been
/// sent or not: a caller that never read could make the server hold an answer every 10 s per turn,
/// each counted as the result alone although the answer carries it twice, escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_sent_over_mcp_hold_their_callers_result_turns_until_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut env = Env::new().await;
    env.start_worker("w1", Duration::from_secs(5));
    let server = env.serve_with("api", &[("JOBTRAIL_RESULTS_PER_CALLER", "1")]);
    let token = env.token("agent-alice", &["submit", "read"]).await;
    let client = over_http(&server, &token, false).await;
    // A result the provider answered at once, echoing the request: 450 000 backslashes, some
    // 0.9 MiB as JSON text, and an answer of some 5.5 MiB (each backslash escaped once in the
    // structured value and twice in its text copy): more than the kernel takes from the server
    // for a reader that reads nothing.
    let mut request = request(json!({"create": ["sync_echo"], "duration_ms": 0}));
    request["pad"] = "\\".repeat(450_000).into();
    let r = call(
        &client,
        "submit_operation",
        json!({"provider": "sim", "target": "reports", "approved_by": "alice",
               "request": request}),
    )
    .await;
    let id = structured(&r)["operation"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", r.content))
        .to_owned();
    let w = structured(
        &call(
            &client,
            "wait_operation",
            json!({"operation_id": id, "timeout_secs": 60}),
        )
        .await,
    );
    assert_eq!(
        w["operation"]["state"], "succeeded",
        "{}",
        w["operation"]["state"]
    );
    // Read to its end, an answer gives its turn back at once.
    for _ in 0..2 {
        let got = call(&client, "get_result", json!({"operation_id": id})).await;
        assert_eq!(
            got.is_error,
            Some(false),
            "a result read was not given back"
        );
    }

    // An answer left unread holds the turn.
    let session = support::mcp_session(&server, &token).await;
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                      "params": {"name": "get_result", "arguments": {"operation_id": id}}})
    .to_string();
    let addr = server.base.trim_start_matches("http://").to_owned();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut unread = socket.connect(addr.parse().unwrap()).await.unwrap();
    unread
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Mcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: {session}\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(20), unread.read(&mut head))
        .await
        .expect("answered in time")
        .unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    // The answer is built behind its stream: wait until the turn is taken.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let again = call(&client, "get_result", json!({"operation_id": id})).await;
        if again.is_error == Some(true) {
            assert_eq!(structured(&again)["error"], "rate-limited", "{again:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an unread answer held no turn"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held well past the 10 s it was held before, and over HTTP too: one turn, whichever door.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let by_http = support::http()
        .get(server.url(&format!("/v1/operations/{id}/result")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(by_http.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    // The connection gone, the turn comes back.
    drop(unread);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let again = call(&client, "get_result", json!({"operation_id": id})).await;
        if again.is_error == Some(false) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the turn never came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What is counted is the answer as sent: a server that may hold 4 MiB serves the 0.9 MiB
    // result over HTTP, but not its 5.5 MiB answer over MCP.
    let narrow = env.serve_with("api-narrow", &[("JOBTRAIL_HELD_MIB", "4")]);
    let served = support::http()
        .get(narrow.url(&format!("/v1/operations/{id}/result")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), reqwest::StatusCode::OK);
    let client = over_http(&narrow, &token, false).await;
    let refused = call(&client, "get_result", json!({"operation_id": id})).await;
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(structured(&refused)["error"], "unavailable", "{refused:?}");
    assert!(
        format!("{refused:?}").contains("--held-mib"),
        "the refusal names the flag"
    );
    env.stop_workers().await;
}

/// A tool's refusal is counted where the HTTP routes count theirs (`jobtrail_api_problems_total`,
/// by kind): an operator watching refusals sees agents refused over MCP too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_refusal_is_counted_as_a_problem_the_api_answered() {
    let env = Env::new().await;
    let server = env.serve_with("api-mcp-ops", &[("JOBTRAIL_OPS_LISTEN", "127.0.0.1:0")]);
    let ops = support::ops_address(&server.log);
    let token = env.token("agent-alice", &["read"]).await;
    let client = over_http(&server, &token, false).await;
    let unknown = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    for _ in 0..2 {
        let refused = call(&client, "get_operation", json!({"operation_id": unknown})).await;
        assert_eq!(structured(&refused)["error"], "not-found", "{refused:?}");
    }
    let metrics = support::http()
        .get(format!("{ops}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        support::sample(
            &metrics,
            "jobtrail_api_problems_total",
            &["kind=\"not-found\""]
        ),
        Some(2.0),
        "{metrics}"
    );
}

/// A person's token (one that may decide) configured in an agent's host: over MCP its decide scope
/// is not used, so the model cannot submit to a provider that requires approval as that person
/// approving, nor read other callers' operations. Over plain HTTP the same token may (a person
/// submitting): `people_decide_through_the_api_and_approvals_come_from_a_person`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mcp_a_persons_token_approves_nothing() {
    let env = Env::with_edited_contracts(&[(
        "sim-legacy.toml",
        "description = ",
        "requires_approval = true\ndescription = ",
    )])
    .await;
    let server = env.serve("api");
    let agent = env.token("agent-7", &["submit", "read"]).await;
    let alice = env.token("alice", &["submit", "read", "decide"]).await;
    let theirs = call(
        &over_http(&server, &agent, false).await,
        "submit_operation",
        json!({"provider": "sim", "target": "reports", "approved_by": "bob",
               "request": request(json!({"duration_ms": 100}))}),
    )
    .await;
    assert!(theirs.is_error != Some(true), "{theirs:?}");
    let client = over_http(&server, &alice, false).await;
    let refused = call(
        &client,
        "submit_operation",
        json!({"provider": "sim-legacy", "target": "reports", "approved_by": "alice",
               "request": request(json!({"duration_ms": 100}))}),
    )
    .await;
    assert_eq!(structured(&refused)["error"], "forbidden", "{refused:?}");
    let listed = call(&client, "list_operations", json!({})).await;
    assert_eq!(
        structured(&listed)["operations"],
        json!([]),
        "only alice's own, and she has none: {listed:?}"
    );
}

/// A session keeps no answer once it is sent: were answers kept for a resume (rmcp can, for
/// streams it has marked complete, until the session's next message), a caller could open its 32
/// sessions, have each sent page after page of 256 KiB and leave them idle for their 5 minutes,
/// holding gigabytes counted nowhere. A stream that is lost is not resumed: the client calls
/// again (every tool that reads is safe to repeat). This pins the behaviour across rmcp releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_no_answer_it_has_sent() {
    let env = Env::new().await;
    let server = env.serve("api");
    let token = env.token("agent-alice", &["read"]).await;
    let session = support::mcp_session(&server, &token).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "list_providers", "arguments": {}}});
    let answer = support::mcp_post(&server, &token, Some(&session), call)
        .await
        .text()
        .await
        .unwrap();
    assert!(answer.contains(r#""id":7"#), "{answer}");
    // Resumed from the stream's first event (its priming one): everything after it again, if
    // the session still had it.
    let first = answer
        .lines()
        .find_map(|l| l.strip_prefix("id:"))
        .unwrap_or_else(|| panic!("no event id in {answer}"))
        .trim()
        .to_owned();
    let resumed = support::http()
        .get(server.url("/mcp"))
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("last-event-id", &first)
        .send()
        .await
        .unwrap();
    let status = resumed.status();
    let replayed = tokio::time::timeout(Duration::from_secs(5), resumed.text())
        .await
        .map(|t| t.unwrap_or_default())
        .unwrap_or_default();
    assert!(
        !replayed.contains(r#""id":7"#),
        "an answer sent was kept and sent again ({status}): {replayed}"
    );
}

/// The MCP door reads a body as strictly as the HTTP routes: a key twice in one object (which
/// MCP's own parser would take the last of, so a call read one way would start a job another way)
/// is refused, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_with_a_key_twice_is_refused_and_writes_nothing() {
    let env = Env::new().await;
    let server = env.serve("api");
    let token = env.token("agent-alice", &["submit", "read"]).await;
    let c = support::http();
    let post = |body: String, session: Option<String>| {
        let mut r = c
            .post(server.url("/mcp"))
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body);
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r.send()
    };
    let opened = post(support::mcp_initialize().to_string(), None)
        .await
        .unwrap();
    assert!(opened.status().is_success(), "{}", opened.status());
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = opened.bytes().await;
    let ack = post(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        Some(session.clone()),
    )
    .await
    .unwrap();
    assert!(ack.status().is_success(), "{}", ack.status());
    let call = r#"{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "submit_operation", "arguments": {
            "provider": "sim", "target": "reports", "approved_by": "alice",
            "request": {"report": "usage", "report": "payroll", "sim": {"duration_ms": 100}}}}}"#;
    // The same for a number MCP's parser would round (what is fingerprinted and sent is not what
    // was written).
    let rounded = call.replace(
        r#""report": "payroll", "#,
        r#""amount": 123456789012345678901234, "#,
    );
    // Two megabytes of tiny values, which would take over 32 MiB parsed.
    let many = call.replace(
        r#""report": "payroll", "#,
        &format!(r#""v": [{}0], "#, "0,".repeat(1 << 20)),
    );
    for (body, names, kind) in [
        (call.to_owned(), "report", "bad-input"),
        (rounded, "string", "bad-input"),
        (many, "MiB of memory a body may", "too-large"),
    ] {
        let refused = post(body, Some(session.clone())).await.unwrap();
        let status = refused.status();
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["kind"], kind, "{problem}");
        assert_eq!(
            status,
            u16::try_from(problem["status"].as_u64().unwrap()).unwrap()
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(names),
            "{problem}"
        );
    }
    assert_eq!(
        env.store.totals().await.unwrap().0,
        0,
        "something was written"
    );
    // The same call without the second key is taken.
    let taken = post(call.replace(r#""report": "payroll", "#, ""), Some(session))
        .await
        .unwrap();
    assert!(taken.status().is_success(), "{}", taken.status());
    let _ = taken.bytes().await;
    assert_eq!(env.store.totals().await.unwrap().0, 1);
}

/// Over stdio as over `/mcp`: a tool call with a key twice (or a number MCP's parser would round)
/// is refused with a JSON-RPC error naming its id, and nothing is written; the same call once is
/// taken, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_over_stdio_with_a_key_twice_is_refused_and_writes_nothing() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let env = Env::new().await;
    let server = env.serve("api");
    let token = env.token("agent-alice", &["submit", "read"]).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobtrail"))
        .arg("mcp")
        .env_remove("DATABASE_URL")
        .env("JOBTRAIL_API", &server.base)
        .env("JOBTRAIL_TOKEN", &token)
        .env("JOBTRAIL_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn jobtrail mcp");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |message: String| {
        stdin.write_all(message.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    };
    // The answer to request `id` (notifications and other answers skipped), within a bound.
    let answer = async |stdout: &mut tokio::io::Lines<_>, id: i64| -> Value {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let line: String = stdout.next_line().await.unwrap().expect("an answer");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        })
        .await
        .expect("answered in time")
    };
    send(support::mcp_initialize().to_string()).await;
    assert!(answer(&mut stdout, 1).await["result"].is_object());
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await;
    let call = |id: i64, extra: &str| {
        format!(
            r#"{{"jsonrpc": "2.0", "id": {id}, "method": "tools/call", "params": {{
            "name": "submit_operation", "arguments": {{
                "provider": "sim", "target": "reports", "approved_by": "alice",
                "request": {{"report": "usage", {extra}"sim": {{"duration_ms": 100}}}}}}}}}}"#
        )
        .replace('\n', " ")
    };
    // A byte-order mark in front is JSON still (RFC 8259 §8.1; rmcp reads past it): checked alike.
    for (id, message, names) in [
        (2, call(2, r#""report": "payroll", "#), "report"),
        (
            3,
            call(3, r#""amount": 123456789012345678901234, "#),
            "string",
        ),
        (
            5,
            format!("\u{FEFF}{}", call(5, r#""report": "payroll", "#)),
            "report",
        ),
    ] {
        send(message).await;
        let refused = answer(&mut stdout, id).await;
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{refused}");
    }
    assert_eq!(
        env.store.totals().await.unwrap().0,
        0,
        "something was written"
    );
    // A request whose id is given twice is answered (JSON-RPC: with a null id, the id unknown),
    // not dropped as if it were a notification: the client would wait for it for good.
    send(call(8, "").replacen(r#""id": 8,"#, r#""id": 8, "id": 9,"#, 1)).await;
    let refused = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line: String = stdout.next_line().await.unwrap().expect("an answer");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("id") == Some(&Value::Null) {
                return v;
            }
        }
    })
    .await
    .expect("answered in time");
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("id")),
        "{refused}"
    );
    assert_eq!(env.store.totals().await.unwrap().0, 0);
    // An argument that does not deserialize is not quoted back whole (rmcp quotes it).
    let long = "x".repeat(1_000_000);
    send(
        json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {
            "name": "get_operation",
            "arguments": {"operation_id": "op_x", "timeline": long}}})
        .to_string(),
    )
    .await;
    // It is a tool error as the tools' own are: structured, `bad-input`, its message cut.
    let refused = answer(&mut stdout, 10).await;
    let said = &refused["result"]["structuredContent"];
    let message = said["message"].as_str().unwrap_or_default();
    assert!(
        refused["result"]["isError"] == true
            && said["error"] == "bad-input"
            && message.contains("deserialize")
            && message.chars().count() <= 301
            && refused.to_string().len() < 4_000,
        "{} bytes: {}",
        refused.to_string().len(),
        jobtrail_core::ids::cut(&refused.to_string(), 600)
    );
    send(call(4, "")).await;
    let taken = answer(&mut stdout, 4).await;
    assert!(taken["result"].is_object(), "{taken}");
    assert_eq!(env.store.totals().await.unwrap().0, 1);
    // Its input closed, the server ends, as it would on stdin's end without the check before it.
    drop(stdin);
    let exited = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    assert!(exited.is_ok_and(|s| s.is_ok()), "still running");
}

/// An agent's trace reaches its operations over MCP as over the HTTP API: the W3C `traceparent` in
/// a tool call's `_meta` (MCP SEP-414), else the Streamable HTTP request's `traceparent` header; one
/// that is not valid is ignored (the operation starts a trace of its own), over both transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_trace_reaches_its_operations_over_mcp() {
    let env = Env::new().await;
    let server = env.serve("api");
    let token = env.token("agent-traced", &["submit", "read"]).await;
    let header_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let meta_trace = "0af7651916cd43dd8448eb211c80319c";
    let (header_span, meta_span) = ("00f067aa0ba902b7", "b7ad6b7169203331");
    let parent = |trace: &str, span: &str| format!("00-{trace}-{span}-01");
    // The caller's context an operation recorded: its trace and the caller's span.
    let context = |trace: &str, span: &str| format!("{trace} {span}");
    // What a submit with this `_meta.traceparent` (or none) records as its operation's trace and
    // the caller's span its root span is recorded under.
    let submitted_trace = async |client: &Client, traceparent: Option<&str>| {
        let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7());
        let mut params = CallToolRequestParams::new("submit_operation").with_arguments(
            json!({"id": id.to_string(), "provider": "sim", "target": "reports",
                   "approved_by": "alice", "request": request(json!({}))})
            .as_object()
            .cloned()
            .unwrap(),
        );
        if let Some(t) = traceparent {
            let mut meta = RequestMetaObject::new();
            meta.set_traceparent(t);
            params.meta = Some(meta);
        }
        let r = tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
            .await
            .expect("tool call in time")
            .expect("tool call");
        assert_eq!(r.is_error, Some(false), "{r:?}");
        let op = env.store.get(id).await.unwrap();
        let span = op.parent_span.map_or("-".to_owned(), |s| s.to_string());
        format!("{} {span}", op.trace_id)
    };
    let invalid = [
        // All-zero trace id and span id are invalid by the W3C spec, as is anything unparsable.
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned(),
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01".to_owned(),
        "not a traceparent".to_owned(),
        format!("00-{meta_trace}"),
    ];

    // Streamable HTTP, every request carrying the agent's `traceparent` header.
    let headers = std::collections::HashMap::from([(
        reqwest::header::HeaderName::from_static("traceparent"),
        reqwest::header::HeaderValue::from_str(&parent(header_trace, header_span)).unwrap(),
    )]);
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"))
            .auth_header(&token)
            .custom_headers(headers),
    );
    let http = tokio::time::timeout(Duration::from_secs(20), config(false).serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize");
    assert_eq!(
        submitted_trace(&http, None).await,
        context(header_trace, header_span)
    );
    assert_eq!(
        submitted_trace(&http, Some(&parent(meta_trace, meta_span))).await,
        context(meta_trace, meta_span),
        "the call's own context comes before its transport's"
    );
    for bad in &invalid {
        assert_eq!(
            submitted_trace(&http, Some(bad)).await,
            context(header_trace, header_span),
            "{bad}"
        );
    }
    let _ = http.cancel().await;

    // stdio: `_meta` is the only carrier; the stdio server passes it on to the API.
    let stdio = over_stdio(&server, &token, false).await;
    assert_eq!(
        submitted_trace(&stdio, Some(&parent(meta_trace, meta_span))).await,
        context(meta_trace, meta_span)
    );
    let mut seen = std::collections::BTreeSet::new();
    for bad in invalid.iter().map(Some).chain([None]) {
        let got = submitted_trace(&stdio, bad.map(String::as_str)).await;
        let (t, span) = got.split_once(' ').unwrap();
        assert!(
            t != meta_trace && t != header_trace && t.len() == 32 && span == "-",
            "{bad:?}: {got}"
        );
        let t = t.to_owned();
        assert!(
            seen.insert(t),
            "each operation without a caller's trace has its own"
        );
    }
    let _ = stdio.cancel().await;
}

/// A wait over /mcp rests on one authentication. A token revoked while the operation moves on
/// every few seconds (each change ends one step of the wait) still ends the wait, refused, within
/// the time a single wait's token is looked at again (30 s), not when the operation settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_during_an_mcp_wait_through_many_state_changes_ends_it() {
    let mut env =
        Env::with_edited_contracts(&[("sim.toml", "request_ms = 2000", "request_ms = 20000")])
            .await;
    let server = env.serve("api");
    env.start_worker("w1", Duration::from_secs(30));
    let token = env.token("agent", &["submit", "read"]).await;
    let client = over_http(&server, &token, false).await;
    let id = jobtrail_core::OperationId::from_uuid(uuid::Uuid::now_v7()).to_string();
    // Created after 12 s, observed for 15 s, its result read for 12 s: no state lasts 30 s.
    let script = json!({"create_hold_ms": 12000, "duration_ms": 15000, "result_delay_ms": 12000});
    let r = call(
        &client,
        "submit_operation",
        json!({"id": id, "provider": "sim", "target": "reports", "approved_by": "alice",
               "request": request(script)}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let started = std::time::Instant::now();
    let wait = tokio::spawn(async move {
        call(
            &client,
            "wait_operation",
            json!({"operation_id": id, "timeout_secs": 120}),
        )
        .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let digest = jobtrail_service::auth::token_digest(&token);
    env.store
        .revoke_token_by_digest(&digest, "alice")
        .await
        .unwrap()
        .expect("the token was there");
    let r = wait.await.unwrap();
    let took = started.elapsed();
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert_eq!(structured(&r)["error"], "unauthenticated", "{r:?}");
    assert!(took < Duration::from_secs(36), "ended after {took:?}");
    env.stop_workers().await;
}
