//! The Kafka half of `changes`, with `--kafka BROKERS` and a server the bench started: the
//! scenario's server is restarted on its own data with a Kafka relay added to a copy of its
//! config, so the relay starts with the whole change log of the runs before it to send.
//!
//! 3. **Relay throughput.** Changes the relay has sent and the broker confirmed, per second,
//!    while it catches up: from when the restarted server is ready until
//!    `meshql_relay_committed_position` in `/metrics` reaches the log's last position (goal
//!    ≥ 50,000 changes/s). The time includes the relay's connection to the broker.
//! 4. **POST → Kafka latency** at 1,000/s and 10,000/s, as POST → SSE but read from the farm
//!    topic by a librdkafka consumer on its own thread, assigned at the topic's end before
//!    the run starts (goal p99 < 25 ms).
//!
//! Without `--kafka`, or against `--url`, both are skipped with a note.

use super::{latency, Reader, Tracker, Via};
use crate::gate::{self, GateResult, ScenarioError};
use crate::scenarios::Ctx;
use http::Method;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Goal for the p99 of POST → Kafka (ms).
pub(super) const GOAL_P99_MS: f64 = 25.0;
/// Goal for the relay's catch-up rate (changes/s).
const GOAL_RELAY_PER_SEC: f64 = 50_000.0;
/// The relay's name in the copied config (its log consumer group is `relay-bench`).
const RELAY: &str = "bench";
/// Longest wait for the relay to catch up.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(300);

