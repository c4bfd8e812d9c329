//! The statements: rules, plans and their steps, messages, invariants.

use super::*;
use crate::vocab::{MAX_STEP_TIMEOUT_SECS, OPERATION_KINDS, Scope, Timeout};

impl<'a, 'd> FileChecker<'a, 'd> {
    pub(super) fn check_rule(&mut self, r: &'a RuleDef) -> Option<CheckedRule> {
        let verdict = match r.verdict.name.as_str() {
            "refuse" => Verdict::Refuse,
            "hold" => Verdict::Hold,
            _ => Verdict::Warn,
        };
        let events = self.events(&r.verbs, &r.subject, r.site.as_ref(), Some(verdict));
        let mut ok = !events.is_empty();
        let cond = |c: &mut Self, e: &'a Option<Expr>, what: &str| -> bool {
            let Some(e) = e else { return true };
            let ty = c.type_in(e, &events);
            if ty != Ty::Known(Type::Bool) && ty != Ty::Error {
                c.diags.push(
                    Diagnostic::error(
                        Code::NotACondition,
                        c.file,
                        e.span,
                        format!(
                            "a `{what}` condition must be a bool, this is {}",
                            ty.describe()
                        ),
                    )
                    .label(ty.describe())
                    .help("compare it with something, e.g. `after < count`"),
                );
                return false;
            }
            ty != Ty::Error
        };
        ok &= cond(self, &r.when, "when");
        ok &= cond(self, &r.unless, "unless");
        match (&r.say, verdict) {
            (Some(m), _) => ok &= self.check_message(m, &events),
            (None, _) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::MissingMessage,
                        self.file,
                        r.name.span,
                        format!("the rule `{}` has no message", r.name.name),
                    )
                    .label("needs `say \"...\"`")
                    .help(
                        "every rule says why, in words the person who made the request can act on",
                    ),
                );
                ok = false;
            }
        }
        if verdict == Verdict::Hold && r.reason.is_none() {
            self.diags.push(
                Diagnostic::error(
                    Code::HoldNeedsReason,
                    self.file,
                    r.verdict.span,
                    "a `hold` needs a condition reason",
                )
                .label("no `reason`")
                .help("add `reason SomeReason` (it becomes Ready=False with that reason)"),
            );
            ok = false;
        }
        if let Some(reason) = &r.reason
            && !is_condition_reason(&reason.name)
        {
            self.diags.push(
                Diagnostic::error(
                    Code::BadReason,
                    self.file,
                    reason.span,
                    format!("`{}` is not a condition reason", reason.name),
                )
                .label("not CamelCase")
                .help(
                    "Kubernetes condition reasons are CamelCase words, e.g. `ControlPlaneOverCap`",
                ),
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let src = |e: &Option<Expr>| e.as_ref().map(|e| e.to_string());
        self.inline_too_deep.set(false);
        let (when, typed_when) = r.when.as_ref().map(|e| self.inline_typed(e)).unzip();
        let (unless, typed_unless) = r.unless.as_ref().map(|e| self.inline_typed(e)).unzip();
        let (message, typed_message) = self.inline_message(r.say.as_ref()?);
        if self.inline_too_deep.get() {
            self.diags.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    r.name.span,
                    format!(
                        "`{}` uses definitions that refer to each other more than {MAX_LET_DEPTH} levels deep",
                        r.name.name
                    ),
                )
                .label("too deep")
                .help("flatten the chain of `let`s"),
            );
            return None;
        }
        Some(CheckedRule {
            name: r.name.name.clone(),
            audit: r.audit,
            file: self.file,
            span: r.span,
            verdict,
            events,
            head: format!(
                "{} {}",
                r.verbs
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                r.subject.name
            ),
            when_text: src(&r.when),
            unless_text: src(&r.unless),
            when,
            unless,
            reason: r.reason.as_ref().map(|i| i.name.clone()),
            say_text: r.say.as_ref()?.source_text(),
            message,
            lets: self.lets_of(r.when.iter().chain(&r.unless), r.say.as_ref()),
            typed: Annotated {
                when: typed_when,
                unless: typed_unless,
                message: Some(typed_message),
            },
        })
    }

    pub(super) fn check_plan(&mut self, p: &'a PlanDef) -> Option<CheckedPlan> {
        let events: Vec<Event> = self
            .events(
                std::slice::from_ref(&p.verb),
                &p.subject,
                None,
                Some(Verdict::Refuse),
            )
            .into_iter()
            .filter(|(_, _, site)| *site == Site::Controller)
            .collect();
        if events.is_empty() {
            if Subject::parse(&p.subject.name).is_some() && resolve_verb(&p.verb.name).is_some() {
                self.diags.push(
                    Diagnostic::error(
                        Code::PlanNotAtController,
                        self.file,
                        p.verb.span.to(p.subject.span),
                        format!(
                            "the controller never runs `{} {}`, so no plan can",
                            p.verb.name, p.subject.name
                        ),
                    )
                    .label("no controller event")
                    .help("plans exist for what the controller does: `remove controlplane`, `run operation`, `snapshot backup`"),
                );
            }
            return None;
        }
        // A group is refused even when only one of its verbs reaches the controller
        // (`leave controlplane` is `remove` there): a plan names the verb it is for.
        let group = resolve_verb(&p.verb.name).is_some_and(|vs| vs.len() > 1);
        if events.len() != 1 || group {
            let verbs: Vec<&str> = events.iter().map(|(v, _, _)| v.name()).collect();
            self.diags.push(
                Diagnostic::error(
                    Code::PlanGroup,
                    self.file,
                    p.verb.span,
                    format!("a plan is for one verb, not the group `{}`", p.verb.name),
                )
                .label("several verbs")
                .help(if verbs.len() == 1 {
                    format!(
                        "at the controller `{}` is only `{}`: write `plan {} {}`",
                        p.verb.name, verbs[0], verbs[0], p.subject.name
                    )
                } else {
                    "write one plan per verb".to_string()
                }),
            );
            return None;
        }
        let (verb, subject, _) = events[0];
        let scope = Scope::of(verb);
        // An operation's plan is per kind: `plan run operation "reboot"`.
        let kind = match (&p.kind, verb) {
            (Some(k), Verb::Run) if OPERATION_KINDS.contains(&k.name.as_str()) => {
                Some(k.name.clone())
            }
            (Some(k), Verb::Run) => {
                let mut d = Diagnostic::error(
                    Code::PlanKind,
                    self.file,
                    k.span,
                    format!("`{}` is not an operation kind", k.name),
                )
                .label("no such kind");
                d = match did_you_mean(&k.name, OPERATION_KINDS.iter().copied()) {
                    Some(s) => d.help(format!("did you mean `\"{s}\"`?")),
                    None => d.help(format!(
                        "the operation kinds are {}",
                        backticked(OPERATION_KINDS)
                    )),
                };
                self.diags.push(d);
                return None;
            }
            (None, Verb::Run) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::PlanKind,
                        self.file,
                        p.verb.span.to(p.subject.span),
                        format!(
                            "`plan {} {}` names no operation kind",
                            p.verb.name, p.subject.name
                        ),
                    )
                    .label("which kind?")
                    .help("an operation's plan is per kind: write `plan run operation \"reboot\"`"),
                );
                return None;
            }
            (Some(k), _) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::PlanKind,
                        self.file,
                        k.span,
                        format!(
                            "`plan {} {}` is not an operation's, so it names no kind",
                            p.verb.name, p.subject.name
                        ),
                    )
                    .label("a kind here")
                    .help("only `plan run operation \"<kind>\"` names a kind; remove it"),
                );
                return None;
            }
            (None, _) => None,
        };
        let mut steps = Vec::new();
        let mut ok = true;
        for s in &p.steps {
            match self.check_step(s, &events, scope) {
                Some(step) => steps.push(step),
                None => ok = false,
            }
        }
        // The controller recounts and runs disruptive work under the cluster lock, one piece
        // at a time per cluster (ADR 0010): a plan that disrupts says so by taking it first,
        // so the text never claims less than the controller does.
        if ok
            && let Some(first) = steps.iter().find(|s| s.action.disruptive())
            && steps.first().map(|s| s.action) != Some(Action::LockCluster)
        {
            self.diags.push(
                Diagnostic::error(
                    Code::PlanWithoutLock,
                    self.file,
                    p.verb.span.to(p.subject.span),
                    format!(
                        "`plan {} {}` runs `{}` without taking the cluster lock first",
                        p.verb.name,
                        p.subject.name,
                        first.action.words().join(" ")
                    ),
                )
                .label("no `do lock cluster` first")
                .secondary(self.file, first.span, "a disruptive step")
                .help(
                    "disruptive steps (drain, etcd, talos) run one at a time per cluster, under its lock, after a recount: start the plan with `do lock cluster`",
                ),
            );
            return None;
        }
        // `wait node-back` waits for a boot time other than the one recorded before the
        // call that took the node down; with no such call before it, nothing was recorded
        // and it passes at once, so the plan would go on with the node never taken down
        // (and, with the call after it, never waited for).
        if ok
            && let Some(wait) = steps.iter().position(|s| s.action == Action::WaitNodeBack)
            && !steps[..wait].iter().any(|s| s.action.reboots())
        {
            let mut d = Diagnostic::error(
                Code::WaitWithoutReboot,
                self.file,
                steps[wait].span,
                "`wait node-back` waits for the node to come back, and no step before it takes the node down",
            )
            .label("nothing to wait for: it would pass at once");
            if let Some(later) = steps[wait..].iter().find(|s| s.action.reboots()) {
                d = d.secondary(
                    self.file,
                    later.span,
                    "the node goes down only here, after the wait",
                );
            } else if let Some(off) = steps[..wait]
                .iter()
                .find(|s| s.action == Action::TalosShutdown)
            {
                d = d.secondary(
                    self.file,
                    off.span,
                    "a node shut down does not come back by itself",
                );
            }
            self.diags.push(d.help(
                "put the call that takes the node down and back (`do talos reboot`, `do talos upgrade` or `do talos rollback`) before the wait, or remove the wait",
            ));
            return None;
        }
        ok.then_some(CheckedPlan {
            verb,
            subject,
            kind,
            file: self.file,
            span: p.span,
            steps,
        })
    }

    pub(super) fn check_step(
        &mut self,
        s: &'a Step,
        events: &[Event],
        scope: Scope,
    ) -> Option<CheckedStep> {
        let words: Vec<&str> = s.words.iter().map(|w| w.name.as_str()).collect();
        let text = words.join(" ");
        let found = ACTIONS.iter().find(|a| {
            words.len() >= a.words.len()
                && words[..a.words.len()] == *a.words
                && words.len() == a.words.len() + usize::from(a.argument.is_some())
        });
        let span = s.words.first().map(|w| w.span).unwrap_or(s.span).to(s
            .words
            .last()
            .map(|w| w.span)
            .unwrap_or(s.span));
        let Some(action) = found else {
            self.report_unknown_action(&words, span);
            return None;
        };
        let mut ok = true;
        if !action.scope.admits(scope) {
            self.diags.push(
                Diagnostic::error(
                    Code::ActionNotInPlan,
                    self.file,
                    span,
                    format!("`{text}` is not a step of {}", scope.describe()),
                )
                .label("another procedure's step")
                .help(format!(
                    "`{text}` runs in {}; remove it here",
                    action.scope.describe()
                )),
            );
            ok = false;
        }
        let within = match (&s.within, action.timeout) {
            (Some(w), Timeout::None) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::StepTimeout,
                        self.file,
                        w.span,
                        format!("`{text}` does not wait, so it takes no `within`"),
                    )
                    .label("a timeout here")
                    .help("only gates wait (`etcd healthy`, `wait node-back`); remove `within`"),
                );
                ok = false;
                None
            }
            (Some(w), _) => match w.secs {
                Some(secs) if secs > 0 && secs <= MAX_STEP_TIMEOUT_SECS => Some(secs),
                _ => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::StepTimeout,
                            self.file,
                            w.span,
                            format!("`{text}` waits for no time, or for more than a day"),
                        )
                        .label("out of range")
                        .help("say a timeout from 1s to 24h, e.g. `within 10m`"),
                    );
                    ok = false;
                    None
                }
            },
            (None, Timeout::Required) => {
                self.diags.push(
                    Diagnostic::error(
                        Code::StepTimeout,
                        self.file,
                        span,
                        format!("`{text}` waits on the node, so it needs a timeout"),
                    )
                    .label("no `within`")
                    .help(format!(
                        "say how long it may wait, e.g. `do {text} within 10m`: past it the operation fails, naming the node and the step"
                    )),
                );
                ok = false;
                None
            }
            (None, _) => None,
        };
        for (e, what) in [(&s.when, "when"), (&s.unless, "unless")] {
            if let Some(e) = e {
                let ty = self.type_in(e, events);
                if ty != Ty::Known(Type::Bool) {
                    if ty != Ty::Error {
                        self.diags.push(
                            Diagnostic::error(
                                Code::NotACondition,
                                self.file,
                                e.span,
                                format!(
                                    "a `{what}` guard must be a bool, this is {}",
                                    ty.describe()
                                ),
                            )
                            .label(ty.describe())
                            .help("guard the step with a bool fact or a comparison"),
                        );
                    }
                    ok = false;
                }
            }
        }
        if action.needs_message && s.say.is_none() {
            self.diags.push(
                Diagnostic::error(
                    Code::MissingMessage,
                    self.file,
                    span,
                    format!("`{text}` needs a message"),
                )
                .label("no `say`")
                .help("add `say \"...\"` after the step"),
            );
            ok = false;
        }
        if let Some(m) = &s.say {
            ok &= self.check_message(m, events);
        }
        if !ok {
            return None;
        }
        let (when, typed_when) = s.when.as_ref().map(|e| self.inline_typed(e)).unzip();
        let (unless, typed_unless) = s.unless.as_ref().map(|e| self.inline_typed(e)).unzip();
        let (message, typed_message) = s.say.as_ref().map(|m| self.inline_message(m)).unzip();
        Some(CheckedStep {
            action: action.action,
            argument: action
                .argument
                .and_then(|_| s.words.last().map(|w| w.name.clone())),
            within,
            when,
            unless,
            text,
            guard_text: match (&s.when, &s.unless) {
                (None, None) => None,
                (w, u) => Some(
                    w.iter()
                        .map(|e| format!("when {e}"))
                        .chain(u.iter().map(|e| format!("unless {e}")))
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
            },
            say_text: s.say.as_ref().map(|m| m.source_text()),
            message,
            span: s.span,
            lets: self.lets_of(s.when.iter().chain(&s.unless), s.say.as_ref()),
            typed: Annotated {
                when: typed_when,
                unless: typed_unless,
                message: typed_message,
            },
        })
    }

    pub(super) fn report_unknown_action(&mut self, words: &[&str], span: Span) {
        let spellings = action_spellings();
        let text = words.join(" ");
        // Compare with as many words as each action has, so an argument does not hide a typo.
        let best = ACTIONS
            .iter()
            .zip(spellings.iter())
            .filter_map(|(a, sp): (&ActionInfo, &String)| {
                let n = a.words.len().min(words.len());
                let head = words[..n].join(" ");
                did_you_mean(&head, [sp.as_str()]).map(|s| (s.to_string(), a))
            })
            .next();
        let mut d = Diagnostic::error(
            Code::UnknownAction,
            self.file,
            span,
            format!("unknown action `{text}`"),
        )
        .label("not a built-in action");
        d = match best {
            Some((s, a)) if a.argument.is_some() => d.help(format!(
                "did you mean `{s} <{}>`?",
                a.argument.unwrap_or("argument")
            )),
            Some((s, _)) => d.help(format!("did you mean `{s}`?")),
            None => d.help(format!(
                "the actions are {}",
                backticked(&spellings.iter().map(|s| s.as_str()).collect::<Vec<_>>())
            )),
        };
        self.diags.push(d);
    }

    pub(super) fn check_message(&mut self, m: &'a Message, events: &[Event]) -> bool {
        let mut ok = true;
        for part in &m.parts {
            if let MessagePart::Placeholder(e) = part
                && self.type_in(e, events) == Ty::Error
            {
                ok = false;
            }
        }
        ok
    }

    pub(super) fn check_invariant(&mut self, inv: &'a InvariantDef) -> Option<CheckedInvariant> {
        self.in_invariant.set(true);
        let mut ok = true;
        let mut cond = |c: &mut Self, e: &'a Option<Expr>, what: &str| {
            let Some(e) = e else { return };
            let ty = c.type_in(e, &[]);
            if ty != Ty::Known(Type::Bool) && ty != Ty::Error {
                c.diags.push(
                    Diagnostic::error(
                        Code::NotACondition,
                        c.file,
                        e.span,
                        format!(
                            "an `{what}` condition must be a bool, this is {}",
                            ty.describe()
                        ),
                    )
                    .label(ty.describe())
                    .help("compare it with something, e.g. `healthy * 2 > members`"),
                );
                ok = false;
            } else if ty == Ty::Error {
                ok = false;
            }
        };
        cond(self, &inv.when, "when");
        cond(self, &inv.unless, "unless");
        cond(self, &inv.ensure, "ensure");
        if let Some(m) = &inv.say {
            ok &= self.check_message(m, &[]);
        }
        self.in_invariant.set(false);
        if inv.ensure.is_none() {
            self.diags.push(
                Diagnostic::error(
                    Code::SyntaxExpected,
                    self.file,
                    inv.name.span,
                    format!("the invariant `{}` has no `ensure`", inv.name.name),
                )
                .label("needs `ensure <condition>`")
                .help("say what must hold in every state, e.g. `ensure members > 0`"),
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let src = |e: &Option<Expr>| e.as_ref().map(|e| e.to_string());
        self.inline_too_deep.set(false);
        let when = inv.when.as_ref().map(|e| self.inline(e));
        let unless = inv.unless.as_ref().map(|e| self.inline(e));
        let ensure = self.inline(inv.ensure.as_ref()?);
        let message = inv.say.as_ref().map(|m| self.inline_message(m).0);
        if self.inline_too_deep.get() {
            self.diags.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    inv.name.span,
                    format!(
                        "`{}` uses definitions that refer to each other more than {MAX_LET_DEPTH} levels deep",
                        inv.name.name
                    ),
                )
                .label("too deep")
                .help("flatten the chain of `let`s"),
            );
            return None;
        }
        Some(CheckedInvariant {
            name: inv.name.name.clone(),
            file: self.file,
            span: inv.span,
            sequential: inv.sequential,
            when_text: src(&inv.when),
            unless_text: src(&inv.unless),
            ensure_text: src(&inv.ensure).unwrap_or_default(),
            when,
            unless,
            ensure,
            message,
            say_text: inv.say.as_ref().map(|m| m.source_text()),
        })
    }

    pub(super) fn report_model_fact_in_rule(
        &mut self,
        fact: ModelFact,
        span: Span,
        events: &[Event],
        via: Option<&str>,
    ) {
        let via = via.map(|l| format!(" (through `{l}`)")).unwrap_or_default();
        let what = events
            .first()
            .map(|(v, s, site)| format!("`{} {}` at the {}", v.name(), s.name(), site.name()))
            .unwrap_or_else(|| "a rule".into());
        self.diags.push(
            Diagnostic::error(
                Code::FactUnavailable,
                self.file,
                span,
                format!(
                    "`{}` is a fact of `verify`'s model, not available for {what}{via}",
                    fact.name()
                ),
            )
            .label("only invariants read it")
            .help("model facts are read by `invariant` statements; rules read the facts of a request (docs/rules.md lists both)"),
        );
    }

    pub(super) fn report_request_fact_in_invariant(
        &mut self,
        fact: Fact,
        span: Span,
        via: Option<&str>,
    ) {
        let via = via.map(|l| format!(" (through `{l}`)")).unwrap_or_default();
        self.diags.push(
            Diagnostic::error(
                Code::FactUnavailable,
                self.file,
                span,
                format!(
                    "the fact `{}` belongs to one request; an invariant reads the model's facts{via}",
                    fact.name()
                ),
            )
            .label("not a fact of the model")
            .help(format!(
                "invariants read {}",
                backticked(&MODEL_FACTS.iter().map(|f| f.name).collect::<Vec<_>>())
            )),
        );
    }
}
