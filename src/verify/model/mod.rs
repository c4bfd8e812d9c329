//! The model `verify` explores: one TalosCluster, its machines, operations, etcd membership,
//! node health, the cluster lock and the requests admitted but not yet committed.
//!
//! Every decision goes through the product's own code: a request becomes the objects an
//! AdmissionReview carries, its events come from [`request_events`] and the webhook's
//! [`decide_events`]. The removal is not modelled at all: the executor's procedure
//! ([`exec::removal::reconcile`], the controller's own code) runs against the model's world
//! ([`super::world`]), which answers what the runtime reads through I/O (etcd's membership
//! and leader, whether a node answers, the lock, whether a PodDisruptionBudget blocks a
//! drain) and applies what it changes.
//!
//! Its files:
//! - `bounds.rs`: the exploration's bounds, and the constants the model shares;
//! - `state.rs`: one explored state (machines, operations, the lock, requests in flight);
//! - `moves.rs`: a transition, what it did, and the rules that fired;
//! - `view.rs`: the counts and names the product and the invariants read of a state, and
//!   the starting states;
//! - `objects.rs`: a state as the API server's objects, and the decisions made on them;
//! - `successors.rs`: the [`Model`] and every successor of a state, of which
//!   `requests.rs` makes people's, `controller.rs` the controller's reconciles and
//!   `environment.rs` the world's moves (nodes, etcd, PodDisruptionBudgets, the lock's
//!   expiry, the backup's snapshot).
//!
//! [`request_events`]: crate::runtime::decide::request_events
//! [`decide_events`]: crate::runtime::decide::decide_events
//! [`exec::removal::reconcile`]: crate::runtime::exec::removal::reconcile

mod bounds;
mod controller;
mod environment;
mod moves;
mod objects;
mod requests;
mod state;
mod successors;
#[cfg(test)]
pub(crate) mod tests;
mod view;

pub use bounds::{
    Bounds, BoundsError, CLUSTER, GONE, MAX_IN_FLIGHT, MAX_MACHINES, MAX_OPERATIONS,
    MAX_PLAN_STEPS, MAX_ROLL_WIDTH, NAMESPACE, NONE, OTHER_CLUSTER, SIDE, ix, unsupported,
};
pub use moves::{Effect, Fired, Move, Next, step_index};
pub use objects::{
    BACKUP, Lazy, Memo, Objects, STALE_SNAPSHOT, len_byte, object_key, outside_backup,
};
pub use state::{
    Backup, Boots, ClusterState, Lock, MRole, Machine, Op, OpKind, OpRun, Pending, Phase, ROLL_MAX,
    Req, RollKind, Side, State, Tallies, remove_machine,
};
pub use successors::{Model, Outcomes, Renumber, lift, lift_pending, renumbering, unseen_into};
