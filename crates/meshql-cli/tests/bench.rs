//! `meshql bench` through the binary: every scenario against fresh local servers (short
//! runs), reports written, `compare` and `list`. Asserts on correctness of what was measured
//! (gates passed, no errors, every check passed), never on speed.

mod common;

use common::{examples_dir, run_meshql};
use serde_json::Value;
use std::time::Duration;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `meshql bench <scenario> <args…>` against the examples (`--quiet`, no latency bound,
/// reports into `out_dir`) and checks that it passed; the scenario's report and what the
/// command printed.
fn passed_scenario(scenario: &str, args: &[&str], out_dir: &tempfile::TempDir) -> (Value, String) {
    let examples = examples_dir();
    let mut all = vec!["bench", scenario, "--examples", examples.to_str().unwrap()];
    all.extend_from_slice(args);
    // no latency bounds: a debug build under this load may queue up
    all.extend_from_slice(&["--max-p95-ms", "600000", "--quiet", "--out"]);
    all.push(out_dir.path().to_str().unwrap());
    let out = run_meshql(&all, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("report.json")).unwrap())
            .unwrap();
    let scenarios = report["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 1);
    let s = scenarios[0].clone();
    assert_eq!(s["name"], scenario);
    assert_eq!(s["status"]["state"], "passed", "{}", s["status"]);
    (s, text(&out.stdout))
}

/// A scenario's notes.
fn notes_of(scenario: &Value) -> Vec<&str> {
    scenario["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

#[test]
fn every_scenario_runs_against_a_fresh_local_server_and_reports() {
    let out_dir = tempfile::tempdir().unwrap();
    let examples = examples_dir();
    let out = run_meshql(
        &[
            "bench",
            "all",
            "--examples",
            examples.to_str().unwrap(),
            "--duration",
            "1",
            "--vus",
            "4",
            "--products",
            "3000",
            "--rates",
            "200",
            "--step-secs",
            "2",
            "--sweep-p95-ms",
            "50",
            "--curve-secs",
            "0.5",
            // never on speed: `changes` offers 10,000 POSTs/s, which queue up in a debug build
            "--max-p95-ms",
            "600000",
            "--quiet",
            "--out",
            out_dir.path().to_str().unwrap(),
        ],
        Duration::from_secs(600),
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("report.json")).unwrap())
            .unwrap();
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "throughput",
            "rest-crud",
            "graphql-queries",
            "federation-depth",
            "mixed-workload",
            "farm-graph",
            "farm-cqrs",
            "products",
            "fan-out",
            "core-scaling",
            "changes",
            "cdc",
            "projections",
            "subscriptions"
        ]
    );
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        assert_eq!(s["status"]["state"], "passed", "{name}: {}", s["status"]);
        let runs = s["runs"].as_array().unwrap();
        assert!(!runs.is_empty(), "{name} measured nothing");
        for run in runs {
            let o = &run["overall"];
            let label = run["label"].as_str().unwrap();
            assert!(
                o["count"].as_u64().unwrap() > 0,
                "{name}/{label}: no requests"
            );
            assert_eq!(o["http_errors"], 0, "{name}/{label}: {o}");
            assert_eq!(o["graphql_errors"], 0, "{name}/{label}: {o}");
            assert_eq!(o["checks_failed"], 0, "{name}/{label}: {o}");
            if label != "ceiling" {
                // the bench started the server, so it sampled it
                assert!(
                    run["server"]["peak_rss_mib"].as_f64().unwrap() > 1.0,
                    "{name}/{label}"
                );
            }
        }
    }
    let by_name = |n: &str| scenarios.iter().find(|s| s["name"] == n).unwrap();
    // the throughput scenario reports every hot path against the ceiling of the same run
    let t = by_name("throughput");
    let labels: Vec<&str> = t["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "ceiling",
            "rest_get_by_id",
            "graphql_get_by_id",
            "graphql_depth3",
            "rest_post"
        ]
    );
    for r in &t["runs"].as_array().unwrap()[1..] {
        assert!(r["metrics"]["of_ceiling"].as_f64().unwrap() > 0.0);
    }
    // a latency-vs-load curve per hot path: five open-model rates below the saturation the
    // same run measured, every due request sent or counted dropped, each sent one recorded
    let curves = t["curves"].as_array().unwrap();
    let kinds: Vec<&str> = curves.iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "rest_get_by_id",
            "graphql_get_by_id",
            "graphql_depth3",
            "rest_post"
        ]
    );
    for c in curves {
        let kind = c["kind"].as_str().unwrap();
        let saturation = c["saturation_rps"].as_f64().unwrap();
        let points = c["points"].as_array().unwrap();
        let fractions: Vec<f64> = points
            .iter()
            .map(|p| p["fraction"].as_f64().unwrap())
            .collect();
        assert_eq!(fractions, [0.10, 0.25, 0.50, 0.75, 0.90], "{kind}");
        for p in points {
            let offered = p["offered_rps"].as_f64().unwrap();
            assert!(offered >= 1.0 && offered <= saturation, "{kind}: {p}");
            let due = (offered * 0.5).ceil() as u64;
            let (sent, dropped) = (
                p["iterations"].as_u64().unwrap(),
                p["dropped"].as_u64().unwrap(),
            );
            assert_eq!(sent + dropped, due, "{kind}: {p}");
            let latency = &p["latency"];
            assert_eq!(latency["kind"], kind);
            assert_eq!(latency["count"].as_u64().unwrap(), sent, "{kind}: {p}");
            assert_eq!(latency["graphql_errors"], 0, "{kind}: {p}");
            for key in ["med_ms", "p99_ms", "p999_ms", "max_ms"] {
                assert!(latency[key].is_f64(), "{kind}: {key} in {p}");
            }
        }
    }
    // batching holds under load: one storage read per level
    let depth3 = &t["runs"][3];
    assert_eq!(
        depth3["metrics"]["storage_reads_per_request"]
            .as_f64()
            .unwrap(),
        3.0
    );
    let fan = by_name("fan-out");
    for r in fan["runs"].as_array().unwrap() {
        assert_eq!(
            r["metrics"]["storage_reads_per_request"].as_f64().unwrap(),
            3.0,
            "{}",
            r["label"]
        );
    }
    // the products scenario ran its fixed rate: every due iteration sent or counted dropped
    let p = &by_name("products")["runs"][0];
    assert_eq!(p["label"], "200/s");
    assert_eq!(p["offered_rps"].as_f64().unwrap(), 200.0);
    assert_eq!(
        p["iterations"].as_u64().unwrap() + p["dropped"].as_u64().unwrap(),
        400
    );
    // core scaling measured both worker counts
    let labels: Vec<&str> = by_name("core-scaling")["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels[0], "1 worker(s)");
    assert_eq!(labels.len(), 2);
    // subscriptions: every write reached the subscribers of its coop, once, with a latency;
    // the server's RSS before and with the subscribers open
    let sub = &by_name("subscriptions")["runs"][0]["metrics"];
    assert!(sub["deliveries_expected"].as_f64().unwrap() > 0.0, "{sub}");
    assert_eq!(
        sub["deliveries_received"], sub["deliveries_expected"],
        "{sub}"
    );
    assert_eq!(sub["deliveries_lost"].as_f64(), Some(0.0), "{sub}");
    assert_eq!(sub["deliveries_duplicated"].as_f64(), Some(0.0), "{sub}");
    for key in [
        "delivery_latency_p99_ms",
        "server_rss_before_subscribers_mib",
        "server_rss_subscribed_mib",
    ] {
        assert!(sub[key].as_f64().unwrap() > 0.0, "{key}: {sub}");
    }
    // the terminal table and the other reports
    assert!(stdout.contains("== farm-graph"), "{stdout}");
    assert!(stdout.contains("hen_coop_farm"), "{stdout}");
    let md = std::fs::read_to_string(out_dir.path().join("report.md")).unwrap();
    assert!(md.contains("## mixed-workload") && md.contains("| event_write |"));
    let html = std::fs::read_to_string(out_dir.path().join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("latency per request kind"));
    let charts: Vec<String> = std::fs::read_dir(out_dir.path().join("charts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        charts.iter().any(|c| c == "throughput-of-ceiling.svg"),
        "{charts:?}"
    );
    assert!(charts.iter().all(|c| c.ends_with(".svg")));
    assert!(md.contains("![throughput-of-ceiling](charts/throughput-of-ceiling.svg)"));
    assert!(md.contains("| p99 | p99.9 | max |"), "{md}");
    assert!(
        md.contains("### Latency vs offered load: graphql_depth3"),
        "{md}"
    );
    assert!(stdout.contains("latency vs offered load"), "{stdout}");
    assert!(html.contains("rest_post — latency against offered load"));
    for path in [
        "rest-get-by-id",
        "graphql-get-by-id",
        "graphql-depth3",
        "rest-post",
    ] {
        let file = format!("throughput-curve-{path}.svg");
        assert!(charts.contains(&file), "{charts:?}");
    }
    assert!(
        html.contains("throughput against offered load")
            || by_name("products")["runs"].as_array().unwrap().len() < 2
    );

    // compare a report with itself: every ratio is 1.00x
    let json = out_dir.path().join("report.json");
    let cmp = run_meshql(
        &[
            "bench",
            "compare",
            json.to_str().unwrap(),
            json.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert!(cmp.status.success());
    let table = text(&cmp.stdout);
    assert!(
        table.contains("throughput / rest_get_by_id / rest_get_by_id"),
        "{table}"
    );
    assert!(
        table.contains("1.00x") && !table.contains("not compared"),
        "{table}"
    );
    assert!(
        table.contains("throughput / curve rest_post / 90%") && table.contains("A p99.9"),
        "{table}"
    );

    // render the JSON again elsewhere: the same Markdown comes out
    let again = tempfile::tempdir().unwrap();
    let out = run_meshql(
        &[
            "bench",
            "render",
            json.to_str().unwrap(),
            "--out",
            again.path().to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("== products"));
    assert_eq!(
        std::fs::read_to_string(again.path().join("report.md")).unwrap(),
        md
    );
    assert!(again
        .path()
        .join("charts/throughput-of-ceiling.svg")
        .is_file());
}

#[test]
fn the_changes_scenario_compares_feed_on_and_off_and_measures_post_to_sse() {
    let out_dir = tempfile::tempdir().unwrap();
    let (s, stdout) = &passed_scenario(
        "changes",
        &["--duration", "1", "--vus", "4", "--rounds", "2"],
        &out_dir,
    );
    let runs = s["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "rest_post_feed_on #1",
            "rest_post_feed_off #1",
            "rest_post_feed_on #2",
            "rest_post_feed_off #2",
            "post_to_sse_1000/s",
            "post_to_sse_10000/s"
        ]
    );
    for run in runs {
        let label = run["label"].as_str().unwrap();
        let o = &run["overall"];
        assert!(o["count"].as_u64().unwrap() > 0, "{label}: no requests");
        assert_eq!(o["http_errors"], 0, "{label}: {o}");
        assert_eq!(o["checks_failed"], 0, "{label}: {o}");
        // both servers were started by the bench and sampled
        assert!(
            run["server"]["peak_rss_mib"].as_f64().unwrap() > 1.0,
            "{label}"
        );
        let m = &run["metrics"];
        if label.starts_with("rest_post_feed_on") {
            assert!(m["feed_on_of_off"].as_f64().unwrap() > 0.0, "{label}: {m}");
        }
        if label.starts_with("post_to_sse") {
            // every POST answered 2xx came back on the event stream, and only once
            assert_eq!(
                m["feed_changes_missing"].as_f64(),
                Some(0.0),
                "{label}: {m}"
            );
            assert_eq!(
                m["feed_changes_received"].as_f64().unwrap() as u64,
                o["count"].as_u64().unwrap(),
                "{label}: {m}"
            );
            assert!(m.get("feed_changes_duplicated").is_none(), "{label}: {m}");
            for key in [
                "feed_latency_p50_ms",
                "feed_latency_p90_ms",
                "feed_latency_p99_ms",
                "feed_latency_max_ms",
                "feed_latency_from_due_p50_ms",
                "feed_latency_from_due_p99_ms",
            ] {
                assert!(m[key].as_f64().unwrap() > 0.0, "{label}: {key} in {m}");
            }
            assert!(
                m["feed_latency_p50_ms"].as_f64() <= m["feed_latency_p99_ms"].as_f64(),
                "{label}: {m}"
            );
        }
    }
    let notes = notes_of(s);
    assert!(notes.iter().any(|n| n.contains("on / off =")), "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains("POST → SSE at 1000/s")),
        "{notes:?}"
    );
    // the new numbers are in every rendering
    assert!(stdout.contains("feed_latency_p99_ms = "), "{stdout}");
    assert!(stdout.contains("feed_on_of_off = "), "{stdout}");
    let md = std::fs::read_to_string(out_dir.path().join("report.md")).unwrap();
    assert!(md.contains("feed_changes_missing = 0 ·"), "{md}");
    let html = std::fs::read_to_string(out_dir.path().join("report.html")).unwrap();
    assert!(html.contains("feed_latency_p99_ms = "));
    assert!(out_dir
        .path()
        .join("charts/changes-feed-latency.svg")
        .is_file());
}

/// `--cqrs`: products seeded and written through a `--role write` process, read through a
/// `--role read` one, with writes flowing from a thread of their own.
#[test]
fn the_products_scenario_reads_through_a_read_role_while_the_write_role_takes_writes() {
    let out_dir = tempfile::tempdir().unwrap();
    let (s, _) = passed_scenario(
        "products",
        &[
            "--cqrs",
            "--products",
            "600",
            "--rates",
            "100",
            "--step-secs",
            "3",
            "--sweep-p95-ms",
            "0.0001",
            "--writes-per-sec",
            "50",
        ],
        &out_dir,
    );
    let notes = notes_of(&s);
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("served as --role write + --role read")),
        "{notes:?}"
    );
    let written = notes
        .iter()
        .find(|n| n.contains("products written during the reads"))
        .unwrap_or_else(|| panic!("{notes:?}"));
    assert!(written.ends_with(", 0 failed"), "{written}");
    let sent: u64 = written.split(' ').next().unwrap().parse().unwrap();
    assert!(
        sent >= 100,
        "writes flowed through the write process: {written}"
    );
    let run = &s["runs"][0];
    assert_eq!(run["label"], "100/s");
    assert_eq!(run["overall"]["http_errors"].as_u64(), Some(0), "{run}");
    assert_eq!(
        run["iterations"].as_u64().unwrap() + run["dropped"].as_u64().unwrap(),
        300
    );
}

#[test]
fn think_time_paces_every_user_of_a_closed_model() {
    let out_dir = tempfile::tempdir().unwrap();
    let (s, _) = &passed_scenario(
        "graphql-queries",
        &["--duration", "2", "--vus", "2", "--think-ms", "400"],
        &out_dir,
    );
    for run in s["runs"].as_array().unwrap() {
        let model = run["model"].as_str().unwrap();
        assert!(
            model.contains("2 users") && model.contains("think 400 ms"),
            "{model}"
        );
        // 2 users, each iteration followed by 400 ms: at most 2 × (2 s / 400 ms + 1)
        let iterations = run["iterations"].as_u64().unwrap();
        assert!(
            (2..=12).contains(&iterations),
            "{iterations} iterations: {run}"
        );
    }
}

#[test]
fn the_soak_scenario_reports_the_servers_rss_slope() {
    // a few seconds instead of 30 minutes, at a rate a debug build keeps up with; asserts
    // that the figures are there, never what they are
    let out_dir = tempfile::tempdir().unwrap();
    let (s, stdout) = &passed_scenario("soak", &["--duration", "5", "--soak-rate", "40"], &out_dir);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run["offered_rps"].as_f64(), Some(40.0));
    let o = &run["overall"];
    assert!(o["count"].as_u64().unwrap() > 0, "{o}");
    assert_eq!(o["http_errors"], 0, "{o}");
    assert_eq!(o["graphql_errors"], 0, "{o}");
    assert_eq!(o["checks_failed"], 0, "{o}");
    // every part of the egg-economy mix took part
    let kinds: Vec<&str> = run["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kind"].as_str().unwrap())
        .collect();
    for kind in ["rest_create", "graphql_get_all", "depth_3", "event_write"] {
        assert!(kinds.contains(&kind), "{kind}: {kinds:?}");
    }
    let m = &run["metrics"];
    for key in [
        "rss_start_mib",
        "rss_end_mib",
        "rss_peak_mib",
        "rss_slope_mib_per_hour",
        "rss_samples",
        "rss_warmup_s",
    ] {
        assert!(m[key].is_number(), "{key} in {m}");
    }
    assert!(m["rss_samples"].as_f64().unwrap() >= 2.0, "{m}");
    let notes = notes_of(s);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("MiB/h") && n.contains("samples")),
        "{notes:?}"
    );
    assert!(stdout.contains("rss_slope_mib_per_hour = "), "{stdout}");
    let md = std::fs::read_to_string(out_dir.path().join("report.md")).unwrap();
    assert!(md.contains("## soak") && md.contains("rss_slope_mib_per_hour = "));
}

