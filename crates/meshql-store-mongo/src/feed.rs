//! The change feed of a collection, without transactions or change streams.
//!
//! # Positions
//!
//! Every version document carries `pos` (Int64, unique index): its place in the feed, the
//! feed cursor being `Cursor::seq(pos)`. Positions come from one counter document per
//! collection, `{_id: <collection>, pos}` in `meshql_feed_clock`, advanced by
//! `findAndModify {$inc: {pos: n}}` (upserting) *before* the versions are inserted: a write
//! draws its positions, inserts, and only then is acknowledged. So the feed follows commit
//! order wherever the contract asks for it: the writes of one document are serialised by the
//! id's lock (draw, insert, next write draws), and a write that begins after another was
//! acknowledged draws after that one's draw.
//!
//! Within a store the draws are serialised and grouped: writers queue their requests, and
//! one round trip serves every request queued meanwhile, handing out consecutive ranges.
//! That matters on FerretDB, whose `findAndModify` reads the counter and writes it back in
//! two statements: two clients drawing at the same instant can be handed the same position,
//! or set the counter back. The unique index on `pos` lets only one version have a
//! position (the other write draws again), and a store never hands out a position at or
//! below its *floor*: the highest position it drew, or that one of its readers went past
//! (so that neither its own writes of a document nor its feed can be overtaken). Of a range
//! reaching below the floor it uses the part above, then pushes the counter forward with
//! `$max` and draws again for the rest. On MongoDB `$inc` is atomic and none of this happens.
//!
//! # Reading: a gap-free prefix
//!
//! Versions are inserted after their draw, so positions appear out of order: at any moment
//! the collection may hold 7 and 9 but not yet 8. The store's `changes` reads the versions
//! with `pos > after` in order and hands out only the prefix that can no longer change: it
//! stops before the first position that is allocated but absent, and that position is
//!
//! * *in flight in this process* (the store keeps the positions it drew and has not settled
//!   in memory): the reader stops there, for as long as the write runs — also when the
//!   version is already present, since a write whose insert was applied but not answered
//!   fails and deletes it again;
//! * *void*: the write that drew it failed in this process (settled at once, so readers skip
//!   it immediately), or it was skipped before (below);
//! * *unknown*: drawn by another process (or by this one, a moment before it could record
//!   the draw), whose write is still in flight or failed or died. The reader waits for it
//!   for a grace period ([`DEFAULT_FEED_GRACE`], [`crate::MongoOptions::feed_grace`]),
//!   counted from when this store first saw the gap, then skips it for good.
//!
//! # Batches
//!
//! `create_many` draws one range, inserts all its versions with one ordered `insert_many`,
//! each carrying the batch's first position (`batch`) and size (`batch_n`), and only after
//! the insert fully succeeded settles the `latest` flags. If it fails part-way, the versions
//! it inserted are deleted again (by their ObjectIds) and its positions become void. A
//! reader hands out a batch only once all its versions are present, so no reader ever sees
//! part of a batch that is then taken back; an incomplete batch is waited for like a gap,
//! and skipped whole when its missing positions are void or past their grace period.
//!
//! # Limits (without transactions)
//!
//! * A writer in *another process* that stalls for longer than the grace period between
//!   drawing a position and inserting its version has its change skipped by this process's
//!   readers (it is stored, and readable, but not in this process's feed). A shorter stall
//!   only delays the feed. A MongoDB replica set would remove this limit, in either of two
//!   ways: the draw and the insert sharing one multi-document transaction (concurrent
//!   transactions conflict on the counter document, so positions commit in order and no
//!   gap is ever waited for, at the cost of serialising a collection's writers), or the feed
//!   following a change stream. Neither is implemented: FerretDB, the server the tests run
//!   on, has no transactions, change streams or replica sets, so neither could be tested.
//! * REST and GraphQL readers (not the feed) may briefly see part of a batch that is about
//!   to fail, between its `insert_many` and the deletion of what it inserted; a batch's
//!   versions also become visible to them one by one. A process that dies between those two
//!   steps leaves the inserted part stored (out of the feed: it is an incomplete batch).
//! * On FerretDB only, when several clients write one collection: a position drawn twice
//!   (see above) and voided by one client while the other's version is still on its way can
//!   make the first client skip that version; a counter set back by one client can hand
//!   another a position below what a third client's readers went past; and a batch's range
//!   that does not fit above the floor leaves numbers no one writes, which other clients'
//!   readers wait the grace period for.
//! * Versions written before the feed existed have no `pos`: the first store to prepare the
//!   collection with a feed numbers them (in `_id` order, which is close to insertion order),
//!   below every position a new write can draw. Versions written afterwards by an older
//!   meshql (a rolling upgrade) get no position and are not in the feed; nor do the rest if
//!   the numbering process dies part-way; and a process started at the same moment that
//!   reads the feed while the numbering still runs skips the numbers not yet written once
//!   its grace period is over.

