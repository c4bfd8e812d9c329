//! Invariants over the model's facts: the values of one state (and of the step that led to
//! it), and the evaluation of an invariant's checked expressions against them.

use super::model::{Effect, State};
use crate::compile::InvariantMeta;
use crate::syntax::ast::{BinOp, Expr, ExprKind, MessagePart, UnOp};
use crate::vocab::{MODEL_STEPS, ModelFact};

/// The model facts of one state, or of one transition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Facts {
    pub members: i64,
    pub healthy: i64,
    pub members_before: i64,
    pub healthy_before: i64,
    pub count: i64,
    pub approved: i64,
    pub approved_all: i64,
    pub approved_before: i64,
    pub approved_all_before: i64,
    pub active: i64,
    pub step_rank: i64,
    pub workers: i64,
    pub disruptive: i64,
    pub running: i64,
    pub unfinished: i64,
    pub down_others: i64,
    pub cluster_deleting: bool,
    pub cluster_exists: bool,
    pub schedulable: bool,
    pub transitioning: bool,
    pub step: u8,
    pub step_kind: Option<super::model::OpKind>,
    pub step_ours: bool,
    pub removed_dead: bool,
    pub left_member: bool,
    pub event_missing: bool,
    pub unannotated: bool,
    pub left_dead: bool,
    pub created: bool,
    pub undrained: bool,
    pub left_running: bool,
    pub warned: bool,
    pub stuck: bool,
    pub op_stuck: bool,
    pub left_down: bool,
    pub undone: bool,
    pub failed_touched: bool,
    pub cure_blocked: bool,
    pub roll_down: i64,
    pub roll_width: i64,
    pub workers_serving: i64,
    pub worker_taken: bool,
    pub roll_beside_cp: bool,
    pub step_cp: bool,
    pub backup_stale: bool,
    pub restore_in_cluster: bool,
}

fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Facts {
    /// A state on its own: every "before" is now, the step is `start`.
    pub fn of_state(s: &State) -> Facts {
        let t = s.tallies();
        let approved = t.approved_cps;
        let (roll_down, roll_width) = s.roll_down();
        let f = Facts {
            roll_down: int(roll_down),
            roll_width: i64::from(roll_width),
            workers_serving: int(t.serving),
            members: int(t.members),
            healthy: int(t.healthy),
            count: i64::from(s.count),
            approved: int(approved),
            approved_all: int(t.approved_all),
            active: int(t.active),
            workers: int(t.workers),
            disruptive: int(t.disruptive),
            running: int(t.running),
            unfinished: int(t.unfinished),
            cluster_deleting: s.cluster.torn_down(),
            cluster_exists: matches!(
                s.cluster,
                super::model::ClusterState::Live | super::model::ClusterState::Deleting
            ),
            schedulable: s.schedulable,
            transitioning: approved > 0 && approved.is_multiple_of(2),
            backup_stale: s.backup.stale(),
            ..Facts::default()
        };
        Facts {
            members_before: f.members,
            healthy_before: f.healthy,
            approved_before: f.approved,
            approved_all_before: f.approved_all,
            ..f
        }
    }

    /// The transition from `before` (facts of the state before) to `after` by a step.
    pub fn of_transition(before: &Facts, after: &State, e: &Effect) -> Facts {
        let now = Facts::of_state(after);
        Facts {
            members_before: before.members,
            healthy_before: before.healthy,
            approved_before: before.approved,
            approved_all_before: before.approved_all,
            step_rank: i64::from(e.rank),
            step: e.step,
            step_ours: e.ours,
            removed_dead: e.removed_dead,
            left_member: e.left_member,
            event_missing: e.event_missing,
            unannotated: e.unannotated,
            left_dead: e.left_dead,
            created: e.created.is_some(),
            undrained: e.undrained,
            down_others: i64::from(e.down_others),
            left_down: e.left_down,
            undone: e.undone,
            worker_taken: e.worker_taken,
            roll_beside_cp: e.beside_cp,
            failed_touched: e.failed_touched,
            left_running: e.left_running,
            warned: e.warned,
            step_kind: e.kind.or(e.created),
            step_cp: e.control_plane,
            // With backups, the model's restores name the one inside the cluster.
            restore_in_cluster: e.created == Some(super::model::OpKind::Restore)
                && after.backup != super::model::Backup::None,
            ..now
        }
    }

    fn value(&self, f: ModelFact) -> V<'static> {
        use ModelFact::*;
        match f {
            Members => V::Int(self.members),
            Healthy => V::Int(self.healthy),
            MembersBefore => V::Int(self.members_before),
            HealthyBefore => V::Int(self.healthy_before),
            Count => V::Int(self.count),
            Approved => V::Int(self.approved),
            ApprovedAll => V::Int(self.approved_all),
            ApprovedBefore => V::Int(self.approved_before),
            ApprovedAllBefore => V::Int(self.approved_all_before),
            Active => V::Int(self.active),
            StepRank => V::Int(self.step_rank),
            Workers => V::Int(self.workers),
            Disruptive => V::Int(self.disruptive),
            Running => V::Int(self.running),
            Unfinished => V::Int(self.unfinished),
            ClusterDeleting => V::Bool(self.cluster_deleting),
            ClusterExists => V::Bool(self.cluster_exists),
            Schedulable => V::Bool(self.schedulable),
            Transitioning => V::Bool(self.transitioning),
            Step => V::Str(
                MODEL_STEPS
                    .get(usize::from(self.step))
                    .copied()
                    .unwrap_or("start"),
            ),
            StepKind => V::Str(self.step_kind.map_or("", |k| k.name())),
            StepOurs => V::Bool(self.step_ours),
            RemovedDead => V::Bool(self.removed_dead),
            ReleasedMember => V::Bool(self.left_member),
            DeadMemberEventMissing => V::Bool(self.event_missing),
            DeletedUnannotated => V::Bool(self.unannotated),
            LeftDead => V::Bool(self.left_dead),
            StepCreated => V::Bool(self.created),
            ResetUndrained => V::Bool(self.undrained),
            ReleasedRunning => V::Bool(self.left_running),
            StepWarned => V::Bool(self.warned),
            Stuck => V::Bool(self.stuck),
            OperationStuck => V::Bool(self.op_stuck),
            DownOthers => V::Int(self.down_others),
            OperationLeftDown => V::Bool(self.left_down),
            OperationUndone => V::Bool(self.undone),
            FailedTouched => V::Bool(self.failed_touched),
            CureBlocked => V::Bool(self.cure_blocked),
            RollDown => V::Int(self.roll_down),
            RollMaxUnavailable => V::Int(self.roll_width),
            WorkersServing => V::Int(self.workers_serving),
            WorkerTaken => V::Bool(self.worker_taken),
            RollBesideControlPlane => V::Bool(self.roll_beside_cp),
            StepControlPlane => V::Bool(self.step_cp),
            BackupStale => V::Bool(self.backup_stale),
            RestoreInCluster => V::Bool(self.restore_in_cluster),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum V<'a> {
    Int(i64),
    Bool(bool),
    Str(&'a str),
}

/// An invariant's expression with its names looked up once (it is evaluated on every
/// transition the exploration takes).
#[derive(Clone, Debug)]
enum Code {
    Int(i64),
    Bool(bool),
    Str(String),
    Fact(ModelFact),
    /// A name that is not a fact of the model (the checker refuses it; kept as an error).
    Unknown(String),
    Unary(UnOp, Box<Code>),
    Binary(BinOp, Box<Code>, Box<Code>),
    /// `step == "…"` (or `!=` with `negate`), looked up once: per step index (the facts'
    /// `step`), whether the comparison holds. Every transition evaluates it.
    StepIs(Box<[bool; 256]>, bool),
}

impl Code {
    fn of(e: &Expr) -> Code {
        match &e.kind {
            ExprKind::Int(n) => Code::Int(*n),
            ExprKind::Bool(b) => Code::Bool(*b),
            ExprKind::Str(s, _) => Code::Str(s.clone()),
            ExprKind::Name(n) => match ModelFact::lookup(n) {
                Some(mf) => Code::Fact(mf),
                None => Code::Unknown(n.clone()),
            },
            ExprKind::Unary(op, inner) => Code::Unary(*op, Box::new(Code::of(inner))),
            ExprKind::Binary(op @ (BinOp::Eq | BinOp::Ne), l, r)
                if let Some(text) = step_literal(l, r) =>
            {
                let mut table = Box::new([false; 256]);
                for (i, holds) in table.iter_mut().enumerate() {
                    // As `Facts::value` names a step: past the list, "start".
                    *holds = MODEL_STEPS.get(i).copied().unwrap_or("start") == text;
                }
                Code::StepIs(table, *op == BinOp::Ne)
            }
            ExprKind::Binary(op, l, r) => {
                Code::Binary(*op, Box::new(Code::of(l)), Box::new(Code::of(r)))
            }
        }
    }
}

/// The string `step` is compared with, when one side is the fact `step` and the other a
/// string literal.
fn step_literal<'e>(l: &'e Expr, r: &'e Expr) -> Option<&'e str> {
    let is_step = |e: &Expr| matches!(&e.kind, ExprKind::Name(n) if ModelFact::lookup(n) == Some(ModelFact::Step));
    match (&l.kind, &r.kind) {
        (_, ExprKind::Str(s, _)) if is_step(l) => Some(s.as_str()),
        (ExprKind::Str(s, _), _) if is_step(r) => Some(s.as_str()),
        _ => None,
    }
}

fn eval<'a>(e: &'a Code, f: &Facts) -> Result<V<'a>, String> {
    Ok(match e {
        Code::StepIs(table, negate) => V::Bool(table[usize::from(f.step)] != *negate),
        Code::Int(n) => V::Int(*n),
        Code::Bool(b) => V::Bool(*b),
        Code::Str(s) => V::Str(s.as_str()),
        Code::Fact(mf) => f.value(*mf),
        Code::Unknown(n) => return Err(format!("`{n}` is not a fact of the model")),
        Code::Unary(op, inner) => match (op, eval(inner, f)?) {
            (UnOp::Not, V::Bool(b)) => V::Bool(!b),
            (UnOp::Neg, V::Int(n)) => V::Int(n.checked_neg().ok_or("overflow")?),
            _ => return Err("a value of the wrong type".into()),
        },
        Code::Binary(op, l, r) => {
            // `and` and `or` short-circuit, as in rules.
            if matches!(op, BinOp::And | BinOp::Or) {
                let V::Bool(a) = eval(l, f)? else {
                    return Err("a value of the wrong type".into());
                };
                if (*op == BinOp::And && !a) || (*op == BinOp::Or && a) {
                    return Ok(V::Bool(a));
                }
                let V::Bool(b) = eval(r, f)? else {
                    return Err("a value of the wrong type".into());
                };
                return Ok(V::Bool(b));
            }
            let (a, b) = (eval(l, f)?, eval(r, f)?);
            match (op, a, b) {
                (BinOp::Eq, a, b) => V::Bool(a == b),
                (BinOp::Ne, a, b) => V::Bool(a != b),
                (_, V::Int(x), V::Int(y)) => match op {
                    BinOp::Lt => V::Bool(x < y),
                    BinOp::Le => V::Bool(x <= y),
                    BinOp::Gt => V::Bool(x > y),
                    BinOp::Ge => V::Bool(x >= y),
                    BinOp::Add => V::Int(x.checked_add(y).ok_or("overflow")?),
                    BinOp::Sub => V::Int(x.checked_sub(y).ok_or("overflow")?),
                    BinOp::Mul => V::Int(x.checked_mul(y).ok_or("overflow")?),
                    BinOp::Div => V::Int(x.checked_div(y).ok_or("division by zero")?),
                    BinOp::Mod => V::Int(x.checked_rem(y).ok_or("division by zero")?),
                    _ => return Err("a value of the wrong type".into()),
                },
                _ => return Err("a value of the wrong type".into()),
            }
        }
    })
}

