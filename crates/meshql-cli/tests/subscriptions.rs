//! GraphQL subscriptions through the binary (issue 21 §4), on the farm example (whose hen SDL
//! declares `Subscription { getById getByCoop }`) with its relationships in process:
//! graphql-transport-ws over a real WebSocket and graphql-sse over an event stream; events
//! follow the changes their root query matches, with the selection's relationships; resuming
//! after a position; disconnects free the subscription; a subscriber that stops reading is
//! dropped and counted; and the caller's grants decide, as for every read — also for callers
//! with different grants on the same subscription at once, over both transports (each cohort
//! sees only its own events, fields and departures; refused credentials get no stream).

mod common;

use common::{bearer_with, Server};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The farm example with in-process relationships, and `extra` appended to its config.
fn farm(extra: &str) -> tempfile::TempDir {
    let extra = extra.to_owned();
    common::example_copy("farm", move |mut text| {
        for graph in ["coop", "farm", "hen", "lay_report"] {
            text = text.replace(
                &format!("url = \"${{PLATFORM_URL:-http://localhost:3033}}/{graph}/graph\""),
                &format!("graph = \"/{graph}/graph\""),
            );
        }
        text + &extra
    })
}

async fn connect(server: &Server, auth: Option<&str>) -> Socket {
    let mut request = format!("ws://127.0.0.1:{}/hen/graph", server.port())
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "graphql-transport-ws"
    );
    let init = match auth {
        Some(a) => json!({"type": "connection_init", "payload": {"Authorization": a}}),
        None => json!({"type": "connection_init"}),
    };
    send(&mut socket, init).await;
    assert_eq!(receive(&mut socket).await["type"], "connection_ack");
    socket
}

async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
}

