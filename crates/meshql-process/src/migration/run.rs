//! Running an entity's pending migrations over its store, recording them, and what a dry run
//! shows (see the module docs of [`super`] for the algorithm).

use super::Migration;
use meshql_core::{
    now_millis, DynStore, Envelope, Millis, OutputBatch, OutputWrite, ReadContext, StateWrite,
    StoreError, WriteContext,
};
use meshql_engine::PayloadValidator;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Why migrations could not run.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("entity `{entity}`: {error}")]
    Store { entity: String, error: StoreError },
    #[error(
        "entity `{entity}` declares migrations, which are recorded with its documents; its \
         storage cannot commit them together yet (SQLite, PostgreSQL, MySQL/MariaDB and memory can)"
    )]
    Unsupported { entity: String },
    #[error(
        "entity `{entity}`: migration `{pending}` is declared before `{applied}`, which has \
         run already: declare new migrations after the ones that ran"
    )]
    OutOfOrder {
        entity: String,
        pending: String,
        applied: String,
    },
    #[error(
        "entity `{entity}`: the run of {} was interrupted, and they are not the next pending \
         migrations, as they were declared then, any more (now pending: {}): declare them \
         again as they were to finish the run",
        names(.running),
        names(.pending)
    )]
    Interrupted {
        entity: String,
        running: Vec<String>,
        pending: Vec<String>,
    },
    #[error("entity `{entity}`, document {id}: migration `{migration}`: {reason}")]
    Transform {
        entity: String,
        id: String,
        migration: String,
        reason: String,
    },
    #[error(
        "entity `{entity}`, document {id}: after {} the document fails the entity's JSON \
         Schema: {}; nothing of its batch was written (fix the declaration and start again: \
         the run resumes there)",
        names(.migrations),
        complaints_text(.violations)
    )]
    Invalid {
        entity: String,
        id: String,
        migrations: Vec<String>,
        violations: Vec<Value>,
    },
    #[error(
        "entity `{entity}`: {} would leave {} of {} documents unable to be migrated or \
         invalid, so nothing was written: {}",
        names(.migrations),
        .survey.failing + .survey.invalid,
        .survey.read,
        .survey.problems()
    )]
    Refused {
        entity: String,
        migrations: Vec<String>,
        survey: Box<DryRun>,
    },
    #[error("entity `{entity}`: the migration record is unreadable: {reason}")]
    Record { entity: String, reason: String },
}

impl MigrationError {
    /// A stable name for the kind of failure (logs, exit codes, tests).
    pub fn kind(&self) -> &'static str {
        match self {
            MigrationError::Store { .. } => "store",
            MigrationError::Unsupported { .. } => "unsupported",
            MigrationError::OutOfOrder { .. } => "out_of_order",
            MigrationError::Interrupted { .. } => "interrupted",
            MigrationError::Transform { .. } => "transform",
            MigrationError::Invalid { .. } => "invalid",
            MigrationError::Refused { .. } => "refused",
            MigrationError::Record { .. } => "record",
        }
    }
}