/// The steps at which a condition can be true or fail to evaluate, when its shape says:
/// `step == "…"` (never fails), `a and b` (false without evaluating `b` where `a` is, so
/// `a`'s steps), `a or b` (both false without failing outside both's steps). `None`: any.
fn steps_of(e: &Code) -> Option<Box<[bool; 256]>> {
    match e {
        Code::StepIs(table, negate) => {
            let mut out = Box::new([false; 256]);
            for (o, t) in out.iter_mut().zip(table.iter()) {
                *o = *t != *negate;
            }
            Some(out)
        }
        Code::Binary(BinOp::And, l, _) => steps_of(l),
        Code::Binary(BinOp::Or, l, r) => {
            let (mut a, b) = (steps_of(l)?, steps_of(r)?);
            for (x, y) in a.iter_mut().zip(b.iter()) {
                *x |= *y;
            }
            Some(a)
        }
        _ => None,
    }
}

fn truth(e: &Code, f: &Facts) -> Result<bool, String> {
    match eval(e, f)? {
        V::Bool(b) => Ok(b),
        _ => Err("not a condition".into()),
    }
}

/// An invariant ready to check.
pub struct InvariantCheck {
    pub meta: InvariantMeta,
    /// It reads `stuck`, which is known only once the whole graph is explored, or
    /// `cure.blocked`, known once the state is expanded: checked on states, at the end.
    pub deferred: bool,
    when: Option<Code>,
    /// The steps at which `when` can be true (or fail): outside them it is false without
    /// evaluating it. `None`: any step.
    when_steps: Option<Box<[bool; 256]>>,
    unless: Option<Code>,
    ensure: Code,
    /// The message's placeholders, compiled (text parts as `None`).
    say: Option<Vec<Result<Code, String>>>,
}

