//! Fault points for the drills: `JOBTRAIL_FAULT=kill_after:<point>` makes the worker process kill
//! itself with SIGKILL at that point, so a test can crash a real worker exactly where the essay says
//! ("after it saved the job id and before it scheduled the first poll"). Unset in production; reading
//! one environment variable is all it costs.

/// Die here, uncleanly, if the drill asks for it.
pub fn point(name: &str) {
    if let Ok(spec) = std::env::var("JOBTRAIL_FAULT")
        && spec.strip_prefix("kill_after:") == Some(name)
    {
        tracing::warn!(point = name, "fault injection: SIGKILL");
        // SAFETY: raising a signal on ourselves has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}
