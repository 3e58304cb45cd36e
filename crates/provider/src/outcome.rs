//! Closed outcomes: every provider response or error becomes exactly one of these values before it
//! touches the store. They live in the core (`jobtrail_core::outcome`), beside the pure decisions
//! that map each value to exactly one step; this module re-exports them for the adapter's users.

pub use jobtrail_core::outcome::*;
