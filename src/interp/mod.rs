//! Evaluates a decision table against facts. Pure: no I/O, no clock. Facts are asked for
//! only when a row needs them, at most once per session; a provider that cannot answer yet
//! (an expensive fact needing etcd) interrupts the session, and the caller supplies the value
//! and runs it again.

mod cache;
pub mod explain;
mod flat_vm;
mod hits;
mod stack_vm;
/// Values and the reference evaluator live below the checker (`crate::value`).
pub use crate::value;

use crate::compile::flat::SESSION_VALUES;
use crate::compile::{Code, Kind, Piece, Table};
use crate::vocab::Event;
use crate::vocab::{Fact, Verdict};
use cache::{FactCache, TEXT_FACTS};
pub use hits::{Hit, Hits};
use serde::Serialize;
pub use value::{EvalError, Value};

/// What a fact provider answers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lookup<'a> {
    Value(Value<'a>),
    /// Not known yet: the caller must fetch it (etcd, Talos) and supply it.
    Later,
}

/// Where facts come from: a snapshot of live objects, and later etcd and Talos.
pub trait Facts<'a> {
    fn fact(&mut self, fact: Fact) -> Lookup<'a>;
}

/// What a plan step's guards decided ([`Session::step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOutcome {
    pub runs: bool,
    /// Its `say`, rendered, when it runs.
    pub message: Option<String>,
}

/// Why a plan step's guards could not decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepError {
    /// A guard failed to evaluate (overflow, division by zero).
    Guard(EvalError),
    /// A guard needs a fact nobody supplied.
    Needs(Fact),
    /// The message needs a fact nobody supplied.
    MessageNeeds(Fact),
}

/// Why a session stopped before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// Fetch this fact, [`Session::supply`] it, and run again.
    Need(Fact),
}

/// One row as the explanation shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TraceRow {
    pub event: String,
    pub rule: String,
    /// Index into [`Table::rules`].
    #[serde(skip)]
    pub rule_index: u32,
    pub verdict: Verdict,
    /// The `when`'s value (`None`: no `when`, it could not be computed, or not read).
    pub when: Option<bool>,
    /// The `unless`'s value (`None` also when the `when` ruled the row out first).
    pub unless: Option<bool>,
    /// Whether the row fired in the decision.
    pub matched: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A fact a condition needs that the provider could not give yet (not read).
    #[serde(skip)]
    pub unread: Option<Fact>,
}

/// A condition's value as a trace shows it.
#[derive(Clone, Copy)]
enum Shown {
    Absent,
    Value(bool),
    Error(EvalError),
    Unread(Fact),
}

impl Shown {
    fn value(self) -> Option<bool> {
        match self {
            Shown::Value(b) => Some(b),
            _ => None,
        }
    }
}

/// Where a flat program stopped without an error.
enum Flow {
    End,
    /// At an [`flat::Op::Stack`] row (its `pc` in `Session::pc`).
    Stack,
}

/// Why evaluating an expression stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Need(Fact),
    Fail(EvalError),
}

/// A decision in progress for one event's facts.
pub struct Session<'a, F> {
    table: &'a Table,
    cache: FactCache<'a, F>,
    /// Where the flat program stopped on an error.
    pc: usize,
}

