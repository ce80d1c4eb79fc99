//! Frame encoding, and a buffered scanner that reads and validates frames from a segment file.

use std::fs::File;
use std::io;

use crate::pio::read_at;

/// Size of a frame header: length u32, crc u32, offset u64, timestamp_ms i64.
pub const HEADER_LEN: usize = 24;

/// Largest record the log accepts (and the largest length a valid header can carry).
pub const MAX_RECORD_BYTES: usize = 1 << 30;

/// How much the scanner reads at once when frames are small.
const CHUNK: usize = 64 * 1024;

/// Bytes a record of `data_len` bytes takes on disk.
pub(crate) fn frame_len(data_len: usize) -> u64 {
    (HEADER_LEN + data_len) as u64
}

/// CRC-32 of the header fields (length, offset, timestamp) and the data.
fn checksum(len: u32, offset: u64, timestamp_ms: i64, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&offset.to_le_bytes());
    h.update(&timestamp_ms.to_le_bytes());
    h.update(data);
    h.finalize()
}

/// Appends one frame to `out`. `data.len()` must be at most [`MAX_RECORD_BYTES`].
pub(crate) fn encode(out: &mut Vec<u8>, offset: u64, timestamp_ms: i64, data: &[u8]) {
    debug_assert!(data.len() <= MAX_RECORD_BYTES);
    let len = data.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(len, offset, timestamp_ms, data).to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    out.extend_from_slice(data);
}

/// A frame found by the [`Scanner`]; `data` borrows the scanner's buffer.
pub(crate) struct Frame<'a> {
    /// File position of the frame's header.
    pub pos: u64,
    pub offset: u64,
    pub timestamp_ms: i64,
    pub data: &'a [u8],
}

impl Frame<'_> {
    /// Bytes the frame takes in the file.
    pub fn len(&self) -> u64 {
        frame_len(self.data.len())
    }
}

/// What the scanner found at its position.
pub(crate) enum Step<'a> {
    /// A complete frame with a good checksum (its offset is not checked here).
    Frame(Frame<'a>),
    /// The position is exactly the limit.
    End,
    /// A frame starts here but does not fit before the limit / end of file.
    Torn,
    /// The bytes here are not a valid frame.
    Bad(&'static str),
}

/// Reads frames sequentially from `[pos, limit)` of a file with positioned reads, in chunks.
/// The scanner stops at the first problem; it never advances past a torn or bad frame.
pub(crate) struct Scanner<'f> {
    file: &'f File,
    pos: u64,
    limit: u64,
    buf: Vec<u8>,
    /// File position of `buf[0]`.
    buf_start: u64,
}

impl<'f> Scanner<'f> {
    pub fn new(file: &'f File, pos: u64, limit: u64) -> Self {
        Scanner {
            file,
            pos,
            limit,
            buf: Vec::new(),
            buf_start: pos,
        }
    }