pub enum Outcome {
    /// It holds; `at_risk` when its `when`/`unless` let it apply.
    Holds {
        at_risk: bool,
    },
    Broken(String),
}

/// [`Outcome`] without the message (rendered only when it is wanted).
enum Judged {
    Holds { at_risk: bool },
    Broken(Why),
}

/// Why an invariant is broken.
enum Why {
    /// Its `when` or `unless` could not be evaluated.
    Condition(String),
    /// Its `ensure` could not be evaluated.
    Ensure(String),
    /// Its `ensure` is false.
    False,
}

fn reads(e: &Expr, name: &str) -> bool {
    e.reads(name)
}

impl InvariantCheck {
    pub fn new(meta: &InvariantMeta) -> InvariantCheck {
        let exprs = meta
            .when
            .iter()
            .chain(meta.unless.iter())
            .chain(std::iter::once(&meta.ensure));
        let deferred = exprs
            .clone()
            .any(|e| reads(e, "stuck") || reads(e, "operation.stuck") || reads(e, "cure.blocked"));
        let when = meta.when.as_ref().map(Code::of);
        InvariantCheck {
            meta: meta.clone(),
            deferred,
            when_steps: when.as_ref().and_then(steps_of),
            when,
            unless: meta.unless.as_ref().map(Code::of),
            ensure: Code::of(&meta.ensure),
            say: meta.message.as_ref().map(|m| {
                m.parts
                    .iter()
                    .map(|p| match p {
                        MessagePart::Text(t) => Err(t.clone()),
                        MessagePart::Placeholder(e) => Ok(Code::of(e)),
                    })
                    .collect()
            }),
        }
    }

    /// Checks the invariant on facts. A `sequential` invariant is not checked where
    /// requests overlapped.
    pub fn holds(&self, f: &Facts, concurrent: bool) -> Outcome {
        match self.judge(f, concurrent) {
            Judged::Holds { at_risk } => Outcome::Holds { at_risk },
            Judged::Broken(Why::Condition(e)) => {
                Outcome::Broken(format!("its condition could not be evaluated ({e})"))
            }
            Judged::Broken(Why::Ensure(e)) => {
                Outcome::Broken(format!("`ensure` could not be evaluated ({e})"))
            }
            Judged::Broken(Why::False) => Outcome::Broken(self.render(f)),
        }
    }

