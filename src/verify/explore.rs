//! Breadth-first exploration of the model: canonical states (machines in the same state are
//! interchangeable), invariants checked on every state and transition, liveness on the
//! explored graph, and the shortest trace to each violation.

use super::invariant::{Facts, InvariantCheck, Verdicts};
use super::memory::{Budget, Over, show};
use super::model::{
    ClusterState, GONE, Lazy, Lock, Machine, Memo, Model, Move, NONE, Next, Op, OpKind, Outcomes,
    Pending, Phase, Renumber, Req, State, ix, len_byte, lift_pending, object_key, renumbering,
    unseen_into,
};
use std::hash::Hasher;
use std::time::Instant;

/// A small, fast, non-cryptographic hasher for the visited set (FxHash's multiply-rotate).
#[derive(Default)]
pub struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }

    // Whole words at once (the invariant cache hashes facts field by field).
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_i64(&mut self, x: i64) {
        self.write_u64(x.cast_unsigned());
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.write_u64(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
}

/// [`Fx`] with its result [`mix`]ed, for the hash tables of the standard library: they pick
/// a bucket by the hash's low bits, which Fx's last multiply fills from the last word's low
/// bits alone (on the invariant cache's packed facts, Fx alone made long probe sequences).
#[derive(Default)]
pub struct FxMixed(Fx);

impl Hasher for FxMixed {
    fn finish(&self) -> u64 {
        mix(self.0.finish())
    }

    fn write_u64(&mut self, x: u64) {
        self.0.write_u64(x);
    }

    fn write_i64(&mut self, x: i64) {
        self.0.write_i64(x);
    }

    fn write_u8(&mut self, x: u8) {
        self.0.write_u8(x);
    }

    fn write_usize(&mut self, x: usize) {
        self.0.write_usize(x);
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

/// The hash tables' hasher ([`FxMixed`]).
pub type Mixed = std::hash::BuildHasherDefault<FxMixed>;

/// What a thread that expands states keeps from batch to batch.
#[derive(Default)]
struct Worker {
    verdicts: Verdicts,
    memos: Memos,
    acts: Acts,
    /// The states of the last batch, decoded: the next batch decodes into their lists.
    decoded: Vec<State>,
}

/// The controller's and the world's successors ([`Model::acting`]) of a state as they see
/// it ([`unseen_into`]), kept for the states that differ from it only in what they do not
/// see: the requests in flight and the explorer's counts. With requests in flight, one
/// cluster recurs under many of them (the largest runs of the default suite expand each
/// about 8 to 24 times), so its reconciles run once and are [`lift`](super::model::lift)ed to each.
pub struct Acting {
    outcomes: Outcomes,
    /// The successors, canonical and encoded; `None` when one of them renumbers the
    /// machines in a way the requests in flight cannot follow (then every state is
    /// expanded on its own).
    nexts: Option<Vec<Lifted>>,
    /// The successors' keys and numberings ([`Lifted`]'s ranges), in one buffer.
    bytes: Vec<u8>,
}

/// A successor of [`Acting`], kept as far as it does not depend on the requests in
/// flight: what a state's own successor by the same move is once its requests in flight
/// are added ([`lift`](super::model::lift)).
struct Lifted {
    mv: Move,
    /// How the move renumbered the machines (the requests in flight follow it).
    how: Renumber,
    /// How [`canonical_into`] numbered the successor's machines (in [`Acting::bytes`]).
    renumber: std::ops::Range<usize>,
    /// The canonical successor's key ([`encode`]) with no request in flight and the
    /// explorer's counts at zero, without the requests' part, its last byte (in
    /// [`Acting::bytes`]).
    key: std::ops::Range<usize>,
    /// The transition's facts: the invariants read neither the requests in flight nor
    /// the counts.
    facts: Facts,
    /// The move adds a machine or an operation ([`always`]).
    grows: bool,
}

impl Lifted {
    /// `n`, a successor of the unseen state `u`, kept (its bytes written onto `bytes`).
    fn of(
        u: &State,
        n: &Next,
        how: Renumber,
        before: &Facts,
        (c, scratch): (&mut State, &mut Scratch),
        bytes: &mut Vec<u8>,
    ) -> Lifted {
        canonical_into(&n.state, c, scratch);
        let start = bytes.len();
        encode_onto(c, bytes);
        // The requests' part: their count (none here), the last byte.
        bytes.pop();
        let key = start..bytes.len();
        bytes.extend_from_slice(&scratch.renumber);
        Lifted {
            mv: n.mv,
            how,
            renumber: key.end..bytes.len(),
            key,
            facts: Facts::of_transition(before, c, &n.effect),
            grows: grows(u, &n.state),
        }
    }

    /// The key of this successor of `s`: `s`'s requests in flight, renumbered as the move
    /// and then [`canonical_into`] renumbered the machines, and `s`'s counts.
    fn key_of(
        &self,
        bytes: &[u8],
        s: &State,
        scratch: &mut (Vec<Pending>, Vec<Pending>),
        out: &mut Vec<u8>,
    ) {
        let (lifted, canon) = scratch;
        lift_pending(&s.pending, self.how, lifted);
        canonical_pending(lifted, &bytes[self.renumber.clone()], canon);
        let start = out.len();
        out.extend_from_slice(&bytes[self.key.clone()]);
        // The counts, where [`encode_onto`] puts them.
        if let Some(flags) = out.get_mut(start + FLAGS_AT) {
            *flags |= u8::from(s.concurrent) << CONCURRENT_BIT;
        }
        if let Some(requests) = out.get_mut(start + REQUESTS_AT) {
            *requests = s.requests;
        }
        encode_pending(canon, out);
    }
}

/// [`Acting`]s of the states expanded lately, kept from batch to batch as [`Memos`] are
/// (in two generations).
#[derive(Default)]
pub struct Acts {
    map: std::collections::HashMap<Vec<u8>, Acting, Mixed>,
    old: std::collections::HashMap<Vec<u8>, Acting, Mixed>,
}

impl Acts {
    /// States kept, both generations together. (More than the states of a batch: a
    /// cluster recurs under other requests in flight several batches apart. At 2^12 the
    /// largest run of the default suite ran `Model::acting` 1.49 M times for 6.07 M
    /// states, at 2^16 0.74 M times.)
    const MAX: usize = 1 << 16;
    /// The bytes of one, about: a key and three successors (each a [`Lifted`] and its
    /// bytes; the successors hold no state). Measured: about 600 on average.
    const BYTES: u64 = 2_000;

    fn headroom(&self) -> u64 {
        Self::MAX.saturating_sub(self.map.len() + self.old.len()) as u64 * Self::BYTES
    }

    fn take(&mut self, key: &[u8]) -> Option<Acting> {
        self.map.remove(key).or_else(|| self.old.remove(key))
    }

    fn keep(&mut self, key: &[u8], acting: Acting) {
        if self.map.len() >= Self::MAX / 2 {
            // The older generation forgotten, its table kept for the next newer one (a
            // table grown afresh each generation rehashed all the way up).
            self.old.clear();
            std::mem::swap(&mut self.old, &mut self.map);
        }
        self.map.insert(key.to_vec(), acting);
    }
}

/// The decisions made on objects ([`Memo`]) of the object keys expanded lately, kept from
/// batch to batch: states with the same objects recur across batches too, often many
/// depths apart. Bounded, in two generations: when the newer one is full, the older one
/// is forgotten and the newer one becomes the older (what is used again is taken back
/// into the newer one, so a key in use is never forgotten all at once).
#[derive(Default)]
pub struct Memos {
    map: std::collections::HashMap<Vec<u8>, Memo, Mixed>,
    old: std::collections::HashMap<Vec<u8>, Memo, Mixed>,
}

impl Memos {
    /// Object keys kept, both generations together (about 650 bytes each).
    const MAX: usize = 1 << 16;
    /// The bytes of one key and its decisions, about.
    const BYTES: u64 = 650;

    /// The memory the memos may still take before they are full (then they forget as
    /// much as they keep).
    fn headroom(&self) -> u64 {
        Self::MAX.saturating_sub(self.map.len() + self.old.len()) as u64 * Self::BYTES
    }

    /// The decisions kept for `key` (none when there are none).
    fn take(&mut self, key: &[u8]) -> Memo {
        let r = self.map.remove(key).or_else(|| self.old.remove(key));
        r.unwrap_or_default()
    }

    fn keep(&mut self, key: &[u8], memo: Memo) {
        if self.map.len() >= Self::MAX / 2 {
            self.old.clear();
            std::mem::swap(&mut self.old, &mut self.map);
        }
        self.map.insert(key.to_vec(), memo);
    }
}

// ---- canonical form ---------------------------------------------------------------------

/// The canonical representative of a state: approval orders renumbered densely, machines
/// sorted by their state (names follow them), everything that refers to a machine or an
/// operation renumbered to match.
pub fn canonical(s: &State) -> State {
    let mut out = s.clone();
    canonical_into(s, &mut out, &mut Scratch::default());
    out
}

/// What [`canonical_into`] works in (kept by a caller that canonicalises many states, so
/// that it allocates nothing once warm).
#[derive(Default)]
pub struct Scratch {
    machines: Vec<Machine>,
    ops: Vec<Op>,
    /// The last state's machines as [`canonical_into`] numbered them: machine `i` became
    /// `renumber[i]`.
    renumber: Vec<u8>,
}

/// `pending` (requests in flight) with their machines numbered by `renumber` (machine `i`
/// became `renumber[i]`), sorted: the requests in flight of a canonical
/// state.
fn canonical_pending(pending: &[Pending], renumber: &[u8], out: &mut Vec<Pending>) {
    let map = |x: u8| -> u8 {
        if x == NONE || x == GONE {
            x
        } else {
            renumber.get(usize::from(x)).copied().unwrap_or(x)
        }
    };
    out.clear();
    out.extend(pending.iter().map(|p| Pending {
        req: p.req.map_machine(map),
        ..*p
    }));
    out.sort();
}

/// [`canonical`] of `s`, written into `out` (whose lists keep their allocations).
pub fn canonical_into(s: &State, out: &mut State, scratch: &mut Scratch) {
    // Every list of a state is at most MAX_MACHINES (machines) or MAX_OPERATIONS long
    // (`Bounds::check`), so the permutations fit in buffers on the stack.
    const M: usize = super::model::MAX_MACHINES;
    const O: usize = super::model::MAX_OPERATIONS;
    let (n, k) = (s.machines.len().min(M), s.ops.len().min(O));
    let Scratch {
        machines,
        ops,
        renumber,
    } = scratch;
    machines.clear();
    machines.extend_from_slice(&s.machines[..n]);
    let machines = machines.as_mut_slice();
    // Approval order matters only among approved control planes, and only as an order.
    let mut orders = [0u8; M];
    let mut counted = 0;
    for m in machines.iter().filter(|m| m.approved && m.order > 0) {
        orders[counted] = m.order;
        counted += 1;
    }
    let orders = &mut orders[..counted];
    orders.sort_unstable();
    for m in machines.iter_mut() {
        if !(m.approved && m.order > 0) {
            m.order = 0;
        } else if let Ok(p) = orders.binary_search(&m.order) {
            m.order = u8::try_from(p + 1).unwrap_or(u8::MAX);
        }
    }
    let mut perm = [0u8; M];
    for (i, _) in ix(machines) {
        perm[usize::from(i)] = i;
    }
    let perm = &mut perm[..n];
    perm.sort_by(|a, b| {
        machines[usize::from(*a)]
            .cmp(&machines[usize::from(*b)])
            .then(a.cmp(b))
    });
    renumber.clear();
    renumber.resize(n, 0);
    for (new, old) in ix(perm) {
        if let Some(r) = renumber.get_mut(usize::from(*old)) {
            *r = new;
        }
    }
    let inv = renumber.as_slice();
    let map = |x: u8| -> u8 {
        if x == NONE || x == GONE {
            x
        } else {
            inv.get(usize::from(x)).copied().unwrap_or(x)
        }
    };
    ops.clear();
    ops.extend_from_slice(&s.ops[..k]);
    let ops = ops.as_mut_slice();
    for o in ops.iter_mut() {
        o.target = map(o.target);
        for x in &mut o.order {
            *x = map(*x);
        }
    }
    // Operations: interchangeable too (their creation order matters only to name the
    // unfinished one another waits on, which a canonical order keeps deterministic).
    let mut operm = [0u8; O];
    for (i, _) in ix(ops) {
        operm[usize::from(i)] = i;
    }
    let operm = &mut operm[..k];
    operm.sort_by(|a, b| {
        ops[usize::from(*a)]
            .cmp(&ops[usize::from(*b)])
            .then(a.cmp(b))
    });
    let mut oinv = [0u8; O];
    for (new, old) in ix(operm) {
        oinv[usize::from(*old)] = new;
    }
    canonical_pending(&s.pending, inv, &mut out.pending);
    out.lock = match s.lock {
        Lock::Removal(h) => Lock::Removal(map(h)),
        Lock::Operation(h) => Lock::Operation(oinv[..k].get(usize::from(h)).copied().unwrap_or(h)),
        other => other,
    };
    out.machines.clear();
    out.machines
        .extend(perm.iter().map(|i| machines[usize::from(*i)]));
    out.names.clear();
    out.names.extend(
        perm.iter()
            .map(|i| s.names.get(usize::from(*i)).copied().unwrap_or(0)),
    );
    out.ops.clear();
    out.ops.extend(operm.iter().map(|i| ops[usize::from(*i)]));
    out.op_names.clear();
    out.op_names.extend(
        operm
            .iter()
            .map(|i| s.op_names.get(usize::from(*i)).copied().unwrap_or(0)),
    );
    // Every field named: one added to the state must be carried over here too.
    let State {
        count,
        schedulable,
        cluster,
        machines: _,
        ops: _,
        lock: _,
        lock_expired,
        pending: _,
        failures,
        requests,
        pdb,
        backup,
        concurrent,
        names: _,
        op_names: _,
    } = s;
    out.count = *count;
    out.schedulable = *schedulable;
    out.cluster = *cluster;
    out.lock_expired = *lock_expired;
    out.failures = *failures;
    out.requests = *requests;
    out.pdb = *pdb;
    out.backup = *backup;
    out.concurrent = *concurrent;
}

/// The bytes that identify a canonical state (names left out).
pub fn encode(s: &State, out: &mut Vec<u8>) {
    out.clear();
    encode_onto(s, out);
}

/// Where [`encode_onto`] puts the flags (among them `concurrent`, at bit
/// [`CONCURRENT_BIT`]) and the count of requests: a key's explorer counts.
const FLAGS_AT: usize = 1;
const CONCURRENT_BIT: u8 = 4;
const REQUESTS_AT: usize = 3;

/// [`encode`], appended to `out`.
fn encode_onto(s: &State, out: &mut Vec<u8>) {
    let start = out.len();
    out.push(s.count);
    out.push(
        u8::from(s.schedulable)
            | (match s.cluster {
                ClusterState::Live => 0,
                ClusterState::Deleting => 1,
                ClusterState::Gone => 2,
                ClusterState::Missing => 3,
            } << 1)
            | (u8::from(s.pdb) << 3)
            | (u8::from(s.concurrent) << CONCURRENT_BIT)
            | (s.backup.byte() << 5),
    );
    out.push(s.failures);
    debug_assert_eq!(out.len() - start, REQUESTS_AT);
    out.push(s.requests);
    let expired = if s.lock_expired { 0x80 } else { 0 };
    match s.lock {
        Lock::Free => out.extend([expired, 0]),
        Lock::Removal(h) => out.extend([1 | expired, h]),
        Lock::Operation(h) => out.extend([2 | expired, h]),
    }
    out.push(len_byte(&s.machines));
    for m in &s.machines {
        let bits: u16 = u16::from(m.role == super::model::MRole::Worker)
            | (u16::from(m.approved) << 1)
            | (u16::from(m.deleting) << 2)
            | (u16::from(m.finalizer) << 3)
            | (u16::from(m.joined) << 4)
            | (u16::from(m.member) << 5)
            | (u16::from(m.up) << 6)
            | (u16::from(m.wiped) << 7)
            | (u16::from(m.unreachable) << 8)
            | (u16::from(m.held) << 9)
            | (u16::from(m.dead) << 10)
            | (u16::from(m.committed) << 11)
            | (u16::from(m.reroled) << 12)
            | (u16::from(m.moved) << 13)
            | (u16::from(m.recorded) << 14)
            | (u16::from(m.cordoned) << 15);
        out.extend(bits.to_le_bytes());
        out.push(m.order);
        out.extend(m.done.to_le_bytes());
        out.push(m.started);
        out.push(m.boots.byte());
    }
    out.push(len_byte(&s.ops));
    for o in &s.ops {
        out.push(o.kind as u8);
        out.push(o.target);
        out.push(o.phase.byte());
        out.push(o.run.steps);
        out.push(o.run.flags);
        out.push(o.run.more);
        out.push(o.done);
        out.extend(o.order);
        out.extend([o.cur, o.width, o.did]);
        for x in o.side {
            out.extend([x.at, x.run.steps, x.run.flags, x.run.more]);
        }
    }
    encode_pending(&s.pending, out);
}

/// The requests in flight of [`encode_onto`], the last of a key's bytes.
fn encode_pending(pending: &[Pending], out: &mut Vec<u8>) {
    out.push(len_byte(pending));
    for p in pending {
        let (tag, arg) = match p.req {
            Req::Approve(x) => (0, x),
            Req::Unapprove(x) => (1, x),
            Req::Reassign(x) => (14, x),
            Req::Move(x) => (15, x),
            Req::Delete(x) => (2, x),
            Req::Collect(x) => (3, x),
            Req::Count(c) => (4, c),
            Req::Unschedule => (5, 0),
            Req::Reschedule => (6, 0),
            Req::DeleteCluster => (7, 0),
            Req::CreateOperation(OpKind::Roll, x) => (16, x),
            Req::CreateOperation(OpKind::UpgradeRoll, x) => (17, x),
            Req::CreateOperation(OpKind::Shutdown, x) => (18, x),
            Req::CreateOperation(OpKind::Rollback, x) => (19, x),
            Req::CreateOperation(k, x) => (8 + k as u8, x),
            Req::ForgeStatus(x) => (11, x),
            Req::Prune(x) => (12, x),
            Req::PruneCluster => (13, 0),
        };
        out.extend([
            tag,
            arg,
            p.base.0,
            u8::from(p.base.1) | (u8::from(p.warned) << 1),
        ]);
    }
}

/// The state a key encodes (with default names).
pub fn decode(b: &[u8]) -> Option<State> {
    let mut s = State::blank();
    decode_into(b, &mut s)?;
    Some(s)
}

/// [`decode`] into `out`, whose lists keep their allocations (`out` is left unspecified
/// when `b` is not a key).
pub fn decode_into(b: &[u8], out: &mut State) -> Option<()> {
    let mut it = b.iter().copied();
    let mut next = || it.next();
    let count = next()?;
    let flags = next()?;
    let failures = next()?;
    let requests = next()?;
    let (tag, h) = (next()?, next()?);
    let lock_expired = tag & 0x80 != 0;
    let lock = match (tag & 0x7f, h) {
        (1, h) => Lock::Removal(h),
        (2, h) => Lock::Operation(h),
        _ => Lock::Free,
    };
    let n = next()?;
    let mut machines = std::mem::take(&mut out.machines);
    machines.clear();
    for _ in 0..n {
        let bits = u16::from_le_bytes([next()?, next()?]);
        let order = next()?;
        let done = u16::from_le_bytes([next()?, next()?]);
        let started = next()?;
        let boots = super::model::Boots::from_byte(next()?);
        let bit = |k: u16| bits & (1 << k) != 0;
        machines.push(Machine {
            role: if bit(0) {
                super::model::MRole::Worker
            } else {
                super::model::MRole::ControlPlane
            },
            approved: bit(1),
            order,
            deleting: bit(2),
            finalizer: bit(3),
            joined: bit(4),
            member: bit(5),
            up: bit(6),
            wiped: bit(7),
            unreachable: bit(8),
            held: bit(9),
            dead: bit(10),
            committed: bit(11),
            reroled: bit(12),
            moved: bit(13),
            done,
            recorded: bit(14),
            cordoned: bit(15),
            started,
            boots,
        });
    }
    let nops = next()?;
    let mut ops = std::mem::take(&mut out.ops);
    ops.clear();
    for _ in 0..nops {
        let kind = match next()? {
            0 => OpKind::Upgrade,
            1 => OpKind::Reset,
            2 => OpKind::Restore,
            3 => OpKind::Roll,
            4 => OpKind::UpgradeRoll,
            5 => OpKind::Shutdown,
            6 => OpKind::Rollback,
            _ => return None,
        };
        let target = next()?;
        let phase = Phase::from_byte(next()?);
        let run = super::model::OpRun {
            steps: next()?,
            flags: next()?,
            more: next()?,
        };
        let done = next()?;
        let mut order = [super::model::NONE; super::model::ROLL_MAX];
        for x in &mut order {
            *x = next()?;
        }
        let (cur, width, did) = (next()?, next()?, next()?);
        let mut side = [super::model::Side::NONE; super::model::SIDE];
        for x in &mut side {
            *x = super::model::Side {
                at: next()?,
                run: super::model::OpRun {
                    steps: next()?,
                    flags: next()?,
                    more: next()?,
                },
            };
        }
        ops.push(Op {
            kind,
            target,
            phase,
            run,
            order,
            done,
            cur,
            side,
            width,
            did,
        });
    }
    let np = next()?;
    let mut pending = std::mem::take(&mut out.pending);
    pending.clear();
    for _ in 0..np {
        let (tag, arg, b0, b1) = (next()?, next()?, next()?, next()?);
        let req = match tag {
            0 => Req::Approve(arg),
            1 => Req::Unapprove(arg),
            2 => Req::Delete(arg),
            3 => Req::Collect(arg),
            4 => Req::Count(arg),
            5 => Req::Unschedule,
            6 => Req::Reschedule,
            7 => Req::DeleteCluster,
            8 => Req::CreateOperation(OpKind::Upgrade, arg),
            9 => Req::CreateOperation(OpKind::Reset, arg),
            10 => Req::CreateOperation(OpKind::Restore, arg),
            11 => Req::ForgeStatus(arg),
            12 => Req::Prune(arg),
            13 => Req::PruneCluster,
            14 => Req::Reassign(arg),
            15 => Req::Move(arg),
            16 => Req::CreateOperation(OpKind::Roll, arg),
            17 => Req::CreateOperation(OpKind::UpgradeRoll, arg),
            18 => Req::CreateOperation(OpKind::Shutdown, arg),
            19 => Req::CreateOperation(OpKind::Rollback, arg),
            _ => return None,
        };
        if b1 > 3 {
            return None;
        }
        pending.push(Pending {
            req,
            base: (b0, b1 & 1 != 0),
            warned: b1 & 2 != 0,
        });
    }
    let mut names = std::mem::take(&mut out.names);
    names.clear();
    let (mut cp, mut w) = (0u8, 0u8);
    for m in &machines {
        if m.role == super::model::MRole::Worker {
            w += 1;
            names.push(w);
        } else {
            cp += 1;
            names.push(cp);
        }
    }
    let mut op_names = std::mem::take(&mut out.op_names);
    op_names.clear();
    op_names.extend(1..=nops);
    *out = State {
        count,
        schedulable: flags & 1 != 0,
        cluster: match (flags >> 1) & 3 {
            0 => ClusterState::Live,
            1 => ClusterState::Deleting,
            2 => ClusterState::Gone,
            _ => ClusterState::Missing,
        },
        machines,
        ops,
        lock,
        lock_expired,
        pending,
        failures,
        requests,
        pdb: flags & 8 != 0,
        backup: super::model::Backup::from_byte(flags >> 5),
        concurrent: flags & (1 << CONCURRENT_BIT) != 0,
        names,
        op_names,
    };
    Some(())
}

// ---- exploration ------------------------------------------------------------------------

/// One violation: the invariant, the state it was found in (by id), the transition (when
/// a transition broke it) and the invariant's message.
#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: usize,
    /// The state before the violating transition, or the violating state itself.
    pub from: u32,
    /// The key of the state after the violating transition.
    pub to_key: Option<Vec<u8>>,
    pub mv: Option<Move>,
    pub message: String,
    pub depth: u32,
    /// For a liveness violation: the states a fair run goes through from `from` without
    /// ending the work, to where the controller has nothing left to do, or to a livelock
    /// and once round it.
    pub lasso: Vec<u32>,
    /// Where the loop starts in `lasso`: the states from this index on go round, back to
    /// the state before it (`from` when 0).
    pub loop_at: Option<usize>,
}

/// The keys of the explored states, by id, in one buffer (a state's key is stored once:
/// the visited set holds ids and hashes the keys it points to).
#[derive(Default)]
pub struct Keys {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Keys {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.bytes.get(start..end)
    }

    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl std::ops::Index<usize> for Keys {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        self.get(i).unwrap_or(&[])
    }
}

pub struct Exploration {
    pub keys: Keys,
    pub parent: Vec<u32>,
    pub depth: Vec<u32>,
    pub transitions: u64,
    pub max_depth: u32,
    /// States left unexpanded because the depth bound was reached.
    pub cut_at_depth: u64,
    /// States where people had sent every request `Bounds::max_requests` allows (their
    /// requests were not explored further).
    pub cut_by_requests: u64,
    pub violations: Vec<Violation>,
    pub fired: super::model::Fired,
    /// Per invariant: its `when`/`unless` held at least once.
    pub at_risk: Vec<bool>,
    pub seconds: f64,
    pub stuck: u64,
    /// Threads that expanded states.
    pub threads: usize,
    /// Why the exploration stopped before its bounds were explored (`None`: it did not).
    /// Such an exploration proves nothing.
    pub incomplete: Option<String>,
}

pub const NO_PARENT: u32 = u32::MAX;

/// Why an exploration stopped before its bounds: more distinct states than it can number.
const FULL: &str = "more than 4,294,967,294 distinct states: exploration stopped before the \
     bounds were explored, so nothing was proved; lower the bounds (or --max-requests)";

fn hash_key(key: &[u8]) -> u64 {
    let mut h = Fx::default();
    h.write(key);
    h.finish()
}

/// The visited set: ids of states, hashed and compared through their keys. Open
/// addressing with linear probing, at most half full: a slot is 0 (empty) or
/// `tag << 32 | (id + 1)`, `tag` being the upper half of the key's [`mix`]ed hash (so that a
/// key is compared only with the keys whose tag it shares). Its own table rather than a
/// library's so that [`merge`] can fetch a lookup's slot and key ahead of it
/// ([`Visited::prefetch`]): a lookup is mostly cache misses, and most are of states seen
/// before.
struct Visited {
    slots: Vec<u64>,
    /// Ids in the table.
    len: usize,
    /// The hash of each id's key (the table grows without hashing every key again).
    hashes: Vec<u64>,
    /// The first id not handed out: [`NO_PARENT`] (smaller in tests).
    limit: u32,
}

/// A key's [`hash_key`] mixed (murmur3's finaliser): its low bits pick the slot, its high
/// half is the tag (Fx's low bits alone are weak).
fn mix(h: u64) -> u64 {
    let mut h = h ^ (h >> 33);
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The smallest table [`Visited`] allocates.
const MIN_SLOTS: usize = 1 << 10;

impl Visited {
    fn new(limit: u32) -> Visited {
        Visited {
            slots: Vec::new(),
            len: 0,
            hashes: Vec::new(),
            limit,
        }
    }

    /// Where `hash`'s probe starts, and its tag.
    fn home(&self, hash: u64) -> (usize, u64) {
        let m = mix(hash);
        (
            (m as usize) & self.slots.len().wrapping_sub(1),
            (m >> 32) << 32,
        )
    }

    /// The id of `key`, or the empty slot where it would go.
    fn find(&self, keys: &Keys, key: &[u8], hash: u64) -> Result<u32, usize> {
        let mask = self.slots.len().wrapping_sub(1);
        let (mut i, tag) = self.home(hash);
        loop {
            let s = self.slots.get(i).copied().unwrap_or(0);
            if s == 0 {
                return Err(i);
            }
            let id = (s as u32).wrapping_sub(1);
            if s & !0xffff_ffff == tag && keys[id as usize] == *key {
                return Ok(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slots a table needs to hold `n` ids at most half full.
    fn slots_for(n: usize) -> usize {
        n.saturating_mul(2).next_power_of_two().max(MIN_SLOTS)
    }

    /// Makes room for one more id.
    fn reserve_one(&mut self) {
        if self.slots.len() >= Self::slots_for(self.len + 1) {
            return;
        }
        let mut slots = vec![0u64; Self::slots_for(self.len + 1)];
        let mask = slots.len() - 1;
        let old = std::mem::take(&mut self.slots);
        for s in old.into_iter().filter(|s| *s != 0) {
            let id = (s as u32).wrapping_sub(1);
            let m = mix(self.hashes.get(id as usize).copied().unwrap_or(0));
            let mut i = (m as usize) & mask;
            while slots[i] != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = s;
        }
        self.slots = slots;
    }

    /// The id of `key`, adding it (as id `keys.len()`) when new; `true` when it was new.
    /// `None` when every id is taken (ids are `u32`, and [`NO_PARENT`] is none of them).
    fn intern(&mut self, keys: &mut Keys, key: &[u8]) -> Option<(u32, bool)> {
        self.intern_hashed(keys, key, hash_key(key))
    }

    /// [`Visited::intern`] of a key whose [`hash_key`] is `hash`.
    fn intern_hashed(&mut self, keys: &mut Keys, key: &[u8], hash: u64) -> Option<(u32, bool)> {
        self.reserve_one();
        let slot = match self.find(keys, key, hash) {
            Ok(id) => return Some((id, false)),
            Err(slot) => slot,
        };
        let id = u32::try_from(keys.len())
            .ok()
            .filter(|id| *id < self.limit)?;
        keys.push(key);
        self.hashes.push(hash);
        let (_, tag) = self.home(hash);
        if let Some(s) = self.slots.get_mut(slot) {
            *s = tag | u64::from(id + 1);
        }
        self.len += 1;
        Some((id, true))
    }

    /// Asks the memory for what a lookup of `hash` will read, `stage` lookups ahead of it:
    /// [`PREFETCH_SLOT`] its slot; then, once that is here, the first candidate's key
    /// bounds ([`PREFETCH_ENDS`]) and then its bytes ([`PREFETCH_KEY`]). Only hints: a slot
    /// filled in the meantime is read as it is.
    fn prefetch(&self, keys: &Keys, hash: u64, stage: u8) {
        if self.slots.is_empty() {
            return;
        }
        let (i, tag) = self.home(hash);
        if stage == PREFETCH_SLOT {
            prefetch_index::prefetch_index(&self.slots, i);
            return;
        }
        let s = self.slots.get(i).copied().unwrap_or(0);
        if s == 0 || s & !0xffff_ffff != tag {
            return;
        }
        let id = (s as u32).wrapping_sub(1) as usize;
        if stage == PREFETCH_ENDS {
            prefetch_index::prefetch_index(&keys.ends, id.saturating_sub(1));
        } else if let Some(&end) = keys.ends.get(id) {
            let start = id
                .checked_sub(1)
                .and_then(|j| keys.ends.get(j).copied())
                .unwrap_or(0);
            prefetch_index::prefetch_index(&keys.bytes, start);
            if end > start + 1 {
                prefetch_index::prefetch_index(&keys.bytes, end - 1);
            }
        }
    }
}

/// How many lookups ahead [`merge`] asks for a lookup's slot, its key's bounds and its key
/// ([`Visited::prefetch`]).
const PREFETCH_SLOT: u8 = 24;
const PREFETCH_ENDS: u8 = 12;
const PREFETCH_KEY: u8 = 4;

/// One successor of an expanded state, as a worker computed it.
struct Succ {
    /// Its key's range in the batch's byte buffer.
    key: std::ops::Range<usize>,
    /// Its key's [`hash_key`] (hashed by the worker, not in the serial merge).
    hash: u64,
    mv: Move,
    /// [`class`] of the move.
    class: u8,
}

// ---- liveness under weak fairness ---------------------------------------------------------

/// A move outside the liveness graph: it needs a person, or is a failure.
const NOT_ALONE: u8 = 0;
/// The environment recovering (a node coming back, etcd catching up, a PDB lifting, a
/// snapshot taken): possible, never obliged.
const RECOVERY: u8 = 1;
/// The first class of the controller's steps, which weak fairness obliges (a step that
/// stays enabled is eventually taken): each kind of step is a class from here on.
const FAIR: u8 = 2;
/// Classes of the controller's steps, bit `class - FAIR` of a mask.
const COMMIT: u8 = FAIR;
const APPLY: u8 = FAIR + 1;
const PROBE: u8 = FAIR + 2;
const REMOVAL: u8 = FAIR + 3;
const OPERATION: u8 = FAIR + 4;
const TEARDOWN: u8 = FAIR + 5;
const COLLECT: u8 = FAIR + 6;
/// Bit of a state's mask ([`Graph::always`]) set when one of its moves in the liveness
/// graph adds a machine or an operation (the refinement of [`fair_livelock`] is sound only
/// where the subjects of the steps stay the same).
const GROWS: u16 = 1 << 15;

/// Which class a move is of, for the liveness check ([`NOT_ALONE`], [`RECOVERY`], or a
/// controller step, [`FAIR`] and up). The moves of the graph are those of
/// [`Move::progresses_alone`].
fn class(mv: &Move) -> u8 {
    if !mv.progresses_alone() {
        return NOT_ALONE;
    }
    match mv {
        Move::Commit(_) => COMMIT,
        Move::Apply(_) => APPLY,
        Move::Probe(_) => PROBE,
        Move::Removal(_) => REMOVAL,
        Move::Operation(_) => OPERATION,
        Move::Teardown => TEARDOWN,
        Move::Admit { .. } => COLLECT,
        Move::NodeReturns(_) | Move::EtcdCatchesUp(_) | Move::PdbLifts | Move::SnapshotTaken => {
            RECOVERY
        }
        // Failures, time passing and what people do: not in the graph
        // (`progresses_alone` said so).
        Move::RemovalLost(_)
        | Move::RemovalCrash(_)
        | Move::RemovalRefused(_)
        | Move::OperationLost(_)
        | Move::OperationCrash(_)
        | Move::OperationRefused(_)
        | Move::NodeDies(_)
        | Move::UpgradeNotTaken(_)
        | Move::NodeReturnsBehind(_)
        | Move::PdbBlocks
        | Move::LockExpires
        | Move::SnapshotAges
        // Time passing (`--clock`): a step outlasting its `within` is the environment's,
        // never obliged and never progress; what it leads to is checked in its own turn.
        | Move::TimePasses(_) => NOT_ALONE,
    }
}

/// The first transition of a chunk, in id order, that broke an invariant: all the merge
/// can report of that invariant from the chunk (the first violation in id order is the
/// one reported), so a chunk holds at most one message per invariant, however many of its
/// transitions break it.
struct FirstBroken {
    /// The state's position in the chunk (in id order).
    state: usize,
    /// The transition's index in the chunk's `succ`.
    succ: usize,
    message: String,
}

/// One state of a batch, expanded.
struct Expanded {
    progress: bool,
    goal: bool,
    /// The same for operations: one in progress, and whether this state is a goal for
    /// them (none in progress, or each waits on something named).
    op_progress: bool,
    op_goal: bool,
    cut: bool,
    /// The request budget is spent here.
    spent: bool,
    /// [`super::model::Outcomes::cure_blocked`].
    cure_blocked: bool,
    /// [`always`] of the state.
    always: u16,
    succ: std::ops::Range<usize>,
}

/// What a worker hands back for its share of a batch.
#[derive(Default)]
struct Chunk {
    states: Vec<Expanded>,
    succ: Vec<Succ>,
    bytes: Vec<u8>,
    fired: super::model::Fired,
    at_risk: Vec<bool>,
    /// Per invariant, the first transition that broke it.
    broken: Vec<Option<FirstBroken>>,
    transitions: u64,
}

/// Pieces each worker's share of a batch is cut into (taken by whichever worker is free).
const PIECES_PER_THREAD: usize = 4;

/// States expanded per batch (their successors are merged, in order, after each batch).
const BATCH: usize = 4096;

/// The states of a batch, copied for the workers: their keys and depths (index 0 is the
/// batch's first state).
#[derive(Default)]
struct Batch {
    keys: Keys,
    depth: Vec<u32>,
}

/// Expands the states `ids` of `batch`: their successors, canonical and encoded,
/// and the invariants each transition breaks (skipping those in `skip`).
/// Whether states are expanded through [`Acts`]: with requests in flight, which states
/// differ in that the controller does not see. (Under a budget of requests alone, the
/// states that differ only in the count are too far apart in the search to share.)
fn lifting(model: &Model<'_>) -> bool {
    model.bounds.in_flight > 0
}

fn expand(
    model: &Model<'_>,
    checks: &[InvariantCheck],
    skip: &[bool],
    batch: &Batch,
    ids: std::ops::Range<usize>,
    worker: &mut Worker,
    spare: Option<Chunk>,
) -> Chunk {
    let Worker {
        verdicts,
        memos,
        acts,
        decoded,
    } = worker;
    let lifting = lifting(model);
    // The buffers of an earlier batch's chunk, emptied (growing fresh ones every batch
    // costs the kernel's zeroing of their pages again).
    let mut out = spare.unwrap_or_default();
    out.states.clear();
    out.succ.clear();
    out.bytes.clear();
    out.fired = super::model::Fired::default();
    out.at_risk.clear();
    out.at_risk.resize(checks.len(), false);
    out.broken.clear();
    out.broken.resize_with(checks.len(), || None);
    out.transitions = 0;
    let mut nexts: Vec<Next> = Vec::new();
    let mut buf = Vec::new();
    let mut scratch = Scratch::default();
    let mut pending_scratch = (Vec::new(), Vec::new());
    // The canonical successor, written over (its lists keep their allocations).
    let mut canon: Option<State> = None;
    // The states in the order of their objects ([`object_key`]), so that states with the
    // same objects are expanded one after another and share their snapshot and the
    // decisions that read only it ([`Memo`]). Each state's successors keep their order and
    // the states are handed back in id order, so nothing else depends on this order.
    let ids: Vec<usize> = ids.collect();
    let states: Vec<Option<State>> = ids
        .iter()
        .map(|i| {
            let b = batch.keys.get(*i)?;
            match decoded.pop() {
                Some(mut st) => decode_into(b, &mut st).map(|()| st),
                None => decode(b),
            }
        })
        .collect();
    let mut object_keys = Vec::new();
    let mut ranges = Vec::with_capacity(states.len());
    for s in &states {
        let start = object_keys.len();
        if let Some(s) = s {
            object_key(s, &mut buf);
            object_keys.extend_from_slice(&buf);
        }
        ranges.push(start..object_keys.len());
    }
    // And as the controller sees them ([`unseen_into`]), so that states it sees alike are
    // expanded one after another too, and share its successors ([`Acting`]).
    let mut unseen_keys = Vec::new();
    let mut unseen_ranges = Vec::with_capacity(if lifting { states.len() } else { 0 });
    let mut unseen: Option<State> = None;
    if lifting {
        for s in &states {
            let start = unseen_keys.len();
            if let Some(s) = s {
                let u = unseen.get_or_insert_with(|| s.clone());
                unseen_into(s, u);
                encode(u, &mut buf);
                unseen_keys.extend_from_slice(&buf);
                unseen_keys.extend_from_slice(&u.names);
            }
            unseen_ranges.push(start..unseen_keys.len());
        }
    }
    let key = |p: usize| &object_keys[ranges[p].clone()];
    let unseen_key = |p: usize| {
        unseen_ranges
            .get(p)
            .map_or(&[][..], |r| &unseen_keys[r.clone()])
    };
    // Sorted by the keys' hashes: equal keys are next to each other all the same (two keys
    // of one hash may interleave, which only costs a memo switch).
    let mut order: Vec<(u64, u64, usize)> = (0..states.len())
        .map(|p| (hash_key(key(p)), hash_key(unseen_key(p)), p))
        .collect();
    order.sort_unstable();
    // The [`Acting`] of the state expanded last (its position), when lifting.
    let mut acting: Option<(usize, Acting)> = None;
    let mut expanded: Vec<Option<Expanded>> = (0..states.len()).map(|_| None).collect();
    let mut memo = Memo::default();
    let mut shared: Option<(usize, Lazy<'_>)> = None;
    for (_, _, p) in order {
        let i = ids[p];
        let from = out.succ.len();
        let Some(s) = &states[p] else {
            expanded[p] = Some(Expanded {
                progress: false,
                goal: true,
                op_progress: false,
                op_goal: true,
                cut: false,
                spent: false,
                cure_blocked: false,
                always: 0,
                succ: from..from,
            });
            continue;
        };
        let progress = s.cluster == ClusterState::Deleting
            || s.machines.iter().any(|m| m.deleting && m.finalizer);
        // Operations in progress: pending, parked or running (a gone TalosCluster's are
        // left to it: nothing of the controller runs for a cluster that is not there).
        let ops = if s.cluster == ClusterState::Gone {
            0
        } else {
            s.ops
                .iter()
                .filter(|o| matches!(o.phase, Phase::Pending | Phase::Parked | Phase::Running))
                .count()
        };
        if batch.depth.get(i).copied().unwrap_or(0) >= model.bounds.depth {
            // Not expanded: nothing can be said of where it leads (counted as a cut).
            expanded[p] = Some(Expanded {
                progress,
                goal: true,
                op_progress: ops > 0,
                op_goal: true,
                cut: true,
                spent: false,
                cure_blocked: false,
                always: 0,
                succ: from..from,
            });
            continue;
        }
        if shared.as_ref().is_none_or(|(q, _)| key(*q) != key(p)) {
            if let Some((q, _)) = &shared {
                memos.keep(key(*q), std::mem::take(&mut memo));
            }
            memo = memos.take(key(p));
            shared = Some((p, Lazy::new(&model.objects, s)));
        }
        let Some((_, snap)) = &shared else {
            continue;
        };
        nexts.clear();
        let outcomes = if lifting {
            if acting
                .as_ref()
                .is_none_or(|(q, _)| unseen_key(*q) != unseen_key(p))
            {
                if let Some((q, a)) = acting.take() {
                    acts.keep(unseen_key(q), a);
                }
                let a = match acts.take(unseen_key(p)) {
                    Some(a) => a,
                    None => {
                        let u = unseen.get_or_insert_with(|| s.clone());
                        unseen_into(s, u);
                        let mut v = Vec::new();
                        let outcomes = model.acting(u, snap, &mut memo, &mut out.fired, &mut v);
                        let before = Facts::of_state(u);
                        let mut bytes = Vec::new();
                        let nexts = v
                            .iter()
                            .map(|n| {
                                let how = renumbering(u, n.mv, &n.state)?;
                                let c = canon.get_or_insert_with(|| n.state.clone());
                                let work = (c, &mut scratch);
                                Some(Lifted::of(u, n, how, &before, work, &mut bytes))
                            })
                            .collect();
                        for n in v {
                            n.state.recycle();
                        }
                        Acting {
                            outcomes,
                            nexts,
                            bytes,
                        }
                    }
                };
                acting = Some((p, a));
            }
            model.people(s, snap, &mut memo, &mut out.fired, &mut nexts);
            match &acting {
                Some((_, a)) if a.nexts.is_some() => a.outcomes,
                _ => model.acting(s, snap, &mut memo, &mut out.fired, &mut nexts),
            }
        } else {
            model.successors(s, snap, &mut memo, &mut out.fired, &mut nexts)
        };
        // The controller's and the world's successors kept for what `s` looks like to them,
        // after the people's (the order [`Model::successors`] gives them in).
        let (lifted, lifted_bytes): (&[Lifted], &[u8]) = match &acting {
            Some((_, a)) if lifting => (a.nexts.as_deref().unwrap_or(&[]), &a.bytes),
            _ => (&[], &[]),
        };
        // Settled: every removal in progress waits on something named, and nothing else
        // of a teardown is left for the controller or the garbage collector.
        let removals = s
            .machines
            .iter()
            .filter(|m| m.deleting && m.finalizer)
            .count();
        let uncollected = s.cluster == ClusterState::Deleting
            && (s.machines.iter().all(|m| m.moved)
                || s.machines.iter().any(|m| !m.deleting && !m.moved));
        let settled =
            removals > 0 && usize::from(outcomes.removals_waiting) >= removals && !uncollected;
        let before = Facts::of_state(s);
        let always = always(
            s,
            nexts
                .iter()
                .map(|n| (n.mv, grows(s, &n.state)))
                .chain(lifted.iter().map(|l| (l.mv, l.grows))),
        );
        #[cfg(test)]
        let mut made: Vec<(Move, Vec<u8>, Facts)> = Vec::new();
        for n in nexts.drain(..) {
            let c = canon.get_or_insert_with(|| n.state.clone());
            canonical_into(&n.state, c, &mut scratch);
            let start = out.bytes.len();
            encode_onto(c, &mut out.bytes);
            let f = Facts::of_transition(&before, c, &n.effect);
            #[cfg(test)]
            made.push((n.mv, out.bytes[start..].to_vec(), f));
            emit(
                &mut out,
                verdicts,
                checks,
                skip,
                p,
                start,
                n.mv,
                &f,
                c.concurrent,
            );
            n.state.recycle();
        }
        for l in lifted {
            let start = out.bytes.len();
            l.key_of(lifted_bytes, s, &mut pending_scratch, &mut out.bytes);
            #[cfg(test)]
            made.push((l.mv, out.bytes[start..].to_vec(), l.facts));
            emit(
                &mut out,
                verdicts,
                checks,
                skip,
                p,
                start,
                l.mv,
                &l.facts,
                s.concurrent,
            );
        }
        #[cfg(test)]
        if lifting {
            // Every lifted successor is the one computed on the state itself: the same
            // move, canonical key and facts.
            let mut direct = Vec::new();
            let o = model.successors(s, snap, &mut memo, &mut out.fired, &mut direct);
            assert_eq!(o, outcomes, "lifted outcomes of {s:?}");
            let direct: Vec<(Move, Vec<u8>, Facts)> = direct
                .iter()
                .map(|d| {
                    let c = canonical(&d.state);
                    let mut key = Vec::new();
                    encode(&c, &mut key);
                    (d.mv, key, Facts::of_transition(&before, &c, &d.effect))
                })
                .collect();
            assert_eq!(direct, made, "lifted successors of {s:?}");
        }
        expanded[p] = Some(Expanded {
            progress,
            goal: !progress || settled,
            op_progress: ops > 0,
            op_goal: usize::from(outcomes.ops_waiting) >= ops,
            cut: false,
            spent: model.budget_spent(s),
            cure_blocked: outcomes.cure_blocked.is_some(),
            always,
            succ: from..out.succ.len(),
        });
    }
    if let Some((q, _)) = shared.take() {
        memos.keep(key(q), memo);
    }
    if let Some((q, a)) = acting {
        acts.keep(unseen_key(q), a);
    }
    decoded.extend(states.into_iter().flatten());
    // (Every position was filled above: each state is expanded once.)
    out.states = expanded.into_iter().flatten().collect();
    out
}

/// Whether `t`, a successor of `s`, has a machine or an operation more.
fn grows(s: &State, t: &State) -> bool {
    t.machines.len() > s.machines.len() || t.ops.len() > s.ops.len()
}

/// A transition of the state at position `p` of the batch, to the successor whose key was
/// just written at `out.bytes[start..]`, by `mv`, with facts `f`: counted, its invariants
/// checked (those in `skip` left out), and added to the state's successors.
#[allow(clippy::too_many_arguments)]
fn emit(
    out: &mut Chunk,
    verdicts: &mut Verdicts,
    checks: &[InvariantCheck],
    skip: &[bool],
    p: usize,
    start: usize,
    mv: Move,
    f: &Facts,
    concurrent: bool,
) {
    out.transitions += 1;
    let hash = hash_key(&out.bytes[start..]);
    let checked = verdicts.check(checks, skip, f, concurrent);
    let skipped = |k: usize| skip.get(k).copied().unwrap_or(false);
    for k in checked.at_risk.iter() {
        if let Some(r) = out.at_risk.get_mut(k)
            && !skipped(k)
        {
            *r = true;
        }
    }
    // Only the first breaking transition in id order (states earlier in the chunk first;
    // within a state, its transitions in order) keeps its message.
    for k in checked.broken.iter().filter(|k| !skipped(*k)) {
        let (Some(slot), Some(check)) = (out.broken.get_mut(k), checks.get(k)) else {
            continue;
        };
        if slot.as_ref().is_some_and(|b| b.state <= p) {
            continue;
        }
        if let super::invariant::Outcome::Broken(message) = check.holds(f, concurrent) {
            *slot = Some(FirstBroken {
                state: p,
                succ: out.succ.len(),
                message,
            });
        }
    }
    out.succ.push(Succ {
        key: start..out.bytes.len(),
        hash,
        mv,
        class: class(&mv),
    });
}

/// The controller's steps enabled in `s` for every one of their subjects (every machine not
/// being deleted, every one being removed, every unfinished operation; the teardown, which
/// has none),
/// as a mask of classes (bit
/// `class - FAIR`), and [`GROWS`] when a move of the liveness graph adds a machine or an
/// operation. Commits are left out: the requests in flight come and go.
/// (`nexts`: each successor's move, and whether it [`grows`] the state.)
fn always(s: &State, nexts: impl Iterator<Item = (Move, bool)>) -> u16 {
    let mut machines = [0u64; 8];
    let mut ops = 0u64;
    let mut mask = 0u16;
    let bit = |i: u8| 1u64.checked_shl(u32::from(i)).unwrap_or(0);
    for (mv, grows) in nexts {
        let c = class(&mv);
        if c == NOT_ALONE {
            continue;
        }
        if grows {
            mask |= GROWS;
        }
        match mv {
            Move::Apply(i)
            | Move::Probe(i)
            | Move::Removal(i)
            | Move::Admit {
                req: Req::Collect(i),
                ..
            } => {
                if let Some(m) = machines.get_mut(usize::from(c - FAIR)) {
                    *m |= bit(i);
                }
            }
            Move::Operation(i) => ops |= bit(i),
            Move::Teardown => mask |= 1 << (TEARDOWN - FAIR),
            _ => {}
        }
    }
    // A class's subjects: the machines not being deleted (an apply, a probe, the garbage
    // collector's deletion), or those being deleted whose finalizer is still there (a
    // removal). Deletion and the finalizer's release go one way only, so inside a strongly
    // connected set of states each class has the same subjects throughout.
    let (mut live, mut removing) = (0u64, 0u64);
    for (i, m) in ix(&s.machines) {
        if !m.deleting {
            live |= bit(i);
        } else if m.finalizer {
            removing |= bit(i);
        }
    }
    for (c, subjects) in [
        (APPLY, live),
        (PROBE, live),
        (COLLECT, live),
        (REMOVAL, removing),
    ] {
        if subjects != 0 && machines[usize::from(c - FAIR)] & subjects == subjects {
            mask |= 1 << (c - FAIR);
        }
    }
    // An operation's reconciles: those not finished (a finished one stays finished without
    // a person).
    let unfinished = ix(&s.ops)
        .filter(|(_, o)| matches!(o.phase, Phase::Pending | Phase::Parked | Phase::Running))
        .fold(0u64, |a, (i, _)| a | bit(i));
    if unfinished != 0 && ops & unfinished == unfinished {
        mask |= 1 << (OPERATION - FAIR);
    }
    mask
}

/// How many threads expand states: the machine's parallelism (at most 8), or
/// `ICHOR_VERIFY_THREADS` when set.
pub fn threads() -> usize {
    std::env::var("ICHOR_VERIFY_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .min(8)
}

/// Explores every state reachable from the starting states within the bounds.
///
/// Breadth-first, in batches: the states of a batch are expanded in parallel and their
/// successors merged in the order a single thread would have found them, so ids, parents,
/// the shortest traces and every report are the same whatever the number of threads.
pub fn explore(model: &Model<'_>, checks: &[InvariantCheck]) -> Exploration {
    explore_within(model, checks, &Budget::unlimited(), threads())
}

/// [`explore`] within a memory budget, with `threads` threads: an exploration that would
/// pass the budget stops before it does, and says how far it got (it proves nothing then).
pub fn explore_within(
    model: &Model<'_>,
    checks: &[InvariantCheck],
    budget: &Budget,
    threads: usize,
) -> Exploration {
    explore_upto(model, checks, threads, BATCH, NO_PARENT, budget)
}

/// [`explore`] with a given number of threads.
pub fn explore_with(model: &Model<'_>, checks: &[InvariantCheck], threads: usize) -> Exploration {
    explore_in(model, checks, threads, BATCH)
}

/// [`explore_with`] expanding `batch` states per thread at a time.
fn explore_in(
    model: &Model<'_>,
    checks: &[InvariantCheck],
    threads: usize,
    batch: usize,
) -> Exploration {
    explore_upto(
        model,
        checks,
        threads,
        batch,
        NO_PARENT,
        &Budget::unlimited(),
    )
}

/// The bytes of a vector's buffer.
fn held<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * std::mem::size_of::<T>()) as u64
}

/// The buffer a vector allocates if `more` elements are pushed (its old one is held until
/// they are copied), or 0 when they fit.
fn growth<T>(v: &Vec<T>, more: usize) -> u64 {
    if v.len() + more <= v.capacity() {
        return 0;
    }
    ((v.len() + more).max(2 * v.capacity()) * std::mem::size_of::<T>()) as u64
}

/// How much memory the exploration holds (its big structures), and how much more it may
/// need before it finishes: the next growth of each structure, if `states`, `edges` and
/// `bytes` more are numbered, and the liveness check after the exploration (which
/// reverses the edges).
fn memory(
    ex: &Exploration,
    visited: &Visited,
    graph: &Graph,
    states: usize,
    edges: usize,
    bytes: usize,
) -> (u64, u64) {
    let held = held(&ex.keys.bytes)
        + held(&ex.keys.ends)
        + held(&ex.parent)
        + held(&ex.depth)
        + held(&visited.hashes)
        + held(&visited.slots)
        + held(&graph.in_progress)
        + held(&graph.goal)
        + held(&graph.op_in_progress)
        + held(&graph.op_goal)
        + held(&graph.blocked)
        + held(&graph.always)
        + held(&graph.alone)
        + held(&graph.classes);
    // A table that grows holds its old slots until the new ones are filled.
    let table = if Visited::slots_for(visited.len + states) > visited.slots.len() {
        Visited::slots_for(visited.len + states) as u64 * 8
    } else {
        0
    };
    let next = growth(&ex.keys.bytes, bytes)
        + growth(&ex.keys.ends, states)
        + growth(&ex.parent, states)
        + growth(&ex.depth, states)
        + growth(&visited.hashes, states)
        + table
        + growth(&graph.in_progress, states)
        + growth(&graph.goal, states)
        + growth(&graph.op_in_progress, states)
        + growth(&graph.op_goal, states)
        + growth(&graph.blocked, states)
        + growth(&graph.always, states)
        + growth(&graph.alone, edges)
        + growth(&graph.classes, edges);
    // The liveness check ([`Csr::of`], [`fair_stuck`]): while the adjacency list is made,
    // its starts and fill pointers (4 bytes a state each) and its targets and classes (5
    // bytes an edge) beside the edges as recorded (9 bytes an edge, held, freed then);
    // after, per kind of work, Tarjan's index, low links and two stacks (20 bytes a state
    // at worst) and a verdict (a byte), the first kind's verdicts and components kept (5
    // bytes a state).
    let (n, e) = (
        (ex.keys.len() + states) as u64,
        (graph.alone.len() + edges) as u64,
    );
    let making = 8 * n + 5 * e;
    let judging = (30 * n + 5 * e).saturating_sub(9 * e);
    let liveness = making.max(judging);
    (held, next + liveness)
}

/// Why an exploration stopped at its memory budget, with how far it got.
fn over_budget(ex: &Exploration, over: Over) -> String {
    format!(
        "the memory budget of {} (--max-memory) would be passed: {} in use and {} more needed \
         to go on and finish, with {} distinct states numbered (to depth {}): exploration \
         stopped before the bounds were explored, so nothing was proved; lower the bounds \
         (--max-control-planes, --max-workers, --max-failures, --max-operations, --in-flight, \
         --max-requests) or --depth, or raise --max-memory",
        show(over.limit),
        show(over.used),
        show(over.reserved),
        ex.keys.len(),
        ex.depth.last().copied().unwrap_or(0),
    )
}

/// [`explore_in`] numbering at most `limit` states, within `budget`.
fn explore_upto(
    model: &Model<'_>,
    checks: &[InvariantCheck],
    threads: usize,
    batch: usize,
    limit: u32,
    budget: &Budget,
) -> Exploration {
    let threads = threads.max(1);
    let batch = batch.max(1);
    let started = Instant::now();
    let mut share = budget.share();
    // One cache of invariant outcomes per thread, kept from batch to batch.
    // What each thread keeps from batch to batch: its caches and its chunk's buffers.
    let mut workers: Vec<Worker> = (0..threads).map(|_| Worker::default()).collect();
    let mut visited = Visited::new(limit);
    let mut ex = Exploration {
        keys: Keys::default(),
        parent: Vec::new(),
        depth: Vec::new(),
        transitions: 0,
        max_depth: 0,
        cut_at_depth: 0,
        cut_by_requests: 0,
        violations: Vec::new(),
        fired: Default::default(),
        at_risk: vec![false; checks.len()],
        seconds: 0.0,
        stuck: 0,
        threads,
        incomplete: None,
    };
    let mut violated = vec![false; checks.len()];
    let mut buf = Vec::new();
    for s in State::initial(&model.bounds) {
        let c = canonical(&s);
        encode(&c, &mut buf);
        let Some((id, new)) = visited.intern(&mut ex.keys, &buf) else {
            ex.incomplete = Some(FULL.to_string());
            break;
        };
        if !new {
            continue;
        }
        ex.parent.push(NO_PARENT);
        ex.depth.push(0);
        let f = Facts::of_state(&c);
        for (k, check) in checks.iter().enumerate() {
            if check.deferred || violated[k] {
                continue;
            }
            match check.holds(&f, c.concurrent) {
                super::invariant::Outcome::Holds { at_risk } => ex.at_risk[k] |= at_risk,
                super::invariant::Outcome::Broken(message) => {
                    violated[k] = true;
                    ex.at_risk[k] = true;
                    ex.violations.push(Violation {
                        invariant: k,
                        from: id,
                        to_key: None,
                        mv: None,
                        message,
                        depth: 0,
                        lasso: Vec::new(),
                        loop_at: None,
                    });
                }
            }
        }
    }
    // The batches are pipelined: while the workers expand one batch (from copies of its
    // keys), this thread merges the batch before it, whenever the states already numbered
    // reach that far (a breadth-first frontier almost always does). Merging stays serial
    // and in batch order, so ids, parents, traces and reports are what one thread finds.
    let mut cursor = 0usize;
    let mut graph = Graph::default();
    let mut copied = Batch::default();
    // The expanded batch not merged yet: its first id, and its chunks in id order.
    let mut unmerged: Option<(usize, Vec<Chunk>)> = None;
    // Merged chunks, whose buffers the next batch's pieces are written into (growing fresh
    // ones every batch costs the kernel's zeroing of their pages again).
    let mut spares: Vec<Chunk> = Vec::new();
    // What the last merge added (states, edges, key bytes): what the next ones may add is
    // reserved, twice over.
    let mut numbered = (ex.keys.len(), 0usize, ex.keys.bytes.len());
    while ex.incomplete.is_none() {
        let added = (
            ex.keys.len() - numbered.0,
            graph.alone.len() - numbered.1,
            ex.keys.bytes.len() - numbered.2,
        );
        numbered = (ex.keys.len(), graph.alone.len(), ex.keys.bytes.len());
        let (held, more) = memory(
            &ex,
            &visited,
            &graph,
            2 * added.0 + 2 * batch * threads,
            2 * added.1,
            2 * added.2,
        );
        // The workers' caches are bounded; what they may still take is reserved too.
        let caches: u64 = workers
            .iter()
            .map(|w| {
                w.memos.headroom()
                    + w.verdicts.headroom()
                    + if lifting(model) { w.acts.headroom() } else { 0 }
            })
            .sum();
        if let Err(over) = share.check(held, more + caches) {
            ex.incomplete = Some(over_budget(&ex, over));
            break;
        }
        if cursor >= ex.keys.len() {
            // Nothing numbered is left to expand before the last batch is merged.
            match unmerged.take() {
                Some((first, mut chunks)) => {
                    merge(
                        &mut ex,
                        &mut visited,
                        &mut violated,
                        &mut graph,
                        first,
                        &mut chunks,
                    );
                    spares.extend(chunks);
                    continue;
                }
                None => break,
            }
        }
        let end = ex.keys.len().min(cursor + batch * threads);
        // What the workers read, copied: the merge appends to the keys meanwhile.
        copied.keys.bytes.clear();
        copied.keys.ends.clear();
        for i in cursor..end {
            copied.keys.push(&ex.keys[i]);
        }
        copied.depth.clear();
        copied.depth.extend_from_slice(&ex.depth[cursor..end]);
        // Invariants already violated are not checked again (one being violated in the
        // merge running alongside is checked, and its outcome dropped there).
        let skip = violated.clone();
        let n = end - cursor;
        let (copied, skip) = (&copied, &skip);
        let mut merged: Option<Vec<Chunk>> = None;
        let chunks: Vec<Chunk> = if threads == 1 || n < threads {
            if let Some((first, mut chunks)) = unmerged.take() {
                merge(
                    &mut ex,
                    &mut visited,
                    &mut violated,
                    &mut graph,
                    first,
                    &mut chunks,
                );
                merged = Some(chunks);
            }
            match workers.split_first_mut() {
                Some((worker, _)) => {
                    vec![expand(
                        model,
                        checks,
                        skip,
                        copied,
                        0..n,
                        worker,
                        spares.pop(),
                    )]
                }
                None => Vec::new(),
            }
        } else {
            // The batch in pieces, taken by whichever worker is free (states differ in
            // cost, so halves would leave one core waiting for the other).
            let size = n.div_ceil(threads * PIECES_PER_THREAD);
            let next = std::sync::atomic::AtomicUsize::new(0);
            let next = &next;
            let pooled = std::sync::Mutex::new(std::mem::take(&mut spares));
            let pool = &pooled;
            let spare = |pool: &std::sync::Mutex<Vec<Chunk>>| pool.lock().ok()?.pop();
            let previous = unmerged.take();
            let (ex, visited, violated, graph) = (&mut ex, &mut visited, &mut violated, &mut graph);
            let chunks = std::thread::scope(|scope| {
                let handles: Vec<_> = workers
                    .iter_mut()
                    .map(|worker| {
                        scope.spawn(move || {
                            let mut done = Vec::new();
                            loop {
                                let p = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let a = p.saturating_mul(size).min(n);
                                if a >= n {
                                    break done;
                                }
                                let b = (a + size).min(n);
                                done.push((
                                    p,
                                    expand(model, checks, skip, copied, a..b, worker, spare(pool)),
                                ));
                            }
                        })
                    })
                    .collect();
                if let Some((first, mut chunks)) = previous {
                    merge(ex, visited, violated, graph, first, &mut chunks);
                    merged = Some(chunks);
                }
                // A thread that panicked expanded only part of its states: carry on without
                // them and the exploration would claim what it did not explore (and number
                // the later states wrong). The run fails instead, and `verify` says so.
                let mut pieces: Vec<(usize, Chunk)> = handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect();
                pieces.sort_by_key(|(p, _)| *p);
                pieces.into_iter().map(|(_, c)| c).collect()
            });
            // The buffers no piece took.
            spares = pooled.into_inner().unwrap_or_default();
            chunks
        };
        // The merged chunks' buffers are used again for the next batch.
        spares.extend(merged.into_iter().flatten());
        unmerged = Some((cursor, chunks));
        cursor = end;
    }
    // The visited set is not needed any more: its memory goes to the liveness check.
    drop(visited);
    let Graph {
        in_progress,
        goal,
        op_in_progress,
        op_goal,
        blocked,
        always,
        alone,
        classes,
    } = graph;
    // Liveness under weak fairness of the controller ([`fair_stuck`]), over the moves that
    // need no person, as one compressed adjacency list.
    let n = ex.keys.len();
    let csr = Csr::of(n, alone, classes);
    let removals = fair_stuck(&csr, &always, &goal);
    drop(goal);
    let operations = fair_stuck(&csr, &always, &op_goal);
    drop(op_goal);
    let deferred: Vec<usize> = (0..checks.len()).filter(|k| checks[*k].deferred).collect();
    for i in 0..n {
        let stuck = in_progress.get(i).copied().unwrap_or(false) && removals.stuck(i);
        let op_stuck = op_in_progress.get(i).copied().unwrap_or(false) && operations.stuck(i);
        if stuck || op_stuck {
            ex.stuck += 1;
        }
        if deferred.is_empty() {
            continue;
        }
        let Some(s) = decode(&ex.keys[i]) else {
            continue;
        };
        let mut f = Facts::of_state(&s);
        f.stuck = stuck;
        f.op_stuck = op_stuck;
        f.cure_blocked = blocked.get(i).copied().unwrap_or(false);
        for &k in &deferred {
            if violated[k] {
                continue;
            }
            match checks[k].holds(&f, s.concurrent) {
                super::invariant::Outcome::Holds { at_risk } => ex.at_risk[k] |= at_risk,
                super::invariant::Outcome::Broken(message) => {
                    violated[k] = true;
                    ex.at_risk[k] = true;
                    let from = u32::try_from(i).unwrap_or(u32::MAX);
                    // Where the work goes that never ends: to a state where the
                    // controller has nothing left to do, or round a livelock.
                    let (lasso, loop_at) = if stuck {
                        removals.lasso(&csr, from)
                    } else if op_stuck {
                        operations.lasso(&csr, from)
                    } else {
                        (Vec::new(), None)
                    };
                    ex.violations.push(Violation {
                        invariant: k,
                        from,
                        to_key: None,
                        mv: None,
                        message,
                        depth: ex.depth[i],
                        lasso,
                        loop_at,
                    });
                }
            }
        }
    }
    ex.violations.sort_by_key(|v| (v.depth, v.invariant));
    // States the depth bound left unexpanded prove nothing about where they lead (the
    // liveness check even took them as finished, so that it reports no false "stuck"):
    // such a run is incomplete, never "verified".
    if ex.cut_at_depth > 0 && ex.incomplete.is_none() {
        ex.incomplete = Some(format!(
            "depth {} reached in {} state(s): exploration was cut there, and what lies beyond \
             (liveness included) is unproved; raise --depth to go further",
            model.bounds.depth, ex.cut_at_depth
        ));
    }
    ex.seconds = started.elapsed().as_secs_f64();
    ex
}

/// The liveness graph (the moves that need no person) as a compressed adjacency list:
/// state `v`'s edges are `to[start[v]..start[v + 1]]`, of classes `class[..]` alike.
struct Csr {
    start: Vec<u32>,
    to: Vec<u32>,
    class: Vec<u8>,
}

impl Csr {
    /// From the edges as the merge recorded them (in the order of their first state),
    /// freeing them as it goes.
    fn of(n: usize, edges: Vec<(u32, u32)>, classes: Vec<u8>) -> Csr {
        let mut start = vec![0u32; n + 1];
        for (a, _) in &edges {
            if let Some(c) = start.get_mut(*a as usize + 1) {
                *c += 1;
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut to = vec![0u32; edges.len()];
        let mut class = vec![NOT_ALONE; edges.len()];
        // The merge numbers states in order, so the edges are in order of their first
        // state already, and each lands where it is.
        let mut fill = start.clone();
        for ((a, b), c) in edges.into_iter().zip(classes) {
            if let Some(slot) = fill.get_mut(a as usize) {
                let at = *slot as usize;
                if let (Some(t), Some(k)) = (to.get_mut(at), class.get_mut(at)) {
                    (*t, *k) = (b, c);
                }
                *slot += 1;
            }
        }
        Csr { start, to, class }
    }

    fn edges(&self, v: usize) -> std::ops::Range<usize> {
        let a = self.start.get(v).copied().unwrap_or(0) as usize;
        let b = self.start.get(v + 1).copied().unwrap_or(0) as usize;
        a..b.max(a)
    }
}

/// A state's verdict for one kind of work ([`fair_stuck`]): every fair run from it reaches
/// a goal.
const FINE: u8 = 0;
/// Stuck: some fair run from it leads to a [`DEAD_END`] or a [`LIVELOCK`].
const LEADS: u8 = 1;
/// Stuck: not a goal, and the controller has no step to take (only the environment's
/// recovery, never obliged, or nothing at all).
const DEAD_END: u8 = 2;
/// Stuck: in a strongly connected set of non-goal states round which a fair run goes
/// forever.
const LIVELOCK: u8 = 3;
/// While a component is judged: its members (and those with no step of the controller).
const MEMBER: u8 = 0xfd;
const MEMBER_DEAD: u8 = 0xfe;
/// Not judged yet.
const OPEN: u8 = 0xff;
/// The bits of the controller's classes in a mask.
const FAIR_BITS: u16 = (1 << (COLLECT - FAIR + 1)) - 1;

/// The verdicts of [`fair_stuck`]: per state, [`FINE`] to [`LIVELOCK`], and its
/// strongly connected component (among the non-goal states).
struct Fairness {
    /// Goals stay [`OPEN`].
    of: Vec<u8>,
    comp: Vec<u32>,
}

/// Liveness under weak fairness of the controller: which states have a fair run that
/// never reaches a goal.
///
/// A run is fair when every step of the controller (a reconcile, the garbage collector, a
/// commit) that stays enabled is eventually taken; the environment's recovery (a node
/// coming back, etcd catching up, a PDB lifting, a snapshot taken) may happen and is never
/// obliged. So a fair run of non-goal states either stops in one where the controller has
/// no step ([`DEAD_END`]: the world may stay as it is) or goes round a strongly connected
/// set of them forever ([`LIVELOCK`]). A state is stuck when such a run starts there.
///
/// For weak fairness the check of a component is exact on a concrete graph: it admits a
/// fair infinite run iff every action is disabled somewhere in it or taken on an edge inside
/// it (a run visiting every state and edge infinitely often is then fair; otherwise the
/// action enabled throughout is never taken by any run that stays in it, nor in any of its
/// parts). The graph here is the symmetry-reduced one, where a move's machine index names a
/// machine in *its* state's canonical order, so "the same action" is not the same index in
/// two states of a component. The check therefore over-approximates fair runs, which is
/// the sound side for a verifier (no fair livelock is missed): a component is taken as
/// admitting a fair run unless a class of the controller's steps (a reconcile of a
/// machine's removal, of an operation, the garbage collector's deletion of a machine, ...)
/// is enabled for *every* one of its subjects in *every* state of it and taken on no edge
/// inside it. Only then is some concrete action surely enabled throughout (the subjects
/// stay the same inside a component: no move of the graph adds a machine or an operation,
/// else [`GROWS`] turns the refinement off, one removed cannot come back, and a machine's
/// deletion and its finalizer's release go one way only) and never taken. Commits are not refined (requests in
/// flight come and go). Any cycle of non-goal states otherwise counts: "stuck" may be said
/// of a component where a finer, per-machine account would find every run unfair, never
/// the other way round.
///
/// One pass of an iterative Tarjan over the non-goal states: a component is finished after
/// every component it reaches, so whether it leads to a stuck one is known when it is judged.
/// Memory: four `u32` a state (index, low link then component, the two stacks at worst)
/// and a byte, besides the graph.
fn fair_stuck(g: &Csr, always: &[u16], goal: &[bool]) -> Fairness {
    const UNSEEN: u32 = u32::MAX;
    let n = always.len();
    let is_goal = |v: usize| goal.get(v).copied().unwrap_or(true);
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut of = vec![OPEN; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut call: Vec<(u32, u32)> = Vec::new();
    let (mut next, mut comps) = (0u32, 0u32);
    for root in 0..n {
        if is_goal(root) || index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root as u32);
        call.push((root as u32, g.edges(root).start as u32));
        while let Some((v, pos)) = call.last_mut() {
            let vi = *v as usize;
            if (*pos as usize) < g.edges(vi).end {
                let w = g.to[*pos as usize] as usize;
                *pos += 1;
                if is_goal(w) {
                    continue;
                }
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w as u32);
                    call.push((w as u32, g.edges(w).start as u32));
                } else if of[w] == OPEN {
                    low[vi] = low[vi].min(index[w]);
                }
                continue;
            }
            call.pop();
            if let Some((p, _)) = call.last() {
                let p = *p as usize;
                low[p] = low[p].min(low[vi]);
            }
            if low[vi] != index[vi] {
                continue;
            }
            // `vi` is the root of a component: its members are on top of the stack.
            let at = stack.iter().rposition(|x| *x as usize == vi).unwrap_or(0);
            let members = &stack[at..];
            for &m in members {
                of[m as usize] = MEMBER;
            }
            let (mut both, mut taken, mut grows) = (u16::MAX, 0u16, false);
            let (mut cycle, mut dead, mut leads) = (members.len() > 1, false, false);
            for &m in members {
                let m = m as usize;
                both &= always[m];
                grows |= always[m] & GROWS != 0;
                let mut steps = false;
                for e in g.edges(m) {
                    let (w, c) = (g.to[e] as usize, g.class[e]);
                    steps |= c >= FAIR;
                    if is_goal(w) {
                        continue;
                    }
                    match of[w] {
                        MEMBER | MEMBER_DEAD => {
                            cycle |= w == m;
                            if c >= FAIR {
                                taken |= 1 << (c - FAIR);
                            }
                        }
                        FINE => {}
                        _ => leads = true,
                    }
                }
                if !steps {
                    of[m] = MEMBER_DEAD;
                    dead = true;
                }
            }
            let livelock = cycle && (grows || both & !taken & FAIR_BITS == 0);
            for &m in members {
                let m = m as usize;
                of[m] = if of[m] == MEMBER_DEAD {
                    DEAD_END
                } else if livelock {
                    LIVELOCK
                } else if dead || leads {
                    LEADS
                } else {
                    FINE
                };
                low[m] = comps;
            }
            comps += 1;
            stack.truncate(at);
        }
    }
    drop(index);
    Fairness { of, comp: low }
}

impl Fairness {
    fn stuck(&self, v: usize) -> bool {
        self.of.get(v).is_some_and(|x| *x != FINE && *x != OPEN)
    }

    /// The states a fair run from the stuck state `from` goes through: to a dead end, or
    /// to a livelock and once round it (`Some(k)`: the states from index `k` on go round
    /// and end where the state before index `k` is, `from` itself when `k` is 0).
    fn lasso(&self, g: &Csr, from: u32) -> (Vec<u32>, Option<usize>) {
        let stops = |v: usize| matches!(self.of.get(v), Some(&DEAD_END | &LIVELOCK));
        let to_end = if stops(from as usize) {
            Some(Vec::new())
        } else {
            self.search(g, from, |w| self.stuck(w), stops)
        };
        let Some(mut path) = to_end else {
            return (Vec::new(), None);
        };
        let end = path.last().copied().unwrap_or(from);
        if self.of.get(end as usize) != Some(&LIVELOCK) {
            return (path, None);
        }
        let comp = self.comp.get(end as usize).copied();
        let inside = |w: usize| self.comp.get(w).copied() == comp && self.stuck(w);
        let round = self.search(g, end, inside, |w| w == end as usize);
        let at = path.len();
        path.extend(round.unwrap_or_default());
        (path, Some(at))
    }

    /// A shortest path of at least one step (the states after `from`) through states where
    /// `through` holds, to one where `stop` holds.
    fn search(
        &self,
        g: &Csr,
        from: u32,
        through: impl Fn(usize) -> bool,
        stop: impl Fn(usize) -> bool,
    ) -> Option<Vec<u32>> {
        let mut parent: std::collections::HashMap<u32, u32> = Default::default();
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(v) = queue.pop_front() {
            for e in g.edges(v as usize) {
                let w = g.to[e];
                let wu = w as usize;
                if !through(wu) || parent.contains_key(&w) {
                    continue;
                }
                parent.insert(w, v);
                if stop(wu) {
                    let mut path = vec![w];
                    let mut at = v;
                    while at != from {
                        path.push(at);
                        at = parent.get(&at).copied().unwrap_or(from);
                    }
                    path.reverse();
                    return Some(path);
                }
                queue.push_back(w);
            }
        }
        None
    }
}

/// What the merge records per state for the liveness check after the exploration.
#[derive(Default)]
struct Graph {
    in_progress: Vec<bool>,
    goal: Vec<bool>,
    op_in_progress: Vec<bool>,
    op_goal: Vec<bool>,
    blocked: Vec<bool>,
    /// Per state: [`always`].
    always: Vec<u16>,
    /// Edges that happen without a person: (from, to).
    alone: Vec<(u32, u32)>,
    /// The [`class`] of each edge of `alone`.
    classes: Vec<u8>,
}

/// Merges an expanded batch whose first state is `first`, in id order: numbers its new
/// successors, records parents, depths, the liveness graph and the first violation of each
/// invariant. Sets `ex.incomplete` (and stops) when the ids run out.
fn merge(
    ex: &mut Exploration,
    visited: &mut Visited,
    violated: &mut [bool],
    graph: &mut Graph,
    first: usize,
    chunks: &mut [Chunk],
) {
    let mut id = first;
    for chunk in chunks.iter_mut() {
        let chunk_first = id;
        ex.transitions += chunk.transitions;
        for (k, r) in chunk.at_risk.iter().enumerate() {
            if let Some(a) = ex.at_risk.get_mut(k) {
                *a |= *r;
            }
        }
        ex.fired.merge(std::mem::take(&mut chunk.fired));
        // The successors' hashes in the order they are looked up, to ask for their slots
        // and keys ahead ([`Visited::prefetch`]).
        let ahead: Vec<u64> = chunk
            .states
            .iter()
            .flat_map(|st| chunk.succ.get(st.succ.clone()).unwrap_or(&[]))
            .map(|sc| sc.hash)
            .collect();
        let mut g = 0;
        for st in &chunk.states {
            // Every id below `keys.len()` was handed out by `intern`, so it fits.
            let Ok(from) = u32::try_from(id) else {
                ex.incomplete = Some(FULL.to_string());
                return;
            };
            let d = ex.depth.get(id).copied().unwrap_or(0);
            ex.max_depth = ex.max_depth.max(d);
            if st.cut {
                ex.cut_at_depth += 1;
            }
            if st.spent {
                ex.cut_by_requests += 1;
            }
            graph.in_progress.push(st.progress);
            graph.goal.push(st.goal);
            graph.op_in_progress.push(st.op_progress);
            graph.op_goal.push(st.op_goal);
            graph.blocked.push(st.cure_blocked);
            graph.always.push(st.always);
            for sc in &chunk.succ[st.succ.clone()] {
                for stage in [PREFETCH_SLOT, PREFETCH_ENDS, PREFETCH_KEY] {
                    if let Some(&h) = ahead.get(g + usize::from(stage)) {
                        visited.prefetch(&ex.keys, h, stage);
                    }
                }
                g += 1;
                let key = &chunk.bytes[sc.key.clone()];
                let Some((to, new)) = visited.intern_hashed(&mut ex.keys, key, sc.hash) else {
                    ex.incomplete = Some(FULL.to_string());
                    return;
                };
                if new {
                    ex.parent.push(from);
                    ex.depth.push(d + 1);
                }
                if sc.class != NOT_ALONE {
                    graph.alone.push((from, to));
                    graph.classes.push(sc.class);
                }
            }
            id += 1;
        }
        // The first violation of each invariant, in id order (chunks are in id order).
        for (k, b) in chunk.broken.iter_mut().enumerate() {
            let Some(b) = b.take() else {
                continue;
            };
            let (Some(false), Some(sc)) = (violated.get(k).copied(), chunk.succ.get(b.succ)) else {
                continue;
            };
            let at = chunk_first + b.state;
            let (Ok(from), Some(d)) = (u32::try_from(at), ex.depth.get(at).copied()) else {
                continue;
            };
            violated[k] = true;
            ex.violations.push(Violation {
                invariant: k,
                from,
                to_key: chunk.bytes.get(sc.key.clone()).map(<[u8]>::to_vec),
                mv: Some(sc.mv),
                message: b.message,
                depth: d + 1,
                lasso: Vec::new(),
                loop_at: None,
            });
        }
    }
}

/// The ids from a starting state to `id`.
pub fn path_to(ex: &Exploration, id: u32) -> Vec<u32> {
    let mut path = vec![id];
    let mut at = id;
    while let Some(&p) = ex.parent.get(at as usize) {
        if p == NO_PARENT {
            break;
        }
        path.push(p);
        at = p;
    }
    path.reverse();
    path
}

/// The key of a concrete state.
pub fn key_of(s: &State) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(&canonical(s), &mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::model::Bounds;

    /// The visited set numbers keys in the order they first come, finds each again through
    /// its growths, tells apart keys whose hashes collide (whole or in their slot), and
    /// hands out no id at its limit.
    #[test]
    fn the_visited_set_numbers_each_key_once() {
        let mut keys = Keys::default();
        let mut v = Visited::new(5_000);
        let key = |i: u32| {
            let mut k = i.to_le_bytes().to_vec();
            k.extend(std::iter::repeat_n(7u8, (i % 13) as usize));
            k
        };
        // Hashes chosen to collide: every fourth key shares one hash with the key before.
        let hash = |i: u32| hash_key(&key(i - i % 2 * u32::from(i % 4 == 1)));
        for i in 0..3_000 {
            assert_eq!(
                v.intern_hashed(&mut keys, &key(i), hash(i)),
                Some((i, true)),
                "key {i}"
            );
            assert_eq!(
                v.intern_hashed(&mut keys, &key(i), hash(i)),
                Some((i, false))
            );
        }
        assert!(v.slots.len() >= 2 * v.len && v.len == 3_000);
        for i in (0..3_000).rev() {
            assert_eq!(
                v.intern_hashed(&mut keys, &key(i), hash(i)),
                Some((i, false))
            );
            assert_eq!(&keys[i as usize], key(i).as_slice());
        }
        // A key looked up under another hash is not found: the hash picks where it is.
        assert_eq!(v.find(&keys, &key(10), hash(11)).ok(), None);
        let mut small = Visited::new(2);
        let mut k2 = Keys::default();
        assert_eq!(small.intern(&mut k2, b"a"), Some((0, true)));
        assert_eq!(small.intern(&mut k2, b"b"), Some((1, true)));
        assert_eq!(small.intern(&mut k2, b"c"), None);
        assert_eq!(small.intern(&mut k2, b"a"), Some((0, false)));
        assert_eq!(k2.len(), 2);
    }

    #[test]
    fn encoding_round_trips_and_canonical_form_forgets_names() {
        for s in State::initial(&Bounds::default()) {
            let c = canonical(&s);
            let mut b = Vec::new();
            encode(&c, &mut b);
            let d = decode(&b).expect("decodes");
            let mut b2 = Vec::new();
            encode(&d, &mut b2);
            assert_eq!(b, b2);
            // A permutation of the machines is the same state.
            let mut p = s.clone();
            p.machines.reverse();
            p.names.reverse();
            assert_eq!(key_of(&p), key_of(&s));
        }
    }
}

#[cfg(test)]
mod parallel {
    use super::*;
    use crate::verify::invariant::InvariantCheck;
    use crate::verify::model::Bounds;

    /// The shipped rules' folder and table.
    fn shipped() -> (std::path::PathBuf, crate::compile::Table) {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
        let table = crate::ruleset::load(std::slice::from_ref(&root))
            .expect("the shipped rules load")
            .table
            .expect("the shipped rules compile");
        (root, table)
    }

    /// Successors kept for what the controller sees ([`Lifted`]) and written for each state
    /// under its own requests in flight are those computed on the state itself: `expand`
    /// asserts it under `cfg(test)` for every state (the same moves, keys and facts). Here
    /// over a model whose lifted keys carry every part a state's own adds: a count of
    /// requests under a budget, requests in flight, requests that overlapped
    /// (`concurrent`), and a machine removed under them.
    #[test]
    fn lifted_successors_are_the_states_own_under_a_budget_and_overlaps() {
        let (_, table) = shipped();
        let bounds = Bounds {
            max_control_planes: 2,
            max_workers: 1,
            max_failures: 0,
            max_operations: 0,
            in_flight: 1,
            max_requests: Some(3),
            ..Bounds::default()
        };
        let model = Model::new(&table, bounds).expect("bounds a model holds");
        let checks: Vec<InvariantCheck> =
            table.invariants.iter().map(InvariantCheck::new).collect();
        let e = explore_with(&model, &checks, 1);
        let states: Vec<State> = e.keys.iter().filter_map(decode).collect();
        assert_eq!(states.len(), e.keys.len());
        let seen = |f: &dyn Fn(&State) -> bool| states.iter().any(f);
        assert!(seen(&|s| s.requests > 0
            && !s.pending.is_empty()
            && s.concurrent));
        // A machine gone while a request about another machine is in flight.
        assert!(seen(
            &|s| s.machines.len() < 3 && s.pending.iter().any(|p| p.req.machine().is_some())
        ));
    }

    /// An exploration that runs out of state ids stops and says so; it proves nothing, and
    /// `verify` reports it as not verified instead of numbering states wrongly.
    #[test]
    fn running_out_of_state_ids_is_said_and_proves_nothing() {
        let (_, table) = shipped();
        let bounds = Bounds {
            max_control_planes: 2,
            max_workers: 0,
            max_failures: 0,
            max_operations: 0,
            in_flight: 0,
            max_requests: None,
            depth: 64,
            rolls: false,
            roll_width: 1,
            roll_kind: crate::verify::RollKind::Reboot,
            all_kinds: false,
            backups: false,
            lifecycle: false,
            clock: false,
        };
        let model = Model::new(&table, bounds).expect("bounds a model holds");
        let checks: Vec<InvariantCheck> =
            table.invariants.iter().map(InvariantCheck::new).collect();
        let whole = explore_with(&model, &checks, 1);
        assert!(whole.incomplete.is_none());
        assert!(whole.keys.len() > 100, "{}", whole.keys.len());
        for (threads, limit) in [(1, 50u32), (2, 50), (1, 1)] {
            let cut = explore_upto(&model, &checks, threads, 4, limit, &Budget::unlimited());
            let why = cut.incomplete.as_deref().expect("said");
            assert!(why.contains("nothing was proved"), "{why}");
            assert!(cut.keys.len() <= limit as usize);
            assert_eq!(cut.parent.len(), cut.keys.len());
            assert_eq!(cut.depth.len(), cut.keys.len());
        }
        let mut full = crate::verify::verify(&table, bounds).expect("bounds a model holds");
        assert!(full.verified());
        full.exploration.incomplete = Some(FULL.to_string());
        assert!(!full.verified());
    }

    /// Threads change how fast, never what: the same states under the same ids, the same
    /// parents (so the same shortest traces), transitions, violations and coverage.
    /// Small batches (7 states a thread) put every part of the pipeline to work: the merge
    /// of one batch beside the expansion of the next, and pieces of one or two states taken
    /// by whichever thread is free, merged back in id order.
    #[test]
    fn threads_explore_exactly_what_one_thread_explores() {
        let (root, table) = shipped();
        // Without the quorum rule: violations to agree on too.
        let dir = std::env::temp_dir().join(format!("ichor-threads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for f in ["admission.rules", "removal.rules", "invariants.rules"] {
            let mut text = std::fs::read_to_string(root.join(f)).expect("read");
            if let Some(i) = text.find("rule quorum\n") {
                let j = text[i..].find("\n\n").map_or(text.len(), |j| i + j + 2);
                text.replace_range(i..j, "");
            }
            std::fs::write(dir.join(f), text).expect("write");
        }
        let weak = crate::ruleset::load(std::slice::from_ref(&dir))
            .expect("the mutant loads")
            .table
            .expect("the mutant compiles");
        let _ = std::fs::remove_dir_all(&dir);
        for (t, in_flight) in [(&table, 1), (&weak, 0)] {
            let model = Model::new(
                t,
                Bounds {
                    max_control_planes: 2,
                    max_workers: 1,
                    max_failures: 0,
                    max_operations: 0,
                    in_flight,
                    max_requests: None,
                    depth: 64,
                    rolls: false,
                    roll_width: 1,
                    roll_kind: crate::verify::RollKind::Reboot,
                    all_kinds: false,
                    backups: false,
                    lifecycle: false,
                    clock: false,
                },
            )
            .expect("bounds a model holds");
            let checks: Vec<InvariantCheck> =
                t.invariants.iter().map(InvariantCheck::new).collect();
            let one = explore_with(&model, &checks, 1);
            for (n, batch) in [(2, 7), (3, 100)] {
                let many = explore_in(&model, &checks, n, batch);
                assert_eq!(one.keys.len(), many.keys.len());
                assert!(one.keys.iter().eq(many.keys.iter()));
                assert_eq!(one.parent, many.parent);
                assert_eq!(one.depth, many.depth);
                assert_eq!(one.transitions, many.transitions);
                assert_eq!(one.stuck, many.stuck);
                assert_eq!(one.at_risk, many.at_risk);
                assert_eq!(one.fired.rules, many.fired.rules);
                let v = |e: &Exploration| {
                    e.violations
                        .iter()
                        .map(|v| (v.invariant, v.from, v.to_key.clone(), v.depth))
                        .collect::<Vec<_>>()
                };
                assert_eq!(v(&one), v(&many));
            }
            assert!(one.keys.len() > 1_000, "{}", one.keys.len());
            if std::ptr::eq(t, &weak) {
                assert!(!one.violations.is_empty());
            }
        }
    }
}

#[cfg(test)]
mod remembered {
    use super::*;

    /// The kept decisions are bounded, and a key in use survives the generations turning
    /// over while one unused for two generations is forgotten.
    #[test]
    fn memos_keep_what_is_used_and_stay_bounded() {
        let mut memos = Memos::default();
        let marked = |n: u8| {
            let mut m = Memo::default();
            m.mark_held(0, n.is_multiple_of(2));
            m
        };
        memos.keep(b"used", marked(0));
        for i in 0..(Memos::MAX as u32 * 2) {
            memos.keep(&i.to_le_bytes(), marked(1));
            if i.is_multiple_of(1000) {
                let m = memos.take(b"used");
                assert_eq!(m.held_of(0), Some(true), "lost at {i}");
                memos.keep(b"used", m);
            }
            assert!(memos.map.len() + memos.old.len() <= Memos::MAX + 1);
        }
        assert_eq!(memos.take(b"used").held_of(0), Some(true));
        // Unused for two generations: forgotten (a fresh memo).
        assert_eq!(memos.take(&0u32.to_le_bytes()).held_of(0), None);
        // The last ones kept are still there.
        let last = Memos::MAX as u32 * 2 - 1;
        assert_eq!(memos.take(&last.to_le_bytes()).held_of(0), Some(false));
    }
    use crate::verify::invariant::{InvariantCheck, check_all};

    /// Remembered outcomes are the outcomes: over the transitions of a small model (and
    /// the same facts with etcd emptied, which breaks invariants), with and without
    /// overlapping requests, the cache answers what checking afresh answers, the first
    /// time and when it is asked again; and with invariants skipped, it answers the
    /// others alike.
    #[test]
    fn remembered_verdicts_are_the_verdicts() {
        let (table, bounds) = crate::verify::model::tests::small_model();
        let model = Model::new(&table, bounds).expect("model");
        let checks: Vec<InvariantCheck> =
            table.invariants.iter().map(InvariantCheck::new).collect();
        let mut cache = Verdicts::default();
        let (mut asked, mut broken) = (0usize, 0usize);
        crate::verify::model::tests::walk(&model, &bounds, 2000, |s, nexts| {
            let before = Facts::of_state(s);
            for n in nexts {
                let c = canonical(&n.state);
                let f = Facts::of_transition(&before, &c, &n.effect);
                let emptied = Facts {
                    members: 0,
                    healthy: 0,
                    ..f
                };
                // Counts past a byte are not packed: checked afresh, with the same outcome.
                let past = Facts {
                    members: 300,
                    members_before: 300,
                    ..f
                };
                for f in [f, emptied, past] {
                    for concurrent in [false, true] {
                        let fresh = check_all(&checks, &[], &f, concurrent);
                        for _ in 0..2 {
                            assert_eq!(cache.check(&checks, &[], &f, concurrent), &fresh);
                            asked += 1;
                        }
                        broken += fresh.broken.len();
                        // Skipping some: the others' outcomes are the same.
                        let skip: Vec<bool> = (0..checks.len()).map(|k| k % 2 == 0).collect();
                        let partial = check_all(&checks, &skip, &f, concurrent);
                        for k in 0..checks.len() {
                            if k % 2 == 1 {
                                assert_eq!(partial.broken.contains(k), fresh.broken.contains(k));
                                assert_eq!(partial.at_risk.contains(k), fresh.at_risk.contains(k));
                            } else {
                                assert!(
                                    !partial.broken.contains(k) && !partial.at_risk.contains(k)
                                );
                            }
                        }
                    }
                }
            }
        });
        assert!(asked > 10_000, "{asked}");
        assert!(broken > 100, "{broken}");
    }
}

/// Liveness under weak fairness ([`fair_stuck`]) on small graphs made by hand: what the
/// possibility check before it (a goal reachable through moves that need no person) passed.
#[cfg(test)]
mod fairness {
    use super::*;

    /// The graph of `n` states with `edges` (from, to, class), in order of `from`.
    fn graph(n: usize, edges: &[(u32, u32, u8)]) -> Csr {
        let mut edges = edges.to_vec();
        edges.sort_by_key(|e| e.0);
        Csr::of(
            n,
            edges.iter().map(|e| (e.0, e.1)).collect(),
            edges.iter().map(|e| e.2).collect(),
        )
    }

    fn bit(class: u8) -> u16 {
        1 << (class - FAIR)
    }

    /// The possibility check this one replaced: a goal reachable at all.
    fn reaches_goal(g: &Csr, goal: &[bool], from: usize) -> bool {
        let mut seen = vec![false; goal.len()];
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            if goal[v] {
                return true;
            }
            if std::mem::replace(&mut seen[v], true) {
                continue;
            }
            stack.extend(g.edges(v).map(|e| g.to[e] as usize));
        }
        false
    }

    /// Two removals' reconciles hand the work back and forth (0 -> 1 -> 0) and never end
    /// it, although in state 0 an apply would reach the goal (2): that apply is not enabled
    /// in state 1, so weak fairness does not oblige it, and the loop is a fair run. The
    /// possibility check passed it; now it is a livelock, and its lasso is the loop.
    #[test]
    fn a_livelock_the_possibility_check_passed_is_stuck() {
        let g = graph(
            3,
            &[
                (0, 1, REMOVAL),
                (1, 0, REMOVAL),
                (0, 2, APPLY),
                (2, 2, PROBE),
            ],
        );
        let goal = [false, false, true];
        let always = [bit(REMOVAL) | bit(APPLY), bit(REMOVAL), 0];
        assert!(reaches_goal(&g, &goal, 0) && reaches_goal(&g, &goal, 1));
        let f = fair_stuck(&g, &always, &goal);
        assert_eq!(f.of[..2], [LIVELOCK, LIVELOCK]);
        assert!(f.stuck(0) && f.stuck(1) && !f.stuck(2));
        assert_eq!(f.lasso(&g, 0), (vec![1, 0], Some(0)));
    }

    /// The same loop where the apply that ends the work is enabled for every machine in
    /// both states and taken on no edge of the loop: every fair run leaves it, and the
    /// work ends.
    #[test]
    fn a_loop_that_leaves_a_step_enabled_throughout_is_not_a_fair_run() {
        let g = graph(
            3,
            &[
                (0, 1, REMOVAL),
                (1, 0, REMOVAL),
                (0, 2, APPLY),
                (1, 2, APPLY),
            ],
        );
        let goal = [false, false, true];
        let always = [bit(REMOVAL) | bit(APPLY), bit(REMOVAL) | bit(APPLY), 0];
        let f = fair_stuck(&g, &always, &goal);
        assert!(!f.stuck(0) && !f.stuck(1));
        // Unless a move of the loop adds a machine: then the subjects may change and
        // nothing is sure of being enabled throughout.
        let grows = [always[0] | GROWS, always[1], 0];
        assert!(fair_stuck(&g, &grows, &goal).stuck(0));
        // Nor is an enabled step that is not enabled for every machine.
        let some = [bit(REMOVAL), bit(REMOVAL), 0];
        assert_eq!(fair_stuck(&g, &some, &goal).of[..2], [LIVELOCK, LIVELOCK]);
    }

    /// A removal waiting for a dead node to come back (state 1: the controller has nothing
    /// to do; the node's return, 1 -> 2, is the environment's) was finished by the node
    /// returning; the node is not obliged to return, so it is stuck there, and so is the
    /// state before it. A controller step that ends the work is what makes a state fine.
    #[test]
    fn a_wait_only_the_environment_ends_is_stuck() {
        let g = graph(4, &[(0, 1, REMOVAL), (1, 2, RECOVERY), (3, 2, REMOVAL)]);
        let goal = [false, false, true, false];
        assert!((0..2).all(|v| reaches_goal(&g, &goal, v)));
        let f = fair_stuck(&g, &[0; 4], &goal);
        assert_eq!(f.of, [LEADS, DEAD_END, OPEN, FINE]);
        assert_eq!(f.lasso(&g, 0), (vec![1], None));
        assert_eq!(f.lasso(&g, 1), (vec![], None));
        // A controller step that may go either way: a fair run may take the one that
        // leads to the dead end.
        let g = graph(4, &[(0, 1, REMOVAL), (0, 2, REMOVAL), (3, 0, COMMIT)]);
        let f = fair_stuck(&g, &[0; 4], &goal);
        assert_eq!(f.of, [LEADS, DEAD_END, OPEN, LEADS]);
        assert_eq!(f.lasso(&g, 3), (vec![0, 1], None));
    }

    /// Deep chains are judged without recursion, and long loops are found whole.
    #[test]
    fn a_long_chain_into_a_long_loop() {
        let n = 200_000u32;
        let mut edges: Vec<(u32, u32, u8)> = (0..n - 1).map(|v| (v, v + 1, OPERATION)).collect();
        edges.push((n - 1, n / 2, OPERATION));
        let g = graph(n as usize, &edges);
        let goal = vec![false; n as usize];
        let f = fair_stuck(&g, &vec![0; n as usize], &goal);
        assert!(f.of[..(n / 2) as usize].iter().all(|x| *x == LEADS));
        assert!(f.of[(n / 2) as usize..].iter().all(|x| *x == LIVELOCK));
        let (lasso, at) = f.lasso(&g, 0);
        assert_eq!(at, Some((n / 2) as usize));
        assert_eq!(lasso.len(), n as usize);
        assert_eq!(lasso.last(), Some(&(n / 2)));
    }
}
