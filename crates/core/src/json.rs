//! Request bodies, parsed strictly: what is fingerprinted, stored and sent is what the caller wrote.
//!
//! `serde_json` on its own takes the last of two equal keys, rounds integers beyond 64 bits to the
//! nearest double, and accepts `\u0000`, which PostgreSQL's `jsonb` then refuses at write time (an
//! "unavailable" error for what is bad input). Here each of those is refused before anything is
//! written, with the line and column of the offending token:
//!
//! * a key that appears twice in one object;
//! * an integer beyond the 64-bit range, or a number written with a fraction or exponent whose
//!   value is an integer of 2^53 or more (a double cannot hold it exactly) — send such values as
//!   strings; other non-integer numbers are IEEE doubles, as RFC 8785 (JCS) fingerprints them;
//! * the NUL character in a key or a string;
//! * a body whose parsed form would take more than [`MAX_PARSED_BYTES`] of memory. A parsed value
//!   can take far more than its text (`[0,0,…]` 16 to 32 times, `[{"a":0},…]` about 80: each
//!   object is a B-tree node of some 640 bytes), so a body within every byte limit could still
//!   take a server's memory; [`footprint`] measures it without building anything, first.

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why a body was refused, with where (serde_json's line and column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (line {line}, column {column})")]
pub struct BodyError {
    pub message: String,
    pub line: usize,
    pub column: usize,
    /// Refused for the memory it would take parsed ([`MAX_PARSED_BYTES`]), not for its text.
    pub too_large: bool,
}

/// Parse a request body strictly (see the module docs).
pub fn parse_strict(bytes: &[u8]) -> Result<Value, BodyError> {
    parse::<false>(bytes)
}

/// As [`parse_strict`], but a NUL is let through: for a door whose handler refuses it itself, in
/// words its caller reads (an MCP tool answers with a tool error; a transport error is never seen
/// by the agent). Two equal keys and inexact numbers are refused all the same: no handler can tell
/// them from what the caller meant once parsed.
pub fn parse_exact(bytes: &[u8]) -> Result<Value, BodyError> {
    parse::<true>(bytes)
}

/// A document a provider wrote (a result), read as every reader reads it alike: a key that appears
/// twice in one object is refused, where `serde_json` keeps the last and other readers the first
/// (a result checked against its schema by one value and read by its caller as the other). Its
/// numbers and NULs are taken as written (a provider's doubles are its own); its size is bounded
/// by the contract's limit on the bytes, not here.
pub fn parse_unique_keys(bytes: &[u8]) -> Result<Value, BodyError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict::<true, false>::deserialize(&mut de).and_then(|v| de.end().map(|()| v.0));
    parsed.map_err(body_error)
}

/// The most memory a parsed body may take: twice the largest request body, so that a body of
/// text (a long string, base64) or of a few hundred thousand small values passes, and sixteen
/// megabytes of tiny values do not.
pub const MAX_PARSED_BYTES: usize = 32 * 1024 * 1024;

/// About how many bytes `bytes` would take parsed into a [`Value`] (its heap allocations and the
/// root), measured without building it (serde_json's scratch buffer aside: a string with escapes,
/// a long number); refused as soon as it passes [`MAX_PARSED_BYTES`], with where, and when the
/// text is not JSON at all. An estimate, on the high side: it sizes serde_json's `Value` as it is
/// built here (B-tree objects, whose nodes are a half to full whatever order the keys come in;
/// arrays doubling from 4).
pub fn footprint(bytes: &[u8]) -> Result<usize, BodyError> {
    footprint_within(bytes, MAX_PARSED_BYTES)
}

/// As [`footprint`], refusing past `most` bytes instead (a provider's answer, say).
pub fn footprint_within(bytes: &[u8], most: usize) -> Result<usize, BodyError> {
    let mut f = Footprint {
        total: VALUE_BYTES,
        most,
    };
    let walked = walk(bytes, &mut f);
    walked.map(|()| f.total).map_err(|e| BodyError {
        too_large: f.total > most,
        ..e
    })
}