    /// [`InvariantCheck::holds`] without rendering a message.
    fn judge(&self, f: &Facts, concurrent: bool) -> Judged {
        if self.meta.sequential && concurrent {
            return Judged::Holds { at_risk: false };
        }
        if let Some(steps) = &self.when_steps
            && !steps[usize::from(f.step)]
        {
            return Judged::Holds { at_risk: false };
        }
        let applies = (|| -> Result<bool, String> {
            let when = match &self.when {
                Some(w) => truth(w, f)?,
                None => true,
            };
            let unless = match (&self.unless, when) {
                (Some(u), true) => truth(u, f)?,
                _ => false,
            };
            Ok(when && !unless)
        })();
        let applies = match applies {
            Ok(a) => a,
            Err(e) => return Judged::Broken(Why::Condition(e)),
        };
        if !applies {
            return Judged::Holds { at_risk: false };
        }
        match truth(&self.ensure, f) {
            Ok(true) => Judged::Holds { at_risk: true },
            Ok(false) => Judged::Broken(Why::False),
            Err(e) => Judged::Broken(Why::Ensure(e)),
        }
    }

    fn render(&self, f: &Facts) -> String {
        let Some(parts) = &self.say else {
            return format!("`{}` does not hold", self.meta.ensure_text);
        };
        render_message(parts, f)
    }
}

/// A set of invariants, by index: a bit each (1,000 invariants in 128 bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Set(Vec<u64>);

impl Set {
    fn insert(&mut self, k: usize) {
        let (word, bit) = (k / 64, k % 64);
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        if let Some(w) = self.0.get_mut(word) {
            *w |= 1 << bit;
        }
    }

    pub fn contains(&self, k: usize) -> bool {
        self.0.get(k / 64).is_some_and(|w| w & (1 << (k % 64)) != 0)
    }

    /// The indices in the set, in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            // The set bits only, lowest first: each step clears the lowest.
            std::iter::successors((w != 0).then_some(w), |&rest| {
                let rest = rest & (rest - 1);
                (rest != 0).then_some(rest)
            })
            .map(move |rest| i * 64 + rest.trailing_zeros() as usize)
        })
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The bytes it holds.
    fn bytes(&self) -> usize {
        self.0.capacity() * 8
    }
}

/// What every check said of one set of facts: the checks it put at risk (holding or not),
/// and the ones it broke. No message: a message is rendered
/// ([`InvariantCheck::holds`]) only for a violation that will be reported, so remembering
/// outcomes costs two bits per invariant, not a message (with 1,000 invariants broken
/// everywhere, remembered messages took gigabytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Checked {
    pub at_risk: Set,
    pub broken: Set,
}

/// Checks with their outcomes remembered per facts. An outcome reads nothing but the
/// facts and whether requests overlapped, and many transitions have the same facts, so
/// each set of facts is checked once. (Bounded: forgotten wholesale past a size.)
///
/// Every transition asks, so the hot path is kept small: a direct-mapped table of
/// [`Verdicts::RECENT`] packed facts with the index of their outcome (40 bytes an entry,
/// where the caches keep it) in front of the full table, and each distinct outcome kept
/// once (a few hundred, against many thousand sets of facts).
#[derive(Default)]
pub struct Verdicts {
    seen: std::collections::HashMap<Packed, u32, super::explore::Mixed>,
    /// Packed facts and their outcome's index + 1 (0: empty), at the facts' hash.
    recent: Vec<(Packed, u32)>,
    /// The distinct outcomes, and where each is in `outcomes`.
    outcomes: Vec<Checked>,
    index: std::collections::HashMap<Checked, u32, super::explore::Mixed>,
    /// The bytes the remembered outcomes hold.
    bytes: usize,
    /// For facts that do not pack (a count past 255): checked afresh each time.
    fresh: Checked,
}

/// Facts and whether requests overlapped, packed a byte per count and a bit per flag
/// (a shorter key to hash and compare than the facts).
type Packed = [u64; 4];

