//! How deep a rule file nests, measured before pest parses it.
//!
//! pest's generated parser recurses once per parenthesis and per `{placeholder}`, and the
//! Pratt parser once per prefix operator, so input that nests without bound would exhaust
//! the stack before any AST exists. This scan reads the file the way the grammar does
//! (comments, strings with their escapes and placeholders, words and operators) in one
//! pass and no recursion, and finds the first place where the nesting passes
//! [`MAX_NESTING`]: open `(` and `{` placeholders, plus the `not`s and unary `-`s whose
//! operand is still open (a run of them ends at `and`/`or`, or with the enclosing group).
//! A `(` inside a string or a comment is text and does not count.

/// The deepest nesting a file may have: parentheses, placeholders and prefix operators.
pub const MAX_NESTING: usize = 64;

/// What nests too deep, and where (a byte offset of the token that goes one level too far).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooDeep {
    pub at: usize,
    pub len: usize,
}

/// One open group: a parenthesis or a placeholder, and the prefix operators counted before
/// it opened (restored when it closes).
#[derive(Clone, Copy)]
enum Frame {
    Paren { prefixes: usize },
    Placeholder { prefixes: usize },
}

/// The first place where `text` nests deeper than [`MAX_NESTING`], if any.
pub fn too_deep(text: &str) -> Option<TooDeep> {
    let bytes = text.as_bytes();
    let mut frames: Vec<Frame> = Vec::new();
    // Prefix operators open at the current level and all levels below it.
    let mut prefixes = 0usize;
    let mut level_prefixes = 0usize;
    // Whether the last token was an operand (so a `-` after it is binary).
    let mut after_operand = false;
    let mut i = 0;
    let deep = |frames: &Vec<Frame>, prefixes: usize| frames.len() + prefixes > MAX_NESTING;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' => {
                // A string: its placeholders open code again.
                match scan_string(bytes, i + 1) {
                    StringEnd::Closed(next) => {
                        i = next;
                        after_operand = true;
                        continue;
                    }
                    StringEnd::Placeholder(next) => {
                        frames.push(Frame::Placeholder {
                            prefixes: level_prefixes,
                        });
                        level_prefixes = 0;
                        if deep(&frames, prefixes) {
                            return Some(TooDeep {
                                at: next - 1,
                                len: 1,
                            });
                        }
                        i = next;
                        after_operand = false;
                        continue;
                    }
                }
            }
            b'(' => {
                frames.push(Frame::Paren {
                    prefixes: level_prefixes,
                });
                level_prefixes = 0;
                if deep(&frames, prefixes) {
                    return Some(TooDeep { at: i, len: 1 });
                }
                after_operand = false;
            }
            b')' => {
                if let Some(Frame::Paren { prefixes: saved }) = frames.last().copied() {
                    frames.pop();
                    prefixes -= level_prefixes;
                    level_prefixes = saved;
                }
                after_operand = true;
            }
            b'}' => {
                if let Some(Frame::Placeholder { prefixes: saved }) = frames.last().copied() {
                    frames.pop();
                    prefixes -= level_prefixes;
                    level_prefixes = saved;
                    // Back inside the string the placeholder was in.
                    match scan_string(bytes, i + 1) {
                        StringEnd::Closed(next) => {
                            i = next;
                            after_operand = true;
                            continue;
                        }
                        StringEnd::Placeholder(next) => {
                            frames.push(Frame::Placeholder {
                                prefixes: level_prefixes,
                            });
                            level_prefixes = 0;
                            if deep(&frames, prefixes) {
                                return Some(TooDeep {
                                    at: next - 1,
                                    len: 1,
                                });
                            }
                            i = next;
                            after_operand = false;
                            continue;
                        }
                    }
                }
                after_operand = false;
            }
            b'-' if !after_operand => {
                prefixes += 1;
                level_prefixes += 1;
                if deep(&frames, prefixes) {
                    return Some(TooDeep { at: i, len: 1 });
                }
            }
            b if b.is_ascii_alphanumeric() || b == b'_' => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.')
                {
                    i += 1;
                }
                match &text[start..i] {
                    "not" => {
                        prefixes += 1;
                        level_prefixes += 1;
                        if deep(&frames, prefixes) {
                            return Some(TooDeep { at: start, len: 3 });
                        }
                        after_operand = false;
                    }
                    "and" | "or" => {
                        // The operands before it are complete.
                        prefixes -= level_prefixes;
                        level_prefixes = 0;
                        after_operand = false;
                    }
                    word => after_operand = !is_keyword(word),
                }
                continue;
            }
            b if b.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            _ => after_operand = false,
        }
        i += 1;
    }
    None
}

