//! AST -> checked program: names, types, availability of facts per verb and site, the shape
//! of rules and plans, and the lints. Every finding is collected; nothing stops at the first.

mod arith;
mod exact;
mod inline;
mod lints;

pub use arith::can_fail;

use crate::diagnostics::{Code, Diagnostic, SourceFile, did_you_mean};
use crate::syntax::ast::*;
use crate::vocab::{
    ACTIONS, Action, ActionInfo, EnumKind, FACTS, Fact, MODEL_FACTS, ModelFact, Site, Subject,
    Type, Verb, Verdict, action_spellings, is_runtime_event, resolve_verb, subjects_of, verb_words,
};
use std::collections::{HashMap, HashSet};

/// How deep `let`s may refer to each other (deeper chains could exhaust the stack).
const MAX_LET_DEPTH: usize = 64;

/// A (verb, subject, site) triple: the key of a row group.
pub use crate::vocab::Event;

/// A rule, resolved: its events, its conditions with every `let` inlined.
#[derive(Clone, Debug)]
pub struct CheckedRule {
    pub name: String,
    pub file: usize,
    pub span: Span,
    pub verdict: Verdict,
    pub events: Vec<Event>,
    /// The verbs and subject as written (`leave worker`), for reviewers.
    pub head: String,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    /// The conditions as written, for reviewers.
    pub when_text: Option<String>,
    pub unless_text: Option<String>,
    pub reason: Option<String>,
    pub message: Message,
    /// The message as written, on one line.
    pub say_text: String,
    /// The `let`s its conditions and message use, directly or through another `let`.
    pub lets: Vec<String>,
}

/// A plan step, resolved.
#[derive(Clone, Debug)]
pub struct CheckedStep {
    pub action: Action,
    pub argument: Option<String>,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub text: String,
    /// The guard as written (`when ...` / `unless ...`), for reviewers.
    pub guard_text: Option<String>,
    pub say_text: Option<String>,
    pub message: Option<Message>,
    pub span: Span,
    /// The `let`s its guard and message use, directly or through another `let`.
    pub lets: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct CheckedPlan {
    pub verb: Verb,
    pub subject: Subject,
    pub file: usize,
    pub span: Span,
    pub steps: Vec<CheckedStep>,
}

/// An invariant, resolved: its conditions over model facts with every `let` inlined.
#[derive(Clone, Debug)]
pub struct CheckedInvariant {
    pub name: String,
    pub file: usize,
    pub span: Span,
    pub sequential: bool,
    pub when: Option<Expr>,
    pub unless: Option<Expr>,
    pub ensure: Expr,
    /// The conditions as written, for reviewers.
    pub when_text: Option<String>,
    pub unless_text: Option<String>,
    pub ensure_text: String,
    pub message: Option<Message>,
    pub say_text: Option<String>,
}

/// A `let` that a rule or a plan step uses, resolved: for explanations and reviewers
/// (conditions have every `let` inlined, so nothing else reads these).
#[derive(Clone, Debug)]
pub struct CheckedLet {
    pub name: String,
    pub file: usize,
    /// The whole definition (`let name = expr`).
    pub span: Span,
    /// The expression as written.
    pub expr_span: Span,
    /// The expression with every `let` it uses inlined.
    pub expr: Expr,
}

/// An `allow` statement, resolved.
#[derive(Clone, Debug)]
pub struct CheckedAllow {
    pub file: usize,
    pub span: Span,
    pub events: Vec<Event>,
}

/// What the compiler needs: rules, allowances, plans and invariants, all resolved.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub rules: Vec<CheckedRule>,
    pub allowed: Vec<Event>,
    /// Each `allow` statement: where it is, and the events it names.
    pub allows: Vec<CheckedAllow>,
    pub plans: Vec<CheckedPlan>,
    pub invariants: Vec<CheckedInvariant>,
    /// The `let`s the rules and plan steps use, each file's in the order it defines them.
    pub lets: Vec<CheckedLet>,
}

/// The result of checking a rule set.
#[derive(Debug, Default)]
pub struct CheckResult {
    pub program: Program,
    pub diagnostics: Vec<Diagnostic>,
}

impl CheckResult {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
}

/// Parses and checks a rule set (several files form one table), lints included.
pub fn check(files: &[SourceFile]) -> CheckResult {
    check_with(files, true)
}