impl<'a, F: Facts<'a>> Session<'a, F> {
    pub fn new(table: &'a Table, facts: F) -> Self {
        Session {
            table,
            cache: FactCache {
                facts,
                vals: [0; SESSION_VALUES],
                texts: [None; TEXT_FACTS],
                known: 0,
                tracing: None,
            },
            pc: 0,
        }
    }

    /// Records every row considered and every fact asked for.
    pub fn traced(mut self) -> Self {
        self.cache.tracing = Some(Box::default());
        self
    }

    /// Every fact asked for, in order, with its value (when traced).
    pub fn asked(&self) -> &[(Fact, Value<'a>)] {
        self.cache.tracing.as_deref().map_or(&[], |t| &t.asked)
    }

    /// The rows recorded since the last call (`None`: not traced). The session goes on
    /// recording.
    pub fn take_trace(&mut self) -> Option<Vec<TraceRow>> {
        self.cache
            .tracing
            .as_deref_mut()
            .map(|t| std::mem::take(&mut t.rows))
    }

    /// The value of every fact of `mask` (bit = fact slot, as [`Table::facts_read`] gives
    /// a group's), asking the provider for those this decision did not need: what a
    /// decision record keeps, read after deciding and from the same cache, so the values
    /// are the ones the rows read. A fact the provider cannot give here
    /// ([`Lookup::Later`]) is left out. Never on the decision's path.
    #[cold]
    pub fn read_facts(&mut self, mask: u64) -> Vec<(Fact, Value<'a>)> {
        let mut out = Vec::with_capacity(mask.count_ones() as usize);
        let mut rest = mask;
        while rest != 0 {
            let slot = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let Some(fact) = Fact::from_slot(slot) else {
                continue;
            };
            if self.cache.ensure(slot).is_err() {
                continue;
            }
            let value = match fact.info().ty {
                crate::vocab::Type::Int => Value::Int(self.cache.value(slot)),
                crate::vocab::Type::Bool => Value::Bool(self.cache.value(slot) != 0),
                _ => Value::Str(
                    cache::TEXT_SLOT
                        .get(slot)
                        .and_then(|&t| self.cache.texts.get(usize::from(t)))
                        .copied()
                        .flatten()
                        .unwrap_or(""),
                ),
            };
            out.push((fact, value));
        }
        out
    }

    /// The provider of this session's facts (a record asks it where a fact came from).
    pub fn facts_mut(&mut self) -> &mut F {
        &mut self.cache.facts
    }

    /// Supplies a fact the provider answered [`Lookup::Later`] for.
    pub fn supply(&mut self, fact: Fact, value: Value<'a>) {
        self.cache.store(fact.slot(), value);
    }

    /// The matching rows of one (verb, subject, site), in source order. The hot path: no
    /// allocation unless something matches. A traced session decides with the same code
    /// (the group's flat program), then records each row's conditions for the explanation.
    pub fn matches(&mut self, event: Event) -> Result<Hits, Interrupt> {
        let (verb, subject, site) = event;
        let mut hits = Hits::new();
        if let Some((rows, program)) = self.table.group(verb, subject, site) {
            self.run_group(rows, program, &mut hits)?;
        }
        if self.cache.tracing.is_some() {
            self.trace_rows(event, &hits);
        }
        Ok(hits)
    }

    /// Records every row of `event` for the explanation: whether it matched (from `hits`,
    /// what the decision used) and the value of its `when` and `unless` (the `unless` only
    /// when the `when` did not rule the row out). A condition that needs a fact the provider
    /// cannot give yet is shown as not read; it never stops the session.
    #[cold]
    #[inline(never)]
    fn trace_rows(&mut self, event: Event, hits: &Hits) {
        let (verb, subject, site) = event;
        let table = self.table;
        let mut next = hits.iter().peekable();
        let mut out = Vec::new();
        for row in table.rows(verb, subject, site) {
            let hit = next
                .next_if(|h| h.rule == row.rule && h.verdict == row.verdict)
                .copied();
            let shown = |s: &mut Self, c: &Option<Code>| match c {
                None => Shown::Absent,
                Some(c) => match s.condition(c) {
                    Ok(Ok(b)) => Shown::Value(b),
                    Ok(Err(e)) => Shown::Error(e),
                    Err(Interrupt::Need(f)) => Shown::Unread(f),
                },
            };
            let when = shown(self, &row.when);
            let unless = match when {
                Shown::Value(false) | Shown::Unread(_) => Shown::Absent,
                _ => shown(self, &row.unless),
            };
            let unread = match (when, unless) {
                (Shown::Unread(f), _) | (_, Shown::Unread(f)) => Some(f),
                _ => None,
            };
            let error = hit.and_then(|h| h.error).or(match (when, unless) {
                (Shown::Error(e), _) | (_, Shown::Error(e)) => Some(e),
                _ => None,
            });
            out.push(TraceRow {
                event: format!("{} {} at {}", verb.name(), subject.name(), site.name()),
                rule: table
                    .rules
                    .get(row.rule as usize)
                    .map(|r| r.name.clone())
                    .unwrap_or_default(),
                rule_index: row.rule,
                verdict: row.verdict,
                when: when.value(),
                unless: unless.value(),
                matched: hit.is_some(),
                error: error.map(|e| e.to_string()),
                unread,
            });
        }
        if let Some(trace) = self.cache.tracing.as_deref_mut().map(|t| &mut t.rows) {
            // A session run again (after supplying a fact) records the event once.
            if let Some(first) = out.first() {
                trace.retain(|r| r.event != first.event);
            }
            trace.extend(out);
        }
    }

    /// The value of the `let` [`Table::lets`]`[index]` against this session's facts: what
    /// a row that uses it computed (the same interpreter). `Err` when it cannot be computed
    /// (a division by zero, an overflow); `Interrupt` when a fact it reads cannot be had
    /// yet.
    pub fn let_value(&mut self, index: u32) -> Result<Result<Value<'a>, EvalError>, Interrupt> {
        let table = self.table;
        let Some(l) = table.lets.get(index as usize) else {
            return Ok(Err(EvalError::Type));
        };
        match &l.value {
            Piece::Name(t) => match self.cache.text(*t, &table.strings) {
                Ok(s) => Ok(Ok(Value::Str(s))),
                Err(Stop::Fail(e)) => Ok(Err(e)),
                Err(Stop::Need(f)) => Err(Interrupt::Need(f)),
            },
            Piece::Value(code) => Ok(self.condition_value(code)?.map(|v| match code.kind {
                Kind::Int => Value::Int(v),
                Kind::Bool => Value::Bool(v != 0),
            })),
            Piece::Text(_) => Ok(Err(EvalError::Type)),
        }
    }

    /// The message of a matching rule, placeholders filled in.
    pub fn render(&mut self, hit: &Hit) -> Result<String, Interrupt> {
        let table = self.table;
        let Some(rule) = table.rules.get(hit.rule as usize) else {
            return Ok(String::new());
        };
        if let Some(e) = hit.error {
            return Ok(format!(
                "rule {} could not be evaluated ({e}); refusing, to be safe",
                rule.name
            ));
        }
        self.render_pieces(&rule.message)
    }

    pub fn render_pieces(&mut self, pieces: &[Piece]) -> Result<String, Interrupt> {
        // One allocation: the text as written plus room for the values.
        let capacity = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.len(),
                Piece::Value(_) | Piece::Name(_) => 24,
            })
            .sum();
        let mut out = String::with_capacity(capacity);
        use std::fmt::Write;
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Name(t) => match self.cache.text(*t, &self.table.strings) {
                    Ok(s) => out.push_str(s),
                    Err(Stop::Fail(e)) => {
                        let _ = write!(out, "<{e}>");
                    }
                    Err(Stop::Need(f)) => return Err(Interrupt::Need(f)),
                },
                Piece::Value(code) => match (self.condition_value(code)?, code.kind) {
                    (Ok(v), Kind::Int) => push_int(&mut out, v),
                    (Ok(v), Kind::Bool) => out.push_str(if v != 0 { "true" } else { "false" }),
                    (Err(e), _) => {
                        let _ = write!(out, "<{e}>");
                    }
                },
            }
        }
        Ok(out)
    }

    /// Evaluates a guard (plans): true when it holds.
    pub fn guard(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        self.condition(code)
    }

    /// Supplies a fact as a number, the way the controller records what it found (a
    /// boolean fact: non-zero is true).
    pub fn supply_number(&mut self, fact: Fact, value: i64) {
        let value = if fact.info().ty == crate::vocab::Type::Bool {
            Value::Bool(value != 0)
        } else {
            Value::Int(value)
        };
        self.supply(fact, value);
    }

    /// Whether a plan step runs (`when` holds and `unless` does not), and its message when
    /// it runs. A guard that cannot be evaluated, or that needs a fact nobody supplied, is
    /// an error: the plan stops there (fails closed) rather than guess.
    pub fn step(&mut self, step: &crate::compile::PlanStep) -> Result<StepOutcome, StepError> {
        let mut holds = |code: &Option<Code>, otherwise: bool| match code {
            None => Ok(otherwise),
            Some(code) => match self.guard(code) {
                Ok(Ok(b)) => Ok(b),
                Ok(Err(e)) => Err(StepError::Guard(e)),
                Err(Interrupt::Need(f)) => Err(StepError::Needs(f)),
            },
        };
        let runs = holds(&step.when, true)? && !holds(&step.unless, false)?;
        let message = match (&step.message, runs) {
            (Some(pieces), true) => Some(
                self.render_pieces(pieces)
                    .map_err(|Interrupt::Need(f)| StepError::MessageNeeds(f))?,
            ),
            _ => None,
        };
        Ok(StepOutcome { runs, message })
    }

    #[inline]
    fn condition(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        Ok(self.condition_value(code)?.map(|v| v != 0))
    }

    #[inline]
    fn condition_value(&mut self, code: &Code) -> Result<Result<i64, EvalError>, Interrupt> {
        match self.run(code) {
            Ok(v) => Ok(Ok(v)),
            Err(Stop::Fail(e)) => Ok(Err(e)),
            Err(Stop::Need(f)) => Err(Interrupt::Need(f)),
        }
    }
}

