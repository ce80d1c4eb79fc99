//! `meshql export` and `meshql import`: a service's documents as NDJSON, with their history,
//! from one backend to another.
//!
//! **Format** (one JSON object per line; `.zst` files are zstd-compressed): a header
//! `{"meshql_export":1,"exported_at":MS,"at":MS|null,"history":BOOL,"entities":[…]}`, then one
//! line per version: `{"entity","id","created_at","deleted","authorized_tokens","payload"}`.
//! With `--history` every version of every document is exported (tombstones included), in
//! each store's feed order; without it, each document's version current at `--at` (or now),
//! deleted ones left out.
//!
//! **Import** writes each entity's versions in batches through
//! `StoreWriter::import_versions` (ids, times, tombstones and tokens kept; a version stored
//! already is skipped, so a second import changes nothing). Versions that are not tombstones
//! are validated against the target entity's JSON Schema first: one that fails, or names an
//! entity the config does not declare, is refused and counted, with its reason, without
//! stopping the import. The stores' feeds carry the imported versions; the service copies them
//! into its change log once, as any write.

use clap::Args;
use meshql_core::{DynStore, Envelope, ReadContext, TokenFilter};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Versions read from a store, or written to one, per round trip.
const BATCH: usize = 2048;
/// Refusals shown per entity.
const EXAMPLES: usize = 5;

#[derive(Args)]
pub struct ExportArgs {
    /// Config file or directory of the service.
    #[arg(default_value = ".")]
    config: PathBuf,
    /// The service's data directory, when it is not the config's.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Only these entities (repeat, or separate with commas). Default: all.
    #[arg(long, value_delimiter = ',')]
    entity: Vec<String>,
    /// Every version of every document, tombstones included (default: the current ones).
    #[arg(long)]
    history: bool,
    /// As of this moment (RFC 3339, or milliseconds since the epoch).
    #[arg(long)]
    at: Option<String>,
    /// The file to write (`-` for stdout); a name ending in `.zst` is zstd-compressed.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct ImportArgs {
    /// Config file or directory of the service to import into.
    config: PathBuf,
    /// The export (NDJSON, or zstd-compressed NDJSON).
    file: PathBuf,
    /// The service's data directory, when it is not the config's.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

pub fn run_export(args: ExportArgs) -> ExitCode {
    report(export(args), "export")
}

pub fn run_import(args: ImportArgs) -> ExitCode {
    report(import(args), "import")
}

fn report(result: Result<bool, String>, what: &str) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // done, with refusals
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("meshql {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The config's entity stores, opened from their databases (the service must not hold them).
pub(crate) struct Opened {
    databases: Vec<meshql_core::DynDatabase>,
    stores: Vec<(String, DynStore)>,
}

impl Opened {
    pub(crate) async fn open(config: &meshql_config::ResolvedConfig) -> Result<Opened, String> {
        let registries = crate::registries::registries();
        let targets =
            meshql_runtime::storage_targets(config, &registries.storage).map_err(|e| {
                e.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            })?;
        let mut by_target: HashMap<String, meshql_core::DynDatabase> = HashMap::new();
        let mut databases = Vec::new();
        let mut stores = Vec::new();
        for entity in &config.entities {
            let target = &targets[&entity.storage];
            let db = match by_target.get(&target.target()) {
                Some(db) => db.clone(),
                None => {
                    let db = target.open().await.map_err(|e| {
                        format!(
                            "storage {}: {e} (a serving meshql holds its SQLite files: stop it first)",
                            entity.storage
                        )
                    })?;
                    by_target.insert(target.target(), db.clone());
                    databases.push(db.clone());
                    db
                }
            };
            let store = db.store(&entity.table);
            store
                .prepare(&[])
                .await
                .map_err(|e| format!("{}: {e}", entity.name))?;
            stores.push((entity.name.clone(), store));
        }
        Ok(Opened { databases, stores })
    }

    /// The store of entity `name` (one the config declares).
    pub(crate) fn store(&self, name: &str) -> &DynStore {
        &self
            .stores
            .iter()
            .find(|(n, _)| n == name)
            .expect("an entity of the config")
            .1
    }

    pub(crate) async fn close(self) {
        for (_, s) in &self.stores {
            s.shutdown().await;
        }
        for db in &self.databases {
            db.close().await;
        }
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

pub(crate) fn load(
    config: &Path,
    data_dir: &Option<PathBuf>,
) -> Result<meshql_config::ResolvedConfig, String> {
    let mut c = meshql_config::load(config).map_err(|e| e.to_string())?;
    if let Some(d) = data_dir {
        c.set_data_dir(d.clone());
    }
    Ok(c)
}

/// A line's writer: a file, zstd when its name ends in `.zst`, or stdout.
fn output(path: &Path) -> Result<Box<dyn Write>, String> {
    if path == Path::new("-") {
        return Ok(Box::new(BufWriter::new(std::io::stdout().lock())));
    }
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "zst") {
        let encoder = zstd::Encoder::new(file, 3)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .auto_finish();
        Ok(Box::new(BufWriter::with_capacity(1 << 16, encoder)))
    } else {
        Ok(Box::new(BufWriter::with_capacity(1 << 16, file)))
    }
}

/// A line's reader: zstd when the file starts with its magic number.
fn input(path: &Path) -> Result<Box<dyn BufRead>, String> {
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(io)?;
    let file = std::fs::File::open(path).map_err(io)?;
    if n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            zstd::Decoder::new(file).map_err(io)?,
        )))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, file)))
    }
}

