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
