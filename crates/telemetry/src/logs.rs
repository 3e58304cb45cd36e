//! Logs to stderr: human-readable by default, one JSON object per line with
//! `JOBTRAIL_LOG_FORMAT=json` (for a cluster's log pipeline). In JSON every line inside an
//! operation's step carries that step's span fields (`operation`, `trace_id`), so an operator can go
//! from any log line to the operation's record and to its trace.

use tracing_subscriber::EnvFilter;

/// Install the process's log subscriber; `default` is the filter when `JOBTRAIL_LOG` is unset.
/// A `JOBTRAIL_LOG` that is not a filter, or a `JOBTRAIL_LOG_FORMAT` other than `json` or `text`,
/// is refused (a typo would otherwise give other logs than asked for, without a word).
pub fn init(default: &str) -> Result<(), String> {
    let filter = match std::env::var("JOBTRAIL_LOG") {
        Ok(f) if !f.trim().is_empty() => EnvFilter::try_new(&f)
            .map_err(|e| format!("JOBTRAIL_LOG={f:?} is not a log filter ({e}); e.g. info or jobtrail_worker=debug,warn"))?,
        _ => EnvFilter::new(default),
    };
    let json = match std::env::var("JOBTRAIL_LOG_FORMAT") {
        Err(_) => false,
        Ok(f) => match f.trim().to_ascii_lowercase().as_str() {
            "json" => true,
            "" | "text" => false,
            _ => {
                return Err(format!("JOBTRAIL_LOG_FORMAT={f:?}: json or text"));
            }
        },
    };
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
    Ok(())
}