fn names(list: &[String]) -> String {
    list.iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn complaints_text(list: &[Value]) -> String {
    list.iter()
        .map(|v| {
            format!(
                "{}: {}",
                v["path"].as_str().unwrap_or("/"),
                v["message"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The record of an applied migration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub name: String,
    /// When its run began and ended (milliseconds since the epoch).
    pub started_at: Millis,
    pub finished_at: Millis,
    /// Documents given a new version by the run it was part of.
    pub documents: u64,
    /// The declaration that ran.
    pub declaration: Value,
    /// The migrations of its run, in the order they were composed.
    #[serde(default)]
    pub run: Vec<String>,
}

/// A run in progress (or interrupted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Running {
    names: Vec<String>,
    /// Their declarations: a run resumes only with the same ones.
    #[serde(default)]
    declarations: Vec<Value>,
    started_at: Millis,
    /// The last id read.
    after: Option<String>,
    migrated: u64,
    unchanged: u64,
}

/// Where a declared migration stands.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Applied(Applied),
    /// Part of a run that began at `started_at` and has not finished (it resumes at the next
    /// start), `migrated` documents so far.
    Running {
        started_at: Millis,
        migrated: u64,
    },
    Pending,
}

/// How a run is going, after each transaction.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub entity: &'a str,
    pub migrations: &'a [String],
    /// Documents read so far (this process), given a new version, and left as they were.
    pub read: u64,
    pub migrated: u64,
    pub unchanged: u64,
}

/// What [`run`] did for one entity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// The migrations recorded as applied by this call.
    pub applied: Vec<String>,
    /// Documents given a new version, left as they were, and skipped as written after the
    /// run began.
    pub migrated: u64,
    pub unchanged: u64,
    pub newer: u64,
    /// Whether an interrupted run was resumed.
    pub resumed: bool,
}

/// What a dry run found for one entity: what the pending migrations would do, nothing written.
#[derive(Debug, Clone, Default)]
pub struct DryRun {
    pub pending: Vec<String>,
    pub read: u64,
    /// Documents that would get a new version.
    pub changed: u64,
    /// Documents the migrations would make invalid (a run would stop at the first), with a
    /// few examples: id and the schema's complaints.
    pub invalid: u64,
    pub invalid_examples: Vec<(String, Vec<Value>)>,
    /// Documents whose transformation fails, with a few examples: id and reason.
    pub failing: u64,
    pub failing_examples: Vec<(String, String)>,
    /// A sample of the changed documents.
    pub sample: Vec<Changed>,
}

/// A document a migration changes: its id, and the document before and after.
#[derive(Debug, Clone)]
pub struct Changed {
    pub id: String,
    pub before: Map<String, Value>,
    pub after: Map<String, Value>,
}

impl DryRun {
    /// The examples of what fails, one per line after the first.
    pub fn problems(&self) -> String {
        let mut lines: Vec<String> = self
            .failing_examples
            .iter()
            .map(|(id, reason)| format!("document {id}: {reason}"))
            .collect();
        lines.extend(self.invalid_examples.iter().map(|(id, v)| {
            format!(
                "document {id} fails the JSON Schema: {}",
                complaints_text(v)
            )
        }));
        lines.join("; ")
    }
}

/// The consumer whose outputs record `entity`'s migrations (`:` never appears in a
/// processor's name, so it cannot collide with one).
pub fn consumer(entity: &str) -> String {
    format!("migration:{entity}")
}

const RUN_KEY: &str = "run";
const APPLIED_GROUP: &str = "applied";
/// Examples a dry run keeps per kind of problem.
const EXAMPLES: usize = 3;

/// What the store records, and which declared migrations are pending.
struct Plan<'m> {
    applied: HashMap<String, Applied>,
    running: Option<Running>,
    pending: Vec<&'m Migration>,
}

async fn plan<'m>(
    entity: &str,
    store: &DynStore,
    migrations: &'m [Migration],
) -> Result<Plan<'m>, MigrationError> {
    if !store.supports_outputs() {
        return Err(MigrationError::Unsupported {
            entity: entity.to_owned(),
        });
    }
    let consumer = consumer(entity);
    let failed = |error| MigrationError::Store {
        entity: entity.to_owned(),
        error,
    };
    let unreadable = |reason: String| MigrationError::Record {
        entity: entity.to_owned(),
        reason,
    };
    let mut applied = HashMap::new();
    for (_, value) in store
        .output_group(&consumer, APPLIED_GROUP)
        .await
        .map_err(failed)?
    {
        let a: Applied = serde_json::from_str(&value).map_err(|e| unreadable(e.to_string()))?;
        applied.insert(a.name.clone(), a);
    }
    let running = match store
        .output_state(&consumer, &[RUN_KEY.to_owned()])
        .await
        .map_err(failed)?
        .get(RUN_KEY)
    {
        Some(text) => {
            Some(serde_json::from_str::<Running>(text).map_err(|e| unreadable(e.to_string()))?)
        }
        None => None,
    };
    let mut first_pending: Option<&str> = None;
    let mut pending = Vec::new();
    for m in migrations {
        if applied.contains_key(m.name()) {
            if let Some(p) = first_pending {
                return Err(MigrationError::OutOfOrder {
                    entity: entity.to_owned(),
                    pending: p.to_owned(),
                    applied: m.name().to_owned(),
                });
            }
        } else {
            first_pending.get_or_insert(m.name());
            pending.push(m);
        }
    }
    if let Some(r) = &running {
        let next: Vec<String> = pending
            .iter()
            .take(r.names.len())
            .map(|m| m.name().to_owned())
            .collect();
        let same = pending
            .iter()
            .zip(&r.declarations)
            .all(|(m, d)| m.declaration() == d);
        if next != r.names || !same {
            return Err(MigrationError::Interrupted {
                entity: entity.to_owned(),
                running: r.names.clone(),
                pending: pending.iter().map(|m| m.name().to_owned()).collect(),
            });
        }
    }
    Ok(Plan {
        applied,
        running,
        pending,
    })
}

