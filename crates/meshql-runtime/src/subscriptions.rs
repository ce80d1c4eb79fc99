//! The subscriptions of a server, fed by its change log.
//!
//! One dispatcher task follows the log. For every change it finds the cohorts subscribed to
//! the change's entity (subscriptions with the same query, variables and caller:
//! [`meshql_graphql::Subscription::cohort`]), computes each cohort's event once — the
//! document, its selection, its relationships — and hands the same bytes to every member.
//! A member is a bounded queue: one that stops reading is dropped when its queue is full (and
//! counted), so a slow subscriber holds at most [`QUEUE`] events and never slows the others.
//! The dispatcher takes only pointers to the cohorts of a change's entity under the lock,
//! computes their events outside it, and sends under it (non-blocking sends).
//!
//! Resuming: a member that joins with `since` first receives the events of the changes after
//! `since` up to where the dispatcher stood when it joined ([`Membership::catch_up`], read
//! from the log by the member itself), then the live ones. The dispatcher's position and the
//! cohorts change under one lock, so no change falls between the two or reaches a member twice.
//! Leaving (a closed connection, `complete`) removes the member at once.

use meshql_changes::feed::read_page;
use meshql_changes::{Change, FeedFilter};
use meshql_graphql::{Before, ChangeEvent, Registry, Subscription};
use meshql_log::Log;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Events queued per member before it counts as too slow and is dropped.
pub const QUEUE: usize = 256;
/// Changes read from the log per step.
const PAGE: usize = 256;

/// Why a member's events ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It stopped reading and its queue filled.
    Slow,
    /// The server is shutting down.
    Closing,
}

/// An event for a member: the log position of its change and the response body.
pub type Event = (u64, Arc<Vec<u8>>);

struct Member {
    id: u64,
    /// The dispatcher's position when it joined: the changes up to here are its catch-up's,
    /// never sent to its queue.
    joined_at: u64,
    queue: mpsc::Sender<Event>,
}

struct Cohort {
    subscription: Arc<Subscription>,
    members: Vec<Member>,
}

#[derive(Default)]
struct State {
    /// Changes up to here have been looked at by the dispatcher.
    position: u64,
    cohorts: HashMap<Arc<str>, Cohort>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct SubscriptionStats {
    pub members: AtomicU64,
    pub events: AtomicU64,
    pub dropped_slow: AtomicU64,
    /// Subscriptions refused because [`Subscriptions::max`] were open.
    pub refused: AtomicU64,
}

pub struct Subscriptions {
    log: Log,
    registry: Arc<Registry>,
    state: Mutex<State>,
    next_member: AtomicU64,
    /// Set when the server shuts down: every member's events end.
    closed: std::sync::atomic::AtomicBool,
    /// Subscriptions served at once (`server.max_subscriptions`, default
    /// [`ServerSpec::DEFAULT_MAX_SUBSCRIPTIONS`](meshql_config::resolve::ServerSpec::DEFAULT_MAX_SUBSCRIPTIONS));
    /// each holds a queue of at most [`QUEUE`] events. One more is refused: a 503 on an event
    /// stream, an `error` on a WebSocket.
    max: u64,
    pub stats: SubscriptionStats,
}

/// A subscriber's place in its cohort; leaving is dropping it.
pub struct Membership {
    hub: Arc<Subscriptions>,
    cohort: Arc<str>,
    id: u64,
    /// The live events.
    pub events: mpsc::Receiver<Event>,
    /// The changes `(since, until]` this member must catch up on before the live events.
    pub catch_up: Option<(u64, u64)>,
    pub subscription: Arc<Subscription>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.hub.leave(&self.cohort, self.id);
    }
}

