//! How deep a YAML or JSON text nests, measured before a parser sees it. A parser handed
//! 60,000 levels either recurses too deep or (libyaml's scanner) spends quadratic time on
//! them; a linear scan refuses such input first, with the line and column where it gets
//! too deep.
//!
//! The YAML scan is an upper bound of the depth a YAML parser would reach, never below it:
//! flow collections (`[`, `{`) count one level each outside quoted scalars, comments and
//! block scalars; block structure counts two levels per indentation column in use (a
//! mapping and a sequence may share one) plus one per compact indicator (`- `, `? `, `: `)
//! opening a line. Ordinary Kubernetes YAML stays far below any sensible limit.
//!
//! Every YAML or JSON text ichor-rules reads from outside (objects files, test files and
//! the files they name, `--apply`/`--status` files, AdmissionReviews, talosconfigs) is
//! handed to its parser by [`yaml`] or [`json`], which refuse it first if it nests deeper
//! than [`MAX_NESTING`]: one bounded loader, so no input reaches a parser unchecked.

use serde::de::DeserializeOwned;

/// The deepest nesting any YAML or JSON input may have. Kubernetes objects, reviews and
/// test files nest far less; a deeper input is refused before a parser sees it (libyaml's
/// scanner is quadratic in nesting depth: 60,000 levels took 13 s, a 500 KB test file 80 s).
pub const MAX_NESTING: usize = 128;

/// A text nested deeper than [`MAX_NESTING`], refused before it was parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "line {line}, column {column}: nested more than {MAX_NESTING} levels deep (refused before parsing)"
)]
pub struct TooDeep {
    pub line: usize,
    pub column: usize,
}

/// The one way a YAML text (or JSON, which is YAML) is parsed: the nesting check, then the
/// parser. The deserializer reads one document (`T::deserialize(yaml(text)?)`, as
/// `serde_yaml::from_str`) or iterates over the documents of a stream.
pub fn yaml(text: &str) -> Result<serde_yaml::Deserializer<'_>, TooDeep> {
    match yaml_too_deep(text, MAX_NESTING) {
        Some((line, column)) => Err(TooDeep { line, column }),
        None => Ok(serde_yaml::Deserializer::from_str(text)),
    }
}

