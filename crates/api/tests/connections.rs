//! How the server treats connections, over a real server on 127.0.0.1: a client that takes none of
//! the answer sent to it is cut off after the send timeout (hyper has no write timeout: a reader
//! that stops reading would hold its answer, and what the answer holds, until it went away), while
//! one that reads slowly, or waits for an answer not yet written (a long poll), keeps its
//! connection; a client that sends no whole request head within the head timeout (a head a byte
//! at a time, a connection left silent or idle) is cut off; each request knows its peer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The timeouts here: short, for short tests.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

fn connections() -> jobtrail_api::Connections {
    jobtrail_api::Connections {
        send_timeout: SEND_TIMEOUT,
        head_timeout: HEAD_TIMEOUT,
        most: 1000,
        per_address: None,
        exempt: Default::default(),
    }
}

/// `app` served on a free loopback port until the token is cancelled.
async fn serving(
    app: axum::Router,
) -> (
    std::net::SocketAddr,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    serving_with(app, connections()).await
}

async fn serving_with(
    app: axum::Router,
    connections: jobtrail_api::Connections,
) -> (
    std::net::SocketAddr,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(jobtrail_api::serve(
        listener,
        app,
        shutdown.clone(),
        Duration::from_secs(1),
        connections,
    ));
    (addr, shutdown, server)
}

async fn stop(
    shutdown: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
}

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

/// (Linux's `TCP_USER_TIMEOUT`: elsewhere only the system's own timeouts apply.)
#[cfg(target_os = "linux")]
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
                tokio::time::sleep(Duration::from_secs(6)).await;
                "done"
            }),
        );
    let (addr, shutdown, server) = serving(app).await;

    // A reader that takes a little every 200 ms, well within the timeout, for 12 s. (A little: a
    // segment's worth, 64 KiB on loopback; a receiver opens its window by no less.)
    let slow = tokio::spawn(async move {
        let mut conn = ask(addr, "/endless").await;
        let mut buf = vec![0u8; 64 * 1024];
        let until = Instant::now() + Duration::from_secs(12);
        while Instant::now() < until {
            tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut buf))
                .await
                .expect("the slow reader was sent nothing for 5 s")
                .expect("the slow reader's connection was closed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        conn
    });
    // A long poll: nothing to send for 6 s, longer than the timeout.
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
    let deadline = Instant::now() + Duration::from_secs(10);
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
    stop(shutdown, server).await;
}

/// Read what the server sends on `conn` until it closes it; `None` if it is still open after
/// `within`.
async fn until_closed(conn: &mut TcpStream, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_no_whole_head_in_time_is_cut_off() {
    let app =
        axum::Router::new().route(
            "/peer",
            get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<
                    std::net::SocketAddr,
                >| async move { peer.to_string() },
            ),
        );
    let (addr, shutdown, server) = serving(app).await;
    let started = Instant::now();

    // A head sent a byte at a time, slower than the timeout allows: cut off with it unfinished.
    let trickle = tokio::spawn(async move {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        for b in b"GET /peer HTTP/1.1\r\nHost: x\r\n".iter() {
            if conn.write_all(&[*b]).await.is_err() {
                return (Instant::now(), String::new());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let seen = until_closed(&mut conn, Duration::from_secs(20))
            .await
            .expect("a head that never ended kept its connection");
        (Instant::now(), seen)
    });
    // Opened and left silent.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        until_closed(&mut silent, Duration::from_secs(20))
            .await
            .is_some(),
        "a silent connection was kept for 20 s"
    );
    assert!(
        started.elapsed() >= HEAD_TIMEOUT - Duration::from_millis(100),
        "cut off after {:?}, before its time",
        started.elapsed()
    );
    // One request, answered with the peer's own address, then left idle.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let me = idle.local_addr().unwrap();
    idle.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let seen = until_closed(&mut idle, Duration::from_secs(20))
        .await
        .expect("an idle keep-alive connection was kept for 20 s");
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.ends_with(&me.to_string()), "not its peer: {seen}");
    let (cut, seen) = trickle.await.unwrap();
    assert!(
        !seen.contains("200"),
        "a trickled head was answered: {seen}"
    );
    assert!(
        cut.duration_since(started) < Duration::from_secs(15),
        "a trickled head held its connection for {:?}",
        cut.duration_since(started)
    );
    stop(shutdown, server).await;
}

