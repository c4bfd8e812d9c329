//! The events a rule or plan covers: its verbs, subjects and sites, as written.

use super::*;

impl<'a, 'd> FileChecker<'a, 'd> {
    /// Resolves verbs, subject and site to the events they stand for, reporting unknown words
    /// and combinations the runtime never produces.
    pub(super) fn events(
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
}
