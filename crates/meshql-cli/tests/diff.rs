//! `meshql diff OLD NEW` through the binary: exit 1 on a breaking change (for CI), 0 on safe
//! ones, `--fail-on dangerous`, the JSON report, and 2 for a config that does not load.

mod common;

use common::{example_copy, examples_dir, run_meshql};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn edit_json(dir: &std::path::Path, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(file);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn breaking_changes_fail_and_safe_ones_pass() {
    let old = examples_dir().join("farm");
    // an optional property added: safe
    let safe = example_copy("farm", |t| t);
    edit_json(safe.path(), "schema/farm.schema.json", |v| {
        v["properties"]["region"] = serde_json::json!({"type": "string"});
    });
    let out = run_meshql(
        &["diff", old.to_str().unwrap(), safe.path().to_str().unwrap()],
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("SAFE") && text.contains("/properties/region"),
        "{text}"
    );

    // the same property made required: breaking, exit 1
    let breaking = example_copy("farm", |t| t);
    edit_json(breaking.path(), "schema/farm.schema.json", |v| {
        v["properties"]["region"] = serde_json::json!({"type": "string"});
        v["required"].as_array_mut().unwrap().push("region".into());
    });
    let out = run_meshql(
        &[
            "diff",
            old.to_str().unwrap(),
            breaking.path().to_str().unwrap(),
        ],
        LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("BREAKING") && text.contains("region"),
        "{text}"
    );
    let out = run_meshql(
        &[
            "diff",
            old.to_str().unwrap(),
            breaking.path().to_str().unwrap(),
            "--format",
            "json",
        ],
        LIMIT,
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["breaking"], 1, "{report}");

    // an enum value added to the SDL: dangerous; fails only with --fail-on dangerous
    let dangerous = example_copy("farm", |t| t);
    let sdl = dangerous.path().join("graph/farm.graphql");
    let text = std::fs::read_to_string(&sdl).unwrap();
    std::fs::write(&sdl, format!("{text}\nenum Size {{ SMALL }}\n")).unwrap();
    let old_copy = example_copy("farm", |t| t);
    let old_sdl = old_copy.path().join("graph/farm.graphql");
    std::fs::write(&old_sdl, format!("{text}\nenum Size {{ SMALL LARGE }}\n")).unwrap();
    let args = [
        "diff",
        old_copy.path().to_str().unwrap(),
        dangerous.path().to_str().unwrap(),
    ];
    let out = run_meshql(&args, LIMIT);
    // a value removed from an enum is breaking for the SDL's readers
    assert_eq!(out.status.code(), Some(1));
    std::fs::write(&old_sdl, format!("{text}\nenum Size {{ SMALL }}\n")).unwrap();
    std::fs::write(&sdl, format!("{text}\nenum Size {{ SMALL LARGE }}\n")).unwrap();
    let out = run_meshql(&args, LIMIT);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("DANGEROUS"), "{printed}");
    let mut strict = args.to_vec();
    strict.extend(["--fail-on", "dangerous"]);
    assert_eq!(run_meshql(&strict, LIMIT).status.code(), Some(1));

    // a config that does not load: 2, and the reason
    let out = run_meshql(
        &["diff", old.to_str().unwrap(), "/nonexistent/meshql.toml"],
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}
