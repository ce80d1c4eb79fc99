//! `meshql backup` and `meshql restore`.
//!
//! `backup` asks the running service (found by the config's port, or `--url`) for an
//! online backup (`POST /_meshql/backup`) and moves it to `--to`; when no service answers it
//! opens the data directory itself (its files are then free: a serving meshql holds them
//! locked) and takes the same backup. `restore` checks a backup (manifest, checksums, the
//! config's entities) and writes its files into a new data directory, cut back to `--at`
//! when given (see [`cut_to`]).

use clap::Args;
use meshql_runtime::backup::{self, Manifest, Written, MANIFEST};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct BackupArgs {
    /// Config file or directory of the service.
    #[arg(default_value = ".")]
    config: PathBuf,
    /// Directory to put the backup in (a new `meshql-<time>` directory inside it). Default:
    /// the service's `<data_dir>/backups`.
    #[arg(long)]
    to: Option<PathBuf>,
    /// The service's data directory, when it is not the config's.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The running service's base URL (instead of the config's port on 127.0.0.1).
    #[arg(long)]
    url: Option<String>,
    /// A bearer token of a caller allowed every action on every entity.
    #[arg(long, env = "MESHQL_TOKEN")]
    token: Option<String>,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The backup: a `meshql-<time>` directory holding `manifest.json`, or its URL in a
    /// bucket (`s3://bucket/prefix/meshql-<time>`, reached as `[backup.s3]` says).
    backup: PathBuf,
    /// A new data directory to restore into (must not exist, or be empty).
    #[arg(long)]
    data_dir: PathBuf,
    /// Restore the data as of this moment (RFC 3339, or milliseconds since the epoch)
    /// instead of the backup's: every document's version of that moment.
    #[arg(long)]
    at: Option<String>,
    /// Config file or directory of the service the backup is restored for: its entities
    /// and their storage must be the backup's.
    #[arg(long, default_value = ".")]
    config: PathBuf,
}

pub fn run_backup(args: BackupArgs) -> ExitCode {
    match backup(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql backup: {message}");
            ExitCode::FAILURE
        }
    }
}

pub fn run_restore(args: RestoreArgs) -> ExitCode {
    match restore(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("meshql restore: {message}");
            ExitCode::FAILURE
        }
    }
}

fn backup(args: BackupArgs) -> Result<(), String> {
    let mut config = meshql_config::load(&args.config).map_err(|e| e.to_string())?;
    if let Some(d) = &args.data_dir {
        config.set_data_dir(d.clone());
    }
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", config.port));
    let base = base.trim_end_matches('/').to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // the service on the config's port must be the one of this data directory; one named by
    // --url is taken at its word unless --data-dir says which data to expect
    let expect_dir = (args.url.is_none() || args.data_dir.is_some()).then_some(&config);
    let written = match runtime.block_on(ask_server(&base, expect_dir, args.token.as_deref()))? {
        Some(path) => {
            eprintln!("the service at {base} took the backup");
            let manifest = read_manifest(&path)?;
            let path = match &args.to {
                Some(to) => move_into(&path, to)?,
                None => path,
            };
            Written { path, manifest }
        }
        None => {
            if args.url.is_some() {
                return Err(format!("no meshql service answers at {base}"));
            }
            eprintln!(
                "no service answers at {base}: backing up {} from its files",
                config.data_dir.display()
            );
            runtime.block_on(offline(&config, args.to.clone()))?
        }
    };
    print_written(&written, &config.file);
    Ok(())
}

/// Asks the service at `base` for a backup: its path, or `None` when nothing answers there.
async fn ask_server(
    base: &str,
    config: Option<&meshql_config::ResolvedConfig>,
    token: Option<&str>,
) -> Result<Option<PathBuf>, String> {
    if !crate::transfer::serves(base, config, token, true).await? {
        return Ok(None);
    }
    let http = reqwest::Client::new();
    let with_token = |r: reqwest::RequestBuilder| match token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let reply = with_token(http.post(format!("{base}/_meshql/backup")))
        .send()
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    let status = reply.status();
    let body: serde_json::Value = reply.json().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!(
            "{status}: {}",
            body["error"].as_str().unwrap_or("the service refused")
        ));
    }
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    report_upload(
        &body["uploaded"].as_str().map(str::to_owned),
        &body["upload_error"].as_str().map(str::to_owned),
        &strings(&body["pruned"]),
    );
    body["path"]
        .as_str()
        .map(|p| Some(PathBuf::from(p)))
        .ok_or_else(|| "the service's answer names no backup".to_owned())
}

