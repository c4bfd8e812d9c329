//! What the integration tests share, compiled once for the one test binary (`tests/it.rs`).
//! The benches include `apiserver.rs` and `https.rs` on their own with `#[path]`, so each
//! file here also stands alone (a sibling is reached as `super::x`, never `crate::x`).

pub mod apiserver;
pub mod controller;
pub mod etcd;
pub mod https;
pub mod objects;
pub mod process;
pub mod s3;
pub mod talos;
