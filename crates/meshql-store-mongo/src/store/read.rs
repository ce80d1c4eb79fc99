//! The store's [`StoreReader`] impl, and the parking of list pages' cursors it does.

use super::parked::{Parked, PARKED_FOR, PARKED_MAX};
use super::visible::visible;
use super::MongoStore;
use crate::document::{envelope, payload_text};
use crate::error::error;
use crate::filter::{path_key, template_filter, Matcher};
use async_trait::async_trait;
use futures::TryStreamExt;
use meshql_core::template::TemplateKind;
use meshql_core::{
    in_request_order, ArgValue, BatchSearch, BoundArgs, Envelope, FieldPath, KeyedRows,
    ReadContext, Row, Search, StoreError, StoreReader,
};
use mongodb::bson::{doc, DateTime, Document};
use std::sync::atomic::Ordering;

impl MongoStore {
    /// The parked cursor continuing a page of `ctx` after `after`, if any; expired ones are
    /// dropped on the way.
    fn unpark(
        &self,
        after: Option<&str>,
        ctx: &ReadContext<'_>,
    ) -> Option<mongodb::Cursor<Document>> {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        parked.retain(|p| p.since.elapsed() < PARKED_FOR);
        let (after, at) = (after?, ctx.at?);
        let i = parked
            .iter()
            .position(|p| p.at == at && p.after == after && p.filter == *ctx.filter)?;
        Some(parked.swap_remove(i).cursor)
    }

    fn park(&self, cursor: mongodb::Cursor<Document>, after: String, ctx: &ReadContext<'_>) {
        let Some(at) = ctx.at else { return };
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if parked.len() >= PARKED_MAX {
            let oldest = (0..parked.len()).min_by_key(|&i| parked[i].since);
            if let Some(i) = oldest {
                parked.swap_remove(i);
            }
        }
        parked.push(Parked {
            filter: ctx.filter.clone(),
            at,
            after,
            cursor,
            since: std::time::Instant::now(),
        });
    }
}

