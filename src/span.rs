//! Source locations: the one type both the front end (`syntax`) and the diagnostics use, so
//! neither imports the other for it (the diagnostics never depend on the parser).

/// A byte range in one source file. Small and `Copy`; the text is attached when printing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: u32::try_from(start).unwrap_or(u32::MAX),
            end: u32::try_from(end).unwrap_or(u32::MAX),
        }
    }

    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    pub fn len(self) -> usize {
        (self.end.saturating_sub(self.start)) as usize
    }

    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}
