//! Kafka as meshql's database (`[storage.<name>] type = "kafka"`): the log is the truth, reads
//! are local.
//!
//! The parts: the storage block's settings with their checks ([`settings`]), the record
//! format ([`record`]), the topics made or checked at start ([`topics`]), the materialiser
//! ([`materialise`]), the writes ([`produce`]), what is known of the brokers and of the
//! distance from the end of each topic ([`health`]), and the store over them ([`store`],
//! opened per storage block by [`database`], registered as `type = "kafka"`).
//!
//! Decided, and tested (`tests/`, and `crates/meshql-cli/tests/kafka_store.rs` through the
//! binary):
//! - **Start.** Each entity's store makes or checks its topic, then reads it until it has
//!   applied everything up to the end the topic had at start (its last stable offset; commit
//!   markers of transactions are passed by reading the consumer's position once the topic is
//!   quiet) before the service reports ready. When no broker answers at start (a 3 s probe,
//!   once per block), a store whose copy this process made before (a state row marks a topic
//!   read to its end once) serves that copy as it was: reads go on, saying it may miss the
//!   writes since its file was last written, writes answer 503, `/ready` says why, and the
//!   topic is started in the background once a second until a broker answers. A store with
//!   no copy answers 503 and retries every second, as for the other backends.
//! - **Processor outputs** (`OutputStore`) are not written to a Kafka entity: that needs the
//!   outputs and the processor's input position in one Kafka transaction. Projections of a
//!   Kafka-stored model live in a local store of each process, computed from the change feed
//!   of the topics, which every process reads in full (examples/egg-economy-kafka).
//! - **One consumer and one producer per storage block**, however many entities it stores:
//!   each topic's partitions are split off the consumer into queues of their own
//!   ([`materialise::Reader`]); batches have transactional producers of their own per topic.
//!   A client per topic kept 89 threads and 0.1 of a core busy in an idle egg-economy
//!   process, which showed in the p99 of reads.
//! - **A record the local store refuses** (a full disk) is tried again, later and later, with
//!   the reason on `/ready`; nothing after it is applied first.
//!
//! # Records
//!
//! Every version of a document is one record of its entity's topic: key = the document id (so
//! one document's versions stay in order on one partition), value = the stored envelope in
//! the format MeshQL's ksqlDB variant writes (CONTRACT §14.4), `{"payload": "<JSON text>",
//! "created_at": <epoch ms>, "deleted": <bool>, "authorized_tokens": "<JSON text>"}`, so its
//! topics are read without a copy and meshql's can be read by it ([`record`]). Topics keep
//! every version: `cleanup.policy=delete` with `retention.ms=-1` and `retention.bytes=-1` —
//! compaction or time retention would lose the versions `at` reads — and a fixed partition
//! count (more partitions would send a document's next versions to another partition,
//! after its earlier ones in no order). Both are checked at start; meshql makes missing topics
//! with them when `create_topics` is on.
//!
//! # Reads: a local materialisation
//!
//! Each meshql process materialises the topics it serves into an embedded SQLite file of its
//! own (`file`), in the SQLite backend's own tables: reads then have exactly the SQLite
//! backend's semantics and speed — latest version and `at`, query templates and operators,
//! nested single-statement reads — because they are the SQLite backend's code. Each applied
//! batch of records is committed with the next offset of every partition it read, in the
//! same transaction: a restart resumes from there, `kill -9` included, and a record is applied
//! once. A new process (an empty file) builds the materialisation from the start of the
//! topics. A version stamped "now" by its writer gets a `created_at` at least its
//! predecessor's + 1 ms in offset order, so `at` follows the log's order even when the clocks
//! of several writing processes disagree; one whose writer asked for its time (the record says
//! so with `"stamp": "requested"`) is placed as the SQLite backend places a back-dated write.
//!
//! # Writes: acknowledged once the broker has them and this process applied them
//!
//! A write is produced with librdkafka's idempotent producer (`acks=all`); it is acknowledged
//! to the client once the broker confirmed it *and* this process's materialiser applied its
//! offset, so the writer's next read sees it (read-your-writes by offset). Writes of other
//! processes appear as fast as they are consumed. A bulk create or delete is one Kafka
//! transaction (the materialiser reads `read_committed`), so it is all or nothing. An update or
//! delete of an id is checked against this process's materialisation before it is produced
//! (404 when it has no current version); two processes updating one document race, and the
//! later offset is the current version. With the broker down, writes answer 503 quickly
//! (nothing half-written), reads go on from the local state and say how far behind it may be,
//! and `/ready` reports it.
//!
//! # The change feed
//!
//! The store's change feed is the materialisation's: versions in the order they were applied,
//! which is each partition's offset order, so the embedded log, `/_changes`, relays and
//! processors work on a Kafka store unchanged. A record that is not a valid envelope (written
//! by something else) is skipped with a logged reason and counted; it never stops the
//! materialiser.

pub mod applied;
mod backend;
pub mod database;
pub mod health;
pub mod materialise;
pub mod produce;
pub mod record;
pub mod settings;
pub mod store;
pub mod topics;

pub use backend::KafkaBackend;
pub use database::KafkaDatabase;
pub use record::{decode, encode, RecordError};
pub use settings::{KafkaSettings, KafkaStorage};
pub use store::KafkaStore;
