//! Contract files are parsed strictly and every invalid field is refused with a message naming the
//! file, the key and what was expected.

use jobtrail_core::IdempotencyMode;
use jobtrail_provider::contract::{Contract, HttpVersion, ReconcileMethod, load_dir};
use std::path::{Path, PathBuf};

fn providers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../providers")
}

fn sim_text() -> String {
    std::fs::read_to_string(providers_dir().join("sim.toml")).unwrap()
}

fn parse(text: &str) -> Result<Contract, String> {
    Contract::parse(text, &providers_dir().join("test.toml")).map_err(|e| e.to_string())
}

#[test]
fn the_shipped_contracts_load() {
    let all = load_dir(&providers_dir()).unwrap();
    assert_eq!(
        all.keys().cloned().collect::<Vec<_>>(),
        ["sim", "sim-csv", "sim-legacy"]
    );
    let sim = &all["sim"];
    assert_eq!(sim.idempotency(), IdempotencyMode::Header);
    assert_eq!(sim.reconcile.method, ReconcileMethod::Resend);
    assert!(sim.result.as_ref().unwrap().schema.is_some());
    assert_eq!(sim.terms().sensitive_fields, ["/payment/card_number"]);
    let legacy = &all["sim-legacy"];
    assert_eq!(legacy.idempotency(), IdempotencyMode::None);
    assert!(!legacy.idempotency().guarantees_at_most_once());

    let example = Contract::load(&providers_dir().join("examples/replicate.toml")).unwrap();
    assert!(
        example.untested,
        "the real-API example must say it is untested"
    );
    assert_eq!(example.idempotency(), IdempotencyMode::None);
}

/// Names that differ only in case or in '-' against '_' would read one base URL override: setting
/// it for one would move the other's calls, credentials and all. Refused when the directory loads.
#[test]
fn two_contracts_sharing_one_base_url_override_are_refused() {
    for (a, b) in [("acme-pay", "acme_pay"), ("acme", "ACME"), ("acme", "acme")] {
        let dir = tempfile::tempdir().unwrap();
        for (file, name) in [("a.toml", a), ("b.toml", b)] {
            let schema = providers_dir().join("schemas/sim-result.json");
            let text = sim_text()
                .replace("name = \"sim\"", &format!("name = \"{name}\""))
                .replace("schemas/sim-result.json", &schema.display().to_string());
            assert!(text.contains(&format!("name = \"{name}\"")));
            std::fs::write(dir.path().join(file), text).unwrap();
        }
        let e = load_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("b.toml") && e.contains("name"), "{a} {b}: {e}");
    }
}