use crate::error::{error, is_duplicate_key};
use futures::TryStreamExt;
use meshql_core::StoreError;
use mongodb::bson::{doc, oid::ObjectId, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::Collection;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a reader waits for a position drawn elsewhere before skipping it.
pub const DEFAULT_FEED_GRACE: Duration = Duration::from_secs(2);

/// The collection holding every feed counter of a database.
pub(crate) const CLOCK_COLLECTION: &str = "meshql_feed_clock";

/// Gaps remembered past this many are pruned when old; a read notes at most this many.
const FIRST_SEEN_LIMIT: usize = 4096;

/// An integer field, whatever its BSON width.
pub(crate) fn int(d: &Document, key: &str) -> Option<i64> {
    match d.get(key)? {
        Bson::Int64(n) => Some(*n),
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Double(f) if f.fract() == 0.0 => Some(*f as i64),
        _ => None,
    }
}

/// A version's feed position.
pub(crate) fn pos_of(d: &Document) -> Option<u64> {
    int(d, "pos").and_then(|p| u64::try_from(p).ok())
}

/// The `(first position, size)` of the batch a version belongs to (none for single writes).
fn batch_of(d: &Document) -> Option<(u64, u64)> {
    let first = u64::try_from(int(d, "batch")?).ok()?;
    let n = u64::try_from(int(d, "batch_n")?).ok()?;
    (n > 1).then_some((first, n))
}

/// A queued draw: how many positions, and where to answer.
type Request = (u64, oneshot::Sender<Result<Hold, StoreError>>);

fn fail(queued: impl IntoIterator<Item = Request>, e: StoreError) {
    for (_, tx) in queued {
        let _ = tx.send(Err(e.clone()));
    }
}

/// What this process knows about positions.
#[derive(Default)]
struct Ledger {
    /// Drawn here and not settled yet (a count: a position drawn twice, see the module doc).
    held: BTreeMap<u64, u32>,
    /// Will never hold a change this process hands out.
    void: BTreeSet<u64>,
    /// When a reader first found an unknown position absent.
    first_seen: HashMap<u64, Instant>,
    /// The highest position of a version a reader went past (handed out or skipped): no
    /// later draw may be at or below it.
    passed: u64,
}

impl Ledger {
    fn hold(&mut self, first: u64, n: u64) {
        for p in first..first + n {
            *self.held.entry(p).or_default() += 1;
        }
    }

    fn release(&mut self, first: u64, n: u64) {
        for p in first..first + n {
            if let Some(count) = self.held.get_mut(&p) {
                *count -= 1;
                if *count == 0 {
                    self.held.remove(&p);
                }
            }
        }
    }

    /// Starts the grace period of an absent position not known here.
    fn note_gap(&mut self, p: u64, now: Instant) {
        if self.held.contains_key(&p) || self.void.contains(&p) {
            return;
        }
        self.first_seen.entry(p).or_insert(now);
    }

    /// Whether a reader may go past the absent position `p` (void, or unknown for longer than
    /// the grace period, which makes it void).
    fn passable(&mut self, p: u64, now: Instant, grace: Duration) -> bool {
        if self.void.contains(&p) {
            return true;
        }
        if self.held.contains_key(&p) {
            return false;
        }
        let seen = *self.first_seen.entry(p).or_insert(now);
        if now.duration_since(seen) >= grace {
            self.first_seen.remove(&p);
            self.void.insert(p);
            true
        } else {
            false
        }
    }
}

/// One collection's feed: its counter, and the positions this process drew.
pub(crate) struct Feed {
    versions: Collection<Document>,
    clock: Collection<Document>,
    /// The counter's `_id`: the collection name.
    key: String,
    grace: Duration,
    ledger: Mutex<Ledger>,
    /// Draws waiting for the next round trip: `(count, answer)`.
    queue: Mutex<Vec<Request>>,
    /// Serialises round trips; holds the highest position handed out so far.
    turn: tokio::sync::Mutex<u64>,
}

/// Positions drawn by a write, until it settles them. Writes run to their end in tasks of
/// their own, so a hold is dropped unsettled only when its write is torn down (a panic, the
/// runtime shutting down, a deletion that keeps failing) or its caller went away before the
/// draw was answered: it then makes its positions void and deletes in the background
/// whatever versions the write may have inserted (the write was not acknowledged).
pub(crate) struct Hold {
    feed: Arc<Feed>,
    first: u64,
    n: u64,
    open: bool,
    /// The versions this write may have inserted.
    undo: Vec<ObjectId>,
}

impl Hold {
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// Records the versions the write is about to insert, to undo should it be abandoned.
    pub(crate) fn will_insert(&mut self, oids: Vec<ObjectId>) {
        self.undo = oids;
    }

    /// The write stored its versions: readers find them.
    pub(crate) fn stored(mut self) {
        self.open = false;
        self.feed.ledger().release(self.first, self.n);
    }

    /// The write failed. `possibly_stored`: some of its versions may be in the collection
    /// (a batch that failed part-way, or an error that does not say whether the server
    /// applied the insert), so they are deleted first. Positions left empty become void (the
    /// feed skips them at once); positions another client's version holds (see the module
    /// doc) are simply released. When the deletion fails, the positions become void all the
    /// same and it is retried in the background (meanwhile REST readers may still see them).
    pub(crate) async fn abandon(mut self, possibly_stored: bool) {
        if possibly_stored {
            let mut undone = false;
            for attempt in 0..3u32 {
                if self.feed.undo(&self.undo).await.is_ok() {
                    undone = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            if !undone {
                return; // dropped unsettled: void, undone in the background
            }
        }
        self.undo.clear();
        let taken = self
            .feed
            .present(self.first, self.n)
            .await
            .unwrap_or_else(|_| (self.first..self.first + self.n).collect());
        self.open = false;
        let mut ledger = self.feed.ledger();
        ledger.release(self.first, self.n);
        ledger
            .void
            .extend((self.first..self.first + self.n).filter(|p| !taken.contains(p)));
    }

    /// The position was taken by another client's version (a position drawn twice): released,
    /// not void, since the feed must hand out that version.
    pub(crate) fn taken(mut self) {
        self.open = false;
        self.undo.clear();
        self.feed.ledger().release(self.first, self.n);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        {
            let mut ledger = self.feed.ledger();
            ledger.release(self.first, self.n);
            ledger.void.extend(self.first..self.first + self.n);
        }
        let undo = std::mem::take(&mut self.undo);
        if undo.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let feed = self.feed.clone();
        runtime.spawn(async move {
            for _ in 0..600 {
                if feed.undo(&undo).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            tracing::error!(
                collection = feed.key,
                "MongoDB: gave up deleting the versions of an abandoned write after 10 minutes"
            );
        });
    }
}

impl Feed {
    pub(crate) fn new(
        versions: Collection<Document>,
        clock: Collection<Document>,
        key: &str,
        grace: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            versions,
            clock,
            key: key.to_owned(),
            grace,
            ledger: Mutex::default(),
            queue: Mutex::default(),
            turn: tokio::sync::Mutex::new(0),
        })
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn undo(&self, oids: &[ObjectId]) -> Result<(), StoreError> {
        if oids.is_empty() {
            return Ok(());
        }
        self.versions
            .delete_many(doc! {"_id": {"$in": oids.to_vec()}})
            .await
            .map(|_| ())
            .map_err(error)
    }

    /// The positions in `first..first + n` some version holds.
    async fn present(&self, first: u64, n: u64) -> Result<BTreeSet<u64>, StoreError> {
        let filter = if n == 1 {
            doc! {"pos": first as i64}
        } else {
            doc! {"pos": {"$gte": first as i64, "$lte": (first + n - 1) as i64}}
        };
        let docs: Vec<Document> = self
            .versions
            .find(filter)
            .projection(doc! {"pos": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        Ok(docs.iter().filter_map(pos_of).collect())
    }

    /// Whether a version other than `oid` holds position `p`.
    pub(crate) async fn taken_by_other(&self, p: u64, oid: ObjectId) -> Result<bool, StoreError> {
        Ok(self
            .versions
            .find_one(doc! {"pos": p as i64, "_id": {"$ne": oid}})
            .projection(doc! {"_id": 1})
            .await
            .map_err(error)?
            .is_some())
    }

    /// Creates the counter when the collection has none, numbering the versions written
    /// before the feed existed (see the module doc). Creating it is an insert, so of several
    /// processes preparing at once exactly one numbers them.
    pub(crate) async fn prepare(&self) -> Result<(), StoreError> {
        let existing = self
            .clock
            .find_one(doc! {"_id": &self.key})
            .await
            .map_err(error)?;
        if existing.is_some() {
            return Ok(());
        }
        let legacy: Vec<Document> = self
            .versions
            .find(doc! {"pos": {"$exists": false}})
            .sort(doc! {"_id": 1})
            .projection(doc! {"_id": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        let claim = self
            .clock
            .insert_one(doc! {"_id": &self.key, "pos": legacy.len() as i64})
            .await;
        match claim {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => return Ok(()),
            Err(e) => return Err(error(e)),
        }
        for (i, d) in legacy.iter().enumerate() {
            let Ok(oid) = d.get_object_id("_id") else {
                continue;
            };
            self.versions
                .update_one(
                    doc! {"_id": oid, "pos": {"$exists": false}},
                    doc! {"$set": {"pos": i as i64 + 1}},
                )
                .await
                .map_err(error)?;
        }
        if !legacy.is_empty() {
            tracing::info!(
                collection = self.key,
                versions = legacy.len(),
                "MongoDB: numbered the versions written before the change feed"
            );
        }
        Ok(())
    }

    /// Draws `n` consecutive positions, held until the returned [`Hold`] is settled.
    pub(crate) async fn draw(self: &Arc<Self>, n: u64) -> Result<Hold, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((n, tx));
        // The round trip runs in its own task, so that a caller going away (a cancelled
        // request) cannot strand the draws it was serving for others.
        tokio::spawn(self.clone().serve());
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the feed clock's task stopped".into(),
            ))
        })
    }

    /// Serves every queued draw with one round trip (none when an earlier one took them).
    async fn serve(self: Arc<Self>) {
        let mut high = self.turn.lock().await;
        let mut queued: VecDeque<Request> =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner())).into();
        let mut attempts = 0;
        while !queued.is_empty() {
            let total: u64 = queued.iter().map(|(n, _)| n).sum();
            let (first, end) = match self.advance(total).await {
                Ok(range) => range,
                Err(e) => return fail(queued, e),
            };
            // Nothing at or below the floor: not what this store drew already (its feed
            // must follow its own writes), nor what its readers went past.
            let floor = (*high).max(self.ledger().passed);
            let mut next = first.max(floor + 1);
            while let Some((n, _)) = queued.front() {
                let n = *n;
                if next + n - 1 > end {
                    break;
                }
                let (_, tx) = queued.pop_front().expect("looked at");
                self.ledger().hold(next, n);
                let hold = Hold {
                    feed: self.clone(),
                    first: next,
                    n,
                    open: true,
                    undo: Vec::new(),
                };
                // a caller gone: the hold drops here, its positions void
                let _ = tx.send(Ok(hold));
                *high = next + n - 1;
                next += n;
            }
            if queued.is_empty() {
                return;
            }
            // Part of the range was at or below the floor: another client's non-atomic
            // update (FerretDB) set the counter back. Push it forward, draw for the rest.
            attempts += 1;
            if attempts > 16 {
                let e = StoreError::Conflict(format!(
                    "the feed clock of `{}` kept going back",
                    self.key
                ));
                return fail(queued, e);
            }
            let floor = (*high).max(self.ledger().passed);
            if let Err(e) = self
                .clock
                .update_one(
                    doc! {"_id": &self.key},
                    doc! {"$max": {"pos": floor as i64}},
                )
                .await
                .map_err(error)
            {
                return fail(queued, e);
            }
        }
    }

    /// Advances the counter by `total`: the range drawn, `(first, last)`.
    async fn advance(&self, total: u64) -> Result<(u64, u64), StoreError> {
        for _ in 0..16 {
            let after = self
                .clock
                .find_one_and_update(
                    doc! {"_id": &self.key},
                    doc! {"$inc": {"pos": total as i64}},
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await;
            let end = match after {
                Ok(Some(d)) => int(&d, "pos").ok_or_else(|| {
                    StoreError::Corrupt(format!("feed clock of `{}`: no position", self.key))
                })?,
                Ok(None) => continue,
                // two first draws upserting at once: the other one created it
                Err(e) if is_duplicate_key(&e) => continue,
                Err(e) => return Err(error(e)),
            };
            let end = u64::try_from(end).unwrap_or(0);
            return Ok(((end + 1).saturating_sub(total).max(1), end));
        }
        Err(StoreError::Conflict(format!(
            "the feed clock of `{}` could not be created",
            self.key
        )))
    }

    /// Up to `limit` changes after position `after`: the gap-free prefix (see the module doc).
    /// `to_change` turns a version into its change; `reads` counts the queries.
    pub(crate) async fn changes<T>(
        &self,
        after: u64,
        limit: usize,
        reads: &std::sync::atomic::AtomicU64,
        to_change: impl Fn(&Document, u64) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        // positions are Int64: nothing comes after the largest
        if after >= i64::MAX as u64 {
            return Ok(out);
        }
        let mut next = after + 1;
        while out.len() < limit {
            // the next position is being written here: nothing can be handed out past it
            if self.ledger().held.contains_key(&next) {
                break;
            }
            let want = (limit - out.len()).min(1000) as i64 + 32;
            reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let docs: Vec<Document> = self
                .versions
                .find(doc! {"pos": {"$gte": next as i64}})
                .sort(doc! {"pos": 1})
                .limit(want)
                .await
                .map_err(error)?
                .try_collect()
                .await
                .map_err(error)?;
            if docs.is_empty() {
                break;
            }
            let full = docs.len() as i64 == want;
            let rows: Vec<(u64, Document)> = docs
                .into_iter()
                .filter_map(|d| pos_of(&d).map(|p| (p, d)))
                .collect();
            // positions up to here that the read did not return are absent
            let covered = if full {
                rows.last().map_or(next, |r| r.0)
            } else {
                u64::MAX
            };
            let present: BTreeSet<u64> = rows.iter().map(|r| r.0).collect();
            // which versions of each batch are there (a query when the batch reaches beyond
            // what this read covers)
            let mut batches: HashMap<u64, (u64, BTreeSet<u64>)> = HashMap::new();
            for (_, d) in &rows {
                let Some((first, n)) = batch_of(d) else {
                    continue;
                };
                if batches.contains_key(&first) {
                    continue;
                }
                let last = first + n - 1;
                let have = if first >= next && last <= covered {
                    present.range(first..=last).copied().collect()
                } else {
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.present(first, n).await?
                };
                batches.insert(first, (n, have));
            }
            let (cursor, blocked) =
                self.walk(next, &rows, &present, &batches, limit, &mut out, &to_change)?;
            if blocked || !full {
                break;
            }
            next = cursor;
        }
        Ok(out)
    }

    /// Hands out the versions of one read up to the first position that may still change;
    /// the next position to read and whether it stopped at such a position.
    #[allow(clippy::too_many_arguments)]
    fn walk<T>(
        &self,
        next: u64,
        rows: &[(u64, Document)],
        present: &BTreeSet<u64>,
        batches: &HashMap<u64, (u64, BTreeSet<u64>)>,
        limit: usize,
        out: &mut Vec<T>,
        to_change: &impl Fn(&Document, u64) -> Result<T, StoreError>,
    ) -> Result<(u64, bool), StoreError> {
        let now = Instant::now();
        let grace = self.grace;
        let mut ledger = self.ledger();
        if ledger.first_seen.len() > FIRST_SEEN_LIMIT {
            // gaps no reader came back to: long void or filled
            ledger
                .first_seen
                .retain(|_, seen| now.duration_since(*seen) < grace * 10);
        }
        // every gap of this read starts its grace period now, side by side (up to a bound:
        // the rest start theirs when a reader reaches them)
        let batch_gaps = batches
            .iter()
            .flat_map(|(first, (n, have))| (*first..first + n).filter(move |q| !have.contains(q)));
        let mut from = next;
        let read_gaps = present.iter().flat_map(|&p| {
            let gaps = from..p;
            from = p + 1;
            gaps
        });
        for q in read_gaps.chain(batch_gaps).take(FIRST_SEEN_LIMIT) {
            ledger.note_gap(q, now);
        }
        let mut cursor = next;
        for (p, d) in rows {
            let p = *p;
            while cursor < p {
                if !ledger.passable(cursor, now, grace) {
                    return Ok((cursor, true));
                }
                cursor += 1;
            }
            ledger.first_seen.remove(&p);
            if ledger.void.contains(&p) {
                // what a failed write inserted, until it is deleted again
                ledger.passed = ledger.passed.max(p);
                cursor = p + 1;
                continue;
            }
            if ledger.held.contains_key(&p) {
                // inserted by a write of this process that has not settled: it may still
                // fail (an insert applied whose answer was lost, its deletion retrying while
                // another write's commit wakes the reader) and delete the version, so the
                // reader waits for it as for an absent position
                return Ok((p, true));
            }
            if let Some((first, n)) = batch_of(d) {
                let (_, have) = &batches[&first];
                if (have.len() as u64) < n {
                    let missing: Vec<u64> =
                        (first..first + n).filter(|q| !have.contains(q)).collect();
                    if !missing.iter().all(|&q| ledger.passable(q, now, grace)) {
                        return Ok((p, true));
                    }
                    // a batch that will never be whole: skipped whole
                    ledger.void.extend(first..first + n);
                    ledger.passed = ledger.passed.max(p);
                    cursor = p + 1;
                    continue;
                }
            }
            out.push(to_change(d, p)?);
            ledger.passed = ledger.passed.max(p);
            cursor = p + 1;
            if out.len() >= limit {
                break;
            }
        }
        Ok((cursor, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A version inserted at a position the feed drew, with the fields a reader looks at.
    async fn insert_at(versions: &Collection<Document>, hold: &mut Hold) -> ObjectId {
        let oid = ObjectId::new();
        hold.will_insert(vec![oid]);
        versions
            .insert_one(doc! {"_id": oid, "pos": hold.first() as i64, "payload": {}})
            .await
            .expect("insert");
        oid
    }

    /// Regression (b613423; scripts/test.sh once handed out a change whose document was
    /// gone): a version present at a position this process still holds — its insert applied,
    /// its write not settled — is not handed out, since the write may yet fail and delete
    /// it. A reader stops there; once the write fails, it goes past the void position.
    #[tokio::test]
    async fn a_version_at_a_position_still_held_waits_for_its_write() {
        let url = meshql_conformance::test_server_url("ferretdb", "MESHQL_TEST_MONGO_URL");
        let client = mongodb::Client::with_uri_str(&url).await.expect("client");
        let db = client.database("meshql_feed_unit");
        let name = format!("held_{}", uuid::Uuid::new_v4().simple());
        let versions = db.collection::<Document>(&name);
        let feed = Feed::new(
            versions.clone(),
            db.collection("meshql_feed_clock"),
            &name,
            Duration::from_millis(200),
        );
        feed.prepare().await.expect("prepare");
        let reads = AtomicU64::new(0);
        let read = || feed.changes(0, 10, &reads, |_, p| Ok(p));

        // one write stored, one whose insert is applied but not settled, one stored after it
        let mut before = feed.draw(1).await.unwrap();
        insert_at(&versions, &mut before).await;
        let first = before.first();
        before.stored();
        let mut unsettled = feed.draw(1).await.unwrap();
        insert_at(&versions, &mut unsettled).await;
        let mut after = feed.draw(1).await.unwrap();
        insert_at(&versions, &mut after).await;
        let last = after.first();
        after.stored();

        assert_eq!(
            read().await.unwrap(),
            vec![first],
            "nothing at or past the unsettled write's position"
        );
        // the write fails: its version is deleted and its position skipped
        unsettled.abandon(true).await;
        assert_eq!(read().await.unwrap(), vec![first, last]);
        db.collection::<Document>(&name).drop().await.ok();
    }
}
