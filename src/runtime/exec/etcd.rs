//! The etcd measurements of a removal (ADR 0106 §4), as procedures over a [`World`]: a
//! healthy sibling to read etcd through, whether a departing member is dead, and the
//! members that stay (`healthy.after`, `members.after`). Each asks Talos calls of the world
//! and judges the answers with the pure functions here ([`judge_member`], [`peer_host`]), so
//! the controller and `verify`'s model measure alike.

use super::{Node, NodeError, World, calls};
use crate::runtime::objects::{Role, Snapshot, TalosMachine};
use crate::runtime::talos::{EtcdMember, EtcdStatus, TalosError};

/// The Kubernetes Node and etcd member name of a machine: `spec.hostname`, else its name.
pub fn node_name(m: &TalosMachine) -> &str {
    m.spec
        .hostname
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(m.name())
}

/// A sibling control plane whose etcd answers with a leader, with the member list it sees.
/// Calls through it go to `Node::Endpoint(sibling.machine)`.
pub struct Sibling<'s> {
    pub machine: &'s TalosMachine,
    pub members: Vec<EtcdMember>,
}

impl Sibling<'_> {
    pub fn member(&self, name: &str) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.hostname == name)
    }

    /// The member with etcd ID `id`, if listed.
    pub fn member_by_id(&self, id: u64) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Where calls through the sibling go.
    pub fn node(&self) -> Node<'_> {
        Node::Endpoint(self.machine)
    }
}

/// The first approved control plane of the departing machine's cluster other than it
/// whose etcd answers with a leader (machines not being deleted first). Why none did,
/// otherwise.
pub async fn healthy_sibling<'s, W: World>(
    w: &mut W,
    snapshot: &'s Snapshot,
    departing: &TalosMachine,
) -> Result<Result<Sibling<'s>, String>, W::Error> {
    let cluster = departing.cluster();
    let mut candidates: Vec<&TalosMachine> = snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == departing.namespace()
                && m.cluster() == cluster
                && m.name() != departing.name()
                && m.approved_role() == Some(Role::ControlPlane)
        })
        .collect();
    candidates.sort_by_key(|m| (m.deleting(), m.name().to_string()));
    let mut why = Vec::new();
    for m in candidates {
        match calls::status(w, cluster, Node::Endpoint(m)).await? {
            Ok(s) if s.leader != 0 => {}
            Ok(_) => {
                why.push(format!("{}: its etcd sees no leader", m.name()));
                continue;
            }
            Err(e) => {
                why.push(format!("{}: {e}", m.name()));
                continue;
            }
        }
        match calls::members(w, cluster, Node::Endpoint(m)).await? {
            Ok(members) => {
                return Ok(Ok(Sibling {
                    machine: m,
                    members,
                }));
            }
            Err(e) => why.push(format!("{}: {e}", m.name())),
        }
    }
    if why.is_empty() {
        why.push("no other approved control plane".into());
    }
    Ok(Err(why.join("; ")))
}

/// What the controller could tell of a departing member (ADR 0106 §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deadness {
    /// Proven dead: a healthy sibling lists it, and asked through that sibling at the
    /// address etcd lists for it, it does not answer, its etcd fails, or it sees no leader
    /// (or this removal already removed it as dead).
    Dead(String),
    /// It answers as itself: alive.
    Alive(String),
    /// Nothing proves it either way (no sibling to ask, not listed, no address in etcd's
    /// membership, an answer that is no proof): treated as not dead, so the declared-count
    /// refusal stays in place.
    CannotTell(String),
}

impl Deadness {
    pub fn is_dead(&self) -> bool {
        matches!(self, Deadness::Dead(_))
    }

    pub fn why(&self) -> &str {
        match self {
            Deadness::Dead(w) | Deadness::Alive(w) | Deadness::CannotTell(w) => w,
        }
    }
}

/// The host etcd knows a member by: the host of its first peer URL (Talos advertises the
/// node's own address there). `None` when etcd lists no peer URL with a host.
///
/// This is where the controller reaches a member's node for evidence about the member:
/// through a healthy sibling's Talos API (`node: <host>`), from etcd's own membership.
/// Never `spec.endpoint`, which a person can edit: pointing it at an address nothing
/// answers on must not make a healthy member look dead (issue 33), nor pointing a dead
/// member's at a healthy node make it look alive.
pub fn peer_host(member: &EtcdMember) -> Option<String> {
    let url = member.peer_urls.first()?;
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty() && !host.contains(char::is_whitespace)).then(|| host.to_string())
}

