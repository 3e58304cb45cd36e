//! The request an operation sends, its fingerprint, and the rule for sensitive fields.
//!
//! The fingerprint is sha256 over the RFC 8785 (JCS) form of `{provider, target, body}`, so key order
//! and whitespace never change it while any change of effect (account, range, format, target) does.
//!
//! Sensitive fields (JSON pointers named by the provider contract) are never stored as values. The
//! caller names a secret there instead, `{"$secret": "customer_card"}`: a *grant name* the operator
//! configured for this provider (and, where it matters, for this caller), which the worker resolves
//! at send time from a source only the operator chose. A caller never names a path or an environment
//! variable, so it can reach no secret of the worker host that was not granted to it. A literal
//! value in a sensitive field is refused at submit (storing it redacted would make the operation
//! impossible to send after a restart; storing it plainly would put a secret at rest), and so is a
//! reference anywhere but at a sensitive field, or to a name not granted.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The key that marks a secret reference object in a request body.
pub const SECRET_REF_KEY: &str = "$secret";

/// `sha256:<64 hex>` over the canonical form of the request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(provider: &str, target: &str, body: &serde_json::Value) -> Self {
        let canonical = serde_json_canonicalizer::to_vec(&serde_json::json!({
            "provider": provider,
            "target": target,
            "body": body,
        }))
        .expect("a serde_json::Value always serialises");
        Self(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(&canonical))
        ))
    }
    pub fn from_stored(s: String) -> Self {
        Self(s)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an operator-configured secret comes from (a contract's `[auth]` or `[secrets]`), never a
/// caller's. Resolution (reading the env or the file) is I/O and happens in the adapter at send time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum SecretRef {
    Env(String),
    File(String),
}

impl SecretRef {
    /// Parse `env:NAME` or `file:/path`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(name) = s.strip_prefix("env:") {
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Ok(SecretRef::Env(name.to_owned()));
            }
        } else if let Some(path) = s.strip_prefix("file:")
            && path.starts_with('/')
        {
            return Ok(SecretRef::File(path.to_owned()));
        }
        Err(format!(
            "secret reference {s:?} is malformed: expected env:NAME (letters, digits, _) or file:/absolute/path"
        ))
    }

    /// If `v` is a secret reference object, the reference it holds.
    pub fn from_value(v: &serde_json::Value) -> Option<Result<Self, String>> {
        let obj = v.as_object()?;
        if obj.len() != 1 {
            return None;
        }
        let s = obj.get(SECRET_REF_KEY)?;
        Some(match s.as_str() {
            Some(s) => Self::parse(s),
            None => Err(format!("{SECRET_REF_KEY} must be a string")),
        })
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretRef::Env(n) => write!(f, "env:{n}"),
            SecretRef::File(p) => write!(f, "file:{p}"),
        }
    }
}

/// A secret the operator granted callers of one provider to name: which callers may (all, when
/// `callers` is `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretGrant {
    pub callers: Option<Vec<String>>,
}

impl SecretGrant {
    pub fn allows(&self, caller: &str) -> bool {
        self.callers
            .as_ref()
            .is_none_or(|c| c.iter().any(|x| x == caller))
    }
}

/// Is this a well-formed grant name (what a caller may put in `{"$secret": …}`)?
pub fn is_grant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
}

/// A request body's secret references broke a rule. Never holds a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SensitiveFieldError {
    #[error(
        "field {pointer} is marked sensitive by the provider contract: name a granted secret such as {{\"$secret\": \"customer_card\"}} instead of the value"
    )]
    LiteralValue { pointer: String },
    #[error("field {pointer}: {message}")]
    BadReference { pointer: String, message: String },
    #[error(
        "field {pointer} holds a secret reference, but the provider contract marks no such field sensitive: secrets may be named only at {allowed}"
    )]
    NotSensitive { pointer: String, allowed: String },
    #[error(
        "field {pointer}: secret {name:?} is not granted to {holder} for this provider{granted}"
    )]
    NotGranted {
        pointer: String,
        name: String,
        /// Who it was checked for, as a phrase (`caller "agent-7"`).
        holder: String,
        granted: String,
    },
}

