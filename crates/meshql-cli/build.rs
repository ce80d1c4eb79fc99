//! Link-time layout of the `meshql` binary.
//!
//! The kernel maps an executable's code into a process in windows of 64 KiB or more around
//! each page first run, and keeps it mapped: the resident set counts every window that
//! serving touches, not only the bytes it runs. Left to the linker, the ~1,000 functions a
//! server runs while serving (1 MB of code) are spread over the whole 24 MB text section,
//! and their windows added up to ~6.5 MiB of resident code. `hot-functions.txt` lists them
//! (hottest first, from a profile of `meshql bench`; `scripts/hot-functions.sh` writes it
//! again), and the linker places them together at the start of the text section
//! (`--symbol-ordering-file`). Names the build does not define (another toolchain, changed
//! dependencies: the names carry hashes of both) are skipped by the linker without a warning
//! (`--no-warn-symbol-ordering`; rustc would hide LLD's one line per name anyway), and the
//! layout falls back towards the default. `scripts/test.sh` therefore builds the release
//! binary and fails when fewer than 90 % of the list's names are defined in it
//! (`scripts/check-hot-functions.sh`), asking for the list to be written again.
//! docs/BENCHMARKS.md, "Footprint: the code serving runs, placed together".
//!
//! Applied to release builds for x86_64 Linux by a Rust that links with its own LLD by default
//! (1.90 and later); not when the flags choose another linker. `MESHQL_NO_SYMBOL_ORDER=1` turns it off.
//! The decision is written to `$OUT_DIR/symbol-order` (`on` or `off: <why>`): the check runs
//! only when the list was applied.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=hot-functions.txt");
    println!("cargo:rerun-if-env-changed=MESHQL_NO_SYMBOL_ORDER");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let flags = env("CARGO_ENCODED_RUSTFLAGS");
    let other_linker = [
        "linker-features=-lld",
        "link-self-contained=-linker",
        "fuse-ld=bfd",
        "fuse-ld=gold",
        "-Clinker=",
        "\u{1f}linker=",
    ]
    .iter()
    .any(|f| flags.contains(f))
        // a linker configured for the target (`[target.<triple>] linker`)
        || !env("RUSTC_LINKER").is_empty();
    let order = Path::new(&env("CARGO_MANIFEST_DIR")).join("hot-functions.txt");
    let off = if env("TARGET") != "x86_64-unknown-linux-gnu" {
        Some("not x86_64 Linux")
    } else if !links_with_lld_by_default(&env("RUSTC")) {
        Some("Rust older than 1.90 (links with the system's linker)")
    } else if env("PROFILE") != "release" {
        Some("not a release build")
    } else if std::env::var_os("MESHQL_NO_SYMBOL_ORDER").is_some() {
        Some("MESHQL_NO_SYMBOL_ORDER is set")
    } else if other_linker {
        Some("the flags choose another linker")
    } else if !order.exists() {
        Some("no hot-functions.txt")
    } else {
        None
    };
    if off.is_none() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    // read by scripts/test.sh (through cargo's `build-script-executed` message, which names
    // OUT_DIR) to check the list against the binary only when the link used it
    let decision = match off {
        None => "on\n".to_string(),
        Some(why) => format!("off: {why}\n"),
    };
    let marker = Path::new(&env("OUT_DIR")).join("symbol-order");
    std::fs::write(&marker, decision).expect("writing $OUT_DIR/symbol-order");
}

/// Whether this compiler links x86_64 Linux programs with its own LLD unless told otherwise
/// (Rust 1.90 and later); older ones use the system's `cc` and linker, which may not know
/// `--symbol-ordering-file`.
fn links_with_lld_by_default(rustc: &str) -> bool {
    let Ok(out) = std::process::Command::new(if rustc.is_empty() { "rustc" } else { rustc })
        .arg("--version")
        .output()
    else {
        return false;
    };
    // `rustc 1.95.0 (59807616e 2026-04-14)`
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
