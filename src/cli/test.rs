//! `ichor-rules test`: rule tests in YAML next to the rules (`rules/tests/*.yaml`), each
//! case decided through the same code as `eval` (cli/outcome.rs), with a diff of what was
//! expected and what was decided, the rules that decided each case (no vacuous passes), and
//! coverage of every rule and every `when`/`unless` branch.
//!
//! The file format is in docs/rules.md, "Testing rules".

use super::eval::{MAX_OBJECTS_FILE, read, read_text};
use super::outcome::{self, Outcome};
use super::request::{
    Form, build_review, now, parse_target, raw_objects, read_apply_file, review_of,
};
use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, emit};
use crate::compile::Table;
use crate::diagnostics::render_human;
use crate::ruleset::load;
use crate::runtime::objects::load_snapshot;
use clap::{Args, ValueEnum};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum TestFormat {
    Human,
    Json,
    Junit,
}

#[derive(Args, Debug)]
pub struct TestArgs {
    /// Test files (YAML) or folders (their `*.yaml`/`*.yml` files; a folder without any,
    /// such as `rules/`, means its `tests/` folder). Default: `rules/tests`.
    pub paths: Vec<PathBuf>,
    /// Rule files or folders the cases are decided with.
    #[arg(long, default_value = "rules")]
    pub rules: Vec<PathBuf>,
    /// Run only the cases whose name contains PATTERN (`*` matches any text).
    #[arg(long, value_name = "PATTERN")]
    pub run: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TestFormat::Human)]
    pub format: TestFormat,
    /// Report, per rule and per `when`/`unless` branch, whether a case exercised it.
    #[arg(long)]
    pub coverage: bool,
    /// Fail (exit 1) when coverage is below PCT percent (implies --coverage).
    #[arg(long, value_name = "PCT")]
    pub fail_under: Option<f64>,
}

// ---------------------------------------------------------------------------------------
// The file format.
// ---------------------------------------------------------------------------------------

/// A test file: named object sets, and the cases.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    /// Named objects (or lists of objects) the cases refer to by name.
    #[serde(default)]
    objects: BTreeMap<String, OneOrMany>,
    cases: Vec<CaseSpec>,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum OneOrMany {
    Many(Vec<Entry>),
    One(Entry),
}

/// An object: inline, the name of a set of the file's `objects`, or a file (a path
/// ending in `.yaml`, `.yml` or `.json`, relative to the test file).
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Entry {
    Ref(String),
    Inline(serde_json::Map<String, Value>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseSpec {
    name: String,
    #[serde(default)]
    objects: Option<OneOrMany>,
    #[serde(default)]
    review: Option<ReviewSpec>,
    #[serde(default)]
    delete: Option<String>,
    #[serde(default)]
    apply: Option<Entry>,
    #[serde(default)]
    approve: Option<String>,
    #[serde(default)]
    unapprove: Option<String>,
    #[serde(default)]
    unschedule: Option<String>,
    #[serde(default)]
    status: Option<Entry>,
    #[serde(default)]
    reconcile: Option<String>,
    /// A step of the running operation NAMESPACE/NAME: the `step operation` rules, as the
    /// controller decides them before each step.
    #[serde(default)]
    step: Option<String>,
    /// The machine the step works on (by default the operation's `spec.machine`; a roll
    /// over the cluster names each node in turn).
    #[serde(default)]
    node: Option<String>,
    /// The TalosCluster the request or reconcile names is meant to be missing from the
    /// objects (it is read as missing: `cluster.exists` false, `count` 0). Without it, a
    /// case whose cluster is missing fails: a typo in `clusterRef`, a cluster in another
    /// namespace or a forgotten object would otherwise pass silently.
    #[serde(default, rename = "clusterMissing")]
    cluster_missing: bool,
    /// The request is made by the controller's own identity (`request.by_controller`): its
    /// `userInfo` is [`TEST_CONTROLLER_USERNAME`]'s, and it is decided as a webhook whose
    /// `serve --controller-username` names that user. Requests only.
    #[serde(default, rename = "byController")]
    by_controller: bool,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ReviewSpec {
    File(String),
    Inline(InlineReview),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InlineReview {
    operation: String,
    #[serde(default)]
    old: Option<Entry>,
    #[serde(default)]
    new: Option<Entry>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Allow,
    Refuse,
    Proceed,
    Hold,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Refuse => "refuse",
            Verdict::Proceed => "proceed",
            Verdict::Hold => "hold",
        }
    }
}

#[derive(Deserialize, Clone, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    verdict: Verdict,
    /// The rules that decide it (refuse, hold): exactly these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rules: Option<Vec<String>>,
    /// The condition reason of the deciding rule (a hold, a controller refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Fragments that the deciding messages must contain (each one, in some message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    messages: Vec<String>,
    /// Fragments of the warnings (each one, in some warning); `[]`: no warning at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warnings: Option<Vec<String>>,
    /// How many events the request produces (`0`: an ordinary edit no rule looks at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    events: Option<usize>,
}

// ---------------------------------------------------------------------------------------
// Loading.
// ---------------------------------------------------------------------------------------

/// A bad test file: exit 2.
struct BadFile(String);

/// The 1-based lines of the `name:` lines of a test file, by the name they give (each
/// name's first line), for messages: read once per file, so finding a case's line costs
/// nothing per case (a search of the text per case made loading quadratic in the cases).
struct CaseLines(std::collections::HashMap<String, usize>);

impl CaseLines {
    fn of(text: &str) -> CaseLines {
        let mut lines = std::collections::HashMap::new();
        for (i, l) in text.lines().enumerate() {
            let t = l.trim_start().trim_start_matches("- ").trim_start();
            let Some(rest) = t.strip_prefix("name:") else {
                continue;
            };
            let v = rest.trim();
            for v in [v, v.trim_matches('"'), v.trim_matches('\'')] {
                lines.entry(v.to_string()).or_insert(i + 1);
            }
        }
        CaseLines(lines)
    }

    /// The line of the case named `name` (its `name:` line).
    fn of_case(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }
}

/// Test files under the given paths, sorted within each folder.
fn test_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let list = |dir: &Path| -> Result<Vec<PathBuf>, String> {
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .map_err(|e| format!("{}: {e}", dir.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml")
                    })
                    .collect();
                found.sort();
                Ok(found)
            };
            let mut found = list(p)?;
            if found.is_empty() && p.join("tests").is_dir() {
                found = list(&p.join("tests"))?;
            }
            if found.is_empty() {
                return Err(format!(
                    "{}: no test files (*.yaml) here or in its tests/ folder",
                    p.display()
                ));
            }
            out.extend(found);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(format!("{}: no such file or folder", p.display()));
        }
    }
    Ok(out)
}