/// A JSON text that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error(transparent)]
    TooDeep(#[from] TooDeep),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// The one way a JSON text is parsed: the nesting check, then the parser.
pub fn json<T: DeserializeOwned>(text: &[u8]) -> Result<T, JsonError> {
    if let Some((line, column)) = json_too_deep(text, MAX_NESTING) {
        return Err(TooDeep { line, column }.into());
    }
    Ok(serde_json::from_slice(text)?)
}

/// Like [`json`], for a type that borrows from the text (raw parts kept as text).
pub fn json_borrowed<'a, T: serde::Deserialize<'a>>(text: &'a [u8]) -> Result<T, JsonError> {
    if let Some((line, column)) = json_too_deep(text, MAX_NESTING) {
        return Err(TooDeep { line, column }.into());
    }
    Ok(serde_json::from_slice(text)?)
}

/// Where a text first nests deeper than `max`: (line, column), both from 1.
pub type Where = (usize, usize);

/// The first place where the JSON `text` nests deeper than `max` levels of arrays and
/// objects, if any. Brackets inside strings do not count.
pub fn json_too_deep(text: &[u8], max: usize) -> Option<Where> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in text {
        if b == b'\n' {
            line += 1;
            column = 0;
        } else {
            column += 1;
        }
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Some((line, column));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// A block scalar (`|` or `>`) being skipped: its lines are text, not structure.
#[derive(Clone, Copy)]
struct BlockScalar {
    /// The indentation of the line that opened it: content is indented more.
    parent: usize,
    /// The indentation of its content, once its first non-blank line fixed it.
    content: Option<usize>,
}

/// The first place where the YAML `text` may nest deeper than `max` levels, if any.
pub fn yaml_too_deep(text: &str, max: usize) -> Option<Where> {
    let mut flow = 0usize;
    // Indentation columns of the open block collections, strictly increasing.
    let mut stack: Vec<usize> = Vec::new();
    let mut quote: Option<char> = None;
    let mut block: Option<BlockScalar> = None;
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let chars: Vec<char> = line.chars().collect();
        let indent = chars.iter().take_while(|c| **c == ' ').count();
        let blank = chars[indent..].iter().all(|c| c.is_whitespace());
        if let Some(b) = block.as_mut() {
            if blank {
                continue;
            }
            match b.content {
                None if indent > b.parent => {
                    b.content = Some(indent);
                    continue;
                }
                Some(c) if indent >= c => continue,
                _ => block = None,
            }
        }
        let mut pos = 0usize;
        let mut block_depth = 0usize;
        if quote.is_none() && flow == 0 {
            if blank || chars.get(indent) == Some(&'#') {
                continue;
            }
            pos = indent;
            let marker = |at: usize, c: char| {
                chars
                    .get(at..at + 3)
                    .is_some_and(|m| m.iter().all(|x| *x == c))
                    && chars.get(at + 3).is_none_or(|c| c.is_whitespace())
            };
            if indent == 0 && (marker(0, '-') || marker(0, '.')) {
                stack.clear();
                pos = 3;
                while chars.get(pos).is_some_and(|c| c.is_whitespace()) {
                    pos += 1;
                }
            }
            while stack.last().is_some_and(|top| *top >= pos) {
                stack.pop();
            }
            stack.push(pos);
            let mut compact = 0usize;
            while chars.get(pos).is_some_and(|c| matches!(c, '-' | '?' | ':'))
                && chars.get(pos + 1).is_none_or(|c| c.is_whitespace())
            {
                compact += 1;
                if 2 * stack.len() + compact > max {
                    return Some((i + 1, pos + 1));
                }
                pos += 1;
                while chars.get(pos).is_some_and(|c| c.is_whitespace()) {
                    pos += 1;
                }
            }
            block_depth = 2 * stack.len() + compact;
            if block_depth > max {
                return Some((i + 1, pos + 1));
            }
        }
        while pos < chars.len() {
            let c = chars[pos];
            let prev = pos.checked_sub(1).map(|p| chars[p]);
            let after_space = prev.is_none_or(|p| p.is_whitespace());
            pos += 1;
            match quote {
                Some('"') => {
                    if c == '\\' {
                        pos += 1;
                    } else if c == '"' {
                        quote = None;
                    }
                    continue;
                }
                Some(_) => {
                    if c == '\'' {
                        if chars.get(pos) == Some(&'\'') {
                            pos += 1;
                        } else {
                            quote = None;
                        }
                    }
                    continue;
                }
                None => {}
            }
            let token_start = after_space || (flow > 0 && prev.is_some_and(|p| "[{,:".contains(p)));
            match c {
                '#' if after_space => break,
                '"' | '\'' if token_start => quote = Some(c),
                '[' | '{' if flow > 0 || after_space => {
                    flow += 1;
                    if block_depth + flow > max {
                        return Some((i + 1, pos));
                    }
                }
                ']' | '}' if flow > 0 => flow -= 1,
                '|' | '>'
                    if flow == 0
                        && after_space
                        && value_position(&chars[..pos - 1])
                        && block_header(&chars[pos..]) =>
                {
                    block = Some(BlockScalar {
                        parent: indent,
                        content: None,
                    });
                    break;
                }
                _ => {}
            }
        }
    }
    None
}

/// Whether what precedes a `|` or `>` on its line puts it where a value starts: after
/// `:`, `-` or `?` (or `---`), or first on the line.
fn value_position(before: &[char]) -> bool {
    before
        .iter()
        .rev()
        .find(|c| !c.is_whitespace())
        .is_none_or(|c| matches!(c, ':' | '-' | '?'))
}

/// Whether the rest of a line after `|` or `>` is a block scalar header: indentation and
/// chomping indicators, then nothing or a comment.
fn block_header(rest: &[char]) -> bool {
    for (i, c) in rest.iter().enumerate() {
        match c {
            '0'..='9' | '+' | '-' => {}
            ' ' | '\t' => {
                return rest[i..]
                    .iter()
                    .find(|c| !c.is_whitespace())
                    .is_none_or(|c| *c == '#');
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_depth_ignores_strings() {
        assert_eq!(json_too_deep(br#"{"a": "[[[[[[[[[["}"#, 2), None);
        assert_eq!(json_too_deep(b"[[[]]]", 3), None);
        assert_eq!(json_too_deep(b"[\n [[]]]", 2), Some((2, 3)));
    }

    #[test]
    fn yaml_flow_depth_outside_quotes_and_comments() {
        assert_eq!(yaml_too_deep(&"[".repeat(60_000), 128), Some((1, 127)));
        assert_eq!(
            yaml_too_deep("a: \"[[[[[[\"\nb: '{{{{'\n# [[[[[[\n", 4),
            None
        );
        assert_eq!(yaml_too_deep("a: x[[[[[[[y\n", 4), None);
        assert_eq!(yaml_too_deep("a: [[[[[[1]]]]]]\n", 4), Some((1, 6)));
        // JSON is YAML too.
        assert_eq!(yaml_too_deep(r#"{"a":[{"b":[1]}]}"#, 6), None);
        assert_eq!(yaml_too_deep(r#"{"a":[{"b":[1]}]}"#, 5), Some((1, 12)));
    }

    #[test]
    fn yaml_block_depth_counts_indentation_and_compact_entries() {
        let k8s = "apiVersion: v1\nkind: List\nitems:\n- metadata:\n    name: x\n    labels:\n      a: b\n  spec:\n    c: [1, 2]\n";
        assert_eq!(yaml_too_deep(k8s, 16), None);
        let compact = format!("{}x\n", "- ".repeat(60_000));
        assert!(yaml_too_deep(&compact, 128).is_some());
        let mut stair = String::new();
        for i in 0..200 {
            stair.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
        }
        assert!(yaml_too_deep(&stair, 128).is_some());
    }

    #[test]
    fn yaml_block_scalars_are_text() {
        let text = "a: |\n  [[[[[[[[\n  {{{{{{{{\nb: >-\n    [[[[[[[[\nc: 1\n";
        assert_eq!(yaml_too_deep(text, 4), None);
        // The scalar ends at the first line indented less than its content.
        let text = "a: |\n    x\n  [[[[[[[[\n";
        assert!(yaml_too_deep(text, 4).is_some());
    }
}
