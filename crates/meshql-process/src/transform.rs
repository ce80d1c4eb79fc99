//! Per-change transforms: logic a declaration cannot express, as compiled Rust
//! (`type = "rust"`, a [`Transform`] registered by name) or as a script (`type = "script"`,
//! [`crate::script`]).
//!
//! ```toml
//! [[processor]]
//! name = "events-processor"
//! type = "rust"
//! function = "events.enrich"     # a registered Transform
//! inputs = ["event"]             # the entities whose changes it reads
//! output = "processedevent"      # the entity it writes
//! ```
//!
//! A transform turns one input change into documents of the output entity ([`Emit`]). A
//! document without an id gets one derived from the input's `change_id` and its place in the
//! transform's answer, so the same input always writes the same document: with the output's
//! position committed in the same transaction that is exactly once, and even a replay would
//! only add a version, never a second document. A transform that fails on an input sends it
//! to the dead letters with its message (a transform that panics, too).
//!
//! **Parallel by key, ordered per key.** `parallel = N` (default 1; scripts get N engines)
//! splits each batch into N lanes by a hash of the input's key — the field named by `key`,
//! else the document's id — and runs the lanes at once on blocking threads; inside a lane the
//! inputs keep their order, so one key's changes are transformed in the order they happened.
//! The lanes' documents are then written in the batch's order, in one transaction with the
//! batch's position as before: parallelism changes how fast a batch is computed, never what is
//! committed. Scripts always run off the change feed's own thread (a slow script must not hold
//! up the relays and the other processors); a compiled transform with `parallel = 1` runs
//! inline.

use crate::plan::{Input, Outcome, PlanIo, Planner};
use meshql_core::{ChangeOp, OutputWrite, StoreError};
use parking_lot::RwLock;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// One document a transform writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Emit {
    /// The document's id (`None`: derived from the input, see the module docs).
    pub id: Option<String>,
    /// The document; `None` deletes `id`.
    pub payload: Option<Map<String, Value>>,
}

impl Emit {
    /// A document with a derived id.
    pub fn document(payload: Map<String, Value>) -> Self {
        Self {
            id: None,
            payload: Some(payload),
        }
    }
}

/// Logic compiled into the binary, registered under a name ([`register_transform`]).
pub trait Transform: Send + Sync + 'static {
    /// The documents one input change leads to (none is fine), or why it cannot be
    /// processed (the input becomes a dead letter).
    fn transform(&self, input: &Input) -> Result<Vec<Emit>, String>;

    /// The documents of other entities that transforming `input` reads (a mapping's
    /// `lookup`): the planner reads their current versions, waiting up to each [`Read`]'s
    /// `wait` for one that does not exist yet, and hands them to [`Transform::transform_with`].
    fn reads(&self, input: &Input) -> Vec<Read> {
        let _ = input;
        Vec::new()
    }

    /// The legacy table it reads rows of and the columns it names, each with the setting
    /// that names it (`mapping.fields.eggs`), for `meshql check` to ask the database whether
    /// they exist (`None`: it reads no table's columns by name).
    fn legacy_columns(&self) -> Option<(String, Vec<(String, String)>)> {
        None
    }

    /// How it derives its documents' ids from a legacy table's keys, if it does (for checks
    /// across processors: a reference to another table must name as many key values as that
    /// table's ids are derived from).
    fn derived_ids(&self) -> Option<DerivedIds> {
        None
    }

    /// The entities [`Transform::reads`] may ask for (the runtime opens them for it).
    fn read_entities(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether [`Transform::reads`] can ever ask for something (the planner skips the read
    /// phase otherwise).
    fn has_reads(&self) -> bool {
        !self.read_entities().is_empty()
    }

    /// [`Transform::transform`] with the documents [`Transform::reads`] asked for (those
    /// that did not exist in time are missing from `found`).
    fn transform_with(&self, input: &Input, found: &Found) -> Result<Vec<Emit>, String> {
        let _ = found;
        self.transform(input)
    }
}

/// How a transform derives document ids from a legacy table's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DerivedIds {
    /// The table whose rows become its documents.
    pub table: String,
    /// The key columns an id is derived from.
    pub key: Vec<String>,
    /// The ids it derives of other tables' rows: (setting, table, key values named).
    pub references: Vec<(String, String, usize)>,
}

/// A document a transform reads: the current version of `entity`'s `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub entity: String,
    pub id: String,
    /// How long the input may wait for the document to exist (a parent that arrives after
    /// its child, through another processor) before it is transformed without it.
    pub wait: std::time::Duration,
}