enum StringEnd {
    /// The string ended; scanning goes on at this offset.
    Closed(usize),
    /// A `{` opened a placeholder; its code starts at this offset.
    Placeholder(usize),
}

/// Scans string text from `i` (just after `"` or a placeholder's `}`).
fn scan_string(bytes: &[u8], mut i: usize) -> StringEnd {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'{' if bytes.get(i + 1) == Some(&b'{') => i += 2,
            b'}' if bytes.get(i + 1) == Some(&b'}') => i += 2,
            b'{' => return StringEnd::Placeholder(i + 1),
            // A newline ends an unterminated string (the parser reports it).
            b'"' | b'\n' => return StringEnd::Closed(i + 1),
            _ => i += 1,
        }
    }
    StringEnd::Closed(bytes.len())
}

fn is_keyword(word: &str) -> bool {
    matches!(
        word,
        "let"
            | "rule"
            | "allow"
            | "plan"
            | "invariant"
            | "ensure"
            | "do"
            | "refuse"
            | "hold"
            | "warn"
            | "at"
            | "when"
            | "unless"
            | "reason"
            | "say"
            | "and"
            | "or"
            | "not"
            | "sequential"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parentheses_in_comments_and_strings_do_not_count() {
        let comment = format!("# {}\nlet x = 1", "(".repeat(200));
        assert_eq!(too_deep(&comment), None);
        let string = format!("let x = machine == \"{}\"", "(".repeat(200));
        assert_eq!(too_deep(&string), None);
        let escaped = format!("let x = machine == \"\\\"{}\"", "(".repeat(200));
        assert_eq!(too_deep(&escaped), None);
    }

    #[test]
    fn nesting_hidden_behind_quotes_is_counted() {
        let mut s = "true".to_string();
        for _ in 0..100 {
            s = format!("( \"x)\" == machine or {s} )");
        }
        assert!(too_deep(&format!("let x = {s}")).is_some());
    }

    #[test]
    fn placeholders_and_prefix_operators_nest() {
        let mut s = "1".to_string();
        for _ in 0..100 {
            s = format!("\"a{{{s}}}b\" == machine");
        }
        assert!(too_deep(&format!("rule r refuse remove worker say \"{{{s}}}\"")).is_some());
        assert!(too_deep(&format!("let x = {}true", "not ".repeat(65))).is_some());
        assert!(too_deep(&format!("let x = {}1", "- ".repeat(65))).is_some());
        assert!(too_deep(&format!("let x = {}1", "-(".repeat(40))).is_some());
        // Runs of `not` end at `and`/`or`, and binary minus is not a prefix.
        let flat = format!("let x = {}true", "not a and ".repeat(500));
        assert_eq!(too_deep(&flat), None);
        let minus = format!("let x = 1{}", " - 1".repeat(500));
        assert_eq!(too_deep(&minus), None);
        let ok = format!("let x = {}1{}", "(".repeat(64), ")".repeat(64));
        assert_eq!(too_deep(&ok), None);
        let no = format!("let x = {}1{}", "(".repeat(65), ")".repeat(65));
        assert_eq!(too_deep(&no).map(|d| d.at), Some(8 + 64));
    }
}
