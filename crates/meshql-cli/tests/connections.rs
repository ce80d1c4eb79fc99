//! Connection hygiene and graceful shutdown, through the binary over raw sockets: slow
//! headers, idle keep-alive connections and stalled bodies are closed after the `[server]`
//! timeouts; `max_connections` holds; SIGTERM closes idle and half-sent connections at once,
//! lets requests in progress finish (up to `shutdown_timeout_ms`), keeps what was written,
//! and exits 0; a second signal exits at once.
//!
//! Timing: every wait polls up to a generous bound (several times the configured timeout);
//! nothing asserts that a timeout fired at a precise moment, only that it fired, and (where
//! it proves the point) not before the configured time.

mod common;

use common::Server;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One entity with REST, and the given `[server]` lines.
fn config(dir: &Path, server: &str) -> PathBuf {
    let file = dir.join("meshql.toml");
    std::fs::write(
        dir.join("note.graphql"),
        "type Query { getById(id: ID): Note } type Note { id: ID title: String }",
    )
    .expect("write the schema");
    std::fs::write(
        &file,
        format!(
            "port = 1\n\n[server]\n{server}\n\n[[entity]]\nname = \"note\"\n\n[entity.rest]\npath = \"/note/api\"\n\n[entity.graphql]\npath = \"/note/graph\"\nschema = \"note.graphql\"\n\n[[entity.graphql.singletons]]\nname = \"getById\"\nquery = '{{\"id\": \"{{{{id}}}}\"}}'\n"
        ),
    )
    .expect("write the config");
    file
}

fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Polls `stream` until the server closes it (end of stream, or a reset), for at most
/// `bound`; returns how long that took, or `None` if it is still open. Bytes the server
/// sends meanwhile are collected into `received`. `tick` runs between polls (e.g. to send
/// one more byte).
fn wait_closed(
    stream: &mut TcpStream,
    bound: Duration,
    received: &mut Vec<u8>,
    mut tick: impl FnMut(&mut TcpStream),
) -> Option<Duration> {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let mut buf = [0u8; 4096];
    while start.elapsed() < bound {
        match stream.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(start.elapsed()), // reset by the server
        }
        tick(stream);
    }
    None
}

/// Reads one HTTP/1.1 response with a `content-length` body: (status, head, body).
fn read_response(stream: &mut TcpStream, bound: Duration) -> (u16, String, String) {
    read_buffered(stream, &mut Vec::new(), bound)
}

/// [`read_response`] starting with the bytes in `data` (what an earlier read brought beyond
/// its response), leaving in it what this read brings beyond this response.
fn read_buffered(
    stream: &mut TcpStream,
    data: &mut Vec<u8>,
    bound: Duration,
) -> (u16, String, String) {
    stream.set_read_timeout(Some(bound)).expect("read timeout");
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).expect("read a response");
        assert!(
            n > 0,
            "connection closed before a response: {:?}",
            String::from_utf8_lossy(data)
        );
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let status: u16 = head[9..12].parse().expect("status code");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = stream.read(&mut buf).expect("read a response body");
        assert!(n > 0, "connection closed inside a response body");
        data.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&data[head_end..head_end + length]).to_string();
    data.drain(..head_end + length);
    (status, head, body)
}

fn get_health(stream: &mut TcpStream) -> u16 {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("send a request");
    read_response(stream, Duration::from_secs(10)).0
}

/// VmRSS of a process, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}

const SHORT: &str =
    "header_read_timeout_ms = 1000\nkeep_alive_timeout_ms = 1000\nbody_read_timeout_ms = 1000";