#[async_trait]
impl StoreReader for MongoStore {
    async fn read(&self, id: &str, ctx: &ReadContext<'_>) -> Result<Option<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let f = match at {
            None => doc! {"id": id, "latest": true},
            Some(at) => doc! {"id": id, "created_at": {"$lte": DateTime::from_millis(at)}},
        };
        let d = self
            .coll
            .find_one(f)
            .sort(doc! {"created_at": -1})
            .await
            .map_err(error)?;
        let Some(d) = d else { return Ok(None) };
        let e = envelope(&d)?;
        Ok(visible(e, filter))
    }

    async fn read_many(
        &self,
        ids: &[String],
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        // one query: each id's candidate versions, newest first, then the first per id
        let f = match at {
            None => doc! {"id": {"$in": ids}, "latest": true},
            Some(at) => {
                doc! {"id": {"$in": ids}, "created_at": {"$lte": DateTime::from_millis(at)}}
            }
        };
        let docs: Vec<Document> = self
            .coll
            .find(f)
            .sort(doc! {"id": 1, "created_at": -1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        // newest first within each id: keep the first of each
        let mut found: Vec<Envelope> = Vec::with_capacity(ids.len());
        for d in &docs {
            if found.last().map(|e| e.id.as_str()) != d.get_str("id").ok() {
                found.push(envelope(d)?);
            }
        }
        Ok(in_request_order(ids, found, filter))
    }

    async fn list(&self, ctx: &ReadContext<'_>) -> Result<Vec<Envelope>, StoreError> {
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.visible_docs(Document::new(), &Matcher::Filter, filter, at, None)
            .await?
            .iter()
            .map(envelope)
            .collect()
    }

    /// Walks the unique `(id, created_at desc)` index from `after`: the first version of each
    /// id at or before `at` is its visible one (whatever `latest` flags say). A page read at a
    /// fixed time parks its cursor when full, for the next page to continue ([`Parked`]).
    async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Envelope>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let mut cursor = match self.unpark(after, ctx) {
            Some(c) => c,
            None => {
                let mut f = Document::new();
                if let Some(after) = after {
                    f.insert("id", doc! {"$gt": after});
                }
                if let Some(at) = ctx.at {
                    f.insert("created_at", doc! {"$lte": DateTime::from_millis(at)});
                }
                self.coll
                    .find(f)
                    .sort(doc! {"id": 1, "created_at": -1})
                    .batch_size(u32::try_from(limit.saturating_add(16)).unwrap_or(u32::MAX))
                    .await
                    .map_err(error)?
            }
        };
        let mut out: Vec<Envelope> = Vec::with_capacity(limit.min(1024));
        // the id whose newest version was taken; a parked cursor stopped right after it
        let mut last: Option<String> = after.map(str::to_owned);
        while out.len() < limit {
            let Some(d) = cursor.try_next().await.map_err(error)? else {
                return Ok(out);
            };
            let id = d.get_str("id").unwrap_or_default();
            if last.as_deref() == Some(id) {
                continue; // an older version of the id just taken
            }
            last = Some(id.to_owned());
            if let Some(e) = visible(envelope(&d)?, ctx.filter) {
                out.push(e);
            }
        }
        if let Some(e) = out.last() {
            self.park(cursor, e.id.clone(), ctx);
        }
        Ok(out)
    }

    async fn versions(&self, id: &str) -> Result<Vec<Envelope>, StoreError> {
        let _permit = self.db.checkout().await?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let docs: Vec<Document> = self
            .coll
            .find(doc! {"id": id})
            .sort(doc! {"created_at": 1})
            .await
            .map_err(error)?
            .try_collect()
            .await
            .map_err(error)?;
        docs.iter().map(envelope).collect()
    }

    async fn find(
        &self,
        search: &Search<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let Search {
            template,
            args,
            limit,
            ..
        } = *search;
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        self.find_rows(template, args, filter, at, limit).await
    }

    async fn find_batch(
        &self,
        batch: &BatchSearch<'_>,
        ctx: &ReadContext<'_>,
    ) -> Result<KeyedRows, StoreError> {
        let BatchSearch {
            template,
            key_arg,
            keys,
        } = *batch;
        let (filter, at) = (ctx.filter, ctx.at);
        let _permit = self.db.checkout().await?;
        let no_preds = Vec::new();
        let preds = match &template.kind {
            TemplateKind::Filter(preds) => preds,
            // operators: one query per key (below)
            TemplateKind::Query(_) => &no_preds,
            TemplateKind::Sql(_) => {
                return Err(StoreError::Invalid(format!(
                    "SQL fragment `{}` needs a SQL backend",
                    template.source
                )))
            }
        };
        // the predicate the key binds to: one `$in` query for all keys
        let key_path = preds.iter().find_map(|(path, v)| match v {
            ArgValue::Arg(name) if name == key_arg => Some(path.clone()),
            _ => None,
        });
        let Some(key_path) = key_path else {
            // the key is not a whole predicate value: one query per key
            let mut out = Vec::new();
            for k in keys {
                let mut args = BoundArgs::new();
                args.insert(key_arg.to_owned(), serde_json::Value::String(k.clone()));
                for row in self.find_rows(template, &args, filter, at, None).await? {
                    out.push((k.clone(), row));
                }
            }
            return Ok(out);
        };
        let mut matching = template_filter(template, &BoundArgs::new(), "")?;
        matching.insert(path_key(&key_path), doc! {"$in": keys.to_vec()});
        let docs = self
            .visible_docs(matching, &Matcher::Filter, filter, at, None)
            .await?;
        let mut out = Vec::with_capacity(docs.len());
        for d in &docs {
            let id = d.get_str("id").unwrap_or_default().to_owned();
            let payload = payload_text(d)?;
            let key = match &key_path {
                FieldPath::Id => Some(id.clone()),
                FieldPath::Payload(_) => {
                    let map: serde_json::Map<String, serde_json::Value> =
                        serde_json::from_str(&payload).unwrap_or_default();
                    key_path.lookup(&id, &map).and_then(|v| match v {
                        serde_json::Value::String(s) => Some(s),
                        serde_json::Value::Null => None,
                        other => Some(other.to_string()),
                    })
                }
            };
            if let Some(key) = key {
                out.push((key, Row { id, payload }));
            }
        }
        Ok(out)
    }
}