/// A case ready to run.
struct Case {
    file: PathBuf,
    line: Option<usize>,
    name: String,
    objects: Vec<Value>,
    request: Request,
    /// `clusterMissing: true`: the case means its TalosCluster to be missing.
    cluster_missing: bool,
    /// `byController: true`: the request is the controller's own.
    by_controller: bool,
    expect: Expect,
}

enum Request {
    /// A review built or read; the string says how it was given.
    Review(Vec<u8>),
    /// A form of kubectl words, built against the case's objects when run.
    Form(Form),
    Reconcile(String, String),
    /// A step of an operation (namespace, name) on a machine (by default `spec.machine`).
    Step(String, String, Option<String>),
}

struct Loader<'a> {
    file: &'a Path,
    lines: CaseLines,
    sets: &'a BTreeMap<String, OneOrMany>,
}

impl Loader<'_> {
    fn at(&self, name: &str) -> String {
        match self.lines.of_case(name) {
            Some(l) => format!("{}:{l}", self.file.display()),
            None => self.file.display().to_string(),
        }
    }

    fn resolve(&self, path: &str) -> PathBuf {
        self.file
            .parent()
            .map_or_else(|| PathBuf::from(path), |d| d.join(path))
    }

    fn is_file_ref(s: &str) -> bool {
        s.ends_with(".yaml") || s.ends_with(".yml") || s.ends_with(".json")
    }

    /// The objects an entry stands for.
    fn entry(&self, e: &Entry, depth: usize, out: &mut Vec<Value>) -> Result<(), String> {
        match e {
            Entry::Inline(m) => out.push(Value::Object(m.clone())),
            Entry::Ref(r) if Self::is_file_ref(r) => {
                let path = self.resolve(r);
                let text = read_text(&path, MAX_OBJECTS_FILE)?;
                load_snapshot(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                out.extend(raw_objects(&text).into_iter().filter(|v| !v.is_null()));
            }
            Entry::Ref(r) => {
                let Some(set) = self.sets.get(r) else {
                    let known: Vec<&str> = self.sets.keys().map(String::as_str).collect();
                    let hint = match crate::diagnostics::did_you_mean(r, known.iter().copied()) {
                        Some(k) => format!("; did you mean `{k}`?"),
                        None => String::new(),
                    };
                    return Err(format!(
                        "`{r}` is not one of the file's `objects` (nor a file: those end in \
                         .yaml, .yml or .json){hint}"
                    ));
                };
                if depth > 16 {
                    return Err(format!("`{r}`: object sets refer to each other in a cycle"));
                }
                self.set(set, depth + 1, out)?;
            }
        }
        Ok(())
    }

    fn set(&self, s: &OneOrMany, depth: usize, out: &mut Vec<Value>) -> Result<(), String> {
        match s {
            OneOrMany::One(e) => self.entry(e, depth, out),
            OneOrMany::Many(es) => es.iter().try_for_each(|e| self.entry(e, depth, out)),
        }
    }

    fn one(&self, e: &Entry, what: &str) -> Result<Value, String> {
        let mut v = Vec::new();
        self.entry(e, 0, &mut v)?;
        match <[Value; 1]>::try_from(v) {
            Ok([one]) => Ok(one),
            Err(v) => Err(format!("{what} must be one object; it is {}", v.len())),
        }
    }

    fn case(&self, spec: CaseSpec) -> Result<Case, String> {
        let mut objects = Vec::new();
        if let Some(o) = &spec.objects {
            self.set(o, 0, &mut objects)?;
        }
        let given: Vec<&str> = [
            ("review", spec.review.is_some()),
            ("delete", spec.delete.is_some()),
            ("apply", spec.apply.is_some()),
            ("approve", spec.approve.is_some()),
            ("unapprove", spec.unapprove.is_some()),
            ("unschedule", spec.unschedule.is_some()),
            ("status", spec.status.is_some()),
            ("reconcile", spec.reconcile.is_some()),
            ("step", spec.step.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        if given.len() != 1 {
            return Err(format!(
                "a case gives exactly one request (review, delete, apply, approve, unapprove, \
                 unschedule, status), reconcile or step; this one gives {}",
                if given.is_empty() {
                    "none".to_string()
                } else {
                    given.join(", ")
                }
            ));
        }
        let target = |flag: &str, t: &str| parse_target(t).map_err(|e| format!("{flag}: {e}"));
        let request = if let Some(r) = &spec.review {
            match r {
                ReviewSpec::File(path) => {
                    let path = self.resolve(path);
                    Request::Review(read(&path, crate::runtime::webhook::MAX_BODY as u64)?)
                }
                ReviewSpec::Inline(r) => {
                    let old = r
                        .old
                        .as_ref()
                        .map(|e| self.one(e, "review.old"))
                        .transpose()?;
                    let new = r
                        .new
                        .as_ref()
                        .map(|e| self.one(e, "review.new"))
                        .transpose()?;
                    let review =
                        review_of(&r.operation, old, new).map_err(|e| format!("review: {e}"))?;
                    Request::Review(serde_json::to_vec(&review).map_err(|e| e.to_string())?)
                }
            }
        } else if let Some(t) = &spec.delete {
            Request::Form(Form::Delete(target("delete", t)?))
        } else if let Some(t) = &spec.approve {
            Request::Form(Form::Approve(target("approve", t)?))
        } else if let Some(t) = &spec.unapprove {
            Request::Form(Form::Unapprove(target("unapprove", t)?))
        } else if let Some(t) = &spec.unschedule {
            Request::Form(Form::Unschedule(target("unschedule", t)?))
        } else if let Some(e) = spec.apply.as_ref().or(spec.status.as_ref()) {
            let value = match e {
                Entry::Ref(r) if Self::is_file_ref(r) => {
                    let path = self.resolve(r);
                    let text = read_text(&path, crate::runtime::webhook::MAX_BODY as u64)?;
                    read_apply_file(&path, &text)?
                }
                e => {
                    let v = self.one(e, "apply")?;
                    let text = serde_json::to_string(&v).map_err(|e| e.to_string())?;
                    read_apply_file(Path::new("apply"), &text)?
                }
            };
            if spec.apply.is_some() {
                Request::Form(Form::Apply(value))
            } else {
                Request::Form(Form::Status(value))
            }
        } else if let Some(t) = &spec.step {
            let Some((ns, name)) = t
                .split_once('/')
                .filter(|(n, m)| !n.is_empty() && !m.is_empty())
            else {
                return Err(format!(
                    "step {t:?}: expected NAMESPACE/NAME of a TalosOperation"
                ));
            };
            Request::Step(ns.to_string(), name.to_string(), spec.node.clone())
        } else {
            let t = spec.reconcile.as_deref().unwrap_or_default();
            let Some((ns, name)) = t
                .split_once('/')
                .filter(|(n, m)| !n.is_empty() && !m.is_empty())
            else {
                return Err(format!("reconcile {t:?}: expected NAMESPACE/NAME"));
            };
            Request::Reconcile(ns.to_string(), name.to_string())
        };
        if spec.node.is_some() && spec.step.is_none() {
            return Err(
                "`node` names the machine a step works on; it goes with `step`, not alone".into(),
            );
        }
        let reconcile = matches!(request, Request::Reconcile(..) | Request::Step(..));
        if spec.by_controller && reconcile {
            return Err(
                "`byController` says who makes a request; a reconcile or a step is \
                 the controller's own already"
                    .into(),
            );
        }
        let e = &spec.expect;
        match (reconcile, e.verdict) {
            (false, Verdict::Proceed | Verdict::Hold) => {
                return Err(format!(
                    "expect.verdict `{}` is the controller's; a request is `allow` or `refuse`",
                    e.verdict.word()
                ));
            }
            (true, Verdict::Allow) => {
                return Err(
                    "expect.verdict `allow` is the webhook's; a reconcile is `proceed`, `hold` or `refuse`"
                        .into(),
                );
            }
            _ => {}
        }
        let deciding = matches!(e.verdict, Verdict::Refuse | Verdict::Hold);
        if deciding && e.rules.as_ref().is_none_or(Vec::is_empty) {
            return Err(format!(
                "expect.verdict `{}` names the rules that must decide it: `rules: [...]` \
                 (a refusal no rule made would pass vacuously)",
                e.verdict.word()
            ));
        }
        if !deciding && e.rules.as_ref().is_some_and(|r| !r.is_empty()) {
            return Err(format!(
                "expect.rules names deciding rules, and `{}` is decided by none: drop \
                 `rules`, or expect `refuse`/`hold`",
                e.verdict.word()
            ));
        }
        if !deciding && (!e.messages.is_empty() || e.reason.is_some()) {
            return Err(format!(
                "expect.messages and expect.reason are about the deciding rules, and `{}` has none \
                 (warnings go in expect.warnings)",
                e.verdict.word()
            ));
        }
        Ok(Case {
            file: self.file.to_path_buf(),
            line: self.lines.of_case(&spec.name),
            name: spec.name,
            objects,
            request,
            cluster_missing: spec.cluster_missing,
            by_controller: spec.by_controller,
            expect: spec.expect,
        })
    }
}

fn load_file(path: &Path) -> Result<Vec<Case>, BadFile> {
    let text = read_text(path, MAX_OBJECTS_FILE).map_err(BadFile)?;
    let yaml = crate::runtime::nesting::yaml(&text).map_err(|e| {
        BadFile(format!(
            "{}:{}:{}: nested more than {} levels deep; a test file nests far less (cases, \
             their objects and requests), so it is refused before it is parsed",
            path.display(),
            e.line,
            e.column,
            crate::runtime::nesting::MAX_NESTING
        ))
    })?;
    let file = TestFile::deserialize(yaml).map_err(|e| {
        let at = match e.location() {
            Some(l) => format!("{}:{}:{}", path.display(), l.line(), l.column()),
            None => path.display().to_string(),
        };
        BadFile(format!(
            "{at}: {e}; a test file has `cases:` (and optionally `objects:`), see docs/rules.md, \"Testing rules\""
        ))
    })?;
    let loader = Loader {
        file: path,
        lines: CaseLines::of(&text),
        sets: &file.objects,
    };
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for spec in file.cases {
        if !names.insert(spec.name.clone()) {
            return Err(BadFile(format!(
                "{}: two cases are named {:?}; names identify cases in reports",
                loader.at(&spec.name),
                spec.name
            )));
        }
        let at = loader.at(&spec.name);
        let name = spec.name.clone();
        out.push(
            loader
                .case(spec)
                .map_err(|e| BadFile(format!("{at}: case {name:?}: {e}")))?,
        );
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Running.
// ---------------------------------------------------------------------------------------

/// What was decided, in the terms of an expectation.
#[derive(serde::Serialize)]
struct Actual {
    verdict: Verdict,
    rules: Vec<String>,
    reason: Option<String>,
    messages: Vec<String>,
    warnings: Vec<String>,
    events: usize,
    /// Every rule evaluated, in order.
    considered: Vec<String>,
    /// The `allow` statements that cover the events no rule looked at.
    allowed_by: Vec<String>,
    notes: Vec<String>,
    /// The TalosClusters the events name that the objects do not hold (`namespace/name`).
    missing_clusters: Vec<String>,
}

struct Ran {
    case: Case,
    /// `Err`: the case could not be decided (its objects or request are bad input).
    result: Result<(Actual, Vec<String>), String>,
    review: Option<Value>,
    response: Option<Value>,
    /// (rule, when, unless, matched) of every row evaluated.
    rows: Vec<(String, Option<bool>, Option<bool>, bool)>,
}

fn glob(pattern: &str, text: &str) -> bool {
    if !pattern.contains('*') {
        return text.contains(pattern);
    }
    // Anywhere in the name, as without `*`.
    let anywhere = format!("*{pattern}*");
    let parts: Vec<&str> = anywhere.split('*').collect();
    let mut rest = text;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(p) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return p.is_empty() || rest.ends_with(p);
        } else if let Some(at) = rest.find(p) {
            rest = &rest[at + p.len()..];
        } else {
            return false;
        }
    }
    rest.is_empty()
}

/// Makes `review` a request by `user`, a ServiceAccount as the API server names one.
fn as_user(review: &mut Value, user: &str) {
    if let Some(request) = review.get_mut("request").and_then(Value::as_object_mut) {
        let mut groups = vec![json!("system:serviceaccounts")];
        if let Some(ns) = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .map(|(ns, _)| ns)
        {
            groups.push(json!(format!("system:serviceaccounts:{ns}")));
        }
        groups.push(json!("system:authenticated"));
        request.insert(
            "userInfo".into(),
            json!({"username": user, "groups": groups}),
        );
    }
}

fn run_case(table: &Table, case: Case, now: &str) -> Ran {
    let mut ran = Ran {
        case,
        result: Err(String::new()),
        review: None,
        response: None,
        rows: Vec::new(),
    };
    let stream = ran
        .case
        .objects
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n");
    let snapshot = match load_snapshot(&stream) {
        Ok(s) => s,
        Err(e) => {
            ran.result = Err(format!("objects: {e}"));
            return ran;
        }
    };
    // `byController: true`: the controller's user, and a webhook that knows it.
    let controller = ran
        .case
        .by_controller
        .then_some(super::TEST_CONTROLLER_USERNAME);
    let decided: Result<Outcome, String> = match &ran.case.request {
        Request::Review(body) => {
            let review = crate::runtime::nesting::json::<Value>(body).ok();
            match (review, controller) {
                (Some(mut review), Some(user)) => {
                    as_user(&mut review, user);
                    let body = serde_json::to_vec(&review).unwrap_or_default();
                    ran.review = Some(review);
                    outcome::admission_as(table, &snapshot, &body, true, controller)
                }
                // A body that is no JSON is decided as it is (its error is the answer).
                (review, _) => {
                    ran.review = review;
                    outcome::admission_as(table, &snapshot, body, true, controller)
                }
            }
        }
        Request::Form(form) => match build_review(form, &ran.case.objects, now) {
            Ok(mut review) => {
                if let Some(user) = controller {
                    as_user(&mut review, user);
                }
                let body = serde_json::to_vec(&review).unwrap_or_default();
                ran.review = Some(review);
                outcome::admission_as(table, &snapshot, &body, true, controller)
            }
            Err(e) => Err(e),
        },
        Request::Reconcile(ns, name) => outcome::reconcile(table, &snapshot, ns, name, true),
        Request::Step(ns, name, node) => {
            outcome::step(table, &snapshot, ns, name, node.as_deref(), true)
        }
    };
    let o = match decided {
        Ok(o) => o,
        Err(e) => {
            ran.result = Err(e);
            return ran;
        }
    };
    for t in &o.traces {
        for r in &t.rows {
            ran.rows.push((r.rule.clone(), r.when, r.unless, r.matched));
        }
    }
    let reconcile = o.request.is_none();
    if let Some(req) = &o.request {
        ran.response = serde_json::to_value(match &o.not_by_rule {
            Some(m) => crate::runtime::admission::refuse(req, m.clone()),
            None => crate::runtime::admission::respond(req, &o.decision),
        })
        .ok();
    }
    let deciding = o.decision.deciding();
    let (verdict, mut rules, messages) = if let Some(m) = &o.not_by_rule {
        (
            Verdict::Refuse,
            vec!["(immutable-spec)".to_string()],
            vec![m.clone()],
        )
    } else {
        let v = match o.decision.verdict() {
            Some(crate::vocab::Verdict::Refuse) => Verdict::Refuse,
            Some(crate::vocab::Verdict::Hold) => Verdict::Hold,
            _ if reconcile => Verdict::Proceed,
            _ => Verdict::Allow,
        };
        (
            v,
            deciding.iter().map(|f| f.rule.clone()).collect(),
            deciding.iter().map(|f| f.message.clone()).collect(),
        )
    };
    rules.sort();
    rules.dedup();
    let mut considered: Vec<String> = Vec::new();
    for (r, ..) in &ran.rows {
        if !considered.contains(r) {
            considered.push(r.clone());
        }
    }
    let allowed_by: Vec<String> = o
        .kinds
        .iter()
        .filter(|k| table.allowed.contains(k))
        .map(|(verb, subject, site)| {
            format!(
                "allow {} {} at {}",
                verb.name(),
                subject.name(),
                site.name()
            )
        })
        .collect();
    let actual = Actual {
        allowed_by,
        verdict,
        rules,
        reason: deciding.iter().find_map(|f| f.reason.clone()),
        messages,
        warnings: o
            .decision
            .warnings
            .iter()
            .map(|f| f.message.clone())
            .collect(),
        events: o.events,
        considered,
        notes: o.notes.clone(),
        missing_clusters: o.missing_clusters.clone(),
    };
    let failures = compare(&ran.case.expect, ran.case.cluster_missing, &actual);
    ran.result = Ok((actual, failures));
    ran
}

/// Every way `actual` differs from `expect` (and from `clusterMissing`), one line each;
/// empty when the case passes.
fn compare(e: &Expect, cluster_missing: bool, a: &Actual) -> Vec<String> {
    let mut out = Vec::new();
    let list = |v: &[String]| {
        if v.is_empty() {
            "(none)".to_string()
        } else {
            v.join(", ")
        }
    };
    if e.verdict != a.verdict {
        out.push(format!(
            "verdict: expected {}, decided {}{}",
            e.verdict.word(),
            a.verdict.word(),
            if a.rules.is_empty() {
                String::new()
            } else {
                format!(" by {}", a.rules.join(", "))
            }
        ));
    }
    if let Some(want) = &e.rules {
        let mut want = want.clone();
        want.sort();
        want.dedup();
        if want != a.rules && e.verdict == a.verdict {
            let missing: Vec<String> = want
                .iter()
                .filter(|r| !a.rules.contains(r))
                .cloned()
                .collect();
            let extra: Vec<String> = a
                .rules
                .iter()
                .filter(|r| !want.contains(r))
                .cloned()
                .collect();
            out.push(format!(
                "rules: expected {}, decided by {} (missing: {}; not expected: {})",
                list(&want),
                list(&a.rules),
                list(&missing),
                list(&extra)
            ));
        }
    }
    if let Some(r) = &e.reason
        && a.reason.as_ref() != Some(r)
    {
        out.push(format!(
            "reason: expected {r}, decided {}",
            a.reason.as_deref().unwrap_or("(none)")
        ));
    }
    for m in &e.messages {
        if !a.messages.iter().any(|x| x.contains(m.as_str())) {
            out.push(format!(
                "messages: none contains {m:?}; the deciding messages are: {}",
                if a.messages.is_empty() {
                    "(none)".to_string()
                } else {
                    a.messages
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
    }
    if let Some(w) = &e.warnings {
        if w.is_empty() && !a.warnings.is_empty() {
            out.push(format!("warnings: expected none, got {:?}", a.warnings));
        }
        for f in w {
            if !a.warnings.iter().any(|x| x.contains(f.as_str())) {
                out.push(format!(
                    "warnings: none contains {f:?}; the warnings are {:?}",
                    a.warnings
                ));
            }
        }
    }
    match e.events {
        Some(n) if n != a.events => out.push(format!(
            "events: expected {n}, the {} produced {}",
            if a.verdict == Verdict::Proceed || a.verdict == Verdict::Hold {
                "reconcile"
            } else {
                "request"
            },
            a.events
        )),
        // No vacuous pass: an allow (or proceed) must come from rules that looked at the
        // request and let it through, unless the case says there is no event at all.
        None if out.is_empty()
            && a.rules.is_empty()
            && a.considered.is_empty()
            && (a.allowed_by.is_empty() || a.allowed_by.len() < a.events) =>
        {
            out.push(if a.events == 0 {
                "vacuous: no rule decided this case: it produces no event (an ordinary edit, \
                 or nothing for the controller to do); write `events: 0` if that is what it tests"
                    .to_string()
            } else {
                "vacuous: no rule decided this case: no rule covers its events; add a rule, \
                 or write `events: N` if it tests only that the event happens"
                    .to_string()
            });
        }
        _ => {}
    }
    // A cluster read as missing is said, and is what the case meant or a failure.
    match (cluster_missing, a.missing_clusters.is_empty()) {
        (false, false) => out.push(format!(
            "cluster: the objects hold no TalosCluster {}, so it was read as missing \
             (cluster.exists = false, count = 0); add it to the case's objects (in the \
             namespace of the machine), or write `clusterMissing: true` if the case tests a \
             missing cluster",
            a.missing_clusters.join(", ")
        )),
        (true, true) if a.events > 0 => out.push(
            "cluster: the case says `clusterMissing: true`, and the objects hold every \
             TalosCluster its events name; drop `clusterMissing`, or leave the cluster out"
                .to_string(),
        ),
        _ => {}
    }
    out
}

// ---------------------------------------------------------------------------------------
// Coverage.
// ---------------------------------------------------------------------------------------

#[derive(serde::Serialize)]
struct RuleCoverage {
    rule: String,
    file: String,
    line: usize,
    /// Cases that evaluated it, and in which it matched.
    evaluated: usize,
    fired: usize,
    /// `when` true / false seen (absent without `when`).
    #[serde(skip_serializing_if = "Option::is_none")]
    when_true: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    when_false: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unless_true: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unless_false: Option<bool>,
}

impl RuleCoverage {
    fn items(&self) -> (usize, usize) {
        let mut total = 1;
        let mut hit = usize::from(self.evaluated > 0);
        for b in [
            self.when_true,
            self.when_false,
            self.unless_true,
            self.unless_false,
        ]
        .into_iter()
        .flatten()
        {
            total += 1;
            hit += usize::from(b);
        }
        (hit, total)
    }
}

fn coverage(table: &Table, ran: &[Ran]) -> Vec<RuleCoverage> {
    table
        .rules
        .iter()
        .map(|r| {
            let mut c = RuleCoverage {
                rule: r.name.clone(),
                file: r.file.clone(),
                line: r.line,
                evaluated: 0,
                fired: 0,
                when_true: r.when_text.as_ref().map(|_| false),
                when_false: r.when_text.as_ref().map(|_| false),
                unless_true: r.unless_text.as_ref().map(|_| false),
                unless_false: r.unless_text.as_ref().map(|_| false),
            };
            for run in ran {
                let rows: Vec<_> = run.rows.iter().filter(|x| x.0 == r.name).collect();
                if rows.is_empty() {
                    continue;
                }
                c.evaluated += 1;
                c.fired += usize::from(rows.iter().any(|x| x.3));
                for (_, when, unless, _) in rows {
                    let set = |slot: &mut Option<bool>, seen: bool| {
                        if seen && let Some(s) = slot {
                            *s = true;
                        }
                    };
                    set(&mut c.when_true, *when == Some(true));
                    set(&mut c.when_false, *when == Some(false));
                    set(&mut c.unless_true, *unless == Some(true));
                    set(&mut c.unless_false, *unless == Some(false));
                }
            }
            c
        })
        .collect()
}

fn percent(cov: &[RuleCoverage]) -> f64 {
    let (hit, total) = cov.iter().fold((0, 0), |(h, t), c| {
        let (a, b) = c.items();
        (h + a, t + b)
    });
    if total == 0 {
        100.0
    } else {
        hit as f64 * 100.0 / total as f64
    }
}

// ---------------------------------------------------------------------------------------
// Reports.
// ---------------------------------------------------------------------------------------

fn where_(c: &Case) -> String {
    match c.line {
        Some(l) => format!("{}:{l}", c.file.display()),
        None => c.file.display().to_string(),
    }
}

fn decided_by(a: &Actual) -> String {
    match a.verdict {
        Verdict::Refuse | Verdict::Hold => {
            format!("{} by {}", a.verdict.word(), a.rules.join(", "))
        }
        _ if a.events == 0 => format!("{}: no event, no rule looked at it", a.verdict.word()),
        _ if a.considered.is_empty() && !a.allowed_by.is_empty() => {
            format!("{}: by `{}`", a.verdict.word(), a.allowed_by.join("`, `"))
        }
        _ if a.considered.is_empty() => format!("{}: no rule covers its events", a.verdict.word()),
        _ => format!(
            "{}: evaluated {}; none refused or held",
            a.verdict.word(),
            a.considered.join(", ")
        ),
    }
}

fn human(ran: &[Ran], filtered: usize, cov: Option<&[RuleCoverage]>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut file: Option<&Path> = None;
    for r in ran {
        if file != Some(r.case.file.as_path()) {
            file = Some(r.case.file.as_path());
            let _ = writeln!(out, "{}", r.case.file.display());
        }
        match &r.result {
            Ok((a, f)) if f.is_empty() => {
                let _ = writeln!(out, "  ok    {} ({})", r.case.name, decided_by(a));
                for n in &a.notes {
                    let _ = writeln!(out, "        note: {n}");
                }
                if r.case.cluster_missing {
                    let _ = writeln!(
                        out,
                        "        note: the case declares its TalosCluster missing (`clusterMissing: true`)"
                    );
                }
            }
            Ok((a, f)) => {
                let _ = writeln!(out, "  FAIL  {} ({})", r.case.name, where_(&r.case));
                for line in f {
                    let _ = writeln!(out, "        - {line}");
                }
                let _ = writeln!(out, "        decided: {}", decided_by(a));
                for n in &a.notes {
                    let _ = writeln!(out, "        note: {n}");
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  ERROR {} ({}): {e}", r.case.name, where_(&r.case));
            }
        }
    }
    let passed = ran
        .iter()
        .filter(|r| matches!(&r.result, Ok((_, f)) if f.is_empty()))
        .count();
    if let Some(cov) = cov {
        let _ = writeln!(
            out,
            "\ncoverage (rule: evaluated/fired in cases; branches seen):"
        );
        for c in cov {
            let b = |name: &str, v: Option<bool>| match v {
                Some(true) => format!(" {name} ✓"),
                Some(false) => format!(" {name} ✗"),
                None => String::new(),
            };
            let (hit, total) = c.items();
            let _ = writeln!(
                out,
                "  {:<32} {}:{}  evaluated {} fired {} |{}{}{}{} | {hit}/{total}",
                c.rule,
                c.file,
                c.line,
                c.evaluated,
                c.fired,
                b("when=true", c.when_true),
                b("when=false", c.when_false),
                b("unless=true", c.unless_true),
                b("unless=false", c.unless_false),
            );
        }
        let _ = writeln!(out, "coverage: {:.1}% of rules and branches", percent(cov));
    }
    let _ = writeln!(
        out,
        "\n{} cases: {passed} passed, {} failed, {filtered} filtered out",
        ran.len(),
        ran.len() - passed
    );
    out
}

fn json_report(ran: &[Ran], filtered: usize, cov: Option<&[RuleCoverage]>) -> Value {
    let cases: Vec<Value> = ran
        .iter()
        .map(|r| {
            let (status, actual, failures, error) = match &r.result {
                Ok((a, f)) => (
                    if f.is_empty() { "pass" } else { "fail" },
                    serde_json::to_value(a).unwrap_or_default(),
                    f.clone(),
                    Value::Null,
                ),
                Err(e) => ("error", Value::Null, Vec::new(), Value::String(e.clone())),
            };
            json!({
                "file": r.case.file.display().to_string(),
                "line": r.case.line,
                "name": r.case.name,
                "status": status,
                "expected": r.case.expect,
                "clusterMissing": r.case.cluster_missing,
                "byController": r.case.by_controller,
                "actual": actual,
                "failures": failures,
                "error": error,
                "objects": r.case.objects,
                "review": r.review,
                "response": r.response,
                "reconcile": match &r.case.request {
                    Request::Reconcile(ns, n) => Value::String(format!("{ns}/{n}")),
                    _ => Value::Null,
                },
                "step": match &r.case.request {
                    Request::Step(ns, n, node) => json!({
                        "operation": format!("{ns}/{n}"),
                        "node": node,
                    }),
                    _ => Value::Null,
                },
            })
        })
        .collect();
    let passed = ran
        .iter()
        .filter(|r| matches!(&r.result, Ok((_, f)) if f.is_empty()))
        .count();
    let mut out = json!({
        "cases": cases,
        "passed": passed,
        "failed": ran.len() - passed,
        "filtered": filtered,
    });
    if let Some(cov) = cov {
        out["coverage"] = json!({"rules": cov, "percent": percent(cov)});
    }
    out
}

/// `s` as XML 1.0 text or attribute value: markup characters escaped, and every character
/// XML 1.0 forbids (anything outside #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] |
/// [#x10000-#x10FFFF]; a reference to one is not well-formed either) written as its Rust
/// escape (`\u{fffe}`), as are the other control characters, so the report parses and the
/// name stays recognisable. A `\r` is a character reference (a parser would turn it into
/// `\n`), and so are tabs and line breaks in an attribute (`attr`; they would become
/// spaces).
fn xml(s: &str, attr: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' if !attr => out.push(c),
            '\t' | '\n' | '\r' => out.push_str(&format!("&#{};", u32::from(c))),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                out.extend(c.escape_unicode());
            }
            c => out.push(c),
        }
    }
    out
}

fn junit(ran: &[Ran]) -> String {
    use std::fmt::Write;
    // One suite per file, in the order of first appearance (looked up, not searched: many
    // files of few cases stay linear).
    let mut by_file: Vec<(&Path, Vec<&Ran>)> = Vec::new();
    let mut index: std::collections::HashMap<&Path, usize> = Default::default();
    for r in ran {
        let file = r.case.file.as_path();
        let i = *index.entry(file).or_insert_with(|| {
            by_file.push((file, Vec::new()));
            by_file.len() - 1
        });
        if let Some((_, cases)) = by_file.get_mut(i) {
            cases.push(r);
        }
    }
    let failed = |r: &Ran| !matches!(&r.result, Ok((_, f)) if f.is_empty());
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"ichor-rules test\" tests=\"{}\" failures=\"{}\">",
        ran.len(),
        ran.iter().filter(|r| failed(r)).count()
    );
    for (file, cases) in by_file {
        let name = xml(&file.display().to_string(), true);
        let _ = writeln!(
            out,
            "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{}\">",
            cases.len(),
            cases.iter().filter(|r| failed(r)).count()
        );
        for r in cases {
            let _ = write!(
                out,
                "    <testcase classname=\"{name}\" name=\"{}\"",
                xml(&r.case.name, true)
            );
            match &r.result {
                Ok((_, f)) if f.is_empty() => {
                    let _ = writeln!(out, "/>");
                }
                Ok((a, f)) => {
                    let _ = writeln!(
                        out,
                        ">\n      <failure message=\"{}\">{}\ndecided: {}</failure>\n    </testcase>",
                        xml(&f[0], true),
                        xml(&f.join("\n"), false),
                        xml(&decided_by(a), false)
                    );
                }
                Err(e) => {
                    let _ = writeln!(
                        out,
                        ">\n      <error message=\"{}\"/>\n    </testcase>",
                        xml(e, true)
                    );
                }
            }
        }
        let _ = writeln!(out, "  </testsuite>");
    }
    out.push_str("</testsuites>\n");
    out
}

fn bad(msg: impl std::fmt::Display) -> u8 {
    eprintln!("error: {msg}");
    EXIT_BAD_INPUT
}

pub fn run(args: &TestArgs) -> u8 {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from("rules/tests")]
    } else {
        args.paths.clone()
    };
    if let Some(p) = args.fail_under
        && !(0.0..=100.0).contains(&p)
    {
        return bad(format!("--fail-under {p}: a percentage from 0 to 100"));
    }
    let set = match load(&args.rules) {
        Ok(s) => s,
        Err(e) => return bad(e),
    };
    let Some(table) = &set.table else {
        eprint!("{}", render_human(&set.diagnostics, &set.files, false));
        return bad(format!(
            "the rules have {} error(s); fix them (`ichor-rules check`) before testing",
            set.errors()
        ));
    };
    let files = match test_files(&paths) {
        Ok(f) => f,
        Err(e) => return bad(e),
    };
    let mut cases = Vec::new();
    for f in &files {
        match load_file(f) {
            Ok(c) => cases.extend(c),
            Err(BadFile(e)) => return bad(e),
        }
    }
    let total = cases.len();
    if let Some(p) = &args.run {
        cases.retain(|c| glob(p, &c.name));
    }
    let filtered = total - cases.len();
    if cases.is_empty() {
        return bad(match &args.run {
            Some(p) => format!(
                "no case matches --run {p:?} ({total} cases in {} files)",
                files.len()
            ),
            None => "the test files hold no case".to_string(),
        });
    }
    let now = now();
    let ran: Vec<Ran> = cases
        .into_iter()
        .map(|c| run_case(table, c, &now))
        .collect();
    let cov = (args.coverage || args.fail_under.is_some()).then(|| coverage(table, &ran));
    let text = match args.format {
        TestFormat::Human => human(&ran, filtered, cov.as_deref()),
        TestFormat::Json => {
            match serde_json::to_string_pretty(&json_report(&ran, filtered, cov.as_deref())) {
                Ok(s) => s + "\n",
                Err(e) => return bad(format!("cannot write the report: {e}")),
            }
        }
        TestFormat::Junit => junit(&ran),
    };
    if let Err(code) = emit(&text) {
        return code;
    }
    // A case whose objects or request cannot be read is a bad test file.
    if let Some(r) = ran.iter().find(|r| r.result.is_err()) {
        if let Err(e) = &r.result {
            eprintln!("error: {}: case {:?}: {e}", where_(&r.case), r.case.name);
        }
        return EXIT_BAD_INPUT;
    }
    let failed = ran
        .iter()
        .any(|r| matches!(&r.result, Ok((_, f)) if !f.is_empty()));
    if let (Some(p), Some(cov)) = (args.fail_under, &cov) {
        let got = percent(cov);
        if got < p {
            eprintln!("error: coverage {got:.1}% is below --fail-under {p}%");
            return EXIT_FINDINGS;
        }
    }
    if failed { EXIT_FINDINGS } else { EXIT_OK }
}