#[test]
fn slowloris_headers_are_cut_at_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path(), SHORT), &[]);

    // one byte every 500 ms, forever: the headers never end
    let mut slow = connect(&server);
    slow.write_all(b"G").unwrap();
    let mut last = Instant::now();
    let request = b"ET /health HTTP/1.1\r\nHost: t\r\nX-Slow: "
        .iter()
        .copied()
        .chain(std::iter::repeat(b'a'));
    let mut request = request.into_iter();
    let mut got = Vec::new();
    let closed = wait_closed(&mut slow, Duration::from_secs(10), &mut got, |s| {
        if last.elapsed() >= Duration::from_millis(500) {
            let _ = s.write_all(&[request.next().unwrap()]);
            last = Instant::now();
        }
    })
    .expect("a slowloris connection must be closed within 10 s (header timeout 1 s)");
    assert!(
        closed >= Duration::from_millis(500),
        "closed after {closed:?}, before the timeout"
    );
    assert!(
        got.is_empty(),
        "no response to unfinished headers: {:?}",
        String::from_utf8_lossy(&got)
    );

    // a connection that never sends a byte is closed as well
    let mut silent = connect(&server);
    wait_closed(&mut silent, Duration::from_secs(10), &mut got, |_| {})
        .expect("a silent connection must be closed within 10 s");

    // and the server serves the next client normally, and counts what it closed
    assert_eq!(get_health(&mut connect(&server)), 200);
    assert!(timed_out(&server, "header") >= 2);
}

#[test]
fn idle_keep_alive_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &config(
            dir.path(),
            "header_read_timeout_ms = 2000\nkeep_alive_timeout_ms = 2000",
        ),
        &[],
    );
    let mut c = connect(&server);
    // keep-alive works: three requests on one connection, with pauses shorter than the timeout
    for _ in 0..3 {
        assert_eq!(get_health(&mut c), 200);
        std::thread::sleep(Duration::from_millis(300));
    }
    // pipelined requests are answered in order
    c.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // (one read may bring both answers)
    let mut pending = Vec::new();
    let bound = Duration::from_secs(10);
    assert_eq!(read_buffered(&mut c, &mut pending, bound).0, 200);
    assert_eq!(read_buffered(&mut c, &mut pending, bound).0, 404);
    let mut got = Vec::new();
    let idle = wait_closed(&mut c, Duration::from_secs(20), &mut got, |_| {})
        .expect("an idle keep-alive connection must be closed within 20 s (timeout 2 s)");
    assert!(
        idle >= Duration::from_millis(1000),
        "closed after {idle:?}, before the timeout"
    );
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert_eq!(timed_out(&server, "idle"), 1);
}

#[test]
fn a_stalled_or_trickled_body_gets_408_and_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path(), SHORT), &[]);
    let head = "POST /note/api HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n";

    // stalled: headers and 10 bytes, then nothing
    let mut stalled = connect(&server);
    stalled.write_all(head.as_bytes()).unwrap();
    stalled.write_all(br#"{"title": "#).unwrap();
    // the same, to GraphQL (answered without the router)
    let mut stalled_graphql = connect(&server);
    stalled_graphql
        .write_all(head.replace("/note/api", "/note/graph").as_bytes())
        .unwrap();
    stalled_graphql.write_all(br#"{"query": "#).unwrap();
    // trickled: one byte every 300 ms; 200 bytes would take a minute
    let mut trickled = connect(&server);
    trickled.write_all(head.as_bytes()).unwrap();
    let mut last = Instant::now();
    let mut got_stalled = Vec::new();
    let mut got_stalled_graphql = Vec::new();
    let mut got_trickled = Vec::new();
    wait_closed(
        &mut stalled_graphql,
        Duration::from_secs(10),
        &mut got_stalled_graphql,
        |_| {},
    )
    .expect("a stalled GraphQL body must end its connection within 10 s (body timeout 1 s)");
    wait_closed(
        &mut stalled,
        Duration::from_secs(10),
        &mut got_stalled,
        |_| {},
    )
    .expect("a stalled body must end its connection within 10 s (body timeout 1 s)");
    wait_closed(
        &mut trickled,
        Duration::from_secs(10),
        &mut got_trickled,
        |s| {
            if last.elapsed() >= Duration::from_millis(300) {
                let _ = s.write_all(b" ");
                last = Instant::now();
            }
        },
    )
    .expect("a trickled body must end its connection within 10 s (body timeout 1 s)");
    for got in [got_stalled, got_stalled_graphql, got_trickled] {
        let text = String::from_utf8_lossy(&got).to_string();
        assert!(
            text.starts_with("HTTP/1.1 408"),
            "expected 408, got {text:?}"
        );
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{text}"
        );
        let body = &text[text.find("\r\n\r\n").expect("a head") + 4..];
        let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(json["code"], "REQUEST_TIMEOUT", "{json}");
        assert!(
            json["error"].as_str().unwrap().contains("1000 ms"),
            "{json}"
        );
    }
    // nothing was written
    let c = server.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(rt.block_on(c.list("/note/api")).is_empty());
}