/// What one etcd member is, judged from what was asked of it (pure: the controller and
/// `verify` judge the same answers alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberHealth {
    /// It answered as this member, sees a leader, and reports no errors or alarms.
    Healthy,
    /// It answered as this member with a leader, but reports errors or alarms: alive (not
    /// dead), and not counted healthy.
    Impaired(String),
    /// It does not answer through a sibling that still answers, its etcd fails, or it sees
    /// no leader.
    Dead(String),
    /// The answer proves nothing (no address, another member answered, a refusal).
    CannotTell(String),
}

/// Judges a member from the answer to `EtcdStatus` sent through a healthy sibling to the
/// member's address in etcd (`answer`), and whether the sibling itself still answered with
/// a leader afterwards (`sibling_answers`: an unanswered proxied call proves nothing when
/// the proxy itself went away).
pub fn judge_member(
    member: &EtcdMember,
    answer: &Result<EtcdStatus, TalosError>,
    sibling_answers: bool,
) -> MemberHealth {
    let name = &member.hostname;
    match answer {
        Ok(s) if s.member_id != member.id => MemberHealth::CannotTell(format!(
            "the address etcd lists for member {name} answers as member {:x}, not {:x}",
            s.member_id, member.id
        )),
        Ok(s) if s.leader == 0 => {
            MemberHealth::Dead(format!("its etcd member {name} sees no leader"))
        }
        Ok(s) if !s.errors.is_empty() => MemberHealth::Impaired(format!(
            "its etcd member {name} answers with a leader but reports: {}",
            s.errors.join("; ")
        )),
        Ok(_) => MemberHealth::Healthy,
        Err(e @ TalosError::Unreachable { .. }) if sibling_answers => MemberHealth::Dead(format!(
            "its etcd member {name} does not answer at the address etcd lists for it ({e})"
        )),
        Err(e @ TalosError::Unreachable { .. }) => MemberHealth::CannotTell(format!(
            "asking member {name} through the sibling failed and the sibling itself stopped answering ({e})"
        )),
        Err(
            e @ TalosError::Failed {
                code: tonic::Code::Unknown | tonic::Code::Internal,
                ..
            },
        ) => MemberHealth::Dead(format!("its etcd member {name} fails ({e})")),
        Err(e) => MemberHealth::CannotTell(format!("asking member {name} failed ({e})")),
    }
}

/// Asks one member of `sibling`'s list for its etcd status through the sibling's Talos
/// API, at the address etcd lists for it, and judges the answer ([`judge_member`]).
pub async fn ask_member<W: World>(
    w: &mut W,
    cluster: &str,
    sibling: &Sibling<'_>,
    member: &EtcdMember,
) -> Result<MemberHealth, W::Error> {
    Ok(ask_member_leader(w, cluster, sibling, member).await?.0)
}

/// [`ask_member`], with the leader the member sees when it answered as itself (so a caller
/// can tell whether the members agree on one leader).
pub async fn ask_member_leader<W: World>(
    w: &mut W,
    cluster: &str,
    sibling: &Sibling<'_>,
    member: &EtcdMember,
) -> Result<(MemberHealth, Option<u64>), W::Error> {
    let Some(host) = peer_host(member) else {
        return Ok((
            MemberHealth::CannotTell(format!(
                "etcd lists no peer address for member {}",
                member.hostname
            )),
            None,
        ));
    };
    let answer = calls::status(w, cluster, Node::Via(sibling.machine, &host)).await?;
    let answer = match answer {
        Ok(s) => Ok(s),
        Err(NodeError::Talos(e)) => Err(e),
        Err(e) => {
            return Ok((
                MemberHealth::CannotTell(format!("asking member {} failed ({e})", member.hostname)),
                None,
            ));
        }
    };
    let sibling_answers = match &answer {
        Err(TalosError::Unreachable { .. }) => matches!(
            calls::status(w, cluster, sibling.node()).await?,
            Ok(s) if s.leader != 0
        ),
        _ => true,
    };
    let leader = match &answer {
        Ok(s) if s.member_id == member.id && s.leader != 0 => Some(s.leader),
        _ => None,
    };
    Ok((judge_member(member, &answer, sibling_answers), leader))
}