/// The documents read for a batch, by entity and id.
#[derive(Debug, Default)]
pub struct Found(HashMap<(String, String), Map<String, Value>>);

impl Found {
    /// The current document `id` of `entity`, if it existed in time.
    pub fn get(&self, entity: &str, id: &str) -> Option<&Map<String, Value>> {
        self.0.get(&(entity.to_owned(), id.to_owned()))
    }

    /// Records a document (tests and planners).
    pub fn insert(&mut self, entity: &str, id: &str, doc: Map<String, Value>) {
        self.0.insert((entity.to_owned(), id.to_owned()), doc);
    }
}

/// How often a planner looks again for documents its inputs wait for.
const READ_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Reads the documents `inputs` ask for; a missing one is looked for again every
/// [`READ_POLL`] until it exists or its wait is over (the batch waits with it: the inputs
/// keep their order).
async fn read_all(
    transform: &dyn Transform,
    io: &dyn PlanIo,
    inputs: &[Input],
) -> Result<Found, StoreError> {
    let mut wanted: Vec<Read> = Vec::new();
    for input in inputs {
        for r in transform.reads(input) {
            if !wanted
                .iter()
                .any(|w| w.entity == r.entity && w.id == r.id && w.wait >= r.wait)
            {
                wanted.push(r);
            }
        }
    }
    let mut found = Found::default();
    if wanted.is_empty() {
        return Ok(found);
    }
    let started = std::time::Instant::now();
    let mut waited = false;
    loop {
        let mut missing = Vec::new();
        for r in wanted {
            if found.get(&r.entity, &r.id).is_some() {
                continue;
            }
            match io.lookup(&r.entity, &r.id).await? {
                Some(doc) => found.insert(&r.entity, &r.id, doc),
                None => missing.push(r),
            }
        }
        missing.retain(|r| started.elapsed() < r.wait);
        if missing.is_empty() {
            return Ok(found);
        }
        if !waited {
            waited = true;
            tracing::debug!(
                entity = %missing[0].entity,
                id = %missing[0].id,
                "a transform waits for a document that does not exist yet"
            );
        }
        tokio::time::sleep(READ_POLL).await;
        wanted = missing;
    }
}

fn registry() -> &'static RwLock<HashMap<String, Arc<dyn Transform>>> {
    static REGISTRY: OnceLock<RwLock<HashMap<String, Arc<dyn Transform>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut builtins: HashMap<String, Arc<dyn Transform>> = HashMap::new();
        builtins.insert("events.enrich".into(), Arc::new(EnrichEvents));
        RwLock::new(builtins)
    })
}

/// Makes `transform` available to `type = "rust"` processors as `function = name` (call it
/// before the config is checked; a later registration of a name replaces the earlier one).
pub fn register_transform(name: &str, transform: Arc<dyn Transform>) {
    registry().write().insert(name.to_owned(), transform);
}

/// The registered names, sorted.
pub fn transform_names() -> Vec<String> {
    let mut names: Vec<String> = registry().read().keys().cloned().collect();
    names.sort();
    names
}

pub(crate) fn lookup(name: &str) -> Option<Arc<dyn Transform>> {
    registry().read().get(name).cloned()
}

/// The most lanes a transform processor may run at once.
pub const MAX_PARALLEL: usize = 64;

/// A checked transform processor.
#[derive(Clone)]
pub struct TransformSpec {
    pub name: String,
    pub kind: &'static str,
    pub inputs: Vec<String>,
    pub output: String,
    pub batch: usize,
    /// Lanes run at once (see the module docs).
    pub parallel: usize,
    /// The payload field that orders inputs (`None`: the document id).
    pub key: Option<String>,
    pub enabled: bool,
    pub transform: Arc<dyn Transform>,
    /// Kafka topics or a NATS stream to read instead of the service's change log.
    pub source: Option<Arc<dyn crate::source::Source>>,
}

impl std::fmt::Debug for TransformSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformSpec")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("inputs", &self.inputs)
            .field("output", &self.output)
            .finish()
    }
}

/// A transform processor's batches.
pub struct TransformPlanner {
    pub spec: TransformSpec,
    /// A document equal to the output's current version is not written again: its source
    /// may deliver a row twice (a `postgres_cdc` snapshot taken again), and a replay must
    /// change nothing.
    pub skip_unchanged: bool,
}