#[test]
fn max_connections_holds_and_the_server_answers_once_some_close() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &config(
            dir.path(),
            "max_connections = 20\nheader_read_timeout_ms = 60000\nkeep_alive_timeout_ms = 60000",
        ),
        &[],
    );
    let pid = server.pid();
    let before = rss_kb(pid);
    // 50 connections: 20 are served (and stay open: they send nothing and the header timeout
    // is a minute), 30 wait in the listen backlog
    let mut held: Vec<TcpStream> = (0..50).map(|_| connect(&server)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_kb(pid);

    // one more client gets no answer while every slot is taken
    let mut waiting = connect(&server);
    waiting
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut buf = [0u8; 64];
    match waiting.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the 51st connection was served beyond max_connections: {other:?}"),
    }
    assert!(
        server
            .log()
            .contains("20 connections open (server.max_connections)"),
        "{}",
        server.log()
    );

    // the held connections leave; the waiting client is answered
    held.clear();
    let (status, _, _) = read_response(&mut waiting, Duration::from_secs(10));
    assert_eq!(status, 200);
    assert_eq!(get_health(&mut connect(&server)), 200);
    eprintln!("RSS: {before} kB before, {during} kB with 50 connections open");
    assert!(
        during < before + 50 * 1024,
        "RSS grew from {before} kB to {during} kB for 20 served connections"
    );
}

/// A server on `data` with the given `[server]` lines, and a note written before anything
/// else happens.
fn with_a_note(dir: &Path, data: &Path, server_lines: &str) -> (Server, String) {
    let server = Server::start_with_data_dir(&config(dir, server_lines), data, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(
        server
            .client()
            .post_json("/note/api", &serde_json::json!({"title": "before"})),
    );
    r.expect_status(201);
    let id = r.json()["id"].as_str().expect("an id").to_owned();
    (server, id)
}

#[test]
fn sigterm_closes_idle_and_half_sent_connections_at_once_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    // long timeouts: the server must not wait for the half-sent request
    let (mut server, id) = with_a_note(
        dir.path(),
        data.path(),
        "header_read_timeout_ms = 60000\nkeep_alive_timeout_ms = 60000\nshutdown_timeout_ms = 30000",
    );
    let mut idle = connect(&server);
    assert_eq!(get_health(&mut idle), 200);
    let mut half = connect(&server);
    half.write_all(b"GET /hea").unwrap();
    let mut silent = connect(&server);
    std::thread::sleep(Duration::from_millis(200));

    let start = Instant::now();
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| {
            panic!(
                "no exit within 10 s of SIGTERM (deadline 30 s); log:\n{}",
                server.log()
            )
        });
    let took = start.elapsed();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log()
    );
    eprintln!("exited {took:?} after SIGTERM");
    let mut got = Vec::new();
    for c in [&mut idle, &mut half, &mut silent] {
        wait_closed(c, Duration::from_secs(1), &mut got, |_| {}).expect("closed");
    }
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));

    // what was written is there after a restart
    let server = Server::start_with_data_dir(&config(dir.path(), ""), data.path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(server.client().get(&format!("/note/api/{id}")));
    r.expect_status(200);
    assert_eq!(r.json()["title"], "before");
}

