//! A minimal HTTP/1.1 client connection: keep-alive, `Content-Length` and chunked bodies.
//!
//! Written by hand because the load generator shares two cores with the server it measures:
//! hyper's client runs each connection as a separate task and hands every request and
//! response across a channel, which capped one generator thread at ~45k requests/s on this
//! machine — below what the do-nothing ceiling server answers. Here a virtual user writes its
//! request and parses the answer in place (httparse), with no task, channel or allocation
//! beyond the response body.

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What came back.
pub struct Response {
    pub status: StatusCode,
    pub body: Bytes,
    pub location: Option<String>,
}

/// Why an exchange failed; `Closed` before any response byte means a reused connection was
/// closed by the server while idle, so the request may be retried on a new one.
#[derive(Debug, thiserror::Error)]
pub enum Http1Error {
    #[error("connection closed before a response")]
    Closed,
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("malformed response: {0}")]
    Malformed(String),
}

pub struct Connection {
    stream: TcpStream,
    read: BytesMut,
    write: Vec<u8>,
    /// Whether the server asked to close after the last response.
    pub closed: bool,
}

const MAX_HEADERS: usize = 48;

impl Connection {
    pub async fn connect(authority: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            read: BytesMut::with_capacity(16 * 1024),
            write: Vec::with_capacity(1024),
            closed: false,
        })
    }

    /// Sends one request (with `headers` besides `Host` and, with a body, `Content-Type` and
    /// `Content-Length`) and reads its response.
    pub async fn exchange(
        &mut self,
        method: &Method,
        path: &str,
        host: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Response, Http1Error> {
        self.write.clear();
        let w = &mut self.write;
        w.extend_from_slice(method.as_str().as_bytes());
        w.push(b' ');
        w.extend_from_slice(path.as_bytes());
        w.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        w.extend_from_slice(host.as_bytes());
        w.extend_from_slice(b"\r\n");
        for (name, value) in headers {
            w.extend_from_slice(name.as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(value.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        if let Some(b) = body {
            w.extend_from_slice(b"Content-Type: application/json\r\nContent-Length: ");
            w.extend_from_slice(b.len().to_string().as_bytes());
            w.extend_from_slice(b"\r\n\r\n");
            w.extend_from_slice(b);
        } else {
            w.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&self.write).await?;
        self.read_response(method == Method::HEAD).await
    }

    async fn fill(&mut self) -> Result<(), Http1Error> {
        if self.stream.read_buf(&mut self.read).await? == 0 {
            self.closed = true;
            return Err(Http1Error::Closed);
        }
        Ok(())
    }

    async fn read_response(&mut self, head: bool) -> Result<Response, Http1Error> {
        self.read.clear();
        let (header_len, status, length, chunked, close, location) = loop {
            if !self.read.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut r = httparse::Response::new(&mut headers);
                match r.parse(&self.read) {
                    Ok(httparse::Status::Complete(n)) => {
                        let code = r.code.unwrap_or(0);
                        let mut length = None;
                        let mut chunked = false;
                        let mut close = r.version == Some(0);
                        let mut location = None;
                        for h in r.headers.iter() {
                            if h.name.eq_ignore_ascii_case("content-length") {
                                length = std::str::from_utf8(h.value)
                                    .ok()
                                    .and_then(|v| v.trim().parse::<usize>().ok());
                            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                                chunked = h.value.eq_ignore_ascii_case(b"chunked");
                            } else if h.name.eq_ignore_ascii_case("connection") {
                                close = h.value.eq_ignore_ascii_case(b"close");
                            } else if h.name.eq_ignore_ascii_case("location") {
                                location = std::str::from_utf8(h.value).ok().map(str::to_owned);
                            }
                        }
                        break (n, code, length, chunked, close, location);
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(Http1Error::Malformed(e.to_string())),
                }
            }
            self.fill().await?;
        };
        let status = StatusCode::from_u16(status)
            .map_err(|_| Http1Error::Malformed(format!("status {status}")))?;
        let no_body = head
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let _ = self.read.split_to(header_len);
        let body = if no_body {
            Bytes::new()
        } else if chunked {
            self.read_chunked().await?
        } else if let Some(len) = length {
            while self.read.len() < len {
                self.fill().await.map_err(|_| {
                    Http1Error::Malformed("connection closed inside the body".into())
                })?;
            }
            self.read.split_to(len).freeze()
        } else {
            // no length: the body runs to the end of the connection
            while self.fill().await.is_ok() {}
            self.closed = true;
            self.read.split().freeze()
        };
        self.closed |= close;
        Ok(Response {
            status,
            body,
            location,
        })
    }

    async fn read_chunked(&mut self) -> Result<Bytes, Http1Error> {
        let mut body = BytesMut::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.read.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size_text = std::str::from_utf8(&self.read[..line_end])
                .map_err(|_| Http1Error::Malformed("chunk size".into()))?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| Http1Error::Malformed(format!("chunk size {size_text:?}")))?;
            let _ = self.read.split_to(line_end + 2);
            if size == 0 {
                // trailers (none expected) end with an empty line
                loop {
                    if let Some(i) = self.read.windows(2).position(|w| w == b"\r\n") {
                        let _ = self.read.split_to(i + 2);
                        if i == 0 {
                            return Ok(body.freeze());
                        }
                        continue;
                    }
                    self.fill().await?;
                }
            }
            while self.read.len() < size + 2 {
                self.fill().await?;
            }
            body.extend_from_slice(&self.read[..size]);
            let _ = self.read.split_to(size + 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers every request with the given raw bytes, then (optionally) closes.
    async fn raw_server(answer: &'static [u8], close: bool) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        // answer in two pieces to exercise partial reads
                        let (a, b) = answer.split_at(answer.len() / 2);
                        s.write_all(a).await.unwrap();
                        s.flush().await.unwrap();
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        s.write_all(b).await.unwrap();
                        if close {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn content_length_keep_alive() {
        let addr = raw_server(
            b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\nLocation: /x/1\r\n\r\n{\"id\":\"1\"}\n",
            false,
        )
        .await;
        let mut c = Connection::connect(&addr).await.unwrap();
        for _ in 0..3 {
            let r = c
                .exchange(&Method::POST, "/x", &addr, &[], Some(b"{}"))
                .await
                .unwrap();
            assert_eq!(r.status, StatusCode::CREATED);
            assert_eq!(&r.body[..], b"{\"id\":\"1\"}\n");
            assert_eq!(r.location.as_deref(), Some("/x/1"));
            assert!(!c.closed);
        }
    }

    #[tokio::test]
    async fn chunked_bodies_are_reassembled() {
        let addr = raw_server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n", false).await;
        let mut c = Connection::connect(&addr).await.unwrap();
        for _ in 0..2 {
            let r = c
                .exchange(&Method::GET, "/", &addr, &[], None)
                .await
                .unwrap();
            assert_eq!(&r.body[..], b"hello, world");
        }
    }

    #[tokio::test]
    async fn connection_close_and_bodies_without_length() {
        let addr = raw_server(
            b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nnothing here",
            true,
        )
        .await;
        let mut c = Connection::connect(&addr).await.unwrap();
        let r = c
            .exchange(&Method::GET, "/", &addr, &[], None)
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        assert_eq!(&r.body[..], b"nothing here");
        assert!(c.closed);
        let again = c.exchange(&Method::GET, "/", &addr, &[], None).await;
        assert!(again.is_err());
    }

    #[tokio::test]
    async fn extra_headers_are_sent() {
        // a server that answers with the request it read (this one has the body `{}`)
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = vec![0u8; 4096];
            while !req.ends_with(b"\r\n\r\n{}") {
                let n = s.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
            }
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", req.len());
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(&req).await.unwrap();
        });
        let mut c = Connection::connect(&addr).await.unwrap();
        let r = c
            .exchange(
                &Method::POST,
                "/farm/api",
                &addr,
                &[("x-correlation-id", "bench-1-7")],
                Some(b"{}"),
            )
            .await
            .unwrap();
        let sent = String::from_utf8_lossy(&r.body).into_owned();
        assert!(sent.starts_with("POST /farm/api HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.contains("\r\nx-correlation-id: bench-1-7\r\n"),
            "{sent}"
        );
        assert!(sent.ends_with("Content-Length: 2\r\n\r\n{}"), "{sent}");
    }

    #[tokio::test]
    async fn garbage_is_malformed() {
        let addr = raw_server(b"SMTP ready\r\n\r\n", true).await;
        let mut c = Connection::connect(&addr).await.unwrap();
        assert!(matches!(
            c.exchange(&Method::GET, "/", &addr, &[], None).await,
            Err(Http1Error::Malformed(_))
        ));
    }
}
