//! The README's tour, run as a newcomer runs it: a wrong example fails here, not in front of
//! a new user.
//!
//! Every fenced ```` ```bash ```` block that follows a `<!-- tested -->` line is executed, in
//! document order, by one `bash` (so variables such as `FARM` carry from block to block),
//! against a fresh `meshql serve examples/egg-economy` on a free port (`localhost:5088` in
//! the text becomes that port). Inside a block, a comment `# → TEXT` (continued on following
//! comment lines that start with `#` and at least three spaces) states what the commands
//! since the previous `# →` line, or since the block's start, printed: `…` matches any text
//! and whitespace is ignored.

mod common;

use common::{examples_dir, Server};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Marks a tested block in the README.
const TESTED: &str = "<!-- tested -->";
/// Starts an expectation.
const EXPECT: &str = "# →";
/// Separates the output of one step from the next in the script's stdout.
const MARK: &str = "@@meshql-readme-step@@";

/// A tested block: where it starts in the README, its lines.
struct Block {
    line: usize,
    lines: Vec<String>,
}

fn readme() -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&path).expect("README.md");
    (path, text)
}

/// The tested blocks of `text`; a `<!-- tested -->` not followed by a bash block is an error.
fn tested_blocks(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != TESTED {
            i += 1;
            continue;
        }
        let marker = i + 1;
        i += 1;
        while i < lines.len() && lines[i].trim().is_empty() {
            i += 1;
        }
        if lines.get(i).map(|l| l.trim()) != Some("```bash") {
            return Err(format!(
                "README.md:{marker}: `{TESTED}` must be followed by a ```bash block"
            ));
        }
        let start = i + 2;
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].to_owned());
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("README.md:{start}: the tested block is not closed"));
        }
        blocks.push(Block {
            line: start,
            lines: body,
        });
    }
    Ok(blocks)
}

/// What one step must print, and where it is stated.
struct Expectation {
    line: usize,
    text: String,
}

/// The script that runs every block, and its marks in the order it prints them: `None` at
/// the start of a block, the expectation where one stands. The output an expectation
/// states is what was printed between the mark before it and its own.
fn script(blocks: &[Block], port: u16) -> (String, Vec<Option<Expectation>>) {
    let mut out = String::from("set -euo pipefail\n");
    let mut marks: Vec<Option<Expectation>> = Vec::new();
    for block in blocks {
        out.push_str(&format!("echo '{MARK}'\n"));
        marks.push(None);
        let mut continuing = false;
        for (offset, line) in block.lines.iter().enumerate() {
            let trimmed = line.trim_start();
            if let Some(expected) = trimmed.strip_prefix(EXPECT) {
                out.push_str(&format!("echo '{MARK}'\n"));
                marks.push(Some(Expectation {
                    line: block.line + offset,
                    text: expected.to_owned(),
                }));
                continuing = true;
                continue;
            }
            if continuing && trimmed.starts_with("#   ") {
                if let Some(Some(last)) = marks.last_mut() {
                    last.text.push_str(&trimmed[1..]);
                }
                continue;
            }
            continuing = false;
            out.push_str(&line.replace("localhost:5088", &format!("localhost:{port}")));
            out.push('\n');
        }
    }
    (out, marks)
}

/// Whether `actual` is what `expected` says, `…` matching anything, whitespace ignored.
fn matches(expected: &str, actual: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    let (expected, actual) = (squeeze(expected), squeeze(actual));
    let parts: Vec<&str> = expected.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return actual == expected;
    }
    if !actual.starts_with(first) || !actual[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[test]
fn expectations_match_with_ellipses_and_any_whitespace() {
    assert!(matches(
        r#"{"a":1,"id":"…"}"#,
        r#"{"a": 1, "id": "0193-x"}"#
    ));
    assert!(matches("… 400", r#"{"error":"x"} 400"#));
    assert!(matches(
        "[{…\"eggs\":4…}]",
        r#"[{"farm_id":"f","eggs":4,"n":1}]"#
    ));
    assert!(matches("…", ""));
    assert!(!matches(r#"{"a":1}"#, r#"{"a":2}"#));
    assert!(!matches("… 400", "… 415"));
    assert!(!matches("a…b…c", "acb"));
}

#[test]
fn blocks_are_found_after_their_marker_only() {
    let text = "x\n<!-- tested -->\n\n```bash\necho 1\n# → 1\n```\n```bash\nnot tested\n```\n";
    let blocks = tested_blocks(text).unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].lines, ["echo 1", "# → 1"]);
    let (script, marks) = script(&blocks, 1);
    assert!(script.contains("echo 1\n") && !script.contains("not tested"));
    assert_eq!(marks.len(), 2, "the block's start and its expectation");
    assert!(tested_blocks("<!-- tested -->\ntext\n").is_err());
}

#[test]
fn the_readme_tour_runs_as_written() {
    let (path, text) = readme();
    let blocks = tested_blocks(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        blocks.len() >= 3,
        "{}: only {} tested blocks; the tour's blocks are marked `{TESTED}`",
        path.display(),
        blocks.len()
    );
    let server = Server::start(&examples_dir().join("egg-economy"), &[]);
    let (script, marks) = script(&blocks, server.port());
    let expectations = marks.iter().flatten().count();
    assert!(
        expectations >= 5,
        "the tour states what only {expectations} of its commands print"
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // `meshql` in the tour is the binary under test
    let bin_dir = std::path::Path::new(common::meshql_bin())
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .current_dir(&root)
        .env("PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // parts[j] is what was printed between mark j - 1 and mark j
    let parts: Vec<&str> = stdout.split(MARK).collect();
    for (j, mark) in marks.iter().enumerate() {
        let Some(expectation) = mark else { continue };
        assert!(
            parts.len() > j + 1,
            "README.md:{}: the tour stopped before this step (exit {:?})\nstderr:\n{stderr}\nstdout:\n{stdout}\nserver log:\n{}",
            expectation.line,
            out.status.code(),
            server.log()
        );
        let actual = parts[j].trim_matches('\n');
        assert!(
            matches(&expectation.text, actual),
            "README.md:{}: expected\n  {}\ngot\n  {actual}\nstderr:\n{stderr}\nserver log:\n{}",
            expectation.line,
            expectation.text.trim(),
            server.log()
        );
    }
    assert!(
        out.status.success(),
        "the tour failed (exit {:?})\nstderr:\n{stderr}\nstdout:\n{stdout}\nserver log:\n{}",
        out.status.code(),
        server.log()
    );
}
