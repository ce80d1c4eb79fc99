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
//! dependencies) are skipped without a warning: the layout then falls back towards the
//! default, and only the footprint notices. docs/BENCHMARKS.md, "Footprint: the code
//! serving runs, placed together".
//!
//! Applied to release builds for x86_64 Linux by a Rust that links with its own LLD by default
//! (1.90 and later); not when the flags choose another linker. `MESHQL_NO_SYMBOL_ORDER=1` turns it off.

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
    let wanted = env("TARGET") == "x86_64-unknown-linux-gnu"
        && links_with_lld_by_default(&env("RUSTC"))
        && env("PROFILE") == "release"
        && std::env::var_os("MESHQL_NO_SYMBOL_ORDER").is_none()
        && !other_linker;
    let order = Path::new(&env("CARGO_MANIFEST_DIR")).join("hot-functions.txt");
    if wanted && order.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
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