fn parse<const NUL_OK: bool>(bytes: &[u8]) -> Result<Value, BodyError> {
    footprint(bytes)?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict::<NUL_OK, true>::deserialize(&mut de).and_then(|v| de.end().map(|()| v.0));
    parsed.map_err(body_error)
}

fn body_error(e: serde_json::Error) -> BodyError {
    BodyError {
        // serde_json appends " at line L column C" to custom messages; the fields carry it.
        message: e
            .to_string()
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .to_owned(),
        line: e.line(),
        column: e.column(),
        too_large: false,
    }
}

/// More than any JSON text takes parsed, per byte of it, by [`footprint`]'s measure (the dearest
/// are objects of one empty key: `{"":0},` about 96, `{"":{"":…}}` nested as deep as the parser
/// goes about 128): a text shorter than a bound over this cannot pass it, and need not be
/// measured.
pub const MOST_PER_BYTE: usize = 160;

/// One `Value` (an array's element or an object's value lives in its parent's allocation).
const VALUE_BYTES: usize = std::mem::size_of::<Value>();
/// A B-tree node of `Map<String, Value>`: eleven keys and values, rounded up as an allocator does.
const MAP_NODE_BYTES: usize = 640;
/// Entries a map's node is counted to hold: a leaf holds 5 to 11 once split (keys written in
/// order leave it about half full, and the inner nodes above take some more), so 5 keeps the
/// estimate above what any order of keys takes.
const MAP_NODE_FILL: usize = 5;
/// The least a string's allocation takes.
const MIN_ALLOCATION: usize = 16;

fn string_bytes(len: usize) -> usize {
    if len == 0 { 0 } else { len.max(MIN_ALLOCATION) }
}

/// Told of a JSON text's parts as [`walk`] reads them, with nothing built. An `Err` (a message)
/// stops the walk there, said with where.
pub trait Walker {
    /// A string, or an object's key, decoded.
    fn text(&mut self, _s: &str) -> Result<(), String> {
        Ok(())
    }
    /// An array's `n`th element (from 0), once read.
    fn element(&mut self, _n: usize) -> Result<(), String> {
        Ok(())
    }
    /// An object's `n`th entry (from 0): its key read, its value not yet.
    fn entry(&mut self, _n: usize) -> Result<(), String> {
        Ok(())
    }
}

/// Read `bytes` as one JSON text, telling `w` of its parts, building nothing (serde_json's
/// scratch buffer aside); refused where `w` says so, or where the text is not JSON.
pub fn walk(bytes: &[u8], w: &mut dyn Walker) -> Result<(), BodyError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Walk(w)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(body_error)
}

/// Counts the heap a value would take into `total`, refusing past `most`.
struct Footprint {
    total: usize,
    most: usize,
}

impl Footprint {
    fn add(&mut self, n: usize) -> Result<(), String> {
        self.total = self.total.saturating_add(n);
        if self.total > self.most {
            return Err(format!(
                "parsed, the body would take more than the {} MiB of memory a body may (it holds too many small values: each takes 32 bytes or more, an object about 640); send bulk data as one string (base64, say) or in smaller requests",
                self.most.div_ceil(1024 * 1024)
            ));
        }
        Ok(())
    }
}

impl Walker for Footprint {
    fn text(&mut self, s: &str) -> Result<(), String> {
        self.add(string_bytes(s.len()))
    }
    fn element(&mut self, n: usize) -> Result<(), String> {
        // A vector takes room for 4 at its first element, and doubles when full: charged as it
        // grows (an empty array takes nothing).
        match n {
            0 => self.add(VALUE_BYTES * 4),
            n if n >= 4 && n.is_power_of_two() => self.add(VALUE_BYTES * n),
            _ => Ok(()),
        }
    }
    fn entry(&mut self, n: usize) -> Result<(), String> {
        if n.is_multiple_of(MAP_NODE_FILL) {
            self.add(MAP_NODE_BYTES)?;
        }
        Ok(())
    }
}

