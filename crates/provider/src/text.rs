//! A provider's words as text for the record: a JSON value as text, text a record can store, and
//! text cut to a length a record can carry. A provider is not trusted to send either.

use serde_json::Value;

/// A JSON value as text: a string as itself, anything else (`true`, `3`, an object) as its JSON.
/// Storable (see [`storable`]): a provider's string may hold anything, and JSON text escapes only
/// the characters below U+0020 (DEL and the C1 range, U+009B a terminal's escape, stay raw in it).
pub(crate) fn of_json(v: &Value) -> String {
    storable(v.as_str().map_or_else(|| v.to_string(), str::to_owned))
}

/// `text` as a record can store it: PostgreSQL refuses NUL in `text` and `jsonb` (a provider that
/// sent one would make its step unwritable), and other control characters would corrupt a terminal
/// or a log line. Each becomes U+FFFD; newline and tab stay.
pub(crate) fn storable(text: String) -> String {
    if !text.chars().any(unstorable) {
        return text;
    }
    text.chars()
        .map(|c| if unstorable(c) { '\u{FFFD}' } else { c })
        .collect()
}

fn unstorable(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// Whether a provider-named locator (a URL, a checksum) can be used as it is: not empty, no control
/// characters, and not longer than `max` bytes. One that fails is treated as not given.
pub(crate) fn usable(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control)
}

/// A provider's JSON (progress, say) as a record can keep it: strings and keys storable, integers
/// beyond ±2^53 as their digits (the chain's hash reads every number as a double, and could not
/// tell 2^53 + 1 from 2^53), and a value whose JSON text is longer than `max` bytes kept as that
/// text, cut.
pub(crate) fn bounded_json(v: &Value, max: usize) -> Value {
    let text = v.to_string();
    if text.len() > max {
        // Kept as its text, cut: cleaned as any text a provider wrote.
        return Value::String(storable(truncate(text, max)));
    }
    fn clean(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(storable(s.clone())),
            Value::Array(a) => Value::Array(a.iter().map(clean).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| (storable(k.clone()), clean(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let mut kept = clean(v);
    jobtrail_core::json::integers_beyond_double_as_text(&mut kept);
    kept
}

pub(crate) use jobtrail_core::text::truncate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_error_texts_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short".into(), 10), "short");
        let cut = truncate("é".repeat(10), 5);
        assert_eq!(cut, "éé…");
    }

    #[test]
    fn control_characters_never_reach_a_record() {
        assert_eq!(
            storable("run\u{0}ning\u{1b}[31m".into()),
            "run\u{FFFD}ning\u{FFFD}[31m"
        );
        assert_eq!(storable("two\nlines\tok".into()), "two\nlines\tok");
        assert_eq!(of_json(&serde_json::json!("a\u{0}b")), "a\u{FFFD}b");
        // Not a string: its JSON text keeps DEL and the C1 range raw, so they are replaced too.
        assert_eq!(
            of_json(&serde_json::json!({"m": "\u{9b}2J\u{7f}"})),
            "{\"m\":\"\u{FFFD}2J\u{FFFD}\"}"
        );
        let v = bounded_json(&serde_json::json!({"n\u{0}": ["x\u{0}"], "k": 1}), 100);
        assert_eq!(v, serde_json::json!({"n\u{FFFD}": ["x\u{FFFD}"], "k": 1}));
        // An integer the chain's hash could not tell from its neighbours is kept as its digits.
        let v = bounded_json(
            &serde_json::json!({"done": 9007199254740993_u64, "of": 10}),
            100,
        );
        assert_eq!(v, serde_json::json!({"done": "9007199254740993", "of": 10}));
        let big = bounded_json(&serde_json::json!({"pad": "y".repeat(5000)}), 64);
        assert!(big.as_str().is_some_and(|s| s.len() <= 64 + 3), "{big}");
        assert!(!usable("/v1/jobs/a\u{0}", 100) && !usable("", 100) && !usable("/x", 1));
        assert!(usable("/v1/jobs/a", 100));
    }

    #[test]
    fn a_json_value_is_text_as_it_reads() {
        assert_eq!(of_json(&serde_json::json!("Canceled")), "Canceled");
        assert_eq!(of_json(&serde_json::json!(true)), "true");
        assert_eq!(of_json(&serde_json::json!({"code": 1})), r#"{"code":1}"#);
    }
}