#[test]
fn the_legacy_scenario_captures_a_postgres_table_and_drops_what_it_made() {
    // the test PostgreSQL (wal_level = logical); a small snapshot and one-second runs, in a
    // debug build: asserts that nothing was lost or written twice, never how fast
    let admin = common::postgres_url();
    let out_dir = tempfile::tempdir().unwrap();
    let (s, _) = &passed_scenario(
        "legacy",
        &[
            "--legacy-url",
            &admin,
            "--legacy-rows",
            "2000",
            "--duration",
            "1",
        ],
        &out_dir,
    );
    let runs = s["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "snapshot_2000_rows",
            "insert_to_readable_100_per_s",
            "insert_to_readable_1000_per_s"
        ]
    );
    let m = &runs[0]["metrics"];
    assert_eq!(m["snapshot_rows"].as_f64(), Some(2000.0), "{m}");
    assert_eq!(m["snapshot_outputs"].as_f64(), Some(2000.0), "{m}");
    assert!(m["snapshot_rows_per_s"].as_f64().unwrap() > 0.0, "{m}");
    for run in &runs[1..] {
        let label = run["label"].as_str().unwrap();
        let m = &run["metrics"];
        assert!(
            m["legacy_rows_committed"].as_f64().unwrap() > 0.0,
            "{label}: {m}"
        );
        for key in [
            "legacy_lost",
            "legacy_duplicated",
            "legacy_graphql_unreadable",
        ] {
            assert_eq!(m[key].as_f64(), Some(0.0), "{label}: {key} in {m}");
        }
        assert!(
            m["legacy_graphql_reads"].as_f64().unwrap() > 0.0,
            "{label}: {m}"
        );
        assert!(m["legacy_latency_p99_ms"].is_number(), "{label}: {m}");
        let o = &run["overall"];
        assert_eq!(o["http_errors"], 0, "{label}: {o}");
        assert_eq!(o["graphql_errors"], 0, "{label}: {o}");
        assert_eq!(o["checks_failed"], 0, "{label}: {o}");
        let mut kinds: Vec<&str> = run["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kind"].as_str().unwrap())
            .collect();
        kinds.sort_unstable();
        assert_eq!(kinds, ["graphql_get_by_id", "legacy_insert"], "{label}");
    }
    // its database and replication slot are gone
    let notes = notes_of(s);
    let database = notes
        .iter()
        .find_map(|n| n.strip_prefix("the legacy database "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no cleanup note: {notes:?}"));
    assert!(database.starts_with("meshql_bench_legacy_"), "{database}");
    let left = common::psql(
        &admin,
        &format!(
            "SELECT (SELECT count(*) FROM pg_database WHERE datname = '{database}') + \
             (SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{database}')"
        ),
    );
    assert_eq!(left, "0", "{database} left behind");
}

#[test]
fn list_compare_errors_and_unknown_names() {
    let out = run_meshql(&["bench", "list"], Duration::from_secs(30));
    assert!(out.status.success());
    let list = text(&out.stdout);
    for name in [
        "throughput",
        "rest-crud",
        "products",
        "fan-out",
        "core-scaling",
        "changes",
        "soak",
        "egg-economy",
    ] {
        assert!(list.contains(name), "{list}");
    }
    assert!(list.contains("every scenario except soak"), "{list}");
    let out = run_meshql(
        &[
            "bench",
            "soak",
            "--soak-rate",
            "0",
            "--url",
            "http://127.0.0.1:9",
        ],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--soak-rate"),
        "{}",
        text(&out.stderr)
    );
    for (args, expected) in [
        (
            &["bench", "products", "--cqrs", "--url", "http://127.0.0.1:9"][..],
            "it cannot measure --url",
        ),
        (
            &["bench", "throughput", "--cqrs"][..],
            "--cqrs applies to the products scenario only",
        ),
    ] {
        let out = run_meshql(args, Duration::from_secs(30));
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(expected),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = run_meshql(
        &["bench", "nope", "--url", "http://127.0.0.1:9"],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("unknown scenario \"nope\""),
        "{}",
        text(&out.stderr)
    );
    let out = run_meshql(
        &["bench", "--profile", "soak", "--url", "http://127.0.0.1:9"],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown profile"));
    let out = run_meshql(
        &[
            "bench",
            "compare",
            "/nonexistent/a.json",
            "/nonexistent/b.json",
        ],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("/nonexistent/a.json"));
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), "{\"not\": \"a report\"}").unwrap();
    let out = run_meshql(
        &["bench", "render", junk.path().to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a bench report"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_broken_config_fails_the_scenario_with_the_servers_own_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meshql.toml"), "port = 1\nbogus = true\n").unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = run_meshql(
        &[
            "bench",
            "throughput",
            "--config",
            dir.path().to_str().unwrap(),
            "--quiet",
            "--out",
            out_dir.path().to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("FAILED") && stdout.contains("bogus"),
        "{stdout}"
    );
}

#[test]
fn the_kafka_store_scenario_times_a_rebuild_and_post_on_one_process_to_readable_on_another() {
    // the test broker; a small rebuild and one-second runs, in a debug build: asserts that
    // every measurement is there, that nothing was lost or delivered twice, never how fast
    let brokers = meshql_conformance::test_server_url("kafka", "MESHQL_TEST_KAFKA_BROKERS");
    let out_dir = tempfile::tempdir().unwrap();
    let (s, stdout) = &passed_scenario(
        "kafka-store",
        &[
            "--kafka",
            &brokers,
            "--kafka-versions",
            "5000",
            "--duration",
            "1",
        ],
        &out_dir,
    );
    let runs = s["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "start_on_empty_topics",
            "rebuild_5000_versions",
            "post_on_a_readable_on_b_100/s",
            "post_on_a_readable_on_b_1000/s"
        ]
    );
    for run in runs {
        let label = run["label"].as_str().unwrap();
        let o = &run["overall"];
        assert!(o["count"].as_u64().unwrap() > 0, "{label}: no requests");
        assert_eq!(o["http_errors"], 0, "{label}: {o}");
        assert_eq!(o["checks_failed"], 0, "{label}: {o}");
        // every process was started by the bench and sampled
        assert!(
            run["server"]["peak_rss_mib"].as_f64().unwrap() > 1.0,
            "{label}"
        );
    }
    // the rebuild: a time to ready on the empty topics, then on the versions written
    let m = &runs[1]["metrics"];
    assert_eq!(m["rebuild_versions"].as_f64(), Some(5000.0), "{m}");
    let (empty, ready) = (
        m["empty_start_ready_s"].as_f64().unwrap(),
        m["rebuild_ready_s"].as_f64().unwrap(),
    );
    assert!(empty > 0.0 && ready > 0.0, "{m}");
    // the same start, reported twice: the run ends when /ready answered
    let run_ms = runs[0]["duration_s"].as_f64().unwrap() * 1000.0;
    assert!((run_ms - empty * 1000.0).abs() <= 1.0, "{run_ms} ms, {m}");
    assert!(m["rebuild_versions_per_s"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["written_versions_per_s"].as_f64().unwrap() > 0.0, "{m}");
    assert!(
        m["rebuild_feed_after_ready_s"].as_f64().unwrap() >= 0.0,
        "{m}"
    );
    // the store's own log line: the versions plus the transactions' commit markers
    assert!(m["rebuild_log_offsets"].as_f64().unwrap() >= 5000.0, "{m}");
    assert!(m["rebuild_log_ms"].is_number(), "{m}");
    assert!(
        m["rebuild_log_versions_per_s"].as_f64().unwrap() > 0.0,
        "{m}"
    );
    // POST on A → change on B: every POST A accepted arrived on B once
    for run in &runs[2..] {
        let label = run["label"].as_str().unwrap();
        let m = &run["metrics"];
        let posted = run["overall"]["count"].as_f64().unwrap();
        assert_eq!(m["a_to_b_accepted"].as_f64(), Some(posted), "{label}: {m}");
        assert_eq!(m["a_to_b_received"].as_f64(), Some(posted), "{label}: {m}");
        assert_eq!(m["a_to_b_lost"].as_f64(), Some(0.0), "{label}: {m}");
        assert_eq!(m["a_to_b_duplicated"].as_f64(), Some(0.0), "{label}: {m}");
        for key in [
            "a_to_b_latency_p50_ms",
            "a_to_b_latency_p95_ms",
            "a_to_b_latency_p99_ms",
            "a_to_b_latency_max_ms",
        ] {
            assert!(m[key].as_f64().unwrap() > 0.0, "{label}: {key} in {m}");
        }
        assert!(
            m["a_to_b_latency_p50_ms"].as_f64() <= m["a_to_b_latency_p99_ms"].as_f64(),
            "{label}: {m}"
        );
        let thresholds: Vec<&str> = run["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(
            thresholds.iter().any(|t| t.starts_with("lost"))
                && thresholds.iter().any(|t| t.starts_with("duplicated")),
            "{label}: {thresholds:?}"
        );
    }
    let notes = notes_of(s);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("topics") && n.contains("were deleted")),
        "{notes:?}"
    );
    assert!(stdout.contains("rebuild_versions_per_s = "), "{stdout}");
    let md = std::fs::read_to_string(out_dir.path().join("report.md")).unwrap();
    assert!(md.contains("a_to_b_lost = 0 ·"), "{md}");
    assert!(md.contains("0 ≤ 0 ok"), "{md}");
    assert!(out_dir
        .path()
        .join("charts/kafka-store-a-to-b-latency.svg")
        .is_file());

    // without a broker it fails at once, saying what it needs; it is listed, not in `all`
    let out = run_meshql(
        &[
            "bench",
            "kafka-store",
            "--examples",
            examples_dir().to_str().unwrap(),
            "--quiet",
            "--out",
            tempfile::tempdir().unwrap().path().to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("give --kafka BROKERS"),
        "{}",
        text(&out.stdout)
    );
    let list = text(&run_meshql(&["bench", "list"], Duration::from_secs(30)).stdout);
    assert!(
        list.contains("kafka-store") && list.contains("except soak, legacy and kafka-store"),
        "{list}"
    );
}