/// One line of an export: a version.
fn version_line(out: &mut Vec<u8>, entity: &str, v: &Envelope) {
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

/// Prints `n` versions and the rate to a terminal's stderr, at most twice a second.
struct Progress {
    on: bool,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new() -> Progress {
        let now = Instant::now();
        Progress {
            on: std::io::stderr().is_terminal(),
            started: now,
            last: now,
        }
    }

    fn tick(&mut self, what: &str, n: u64) {
        if self.on && self.last.elapsed() >= Duration::from_millis(500) {
            self.last = Instant::now();
            let rate = n as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            eprint!("\r{what}: {n} versions, {rate:.0}/s      ");
        }
    }

    fn done(&self) -> f64 {
        if self.on {
            eprint!("\r");
        }
        self.started.elapsed().as_secs_f64()
    }
}

fn export(args: ExportArgs) -> Result<bool, String> {
    let config = load(&args.config, &args.data_dir)?;
    for e in &args.entity {
        if !config.entities.iter().any(|c| &c.name == e) {
            return Err(format!(
                "{} declares no entity \"{e}\"",
                config.file.display()
            ));
        }
    }
    let at = args
        .at
        .as_deref()
        .map(crate::backup::parse_moment)
        .transpose()?;
    let rt = runtime()?;
    rt.block_on(async {
        let opened = Opened::open(&config).await?;
        let result = export_stores(&opened.stores, &args, at).await;
        opened.close().await;
        result
    })
}

async fn export_stores(
    stores: &[(String, DynStore)],
    args: &ExportArgs,
    at: Option<i64>,
) -> Result<bool, String> {
    let chosen: Vec<&(String, DynStore)> = stores
        .iter()
        .filter(|(name, _)| args.entity.is_empty() || args.entity.contains(name))
        .collect();
    let mut out = output(&args.out)?;
    let header = serde_json::json!({
        "meshql_export": 1,
        "exported_at": meshql_core::time::now_millis(),
        "at": at,
        "history": args.history,
        "entities": chosen.iter().map(|(n, _)| n).collect::<Vec<_>>(),
    });
    let werr = |e: std::io::Error| format!("{}: {e}", args.out.display());
    writeln!(out, "{header}").map_err(werr)?;
    let mut progress = Progress::new();
    let mut total = 0u64;
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut line = Vec::with_capacity(4096);
    for (name, store) in chosen {
        let mut n = 0u64;
        if args.history {
            let mut cursor = meshql_core::Cursor::seq(0);
            loop {
                let page = store
                    .changes(cursor, BATCH)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                let Some(last) = page.last() else { break };
                cursor = last.cursor;
                line.clear();
                for c in &page {
                    if at.is_some_and(|at| c.created_at > at) {
                        continue;
                    }
                    let v = Envelope {
                        id: c.id.clone(),
                        payload: c.payload.clone(),
                        created_at: c.created_at,
                        deleted: c.op == meshql_core::ChangeOp::Delete,
                        authorized_tokens: c.authorized_tokens.clone(),
                    };
                    version_line(&mut line, name, &v);
                    n += 1;
                }
                out.write_all(&line).map_err(werr)?;
                progress.tick(name, total + n);
            }
        } else {
            let filter = TokenFilter::All;
            let ctx = ReadContext::new(&filter, at);
            let mut after: Option<String> = None;
            loop {
                let page = store
                    .list_page(after.as_deref(), BATCH, &ctx)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                let Some(last) = page.last() else { break };
                after = Some(last.id.clone());
                line.clear();
                for v in &page {
                    version_line(&mut line, name, v);
                }
                n += page.len() as u64;
                out.write_all(&line).map_err(werr)?;
                progress.tick(name, total + n);
                if page.len() < BATCH {
                    break;
                }
            }
        }
        total += n;
        counts.push((name.clone(), n));
    }
    out.flush().map_err(werr)?;
    drop(out);
    let seconds = progress.done();
    for (name, n) in counts.iter().filter(|(_, n)| *n > 0) {
        eprintln!("  {name:<24} {n:>10} versions");
    }
    eprintln!(
        "exported {total} versions in {seconds:.2} s ({:.0}/s) to {}",
        total as f64 / seconds.max(1e-3),
        args.out.display()
    );
    Ok(true)
}

/// What an import did with one entity's versions.
#[derive(Default)]
struct Tally {
    read: u64,
    written: u64,
    refused: u64,
    examples: Vec<String>,
}

impl Tally {
    fn refuse(&mut self, why: String) {
        self.refused += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(why);
        }
    }
}

#[derive(serde::Deserialize)]
struct Line {
    entity: String,
    id: String,
    created_at: i64,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    authorized_tokens: Vec<String>,
    payload: Box<serde_json::value::RawValue>,
}

