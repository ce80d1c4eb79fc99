//! The golden contract suite: every folder under `tests/contract/` is one case of the wire
//! contract (../shared/spec/CONTRACT.md), run through the binary. A case is data, so that a
//! regression in any quirk is one failing folder with a readable diff:
//!
//! - `example`: the name of the example it serves (one line, e.g. `egg-economy`), or a
//!   `meshql.toml` (with its schemas) in the folder itself;
//! - `request.json`: the steps, in order — an HTTP request
//!   `{"method", "path", "headers"?, "body"?, "raw_body"?, "capture"?}`, or a clock mark
//!   `{"mark_time": "t1"}` (the current time in ms since the epoch, with a few ms before and
//!   after so that writes on either side have other timestamps);
//! - `expected.json`: one entry per step, in the same order — `{"status", "headers"?,
//!   "body"?}` for a request (`null` for a clock mark).
//!
//! Matching: `status` exactly; each `headers` entry exactly (names case-insensitive; `null`:
//! absent); `body` as JSON, equal after these substitutions in expected strings:
//! `"<uuid>"` any RFC 4122 UUID, `"<any>"` any value, `"<number>"` any number, `"<string>"`
//! any string, `"${name}"` a captured value, and `${name}` inside a longer string the
//! captured value's text. `body` absent: not checked; `""` (a string) for an empty body.
//! Captures (`"capture": {"name": "/id"}`) are JSON pointers into the response body, or
//! `"header:location"` for a header.
//!
//! Each case gets a fresh server and data directory. A failure names the case, the step and
//! its request, and shows expected and actual side by side.

mod common;

