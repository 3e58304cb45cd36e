//! Text that people and agents hand jobtrail (a target, who approved, a reason): bounded, and free
//! of control characters. It is kept for ever in the evidence chain, shown in terminals and log
//! lines, and PostgreSQL refuses NUL in it; so it is checked here, where every door (HTTP, MCP, the
//! CLI, the admin binary) passes, before anything is written.

/// What a field may hold besides printable characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One line: no control character at all (a name, a reference).
    Line,
    /// Prose: newlines and tabs too (a reason, evidence).
    Prose,
}

/// A bounded text field: its name (as the caller spelled it), most characters, and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub max_chars: usize,
    pub shape: Shape,
}

pub const TARGET: Field = Field::line("target", 1024);
pub const CALLER: Field = Field::line("caller", 256);
pub const APPROVED_BY: Field = Field::line("approved_by", 256);
pub const APPROVAL_REF: Field = Field::line("approval_ref", 1024);
pub const ACTOR: Field = Field::line("actor", 256);
pub const REASON: Field = Field::prose("reason", 4096);
/// A token's caller: a caller, as the database keeps a token's (at most 200 characters).
pub const TOKEN_CALLER: Field = Field::line("--caller", 200);
/// A token's note.
pub const TOKEN_NOTE: Field = Field::prose("--note", 500);
pub const EVIDENCE: Field = Field::prose("evidence", 4096);
/// A job id a person read at the provider (an adopted job): kept in the record for good, and
/// called at, so visible characters only, as long as a provider's may be.
pub const JOB_ID: Field = Field::line("job_id", crate::ids::MAX_LOCATOR_BYTES);

/// Why a text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("{field} is required")]
    Missing { field: &'static str },
    #[error("{field} is {chars} characters long; at most {max} are accepted")]
    TooLong {
        field: &'static str,
        chars: usize,
        max: usize,
    },
    #[error("{field} holds the control character U+{code:04X} at character {at}; {allowed}")]
    Control {
        field: &'static str,
        code: u32,
        at: usize,
        allowed: &'static str,
    },
    #[error(
        "{field} holds U+{code:04X} at character {at}, which prints as nothing or reorders the text around it; one-line fields take visible characters only (two names that read alike must be alike)"
    )]
    Unseen {
        field: &'static str,
        code: u32,
        at: usize,
    },
}

