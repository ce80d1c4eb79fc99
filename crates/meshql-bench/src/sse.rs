//! A minimal Server-Sent Events client over HTTP/1.1, for measuring how soon a write shows
//! up on a change feed or a GraphQL subscription.
//!
//! Three layers, each usable (and tested) on its own:
//! * [`ChunkedDecoder`]: undoes `Transfer-Encoding: chunked` incrementally, whatever the
//!   boundaries of the reads that feed it;
//! * [`SseParser`]: turns the event-stream text into [`Event`]s as the WHATWG HTML standard
//!   says (lines end in CRLF, LF or CR; `data` lines are joined with LF; `:` starts a comment;
//!   an event with no data is not dispatched), again across any split of its input;
//! * [`EventStream`]: a `GET` (or a `POST` with a JSON body) with `Accept: text/event-stream`
//!   on its own TCP connection, then one socket read at a time, each returning the instant its
//!   bytes were read (taken before any parsing) and the events they completed.

use bytes::BytesMut;
use std::io;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("malformed HTTP response: {0}")]
    Malformed(String),
    #[error("malformed chunked body: {0}")]
    Chunked(String),
    #[error("the server answered {status} instead of an event stream: {body}")]
    NotAStream { status: u16, body: String },
}

// ------------------------------------------------------------------------------------------
// chunked transfer encoding
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the hexadecimal size; `digits` seen so far.
    Size {
        size: u64,
        digits: u32,
    },
    /// Skipping a chunk extension (`;name=value`) up to the end of the size line.
    Extension {
        size: u64,
    },
    /// After the size line's CR, expecting LF.
    SizeLf {
        size: u64,
    },
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data: CR, then LF.
    DataCr,
    DataLf,
    /// After the last (empty) chunk: trailer lines until an empty one.
    Trailer {
        line_empty: bool,
    },
    Done,
}

/// Incremental decoder of a chunked HTTP/1.1 body.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: Chunk,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self {
            state: Chunk::Size { size: 0, digits: 0 },
        }
    }
}

impl ChunkedDecoder {
    /// Decodes `input`, appending the body bytes it carries to `out`. Bytes after the end of
    /// the body are ignored.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), SseError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                Chunk::Size { size, digits } => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if digits >= 15 {
                            return Err(SseError::Chunked("chunk size too large".into()));
                        }
                        let d = (b as char).to_digit(16).expect("hex digit") as u64;
                        Chunk::Size {
                            size: size * 16 + d,
                            digits: digits + 1,
                        }
                    }
                    _ if digits == 0 => {
                        return Err(SseError::Chunked(format!(
                            "expected a chunk size, found byte {b:#04x}"
                        )))
                    }
                    b';' | b' ' | b'\t' => Chunk::Extension { size },
                    b'\r' => Chunk::SizeLf { size },
                    b'\n' => Self::after_size(size),
                    _ => {
                        return Err(SseError::Chunked(format!(
                            "unexpected byte {b:#04x} in a chunk size"
                        )))
                    }
                },
                Chunk::Extension { size } => match b {
                    b'\r' => Chunk::SizeLf { size },
                    b'\n' => Self::after_size(size),
                    _ => Chunk::Extension { size },
                },
                Chunk::SizeLf { size } => {
                    if b != b'\n' {
                        return Err(SseError::Chunked("CR without LF after a chunk size".into()));
                    }
                    Self::after_size(size)
                }
                Chunk::Data(left) => {
                    let take = (left as usize).min(input.len() - i);
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data(left)
                    };
                    continue;
                }
                Chunk::DataCr => match b {
                    b'\r' => Chunk::DataLf,
                    b'\n' => Chunk::Size { size: 0, digits: 0 },
                    _ => return Err(SseError::Chunked("chunk data longer than its size".into())),
                },
                Chunk::DataLf => {
                    if b != b'\n' {
                        return Err(SseError::Chunked("CR without LF after chunk data".into()));
                    }
                    Chunk::Size { size: 0, digits: 0 }
                }
                Chunk::Trailer { line_empty } => match b {
                    b'\n' if line_empty => Chunk::Done,
                    b'\n' => Chunk::Trailer { line_empty: true },
                    b'\r' => Chunk::Trailer { line_empty },
                    _ => Chunk::Trailer { line_empty: false },
                },
                Chunk::Done => return Ok(()),
            };
            i += 1;
        }
        Ok(())
    }

    fn after_size(size: u64) -> Chunk {
        if size == 0 {
            Chunk::Trailer { line_empty: true }
        } else {
            Chunk::Data(size)
        }
    }

    /// Whether the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == Chunk::Done
    }
}

