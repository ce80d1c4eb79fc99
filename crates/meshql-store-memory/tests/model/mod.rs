//! A model-based test of the temporal semantics (CONTRACT §3.4, §4.2, §4.4; issue 11 item
//! 10), shared by the memory and SQLite stores' `tests/temporal_model.rs` (the SQLite crate
//! includes this file by path).
//!
//! Sequences of writes (create with an explicit id and, or not, an explicit `created_at`;
//! update; remove) and reads (read, read_many, list, list_page, each now or `at` some time;
//! versions) on a few ids run against the store and against a reference model: per id, its
//! versions `(created_at, Some(n) | None for a tombstone)` in time order. After every step the
//! store's answer must be the model's.
//!
//! The model's rules, as the contract and `meshql_core::Placement` state them:
//! * a version written "now" becomes the newest, 1 ms after the newest when the clock has not
//!   moved past it (its stamp is read back from the store and checked against the clock
//!   around the call); a tombstone is always written "now";
//! * a version with an explicit `created_at` at or after the newest becomes the newest (1 ms
//!   after it when equal); one before the newest is back-dated into the history, moved by
//!   +1 ms while its stamp is taken, and becomes the newest only if that moves it past it;
//! * a read at `T` sees the latest version with `created_at <= T`, nothing when that is a
//!   tombstone; a read now sees the newest version, nothing when it is a tombstone;
//! * an update needs a newest version that is not a tombstone (else nothing is written);
//!   a remove answers NotFound with no versions, AlreadyDeleted when the newest is a
//!   tombstone, else appends a tombstone.

use meshql_core::{
    now_millis, DynStore, Envelope, Millis, NewDocument, ReadContext, RemoveOutcome, TokenFilter,
    WriteContext,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub const IDS: &[&str] = &["a", "b", "c", "d"];

/// When a read looks.
#[derive(Debug, Clone)]
pub enum At {
    Now,
    /// `t0 + offset`.
    Offset(i64),
    /// The `k`-th stamp the model holds (mod their number), plus `delta` ms.
    Stamp(usize, i64),
}

#[derive(Debug, Clone)]
pub enum Op {
    /// `at`: an explicit `created_at` as an offset from `t0`, or now.
    Create {
        id: usize,
        at: Option<i64>,
        n: i64,
    },
    Update {
        id: usize,
        at: Option<i64>,
        n: i64,
    },
    Remove {
        id: usize,
    },
    Read {
        id: usize,
        at: At,
    },
    ReadMany {
        ids: Vec<usize>,
        at: At,
    },
    List {
        at: At,
    },
    ListPage {
        after: Option<usize>,
        limit: usize,
        at: At,
    },
    Versions {
        id: usize,
    },
}

/// Explicit stamps fall from 0.5 s before the test's start to 0.5 s after it, so they land
/// before, among and after the versions written now.
const SPAN: i64 = 1000;

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        1 => Just(At::Now),
        2 => (-5..SPAN + 100).prop_map(At::Offset),
        3 => (any::<usize>(), -1i64..=1).prop_map(|(k, d)| At::Stamp(k, d)),
    ]
}

fn stamp() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        1 => Just(None),
        // a few distinct values so that stamps collide
        2 => (0..8i64).prop_map(|k| Some(k * 100)),
        2 => (0..SPAN).prop_map(Some),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS.len();
    prop_oneof![
        4 => (id.clone(), stamp(), 0..1000i64).prop_map(|(id, at, n)| Op::Create { id, at, n }),
        3 => (id.clone(), stamp(), 0..1000i64).prop_map(|(id, at, n)| Op::Update { id, at, n }),
        2 => id.clone().prop_map(|id| Op::Remove { id }),
        3 => (id.clone(), at()).prop_map(|(id, at)| Op::Read { id, at }),
        1 => (prop::collection::vec(id.clone(), 0..6), at())
            .prop_map(|(ids, at)| Op::ReadMany { ids, at }),
        2 => at().prop_map(|at| Op::List { at }),
        1 => (prop::option::of(id.clone()), 0..5usize, at())
            .prop_map(|(after, limit, at)| Op::ListPage { after, limit, at }),
        1 => id.prop_map(|id| Op::Versions { id }),
    ]
}

