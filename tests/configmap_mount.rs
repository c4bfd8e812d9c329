//! Rules mounted from a ConfigMap, laid out as the kubelet lays it out: each key is a
//! symlink `admission.rules -> ..data/admission.rules`, `..data` is a symlink to a hidden
//! timestamped folder holding the files, and an update writes a new timestamped folder and
//! renames a new `..data` link over the old one. The loader must follow the links, read
//! each file once (never the hidden folder's copies), and the reloader must notice a swap.

use ichor_rules::ruleset::{build, read_sources};
use ichor_rules::runtime::reload::{Reload, Rules};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("configmap-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch folder");
    dir
}

/// A mounted ConfigMap volume, updated as the kubelet's atomic writer updates it.
struct Volume {
    dir: PathBuf,
    generation: u32,
    current: Option<String>,
    keys: Vec<String>,
}

impl Volume {
    fn new(dir: PathBuf) -> Volume {
        Volume {
            dir,
            generation: 0,
            current: None,
            keys: Vec::new(),
        }
    }

    /// Publishes a new version: a new `..<timestamp>` folder, `..data` swapped by rename,
    /// top-level links for new keys, links of removed keys deleted, the old folder removed.
    fn publish(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let stamp = format!(
            "..2026_11_29_10_00_{:02}.{}",
            self.generation,
            1000 + self.generation
        );
        let version = self.dir.join(&stamp);
        std::fs::create_dir(&version).expect("version folder");
        for (name, text) in files {
            std::fs::write(version.join(name), text).expect("write key");
        }
        let tmp = self.dir.join("..data_tmp");
        symlink(&stamp, &tmp).expect("..data_tmp link");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(name), &link).expect("key link");
            }
        }
        let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
        for old in &self.keys {
            if !names.contains(old) {
                std::fs::remove_file(self.dir.join(old)).expect("remove old key link");
            }
        }
        self.keys = names;
        if let Some(old) = self.current.replace(stamp) {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove old version");
        }
    }
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(Path::new("rules").join(name)).expect("shipped rules")
}

/// The shipped admission rules with the `cluster-allow-delete` rule replaced by an
/// explicit `allow` (dropping it alone leaves `remove cluster` uncovered: refused).
fn admission_without_cluster_gate() -> String {
    let text = shipped("admission.rules");
    let start = text
        .find("rule cluster-allow-delete")
        .expect("the shipped rules have cluster-allow-delete");
    let end = start
        + text[start..]
            .find("\n\n")
            .expect("a blank line ends the rule")
        + 2;
    format!("{}allow remove cluster\n\n{}", &text[..start], &text[end..])
}

/// Every event the shipped `removal.rules` covers, explicitly allowed.
const ALLOW_REMOVALS: &str =
    "allow leave controlplane\nallow apply controlplane\nallow apply worker\nallow run operation\n";

#[test]
fn a_mounted_configmap_is_read_once_per_key_through_its_links() {
    let dir = scratch("layout");
    let mut volume = Volume::new(dir.clone());
    let (admission, removal) = (shipped("admission.rules"), shipped("removal.rules"));
    volume.publish(&[("admission.rules", &admission), ("removal.rules", &removal)]);
    // The layout is the kubelet's: links at the top, files only in the hidden folder.
    assert!(
        std::fs::symlink_metadata(dir.join("admission.rules"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        std::fs::symlink_metadata(dir.join("..data"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        4,
        "2 keys, ..data, one version"
    );

    let files = read_sources(std::slice::from_ref(&dir)).expect("loads");
    let names: Vec<String> = files
        .iter()
        .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["admission.rules", "removal.rules"]);
    assert_eq!(&*files[0].text, admission);
    assert_eq!(&*files[1].text, removal);
    // The paths are the stable top-level ones, not the timestamped folder's.
    assert!(files.iter().all(|f| f.path.parent() == Some(dir.as_path())));
}

#[test]
fn a_swap_of_the_data_link_reloads_and_a_broken_swap_keeps_the_table() {
    let dir = scratch("swap");
    let mut volume = Volume::new(dir.clone());
    let (admission, removal) = (shipped("admission.rules"), shipped("removal.rules"));
    volume.publish(&[("admission.rules", &admission), ("removal.rules", &removal)]);
    let rules = Rules::new(vec![dir.clone()]);
    let full = match rules.reload() {
        Reload::Replaced { rows, .. } => rows,
        other => panic!("first load: {other:?}"),
    };
    assert_eq!(rules.reload(), Reload::Unchanged);

    // An edit of one key: same paths, new text behind ..data.
    volume.publish(&[
        ("admission.rules", &admission_without_cluster_gate()),
        ("removal.rules", &removal),
    ]);
    let fewer = match rules.reload() {
        Reload::Replaced { rows, .. } => rows,
        other => panic!("after the swap: {other:?}"),
    };
    assert!(fewer < full, "a rule was dropped: {fewer} rows, was {full}");
    assert_eq!(rules.current().expect("serving").row_count(), fewer);
    assert_eq!(rules.reload(), Reload::Unchanged);

    // A broken edit is rejected and the previous table keeps serving.
    volume.publish(&[
        (
            "admission.rules",
            "rule broken\n  refuse remove machine when nonsense_fact\n",
        ),
        ("removal.rules", &removal),
    ]);
    assert!(matches!(rules.reload(), Reload::Rejected { .. }));
    assert_eq!(rules.current().expect("still serving").row_count(), fewer);

    // A key removed from the ConfigMap leaves the removal events uncovered: refused.
    volume.publish(&[("admission.rules", &admission)]);
    match rules.reload() {
        Reload::Rejected { reason, .. } => {
            assert!(reason.contains("remove controlplane"), "{reason}")
        }
        other => panic!("a set that covers no removal must be refused, got {other:?}"),
    }
    assert_eq!(rules.current().expect("still serving").row_count(), fewer);

    // The same key with the removals explicitly allowed: the set shrinks to one file.
    let together = format!("{admission}\n{ALLOW_REMOVALS}");
    volume.publish(&[("admission.rules", &together)]);
    let files = read_sources(std::slice::from_ref(&dir)).expect("loads");
    assert_eq!(files.len(), 1);
    let alone = build(files)
        .table
        .expect("admission.rules with the allows checks on its own")
        .row_count();
    assert!(matches!(rules.reload(), Reload::Replaced { rows, .. } if rows == alone));
}

#[test]
fn a_link_left_dangling_between_swap_and_cleanup_is_skipped() {
    let dir = scratch("dangling");
    let mut volume = Volume::new(dir.clone());
    let (admission, removal) = (shipped("admission.rules"), shipped("removal.rules"));
    volume.publish(&[("admission.rules", &admission), ("removal.rules", &removal)]);
    // The kubelet swaps ..data first and removes the links of dropped keys after: in
    // between, removal.rules points at nothing.
    let next = dir.join("..2026_11_29_11_00_00.1");
    std::fs::create_dir(&next).unwrap();
    std::fs::write(next.join("admission.rules"), &admission).unwrap();
    symlink("..2026_11_29_11_00_00.1", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let files = read_sources(std::slice::from_ref(&dir)).expect("a dangling link is no error");
    assert_eq!(files.len(), 1);
    assert!(files[0].path.ends_with("admission.rules"));
}
