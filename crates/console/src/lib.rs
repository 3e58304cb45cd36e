//! # jobtrail-console
//!
//! What `jobtrail` and `jobtrail-admin` share: documented exit codes and the error type that carries
//! them, time and duration parsing for flags, connecting to the database (DATABASE_URL or the private
//! cluster, migrations applied), loading provider contracts, and the rendering of one operation's whole
//! story.

pub mod shell;
pub mod timeline;