/// Says where a backup was uploaded (or why not) and which old ones were deleted.
fn report_upload(uploaded: &Option<String>, error: &Option<String>, pruned: &[String]) {
    if let Some(url) = uploaded {
        eprintln!("uploaded to {url}");
    }
    if let Some(e) = error {
        eprintln!("warning: not uploaded: {e} (the backup on disk is whole)");
    }
    for p in pruned {
        eprintln!("deleted an old backup (keep): {p}");
    }
}

/// Opens the data directory's databases and change log (no service holds them) and backs
/// them up as the service would: into `into`, or into `[backup] dir` (keeping `keep`,
/// uploading to the bucket).
async fn offline(
    config: &meshql_config::ResolvedConfig,
    into: Option<PathBuf>,
) -> Result<Written, String> {
    let registries = crate::registries::registries();
    let targets = meshql_runtime::storage_targets(config, &registries.storage).map_err(|e| {
        e.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let mut databases: Vec<meshql_core::DynDatabase> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for target in targets.values() {
        if !seen.insert(target.target()) {
            continue;
        }
        databases.push(target.open().await.map_err(|e| e.to_string())?);
    }
    let log = if config.changes.config.enabled && config.changes.dir.exists() {
        Some(
            meshql_log::Log::open(&config.changes.dir, meshql_log::LogOptions::default()).map_err(
                |e| match e.kind() {
                    meshql_log::ErrorKind::Locked => format!(
                        "{e}: a meshql service runs on this data directory but not on the \
                         config's port: pass its --url"
                    ),
                    _ => e.to_string(),
                },
            )?,
        )
    } else {
        None
    };
    let backups = backup::Backups::new(backup::BackupSpec::of(config), databases.clone(), log);
    let result = backups.take(into).await;
    for db in &databases {
        db.close().await;
    }
    let taken = result.map_err(|e| e.to_string())?;
    report_upload(&taken.uploaded, &taken.upload_error, &taken.pruned);
    Ok(taken.written)
}

/// Moves a backup directory into `to` (renamed when on the same file system, else copied).
fn move_into(path: &Path, to: &Path) -> Result<PathBuf, String> {
    fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a backup directory", path.display()))?;
    let dest = to.join(name);
    if fs::rename(path, &dest).is_ok() {
        return Ok(dest);
    }
    let partial = to.join(format!(
        ".partial-{}-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    copy_tree(path, &partial).map_err(|e| format!("copying into {}: {e}", to.display()))?;
    fs::rename(&partial, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let _ = fs::remove_dir_all(path);
    Ok(dest)
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &target)?;
        } else {
            fs::copy(e.path(), &target)?;
            fs::File::open(&target)?.sync_all()?;
        }
    }
    Ok(())
}

fn print_written(w: &Written, config_file: &Path) {
    // a reader that stops early (`| head`) is not an error of the backup
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let m = &w.manifest;
    let _ = writeln!(out, "backup {}", w.path.display());
    let _ = writeln!(
        out,
        "  taken at {} ({} ms since the epoch); writes paused {:.1} ms; {:.2} s in all",
        m.taken_at, m.taken_at_ms, m.pause_ms, m.seconds
    );
    for f in m.files.iter().filter(|f| f.kind == "sqlite") {
        let _ = writeln!(out, "  {:<28} {:>12} bytes", f.path, f.bytes);
    }
    if let Some(log) = &m.log {
        let bytes: u64 = m
            .files
            .iter()
            .filter(|f| f.kind == "log")
            .map(|f| f.bytes)
            .sum();
        let _ = writeln!(
            out,
            "  {:<28} {:>12} bytes (positions {}..={})",
            "changes/", bytes, log.first_offset, log.last_offset
        );
    }
    for note in &m.not_included {
        let _ = writeln!(out, "  not included: {note}");
    }
    let _ = writeln!(
        out,
        "restore: meshql restore {} --config {} --data-dir NEW_DATA_DIR [--at TIME]",
        w.path.display(),
        config_file.display()
    );
}

fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    let text = fs::read(&path).map_err(|e| {
        if dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".partial-"))
        {
            format!(
                "{} is a backup that never finished (killed midway): it cannot be restored",
                dir.display()
            )
        } else {
            format!(
                "{} is not a complete backup: {}: {e}",
                dir.display(),
                path.display()
            )
        }
    })?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| format!("{}: not a meshql backup manifest: {e}", path.display()))?;
    if manifest.format != backup::FORMAT {
        return Err(format!(
            "{}: backup format {} (this meshql reads format {})",
            path.display(),
            manifest.format,
            backup::FORMAT
        ));
    }
    Ok(manifest)
}

pub use meshql_runtime::backup::parse_moment;

