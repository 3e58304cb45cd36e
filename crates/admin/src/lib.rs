//! # jobtrail-admin
//!
//! Where people decide what automation could not: the escalation queue, the whole story of one
//! operation, recorded decisions, and audit verification. The binary is `jobtrail-admin`; the
//! rendering here is shared with `jobtrail show`.

pub mod timeline;
