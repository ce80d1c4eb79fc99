//! The console (issue 13) through the binary: its JSON endpoints over HTTP, and the page in a
//! real headless Chromium driven over the W3C WebDriver protocol by `chromedriver` (Debian's
//! `chromium` and `chromium-driver`; `scripts/services/chromium.sh` installs them, and these
//! tests fail, saying so, when they are missing).
//!
//! The WebDriver client is the few commands below sent with reqwest (already a dev-dependency):
//! WebDriver is plain JSON over HTTP, and a driver crate would only wrap the same calls.
//!
//! Screenshots of every browser test land in `target/tmp/console-screenshots/` (the
//! test's `CARGO_TARGET_TMPDIR`); with `MESHQL_CONSOLE_DOCS_SCREENSHOT=1` the landing page's
//! is also written to `docs/console.png`, the README's.

mod common;

use base64::Engine;
use common::{bearer, examples_dir, free_port, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long anything the browser shows may take to appear.
const DEADLINE: Duration = Duration::from_secs(30);

/// Browser tests one at a time: each runs a Chromium, and the machine may have two cores.
static BROWSER: Mutex<()> = Mutex::new(());

const EGG_ECONOMY: [&str; 13] = [
    "farm",
    "coop",
    "hen",
    "container",
    "consumer",
    "lay_report",
    "storage_deposit",
    "storage_withdrawal",
    "container_transfer",
    "consumption_report",
    "container_inventory",
    "hen_productivity",
    "farm_output",
];

fn screenshots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshots directory");
    dir
}

/// With `MESHQL_CONSOLE_DOCS_SCREENSHOT=1`, copies a screenshot to `docs/<name>` (the
/// README shows them).
fn for_the_readme(shot: &Path, name: &str) {
    if std::env::var("MESHQL_CONSOLE_DOCS_SCREENSHOT").as_deref() == Ok("1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs")
            .join(name);
        std::fs::copy(shot, &docs).expect("copy the screenshot to docs/");
    }
}

fn egg_economy() -> Server {
    Server::start(&examples_dir().join("egg-economy"), &[])
}

// ---------------------------------------------------------------------------------------------
// HTTP with reqwest (blocking: the browser tests are plain threads)

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("reqwest client")
}

