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
    panics_are_logged();
    Ok(())
}

/// A panic is a log line like any other: the default hook prints plain text to stderr (a line a
/// JSON log pipeline cannot read) with none of the spans around it. Logged here, inside the
/// panicking code's spans, a step's panic names its `operation` and `trace_id`. A backtrace is
/// kept when `RUST_BACKTRACE` asks for one, as the default hook does.
fn panics_are_logged() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // A write to a closed stdout (`jobtrail list | head -1`) is no bug: the hook before this
        // one ends the process as a Unix tool does.
        if info.to_string().contains("failed printing to stdout") {
            return before(info);
        }
        // A filter that leaves this line out (`JOBTRAIL_LOG=jobtrail_worker=debug`, `off`) must
        // not silence a panic: the default hook says it then, as before.
        if !tracing::enabled!(target: "panic", tracing::Level::ERROR) {
            return before(info);
        }
        let at = info.location().map(ToString::to_string).unwrap_or_default();
        let said = info.payload_as_str().unwrap_or("(no message)");
        let trace = std::backtrace::Backtrace::capture();
        if trace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!(target: "panic", panic_at = %at, panic_backtrace = %trace, "panicked: {said}");
        } else {
            tracing::error!(target: "panic", panic_at = %at, "panicked: {said}");
        }
    }));
}
