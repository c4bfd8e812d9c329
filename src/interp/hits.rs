//! The rows an event matched: a few inline, more on the heap (the hot path allocates only
//! when something matches more than [`INLINE_HITS`] times).

use super::EvalError;
use crate::vocab::Verdict;

/// One matching row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub rule: u32,
    pub verdict: Verdict,
    /// Set when the row could not be evaluated; refuse and hold rows then match (fail closed).
    pub error: Option<EvalError>,
}

/// The matching rows of one event, in source order: a slice of [`Hit`]s. The first few are
/// kept inline, so deciding allocates nothing unless many rows match.
#[derive(Clone, Debug)]
pub struct Hits(HitsRepr);

#[derive(Clone, Debug)]
enum HitsRepr {
    Inline { len: u8, hits: [Hit; INLINE_HITS] },
    Heap(Vec<Hit>),
}

const INLINE_HITS: usize = 6;

const NO_HIT: Hit = Hit {
    rule: 0,
    verdict: Verdict::Warn,
    error: None,
};

impl Hits {
    #[inline]
    pub fn new() -> Self {
        Hits(HitsRepr::Inline {
            len: 0,
            hits: [NO_HIT; INLINE_HITS],
        })
    }

    #[inline]
    pub fn push(&mut self, hit: Hit) {
        match &mut self.0 {
            HitsRepr::Inline { len, hits } => match hits.get_mut(usize::from(*len)) {
                Some(slot) => {
                    *slot = hit;
                    *len += 1;
                }
                None => {
                    let mut v = Vec::with_capacity(INLINE_HITS * 2);
                    v.extend_from_slice(hits);
                    v.push(hit);
                    self.0 = HitsRepr::Heap(v);
                }
            },
            HitsRepr::Heap(v) => v.push(hit),
        }
    }

    #[inline]
    pub fn as_slice(&self) -> &[Hit] {
        match &self.0 {
            HitsRepr::Inline { len, hits } => hits.get(..usize::from(*len)).unwrap_or(&[]),
            HitsRepr::Heap(v) => v,
        }
    }

    pub fn to_vec(&self) -> Vec<Hit> {
        self.as_slice().to_vec()
    }
}

impl Default for Hits {
    fn default() -> Self {
        Hits::new()
    }
}

impl std::ops::Deref for Hits {
    type Target = [Hit];
    #[inline]
    fn deref(&self) -> &[Hit] {
        self.as_slice()
    }
}

impl PartialEq for Hits {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Hits {}

impl<'h> IntoIterator for &'h Hits {
    type Item = &'h Hit;
    type IntoIter = std::slice::Iter<'h, Hit>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl From<Hits> for Vec<Hit> {
    fn from(h: Hits) -> Vec<Hit> {
        match h.0 {
            HitsRepr::Heap(v) => v,
            inline @ HitsRepr::Inline { .. } => Hits(inline).to_vec(),
        }
    }
}