/// One version as the model holds it: its stamp and `n`, or `None` for a tombstone.
type Version = (Millis, Option<i64>);

#[derive(Debug, Default)]
struct Model {
    docs: BTreeMap<String, Vec<Version>>,
}

impl Model {
    fn newest(&self, id: &str) -> Option<&Version> {
        self.docs.get(id).and_then(|v| v.last())
    }

    /// Where an explicitly stamped version goes (see the module doc).
    fn place_explicit(&self, id: &str, mut stamp: Millis) -> Millis {
        let versions = self.docs.get(id).map(Vec::as_slice).unwrap_or_default();
        match versions.last() {
            None => stamp,
            Some(&(last, _)) if stamp >= last => stamp.max(last + 1),
            Some(_) => {
                while versions.iter().any(|(t, _)| *t == stamp) {
                    stamp += 1;
                }
                stamp
            }
        }
    }

    fn insert(&mut self, id: &str, stamp: Millis, n: Option<i64>) {
        let versions = self.docs.entry(id.to_owned()).or_default();
        assert!(
            versions.iter().all(|(t, _)| *t != stamp),
            "model: stamp {stamp} taken"
        );
        let pos = versions.partition_point(|(t, _)| *t < stamp);
        versions.insert(pos, (stamp, n));
    }

    /// The version of `id` a read at `at` sees (tombstones included).
    fn at(&self, id: &str, at: Option<Millis>) -> Option<&Version> {
        let versions = self.docs.get(id)?;
        match at {
            None => versions.last(),
            Some(at) => versions.iter().rev().find(|(t, _)| *t <= at),
        }
    }

    /// What a read sees: `(stamp, n)` of a live version.
    fn visible(&self, id: &str, at: Option<Millis>) -> Option<(Millis, i64)> {
        self.at(id, at).and_then(|&(t, n)| n.map(|n| (t, n)))
    }

    fn stamps(&self) -> Vec<Millis> {
        self.docs.values().flatten().map(|(t, _)| *t).collect()
    }
}

/// What a read answered, reduced to what the model knows: `(id, created_at, n)`.
fn seen(e: &Envelope) -> Result<(String, Millis, i64), TestCaseError> {
    prop_assert!(!e.deleted, "a read returned a tombstone: {e:?}");
    let p: Value = serde_json::from_str(&e.payload)
        .map_err(|err| TestCaseError::fail(format!("payload not JSON: {err}: {e:?}")))?;
    prop_assert_eq!(&p["id"], &json!(e.id), "the payload carries its id");
    let n = p["n"]
        .as_i64()
        .ok_or_else(|| TestCaseError::fail(format!("payload without n: {e:?}")))?;
    Ok((e.id.clone(), e.created_at, n))
}

pub struct Run {
    store: DynStore,
    model: Model,
    t0: Millis,
}

impl Run {
    pub fn new(store: DynStore) -> Self {
        Run {
            store,
            model: Model::default(),
            t0: now_millis() - SPAN / 2,
        }
    }

    fn resolve(&self, at: &At) -> Option<Millis> {
        match at {
            At::Now => None,
            At::Offset(o) => Some(self.t0 + o),
            At::Stamp(k, d) => {
                let stamps = self.model.stamps();
                if stamps.is_empty() {
                    Some(self.t0 + d)
                } else {
                    Some(stamps[k % stamps.len()] + d)
                }
            }
        }
    }

    /// Checks a stamp the store chose for a version written now, given the clock before
    /// and after the call and the newest stamp before it.
    fn check_now_stamp(
        stamp: Millis,
        before: Millis,
        after: Millis,
        newest: Option<Millis>,
    ) -> Result<(), TestCaseError> {
        let floor = newest.map_or(before, |n| before.max(n + 1));
        let ceiling = newest.map_or(after, |n| after.max(n + 1));
        prop_assert!(
            (floor..=ceiling).contains(&stamp),
            "a version written now got {stamp}, expected {floor}..={ceiling} (newest before: {newest:?})"
        );
        Ok(())
    }