    /// Position of the next frame (after the last one returned).
    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn next(&mut self) -> io::Result<Step<'_>> {
        if self.pos >= self.limit {
            return Ok(Step::End);
        }
        if !self.fill(HEADER_LEN)? {
            return Ok(Step::Torn);
        }
        let at = (self.pos - self.buf_start) as usize;
        let header = &self.buf[at..at + HEADER_LEN];
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap());
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let offset = u64::from_le_bytes(header[8..16].try_into().unwrap());
        let timestamp_ms = i64::from_le_bytes(header[16..24].try_into().unwrap());
        if len as usize > MAX_RECORD_BYTES {
            return Ok(Step::Bad("record length out of range"));
        }
        if !self.fill(HEADER_LEN + len as usize)? {
            return Ok(Step::Torn);
        }
        let pos = self.pos;
        let at = (pos - self.buf_start) as usize + HEADER_LEN;
        let data = &self.buf[at..at + len as usize];
        if checksum(len, offset, timestamp_ms, data) != crc {
            return Ok(Step::Bad("checksum mismatch"));
        }
        self.pos = pos + frame_len(len as usize);
        Ok(Step::Frame(Frame {
            pos,
            offset,
            timestamp_ms,
            data,
        }))
    }

    /// Makes the file bytes `[pos, pos + n)` available in `buf`. False when the limit or the
    /// end of the file comes first.
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        let need_end = self.pos + n as u64;
        if need_end > self.limit {
            return Ok(false);
        }
        let buf_end = self.buf_start + self.buf.len() as u64;
        if self.pos >= self.buf_start && need_end <= buf_end {
            return Ok(true);
        }
        // Keep the unconsumed tail of the buffer, then read after it.
        if self.pos >= self.buf_start && self.pos <= buf_end {
            self.buf.drain(..(self.pos - self.buf_start) as usize);
        } else {
            self.buf.clear();
        }
        self.buf_start = self.pos;
        let want = (n.max(CHUNK) as u64).min(self.limit - self.pos) as usize;
        let mut filled = self.buf.len();
        self.buf.resize(want, 0);
        while filled < want {
            match read_at(
                self.file,
                &mut self.buf[filled..],
                self.buf_start + filled as u64,
            ) {
                Ok(0) => break,
                Ok(got) => filled += got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(filled);
                    return Err(e);
                }
            }
        }
        self.buf.truncate(filled);
        Ok(filled >= n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn encodes_the_documented_layout() {
        let mut out = Vec::new();
        encode(&mut out, 7, -3, b"abc");
        assert_eq!(out.len(), HEADER_LEN + 3);
        assert_eq!(&out[0..4], &3u32.to_le_bytes());
        assert_eq!(&out[8..16], &7u64.to_le_bytes());
        assert_eq!(&out[16..24], &(-3i64).to_le_bytes());
        assert_eq!(&out[24..], b"abc");
        let mut h = crc32fast::Hasher::new();
        h.update(&out[0..4]);
        h.update(&out[8..24]);
        h.update(b"abc");
        assert_eq!(&out[4..8], &h.finalize().to_le_bytes());
    }

    #[test]
    fn scans_frames_across_chunk_boundaries() {
        let mut bytes = Vec::new();
        let records: Vec<Vec<u8>> = (0..500u32)
            .map(|i| vec![i as u8; (i as usize * 37) % 1000])
            .collect();
        for (i, r) in records.iter().enumerate() {
            encode(&mut bytes, i as u64 + 1, i as i64, r);
        }
        encode(&mut bytes, 501, 0, &vec![9u8; 3 * CHUNK]);
        let f = file_with(&bytes);
        let mut s = Scanner::new(&f, 0, bytes.len() as u64);
        for (i, r) in records.iter().enumerate() {
            match s.next().unwrap() {
                Step::Frame(fr) => {
                    assert_eq!(fr.offset, i as u64 + 1);
                    assert_eq!(fr.timestamp_ms, i as i64);
                    assert_eq!(fr.data, &r[..]);
                }
                _ => panic!("frame {i} missing"),
            }
        }
        match s.next().unwrap() {
            Step::Frame(fr) => assert_eq!(fr.data.len(), 3 * CHUNK),
            _ => panic!("large frame missing"),
        }
        assert!(matches!(s.next().unwrap(), Step::End));
        assert_eq!(s.pos(), bytes.len() as u64);
    }

    #[test]
    fn reports_torn_and_bad_frames() {
        let mut bytes = Vec::new();
        encode(&mut bytes, 1, 0, b"hello");
        let whole = bytes.len() as u64;
        encode(&mut bytes, 2, 0, b"world");
        // torn: limit in the middle of the second frame's data, and of its header
        let f = file_with(&bytes);
        for cut in [whole + 3, whole + 26] {
            let mut s = Scanner::new(&f, 0, cut);
            assert!(matches!(s.next().unwrap(), Step::Frame(_)));
            assert!(matches!(s.next().unwrap(), Step::Torn));
            assert_eq!(s.pos(), whole);
        }
        // torn by the end of the file even though the limit is further
        let f = file_with(&bytes[..bytes.len() - 1]);
        let mut s = Scanner::new(&f, whole, u64::MAX);
        assert!(matches!(s.next().unwrap(), Step::Torn));
        // bad checksum
        let mut damaged = bytes.clone();
        *damaged.last_mut().unwrap() ^= 1;
        let f = file_with(&damaged);
        let mut s = Scanner::new(&f, whole, damaged.len() as u64);
        assert!(matches!(s.next().unwrap(), Step::Bad(_)));
        // impossible length
        let mut damaged = bytes.clone();
        damaged[whole as usize + 3] = 0xff;
        let f = file_with(&damaged);
        let mut s = Scanner::new(&f, whole, damaged.len() as u64);
        assert!(matches!(s.next().unwrap(), Step::Bad(_)));
    }
}
