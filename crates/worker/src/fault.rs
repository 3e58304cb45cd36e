//! Fault points for the drills. `JOBTRAIL_FAULT=kill_after:<point>` makes the worker process kill
//! itself with SIGKILL at that point, so a test can crash a real worker exactly where the essay says
//! ("after it saved the job id and before it scheduled the first poll"); `stop_at:<point>` stops it
//! there with SIGSTOP (once per process), as a long pause would, until the test sends SIGCONT;
//! `slow_at:<point>:<ms>` blocks the thread there that long each time, as long work on it (a large
//! result's check, which runs on a thread handed over from the runtime from 256 KiB on) would;
//! `panic_at:<point>` panics there each time, as a bug in a step would. Unset in production;
//! reading one environment variable is all it costs.

use std::sync::atomic::{AtomicBool, Ordering};

static STOPPED: AtomicBool = AtomicBool::new(false);

/// Die (or stop) here, uncleanly, if the drill asks for it.
pub fn point(name: &str) {
    let Ok(spec) = std::env::var("JOBTRAIL_FAULT") else {
        return;
    };
    if spec.strip_prefix("kill_after:") == Some(name) {
        tracing::warn!(point = name, "fault injection: SIGKILL");
        // SAFETY: raising a signal on ourselves has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
    if let Some(ms) = spec
        .strip_prefix("slow_at:")
        .and_then(|rest| rest.strip_prefix(name))
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|ms| ms.parse::<u64>().ok())
    {
        tracing::warn!(point = name, ms, "fault injection: blocking the thread");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if spec.strip_prefix("panic_at:") == Some(name) {
        tracing::warn!(point = name, "fault injection: panic");
        panic!("fault injection: panic at {name}");
    }
    if spec.strip_prefix("stop_at:") == Some(name) && !STOPPED.swap(true, Ordering::SeqCst) {
        tracing::warn!(point = name, "fault injection: SIGSTOP");
        // SAFETY: as above; the process continues on SIGCONT.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}
