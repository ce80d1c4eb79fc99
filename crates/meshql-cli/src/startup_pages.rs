//! Releasing the executable's pages that only start-up used.
//!
//! Start-up runs code that serving never runs again: command-line and config parsing, the
//! GraphQL schema compiler, JSON Schema compilation, every backend's and relay's registration,
//! TLS and key loading. The kernel maps an executable's code as it is first run, in 64 KiB
//! windows, and keeps it mapped: after start-up the resident set holds all of it. Once the
//! server is listening, [`release`] unmaps the executable's read-only segments from this
//! process with `madvise(MADV_DONTNEED)`. Their pages stay in the page cache (they belong to
//! the file, are clean, and are shared by every process running the binary); the code that
//! serving runs is mapped again by minor faults within its first requests, so the resident set
//! then counts what serving uses. Only segments that are never written are released: the
//! text and the first read-only segment (headers, `.rodata`, unwind tables), not the RELRO
//! segment, whose pages hold relocated pointers. Measured in docs/BENCHMARKS.md
//! ("Footprint").
//!
//! Not done under a debugger or tracer (`TracerPid` in `/proc/self/status`): their
//! breakpoints and uprobes are written into private copies of code pages, which releasing
//! would silently drop. `MESHQL_KEEP_STARTUP_PAGES=1` turns it off.

use std::fs;

/// The executable's never-written mappings `(start, len)`, from `/proc/self/smaps`: its
/// code, and the read-only segment at the file's start, each only if none of its pages has
/// been written: a page this process wrote (relocated, patched by a debugger) is a private
/// copy, counted as `Anonymous`, and releasing it would lose the writes. (`Private_Dirty` is
/// no such sign: it also counts the page cache's own dirty pages of a binary just linked and
/// not yet written back, which releasing leaves in the page cache.)
fn read_only_segments() -> Vec<(usize, usize)> {
    let Ok(exe) = fs::read_link("/proc/self/exe") else {
        return Vec::new();
    };
    let Ok(smaps) = fs::read_to_string("/proc/self/smaps") else {
        return Vec::new();
    };
    releasable_segments(&smaps, &exe.to_string_lossy())
}

/// [`read_only_segments`] over the text of an `smaps` file.
fn releasable_segments(smaps: &str, exe: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // the mapping being read: its range, and whether it may be released so far
    let mut current: Option<((usize, usize), bool)> = None;
    let mut finish = |current: &mut Option<((usize, usize), bool)>| {
        if let Some((range, true)) = current.take() {
            out.push(range);
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            // a mapping's header line: `start-end perms offset dev inode path`
            finish(&mut current);
            let (Some(perms), Some(offset)) = (fields.next(), fields.next()) else {
                continue;
            };
            let path = fields.nth(2).unwrap_or("");
            // executable code, or the read-only segment at the file's start; a read-only
            // mapping further in is RELRO (written by the dynamic linker before it was made
            // read-only)
            let candidate = path == exe
                && (perms == "r-xp"
                    || (perms == "r--p" && offset.trim_start_matches('0').is_empty()));
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            if candidate {
                current = Some(((start, end - start), true));
            }
        } else if let Some((_, releasable)) = current.as_mut() {
            if first == "Anonymous:" && fields.next().is_some_and(|kb| kb != "0") {
                *releasable = false;
            }
        }
    }
    finish(&mut current);
    out
}

/// Whether a debugger or tracer is attached to this process.
fn traced() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .is_some_and(|pid| pid.trim() != "0")
    })
}

/// Unmaps the executable's never-written segments from the resident set (see the module
/// docs); returns how many bytes of address space were released (0 under a tracer).
pub fn release() -> usize {
    if traced() {
        return 0;
    }
    const MADV_DONTNEED: i32 = 4;
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    let mut released = 0;
    for (start, len) in read_only_segments() {
        // SAFETY: the range is a whole private, read-only mapping of the executable file that
        // nothing has written (see `read_only_segments`): dropping its pages makes the next
        // access read the same bytes from the page cache again.
        if unsafe { madvise(start as *mut _, len, MADV_DONTNEED) } == 0 {
            released += len;
        }
    }
    released
}

#[cfg(test)]
mod tests {
    use super::releasable_segments;

    const EXE: &str = "/usr/bin/meshql";

    fn mapping(
        range: &str,
        perms: &str,
        offset: &str,
        path: &str,
        dirty_kb: u32,
        anon_kb: u32,
    ) -> String {
        format!(
            "{range} {perms} {offset} fd:01 1234 {path}\nSize: 64 kB\nRss: 8 kB\n\
             Private_Clean: 8 kB\nPrivate_Dirty: {dirty_kb} kB\nAnonymous: {anon_kb} kB\n\
             VmFlags: rd mr mw me\n"
        )
    }

    #[test]
    fn only_unwritten_code_and_the_first_read_only_segment_are_released() {
        let smaps = [
            // dirty in the page cache (just linked), not written by the process
            mapping("1000-3000", "r--p", "00000000", EXE, 8, 0),
            mapping("3000-9000", "r-xp", "00002000", EXE, 8, 0),
            // RELRO: read-only, further in
            mapping("9000-a000", "r--p", "00008000", EXE, 0, 0),
            mapping("a000-b000", "rw-p", "00009000", EXE, 4, 0),
            // another file's code
            mapping(
                "10000-12000",
                "r-xp",
                "00000000",
                "/usr/lib/libc.so.6",
                0,
                0,
            ),
            mapping("20000-21000", "rw-p", "00000000", "", 0, 4),
        ]
        .concat();
        assert_eq!(
            releasable_segments(&smaps, EXE),
            vec![(0x1000, 0x2000), (0x3000, 0x6000)]
        );
        // code with a page written (a breakpoint, a patched page): a private copy
        let patched = [
            mapping("1000-3000", "r--p", "00000000", EXE, 0, 0),
            mapping("3000-9000", "r-xp", "00002000", EXE, 4, 4),
        ]
        .concat();
        assert_eq!(releasable_segments(&patched, EXE), vec![(0x1000, 0x2000)]);
    }
}