impl TransformPlanner {
    fn derived_id(&self, input: &Input, index: usize) -> String {
        uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("meshql:{}:{}:{index}", self.spec.name, input.change_id).as_bytes(),
        )
        .to_string()
    }
}

/// What a transform made of one input.
type Made = Result<Vec<Emit>, String>;

/// Runs `transform` on `input`; a panic becomes the input's failure.
fn run_one(transform: &dyn Transform, input: &Input, found: Option<&Found>) -> Made {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match found {
        Some(found) => transform.transform_with(input, found),
        None => transform.transform(input),
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(format!("the transform panicked: {message}"))
    })
}

impl TransformPlanner {
    /// The lane of an input: inputs with the same key share one, in order.
    fn lane(&self, input: &Input) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match self.spec.key.as_deref().and_then(|k| input.payload.get(k)) {
            Some(Value::String(s)) => s.hash(&mut h),
            Some(other) => other.to_string().hash(&mut h),
            None => input.id.hash(&mut h),
        }
        (h.finish() % self.spec.parallel as u64) as usize
    }

    /// The transform's answer for each input, in the inputs' order.
    async fn made(&self, io: &dyn PlanIo, inputs: &[Input]) -> Result<Vec<Made>, StoreError> {
        let transform = &self.spec.transform;
        let found = if transform.has_reads() {
            Some(Arc::new(read_all(transform.as_ref(), io, inputs).await?))
        } else {
            None
        };
        if self.spec.parallel == 1 && self.spec.kind != "script" {
            return Ok(inputs
                .iter()
                .map(|input| run_one(transform.as_ref(), input, found.as_deref()))
                .collect());
        }
        let mut lanes: Vec<Vec<(usize, Input)>> = vec![Vec::new(); self.spec.parallel];
        for (i, input) in inputs.iter().enumerate() {
            lanes[self.lane(input)].push((i, input.clone()));
        }
        let running: Vec<_> = lanes
            .into_iter()
            .filter(|lane| !lane.is_empty())
            .map(|lane| {
                let transform = transform.clone();
                let found = found.clone();
                tokio::task::spawn_blocking(move || {
                    lane.into_iter()
                        .map(|(i, input)| {
                            (i, run_one(transform.as_ref(), &input, found.as_deref()))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut made: Vec<Option<Made>> = vec![None; inputs.len()];
        for lane in futures::future::join_all(running).await {
            let lane =
                lane.map_err(|e| StoreError::Unavailable(format!("a transform lane: {e}")))?;
            for (i, m) in lane {
                made[i] = Some(m);
            }
        }
        Ok(made
            .into_iter()
            .map(|m| m.unwrap_or_else(|| Err("the transform gave no answer".into())))
            .collect())
    }
}

#[async_trait::async_trait]
impl Planner for TransformPlanner {
    fn kind(&self) -> &'static str {
        self.spec.kind
    }

    async fn plan(&self, io: &dyn PlanIo, inputs: &[Input]) -> Result<Outcome, StoreError> {
        let mut outcome = Outcome::default();
        for (i, (input, made)) in inputs.iter().zip(self.made(io, inputs).await?).enumerate() {
            let emits = match made {
                Ok(e) => e,
                Err(reason) => {
                    outcome.dead.push((i, reason));
                    continue;
                }
            };
            for (k, emit) in emits.into_iter().enumerate() {
                let id = emit.id.unwrap_or_else(|| self.derived_id(input, k));
                let write = match emit.payload {
                    Some(payload) => {
                        if self.skip_unchanged
                            && !input.fresh
                            && unchanged(io, &id, &payload).await?
                        {
                            continue;
                        }
                        OutputWrite::Put {
                            id,
                            payload: serde_json::to_string(&payload).expect("a map serialises"),
                        }
                    }
                    None => OutputWrite::Delete { id },
                };
                outcome.writes.push((write, vec![i]));
            }
        }
        Ok(outcome)
    }
}

/// Whether `payload` is what the output's current version of `id` holds (its `id` aside).
async fn unchanged(
    io: &dyn PlanIo,
    id: &str,
    payload: &Map<String, Value>,
) -> Result<bool, StoreError> {
    let Some(mut current) = io.current(id).await? else {
        return Ok(false);
    };
    current.remove("id");
    Ok(if payload.contains_key("id") {
        let mut p = payload.clone();
        p.remove("id");
        p == current
    } else {
        *payload == current
    })
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of milliseconds since the epoch.
pub fn iso_time(ms: i64) -> String {
    let (y, mo, d) = crate::time::civil_from_days(ms.div_euclid(86_400_000));
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// MeshQL's events processor (CONTRACT §7.2): an `event` becomes a `processedevent` whose
/// `processed_data` is the event's `data` (parsed when it is JSON text, else kept as
/// `raw_data`) with `enriched`, `processed_at` and `processor_version`. Deletes and documents
/// without a `name` (initialisation documents) lead to nothing.
pub struct EnrichEvents;

impl Transform for EnrichEvents {
    fn transform(&self, input: &Input) -> Result<Vec<Emit>, String> {
        let started = std::time::Instant::now();
        if input.op == ChangeOp::Delete {
            return Ok(Vec::new());
        }
        let Some(name) = input.payload.get("name").and_then(Value::as_str) else {
            return Ok(Vec::new());
        };
        let mut data = match input.payload.get("data") {
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(m)) => m,
                _ => Map::from_iter([("raw_data".to_owned(), Value::String(text.clone()))]),
            },
            Some(Value::Object(m)) => m.clone(),
            Some(other) => Map::from_iter([("raw_data".to_owned(), other.clone())]),
            None => Map::new(),
        };
        let now = iso_time(meshql_core::now_millis());
        data.insert("enriched".into(), Value::Bool(true));
        data.insert("processed_at".into(), Value::String(now.clone()));
        data.insert("processor_version".into(), Value::String("1.0.0".into()));
        let mut out = Map::new();
        out.insert("raw_event_id".into(), Value::String(input.id.clone()));
        out.insert("name".into(), Value::String(name.to_owned()));
        if let Some(c) = input.payload.get("correlationId").filter(|c| !c.is_null()) {
            out.insert("correlationId".into(), c.clone());
        }
        out.insert(
            "processed_data".into(),
            Value::String(serde_json::to_string(&data).expect("a map serialises")),
        );
        out.insert("processed_timestamp".into(), Value::String(now));
        out.insert("status".into(), Value::String("SUCCESS".into()));
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        out.insert(
            "processing_time_ms".into(),
            crate::expr::number((ms * 1000.0).ceil() / 1000.0),
        );
        Ok(vec![Emit::document(out)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(payload: Value, op: ChangeOp) -> Input {
        Input {
            position: 7,
            change_id: "event:e1:5".into(),
            entity: "event".into(),
            id: "e1".into(),
            op,
            created_at: 5,
            correlation_id: None,
            payload: payload.as_object().unwrap().clone(),
            order: (0, 7),
            fresh: false,
        }
    }

    #[test]
    fn iso_times() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_time(1_709_513_023_456), "2024-03-04T00:43:43.456Z");
    }

    #[test]
    fn events_are_enriched_as_meshql_does() {
        let e = input(
            json!({"name": "signup", "correlationId": "c-1", "data": "{\"user_id\":\"u1\",\"username\":\"ann\"}"}),
            ChangeOp::Create,
        );
        let out = EnrichEvents.transform(&e).unwrap();
        assert_eq!(out.len(), 1);
        let doc = out[0].payload.as_ref().unwrap();
        assert_eq!(doc["raw_event_id"], "e1");
        assert_eq!(doc["name"], "signup");
        assert_eq!(doc["correlationId"], "c-1");
        assert_eq!(doc["status"], "SUCCESS");
        assert!(doc["processing_time_ms"].as_f64().unwrap() > 0.0);
        let data: Value = serde_json::from_str(doc["processed_data"].as_str().unwrap()).unwrap();
        assert_eq!(data["user_id"], "u1");
        assert_eq!(data["username"], "ann");
        assert_eq!(data["enriched"], true);
        assert_eq!(data["processor_version"], "1.0.0");
        // not JSON: kept as raw_data; no name or a delete: nothing
        let raw = EnrichEvents
            .transform(&input(
                json!({"name": "x", "data": "plain"}),
                ChangeOp::Create,
            ))
            .unwrap();
        let data: Value = serde_json::from_str(
            raw[0].payload.as_ref().unwrap()["processed_data"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["raw_data"], "plain");
        assert!(EnrichEvents
            .transform(&input(json!({"data": "{}"}), ChangeOp::Create))
            .unwrap()
            .is_empty());
        assert!(EnrichEvents
            .transform(&input(json!({"name": "x"}), ChangeOp::Delete))
            .unwrap()
            .is_empty());
    }

    struct NoIo;

    #[async_trait::async_trait]
    impl PlanIo for NoIo {
        async fn state(&self, _: &[String]) -> Result<HashMap<String, String>, StoreError> {
            Ok(HashMap::new())
        }
        async fn group(&self, _: &str) -> Result<Vec<(String, String)>, StoreError> {
            Ok(Vec::new())
        }
        async fn lookup(&self, _: &str, _: &str) -> Result<Option<Map<String, Value>>, StoreError> {
            Ok(None)
        }
    }

    /// Sleeps in each call, and records how many calls overlapped and each key's sequence.
    #[derive(Default)]
    struct Slow {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        seen: parking_lot::Mutex<Vec<(String, u64)>>,
    }

    impl Transform for Slow {
        fn transform(&self, input: &Input) -> Result<Vec<Emit>, String> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            let k = input.payload["k"].as_str().unwrap().to_owned();
            let n = input.payload["n"].as_u64().unwrap();
            self.seen.lock().push((k.clone(), n));
            self.running.fetch_sub(1, SeqCst);
            if n == 3 && k == "b" {
                panic!("no b3");
            }
            Ok(vec![Emit::document(
                json!({"k": k, "n": n}).as_object().unwrap().clone(),
            )])
        }
    }

    fn planner(
        transform: Arc<dyn Transform>,
        parallel: usize,
        key: Option<&str>,
    ) -> TransformPlanner {
        TransformPlanner {
            spec: TransformSpec {
                name: "t".into(),
                kind: "rust",
                inputs: vec!["event".into()],
                output: "out".into(),
                batch: 100,
                parallel,
                key: key.map(str::to_owned),
                enabled: true,
                transform,
                source: None,
            },
            skip_unchanged: false,
        }
    }

    /// Four keys, six changes each, interleaved; each a different document (the lane follows
    /// `key`, not the id).
    fn keyed_inputs() -> Vec<Input> {
        let mut inputs = Vec::new();
        for n in 0..6u64 {
            for k in ["a", "b", "c", "d"] {
                let mut i = input(json!({"k": k, "n": n}), ChangeOp::Create);
                i.id = format!("{k}{n}");
                i.change_id = format!("event:{k}{n}:{n}");
                inputs.push(i);
            }
        }
        inputs
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lanes_run_at_once_and_each_key_keeps_its_order() {
        let slow = Arc::new(Slow::default());
        let p = planner(slow.clone(), 4, Some("k"));
        let inputs = keyed_inputs();
        let outcome = p.plan(&NoIo, &inputs).await.unwrap();
        assert!(
            slow.most.load(std::sync::atomic::Ordering::SeqCst) > 1,
            "the lanes overlapped"
        );
        // each key's changes were transformed in order, in one lane
        let seen = slow.seen.lock().clone();
        assert_eq!(seen.len(), inputs.len());
        for k in ["a", "b", "c", "d"] {
            let order: Vec<u64> = seen
                .iter()
                .filter(|(x, _)| x == k)
                .map(|(_, n)| *n)
                .collect();
            assert_eq!(order, (0..6).collect::<Vec<_>>(), "key {k}");
        }
        // the writes come in the batch's order, whatever lane finished first; the panic is
        // the one dead letter, the lane goes on after it
        assert_eq!(outcome.dead.len(), 1);
        let (dead, reason) = &outcome.dead[0];
        assert_eq!(inputs[*dead].id, "b3");
        assert!(reason.contains("panicked: no b3"), "{reason}");
        let indexes: Vec<usize> = outcome.writes.iter().map(|(_, from)| from[0]).collect();
        let expected: Vec<usize> = (0..inputs.len()).filter(|i| i != dead).collect();
        assert_eq!(indexes, expected);
        // the same ids as a run in one lane: parallelism changes nothing that is written
        let one = planner(Arc::new(Slow::default()), 1, None)
            .plan(&NoIo, &inputs)
            .await
            .unwrap();
        let ids = |o: &Outcome| -> Vec<String> {
            o.writes
                .iter()
                .map(|(w, _)| match w {
                    OutputWrite::Put { id, payload } => format!("{id} {payload}"),
                    OutputWrite::Delete { id } => id.clone(),
                })
                .collect()
        };
        assert_eq!(ids(&one), ids(&outcome));
    }

    #[tokio::test]
    async fn one_lane_runs_one_call_at_a_time() {
        let slow = Arc::new(Slow::default());
        let p = planner(slow.clone(), 1, None);
        p.plan(&NoIo, &keyed_inputs()[..8]).await.unwrap();
        assert_eq!(slow.most.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