/// The next JSON message (10 s at most).
async fn receive(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

/// Whether no message arrives within `wait`.
async fn silent(socket: &mut Socket, wait: Duration) -> bool {
    tokio::time::timeout(wait, socket.next()).await.is_err()
}

/// `meshql_subscriptions` in `/metrics`.
async fn open_subscriptions(server: &Server) -> u64 {
    metric(server, "meshql_subscriptions").await
}

async fn metric(server: &Server, name: &str) -> u64 {
    let text = server.client().get("/metrics").await.text;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

/// Waits until the change log holds `n` changes.
async fn until_in_feed(server: &Server, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = server.client().get("/_changes?limit=1000").await;
        if page.status == 200 && page.json()["changes"].as_array().unwrap().len() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} changes in the feed within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `/metrics` counts `n` open subscriptions.
async fn until_open(server: &Server, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_subscriptions(server).await != n {
        assert!(Instant::now() < deadline, "{n} subscriptions never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(server: &Server, path: &str, body: Value) -> String {
    let r = server.client().post_json(path, &body).await;
    r.expect_status(201);
    r.json()["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_subscriptions_follow_the_changes_their_query_matches() {
    let dir = farm("");
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let farm = post(&server, "/farm/api", json!({"name": "Emerdale"})).await;
    let red = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm}),
    )
    .await;
    let blue = post(
        &server,
        "/coop/api",
        json!({"name": "blue", "farm_id": farm}),
    )
    .await;

    let mut ws = connect(&server, None).await;
    send(&mut ws, json!({"type": "ping"})).await;
    assert_eq!(receive(&mut ws).await["type"], "pong");
    send(
        &mut ws,
        json!({"id": "reds", "type": "subscribe", "payload": {
            "query": "subscription ($coop: ID) { getByCoop(id: $coop) { name eggs coop { name } } }",
            "variables": {"coop": red},
        }}),
    )
    .await;
    until_open(&server, 1).await;

    // a hen of another coop is no event for this subscription; one of the red coop is, with
    // its relationship resolved
    post(
        &server,
        "/hen/api",
        json!({"name": "bluebell", "coop_id": blue, "eggs": 1}),
    )
    .await;
    let hen = post(
        &server,
        "/hen/api",
        json!({"name": "ruby", "coop_id": red, "eggs": 2}),
    )
    .await;
    let event = receive(&mut ws).await;
    assert_eq!(event["id"], "reds", "{event}");
    assert_eq!(event["type"], "next", "{event}");
    let payload = &event["payload"];
    assert_eq!(
        payload["data"]["getByCoop"],
        json!([{"name": "ruby", "eggs": 2, "coop": {"name": "red"}}]),
        "{event}"
    );
    assert_eq!(payload["extensions"]["change"]["op"], "create");
    assert_eq!(payload["extensions"]["change"]["id"], json!(hen));
    assert!(
        payload["extensions"]["change"]["position"]
            .as_u64()
            .unwrap()
            > 0
    );

    // an update and a delete of the hen are events too; a delete answers nothing
    server
        .client()
        .put_json(
            &format!("/hen/api/{hen}"),
            &json!({"name": "ruby", "coop_id": red, "eggs": 5}),
        )
        .await
        .expect_status(200);
    let event = receive(&mut ws).await;
    assert_eq!(
        event["payload"]["data"]["getByCoop"][0]["eggs"], 5,
        "{event}"
    );
    assert_eq!(event["payload"]["extensions"]["change"]["op"], "update");
    assert!(event["payload"]["extensions"]["change"]
        .get("departed")
        .is_none());

    // moved to the blue coop, the hen leaves the query's match: a departure (the field
    // answers nothing); updates while it is away are no events; moved back, it is one again
    let put = |body: Value| {
        let (c, path) = (server.client(), format!("/hen/api/{hen}"));
        async move {
            c.put_json(&path, &body).await.expect_status(200);
        }
    };
    put(json!({"name": "ruby", "coop_id": blue, "eggs": 5})).await;
    let event = receive(&mut ws).await;
    assert_eq!(event["payload"]["data"]["getByCoop"], json!([]), "{event}");
    let change = &event["payload"]["extensions"]["change"];
    assert_eq!(
        (&change["op"], &change["departed"], &change["id"]),
        (&json!("update"), &json!(true), &json!(hen)),
        "{event}"
    );
    put(json!({"name": "ruby", "coop_id": blue, "eggs": 6})).await;
    assert!(silent(&mut ws, Duration::from_millis(300)).await);
    put(json!({"name": "ruby", "coop_id": red, "eggs": 6})).await;
    let event = receive(&mut ws).await;
    assert_eq!(
        event["payload"]["data"]["getByCoop"][0]["eggs"], 6,
        "{event}"
    );
    assert!(event["payload"]["extensions"]["change"]
        .get("departed")
        .is_none());
    server
        .client()
        .delete(&format!("/hen/api/{hen}"))
        .await
        .expect_status(200);
    let event = receive(&mut ws).await;
    assert_eq!(event["payload"]["data"]["getByCoop"], json!([]), "{event}");
    assert_eq!(event["payload"]["extensions"]["change"]["op"], "delete");

    // complete ends it: nothing more arrives, and the subscription is freed
    send(&mut ws, json!({"id": "reds", "type": "complete"})).await;
    until_open(&server, 0).await;
    post(&server, "/hen/api", json!({"name": "late", "coop_id": red})).await;
    assert!(silent(&mut ws, Duration::from_millis(300)).await);

    // a query over the socket is answered once, then complete
    send(
        &mut ws,
        json!({"id": "q", "type": "subscribe", "payload": {
            "query": format!(r#"{{ getByCoop(id: "{red}") {{ name }} }}"#)
        }}),
    )
    .await;
    let answer = receive(&mut ws).await;
    assert_eq!(answer["type"], "next");
    assert_eq!(answer["payload"]["data"]["getByCoop"][0]["name"], "late");
    assert_eq!(
        receive(&mut ws).await,
        json!({"id": "q", "type": "complete"})
    );

    // a field that names no bound query, and a document that does not validate: errors
    send(
        &mut ws,
        json!({"id": "bad", "type": "subscribe", "payload": {"query": "subscription { nothing { name } }"}}),
    )
    .await;
    let error = receive(&mut ws).await;
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["id"], "bad");
    assert!(error["payload"][0]["message"].as_str().is_some(), "{error}");

    // a subscription over a plain POST is refused with a pointer to the transports
    let r = server
        .client()
        .post_json(
            "/hen/graph",
            &json!({"query": "subscription { getById(id: \"x\") { name } }"}),
        )
        .await;
    assert!(r.text.contains("graphql-transport-ws"), "{}", r.text);

    // a second subscription on the same id is a protocol error (4409); closing frees all
    send(
        &mut ws,
        json!({"id": "a", "type": "subscribe", "payload": {"query": "subscription { getById(id: \"x\") { name } }"}}),
    )
    .await;
    until_open(&server, 1).await;
    send(
        &mut ws,
        json!({"id": "a", "type": "subscribe", "payload": {"query": "subscription { getById(id: \"x\") { name } }"}}),
    )
    .await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Close(frame) = m {
                return frame.map(|f| u16::from(f.code));
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(closed, Some(4409));
    until_open(&server, 0).await;
}

/// The complete frames of an event stream read so far: (id, event, data).
fn frames(text: &str) -> Vec<(Option<u64>, String, String)> {
    let complete = text.rfind("\n\n").map_or("", |end| &text[..end]);
    complete
        .split("\n\n")
        .filter(|f| f.contains("event: "))
        .map(|f| {
            let mut id = None;
            let mut event = String::new();
            let mut data = String::new();
            for line in f.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = v.to_owned();
                }
            }
            (id, event, data)
        })
        .collect()
}

/// Reads an event stream until it holds `n` `next` events (10 s at most).
async fn read_events(
    response: &mut reqwest::Response,
    text: &mut String,
    n: usize,
) -> Vec<(Option<u64>, Value)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<(Option<u64>, Value)> = frames(text)
            .into_iter()
            .filter(|(_, e, _)| e == "next")
            .map(|(id, _, data)| (id, serde_json::from_str(&data).unwrap()))
            .collect();
        if events.len() >= n {
            return events;
        }
        read_more(response, text, deadline, &format!("{n} events")).await;
    }
}

