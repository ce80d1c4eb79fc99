//! Which versions a read sees: the visible versions matching a filter, now or at a past time
//! ("latest, then filter"), and a template's rows from them.

use super::MongoStore;
use crate::document::payload_text;
use crate::error::error;
use crate::filter::{template_filter, token_filter, Matcher};
use futures::TryStreamExt;
use meshql_core::{BoundArgs, Envelope, Millis, QueryTemplate, Row, StoreError, TokenFilter};
use mongodb::bson::{doc, DateTime, Document};
use std::sync::atomic::Ordering;

/// Versions sorted by `seq` where one id may (after a failed or concurrent write, until its
/// flag is cleared) have several flagged `latest`: its versions share a `seq`, so they are
/// adjacent; keeps the newest of each run.
fn newest_per_seq(docs: Vec<Document>) -> Vec<Document> {
    let created = |d: &Document| d.get_datetime("created_at").ok().copied();
    let mut out: Vec<Document> = Vec::with_capacity(docs.len());
    for d in docs {
        match out.last_mut() {
            Some(prev) if prev.get_object_id("seq").ok() == d.get_object_id("seq").ok() => {
                if created(&d) > created(prev) {
                    *prev = d;
                }
            }
            _ => out.push(d),
        }
    }
    out
}

/// `e` unless it is a tombstone or hidden from the caller's tokens.
pub(super) fn visible(e: Envelope, filter: &TokenFilter) -> Option<Envelope> {
    (!e.deleted && meshql_core::auth::is_visible(filter, &e.authorized_tokens)).then_some(e)
}

impl MongoStore {
    pub(super) async fn find_rows(
        &self,
        template: &QueryTemplate,
        args: &BoundArgs,
        filter: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Row>, StoreError> {
        template
            .check_args(args)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let matching = template_filter(template, args, "")?;
        let check = Matcher::of(template, args);
        if template.sort().is_empty() {
            return self
                .visible_docs(matching, &check, filter, at, limit)
                .await?
                .iter()
                .map(|d| {
                    Ok(Row {
                        id: d.get_str("id").unwrap_or_default().to_owned(),
                        payload: payload_text(d)?,
                    })
                })
                .collect();
        }
        // sorted here, with the comparison every backend shares, then cut to `limit`
        let mut rows: Vec<(Row, serde_json::Map<String, serde_json::Value>)> = self
            .visible_docs(matching, &check, filter, at, None)
            .await?
            .iter()
            .map(|d| {
                let payload = payload_text(d)?;
                let parsed = serde_json::from_str(&payload).unwrap_or_default();
                let id = d.get_str("id").unwrap_or_default().to_owned();
                Ok((Row { id, payload }, parsed))
            })
            .collect::<Result<_, StoreError>>()?;
        template.sort_rows(&mut rows, |(r, p)| (r.id.as_str(), p));
        Ok(rows
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .map(|(r, _)| r)
            .collect())
    }

    /// Visible versions matching `filter` (a Document over the version's fields), at `at`.
    /// The ids of the versions matching `filter`, sorted, each once.
    async fn distinct_ids(&self, filter: Document) -> Result<Vec<String>, StoreError> {
        let found: Vec<Document> = self
            .coll
            .find(filter)
            .projection(doc! {"id": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        let mut ids: Vec<String> = found
            .iter()
            .filter_map(|d| d.get_str("id").ok().map(str::to_owned))
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    pub(super) async fn visible_docs(
        &self,
        matching: Document,
        check: &Matcher<'_>,
        tokens: &TokenFilter,
        at: Option<Millis>,
        limit: Option<usize>,
    ) -> Result<Vec<Document>, StoreError> {
        let tokens_filter = tokens;
        self.reads.fetch_add(1, Ordering::Relaxed);
        match at {
            None => {
                let mut f = doc! {"latest": true, "deleted": false};
                f.extend(matching);
                if let Some(t) = token_filter(tokens) {
                    f.extend(t);
                }
                let mut find = self.coll.find(f).sort(doc! {"seq": 1});
                if let Some(l) = limit {
                    find = find.limit(l as i64);
                }
                let docs: Vec<Document> = find
                    .await
                    .map_err(error)?
                    .try_collect()
                    .await
                    .map_err(error)?;
                Ok(newest_per_seq(docs))
            }
            Some(at) => {
                // In two parts, so that the cost follows the current documents and the
                // versions written after `at`, not every version stored (an `at` close to
                // now is what every GraphQL request reads with): documents unchanged since
                // `at` are their latest version; those changed since are read as below.
                let before = DateTime::from_millis(at);
                // a condition on the id reads those ids' versions alone, as it always did
                let by_id = matching.contains_key("id");
                let mut newest: Vec<Document> = Vec::new();
                let changed = if by_id {
                    None
                } else {
                    let changed = self
                        .distinct_ids(doc! {"created_at": {"$gt": before}})
                        .await?;
                    let mut unchanged =
                        doc! {"latest": true, "deleted": false, "created_at": {"$lte": before}};
                    unchanged.extend(matching.clone());
                    if let Some(t) = token_filter(tokens) {
                        unchanged.extend(t);
                    }
                    newest = self
                        .coll
                        .find(unchanged)
                        .sort(doc! {"seq": 1})
                        .await
                        .map_err(error)?
                        .try_collect()
                        .await
                        .map_err(error)?;
                    // a version whose `latest` flag is not yet settled (see `settle_latest`):
                    // the newer of the two, or, if that is after `at`, neither (the document
                    // changed since, and is read with those below)
                    newest = newest_per_seq(newest);
                    newest.retain(|d| {
                        d.get_str("id").is_ok_and(|id| {
                            changed.binary_search_by(|c| c.as_str().cmp(id)).is_err()
                        })
                    });
                    if changed.is_empty() {
                        if let Some(l) = limit {
                            newest.truncate(l);
                        }
                        return Ok(newest);
                    }
                    Some(changed)
                };
                // Portable "latest ≤ at, then filter" without $group/$first (FerretDB lacks
                // them): of the documents changed since, ids with some matching version
                // ≤ at, then their newest version ≤ at, checked in process.
                let mut f = doc! {"created_at": {"$lte": before}};
                if let Some(changed) = &changed {
                    f.insert("id", doc! {"$in": changed});
                }
                f.extend(matching.clone());
                let ids = self.distinct_ids(f).await?;
                let versions: Vec<Document> = if ids.is_empty() {
                    Vec::new()
                } else {
                    self.coll
                        .find(doc! {"id": {"$in": ids}, "created_at": {"$lte": before}})
                        .sort(doc! {"id": 1, "created_at": -1})
                        .await
                        .map_err(error)?
                        .try_collect()
                        .await
                        .map_err(error)?
                };
                let mut last_id: Option<String> = None;
                for v in versions {
                    let id = v.get_str("id").unwrap_or_default().to_owned();
                    if last_id.as_deref() == Some(id.as_str()) {
                        continue;
                    }
                    last_id = Some(id);
                    let tokens: Vec<String> = v
                        .get_array("authorized_tokens")
                        .map(|a| {
                            a.iter()
                                .filter_map(|t| t.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    if !v.get_bool("deleted").unwrap_or(false)
                        && meshql_core::auth::is_visible(tokens_filter, &tokens)
                        && check.matches(&v, &matching)
                    {
                        newest.push(v);
                    }
                }
                newest.sort_by_key(|d| d.get_object_id("seq").unwrap_or_default());
                if let Some(l) = limit {
                    newest.truncate(l);
                }
                Ok(newest)
            }
        }
    }
}
