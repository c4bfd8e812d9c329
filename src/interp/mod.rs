//! Evaluates a decision table against facts. Pure: no I/O, no clock. Facts are asked for
//! only when a row needs them, at most once per session; a provider that cannot answer yet
//! (an expensive fact needing etcd) interrupts the session, and the caller supplies the value
//! and runs it again.

pub mod explain;
pub mod value;

use crate::check::Event;
use crate::compile::{Code, MAX_STACK, Op, Piece, Table};
use crate::syntax::ast::UnOp;
use crate::vocab::{FACT_COUNT, Fact, Verdict};
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

/// Why a session stopped before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// Fetch this fact, [`Session::supply`] it, and run again.
    Need(Fact),
}

/// One matching row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub rule: u32,
    pub verdict: Verdict,
    /// Set when the row could not be evaluated; refuse and hold rows then match (fail closed).
    pub error: Option<EvalError>,
}

/// One row as the explanation shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TraceRow {
    pub event: String,
    pub rule: String,
    pub verdict: Verdict,
    pub when: Option<bool>,
    pub unless: Option<bool>,
    pub matched: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A decision in progress for one event's facts.
pub struct Session<'a, F> {
    table: &'a Table,
    facts: F,
    cache: [Option<Value<'a>>; FACT_COUNT],
    /// Every fact asked for, in order, with its value.
    pub asked: Vec<(Fact, Value<'a>)>,
    pub trace: Option<Vec<TraceRow>>,
}

impl<'a, F: Facts<'a>> Session<'a, F> {
    pub fn new(table: &'a Table, facts: F) -> Self {
        Session {
            table,
            facts,
            cache: [None; FACT_COUNT],
            asked: Vec::new(),
            trace: None,
        }
    }

    /// Records every row considered and every fact asked for.
    pub fn traced(mut self) -> Self {
        self.trace = Some(Vec::new());
        self
    }

    /// Supplies a fact the provider answered [`Lookup::Later`] for.
    pub fn supply(&mut self, fact: Fact, value: Value<'a>) {
        self.cache[fact.slot()] = Some(value);
    }

    pub fn facts_mut(&mut self) -> &mut F {
        &mut self.facts
    }

    /// The matching rows of one (verb, subject, site), in source order. The hot path: no
    /// allocation unless something matches.
    pub fn matches(&mut self, event: Event) -> Result<Vec<Hit>, Interrupt> {
        let (verb, subject, site) = event;
        let table = self.table;
        let mut hits = Vec::new();
        for row in table.rows(verb, subject, site) {
            let when = match &row.when {
                Some(c) => Some(self.condition(c)?),
                None => None,
            };
            let when_ok = match when {
                None | Some(Ok(true)) => true,
                Some(Ok(false)) => false,
                Some(Err(_)) => true,
            };
            let unless = match (&row.unless, when_ok) {
                (Some(c), true) => Some(self.condition(c)?),
                _ => None,
            };
            let error = match (when, unless) {
                (Some(Err(e)), _) | (_, Some(Err(e))) => Some(e),
                _ => None,
            };
            let matched = match error {
                Some(_) => row.verdict != Verdict::Warn,
                None => when_ok && !matches!(unless, Some(Ok(true))),
            };
            if let Some(trace) = &mut self.trace {
                trace.push(TraceRow {
                    event: format!("{} {} at {}", verb.name(), subject.name(), site.name()),
                    rule: table
                        .rules
                        .get(row.rule as usize)
                        .map(|r| r.name.clone())
                        .unwrap_or_default(),
                    verdict: row.verdict,
                    when: when.and_then(|r| r.ok()),
                    unless: unless.and_then(|r| r.ok()),
                    matched,
                    error: error.map(|e| e.to_string()),
                });
            }
            if matched {
                hits.push(Hit {
                    rule: row.rule,
                    verdict: row.verdict,
                    error,
                });
            }
        }
        Ok(hits)
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
        let mut out = String::new();
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Value(code) => match self.run(code)? {
                    Ok(v) => {
                        use std::fmt::Write;
                        let _ = write!(out, "{v}");
                    }
                    Err(e) => out.push_str(&format!("<{e}>")),
                },
            }
        }
        Ok(out)
    }

    /// Evaluates a guard (plans): true when it holds.
    pub fn guard(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        self.condition(code)
    }

    fn condition(&mut self, code: &Code) -> Result<Result<bool, EvalError>, Interrupt> {
        Ok(match self.run(code)? {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(_) => Err(EvalError::Type),
            Err(e) => Err(e),
        })
    }

    fn fact(&mut self, slot: u8) -> Result<Result<Value<'a>, EvalError>, Interrupt> {
        let slot = slot as usize;
        if let Some(Some(v)) = self.cache.get(slot) {
            return Ok(Ok(*v));
        }
        let Some(fact) = Fact::from_slot(slot) else {
            return Ok(Err(EvalError::Type));
        };
        match self.facts.fact(fact) {
            Lookup::Value(v) => {
                self.cache[slot] = Some(v);
                if self.trace.is_some() {
                    self.asked.push((fact, v));
                }
                Ok(Ok(v))
            }
            Lookup::Later => Err(Interrupt::Need(fact)),
        }
    }

    /// The stack machine.
    fn run(&mut self, code: &Code) -> Result<Result<Value<'a>, EvalError>, Interrupt> {
        let strings = &self.table.strings;
        let mut stack = [Value::Int(0); MAX_STACK];
        let mut sp = 0usize;
        let mut pc = 0usize;
        let ops = &code.ops;
        macro_rules! push {
            ($v:expr) => {{
                if sp >= MAX_STACK {
                    return Ok(Err(EvalError::Overflow));
                }
                stack[sp] = $v;
                sp += 1;
            }};
        }
        macro_rules! pop {
            () => {{
                if sp == 0 {
                    return Ok(Err(EvalError::Type));
                }
                sp -= 1;
                stack[sp]
            }};
        }
        while let Some(op) = ops.get(pc) {
            pc += 1;
            match *op {
                Op::Fact(slot) => match self.fact(slot)? {
                    Ok(v) => push!(v),
                    Err(e) => return Ok(Err(e)),
                },
                Op::Int(i) => push!(Value::Int(i)),
                Op::Bool(b) => push!(Value::Bool(b)),
                Op::Str(i) => match strings.get(i as usize) {
                    Some(s) => push!(Value::Str(s)),
                    None => return Ok(Err(EvalError::Type)),
                },
                Op::Not => match pop!() {
                    Value::Bool(b) => push!(Value::Bool(!b)),
                    _ => return Ok(Err(EvalError::Type)),
                },
                Op::Neg => match pop!() {
                    Value::Int(i) => match i.checked_neg() {
                        Some(n) => push!(Value::Int(n)),
                        None => return Ok(Err(EvalError::Overflow)),
                    },
                    _ => return Ok(Err(EvalError::Type)),
                },
                Op::Bin(op) => {
                    let r = pop!();
                    let l = pop!();
                    match value::binary(op, l, r) {
                        Ok(v) => push!(v),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                Op::JumpIfFalse(target) | Op::JumpIfTrue(target) => {
                    let want = matches!(op, Op::JumpIfTrue(_));
                    match stack.get(sp.wrapping_sub(1)) {
                        Some(Value::Bool(b)) if *b == want => pc = target as usize,
                        Some(Value::Bool(_)) => sp -= 1,
                        _ => return Ok(Err(EvalError::Type)),
                    }
                }
            }
        }
        let _ = UnOp::Not;
        Ok(match sp {
            1 => Ok(stack[0]),
            _ => Err(EvalError::Type),
        })
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
            .map(|r| (r.name.clone(), r.reason.clone()))
            .unwrap_or_default();
        let finding = Finding {
            rule: rule.0,
            verdict: hit.verdict,
            message,
            reason: rule.1,
        };
        let list = match hit.verdict {
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
