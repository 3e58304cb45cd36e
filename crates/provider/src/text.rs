//! A provider's words as text for the record: a JSON value as text, and text cut to a length a
//! record can carry.

/// A JSON value as text: a string as itself, anything else (`true`, `3`, an object) as its JSON.
pub(crate) fn of_json(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// At most `max` bytes of `text`, cut at a character boundary and marked with `…` (a provider's
/// error text is kept, not its every megabyte).
pub(crate) fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

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
    fn a_json_value_is_text_as_it_reads() {
        assert_eq!(of_json(&serde_json::json!("Canceled")), "Canceled");
        assert_eq!(of_json(&serde_json::json!(true)), "true");
        assert_eq!(of_json(&serde_json::json!({"code": 1})), r#"{"code":1}"#);
    }
}
