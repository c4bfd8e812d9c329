//! The etcd revision an etcd snapshot holds, read from its bbolt database as it streams
//! past (issue 36), never holding the snapshot.
//!
//! The facts of the format (go.etcd.io/bbolt, `internal/common/{page,meta}.go`): the file is
//! pages of the meta page's size, page `n` at `n * pageSize`. Every page begins with a
//! 16-byte header (id u64, flags u16: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist;
//! count u16; overflow u32, the pages after it that it spans), all little-endian. A meta page
//! (0 and 1) holds magic 0xED0CDAED, version 2, the page size, flags, the root bucket (root
//! page id, sequence), the freelist's page, the high-water page, the transaction id and an
//! FNV-1a 64 checksum of the 56 bytes before it; bbolt uses the valid one with the higher
//! transaction id. A branch page holds `count` elements (pos u32, ksize u32, child page u64),
//! a leaf `count` elements (flags u32, pos u32, ksize u32, vsize u32), each key at its
//! element's address plus `pos` and a leaf's value just after its key. A leaf element with
//! flag 0x01 is a bucket: its value is the bucket's root page and sequence, and a root of 0
//! means the bucket is inline, its one leaf page following in the value.
//!
//! What etcd makes of it (`mvcc/kvstore.go`, `restore`): the current revision is the main
//! revision of the last key of the bucket `key` (keys are revisions: 8 bytes big-endian main
//! revision, `_`, 8 bytes sub revision, and a trailing `t` on a tombstone), 1 when it is
//! empty, and never below the compaction revisions kept in the bucket `meta`
//! (`finishedCompactRev`, and `scheduledCompactRev` as etcd 3.5.14 and later count it: it
//! never exceeds the revision it was scheduled at).
//!
//! Pages arrive in file order, and a page can come before the page that points to it; a
//! free page keeps whatever it last held (a stale header whose overflow covers live pages
//! now, or the middle of an old value), so no header is trusted to say where the next page
//! is. So every page-size slice is read as a page that may be live, and each branch and
//! leaf page is summarised as it passes (a branch: its last child and the
//! child a search for each name this reader looks for goes to; a leaf: its last key as a
//! revision, and the names it holds), in tables bounded whatever the input, and the trees are
//! walked from the meta page at the end. A page the walk needs that was not summarised
//! (malformed, too large, or past a table's bound) means no revision, never a guess: the
//! answer is exact or absent.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const HEADER: usize = 16;
const ELEMENT: usize = 16;
/// The meta fields up to and including the checksum.
const META: usize = 64;
const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;
const MIN_PAGE: u64 = 512;
const MAX_PAGE: u64 = 1 << 20;
/// Bounds of the side tables, whatever the input (about 1 MiB, 2.6 MiB and a few MiB).
const MAX_LEAVES: usize = 1 << 16;
const MAX_BRANCHES: usize = 1 << 16;
const MAX_NAMED: usize = 1 << 14;
/// Deeper than any bbolt tree of a file this size.
const MAX_DEPTH: usize = 64;

/// The names looked for: two buckets of the root bucket, two keys of the `meta` bucket.
const NAMES: [&[u8]; 4] = [
    b"key",
    b"meta",
    b"finishedCompactRev",
    b"scheduledCompactRev",
];
const KEY: usize = 0;
const META_BUCKET: usize = 1;
const FINISHED: usize = 2;
const SCHEDULED: usize = 3;

#[derive(Clone, Copy, Debug)]
struct Meta {
    page_size: u64,
    root: u64,
    txid: u64,
}

/// A leaf's last key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Last {
    /// No keys.
    Empty,
    /// A revision, its main part.
    Rev(i64),
}

#[derive(Clone, Debug, PartialEq)]
enum Lookup<T> {
    Absent,
    Found(T),
    /// The page could not say (a key or value past what was held, or malformed).
    Unknown,
}

