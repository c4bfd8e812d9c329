//! The facts of a session: asked of the provider at most once, then read from the cache.

use super::{EvalError, Facts, Lookup, Stop, Value};
use crate::compile::Text;
use crate::compile::flat::{self, VALUES};
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
    /// Int and bool facts (bools as 0/1) by slot, valid where `known` has their bit; then
    /// the registers of the flat programs (see [`flat`]). A power of two long, so an index
    /// masked into range needs no bounds check.
    pub(super) vals: [i64; VALUES],
    /// Name and enum facts, valid where `known` has their bit.
    pub(super) texts: [Option<&'a str>; TEXT_FACTS],
    pub(super) known: u32,
    /// Every fact asked for, in order, with its value (only when tracing).
    pub(super) asked: Vec<(Fact, Value<'a>)>,
    pub(super) record: bool,
}

impl<'a, F: Facts<'a>> FactCache<'a, F> {
    pub(super) fn store(&mut self, slot: usize, value: Value<'a>) {
        if slot >= FACT_COUNT {
            return;
        }
        match value {
            Value::Int(i) => self.vals[slot % VALUES] = i,
            Value::Bool(b) => self.vals[slot % VALUES] = i64::from(b),
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
        if self.known & (1u32 << (slot & 31)) != 0 && slot < FACT_COUNT {
            return Ok(());
        }
        self.fetch(slot)
    }

    #[inline(never)]
    pub(super) fn fetch(&mut self, slot: usize) -> Result<(), Stop> {
        self.ask(slot)
    }

    /// Asks the provider for a fact and keeps the answer.
    #[inline(always)]
    pub(super) fn ask(&mut self, slot: usize) -> Result<(), Stop> {
        let Some(fact) = Fact::from_slot(slot) else {
            return Err(Stop::Fail(EvalError::Type));
        };
        match self.facts.fact(fact) {
            Lookup::Value(v) => {
                self.store(slot, v);
                if self.record {
                    self.asked.push((fact, v));
                }
                Ok(())
            }
            Lookup::Later => Err(Stop::Need(fact)),
        }
    }

    /// Asks for the facts an instruction reads that are not known yet, left operand first.
    /// Inlined into the interpreter loop, with the provider.
    #[inline(always)]
    pub(super) fn need(&mut self, ins: &flat::Ins) -> Result<(), Stop> {
        // `need` has the bits of `a` and `b` when they are fact slots, and no others.
        let a_bit = 1u32.checked_shl(u32::from(ins.a)).unwrap_or(0) & ins.need;
        if a_bit & !self.known != 0 {
            self.ask(usize::from(ins.a))?;
        }
        if ins.need & !a_bit & !self.known != 0 {
            self.ask(usize::from(ins.b))?;
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
