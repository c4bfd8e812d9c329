//! Checking an etcd snapshot as it streams past (issue 36), as `talosctl etcd snapshot`
//! does: etcd's `Maintenance/Snapshot` stream (which Talos' `EtcdSnapshot` relays) is the
//! bbolt database followed by the sha256 of that database, 32 bytes. [`SnapshotCheck`]
//! hashes every byte but the last 32 as they pass, holding back only those 32 (never the
//! snapshot), and at the end compares them with the hash: a truncated or altered
//! snapshot fails, saying which.

use crate::runtime::bbolt::RevisionScan;
use ring::digest::{Context, SHA256};

/// The trailing hash's length.
pub const HASH_LEN: usize = 32;

/// What a snapshot that checked out is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Bytes streamed, the trailing hash included (what is stored).
    pub size: u64,
    /// The sha256 of the database (the snapshot's own trailing hash), lowercase hex.
    pub sha256: String,
    /// The etcd revision the database holds, read from it as it passed
    /// ([`crate::runtime::bbolt`]), or why it could not be read.
    pub revision: Result<i64, String>,
}

/// Why a snapshot did not check out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "the snapshot is {size} bytes, too short to be an etcd database followed by its sha256 (it was cut off, or is not an etcd snapshot)"
    )]
    TooShort { size: u64 },
    #[error(
        "the snapshot's trailing sha256 ({found}) is not the sha256 of its {db} bytes of database ({computed}): it was altered or cut off on the way"
    )]
    Mismatch {
        db: u64,
        found: String,
        computed: String,
    },
}

impl SnapshotError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            SnapshotError::TooShort { .. } => "too_short",
            SnapshotError::Mismatch { .. } => "hash_mismatch",
        }
    }
}

/// Why streaming a snapshot from a node failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The node, or the way to it.
    #[error(transparent)]
    Talos(#[from] crate::runtime::talos::TalosError),
    /// Where the snapshot was being written.
    #[error("writing the snapshot failed: {0}")]
    Write(#[source] std::io::Error),
    /// The snapshot streamed whole but is not sound.
    #[error(transparent)]
    Check(#[from] SnapshotError),
}

impl StreamError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            StreamError::Talos(e) => e.metric_label(),
            StreamError::Write(_) => "write",
            StreamError::Check(e) => e.metric_label(),
        }
    }
}

/// The check of one snapshot, fed chunk by chunk.
pub struct SnapshotCheck {
    hash: Context,
    /// The last bytes seen (at most [`HASH_LEN`]): not hashed yet, since they may be the
    /// trailing hash.
    tail: Vec<u8>,
    size: u64,
    /// The database's revision, read as it passes.
    scan: RevisionScan,
}

impl Default for SnapshotCheck {
    fn default() -> Self {
        SnapshotCheck::new()
    }
}

impl SnapshotCheck {
    pub fn new() -> SnapshotCheck {
        SnapshotCheck {
            hash: Context::new(&SHA256),
            tail: Vec::with_capacity(2 * HASH_LEN),
            size: 0,
            scan: RevisionScan::new(),
        }
    }

    /// Bytes fed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.size += chunk.len() as u64;
        if chunk.len() >= HASH_LEN {
            // Everything held back, and all of this chunk but its last 32 bytes, is database.
            self.hash.update(&self.tail);
            self.scan.update(&self.tail);
            let (db, tail) = chunk.split_at(chunk.len() - HASH_LEN);
            self.hash.update(db);
            self.scan.update(db);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(chunk);
            if self.tail.len() > HASH_LEN {
                let spill = self.tail.len() - HASH_LEN;
                self.hash.update(&self.tail[..spill]);
                self.scan.update(&self.tail[..spill]);
                self.tail.drain(..spill);
            }
        }
    }

    /// Whether the last 32 bytes are the sha256 of everything before them.
    pub fn finish(self) -> Result<Checked, SnapshotError> {
        // An empty database is no etcd snapshot: bbolt's smallest file is 4 pages.
        if self.size < (HASH_LEN as u64) * 2 {
            return Err(SnapshotError::TooShort { size: self.size });
        }
        let computed = hex(self.hash.finish().as_ref());
        let found = hex(&self.tail);
        if computed != found {
            return Err(SnapshotError::Mismatch {
                db: self.size - HASH_LEN as u64,
                found,
                computed,
            });
        }
        Ok(Checked {
            size: self.size,
            sha256: found,
            revision: self.scan.finish(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(db: &[u8]) -> Vec<u8> {
        let mut out = db.to_vec();
        out.extend_from_slice(ring::digest::digest(&SHA256, db).as_ref());
        out
    }

    fn check(bytes: &[u8], chunk: usize) -> Result<Checked, SnapshotError> {
        let mut c = SnapshotCheck::new();
        for part in bytes.chunks(chunk.max(1)) {
            c.update(part);
        }
        c.finish()
    }

    #[test]
    fn a_whole_snapshot_checks_out_in_chunks_of_any_size() {
        let db: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let snap = snapshot(&db);
        let want = hex(ring::digest::digest(&SHA256, &db).as_ref());
        for chunk in [1, 3, 31, 32, 33, 64, 1000, snap.len()] {
            let got = check(&snap, chunk).unwrap();
            assert_eq!(got.size, snap.len() as u64, "{chunk}");
            assert_eq!(got.sha256, want, "{chunk}");
        }
    }

    #[test]
    fn an_altered_or_cut_snapshot_fails() {
        let db = vec![9u8; 4096];
        let mut snap = snapshot(&db);
        snap[100] ^= 1;
        for chunk in [7, 4096] {
            assert!(matches!(
                check(&snap, chunk),
                Err(SnapshotError::Mismatch { db: 4096, .. })
            ));
        }
        let whole = snapshot(&db);
        let cut = &whole[..whole.len() - 1];
        assert!(matches!(
            check(cut, 10),
            Err(SnapshotError::Mismatch { .. })
        ));
        assert_eq!(
            check(&whole[..40], 5),
            Err(SnapshotError::TooShort { size: 40 })
        );
        assert_eq!(check(&[], 5), Err(SnapshotError::TooShort { size: 0 }));
    }
}
