//! The language modules are layered: each imports only the ones below it, so none of them
//! forms a cycle with another (and none reaches the runtime, which `cargo check --lib
//! --no-default-features` checks by compiling them alone). From the bottom: `span`, `vocab`,
//! `diagnostics`, `syntax`, `value`, `check`, `compile`, `interp`, `ruleset`.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 9] = [
    "span",
    "vocab",
    "diagnostics",
    "syntax",
    "value",
    "check",
    "compile",
    "interp",
    "ruleset",
];

/// The files of a module: `src/m.rs`, or everything under `src/m/`.
fn files_of(module: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let single = src.join(format!("{module}.rs"));
    if single.exists() {
        return vec![single];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(module)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("module folder") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    assert!(!out.is_empty(), "no files for module {module}");
    out
}

/// The modules of the crate a source text names (`crate::m`), outside comments and its
/// unit tests (which may use anything: they are not part of the library).
fn imports(text: &str) -> Vec<String> {
    let code = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn language_modules_import_only_the_layers_below_them() {
    let mut wrong = Vec::new();
    for (i, module) in LAYERS.iter().enumerate() {
        for file in files_of(module) {
            let text = std::fs::read_to_string(&file).expect("read");
            for name in imports(&text) {
                if name == *module {
                    continue;
                }
                match LAYERS.iter().position(|m| *m == name) {
                    Some(j) if j < i => {}
                    _ => wrong.push(format!("{} imports crate::{name}", file.display())),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check above would pass vacuously if it found no import: it sees the ones there are,
/// and refuses one that goes up a layer or out of the language.
#[test]
fn the_layer_check_sees_imports() {
    let check = files_of("check")
        .iter()
        .flat_map(|f| imports(&std::fs::read_to_string(f).expect("read")))
        .collect::<Vec<_>>();
    assert!(check.iter().any(|m| m == "syntax"), "{check:?}");
    assert_eq!(
        imports("use crate::interp::Session;\n// crate::runtime in a comment\nfn f() {}\n"),
        ["interp"]
    );
    assert_eq!(
        imports(
            "use crate::vocab::Fact;\n#[cfg(test)]\nmod tests {\n    use crate::runtime::x;\n}\n"
        ),
        ["vocab"]
    );
}

/// The reads of a TalosMachine's status outside `src/runtime/objects/mod.rs` in `text`
/// (outside comments and unit tests): a condition looked up by a type the machine's reads
/// cover, or `status.removal` read. `status_reads!` declares every read the controller and
/// the decisions make, and the status guard compares exactly those; a read written anywhere
/// else would be one the guard does not cover.
fn direct_status_reads(text: &str) -> Vec<String> {
    // Unit test modules (whatever their name, in the file or a file of their own) are not
    // the library.
    if text.lines().any(|l| l.trim() == "#![cfg(test)]") {
        return Vec::new();
    }
    let code = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
    let types: Vec<String> = ichor_rules::runtime::objects::MACHINE_CONDITIONS_READ
        .iter()
        .map(|t| format!("\"{t}\""))
        .chain(["REMOVAL".to_string()])
        .collect();
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let lookup = ["status::find(", ".condition(", "find(", ".conditions()"]
            .iter()
            .any(|f| t.contains(f));
        let removal_read = t.match_indices(".removal").any(|(i, m)| {
            let rest = &t[i + m.len()..];
            !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && !rest.trim_start().starts_with('=')
        });
        let timer = t.contains(".last_transition_time");
        if (lookup && types.iter().any(|ty| t.contains(ty.as_str()))) || removal_read || timer {
            out.push(format!("line {}: {}", n + 1, t));
        }
    }
    out
}

#[test]
fn status_reads_are_the_only_reads() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // The module that declares the reads, and the generic condition writer (which sets
    // lastTransitionTime when a condition changes), are where status is handled as such.
    let allowed = [
        src.join("runtime/objects/mod.rs"),
        src.join("runtime/controller/status.rs"),
    ];
    let mut files = Vec::new();
    let mut dirs = vec![src.join("runtime"), src.join("cli")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("folder") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !allowed.contains(&p) {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 20, "{files:?}");
    let mut wrong = Vec::new();
    for f in &files {
        for r in direct_status_reads(&std::fs::read_to_string(f).expect("read")) {
            wrong.push(format!("{}: {r}", f.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "read these through an accessor of `status_reads!` (src/runtime/objects/mod.rs), so \
         that the status guard covers them:\n{}",
        wrong.join("\n")
    );
    // The guard compares every declared read.
    let reads = ichor_rules::runtime::objects::TalosMachine::default().status_reads();
    let names: Vec<&str> = reads.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ichor_rules::runtime::objects::STATUS_READS);
    for must in [
        "node_unreachable",
        "unreachable_since",
        "removal_progress",
        "removal_reason",
    ] {
        assert!(names.contains(&must), "{names:?}");
    }
}

/// The check above sees the reads it is about, and leaves writes and other kinds alone.
#[test]
fn the_status_read_check_sees_reads() {
    let seen = |s: &str| !direct_status_reads(s).is_empty();
    assert!(seen("let since = status::find(conds, \"NodeReachable\");"));
    assert!(seen(
        "if status::find(next.conditions_mut(), REMOVAL).is_some() {}"
    ));
    assert!(seen("let r = m.condition(\"Ready\");"));
    assert!(seen(
        "let p = m.status.as_ref().and_then(|s| s.removal.clone());"
    ));
    assert!(seen("let t = c.last_transition_time.as_ref();"));
    assert!(!seen(
        "status::set(next.conditions_mut(), REMOVAL, false, r, &m);"
    ));
    assert!(!seen(
        "m.status.get_or_insert_with(Default::default).removal = Some(p);"
    ));
    assert!(!seen(
        "let paused = status::find(next.conditions_mut(), \"Paused\");"
    ));
    assert!(!seen("// status::find(conds, \"Ready\") in a comment"));
    assert!(!seen("let p = m.removal_progress();"));
    assert!(!seen("Condition { last_transition_time: None, ..c }"));
    assert!(!seen(
        "#[cfg(test)]\nmod clipping {\n let r = m.condition(\"Ready\");\n}"
    ));
    // A unit-test module in a file of its own (`#![cfg(test)]`) is not the library either.
    assert!(!seen(
        "//! tests\n#![cfg(test)]\nlet r = m.condition(\"Ready\");"
    ));
    assert!(seen("//! not tests\nlet r = m.condition(\"Ready\");"));
}

/// What in `text` (outside comments and unit tests) says what a controller step does: a
/// plan step's built-in action looked at, or the controller's own procedures and checks
/// called by name. `verify`'s model holds only the world; the steps are the executor's
/// (`runtime::exec`), run against that world.
fn controller_steps_named(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
    let forbidden = [
        "Action::",
        ".action",
        "removal::decide",
        "removal::applies",
        "controller::nodes",
        "nodes::",
        "healthy_sibling(",
        "member_dead(",
        "judge_member(",
        "find_member(",
        "\"talos reset\"",
        "\"talos wipe\"",
        "\"etcd leave\"",
    ];
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if let Some(f) = forbidden.iter().find(|f| t.contains(*f)) {
            out.push(format!("line {}: `{f}` in {t}", n + 1));
        }
    }
    out
}

#[test]
fn verify_holds_the_world_and_names_no_controller_step() {
    let mut wrong = Vec::new();
    for f in files_of("verify") {
        for r in controller_steps_named(&std::fs::read_to_string(&f).expect("read")) {
            wrong.push(format!("{}: {r}", f.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "src/verify/ says what a controller step does; run the executor's procedure \
         (runtime::exec) against the model's world (src/verify/world.rs) instead:\n{}",
        wrong.join("\n")
    );
    // The check sees a step written by hand.
    let seen = |s: &str| !controller_steps_named(s).is_empty();
    assert!(seen("match step.action {\n    BuiltIn::EtcdLeave => {}\n}"));
    assert!(seen("let d = removal::decide(table, snap, ev, &supplied);"));
    assert!(seen("if m.done.iter().any(|d| d == \"talos reset\") {}"));
    assert!(!seen("// match step.action"));
    assert!(!seen("let e = effect(\"etcd-leave\");"));
}
