//! A `create_many` without transactions: its versions placed as consecutive single writes
//! would place them, inserted with one ordered `insert_many` under one range of feed
//! positions, and undone should that fail part-way.

use super::writer::Writer;
use crate::error::{error, is_duplicate_key};
use crate::feed::Hold;
use meshql_core::{now_millis, Envelope, Millis, Placement, StoreError, WriteContext};
use mongodb::bson::{doc, oid::ObjectId, DateTime, Document};
use std::collections::{HashMap, HashSet};

/// A document of a `create_many`, ready to be placed.
pub(super) struct BatchItem {
    pub(super) id: String,
    pub(super) payload: Document,
    pub(super) text: String,
    pub(super) created_at: Option<Millis>,
    pub(super) fresh_id: bool,
}

/// The versions of a `create_many`, placed: what to insert, what to answer, and the
/// `latest` flags to settle once every version is in.
struct PlannedBatch {
    versions: Vec<Document>,
    envelopes: Vec<Envelope>,
    oids: Vec<ObjectId>,
    settle: Vec<(String, ObjectId, Millis)>,
}

/// Why a batch insert failed.
enum BatchFailure {
    Mongo(mongodb::error::Error),
    Store(StoreError),
}

impl Writer {
    /// Places the versions of a batch: as consecutive single writes would, each seeing the
    /// ones before it (an id may come more than once). Only the newest version of an id in
    /// the batch is inserted flagged `latest`.
    async fn plan_batch(
        &self,
        items: &[BatchItem],
        tokens: &[String],
        correlation_id: Option<&str>,
    ) -> Result<PlannedBatch, StoreError> {
        struct Seen {
            newest: Option<Millis>,
            seq: Option<ObjectId>,
            stamps: HashSet<Millis>,
            latest: Option<usize>,
            fresh_id: bool,
        }
        let now = now_millis();
        let mut seen: HashMap<&str, Seen> = HashMap::new();
        let mut plan = PlannedBatch {
            versions: Vec::with_capacity(items.len()),
            envelopes: Vec::with_capacity(items.len()),
            oids: Vec::with_capacity(items.len()),
            settle: Vec::new(),
        };
        for (i, item) in items.iter().enumerate() {
            let id = item.id.as_str();
            if !seen.contains_key(id) {
                let current = if item.fresh_id {
                    None
                } else {
                    self.current(id).await?
                };
                seen.insert(
                    id,
                    Seen {
                        newest: current.as_ref().map(|c| c.created_at),
                        seq: current.map(|c| c.seq),
                        stamps: HashSet::new(),
                        latest: None,
                        fresh_id: item.fresh_id,
                    },
                );
            }
            let s = seen.get_mut(id).expect("inserted above");
            let mut place = Placement::new(item.created_at, s.newest, now);
            if place.check_collisions {
                let mut stamp = place.stamp;
                while s.stamps.contains(&stamp) || self.version_at(id, stamp).await? {
                    stamp += 1;
                }
                place = place.settle(stamp, s.newest);
            }
            let oid = ObjectId::new();
            let seq = *s.seq.get_or_insert(oid);
            s.stamps.insert(place.stamp);
            if place.latest {
                s.newest = Some(place.stamp);
                if let Some(earlier) = s.latest.replace(i) {
                    plan.versions[earlier].insert("latest", false);
                }
            }
            let mut version = doc! {
                "_id": oid,
                "id": id,
                "payload": item.payload.clone(),
                "created_at": DateTime::from_millis(place.stamp),
                "deleted": false,
                "authorized_tokens": tokens.to_vec(),
                "latest": place.latest,
                "seq": seq,
            };
            if let Some(c) = correlation_id {
                version.insert("correlation_id", c);
            }
            plan.versions.push(version);
            plan.oids.push(oid);
            plan.envelopes.push(Envelope {
                id: item.id.clone(),
                payload: item.text.clone(),
                created_at: place.stamp,
                deleted: false,
                authorized_tokens: tokens.to_vec(),
            });
        }
        // A server-generated id has no other version to supersede.
        for s in seen.values().filter(|s| !s.fresh_id) {
            if let Some(i) = s.latest {
                plan.settle.push((
                    items[i].id.clone(),
                    plan.oids[i],
                    plan.envelopes[i].created_at,
                ));
            }
        }
        Ok(plan)
    }

    /// Inserts a planned batch with one ordered `insert_many` under `hold`'s positions. With
    /// the fault marker on document `k` (test builds), the documents before it are inserted
    /// for real and the write then fails, as when the server refuses document `k` of an
    /// ordered insert: the caller's compensation runs on what was inserted.
    async fn insert_batch(
        &self,
        plan: &mut PlannedBatch,
        items: &[BatchItem],
        hold: &mut Hold,
    ) -> Result<(), BatchFailure> {
        let n = plan.versions.len() as u64;
        for (i, v) in plan.versions.iter_mut().enumerate() {
            v.insert("pos", (hold.first() + i as u64) as i64);
            if n > 1 {
                v.insert("batch", hold.first() as i64);
                v.insert("batch_n", n as i64);
            }
        }
        hold.will_insert(plan.oids.clone());
        let poisoned = items
            .iter()
            .enumerate()
            .find_map(|(k, item)| meshql_core::fault::check(&item.text).err().map(|e| (k, e)));
        let upto = poisoned.as_ref().map_or(plan.versions.len(), |(k, _)| *k);
        if upto > 0 {
            self.coll
                .insert_many(&plan.versions[..upto])
                .ordered(true)
                .await
                .map_err(BatchFailure::Mongo)?;
        }
        match poisoned {
            Some((_, e)) => Err(BatchFailure::Store(e)),
            None => Ok(()),
        }
    }

    /// See [`StoreWriter::create_many`](meshql_core::StoreWriter::create_many) (the caller holds the locks of the batch's given ids).
    pub(super) async fn create_many_locked(
        &self,
        items: Vec<BatchItem>,
        ctx: &WriteContext,
    ) -> Result<Vec<Envelope>, StoreError> {
        let tokens = ctx.create_tokens();
        let mut attempts = 0;
        let plan = loop {
            let mut plan = self
                .plan_batch(&items, tokens, ctx.correlation_id.as_deref())
                .await?;
            let mut hold = self.feed.draw(plan.versions.len() as u64).await?;
            match self.insert_batch(&mut plan, &items, &mut hold).await {
                Ok(()) => {
                    hold.stored();
                    break plan;
                }
                Err(BatchFailure::Mongo(e)) => {
                    hold.abandon(true).await;
                    if is_duplicate_key(&e) && attempts < 8 {
                        attempts += 1;
                        continue;
                    }
                    return Err(error(e));
                }
                Err(BatchFailure::Store(e)) => {
                    hold.abandon(true).await;
                    return Err(e);
                }
            }
        };
        for (id, oid, stamp) in &plan.settle {
            self.supersede(id, *oid, *stamp).await;
        }
        self.committed(plan.envelopes.len() as u64);
        Ok(plan.envelopes)
    }
}