/// Whether the departing machine's etcd member is dead, and why (for logs, events and the
/// refusal's message), with the etcd ID of the member it judged (when a sibling listed it):
/// the removal records it, so its etcd steps act on that member and no other.
///
/// The member is the one a healthy sibling lists under the machine's node name; it is asked
/// through that sibling at the address etcd lists for it ([`ask_member`]), never at
/// `spec.endpoint`. Dead when it does not answer there while the sibling does, when its
/// etcd fails, or when it sees no leader. A sibling that cannot be found, a member the
/// sibling does not list, an answer from another member: cannot tell, so not dead (nothing
/// proves it, and the declared-count refusal stands). A member that answers with a leader:
/// alive.
///
/// `marked`: this removal already proceeded as a dead-member removal. A member etcd no
/// longer lists was then removed by it (a restart between the removal and its record), so
/// it stays dead; one that answers again is alive, whatever the record says.
pub async fn member_dead<W: World>(
    w: &mut W,
    snapshot: &Snapshot,
    departing: &TalosMachine,
    marked: bool,
) -> Result<(Deadness, Option<u64>), W::Error> {
    let name = node_name(departing);
    let sibling = match healthy_sibling(w, snapshot, departing).await? {
        Ok(s) => s,
        Err(why) => {
            return Ok((
                Deadness::CannotTell(format!(
                    "there is no healthy sibling to read etcd through ({why})"
                )),
                None,
            ));
        }
    };
    let Some(member) = sibling.member(name) else {
        if marked {
            return Ok((
                Deadness::Dead(format!(
                    "etcd (through {}) no longer lists {name}: this dead-member removal removed it",
                    sibling.machine.name()
                )),
                None,
            ));
        }
        return Ok((
            Deadness::CannotTell(format!(
                "etcd (through {}) does not list a member {name}",
                sibling.machine.name()
            )),
            None,
        ));
    };
    let through = sibling.machine.name();
    let id = Some(member.id);
    let deadness = match ask_member(w, departing.cluster(), &sibling, member).await? {
        MemberHealth::Healthy => Deadness::Alive(format!(
            "its etcd member answers with a leader (asked through {through} at the address etcd lists for it)"
        )),
        MemberHealth::Impaired(why) => Deadness::Alive(format!("{why} (asked through {through})")),
        MemberHealth::Dead(why) => Deadness::Dead(format!("{why} (asked through {through})")),
        MemberHealth::CannotTell(why) => Deadness::CannotTell(why),
    };
    Ok((deadness, id))
}

/// `members.after` as the controller reads it: the voting members a healthy sibling lists,
/// without the departing one, answering or not. A replacement that is approved but has not
/// joined etcd yet (or is still a learner) is not one. `Err` when no healthy sibling could
/// be asked: the fact cannot be read, and the removal waits (fails closed).
pub async fn members_after<W: World>(
    w: &mut W,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<Result<i64, String>, W::Error> {
    let sibling = match healthy_sibling(w, snapshot, departing).await? {
        Ok(s) => s,
        Err(why) => return Ok(Err(why)),
    };
    let n = staying(&sibling, departing).count();
    Ok(Ok(i64::try_from(n).unwrap_or(i64::MAX)))
}

/// The voting members a sibling lists, without the departing one.
fn staying<'a>(
    sibling: &'a Sibling<'_>,
    departing: &TalosMachine,
) -> impl Iterator<Item = &'a EtcdMember> {
    let leaving = node_name(departing);
    sibling
        .members
        .iter()
        .filter(move |m| m.hostname != leaving && !m.is_learner)
}

