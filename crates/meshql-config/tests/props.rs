//! Property tests for the config loader (issue 11, item 10): whatever the text of
//! `meshql.toml` — arbitrary, or a known-good config with bytes or lines inserted, deleted or
//! replaced — `load` answers `Ok` or `Err` and never panics, and every error names a file of
//! the config (the config itself or a schema file it references) with, where it has a line,
//! a line inside that file.

use meshql_config::resolve::load_with_env;
use meshql_config::ConfigErrors;
use proptest::prelude::*;
use std::path::Path;

const GRAPHQL: &str = "scalar Date\ntype Query {\n  getById(id: ID, at: Int): Thing\n  getAll(at: Float): [Thing]\n  byName(name: String): [Thing]\n}\ntype Thing { id: ID name: String other: Thing others: [Thing] }\n";
const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"}}}"#;

const GOOD: &str = r#"port = ${PORT:-3033}
data_dir = "${MESHQL_DATA_DIR:-data}"

[storage.main]
type = "sqlite"
file = "main.db"

[[entity]]
name = "thing"
storage = "main"
[entity.rest]
schema = "thing.schema.json"
[entity.graphql]
schema = "thing.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[entity.graphql.vectors]]
name = "getAll"
query = '{}'
[[entity.graphql.vectors]]
name = "byName"
query = '{"payload.name": "zone-{{name}}"}'
[[entity.graphql.resolvers]]
name = "others"
key = "id"
query = "getById"
graph = "/thing/graph"
[[entity.graphql.resolvers]]
name = "other"
key = "id"
query = "getById"
url = "${PLATFORM_URL:-http://localhost:3033}/thing/graph"
"#;

/// Fragments that mean something to TOML, to the env expander, to templates or to the
/// model: mutations splice these in so that they reach past the TOML parser.
const FRAGMENTS: &[&str] = &[
    "[[entity]]",
    "[entity.rest]",
    "[entity.graphql]",
    "[[entity.graphql.resolvers]]",
    "[storage.x]",
    "name = \"thing\"",
    "name = \"\"",
    "port = 0",
    "port = 99999999999999999999",
    "port = -1",
    "${",
    "${PORT",
    "${:-}",
    "${A:-${B}}",
    "$$",
    "{{",
    "}}",
    "{{{x}}}",
    "'",
    "\"",
    "'''",
    "\"\"\"",
    "\\u0000",
    "\\",
    "=",
    "[",
    "]",
    "#",
    "\n",
    "\r\n",
    "\u{0}",
    "\u{feff}",
    "é",
    "𝄞",
    "schema = \"../../../../etc/passwd\"",
    "schema = \"/\"",
    "schema = \"thing.graphql\"",
    "query = 'SELECT 1'",
    "sql = \"id = '{{id}}\"",
    "type = \"memory\"",
    "type = \"postgres\"",
    "graph = \"/nowhere\"",
    "url = \"not a url\"",
    "key = \"nope\"",
    "inf",
    "nan",
    "1979-05-27T07:32:00Z",
    "true",
    "[]",
    "{}",
];

#[derive(Debug, Clone)]
enum Mutation {
    InsertBytes(usize, Vec<u8>),
    DeleteBytes(usize, usize),
    ReplaceByte(usize, u8),
    InsertFragment(usize, usize),
    DeleteLine(usize),
    DuplicateLine(usize, usize),
    SwapLines(usize, usize),
    ReplaceLine(usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, b)| Mutation::InsertBytes(at, b)),
        (any::<usize>(), 1usize..40).prop_map(|(at, n)| Mutation::DeleteBytes(at, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::ReplaceByte(at, b)),
        (any::<usize>(), 0..FRAGMENTS.len()).prop_map(|(at, f)| Mutation::InsertFragment(at, f)),
        any::<usize>().prop_map(Mutation::DeleteLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::DuplicateLine(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), ".{0,40}").prop_map(|(a, s)| Mutation::ReplaceLine(a, s)),
    ]
}

