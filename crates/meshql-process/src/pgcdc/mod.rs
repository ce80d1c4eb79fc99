//! Change capture from a PostgreSQL meshql does not own (`source = { type = "postgres_cdc", … }`):
//! the rows of legacy tables as a processor's inputs, first as they are (a snapshot), then
//! every insert, update and delete as it commits (logical replication, `pgoutput`).
//!
//! ```toml
//! [[processor]]
//! name = "customers"
//! type = "mapping"
//! inputs = ["cust_acct"]
//! output = "customer"
//! source = { type = "postgres_cdc", url = "${LEGACY_URL}", publication = "meshql_legacy", tables = ["cust_acct"] }
//! ```
//!
//! Settings: `url` (a `postgres://` URL of the legacy database; the user needs the
//! `REPLICATION` attribute, and `CREATE` on the database when meshql makes the publication),
//! `publication` (made `FOR TABLE` the tables when it does not exist, and the missing tables
//! added when it does, unless `create = false`: then it must exist and publish them), `slot`
//! (the replication slot, default `meshql_<publication>`; one slot per processor), `tables`
//! (`name` or `schema.name`), `snapshot` (default true: copy the rows present when the slot is
//! made before streaming) and `entities = { "<table>" = "<entity>" }` (an input's entity is
//! the table's name, `schema.name` outside `public`, unless mapped here).
//!
//! **What an input is.** One row change: `op` create (a snapshot row or an INSERT), update or
//! delete; `payload` the row as column → JSON value (integers, floating and numeric columns as
//! numbers, booleans, `json`/`jsonb` parsed, everything else as PostgreSQL's text; a delete
//! carries what the table's replica identity logs: its key columns, or the whole row with
//! `REPLICA IDENTITY FULL`; a large value an update left untouched is absent unless the
//! identity is `FULL`); `id` the primary key's values joined by `,`; `created_at` the commit
//! time (a snapshot row: the snapshot's).
//!
//! **Exactly once.** The slot streams whole transactions in commit order. A state row of the
//! processor (`pgcdc/<slot>`) holds the end of the last transaction whose changes are
//! committed with the outputs, and, when a transaction was larger than a batch, how many of
//! its changes are; it is committed with the batch's outputs in one transaction. After a
//! restart, `kill -9` included, streaming starts again from there: transactions at or before
//! it, and the first changes of a partial one, are skipped. The slot is told a position only
//! after the outputs are committed, so PostgreSQL keeps the WAL the processor has not applied
//! — and, while the publication's tables are idle, the server's current position, so the slot
//! never holds WAL for nothing.
//!
//! **The snapshot.** With no committed position, the slot is made with an exported snapshot
//! (`CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`); the tables are read through a cursor in
//! a `REPEATABLE READ` transaction that adopts it, so the copy holds exactly the rows committed
//! before the slot's first change, in transactions of at least 5,000 rows; the position is
//! committed with the copy's last batch. A copy
//! cut short (a crash, a lost connection) starts again with a new slot: rows copied twice are
//! the same rows (a mapping derives a row's document from its key).
//!
//! **Faults.** A database that is down, refuses the slot or drops the connection is retried
//! with backoff (100 ms doubling up to 12.8 s), counted in the processor's `errors`; the
//! service meanwhile serves as usual. A slot still held by a session that died (the server
//! has not noticed yet) is waited for the same way. A slot that disappeared (dropped by an
//! operator) lost the changes since: the processor warns and takes a new snapshot.
//!
//! **Latency.** Logical decoding sends a transaction once its WAL is flushed: with
//! `synchronous_commit = on` a change is an input within milliseconds of its commit; a database
//! that commits asynchronously delays it until the WAL writer flushes (`wal_writer_delay`,
//! 200 ms by default).
//!
//! The processor's `lag` (`meshql_processor_lag`) is the WAL, in bytes, the slot keeps for it:
//! from the slot's confirmed position to the server's current one, read every 5 s. `meshql cdc
//! slots CONFIG` lists the slots of the config's legacy databases (with what each keeps, and
//! whether a processor of the config reads it), `meshql cdc drop-slot SLOT CONFIG` drops one,
//! and `meshql check` warns about a slot of meshql's (`meshql_…`) no processor reads.
//!
//! **TLS.** The URL's `sslmode` (`disable`, `prefer` — the default —, `require`, `verify-ca`,
//! `verify-full`) and `sslrootcert` (a PEM file, or `system`) are read as meshql's PostgreSQL
//! store reads them, for both connections ([`meshql_pg::tunnel`]).
//!
//! Rooms: [`settings`] (the block and its checks), [`capture`] (a session: snapshot, then the
//! stream, committed with the processor's outputs), [`decode`] (`pgoutput` tuples as JSON
//! rows), [`sql`] (the ordinary connection: catalog, publication, slot), [`slots`] (the
//! slots and columns `meshql cdc` and `meshql check` ask about).

mod capture;
mod decode;
pub mod settings;
pub mod slots;
mod sql;

pub use settings::{compile, PostgresCdcSource, PostgresCdcSourceType, Table};
pub use slots::{columns, drop_slot, redacted_url, slots, SlotInfo};

use crate::source::contract::{Source, SourceKind, SourceRun};

impl SourceKind for PostgresCdcSource {
    const KIND: &'static str = "postgres_cdc";
    type Settings = settings::Settings;

    fn check(s: settings::Settings) -> Result<Self, meshql_core::SettingError> {
        settings::checked(s)
    }

    async fn read(self, run: SourceRun) {
        capture::run(
            run.name,
            self,
            run.inputs,
            run.batch,
            run.intake,
            run.counters,
            run.stop,
        )
        .await
    }

    /// A legacy database's tables are a processor's inputs, not entities of this config.
    fn tables(&self) -> Vec<String> {
        self.tables.iter().map(|t| self.entity_of(t)).collect()
    }

    /// A snapshot taken again delivers its rows again: the same rows must change nothing.
    fn redelivers(&self) -> bool {
        true
    }
}

/// The `postgres_cdc` source among a processor's, if it is one (for `meshql cdc`).
pub fn of(source: &dyn Source) -> Option<&PostgresCdcSource> {
    source.as_any().downcast_ref()
}