/// `healthy.after` as the controller reads it (the `targetEtcdClusterHealthy` check of
/// Cluster API): the voting members a healthy sibling lists, without the departing one,
/// that answer as themselves with a leader and no errors when asked through that sibling at
/// the address etcd lists for them ([`ask_member`]; not at any `spec.endpoint`, which a
/// person can edit). `Err` when no healthy sibling could be asked: the fact cannot be
/// read, and the removal waits (fails closed).
pub async fn healthy_after<W: World>(
    w: &mut W,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<Result<i64, String>, W::Error> {
    let sibling = match healthy_sibling(w, snapshot, departing).await? {
        Ok(s) => s,
        Err(why) => return Ok(Err(why)),
    };
    let mut healthy = 0i64;
    let staying: Vec<&EtcdMember> = staying(&sibling, departing).collect();
    for member in staying {
        if ask_member(w, departing.cluster(), &sibling, member).await? == MemberHealth::Healthy {
            healthy += 1;
        }
    }
    Ok(Ok(healthy))
}

/// An expensive count of the departing machine's cluster, as the rules name it.
pub async fn count<W: World>(
    w: &mut W,
    fact: crate::vocab::Fact,
    snapshot: &Snapshot,
    departing: &TalosMachine,
) -> Result<Result<i64, String>, W::Error> {
    match fact {
        crate::vocab::Fact::HealthyAfter => healthy_after(w, snapshot, departing).await,
        crate::vocab::Fact::MembersAfter => members_after(w, snapshot, departing).await,
        other => Ok(Err(format!("`{other}` is not read from etcd"))),
    }
}

/// Whether the members that answered (`(name, leader it sees)`) agree on one leader:
/// members that disagree are mid-election or partitioned, which is no time to take one of
/// them down.
pub fn one_leader(leaders: &[(String, u64)]) -> Result<(), String> {
    if leaders.windows(2).all(|p| p[0].1 == p[1].1) {
        return Ok(());
    }
    let seen: Vec<String> = leaders
        .iter()
        .map(|(name, l)| format!("{name} sees {l:x}"))
        .collect();
    Err(format!(
        "the members do not agree on a leader ({})",
        seen.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_agree_on_a_leader_only_when_all_see_the_same_one() {
        let l = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(n, x)| (n.to_string(), *x)).collect()
        };
        assert!(one_leader(&[]).is_ok());
        assert!(one_leader(&l(&[("cp-1", 7)])).is_ok());
        assert!(one_leader(&l(&[("cp-1", 7), ("cp-2", 7), ("cp-3", 7)])).is_ok());
        let e = one_leader(&l(&[("cp-1", 7), ("cp-2", 7), ("cp-3", 9)])).unwrap_err();
        assert!(
            e.contains("cp-3 sees 9") && e.contains("cp-1 sees 7"),
            "{e}"
        );
        assert!(one_leader(&l(&[("cp-1", 9), ("cp-2", 7), ("cp-3", 7)])).is_err());
    }

    fn member(id: u64, peer: &str) -> EtcdMember {
        EtcdMember {
            id,
            hostname: "cp-2".into(),
            peer_urls: vec![peer.into()],
            client_urls: vec![],
            is_learner: false,
        }
    }

    fn status(member_id: u64, leader: u64, errors: &[&str]) -> EtcdStatus {
        EtcdStatus {
            member_id,
            leader,
            protocol_version: "3.5".into(),
            db_size: 0,
            db_size_in_use: 0,
            raft_index: 0,
            raft_term: 0,
            raft_applied_index: 0,
            errors: errors.iter().map(|e| e.to_string()).collect(),
            is_learner: false,
        }
    }

    fn unreachable() -> TalosError {
        TalosError::Unreachable {
            endpoint: "127.0.0.1:50000".into(),
            node: Some("10.0.0.2".into()),
            detail: "connection refused".into(),
        }
    }

    fn failed(code: tonic::Code) -> TalosError {
        TalosError::Failed {
            endpoint: "127.0.0.1:50000".into(),
            node: Some("10.0.0.2".into()),
            code,
            message: "no".into(),
        }
    }

    #[test]
    fn the_peer_host_is_the_host_of_the_first_peer_url() {
        let host = |u: &str| peer_host(&member(1, u));
        assert_eq!(host("https://10.0.0.2:2380").as_deref(), Some("10.0.0.2"));
        assert_eq!(
            host("http://127.0.0.3:41000/").as_deref(),
            Some("127.0.0.3")
        );
        assert_eq!(host("https://[fd00::2]:2380").as_deref(), Some("fd00::2"));
        assert_eq!(
            host("https://cp-2.example:2380").as_deref(),
            Some("cp-2.example")
        );
        assert_eq!(
            host("https://user@10.0.0.2:2380").as_deref(),
            Some("10.0.0.2")
        );
        assert_eq!(host("10.0.0.2:2380").as_deref(), Some("10.0.0.2"));
        assert_eq!(host("https://:2380"), None);
        assert_eq!(host("https://[fd00::2"), None);
        assert_eq!(host(""), None);
        let none = EtcdMember {
            peer_urls: vec![],
            ..member(1, "")
        };
        assert_eq!(peer_host(&none), None);
    }

    #[test]
    fn a_member_is_judged_by_what_it_answers_as_itself() {
        let m = member(7, "https://10.0.0.2:2380");
        let judge = |a: Result<EtcdStatus, TalosError>, s: bool| judge_member(&m, &a, s);
        assert_eq!(judge(Ok(status(7, 3, &[])), true), MemberHealth::Healthy);
        assert!(matches!(
            judge(Ok(status(7, 0, &[])), true),
            MemberHealth::Dead(_)
        ));
        assert!(matches!(
            judge(Ok(status(7, 3, &["NOSPACE"])), true),
            MemberHealth::Impaired(w) if w.contains("NOSPACE")
        ));
        // Another member answering at the address proves nothing about this one.
        assert!(matches!(
            judge(Ok(status(8, 3, &[])), true),
            MemberHealth::CannotTell(_)
        ));
        assert!(matches!(
            judge(Ok(status(8, 0, &[])), true),
            MemberHealth::CannotTell(_)
        ));
        // No answer through a sibling that still answers: dead; if the sibling went away
        // too, nothing is proven.
        assert!(matches!(
            judge(Err(unreachable()), true),
            MemberHealth::Dead(_)
        ));
        assert!(matches!(
            judge(Err(unreachable()), false),
            MemberHealth::CannotTell(_)
        ));
        // The node answered, its etcd failed: dead. A refusal is no proof.
        assert!(matches!(
            judge(Err(failed(tonic::Code::Unknown)), true),
            MemberHealth::Dead(_)
        ));
        for code in [
            tonic::Code::PermissionDenied,
            tonic::Code::Unauthenticated,
            tonic::Code::InvalidArgument,
            tonic::Code::Unimplemented,
            tonic::Code::FailedPrecondition,
        ] {
            assert!(
                matches!(judge(Err(failed(code)), true), MemberHealth::CannotTell(_)),
                "{code:?}"
            );
        }
    }

    /// A world whose nodes answer `EtcdStatus` with the leader given per machine name
    /// (none: the node does not answer), and record whose status was asked.
    struct Leaders {
        leaders: Vec<(&'static str, u64)>,
        asked: Vec<String>,
    }

    impl World for Leaders {
        type Error = ();
        fn now(&self) -> k8s_openapi::jiff::Timestamp {
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH
        }
        async fn credentials(&mut self, _: &str) -> Result<(), String> {
            Ok(())
        }
        async fn talos(
            &mut self,
            _: &str,
            node: Node<'_>,
            call: super::super::Call,
        ) -> Result<Result<super::super::Reply, NodeError>, ()> {
            let Node::Endpoint(m) = node else {
                return Err(());
            };
            if call == super::super::Call::EtcdStatus {
                self.asked.push(m.name().to_string());
            }
            let leader = self
                .leaders
                .iter()
                .find(|(n, _)| *n == m.name())
                .map(|x| x.1);
            Ok(match (call, leader) {
                (super::super::Call::EtcdStatus, Some(l)) => {
                    Ok(super::super::Reply::Status(status(1, l, &[])))
                }
                (super::super::Call::EtcdMemberList, Some(_)) => Ok(super::super::Reply::Members(
                    vec![member(7, "https://10.0.0.2:2380")],
                )),
                _ => Err(NodeError::Talos(unreachable())),
            })
        }
        async fn lock(
            &mut self,
            _: &str,
            _: super::super::LockOp,
        ) -> Result<Result<(), String>, ()> {
            Err(())
        }
        async fn read(
            &mut self,
            _: &str,
            _: crate::runtime::live::Reads,
        ) -> Result<std::sync::Arc<Snapshot>, ()> {
            Err(())
        }
        async fn drain(&mut self, _: &str) -> Result<Result<super::super::Drained, String>, ()> {
            Err(())
        }
        async fn write_status(
            &mut self,
            _: &TalosMachine,
            _: &TalosMachine,
        ) -> Result<Option<String>, ()> {
            Err(())
        }
        async fn release_finalizer(&mut self, _: &TalosMachine) -> Result<(), ()> {
            Err(())
        }
        async fn event(&mut self, _: &TalosMachine, _: bool, _: &str, _: String) {}
        fn note(&mut self, _: &TalosMachine, _: super::super::Note<'_>) {}
    }

    fn machine(ns: &str, name: &str, cluster: &str, role: Role, approved: bool) -> TalosMachine {
        use crate::runtime::objects::{ClusterRef, MachineSpec};
        let mut m = TalosMachine::new(
            name,
            MachineSpec {
                cluster_ref: ClusterRef {
                    name: cluster.into(),
                },
                role: Some(role),
                approved,
                ..MachineSpec::default()
            },
        );
        m.metadata.namespace = Some(ns.into());
        m
    }

    /// The sibling is an approved control plane of the departing one's cluster and
    /// namespace, not itself, whose etcd sees a leader; machines not being deleted are
    /// asked first, then by name; each one that cannot serve is said.
    #[test]
    fn a_healthy_sibling_is_an_approved_control_plane_of_the_same_cluster_that_sees_a_leader() {
        let departing = machine("infra", "cp-1", "prod", Role::ControlPlane, true);
        let mut deleting = machine("infra", "cp-0", "prod", Role::ControlPlane, true);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let snapshot = Snapshot {
            machines: vec![
                departing.clone(),
                machine("other", "cp-9", "prod", Role::ControlPlane, true),
                machine("infra", "cp-8", "staging", Role::ControlPlane, true),
                machine("infra", "worker-1", "prod", Role::Worker, true),
                machine("infra", "cp-7", "prod", Role::ControlPlane, false),
                deleting,
                machine("infra", "cp-3", "prod", Role::ControlPlane, true),
                machine("infra", "cp-2", "prod", Role::ControlPlane, true),
            ],
            ..Snapshot::default()
        };
        let everyone = vec![
            ("cp-0", 5),
            ("cp-1", 5),
            ("cp-2", 0),
            ("cp-3", 5),
            ("cp-7", 5),
            ("cp-8", 5),
            ("cp-9", 5),
            ("worker-1", 5),
        ];
        let mut w = Leaders {
            leaders: everyone,
            asked: Vec::new(),
        };
        let found = super::super::run_now(healthy_sibling(&mut w, &snapshot, &departing))
            .expect("answers at once")
            .expect("no world error")
            .expect("a sibling");
        assert_eq!(found.machine.name(), "cp-3");
        assert_eq!(found.members.len(), 1);
        assert_eq!(found.member("cp-2").map(|m| m.id), Some(7));
        assert!(found.member("cp-3").is_none());
        assert_eq!(
            found.member_by_id(7).map(|m| m.hostname.as_str()),
            Some("cp-2")
        );
        assert!(found.member_by_id(8).is_none());
        // cp-2 sees no leader; cp-3 does: cp-0, being deleted, would have been last.
        assert_eq!(w.asked, vec!["cp-2", "cp-3"]);

        // Nobody answers: why, per candidate.
        let mut w = Leaders {
            leaders: vec![("cp-2", 0)],
            asked: Vec::new(),
        };
        let why = super::super::run_now(healthy_sibling(&mut w, &snapshot, &departing))
            .expect("answers at once")
            .expect("no world error")
            .err()
            .expect("no sibling");
        assert!(why.contains("cp-2: its etcd sees no leader"), "{why}");
        assert!(why.contains("cp-3:"), "{why}");
        assert!(why.contains("cp-0:"), "{why}");
        assert_eq!(w.asked, vec!["cp-2", "cp-3", "cp-0"]);
    }

    #[test]
    fn a_node_name_is_the_hostname_else_the_machine_name() {
        let mut m = machine("infra", "cp-1", "prod", Role::ControlPlane, true);
        assert_eq!(node_name(&m), "cp-1");
        m.spec.hostname = Some(String::new());
        assert_eq!(node_name(&m), "cp-1");
        m.spec.hostname = Some("node-a".into());
        assert_eq!(node_name(&m), "node-a");
    }
}

/// Tests that pin what mutation testing (`cargo mutants`) found the other tests let
/// through: the measurements over a world whose members answer as configured.
#[cfg(test)]
mod mutant_tests {
    use super::*;
    use crate::runtime::exec::{Call, Drained, LockOp, Note, Reply, run_now};
    use crate::runtime::live::Reads;
    use crate::vocab::Fact;
    use std::sync::Arc;

    /// How a member answers at the address etcd lists for it.
    #[derive(Clone, Copy)]
    enum Answer {
        Healthy,
        Alarm,
        NoLeader,
        Silent,
        As(u64),
        NoCredentials,
    }

    /// cp-2 (a healthy sibling, unless `sibling_leader` is 0) lists `members`; each member
    /// answers through it as `answers` says (healthy when not said).
    struct Members {
        members: Vec<EtcdMember>,
        answers: Vec<(&'static str, Answer)>,
        sibling_leader: u64,
        /// The sibling stops answering once a member was asked through it.
        sibling_goes: bool,
        asked_via: Vec<String>,
    }

    fn member(name: &str, id: u64, learner: bool) -> EtcdMember {
        EtcdMember {
            id,
            hostname: name.into(),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            client_urls: vec![],
            is_learner: learner,
        }
    }

    fn status(member_id: u64, leader: u64, errors: &[&str]) -> EtcdStatus {
        EtcdStatus {
            member_id,
            leader,
            protocol_version: "3.5".into(),
            db_size: 0,
            db_size_in_use: 0,
            raft_index: 0,
            raft_term: 0,
            raft_applied_index: 0,
            errors: errors.iter().map(|e| e.to_string()).collect(),
            is_learner: false,
        }
    }

    fn unreachable() -> NodeError {
        NodeError::Talos(TalosError::Unreachable {
            endpoint: "10.0.0.2:50000".into(),
            node: None,
            detail: "no route".into(),
        })
    }

    impl Members {
        fn new(members: Vec<EtcdMember>) -> Members {
            Members {
                members,
                answers: vec![],
                sibling_leader: 2,
                sibling_goes: false,
                asked_via: vec![],
            }
        }
    }

    impl World for Members {
        type Error = ();
        fn now(&self) -> k8s_openapi::jiff::Timestamp {
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH
        }
        async fn credentials(&mut self, _: &str) -> Result<(), String> {
            Ok(())
        }
        async fn talos(
            &mut self,
            _: &str,
            node: Node<'_>,
            call: Call,
        ) -> Result<Result<Reply, NodeError>, ()> {
            match node {
                Node::Endpoint(m) if m.name() == "cp-2" => {
                    let gone = self.sibling_goes && !self.asked_via.is_empty();
                    Ok(match call {
                        _ if gone => Err(unreachable()),
                        Call::EtcdStatus => Ok(Reply::Status(status(2, self.sibling_leader, &[]))),
                        Call::EtcdMemberList => Ok(Reply::Members(self.members.clone())),
                        _ => Err(unreachable()),
                    })
                }
                Node::Via(_, host) => {
                    let Some(m) = self
                        .members
                        .iter()
                        .find(|m| peer_host(m).as_deref() == Some(host))
                    else {
                        return Ok(Err(unreachable()));
                    };
                    self.asked_via.push(m.hostname.clone());
                    let answer = self
                        .answers
                        .iter()
                        .find(|(n, _)| *n == m.hostname)
                        .map_or(Answer::Healthy, |x| x.1);
                    Ok(match answer {
                        Answer::Healthy => Ok(Reply::Status(status(m.id, 2, &[]))),
                        Answer::Alarm => Ok(Reply::Status(status(m.id, 2, &["NOSPACE"]))),
                        Answer::NoLeader => Ok(Reply::Status(status(m.id, 0, &[]))),
                        Answer::As(id) => Ok(Reply::Status(status(id, 2, &[]))),
                        Answer::Silent => Err(unreachable()),
                        Answer::NoCredentials => Err(NodeError::NoCredentials("none".into())),
                    })
                }
                _ => Ok(Err(unreachable())),
            }
        }
        async fn lock(&mut self, _: &str, _: LockOp) -> Result<Result<(), String>, ()> {
            Err(())
        }
        async fn read(&mut self, _: &str, _: Reads) -> Result<Arc<Snapshot>, ()> {
            Err(())
        }
        async fn drain(&mut self, _: &str) -> Result<Result<Drained, String>, ()> {
            Err(())
        }
        async fn write_status(
            &mut self,
            _: &TalosMachine,
            _: &TalosMachine,
        ) -> Result<Option<String>, ()> {
            Err(())
        }
        async fn release_finalizer(&mut self, _: &TalosMachine) -> Result<(), ()> {
            Err(())
        }
        async fn event(&mut self, _: &TalosMachine, _: bool, _: &str, _: String) {}
        fn note(&mut self, _: &TalosMachine, _: Note<'_>) {}
    }

    fn machine(name: &str) -> TalosMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true}
        }))
        .unwrap()
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            machines: vec![machine("cp-1"), machine("cp-2")],
            ..Snapshot::default()
        }
    }

    fn three() -> Vec<EtcdMember> {
        vec![
            member("cp-1", 1, false),
            member("cp-2", 2, false),
            member("cp-3", 3, false),
        ]
    }

    fn now<T>(f: impl std::future::Future<Output = Result<T, ()>>) -> T {
        run_now(f)
            .expect("answers at once")
            .expect("no world error")
    }

    /// `members.after`: the voting members a sibling lists, without the departing one.
    #[test]
    fn the_members_after_are_the_voting_ones_that_stay() {
        let (s, cp1) = (snapshot(), machine("cp-1"));
        let mut members = three();
        members.push(member("cp-4", 4, true));
        let mut w = Members::new(members);
        assert_eq!(now(members_after(&mut w, &s, &cp1)), Ok(2));
        assert_eq!(now(count(&mut w, Fact::MembersAfter, &s, &cp1)), Ok(2));
        assert!(now(count(&mut w, Fact::Approved, &s, &cp1)).is_err());
        w.sibling_leader = 0;
        assert!(now(members_after(&mut w, &s, &cp1)).is_err());
    }

    /// `healthy.after`: of those, the ones that answer as themselves with a leader and no
    /// alarm.
    #[test]
    fn the_healthy_after_answer_as_themselves_with_a_leader_and_no_alarm() {
        let (s, cp1) = (snapshot(), machine("cp-1"));
        let mut w = Members::new(three());
        w.answers = vec![("cp-1", Answer::Silent)];
        assert_eq!(now(healthy_after(&mut w, &s, &cp1)), Ok(2));
        assert_eq!(now(count(&mut w, Fact::HealthyAfter, &s, &cp1)), Ok(2));
        assert!(
            !w.asked_via.contains(&"cp-1".to_string()),
            "the departing one is not asked"
        );
        for a in [
            Answer::Alarm,
            Answer::NoLeader,
            Answer::Silent,
            Answer::As(9),
        ] {
            let mut w = Members::new(three());
            w.answers = vec![("cp-3", a)];
            assert_eq!(now(healthy_after(&mut w, &s, &cp1)), Ok(1));
        }
        let mut w = Members::new(three());
        w.sibling_leader = 0;
        assert!(now(healthy_after(&mut w, &s, &cp1)).is_err());
    }

    /// `member.dead`, and the ID of the member judged.
    #[test]
    fn a_departing_member_is_dead_only_on_proof() {
        let (s, cp1) = (snapshot(), machine("cp-1"));
        let judge = |answer: Option<Answer>, marked: bool| {
            let mut w = Members::new(three());
            w.answers = answer.map(|a| vec![("cp-1", a)]).unwrap_or_default();
            now(member_dead(&mut w, &s, &cp1, marked))
        };
        let (d, id) = judge(Some(Answer::Silent), false);
        assert!(d.is_dead(), "{d:?}");
        assert_eq!(id, Some(1));
        assert!(d.why().contains("(asked through cp-2)"), "{}", d.why());
        assert!(matches!(
            judge(Some(Answer::NoLeader), false).0,
            Deadness::Dead(_)
        ));
        assert!(matches!(judge(None, false).0, Deadness::Alive(_)));
        assert!(
            matches!(judge(None, true).0, Deadness::Alive(_)),
            "answers again: alive"
        );
        assert!(matches!(
            judge(Some(Answer::Alarm), false).0,
            Deadness::Alive(_)
        ));
        assert!(matches!(
            judge(Some(Answer::As(3)), false).0,
            Deadness::CannotTell(_)
        ));
        assert!(matches!(
            judge(Some(Answer::NoCredentials), false).0,
            Deadness::CannotTell(_)
        ));

        // Not listed: dead only when this removal already removed it as dead.
        let mut w = Members::new(vec![member("cp-2", 2, false), member("cp-3", 3, false)]);
        let (d, id) = now(member_dead(&mut w, &s, &cp1, true));
        assert!(d.is_dead() && id.is_none(), "{d:?}");
        let (d, _) = now(member_dead(&mut w, &s, &cp1, false));
        assert!(matches!(d, Deadness::CannotTell(_)), "{d:?}");

        // No sibling: cannot tell.
        let mut w = Members::new(three());
        w.sibling_leader = 0;
        let (d, id) = now(member_dead(&mut w, &s, &cp1, true));
        assert!(
            matches!(d, Deadness::CannotTell(_)) && id.is_none(),
            "{d:?}"
        );
    }

    /// The leader a member sees is reported only when it answered as itself with one; an
    /// unanswered call proves nothing when the sibling went away too.
    #[test]
    fn a_members_leader_is_its_own_answer() {
        let s = snapshot();
        let sibling = Sibling {
            machine: &s.machines[1],
            members: three(),
        };
        let ask = |a: Answer, goes: bool| {
            let mut w = Members::new(three());
            w.answers = vec![("cp-3", a)];
            w.sibling_goes = goes;
            now(ask_member_leader(
                &mut w,
                "prod",
                &sibling,
                &sibling.members[2],
            ))
        };
        assert_eq!(
            ask(Answer::Healthy, false),
            (MemberHealth::Healthy, Some(2))
        );
        assert_eq!(ask(Answer::NoLeader, false).1, None);
        assert_eq!(ask(Answer::As(1), false).1, None);
        assert!(matches!(
            ask(Answer::Silent, false).0,
            MemberHealth::Dead(_)
        ));
        assert!(matches!(
            ask(Answer::Silent, true).0,
            MemberHealth::CannotTell(_)
        ));
        let mut w = Members::new(three());
        let no_url = EtcdMember {
            peer_urls: vec![],
            ..member("cp-3", 3, false)
        };
        let (h, l) = now(ask_member_leader(&mut w, "prod", &sibling, &no_url));
        assert!(matches!(h, MemberHealth::CannotTell(_)) && l.is_none());
        assert!(w.asked_via.is_empty());
    }
}