fn apply(text: &mut Vec<u8>, m: &Mutation) {
    let len = text.len();
    let pos = |at: usize| if len == 0 { 0 } else { at % (len + 1) };
    match m {
        Mutation::InsertBytes(at, b) => {
            let p = pos(*at);
            text.splice(p..p, b.iter().copied());
        }
        Mutation::DeleteBytes(at, n) => {
            let p = pos(*at);
            let end = (p + n).min(len);
            text.drain(p..end);
        }
        Mutation::ReplaceByte(at, b) => {
            if len > 0 {
                text[at % len] = *b;
            }
        }
        Mutation::InsertFragment(at, f) => {
            let p = pos(*at);
            text.splice(p..p, FRAGMENTS[*f].bytes());
        }
        Mutation::DeleteLine(_)
        | Mutation::DuplicateLine(..)
        | Mutation::SwapLines(..)
        | Mutation::ReplaceLine(..) => {
            let mut lines: Vec<Vec<u8>> = text.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
            let n = lines.len();
            match m {
                Mutation::DeleteLine(a) => {
                    lines.remove(a % n);
                }
                Mutation::DuplicateLine(a, b) => {
                    let l = lines[a % n].clone();
                    lines.insert(b % (n + 1), l);
                }
                Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
                Mutation::ReplaceLine(a, s) => lines[a % n] = s.clone().into_bytes(),
                _ => unreachable!(),
            }
            *text = lines.join(&b'\n');
        }
    }
}

/// The environment the loader sees: fixed, so that runs are reproducible.
fn env(k: &str) -> Option<String> {
    match k {
        "PORT" => Some("4000".into()),
        "WEIRD" => Some("\"'\n[[entity]]${PORT}".into()),
        _ => None,
    }
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("thing.graphql"), GRAPHQL).unwrap();
        std::fs::write(dir.path().join("thing.schema.json"), SCHEMA).unwrap();
        Dir(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Loads `text` as the config and checks the shape of any errors.
fn check(dir: &Dir, text: &[u8]) -> Result<(), TestCaseError> {
    let file = dir.path().join("meshql.toml");
    std::fs::write(&file, text).unwrap();
    // the loader is given the directory (as `meshql serve DIR` does) or the file
    let target = if text.len() & 1 == 0 {
        dir.path().to_owned()
    } else {
        file.clone()
    };
    let result = load_with_env(&target, env);
    if let Err(ConfigErrors(errors)) = result {
        prop_assert!(!errors.is_empty(), "an Err carries at least one error");
        for e in &errors {
            prop_assert!(!e.message.is_empty(), "error without a message: {e:?}");
            prop_assert!(
                e.file.starts_with(dir.path()),
                "error names a file outside the config's directory: {e:?}"
            );
            if let Some(line) = e.line {
                prop_assert!(line >= 1, "line 0: {e:?}");
                // the line must be inside the file it names (when that file exists)
                if let Ok(bytes) = std::fs::read(&e.file) {
                    let lines = bytes.iter().filter(|b| **b == b'\n').count() + 1;
                    prop_assert!(
                        line <= lines,
                        "line {line} past the end ({lines} lines) of {}: {e}",
                        e.file.display()
                    );
                }
            }
            // Display must not panic either, and names the file
            let shown = e.to_string();
            prop_assert!(shown.contains(&*e.file.to_string_lossy()), "{shown}");
        }
    }
    Ok(())
}

#[test]
fn the_fixture_is_valid() {
    let dir = Dir::new();
    std::fs::write(dir.path().join("meshql.toml"), GOOD).unwrap();
    let c = load_with_env(dir.path(), env).expect("the unmutated fixture loads");
    assert_eq!(c.port, 4000);
    assert_eq!(c.entities.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary bytes (mostly not UTF-8) as the config file.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let dir = Dir::new();
        check(&dir, &bytes)?;
    }

    /// Arbitrary text, biased towards TOML's punctuation.
    #[test]
    fn arbitrary_text_never_panics(text in "([\\[\\]=\"'{}$#.\n a-z0-9_:-]|\\PC){0,300}") {
        let dir = Dir::new();
        check(&dir, text.as_bytes())?;
    }

    /// A known-good config with up to eight mutations.
    #[test]
    fn mutated_config_never_panics(mutations in prop::collection::vec(mutation(), 1..8)) {
        let dir = Dir::new();
        let mut text = GOOD.as_bytes().to_vec();
        for m in &mutations {
            apply(&mut text, m);
        }
        check(&dir, &text)?;
    }

    /// The good config with its schema files mutated: errors name the schema file, with a
    /// line inside it.
    #[test]
    fn mutated_schema_files_never_panic(
        sdl in prop::collection::vec(mutation(), 0..5),
        json in prop::collection::vec(mutation(), 0..5),
    ) {
        let dir = Dir::new();
        let mut text = GRAPHQL.as_bytes().to_vec();
        for m in &sdl {
            apply(&mut text, m);
        }
        std::fs::write(dir.path().join("thing.graphql"), &text).unwrap();
        let mut text = SCHEMA.as_bytes().to_vec();
        for m in &json {
            apply(&mut text, m);
        }
        std::fs::write(dir.path().join("thing.schema.json"), &text).unwrap();
        check(&dir, GOOD.as_bytes())?;
    }
}