struct Walk<'a>(&'a mut dyn Walker);

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.text(s).map_err(E::custom)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let w = self.0;
        let mut n = 0;
        while seq.next_element_seed(Walk(&mut *w))?.is_some() {
            w.element(n).map_err(de::Error::custom)?;
            n += 1;
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let w = self.0;
        let mut n = 0;
        while map.next_key_seed(Walk(&mut *w))?.is_some() {
            w.entry(n).map_err(de::Error::custom)?;
            n += 1;
            map.next_value_seed(Walk(&mut *w))?;
        }
        Ok(())
    }
}

/// The largest magnitude a double holds every integer up to.
const EXACT_DOUBLE: f64 = 9_007_199_254_740_992.0; // 2^53

struct Strict<const NUL_OK: bool, const EXACT: bool>(Value);

impl<'de, const NUL_OK: bool, const EXACT: bool> Deserialize<'de> for Strict<NUL_OK, EXACT> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor::<NUL_OK, EXACT>)
            .map(Strict)
    }
}

struct StrictVisitor<const NUL_OK: bool, const EXACT: bool>;

impl<const NUL_OK: bool, const EXACT: bool> StrictVisitor<NUL_OK, EXACT> {
    fn no_nul<E: de::Error>(s: &str, what: &str) -> Result<(), E> {
        if !NUL_OK && s.contains('\0') {
            return Err(E::custom(format!(
                "{what} holds the NUL character (\\u0000), which cannot be stored"
            )));
        }
        Ok(())
    }
}

impl<'de, const NUL_OK: bool, const EXACT: bool> Visitor<'de> for StrictVisitor<NUL_OK, EXACT> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        // serde_json hands integers beyond 64 bits to us as (rounded) doubles.
        if EXACT && f.fract() == 0.0 && f.abs() >= EXACT_DOUBLE {
            return Err(E::custom(format!(
                "the number {f:e} is an integer beyond what is kept exactly (integers up to 64 bits, or 2^53 written with a fraction or exponent); send it as a string"
            )));
        }
        Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Self::no_nul(s, "a string")?;
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Self::no_nul(&s, "a string")?;
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict::<NUL_OK, EXACT>(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            Self::no_nul(&key, "a key")?;
            if out.contains_key(&key) {
                // Quoted in part: a key may be as long as the body.
                let shown: String = key.chars().take(64).collect();
                let more = if shown.len() < key.len() { "…" } else { "" };
                return Err(de::Error::custom(format!(
                    "the key {shown:?}{more} appears twice in one object"
                )));
            }
            let Strict::<NUL_OK, EXACT>(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// The first integer in `v` (depth first, in document order) beyond what a double holds exactly
/// (±2^53), as its JSON pointer and its text. The strict parser keeps 64-bit integers exactly, but a
/// request's fingerprint is RFC 8785's form, which writes every number as a double: 2^53 + 1 and
/// 2^53 would fingerprint alike, so a changed request could pass as the same one.
pub fn first_integer_beyond_double(v: &Value) -> Option<(String, String)> {
    fn escaped(key: &str) -> String {
        key.replace('~', "~0").replace('/', "~1")
    }
    match v {
        Value::Number(n) => {
            let beyond = match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.unsigned_abs() > 1 << 53,
                (None, Some(u)) => u > 1 << 53,
                (None, None) => false,
            };
            beyond.then(|| (String::new(), n.to_string()))
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            first_integer_beyond_double(item).map(|(at, n)| (format!("/{i}{at}"), n))
        }),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            first_integer_beyond_double(item).map(|(at, n)| (format!("/{}{at}", escaped(k)), n))
        }),
        _ => None,
    }
}

