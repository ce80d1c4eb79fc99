//! What every source is to the processor it feeds, and what the processor is to its source:
//! a [`Source`] runs, reading its broker or database, and hands batches to an [`Intake`] —
//! the processor's runtime, which plans them and commits the outputs with the source's own
//! position in one transaction. Sources know nothing of the runtime beyond this.

use crate::plan::Item;
use async_trait::async_trait;
use meshql_changes::HandlerError;
use meshql_core::{DeadLetter, SettingError, StateWrite, StoreError};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::sync::watch;

/// Processor sources, as a `source` block's `type` names them.
pub struct Sources;

impl meshql_core::Family for Sources {
    const WHAT: &'static str = "source";
    type Context<'a> = ();
    type Built = Arc<dyn Source>;
}

/// A checked `source` block, ready to run.
#[async_trait]
pub trait Source: std::fmt::Debug + Send + Sync + 'static {
    /// Its `type`.
    fn kind(&self) -> &'static str;

    /// The input names it delivers when they are not entities of this config (a legacy
    /// database's tables); empty when its inputs are the config's entities.
    fn tables(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether it may deliver a row again as if new (a snapshot taken again): the processor
    /// then writes no document equal to the output's current version.
    fn redelivers(&self) -> bool {
        false
    }

    /// Reads into `run.intake` until `run.stop`.
    async fn run(self: Arc<Self>, run: SourceRun);

    /// For tools about one kind of source (`meshql cdc`) to find theirs among a config's.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What a running source is given.
pub struct SourceRun {
    /// The processor's name (consumer and connection names are derived from it).
    pub name: String,
    /// The inputs the processor reads; anything else the source reads is skipped.
    pub inputs: Vec<String>,
    /// Inputs per batch at most.
    pub batch: usize,
    pub intake: Arc<dyn Intake>,
    pub counters: Arc<SourceCounters>,
    pub stop: watch::Receiver<bool>,
}

/// The processor a source feeds.
#[async_trait]
pub trait Intake: Send + Sync {
    /// The processor's name.
    fn processor(&self) -> &str;

    /// The last input position committed with the outputs.
    fn position(&self) -> u64;

    /// Reads the committed position and the dead-letter count, once.
    async fn ensure_loaded(&self) -> Result<(), HandlerError>;

    /// The processor's state rows `keys` (a source's own positions among them).
    async fn state(&self, keys: &[String]) -> Result<HashMap<String, String>, StoreError>;

    /// Plans `items`, sets aside what cannot be applied, and commits the writes, the state,
    /// `extra` state rows (the source's own positions) and the dead letters with `last`.
    async fn apply(
        &self,
        items: Vec<Item<'_>>,
        letters: Vec<DeadLetter>,
        last: u64,
        extra: Vec<StateWrite>,
    ) -> Result<(), HandlerError>;
}

/// What a source's runner shares with the processor's stats.
#[derive(Default)]
pub struct SourceCounters {
    /// Failures to connect, read or commit (each retried with backoff).
    pub errors: AtomicU64,
    /// Messages in the source after the last one read.
    pub lag: AtomicU64,
}

/// Waits before the next attempt after `failures` failures in a row (none after none; 100 ms
/// doubling up to 12.8 s); `false` when `stop` came first.
pub async fn back_off(failures: u32, stop: &mut watch::Receiver<bool>) -> bool {
    if failures == 0 {
        return true;
    }
    let delay = std::time::Duration::from_millis(100 * (1u64 << failures.min(7)));
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.changed() => false,
    }
}

/// A settings error of the source's block, its field under `source`.
pub fn scoped(e: SettingError) -> SettingError {
    SettingError {
        field: Some(match e.field {
            Some(f) => format!("source.{f}"),
            None => "source".into(),
        }),
        message: e.message,
    }
}