/// The packed form of facts, when every count fits in a byte.
fn pack(f: &Facts, concurrent: bool) -> Option<Packed> {
    // Every field named: one added to the facts must be packed too.
    let Facts {
        members,
        healthy,
        members_before,
        healthy_before,
        count,
        approved,
        approved_all,
        approved_before,
        approved_all_before,
        active,
        step_rank,
        workers,
        disruptive,
        running,
        unfinished,
        down_others,
        cluster_deleting,
        cluster_exists,
        schedulable,
        transitioning,
        step,
        step_kind,
        step_ours,
        removed_dead,
        left_member,
        event_missing,
        unannotated,
        left_dead,
        created,
        undrained,
        left_running,
        warned,
        stuck,
        op_stuck,
        left_down,
        undone,
        failed_touched,
        cure_blocked,
        roll_down,
        roll_width,
        workers_serving,
        worker_taken,
        roll_beside_cp,
        step_cp,
        backup_stale,
        restore_in_cluster,
    } = *f;
    let mut bytes = [0u8; 32];
    let ints = [
        members,
        healthy,
        members_before,
        healthy_before,
        count,
        approved,
        approved_all,
        approved_before,
        approved_all_before,
        active,
        step_rank,
        workers,
        disruptive,
        running,
        unfinished,
        down_others,
    ];
    for (b, n) in bytes.iter_mut().zip(ints) {
        *b = u8::try_from(n).ok()?;
    }
    let flags = [
        cluster_deleting,
        cluster_exists,
        schedulable,
        transitioning,
        step_ours,
        removed_dead,
        left_member,
        event_missing,
        unannotated,
        left_dead,
        created,
        undrained,
        left_running,
        warned,
        stuck,
        op_stuck,
        left_down,
        cure_blocked,
        concurrent,
        failed_touched,
        worker_taken,
        roll_beside_cp,
        undone,
        step_cp,
        backup_stale,
        restore_in_cluster,
    ];
    let bits = flags
        .iter()
        .enumerate()
        .fold(0u32, |acc, (k, on)| acc | (u32::from(*on) << k));
    bytes[16..20].copy_from_slice(&bits.to_le_bytes());
    bytes[20] = step;
    bytes[22] = u8::try_from(roll_down).ok()?;
    bytes[23] = u8::try_from(roll_width).ok()?;
    bytes[24] = u8::try_from(workers_serving).ok()?;
    bytes[21] = match step_kind {
        None => 0,
        Some(super::model::OpKind::Upgrade) => 1,
        Some(super::model::OpKind::Reset) => 2,
        Some(super::model::OpKind::Restore) => 3,
        Some(super::model::OpKind::Roll) => 4,
        Some(super::model::OpKind::UpgradeRoll) => 5,
        Some(super::model::OpKind::Shutdown) => 6,
        Some(super::model::OpKind::Rollback) => 7,
    };
    let word = |k: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[k * 8..k * 8 + 8]);
        u64::from_le_bytes(w)
    };
    Some([word(0), word(1), word(2), word(3)])
}

impl Verdicts {
    /// Sets of facts remembered at most.
    const MAX: usize = 1 << 16;
    /// Bytes of remembered outcomes at most (many invariants make each one larger).
    const MAX_BYTES: usize = 16 << 20;
    /// Entries of the direct-mapped table in front (a power of two).
    const RECENT: usize = 1 << 12;

    /// The memory the remembered outcomes may still take before they are forgotten.
    pub fn headroom(&self) -> u64 {
        Self::MAX_BYTES.saturating_sub(self.bytes) as u64
    }

    /// The outcomes of the checks not deferred (the whole graph's) nor in `skip`. `skip`
    /// may only grow from call to call (the invariants already violated): an outcome
    /// remembered under a smaller `skip` holds more, which the caller skips too.
    pub fn check(
        &mut self,
        checks: &[InvariantCheck],
        skip: &[bool],
        f: &Facts,
        concurrent: bool,
    ) -> &Checked {
        let Some(key) = pack(f, concurrent) else {
            self.fresh = check_all(checks, skip, f, concurrent);
            return &self.fresh;
        };
        let slot = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = super::explore::Mixed::default().build_hasher();
            for w in key {
                h.write_u64(w);
            }
            h.finish() as usize & (Self::RECENT - 1)
        };
        if self.recent.len() != Self::RECENT {
            self.recent = vec![([0; 4], 0); Self::RECENT];
        }
        let hit = self
            .recent
            .get(slot)
            .filter(|(k, at)| *at != 0 && *k == key)
            .map(|&(_, at)| at as usize - 1);
        if let Some(at) = hit
            && at < self.outcomes.len()
        {
            return &self.outcomes[at];
        }
        if self.seen.len() >= Self::MAX || self.bytes >= Self::MAX_BYTES {
            self.seen.clear();
            self.index.clear();
            self.outcomes.clear();
            self.recent.iter_mut().for_each(|e| *e = ([0; 4], 0));
            self.bytes = 0;
        }
        let at = match self.seen.get(&key) {
            Some(&at) => at,
            None => {
                let c = check_all(checks, skip, f, concurrent);
                self.bytes += std::mem::size_of::<(Packed, u32)>();
                let at = match self.index.get(&c) {
                    Some(&at) => at,
                    None => {
                        let at = self.outcomes.len() as u32;
                        self.bytes += 2 * std::mem::size_of::<Checked>()
                            + 2 * (c.at_risk.bytes() + c.broken.bytes());
                        self.outcomes.push(c.clone());
                        self.index.insert(c, at);
                        at
                    }
                };
                self.seen.insert(key, at);
                at
            }
        };
        if let Some(e) = self.recent.get_mut(slot) {
            *e = (key, at + 1);
        }
        &self.outcomes[at as usize]
    }
}

