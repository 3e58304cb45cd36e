//! The agent-facing commands: submit, show, list, providers, cancel, result, wait. Each is a thin
//! layer over `jobtrail_service`, through whichever door this invocation has: the database
//! (`DATABASE_URL`, or the private cluster) or the HTTP API (`--api` / `JOBTRAIL_API` with
//! `JOBTRAIL_TOKEN`; then neither a database URL nor contracts are needed on this machine).

use jobtrail_console::shell::{self, CmdResult, Failure, exit, fail, print_json};
use jobtrail_service::{
    Door, ListQuery, OperationView, Operations, Principal, ServiceError, SubmitRequest, Timeline,
};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

/// How this invocation reaches jobtrail.
#[derive(clap::Args, Debug, Clone)]
pub struct DoorArgs {
    /// jobtrail's HTTP API (`http://host:8080`) instead of the database; the token comes from
    /// JOBTRAIL_TOKEN (never a flag: flags show in process lists).
    #[arg(long, env = "JOBTRAIL_API", global = true)]
    pub api: Option<String>,
}

/// What a command needs of its door in database mode.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The records only.
    Records,
    /// The providers' contracts too.
    Contracts,
    /// Contracts and the submit settings (`JOBTRAIL_OPEN_PER_CALLER`): a read-only command is not
    /// refused for a submit setting it never uses.
    Submits,
}

/// The door for a command acting as `caller` (database mode; with the API the token decides).
pub async fn door(
    common: &shell::Common,
    d: &DoorArgs,
    caller: Option<&str>,
    needs: Needs,
) -> Result<Door, Failure> {
    if let Some(api) = d.api.as_deref().filter(|a| !a.trim().is_empty()) {
        // Checked first: a URL carrying a password is refused before anything prints it.
        let token = std::env::var("JOBTRAIL_TOKEN").unwrap_or_default();
        let client = jobtrail_service::client::ApiClient::new(api, &token).map_err(failure)?;
        // A database named on this command line beside an API (a JOBTRAIL_API left exported)
        // would be ignored without a word, and the command act as the token's caller instead.
        // (Arguments as the OS gives them: one that is not UTF-8, a file name, is no flag.)
        if std::env::args_os().any(|a| {
            let a = a.as_encoded_bytes();
            a == b"--database-url" || a.starts_with(b"--database-url=")
        }) {
            return Err(fail(
                exit::BAD_INPUT,
                format!(
                    "--database-url and --api (or JOBTRAIL_API, here {:?}) name two ways in: give one (unset JOBTRAIL_API to use the database)",
                    api.trim()
                ),
            ));
        }
        if caller.is_some_and(|c| !c.trim().is_empty()) {
            eprintln!(
                "note: with --api the token decides the caller and actor; a --caller or --actor (or JOBTRAIL_CALLER) is ignored"
            );
        }
        return Ok(Door::Remote(client));
    }
    // Usage first: a missing --caller is exit 2 whether or not a database is there.
    let caller = match caller.map(str::trim) {
        Some(c) if !c.is_empty() => c.to_owned(),
        Some(_) => {
            return Err(fail(
                exit::BAD_INPUT,
                "who asks is required: --caller (or JOBTRAIL_CALLER) for submit, --actor for cancel (with --api the token names the caller)",
            ));
        }
        None => "cli".to_owned(),
    };
    let open_cap = match needs {
        Needs::Submits => open_per_caller()?,
        Needs::Records | Needs::Contracts => None,
    };
    let registry = if needs != Needs::Records {
        shell::registry(&common.providers)?
    } else {
        jobtrail_provider::Registry::default()
    };
    let store = shell::store(common).await?;
    let service = jobtrail_service::Service::new(store, registry);
    if let Some(n) = open_cap {
        service.set_open_per_caller(n);
    }
    Ok(Door::Local(service.bind(Principal::trusted(caller))))
}