/// Sends `body` (JSON) and answers `(status, body as JSON or null)`.
fn send(
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    auth: Option<&str>,
) -> (u16, Value) {
    let mut req = http().request(method, url);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().expect("send a request to meshql");
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn post(server: &Server, path: &str, body: Value) -> Value {
    let (status, answer) = send(reqwest::Method::POST, &server.url(path), Some(&body), None);
    assert_eq!(status, 201, "POST {path} {body}: {answer}");
    answer
}

/// Creates the farm most tests start from, through REST; the answer.
fn emerdale(server: &Server) -> Value {
    post(
        server,
        "/farm/api",
        json!({"name": "Emerdale", "farm_type": "homestead", "zone": "north"}),
    )
}

fn get(server: &Server, path: &str, auth: Option<&str>) -> (u16, Value) {
    send(reqwest::Method::GET, &server.url(path), None, auth)
}

// ---------------------------------------------------------------------------------------------
// a minimal WebDriver client over chromedriver

fn program(env: &str, candidates: &[&str]) -> PathBuf {
    if let Ok(p) = std::env::var(env) {
        return PathBuf::from(p);
    }
    for c in candidates {
        if Path::new(c).exists() {
            return PathBuf::from(c);
        }
    }
    panic!(
        "the console tests need Chromium and chromedriver ({}) and found none of {candidates:?}: \
         run scripts/services/chromium.sh (Debian: apt-get install chromium chromium-driver), \
         or set {env}",
        candidates.join(", ")
    );
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Browser {
    driver: Child,
    http: reqwest::blocking::Client,
    /// `http://127.0.0.1:<port>/session/<id>`
    session: String,
    profile: tempfile::TempDir,
    test: &'static str,
    shots: usize,
}

impl Browser {
    fn start(test: &'static str) -> Browser {
        let chromium = program("MESHQL_TEST_CHROMIUM", &["/usr/bin/chromium"]);
        let chromedriver = program("MESHQL_TEST_CHROMEDRIVER", &["/usr/bin/chromedriver"]);
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()));
        let http = http();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = http
                .get(format!("{base}/status"))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == json!(true));
            if ready {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "chromedriver did not become ready on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().expect("a Chromium profile directory");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,900", "--no-first-run", "--lang=en-US",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .and_then(|r| r.json())
            .expect("create a WebDriver session");
        let id = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver refused the session: {resp}"))
            .to_owned();
        Browser {
            driver,
            http,
            session: format!("{base}/session/{id}"),
            profile,
            test,
            shots: 0,
        }
    }

    fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        } else if method == reqwest::Method::POST {
            req = req.json(&json!({}));
        }
        let resp = req.send().expect("talk to chromedriver");
        let status = resp.status();
        let v: Value = resp.json().expect("chromedriver answers JSON");
        assert!(status.is_success(), "WebDriver {method} {path}: {v}");
        v["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })));
    }

    /// Runs `body` (a function body: `return …`) in the page.
    fn js(&self, body: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": body, "args": args})),
        )
    }

    fn find(&self, css: &str) -> String {
        let v = self.command(
            reqwest::Method::POST,
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: not an element reference: {v}"))
            .to_owned()
    }

    fn click(&self, css: &str) {
        let id = self.find(css);
        self.command(reqwest::Method::POST, &format!("/element/{id}/click"), None);
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.command(reqwest::Method::POST, &format!("/element/{id}/clear"), None);
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Saves a screenshot as `<test>-<n>-<name>.png` and answers its path.
    fn screenshot(&mut self, name: &str) -> PathBuf {
        self.shots += 1;
        let png = self.command(reqwest::Method::GET, "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a base64 screenshot"))
            .expect("base64");
        let path = screenshots_dir().join(format!("{}-{}-{name}.png", self.test, self.shots));
        std::fs::write(&path, bytes).expect("write the screenshot");
        path
    }

    /// Polls the JavaScript expression `expr` until it is truthy (answering its value), for
    /// up to [`DEADLINE`]; then saves a screenshot and fails, showing the page's text.
    fn wait_for(&mut self, what: &str, expr: &str, args: Value) -> Value {
        let started = Instant::now();
        loop {
            let v = self.js(
                &format!("try {{ return ({expr}); }} catch (e) {{ return null; }}"),
                args.clone(),
            );
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if started.elapsed() > DEADLINE {
                let shot = self.screenshot("timeout");
                let text = self.js("return document.body.innerText", json!([]));
                panic!(
                    "{what}: not seen within {DEADLINE:?} (screenshot {}); the page shows:\n{}",
                    shot.display(),
                    text.as_str().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the console has rendered its current route.
    fn wait_ready(&mut self) {
        self.wait_for(
            "the console rendered",
            "document.body.dataset.ready === 'true'",
            json!([]),
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(&self.session).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = &self.profile;
    }
}

/// The text of the name cells of the open list.
const LIST_NAMES: &str = "Array.from(document.querySelectorAll('#documents tbody td[data-field=name]')).map((td) => td.textContent)";

// ---------------------------------------------------------------------------------------------
// the page in a browser

#[test]
fn the_landing_page_lists_the_13_egg_economy_entities() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    emerdale(&server);
    let farm = &get(&server, "/farm/api", None).1[0]["id"];
    let coop = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm, "capacity": 12, "coop_type": "a-frame"}),
    );
    for hen in ["chuck", "duck"] {
        post(
            &server,
            "/hen/api",
            json!({"name": hen, "coop_id": coop["id"], "breed": "leghorn"}),
        );
    }
    let mut b = Browser::start("landing");
    b.goto(&server.url("/"));
    b.wait_ready();
    let names = b.wait_for(
        "13 entity rows",
        "(() => { const rows = document.querySelectorAll('#entities tbody tr'); return rows.length === 13 && Array.from(rows).map((r) => r.dataset.entity); })()",
        json!([]),
    );
    assert_eq!(names, json!(EGG_ECONOMY));
    // each row: its count, storage, REST and GraphQL paths and links; health and readiness
    let farm = b.js(
        "const r = document.querySelector('#entities tr[data-entity=farm]'); return {count: r.querySelector('.count').textContent, text: r.textContent, links: Array.from(r.querySelectorAll('a')).map((a) => a.getAttribute('href'))}",
        json!([]),
    );
    assert_eq!(farm["count"], "1", "{farm}");
    let text = farm["text"].as_str().unwrap();
    assert!(text.contains("actors") && text.contains("sqlite"), "{text}");
    assert_eq!(
        farm["links"],
        json!(["#/e/farm", "/farm/api/api-docs", "/farm/graph"])
    );
    b.wait_for(
        "health and readiness",
        "document.querySelector('#health.ok') && document.querySelector('#ready.ok')",
        json!([]),
    );
    b.wait_for(
        "the change feed in the panel",
        "document.body.dataset.feed === 'live' && document.querySelector('#changes-list li[data-entity=farm]')",
        json!([]),
    );
    let shot = b.screenshot("landing");
    for_the_readme(&shot, "console.png");

    // GraphiQL opens with an example query for the entity: getById, its fields, a relationship
    b.click("#entities tr[data-entity=farm] a.graphiql");
    let editor = b.wait_for(
        "GraphiQL with the example query",
        "(() => { const t = document.querySelector('.graphiql-query-editor')?.innerText || ''; return t.includes('getById') && t; })()",
        json!([]),
    );
    let editor = editor.as_str().unwrap();
    for part in ["getById", "name", "farm_type", "coops"] {
        assert!(editor.contains(part), "{part} in {editor}");
    }
    b.screenshot("graphiql");

    // opened directly, GraphiQL starts from the same example (with a placeholder id) when the
    // browser keeps no query of its own (GraphiQL stores the last one per origin)
    // (cleared from another page of the origin: GraphiQL saves its state as it closes)
    b.goto(&server.url("/health"));
    b.js("localStorage.clear(); return true;", json!([]));
    b.goto(&server.url("/coop/graph"));
    let editor = b.wait_for(
        "GraphiQL's own example",
        "(() => { const t = document.querySelector('.graphiql-query-editor')?.innerText || ''; return t.includes('getById') && t; })()",
        json!([]),
    );
    let editor = editor.as_str().unwrap();
    for part in ["getById(id: \"an id\")", "capacity", "coop_type", "farm {"] {
        assert!(editor.contains(part), "{part} in {editor}");
    }
}

#[test]
fn the_landing_page_shows_each_processor_its_lag_and_its_dead_letters() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let hen = "00000000-0000-4000-8000-000000000001";
    let report = |eggs: i64, timestamp: &str| json!({"hen_id": hen, "coop_id": hen, "farm_id": hen, "eggs": eggs, "timestamp": timestamp});
    post(
        &server,
        "/lay_report/api",
        report(4, "2026-11-27T06:00:00Z"),
    );
    post(&server, "/lay_report/api", report(2, "the day after"));
    let mut b = Browser::start("processors");
    b.goto(&server.url("/"));
    b.wait_ready();
    let rows = b.wait_for(
        "three processors, one dead letter each for the projections of lay reports",
        "(() => { const rows = Array.from(document.querySelectorAll('#processors tbody tr')); \
          const dead = (n) => rows.find((r) => r.dataset.processor === n)?.querySelector('.dead')?.textContent; \
          return rows.length === 3 && dead('hen_productivity') === '1' && dead('farm_output') === '1' \
            && rows.map((r) => [r.dataset.processor, r.textContent]); })()",
        json!([]),
    );
    let text = rows.to_string();
    for part in [
        "hen_productivity",
        "farm_output",
        "container_inventory",
        "lay_report → hen_productivity",
    ] {
        assert!(text.contains(part), "{part} in {text}");
    }
    let letters = b.wait_for(
        "the dead letters with their reasons",
        "(() => { const t = document.querySelector('#dead-letters')?.textContent || ''; return t.includes('not a time') && t; })()",
        json!([]),
    );
    assert!(
        letters.as_str().unwrap().contains("the day after"),
        "{letters}"
    );
    b.screenshot("processors");
    // the projection itself counts the good report
    let (_, docs) = get(&server, "/hen_productivity/api", None);
    assert_eq!(docs[0]["total_eggs"], 4, "{docs}");
}