/// A request head larger than a head needs (one endless header line, sent by someone with no
/// token) is answered 431 and its connection closed at once, not buffered up to hyper's 400 KiB
/// for the head timeout; a head of a few KiB (a long token, a trace state) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_larger_than_a_head_needs_is_refused_at_once() {
    let app = axum::Router::new().route("/", get(|| async { "here" }));
    let (addr, shutdown, server) = serving(app).await;
    let mut big = TcpStream::connect(addr).await.unwrap();
    big.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        .await
        .unwrap();
    // Written until the server stops taking it: it closes the connection once its buffer is full.
    let pad = vec![b'a'; 4096];
    for _ in 0..16 {
        if big.write_all(&pad).await.is_err() {
            break;
        }
    }
    let seen = until_closed(&mut big, HEAD_TIMEOUT / 2)
        .await
        .expect("a 64 KiB header line was still being read");
    assert!(seen.starts_with("HTTP/1.1 431"), "{seen}");
    let mut fine = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\ntracestate: {}\r\nConnection: close\r\n\r\n",
        "t".repeat(2048),
        "k=v,".repeat(128)
    );
    fine.write_all(head.as_bytes()).await.unwrap();
    let seen = until_closed(&mut fine, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    stop(shutdown, server).await;
}

/// At `most` connections open, no more is accepted until one closes: a request on a further
/// connection waits (in the system's backlog), and is answered once a place is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_most_connections_the_next_waits_for_one_to_close() {
    let app = axum::Router::new().route("/", get(|| async { "here" }));
    let (addr, shutdown, server) = serving_with(
        app,
        jobtrail_api::Connections {
            most: 2,
            // Long enough that only closing frees a place here.
            head_timeout: Duration::from_secs(60),
            ..connections()
        },
    )
    .await;
    let first = TcpStream::connect(addr).await.unwrap();
    let second = TcpStream::connect(addr).await.unwrap();
    let mut third = ask(addr, "/").await;
    let mut buf = [0u8; 256];
    assert!(
        tokio::time::timeout(Duration::from_secs(2), third.read(&mut buf))
            .await
            .is_err(),
        "a third connection was served while two were open"
    );
    drop(first);
    let answer = until_closed(&mut third, Duration::from_secs(10))
        .await
        .expect("the waiting connection was not served once a place was free");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("here"), "{answer}");
    drop(second);
    stop(shutdown, server).await;
}

/// A connection from 127.0.0.`host` (the whole 127/8 is this machine's loopback).
async fn connect_from(host: u8, addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, host], 0)))
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// An answered request on `conn`, kept open (keep-alive): the head and body as text.
async fn served(conn: &mut TcpStream, addr: std::net::SocketAddr) -> String {
    conn.write_all(format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .expect("no answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// One client address holds at most `per_address` connections: past it, a new one from that
/// address is answered 429 and closed at once, while other addresses are served, the address is
/// served again once one of its connections closes, and a trusted proxy's address is not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_a_bounded_share_of_the_connections() {
    let app = axum::Router::new().route("/", get(|| async { "here" }));
    let (addr, shutdown, server) = serving_with(
        app.clone(),
        jobtrail_api::Connections {
            per_address: Some(2),
            head_timeout: Duration::from_secs(60),
            ..connections()
        },
    )
    .await;
    let mut first = connect_from(2, addr).await;
    let mut second = connect_from(2, addr).await;
    assert!(served(&mut first, addr).await.ends_with("here"));
    assert!(served(&mut second, addr).await.ends_with("here"));
    // The third from 127.0.0.2: answered 429 and closed, its request never read.
    let mut third = connect_from(2, addr).await;
    let _ = third
        .write_all(format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await;
    let refused = until_closed(&mut third, Duration::from_secs(5))
        .await
        .expect("a connection past its address's bound was kept open");
    assert!(
        !refused.contains("here"),
        "served past the bound: {refused}"
    );
    if !refused.is_empty() {
        // (The socket may be reset before the answer is read: then only the close is seen.)
        assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
        let (head, body) = refused.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{refused}"
        );
        assert!(body.contains("--max-connections-per-address"), "{refused}");
    }
    // Another address is served meanwhile.
    let mut other = connect_from(3, addr).await;
    assert!(served(&mut other, addr).await.ends_with("here"));
    // One of 127.0.0.2's closes: it may open another.
    drop(first);
    let mut again = None;
    for _ in 0..50 {
        let mut conn = connect_from(2, addr).await;
        let _ = conn
            .write_all(format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await;
        let mut buf = vec![0u8; 1024];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await
            && String::from_utf8_lossy(&buf[..n]).ends_with("here")
        {
            again = Some(conn);
            break;
        }
        // The server had not yet seen the first one close.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        again.is_some(),
        "the address was not served again after one of its connections closed"
    );
    drop((second, other, again));
    stop(shutdown, server).await;

    // A trusted proxy carries many clients: its connections are not counted.
    let (addr, shutdown, server) = serving_with(
        app,
        jobtrail_api::Connections {
            per_address: Some(1),
            exempt: "127.0.0.2".parse().unwrap(),
            head_timeout: Duration::from_secs(60),
            ..connections()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = connect_from(2, addr).await;
        assert!(served(&mut conn, addr).await.ends_with("here"));
        held.push(conn);
    }
    drop(held);
    stop(shutdown, server).await;
}