use common::{copy_dir, examples_dir, is_rfc4122_uuid, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/contract")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// `${name}` in `text` replaced by the captured values' text.
fn substitute(text: &str, vars: &HashMap<String, Value>) -> String {
    let mut out = text.to_owned();
    for (name, value) in vars {
        let shown = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out = out.replace(&format!("${{{name}}}"), &shown);
    }
    out
}

/// A request body or expected value with captured variables put in: a string that is exactly
/// `${name}` becomes the captured value (of any type), other strings get the text.
fn fill(value: &Value, vars: &HashMap<String, Value>) -> Value {
    match value {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
                if let Some(v) = vars.get(name) {
                    return v.clone();
                }
            }
            Value::String(substitute(s, vars))
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| fill(v, vars)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (substitute(k, vars), fill(v, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Where `actual` differs from `expected` (with the wildcards of the module docs), as JSON
/// paths; empty when they match.
fn differences(expected: &Value, actual: &Value, at: &str, out: &mut Vec<String>) {
    match (expected, actual) {
        (Value::String(w), _) if w == "<any>" => {}
        (Value::String(w), Value::String(a)) if w == "<uuid>" && is_rfc4122_uuid(a) => {}
        (Value::String(w), Value::String(_)) if w == "<string>" => {}
        (Value::String(w), Value::Number(_)) if w == "<number>" => {}
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                match a.get(k) {
                    Some(av) => differences(ev, av, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}: missing")),
                }
            }
            for k in a.keys().filter(|k| !e.contains_key(*k)) {
                out.push(format!("{at}.{k}: not expected"));
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                out.push(format!("{at}: {} items, expected {}", a.len(), e.len()));
            }
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                differences(ev, av, &format!("{at}[{i}]"), out);
            }
        }
        (e, a) if e == a => {}
        (e, a) => out.push(format!("{at}: expected {e}, got {a}")),
    }
}

/// Runs one case folder; `Err` describes every failed step.
async fn run_case(dir: &Path) -> Result<(), String> {
    let served = tempfile::tempdir().expect("temp dir");
    if dir.join("meshql.toml").exists() {
        copy_dir(dir, served.path());
    } else {
        let example = std::fs::read_to_string(dir.join("example"))
            .map_err(|e| format!("neither meshql.toml nor example: {e}"))?;
        copy_dir(&examples_dir().join(example.trim()), served.path());
    }
    let server = Server::start(served.path(), &[]);
    let client = server.client();
    let steps = read_json(&dir.join("request.json"));
    let expected = read_json(&dir.join("expected.json"));
    let (steps, expected) = (
        steps.as_array().ok_or("request.json: not an array")?,
        expected.as_array().ok_or("expected.json: not an array")?,
    );
    if steps.len() != expected.len() {
        return Err(format!(
            "{} steps but {} expected answers",
            steps.len(),
            expected.len()
        ));
    }
    let mut vars: HashMap<String, Value> = HashMap::new();
    let mut report = String::new();
    for (i, (step, want)) in steps.iter().zip(expected).enumerate() {
        if let Some(name) = step["mark_time"].as_str() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            vars.insert(name.to_owned(), json!(now));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            continue;
        }
        let method = step["method"].as_str().ok_or("a step without method")?;
        let path = substitute(step["path"].as_str().ok_or("a step without path")?, &vars);
        let body = match (&step["body"], &step["raw_body"]) {
            (Value::Null, Value::String(raw)) => Some(substitute(raw, &vars).into_bytes()),
            (Value::Null, _) => None,
            (b, _) => Some(serde_json::to_vec(&fill(b, &vars)).unwrap()),
        };
        let headers: Vec<(String, String)> = step["headers"]
            .as_object()
            .map(|h| {
                h.iter()
                    .map(|(k, v)| (k.clone(), substitute(v.as_str().unwrap_or(""), &vars)))
                    .collect()
            })
            .unwrap_or_default();
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let got = client.request(method, &path, body, &header_refs).await;
        let actual_body: Value = if got.text.is_empty() {
            Value::String(String::new())
        } else {
            serde_json::from_str(&got.text).unwrap_or_else(|_| Value::String(got.text.clone()))
        };
        let mut diffs = Vec::new();
        // captured first, so that this step's expectations may use them (a Location that
        // names the id in the body)
        if let Some(captures) = step["capture"].as_object() {
            for (name, from) in captures {
                let from = from.as_str().unwrap_or("");
                let value = match from.strip_prefix("header:") {
                    Some(h) => got.header(h).map(|v| json!(v)),
                    None => actual_body.pointer(from).cloned(),
                };
                match value {
                    Some(v) => {
                        vars.insert(name.clone(), v);
                    }
                    None => diffs.push(format!("capture {name}: nothing at {from}")),
                }
            }
        }
        if want["status"] != json!(got.status) {
            diffs.push(format!(
                "status: expected {}, got {}",
                want["status"], got.status
            ));
        }
        if let Some(headers) = want["headers"].as_object() {
            for (name, value) in headers {
                let actual = got.header(name);
                let value = fill(value, &vars);
                match (value.as_str(), actual) {
                    (None, None) => {}
                    (Some(w), Some(a)) if w == a || (w == "<uuid>" && is_rfc4122_uuid(a)) => {}
                    (w, a) => diffs.push(format!("header {name}: expected {w:?}, got {a:?}")),
                }
            }
        }
        if !want["body"].is_null() {
            differences(
                &fill(&want["body"], &vars),
                &actual_body,
                "body",
                &mut diffs,
            );
        }
        if !diffs.is_empty() {
            let _ = writeln!(
                report,
                "step {} ({method} {path}):\n  {}\n  expected body: {}\n  actual ({}): {}",
                i + 1,
                diffs.join("\n  "),
                fill(&want["body"], &vars),
                got.status,
                got.text
            );
            // later steps depend on this one's captures
            break;
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

#[tokio::test]
async fn every_contract_case_holds() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .expect("tests/contract exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 20, "only {} contract cases", dirs.len());
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(e) = run_case(dir).await {
            failures.push(format!("== tests/contract/{name}\n{e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} contract cases failed:\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n")
    );
}

#[test]
fn wildcards_and_captures_match_as_documented() {
    let vars = HashMap::from([("id".to_owned(), json!("abc")), ("n".to_owned(), json!(3))]);
    let expected = fill(
        &json!({"id": "${id}", "path": "/x/${id}", "n": "${n}", "u": "<uuid>", "a": "<any>"}),
        &vars,
    );
    assert_eq!(expected["id"], "abc");
    assert_eq!(expected["path"], "/x/abc");
    assert_eq!(expected["n"], 3);
    let actual = json!({"id": "abc", "path": "/x/abc", "n": 3,
        "u": "01a21321-dc03-75dd-838d-ba7e91523d63", "a": [1]});
    let mut diffs = Vec::new();
    differences(&expected, &actual, "body", &mut diffs);
    assert!(diffs.is_empty(), "{diffs:?}");
    let wrong = json!({"id": "abd", "path": "/x/abc", "n": 3, "u": "no", "extra": 1});
    differences(&expected, &wrong, "body", &mut diffs);
    assert_eq!(
        diffs,
        [
            "body.id: expected \"abc\", got \"abd\"",
            "body.u: expected \"<uuid>\", got \"no\"",
            "body.a: missing",
            "body.extra: not expected"
        ]
    );
}