/// Relay throughput, then POST → Kafka latency; returns the problems to fail the gate with.
pub(super) async fn run(ctx: &mut Ctx) -> GateResult<Vec<String>> {
    let Some(brokers) = ctx.opts.kafka.clone() else {
        ctx.note("relay throughput and POST → Kafka: not measured (give --kafka host:port, e.g. the broker of scripts/services/kafka.sh, 127.0.0.1:19092)");
        return Ok(Vec::new());
    };
    let Some(config) = ctx.server.as_ref().map(|s| s.spec().config.clone()) else {
        ctx.note("relay throughput and POST → Kafka: not measured (needs the server the bench starts; run without --url)");
        return Ok(Vec::new());
    };
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("meshql-bench-{}.", &tag[..8]);
    let relay = relay_block(RELAY, &brokers, &prefix, &[]);
    let (_copy, relayed) = edited_copy(&config, |text| Ok(text + &relay)).map_err(|e| {
        ScenarioError::Setup(format!("a copy of {} with a relay: {e}", config.display()))
    })?;

    let mut s = ctx.session();
    let last = gate::get_json(&mut s, "/_changes?since=now&limit=1")
        .await?
        .get("last")
        .and_then(Value::as_u64)
        .ok_or_else(|| ScenarioError::Gate("/_changes?since=now answered no `last`".into()))?;
    drop(s);
    if let Some(server) = ctx.server.as_mut() {
        server
            .restart_with(|spec| spec.config = relayed.clone())
            .await
            .map_err(|e| ScenarioError::Setup(format!("the server with a Kafka relay: {e}")))?;
    }
    let ready = Instant::now();
    let mut problems = Vec::new();
    loop {
        let committed = relay_committed(ctx).await;
        if committed.is_some_and(|c| c >= last) {
            let secs = ready.elapsed().as_secs_f64();
            let rate = last as f64 / secs;
            ctx.note(format!(
                "relay catch-up: {last} changes sent to Kafka ({brokers}) and confirmed in {secs:.2} s from ready = {rate:.0} changes/s (goal ≥ {GOAL_RELAY_PER_SEC:.0}: {})",
                if rate >= GOAL_RELAY_PER_SEC { "met" } else { "NOT met" }
            ));
            break;
        }
        if ready.elapsed() > CATCH_UP_LIMIT {
            problems.push(format!(
                "the Kafka relay confirmed {} of {last} changes in {} s",
                committed.map_or("none".to_string(), |c| c.to_string()),
                CATCH_UP_LIMIT.as_secs()
            ));
            return Ok(problems);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let via = Via::Kafka {
        brokers,
        topic: format!("{prefix}farm"),
    };
    problems.extend(latency(ctx, &via).await?);
    Ok(problems)
}

/// `meshql_relay_committed_position{relay="bench",…}` from `/metrics`.
async fn relay_committed(ctx: &Ctx) -> Option<u64> {
    let mut s = ctx.session();
    let reply = s.send(Method::GET, "/metrics", None).await.ok()?;
    let text = String::from_utf8_lossy(&reply.body);
    committed_of(&text, RELAY)
}

fn committed_of(metrics: &str, relay: &str) -> Option<u64> {
    let label = format!("relay=\"{relay}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("meshql_relay_committed_position{") && l.contains(&label))
        .find_map(|l| l.rsplit_once(' ')?.1.trim().parse().ok())
}

/// A `[[changes.relay]]` block of type kafka named `name` (extra `key = value` lines after
/// the usual ones), to append to a config.
pub(crate) fn relay_block(
    name: &str,
    brokers: &str,
    topic_prefix: &str,
    extra: &[(&str, &str)],
) -> String {
    let mut block = format!(
        "\n# added by `meshql bench`\n[[changes.relay]]\nname = {}\ntype = \"kafka\"\nbrokers = {}\ntopic_prefix = {}\n",
        toml_string(name),
        toml_string(brokers),
        toml_string(topic_prefix),
    );
    for (k, v) in extra {
        block.push_str(&format!("{k} = {}\n", toml_string(v)));
    }
    block
}

/// A TOML basic string: JSON string syntax is valid TOML basic-string syntax for these values.
pub(crate) fn toml_string(v: &str) -> String {
    serde_json::Value::from(v).to_string()
}

/// A copy of the config's directory (without `data` folders) in a temporary directory, its
/// config file's text changed by `edit`. Returns the directory (deleted when dropped) and
/// the copied config file.
pub(crate) fn edited_copy(
    config: &Path,
    edit: impl FnOnce(String) -> std::io::Result<String>,
) -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let (dir, file) = if config.is_dir() {
        (config.to_path_buf(), config.join("meshql.toml"))
    } else {
        let dir = config.parent().unwrap_or(Path::new(".")).to_path_buf();
        (dir, config.to_path_buf())
    };
    let copy = tempfile::Builder::new().prefix("meshql-bench-").tempdir()?;
    copy_tree(&dir, copy.path())?;
    let copied = copy.path().join(file.file_name().unwrap_or_default());
    let text = edit(std::fs::read_to_string(&copied)?)?;
    std::fs::write(&copied, text)?;
    Ok((copy, copied))
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if entry.file_name() == "data" {
                continue;
            }
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// A consumer of every partition of `topic` from its current end, on a thread of its own;
/// returns once the partitions are assigned at their high watermarks.
pub(super) async fn reader(
    brokers: &str,
    topic: &str,
    tracker: Arc<Tracker>,
) -> Result<Reader, String> {
    let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel::<Option<String>>();
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    std::thread::Builder::new()
        .name("kafka-reader".into())
        .spawn(move || {
            let consumer = match assigned_consumer(&brokers, &topic) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let mut errors = 0u64;
            let mut last_error = None;
            while matches!(stop_rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                match consumer.poll(Duration::from_millis(20)) {
                    None => {}
                    Some(Ok(m)) => {
                        let at = Instant::now();
                        let correlation = m.headers().and_then(|h| {
                            h.iter()
                                .find(|h| h.key == "correlation_id")
                                .and_then(|h| h.value)
                                .and_then(|v| std::str::from_utf8(v).ok())
                        });
                        tracker.arrive_correlated(correlation, at);
                    }
                    // librdkafka retries by itself; a reader that stops seeing messages
                    // shows up as missing changes with this error attached
                    Some(Err(e)) => {
                        errors += 1;
                        last_error = Some(e.to_string());
                    }
                }
            }
            tracker.reader_gone.store(true, Ordering::Relaxed);
            let _ =
                done_tx.send(last_error.map(|e| format!("{errors} consumer errors, last: {e}")));
        })
        .map_err(|e| format!("cannot start the Kafka reader thread: {e}"))?;
    match ready_rx.await {
        Ok(Ok(())) => Ok(Reader {
            stop: Some(stop_tx),
            done: done_rx,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("the Kafka reader thread ended before it was assigned".into()),
    }
}

fn assigned_consumer(brokers: &str, topic: &str) -> Result<BaseConsumer, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("meshql-bench-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10")
        .create()
        .map_err(|e| format!("Kafka consumer for {brokers}: {e}"))?;
    let timeout = Duration::from_secs(10);
    let deadline = Instant::now() + Duration::from_secs(30);
    let partitions = loop {
        let found = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                let t = m.topics().first().ok_or("no topic in the metadata")?;
                match t.error() {
                    Some(e) => Err(format!("{e:?}")),
                    None if t.partitions().is_empty() => Err("no partitions yet".into()),
                    None => Ok(t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>()),
                }
            });
        match found {
            Ok(p) => break p,
            Err(e) if Instant::now() > deadline => {
                return Err(format!("topic {topic} on {brokers}: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let mut list = TopicPartitionList::new();
    for p in partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| format!("end of {topic}[{p}]: {e}"))?;
        list.add_partition_offset(topic, p, Offset::Offset(high))
            .map_err(|e| e.to_string())?;
    }
    consumer
        .assign(&list)
        .map_err(|e| format!("assign {topic}: {e}"))?;
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_position_is_read_from_metrics() {
        let text = "# TYPE meshql_relay_committed_position gauge\n\
            meshql_relay_committed_position{relay=\"other\",type=\"nats\"} 7\n\
            meshql_relay_committed_position{relay=\"bench\",type=\"kafka\"} 1234\n\
            meshql_relay_lag{relay=\"bench\",type=\"kafka\"} 0\n";
        assert_eq!(committed_of(text, "bench"), Some(1234));
        assert_eq!(committed_of(text, "none"), None);
    }

    #[test]
    fn the_copied_config_has_the_relay_and_the_files_beside_it() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("schema")).unwrap();
        std::fs::create_dir_all(src.path().join("data")).unwrap();
        std::fs::write(src.path().join("schema/farm.json"), "{}").unwrap();
        std::fs::write(src.path().join("data/big.db"), "x").unwrap();
        std::fs::write(
            src.path().join("meshql.toml"),
            "port = 1\n[changes]\nenabled = true\n",
        )
        .unwrap();
        let relay = relay_block(RELAY, "127.0.0.1:19092", "p.", &[("db", "d")]);
        let (copy, file) = edited_copy(src.path(), |text| Ok(text + &relay)).unwrap();
        assert!(copy.path().join("schema/farm.json").is_file());
        assert!(!copy.path().join("data").exists());
        let text = std::fs::read_to_string(file).unwrap();
        assert!(text.starts_with("port = 1\n[changes]\nenabled = true\n"));
        assert!(text.contains("[[changes.relay]]\nname = \"bench\"\ntype = \"kafka\"\nbrokers = \"127.0.0.1:19092\"\ntopic_prefix = \"p.\"\ndb = \"d\"\n"));
    }
}