async fn open_stream(
    server: &Server,
    query: &str,
    last_event_id: Option<u64>,
    auth: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(server.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .json(&json!({ "query": query }));
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    if let Some(a) = auth {
        request = request.header("authorization", a);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_resume_after_a_position_and_slow_subscribers_are_dropped() {
    let dir = farm("");
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let farm = post(&server, "/farm/api", json!({"name": "Emerdale"})).await;
    let red = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm}),
    )
    .await;
    let hen = post(&server, "/hen/api", json!({"name": "v1", "coop_id": red})).await;
    // the hub copies an acknowledged write into the log a moment later: a subscription opened
    // before that would take the create for a new change
    until_in_feed(&server, 3).await;
    let by_id = format!(r#"subscription {{ getById(id: "{hen}") {{ name coop {{ name }} }} }}"#);
    let put = |name: &'static str| {
        let c = server.client();
        let (hen, red) = (hen.clone(), red.clone());
        async move {
            c.put_json(
                &format!("/hen/api/{hen}"),
                &json!({"name": name, "coop_id": red}),
            )
            .await
            .expect_status(200);
        }
    };

    let mut stream = open_stream(&server, &by_id, None, None).await;
    until_open(&server, 1).await;
    put("v2").await;
    put("v3").await;
    let mut text = String::new();
    let events = read_events(&mut stream, &mut text, 2).await;
    assert_eq!(
        events[0].1["data"]["getById"],
        json!({"name": "v2", "coop": {"name": "red"}})
    );
    assert_eq!(events[1].1["data"]["getById"]["name"], "v3");
    let after_v2 = events[0].0.expect("events carry their position as id");
    assert!(events[1].0.unwrap() > after_v2);
    drop(stream);
    until_open(&server, 0).await;

    // missed while away: v3 (already seen after v2) and v4; resuming after v2 gets both,
    // then the live v5
    put("v4").await;
    let mut stream = open_stream(&server, &by_id, Some(after_v2), None).await;
    until_open(&server, 1).await;
    put("v5").await;
    let mut text = String::new();
    let events = read_events(&mut stream, &mut text, 3).await;
    let names: Vec<&str> = events
        .iter()
        .map(|(_, e)| e["data"]["getById"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v3", "v4", "v5"], "each change once, in order");
    drop(stream);
    until_open(&server, 0).await;

    // a subscriber that stops reading: its queue fills while hens of 10 KB names are
    // written, it is dropped and counted, and the others are not held up
    let by_coop = format!(r#"subscription {{ getByCoop(id: "{red}") {{ name }} }}"#);
    let mut slow = open_stream(&server, &by_coop, None, None).await;
    let mut fast = open_stream(&server, &by_coop, None, None).await;
    until_open(&server, 2).await;
    let big = "x".repeat(10_000);
    let mut fast_text = String::new();
    let mut seen = 0;
    let mut batches = 0;
    while metric(&server, "meshql_subscription_dropped_total").await == 0 {
        batches += 1;
        assert!(batches <= 200, "the slow subscriber was never dropped");
        let hens: Vec<Value> = (0..50)
            .map(|i| json!({"name": format!("{big}{i}"), "coop_id": red}))
            .collect();
        server
            .client()
            .post_json("/hen/api/bulk", &Value::Array(hens))
            .await
            .expect_status(201);
        seen += 50;
        read_events(&mut fast, &mut fast_text, seen).await;
    }
    until_open(&server, 1).await;
    // the slow one, read at last: what was buffered, then the error and the end
    let mut slow_text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !slow_text.contains("event: complete") {
        assert!(Instant::now() < deadline, "the slow stream never ended");
        match tokio::time::timeout(Duration::from_secs(10), slow.chunk()).await {
            Ok(Ok(Some(chunk))) => slow_text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    assert!(
        slow_text.contains("SLOW_SUBSCRIBER"),
        "the dropped stream says why"
    );
    drop((fast, slow));
    until_open(&server, 0).await;

    // shutting down ends every stream, saying so
    let mut open = open_stream(&server, &by_id, None, None).await;
    until_open(&server, 1).await;
    server.signal("TERM");
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text.contains("event: complete") {
        assert!(Instant::now() < deadline, "the stream never ended: {text}");
        match tokio::time::timeout(Duration::from_secs(10), open.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    assert!(text.contains("shutting down"), "{text}");
}

/// The farm example with JWT roles from `roles`: readers may read hens without `eggs`, and
/// coops; editors do anything to hens, coops and farms; a caller without a token may create
/// hens (whose authorized tokens are then none: every reader sees them).
fn farm_with_roles() -> tempfile::TempDir {
    let auth = format!(
        "\n[auth]\ntype = \"jwt\"\nsecret = \"{}\"\nroles_claim = \"roles\"\n",
        common::JWT_SECRET
    );
    let dir = farm(&auth);
    let config = dir.path().join("meshql.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    for (entity, table) in [
        ("hen", "[entity.permissions.reader]\nactions = [\"read\"]\nhidden_fields = [\"eggs\"]\n[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]\n[entity.permissions.anonymous]\nactions = [\"create\"]"),
        ("coop", "[entity.permissions.reader]\nactions = [\"read\"]\n[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]"),
        ("farm", "[entity.permissions.editor]\nactions = [\"read\", \"create\", \"update\", \"delete\"]"),
    ] {
        let anchor = format!("name = \"{entity}\"\nstorage = \"farm\"\n");
        assert!(text.contains(&anchor));
        text = text.replace(&anchor, &format!("{anchor}{table}\n"));
    }
    std::fs::write(&config, text).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_grants_and_tokens_decide_what_a_subscription_sees() {
    let dir = farm_with_roles();
    let config = dir.path().join("meshql.toml");
    let server = Server::start(&config, &[]);
    let editor = bearer_with(&json!({"sub": "ed", "roles": ["editor"]}));
    let other_editor = bearer_with(&json!({"sub": "eve", "roles": ["editor"]}));
    // the reader's subject is the editor's: it may see what `ed` writes (tokens)
    let reader = bearer_with(&json!({"sub": "ed", "roles": ["reader"]}));
    let nobody = bearer_with(&json!({"sub": "ed", "roles": []}));
    let c = server.client();
    let call = |path: &str, body: Value, auth: &str| {
        let c = c.clone();
        let (path, auth) = (path.to_owned(), auth.to_owned());
        async move {
            let r = c
                .request(
                    "POST",
                    &path,
                    Some(body.to_string().into_bytes()),
                    &[("authorization", auth.as_str())],
                )
                .await;
            r.expect_status(201);
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let farm = call("/farm/api", json!({"name": "F"}), &editor).await;
    let red = call(
        "/coop/api",
        json!({"name": "red", "farm_id": farm}),
        &editor,
    )
    .await;
    let query =
        format!(r#"subscription {{ getByCoop(id: "{red}") {{ name eggs coop {{ name }} }} }}"#);

    // a caller who may not read hens is refused at subscribe time
    let mut ws = connect(&server, Some(&nobody)).await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": {"query": query}}),
    )
    .await;
    let refused = receive(&mut ws).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(
        refused["payload"][0]["extensions"]["code"], "FORBIDDEN",
        "{refused}"
    );

    // the reader: `eggs` null with FORBIDDEN at its path; hens written by another subject
    // (other tokens) never reach it
    let mut ws = connect(&server, Some(&reader)).await;
    send(
        &mut ws,
        json!({"id": "1", "type": "subscribe", "payload": {"query": query}}),
    )
    .await;
    until_open(&server, 1).await;
    call(
        "/hen/api",
        json!({"name": "not yours", "coop_id": red, "eggs": 1}),
        &other_editor,
    )
    .await;
    call(
        "/hen/api",
        json!({"name": "yours", "coop_id": red, "eggs": 3}),
        &editor,
    )
    .await;
    let event = receive(&mut ws).await;
    let payload = &event["payload"];
    assert_eq!(payload["data"]["getByCoop"][0]["name"], "yours", "{event}");
    assert_eq!(
        payload["data"]["getByCoop"][0]["eggs"],
        Value::Null,
        "{event}"
    );
    assert_eq!(
        payload["data"]["getByCoop"][0]["coop"]["name"], "red",
        "{event}"
    );
    assert_eq!(
        payload["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{event}"
    );
    assert_eq!(
        payload["errors"][0]["path"],
        json!(["getByCoop", 0, "eggs"]),
        "{event}"
    );
    assert!(silent(&mut ws, Duration::from_millis(300)).await);

    // an event stream with a bad token is a 401 before anything streams
    let r = reqwest::Client::new()
        .post(server.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .header("authorization", "Bearer forged")
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// Appends the stream's next chunk to `text`; fails the test when none comes before
/// `deadline` (`waiting_for` says what for) or the stream ends.
async fn read_more(
    response: &mut reqwest::Response,
    text: &mut String,
    deadline: Instant,
    waiting_for: &str,
) {
    let left = deadline.saturating_duration_since(Instant::now());
    let chunk = tokio::time::timeout(left, response.chunk())
        .await
        .unwrap_or_else(|_| panic!("{waiting_for} within 10 s; got {text:?}"))
        .unwrap()
        .expect("the stream is open");
    text.push_str(&String::from_utf8_lossy(&chunk));
}

/// Reads an event stream until its `: subscribed` comment (10 s at most).
async fn until_subscribed(response: &mut reqwest::Response) {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text.contains(": subscribed") {
        read_more(response, &mut text, deadline, "`: subscribed`").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_subscriptions_refuses_one_more_until_one_closes() {
    let dir = farm("\n[server]\nmax_subscriptions = 3\n");
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    assert_eq!(metric(&server, "meshql_subscriptions_max").await, 3);
    assert_eq!(
        metric(&server, "meshql_subscriptions_refused_total").await,
        0
    );
    let farm = post(&server, "/farm/api", json!({"name": "Emerdale"})).await;
    let red = post(
        &server,
        "/coop/api",
        json!({"name": "red", "farm_id": farm}),
    )
    .await;
    // the creates are in the log before anyone subscribes (else they would be events)
    until_in_feed(&server, 2).await;
    let query = format!(r#"subscription {{ getByCoop(id: "{red}") {{ name }} }}"#);

    // three streams fill the server
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = open_stream(&server, &query, None, None).await;
        assert_eq!(stream.status(), 200);
        until_subscribed(&mut stream).await;
        streams.push(stream);
    }
    until_open(&server, 3).await;

    // a fourth event stream: 503 with a JSON error naming the limit
    let refused = reqwest::Client::new()
        .post(server.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(
        refused.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"),
        "{:?}",
        refused.headers()
    );
    let body: Value = refused.json().await.unwrap();
    let message = body["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("too many subscriptions") && message.contains("max_subscriptions = 3"),
        "{body}"
    );
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "UNAVAILABLE",
        "{body}"
    );

    // a fourth over graphql-transport-ws: an error message for that operation
    let mut ws = connect(&server, None).await;
    send(
        &mut ws,
        json!({"id": "4", "type": "subscribe", "payload": {"query": query}}),
    )
    .await;
    let error = receive(&mut ws).await;
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["id"], "4", "{error}");
    let message = error["payload"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_subscriptions = 3"), "{error}");
    assert_eq!(open_subscriptions(&server).await, 3);
    assert_eq!(
        metric(&server, "meshql_subscriptions_refused_total").await,
        2
    );

    // one stream closes: its place is free, and a new stream is accepted
    drop(streams.pop());
    until_open(&server, 2).await;
    let mut stream = open_stream(&server, &query, None, None).await;
    assert_eq!(stream.status(), 200);
    until_subscribed(&mut stream).await;
    streams.push(stream);
    until_open(&server, 3).await;

    // the three open streams still receive the events of a write
    post(&server, "/hen/api", json!({"name": "ruby", "coop_id": red})).await;
    for stream in &mut streams {
        let mut text = String::new();
        let events = read_events(stream, &mut text, 1).await;
        assert_eq!(
            events[0].1["data"]["getByCoop"],
            json!([{"name": "ruby"}]),
            "{text}"
        );
    }
    assert_eq!(
        metric(&server, "meshql_subscriptions_refused_total").await,
        2
    );
    drop(streams);
    until_open(&server, 0).await;
}

/// What one subscription event says, for comparing a cohort's events: the change's op,
/// whether it is a departure, the field's answer, and the errors' (path, code).
fn summary(payload: &Value) -> Value {
    let errors: Vec<Value> = payload["errors"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| json!([e["path"], e["extensions"]["code"]]))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "op": payload["extensions"]["change"]["op"],
        "departed": payload["extensions"]["change"]["departed"] == true,
        "data": payload["data"]["getByCoop"],
        "errors": errors,
    })
}

/// The event a `name eggs` subscription to `getByCoop` expects for a hen (a reader's
/// `eggs` is null with FORBIDDEN at its path).
fn arrival(op: &str, name: &str, eggs: Option<u64>) -> Value {
    let errors = match eggs {
        Some(_) => json!([]),
        None => json!([[["getByCoop", 0, "eggs"], "FORBIDDEN"]]),
    };
    json!({"op": op, "departed": false, "data": [{"name": name, "eggs": eggs}], "errors": errors})
}

/// Two callers with different grants on the same subscription at once, over
/// graphql-transport-ws and graphql-sse: an editor and a reader of one subject (the reader's
/// mask hides `eggs`) and a reader of another subject (other authorized tokens). Each
/// receives exactly what its own grants allow — no event, field or departure of another
/// caller's cohort — which a last write every caller may see proves (events come in the
/// log's order, so anything leaked would come before it). An event stream whose caller may
/// not read hens, or whose token is forged, is refused before anything streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_with_different_grants_on_one_subscription_each_see_only_their_own() {
    let dir = farm_with_roles();
    let server = Server::start(&dir.path().join("meshql.toml"), &[]);
    let ed_editor = bearer_with(&json!({"sub": "ed", "roles": ["editor"]}));
    let ed_reader = bearer_with(&json!({"sub": "ed", "roles": ["reader"]}));
    let eve_editor = bearer_with(&json!({"sub": "eve", "roles": ["editor"]}));
    let eve_reader = bearer_with(&json!({"sub": "eve", "roles": ["reader"]}));
    let nobody = bearer_with(&json!({"sub": "ed", "roles": []}));
    let c = server.client();
    let write = |method: &'static str, path: String, body: Value, auth: Option<String>| {
        let c = c.clone();
        async move {
            let headers: Vec<(&str, &str)> = auth
                .as_deref()
                .map(|a| vec![("authorization", a)])
                .unwrap_or_default();
            let r = c
                .request(method, &path, Some(body.to_string().into_bytes()), &headers)
                .await;
            assert!(r.status == 200 || r.status == 201, "{method} {path}: {r:?}");
            r.json()["id"].as_str().map(str::to_owned)
        }
    };
    let post = |path: &str, body: Value, auth: &str| {
        write("POST", path.to_owned(), body, Some(auth.to_owned()))
    };
    let farm = post("/farm/api", json!({"name": "F"}), &ed_editor)
        .await
        .unwrap();
    let red = post(
        "/coop/api",
        json!({"name": "red", "farm_id": farm}),
        &ed_editor,
    )
    .await
    .unwrap();
    let blue = post(
        "/coop/api",
        json!({"name": "blue", "farm_id": farm}),
        &ed_editor,
    )
    .await
    .unwrap();
    // the creates are in the log (as their writer reads it) before anyone subscribes
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = c
            .request(
                "GET",
                "/_changes?limit=1000",
                None,
                &[("authorization", ed_editor.as_str())],
            )
            .await;
        if page.status == 200 && page.json()["changes"].as_array().unwrap().len() >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "3 changes in the feed: {page:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let query = format!(r#"subscription {{ getByCoop(id: "{red}") {{ name eggs }} }}"#);

    // refused credentials are refused over SSE too, before anything streams: a caller who may
    // not read hens (a GraphQL FORBIDDEN, no stream), a forged token (401)
    let refused = reqwest::Client::new()
        .post(server.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .header("authorization", &nobody)
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap();
    let content_type = refused.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "no event stream for a caller who may not read: {content_type}"
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{body}"
    );
    assert!(
        body.get("data")
            .is_none_or(|d| d.is_null() || d["getByCoop"].is_null()),
        "{body}"
    );
    let forged = reqwest::Client::new()
        .post(server.url("/hen/graph"))
        .header("accept", "text/event-stream")
        .header("authorization", "Bearer forged")
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    assert_eq!(
        open_subscriptions(&server).await,
        0,
        "nothing was subscribed"
    );

    // three cohorts on each transport, all open at once
    let mut sockets = Vec::new();
    let mut streams = Vec::new();
    for (who, auth) in [
        ("ed editor", &ed_editor),
        ("ed reader", &ed_reader),
        ("eve reader", &eve_reader),
    ] {
        let mut ws = connect(&server, Some(auth)).await;
        send(
            &mut ws,
            json!({"id": "s", "type": "subscribe", "payload": {"query": query}}),
        )
        .await;
        sockets.push((who, ws));
        let mut stream = open_stream(&server, &query, None, Some(auth)).await;
        assert_eq!(stream.status(), 200);
        until_subscribed(&mut stream).await;
        streams.push((who, stream));
    }
    until_open(&server, 6).await;

    // ed's hen, eve's hen, ed's hen moved out of the red coop (a departure for those who saw
    // it), then a hen without authorized tokens, which every cohort sees
    let ed_hen = post(
        "/hen/api",
        json!({"name": "ed's", "coop_id": red, "eggs": 3}),
        &ed_editor,
    )
    .await
    .unwrap();
    post(
        "/hen/api",
        json!({"name": "eve's", "coop_id": red, "eggs": 1}),
        &eve_editor,
    )
    .await;
    write(
        "PUT",
        format!("/hen/api/{ed_hen}"),
        json!({"name": "ed's", "coop_id": blue, "eggs": 3}),
        Some(ed_editor.clone()),
    )
    .await;
    write(
        "POST",
        "/hen/api".to_owned(),
        json!({"name": "everyone's", "coop_id": red, "eggs": 5}),
        None,
    )
    .await;

    let departure = json!({"op": "update", "departed": true, "data": [], "errors": []});
    let expected = |who: &str| -> Vec<Value> {
        match who {
            "ed editor" => vec![
                arrival("create", "ed's", Some(3)),
                departure.clone(),
                arrival("create", "everyone's", Some(5)),
            ],
            "ed reader" => vec![
                arrival("create", "ed's", None),
                departure.clone(),
                arrival("create", "everyone's", None),
            ],
            _ => vec![
                arrival("create", "eve's", None),
                arrival("create", "everyone's", None),
            ],
        }
    };
    for (who, ws) in &mut sockets {
        let want = expected(who);
        let mut got = Vec::new();
        while got.len() < want.len() {
            let event = receive(ws).await;
            assert_eq!(event["type"], "next", "{who}: {event}");
            got.push(summary(&event["payload"]));
        }
        assert_eq!(got, want, "{who} over graphql-transport-ws");
    }
    for (who, stream) in &mut streams {
        let want = expected(who);
        let mut text = String::new();
        let events = read_events(stream, &mut text, want.len()).await;
        let got: Vec<Value> = events.iter().map(|(_, e)| summary(e)).collect();
        assert_eq!(got, want, "{who} over graphql-sse: {text}");
        // the departure's position is the move's, after the arrival's
        if *who != "eve reader" {
            assert!(events[1].0.unwrap() > events[0].0.unwrap(), "{text}");
        }
    }
    drop((sockets, streams));
    until_open(&server, 0).await;
}
