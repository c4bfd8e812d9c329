//! A generated rule file of any size, for the front end's benches (`benches/decide.rs`)
//! and for profiling it (`decide-counts build generated:1000 <n>`).

use ichor_rules::diagnostics::SourceFile;
use std::fmt::Write as _;

/// A file of `rules` rules across five events, with lets, unless clauses and placeholders.
/// The rules of one event overlap, so many subsume others (the lint reports each pair).
/// With `distinct`, each rule also names its own cluster, so no rule subsumes another.
pub fn generated(rules: usize, distinct: bool) -> SourceFile {
    const KINDS: &[&str] = ichor_rules::vocab::OPERATION_KINDS;
    let mut s = String::from(
        "# generated for benches/decide.rs\n\
         let after = approved - 1\n\
         let quorum = approved / 2 + 1\n\
         let teardown = not cluster.exists or cluster.deleting\n\
         let cap = count + 1\n",
    );
    for i in 0..rules {
        let k = (i / 5) as i64;
        let scope = if distinct {
            format!("cluster == \"cluster-{i}\" and ")
        } else {
            String::new()
        };
        match i % 5 {
            0 => write!(
                s,
                "rule gen-{i:04}-remove-cp\n  refuse remove controlplane\n  \
                 when {scope}(after < count - {a} and approved > {b})\n  \
                 unless member.dead or teardown\n  reason RemovalRefused\n  \
                 say \"removing {{machine}}: control planes {{approved}} -> {{after}}, \
                 below {{count}} (quorum {{quorum}}, variant {i})\"\n\n",
                a = k % 3,
                b = k % 4,
            ),
            1 => write!(
                s,
                "rule gen-{i:04}-approve-cp\n  refuse approve controlplane\n  \
                 when {scope}(approved > count + {a} or approved >= {b})\n  unless teardown\n  \
                 say \"approving {{machine}} would make {{approved + 1}} control planes, \
                 above {{cap}} (variant {i})\"\n\n",
                a = k % 3,
                b = 6 + k % 4,
            ),
            2 => write!(
                s,
                "rule gen-{i:04}-leave-worker\n  refuse leave worker at webhook\n  \
                 when {scope}(not schedulable and workers <= {a})\n  unless teardown\n  \
                 say \"{{machine}} is one of the last {{workers}} workers of {{cluster}} \
                 (variant {i})\"\n\n",
                a = 1 + k % 4,
            ),
            3 => write!(
                s,
                "rule gen-{i:04}-start-op\n  refuse start operation\n  \
                 when {scope}kind == \"{kind}\" and (transitioning or approved < {a})\n  \
                 unless target.controlplane\n  \
                 say \"a {{kind}} now, with {{approved}} control planes, would wait \
                 (variant {i})\"\n\n",
                kind = KINDS[(k as usize) % KINDS.len()],
                a = 1 + k % 3,
            ),
            _ => write!(
                s,
                "rule gen-{i:04}-hold-cp\n  hold apply controlplane at controller\n  \
                 when {scope}(cluster.exists and rank > cap + {a})\n  reason ControlPlaneOverCap\n  \
                 say \"{{machine}} is control plane number {{rank}}, past {{cap}} \
                 (variant {i})\"\n\n",
                a = k % 4,
            ),
        }
        .expect("writing to a String");
    }
    SourceFile::new("generated.rules", s)
}
