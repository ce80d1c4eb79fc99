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
//! Applied to release builds on Linux, where Rust links with LLD by default (since 1.90);
//! not when the flags choose another linker. `MESHQL_NO_SYMBOL_ORDER=1` turns it off.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=hot-functions.txt");
    println!("cargo:rerun-if-env-changed=MESHQL_NO_SYMBOL_ORDER");
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
    .any(|f| flags.contains(f));
    let wanted = env("TARGET") == "x86_64-unknown-linux-gnu"
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
