//! Logs to stderr: human-readable by default, one JSON object per line with
//! `JOBTRAIL_LOG_FORMAT=json` (for a cluster's log pipeline). In JSON every line inside an
//! operation's step carries that step's span fields (`operation`, `trace_id`), so an operator can go
//! from any log line to the operation's record and to its trace.

use tracing_subscriber::EnvFilter;

/// Install the process's log subscriber; `default` is the filter when `JOBTRAIL_LOG` is unset.
pub fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("JOBTRAIL_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let json = std::env::var("JOBTRAIL_LOG_FORMAT").is_ok_and(|f| f == "json");
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        let _ = b
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init();
    } else {
        let _ = b.try_init();
    }
}