/// A rule that matched, with its message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: String,
    pub verdict: Verdict,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the table decided for a request or a reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub refusals: Vec<Finding>,
    pub holds: Vec<Finding>,
    pub warnings: Vec<Finding>,
    /// Rules in audit mode that matched, with the verdict they would have given: recorded
    /// and counted, never refusing, holding or warning.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub audited: Vec<Finding>,
}

impl Decision {
    /// Refusals override holds, holds override proceeding.
    pub fn verdict(&self) -> Option<Verdict> {
        if !self.refusals.is_empty() {
            Some(Verdict::Refuse)
        } else if !self.holds.is_empty() {
            Some(Verdict::Hold)
        } else {
            None
        }
    }

    /// The findings that decided (refusals, else holds).
    pub fn deciding(&self) -> &[Finding] {
        if !self.refusals.is_empty() {
            &self.refusals
        } else {
            &self.holds
        }
    }
}

/// Evaluates one event and adds what matched to `decision`, messages rendered. Rules that
/// match for several events of one request are reported once.
pub fn decide_into<'a, F: Facts<'a>>(
    session: &mut Session<'a, F>,
    event: Event,
    decision: &mut Decision,
) -> Result<(), Interrupt> {
    let hits = session.matches(event)?;
    for hit in &hits {
        let message = session.render(hit)?;
        let rule = session
            .table
            .rules
            .get(hit.rule as usize)
            .map(|r| (r.name.clone(), r.reason.clone(), r.audit))
            .unwrap_or_default();
        let finding = Finding {
            rule: rule.0,
            verdict: hit.verdict,
            message,
            reason: rule.1,
        };
        let list = match hit.verdict {
            _ if rule.2 => &mut decision.audited,
            Verdict::Refuse => &mut decision.refusals,
            Verdict::Hold => &mut decision.holds,
            Verdict::Warn => &mut decision.warnings,
        };
        if !list.contains(&finding) {
            list.push(finding);
        }
    }
    Ok(())
}