/// Parses and checks a rule set; `lints: false` skips the lints (warnings only), as a
/// server reloading rules does: only errors decide whether a table may serve.
pub fn check_with(files: &[SourceFile], lints: bool) -> CheckResult {
    let mut diags = Vec::new();
    let mut parsed = Vec::new();
    for (i, f) in files.iter().enumerate() {
        // Every syntax error, and the statements that parsed, so their own errors are
        // found too (no table is built while any error stands).
        let (ast, ds) = crate::syntax::parse_recovering(i, &f.text);
        diags.extend(ds);
        parsed.push((i, ast));
    }
    let mut program = Program::default();
    let mut rule_names: HashMap<String, (usize, Span)> = HashMap::new();
    let mut plan_keys: HashMap<(Verb, Subject), (usize, Span)> = HashMap::new();
    for (file, ast) in &parsed {
        let mut c = FileChecker::new(*file, &files[*file], ast, &mut diags);
        c.check_lets();
        for item in &ast.items {
            match item {
                Item::Rule(r) => {
                    if let Some(d) = claim_name(&mut rule_names, *file, &r.name, false) {
                        c.diags.push(d);
                    }
                    if let Some(rule) = c.check_rule(r) {
                        program.rules.push(rule);
                    }
                }
                Item::Allow(a) => {
                    let events = c.events(&a.verbs, &a.subject, a.site.as_ref(), None);
                    program.allows.push(CheckedAllow {
                        file: *file,
                        span: a.span,
                        events: events.clone(),
                    });
                    program.allowed.extend(events);
                }
                Item::Invariant(inv) => {
                    if let Some(d) = claim_name(&mut rule_names, *file, &inv.name, true) {
                        c.diags.push(d);
                    }
                    if let Some(checked) = c.check_invariant(inv) {
                        program.invariants.push(checked);
                    }
                }
                Item::Plan(p) => {
                    if let Some(plan) = c.check_plan(p) {
                        let key = (plan.verb, plan.subject);
                        if let std::collections::hash_map::Entry::Vacant(slot) =
                            plan_keys.entry(key)
                        {
                            slot.insert((*file, p.span));
                            program.plans.push(plan);
                        } else if let Some((first_file, first_span)) = plan_keys.get(&key) {
                            c.diags.push(
                                Diagnostic::error(
                                    Code::DuplicatePlan,
                                    *file,
                                    p.verb.span.to(p.subject.span),
                                    format!(
                                        "a plan for `{} {}` is defined twice",
                                        plan.verb.name(),
                                        plan.subject.name()
                                    ),
                                )
                                .label("second plan")
                                .secondary(
                                    *first_file,
                                    first_line(files, *first_file, *first_span),
                                    "the first plan",
                                )
                                .help("one plan per verb and subject; merge the steps into one"),
                            );
                        }
                    }
                }
                Item::Let(_) => {}
            }
        }
        program.lets.extend(c.used_lets(&program));
        c.report_unused_lets();
        c.report_inline_errors();
    }
    if lints && !diags.iter().any(|d| d.is_error()) {
        lints::run(files, &program, &mut diags);
    }
    diags.sort_by(|a, b| {
        (a.file, a.span.start, a.severity).cmp(&(b.file, b.span.start, b.severity))
    });
    CheckResult {
        program,
        diagnostics: diags,
    }
}

/// The first line of a span (a rule's or a plan's head), for a secondary label that points
/// at a whole item without drawing all of it.
pub(crate) fn first_line(files: &[SourceFile], file: usize, span: Span) -> Span {
    let text = files.get(file).map_or("", |f| &f.text);
    let from = span.start as usize;
    let rest = text.get(from..span.end as usize).unwrap_or("");
    let len = rest.find('\n').unwrap_or(rest.len());
    let len = rest[..len].trim_end().len();
    Span::new(from, from + len)
}

/// Rules and invariants share one namespace across the rule set: the first definition of
/// a name claims it; a second one is a `duplicate_rule` error pointing at the first.
fn claim_name(
    names: &mut HashMap<String, (usize, Span)>,
    file: usize,
    name: &Ident,
    invariant: bool,
) -> Option<Diagnostic> {
    let Some((pf, ps)) = names.get(&name.name) else {
        names.insert(name.name.clone(), (file, name.span));
        return None;
    };
    let (message, help) = if invariant {
        (
            format!("the name `{}` is defined twice", name.name),
            "rule and invariant names are unique across the rule set; rename one",
        )
    } else {
        (
            format!("the rule `{}` is defined twice", name.name),
            "rule names are unique across the rule set; rename one",
        )
    };
    Some(
        Diagnostic::error(Code::DuplicateRule, file, name.span, message)
            .label("second definition")
            .secondary(*pf, *ps, "first defined here")
            .help(help),
    )
}

/// The type an expression has while checking; string literals stay literals until they
/// meet what they are compared with.
#[derive(Clone, Debug, PartialEq)]
enum Ty {
    Known(Type),
    Literal,
    /// Already reported; suppresses follow-on errors.
    Error,
}

