//! The facts of a session: asked of the provider at most once, then read from the cache.

use super::{EvalError, Facts, Lookup, Stop, Value};
use crate::compile::Text;
use crate::compile::flat::{self, SESSION_VALUES, SLOT_OF_VALUE, VALUE_OF_SLOT, VALUES};
use crate::vocab::{FACT_COUNT, FACTS, Fact, Type};
use std::sync::Arc;

/// Where each name or enum fact keeps its text in [`FactCache::texts`] (`u8::MAX`: not a
/// text fact).
pub(super) const TEXT_SLOT: [u8; FACT_COUNT] = {
    let mut slots = [u8::MAX; FACT_COUNT];
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            slots[i] = n;
            n += 1;
        }
        i += 1;
    }
    slots
};

/// The fact of each slot (what [`Fact::from_slot`] answers, without its lookup in the
/// vocabulary's table of descriptions).
const FACT_OF_SLOT: [Fact; FACT_COUNT] = {
    let mut facts = [Fact::Approved; FACT_COUNT];
    let mut i = 0;
    while i < FACT_COUNT {
        facts[i] = FACTS[i].fact;
        i += 1;
    }
    facts
};

/// The number of name and enum facts.
pub(super) const TEXT_FACTS: usize = {
    let (mut i, mut n) = (0, 0);
    while i < FACT_COUNT {
        if matches!(FACTS[i].ty, Type::Name | Type::Enum(_)) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The facts of a session: asked of the provider at most once, then read from here.
pub(super) struct FactCache<'a, F> {
    pub(super) facts: F,
    /// Int and bool facts (bools as 0/1) at [`VALUE_OF_SLOT`], valid where `known` has
    /// their bit; then the registers of the flat programs that are not
    /// [`wide`](flat::FlatProgram::wide) (see [`flat`]). A power of two long, so an index
    /// masked into range needs no bounds check.
    pub(super) vals: [i64; SESSION_VALUES],
    /// Name and enum facts, valid where `known` has their bit.
    pub(super) texts: [Option<&'a str>; TEXT_FACTS],
    pub(super) known: u64,
    /// What a traced session records (`None`: one pointer, all an untraced decision
    /// writes to start and tests to drop).
    pub(super) tracing: Option<Box<Tracing<'a>>>,
}

/// What a traced session records.
#[derive(Default)]
pub(super) struct Tracing<'a> {
    /// Every row considered, for the explanation.
    pub(super) rows: Vec<super::TraceRow>,
    /// Every fact asked for, in order, with its value.
    pub(super) asked: Vec<(Fact, Value<'a>)>,
}

impl<'a, F: Facts<'a>> FactCache<'a, F> {
    pub(super) fn store(&mut self, slot: usize, value: Value<'a>) {
        if slot >= FACT_COUNT {
            return;
        }
        let at = usize::from(VALUE_OF_SLOT[slot]) % SESSION_VALUES;
        match value {
            Value::Int(i) => self.vals[at] = i,
            Value::Bool(b) => self.vals[at] = i64::from(b),
            Value::Str(s) => {
                if let Some(t) = self.texts.get_mut(usize::from(TEXT_SLOT[slot])) {
                    *t = Some(s);
                }
            }
        }
        self.known |= 1 << slot;
    }

    /// Makes sure a fact is known: a bit test, or one question to the provider.
    #[inline(always)]
    pub(super) fn ensure(&mut self, slot: usize) -> Result<(), Stop> {
        if self.known & (1u64 << (slot & 63)) != 0 && slot < FACT_COUNT {
            return Ok(());
        }
        self.fetch(slot)
    }

    #[inline(never)]
    pub(super) fn fetch(&mut self, slot: usize) -> Result<(), Stop> {
        self.ask(slot)
    }

    /// The value of an int or bool fact, once [`Self::ensure`]d.
    #[inline(always)]
    pub(super) fn value(&self, slot: usize) -> i64 {
        let at = VALUE_OF_SLOT
            .get(slot)
            .map_or(SESSION_VALUES - 1, |&v| usize::from(v));
        self.vals[at % SESSION_VALUES]
    }

    /// Asks the provider for a fact and keeps the answer.
    #[inline(always)]
    pub(super) fn ask(&mut self, slot: usize) -> Result<(), Stop> {
        let Some(&fact) = FACT_OF_SLOT.get(slot) else {
            return Err(Stop::Fail(EvalError::Type));
        };
        match self.facts.fact(fact) {
            Lookup::Value(v) => {
                self.store(slot, v);
                if let Some(t) = &mut self.tracing {
                    t.asked.push((fact, v));
                }
                Ok(())
            }
            Lookup::Later => Err(Stop::Need(fact)),
        }
    }

    /// Asks for the facts an instruction reads that are not known yet, left operand first:
    /// inlined into the interpreter loop, with the provider.
    #[inline(always)]
    pub(super) fn need(&mut self, ins: &flat::Ins) -> Result<(), Stop> {
        // `need` has the bits of `a` and `b` when they are facts, and no others. Both
        // unknown: the left operand's first; then whichever is still unknown.
        let missing = ins.need & !self.known;
        if missing & missing.wrapping_sub(1) != 0 {
            self.ask(usize::from(SLOT_OF_VALUE[usize::from(ins.a) % VALUES]))?;
        }
        let rest = ins.need & !self.known;
        if rest != 0 {
            self.ask(rest.trailing_zeros() as usize)?;
        }
        Ok(())
    }

    pub(super) fn text(&mut self, t: Text, strings: &'a [Arc<str>]) -> Result<&'a str, Stop> {
        match t {
            Text::Const(i) => match strings.get(i as usize) {
                Some(s) => Ok(&**s),
                None => Err(Stop::Fail(EvalError::Type)),
            },
            Text::Fact(slot) => {
                let slot = slot as usize;
                self.ensure(slot)?;
                let text = TEXT_SLOT
                    .get(slot)
                    .and_then(|&t| self.texts.get(usize::from(t)));
                Ok(text.copied().flatten().unwrap_or(""))
            }
        }
    }
}