#[derive(Clone, Debug, PartialEq)]
enum Bucket {
    /// Its root page.
    Page(u64),
    /// Inline: what its one leaf says.
    Inline {
        last: Option<Last>,
        finished: Lookup<i64>,
        scheduled: Lookup<i64>,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct Leaf {
    /// None: its last key is no revision, or could not be read.
    last: Option<Last>,
    key: Lookup<Bucket>,
    meta: Lookup<Bucket>,
    finished: Lookup<i64>,
    scheduled: Lookup<i64>,
}

impl Leaf {
    fn plain(&self) -> bool {
        matches!(
            (&self.key, &self.meta, &self.finished, &self.scheduled),
            (
                Lookup::Absent,
                Lookup::Absent,
                Lookup::Absent,
                Lookup::Absent
            )
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Branch {
    last: u64,
    /// The child a search for each of [`NAMES`] goes to (None: not readable).
    toward: [Option<u64>; 4],
}

/// Reads the revision of an etcd database fed to it in order, chunk by chunk
/// ([`RevisionScan::update`]), and says it at the end ([`RevisionScan::finish`]).
///
/// Every page-size boundary is read as a page that may be live: a free page keeps whatever
/// it held (a stale header, or the middle of an old value), so a page's overflow is never
/// trusted to skip what follows it. A page nothing live points to is summarised and never
/// used. A page spanning several (a leaf with a large value) is read from its first page;
/// its last key, when further on, is picked up as the stream passes it.
#[derive(Default)]
pub struct RevisionScan {
    /// 0 until page 0's meta is read.
    page_size: u64,
    metas: [Option<Meta>; 2],
    /// Bytes fed so far.
    at: u64,
    /// The current page-size slice of the file.
    buf: Vec<u8>,
    /// Leaves waiting for their last key, further on in the stream.
    pending: Vec<Pending>,
    /// Why no revision can be read, once known (reading stops).
    broken: Option<String>,
    branches: Vec<(u64, Branch)>,
    lasts: BinaryHeap<Reverse<(i64, u64)>>,
    named: Vec<(u64, Leaf)>,
    /// Leaf pages summarised whole (a leaf here and not in `named` holds none of the names).
    read: Vec<u64>,
    /// A table overflowed (said when the walk misses a page).
    overflowed: bool,
}

/// A leaf read from its first page, its last key at `[from, from + len)` of the file.
struct Pending {
    id: u64,
    from: u64,
    len: u64,
    got: Vec<u8>,
    leaf: Leaf,
}

/// Leaves waiting for their last key at once, at most.
const MAX_PENDING: usize = 1024;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A key of etcd's `key` bucket (or a compaction revision's value): its main revision.
fn revision(key: &[u8]) -> Option<i64> {
    let tombstone = match key.len() {
        17 => false,
        18 => true,
        _ => return None,
    };
    if key[8] != b'_' || (tombstone && key[17] != b't') {
        return None;
    }
    let main = u64::from_be_bytes(key[..8].try_into().ok()?);
    i64::try_from(main).ok()
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The meta of a meta page's first bytes, when valid.
fn meta(page: &[u8]) -> Option<Meta> {
    if u16_at(page, 8)? != META_PAGE {
        return None;
    }
    let m = page.get(HEADER..HEADER + META)?;
    if u32_at(m, 0)? != MAGIC || u32_at(m, 4)? != VERSION || u64_at(m, 56)? != fnv1a64(&m[..56]) {
        return None;
    }
    let page_size = u64::from(u32_at(m, 8)?);
    if !(MIN_PAGE..=MAX_PAGE).contains(&page_size) {
        return None;
    }
    Some(Meta {
        page_size,
        root: u64_at(m, 16)?,
        txid: u64_at(m, 48)?,
    })
}

/// The bytes `[from, from + len)` of `page` when held.
fn slice(page: &[u8], from: u64, len: u64) -> Option<&[u8]> {
    let from = usize::try_from(from).ok()?;
    let to = from.checked_add(usize::try_from(len).ok()?)?;
    page.get(from..to)
}

/// Element `i`'s key: where it starts in the page, and its length.
fn key_at(page: &[u8], i: usize, pos_at: usize, ksize_at: usize) -> Option<(u64, u64)> {
    let e = HEADER + i * ELEMENT;
    let pos = u64::from(u32_at(page, e + pos_at)?);
    let ksize = u64::from(u32_at(page, e + ksize_at)?);
    Some((e as u64 + pos, ksize))
}

/// A branch page (held in `page`): its last child and where each name's search goes.
fn branch(page: &[u8]) -> Option<Branch> {
    let count = usize::from(u16_at(page, 10)?);
    if count == 0 || page.len() < HEADER + count * ELEMENT {
        return None;
    }
    let child = |i: usize| u64_at(page, HEADER + i * ELEMENT + 8);
    let last = child(count - 1)?;
    let mut toward = [None; 4];
    for (t, name) in NAMES.iter().enumerate() {
        // bbolt: the last element whose key is at most the name, else the first.
        let mut at = Some(0);
        for i in 0..count {
            let key = key_at(page, i, 0, 4).and_then(|(from, len)| slice(page, from, len));
            match key {
                Some(k) if k <= *name => at = Some(i),
                Some(_) => break,
                None => {
                    at = None;
                    break;
                }
            }
        }
        toward[t] = match at {
            Some(i) => Some(child(i)?),
            None => None,
        };
    }
    Some(Branch { last, toward })
}

/// A leaf page held in `page` (the first of its pages), inline or not.
fn leaf(page: &[u8], inline_ok: bool) -> Option<Leaf> {
    let count = usize::from(u16_at(page, 10)?);
    if page.len() < HEADER + count * ELEMENT {
        return None;
    }
    let key_of = |i: usize| {
        let (from, len) = key_at(page, i, 4, 8)?;
        slice(page, from, len)
    };
    let last = if count == 0 {
        Some(Last::Empty)
    } else {
        key_of(count - 1).and_then(revision).map(Last::Rev)
    };
    let mut found = [
        Lookup::Absent,
        Lookup::Absent,
        Lookup::Absent,
        Lookup::Absent,
    ];
    let mut buckets: [Lookup<Bucket>; 2] = [Lookup::Absent, Lookup::Absent];
    for i in 0..count {
        let e = HEADER + i * ELEMENT;
        let (Some(flags), Some((from, ksize)), Some(vsize)) =
            (u32_at(page, e), key_at(page, i, 4, 8), u32_at(page, e + 12))
        else {
            return None;
        };
        for (t, name) in NAMES.iter().enumerate() {
            if ksize != name.len() as u64 || !matches!(found[t], Lookup::Absent) {
                continue;
            }
            let Some(k) = slice(page, from, ksize) else {
                found[t] = Lookup::Unknown;
                if t < 2 {
                    buckets[t] = Lookup::Unknown;
                }
                continue;
            };
            if k != *name {
                continue;
            }
            let value = slice(page, from + ksize, u64::from(vsize));
            let bucket = flags & BUCKET_LEAF != 0;
            if t < 2 {
                buckets[t] = match value {
                    Some(v) if bucket => bucket_of(v, inline_ok),
                    _ => Lookup::Unknown,
                };
                found[t] = Lookup::Found(0);
            } else {
                found[t] = match value {
                    Some(v) if !bucket => revision(v).map_or(Lookup::Unknown, Lookup::Found),
                    _ => Lookup::Unknown,
                };
            }
        }
    }
    let [key, meta] = buckets;
    let [_, _, finished, scheduled] = found;
    Some(Leaf {
        last,
        key,
        meta,
        finished,
        scheduled,
    })
}

/// A bucket's value: its root page, or its inline leaf.
fn bucket_of(v: &[u8], inline_ok: bool) -> Lookup<Bucket> {
    match u64_at(v, 0) {
        Some(0) if inline_ok => match v.get(HEADER..).and_then(|p| leaf(p, false)) {
            Some(l) if u16_at(&v[HEADER..], 8) == Some(LEAF_PAGE) => {
                Lookup::Found(Bucket::Inline {
                    last: l.last,
                    finished: l.finished,
                    scheduled: l.scheduled,
                })
            }
            _ => Lookup::Unknown,
        },
        Some(root) if root != 0 => Lookup::Found(Bucket::Page(root)),
        _ => Lookup::Unknown,
    }
}

impl RevisionScan {
    pub fn new() -> RevisionScan {
        RevisionScan::default()
    }

    /// Feeds the next bytes of the database.
    pub fn update(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() && self.broken.is_none() {
            // Up to the end of the current page (or of page 0's meta, before the page
            // size is known).
            let page_end = if self.page_size == 0 {
                (HEADER + META) as u64
            } else {
                self.page_size
            };
            let room = page_end.saturating_sub(self.buf.len() as u64);
            let n = usize::try_from(room).unwrap_or(usize::MAX).min(chunk.len());
            if n == 0 {
                self.broken = Some("the reader lost its place in the file".into());
                return;
            }
            let (now, rest) = chunk.split_at(n);
            self.pick_up(now);
            self.buf.extend_from_slice(now);
            self.at += n as u64;
            chunk = rest;
            if self.page_size == 0 && self.buf.len() == HEADER + META {
                match meta(&self.buf) {
                    Some(m) => self.page_size = m.page_size,
                    None => {
                        self.broken = Some(
                            "its first page is not a valid bbolt meta page (magic, version, page \
                             size or checksum)"
                                .into(),
                        );
                        return;
                    }
                }
            }
            if self.page_size != 0 && self.buf.len() as u64 == self.page_size {
                self.end_page();
                self.buf.clear();
            }
        }
    }

    /// The bytes of `now` (at `self.at` in the file) that pending leaves wait for.
    fn pick_up(&mut self, now: &[u8]) {
        if self.pending.is_empty() {
            return;
        }
        let (a, b) = (self.at, self.at + now.len() as u64);
        let mut done = Vec::new();
        for (i, p) in self.pending.iter_mut().enumerate() {
            let (lo, hi) = (p.from.max(a), (p.from + p.len).min(b));
            if lo < hi {
                p.got
                    .extend_from_slice(&now[(lo - a) as usize..(hi - a) as usize]);
            }
            if p.got.len() as u64 == p.len {
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            let mut p = self.pending.swap_remove(i);
            p.leaf.last = revision(&p.got).map(Last::Rev);
            self.record_leaf(p.id, p.leaf);
        }
    }

    /// The page just read (the last `page_size` bytes), whichever it is.
    fn end_page(&mut self) {
        let id = self.at / self.page_size - 1;
        let page = &self.buf;
        if u64_at(page, 0) != Some(id) {
            return;
        }
        let overflow = u64::from(u32_at(page, 12).unwrap_or(0));
        let span_end = self.at - self.page_size + (overflow + 1) * self.page_size;
        match u16_at(page, 8) {
            Some(META_PAGE) if id < 2 && overflow == 0 => {
                self.metas[id as usize] = meta(page).filter(|m| m.page_size == self.page_size);
            }
            Some(BRANCH_PAGE) => {
                if let Some(b) = branch(page) {
                    if self.branches.len() < MAX_BRANCHES {
                        self.branches.push((id, b));
                    } else {
                        self.overflowed = true;
                    }
                }
            }
            Some(LEAF_PAGE) => {
                let Some(l) = leaf(page, true) else {
                    return;
                };
                let count = usize::from(u16_at(page, 10).unwrap_or(0));
                let start = self.at - self.page_size;
                let beyond = (count > 0 && l.last.is_none())
                    .then(|| key_at(page, count - 1, 4, 8))
                    .flatten()
                    .filter(|(from, len)| {
                        (17..=18).contains(len)
                            && *from >= self.page_size
                            && start + from + len <= span_end
                    });
                match beyond {
                    Some((from, len)) if self.pending.len() < MAX_PENDING => {
                        self.pending.push(Pending {
                            id,
                            from: start + from,
                            len,
                            got: Vec::with_capacity(len as usize),
                            leaf: l,
                        })
                    }
                    Some(_) => self.overflowed = true,
                    None => self.record_leaf(id, l),
                }
            }
            _ => {}
        }
    }

    fn record_leaf(&mut self, id: u64, l: Leaf) {
        if let Some(last) = l.last {
            let v = match last {
                Last::Empty => -1,
                Last::Rev(r) => r,
            };
            self.lasts.push(Reverse((v, id)));
            if self.lasts.len() > MAX_LEAVES {
                self.lasts.pop();
                self.overflowed = true;
            }
        }
        if !l.plain() {
            if self.named.len() >= MAX_NAMED {
                self.overflowed = true;
                return;
            }
            self.named.push((id, l));
        }
        let (word, bit) = ((id / 64) as usize, id % 64);
        if self.read.len() <= word {
            self.read.resize(word + 1, 0);
        }
        self.read[word] |= 1 << bit;
    }

    fn branch(&self, id: u64) -> Option<Branch> {
        self.branches
            .binary_search_by_key(&id, |(i, _)| *i)
            .ok()
            .map(|i| self.branches[i].1)
    }

    fn leaf(&self, id: u64) -> Option<Leaf> {
        if let Some((_, l)) = self.named.iter().find(|(i, _)| *i == id) {
            return Some(l.clone());
        }
        let read = self
            .read
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0);
        read.then_some(Leaf {
            last: None,
            key: Lookup::Absent,
            meta: Lookup::Absent,
            finished: Lookup::Absent,
            scheduled: Lookup::Absent,
        })
    }

    fn missing(&self, what: &str, id: u64) -> String {
        let why = if self.overflowed {
            "not summarised (the database has more pages than this reader keeps)"
        } else {
            "not a sound page of that tree"
        };
        format!("page {id}, {what}, is {why}")
    }

    /// The leaf a search for `NAMES[t]` from `root` ends on.
    fn search(&self, root: u64, t: usize, what: &str) -> Result<Leaf, String> {
        let mut page = root;
        for _ in 0..MAX_DEPTH {
            if let Some(b) = self.branch(page) {
                page = b.toward[t].ok_or_else(|| self.missing(what, page))?;
                continue;
            }
            return self.leaf(page).ok_or_else(|| self.missing(what, page));
        }
        Err(format!(
            "the {what} is deeper than {MAX_DEPTH} pages (a loop)"
        ))
    }

    /// The last key of the tree at `root`.
    fn rightmost(&self, root: u64) -> Result<Last, String> {
        let mut page = root;
        for _ in 0..MAX_DEPTH {
            if let Some(b) = self.branch(page) {
                page = b.last;
                continue;
            }
            return self
                .lasts
                .iter()
                .find(|Reverse((_, id))| *id == page)
                .map(|Reverse((v, _))| if *v < 0 { Last::Empty } else { Last::Rev(*v) })
                .ok_or_else(|| self.missing("the last leaf of the bucket `key`", page));
        }
        Err(format!(
            "the bucket `key` is deeper than {MAX_DEPTH} pages (a loop)"
        ))
    }

    /// The revision etcd would restore from the database fed, or why it cannot be read.
    pub fn finish(self) -> Result<i64, String> {
        if let Some(why) = self.broken {
            return Err(why);
        }
        let meta = self
            .metas
            .iter()
            .flatten()
            .max_by_key(|m| m.txid)
            .ok_or("neither meta page (0, 1) is valid")?;
        let root = self.search(meta.root, KEY, "in the root bucket")?;
        let key = match root.key {
            Lookup::Found(b) => b,
            Lookup::Absent => return Err("the database has no bucket `key`".into()),
            Lookup::Unknown => return Err("the root bucket's entry `key` is unreadable".into()),
        };
        let root = self.search(meta.root, META_BUCKET, "in the root bucket")?;
        let (finished, scheduled) = match root.meta {
            Lookup::Found(Bucket::Inline {
                finished,
                scheduled,
                ..
            }) => (finished, scheduled),
            Lookup::Found(Bucket::Page(p)) => (
                self.search(p, FINISHED, "in the bucket `meta`")?.finished,
                self.search(p, SCHEDULED, "in the bucket `meta`")?.scheduled,
            ),
            Lookup::Absent => (Lookup::Absent, Lookup::Absent),
            Lookup::Unknown => return Err("the root bucket's entry `meta` is unreadable".into()),
        };
        let last = match key {
            Bucket::Page(p) => self.rightmost(p)?,
            Bucket::Inline { last, .. } => {
                last.ok_or("the inline bucket `key` ends with a key that is no revision")?
            }
        };
        let mut rev = match last {
            Last::Empty => 1,
            Last::Rev(r) => r.max(1),
        };
        for (name, l) in [
            ("finishedCompactRev", finished),
            ("scheduledCompactRev", scheduled),
        ] {
            match l {
                Lookup::Found(r) => rev = rev.max(r),
                Lookup::Absent => {}
                Lookup::Unknown => return Err(format!("the meta key `{name}` is unreadable")),
            }
        }
        Ok(rev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of `size` bytes: header, then the elements and their data.
    fn page(id: u64, flags: u16, elems: &[(u32, &[u8], &[u8])], size: usize) -> Vec<u8> {
        let mut p = vec![0u8; size];
        p[..8].copy_from_slice(&id.to_le_bytes());
        p[8..10].copy_from_slice(&flags.to_le_bytes());
        p[10..12].copy_from_slice(&(elems.len() as u16).to_le_bytes());
        let mut data = HEADER + elems.len() * ELEMENT;
        for (i, (f, k, v)) in elems.iter().enumerate() {
            let e = HEADER + i * ELEMENT;
            let pos = (data - e) as u32;
            if flags == BRANCH_PAGE {
                p[e..e + 4].copy_from_slice(&pos.to_le_bytes());
                p[e + 4..e + 8].copy_from_slice(&(k.len() as u32).to_le_bytes());
                p[e + 8..e + 16].copy_from_slice(&u64::from(*f).to_le_bytes());
            } else {
                p[e..e + 4].copy_from_slice(&f.to_le_bytes());
                p[e + 4..e + 8].copy_from_slice(&pos.to_le_bytes());
                p[e + 8..e + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
                p[e + 12..e + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
            }
            p[data..data + k.len()].copy_from_slice(k);
            data += k.len();
            p[data..data + v.len()].copy_from_slice(v);
            data += v.len();
        }
        p
    }

    fn meta_page(id: u64, size: usize, root: u64, txid: u64) -> Vec<u8> {
        let mut p = page(id, META_PAGE, &[], size);
        let m = &mut p[HEADER..HEADER + META];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&(size as u32).to_le_bytes());
        m[16..24].copy_from_slice(&root.to_le_bytes());
        m[48..56].copy_from_slice(&txid.to_le_bytes());
        let sum = fnv1a64(&m[..56]);
        m[56..64].copy_from_slice(&sum.to_le_bytes());
        p
    }

    fn rev(main: u64, sub: u64) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&sub.to_be_bytes());
        k
    }

    fn bucket(root: u64) -> Vec<u8> {
        let mut v = root.to_le_bytes().to_vec();
        v.extend_from_slice(&0u64.to_le_bytes());
        v
    }

    fn scan(db: &[u8], chunk: usize) -> Result<i64, String> {
        let mut s = RevisionScan::new();
        for c in db.chunks(chunk) {
            s.update(c);
        }
        s.finish()
    }

    /// A two-level `key` bucket whose pages come before the page pointing to them, a stale
    /// leaf with a larger revision (and an overflow over the live pages after it), a leaf of another bucket with revision-shaped keys, and
    /// a compaction revision in `meta`.
    fn db(compacted: u64) -> Vec<u8> {
        const P: usize = 1024;
        let (r5, r9, r12, r40) = (rev(5, 0), rev(9, 0), rev(12, 1), rev(40, 0));
        let mut tomb = rev(14, 0);
        tomb.push(b't');
        let compact = rev(compacted, 0);
        let mut pages = vec![meta_page(0, P, 7, 10), meta_page(1, P, 6, 9)];
        // 2, 3: the key bucket's leaves; 4: its branch; 5: a stale leaf; 6: a stale root.
        pages.push(page(2, LEAF_PAGE, &[(0, &r5, b"a"), (0, &r9, b"b")], P));
        pages.push(page(3, LEAF_PAGE, &[(0, &r12, b"c"), (0, &tomb, b"")], P));
        pages.push(page(4, BRANCH_PAGE, &[(2, &r5, b""), (3, &r12, b"")], P));
        // A free page keeps a stale header: this one claims the pages after it as its own.
        let mut stale = page(5, LEAF_PAGE, &[(0, &r40, b"old")], P);
        stale[12..16].copy_from_slice(&1000u32.to_le_bytes());
        pages.push(stale);
        pages.push(page(6, LEAF_PAGE, &[(1, b"key", &bucket(5))], P));
        // 7: the root bucket; 8: `meta`; 9: another bucket whose keys look like revisions.
        pages.push(page(
            7,
            LEAF_PAGE,
            &[
                (1, b"auth", &bucket(9)),
                (1, b"key", &bucket(4)),
                (1, b"meta", &bucket(8)),
            ],
            P,
        ));
        pages.push(page(
            8,
            LEAF_PAGE,
            &[
                (0, b"consistent_index", &[0; 8]),
                (0, b"finishedCompactRev", &compact),
            ],
            P,
        ));
        pages.push(page(9, LEAF_PAGE, &[(0, &rev(99, 0), b"x")], P));
        pages.concat()
    }

    #[test]
    fn the_revision_is_the_last_key_of_the_live_key_bucket_or_the_compaction() {
        for chunk in [1, 7, 16, 1000, 1 << 20] {
            assert_eq!(scan(&db(3), chunk), Ok(14), "chunk {chunk}");
            assert_eq!(scan(&db(20), chunk), Ok(20), "chunk {chunk}");
        }
    }

    #[test]
    fn an_inline_key_bucket_and_an_empty_one_are_read() {
        const P: usize = 512;
        let mut inline = bucket(0);
        inline.extend_from_slice(&page(0, LEAF_PAGE, &[(0, &rev(3, 0), b"v")], 64)[..51]);
        let empty = {
            let mut v = bucket(0);
            v.extend_from_slice(&page(0, LEAF_PAGE, &[], 16));
            v
        };
        for (value, want) in [(inline, 3), (empty, 1)] {
            let db = [
                meta_page(0, P, 2, 2),
                meta_page(1, P, 2, 1),
                page(2, LEAF_PAGE, &[(1, b"key", &value)], P),
            ]
            .concat();
            assert_eq!(scan(&db, 5), Ok(want));
        }
    }

    #[test]
    fn a_leaf_spanning_pages_gives_its_last_key() {
        const P: usize = 4096;
        let big = vec![7u8; 300 * 1024];
        let pages = 2 + (HEADER + 2 * ELEMENT + 34 + big.len()).div_ceil(P);
        let mut leafp = page(
            2,
            LEAF_PAGE,
            &[(0, &rev(8, 0), &big), (0, &rev(31, 2), b"z")],
            (pages - 2) * P,
        );
        leafp[12..16].copy_from_slice(&((pages - 3) as u32).to_le_bytes());
        let db = [
            meta_page(0, P, pages as u64, 3),
            meta_page(1, P, pages as u64, 2),
            leafp,
            page(pages as u64, LEAF_PAGE, &[(1, b"key", &bucket(2))], P),
        ]
        .concat();
        assert_eq!(scan(&db, 4000), Ok(31));
    }

    #[test]
    fn what_cannot_be_read_is_said_never_guessed() {
        let good = db(3);
        // The key bucket's last leaf cut off: no revision.
        assert!(scan(&good[..4 * 1024], 100).is_err());
        // A bad meta checksum on both.
        let mut bad = good.clone();
        bad[HEADER + 20] ^= 1;
        bad[1024 + HEADER + 20] ^= 1;
        assert!(scan(&bad, 100).unwrap_err().contains("meta"));
        // The branch's last child pointing at a page of another bucket's tree would be
        // followed (it is what the file says), but one pointing nowhere is said.
        let mut nowhere = good.clone();
        let e = 4 * 1024 + HEADER + ELEMENT + 8;
        nowhere[e..e + 8].copy_from_slice(&77u64.to_le_bytes());
        assert!(scan(&nowhere, 100).unwrap_err().contains("page 77"));
        // Every single-byte change and every truncation ends, without a panic.
        for i in (0..good.len()).step_by(3) {
            let mut m = good.clone();
            m[i] = m[i].wrapping_add(0x5d);
            let _ = scan(&m, 61);
            let _ = scan(&good[..i], 61);
        }
        assert!(scan(&[], 1).is_err());
    }
}