#[test]
fn creating_a_farm_through_the_form_shows_it_in_the_list() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let mut b = Browser::start("create");
    b.goto(&server.url("/#/e/farm"));
    b.wait_ready();
    b.click("#new-document");
    b.wait_for(
        "the farm form",
        "document.querySelector('#document-form [name=zone]')",
        json!([]),
    );
    // the form follows the JSON Schema: every property but id, the enum as a choice
    let fields = b.js(
        "return Array.from(document.querySelectorAll('#document-form .field')).map((f) => f.dataset.field)",
        json!([]),
    );
    assert_eq!(fields, json!(["name", "farm_type", "zone", "owner"]));
    b.type_into("#field-name", "Console Acres");
    b.click("#field-farm_type option[value='\"local_farm\"']");
    b.type_into("#field-zone", "east");
    b.screenshot("form");
    b.click("#save");
    // saved: the document page, then the list holds it
    let id = b.wait_for(
        "the new farm's page",
        "(() => { const m = location.hash.match(/^#\\/e\\/farm\\/d\\/([^/?]+)$/); return m && document.querySelector('#document tr[data-field=name] td')?.textContent === 'Console Acres' && m[1]; })()",
        json!([]),
    );
    let id = id.as_str().unwrap().to_owned();
    let (status, stored) = get(&server, &format!("/farm/api/{id}"), None);
    assert_eq!(status, 200);
    assert_eq!(
        stored,
        json!({"id": id, "name": "Console Acres", "farm_type": "local_farm", "zone": "east"})
    );
    b.screenshot("document");
    b.goto(&server.url("/#/e/farm"));
    b.wait_ready();
    b.wait_for(
        "the farm in the list",
        &format!("{LIST_NAMES}.includes('Console Acres')"),
        json!([]),
    );
    b.screenshot("list");
}