    fn doc(id: &str, n: i64, at: Option<Millis>) -> NewDocument {
        let payload = json!({"n": n}).as_object().unwrap().clone();
        let d = NewDocument::with_id(id, payload);
        match at {
            Some(t) => d.at(t),
            None => d,
        }
    }

    async fn check_versions(&self, id: &str) -> Result<(), TestCaseError> {
        let real = self
            .store
            .versions(id)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let real: Vec<(Millis, bool)> = real.iter().map(|e| (e.created_at, e.deleted)).collect();
        let model: Vec<(Millis, bool)> = self
            .model
            .docs
            .get(id)
            .map(|v| v.iter().map(|(t, n)| (*t, n.is_none())).collect())
            .unwrap_or_default();
        prop_assert_eq!(real, model, "versions of {}", id);
        // live versions carry their own payload
        for e in self.store.versions(id).await.unwrap() {
            if !e.deleted {
                let (_, t, n) = seen(&e)?;
                let expected = self.model.at(id, Some(t)).copied();
                prop_assert_eq!(expected, Some((t, Some(n))), "payload of {} at {}", id, t);
            }
        }
        Ok(())
    }

    pub async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let all = TokenFilter::All;
        let w = WriteContext::SYSTEM;
        let fail = |e: meshql_core::StoreError| TestCaseError::fail(format!("{op:?}: {e}"));
        match op {
            Op::Create { id, at, n } | Op::Update { id, at, n } => {
                let id = IDS[*id];
                let explicit = at.map(|o| self.t0 + o);
                let newest = self.model.newest(id).copied();
                let is_update = matches!(op, Op::Update { .. });
                if is_update && newest.is_none_or(|(_, n)| n.is_none()) {
                    let r = self
                        .store
                        .update(id, Self::doc(id, *n, explicit), &w)
                        .await
                        .map_err(fail)?;
                    prop_assert!(r.is_none(), "update of a missing/deleted {id}: {r:?}");
                } else {
                    let before = now_millis();
                    let env = if is_update {
                        self.store
                            .update(id, Self::doc(id, *n, explicit), &w)
                            .await
                            .map_err(fail)?
                            .ok_or_else(|| TestCaseError::fail(format!("{op:?}: no version")))?
                    } else {
                        self.store
                            .create(Self::doc(id, *n, explicit), &w)
                            .await
                            .map_err(fail)?
                    };
                    let after = now_millis();
                    let stamp = match explicit {
                        Some(t) => {
                            let expected = self.model.place_explicit(id, t);
                            prop_assert_eq!(env.created_at, expected, "{:?}", op);
                            expected
                        }
                        None => {
                            Self::check_now_stamp(
                                env.created_at,
                                before,
                                after,
                                newest.map(|v| v.0),
                            )?;
                            env.created_at
                        }
                    };
                    prop_assert_eq!(seen(&env)?, (id.to_owned(), stamp, *n));
                    self.model.insert(id, stamp, Some(*n));
                }
                self.check_versions(id).await?;
            }
            Op::Remove { id } => {
                let id = IDS[*id];
                let newest = self.model.newest(id).copied();
                let before = now_millis();
                let outcome = self.store.remove(id, &w).await.map_err(fail)?;
                let after = now_millis();
                match newest {
                    None => prop_assert_eq!(outcome, RemoveOutcome::NotFound),
                    Some((_, None)) => prop_assert_eq!(outcome, RemoveOutcome::AlreadyDeleted),
                    Some((last, Some(_))) => {
                        prop_assert_eq!(outcome, RemoveOutcome::Removed);
                        let versions = self.store.versions(id).await.map_err(fail)?;
                        let tomb = versions.last().ok_or_else(|| {
                            TestCaseError::fail(format!("{id}: no versions after a remove"))
                        })?;
                        prop_assert!(tomb.deleted, "the newest version is the tombstone");
                        Self::check_now_stamp(tomb.created_at, before, after, Some(last))?;
                        self.model.insert(id, tomb.created_at, None);
                    }
                }
                self.check_versions(id).await?;
            }
            Op::Read { id, at } => {
                let id = IDS[*id];
                let at = self.resolve(at);
                let real = self
                    .store
                    .read(id, &ReadContext::new(&all, at))
                    .await
                    .map_err(fail)?;
                let real = real.as_ref().map(seen).transpose()?;
                let model = self
                    .model
                    .visible(id, at)
                    .map(|(t, n)| (id.to_owned(), t, n));
                prop_assert_eq!(real, model, "read {} at {:?}", id, at);
            }
            Op::ReadMany { ids, at } => {
                let ids: Vec<String> = ids.iter().map(|i| IDS[*i].to_owned()).collect();
                let at = self.resolve(at);
                let real = self
                    .store
                    .read_many(&ids, &ReadContext::new(&all, at))
                    .await
                    .map_err(fail)?;
                let mut real = real.iter().map(seen).collect::<Result<Vec<_>, _>>()?;
                // "missing ones are left out": compare as sets of distinct ids
                real.sort();
                real.dedup();
                let mut model: Vec<_> = ids
                    .iter()
                    .filter_map(|id| self.model.visible(id, at).map(|(t, n)| (id.clone(), t, n)))
                    .collect();
                model.sort();
                model.dedup();
                prop_assert_eq!(real, model, "read_many {:?} at {:?}", ids, at);
            }
            Op::List { at } => {
                let at = self.resolve(at);
                let real = self
                    .store
                    .list(&ReadContext::new(&all, at))
                    .await
                    .map_err(fail)?;
                let mut real = real.iter().map(seen).collect::<Result<Vec<_>, _>>()?;
                real.sort();
                let model: Vec<_> = self
                    .model
                    .docs
                    .keys()
                    .filter_map(|id| self.model.visible(id, at).map(|(t, n)| (id.clone(), t, n)))
                    .collect();
                prop_assert_eq!(real, model, "list at {:?}", at);
            }
            Op::ListPage { after, limit, at } => {
                let after = after.map(|i| IDS[i]);
                let at = self.resolve(at);
                let real = self
                    .store
                    .list_page(after, *limit, &ReadContext::new(&all, at))
                    .await
                    .map_err(fail)?;
                let real = real.iter().map(seen).collect::<Result<Vec<_>, _>>()?;
                let model: Vec<_> = self
                    .model
                    .docs
                    .keys()
                    .filter(|id| after.is_none_or(|a| id.as_str() > a))
                    .filter_map(|id| self.model.visible(id, at).map(|(t, n)| (id.clone(), t, n)))
                    .take(*limit)
                    .collect();
                prop_assert_eq!(real, model, "list_page after {:?} at {:?}", after, at);
            }
            Op::Versions { id } => self.check_versions(IDS[*id]).await?,
        }
        Ok(())
    }

    /// Every id read at every stamp the model holds (and 1 ms either side).
    pub async fn check_everything(&mut self) -> Result<(), TestCaseError> {
        let mut stamps = self.model.stamps();
        stamps.sort();
        stamps.dedup();
        for t in stamps {
            for d in -1..=1 {
                for id in 0..IDS.len() {
                    self.step(&Op::Read {
                        id,
                        at: At::Offset(t + d - self.t0),
                    })
                    .await?;
                }
            }
        }
        for id in 0..IDS.len() {
            self.step(&Op::Read { id, at: At::Now }).await?;
            self.step(&Op::Versions { id }).await?;
        }
        Ok(())
    }
}

/// Runs `ops` on a fresh store from `fresh`, which also gives what must outlive the store
/// (a temporary directory), dropped after the store is shut down.
pub fn run<F, Fut, G>(fresh: F, ops: &[Op]) -> Result<(), TestCaseError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = (DynStore, G)>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (store, guard) = fresh().await;
        let mut run = Run::new(store);
        let mut result = Ok(());
        for op in ops {
            result = run.step(op).await;
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = run.check_everything().await;
        }
        run.store.shutdown().await;
        drop(run);
        drop(guard);
        result
    })
}