/// At most `max` bytes of `text`, cut at a character boundary and marked with `…` (a provider's
/// error text is kept, not its every megabyte).
pub fn truncate(mut text: String, max: usize) -> String {
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

/// `s` with every character a terminal would act on instead of printing (see
/// [`acts_instead_of_printing`]) shown escaped (`\u{1b}`, `\n`): for text from a row or a caller
/// put into a message a person reads (an error naming a lease's owner, say), where an escape could
/// erase the line and a line break forge another.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(acts_instead_of_printing) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if acts_instead_of_printing(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Would a terminal act on this character instead of printing it, or print nothing a person could
/// see? Controls; direction marks, embeddings, overrides and isolates (which reorder what is read);
/// the line and paragraph separators (which break a line as `\n` does); and the characters that
/// print as nothing — zero-width ones, the soft hyphen, the Hangul fillers, tags — which make two
/// ids that read alike differ (`job_1` and `job\u{200b}_1`).
pub fn acts_instead_of_printing(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{061c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{3164}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// Joiners and direction marks that words of some scripts need (Persian and Indic spellings use
/// U+200C/U+200D, emoji sequences U+200D, right-to-left text the marks): a one-line field takes
/// them next to a character outside ASCII, never beside ASCII alone (`alice\u{200d}` reads as
/// `alice`).
fn joins_words(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200c}'..='\u{200f}')
}

/// The first character of a one-line value that prints as nothing or reorders the text, with its
/// position: `None` when every character reads as what it is.
fn unseen_in_line(v: &str) -> Option<(usize, char)> {
    let chars: Vec<char> = v.chars().collect();
    let beside_non_ascii = |i: usize| {
        let wide = |c: Option<&char>| c.is_some_and(|c| !c.is_ascii() && !joins_words(*c));
        wide(i.checked_sub(1).and_then(|j| chars.get(j))) || wide(chars.get(i + 1))
    };
    chars.iter().enumerate().find_map(|(i, &c)| {
        let allowed = joins_words(c) && beside_non_ascii(i);
        (acts_instead_of_printing(c) && !allowed).then_some((i, c))
    })
}

impl Field {
    const fn line(name: &'static str, max_chars: usize) -> Self {
        Self {
            name,
            max_chars,
            shape: Shape::Line,
        }
    }
    const fn prose(name: &'static str, max_chars: usize) -> Self {
        Self {
            name,
            max_chars,
            shape: Shape::Prose,
        }
    }

    /// `value` trimmed, if it is not empty, not too long and has no control character its shape
    /// refuses.
    pub fn check(&self, value: &str) -> Result<String, TextError> {
        let v = value.trim();
        if v.is_empty() {
            return Err(TextError::Missing { field: self.name });
        }
        // A byte count at most the limit is at most that many characters: no count needed.
        if v.len() > self.max_chars {
            let chars = v.chars().count();
            if chars > self.max_chars {
                return Err(TextError::TooLong {
                    field: self.name,
                    chars,
                    max: self.max_chars,
                });
            }
        }
        let allowed = |c: char| self.shape == Shape::Prose && (c == '\n' || c == '\t');
        if let Some((at, c)) = v
            .chars()
            .enumerate()
            .find(|&(_, c)| c.is_control() && !allowed(c))
        {
            return Err(TextError::Control {
                field: self.name,
                code: u32::from(c),
                at,
                allowed: match self.shape {
                    Shape::Line => "it must be one line of printable text",
                    Shape::Prose => "only newlines and tabs are accepted",
                },
            });
        }
        // A name or reference kept for ever must read as what it is: `alice\u{200b}` is not
        // `alice`, yet shows as it. (Prose keeps them: scripts join and order words with some.)
        if self.shape == Shape::Line
            && let Some((at, c)) = unseen_in_line(v)
        {
            return Err(TextError::Unseen {
                field: self.name,
                code: u32::from(c),
                at,
            });
        }
        Ok(v.to_owned())
    }

    /// As [`Field::check`], with an absent or blank value as `None`.
    pub fn check_optional(&self, value: Option<&str>) -> Result<Option<String>, TextError> {
        match value.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => self.check(v).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_trimmed_bounded_and_printable() {
        assert_eq!(TARGET.check("  reports ").unwrap(), "reports");
        assert_eq!(
            TARGET.check("   "),
            Err(TextError::Missing { field: "target" })
        );
        assert!(matches!(
            ACTOR.check(&"é".repeat(257)),
            Err(TextError::TooLong {
                chars: 257,
                max: 256,
                ..
            })
        ));
        assert!(
            ACTOR.check(&"é".repeat(256)).is_ok(),
            "characters, not bytes"
        );
        assert!(matches!(
            TARGET.check("a\u{0}b"),
            Err(TextError::Control { code: 0, at: 1, .. })
        ));
        assert!(TARGET.check("two\nlines").is_err());
        assert!(TARGET.check("esc\u{1b}[2J").is_err());
        assert!(REASON.check("two\nlines\tand a tab").is_ok());
        for unseen in [
            "alice\u{200b}",
            "al\u{202e}ecila",
            "a\u{2028}b",
            "\u{feff}alice",
            "a\u{e0041}",
        ] {
            assert!(
                matches!(APPROVED_BY.check(unseen), Err(TextError::Unseen { .. })),
                "{unseen:?}"
            );
        }
        assert!(APPROVED_BY.check("Zoë Ødegård 山田").is_ok());
        // Joiners and marks a script or an emoji needs, beside the characters they join.
        for word in ["گزارش\u{200c}ها", "👩\u{200d}💻", "שלום\u{200f}"] {
            assert!(TARGET.check(word).is_ok(), "{word:?}");
        }
        for beside_ascii in ["alice\u{200d}", "al\u{200c}ice", "\u{200e}bob"] {
            assert!(
                matches!(
                    APPROVED_BY.check(beside_ascii),
                    Err(TextError::Unseen { .. })
                ),
                "{beside_ascii:?}"
            );
        }
        assert!(
            REASON
                .check("\u{05e9}\u{05dc}\u{05d5}\u{05dd}\u{200f} ok")
                .is_ok()
        );
        assert!(REASON.check("bell\u{7}").is_err());
        assert_eq!(APPROVAL_REF.check_optional(Some("  ")), Ok(None));
        assert_eq!(APPROVAL_REF.check_optional(None), Ok(None));
        assert!(APPROVAL_REF.check_optional(Some("x\u{0}")).is_err());
        let msg = TARGET.check("a\u{0}b").unwrap_err().to_string();
        assert_eq!(
            msg,
            "target holds the control character U+0000 at character 1; it must be one line of printable text"
        );
    }
}
