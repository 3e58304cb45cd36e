//! The worker (see the worker issue).