/// Every check not deferred nor in `skip`, on facts.
pub fn check_all(checks: &[InvariantCheck], skip: &[bool], f: &Facts, concurrent: bool) -> Checked {
    let mut out = Checked::default();
    for (k, check) in checks.iter().enumerate() {
        if check.deferred || skip.get(k).copied().unwrap_or(false) {
            continue;
        }
        match check.judge(f, concurrent) {
            Judged::Holds { at_risk } => {
                if at_risk {
                    out.at_risk.insert(k);
                }
            }
            Judged::Broken(_) => {
                out.at_risk.insert(k);
                out.broken.insert(k);
            }
        }
    }
    out
}

fn render_message(parts: &[Result<Code, String>], f: &Facts) -> String {
    let mut out = String::new();
    for p in parts {
        match p {
            Err(t) => out.push_str(t),
            Ok(e) => match eval(e, f) {
                Ok(V::Int(n)) => out.push_str(&n.to_string()),
                Ok(V::Bool(b)) => out.push_str(if b { "true" } else { "false" }),
                Ok(V::Str(s)) => out.push_str(s),
                Err(e) => out.push_str(&format!("<{e}>")),
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set gives back exactly what was put in it, lowest first, across words (bits 0,
    /// 63 and 64 included), and nothing when empty.
    #[test]
    fn a_set_iterates_its_members_in_order() {
        let mut s = Set::default();
        assert_eq!(s.iter().count(), 0);
        for k in [130, 0, 64, 63, 5, 127] {
            s.insert(k);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 127, 130]);
        assert_eq!(s.len(), 6);
        let mut one = Set::default();
        one.insert(191);
        assert_eq!(one.iter().collect::<Vec<_>>(), vec![191]);
    }

    /// Packed facts tell apart every two sets of facts that differ in one field (any
    /// count, any flag, the step and its kind), and counts past a byte are not packed.
    #[test]
    fn packed_facts_differ_where_the_facts_do() {
        let base = Facts {
            members: 3,
            healthy: 2,
            count: 3,
            step: 4,
            ..Facts::default()
        };
        let mut variants: Vec<(Facts, bool)> = vec![(base, false), (base, true)];
        let ints: [fn(&mut Facts) -> &mut i64; 19] = [
            |f| &mut f.members,
            |f| &mut f.healthy,
            |f| &mut f.members_before,
            |f| &mut f.healthy_before,
            |f| &mut f.count,
            |f| &mut f.approved,
            |f| &mut f.approved_all,
            |f| &mut f.approved_before,
            |f| &mut f.approved_all_before,
            |f| &mut f.active,
            |f| &mut f.step_rank,
            |f| &mut f.workers,
            |f| &mut f.disruptive,
            |f| &mut f.running,
            |f| &mut f.unfinished,
            |f| &mut f.down_others,
            |f| &mut f.roll_down,
            |f| &mut f.roll_width,
            |f| &mut f.workers_serving,
        ];
        for field in ints {
            for n in [1, 255] {
                let mut f = base;
                *field(&mut f) += n;
                if f != base && *field(&mut f) <= 255 {
                    variants.push((f, false));
                }
            }
            let mut past = base;
            *field(&mut past) = 256;
            assert_eq!(pack(&past, false), None);
            *field(&mut past) = -1;
            assert_eq!(pack(&past, false), None);
        }
        let flags: [fn(&mut Facts) -> &mut bool; 22] = [
            |f| &mut f.cluster_deleting,
            |f| &mut f.cluster_exists,
            |f| &mut f.schedulable,
            |f| &mut f.transitioning,
            |f| &mut f.step_ours,
            |f| &mut f.removed_dead,
            |f| &mut f.left_member,
            |f| &mut f.event_missing,
            |f| &mut f.unannotated,
            |f| &mut f.left_dead,
            |f| &mut f.created,
            |f| &mut f.undrained,
            |f| &mut f.left_running,
            |f| &mut f.warned,
            |f| &mut f.stuck,
            |f| &mut f.op_stuck,
            |f| &mut f.left_down,
            |f| &mut f.cure_blocked,
            |f| &mut f.failed_touched,
            |f| &mut f.worker_taken,
            |f| &mut f.roll_beside_cp,
            |f| &mut f.undone,
        ];
        for flag in flags {
            let mut f = base;
            *flag(&mut f) = true;
            variants.push((f, false));
        }
        for step in [0, 1, 255] {
            variants.push((Facts { step, ..base }, false));
        }
        for kind in crate::verify::model::OpKind::ALL {
            variants.push((
                Facts {
                    step_kind: Some(kind),
                    ..base
                },
                false,
            ));
        }
        let keys: Vec<Packed> = variants
            .iter()
            .map(|(f, c)| pack(f, *c).expect("every count fits a byte"))
            .collect();
        for (a, ka) in variants.iter().zip(&keys) {
            for (b, kb) in variants.iter().zip(&keys) {
                assert_eq!(a == b, ka == kb, "{a:?} / {b:?}");
            }
        }
        assert!(variants.len() > 40, "{}", variants.len());
    }

    /// Skipping a `when` outside its steps gives what evaluating it gives: false, never
    /// an error, wherever the steps say it cannot hold.
    #[test]
    fn a_when_skipped_outside_its_steps_is_false_there() {
        for text in [
            "step == \"join\"",
            "step == \"join\" and 1 / 0 > 0",
            "step == \"join\" or step != \"commit\" and members < 1 / 0",
            "(step == \"reset\" or step == \"wipe\") and members > 0",
            "members > 0 and step == \"join\"",
            "not (step == \"join\")",
        ] {
            let code = Code::of(&crate::syntax::parse_expr(text).expect("parses"));
            let steps = steps_of(&code);
            if text.starts_with("members") || text.starts_with("not") {
                assert!(steps.is_none(), "{text}");
                continue;
            }
            let steps = steps.expect("a step filter");
            for step in 0..=u8::MAX {
                let f = Facts {
                    step,
                    ..Facts::default()
                };
                if !steps[usize::from(step)] {
                    assert_eq!(truth(&code, &f), Ok(false), "{text} at step {step}");
                }
            }
            assert!(steps.iter().any(|s| *s), "{text}");
        }
    }

    /// `step == "…"` looked up once says what comparing the step's name says, for every
    /// step index, either way round, with `==` and `!=`, and for a name that is no step.
    #[test]
    fn a_step_comparison_looked_up_once_agrees_with_comparing_names() {
        for text in [
            "step == \"join\"",
            "\"release-finalizer\" == step",
            "step != \"operation-run\"",
            "step == \"start\"",
            "step == \"no-such-step\"",
        ] {
            let e = crate::syntax::parse_expr(text).expect("parses");
            let fast = Code::of(&e);
            assert!(matches!(fast, Code::StepIs(..)), "{text}");
            let ExprKind::Binary(op, l, r) = &e.kind else {
                panic!("{text}")
            };
            let slow = Code::Binary(*op, Box::new(Code::of(l)), Box::new(Code::of(r)));
            for step in 0..=u8::MAX {
                let f = Facts {
                    step,
                    ..Facts::default()
                };
                assert_eq!(eval(&fast, &f), eval(&slow, &f), "{text} at step {step}");
            }
        }
    }
}
