//! `meshql export` and `meshql import`: a service's documents as NDJSON, with their history,
//! from one backend to another.
//!
//! **Export** ([`meshql_runtime::export`] has the format; `.zst` files are zstd-compressed)
//! asks the running service first (`GET /_meshql/export`, streamed into the file), and reads
//! the data directory's storage itself when none answers, or when the one on the config's port
//! keeps another data directory.
//!
//! **Import** writes each entity's versions in batches through
//! `StoreWriter::import_versions` (ids, times, tombstones and tokens kept; a version stored
//! already is skipped, so a second import changes nothing). Versions that are not tombstones
//! are validated against the target entity's JSON Schema first: one that fails, or names an
//! entity the config does not declare, is refused and counted, with its reason, without
//! stopping the import. The stores' feeds carry the imported versions; the service copies them
//! into its change log once, as any write.

use clap::Args;
use meshql_core::DynStore;
use meshql_runtime::export::{ExportSpec, Sink};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
    /// The running service to export through (default: the config's port on this machine;
    /// when none answers there, the data directory's files are read directly).
    #[arg(long)]
    url: Option<String>,
    /// A bearer token for the service (a caller allowed every action on every entity).
    #[arg(long, env = "MESHQL_TOKEN")]
    token: Option<String>,
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
    /// The running service to import through (default: the config's port on this machine;
    /// when none answers there, the storage is written directly).
    #[arg(long)]
    url: Option<String>,
    /// A bearer token for the service (a caller allowed every action on every entity).
    #[arg(long, env = "MESHQL_TOKEN")]
    token: Option<String>,
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
fn output(path: &Path) -> Result<Box<dyn Write + Send>, String> {
    if path == Path::new("-") {
        return Ok(Box::new(BufWriter::new(std::io::stdout())));
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
fn input(path: &Path) -> Result<Box<dyn BufRead + Send>, String> {
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
    let spec = ExportSpec {
        entities: args.entity.clone(),
        history: args.history,
        at: args
            .at
            .as_deref()
            .map(meshql_runtime::backup::parse_moment)
            .transpose()?,
    };
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", config.port));
    let base = base.trim_end_matches('/').to_owned();
    // the service on the config's port must be the one of this data directory; one named by
    // --url is taken at its word unless --data-dir says which data to expect
    let expect_dir = (args.url.is_none() || args.data_dir.is_some()).then_some(&config.data_dir);
    let rt = runtime()?;
    rt.block_on(async {
        if through_service(&base, expect_dir, &args, &spec).await? {
            return Ok(true);
        }
        if args.url.is_some() {
            return Err(format!("no meshql service answers at {base}"));
        }
        let opened = Opened::open(&config).await?;
        let result = export_stores(&opened.stores, &args, &spec).await;
        opened.close().await;
        result
    })
}

/// Exports through the service at `base` (`GET /_meshql/export`); `false` when nothing
/// answers there.
async fn through_service(
    base: &str,
    expect_dir: Option<&PathBuf>,
    args: &ExportArgs,
    spec: &ExportSpec,
) -> Result<bool, String> {
    let mut query: Vec<(&str, String)> = vec![("history", spec.history.to_string())];
    if let Some(at) = spec.at {
        query.push(("at", at.to_string()));
    }
    if !spec.entities.is_empty() {
        query.push(("entity", spec.entities.join(",")));
    }
    let mut request = reqwest::Client::new()
        .get(format!("{base}/_meshql/export"))
        .query(&query);
    if let Some(t) = &args.token {
        request = request.bearer_auth(t);
    }
    let mut reply = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Ok(false),
        Err(e) => return Err(format!("{base}: {e}")),
    };
    let status = reply.status();
    if !status.is_success() {
        let body: serde_json::Value = reply.json().await.unwrap_or_default();
        return Err(format!(
            "{base}: {status}: {}",
            body["error"].as_str().unwrap_or("the service refused")
        ));
    }
    let served = reply
        .headers()
        .get(DATA_DIR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(PathBuf::from);
    if let (Some(served), Some(wanted)) = (served, expect_dir) {
        if canonical(&served) != canonical(wanted) {
            if args.url.is_some() {
                return Err(format!(
                    "the service at {base} keeps its data in {}, not {}: pass the right \
                     --url, or stop it to export {} from its files",
                    served.display(),
                    wanted.display(),
                    wanted.display()
                ));
            }
            // another service on the config's port: this data directory's files, then
            eprintln!(
                "the service at {base} keeps its data in {}: exporting {} from its files",
                served.display(),
                wanted.display()
            );
            return Ok(false);
        }
    }
    eprintln!("exporting through the service at {base}");
    let mut out = output(&args.out)?;
    let werr = |e: std::io::Error| format!("{}: {e}", args.out.display());
    let mut progress = Progress::new();
    let (mut bytes, mut lines) = (0u64, 0u64);
    // the service ends the body abruptly when its export fails: an error here, never a
    // silently short file
    while let Some(chunk) = reply
        .chunk()
        .await
        .map_err(|e| format!("{base}: the export stopped: {e}"))?
    {
        out.write_all(&chunk).map_err(werr)?;
        bytes += chunk.len() as u64;
        lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        progress.tick("exported", lines.saturating_sub(1));
    }
    out.flush().map_err(werr)?;
    drop(out);
    let seconds = progress.done();
    let versions = lines.saturating_sub(1);
    eprintln!(
        "exported {versions} versions ({bytes} bytes) in {seconds:.2} s ({:.0}/s) to {}",
        versions as f64 / seconds.max(1e-3),
        args.out.display()
    );
    Ok(true)
}

/// The header naming the data directory of the service that answers an export.
pub const DATA_DIR_HEADER: &str = "x-meshql-data-dir";

/// `p` with its links resolved; a directory that does not exist yet (a backup directory) by
/// its parent's.
fn canonical(p: &Path) -> PathBuf {
    match p.canonicalize() {
        Ok(c) => c,
        Err(_) => match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => parent
                .canonicalize()
                .unwrap_or_else(|_| parent.to_owned())
                .join(name),
            _ => p.to_owned(),
        },
    }
}

/// Lines into the export's file, with a progress line on a terminal.
struct FileSink {
    out: Box<dyn Write + Send>,
    path: PathBuf,
    progress: Progress,
}

#[async_trait::async_trait]
impl Sink for FileSink {
    async fn page(&mut self, entity: &str, lines: &[u8], exported: u64) -> Result<(), String> {
        self.out
            .write_all(lines)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        self.progress.tick(entity, exported);
        Ok(())
    }
}

async fn export_stores(
    stores: &[(String, DynStore)],
    args: &ExportArgs,
    spec: &ExportSpec,
) -> Result<bool, String> {
    let chosen = meshql_runtime::export::chosen(stores, spec)?;
    let mut sink = FileSink {
        out: output(&args.out)?,
        path: args.out.clone(),
        progress: Progress::new(),
    };
    let werr = |e: std::io::Error| format!("{}: {e}", args.out.display());
    sink.out
        .write_all(&meshql_runtime::export::header(spec, &chosen))
        .map_err(werr)?;
    let counts = meshql_runtime::export::export(&chosen, spec, &mut sink).await?;
    sink.out.flush().map_err(werr)?;
    let seconds = sink.progress.done();
    drop(sink);
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
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

fn import(args: ImportArgs) -> Result<bool, String> {
    let config = load(&args.config, &args.data_dir)?;
    let mut reader = input(&args.file)?;
    let mut first = String::new();
    reader
        .read_line(&mut first)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    meshql_runtime::import::check_header(&first)
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", config.port));
    let base = base.trim_end_matches('/').to_owned();
    let expect = (args.url.is_none() || args.data_dir.is_some()).then_some(&config);
    let rt = runtime()?;
    rt.block_on(async {
        let mut progress = Progress::new();
        let report = match serves(&base, expect, args.token.as_deref(), args.url.is_some()).await? {
            true => {
                eprintln!("importing through the service at {base}");
                import_through(&base, args.token.as_deref(), first, reader).await?
            }
            false if args.url.is_some() => {
                return Err(format!("no meshql service answers at {base}"))
            }
            false => {
                let validators = meshql_runtime::import::Importer::validators(&config)?;
                let opened = Opened::open(&config).await?;
                let result = import_lines(&opened.stores, validators, reader, &mut progress).await;
                opened.close().await;
                result?
            }
        };
        Ok(print_report(&report, progress.done()))
    })
}

/// Whether the service at `base` is the one to back up, export from or import into: `false`
/// when nothing answers. A service that keeps another data directory than `expect`'s is an
/// error when `named` (by `--url`, or always for a backup), else `false` too (its files are
/// then the ones to use).
pub(crate) async fn serves(
    base: &str,
    expect: Option<&meshql_config::ResolvedConfig>,
    token: Option<&str>,
    named: bool,
) -> Result<bool, String> {
    let mut request = reqwest::Client::new().get(format!("{base}/_meshql/backups"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let reply = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Ok(false),
        Err(e) => return Err(format!("{base}: {e}")),
    };
    let status = reply.status();
    let body: serde_json::Value = reply.json().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!(
            "{base}: {status}: {}",
            body["error"].as_str().unwrap_or("the service refused")
        ));
    }
    // the backup directory it answers with is its data directory's (or configured beside it)
    let served = body["dir"].as_str().map(PathBuf::from);
    if let (Some(served), Some(config)) = (served, expect) {
        if canonical(&served) != canonical(&config.backup.dir) {
            let theirs = served.parent().unwrap_or(&served).display().to_string();
            let ours = config.data_dir.display();
            if named {
                return Err(format!(
                    "the service at {base} keeps its data in {theirs}, not {ours}: pass the \
                     right --url, or stop it to use {ours} from its files"
                ));
            }
            eprintln!("the service at {base} keeps its data in {theirs}: using {ours} directly");
            return Ok(false);
        }
    }
    Ok(true)
}

/// Sends the export (its header line, then the rest of `reader`, decompressed) to the
/// service's `POST /_meshql/import`, streamed; its report.
async fn import_through(
    base: &str,
    token: Option<&str>,
    first: String,
    mut reader: Box<dyn BufRead + Send>,
) -> Result<meshql_runtime::import::ImportReport, String> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    // the file is read on a thread of its own, a chunk ahead of the upload
    let reading = std::thread::spawn(move || {
        if tx.blocking_send(Ok(first.into_bytes())).is_err() {
            return;
        }
        loop {
            let mut chunk = vec![0u8; 1 << 16];
            match reader.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    chunk.truncate(n);
                    if tx.blocking_send(Ok(chunk)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut request = reqwest::Client::new()
        .post(format!("{base}/_meshql/import"))
        .header("content-type", "application/x-ndjson")
        .body(reqwest::Body::wrap_stream(stream));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let reply = request
        .send()
        .await
        .map_err(|e| format!("{base}: the import stopped: {e}"))?;
    let _ = reading.join();
    let status = reply.status();
    let body: serde_json::Value = reply
        .json()
        .await
        .map_err(|e| format!("{base}: {status}: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "{base}: {status}: {}",
            body["error"].as_str().unwrap_or("the service refused")
        ));
    }
    serde_json::from_value(body).map_err(|e| format!("{base}: an unreadable report: {e}"))
}

async fn import_lines(
    stores: &[(String, DynStore)],
    validators: HashMap<String, meshql_engine::PayloadValidator>,
    reader: Box<dyn BufRead + Send>,
    progress: &mut Progress,
) -> Result<meshql_runtime::import::ImportReport, String> {
    let mut importer =
        meshql_runtime::import::Importer::new(stores, std::sync::Arc::new(validators));
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        importer.line(n as u64 + 2, &line).await?;
        progress.tick("imported", importer.versions());
    }
    importer.finish().await
}

/// Prints what an import did; `false` when versions were refused.
fn print_report(report: &meshql_runtime::import::ImportReport, seconds: f64) -> bool {
    for (entity, t) in &report.entities {
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
    }
    let refused = report.refused();
    eprintln!(
        "imported {} of {} versions in {seconds:.2} s ({:.0}/s){}",
        report.written(),
        report.versions,
        report.versions as f64 / seconds.max(1e-3),
        if refused > 0 {
            format!("; {refused} refused (exit 3)")
        } else {
            String::new()
        }
    );
    refused == 0
}