impl Ty {
    fn describe(&self) -> String {
        match self {
            Ty::Known(t) => t.to_string(),
            Ty::Literal => "string".into(),
            Ty::Error => "error".into(),
        }
    }
}

struct LetInfo<'a> {
    def: &'a LetDef,
    ty: Option<Ty>,
    used: bool,
}

struct FileChecker<'a, 'd> {
    file: usize,
    ast: &'a File,
    lets: HashMap<&'a str, LetInfo<'a>>,
    diags: &'d mut Vec<Diagnostic>,
    /// Lets being typed right now, for cycle detection.
    visiting: Vec<&'a str>,
    /// Cycles already reported, so each is reported once.
    reported_cycles: HashSet<&'a str>,
    /// Set when inlining met a chain of `let`s deeper than [`MAX_LET_DEPTH`].
    inline_too_deep: std::cell::Cell<bool>,
    /// The written-out size of each `let`, and what inlining used of the file's budget.
    expansions: std::cell::RefCell<inline::Expansions>,
    /// See [`inline::budget`].
    inline_budget: usize,
    /// Set while an `invariant` is checked: names are the model's facts.
    in_invariant: std::cell::Cell<bool>,
}

impl<'a, 'd> FileChecker<'a, 'd> {
    fn new(file: usize, src: &SourceFile, ast: &'a File, diags: &'d mut Vec<Diagnostic>) -> Self {
        let mut lets: HashMap<&'a str, LetInfo<'a>> = HashMap::new();
        for item in &ast.items {
            if let Item::Let(l) = item {
                if let Some(prev) = lets.get(l.name.name.as_str()) {
                    diags.push(
                        Diagnostic::error(
                            Code::DuplicateLet,
                            file,
                            l.name.span,
                            format!("`{}` is defined twice", l.name.name),
                        )
                        .label("second definition")
                        .secondary(file, prev.def.name.span, "first defined here")
                        .help("remove or rename one of the two definitions"),
                    );
                    continue;
                }
                if let Some(f) = ModelFact::lookup(&l.name.name)
                    && Fact::lookup(&l.name.name).is_none()
                {
                    diags.push(
                        Diagnostic::error(
                            Code::LetShadowsFact,
                            file,
                            l.name.span,
                            format!(
                                "`{}` is a fact of `verify`'s model; a `let` cannot redefine it",
                                f.name()
                            ),
                        )
                        .label("already a fact")
                        .help("choose another name for the definition"),
                    );
                    continue;
                }
                if let Some(f) = Fact::lookup(&l.name.name) {
                    diags.push(
                        Diagnostic::error(
                            Code::LetShadowsFact,
                            file,
                            l.name.span,
                            format!("`{}` is a fact; a `let` cannot redefine it", f.name()),
                        )
                        .label("already a fact")
                        .help("choose another name for the definition"),
                    );
                    continue;
                }
                lets.insert(
                    l.name.name.as_str(),
                    LetInfo {
                        def: l,
                        ty: None,
                        used: false,
                    },
                );
            }
        }
        FileChecker {
            file,
            ast,
            lets,
            diags,
            visiting: Vec::new(),
            reported_cycles: HashSet::new(),
            inline_too_deep: std::cell::Cell::new(false),
            expansions: std::cell::RefCell::default(),
            inline_budget: inline::budget(src.text.len()),
            in_invariant: std::cell::Cell::new(false),
        }
    }

