//! # jobtrail-console
//!
//! What `jobtrail` and `jobtrail-admin` share: documented exit codes and the error type that carries
//! them, time and duration parsing for flags, connecting to the database (DATABASE_URL or the private
//! cluster, the schema checked), loading provider contracts, the rendering of one operation's whole
//! story, and making caller- and provider-supplied text safe for a terminal.

pub mod shell;
pub mod timeline;
pub mod visible;