fn restore(mut args: RestoreArgs) -> Result<(), String> {
    let config = meshql_config::load(&args.config).map_err(|e| e.to_string())?;
    // a backup in a bucket is downloaded first, beside the new data directory
    let _download = match args.backup.to_str().filter(|s| s.starts_with("s3://")) {
        Some(url) => {
            let dir = download(url, &config, &args.data_dir)?;
            args.backup = dir.path().to_owned();
            Some(dir)
        }
        None => None,
    };
    let manifest = read_manifest(&args.backup)?;
    let expected = backup::layout_of(&config);
    if expected != manifest.layout {
        return Err(format!(
            "{} is a backup of another service: {}",
            args.backup.display(),
            layout_difference(&manifest.layout, &expected, &config.file)
        ));
    }
    let at = args.at.as_deref().map(parse_moment).transpose()?;
    if let Some(at) = at {
        if at > manifest.taken_at_ms {
            return Err(format!(
                "the backup was taken at {} ({}): it cannot restore a later moment ({}); take \
                 or pick a later backup",
                manifest.taken_at,
                manifest.taken_at_ms,
                backup::rfc3339(at)
            ));
        }
    }
    let new = &args.data_dir;
    if new.exists()
        && fs::read_dir(new)
            .map_err(|e| format!("{}: {e}", new.display()))?
            .next()
            .is_some()
    {
        return Err(format!(
            "{} is not empty: restore into a new data directory (a restore never writes over \
             data)",
            new.display()
        ));
    }
    // checksums first: a damaged backup writes nothing
    for f in &manifest.files {
        let path = args.backup.join(&f.path);
        let (bytes, sha256) =
            backup::sha256_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if bytes != f.bytes || sha256 != f.sha256 {
            return Err(format!(
                "{}: its checksum is not the manifest's: the backup is damaged",
                path.display()
            ));
        }
    }
    let parent = new
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let staging = parent.join(format!(
        ".restoring-{}-{}",
        new.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let result = (|| -> Result<Vec<String>, String> {
        for f in &manifest.files {
            let from = args.backup.join(&f.path);
            let to = staging.join(&f.path);
            if let Some(dir) = to.parent() {
                fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            fs::copy(&from, &to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
        match at {
            Some(at) => {
                let mut report = cut_to(&staging, &manifest, at)?;
                report.extend(rewind_migrations(&config, &staging, at)?);
                Ok(report)
            }
            None => Ok(Vec::new()),
        }
    })();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    if new.exists() {
        fs::remove_dir(new).map_err(|e| format!("{}: {e}", new.display()))?;
    }
    fs::rename(&staging, new).map_err(|e| format!("{}: {e}", new.display()))?;
    match at {
        Some(at) => println!(
            "restored {} into {} as of {} ({at})",
            args.backup.display(),
            new.display(),
            backup::rfc3339(at)
        ),
        None => println!(
            "restored {} into {} as of {} (the backup's moment)",
            args.backup.display(),
            new.display(),
            manifest.taken_at
        ),
    }
    for line in report {
        println!("  {line}");
    }
    println!(
        "serve it: meshql serve {} --data-dir {}",
        config.file.display(),
        new.display()
    );
    Ok(())
}

/// Downloads the backup at `url` into a temporary directory beside `data_dir`, reaching the
/// bucket as the config's `[backup.s3]` says (AWS itself without one).
fn download(
    url: &str,
    config: &meshql_config::ResolvedConfig,
    data_dir: &Path,
) -> Result<tempfile::TempDir, String> {
    let settings = config
        .backup
        .s3
        .clone()
        .unwrap_or_else(|| meshql_config::model::S3Config {
            url: url.to_owned(),
            endpoint: None,
            region: "us-east-1".to_owned(),
        });
    let parent = data_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let dir = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let dest = dir.path().to_owned();
    runtime
        .block_on(async {
            let bucket = backup::s3::Bucket::at(&settings, url)?;
            bucket.download(&dest).await
        })
        .map_err(|e| format!("{url}: {e}"))?;
    eprintln!("downloaded {url}");
    Ok(dir)
}

/// What differs between a backup's entities and a config's, in one line.
fn layout_difference(
    backup: &[backup::LayoutEntry],
    config: &[backup::LayoutEntry],
    file: &Path,
) -> String {
    for b in backup {
        match config.iter().find(|c| c.entity == b.entity) {
            None => {
                return format!(
                    "it holds entity \"{}\", which {} does not declare",
                    b.entity,
                    file.display()
                )
            }
            Some(c) if c != b => {
                return format!(
                "entity \"{}\" is stored in {} ({}, table {}) there and in {} ({}, table {}) in {}",
                b.entity,
                b.storage,
                b.backend,
                b.table,
                c.storage,
                c.backend,
                c.table,
                file.display()
            )
            }
            _ => {}
        }
    }
    match config
        .iter()
        .find(|c| !backup.iter().any(|b| b.entity == c.entity))
    {
        Some(c) => format!(
            "{} declares entity \"{}\", which the backup does not hold",
            file.display(),
            c.entity
        ),
        None => "its entities are in another order".to_owned(),
    }
}

/// Cuts a restored data directory back to the moment `at` (ms): each SQLite file keeps the
/// versions created at or before it (every document reads as an `at` read of that moment
/// did), and the change log keeps the records appended at or before it whose versions the
/// files still hold. The log gets a new identity: processors, whose state cannot be wound
/// back, see that their position belongs to another log and rebuild from this one; the hub
/// copies into it the versions of the moment the log did not hold yet.
fn cut_to(dir: &Path, manifest: &Manifest, at: i64) -> Result<Vec<String>, String> {
    let mut report = Vec::new();
    let (mut kept, mut tables) = (0u64, 0usize);
    for f in manifest.files.iter().filter(|f| f.kind == "sqlite") {
        let path = dir.join(&f.path);
        let cut = meshql_store_sqlite::cut_at(&path, at)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for t in cut {
            kept += t.kept;
            tables += 1;
            if t.removed > 0 {
                report.push(format!(
                    "{}: {} versions after the moment removed",
                    t.table, t.removed
                ));
            }
        }
    }
    report.insert(0, format!("{kept} versions kept in {tables} tables"));
    if manifest.log.is_some() {
        let log_dir = dir.join(backup::LOG_DIR);
        let last = last_record_at(&log_dir, at)?;
        meshql_log::truncate_after(&log_dir, last).map_err(|e| e.to_string())?;
        let _ = fs::remove_file(log_dir.join("hub.json"));
        fs::write(
            log_dir.join("log.id"),
            format!("{}\n", uuid::Uuid::new_v4()),
        )
        .map_err(|e| format!("{}: {e}", log_dir.display()))?;
        report.push(format!(
            "change log: positions up to {last} kept; processors rebuild from it when served"
        ));
    }
    Ok(report)
}

/// The records of declared migrations in the restored SQLite files, put back as they stood
/// at `at` (a migration run after it is pending again; one running then resumes when served).
fn rewind_migrations(
    config: &meshql_config::ResolvedConfig,
    dir: &Path,
    at: i64,
) -> Result<Vec<String>, String> {
    let mut restored = config.clone();
    restored.set_data_dir(dir.to_owned());
    // only what the backup holds: the embedded files, never a server's database
    let embedded = |e: &meshql_config::ResolvedEntity| {
        config
            .storages
            .get(&e.storage)
            .is_some_and(|s| s.kind == "sqlite")
    };
    restored.entities.retain(embedded);
    if restored.entities.is_empty() {
        return Ok(Vec::new());
    }
    crate::transfer::runtime()?.block_on(async {
        let opened = crate::transfer::Opened::open(&restored).await?;
        let mut said = Vec::new();
        let mut result = Ok(());
        for e in &restored.entities {
            match meshql_process::migration::rewind(&e.name, opened.store(&e.name), at).await {
                Ok(lines) => said.extend(lines),
                Err(err) => {
                    result = Err(err.to_string());
                    break;
                }
            }
        }
        opened.close().await;
        result.map(|()| said)
    })
}

/// The last offset of the log in `dir` such that it and every record before it were
/// appended at or before `at` and carry versions created at or before it.
fn last_record_at(dir: &Path, at: i64) -> Result<u64, String> {
    #[derive(serde::Deserialize)]
    struct Created {
        created_at: i64,
    }
    let log =
        meshql_log::Log::open(dir, meshql_log::LogOptions::default()).map_err(|e| e.to_string())?;
    let mut last = log.first_offset().saturating_sub(1);
    let mut after = last;
    loop {
        let records = log.read(after, 4096, 16 << 20).map_err(|e| e.to_string())?;
        if records.is_empty() {
            return Ok(last);
        }
        for r in &records {
            let created = serde_json::from_slice::<Created>(&r.data)
                .map(|c| c.created_at)
                .unwrap_or(i64::MAX);
            if r.timestamp_ms > at || created > at {
                return Ok(last);
            }
            last = r.offset;
        }
        after = last;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_moment;

    #[test]
    fn moments_are_rfc3339_or_milliseconds_and_anything_else_is_named() {
        assert_eq!(parse_moment("1796679680505"), Ok(1_796_679_680_505));
        assert_eq!(
            parse_moment("2026-12-07T10:15:00.250Z"),
            Ok(1_796_638_500_250)
        );
        assert_eq!(
            parse_moment("2026-12-07T11:15:00+01:00"),
            parse_moment("2026-12-07T10:15:00Z")
        );
        let err = parse_moment("yesterday").unwrap_err();
        assert!(err.contains("\"yesterday\" is not a moment"), "{err}");
        assert!(err.contains("RFC 3339"), "{err}");
    }
}
