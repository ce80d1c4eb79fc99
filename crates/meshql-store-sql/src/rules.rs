//! Rules every SQL store applies the same way, whatever its driver.

use meshql_core::{Envelope, Millis, QueryTemplate, TokenFilter};

/// The current version of an id as a writer sees it (its newest version, a tombstone
/// included), read by each store with its own driver.
#[derive(Debug, Clone)]
pub struct Current {
    /// Row id of this version.
    pub rowid: i64,
    /// Row id of the document's first version (creation order).
    pub seq: i64,
    pub payload: String,
    pub created_at: Millis,
    pub deleted: bool,
    pub tokens: Vec<String>,
}

/// A version to append.
#[derive(Debug)]
pub struct Version<'a> {
    pub id: &'a str,
    pub payload: String,
    /// The time the writer asked for (`None`: now).
    pub created_at: Option<Millis>,
    pub deleted: bool,
    pub tokens: &'a [String],
    /// The id was generated for this write, so no earlier version can exist.
    pub fresh_id: bool,
    pub correlation_id: Option<&'a str>,
}

/// The caller's tokens as the JSON array a statement binds (`None`: it sees everything).
pub fn tokens_json(filter: &TokenFilter) -> Option<String> {
    match filter {
        TokenFilter::All => None,
        TokenFilter::AnyOf(t) => Some(serde_json::to_string(t).expect("strings serialise")),
    }
}

/// The caller's tokens as a list (`None`: it sees everything).
pub fn token_list(filter: &TokenFilter) -> Option<Vec<String>> {
    match filter {
        TokenFilter::All => None,
        TokenFilter::AnyOf(t) => Some(t.clone()),
    }
}

/// Whether a version read by id is one the caller gets: not a tombstone, and allowed by its
/// tokens.
pub fn visible(filter: &TokenFilter, e: &Envelope) -> bool {
    !e.deleted && meshql_core::auth::is_visible(filter, &e.authorized_tokens)
}

/// Orders rows (already in creation order) by a template's sort keys, with the comparison
/// every backend shares (`meshql_core::template::sort_compare`): for a dialect whose rows
/// are sorted by the caller rather than by the database (`RowOrder::ByCaller`). A payload
/// that does not parse sorts as `{}`.
pub fn sort_by_template<T>(
    template: &QueryTemplate,
    rows: &mut Vec<T>,
    parts: impl Fn(&T) -> (&String, &String),
) {
    if template.sort().is_empty() {
        return;
    }
    let empty = serde_json::Map::new();
    let mut parsed: Vec<(T, serde_json::Map<String, serde_json::Value>)> = rows
        .drain(..)
        .map(|r| {
            let payload = serde_json::from_str(parts(&r).1).unwrap_or_else(|_| empty.clone());
            (r, payload)
        })
        .collect();
    template.sort_rows(&mut parsed, |(r, p)| (parts(r).0.as_str(), p));
    rows.extend(parsed.into_iter().map(|(r, _)| r));
}

impl<'a> Version<'a> {
    /// The tombstone of `id` after its current version: its last payload, its tokens.
    pub fn tombstone(
        id: &'a str,
        payload: String,
        tokens: &'a [String],
        correlation_id: Option<&'a str>,
    ) -> Self {
        Version {
            id,
            payload,
            created_at: None,
            deleted: true,
            tokens,
            fresh_id: false,
            correlation_id,
        }
    }
}

/// Whether an update applies to an id's current version: not a tombstone, and visible to
/// the writer's tokens.
pub fn updatable(current: &Current, filter: &TokenFilter) -> bool {
    !current.deleted && meshql_core::auth::is_visible(filter, &current.tokens)
}

/// What a remove does, given an id's current version.
#[derive(Debug)]
pub enum RemoveStep {
    /// Nothing to write: none, or hidden from the writer (`NotFound`), or a tombstone
    /// already (`AlreadyDeleted`).
    Done(meshql_core::RemoveOutcome),
    /// Append the tombstone after this version (then `Removed`).
    Tombstone(Current),
}

impl RemoveStep {
    pub fn of(current: Option<Current>, filter: &TokenFilter) -> Self {
        use meshql_core::RemoveOutcome;
        match current {
            None => RemoveStep::Done(RemoveOutcome::NotFound),
            Some(cur) if !meshql_core::auth::is_visible(filter, &cur.tokens) => {
                RemoveStep::Done(RemoveOutcome::NotFound)
            }
            Some(cur) if cur.deleted => RemoveStep::Done(RemoveOutcome::AlreadyDeleted),
            Some(cur) => RemoveStep::Tombstone(cur),
        }
    }
}
