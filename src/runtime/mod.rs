//! Everything that touches a cluster's objects: their types, facts from a snapshot of them,
//! the AdmissionReview envelope, and turning requests and reconciles into events.

pub mod access;
pub mod admission;
pub mod admission_link;
pub mod bbolt;
pub mod certs;
pub mod configpatch;
pub mod controller;
pub mod crypt;
pub mod decide;
pub mod exec;
pub mod facts;
pub mod live;
pub mod logs;
pub mod metrics;
pub mod metrics_auth;
pub mod nesting;
pub mod objects;
pub mod operator;
pub mod records;
pub mod reload;
pub mod render;
pub mod secrets;
pub mod server;
pub mod snapshot;
pub mod step_records;
pub mod store;
pub mod talos;
pub mod tls;
pub mod webhook;