fn import(args: ImportArgs) -> Result<bool, String> {
    let config = load(&args.config, &args.data_dir)?;
    let mut reader = input(&args.file)?;
    let mut first = String::new();
    reader
        .read_line(&mut first)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    let header: serde_json::Value = serde_json::from_str(&first).map_err(|e| {
        format!(
            "{}: line 1 is not a meshql export header: {e}",
            args.file.display()
        )
    })?;
    if header["meshql_export"] != 1 {
        return Err(format!(
            "{}: not a meshql export (format 1) — its first line is {}",
            args.file.display(),
            first.trim()
        ));
    }
    let mut validators = HashMap::new();
    for e in &config.entities {
        if let Some(schema) = e.rest.as_ref().and_then(|r| r.schema.as_ref()) {
            let v = meshql_engine::PayloadValidator::new(schema)
                .map_err(|err| format!("{}: {}", e.name, err.0))?;
            validators.insert(e.name.clone(), v);
        }
    }
    let rt = runtime()?;
    rt.block_on(async {
        let opened = Opened::open(&config).await?;
        let result = import_lines(&opened.stores, &validators, reader, &args.file).await;
        opened.close().await;
        result
    })
}

async fn import_lines(
    stores: &[(String, DynStore)],
    validators: &HashMap<String, meshql_engine::PayloadValidator>,
    reader: Box<dyn BufRead>,
    file: &Path,
) -> Result<bool, String> {
    let stores: HashMap<&str, &DynStore> = stores.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let mut pending: HashMap<String, Vec<Envelope>> = HashMap::new();
    let mut progress = Progress::new();
    let mut seen = 0u64;
    async fn flush(
        store: &DynStore,
        batch: &mut Vec<Envelope>,
        tally: &mut Tally,
        entity: &str,
    ) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let written = store
            .import_versions(batch)
            .await
            .map_err(|e| format!("{entity}: {e}"))?;
        tally.written += written;
        batch.clear();
        Ok(())
    }
    for (n, line) in reader.lines().enumerate() {
        let line_no = n + 2;
        let line = line.map_err(|e| format!("{}: {e}", file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        seen += 1;
        let parsed: Line = match serde_json::from_str(&line) {
            Ok(l) => l,
            Err(e) => {
                tallies
                    .entry("(unreadable lines)".into())
                    .or_default()
                    .refuse(format!("line {line_no}: {e}"));
                continue;
            }
        };
        let tally = tallies.entry(parsed.entity.clone()).or_default();
        tally.read += 1;
        let Some(store) = stores.get(parsed.entity.as_str()) else {
            tally.refuse(format!(
                "line {line_no}: the config declares no entity \"{}\"",
                parsed.entity
            ));
            continue;
        };
        if !parsed.deleted {
            if let Some(v) = validators.get(&parsed.entity) {
                let value: serde_json::Value = match serde_json::from_str(parsed.payload.get()) {
                    Ok(v) => v,
                    Err(e) => {
                        tally.refuse(format!("line {line_no}: {}: {e}", parsed.id));
                        continue;
                    }
                };
                let violations = v.violations(&value);
                if !violations.is_empty() {
                    let why: Vec<String> = violations
                        .iter()
                        .take(3)
                        .map(|x| {
                            format!(
                                "{} {}",
                                x["path"].as_str().unwrap_or(""),
                                x["message"].as_str().unwrap_or("")
                            )
                        })
                        .collect();
                    tally.refuse(format!(
                        "line {line_no}: {} at {}: {}",
                        parsed.id,
                        parsed.created_at,
                        why.join("; ")
                    ));
                    continue;
                }
            }
        }
        let batch = pending.entry(parsed.entity.clone()).or_default();
        batch.push(Envelope {
            id: parsed.id,
            payload: parsed.payload.get().to_owned(),
            created_at: parsed.created_at,
            deleted: parsed.deleted,
            authorized_tokens: parsed.authorized_tokens,
        });
        if batch.len() >= BATCH {
            flush(store, batch, tally, &parsed.entity).await?;
        }
        progress.tick("imported", seen);
    }
    for (entity, batch) in pending.iter_mut() {
        let tally = tallies.entry(entity.clone()).or_default();
        flush(stores[entity.as_str()], batch, tally, entity).await?;
    }
    let seconds = progress.done();
    let (mut written, mut refused) = (0u64, 0u64);
    for (entity, t) in &tallies {
        eprintln!(
            "  {entity:<24} {:>10} read {:>10} written {:>8} already there {:>8} refused",
            t.read,
            t.written,
            t.read.saturating_sub(t.written + t.refused),
            t.refused
        );
        for e in &t.examples {
            eprintln!("      refused: {e}");
        }
        written += t.written;
        refused += t.refused;
    }
    eprintln!(
        "imported {written} of {seen} versions in {seconds:.2} s ({:.0}/s){}",
        seen as f64 / seconds.max(1e-3),
        if refused > 0 {
            format!("; {refused} refused (exit 3)")
        } else {
            String::new()
        }
    );
    Ok(refused == 0)
}