/// Where each declared migration of `entity` stands, in declaration order.
pub async fn status(
    entity: &str,
    store: &DynStore,
    migrations: &[Migration],
) -> Result<Vec<(String, State)>, MigrationError> {
    let mut plan = plan(entity, store, migrations).await?;
    Ok(migrations
        .iter()
        .map(|m| {
            let state = match plan.applied.remove(m.name()) {
                Some(a) => State::Applied(a),
                None => match &plan.running {
                    Some(r) if r.names.iter().any(|n| n == m.name()) => State::Running {
                        started_at: r.started_at,
                        migrated: r.migrated,
                    },
                    _ => State::Pending,
                },
            };
            (m.name().to_owned(), state)
        })
        .collect())
}

/// `doc` after each of `set`, in order (`Err`: the migration that failed and why).
fn transform(
    set: &[&Migration],
    doc: &Map<String, Value>,
) -> Result<Map<String, Value>, (String, String)> {
    let mut out = doc.clone();
    for m in set {
        out = m.apply(&out).map_err(|e| (m.name().to_owned(), e))?;
    }
    Ok(out)
}

/// The schema's complaints about `doc`, validated as a write's body is (without its `id`).
fn complaints(validator: &PayloadValidator, doc: &Map<String, Value>) -> Vec<Value> {
    let mut body = doc.clone();
    body.remove("id");
    validator.violations(&Value::Object(body))
}

fn payload(entity: &str, doc: &Envelope) -> Result<Map<String, Value>, MigrationError> {
    doc.payload_map().map_err(|e| MigrationError::Store {
        entity: entity.to_owned(),
        error: StoreError::Invalid(format!("document {}: {e}", doc.id)),
    })
}