/// Sends the head of a POST and half its body: a request in progress on the server. The
/// head asks for `100 Continue`, which the server sends once the handler reads the body.
fn half_a_post(server: &Server, body: &str) -> TcpStream {
    let mut c = connect(server);
    let head = format!(
        "POST /note/api HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let (status, _, _) = read_response(&mut c, Duration::from_secs(10));
    assert_eq!(status, 100, "the handler did not start reading the body");
    c.write_all(&body.as_bytes()[..body.len() / 2]).unwrap();
    c
}

/// Waits until the server refuses new connections (it stopped accepting).
fn wait_refused(port: u16) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "new connections still accepted 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_lets_a_request_in_progress_finish_and_keeps_its_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (mut server, id) = with_a_note(
        dir.path(),
        data.path(),
        "body_read_timeout_ms = 60000\nshutdown_timeout_ms = 20000",
    );
    let port = server.port();
    let body = r#"{"title": "in flight during SIGTERM"}"#;
    let mut c = half_a_post(&server, body);

    server.signal("TERM");
    // no new connection is accepted; the process still runs: a request is in progress
    wait_refused(port);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.wait_exit(Duration::ZERO).is_none(),
        "exited with a request in progress"
    );

    c.write_all(&body.as_bytes()[body.len() / 2..]).unwrap();
    let (status, head, response) = read_response(&mut c, Duration::from_secs(10));
    assert_eq!(status, 201, "{response}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let late: serde_json::Value = serde_json::from_str(&response).unwrap();
    let late_id = late["id"].as_str().expect("an id").to_owned();

    let status = server
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no exit after the last response; log:\n{}", server.log()));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log()
    );

    let server = Server::start_with_data_dir(&config(dir.path(), ""), data.path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = server.client();
    for (id, title) in [(id, "before"), (late_id, "in flight during SIGTERM")] {
        let r = rt.block_on(c.get(&format!("/note/api/{id}")));
        r.expect_status(200);
        assert_eq!(r.json()["title"], title);
    }
}

#[test]
fn the_shutdown_deadline_cuts_requests_still_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (mut server, _) = with_a_note(
        dir.path(),
        data.path(),
        "body_read_timeout_ms = 60000\nshutdown_timeout_ms = 1000",
    );
    let body = r#"{"title": "never finished"}"#;
    let mut c = half_a_post(&server, body);
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no exit within 10 s (deadline 1 s); log:\n{}", server.log()));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log()
    );
    let log = server.log();
    assert!(log.contains("shutdown deadline of 1000 ms passed"), "{log}");
    assert!(log.contains("POST /note/api cut off"), "{log}");
    let mut got = Vec::new();
    wait_closed(&mut c, Duration::from_secs(1), &mut got, |_| {}).expect("closed");
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (mut server, _) = with_a_note(
        dir.path(),
        data.path(),
        "body_read_timeout_ms = 60000\nshutdown_timeout_ms = 60000",
    );
    let _c = half_a_post(&server, r#"{"title": "held"}"#);
    server.signal("TERM");
    wait_refused(server.port());
    assert!(
        server.wait_exit(Duration::ZERO).is_none(),
        "exited with a request in progress"
    );
    server.signal("INT");
    let status = server
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no exit after a second signal; log:\n{}", server.log()));
    assert_eq!(status.code(), Some(130), "{status}; log:\n{}", server.log());
}

#[test]
fn memory_held_by_connections_is_returned_after_they_close() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path(), ""), &[]);
    let pid = server.pid();
    // warm up: the first connections allocate what every later one reuses
    for _ in 0..20 {
        assert_eq!(get_health(&mut connect(&server)), 200);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let before = rss_kb(pid);
    let mut conns: Vec<TcpStream> = (0..500).map(|_| connect(&server)).collect();
    for c in &mut conns {
        c.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    for c in &mut conns {
        assert_eq!(read_response(c, Duration::from_secs(10)).0, 200);
    }
    let open = rss_kb(pid);
    drop(conns);
    let grown = open.saturating_sub(before);
    let start = Instant::now();
    let mut after = rss_kb(pid);
    while after > before + grown / 2 && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(250));
        after = rss_kb(pid);
    }
    eprintln!(
        "RSS: {before} kB before, {open} kB with 500 keep-alive connections, {after} kB {:?} after they closed",
        start.elapsed()
    );
    assert!(
        after <= before + grown / 2,
        "RSS {after} kB 15 s after the connections closed: less than half of the {grown} kB they took was returned"
    );
}