#[test]
fn the_list_pages_sorts_and_filters() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let farms: Vec<Value> = (0..25)
        .map(|n| json!({"name": format!("farm {n:02}"), "farm_type": "homestead", "zone": format!("z{}", n % 3)}))
        .collect();
    let (status, answer) = send(
        reqwest::Method::POST,
        &server.url("/farm/api/bulk"),
        Some(&Value::Array(farms)),
        None,
    );
    assert!(status < 300, "{status} {answer}");
    let mut b = Browser::start("table");
    b.goto(&server.url("/#/e/farm"));
    b.wait_ready();
    b.wait_for(
        "the first page",
        &format!("{LIST_NAMES}.length === 20 && document.querySelector('.pager').textContent.includes('page 1 of 2')"),
        json!([]),
    );
    // columns from the JSON Schema
    let head = b.js(
        "return Array.from(document.querySelectorAll('#documents th')).map((th) => th.dataset.column)",
        json!([]),
    );
    assert_eq!(
        head,
        json!(["id", "name", "farm_type", "zone", "owner", "@version"])
    );
    b.click(".pager button:last-child");
    b.wait_for(
        "the second page",
        &format!("{LIST_NAMES}.length === 5"),
        json!([]),
    );
    // sorted by name, descending
    b.click("#documents th[data-column=name]");
    b.click("#documents th[data-column=name]");
    b.wait_for(
        "names in descending order, first page",
        &format!("{LIST_NAMES}[0] === 'farm 24' && {LIST_NAMES}[19] === 'farm 05'"),
        json!([]),
    );
    b.type_into("#filter", "farm 1");
    let names = b.wait_for(
        "the filtered rows",
        &format!("(() => {{ const n = {LIST_NAMES}; return n.length === 10 && n; }})()"),
        json!([]),
    );
    let expected: Vec<String> = (10..20).rev().map(|n| format!("farm {n}")).collect();
    assert_eq!(names, json!(expected));
    b.screenshot("sorted-filtered");
}

#[test]
fn editing_and_deleting_write_versions_shown_in_the_history() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let farm = emerdale(&server);
    let id = farm["id"].as_str().unwrap().to_owned();
    let mut b = Browser::start("edit");
    b.goto(&server.url(&format!("/#/e/farm/d/{id}")));
    b.wait_ready();
    b.click("#edit-document");
    b.wait_for(
        "the form with the stored values",
        "document.querySelector('#field-name')?.value === 'Emerdale' && document.querySelector('#field-farm_type').value === '\"homestead\"'",
        json!([]),
    );
    b.type_into("#field-name", "Emerdale Hall");
    b.click("#save");
    b.wait_for(
        "the new version and its change in the history",
        "document.querySelector('#document tr[data-field=name] td')?.textContent === 'Emerdale Hall' && document.querySelectorAll('#history li.version').length === 2 && document.querySelector('#history li.updated .changed')?.textContent",
        json!([]),
    );
    let change = b.js(
        "return document.querySelector('#history li.updated .changed').textContent",
        json!([]),
    );
    assert_eq!(change, json!("name: Emerdale → Emerdale Hall"));
    // delete (the browser's confirmation answered yes): a tombstone, the history kept
    b.js("window.confirm = () => true; return true;", json!([]));
    b.click("#delete-document");
    b.wait_for(
        "the tombstone",
        "document.querySelector('#absent') && document.querySelectorAll('#history li.version').length === 3 && document.querySelector('#history li.deleted')",
        json!([]),
    );
    let (status, _) = get(&server, &format!("/farm/api/{id}"), None);
    assert_eq!(status, 404);
    b.screenshot("history");
}

