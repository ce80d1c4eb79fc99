//! An export of a service's documents as NDJSON (what `meshql export` writes, from the files or
//! through the running service's `GET /_meshql/export`).
//!
//! **Format 1**: a header line
//! `{"meshql_export":1,"exported_at":MS,"at":MS|null,"history":BOOL,"entities":[…]}`, then one
//! line per version: `{"entity","id","created_at","deleted","authorized_tokens","payload"}`.
//! With `history` every version of every document (tombstones included), in each store's feed
//! order; without it, each document's version current at `at` (or now), deleted ones left
//! out. Each store is read a page at a time and each page handed to a [`Sink`] before the next
//! is read, so an export holds one page in memory whatever the data's size.

use meshql_core::{ChangeOp, Cursor, DynStore, Envelope, Millis, ReadContext, TokenFilter};

/// The format's version, in the header's `meshql_export`.
pub const FORMAT: u64 = 1;
/// Versions read from a store per round trip.
pub const PAGE: usize = 2048;

/// What to export.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportSpec {
    /// Only these entities (empty: every one).
    pub entities: Vec<String>,
    /// Every version, tombstones included (else the current ones).
    pub history: bool,
    /// As of this moment (else now).
    pub at: Option<Millis>,
}

/// Where an export's lines go, a page at a time.
#[async_trait::async_trait]
pub trait Sink: Send {
    /// `lines`: whole lines of `entity`'s versions; `exported`: how many versions of every
    /// entity so far, these included.
    async fn page(&mut self, entity: &str, lines: &[u8], exported: u64) -> Result<(), String>;
}

/// The stores `spec` selects, in the config's order; an error names an entity the service
/// does not have.
pub fn chosen<'a>(
    stores: &'a [(String, DynStore)],
    spec: &ExportSpec,
) -> Result<Vec<&'a (String, DynStore)>, String> {
    for e in &spec.entities {
        if !stores.iter().any(|(name, _)| name == e) {
            let names: Vec<&str> = stores.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "no entity \"{e}\" (the service has: {})",
                names.join(", ")
            ));
        }
    }
    Ok(stores
        .iter()
        .filter(|(name, _)| spec.entities.is_empty() || spec.entities.contains(name))
        .collect())
}

/// The header line (with its newline).
pub fn header(spec: &ExportSpec, entities: &[&(String, DynStore)]) -> Vec<u8> {
    let header = serde_json::json!({
        "meshql_export": FORMAT,
        "exported_at": meshql_core::time::now_millis(),
        "at": spec.at,
        "history": spec.history,
        "entities": entities.iter().map(|(n, _)| n).collect::<Vec<_>>(),
    });
    let mut line = header.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// One line of an export: a version.
pub fn version_line(out: &mut Vec<u8>, entity: &str, v: &Envelope) {
    out.extend_from_slice(b"{\"entity\":");
    serde_json::to_writer(&mut *out, entity).expect("a string serialises");
    out.extend_from_slice(b",\"id\":");
    serde_json::to_writer(&mut *out, &v.id).expect("a string serialises");
    out.extend_from_slice(
        format!(",\"created_at\":{},\"deleted\":{}", v.created_at, v.deleted).as_bytes(),
    );
    out.extend_from_slice(b",\"authorized_tokens\":");
    serde_json::to_writer(&mut *out, &v.authorized_tokens).expect("strings serialise");
    out.extend_from_slice(b",\"payload\":");
    // the stored text is a JSON object already: written as it is, never re-serialised
    out.extend_from_slice(v.payload.as_bytes());
    out.extend_from_slice(b"}\n");
}

/// Writes the versions of `entities` (after the header, which the caller writes) to `sink`;
/// returns how many versions each had.
pub async fn export(
    entities: &[&(String, DynStore)],
    spec: &ExportSpec,
    sink: &mut dyn Sink,
) -> Result<Vec<(String, u64)>, String> {
    let mut total = 0u64;
    let mut counts = Vec::new();
    let mut lines = Vec::with_capacity(4096);
    for (name, store) in entities {
        let mut n = 0u64;
        if spec.history {
            let mut cursor = Cursor::seq(0);
            loop {
                let page = store
                    .changes(cursor, PAGE)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                let Some(last) = page.last() else { break };
                cursor = last.cursor;
                lines.clear();
                let before = n;
                for c in &page {
                    if spec.at.is_some_and(|at| c.created_at > at) {
                        continue;
                    }
                    let v = Envelope {
                        id: c.id.clone(),
                        payload: c.payload.clone(),
                        created_at: c.created_at,
                        deleted: c.op == ChangeOp::Delete,
                        authorized_tokens: c.authorized_tokens.clone(),
                    };
                    version_line(&mut lines, name, &v);
                    n += 1;
                }
                if n > before {
                    sink.page(name, &lines, total + n).await?;
                }
            }
        } else {
            let filter = TokenFilter::All;
            let ctx = ReadContext::new(&filter, spec.at);
            let mut after: Option<String> = None;
            loop {
                let page = store
                    .list_page(after.as_deref(), PAGE, &ctx)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                let Some(last) = page.last() else { break };
                after = Some(last.id.clone());
                lines.clear();
                for v in &page {
                    version_line(&mut lines, name, v);
                }
                n += page.len() as u64;
                sink.page(name, &lines, total + n).await?;
                if page.len() < PAGE {
                    break;
                }
            }
        }
        total += n;
        counts.push((name.clone(), n));
    }
    Ok(counts)
}
