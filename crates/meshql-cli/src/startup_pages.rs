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

/// The executable's never-written mappings `(start, len)`, from `/proc/self/maps`.
fn read_only_segments() -> Vec<(usize, usize)> {
    let Ok(exe) = fs::read_link("/proc/self/exe") else {
        return Vec::new();
    };
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let exe = exe.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = fields.nth(2).unwrap_or("");
        if path != exe {
            continue;
        }
        // executable code, or the read-only segment at the file's start; a read-only mapping
        // further in is RELRO (written by the dynamic linker before it was made read-only)
        let releasable =
            perms == "r-xp" || (perms == "r--p" && offset.trim_start_matches('0').is_empty());
        if !releasable {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        out.push((start, end - start));
    }
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