/// Appends `v` in decimal: what `write!(out, "{v}")` does, without the formatting machinery.
fn push_int(out: &mut String, v: i64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut n = v.unsigned_abs();
    loop {
        at -= 1;
        // `n % 10` is below 10, so the cast keeps it whole.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push('-');
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::push_int;

    mod plan_steps {
        use crate::diagnostics::SourceFile;
        use crate::interp::{Facts, Lookup, Session, StepError, StepOutcome, Value};
        use crate::vocab::{Fact, Verb};

        /// `member.dead` is expensive (answered later); the rest as given.
        struct Given {
            approved: i64,
            count: i64,
        }

        impl<'a> Facts<'a> for Given {
            fn fact(&mut self, fact: Fact) -> Lookup<'a> {
                Lookup::Value(match fact {
                    Fact::MemberDead => return Lookup::Later,
                    Fact::Approved => Value::Int(self.approved),
                    Fact::Count => Value::Int(self.count),
                    Fact::Machine => Value::Str("cp-2"),
                    _ => match fact.info().ty {
                        crate::vocab::Type::Int => Value::Int(0),
                        crate::vocab::Type::Bool => Value::Bool(false),
                        _ => Value::Str(""),
                    },
                })
            }
        }

        #[test]
        fn a_step_runs_when_its_guards_say_so_and_asks_for_what_it_lacks() {
            let text = "plan remove controlplane\n  do lock cluster\n  \
                do event warning Below when member.dead and approved - 1 < count\n    \
                say \"{machine}: {approved - 1} of {count}\"\n  \
                do etcd leave unless member.dead\n  do release finalizer\n";
            let set = crate::ruleset::build(vec![SourceFile::new("p.rules", text)]);
            let table = set.table.expect("the plan checks");
            let plan = table
                .plans
                .iter()
                .find(|p| p.verb == Verb::Remove)
                .expect("the plan");
            let session = |approved| Session::new(&table, Given { approved, count: 3 });

            // No guard: runs, no message.
            let mut s = session(3);
            assert_eq!(
                s.step(&plan.steps[0]),
                Ok(StepOutcome {
                    runs: true,
                    message: None
                })
            );
            // The guard needs member.dead: the step says so rather than guess.
            assert_eq!(
                s.step(&plan.steps[1]),
                Err(StepError::Needs(Fact::MemberDead))
            );
            assert_eq!(
                s.step(&plan.steps[2]),
                Err(StepError::Needs(Fact::MemberDead))
            );
            // Supplied (as the controller records it, a number): decided, message rendered.
            s.supply_number(Fact::MemberDead, 1);
            assert_eq!(
                s.step(&plan.steps[1]),
                Ok(StepOutcome {
                    runs: true,
                    message: Some("cp-2: 2 of 3".into())
                })
            );
            assert_eq!(
                s.step(&plan.steps[2]),
                Ok(StepOutcome {
                    runs: false,
                    message: None
                })
            );
            // Not below the count: the event's `when` does not hold.
            let mut s = session(5);
            s.supply_number(Fact::MemberDead, 1);
            assert_eq!(
                s.step(&plan.steps[1]),
                Ok(StepOutcome {
                    runs: false,
                    message: None
                })
            );
            // Alive: leave runs.
            let mut s = session(3);
            s.supply_number(Fact::MemberDead, 0);
            assert_eq!(
                s.step(&plan.steps[2]),
                Ok(StepOutcome {
                    runs: true,
                    message: None
                })
            );
        }
    }

    /// A row whose arithmetic needs more registers than the session's array holds runs on
    /// an array of its own (`FlatProgram::wide`), facts asked midway included, and decides
    /// as the stack machine does; the rows after it run as before.
    #[test]
    fn a_wide_program_decides_as_the_stack_machine() {
        use crate::compile::{Options, compile_with};
        use crate::diagnostics::SourceFile;
        use crate::interp::{Facts, Lookup, Session, Value};
        use crate::vocab::{Fact, Site, Subject, Verb};
        struct Given(i64, i64, i64);
        impl<'a> Facts<'a> for Given {
            fn fact(&mut self, fact: Fact) -> Lookup<'a> {
                Lookup::Value(match fact {
                    Fact::Approved => Value::Int(self.0),
                    Fact::Count => Value::Int(self.1),
                    Fact::Workers => Value::Int(self.2),
                    _ => match fact.info().ty {
                        crate::vocab::Type::Int => Value::Int(0),
                        crate::vocab::Type::Bool => Value::Bool(false),
                        _ => Value::Str(""),
                    },
                })
            }
        }
        // Each left operand computed, so each level holds one more register: 30 deep, past
        // the session's array (the int and bool facts, then the registers).
        let mut deep = String::from("(workers + 1)");
        for i in 0..30 {
            let f = ["approved", "count", "workers"][i % 3];
            deep = format!("({f} + {i}) * ({deep} - {f})");
        }
        let text = format!(
            "rule wide\n  refuse remove controlplane\n  when {deep} > approved * 1000\n  say \"w\"\n\n\
             rule after\n  refuse remove controlplane\n  when approved - 1 < count\n  say \"a\"\n"
        );
        let files = vec![SourceFile::new("w.rules", text)];
        let checked = crate::check::check_with(&files, false);
        assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
        let flat = compile_with(&checked.program, &files, Options { flat: true }).expect("flat");
        let stack = compile_with(&checked.program, &files, Options { flat: false }).expect("stack");
        let (_, program) = flat
            .group(Verb::Remove, Subject::ControlPlane, Site::Webhook)
            .expect("the group");
        assert!(program.wide && program.stack_rows.is_empty(), "{program:?}");
        let event = (Verb::Remove, Subject::ControlPlane, Site::Webhook);
        for facts in [
            (0, 0, 0),
            (1, 2, 3),
            (3, 3, 2),
            (5, 3, 1),
            (-7, 40, 9),
            (i64::MAX, 1, 1),
        ] {
            let (a, c, w) = facts;
            let flat_hits = Session::new(&flat, Given(a, c, w)).matches(event);
            let stack_hits = Session::new(&stack, Given(a, c, w)).matches(event);
            assert_eq!(
                flat_hits.map(|h| h.to_vec()),
                stack_hits.map(|h| h.to_vec()),
                "{facts:?}"
            );
        }
    }

    /// `rule NAME audit`: the rule matches and is reported apart, with the verdict it would
    /// have given; it neither refuses, holds nor warns. Switched to enforce, it refuses.
    #[test]
    fn an_audit_rule_is_reported_not_enforced() {
        use crate::diagnostics::SourceFile;
        use crate::interp::{Decision, Facts, Lookup, Session, Value, decide_into};
        use crate::vocab::{Fact, Site, Subject, Verb, Verdict};
        struct Given;
        impl<'a> Facts<'a> for Given {
            fn fact(&mut self, fact: Fact) -> Lookup<'a> {
                Lookup::Value(match fact {
                    Fact::Approved => Value::Int(3),
                    Fact::Count => Value::Int(3),
                    _ => match fact.info().ty {
                        crate::vocab::Type::Int => Value::Int(0),
                        crate::vocab::Type::Bool => Value::Bool(false),
                        _ => Value::Str(""),
                    },
                })
            }
        }
        let text = "rule staged audit\n  refuse remove controlplane\n  when approved - 1 < count\n  say \"s\"\n\n\
                    rule warned\n  warn remove controlplane\n  when approved == 3\n  say \"w\"\n";
        let set = crate::ruleset::build(vec![SourceFile::new("a.rules", text)]);
        let mut table = set.table.expect("the rules check");
        assert!(table.rules.iter().any(|r| r.name == "staged" && r.audit));
        let event = (Verb::Remove, Subject::ControlPlane, Site::Webhook);
        let decide = |table: &crate::compile::Table| {
            let mut decision = Decision::default();
            decide_into(&mut Session::new(table, Given), event, &mut decision).expect("decides");
            decision
        };
        let d = decide(&table);
        assert_eq!(d.verdict(), None);
        assert!(d.refusals.is_empty());
        assert_eq!(d.warnings.len(), 1);
        assert_eq!(d.audited.len(), 1);
        assert_eq!(
            (d.audited[0].rule.as_str(), d.audited[0].verdict),
            ("staged", Verdict::Refuse)
        );
        assert!(table.set_audit("staged", false));
        assert!(!table.set_audit("no-such-rule", true));
        let d = decide(&table);
        assert_eq!(d.verdict(), Some(Verdict::Refuse));
        assert!(d.audited.is_empty());
    }

    #[test]
    fn push_int_writes_what_display_writes() {
        for v in [
            0,
            1,
            -1,
            9,
            10,
            -10,
            99,
            100,
            12_345,
            -987_654_321,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ] {
            let mut out = String::from("x=");
            push_int(&mut out, v);
            assert_eq!(out, format!("x={v}"));
        }
    }
}
