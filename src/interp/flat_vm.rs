//! The hot path: a group's flat branch program (see [`crate::compile::flat`]).

use super::cache::FactCache;
use super::{EvalError, Facts, Flow, Hit, Hits, Interrupt, Session, Stop};
use crate::compile::flat::{self, REG_BASE, SESSION_VALUES, VALUES};
use crate::compile::{FlatProgram, Row};
use crate::vocab::Verdict;
use std::sync::Arc;

impl<'a, F: Facts<'a>> Session<'a, F> {
    /// Runs a group's flat program: every row, in order, adding the ones that fire.
    pub(super) fn run_group(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        hits: &mut Hits,
    ) -> Result<(), Interrupt> {
        if program.stack_only {
            return self.run_stack_rows(rows, program, hits);
        }
        if program.wide {
            let mut wide = Wide([0; VALUES]);
            self.run_on(rows, program, hits, &mut wide)
        } else {
            self.run_on(rows, program, hits, &mut Narrow)
        }
    }

    /// A program of rows all on the stack machine (each row's `fires` code, in order: what
    /// the flat loop would do, each row's `Stack` instruction at a time).
    #[inline(never)]
    fn run_stack_rows(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        hits: &mut Hits,
    ) -> Result<(), Interrupt> {
        for (code, &at) in program.deep.iter().zip(&program.stack_rows) {
            let result = self.run(code).map(|v| v != 0);
            let error = match result {
                Ok(_) => None,
                Err(Stop::Need(f)) => return Err(Interrupt::Need(f)),
                Err(Stop::Fail(e)) => Some(e),
            };
            // As `resume` does: a row that could not be evaluated matches unless it warns.
            if let Some(row) = rows.get(at as usize)
                && (result == Ok(true) || (error.is_some() && row.verdict != Verdict::Warn))
            {
                hits.push(Hit {
                    rule: row.rule,
                    verdict: row.verdict,
                    error,
                });
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn run_on<V: Values<'a, F>>(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        hits: &mut Hits,
        vals: &mut V,
    ) -> Result<(), Interrupt> {
        let mut pc = 0;
        loop {
            vals.sync(&self.cache);
            match self.exec(rows, program, pc, hits, vals) {
                Ok(Flow::End) => return Ok(()),
                // A row on the stack machine: the usual case of `flat: false`.
                Ok(Flow::Stack) => pc = self.stack_row(rows, program, hits)?,
                stopped => pc = self.resume(rows, program, stopped, hits)?,
            }
        }
    }

    /// Runs the row whose `Stack` instruction is at `self.pc` on the stack machine; where
    /// the program goes on.
    #[inline(always)]
    fn stack_row(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        hits: &mut Hits,
    ) -> Result<usize, Interrupt> {
        let stack = program.ins.get(self.pc).and_then(|i| {
            let code = program.deep.get(usize::try_from(i.d).ok()?)?;
            Some((code, usize::try_from(i.k).ok()?))
        });
        let Some((code, at)) = stack else {
            return self.resume(rows, program, Ok(Flow::Stack), hits);
        };
        match self.run(code) {
            Ok(fires) => {
                if fires != 0
                    && let Some(row) = rows.get(at)
                {
                    hits.push(Hit {
                        rule: row.rule,
                        verdict: row.verdict,
                        error: None,
                    });
                }
                Ok(program.next_entry(at))
            }
            Err(e) => self.resume(rows, program, Err(e), hits),
        }
    }

    /// Where the program goes on after it stopped before its end, at `self.pc`: a row on
    /// the stack machine (run there), or a row that could not be evaluated. Out of the hot
    /// loop: the usual decision never stops.
    #[inline(never)]
    fn resume(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        stopped: Result<Flow, Stop>,
        hits: &mut Hits,
    ) -> Result<usize, Interrupt> {
        let (result, at) = match stopped {
            // (Not stopped: `run_group` ends there.) The program's last instruction, `End`.
            Ok(Flow::End) => return Ok(program.ins.len().saturating_sub(1)),
            // A row on the stack machine: its `fires` code, found from the instruction.
            Ok(Flow::Stack) => match program.ins.get(self.pc) {
                Some(i) => {
                    let code = usize::try_from(i.d).ok().and_then(|d| program.deep.get(d));
                    let result = match code {
                        Some(code) => self.run(code).map(|v| v != 0),
                        None => Err(Stop::Fail(EvalError::Type)),
                    };
                    (
                        result,
                        usize::try_from(i.k).unwrap_or_else(|_| program.row_at(self.pc)),
                    )
                }
                None => (Err(Stop::Fail(EvalError::Type)), program.row_at(self.pc)),
            },
            Err(e) => (Err(e), program.row_at(self.pc)),
        };
        let error = match result {
            Ok(_) => None,
            Err(Stop::Need(f)) => return Err(Interrupt::Need(f)),
            Err(Stop::Fail(e)) => Some(e),
        };
        // A row that could not be evaluated: refuse and hold rows match (fail closed),
        // warn rows do not.
        if let Some(row) = rows.get(at)
            && (result == Ok(true) || (error.is_some() && row.verdict != Verdict::Warn))
        {
            hits.push(Hit {
                rule: row.rule,
                verdict: row.verdict,
                error,
            });
        }
        Ok(program.next_entry(at))
    }

    /// Runs a flat program from `pc` to its end, or to the first error (its `pc` left in
    /// `self.pc`).
    #[inline]
    pub(super) fn exec(
        &mut self,
        rows: &[Row],
        program: &FlatProgram,
        mut pc: usize,
        hits: &mut Hits,
        vals: &mut impl Values<'a, F>,
    ) -> Result<Flow, Stop> {
        use flat::Op as F;
        let cache = &mut self.cache;
        let strings: &'a [Arc<str>] = &self.table.strings;
        let ins = program.ins.as_slice();
        macro_rules! fail {
            ($e:expr) => {{
                self.pc = pc;
                return Err(Stop::Fail($e));
            }};
        }
        macro_rules! arith {
            ($i:expr, $a:expr, $f:ident, $b:expr) => {{
                let (a, b) = ($a, $b);
                match a.$f(b) {
                    Some(v) => vals.set(cache, $i.x, v),
                    None if b == 0 => fail!(EvalError::DivisionByZero),
                    None => fail!(EvalError::Overflow),
                }
                pc += 1;
            }};
        }
        // The facts known, kept in a register (updated where facts are asked).
        let mut known = cache.known;
        // Every jump goes forward (see `compile::flat`), so this ends.
        loop {
            let Some(i) = ins.get(pc) else {
                fail!(EvalError::Type)
            };
            if known & i.need != i.need {
                if let Err(e) = cache.need(i) {
                    self.pc = pc;
                    return Err(e);
                }
                known = cache.known;
                vals.sync(cache);
            }
            let a = vals.get(cache, i.a);
            macro_rules! b {
                () => {
                    vals.get(cache, i.b)
                };
            }
            // The comparisons, most of what a program runs, without a jump through the table
            // of operations: their right operands are chosen, not branched to.
            if i.op <= F::CmpDiv {
                let Some(a) = a.checked_add(i64::from(i.d)) else {
                    fail!(EvalError::Overflow)
                };
                let v = if i.op == F::CmpK { 0 } else { b!() };
                let v = if i.op == F::CmpDiv { div_p2(v, i.x) } else { v };
                let Some(b) = v.checked_add(i.k) else {
                    fail!(EvalError::Overflow)
                };
                // 0 less, 1 equal, 2 greater
                let ord = usize::from(a >= b) + usize::from(a > b);
                pc = i.to[ord] as usize;
                continue;
            }
            match i.op {
                // Handled above.
                F::CmpK | F::Cmp | F::CmpDiv => fail!(EvalError::Type),
                F::Test => pc = i.to[usize::from(a != 0)] as usize,
                F::Hit => {
                    if let Some(row) = rows.get(i.k as usize) {
                        hits.push(Hit {
                            rule: row.rule,
                            verdict: row.verdict,
                            error: None,
                        });
                    }
                    pc += 1;
                }
                F::End => return Ok(Flow::End),
                F::AddK => arith!(i, a, checked_add, i.k),
                F::SubK => arith!(i, a, checked_sub, i.k),
                F::MulK => arith!(i, a, checked_mul, i.k),
                F::DivK => arith!(i, a, checked_div, i.k),
                F::DivP2 => {
                    vals.set(cache, i.x, div_p2(a, (i.k & 63) as u8));
                    pc += 1;
                }
                F::ModK => arith!(i, a, checked_rem, i.k),
                F::Add => arith!(i, a, checked_add, b!()),
                F::Sub => arith!(i, a, checked_sub, b!()),
                F::Mul => arith!(i, a, checked_mul, b!()),
                F::Div => arith!(i, a, checked_div, b!()),
                F::Mod => arith!(i, a, checked_rem, b!()),
                F::Neg => match a.checked_neg() {
                    Some(v) => {
                        vals.set(cache, i.x, v);
                        pc += 1;
                    }
                    None => fail!(EvalError::Overflow),
                },
                F::Mov => {
                    vals.set(cache, i.x, i.k);
                    pc += 1;
                }
                F::Set => {
                    vals.set(cache, i.x, i.k);
                    pc = i.to[0] as usize;
                }
                F::Text => {
                    let Some(&(ta, tb)) = program.texts.get(i.k as usize) else {
                        fail!(EvalError::Type)
                    };
                    let eq = match cache.text(ta, strings) {
                        Ok(ta) => cache.text(tb, strings).map(|tb| ta == tb),
                        Err(e) => Err(e),
                    };
                    known = cache.known;
                    vals.sync(cache);
                    match eq {
                        Ok(eq) => pc = i.to[usize::from(eq)] as usize,
                        Err(Stop::Fail(e)) => fail!(e),
                        Err(e) => return Err(e),
                    }
                }
                F::Jump => pc = i.to[0] as usize,
                F::Stack => {
                    self.pc = pc;
                    return Ok(Flow::Stack);
                }
                F::Need => pc += 1,
                F::Invalid => fail!(EvalError::Type),
            }
        }
    }
}

/// Where a flat program's values live: the facts the session knows, and the registers.
pub(super) trait Values<'a, F> {
    fn get(&self, cache: &FactCache<'a, F>, index: u8) -> i64;
    fn set(&mut self, cache: &mut FactCache<'a, F>, index: u8, value: i64);
    /// Takes the facts the session learnt since (after facts were asked).
    fn sync(&mut self, cache: &FactCache<'a, F>);
}

/// The session's own array: a program whose indexes all fall below [`SESSION_VALUES`].
pub(super) struct Narrow;

impl<'a, F> Values<'a, F> for Narrow {
    #[inline(always)]
    fn get(&self, cache: &FactCache<'a, F>, index: u8) -> i64 {
        cache.vals[usize::from(index) & (SESSION_VALUES - 1)]
    }
    #[inline(always)]
    fn set(&mut self, cache: &mut FactCache<'a, F>, index: u8, value: i64) {
        cache.vals[usize::from(index) & (SESSION_VALUES - 1)] = value;
    }
    #[inline(always)]
    fn sync(&mut self, _: &FactCache<'a, F>) {}
}

/// An array of [`VALUES`] for a [`wide`](flat::FlatProgram::wide) program: the session's
/// facts copied in (again whenever facts are asked), its registers its own.
pub(super) struct Wide(pub(super) [i64; VALUES]);

impl<'a, F> Values<'a, F> for Wide {
    #[inline(always)]
    fn get(&self, _: &FactCache<'a, F>, index: u8) -> i64 {
        self.0[usize::from(index) & (VALUES - 1)]
    }
    #[inline(always)]
    fn set(&mut self, _: &mut FactCache<'a, F>, index: u8, value: i64) {
        self.0[usize::from(index) & (VALUES - 1)] = value;
    }
    #[inline(always)]
    fn sync(&mut self, cache: &FactCache<'a, F>) {
        self.0[..REG_BASE].copy_from_slice(&cache.vals[..REG_BASE]);
    }
}

/// `a / 2^n` for `n` in 1..=62, truncated towards zero as `/` truncates: a negative value is
/// biased first (the bias makes it no larger, so this cannot overflow). No hardware division.
#[inline(always)]
fn div_p2(a: i64, n: u8) -> i64 {
    let n = u32::from(n & 63);
    let bias = (a >> 63) & ((1i64 << n) - 1);
    (a + bias) >> n
}

#[cfg(test)]
mod tests {
    /// A shift divides as `/` does, negative values and the extremes included.
    #[test]
    fn div_p2_is_division() {
        for a in [
            0,
            1,
            -1,
            2,
            -2,
            3,
            -3,
            7,
            -7,
            1023,
            -1025,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
            i64::MAX - 1,
        ] {
            for n in 1..=62u8 {
                assert_eq!(super::div_p2(a, n), a / (1i64 << n), "{a} / 2^{n}");
            }
        }
    }
}
