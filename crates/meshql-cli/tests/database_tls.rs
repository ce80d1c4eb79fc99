//! TLS from meshql to its databases, through the binary: bad TLS parameters are `meshql check`
//! errors naming the file, line and field; a certificate that does not verify leaves the
//! entity answering 503 with the TLS reason in the log; the right CA serves.

mod common;

use common::{example_copy, examples_dir, run_meshql, Server};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The line of the farm example's storage block's first field (`type = "sqlite"`): `field`
/// lines below are counted from it.
fn storage_line() -> usize {
    let text = std::fs::read_to_string(examples_dir().join("farm/meshql.toml")).unwrap();
    text.lines()
        .position(|l| l == "type = \"sqlite\"")
        .expect("the farm example's storage block")
        + 1
}

/// `meshql check` on the farm example with its storage block replaced by `block`.
fn check_with_storage(block: &str) -> String {
    let dir = example_copy("farm", |text| {
        text.replace("type = \"sqlite\"\nfile = \"farm.db\"\n", block)
    });
    let config = dir.path().join("meshql.toml");
    let out = run_meshql(
        &["check", config.to_str().unwrap()],
        Duration::from_secs(30),
    );
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "check passed:\n{stderr}");
    stderr
}

#[test]
fn check_names_bad_tls_parameters_with_file_line_and_field() {
    for (block, field, expected) in [
        (
            "type = \"postgres\"\nurl = \"postgres://h/db?sslmode=sometimes\"\n",
            (1, "storage.farm.url"),
            "sslmode=\"sometimes\" is not one of",
        ),
        (
            "type = \"postgres\"\nurl = \"postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem\"\n",
            (1, "storage.farm.url"),
            "sslrootcert /nonexistent/ca.pem cannot be read",
        ),
        (
            "type = \"postgres\"\nurl = \"postgres://h/db\"\nread_url = \"postgres://r/db?sslmode=verify-all\"\n",
            (2, "storage.farm.read_url"),
            "sslmode=\"verify-all\"",
        ),
        (
            "type = \"mysql\"\nurl = \"mysql://u:p@h/db?ssl-mode=SOMETIMES\"\n",
            (1, "storage.farm.url"),
            "ssl-mode=\"SOMETIMES\" is not one of",
        ),
        (
            "type = \"mysql\"\nurl = \"mysql://u:p@h/db?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.pem\"\n",
            (1, "storage.farm.url"),
            "ssl-ca /nonexistent/ca.pem cannot be read",
        ),
        (
            "type = \"mongo\"\ndb = \"farm\"\nuri = \"mongodb://h/?tls=true&tlsCAFile=/nonexistent/ca.pem\"\n",
            (2, "storage.farm.uri"),
            "tlsCAFile /nonexistent/ca.pem cannot be read",
        ),
        (
            "type = \"mongo\"\ndb = \"farm\"\nuri = \"mongodb://h/?tls=perhaps\"\n",
            (2, "storage.farm.uri"),
            "tls",
        ),
    ] {
        let stderr = check_with_storage(block);
        // file:line: field (lines below the storage block's first)
        let (below, field) = field;
        assert!(
            stderr.contains(&format!("meshql.toml:{}: {field}", storage_line() + below)),
            "{block}\n{stderr}"
        );
        assert!(stderr.contains(expected), "{block}\n{stderr}");
    }
}

/// The test PostgreSQL's certificate directory (`ca.crt`, `other-ca.crt`).
fn postgres_tls_dir() -> PathBuf {
    common::postgres_url(); // started, with TLS on
    let out = Command::new("bash")
        .arg(examples_dir().join("../scripts/services/postgres.sh"))
        .arg("tls")
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[tokio::test]
async fn postgres_verify_full_serves_and_a_wrong_ca_is_a_503_with_the_reason() {
    let tls = postgres_tls_dir();
    let db = common::fresh_postgres_database();
    let on = |ca: &str| {
        Server::start_with_env(
            &examples_dir().join("egg-economy/meshql-postgres.toml"),
            &[(
                "DATABASE_URL",
                format!(
                    "{db}?sslmode=verify-full&sslrootcert={}",
                    tls.join(ca).display()
                ),
            )],
            None,
        )
    };

    // a CA that did not sign the server's certificate: the entity is unavailable, the log
    // says why
    let server = on("other-ca.crt");
    let c = server.client();
    c.get("/farm/api").await.expect_status(503);
    c.get("/ready").await.expect_status(503);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.log().contains("UnknownIssuer") {
        assert!(
            Instant::now() < deadline,
            "no TLS reason in the log:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        server.log().contains("TLS handshake failed"),
        "{}",
        server.log()
    );
    drop(server);

    // the right CA: served over TLS
    let server = on("ca.crt");
    let c = server.client();
    let r = c
        .post_json(
            "/farm/api",
            &json!({"name": "Encrypted", "farm_type": "megafarm", "zone": "north"}),
        )
        .await;
    r.expect_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        c.get(&format!("/farm/api/{id}")).await.json()["name"],
        "Encrypted"
    );
}