/// Runs `entity`'s pending `migrations` (all its declared ones, in order) over `store`,
/// validating what they write with `validator`; `progress` is told after each transaction.
/// Returns at once when none is pending.
pub async fn run(
    entity: &str,
    store: &DynStore,
    migrations: &[Migration],
    validator: Option<&PayloadValidator>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Report, MigrationError> {
    let Plan {
        mut running,
        pending,
        ..
    } = plan(entity, store, migrations).await?;
    let mut report = Report::default();
    let consumer = consumer(entity);
    let failed = |error| MigrationError::Store {
        entity: entity.to_owned(),
        error,
    };
    let mut pending = pending.as_slice();
    while !pending.is_empty() {
        let mut position = store
            .output_position(&consumer)
            .await
            .map_err(failed)?
            .unwrap_or(0);
        // every document is transformed and validated before anything is written: a run
        // that would stop half-way does not start
        let (set_len, after, since) = match &running {
            Some(r) => (r.names.len(), r.after.clone(), r.started_at),
            None => (pending.len(), None, Millis::MAX),
        };
        let check = survey(
            entity,
            store,
            &pending[..set_len],
            validator,
            after,
            since,
            0,
        )
        .await?;
        if check.failing > 0 || check.invalid > 0 {
            return Err(MigrationError::Refused {
                entity: entity.to_owned(),
                migrations: check.pending.clone(),
                survey: Box::new(check),
            });
        }
        let mut run = match running.take() {
            Some(r) => {
                report.resumed = true;
                r
            }
            None => {
                let r = Running {
                    names: pending.iter().map(|m| m.name().to_owned()).collect(),
                    declarations: pending.iter().map(|m| m.declaration().clone()).collect(),
                    started_at: now_millis(),
                    after: None,
                    migrated: 0,
                    unchanged: 0,
                };
                // the start time is durable before any document is written in the new
                // shape: what tells the documents of this run from the ones before it
                position += 1;
                let mut batch = OutputBatch::new(&consumer, position);
                batch.state.push(run_state(&r));
                store
                    .apply_output(batch, &WriteContext::SYSTEM)
                    .await
                    .map_err(failed)?;
                // what this run writes is stamped after `started_at`; what was written in
                // its millisecond, before it, is not
                while now_millis() <= r.started_at {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                r
            }
        };
        let (set, rest) = pending.split_at(run.names.len());
        pending = rest;
        let size = set
            .iter()
            .map(|m| m.batch())
            .min()
            .unwrap_or(super::DEFAULT_BATCH);
        let ctx = WriteContext {
            correlation_id: Some(format!("{consumer}:{}", run.names.join(","))),
            ..WriteContext::SYSTEM
        };
        let mut read = 0u64;
        loop {
            let page = store
                .list_page(run.after.as_deref(), size, &ReadContext::LATEST)
                .await
                .map_err(failed)?;
            let Some(last) = page.last() else { break };
            let last = last.id.clone();
            let mut writes = Vec::new();
            for doc in &page {
                read += 1;
                if doc.created_at > run.started_at {
                    report.newer += 1;
                    continue;
                }
                let before = payload(entity, doc)?;
                let after = transform(set, &before).map_err(|(migration, reason)| {
                    MigrationError::Transform {
                        entity: entity.to_owned(),
                        id: doc.id.clone(),
                        migration,
                        reason,
                    }
                })?;
                if after == before {
                    run.unchanged += 1;
                    continue;
                }
                if let Some(v) = validator {
                    let violations = complaints(v, &after);
                    if !violations.is_empty() {
                        return Err(MigrationError::Invalid {
                            entity: entity.to_owned(),
                            id: doc.id.clone(),
                            migrations: run.names.clone(),
                            violations,
                        });
                    }
                }
                let text = serde_json::to_string(&after).expect("a JSON map serialises");
                writes.push(OutputWrite::Put {
                    id: doc.id.clone(),
                    payload: text,
                });
                run.migrated += 1;
            }
            run.after = Some(last);
            position += 1;
            let mut batch = OutputBatch::new(&consumer, position);
            batch.writes = writes;
            batch.state.push(run_state(&run));
            store.apply_output(batch, &ctx).await.map_err(failed)?;
            progress(Progress {
                entity,
                migrations: &run.names,
                read,
                migrated: run.migrated,
                unchanged: run.unchanged,
            });
            if page.len() < size {
                break;
            }
        }
        // the end: each migration recorded as applied, the run forgotten, in one commit
        let finished_at = now_millis();
        position += 1;
        let mut batch = OutputBatch::new(&consumer, position);
        for m in set {
            let applied = Applied {
                name: m.name().to_owned(),
                started_at: run.started_at,
                finished_at,
                documents: run.migrated,
                declaration: m.declaration().clone(),
                run: run.names.clone(),
            };
            batch.state.push(StateWrite {
                key: format!("{APPLIED_GROUP}/{}", m.name()),
                group: Some(APPLIED_GROUP.to_owned()),
                value: Some(serde_json::to_string(&applied).expect("a record serialises")),
            });
        }
        batch.state.push(StateWrite {
            key: RUN_KEY.to_owned(),
            group: None,
            value: None,
        });
        store
            .apply_output(batch, &WriteContext::SYSTEM)
            .await
            .map_err(failed)?;
        report.applied.extend(run.names.iter().cloned());
        report.migrated += run.migrated;
        report.unchanged += run.unchanged;
    }
    Ok(report)
}

/// Puts `entity`'s migration records back as they stood at `at`, after a restore to that
/// moment removed every version written later: a migration whose run began after it is
/// pending again; one whose run was going on then becomes an interrupted run, which resumes
/// from the first document at the next start (the documents it had migrated by `at` were
/// written after the run began, so they are left alone). Says what it changed.
pub async fn rewind(
    entity: &str,
    store: &DynStore,
    at: Millis,
) -> Result<Vec<String>, MigrationError> {
    if !store.supports_outputs() {
        return Ok(Vec::new());
    }
    let consumer = consumer(entity);
    let failed = |error| MigrationError::Store {
        entity: entity.to_owned(),
        error,
    };
    let unreadable = |reason: String| MigrationError::Record {
        entity: entity.to_owned(),
        reason,
    };
    let mut state = Vec::new();
    let mut said = Vec::new();
    let mut resumed: Option<Running> = None;
    let running = store
        .output_state(&consumer, &[RUN_KEY.to_owned()])
        .await
        .map_err(failed)?;
    if let Some(text) = running.get(RUN_KEY) {
        let mut r: Running = serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        if r.started_at > at {
            said.push(format!(
                "{entity}: the run of {} began after the moment: pending again",
                names(&r.names)
            ));
            state.push(StateWrite {
                key: RUN_KEY.to_owned(),
                group: None,
                value: None,
            });
        } else {
            r.after = None;
            resumed = Some(r);
        }
    }
    let mut partial: Vec<Applied> = Vec::new();
    for (key, value) in store
        .output_group(&consumer, APPLIED_GROUP)
        .await
        .map_err(failed)?
    {
        let a: Applied = serde_json::from_str(&value).map_err(|e| unreadable(e.to_string()))?;
        if a.finished_at <= at {
            continue;
        }
        state.push(StateWrite {
            key,
            group: Some(APPLIED_GROUP.to_owned()),
            value: None,
        });
        if a.started_at > at {
            said.push(format!(
                "{entity}: `{}` ran after the moment: pending again",
                a.name
            ));
        } else {
            partial.push(a);
        }
    }
    if let Some(first) = partial.first() {
        // a run going on at the moment: its migrations, in their order
        let started_at = first.started_at;
        let mut of_run: Vec<&Applied> = partial
            .iter()
            .filter(|a| a.started_at == started_at)
            .collect();
        let order = |a: &Applied| {
            first
                .run
                .iter()
                .position(|n| *n == a.name)
                .unwrap_or(usize::MAX)
        };
        of_run.sort_by_key(|a| (order(a), a.name.clone()));
        resumed = Some(Running {
            names: of_run.iter().map(|a| a.name.clone()).collect(),
            declarations: of_run.iter().map(|a| a.declaration.clone()).collect(),
            started_at,
            after: None,
            migrated: 0,
            unchanged: 0,
        });
    }
    if let Some(r) = resumed {
        said.push(format!(
            "{entity}: {} was running at the moment: it resumes when served",
            names(&r.names)
        ));
        state.push(run_state(&r));
    }
    if state.is_empty() {
        return Ok(said);
    }
    let position = store
        .output_position(&consumer)
        .await
        .map_err(failed)?
        .unwrap_or(0);
    let mut batch = OutputBatch::new(&consumer, position + 1);
    batch.state = state;
    store
        .apply_output(batch, &WriteContext::SYSTEM)
        .await
        .map_err(failed)?;
    Ok(said)
}

fn run_state(run: &Running) -> StateWrite {
    StateWrite {
        key: RUN_KEY.to_owned(),
        group: None,
        value: Some(serde_json::to_string(run).expect("a run serialises")),
    }
}

/// What `entity`'s pending migrations would do, without writing: every current document is
/// read and transformed; `sample` changed documents are kept with their before and after.
pub async fn dry_run(
    entity: &str,
    store: &DynStore,
    migrations: &[Migration],
    validator: Option<&PayloadValidator>,
    sample: usize,
) -> Result<DryRun, MigrationError> {
    let plan = plan(entity, store, migrations).await?;
    let (after, started_at) = match &plan.running {
        Some(r) => (r.after.clone(), r.started_at),
        None => (None, Millis::MAX),
    };
    survey(
        entity,
        store,
        &plan.pending,
        validator,
        after,
        started_at,
        sample,
    )
    .await
}

/// Reads the documents after `after` not written after `started_at`, and counts what `set`
/// does to them.
async fn survey(
    entity: &str,
    store: &DynStore,
    set: &[&Migration],
    validator: Option<&PayloadValidator>,
    mut after: Option<String>,
    started_at: Millis,
    sample: usize,
) -> Result<DryRun, MigrationError> {
    let mut out = DryRun {
        pending: set.iter().map(|m| m.name().to_owned()).collect(),
        ..DryRun::default()
    };
    if set.is_empty() {
        return Ok(out);
    }
    loop {
        let page = store
            .list_page(after.as_deref(), super::MAX_BATCH, &ReadContext::LATEST)
            .await
            .map_err(|error| MigrationError::Store {
                entity: entity.to_owned(),
                error,
            })?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        for doc in &page {
            if doc.created_at > started_at {
                continue;
            }
            out.read += 1;
            let before = payload(entity, doc)?;
            let changed = match transform(set, &before) {
                Ok(changed) => changed,
                Err((migration, reason)) => {
                    out.failing += 1;
                    if out.failing_examples.len() < EXAMPLES {
                        out.failing_examples
                            .push((doc.id.clone(), format!("`{migration}`: {reason}")));
                    }
                    continue;
                }
            };
            if changed == before {
                continue;
            }
            out.changed += 1;
            if let Some(v) = validator {
                let violations = complaints(v, &changed);
                if !violations.is_empty() {
                    out.invalid += 1;
                    if out.invalid_examples.len() < EXAMPLES {
                        out.invalid_examples.push((doc.id.clone(), violations));
                    }
                }
            }
            if out.sample.len() < sample {
                out.sample.push(Changed {
                    id: doc.id.clone(),
                    before,
                    after: changed,
                });
            }
        }
        if page.len() < super::MAX_BATCH {
            break;
        }
    }
    Ok(out)
}