#[test]
fn a_schema_violation_shows_the_servers_message_next_to_the_field() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let farm = emerdale(&server);
    let farm_id = farm["id"].as_str().unwrap();
    // what the server says of this coop: capacity below its minimum, coop_type missing
    let bad = json!({"name": "tiny", "farm_id": farm_id, "capacity": 0});
    let (status, answer) = send(
        reqwest::Method::POST,
        &server.url("/coop/api"),
        Some(&bad),
        None,
    );
    assert_eq!(status, 400, "{answer}");
    let message = |pred: &dyn Fn(&Value) -> bool| -> String {
        answer["details"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| pred(d))
            .unwrap_or_else(|| panic!("{answer}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let capacity = message(&|d| d["path"] == "/capacity");
    let coop_type = message(&|d| d["message"].as_str().unwrap().contains("coop_type"));

    let mut b = Browser::start("violation");
    b.goto(&server.url("/#/e/coop/new"));
    b.wait_ready();
    b.type_into("#field-name", "tiny");
    b.type_into("#field-farm_id", farm_id);
    b.type_into("#field-capacity", "0");
    b.click("#save");
    let shown = b.wait_for(
        "the server's messages beside the fields",
        "(() => { const f = document.querySelector('#document-form'); return f && f.dataset.failed && {capacity: f.querySelector('.field-error[data-field=capacity]').textContent, coop_type: f.querySelector('.field-error[data-field=coop_type]').textContent}; })()",
        json!([]),
    );
    assert_eq!(shown["capacity"], json!(capacity), "{shown}");
    assert_eq!(shown["coop_type"], json!(coop_type), "{shown}");
    b.screenshot("violation");
    // nothing was written
    let (_, list) = get(&server, "/coop/api", None);
    assert_eq!(list, json!([]));
}

#[test]
fn the_time_control_shows_the_old_name_of_a_renamed_coop() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let farm = emerdale(&server);
    let farm_id = farm["id"].as_str().unwrap();
    let coop = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm_id, "capacity": 12, "coop_type": "a-frame"}),
    );
    let coop_id = coop["id"].as_str().unwrap();
    let hen = post(
        &server,
        "/hen/api",
        json!({"name": "chuck", "coop_id": coop_id, "breed": "leghorn"}),
    );
    let hen_id = hen["id"].as_str().unwrap();
    // the rename one millisecond later at least (stamps are milliseconds)
    let first = Instant::now();
    while first.elapsed() < Duration::from_millis(5) {
        std::thread::yield_now();
    }
    let (status, _) = send(
        reqwest::Method::PUT,
        &server.url(&format!("/coop/api/{coop_id}")),
        Some(
            &json!({"name": "purple", "farm_id": farm_id, "capacity": 12, "coop_type": "a-frame"}),
        ),
        None,
    );
    assert_eq!(status, 200);
    let (_, versions) = get(
        &server,
        &format!("/_meshql/console/api/entities/coop/documents/{coop_id}/versions"),
        None,
    );
    let red_at = versions["versions"][0]["created_at"].as_i64().unwrap();
    let purple_at = versions["versions"][1]["created_at"].as_i64().unwrap();
    assert!(red_at < purple_at, "{versions}");
    // a moment after the hen was added, before the rename
    let between = purple_at - 1;

    // the list: now purple; at the moment between, red
    let mut b = Browser::start("time");
    b.goto(&server.url("/#/e/coop"));
    b.wait_ready();
    b.wait_for(
        "the coop, renamed",
        &format!("JSON.stringify({LIST_NAMES}) === '[\"purple\"]'"),
        json!([]),
    );
    let set_at = "const input = document.getElementById('at-input'); const ms = arguments[0]; input.value = new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 23); input.dispatchEvent(new Event('change')); return true;";
    b.js(set_at, json!([between]));
    b.wait_for(
        "the coop's old name at the earlier moment",
        &format!("document.body.dataset.listAt === String(arguments[0]) && JSON.stringify({LIST_NAMES}) === '[\"red\"]'"),
        json!([between]),
    );
    b.screenshot("list-then");

    // the document at that moment, with its relationship read at the same moment
    b.click(&format!("#documents tr[data-id='{coop_id}'] a.doc-link"));
    let then = b.wait_for(
        "the coop's page as of the earlier moment",
        "(() => { const name = document.querySelector('#document tr[data-field=name] td')?.textContent; const farm = document.querySelector('.relationship[data-field=farm] a.rel-link'); const hen = document.querySelector('.relationship[data-field=hens] a.rel-link'); return document.body.dataset.at === String(arguments[0]) && name === 'red' && farm && hen && {name, farm: farm.getAttribute('href'), hen: hen.getAttribute('href'), versions: document.querySelectorAll('#history li.version').length}; })()",
        json!([between]),
    );
    assert_eq!(then["farm"], json!(format!("#/e/farm/d/{farm_id}")));
    assert_eq!(then["hen"], json!(format!("#/e/hen/d/{hen_id}")));
    assert_eq!(then["versions"], json!(2));
    let shot = b.screenshot("document-then");
    for_the_readme(&shot, "console-time-travel.png");

    // its farm at the same moment: the coop under it by its old name, and the hen in it
    // (relationships nested two deep, every level read as of the moment)
    b.click(".relationship[data-field=farm] a.rel-link");
    let nested = b.wait_for(
        "the farm's coops as of the earlier moment",
        "(() => { const coop = document.querySelector('.relationship[data-field=coops] li'); const hens = coop?.querySelector('.nested[data-field=hens]'); return document.body.dataset.at === String(arguments[0]) && hens && {coop: coop.querySelector('a.rel-link').textContent, hens: hens.textContent}; })()",
        json!([between]),
    );
    assert!(
        nested["coop"].as_str().unwrap().starts_with("red"),
        "{nested}"
    );
    assert_eq!(nested["hens"], json!("hens: chuck · leghorn"));
    b.screenshot("farm-then");
    b.goto(&server.url(&format!("/#/e/coop/d/{coop_id}")));
    b.wait_ready();

    // back to live: purple again
    b.click("#live-button");
    b.wait_for(
        "the coop's current name",
        "document.body.dataset.at === 'live' && document.querySelector('#document tr[data-field=name] td')?.textContent === 'purple'",
        json!([]),
    );
    // before the coop existed: nothing
    b.js(set_at, json!([red_at - 1]));
    b.wait_for(
        "no coop before its creation",
        "document.querySelector('#absent')",
        json!([]),
    );
}