impl Subscriptions {
    /// Starts the dispatcher after the log's newest change, serving at most `max` subscribers
    /// at once; it ends when `closing` is set.
    pub fn start(
        log: Log,
        registry: Arc<Registry>,
        max: u64,
        mut closing: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Subscriptions> {
        let hub = Arc::new(Subscriptions {
            state: Mutex::new(State {
                position: log.last_offset(),
                cohorts: HashMap::new(),
            }),
            log,
            registry,
            next_member: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            max,
            stats: SubscriptionStats::default(),
        });
        let weak = Arc::downgrade(&hub);
        let mut updates = hub.log.subscribe();
        tokio::spawn(async move {
            loop {
                let Some(hub) = weak.upgrade() else { return };
                if *closing.borrow() {
                    hub.close();
                    return;
                }
                if let Err(e) = hub.dispatch().await {
                    tracing::error!(error = %e, "subscriptions: reading the change log failed");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
                let caught_up = hub.state.lock().position >= hub.log.last_offset();
                drop(hub);
                if caught_up {
                    tokio::select! {
                        changed = updates.changed() => if changed.is_err() { return },
                        _ = closing.changed() => {
                            if let Some(hub) = weak.upgrade() {
                                hub.close();
                            }
                            return;
                        }
                    }
                }
            }
        });
        hub
    }

    /// Ends every member's events (the server is shutting down).
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut state = self.state.lock();
        let members: u64 = state.cohorts.values().map(|c| c.members.len() as u64).sum();
        state.cohorts.clear();
        self.stats.members.fetch_sub(members, Ordering::Relaxed);
    }

    /// Why the events of a member whose queue closed ended.
    pub fn ended(&self) -> Ended {
        if self.closed.load(Ordering::Acquire) {
            Ended::Closing
        } else {
            Ended::Slow
        }
    }

    /// Joins the cohort of `subscription`; with `since`, the member catches up on the changes
    /// after it first. `None` when the server serves [`Subscriptions::max`] already (counted in
    /// `refused`) or is shutting down.
    pub fn join(
        self: &Arc<Self>,
        subscription: Subscription,
        since: Option<u64>,
    ) -> Option<Membership> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let id = self.next_member.fetch_add(1, Ordering::Relaxed);
        let key: Arc<str> = Arc::from(subscription.cohort());
        let mut state = self.state.lock();
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        if self.stats.members.load(Ordering::Relaxed) >= self.max {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let position = state.position;
        let cohort = state.cohorts.entry(key.clone()).or_insert_with(|| Cohort {
            subscription: Arc::new(subscription),
            members: Vec::new(),
        });
        cohort.members.push(Member {
            id,
            joined_at: position,
            queue: tx,
        });
        let subscription = cohort.subscription.clone();
        drop(state);
        self.stats.members.fetch_add(1, Ordering::Relaxed);
        Some(Membership {
            hub: self.clone(),
            cohort: key,
            id,
            events: rx,
            catch_up: since.filter(|s| *s < position).map(|s| (s, position)),
            subscription,
        })
    }

    /// Subscriptions served at once (`server.max_subscriptions`).
    pub fn max(&self) -> u64 {
        self.max
    }

    fn leave(&self, cohort: &str, id: u64) {
        let mut state = self.state.lock();
        if let Some(c) = state.cohorts.get_mut(cohort) {
            let before = c.members.len();
            c.members.retain(|m| m.id != id);
            if c.members.len() < before {
                self.stats.members.fetch_sub(1, Ordering::Relaxed);
            }
            if c.members.is_empty() {
                state.cohorts.remove(cohort);
            }
        }
    }

    /// The `meshql_subscription*` series of `/metrics`.
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let s = &self.stats;
        let (cohorts, position) = {
            let state = self.state.lock();
            (state.cohorts.len() as u64, state.position)
        };
        for (name, kind, help, value) in [
            ("meshql_subscriptions", "gauge", "GraphQL subscriptions open (WebSocket operations and event streams).", s.members.load(Ordering::Relaxed)),
            ("meshql_subscriptions_max", "gauge", "server.max_subscriptions: subscriptions served at once; one more is refused.", self.max),
            ("meshql_subscriptions_refused_total", "counter", "Subscriptions refused because server.max_subscriptions were open (a 503 on an event stream, an error on a WebSocket).", s.refused.load(Ordering::Relaxed)),
            ("meshql_subscription_cohorts", "gauge", "Groups of subscriptions that share a query, its variables and a caller: each change's event is computed once per cohort.", cohorts),
            ("meshql_subscription_events_total", "counter", "Events handed to subscribers.", s.events.load(Ordering::Relaxed)),
            ("meshql_subscription_dropped_total", "counter", "Subscribers dropped because they stopped reading and their queue filled.", s.dropped_slow.load(Ordering::Relaxed)),
            ("meshql_subscription_position", "gauge", "Change log position up to which subscribers have been served.", position),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
    }

    /// Reads the changes after `after` (at most `until`), oldest first.
    pub async fn changes_after(
        &self,
        after: u64,
        until: u64,
    ) -> Result<(Vec<Change>, u64), String> {
        let log = self.log.clone();
        let page = tokio::task::spawn_blocking(move || {
            read_page(&log, after, PAGE, &FeedFilter::default())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        let mut changes = Vec::with_capacity(page.changes.len());
        for (position, json) in page.changes {
            if position > until {
                return Ok((changes, until));
            }
            match Change::parse(position, 0, json) {
                Ok(c) => changes.push(c),
                Err(e) => {
                    tracing::error!(position, error = %e, "subscriptions: an unreadable change was skipped")
                }
            }
        }
        Ok((changes, page.last.min(until)))
    }

    /// What every subscription looks at in `change`: its document, parsed once ([`parse`]).
    pub fn seen(&self, change: &Change) -> Seen {
        Seen {
            document: parse(change),
            before: None,
        }
    }

    /// `seen` with the version before `change` when it is an update (read once, and only
    /// when a subscription has no event for the new version: it may have one for leaving).
    async fn with_before(&self, change: &Change, mut seen: Seen) -> Option<Seen> {
        if change.op != meshql_core::ChangeOp::Update {
            return None;
        }
        seen.before =
            meshql_graphql::version_before(&self.registry, &event_of(change, None, None)).await;
        seen.before.is_some().then_some(seen)
    }

    /// The event of `change` for `subscription`, a departure included (see
    /// [`meshql_graphql::Subscription::event`]).
    pub async fn event_of_change(
        &self,
        subscription: &Subscription,
        change: &Change,
    ) -> Option<Vec<u8>> {
        let seen = self.seen(change);
        if let Some(event) = self.event(subscription, change, &seen).await {
            return Some(event);
        }
        let seen = self.with_before(change, seen).await?;
        self.event(subscription, change, &seen).await
    }

    /// The event of `change` (as [`Self::seen`] saw it) for `subscription`, if it has one.
    pub async fn event(
        &self,
        subscription: &Subscription,
        change: &Change,
        seen: &Seen,
    ) -> Option<Vec<u8>> {
        let event = event_of(change, seen.document.as_ref(), seen.before.as_ref());
        subscription.event(&self.registry, &event).await
    }

    /// Hands out the changes after the dispatcher's position, one page.
    async fn dispatch(&self) -> Result<(), String> {
        let from = {
            let mut state = self.state.lock();
            if state.cohorts.is_empty() {
                // nobody to hand anything to: skip the pages instead of reading them (a member
                // joining now starts from here, as it would from a caught-up dispatcher)
                state.position = state.position.max(self.log.last_offset());
                return Ok(());
            }
            state.position
        };
        let (changes, last) = self.changes_after(from, u64::MAX).await?;
        for change in changes {
            let at = change.position;
            // the cohorts of the change's entity (a pointer each); the position moves under
            // the same lock, so a member that joins from now on has this change in its
            // catch-up (`joined_at`) and is skipped below
            let cohorts: Vec<(Arc<str>, Arc<Subscription>)> = {
                let mut state = self.state.lock();
                state.position = at;
                state
                    .cohorts
                    .iter()
                    .filter(|(_, c)| c.subscription.entity() == change.entity)
                    .map(|(k, c)| (k.clone(), c.subscription.clone()))
                    .collect()
            };
            if cohorts.is_empty() {
                continue;
            }
            let seen = self.seen(&change);
            let mut events = futures::future::join_all(
                cohorts
                    .iter()
                    .map(|(_, subscription)| self.event(subscription, &change, &seen)),
            )
            .await;
            // the cohorts without an event for the new version may have one for the document
            // leaving their match: the version before is read once for them all
            if events.iter().any(Option::is_none) {
                if let Some(seen) = self.with_before(&change, seen).await {
                    for ((_, subscription), event) in cohorts.iter().zip(events.iter_mut()) {
                        if event.is_none() {
                            *event = self.event(subscription, &change, &seen).await;
                        }
                    }
                }
            }
            // hand each event to the members of its cohort (non-blocking sends, under the
            // lock: members are not copied)
            let mut state = self.state.lock();
            for ((key, _), event) in cohorts.into_iter().zip(events) {
                let Some(event) = event else { continue };
                let Some(cohort) = state.cohorts.get_mut(&key) else {
                    continue;
                };
                let event = Arc::new(event);
                let before = cohort.members.len();
                cohort.members.retain(|m| {
                    if m.joined_at >= at {
                        return true;
                    }
                    match m.queue.try_send((at, event.clone())) {
                        Ok(()) => {
                            self.stats.events.fetch_add(1, Ordering::Relaxed);
                            true
                        }
                        // its queue is full: drop it (its receiver sees the end of the events)
                        Err(mpsc::error::TrySendError::Full(_)) => false,
                        // it left; its membership removes it
                        Err(mpsc::error::TrySendError::Closed(_)) => true,
                    }
                });
                let dropped = (before - cohort.members.len()) as u64;
                if dropped > 0 {
                    self.stats
                        .dropped_slow
                        .fetch_add(dropped, Ordering::Relaxed);
                    self.stats.members.fetch_sub(dropped, Ordering::Relaxed);
                    tracing::warn!(
                        dropped,
                        "subscriptions: subscribers that stopped reading were dropped"
                    );
                }
                if cohort.members.is_empty() {
                    state.cohorts.remove(&key);
                }
            }
        }
        let mut state = self.state.lock();
        if last > state.position {
            state.position = last;
        }
        Ok(())
    }
}

/// What the subscriptions look at in a change ([`Subscriptions::seen`]).
pub struct Seen {
    pub document: Option<serde_json::Map<String, serde_json::Value>>,
    pub before: Option<Before>,
}

fn event_of<'a>(
    change: &'a Change,
    document: Option<&'a serde_json::Map<String, serde_json::Value>>,
    before: Option<&'a Before>,
) -> ChangeEvent<'a> {
    ChangeEvent {
        position: change.position,
        entity: &change.entity,
        id: &change.id,
        op: change.op.as_str(),
        created_at: change.created_at,
        authorized_tokens: &change.authorized_tokens,
        payload: change.payload.get(),
        document,
        before,
    }
}

/// A change's payload as a JSON object, parsed once per change.
pub fn parse(change: &Change) -> Option<serde_json::Map<String, serde_json::Value>> {
    serde_json::from_str(change.payload.get()).ok()
}

impl meshql_core::metrics::Collect for Subscriptions {
    fn collect(&self, out: &mut String) {
        self.write_metrics(out);
    }
}