/// Integers beyond ±2^53 in `v` written as strings of their digits: the chain hashes JSON in
/// RFC 8785's form, which writes every number as a double, so 2^53 + 1 and 2^53 would hash alike
/// and one could be put in the other's place unseen. Applied to what a provider sends before it is
/// recorded.
pub fn integers_beyond_double_as_text(v: &mut Value) {
    match v {
        Value::Number(_) if first_integer_beyond_double(v).is_some() => {
            *v = Value::String(v.to_string());
        }
        Value::Array(items) => items.iter_mut().for_each(integers_beyond_double_as_text),
        Value::Object(map) => map.values_mut().for_each(integers_beyond_double_as_text),
        _ => {}
    }
}

/// A number in JSON text that is not exactly the shortest decimal of a double (see
/// [`number_beyond_double`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeyondDouble {
    /// The number as written, cut to 64 bytes.
    pub token: String,
    /// Written as an integer: digits only, no fraction or exponent (told before the cut).
    pub integer: bool,
}

/// A number in JSON `text` (outside strings) that is not exactly the shortest decimal of a
/// double: the chain's hash reads it as that double, so it could have been put in the place of
/// the number hashed (`5` changed to `5.0000000000000001`, or 2^53 + 1 to 2^53) without the hash
/// changing. Numbers written from a double, and integers within ±2^53, are such decimals; `None`
/// when every number is. The first one not written as an integer, else the first integer: a
/// reader may excuse large integers (a provider's, kept as it came), and one of those must not
/// hide a fraction put in later.
pub fn number_beyond_double(text: &[u8]) -> Option<BeyondDouble> {
    let mut first_integer = None;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < text.len()
                    && matches!(text[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let token = std::str::from_utf8(&text[start..i]).unwrap_or("");
                if !is_shortest_double(token) {
                    let found = BeyondDouble {
                        token: crate::text::truncate(token.to_owned(), 64),
                        integer: token.bytes().all(|b| b.is_ascii_digit() || b == b'-'),
                    };
                    if !found.integer {
                        return Some(found);
                    }
                    first_integer.get_or_insert(found);
                }
            }
            _ => i += 1,
        }
    }
    first_integer
}

/// Whether decimal `token` is exactly the shortest decimal of the double it reads as (Rust writes
/// a double so, without an exponent), compared as numbers: `5.0`, `5` and `5e0` are one number.
fn is_shortest_double(token: &str) -> bool {
    match token.parse::<f64>() {
        Ok(d) if d.is_finite() => decimal(token) == decimal(&format!("{d}")),
        _ => false,
    }
}

/// A decimal as (negative, significant digits, power of ten): one form for each number (zero is
/// `(false, "", 0)`, whatever its sign).
fn decimal(s: &str) -> Option<(bool, String, i64)> {
    let (negative, s) = s.strip_prefix('-').map_or((false, s), |r| (true, r));
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], s[at + 1..].parse::<i64>().ok()?),
        None => (s, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(whole.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mut exp = exp.checked_sub(i64::try_from(fraction.len()).ok()?)?;
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    exp = exp.checked_add(i64::try_from(significant.len() - trimmed.len()).ok()?)?;
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, trimmed.to_owned(), exp))
}

/// The key of the marker a stored value PostgreSQL keeps but serde_json refuses is read as
/// (`{"jobtrail_unreadable_json": "<why>"}`): reserved, never accepted in a request.
pub const UNREADABLE_JSON: &str = "jobtrail_unreadable_json";