    fn check_lets(&mut self) {
        let names: Vec<&'a str> = self
            .ast
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Let(l) => Some(l.name.name.as_str()),
                _ => None,
            })
            .collect();
        for n in names {
            self.let_type(n);
        }
    }

    /// The type of a `let`, computed once; cycles are reported at the `let` that closes them.
    fn let_type(&mut self, name: &'a str) -> Ty {
        let Some(info) = self.lets.get(name) else {
            return Ty::Error;
        };
        if let Some(t) = &info.ty {
            return t.clone();
        }
        let def = info.def;
        if let Some(pos) = self.visiting.iter().position(|n| *n == name) {
            if self.reported_cycles.insert(name) {
                let mut cycle: Vec<&str> = self.visiting[pos..].to_vec();
                cycle.push(name);
                self.diags.push(
                    Diagnostic::error(
                        Code::CyclicLet,
                        self.file,
                        def.name.span,
                        format!("`{name}` is defined in terms of itself"),
                    )
                    .label(format!("cycle: {}", cycle.join(" -> ")))
                    .help("break the cycle: one of these definitions must use only facts"),
                );
            }
            return Ty::Error;
        }
        if self.visiting.len() >= MAX_LET_DEPTH {
            self.diags.push(
                Diagnostic::error(
                    Code::SyntaxTooComplex,
                    self.file,
                    def.name.span,
                    format!(
                        "definitions refer to each other more than {MAX_LET_DEPTH} levels deep"
                    ),
                )
                .label("too deep")
                .help("flatten the chain of `let`s"),
            );
            return Ty::Error;
        }
        self.visiting.push(name);
        // Lets are typed without an event: fact availability is checked where they are used.
        let ty = self.type_of(&def.expr, None);
        self.visiting.pop();
        if let Some(info) = self.lets.get_mut(name) {
            info.ty = Some(ty.clone());
        }
        ty
    }

    fn report_unused_lets(&mut self) {
        let mut unused: Vec<&LetInfo> = self.lets.values().filter(|l| !l.used).collect();
        unused.sort_by_key(|l| l.def.span.start);
        for l in unused {
            self.diags.push(
                Diagnostic::warning(
                    Code::UnusedLet,
                    self.file,
                    l.def.name.span,
                    format!("`{}` is defined but never used", l.def.name.name),
                )
                .label("unused")
                .help("remove it, or use it in a condition or a message"),
            );
        }
    }

    /// Resolves verbs, subject and site to the events they stand for, reporting unknown words
    /// and combinations the runtime never produces.
    fn events(
        &mut self,
        verbs: &[Ident],
        subject: &Ident,
        site: Option<&Ident>,
        verdict: Option<Verdict>,
    ) -> Vec<Event> {
        let mut ok = true;
        let subj = match Subject::parse(&subject.name) {
            Some(s) => Some(s),
            None => {
                let names: Vec<&str> = Subject::ALL.iter().map(|s| s.name()).collect();
                let mut d = Diagnostic::error(
                    Code::UnknownSubject,
                    self.file,
                    subject.span,
                    format!("unknown subject `{}`", subject.name),
                )
                .label("not a subject");
                d = match did_you_mean(&subject.name, names.iter().copied()) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help(format!("subjects are {}", backticked(&names))),
                };
                self.diags.push(d);
                ok = false;
                None
            }
        };
        let sites: Vec<Site> = match site {
            None => match verdict {
                Some(Verdict::Hold) => vec![Site::Controller],
                _ => Site::ALL.to_vec(),
            },
            Some(s) => match Site::parse(&s.name) {
                Some(site) => vec![site],
                None => {
                    let names = ["webhook", "controller"];
                    let mut d = Diagnostic::error(
                        Code::UnknownSite,
                        self.file,
                        s.span,
                        format!("unknown site `{}`", s.name),
                    )
                    .label("not a site");
                    d = match did_you_mean(&s.name, names) {
                        Some(n) => d.help(format!("did you mean `{n}`?")),
                        None => d.help("sites are `webhook` and `controller`"),
                    };
                    self.diags.push(d);
                    ok = false;
                    Vec::new()
                }
            },
        };
        if verdict == Some(Verdict::Hold) && sites.contains(&Site::Webhook) {
            if let Some(s) = site {
                self.diags.push(
                    Diagnostic::error(
                        Code::HoldAtWebhook,
                        self.file,
                        s.span,
                        "`hold` is a controller verdict; the webhook can only refuse or warn",
                    )
                    .label("webhook")
                    .help("write `at controller` (or nothing), or use `refuse`"),
                );
            }
            ok = false;
        }
        let mut out = Vec::new();
        for v in verbs {
            let Some(vs) = resolve_verb(&v.name) else {
                let words = verb_words();
                let mut d = Diagnostic::error(
                    Code::UnknownVerb,
                    self.file,
                    v.span,
                    format!("unknown verb `{}`", v.name),
                )
                .label("not a verb");
                d = match did_you_mean(&v.name, words.iter().copied()) {
                    _ if v.name == "delete" => {
                        d.help("a delete is `remove`: `refuse remove machine ...`")
                    }
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help(format!("verbs are {}", backticked(&words))),
                };
                self.diags.push(d);
                ok = false;
                continue;
            };
            let Some(subj) = subj else { continue };
            let mut any = false;
            for verb in &vs {
                for site in &sites {
                    if is_runtime_event(*verb, subj, *site) {
                        out.push((*verb, subj, *site));
                        any = true;
                    }
                }
            }
            if !any && !sites.is_empty() {
                let subjects: Vec<&str> = vs
                    .iter()
                    .flat_map(|v| subjects_of(*v))
                    .map(|s| s.name())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let where_ = if sites.len() == 1 {
                    format!(" at the {}", sites[0].name())
                } else {
                    String::new()
                };
                self.diags.push(
                    Diagnostic::error(
                        Code::ImpossibleEvent,
                        self.file,
                        v.span.to(subject.span),
                        format!("`{} {}` never happens{where_}", v.name, subject.name),
                    )
                    .label("no request or reconcile produces this")
                    .help(if subjects.is_empty() {
                        format!("`{}` happens at no site", v.name)
                    } else {
                        format!("`{}` applies to {}", v.name, backticked(&subjects))
                    }),
                );
                ok = false;
            }
        }
        if !ok && out.is_empty() {
            return Vec::new();
        }
        out.sort();
        out.dedup();
        out
    }

    fn check_rule(&mut self, r: &'a RuleDef) -> Option<CheckedRule> {
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
        let when = r.when.as_ref().map(|e| self.inline(e));
        let unless = r.unless.as_ref().map(|e| self.inline(e));
        let message = self.inline_message(r.say.as_ref()?);
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
        })
    }

    fn check_plan(&mut self, p: &'a PlanDef) -> Option<CheckedPlan> {
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
                    .help("plans exist for what the controller does: `remove controlplane`, `apply controlplane`, `run operation`"),
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
        let mut steps = Vec::new();
        let mut ok = true;
        for s in &p.steps {
            match self.check_step(s, &events) {
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
        ok.then_some(CheckedPlan {
            verb,
            subject,
            file: self.file,
            span: p.span,
            steps,
        })
    }

    fn check_step(&mut self, s: &'a Step, events: &[Event]) -> Option<CheckedStep> {
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
        Some(CheckedStep {
            action: action.action,
            argument: action
                .argument
                .and_then(|_| s.words.last().map(|w| w.name.clone())),
            when: s.when.as_ref().map(|e| self.inline(e)),
            unless: s.unless.as_ref().map(|e| self.inline(e)),
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
            message: s.say.as_ref().map(|m| self.inline_message(m)),
            span: s.span,
            lets: self.lets_of(s.when.iter().chain(&s.unless), s.say.as_ref()),
        })
    }

    fn report_unknown_action(&mut self, words: &[&str], span: Span) {
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

    fn check_message(&mut self, m: &'a Message, events: &[Event]) -> bool {
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

    /// Type of an expression used in a rule with these events; `None` = inside a `let`.
    fn type_in(&mut self, e: &'a Expr, events: &[Event]) -> Ty {
        self.type_of(e, Some(events))
    }

    fn type_of(&mut self, e: &'a Expr, events: Option<&[Event]>) -> Ty {
        match &e.kind {
            ExprKind::Int(_) => Ty::Known(Type::Int),
            ExprKind::Bool(_) => Ty::Known(Type::Bool),
            ExprKind::Str(_, placeholders) => {
                if *placeholders {
                    self.diags.push(
                        Diagnostic::error(
                            Code::PlaceholderOutsideMessage,
                            self.file,
                            e.span,
                            "`{...}` placeholders only work in messages",
                        )
                        .label("inside a condition")
                        .help("compare the values directly, or write `{{` for a literal brace"),
                    );
                    return Ty::Error;
                }
                Ty::Literal
            }
            ExprKind::Name(n) => self.type_of_name(n, e.span, events),
            ExprKind::Unary(op, inner) => {
                let t = self.type_of(inner, events);
                let want = match op {
                    UnOp::Not => Type::Bool,
                    UnOp::Neg => Type::Int,
                };
                if t == Ty::Error {
                    return Ty::Error;
                }
                if t != Ty::Known(want) {
                    let sym = if *op == UnOp::Not { "not" } else { "-" };
                    self.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            self.file,
                            inner.span,
                            format!("`{sym}` needs a {want}, this is {}", t.describe()),
                        )
                        .label(t.describe())
                        .help(if *op == UnOp::Not {
                            "`not` negates a condition; compare the value first"
                        } else {
                            "`-` negates an integer"
                        }),
                    );
                    return Ty::Error;
                }
                Ty::Known(want)
            }
            ExprKind::Binary(op, l, r) => {
                let lt = self.type_of(l, events);
                let rt = self.type_of(r, events);
                if lt == Ty::Error || rt == Ty::Error {
                    return Ty::Error;
                }
                self.type_binary(*op, l, r, lt, rt, e.span)
            }
        }
    }

    fn type_binary(&mut self, op: BinOp, l: &Expr, r: &Expr, lt: Ty, rt: Ty, span: Span) -> Ty {
        let sym = op.symbol();
        match op {
            BinOp::And | BinOp::Or => {
                for (side, t) in [(l, &lt), (r, &rt)] {
                    if *t != Ty::Known(Type::Bool) {
                        self.diags.push(
                            Diagnostic::error(
                                Code::TypeMismatch,
                                self.file,
                                side.span,
                                format!("`{sym}` joins conditions, this is {}", t.describe()),
                            )
                            .label(t.describe())
                            .help("compare it first, e.g. `workers == 0`"),
                        );
                        return Ty::Error;
                    }
                }
                Ty::Known(Type::Bool)
            }
            BinOp::Lt
            | BinOp::Le
            | BinOp::Gt
            | BinOp::Ge
            | BinOp::Add
            | BinOp::Sub
            | BinOp::Mul
            | BinOp::Div
            | BinOp::Mod => {
                for (side, t) in [(l, &lt), (r, &rt)] {
                    if *t != Ty::Known(Type::Int) {
                        let what = if matches!(op, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge) {
                            "compares integers"
                        } else {
                            "is integer arithmetic"
                        };
                        self.diags.push(
                            Diagnostic::error(
                                Code::TypeMismatch,
                                self.file,
                                side.span,
                                format!("`{sym}` {what}; `{side}` is {}", t.describe()),
                            )
                            .label(t.describe())
                            .help(
                                if let Some(n) = quoted_integer(side) {
                                    format!("drop the quotes: {n} is an integer")
                                } else if t == &Ty::Known(Type::Bool) {
                                    "use `==`, `and`, `or` or `not` with bools".to_string()
                                } else {
                                    "use `==` or `!=` to compare names".to_string()
                                },
                            ),
                        );
                        return Ty::Error;
                    }
                }
                if matches!(
                    op,
                    BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod
                ) {
                    Ty::Known(Type::Int)
                } else {
                    Ty::Known(Type::Bool)
                }
            }
            BinOp::Eq | BinOp::Ne => {
                let textual = |t: &Ty| {
                    matches!(
                        t,
                        Ty::Literal | Ty::Known(Type::Name) | Ty::Known(Type::Enum(_))
                    )
                };
                let compatible = match (&lt, &rt) {
                    (Ty::Known(a), Ty::Known(b)) if a == b => true,
                    (Ty::Known(Type::Enum(a)), Ty::Known(Type::Enum(b))) => a == b,
                    (a, b) => textual(a) && textual(b),
                };
                if !compatible {
                    self.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            self.file,
                            span,
                            format!(
                                "`{sym}` compares values of one type; this compares {} with {}",
                                lt.describe(),
                                rt.describe()
                            ),
                        )
                        .label(format!("{} {sym} {}", lt.describe(), rt.describe()))
                        .help(
                            match quoted_integer(l).or_else(|| quoted_integer(r)) {
                                Some(n) => format!("drop the quotes: {n} is an integer"),
                                None => "both sides must be ints, bools, or names".to_string(),
                            },
                        ),
                    );
                    return Ty::Error;
                }
                // A literal compared with an enum must be one of its values.
                for (lit, other) in [(l, &rt), (r, &lt)] {
                    if let (ExprKind::Str(s, _), Ty::Known(Type::Enum(kind))) = (&lit.kind, other)
                        && !kind.values().contains(&s.as_str())
                    {
                        self.report_enum_value(kind.to_owned(), s, lit.span);
                        return Ty::Error;
                    }
                }
                Ty::Known(Type::Bool)
            }
        }
    }

    fn report_enum_value(&mut self, kind: EnumKind, value: &str, span: Span) {
        let values = kind.values();
        let mut d = Diagnostic::error(
            Code::UnknownEnumValue,
            self.file,
            span,
            format!("`{value}` is not {}", kind.with_article()),
        )
        .label(format!("not {}", kind.with_article()));
        d = match did_you_mean(value, values.iter().copied()) {
            Some(s) => d.help(format!("did you mean `\"{s}\"`?")),
            None => d.help(format!(
                "{} is one of {}",
                kind.with_article(),
                backticked(values)
            )),
        };
        self.diags.push(d);
    }

    fn type_of_name(&mut self, n: &str, span: Span, events: Option<&[Event]>) -> Ty {
        if let Some(key) = self.lets.get_key_value(n).map(|(k, _)| *k) {
            if let Some(info) = self.lets.get_mut(key) {
                info.used = true;
            }
            let ty = self.let_type(key);
            if let Some(events) = events {
                self.check_let_availability(key, span, events);
            }
            return ty;
        }
        if self.in_invariant.get() || Fact::lookup(n).is_none() {
            if let Some(mf) = ModelFact::lookup(n) {
                if let Some(events) = events
                    && !self.in_invariant.get()
                {
                    self.report_model_fact_in_rule(mf, span, events, None);
                    return Ty::Error;
                }
                return Ty::Known(mf.info().ty);
            }
            if self.in_invariant.get()
                && let Some(f) = Fact::lookup(n)
            {
                self.report_request_fact_in_invariant(f, span, None);
                return Ty::Error;
            }
        }
        let Some(fact) = Fact::lookup(n) else {
            if self.ast.broken_lets.iter().any(|b| b == n) {
                // Its `let` has a syntax error, reported already.
                return Ty::Error;
            }
            let mut candidates: Vec<&str> = FACTS.iter().map(|f| f.name).collect();
            candidates.extend(MODEL_FACTS.iter().map(|f| f.name));
            candidates.extend(self.lets.keys().copied());
            let mut d = Diagnostic::error(
                Code::UnknownName,
                self.file,
                span,
                format!("unknown fact or definition `{n}`"),
            )
            .label("not a fact or a `let`");
            d = match did_you_mean(n, candidates) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None => d.help("facts are listed in the rule author's guide (docs/rules.md); or define it with `let`"),
            };
            self.diags.push(d);
            return Ty::Error;
        };
        if let Some(events) = events
            && !self.fact_available(fact, span, events, None)
        {
            return Ty::Error;
        }
        Ty::Known(fact.info().ty)
    }

    /// Reports a fact not available for one of the events; `via` names the `let` it came through.
    fn fact_available(
        &mut self,
        fact: Fact,
        span: Span,
        events: &[Event],
        via: Option<&str>,
    ) -> bool {
        let missing: Vec<&Event> = events
            .iter()
            .filter(|(v, s, site)| !fact.available(*v, *s, *site))
            .collect();
        let Some((v, s, site)) = missing.first() else {
            return true;
        };
        let via = via.map(|l| format!(" (through `{l}`)")).unwrap_or_default();
        self.diags.push(
            Diagnostic::error(
                Code::FactUnavailable,
                self.file,
                span,
                format!(
                    "the fact `{}` is not available for `{} {}` at the {}{via}",
                    fact.name(),
                    v.name(),
                    s.name(),
                    site.name()
                ),
            )
            .label("not known for this request")
            .help(format!(
                "`{}` is available in {}; narrow the rule's verbs, subject or site",
                fact.name(),
                fact.availability_text()
            )),
        );
        false
    }

    fn check_let_availability(&mut self, name: &'a str, span: Span, events: &[Event]) {
        let Some(info) = self.lets.get(name) else {
            return;
        };
        let mut facts = Vec::new();
        let mut seen = HashSet::new();
        let mut names = Vec::new();
        self.collect_names(&info.def.expr, &mut names, &mut HashSet::new());
        if self.in_invariant.get() {
            // An invariant reads the model: a request fact has no value there.
            for n in names {
                if ModelFact::lookup(n).is_none()
                    && let Some(f) = Fact::lookup(n)
                {
                    self.report_request_fact_in_invariant(f, span, Some(name));
                    break;
                }
            }
            return;
        }
        for n in names {
            if Fact::lookup(n).is_none()
                && let Some(mf) = ModelFact::lookup(n)
            {
                self.report_model_fact_in_rule(mf, span, events, Some(name));
                return;
            }
        }
        self.collect_facts(&info.def.expr, &mut facts, &mut seen);
        for f in facts {
            if !self.fact_available(f, span, events, Some(name)) {
                break;
            }
        }
    }

    /// Every fact name an expression reads, through its `let`s.
    fn collect_names(&self, e: &'a Expr, out: &mut Vec<&'a str>, seen: &mut HashSet<&'a str>) {
        match &e.kind {
            ExprKind::Name(n) => {
                if let Some(info) = self.lets.get(n.as_str()) {
                    if seen.insert(n.as_str()) {
                        self.collect_names(&info.def.expr, out, seen);
                    }
                } else if !out.contains(&n.as_str()) {
                    out.push(n.as_str());
                }
            }
            ExprKind::Unary(_, i) => self.collect_names(i, out, seen),
            ExprKind::Binary(_, l, r) => {
                self.collect_names(l, out, seen);
                self.collect_names(r, out, seen);
            }
            _ => {}
        }
    }

    fn report_model_fact_in_rule(
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

    fn report_request_fact_in_invariant(&mut self, fact: Fact, span: Span, via: Option<&str>) {
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

    fn check_invariant(&mut self, inv: &'a InvariantDef) -> Option<CheckedInvariant> {
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
        let message = inv.say.as_ref().map(|m| self.inline_message(m));
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

    fn collect_facts(&self, e: &'a Expr, out: &mut Vec<Fact>, seen: &mut HashSet<&'a str>) {
        match &e.kind {
            ExprKind::Name(n) => {
                if let Some(info) = self.lets.get(n.as_str()) {
                    if seen.insert(n.as_str()) {
                        self.collect_facts(&info.def.expr, out, seen);
                    }
                } else if let Some(f) = Fact::lookup(n)
                    && !out.contains(&f)
                {
                    out.push(f);
                }
            }
            ExprKind::Unary(_, i) => self.collect_facts(i, out, seen),
            ExprKind::Binary(_, l, r) => {
                self.collect_facts(l, out, seen);
                self.collect_facts(r, out, seen);
            }
            _ => {}
        }
    }

    /// The `let`s these conditions and this message use, directly or through another.
    fn lets_of<'e>(
        &self,
        exprs: impl Iterator<Item = &'e Expr>,
        message: Option<&'e Message>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let placeholders = message
            .into_iter()
            .flat_map(|m| &m.parts)
            .filter_map(|p| match p {
                MessagePart::Placeholder(e) => Some(e),
                MessagePart::Text(_) => None,
            });
        for e in exprs.chain(placeholders) {
            self.collect_lets(e, &mut out);
        }
        out
    }

    fn collect_lets(&self, e: &Expr, out: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(n) => {
                if let Some(info) = self.lets.get(n.as_str())
                    && !out.contains(n)
                {
                    out.push(n.clone());
                    self.collect_lets(&info.def.expr, out);
                }
            }
            ExprKind::Unary(_, i) => self.collect_lets(i, out),
            ExprKind::Binary(_, l, r) => {
                self.collect_lets(l, out);
                self.collect_lets(r, out);
            }
            _ => {}
        }
    }

    /// This file's `let`s that its checked rules and plan steps use, in the order the file
    /// defines them, each with its expression inlined (no larger than the inlined rule that
    /// uses it, which stayed within the limits, and counted in the file's budget).
    fn used_lets(&self, program: &Program) -> Vec<CheckedLet> {
        // With an error no table is built; and a rule over the limits kept no inlining (its
        // error is still pending: reported after this).
        if self.diags.iter().any(|d| d.is_error())
            || !self.expansions.borrow().pending.is_empty()
            || self.inline_too_deep.get()
        {
            return Vec::new();
        }
        let rules = program.rules.iter().filter(|r| r.file == self.file);
        let steps = program
            .plans
            .iter()
            .filter(|p| p.file == self.file)
            .flat_map(|p| &p.steps);
        let used: HashSet<&str> = rules
            .flat_map(|r| &r.lets)
            .chain(steps.flat_map(|s| &s.lets))
            .map(String::as_str)
            .collect();
        self.ast
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Let(l) => Some(l),
                _ => None,
            })
            // The definition the file's names resolve to (a second one is an error).
            .filter(|l| {
                used.contains(l.name.name.as_str())
                    && self
                        .lets
                        .get(l.name.name.as_str())
                        .is_some_and(|info| std::ptr::eq(info.def, *l))
            })
            .map(|l| CheckedLet {
                name: l.name.name.clone(),
                file: self.file,
                span: l.span,
                expr_span: l.expr.span,
                // Written out within the file's budget like every condition: a chain of
                // `let`s each used once costs its length once per link, not unboundedly.
                expr: self.inline(&l.expr),
            })
            .collect()
    }

    /// Replaces every `let` name by its definition (checked acyclic before this runs).
    fn inline(&self, e: &Expr) -> Expr {
        // Never copy more than the limits allow (an error is reported instead).
        if !self.may_inline(e) {
            return Expr {
                kind: ExprKind::Bool(false),
                span: e.span,
            };
        }
        let inlined = self.inline_depth(e, 0);
        self.check_stack(&inlined);
        inlined
    }

    fn inline_depth(&self, e: &Expr, depth: usize) -> Expr {
        let kind = match &e.kind {
            ExprKind::Name(n) => match self.lets.get(n.as_str()) {
                Some(info) if depth < MAX_LET_DEPTH => {
                    let mut inner = self.inline_depth(&info.def.expr, depth + 1);
                    inner.span = e.span;
                    return inner;
                }
                Some(_) => {
                    self.inline_too_deep.set(true);
                    ExprKind::Bool(false)
                }
                None => ExprKind::Name(n.clone()),
            },
            ExprKind::Unary(op, i) => ExprKind::Unary(*op, Box::new(self.inline_depth(i, depth))),
            ExprKind::Binary(op, l, r) => ExprKind::Binary(
                *op,
                Box::new(self.inline_depth(l, depth)),
                Box::new(self.inline_depth(r, depth)),
            ),
            other => other.clone(),
        };
        Expr { kind, span: e.span }
    }

    fn inline_message(&self, m: &Message) -> Message {
        Message {
            parts: m
                .parts
                .iter()
                .map(|p| match p {
                    MessagePart::Text(t) => MessagePart::Text(t.clone()),
                    MessagePart::Placeholder(e) => MessagePart::Placeholder(self.inline(e)),
                })
                .collect(),
            span: m.span,
        }
    }
}

fn is_condition_reason(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

fn backticked(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
    match quoted.len() {
        0 => String::new(),
        1 => quoted[0].clone(),
        n => format!("{} and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

/// The integer a string literal spells (`"4"`), for the "drop the quotes" help.
fn quoted_integer(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Str(s, _) => s.trim().parse().ok(),
        _ => None,
    }
}