#[test]
fn a_write_made_with_an_http_client_appears_in_an_open_list_without_reloading() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    emerdale(&server);
    let mut b = Browser::start("live");
    b.goto(&server.url("/#/e/farm"));
    b.wait_ready();
    b.wait_for(
        "the list and the live feed",
        &format!("document.body.dataset.feed === 'live' && {LIST_NAMES}.includes('Emerdale')"),
        json!([]),
    );
    // a mark that a reload would lose
    b.js("window.__notReloaded = true; return true;", json!([]));
    let farm = post(
        &server,
        "/farm/api",
        json!({"name": "Written with reqwest", "farm_type": "megafarm", "zone": "south"}),
    );
    let id = farm["id"].as_str().unwrap();
    b.wait_for(
        "the new farm in the open list",
        &format!("{LIST_NAMES}.includes('Written with reqwest')"),
        json!([]),
    );
    b.wait_for(
        "the new farm in the recent changes",
        "document.querySelector(`#changes-list li[data-id='${arguments[0]}']`)",
        json!([id]),
    );
    assert_eq!(
        b.js("return window.__notReloaded === true", json!([])),
        json!(true)
    );
    b.screenshot("live");

    // an open document follows its writes too: the new name, and a second version
    b.click(&format!("#documents tr[data-id='{id}'] a.doc-link"));
    b.wait_for(
        "the farm's page",
        "document.querySelector('#document tr[data-field=name] td')?.textContent === 'Written with reqwest'",
        json!([]),
    );
    b.js("window.__notReloaded = true; return true;", json!([]));
    let (status, _) = send(
        reqwest::Method::PUT,
        &server.url(&format!("/farm/api/{id}")),
        Some(&json!({"name": "Renamed with reqwest", "farm_type": "megafarm", "zone": "south"})),
        None,
    );
    assert_eq!(status, 200);
    b.wait_for(
        "the rename on the open page",
        "document.querySelector('#document tr[data-field=name] td')?.textContent === 'Renamed with reqwest' && document.querySelectorAll('#history li.version').length === 2 && window.__notReloaded === true",
        json!([]),
    );
}

#[test]
fn the_console_sends_the_token_and_shows_what_the_apis_would_return() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let (server, _dir) = jwt_farm();
    let alice = bearer("alice");
    for (who, name) in [(&alice, "alice's"), (&bearer("bob"), "bob's")] {
        let (status, _) = send(
            reqwest::Method::POST,
            &server.url("/farm/api"),
            Some(&json!({ "name": name })),
            Some(who),
        );
        assert_eq!(status, 201);
    }
    let mut b = Browser::start("token");
    b.goto(&server.url("/#/e/farm"));
    b.wait_ready();
    // without a token: only documents without tokens, i.e. none
    b.wait_for(
        "an empty list",
        "document.querySelector('#list-info')?.textContent.startsWith('0 documents')",
        json!([]),
    );
    b.type_into("#token-input", alice.trim_start_matches("Bearer "));
    b.click("#token-form button[type=submit]");
    b.wait_for(
        "alice's farm only",
        &format!("JSON.stringify({LIST_NAMES}) === '[\"alice\\'s\"]'"),
        json!([]),
    );
    b.screenshot("alice");

    // GraphiQL gets the token too: its example query finds alice's farm
    b.click("a.graphiql");
    b.wait_for(
        "GraphiQL with the example query",
        "document.querySelector('.graphiql-query-editor')?.innerText.includes('getById')",
        json!([]),
    );
    b.click(".graphiql-execute-button");
    b.wait_for(
        "alice's farm in GraphiQL's answer",
        "document.querySelector('.result-window')?.innerText.includes(\"alice's\")",
        json!([]),
    );
    b.screenshot("graphiql-token");
}