// ------------------------------------------------------------------------------------------
// the event-stream format
// ------------------------------------------------------------------------------------------

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, `message` when absent.
    pub event: String,
    /// The `data:` lines, joined with LF.
    pub data: String,
    /// The last event id at dispatch (`id:` of this or an earlier event), empty if none yet.
    pub id: String,
}

/// Incremental parser of `text/event-stream`.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the line being read.
    line: Vec<u8>,
    /// The previous byte ended a line with CR (an LF right after it belongs to that CR).
    after_cr: bool,
    /// Whether the first line (which may open with a byte order mark) is done.
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    /// The last event id (kept across events, as the standard says).
    pub last_event_id: String,
    /// The reconnection time the server asked for (`retry:`), in milliseconds.
    pub retry_ms: Option<u64>,
    /// Comment lines seen (`: keep-alive` heartbeats among them).
    pub comments: u64,
}

impl SseParser {
    /// Parses `input`, appending the events it completes to `events`.
    pub fn feed(&mut self, mut input: &[u8], events: &mut Vec<Event>) {
        while !input.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if input[0] == b'\n' {
                    input = &input[1..];
                    continue;
                }
            }
            match input.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.line.extend_from_slice(&input[..end]);
                    self.after_cr = input[end] == b'\r';
                    input = &input[end + 1..];
                    let line = std::mem::take(&mut self.line);
                    let text = if self.started {
                        &line[..]
                    } else {
                        // a byte order mark may open the stream
                        self.started = true;
                        line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&line)
                    };
                    self.line_done(text, events);
                    self.line = line;
                    self.line.clear();
                }
                None => {
                    self.line.extend_from_slice(input);
                    input = &[];
                }
            }
        }
    }

    fn line_done(&mut self, line: &[u8], events: &mut Vec<Event>) {
        if line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                if data.ends_with('\n') {
                    data.pop();
                }
                let event = std::mem::take(&mut self.event);
                events.push(Event {
                    event: if event.is_empty() {
                        "message".into()
                    } else {
                        event
                    },
                    data,
                    id: self.last_event_id.clone(),
                });
            }
            self.data.clear();
            self.event.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            self.comments += 1;
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => self.event = value.into_owned(),
            b"data" => {
                self.data.push_str(&value);
                self.data.push('\n');
                self.has_data = true;
            }
            b"id" if !value.contains('\0') => self.last_event_id = value.into_owned(),
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            _ => {}
        }
    }
}

// ------------------------------------------------------------------------------------------
// the connection
// ------------------------------------------------------------------------------------------

enum Framing {
    Chunked(ChunkedDecoder),
    /// `Content-Length`: this many body bytes left.
    Length(u64),
    /// No length: the body runs to the end of the connection.
    ToEnd,
}

/// An open event stream.
pub struct EventStream {
    stream: TcpStream,
    read: BytesMut,
    framing: Framing,
    parser: SseParser,
    body: Vec<u8>,
    /// When the bytes left over from reading the response head were read.
    pending_since: Option<Instant>,
    ended: bool,
}

const MAX_HEADERS: usize = 48;

