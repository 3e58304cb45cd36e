//! A connection whose client takes none of the answer sent to it is closed after the send timeout
//! (hyper has no write timeout: a reader that stops reading would hold its answer, and what the
//! answer holds, until it went away); a client that reads slowly, or that waits for an answer not
//! yet written (a long poll), keeps its connection. Over a real server on 127.0.0.1.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The send timeout here: short, for a short test.
const SEND_TIMEOUT: Duration = Duration::from_secs(3);

/// Answers being sent now: one is counted from its start until its body is dropped (sent to the
/// end, or its connection closed).
#[derive(Clone, Default)]
struct Open(Arc<AtomicUsize>);

struct Counted(Open);

impl Drop for Counted {
    fn drop(&mut self) {
        (self.0).0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Open {
    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// An endless answer, counted while it lives.
    fn endless(&self) -> axum::body::Body {
        self.0.fetch_add(1, Ordering::SeqCst);
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = futures::stream::unfold(Counted(self.clone()), move |held| {
            let chunk = chunk.clone();
            async move { Some((Ok::<_, std::convert::Infallible>(chunk), held)) }
        });
        axum::body::Body::from_stream(chunks)
    }
}

async fn ask(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_takes_nothing_is_cut_off_and_a_slow_one_is_not() {
    let open = Open::default();
    let app = axum::Router::new()
        .route(
            "/endless",
            get({
                let open = open.clone();
                move || async move { open.endless() }
            }),
        )
        .route(
            "/later",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                "done"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(jobtrail_api::serve(
        listener,
        app,
        shutdown.clone(),
        Duration::from_secs(1),
        SEND_TIMEOUT,
    ));

    // A reader that takes a little every 200 ms, well within the timeout, for 8 s. (A little: a
    // segment's worth, 64 KiB on loopback; a receiver opens its window by no less.)
    let slow = tokio::spawn(async move {
        let mut conn = ask(addr, "/endless").await;
        let mut buf = vec![0u8; 64 * 1024];
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until {
            tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut buf))
                .await
                .expect("the slow reader was sent nothing for 5 s")
                .expect("the slow reader's connection was closed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        conn
    });
    // A long poll: nothing to send for 4 s, longer than the timeout.
    let waiting = tokio::spawn(async move {
        let mut conn = ask(addr, "/later").await;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut answer))
            .await
            .expect("the long poll was not answered within 10 s")
            .ok();
        answer
    });

    // A reader that takes nothing: its answer is dropped once the buffers between are full and
    // the timeout has passed without the window opening.
    let stalled = ask(addr, "/endless").await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while open.now() < 2 {
        assert!(Instant::now() < deadline, "the answers did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while open.now() > 1 {
        assert!(
            Instant::now() < deadline,
            "a client that took nothing for 20 s still holds its answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The one left is the slow reader's, which read to its end unhurried.
    let slow = slow.await.unwrap();
    assert_eq!(open.now(), 1, "the slow reader's answer was dropped");
    assert!(
        waiting.await.unwrap().ends_with("done"),
        "the long poll was cut off"
    );
    drop((slow, stalled));
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
}