/// `JOBTRAIL_OPEN_PER_CALLER` for a submit straight to the database, as `jobtrail serve` takes
/// it (unset: the same default); a value that is no count is bad input, never ignored.
fn open_per_caller() -> Result<Option<u32>, Failure> {
    let Ok(v) = std::env::var("JOBTRAIL_OPEN_PER_CALLER") else {
        return Ok(None);
    };
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=100_000_000).contains(n))
        .map(Some)
        .ok_or_else(|| {
            fail(
                exit::BAD_INPUT,
                format!("JOBTRAIL_OPEN_PER_CALLER={v:?}: a count of 1 to 100000000"),
            )
        })
}

/// A service error as the command's failure (the exit code of its kind).
pub fn failure(e: ServiceError) -> Failure {
    fail(e.kind.exit_code(), e.message)
}

/// A fresh operation id, made here when the caller named none: a submit whose answer is lost (a
/// timeout, a dropped connection after the server committed) can then be sent again under it
/// without starting a second operation, and a second paid job.
fn fresh_id() -> String {
    jobtrail_core::OperationId::fresh().to_string()
}

/// A submit that failed unavailable may have landed all the same: say under which ids, so that
/// sending it again under them cannot submit twice.
fn unsure(mut e: ServiceError, ids: &[(String, String)]) -> ServiceError {
    if e.kind == jobtrail_service::Kind::Unavailable && !ids.is_empty() {
        let named: Vec<String> = ids.iter().map(|(at, id)| format!("{at}{id}")).collect();
        e.message = format!(
            "{}\nit may have been submitted all the same, under the id{} made up here: {}; submit it again with {} (the same request under the same id is never submitted twice)",
            e.message,
            if ids.len() == 1 { "" } else { "s" },
            named.join(", "),
            if ids.len() == 1 {
                format!("--id {}", ids[0].1)
            } else {
                "each line's \"id\" set to these".to_owned()
            }
        );
    }
    e
}

#[derive(clap::Args)]
pub struct SubmitArgs {
    #[arg(long)]
    pub provider: String,
    /// What the operation acts on (part of the fingerprint).
    #[arg(long)]
    pub target: String,
    /// Request body (JSON) file; `-` or absent: stdin (absent at a terminal is refused: pipe the
    /// JSON in, or say `-` to type it).
    #[arg(long)]
    pub body: Option<std::path::PathBuf>,
    /// Your own operation id (op_<ULID>). Re-submitting the same id with the same request is a
    /// no-op. Without one, one is made up here, and named if the submit's outcome is unknown.
    #[arg(long)]
    pub id: Option<String>,
    /// Who asks (agent run, tool, person): required when going to the database. With --api the
    /// token decides.
    #[arg(long, env = "JOBTRAIL_CALLER")]
    pub caller: Option<String>,
    /// Who authorised the work.
    #[arg(long)]
    pub approved_by: String,
    /// A reference to the approval (ticket, change request).
    #[arg(long)]
    pub approval_ref: Option<String>,
    /// RFC 3339 or relative (+2m). Default: the provider's create window.
    #[arg(long)]
    pub create_deadline: Option<String>,
    /// RFC 3339 or relative (+1h). Default: the provider's result window.
    #[arg(long)]
    pub result_deadline: Option<String>,
    /// How long a cancel may take to be confirmed (90s, 5m). Default: the provider's.
    #[arg(long)]
    pub cancel_window: Option<String>,
    /// The operation this one retries (a new operation linked to the old; it must be finished).
    #[arg(long)]
    pub supersedes: Option<String>,
    /// W3C trace context (`00-<trace id>-<span id>-<flags>`): the operation's provider calls join
    /// this trace. Default: TRACEPARENT from the environment, else a new trace.
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
}