impl EventStream {
    /// Connects to `authority` (`host:port`), sends `GET path` asking for an event stream
    /// (plus `headers`), and reads the response head. Fails unless the answer is a 2xx
    /// `text/event-stream`.
    pub async fn connect(
        authority: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Self, SseError> {
        Self::request(authority, "GET", path, headers, None).await
    }

    /// [`EventStream::connect`] with another method and a JSON request body (a graphql-sse
    /// subscription is a `POST` of the GraphQL request).
    pub async fn request(
        authority: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        json_body: Option<&[u8]>,
    ) -> Result<Self, SseError> {
        let mut stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n"
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(body) = json_body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        let mut req = req.into_bytes();
        req.extend_from_slice(json_body.unwrap_or_default());
        stream.write_all(&req).await?;
        let mut read = BytesMut::with_capacity(64 * 1024);
        let (head_len, status, framing, is_stream, read_at) = loop {
            let n = stream.read_buf(&mut read).await?;
            let read_at = Instant::now();
            let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Response::new(&mut hs);
            match r.parse(&read) {
                Ok(httparse::Status::Complete(len)) => {
                    let mut framing = Framing::ToEnd;
                    let mut is_stream = false;
                    for h in r.headers.iter() {
                        if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            if h.value.eq_ignore_ascii_case(b"chunked") {
                                framing = Framing::Chunked(ChunkedDecoder::default());
                            }
                        } else if h.name.eq_ignore_ascii_case("content-length") {
                            if !matches!(framing, Framing::Chunked(_)) {
                                let n = std::str::from_utf8(h.value)
                                    .ok()
                                    .and_then(|v| v.trim().parse::<u64>().ok())
                                    .ok_or_else(|| {
                                        SseError::Malformed("bad Content-Length".into())
                                    })?;
                                framing = Framing::Length(n);
                            }
                        } else if h.name.eq_ignore_ascii_case("content-type") {
                            is_stream = h
                                .value
                                .to_ascii_lowercase()
                                .starts_with(b"text/event-stream");
                        }
                    }
                    break (len, r.code.unwrap_or(0), framing, is_stream, read_at);
                }
                Ok(httparse::Status::Partial) if n == 0 => {
                    return Err(SseError::Malformed(
                        "connection closed inside the response head".into(),
                    ))
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(SseError::Malformed(e.to_string())),
            }
        };
        let _ = read.split_to(head_len);
        if !(200..300).contains(&status) || !is_stream {
            // read a little of the body for the error message
            let body = String::from_utf8_lossy(&read[..read.len().min(300)]).into_owned();
            return Err(SseError::NotAStream { status, body });
        }
        Ok(Self {
            stream,
            framing,
            parser: SseParser::default(),
            body: Vec::new(),
            pending_since: (!read.is_empty()).then_some(read_at),
            read,
            ended: false,
        })
    }

    /// Reads from the socket once (or takes the bytes that came with the response head) and
    /// appends the events those bytes complete to `events`. Returns when the bytes were read,
    /// or `None` once the stream has ended.
    pub async fn next_batch(
        &mut self,
        events: &mut Vec<Event>,
    ) -> Result<Option<Instant>, SseError> {
        if self.ended {
            return Ok(None);
        }
        let at = match self.pending_since.take() {
            Some(at) => at,
            None => {
                self.read.clear();
                if self.read.capacity() < 16 * 1024 {
                    self.read.reserve(64 * 1024);
                }
                let n = self.stream.read_buf(&mut self.read).await?;
                if n == 0 {
                    self.ended = true;
                    return match self.framing {
                        Framing::ToEnd => Ok(None),
                        _ => Err(SseError::Malformed(
                            "connection closed inside the event stream".into(),
                        )),
                    };
                }
                Instant::now()
            }
        };
        self.body.clear();
        match &mut self.framing {
            Framing::Chunked(d) => {
                d.decode(&self.read, &mut self.body)?;
                if d.is_done() {
                    self.ended = true;
                }
            }
            Framing::Length(left) => {
                let take = (*left as usize).min(self.read.len());
                self.body.extend_from_slice(&self.read[..take]);
                *left -= take as u64;
                if *left == 0 {
                    self.ended = true;
                }
            }
            Framing::ToEnd => self.body.extend_from_slice(&self.read),
        }
        self.read.clear();
        self.parser.feed(&self.body, events);
        Ok(Some(at))
    }

    /// The parser's state (last event id, heartbeats seen).
    pub fn parser(&self) -> &SseParser {
        &self.parser
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn parse_all(pieces: &[&[u8]]) -> (Vec<Event>, SseParser) {
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for piece in pieces {
            p.feed(piece, &mut events);
        }
        (events, p)
    }

    fn change(id: &str, data: &str) -> Event {
        Event {
            event: "change".into(),
            data: data.into(),
            id: id.into(),
        }
    }

    const STREAM: &[u8] = b": changes after 7\nretry: 2000\n\nid: 8\nevent: change\ndata: {\"position\":8}\n\n: keep-alive\n\nid: 9\nevent: change\ndata: {\"position\":9}\n\nid: 12\n\n";

    #[test]
    fn events_comments_retry_and_bare_ids() {
        let (events, p) = parse_all(&[STREAM]);
        assert_eq!(
            events,
            vec![
                change("8", "{\"position\":8}"),
                change("9", "{\"position\":9}")
            ]
        );
        assert_eq!(p.retry_ms, Some(2000));
        assert_eq!(p.comments, 2);
        // an id-only block moves the resume point without dispatching anything
        assert_eq!(p.last_event_id, "12");
    }

    #[test]
    fn events_split_at_every_byte_give_the_same_result() {
        let (whole, _) = parse_all(&[STREAM]);
        for cut in 0..=STREAM.len() {
            let (a, b) = STREAM.split_at(cut);
            assert_eq!(parse_all(&[a, b]).0, whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(parse_all(&bytes).0, whole);
        let threes: Vec<&[u8]> = STREAM.chunks(3).collect();
        assert_eq!(parse_all(&threes).0, whole);
    }

    #[test]
    fn line_endings_multi_line_data_and_field_rules() {
        // CRLF split between reads, bare CR, a BOM, data without a space, several data lines,
        // a field without a colon, unknown fields and a retry that is not a number
        let text: &[u8] = b"\xEF\xBB\xBFdata:one\r\ndata: two\rdata\r\nfoo: bar\nretry: 1x\n\r\nevent: e\ndata: 3\n\n";
        let (whole, p) = parse_all(&[text]);
        assert_eq!(
            whole,
            vec![
                Event {
                    event: "message".into(),
                    data: "one\ntwo\n".into(),
                    id: String::new()
                },
                Event {
                    event: "e".into(),
                    data: "3".into(),
                    id: String::new()
                }
            ]
        );
        assert_eq!(p.retry_ms, None);
        for cut in 0..=text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(parse_all(&[a, b]).0, whole, "cut at {cut}");
        }
        // an event not yet ended by an empty line is not dispatched
        let (events, _) = parse_all(&[b"data: x\n"]);
        assert!(events.is_empty());
        // an id with NUL is ignored; the last id carries over to later events
        let (events, _) = parse_all(&[b"id: 5\ndata: a\n\nid: 6\0\ndata: b\n\n"]);
        assert_eq!(events[1].id, "5");
    }

    fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].min(rest.len());
            i += 1;
            out.extend_from_slice(format!("{n:x}").as_bytes());
            if i % 2 == 0 {
                out.extend_from_slice(b";ext=1");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        out.extend_from_slice(b"0\r\nX-Trailer: 1\r\n\r\n");
        out
    }

    fn decode_pieces(pieces: &[&[u8]]) -> Result<(Vec<u8>, bool), SseError> {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        for p in pieces {
            d.decode(p, &mut out)?;
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        // events split across chunks (a chunk ends in the middle of an event and of a line)
        let wire = chunked(STREAM, &[10, 1, 37, 300, 7]);
        assert_eq!(decode_pieces(&[&wire]).unwrap(), (STREAM.to_vec(), true));
        for cut in 0..=wire.len() {
            let (a, b) = wire.split_at(cut);
            assert_eq!(
                decode_pieces(&[a, b]).unwrap(),
                (STREAM.to_vec(), true),
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(decode_pieces(&bytes).unwrap().0, STREAM);
        // and the decoded pieces parse to the same events as the whole text
        let mut d = ChunkedDecoder::default();
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for piece in wire.chunks(5) {
            let mut out = Vec::new();
            d.decode(piece, &mut out).unwrap();
            p.feed(&out, &mut events);
        }
        assert_eq!(events, parse_all(&[STREAM]).0);
        // upper-case hex sizes; an open body is not done
        assert_eq!(
            decode_pieces(&[b"A\r\n0123456789\r\n"]).unwrap(),
            (b"0123456789".to_vec(), false)
        );
    }

    #[test]
    fn malformed_chunks_are_errors() {
        assert!(decode_pieces(&[b"zz\r\n"]).is_err());
        assert!(decode_pieces(&[b"3\r\nabcd\r\n"]).is_err());
        assert!(decode_pieces(&[b"3\rx"]).is_err());
        assert!(decode_pieces(&[b"ffffffffffffffffff\r\n"]).is_err());
    }

    /// A server that answers the first request with `head`, then writes `pieces` with pauses.
    async fn serve(head: &'static [u8], pieces: Vec<Vec<u8>>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut req = Vec::new();
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
            }
            assert!(String::from_utf8_lossy(&req).contains("Accept: text/event-stream"));
            s.write_all(head).await.unwrap();
            for p in pieces {
                s.write_all(&p).await.unwrap();
                s.flush().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            }
        });
        addr
    }

    async fn collect(addr: &str) -> Result<Vec<Event>, SseError> {
        let mut s = EventStream::connect(addr, "/_changes?since=now", &[("X-Test", "1")]).await?;
        let mut events = Vec::new();
        while s.next_batch(&mut events).await?.is_some() {}
        Ok(events)
    }

    #[tokio::test]
    async fn a_chunked_stream_over_tcp() {
        let wire = chunked(STREAM, &[13, 2, 50]);
        let pieces: Vec<Vec<u8>> = wire.chunks(17).map(<[u8]>::to_vec).collect();
        let addr = serve(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            pieces,
        )
        .await;
        assert_eq!(collect(&addr).await.unwrap(), parse_all(&[STREAM]).0);
    }

    #[tokio::test]
    async fn a_stream_without_length_and_one_cut_short() {
        let addr = serve(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nid: 1\nevent: change\ndata: {}\n\n",
            vec![b"id: 2\nevent: change\ndata: {}\n\n".to_vec()],
        )
        .await;
        let events = collect(&addr).await.unwrap();
        assert_eq!(events, vec![change("1", "{}"), change("2", "{}")]);
        let addr = serve(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nid: 1",
            vec![],
        )
        .await;
        assert!(collect(&addr).await.is_err());
    }

    #[tokio::test]
    async fn a_post_carries_its_json_body() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut req = Vec::new();
            while !req.ends_with(b"{\"query\":\"x\"}") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "{}", String::from_utf8_lossy(&req));
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nConnection: close\r\n\r\n: subscribed\n\nevent: next\ndata: {}\n\n")
                .await
                .unwrap();
            String::from_utf8(req).unwrap()
        });
        let body = br#"{"query":"x"}"#;
        let mut s = EventStream::request(&addr, "POST", "/hen/graph", &[], Some(body))
            .await
            .unwrap();
        let mut events = Vec::new();
        while s.next_batch(&mut events).await.unwrap().is_some() {}
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, "next");
        let req = server.await.unwrap();
        assert!(req.starts_with("POST /hen/graph HTTP/1.1\r\n"), "{req}");
        assert!(
            req.contains("Content-Type: application/json\r\nContent-Length: 13\r\n\r\n"),
            "{req}"
        );
    }

    #[tokio::test]
    async fn a_json_answer_is_not_a_stream() {
        let addr = serve(
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{\"error\":\"x\"}",
            vec![],
        )
        .await;
        match EventStream::connect(&addr, "/_changes", &[]).await {
            Err(SseError::NotAStream { status, body }) => {
                assert_eq!(status, 404);
                assert!(body.contains("error"));
            }
            other => panic!("expected NotAStream, got {:?}", other.err()),
        }
    }
}
