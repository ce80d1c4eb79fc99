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

/// What a source crate or file implements: its `type`, its settings and their checks, and
/// how it reads. Registering it is one line (`SourceType::<MySource>::new()`), and the
/// object-safe [`Source`] the runtime runs comes with it.
pub trait SourceKind: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// The `type` value that selects it.
    const KIND: &'static str;
    /// The block's fields but `type` (checked once for every kind).
    type Settings: serde::de::DeserializeOwned + schemars::JsonSchema;

    /// Checks the block's fields (errors name `source.<field>`).
    fn check(settings: Self::Settings) -> Result<Self, SettingError>;

    /// Reads into `run.intake` until `run.stop`.
    fn read(self, run: SourceRun) -> impl std::future::Future<Output = ()> + Send;

    /// See [`Source::tables`].
    fn tables(&self) -> Vec<String> {
        Vec::new()
    }

    /// See [`Source::redelivers`].
    fn redelivers(&self) -> bool {
        false
    }
}

/// Registers the source kind `S` with the sources registry.
pub struct SourceType<S>(std::marker::PhantomData<fn() -> S>);

impl<S> SourceType<S> {
    pub fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<S> Default for SourceType<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: SourceKind> meshql_core::Component<Sources> for SourceType<S> {
    const KIND: &'static str = S::KIND;
    type Settings = S::Settings;

    fn parse(&self, settings: &serde_json::Value) -> Result<S::Settings, SettingError> {
        fields::<S>(settings)
    }

    fn build(&self, settings: S::Settings, _: &()) -> Result<Arc<dyn Source>, SettingError> {
        Ok(Arc::new(S::check(settings)?))
    }
}

/// Reads and checks a `source` block of kind `S` (tests, tools).
pub fn compile<S: SourceKind>(settings: &serde_json::Value) -> Result<S, SettingError> {
    S::check(fields::<S>(settings)?)
}

/// A block's fields but `type`, which must name `S` (errors name `source.<field>`).
fn fields<S: SourceKind>(settings: &serde_json::Value) -> Result<S::Settings, SettingError> {
    let mut block = settings.clone();
    if let Some(fields) = block.as_object_mut() {
        match fields.remove("type") {
            Some(serde_json::Value::String(kind)) if kind == S::KIND => {}
            Some(other) => {
                let kind = other
                    .as_str()
                    .map_or_else(|| other.to_string(), str::to_owned);
                return Err(SettingError::new(
                    "source.type",
                    format!("`{kind}` is not a {} source", S::KIND),
                ));
            }
            None => {}
        }
    }
    meshql_core::parse_settings(&block).map_err(scoped)
}

#[async_trait]
impl<S: SourceKind> Source for S {
    fn kind(&self) -> &'static str {
        S::KIND
    }

    fn tables(&self) -> Vec<String> {
        SourceKind::tables(self)
    }

    fn redelivers(&self) -> bool {
        SourceKind::redelivers(self)
    }

    async fn run(self: Arc<Self>, run: SourceRun) {
        (*self).clone().read(run).await
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
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
