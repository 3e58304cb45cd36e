//! The request an operation sends, its fingerprint, and the rule for sensitive fields.
//!
//! The fingerprint is sha256 over the RFC 8785 (JCS) form of `{provider, target, body}`, so key order
//! and whitespace never change it while any change of effect (account, range, format, target) does.
//!
//! Sensitive fields (JSON pointers named by the provider contract) are never stored as values. The
//! caller passes a secret reference there instead, `{"$secret": "env:NAME"}` or
//! `{"$secret": "file:/path"}`, which the adapter resolves at send time. A literal value in a sensitive
//! field is refused at submit: storing it redacted would make the operation impossible to send after a
//! restart, and storing it plainly would put a secret at rest.

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

/// Where a secret reference points. Resolution (reading the env or the file) is I/O and happens in the
/// adapter at send time.
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

/// A sensitive field held a literal value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SensitiveFieldError {
    #[error(
        "field {pointer} is marked sensitive by the provider contract: pass a secret reference such as {{\"$secret\": \"env:NAME\"}} instead of the value"
    )]
    LiteralValue { pointer: String },
    #[error("field {pointer}: {message}")]
    BadReference { pointer: String, message: String },
}

/// Check that every sensitive pointer that is present in `body` holds a well-formed secret reference.
/// Absent fields are fine (the provider's own schema decides whether they are required).
pub fn check_sensitive_fields(
    body: &serde_json::Value,
    sensitive_pointers: &[String],
) -> Result<(), SensitiveFieldError> {
    for pointer in sensitive_pointers {
        let Some(v) = body.pointer(pointer) else {
            continue;
        };
        match SecretRef::from_value(v) {
            Some(Ok(_)) => {}
            Some(Err(message)) => {
                return Err(SensitiveFieldError::BadReference {
                    pointer: pointer.clone(),
                    message,
                });
            }
            None => {
                return Err(SensitiveFieldError::LiteralValue {
                    pointer: pointer.clone(),
                });
            }
        }
    }
    Ok(())
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
    fn sensitive_fields_take_references_only() {
        let ptrs = vec!["/card/number".to_string()];
        assert!(
            check_sensitive_fields(&json!({"card":{"number":{"$secret":"env:CARD"}}}), &ptrs)
                .is_ok()
        );
        assert!(check_sensitive_fields(&json!({"amount": 3}), &ptrs).is_ok());
        let err = check_sensitive_fields(&json!({"card":{"number":"4111"}}), &ptrs).unwrap_err();
        assert!(err.to_string().contains("/card/number"));
        assert!(!err.to_string().contains("4111"));
        assert!(
            check_sensitive_fields(
                &json!({"card":{"number":{"$secret":"env:bad-name"}}}),
                &ptrs
            )
            .is_err()
        );
        assert!(
            check_sensitive_fields(
                &json!({"card":{"number":{"$secret":"file:relative"}}}),
                &ptrs
            )
            .is_err()
        );
    }
}