/// Whose grants a request's secret references are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// The operation's caller: the agent it runs for.
    Caller(&'a str),
    /// A person who retried the caller's operation with a request they edited (this retry, or
    /// one it resends unedited): the request is theirs too, and they may not reach a secret
    /// through the agent's grant.
    Retrier(&'a str),
}

impl Holder<'_> {
    pub fn name(&self) -> &str {
        match self {
            Holder::Caller(n) | Holder::Retrier(n) => n,
        }
    }
}

impl std::fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Caller(n) => write!(f, "caller {n:?}"),
            Holder::Retrier(n) => write!(f, "{n:?}, who edited the request on a retry,"),
        }
    }
}

fn escape_pointer_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

/// Every secret reference object in `v` (an object with a `"$secret"` key), with its JSON pointer.
fn references<'a>(
    v: &'a serde_json::Value,
    at: String,
    out: &mut Vec<(String, &'a serde_json::Value)>,
) {
    match v {
        serde_json::Value::Object(m) if m.contains_key(SECRET_REF_KEY) => out.push((at, v)),
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                references(x, format!("{at}/{}", escape_pointer_token(k)), out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                references(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// The grant name a reference object holds, or why it is not one.
fn grant_name(v: &serde_json::Value) -> Result<&str, String> {
    let obj = v.as_object().expect("a reference is an object");
    let name = obj
        .get(SECRET_REF_KEY)
        .and_then(|n| n.as_str())
        .ok_or_else(|| format!("{SECRET_REF_KEY} must be a string naming a granted secret"))?;
    if obj.len() != 1 {
        return Err(format!(
            "a secret reference is an object with the single key {SECRET_REF_KEY}"
        ));
    }
    if !is_grant_name(name) {
        return Err(format!(
            "{name:?} is not a secret name (letters, digits, '_', '-', '.'): name a secret the operator granted, never a path or an environment variable"
        ));
    }
    Ok(name)
}

/// Check a body's secret references for `holder`: every reference sits at a field the contract
/// marks sensitive and names a secret granted to them; every sensitive field that is present holds
/// one. Absent fields are fine (the provider's own schema decides whether they are required).
pub fn check_sensitive_fields(
    body: &serde_json::Value,
    sensitive_pointers: &[String],
    grants: &std::collections::BTreeMap<String, SecretGrant>,
    holder: Holder<'_>,
) -> Result<(), SensitiveFieldError> {
    let caller = holder.name();
    let mut found = Vec::new();
    references(body, String::new(), &mut found);
    for (pointer, v) in found {
        if !sensitive_pointers.contains(&pointer) {
            return Err(SensitiveFieldError::NotSensitive {
                pointer,
                allowed: if sensitive_pointers.is_empty() {
                    "no field of this provider".into()
                } else {
                    sensitive_pointers.join(", ")
                },
            });
        }
        let name = grant_name(v).map_err(|message| SensitiveFieldError::BadReference {
            pointer: pointer.clone(),
            message,
        })?;
        if !grants.get(name).is_some_and(|g| g.allows(caller)) {
            let mine: Vec<&str> = grants
                .iter()
                .filter(|(_, g)| g.allows(caller))
                .map(|(n, _)| n.as_str())
                .collect();
            return Err(SensitiveFieldError::NotGranted {
                pointer,
                name: name.to_owned(),
                holder: holder.to_string(),
                granted: if mine.is_empty() {
                    " (it is granted none)".into()
                } else {
                    format!(" (granted: {})", mine.join(", "))
                },
            });
        }
    }
    for pointer in sensitive_pointers {
        if let Some(v) = body.pointer(pointer)
            && !v
                .as_object()
                .is_some_and(|o| o.contains_key(SECRET_REF_KEY))
        {
            return Err(SensitiveFieldError::LiteralValue {
                pointer: pointer.clone(),
            });
        }
    }
    Ok(())
}

/// The grant name a reference object holds (`None`: not a reference). For the adapter, after submit
/// checked it.
pub fn reference_name(v: &serde_json::Value) -> Option<&str> {
    v.as_object()?.get(SECRET_REF_KEY)?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprint_ignores_key_order_and_whitespace() {
        let a: serde_json::Value = serde_json::from_str(
            r#"{"account":"acct_218","range":{"start":"2025-02-01","end":"2025-02-28"},"format":"csv"}"#,
        )
        .unwrap();
        let b: serde_json::Value = serde_json::from_str(
            "{ \"format\" : \"csv\",\n \"range\": {\"end\":\"2025-02-28\", \"start\":\"2025-02-01\"}, \"account\":\"acct_218\" }",
        )
        .unwrap();
        assert_eq!(Fingerprint::of("p", "t", &a), Fingerprint::of("p", "t", &b));
        assert!(
            Fingerprint::of("p", "t", &a)
                .as_str()
                .starts_with("sha256:")
        );
        assert_eq!(Fingerprint::of("p", "t", &a).as_str().len(), 7 + 64);
    }

    #[test]
    fn fingerprint_changes_with_any_effect() {
        let base = json!({"account":"acct_218","format":"csv"});
        let fp = Fingerprint::of("p", "reports", &base);
        assert_ne!(
            fp,
            Fingerprint::of(
                "p",
                "reports",
                &json!({"account":"acct_219","format":"csv"})
            )
        );
        assert_ne!(
            fp,
            Fingerprint::of(
                "p",
                "reports",
                &json!({"account":"acct_218","format":"json"})
            )
        );
        assert_ne!(fp, Fingerprint::of("p", "exports", &base));
        assert_ne!(fp, Fingerprint::of("q", "reports", &base));
    }

    #[test]
    fn sensitive_fields_take_granted_names_only() {
        let ptrs = vec!["/card/number".to_string()];
        let mut grants = std::collections::BTreeMap::new();
        grants.insert("customer_card".to_string(), SecretGrant::default());
        grants.insert(
            "treasury_key".to_string(),
            SecretGrant {
                callers: Some(vec!["finance-bot".into()]),
            },
        );
        let check = |v: serde_json::Value, caller: &str| {
            check_sensitive_fields(&v, &ptrs, &grants, Holder::Caller(caller))
        };
        assert!(
            check(
                json!({"card":{"number":{"$secret":"customer_card"}}}),
                "agent-7"
            )
            .is_ok()
        );
        assert!(check(json!({"amount": 3}), "agent-7").is_ok());
        // A literal value, and never the value in the message.
        let err = check(json!({"card":{"number":"4111"}}), "agent-7").unwrap_err();
        assert!(err.to_string().contains("/card/number"));
        assert!(!err.to_string().contains("4111"));
        // Paths and environment variables are not names; a name not granted is refused.
        for bad in ["env:CARD", "file:/etc/passwd", "../x", ""] {
            assert!(
                matches!(
                    check(json!({"card":{"number":{"$secret": bad}}}), "agent-7"),
                    Err(SensitiveFieldError::BadReference { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            check(
                json!({"card":{"number":{"$secret":"someone_elses"}}}),
                "agent-7"
            ),
            Err(SensitiveFieldError::NotGranted { .. })
        ));
        // Granted to another caller only.
        assert!(matches!(
            check(
                json!({"card":{"number":{"$secret":"treasury_key"}}}),
                "agent-7"
            ),
            Err(SensitiveFieldError::NotGranted { .. })
        ));
        assert!(
            check(
                json!({"card":{"number":{"$secret":"treasury_key"}}}),
                "finance-bot"
            )
            .is_ok()
        );
        // A reference anywhere but a sensitive field.
        assert!(matches!(
            check(json!({"note":{"$secret":"customer_card"}}), "agent-7"),
            Err(SensitiveFieldError::NotSensitive { .. })
        ));
        assert!(matches!(
            check(json!({"items":[{"$secret":"customer_card"}]}), "agent-7"),
            Err(SensitiveFieldError::NotSensitive { .. })
        ));
    }
}
