//! The OpenAPI document is generated from the routes, committed as `docs/openapi.json`, valid
//! OpenAPI 3.1, and matches what the server answers.

use std::collections::BTreeSet;

fn committed_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

fn generated() -> serde_json::Value {
    serde_json::to_value(jobtrail_api::openapi()).unwrap()
}

/// Set JOBTRAIL_UPDATE_OPENAPI=1 to rewrite the committed document after changing a route.
#[test]
fn the_committed_document_is_the_generated_one() {
    let doc = generated();
    let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
    if std::env::var_os("JOBTRAIL_UPDATE_OPENAPI").is_some() {
        std::fs::write(committed_path(), &text).unwrap();
    }
    let committed = std::fs::read_to_string(committed_path())
        .expect("docs/openapi.json (generate it with JOBTRAIL_UPDATE_OPENAPI=1)");
    assert!(
        committed == text,
        "docs/openapi.json differs from the document the code generates: run the tests with JOBTRAIL_UPDATE_OPENAPI=1 and commit it"
    );
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("data/openapi-3.1-schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let doc = generated();
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    // A broken document is caught (the validator is not vacuous).
    let mut broken = doc.clone();
    broken["paths"]["/v1/operations"]["post"]["responses"] = serde_json::json!("none");
    assert!(!validator.is_valid(&broken));
}

/// Every documented operation, as (METHOD, path template).
pub fn documented() -> BTreeSet<(String, String)> {
    let doc = generated();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

#[test]
fn the_document_names_every_route_and_only_those() {
    let expected: BTreeSet<(String, String)> = [
        ("POST", "/v1/operations:batch"),
        ("POST", "/v1/operations"),
        ("GET", "/v1/operations"),
        ("GET", "/v1/operations/{id}"),
        ("GET", "/v1/operations/{id}/wait"),
        ("POST", "/v1/operations/{id}/cancel"),
        ("GET", "/v1/operations/{id}/result"),
        ("POST", "/v1/operations/{id}/decisions"),
        ("GET", "/v1/providers"),
        ("GET", "/v1/escalations"),
        ("GET", "/v1/audit/verify"),
        ("POST", "/v1/webhooks/{provider}"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    assert_eq!(documented(), expected);
    // Every bearer route says so; the webhook receiver (signed by the provider) does not.
    let doc = generated();
    for (method, path) in documented() {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let secured = op.get("security").is_some();
        assert_eq!(
            secured,
            !path.starts_with("/v1/webhooks"),
            "{method} {path}"
        );
        assert!(
            op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with('2')),
            "{method} {path}"
        );
        // Any route may be refused by the door's rate limits, and any may find the database
        // down: both are problems, and a rate-limited one says when to come back.
        for code in ["429", "503"] {
            assert_eq!(
                op["responses"][code]["content"]["application/problem+json"]["schema"]["$ref"],
                "#/components/schemas/ProblemDoc",
                "{method} {path} {code}"
            );
        }
        assert_eq!(
            op["responses"]["429"]["headers"]["Retry-After"]["schema"]["type"], "integer",
            "{method} {path}"
        );
    }
}