/// What kind of JSON value this is, for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_a_double_cannot_hold_are_found_where_they_are() {
        let v = |t: &str| parse_strict(t.as_bytes()).unwrap();
        for fine in [
            "9007199254740992",
            "-9007199254740992",
            r#"{"a":[1, 2.5, -3, "18446744073709551615"]}"#,
        ] {
            assert_eq!(first_integer_beyond_double(&v(fine)), None, "{fine}");
        }
        for (beyond, at, n) in [
            ("9007199254740993", "", "9007199254740993"),
            ("-9007199254740993", "", "-9007199254740993"),
            (
                r#"{"a/b":{"x~y":[0, 18446744073709551615]}}"#,
                "/a~1b/x~0y/1",
                "18446744073709551615",
            ),
            (
                r#"[{"ok":1}, {"id":-9223372036854775808}]"#,
                "/1/id",
                "-9223372036854775808",
            ),
        ] {
            assert_eq!(
                first_integer_beyond_double(&v(beyond)),
                Some((at.to_owned(), n.to_owned())),
                "{beyond}"
            );
        }
    }

    #[test]
    fn parse_exact_lets_a_nul_through_and_nothing_else() {
        let nul = br#"{"a": "x\u0000y"}"#;
        assert!(parse_strict(nul).is_err());
        assert_eq!(parse_exact(nul).unwrap()["a"], "x\u{0}y");
        for bad in [
            &br#"{"a": 1, "a": 2}"#[..],
            br#"{"a": 123456789012345678901234}"#,
            br#"{"a": 1e300}"#,
        ] {
            assert!(
                parse_exact(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_body_of_many_small_values_is_refused_before_it_is_built_and_text_is_not() {
        let mib = 1024 * 1024;
        // Sixteen megabytes of zeros would be 8 M values of 32 bytes: 256 MiB.
        let mut zeros = b"[0".to_vec();
        zeros.extend(std::iter::repeat_n(&b",0"[..], 8 * mib - 1).flatten());
        zeros.push(b']');
        let e = parse_strict(&zeros).unwrap_err();
        assert!(
            e.message.contains("MiB of memory a body may") && e.too_large,
            "{e}"
        );
        assert!(
            e.column < 4 * mib,
            "refused where it passed the bound, not at the end: {e}"
        );
        // Small objects are the dearest: a B-tree node each.
        let objects = format!("[{}{{}}]", r#"{"a":0},"#.repeat(40_000));
        assert!(footprint(objects.as_bytes()).unwrap() > 40_000 * MAP_NODE_BYTES);
        let objects = format!("[{}{{}}]", r#"{"a":0},"#.repeat(100_000));
        assert!(objects.len() < mib && parse_strict(objects.as_bytes()).is_err());
        // The same bytes as one string take about their length.
        let text = format!(r#"{{"data": "{}"}}"#, "A".repeat(16 * mib));
        let size = footprint(text.as_bytes()).unwrap();
        assert!(size >= 16 * mib && size < 16 * mib + 2048, "{size}");
        assert_eq!(
            parse_strict(text.as_bytes()).unwrap()["data"]
                .as_str()
                .unwrap()
                .len(),
            16 * mib
        );
        // A megabyte of numbers (a few hundred thousand) passes.
        let numbers = format!("[{}1]", "12345,".repeat(170_000));
        assert!(parse_strict(numbers.as_bytes()).is_ok());
        // What is not JSON is refused by the same pass, with where.
        assert!(footprint(b"[1, 2").is_err_and(|e| !e.too_large));
        assert_eq!(footprint(b"[]").unwrap(), VALUE_BYTES);
        assert_eq!(footprint(b"[1]").unwrap(), VALUE_BYTES * 5);
    }

    #[test]
    fn no_text_takes_more_than_most_per_byte_parsed() {
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let nested = format!("{}0{}", r#"{"":"#.repeat(127), "}".repeat(127));
        let shapes = [
            format!("[{}{{}}]", r#"{"":0},"#.repeat(1000)),
            format!("[{}0]", "[0],".repeat(1000)),
            format!("[{}[]]", "[[0]],".repeat(1000)),
            format!("[{}\"\"]", r#""a","#.repeat(1000)),
            format!(
                "{{{}\"\":0}}",
                (0..1000)
                    .map(|i| format!(r#""{i}":0,"#))
                    .collect::<String>()
            ),
            format!(r#"[{}{{"":{{}}}}]"#, r#"{"":{"":0}},"#.repeat(1000)),
            deep,
            nested,
            "{}".to_owned(),
            "[0]".to_owned(),
            r#"{"":0}"#.to_owned(),
        ];
        for text in shapes {
            let size = footprint(text.as_bytes()).unwrap();
            assert!(
                size <= MOST_PER_BYTE * text.len(),
                "{}…: {size} for {} bytes",
                &text[..20.min(text.len())],
                text.len()
            );
        }
    }

    #[test]
    fn good_json_parses_as_serde_json_would() {
        let text = br#"{"a": [1, -2, 18446744073709551615, -9223372036854775808, 1.5, "x", null, true], "b": {"c": {}}}"#;
        assert_eq!(
            parse_strict(text).unwrap(),
            serde_json::from_slice::<Value>(text).unwrap()
        );
    }

    #[test]
    fn what_would_change_silently_is_refused_with_where() {
        for (text, says) in [
            (r#"{"a": 1, "a": 2}"#, "appears twice"),
            (r#"{"a": {"b": 1, "b": 1}}"#, "appears twice"),
            (r#"{"n": 18446744073709551616}"#, "send it as a string"),
            (r#"{"n": -9223372036854775809}"#, "send it as a string"),
            (
                r#"{"n": 123456789012345678901234567890}"#,
                "send it as a string",
            ),
            (r#"{"n": 9007199254740993.0}"#, "send it as a string"),
            (r#"{"s": "a\u0000b"}"#, "NUL"),
            (r#"{"a\u0000": 1}"#, "NUL"),
            (r#"{"a": 1} x"#, "trailing"),
        ] {
            let e = parse_strict(text.as_bytes()).unwrap_err();
            assert!(e.message.contains(says), "{text}: {e}");
            assert!(e.line >= 1 && e.column >= 1, "{text}: {e}");
        }
    }

    /// A number the chain's hash reads as a double it is not exactly (so another number could
    /// stand in its place unseen) is found wherever it stands; numbers written from a double, in
    /// any of the forms PostgreSQL or serde_json write them, are not; nor is anything in a string.
    #[test]
    fn numbers_a_hash_cannot_tell_apart_are_found() {
        let beyond = |text: &[u8]| super::number_beyond_double(text).map(|b| b.token);
        for exact in [
            "5",
            "5.0",
            "-0.0",
            "0.1",
            "0.30000000000000004",
            "1.5e-7",
            "0.00000015",
            "9007199254740992",
            "123456789012345680000",
            "1e300",
            r#"{"a":[1,2.5,{"b":-3}],"s":"9007199254740993","t":"x\"9007199254740993"}"#,
        ] {
            assert_eq!(beyond(exact.as_bytes()), None, "{exact}");
        }
        for (text, found) in [
            ("5.0000000000000001", "5.0000000000000001"),
            ("9007199254740993", "9007199254740993"),
            ("0.10000000000000001", "0.10000000000000001"),
            (
                r#"{"a":"\\","n":[1,18446744073709551615]}"#,
                "18446744073709551615",
            ),
            ("1e400", "1e400"),
            // A large integer first does not hide a fraction after it.
            (
                r#"{"a":9007199254740993,"b":5.0000000000000001}"#,
                "5.0000000000000001",
            ),
            (
                r#"{"a":9007199254740993,"b":9007199254740995}"#,
                "9007199254740993",
            ),
        ] {
            assert_eq!(beyond(text.as_bytes()).as_deref(), Some(found), "{text}");
        }
        // An integer too long to show whole is still told an integer.
        let long = "9".repeat(70);
        let found = super::number_beyond_double(long.as_bytes()).unwrap();
        assert!(found.integer && found.token.len() < long.len(), "{found:?}");
        assert!(!super::number_beyond_double(b"1e400").unwrap().integer);
        let mut v = serde_json::json!({"a": 9007199254740993_u64, "b": [5, -9007199254740993_i64], "c": 1.5});
        super::integers_beyond_double_as_text(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": "9007199254740993", "b": [5, "-9007199254740993"], "c": 1.5})
        );
        assert_eq!(beyond(v.to_string().as_bytes()), None);
    }
}