/// GraphiQL runs a subscription (over graphql-sse): the answer pane shows the event of a
/// write made afterwards with another client.
#[test]
fn graphiql_runs_a_subscription_and_shows_its_events() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::example_copy("farm", |t| t);
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let farm = post(&server, "/farm/api", json!({"name": "Emerdale"}));
    let coop = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm["id"]}),
    );
    let coop_id = coop["id"].as_str().unwrap().to_owned();
    let query = format!(r#"subscription {{ getByCoop(id: "{coop_id}") {{ name eggs }} }}"#);
    let mut b = Browser::start("subscription");
    let fragment: String = url_escape(&query);
    b.goto(&server.url(&format!("/hen/graph#query={fragment}")));
    b.wait_for(
        "GraphiQL with the subscription",
        "document.querySelector('.graphiql-query-editor')?.innerText.includes('subscription')",
        json!([]),
    );
    b.click(".graphiql-execute-button");
    // the stream is open once the server counts it
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let metrics = http()
            .get(server.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        if metrics.lines().any(|l| l == "meshql_subscriptions 1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "GraphiQL never subscribed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    post(
        &server,
        "/hen/api",
        json!({"name": "Subscribed Sally", "coop_id": coop_id, "eggs": 4}),
    );
    b.wait_for(
        "the event in GraphiQL's answer",
        "document.querySelector('.result-window')?.innerText.includes('Subscribed Sally')",
        json!([]),
    );
    b.screenshot("graphiql-subscription");
}

/// `text` escaped for a URL fragment.
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// the JSON endpoints

fn jwt_farm() -> (Server, tempfile::TempDir) {
    let dir = common::example_copy("farm", |t| {
        t.replacen(
            "\n[storage.",
            &format!(
                "\n[auth]\ntype = \"jwt\"\nsecret = \"{}\"\n\n[storage.",
                common::JWT_SECRET
            ),
            1,
        )
    });
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    (server, dir)
}

#[test]
fn the_service_endpoint_describes_every_entity_with_its_count() {
    let server = egg_economy();
    for name in ["a", "b"] {
        post(
            &server,
            "/farm/api",
            json!({"name": name, "farm_type": "homestead", "zone": "north"}),
        );
    }
    let (status, service) = get(&server, "/_meshql/console/api/service", None);
    assert_eq!(status, 200);
    let entities = service["entities"].as_array().unwrap();
    let names: Vec<&str> = entities
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, EGG_ECONOMY);
    let farm = &entities[0];
    assert_eq!(farm["count"], 2);
    assert_eq!(farm["count_capped"], false);
    assert_eq!(farm["storage"], "actors");
    assert_eq!(farm["backend"], "sqlite");
    assert_eq!(farm["rest"]["path"], "/farm/api");
    assert_eq!(farm["rest"]["docs"], "/farm/api/api-docs");
    assert_eq!(
        farm["rest"]["schema"]["required"],
        json!(["name", "farm_type", "zone"])
    );
    assert_eq!(farm["graphql"]["path"], "/farm/graph");
    assert_eq!(farm["graphql"]["type"], "Farm");
    let coops = farm["graphql"]["resolvers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["field"] == "coops")
        .expect("the coops relationship");
    assert_eq!(coops["entity"], "coop");
    assert_eq!(coops["graph"], "/coop/graph");
    assert_eq!(coops["vector"], true);
    assert_eq!(service["changes"], "/_changes");
    assert_eq!(entities[1]["count"], 0);

    // the page and its assets
    let page = http().get(server.url("/")).send().unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let html = page.text().unwrap();
    assert!(html.contains("/_meshql/console/assets/console.js"));
    for asset in ["console.js", "console.css"] {
        let r = http()
            .get(server.url(&format!("/_meshql/console/assets/{asset}")))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{asset}");
    }
    let (status, _) = get(&server, "/_meshql/console/assets/nothing.js", None);
    assert_eq!(status, 404);
}

#[test]
fn documents_at_a_moment_and_versions_with_tombstones() {
    let server = egg_economy();
    let farm = post(
        &server,
        "/farm/api",
        json!({"name": "first", "farm_type": "homestead", "zone": "north"}),
    );
    let id = farm["id"].as_str().unwrap().to_owned();
    let versions_path = format!("/_meshql/console/api/entities/farm/documents/{id}/versions");
    let (_, v1) = get(&server, &versions_path, None);
    let created = v1["versions"][0]["created_at"].as_i64().unwrap();
    let later = Instant::now();
    while later.elapsed() < Duration::from_millis(5) {
        std::thread::yield_now();
    }
    let (status, _) = send(
        reqwest::Method::PUT,
        &server.url(&format!("/farm/api/{id}")),
        Some(&json!({"name": "second", "farm_type": "homestead", "zone": "north"})),
        None,
    );
    assert_eq!(status, 200);
    let (status, _) = send(
        reqwest::Method::DELETE,
        &server.url(&format!("/farm/api/{id}")),
        None,
        None,
    );
    assert_eq!(status, 200);

    let (status, history) = get(&server, &versions_path, None);
    assert_eq!(status, 200, "{history}");
    let versions = history["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 3, "{history}");
    assert_eq!(versions[0]["payload"]["name"], "first");
    assert_eq!(versions[1]["payload"]["name"], "second");
    assert_eq!(
        versions
            .iter()
            .map(|v| v["deleted"].clone())
            .collect::<Vec<_>>(),
        [json!(false), json!(false), json!(true)]
    );

    // the list now (deleted: absent) and as of the first version
    let docs = "/_meshql/console/api/entities/farm/documents";
    let (_, now) = get(&server, docs, None);
    assert_eq!(now["documents"], json!([]));
    let (_, then) = get(&server, &format!("{docs}?at={created}"), None);
    assert_eq!(then["at"], created);
    assert_eq!(then["documents"][0]["id"], json!(id));
    assert_eq!(then["documents"][0]["payload"]["name"], "first");
    assert_eq!(then["documents"][0]["created_at"], created);
    let (_, before) = get(&server, &format!("{docs}?at={}", created - 1), None);
    assert_eq!(before["documents"], json!([]));

    // pages
    for n in 0..3 {
        post(
            &server,
            "/farm/api",
            json!({"name": format!("p{n}"), "farm_type": "homestead", "zone": "north"}),
        );
    }
    let (_, page) = get(&server, &format!("{docs}?limit=2"), None);
    assert_eq!(page["documents"].as_array().unwrap().len(), 2);
    let next = page["next"].as_str().unwrap();
    let (_, rest) = get(&server, &format!("{docs}?limit=2&after={next}"), None);
    assert_eq!(rest["documents"].as_array().unwrap().len(), 1);
    assert_eq!(rest["next"], Value::Null);

    // refusals
    for (path, status) in [
        (format!("{docs}?at=yesterday"), 400),
        (format!("{docs}?limit=0"), 400),
        (format!("{docs}?sort=name"), 400),
        (
            "/_meshql/console/api/entities/nothing/documents".into(),
            404,
        ),
        (
            "/_meshql/console/api/entities/farm/documents/no-such-id/versions".into(),
            404,
        ),
    ] {
        let (s, body) = get(&server, &path, None);
        assert_eq!(s, status, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
}

#[test]
fn the_endpoints_filter_by_the_callers_token() {
    let (server, _dir) = jwt_farm();
    let alice = bearer("alice");
    let bob = bearer("bob");
    let (_, farm) = send(
        reqwest::Method::POST,
        &server.url("/farm/api"),
        Some(&json!({"name": "alice's"})),
        Some(&alice),
    );
    let id = farm["id"].as_str().unwrap();
    let service = |auth: Option<&str>| {
        let (status, s) = get(&server, "/_meshql/console/api/service", auth);
        assert_eq!(status, 200, "{s}");
        s["entities"][0]["count"].clone()
    };
    assert_eq!(service(Some(&alice)), 1);
    assert_eq!(service(Some(&bob)), 0);
    assert_eq!(service(None), 0);
    let docs = "/_meshql/console/api/entities/farm/documents";
    assert_eq!(get(&server, docs, Some(&alice)).1["documents"][0]["id"], id);
    assert_eq!(get(&server, docs, Some(&bob)).1["documents"], json!([]));
    let versions = format!("/_meshql/console/api/entities/farm/documents/{id}/versions");
    assert_eq!(get(&server, &versions, Some(&alice)).0, 200);
    assert_eq!(get(&server, &versions, Some(&bob)).0, 404);
    // a refused token is a 401, as on REST
    let (status, body) = get(&server, docs, Some("Bearer not-a-jwt"));
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "UNAUTHENTICATED");
}

#[test]
fn the_console_can_move_or_be_turned_off() {
    let moved = common::example_copy("farm", |t| format!("{t}\n[console]\npath = \"/console\"\n"));
    let server = Server::start(&moved.path().join("meshql.toml"), &[]);
    assert_eq!(
        http().get(server.url("/console")).send().unwrap().status(),
        200
    );
    assert_eq!(get(&server, "/", None).0, 404);
    drop(server);

    let off = common::example_copy("farm", |t| format!("{t}\n[console]\nenabled = false\n"));
    let server = Server::start(&off.path().join("meshql.toml"), &[]);
    assert_eq!(get(&server, "/", None).0, 404);
    assert_eq!(get(&server, "/_meshql/console/api/service", None).0, 404);
    drop(server);

    // a path an entity serves is refused by `meshql check`
    let clash = common::example_copy("farm", |t| {
        format!("{t}\n[console]\npath = \"/farm/api\"\n")
    });
    let out = common::run_meshql(
        &["check", clash.path().to_str().unwrap()],
        Duration::from_secs(30),
    );
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("console.path"), "{text}");
}

/// The landing page lists the service's backups with their size and the command that
/// restores each, and takes one more with a click.
#[test]
fn the_landing_page_lists_backups_and_takes_one() {
    let _one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let server = egg_economy();
    let taken = send(
        reqwest::Method::POST,
        &server.url("/_meshql/backup"),
        None,
        None,
    );
    assert_eq!(taken.0, 201, "{}", taken.1);
    let mut b = Browser::start("backups");
    b.goto(&server.url("/"));
    b.wait_ready();
    let first = b.wait_for(
        "one backup, with its size and restore command",
        "(() => { const rows = Array.from(document.querySelectorAll('#backups tbody tr')); \
          return rows.length === 1 && rows[0].textContent; })()",
        json!([]),
    );
    let text = first.as_str().unwrap();
    assert!(text.contains("meshql restore"), "{text}");
    assert!(text.contains("KiB") || text.contains("MiB"), "{text}");
    b.click("#take-backup");
    b.wait_for(
        "a second backup after the click",
        "(() => document.querySelectorAll('#backups tbody tr').length === 2)()",
        json!([]),
    );
    b.screenshot("backups");
}
