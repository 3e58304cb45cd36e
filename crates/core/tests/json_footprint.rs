//! The strict parser's memory estimate against what parsing really allocates: it must not be
//! below it (the bound it enforces would not hold), nor far above it (good bodies would be
//! refused). Its own binary: the allocator here counts every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn object(keys: Vec<u32>) -> String {
    let fields: Vec<String> = keys.iter().map(|k| format!(r#""k{k:05}":0"#)).collect();
    format!("{{{}}}", fields.join(","))
}

#[test]
fn the_estimate_is_at_least_what_parsing_allocates_and_at_most_twice() {
    let shapes = [
        format!("[{}0]", "0,".repeat(100_000)),
        format!("[{}{{}}]", r#"{"a":0},"#.repeat(20_000)),
        format!(
            "[{}1]",
            r#"{"role":"user","content":"hello there","n":1},"#.repeat(5_000)
        ),
        format!("[{}[]]", "[1],".repeat(50_000)),
        format!(
            r#"{{"a":"{}","b":["x","yy",""],"c":{{"d":{{}}}}}}"#,
            "z".repeat(100_000)
        ),
        format!("[{}\"\"]", r#""short","#.repeat(50_000)),
        // Arrays of a power of two's length fill their room exactly.
        format!("[{}0.5]", "[0.25,1,2,3,4,5,6,7],".repeat(1023)),
        // One large object, its keys in order, in reverse, and shuffled.
        object((0..10_000).collect()),
        object((0..10_000).rev().collect()),
        object((0..10_000).map(|i| (i * 7_919) % 10_000).collect()),
    ];
    for text in &shapes {
        let estimate = jobtrail_core::json::footprint(text.as_bytes()).unwrap();
        let before = LIVE.load(Ordering::SeqCst);
        let v = jobtrail_core::json::parse_strict(text.as_bytes()).unwrap();
        let taken = LIVE.load(Ordering::SeqCst) - before + std::mem::size_of_val(&v);
        drop(v);
        assert!(
            estimate >= taken && estimate <= 2 * taken,
            "{}…: estimated {estimate}, took {taken}",
            &text[..40.min(text.len())]
        );
    }
}