/// A schema with a key written twice is refused: the last would win silently and the check say
/// less than the file seems to (here the first `required`).
#[test]
fn a_schema_with_a_key_written_twice_is_refused() {
    let text = sim_text();
    let dir = tempfile::tempdir().unwrap();
    let schema = r#"{"type": "object", "required": ["items"], "properties": {}, "required": []}"#;
    std::fs::write(dir.path().join("twice.json"), schema).unwrap();
    let (key, line) = text
        .lines()
        .find_map(|l| {
            let k = l.split('=').next()?.trim();
            (k == "schema_file").then(|| (k.to_owned(), l.to_owned()))
        })
        .expect("sim.toml names its result schema by file");
    let edited = text.replace(&line, &format!("{key} = \"twice.json\""));
    let e = Contract::parse(&edited, &dir.path().join("sim.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("schema_file") && e.contains("twice"), "{e}");
}

#[test]
fn each_invalid_field_is_refused_with_its_name() {
    let base = sim_text();
    let cases: &[(&str, &str, &str)] = &[
        (
            "base_url = \"http://127.0.0.1:8700\"",
            "base_url = \"ftp://x\"",
            "base_url",
        ),
        (
            "base_url = \"http://127.0.0.1:8700\"",
            "base_url = \"http://u:p@h\"",
            "base_url",
        ),
        // Every path would be appended inside the query (or the fragment).
        (
            "base_url = \"http://127.0.0.1:8700\"",
            "base_url = \"http://127.0.0.1:8700/v1?api-version=2024-01-01\"",
            "base_url",
        ),
        (
            "base_url = \"http://127.0.0.1:8700\"",
            "base_url = \"http://127.0.0.1:8700/v1#top\"",
            "base_url",
        ),
        (
            "method = \"POST\"\npath = \"/v1/jobs\"",
            "method = \"FETCH\"\npath = \"/v1/jobs\"",
            "create.method",
        ),
        ("path = \"/v1/jobs\"", "path = \"v1/jobs\"", "create.path"),
        // Braces forgotten: every operation would read, or cancel, one resource.
        (
            "url = \"/v1/jobs/{job_id}\"",
            "url = \"/v1/jobs/job_id\"",
            "status.url",
        ),
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/cancel\"",
            "cancel.path",
        ),
        (
            "idempotency = \"header\"",
            "idempotency = \"maybe\"",
            "create.idempotency",
        ),
        (
            "idempotency_header = \"Idempotency-Key\"",
            "idempotency_header = \"Bad Header\"",
            "create.idempotency_header",
        ),
        (
            "job_id = \"body:/job_id\"",
            "job_id = \"job_id\"",
            "create.job_id",
        ),
        (
            "url = \"/v1/jobs/{job_id}\"",
            "url = \"/v1/jobs/{jobid}\"",
            "status.url",
        ),
        ("state = \"/state\"", "state = \"state\"", "status.state"),
        (
            "succeeded = [\"succeeded\"]",
            "succeeded = []",
            "status.states",
        ),
        (
            "running = [\"running\", \"cancelling\"]",
            "running = [\"running\", \"queued\"]",
            "status.states.running",
        ),
        ("factor = 2.0", "factor = 0.5", "polling.factor"),
        ("jitter = 0.2", "jitter = 3.0", "polling.jitter"),
        ("cap_ms = 2000", "cap_ms = 10", "polling.cap_ms"),
        (
            "retry_after_max_ms = 10000",
            "retry_after_max_ms = 10",
            "polling.retry_after_max_ms",
        ),
        ("window_ms = 5000", "window_ms = 5", "cancel.window_ms"),
        (
            "secret = \"env:JOBTRAIL_SIM_TOKEN\"",
            "secret = \"JOBTRAIL_SIM_TOKEN\"",
            "auth.secret",
        ),
        (
            "schema_file = \"schemas/sim-result.json\"",
            "schema_file = \"schemas/missing.json\"",
            "result.schema_file",
        ),
        ("format = \"json\"", "format = \"xml\"", "format"),
        ("method = \"resend\"", "method = \"guess\"", "method"),
        ("create_ms = 30000", "create_ms = 10", "deadlines.create_ms"),
        (
            "create_ms = 30000",
            "create_ms = 99999999999999",
            "deadlines.create_ms",
        ),
        (
            "request_ms = 2000",
            "request_ms = 86400000",
            "timeouts.request_ms",
        ),
        // A unit slip: ten seconds meant, ten milliseconds written.
        (
            "request_ms = 2000",
            "request_ms = 10",
            "timeouts.request_ms",
        ),
        ("connect_ms = 1000", "connect_ms = 5", "timeouts.connect_ms"),
        (
            "sync_result = \"body:/result\"",
            "sync_result = \"body:/result\"\nbody = \"list\"",
            "create.body",
        ),
        (
            "redact = [\"/payment/card_number\"]",
            "redact = [\"payment.card_number\"]",
            "redact[0]",
        ),
        (
            "signature = \"hmac-sha256\"",
            "signature = \"md5\"",
            "webhook.signature",
        ),
        // A tolerance with no signed timestamp to hold to it would protect nothing.
        (
            "signature = \"hmac-sha256\"",
            "signature = \"hmac-sha256\"\ntolerance_ms = 60000",
            "webhook.tolerance_ms",
        ),
        (
            "means = \"already_exists\"",
            "means = \"whatever\"",
            "means",
        ),
        (
            "max_response_bytes = 262144",
            "max_response_bytes = 262144\nmystery = 1",
            "mystery",
        ),
        (
            "trace_header = \"X-Trace-ID\"",
            "trace_header = \"X-Trace-ID\"\nhttp_version = \"3\"",
            "http_version",
        ),
        // Limits a typo of a few zeros would make dangerous, and waits of nothing.
        (
            "max_response_bytes = 262144",
            "max_response_bytes = 1099511627776",
            "timeouts.max_response_bytes",
        ),
        (
            "max_bytes = 1048576",
            "max_bytes = 2147483648",
            "result.max_bytes",
        ),
        (
            "retry_after_min_ms = 100",
            "retry_after_min_ms = 0",
            "polling.retry_after_min_ms",
        ),
        ("initial_ms = 200", "initial_ms = 1", "polling.initial_ms"),
        (
            "max_failures = 6",
            "max_failures = 4294967295",
            "polling.max_failures",
        ),
        (
            "interval_ms = 300",
            "interval_ms = 0",
            "reconcile.interval_ms",
        ),
        // An authentication scheme is a token: no header can carry the rest.
        (
            "scheme = \"Bearer\"",
            "scheme = \"Bearer\\r\\nX-Injected: y\"",
            "auth.scheme",
        ),
        (
            "scheme = \"Bearer\"",
            "scheme = \"Bearer x\"",
            "auth.scheme",
        ),
        ("scheme = \"Bearer\"", "scheme = \"\"", "auth.scheme"),
        // A number where the version is a string: "2" is meant, but nothing is guessed.
        (
            "trace_header = \"X-Trace-ID\"",
            "trace_header = \"X-Trace-ID\"\nhttp_version = 2",
            "http_version",
        ),
    ];
    for (from, to, key) in cases {
        assert!(base.contains(from), "test setup: {from:?} not in sim.toml");
        let text = base.replacen(from, to, 1);
        let err = parse(&text).expect_err(&format!("{key} should be refused"));
        assert!(
            err.contains("test.toml"),
            "error does not name the file: {err}"
        );
        assert!(err.contains(key), "error for {key} does not name it: {err}");
    }
}

/// `http_version` is `auto` unless said, and only what it names.
#[test]
fn the_http_version_is_auto_unless_the_contract_names_one() {
    let base = sim_text();
    assert_eq!(parse(&base).unwrap().http_version, HttpVersion::Auto);
    for (text, version) in [
        ("\"auto\"", HttpVersion::Auto),
        ("\"1.1\"", HttpVersion::Http1),
        ("\"2\"", HttpVersion::Http2),
    ] {
        let with = base.replacen(
            "trace_header = \"X-Trace-ID\"",
            &format!("trace_header = \"X-Trace-ID\"\nhttp_version = {text}"),
            1,
        );
        assert_eq!(parse(&with).unwrap().http_version, version, "{text}");
    }
    for bad in ["\"2.0\"", "\"h2\"", "\"HTTP/2\"", "\"\"", "true"] {
        let with = base.replacen(
            "trace_header = \"X-Trace-ID\"",
            &format!("trace_header = \"X-Trace-ID\"\nhttp_version = {bad}"),
            1,
        );
        let err = parse(&with).expect_err(bad);
        assert!(err.contains("http_version"), "{bad}: {err}");
    }
}

#[test]
fn cross_field_rules_are_enforced() {
    let base = sim_text();
    // A resend without a token could create a second job.
    let text = base.replacen("idempotency = \"header\"", "idempotency = \"none\"", 1);
    // ... and a header name beside "none" says a token goes where none does.
    assert!(parse(&text).unwrap_err().contains("create.idempotency"));
    let text = text.replacen("idempotency_header = \"Idempotency-Key\"\n", "", 1);
    assert!(parse(&text).unwrap_err().contains("reconcile.method"));
    // Lookup needs to know where our reference goes.
    let text = base.replacen("client_reference_field = \"/client_reference\"\n", "", 1);
    assert!(
        parse(&text)
            .unwrap_err()
            .contains("create.client_reference_field")
    );
    // Header placement needs a header name.
    let text = base.replacen("idempotency_header = \"Idempotency-Key\"\n", "", 1);
    assert!(
        parse(&text)
            .unwrap_err()
            .contains("create.idempotency_header")
    );
}

/// A create window that cannot hold one call plus the lease margin ends before a worker that died
/// mid-create can be taken over: refused at load, naming the keys that must change.
#[test]
fn a_create_window_shorter_than_one_call_and_its_lease_margin_is_refused() {
    let base = sim_text();
    // connect 1 s + request 2 s + margin 2 s = 5 s.
    let text = base.replacen("create_ms = 30000", "create_ms = 4999", 1);
    let err = parse(&text).unwrap_err();
    for key in [
        "test.toml",
        "deadlines.create_ms",
        "timeouts.connect_ms",
        "timeouts.request_ms",
        "5000",
    ] {
        assert!(err.contains(key), "{key} missing from: {err}");
    }
    let text = base.replacen("create_ms = 30000", "create_ms = 5000", 1);
    assert!(parse(&text).is_ok());
}

/// Bodies other than an object are refused at submit unless the contract says otherwise.
#[test]
fn the_contract_says_which_bodies_it_takes() {
    use jobtrail_core::BodyShape;
    let base = sim_text();
    assert_eq!(parse(&base).unwrap().terms().body, BodyShape::Object);
    let text = base.replacen(
        "sync_result = \"body:/result\"",
        "sync_result = \"body:/result\"\nbody = \"any\"",
        1,
    );
    assert_eq!(parse(&text).unwrap().terms().body, BodyShape::Any);
}

/// A refused base URL never echoes the credential someone put into it.
#[test]
fn a_refused_base_url_does_not_echo_its_credential() {
    let text = sim_text().replacen(
        "base_url = \"http://127.0.0.1:8700\"",
        "base_url = \"http://admin:hunter2-SECRET@127.0.0.1:8700\"",
        1,
    );
    let err = parse(&text).unwrap_err();
    assert!(
        err.contains("base_url") && err.contains("not shown"),
        "{err}"
    );
    assert!(!err.contains("hunter2") && !err.contains("admin"), "{err}");
    let text = sim_text()
        .replacen("create.max_body_bytes", "x", 0)
        .replacen(
            "sync_result = \"body:/result\"",
            "sync_result = \"body:/result\"\nmax_body_bytes = 999999999999",
            1,
        );
    assert!(parse(&text).unwrap_err().contains("create.max_body_bytes"));
}

/// A key in the contract's fixed query (Azure Functions' `?code=`, Google's `?key=`) would sit in
/// clear text in the contract file, which a cluster keeps in a ConfigMap and `contract check`
/// prints: refused by name, without repeating the value; an `api-version` is no credential.
#[test]
fn a_credential_in_the_fixed_query_is_refused_without_its_value() {
    let with_query = |q: &str| {
        sim_text().replacen(
            "base_url = \"http://127.0.0.1:8700\"",
            &format!("base_url = \"http://127.0.0.1:8700\"\nquery = {q}"),
            1,
        )
    };
    for (q, key) in [
        (r#"{ code = "hunter2-SECRET" }"#, "query.code"),
        (
            r#"{ "api-version" = "1", api_key = "hunter2-SECRET" }"#,
            "query.api_key",
        ),
        (r#"{ Sig = "hunter2-SECRET" }"#, "query.Sig"),
    ] {
        let err = parse(&with_query(q)).unwrap_err();
        assert!(err.contains(key) && err.contains("[auth]"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    // Nor written into a URL: the base URL, a path or a URL template's own query.
    for (from, to, key) in [
        (
            "base_url = \"http://127.0.0.1:8700\"",
            "base_url = \"http://127.0.0.1:8700/?code=hunter2-SECRET\"",
            "base_url",
        ),
        (
            "path = \"/v1/jobs\"",
            "path = \"/v1/jobs?x=1&code=hunter2-SECRET\"",
            "create.path",
        ),
        (
            "url = \"/v1/jobs/{job_id}\"",
            "url = \"/v1/jobs/{job_id}?api_key=hunter2-SECRET\"",
            "status.url",
        ),
    ] {
        assert!(sim_text().contains(from), "{from}");
        let err = parse(&sim_text().replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(key) && err.contains("[auth]"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    let c = parse(&sim_text().replacen(
        "url = \"/v1/jobs/{job_id}\"",
        "url = \"/v1/jobs/{job_id}?keyword=x&languageCode=en\"",
        1,
    ))
    .unwrap();
    assert!(c.status.url.contains("keyword=x"));
    // A name that only contains such a word is no credential.
    let c = parse(&with_query(
        r#"{ "api-version" = "2024-01-01", languageCode = "en", keyword = "x" }"#,
    ))
    .unwrap();
    assert_eq!(c.query["api-version"], "2024-01-01");
}

#[test]
fn the_base_url_can_be_overridden_per_environment() {
    // SAFETY: no other test in this binary reads this variable.
    unsafe {
        std::env::set_var(
            "JOBTRAIL_PROVIDER_OVERRIDE_ME_BASE_URL",
            "http://127.0.0.1:1234",
        )
    };
    let text = sim_text().replacen("name = \"sim\"", "name = \"override-me\"", 1);
    let c = parse(&text).unwrap();
    assert_eq!(c.base_url.as_str(), "http://127.0.0.1:1234/");
    // An override pasted with a query is refused as the file's would be, naming where it came from.
    unsafe {
        std::env::set_var(
            "JOBTRAIL_PROVIDER_OVERRIDE_ME_BASE_URL",
            "http://127.0.0.1:1234/v1?api-version=1",
        )
    };
    let e = parse(&text).unwrap_err();
    assert!(
        e.contains("base_url") && e.contains("JOBTRAIL_PROVIDER_OVERRIDE_ME_BASE_URL"),
        "{e}"
    );
}

/// `[limits]`: caps and rates a careless operator could mistype are refused with their key; what is
/// left out has a sane default (a burst of one second's calls).
#[test]
fn limits_are_checked_and_defaulted() {
    let with = |limits: &str| parse(&format!("{}\n[limits]\n{limits}\n", sim_text()));
    let c = with("max_in_flight = 4\nfleet_max_in_flight = 20\nrate_per_sec = 2.5").unwrap();
    assert_eq!(c.limits.max_in_flight, Some(4));
    assert_eq!(c.limits.fleet_max_in_flight, Some(20));
    let rate = c.limits.rate.unwrap();
    assert_eq!((rate.per_sec, rate.burst), (2.5, 3));
    assert_eq!(
        parse(&sim_text()).unwrap().limits,
        jobtrail_provider::contract::Limits::default()
    );
    for (text, key) in [
        ("max_in_flight = 0", "limits.max_in_flight"),
        ("max_in_flight = 1000000", "limits.max_in_flight"),
        ("max_in_flight = -1", "max_in_flight"),
        ("fleet_max_in_flight = 0", "limits.fleet_max_in_flight"),
        (
            "max_in_flight = 10\nfleet_max_in_flight = 5",
            "limits.max_in_flight",
        ),
        ("rate_per_sec = 0", "limits.rate_per_sec"),
        ("rate_per_sec = -3", "limits.rate_per_sec"),
        ("rate_per_sec = nan", "limits.rate_per_sec"),
        ("rate_per_sec = inf", "limits.rate_per_sec"),
        ("rate_per_sec = 1e9", "limits.rate_per_sec"),
        ("burst = 5", "limits.burst"),
        ("rate_per_sec = 10\nburst = 0", "limits.burst"),
        ("rate_per_sec = \"10/s\"", "rate_per_sec"),
        ("max_per_second = 3", "max_per_second"),
    ] {
        let err = with(text).expect_err(text);
        assert!(err.contains(key), "{text}: {err}");
        assert!(err.contains("test.toml"), "{text}: {err}");
    }
}

/// `sim.toml` turned into a contract whose jobs have no result.
fn no_result_text() -> String {
    let base = sim_text();
    let start = base.find("[result]\n").unwrap();
    let end = base.find("[reconcile]").unwrap();
    format!(
        "{}[result]\nformat = \"none\"\n\n{}",
        &base[..start],
        &base[end..]
    )
    .replace("result_url = \"/result_url\"\n", "")
    .replace("sync_result = \"body:/result\"\n", "")
}

/// A `Retry-After: 0` waits a second unless the contract says otherwise: a provider answering
/// "now" to every read must not set the poll rate (each read is a step in the record).
#[test]
fn a_retry_after_of_zero_waits_a_second_by_default() {
    let text = sim_text().replace("retry_after_min_ms = 100\n", "");
    assert_ne!(text, sim_text(), "the sim contract sets its own floor");
    let bounds = parse(&text).unwrap().policy().retry_after;
    assert_eq!(
        bounds.clamp(std::time::Duration::ZERO),
        std::time::Duration::from_secs(1)
    );
    let own = parse(&sim_text()).unwrap().policy().retry_after;
    assert_eq!(
        own.clamp(std::time::Duration::ZERO),
        std::time::Duration::from_millis(100)
    );
    // A contract that waits at most half a second on a Retry-After (and was valid before the
    // floor rose) still loads: the floor is then that most.
    let capped = text.replace("retry_after_max_ms = 10000\n", "retry_after_max_ms = 500\n");
    assert_ne!(capped, text);
    let capped = parse(&capped).unwrap().policy().retry_after;
    assert_eq!(
        capped.clamp(std::time::Duration::ZERO),
        std::time::Duration::from_millis(500)
    );
}

#[test]
fn a_job_without_a_result_is_said_so_and_every_result_key_beside_it_is_refused() {
    let c = parse(&no_result_text()).unwrap();
    assert!(c.policy().no_result);
    assert!(!parse(&sim_text()).unwrap().policy().no_result);
    let cases = [
        (
            "format = \"none\"",
            "format = \"none\"\nurl = \"/r/{job_id}\"",
            "result.url",
        ),
        (
            "format = \"none\"",
            "format = \"none\"\ncontent_type = \"application/json\"",
            "result.content_type",
        ),
        (
            "format = \"none\"",
            "format = \"none\"\nitems = \"/items\"",
            "result.items",
        ),
        (
            "format = \"none\"",
            "format = \"none\"\nschema_file = \"schemas/sim-result.json\"",
            "result.schema_file",
        ),
        (
            "state = \"/state\"",
            "state = \"/state\"\nresult_url = \"/result_url\"",
            "status.result_url",
        ),
        (
            "job_id = \"body:/job_id\"",
            "job_id = \"body:/job_id\"\nsync_result = \"body:/result\"",
            "create.sync_result",
        ),
    ];
    for (from, to, key) in cases {
        let text = no_result_text().replacen(from, to, 1);
        assert_ne!(text, no_result_text(), "{from}");
        let e = parse(&text).unwrap_err();
        assert!(e.contains(key) && e.contains("none"), "{key}: {e}");
    }
}

#[test]
fn the_state_may_come_from_several_pointers_or_from_the_status_code() {
    let base = sim_text();
    // Several pointers, an absent state, and codes beside names all load.
    let c = parse(&base.replacen(
        "state = \"/state\"",
        "state = [\"/error/code\", \"/state\"]\nstate_absent = \"queued\"",
        1,
    ))
    .unwrap();
    assert_eq!(c.status.state, ["/error/code", "/state"]);
    assert_eq!(c.status.state_absent.as_deref(), Some("queued"));
    let codes_only = base
        .replacen("state = \"/state\"\n", "", 1)
        .replacen(
            "[status.states]",
            "[status.codes]\nrunning = [202]\nsucceeded = [200, 204]\nfailed = [400]\n\n[status.unused]",
            1,
        );
    let codes_only = {
        // Drop the names table (renamed above) and its lines.
        let start = codes_only.find("[status.unused]").unwrap();
        let end = start + codes_only[start..].find("\n\n").unwrap();
        format!("{}{}", &codes_only[..start], &codes_only[end..])
    };
    let c = parse(&codes_only).unwrap();
    assert!(c.status.state.is_empty());
    assert_eq!(c.status.codes.len(), 4);

    let cases: &[(&str, &str, &str)] = &[
        (
            "[status.codes]\nrunning = [202]",
            "[status.codes]\nrunning = [42]",
            "status.codes.running",
        ),
        (
            "succeeded = [200, 204]",
            "succeeded = [200, 202]",
            "status.codes.succeeded",
        ),
        ("failed = [400]", "failed = []", "status.states"),
    ];
    for (from, to, key) in cases {
        let text = codes_only.replacen(from, to, 1);
        assert_ne!(text, codes_only, "{from}");
        let e = parse(&text).unwrap_err();
        assert!(e.contains(key), "{key}: {e}");
    }
    let e =
        parse(&codes_only.replacen("[status.codes]", "state_absent = \"x\"\n[status.codes]", 1))
            .unwrap_err();
    assert!(e.contains("status.state_absent"), "{e}");
    // A document that states nothing never ends the job: state_absent names a state it is still
    // in (or one no list names, which is held), whatever the case.
    for finished in ["succeeded", "failed", "cancelled"] {
        let e = parse(&base.replacen(
            "state = \"/state\"",
            &format!("state = \"/state\"\nstate_absent = \"{finished}\""),
            1,
        ))
        .unwrap_err();
        assert!(
            e.contains("status.state_absent") && e.contains("still in"),
            "{finished}: {e}"
        );
    }
    let e = parse(&base.replacen(
        "state = \"/state\"",
        "state = \"/state\"\nstate_absent = \"SUCCEEDED\"\nignore_case = true",
        1,
    ))
    .unwrap_err();
    assert!(e.contains("status.state_absent"), "{e}");
    for unfinished in ["running", "queued", "not_a_listed_state"] {
        parse(&base.replacen(
            "state = \"/state\"",
            &format!("state = \"/state\"\nstate_absent = \"{unfinished}\""),
            1,
        ))
        .unwrap();
    }
    // Names without any pointer to read them from.
    let e = parse(&base.replacen("state = \"/state\"\n", "", 1)).unwrap_err();
    assert!(e.contains("status.state"), "{e}");
    let e = parse(&base.replacen("state = \"/state\"", "state = [\"/state\", \"nope\"]", 1))
        .unwrap_err();
    assert!(e.contains("status.state"), "{e}");
}

#[test]
fn every_example_loads_says_it_is_untested_and_names_its_spec() {
    let dir = providers_dir().join("examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let c = Contract::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.untested, "{}: must say it is untested", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("UNTESTED") && text.contains("https://"),
            "{}: says it is untested and which documentation it follows",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 6, "{n} examples");
}

#[test]
fn a_profile_fills_in_the_protocol_and_the_contract_overrides_it() {
    let minimal = r#"
protocol = "google-aip-151"
name = "g"
base_url = "https://example.googleapis.com/v1"
[create]
path = "/things:run"
idempotency = "none"
"#;
    let c = parse(minimal).unwrap();
    assert_eq!(c.status.state, ["/error/code", "/error", "/done"]);
    // A finished operation that failed without a code is not read as its `done`: never a success.
    let failed = serde_json::json!({"done": true, "error": {"message": "quota exhausted"}});
    let state = c.status.state_in(&failed).unwrap();
    assert_ne!(
        c.status.phase(&state),
        Some(jobtrail_core::outcome::Phase::Succeeded),
        "{state}"
    );
    let ok = serde_json::json!({"done": true, "response": {}});
    assert_eq!(
        c.status.phase(&c.status.state_in(&ok).unwrap()),
        Some(jobtrail_core::outcome::Phase::Succeeded)
    );
    assert_eq!(c.status.state_absent.as_deref(), Some("false"));
    // Nothing but `done: true` ends the job: an error code beside `done: false` confirms no
    // cancel and no failure, and a `done` that is no boolean is not done.
    use jobtrail_core::outcome::Phase;
    for (body, phase) in [
        (
            serde_json::json!({"done": false, "error": {"code": 1}}),
            Phase::Running,
        ),
        (serde_json::json!({"error": {"code": 13}}), Phase::Running),
        (
            serde_json::json!({"done": 1, "response": {}}),
            Phase::Running,
        ),
        (
            serde_json::json!({"done": "true", "response": {}}),
            Phase::Running,
        ),
        (
            serde_json::json!({"done": true, "error": {"code": 1}}),
            Phase::Cancelled,
        ),
        (
            serde_json::json!({"done": true, "error": {"code": 13}}),
            Phase::Failed,
        ),
    ] {
        let state = c.status.state_in(&body).unwrap();
        assert_eq!(c.status.phase(&state), Some(phase), "{body}");
    }
    // Without a state for "not done", a document not done would state none, and every read of a
    // running job fail: refused at load. A created resource (no `done` of its own) is read at the
    // state pointers alone.
    let e = parse(&format!("unset = [\"status.state_absent\"]\n{minimal}")).unwrap_err();
    assert!(
        e.contains("status.state_absent") && e.contains("status.done"),
        "{e}"
    );
    assert_eq!(
        c.status
            .stated(&serde_json::json!({"error": {"code": 13}}))
            .as_deref(),
        Some("13")
    );
    assert_eq!(
        c.status.phase("1"),
        Some(jobtrail_core::outcome::Phase::Cancelled)
    );
    assert_eq!(
        c.status.phase("13"),
        Some(jobtrail_core::outcome::Phase::Failed)
    );
    assert_eq!(
        c.status.phase("true"),
        Some(jobtrail_core::outcome::Phase::Succeeded)
    );
    assert_eq!(c.cancel.as_ref().unwrap().path, "/{job_id_path}:cancel");
    let r = c.result.as_ref().unwrap();
    assert_eq!(r.within.as_deref(), Some("/response"));

    // The contract's own keys win, table by table.
    let over = minimal.replace(
        "[create]",
        "[status]\nurl = \"/operations/{job_id_path}\"\n[create]",
    );
    let c = parse(&over).unwrap();
    assert_eq!(c.status.url, "/operations/{job_id_path}");
    assert_eq!(
        c.status.state,
        ["/error/code", "/error", "/done"],
        "the rest stays"
    );

    // Azure's states in any case.
    let azure = r#"
protocol = "azure-lro"
name = "a"
base_url = "https://example.azure.com"
[create]
path = "/jobs"
idempotency = "none"
job_id = "header:Operation-Location"
[status]
url = "/jobs/{job_id}"
"#;
    let c = parse(azure).unwrap();
    for s in ["Succeeded", "succeeded", "SUCCEEDED"] {
        assert_eq!(
            c.status.phase(s),
            Some(jobtrail_core::outcome::Phase::Succeeded)
        );
    }
    assert_eq!(
        c.status.phase("Canceled"),
        Some(jobtrail_core::outcome::Phase::Cancelled)
    );

    // An unknown profile, or a key the profile's tables do not take, is refused by name.
    let e = parse(&minimal.replace("google-aip-151", "soap")).unwrap_err();
    assert!(
        e.contains("protocol") && e.contains("google-aip-151"),
        "{e}"
    );
    let e = parse(&minimal.replace("[create]", "[status]\nstatez = 1\n[create]")).unwrap_err();
    assert!(e.contains("statez"), "{e}");
}

#[test]
fn an_operation_without_a_result_drops_the_profiles_result_keys() {
    let text = r#"
protocol = "google-aip-151"
name = "g"
base_url = "https://example.googleapis.com/v1"
[create]
path = "/things/{target_path}:delete"
idempotency = "none"
[result]
format = "none"
"#;
    let c = parse(text).unwrap();
    assert!(c.policy().no_result);
}

#[test]
fn fixed_headers_are_checked_and_never_what_jobtrail_sets_itself() {
    let base = sim_text();
    let with = |line: &str| {
        base.replacen(
            "trace_header = \"X-Trace-ID\"",
            &format!("trace_header = \"X-Trace-ID\"\n{line}"),
            1,
        )
    };
    let c = parse(&with("headers = { \"X-Api-Version\" = \"2\" }")).unwrap();
    assert_eq!(c.headers["x-api-version"], "2");
    for (line, key) in [
        (
            "headers = { Authorization = \"Bearer x\" }",
            "headers.Authorization",
        ),
        (
            "headers = { \"Idempotency-Key\" = \"fixed\" }",
            "headers.Idempotency-Key",
        ),
        (
            "headers = { traceparent = \"00-x\" }",
            "headers.traceparent",
        ),
        ("headers = { \"X-Trace-ID\" = \"1\" }", "headers.X-Trace-ID"),
        ("headers = { \"Bad Name\" = \"1\" }", "headers.Bad Name"),
        ("headers = { \"X-Ok\" = \"line\\nbreak\" }", "headers.X-Ok"),
    ] {
        let e = parse(&with(line)).unwrap_err();
        assert!(e.contains(key), "{key}: {e}");
    }
    let e = parse(&base.replacen(
        "idempotent = true",
        "idempotent = true\nheaders = { Cookie = \"a=b\" }",
        1,
    ))
    .unwrap_err();
    assert!(e.contains("cancel.headers.Cookie"), "{e}");
}

#[test]
fn codes_that_mean_not_now_or_elsewhere_are_never_a_state_and_status_url_opens_a_template() {
    let base = sim_text();
    for (code, ok) in [
        (202, true),
        (204, true),
        (410, true),
        (302, false),
        (429, false),
        (408, false),
        (503, false),
        (500, false),
        (101, false),
    ] {
        let text = base.replacen(
            "[status.states]",
            &format!("[status.codes]\nfailed = [{code}]\n\n[status.states]"),
            1,
        );
        match parse(&text) {
            Ok(_) => assert!(ok, "{code} was accepted"),
            Err(e) => {
                assert!(!ok, "{code}: {e}");
                assert!(e.contains("status.codes.failed"), "{e}");
            }
        }
    }
    let e = parse(&base.replacen(
        "path = \"/v1/jobs/{job_id}/cancel\"",
        "path = \"/v1/x?next={status_url}\"",
        1,
    ))
    .unwrap_err();
    assert!(e.contains("cancel.path") && e.contains("start"), "{e}");
}

#[test]
fn without_a_job_id_the_job_is_its_status_url_and_no_template_may_place_an_id() {
    let base = r#"
protocol = "azure-lro"
name = "a"
base_url = "https://example.test"
[create]
path = "/things"
idempotency = "none"
[status]
url = "STATUS"
"#;
    let c = parse(&base.replace("STATUS", "{status_url}")).unwrap();
    assert_eq!(c.create.job_id, None);
    for (template, key) in [
        ("/things/{job_id}", "status.url"),
        ("/things/{job_id_path}", "status.url"),
    ] {
        let err = parse(&base.replace("STATUS", template)).unwrap_err();
        assert!(err.contains(key) && err.contains("{status_url}"), "{err}");
    }
    let cancel = format!(
        "{}[cancel]\npath = \"/things/{{job_id}}/cancel\"\n",
        base.replace("STATUS", "{status_url}")
    );
    let err = parse(&cancel).unwrap_err();
    assert!(err.contains("cancel.path"), "{err}");
}

#[test]
fn call_bodies_and_their_placeholders_are_checked_at_load() {
    let base = sim_text();
    let cases: &[(&str, &str, &str)] = &[
        // A GET carries no body.
        (
            "method = \"POST\"\npath = \"/v1/jobs/{job_id}/cancel\"",
            "method = \"DELETE\"\npath = \"/v1/jobs/{job_id}/cancel\"\nbody = { run = \"{job_id}\" }",
            "cancel.body",
        ),
        (
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"",
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"\nlookup_method = \"GET\"\nlookup_body = { a = 1 }",
            "reconcile.lookup_method",
        ),
        (
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"",
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"\nlookup_method = \"DELETE\"",
            "reconcile.lookup_method",
        ),
        // A lookup that names nothing we sent cannot find our job.
        (
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"",
            "lookup_url = \"/v1/jobs\"",
            "reconcile.lookup_url",
        ),
        // A list whose jobs are taken without their repeating our reference: a provider that
        // ignored the filter would hand us another's job.
        (
            "lookup_reference = \"/client_reference\"\n",
            "",
            "reconcile.lookup_reference",
        ),
        // Unknown placeholders and {status_url} inside a body.
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{job_id}/cancel\"\nbody = { run = \"{job}\" }",
            "cancel.body",
        ),
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{job_id}/cancel\"\nbody = { run = [\"{status_url}\"] }",
            "cancel.body",
        ),
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{request:}/cancel\"",
            "cancel.path",
        ),
        // A request value read from a field that carries a secret is never sent elsewhere.
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{job_id}/cancel\"\nbody = { card = \"{request:/payment}\" }",
            "cancel.body",
        ),
        (
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{request:/payment/card_number/x}/cancel\"",
            "cancel.path",
        ),
        // The result's method and body belong to the contract's own result URL.
        (
            "content_type = \"application/json\"\nmax_bytes",
            "method = \"POST\"\ncontent_type = \"application/json\"\nmax_bytes",
            "result.method",
        ),
    ];
    for (from, to, key) in cases {
        assert!(base.contains(from), "{from}");
        let err = parse(&base.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(key), "{to}: {err}");
    }
    // No key goes with a create that sends none.
    let legacy = std::fs::read_to_string(providers_dir().join("sim-legacy.toml")).unwrap();
    let path = legacy
        .lines()
        .find(|l| l.starts_with("url = \"/v1/jobs/{job_id}\""))
        .unwrap();
    let err = parse(&legacy.replacen(path, "url = \"/v1/jobs/{idempotency_key}\"", 1)).unwrap_err();
    assert!(err.contains("{idempotency_key}"), "{err}");

    // What loads: a POST lookup by our key, a body with request values.
    let ok = base
        .replacen(
            "lookup_url = \"/v1/jobs?client_reference={client_reference}\"",
            "lookup_url = \"/v1/jobs:lookup\"\nlookup_body = { key = \"{idempotency_key}\", n = [1, true] }",
            1,
        )
        .replacen(
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{request:/region}/{job_id}/cancel\"\nbody = { why = \"{request:/reason}\" }",
            1,
        );
    let c = parse(&ok).unwrap();
    assert_eq!(c.reconcile.lookup_method, http::Method::POST);
    assert_eq!(
        c.reconcile.lookup_body,
        Some(serde_json::json!({"key": "{idempotency_key}", "n": [1, true]}))
    );
}

#[test]
fn a_natural_create_is_a_put_to_a_url_the_operation_names() {
    let base = sim_text()
        .replacen(
            "method = \"POST\"\npath = \"/v1/jobs\"",
            "method = \"PUT\"\npath = \"/v1/things/{operation_id}\"",
            1,
        )
        .replacen(
            "idempotency = \"header\"\nidempotency_header = \"Idempotency-Key\"\n",
            "idempotency = \"natural\"\n",
            1,
        );
    let c = parse(&base).unwrap();
    assert_eq!(c.idempotency(), IdempotencyMode::Natural);
    assert!(c.idempotency().guarantees_at_most_once());
    for (from, to, key) in [
        ("method = \"PUT\"", "method = \"POST\"", "create.method"),
        ("/v1/things/{operation_id}", "/v1/things", "create.path"),
        (
            "idempotency = \"natural\"\n",
            "idempotency = \"natural\"\nidempotency_header = \"K\"\n",
            "create.idempotency",
        ),
    ] {
        let err = parse(&base.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(key), "{to}: {err}");
    }
    // No key is sent, so none can be looked up.
    let err = parse(&base.replacen(
        "lookup_url = \"/v1/jobs?client_reference={client_reference}\"",
        "lookup_url = \"/v1/jobs?key={idempotency_key}\"",
        1,
    ))
    .unwrap_err();
    assert!(err.contains("{idempotency_key}"), "{err}");
}

#[test]
fn result_formats_chosen_by_the_request_are_checked_each_as_a_whole_result() {
    let base = sim_text().replacen("[result]\n", "[result]\nformat_from = \"/output\"\n", 1);
    let with =
        |formats: &str| base.replacen("[reconcile]\n", &format!("{formats}\n[reconcile]\n"), 1);
    let ok = with(
        "[result.formats.csv]\nformat = \"csv\"\ncontent_type = \"text/csv\"\n[result.formats.ndjson]\nformat = \"bytes\"\nmax_bytes = 2048\n",
    );
    let c = parse(&ok).unwrap();
    let r = c.result.as_ref().unwrap();
    assert_eq!(r.formats.len(), 2);
    // Where and how it is fetched is inherited; what the bytes must look like is not.
    let csv = &r.formats["csv"];
    assert_eq!(csv.checksum_header, r.checksum_header);
    assert!(csv.schema.is_none() && csv.items.is_none());
    assert_eq!(r.largest(), r.max_bytes.max(2048));
    let request = serde_json::json!({"output": "csv"});
    assert_eq!(
        r.for_request(&request).format,
        jobtrail_provider::contract::ResultFormat::Csv
    );
    assert_eq!(
        r.for_request(&serde_json::json!({})).format,
        jobtrail_provider::contract::ResultFormat::Json
    );
    let terms = c.terms().result_formats.unwrap();
    assert_eq!(terms.pointer, "/output");
    assert_eq!(terms.names, ["csv", "ndjson"]);

    for (text, key) in [
        (base.clone(), "result.formats"),
        (
            sim_text().replacen(
                "[reconcile]\n",
                "[result.formats.csv]\nformat = \"csv\"\n[reconcile]\n",
                1,
            ),
            "result.format_from",
        ),
        (
            with("[result.formats.none]\nformat = \"none\"\n"),
            "result.formats.none",
        ),
        (
            with("[result.formats.csv]\nformat = \"csv\"\ncsv_error_values = [\"E\"]\n"),
            "result.formats.csv: result.csv_status_column",
        ),
        (
            with("[result.formats.csv]\nformat = \"csv\"\nnonsense = 1\n"),
            "result.formats.csv",
        ),
    ] {
        let err = parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
}

/// Every complete contract the contract docs show loads as written (a fragment, one without
/// `name`, is not a contract).
#[test]
fn the_contracts_in_the_docs_load() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/provider-contracts.md"),
    )
    .unwrap();
    let mut loaded = 0;
    for block in doc.split("```toml\n").skip(1) {
        let text = block.split("```").next().unwrap();
        if !text.lines().any(|l| l.starts_with("name = ")) {
            continue;
        }
        // Secrets named by environment variables need not be set to load.
        parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        loaded += 1;
    }
    assert!(loaded >= 5, "{loaded} contracts in the docs");
}

/// Every problem `contract check` would list for `text`, as printed.
fn problems(text: &str) -> Vec<String> {
    jobtrail_provider::contract::problems(text, &providers_dir().join("test.toml"))
        .iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn every_problem_is_named_and_none_is_an_echo_of_another() {
    assert!(problems(&sim_text()).is_empty(), "a good contract has none");
    // Independent mistakes are all named, in the order they are checked.
    let text = sim_text()
        .replacen("factor = 2.0", "factor = 99.0", 1)
        .replacen("connect_ms = 1000", "connect_ms = 0", 1)
        .replacen("window_ms = 5000", "window_ms = 5", 1);
    let found = problems(&text);
    assert_eq!(found.len(), 3, "{found:#?}");
    for (p, key) in found
        .iter()
        .zip(["timeouts.connect_ms", "polling.factor", "cancel.window_ms"])
    {
        assert!(p.contains(key), "{key}: {found:?}");
    }
    // A problem that only follows from another is not reported as a second one: with the bad
    // header name set aside, "header placement needs a header name" is its echo.
    let text = sim_text().replacen(
        "idempotency_header = \"Idempotency-Key\"",
        "idempotency_header = \"bad header\"",
        1,
    );
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("a valid HTTP header name"), "{found:?}");

    // A problem inside one result format is set aside by its own path.
    let text = sim_text()
        .replacen("[result]\n", "[result]\nformat_from = \"/f\"\n", 1)
        .replacen(
            "[reconcile]\n",
            "[result.formats.csv]\nformat = \"csv\"\ncsv_error_values = [\"E\"]\n\n[reconcile]\n",
            1,
        )
        .replacen("factor = 2.0", "factor = 0.5", 1);
    let found = problems(&text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|p| p.contains("result.formats.csv: result.csv_status_column")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.contains("polling.factor")),
        "{found:?}"
    );
    // Text that is not TOML is one problem.
    assert_eq!(problems("name = ").len(), 1);
}

#[test]
fn the_create_answer_may_name_the_result_url_but_only_one_place_says_where() {
    let base = sim_text().replacen(
        "sync_result = \"body:/result\"\n",
        "sync_result = \"body:/result\"\nresult_url = \"header:Location\"\n",
        1,
    );
    let c = parse(&base).unwrap();
    assert_eq!(
        c.create.result_url,
        Some(jobtrail_provider::contract::Locator::Header(
            "Location".into()
        ))
    );
    for (from, to) in [
        (
            "[result]\n",
            "[result]\nurl = \"/v1/jobs/{job_id}/result\"\n",
        ),
        ("[result]\n", "[result]\nfrom = \"resource\"\n"),
    ] {
        let err = parse(&base.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains("create.result_url"), "{to}: {err}");
    }
    let err = parse(&base.replacen(
        "result_url = \"header:Location\"",
        "result_url = \"Location\"",
        1,
    ))
    .unwrap_err();
    assert!(err.contains("create.result_url"), "{err}");
}

#[test]
fn a_contract_can_do_without_a_profile_key() {
    let base = r#"
protocol = "ogc-processes"
name = "o"
base_url = "https://example.test"
UNSET
[create]
path = "/processes/{target}/execution"
idempotency = "none"
"#;
    let c = parse(&base.replace("UNSET", "")).unwrap();
    assert!(c.create.headers.contains_key("prefer"));
    assert!(c.cancel.is_some());
    // A server that executes asynchronously without being asked, and cannot dismiss.
    let c =
        parse(&base.replace("UNSET", "unset = [\"create.headers.Prefer\", \"cancel\"]")).unwrap();
    assert!(!c.create.headers.contains_key("prefer"));
    assert!(c.cancel.is_none());
    for (unset, key) in [
        ("unset = [\"create.nothing\"]", "unset[0]"),
        ("unset = [\"cancel\", 3]", "unset[1]"),
        ("unset = \"cancel\"", "unset"),
    ] {
        let err = parse(&base.replace("UNSET", unset)).unwrap_err();
        assert!(err.contains(key), "{unset}: {err}");
    }
    let err =
        parse(&sim_text().replacen("name = \"sim\"", "unset = [\"status\"]\nname = \"sim\"", 1))
            .unwrap_err();
    assert!(err.contains("unset") && err.contains("protocol"), "{err}");
}

#[test]
fn only_2xx_codes_can_say_a_create_ran_synchronously() {
    let base = sim_text();
    let with = |codes: &str| {
        base.replacen(
            "sync_result = \"body:/result\"\n",
            &format!("sync_result = \"body:/result\"\nsync_codes = {codes}\n"),
            1,
        )
    };
    assert_eq!(parse(&with("[200]")).unwrap().create.sync_codes, [200]);
    for bad in ["[302]", "[500]", "[200, 404]"] {
        let err = parse(&with(bad)).unwrap_err();
        assert!(err.contains("create.sync_codes"), "{bad}: {err}");
    }
}

#[test]
fn what_the_review_found_is_refused_at_load() {
    let sim = sim_text();
    let cases: Vec<(String, &str)> = vec![
        // One header, one meaning: the call id never stands in for the token or the trace.
        (
            sim.replacen(
                "trace_header = \"X-Trace-ID\"",
                "trace_header = \"X-Trace-ID\"\nclient_request_id_header = \"Idempotency-Key\"",
                1,
            ),
            "client_request_id_header",
        ),
        (
            sim.replacen(
                "trace_header = \"X-Trace-ID\"",
                "trace_header = \"X-Trace-ID\"\nclient_request_id_header = \"x-trace-id\"",
                1,
            ),
            "client_request_id_header",
        ),
        (
            sim.replacen("trace_header = \"X-Trace-ID\"", "trace_header = \"Idempotency-Key\"", 1),
            "trace_header",
        ),
        // A natural PUT to a URL a target or a request value names: two operations may share it.
        (
            sim.replacen("method = \"POST\"\npath = \"/v1/jobs\"", "method = \"PUT\"\npath = \"/v1/things/{target}\"", 1)
                .replacen("idempotency = \"header\"\nidempotency_header = \"Idempotency-Key\"\n", "idempotency = \"natural\"\n", 1),
            "create.path",
        ),
        (
            sim.replacen("method = \"POST\"\npath = \"/v1/jobs\"", "method = \"PUT\"\npath = \"/v1/things/main?op={operation_id}\"", 1)
                .replacen("idempotency = \"header\"\nidempotency_header = \"Idempotency-Key\"\n", "idempotency = \"natural\"\n", 1),
            "create.path",
        ),
        // A request value alone in a call about our job could name another job.
        (
            sim.replacen("path = \"/v1/jobs/{job_id}/cancel\"", "path = \"/v1/jobs/{request:/job}/cancel\"", 1),
            "cancel.path",
        ),
        // A result format's own URL is checked like any other.
        (
            sim.replacen("[result]\n", "[result]\nformat_from = \"/f\"\n", 1).replacen(
                "[reconcile]\n",
                "[result.formats.raw]\nformat = \"bytes\"\nurl = \"https://elsewhere.test/{job_id}\"\n\n[reconcile]\n",
                1,
            ),
            "result.formats.raw.url",
        ),
        // jobtrail's own credentials are never a provider's secret.
        (
            sim.replacen("secret = \"env:JOBTRAIL_SIM_TOKEN\"", "secret = \"env:DATABASE_URL\"", 1),
            "auth.secret",
        ),
        (
            sim.replacen(
                "secret = \"env:JOBTRAIL_SIM_TOKEN\"",
                "secret = \"file:/proc/self/environ\"",
                1,
            ),
            "auth.secret",
        ),
        (
            sim.replacen("from = \"env:JOBTRAIL_SIM_CARD\"", "from = \"env:JOBTRAIL_OPERATOR_DATABASE_URL\"", 1),
            "secrets.customer_card",
        ),
        (
            sim.replacen("secret = \"env:JOBTRAIL_SIM_TOKEN\"", "secret = \"env:OTEL_EXPORTER_OTLP_HEADERS\"", 1),
            "auth.secret",
        ),
        (
            sim.replacen("from = \"env:JOBTRAIL_SIM_CARD\"", "from = \"env:OTEL_EXPORTER_OTLP_TRACES_HEADERS\"", 1),
            "secrets.customer_card",
        ),
    ];
    for (text, key) in cases {
        let err = parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
    // Without create.job_id: no {job_id} in a body either, and no lookup of provider ids.
    let azure = r#"
protocol = "azure-lro"
name = "a"
base_url = "https://example.test"
[create]
path = "/things"
idempotency = "header"
idempotency_header = "Idempotency-Key"
[status]
url = "{status_url}"
EXTRA
"#;
    for (extra, key) in [
        (
            "[cancel]\npath = \"{status_url}/cancel\"\nbody = { run = \"{job_id}\" }",
            "cancel.body",
        ),
        (
            "[reconcile]\nmethod = \"lookup\"\nlookup_url = \"/things?key={idempotency_key}\"",
            "reconcile.lookup_url",
        ),
    ] {
        let err = parse(&azure.replace("EXTRA", extra)).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn a_list_with_a_problem_is_set_aside_whole_and_a_missing_key_is_no_new_problem() {
    // Two bad entries in one list: one problem named (no renumbered, wrong index).
    let text = sim_text().replacen(
        "redact = [\"/payment/card_number\"]",
        "redact = [\"a\", \"/ok\", \"b\"]\n",
        1,
    );
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("redact[0]"), "{found:?}");
    // A bad job id locator: the templates that need it are not reported as problems of their own.
    let text = sim_text().replacen("job_id = \"body:/job_id\"", "job_id = \"job_id\"", 1);
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("create.job_id"), "{found:?}");
}

#[test]
fn a_request_value_never_alone_chooses_the_job_a_call_is_about() {
    let sim = sim_text();
    let refused = [
        // In a body, with nothing of ours beside it.
        sim.replacen(
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs:cancel\"\nbody = { name = \"{request:/job}\" }",
            1,
        ),
        // Ours only in the query: the path is the request's.
        sim.replacen(
            "path = \"/v1/jobs/{job_id}/cancel\"",
            "path = \"/v1/jobs/{request:/job}/cancel?ref={operation_id}\"",
            1,
        ),
        // A result fetched by a request value alone.
        sim.replacen(
            "content_type = \"application/json\"\nmax_bytes",
            "url = \"/v1/results:get\"\nbody = { id = \"{request:/id}\" }\ncontent_type = \"application/json\"\nmax_bytes",
            1,
        ),
    ];
    for text in refused {
        let err = parse(&text).unwrap_err();
        assert!(err.contains("a request value alone"), "{err}");
    }
    // Beside what names our job, a request value is data.
    let ok = sim.replacen(
        "path = \"/v1/jobs/{job_id}/cancel\"",
        "path = \"/v1/jobs:cancel\"\nbody = { run = \"{job_id}\", labels = \"{request:/labels}\" }",
        1,
    );
    parse(&ok).unwrap();
}

/// Credentials go over plain http only to this machine, or where the contract says the network
/// between is the operator's own (`allow_plain_http`): a tired operator's `http://api…` is refused
/// at load, naming the origin; https, loopback, a provider that gets no credentials, and an
/// unauthenticated origin (no credentials go there) are not.
#[test]
fn credentials_never_go_over_plain_http_to_another_host_unless_the_contract_says_so() {
    let sim = sim_text().replace("allow_plain_http = true\n", "");
    let with_base = |base: &str| {
        sim.replacen(
            "base_url = \"http://127.0.0.1:8700\"",
            &format!("base_url = \"{base}\""),
            1,
        )
    };
    for base in [
        "http://api.provider.example",
        "http://10.0.0.7:8700",
        "http://[2001:db8::1]",
    ] {
        let err = parse(&with_base(base)).unwrap_err();
        assert!(
            err.contains("base_url") && err.contains("https where credentials"),
            "{base}: {err}"
        );
    }
    for base in [
        "https://api.provider.example",
        "http://127.0.0.1:8700",
        "http://127.8.9.10",
        "http://localhost:8700",
        "http://[::1]:8700",
    ] {
        parse(&with_base(base)).unwrap_or_else(|e| panic!("{base}: {e}"));
    }
    let opted_in = with_base("http://sim:8700").replacen(
        "name = \"sim\"",
        "name = \"sim\"\nallow_plain_http = true",
        1,
    );
    parse(&opted_in).unwrap();
    // Another trusted origin in plain http is refused the same way.
    let origins = with_base("https://api.provider.example").replacen(
        "name = \"sim\"",
        "name = \"sim\"\norigins = [\"https://api.provider.example\", \"http://files.provider.example\"]",
        1,
    );
    let err = parse(&origins).unwrap_err();
    assert!(
        err.contains("origins") && err.contains("http://files.provider.example"),
        "{err}"
    );
    // Granted secrets travel in the create's body, even to an origin that gets no credentials.
    let upload = with_base("https://api.provider.example")
        .replacen(
            "name = \"sim\"",
            "name = \"sim\"\nunauthenticated_origins = [\"http://upload.provider.example\"]",
            1,
        )
        .replacen(
            "path = \"/v1/jobs\"",
            "path = \"http://upload.provider.example/v1/jobs\"",
            1,
        );
    let err = parse(&upload).unwrap_err();
    assert!(err.contains("http://upload.provider.example"), "{err}");
    parse(&upload.replace("http://upload.", "https://upload.")).unwrap_or_else(|e| panic!("{e}"));
    // No credentials at all: plain http is the provider's business.
    let anonymous = with_base("http://api.provider.example")
        .replace(
            "[auth]\nheader = \"Authorization\"\nscheme = \"Bearer\"\nsecret = \"env:JOBTRAIL_SIM_TOKEN\"\n",
            "",
        )
        .replace("redact = [\"/payment/card_number\"]\n", "");
    let anonymous = anonymous.split("[secrets.").next().unwrap().to_owned();
    parse(&anonymous).unwrap_or_else(|e| panic!("{e}"));
}

/// A check the result's format never makes is refused by name at load, not accepted to pass every
/// result: item keys with `format = "bytes"` (a batch whose every item failed would be
/// `succeeded`), CSV keys with JSON, a failed-item bound without the items it counts.
#[test]
fn result_checks_the_format_never_makes_are_refused_by_name() {
    let base = sim_text();
    let json = "format = \"json\"\nchecksum_header = \"X-Checksum-Sha256\"\nschema_file = \"schemas/sim-result.json\"\n";
    assert!(base.contains(json));
    let bytes = base.replacen(
        json,
        "format = \"bytes\"\nchecksum_header = \"X-Checksum-Sha256\"\n",
        1,
    );
    // The item keys the shipped contract sets: the first is named.
    let err = parse(&bytes).unwrap_err();
    assert!(
        err.contains("result.items") && err.contains("\"bytes\""),
        "{err}"
    );
    // The item keys the shipped contract sets, one line each.
    let item_lines = [
        "items = \"/items\"\n",
        "item_error = \"/error\"\n",
        "item_ref = \"/id\"\n",
        "item_status = \"/status\"\n",
        "item_succeeded_values = [\"ok\"]\n",
    ];
    let without_items = |text: &str| {
        item_lines
            .iter()
            .fold(text.to_owned(), |t, k| t.replacen(k, "", 1))
    };
    let bare_bytes = without_items(&bytes);
    parse(&bare_bytes).unwrap();
    for (key, line) in [
        ("result.max_failed_items", "max_failed_items = 0\n"),
        ("result.expected_count", "expected_count = 5\n"),
        (
            "result.csv_error_values",
            "csv_error_values = [\"ERROR\"]\n",
        ),
    ] {
        let text = bare_bytes.replacen(
            "format = \"bytes\"\n",
            &format!("format = \"bytes\"\n{line}"),
            1,
        );
        let err = parse(&text).unwrap_err();
        assert!(err.contains(key), "{key}: {err}");
    }
    let csv_in_json = base.replacen(json, &format!("{json}csv_status_column = \"status\"\n"), 1);
    assert!(
        parse(&csv_in_json)
            .unwrap_err()
            .contains("result.csv_status_column")
    );
    // (Without the status's expected count too: a JSON result without items cannot check it.)
    let no_items = without_items(&base).replacen("expected_count = \"/expected_items\"\n", "", 1);
    assert!(
        parse(&without_items(&base))
            .unwrap_err()
            .contains("status.expected_count")
    );
    parse(&no_items).unwrap();
    let bound = no_items.replacen(json, &format!("{json}max_failed_items = 0\n"), 1);
    assert!(parse(&bound).unwrap_err().contains("result.items"));
}

/// A format chosen by the request inherits an item count or bound from beside it only if it
/// counts items: a bytes format beside a CSV base that bounds failed rows loads without the bound
/// (it was never its own), one that sets the bound itself is refused by name.
#[test]
fn an_item_bound_inherited_by_a_format_that_counts_no_items_is_not_its_own() {
    let csv = std::fs::read_to_string(providers_dir().join("sim-csv.toml")).unwrap();
    assert!(csv.contains("max_failed_items = 0\n"));
    let base = csv.replacen("[result]\n", "[result]\nformat_from = \"/output\"\n", 1);
    let with =
        |formats: &str| base.replacen("[reconcile]\n", &format!("{formats}\n[reconcile]\n"), 1);
    let c = parse(&with("[result.formats.raw]\nformat = \"bytes\"\n")).unwrap();
    let r = c.result.as_ref().unwrap();
    assert_eq!(r.max_failed_items, Some(0), "the base keeps its own");
    assert_eq!(r.formats["raw"].max_failed_items, None);
    let err = parse(&with(
        "[result.formats.raw]\nformat = \"bytes\"\nmax_failed_items = 1\n",
    ))
    .unwrap_err();
    assert!(
        err.contains("result.formats.raw") && err.contains("result.max_failed_items"),
        "{err}"
    );
}

/// A count the status gives is checked against a JSON result's items, so a JSON result, or a JSON
/// format a request may choose, without an items pointer is refused at load (every result would
/// fail validation); bytes and CSV formats beside it load.
#[test]
fn an_expected_count_from_the_status_needs_items_in_every_json_result() {
    let base = sim_text().replacen("[result]\n", "[result]\nformat_from = \"/output\"\n", 1);
    assert!(base.contains("expected_count = \"/expected_items\""));
    let with =
        |formats: &str| base.replacen("[reconcile]\n", &format!("{formats}\n[reconcile]\n"), 1);
    parse(&with(
        "[result.formats.raw]\nformat = \"bytes\"\n[result.formats.csv]\nformat = \"csv\"\n",
    ))
    .unwrap();
    let err = parse(&with("[result.formats.bare]\nformat = \"json\"\n")).unwrap_err();
    assert!(
        err.contains("status.expected_count") && err.contains("[result.formats.bare]"),
        "{err}"
    );
}

/// Submit is told where the create writes values of its own into the body (the client reference,
/// an idempotency key in a body field), so a body that cannot take them is refused there.
#[test]
fn the_fields_a_create_writes_are_named_to_submit() {
    let base = sim_text();
    assert_eq!(
        parse(&base).unwrap().terms().written_fields,
        ["/client_reference"]
    );
    let text = base.replacen(
        "idempotency = \"header\"\nidempotency_header = \"Idempotency-Key\"",
        "idempotency = \"body_field\"\nidempotency_field = \"/meta/key\"",
        1,
    );
    assert_ne!(text, base);
    assert_eq!(
        parse(&text).unwrap().terms().written_fields,
        ["/meta/key", "/client_reference"]
    );
    // Written one after the other: one under (or at) the other, or at the whole body, or at or
    // over a sensitive field (a secret is put in first), could never be sent as meant.
    let reference = "client_reference_field = \"/client_reference\"";
    let token = "idempotency_field = \"/meta/key\"";
    for (from, to, key) in [
        (
            reference,
            "client_reference_field = \"/meta\"",
            "create.client_reference_field",
        ),
        (
            reference,
            "client_reference_field = \"/meta/key\"",
            "create.client_reference_field",
        ),
        (
            reference,
            "client_reference_field = \"\"",
            "create.client_reference_field",
        ),
        (
            token,
            "idempotency_field = \"/client_reference/x\"",
            "create.client_reference_field",
        ),
        (
            reference,
            "client_reference_field = \"/payment/card_number/ref\"",
            "create.client_reference_field",
        ),
        (
            token,
            "idempotency_field = \"/payment\"",
            "create.idempotency_field",
        ),
    ] {
        let bad = text.replacen(from, to, 1);
        assert_ne!(bad, text, "{to}");
        let e = parse(&bad).unwrap_err();
        assert!(e.contains(key), "{to}: {e}");
    }
}