/// Read the body, at most one byte over the largest any contract allows (the provider's own limit
/// is checked by the service).
fn read_body(path: &Option<std::path::PathBuf>) -> Result<Vec<u8>, Failure> {
    let limit = jobtrail_core::operation::MAX_BODY_BYTES as u64 + 1;
    let mut body = Vec::new();
    match path {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::File::open(p)
                .and_then(|f| f.take(limit).read_to_end(&mut body))
                .map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))?;
        }
        _ => {
            piped_unless_asked("--body", path.as_deref())?;
            std::io::stdin()
                .take(limit)
                .read_to_end(&mut body)
                .map_err(|e| fail(exit::BAD_INPUT, format!("reading the body from stdin: {e}")))?;
        }
    }
    Ok(body)
}

/// Without `flag`, input comes from stdin: refused when stdin is a terminal, where the command
/// would wait without a word for input nobody meant to type (`flag -` asks for it on purpose).
fn piped_unless_asked(flag: &str, given: Option<&std::path::Path>) -> Result<(), shell::Failure> {
    use std::io::IsTerminal;
    if given.is_none() && std::io::stdin().is_terminal() {
        return Err(fail(
            exit::BAD_INPUT,
            format!(
                "no {flag} and stdin is a terminal: give {flag} FILE, pipe the JSON in, or say {flag} - to type it"
            ),
        ));
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct BatchArgs {
    /// JSON lines file, one submission per line; `-` or absent: stdin (absent at a terminal is
    /// refused). Blank lines are skipped.
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// Who asks. With --api the token decides.
    #[arg(long, env = "JOBTRAIL_CALLER")]
    pub caller: Option<String>,
}

/// `jobtrail submit-batch`: every line parsed strictly before anything is sent; one transaction.
pub async fn submit_batch(door: &Door, a: BatchArgs, json: bool) -> CmdResult {
    let limit = (jobtrail_core::operation::MAX_BODY_BYTES * 16) as u64;
    let mut text = Vec::new();
    match &a.file {
        Some(p) if p.as_os_str() != "-" => std::fs::File::open(p)
            .and_then(|f| f.take(limit + 1).read_to_end(&mut text))
            .map_err(|e| fail(exit::BAD_INPUT, format!("{}: {e}", p.display())))?,
        _ => {
            piped_unless_asked("--file", a.file.as_deref())?;
            std::io::stdin()
                .take(limit + 1)
                .read_to_end(&mut text)
                .map_err(|e| fail(exit::BAD_INPUT, format!("reading stdin: {e}")))?
        }
    };
    if text.len() as u64 > limit {
        return Err(fail(
            exit::BAD_INPUT,
            format!("the batch is over {limit} bytes: split it"),
        ));
    }
    let mut reqs = Vec::new();
    // The ids made up here for lines that named none, to name if the outcome is unknown.
    let mut made_up = Vec::new();
    // Each submission's line, to name it when the batch is refused for it.
    let mut lines = Vec::new();
    for (n, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if reqs.len() == jobtrail_service::MAX_BATCH {
            return Err(fail(
                exit::BAD_INPUT,
                format!(
                    "line {}: a batch holds at most {} submissions: split it",
                    n + 1,
                    jobtrail_service::MAX_BATCH
                ),
            ));
        }
        lines.push(n + 1);
        let v = jobtrail_core::json::parse_strict(line).map_err(|e| {
            fail(
                exit::BAD_INPUT,
                format!("line {}: not valid JSON: {e}", n + 1),
            )
        })?;
        let mut req: SubmitRequest = serde_json::from_value(v)
            .map_err(|e| fail(exit::BAD_INPUT, format!("line {}: {e}", n + 1)))?;
        if req.id.is_none() {
            let id = fresh_id();
            made_up.push((format!("line {}: ", n + 1), id.clone()));
            req.id = Some(id);
        }
        reqs.push(req);
    }
    if reqs.is_empty() {
        return Err(fail(exit::BAD_INPUT, "no submissions: the input is empty"));
    }
    // Through the API the batch is one request, held to the API's size limit: refused here, with
    // what to do, rather than sent whole to be refused (or cut off) there.
    if let Door::Remote(_) = door {
        let body = serde_json::to_vec(&serde_json::json!({"operations": &reqs}))
            .map_err(|e| fail(exit::BAD_INPUT, format!("the batch: {e}")))?;
        if body.len() > jobtrail_service::MAX_REQUEST_BYTES {
            return Err(fail(
                exit::BAD_INPUT,
                format!(
                    "the batch is {} bytes as a request, more than the API takes ({}): split it",
                    body.len(),
                    jobtrail_service::MAX_REQUEST_BYTES
                ),
            ));
        }
    }
    let done = door.submit_batch(reqs, None).await.map_err(|mut e| {
        // The service names the submission refused by its place among them (`item 3`); here
        // it is a line of the input, counted as an editor counts it.
        let item = e.detail.as_ref().and_then(|d| d["item"].as_u64());
        if let Some(line) = item.and_then(|i| lines.get(usize::try_from(i).ok()?)) {
            let why = e
                .message
                .split_once(": ")
                .filter(|(head, _)| head.starts_with("item "))
                .map_or(e.message.as_str(), |(_, why)| why);
            e.message = format!("line {line}: {why}");
        }
        failure(unsure(e, &made_up))
    })?;
    if json {
        print_json(&done);
    } else {
        for s in &done {
            println!("{}", s.operation.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn submit(door: &Door, a: SubmitArgs, json: bool) -> CmdResult {
    let body = read_body(&a.body)?;
    if body.len() > jobtrail_core::operation::MAX_BODY_BYTES {
        return Err(fail(
            exit::BAD_INPUT,
            format!(
                "the request body is over {} bytes",
                jobtrail_core::operation::MAX_BODY_BYTES
            ),
        ));
    }
    // The body is checked strictly here too (duplicate keys, numbers beyond exact range, NUL): a
    // request travels as JSON inside the API's envelope, and what is recorded must be what was
    // meant.
    let request = jobtrail_core::json::parse_strict(&body).map_err(|e| {
        fail(
            exit::BAD_INPUT,
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    let trace = match a.traceparent.as_deref().filter(|t| !t.trim().is_empty()) {
        None => None,
        Some(t) => {
            let mut h = http::HeaderMap::new();
            let v = http::HeaderValue::from_str(t.trim()).map_err(|_| {
                fail(
                    exit::BAD_INPUT,
                    "--traceparent (or TRACEPARENT in the environment): not a header value",
                )
            })?;
            h.insert("traceparent", v);
            Some(jobtrail_provider::wire::extract_trace(&h).ok_or_else(|| {
                fail(
                    exit::BAD_INPUT,
                    format!(
                        "--traceparent (or TRACEPARENT in the environment) {t:?}: not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
                    ),
                )
            })?)
        }
    };
    // The same checks the service makes, here so that the error names the flag the user typed.
    for (flag, t) in [
        ("--create-deadline", &a.create_deadline),
        ("--result-deadline", &a.result_deadline),
    ] {
        if let Some(t) = t {
            jobtrail_core::when::parse_time(t)
                .map_err(|e| fail(exit::BAD_INPUT, format!("{flag}: {e}")))?;
        }
    }
    if let Some(w) = &a.cancel_window {
        jobtrail_core::when::parse_duration_within(
            "--cancel-window",
            w,
            Duration::from_secs(1),
            jobtrail_core::operation::MAX_CANCEL_WINDOW,
        )
        .map_err(|e| fail(exit::BAD_INPUT, e))?;
    }
    let minted = a.id.is_none();
    let id = a.id.unwrap_or_else(fresh_id);
    let req = SubmitRequest {
        id: Some(id.clone()),
        provider: a.provider,
        target: a.target,
        request,
        approved_by: a.approved_by,
        approval_ref: a.approval_ref,
        create_deadline: a.create_deadline,
        result_deadline: a.result_deadline,
        cancel_window: a.cancel_window,
        supersedes: a.supersedes,
    };
    let made_up = if minted {
        vec![(String::new(), id)]
    } else {
        Vec::new()
    };
    let s = door
        .submit(req, trace)
        .await
        .map_err(|e| failure(unsure(e, &made_up)))?;
    let op = &s.operation;
    if json {
        print_json(&s);
    } else {
        println!("{}", op.id);
        if !s.created {
            eprintln!("(already submitted with the same request: nothing new was written)");
        }
        if !op.at_most_once {
            eprintln!(
                "warning: provider {} takes no idempotency key: at-most-once creation cannot be guaranteed",
                op.provider
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn show(door: &Door, id: &str, json: bool) -> CmdResult {
    match door {
        Door::Local(b) => {
            let (op, history, calls) = b
                .service
                .evidence(&b.principal, id)
                .await
                .map_err(failure)?;
            if json {
                // What the API answers (so a program reads `show --json` one way whichever door it
                // goes through), and what only the database door has beside it: the whole record,
                // the chain's links with their hashes, and the provider calls.
                let view = OperationView::of(&op).with_timeline(&history, false);
                let mut v = serde_json::to_value(view).map_err(|e| fail(exit::UNAVAILABLE, e))?;
                v["operation"] = serde_json::json!(op);
                v["history"] = serde_json::json!(history);
                v["calls"] = serde_json::json!(calls);
                print_json(&v);
            } else {
                print!(
                    "{}",
                    jobtrail_console::timeline::render(&op, &history, &calls)
                );
                print!("{}", view_line(&OperationView::of(&op).seen));
            }
        }
        Door::Remote(c) => {
            let mut v = c.get(id, Timeline::Newest).await.map_err(failure)?;
            // The API answers a page at a time, newest first: page back to the first link, up to
            // SHOWN_PAGES pages (what is left unshown is said).
            for _ in 1..SHOWN_PAGES {
                let Some(seq) = v.timeline_earlier else { break };
                let older = c.get(id, Timeline::Before(seq)).await.map_err(failure)?;
                let mut links = older.timeline.unwrap_or_default();
                links.extend(v.timeline.take().unwrap_or_default());
                v.timeline = Some(links);
                v.timeline_earlier = older.timeline_earlier;
            }
            if json {
                print_json(&v);
            } else {
                print!("{}", render_view(&v));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pages of history `show` reads over the API at most (200 links each).
const SHOWN_PAGES: usize = 50;

/// An operation as the API gives it (no provider calls: those stay with operators).
/// The line of `show` naming the view a cancel (or a decision) repeats as `--seen`.
fn view_line(seen: &str) -> String {
    format!("  view: {seen}   (what cancel --seen repeats)\n")
}

fn render_view(v: &OperationView) -> String {
    use jobtrail_console::visible::text;
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "{}  {}  ({})", v.id, v.state, text(&v.advice));
    let _ = writeln!(
        s,
        "  provider {}  target {}  caller {}  approved by {}",
        text(&v.provider),
        text(&v.target),
        text(&v.caller),
        text(&v.approved_by)
    );
    if let Some(j) = &v.remote_job_id {
        let _ = writeln!(s, "  remote job {}", text(j));
    }
    if let Some(r) = &v.escalation_reason {
        let _ = writeln!(s, "  held because {}", text(r));
    }
    let _ = writeln!(s, "  trace {}", v.trace_id);
    s.push_str(&view_line(&text(&v.seen)));
    if let Some(seq) = v.timeline_earlier {
        let _ = writeln!(
            s,
            "  … {} earlier links not shown (jobtrail-admin show --json has them all)",
            seq - 1
        );
    }
    for t in v.timeline.iter().flatten() {
        let _ = writeln!(
            s,
            "  #{:<3} {}  {} → {}  {}  by {}",
            t.seq,
            t.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            t.from_state.as_deref().unwrap_or("-"),
            t.to_state,
            text(&t.cause),
            text(&t.actor)
        );
    }
    s
}

pub async fn list(door: &Door, q: ListQuery, json: bool) -> CmdResult {
    let page = door.list(q).await.map_err(failure)?;
    if json {
        print_json(&page);
        return Ok(ExitCode::SUCCESS);
    }
    for v in &page.operations {
        println!(
            "{}  {:<24} {:<12} {}",
            v.id,
            v.state,
            jobtrail_console::visible::text(&v.provider),
            v.created_at.format("%Y-%m-%d %H:%M:%SZ")
        );
    }
    if let Some(c) = &page.next_cursor {
        eprintln!("more: --cursor {c}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn providers(door: &Door, json: bool) -> CmdResult {
    let list = door.providers().await.map_err(failure)?;
    if json {
        print_json(&list);
        return Ok(ExitCode::SUCCESS);
    }
    for p in &list.providers {
        println!(
            "{}  {}{}",
            p.name,
            p.description.as_deref().unwrap_or(""),
            if p.at_most_once {
                ""
            } else {
                "  (no idempotency key: at-most-once not guaranteed)"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(
    door: &Door,
    id: &str,
    reason: &str,
    seen: Option<&str>,
    json: bool,
) -> CmdResult {
    let r = door.cancel(id, reason, seen).await.map_err(failure)?;
    if json {
        print_json(&r);
    } else {
        println!("{}: {}", r.operation.id, r.note);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn result(door: &Door, id: &str, output: Option<&std::path::Path>) -> CmdResult {
    let r = door.result(id).await.map_err(failure)?;
    match output {
        Some(p) if p.as_os_str() != "-" => {
            // A path that cannot be made is the caller's to fix (bad input); a write that fails
            // part way (a full disk) is not. Written beside it and renamed over it: the file there
            // before (an earlier copy) stays whole until the new one is, and none is left half.
            if let Err(e) = write_whole(p, &r.bytes) {
                use std::io::ErrorKind::{IsADirectory, NotADirectory, NotFound, PermissionDenied};
                let code = match e.kind() {
                    NotFound | PermissionDenied | IsADirectory | NotADirectory => exit::BAD_INPUT,
                    _ => exit::UNAVAILABLE,
                };
                return Err(fail(code, format!("-o {}: {e}", p.display())));
            }
            eprintln!(
                "wrote {} bytes (sha256 {}) to {}",
                r.bytes.len(),
                r.sha256,
                p.display()
            );
        }
        _ => {
            use std::io::{IsTerminal, Write};
            let mut out = std::io::stdout();
            // A provider's bytes are not for a terminal to interpret: an escape sequence in them
            // can retitle the window, hide text or worse. Text prints; anything else needs -o
            // (`-o -` says stdout on purpose).
            if output.is_none() && out.is_terminal() && !terminal_safe(&r.bytes) {
                return Err(fail(
                    exit::BAD_INPUT,
                    format!(
                        "the result ({} bytes, {}) holds control characters (or text-reordering ones) or is not UTF-8 text, and stdout is a terminal: give -o FILE, pipe it, or -o - to print it anyway",
                        r.bytes.len(),
                        r.content_type.as_deref().unwrap_or("no content type")
                    ),
                ));
            }
            if let Err(e) = out.write_all(&r.bytes).and_then(|()| out.flush()) {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    shell::stdout_closed();
                }
                return Err(fail(exit::UNAVAILABLE, e));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `bytes` at `path`, whole or not at all: a new or regular file is written beside it, synced, and
/// renamed over it (keeping an earlier file's permissions; a new one's as the umask says). Anything
/// else (`/dev/stdout`, a pipe, a symbolic link) is written to as it is, not replaced.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let permissions = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => m.permissions(),
        Ok(_) => return std::fs::write(path, bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::Permissions::from_mode(0o666)
        }
        Err(e) => return Err(e),
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let mut f = tempfile::Builder::new()
        .permissions(permissions)
        .tempfile_in(dir)?;
    f.write_all(bytes)?;
    f.as_file().sync_all()?;
    f.persist(path).map(|_| ()).map_err(|e| e.error)
}

/// Text a terminal shows as it is: UTF-8 with no control character but tab and line ends (LF or
/// CRLF), and nothing that reorders the line.
fn terminal_safe(bytes: &[u8]) -> bool {
    // A carriage return only as part of a CRLF line end: alone, it returns to the line's start,
    // and what follows writes over what the line showed ("$5\r$500").
    std::str::from_utf8(bytes).is_ok_and(|t| {
        let mut chars = t.chars().peekable();
        while let Some(c) = chars.next() {
            let shown = match c {
                '\t' | '\n' => true,
                '\r' => chars.peek() == Some(&'\n'),
                // Embeddings, overrides and isolates reorder what the rest of the line reads as;
                // the marks (U+200E, U+200F) that right-to-left prose needs are kept.
                '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => false,
                c => !c.is_control(),
            };
            if !shown {
                return false;
            }
        }
        true
    })
}

/// Block until the operation is terminal or held for a person, or the timeout. Woken by the
/// database's notifications (directly, or through the API's long poll), never by a sleep loop.
pub async fn wait(door: &Door, id: &str, timeout: Duration, json: bool) -> CmdResult {
    let w = jobtrail_service::wait_settled(door, id, timeout)
        .await
        .map_err(failure)?;
    let op = &w.operation;
    report(op, json);
    if w.timed_out {
        return Err(fail(
            exit::TIMEOUT,
            format!(
                "{} is still {} after {}s",
                op.id,
                op.state,
                timeout.as_secs()
            ),
        ));
    }
    let code = match op.state.as_str() {
        "succeeded" => exit::OK,
        _ if op.needs_human => exit::NEEDS_HUMAN,
        _ => exit::NOT_SUCCEEDED,
    };
    Ok(ExitCode::from(code))
}

fn report(op: &OperationView, json: bool) {
    if json {
        print_json(&serde_json::json!({
            "operation_id": op.id,
            "state": op.state,
            "advice": op.advice,
            "remote_job_id": op.remote_job_id,
            "remote_state": op.remote_state,
            "escalation_reason": op.escalation_reason,
            "result_sha256": op.result.as_ref().and_then(|r| r.sha256.clone()),
            "result_summary": op.result.as_ref().and_then(|r| r.summary.clone()),
            "finished_before_cancel": op.finished_before_cancel,
        }));
    } else {
        let extra = op
            .escalation_reason
            .as_deref()
            .map(|r| format!(" — {}", jobtrail_console::visible::text(r)))
            .unwrap_or_default();
        println!("{} {}{extra}", op.id, op.state);
    }
}

#[cfg(test)]
mod tests {
    use super::terminal_safe;

    /// What a provider's result may hold that a terminal would act on instead of show.
    #[test]
    fn only_plain_text_goes_to_a_terminal() {
        for ok in [
            "",
            "{\"a\": 1}\n",
            "tab\there\r\n",
            "naïve ✓",
            "שלום\u{200f} 5",
        ] {
            assert!(terminal_safe(ok.as_bytes()), "{ok:?}");
        }
        for bad in [
            &b"\x1b]0;owned\x07"[..],
            b"\x1b[2J",
            b"a\x00b",
            b"del\x7f",
            "csi \u{9b}31m".as_bytes(),
            b"\xff\xfe not utf-8",
            b"\x08\x08\x08",
            b"paid $5\rpaid $500",
            b"ends in a bare return\r",
            "total \u{202e}005$\u{202c} due".as_bytes(),
            "isolate \u{2067}x\u{2069}".as_bytes(),
        ] {
            assert!(!terminal_safe(bad), "{bad:?}");
        }
    }
}