/// `meshql_http_connections_timed_out_total{reason="<reason>"}` from `/metrics`.
fn timed_out(server: &Server, reason: &str) -> u64 {
    let mut c = connect(server);
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let (status, _, body) = read_response(&mut c, Duration::from_secs(10));
    assert_eq!(status, 200);
    let prefix = format!("meshql_http_connections_timed_out_total{{reason=\"{reason}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics:\n{body}"))
        .parse()
        .expect("a count")
}

#[test]
fn a_client_that_stops_reading_a_response_is_closed_after_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meshql.toml");
    std::fs::write(
        &file,
        "port = 1\nbody_limit_bytes = 4194304\n\n[server]\nwrite_timeout_ms = 1000\n\n\
         [[entity]]\nname = \"note\"\n\n[entity.rest]\npath = \"/note/api\"\n",
    )
    .unwrap();
    let server = Server::start(&file, &[]);
    // a 10 MB list: more than the kernel buffers of a client that never reads
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = server.client();
    let text = "x".repeat(20_000);
    for _ in 0..5 {
        let notes: Vec<_> = (0..100)
            .map(|_| serde_json::json!({ "title": text }))
            .collect();
        rt.block_on(c.post_json("/note/api/bulk", &serde_json::json!(notes)))
            .expect_status(201);
    }
    assert_eq!(timed_out(&server, "write"), 0);
    let mut reader = connect(&server);
    reader
        .write_all(b"GET /note/api HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    while timed_out(&server, "write") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the stalled response was not given up within 20 s (write timeout 1 s)"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // what the kernel had buffered can still be read, then the connection ends
    let mut got = Vec::new();
    wait_closed(&mut reader, Duration::from_secs(10), &mut got, |_| {})
        .expect("closed after the write timeout");
    assert!(got.len() < 10 * 20_000 * 50, "{} bytes arrived", got.len());
    assert_eq!(get_health(&mut connect(&server)), 200);
}

#[test]
fn oversized_request_headers_get_431() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&config(dir.path(), SHORT), &[]);
    let mut c = connect(&server);
    let big = format!(
        "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let _ = c.write_all(big.as_bytes());
    let mut got = Vec::new();
    wait_closed(&mut c, Duration::from_secs(10), &mut got, |_| {}).expect("closed");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 431"), "{text:?}");
    // 64 kB of headers are fine
    let mut c = connect(&server);
    let fine = format!(
        "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(60 * 1024)
    );
    c.write_all(fine.as_bytes()).unwrap();
    assert_eq!(read_response(&mut c, Duration::from_secs(10)).0, 200);
}

/// The names of the server process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the server's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

#[test]
fn both_runtimes_serve_with_their_threads_many_connections_and_stop_gracefully() {
    for (args, serving) in [
        (&["--runtime", "thread-per-core", "--workers", "3"][..], 3),
        (&["--runtime", "work-stealing", "--workers", "2"][..], 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(&config(dir.path(), ""), args);
        // a serving thread may answer before the last one has named itself: look a few times
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (names, serving_threads) = loop {
            let names = thread_names(server.pid());
            let n = names
                .iter()
                .filter(|n| n.starts_with("meshql-serve"))
                .count();
            if n == serving || std::time::Instant::now() > deadline {
                break (names, n);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(serving_threads, serving, "{args:?}: threads {names:?}");
        // many connections at once, each with several requests, all answered
        let handles: Vec<_> = (0..12)
            .map(|_| {
                let mut c = connect(&server);
                std::thread::spawn(move || (0..20).map(|_| get_health(&mut c)).collect::<Vec<_>>())
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap().iter().all(|s| *s == 200), "{args:?}");
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        let created = rt.block_on(
            server
                .client()
                .post_json("/note/api", &serde_json::json!({"title": "t"})),
        );
        created.expect_status(201);
        server.signal("TERM");
        let status = server.wait_exit(Duration::from_secs(15)).expect("exits");
        assert!(
            status.success(),
            "{args:?}: {status}; log:\n{}",
            server.log()
        );
    }
}
