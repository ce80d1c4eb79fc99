//! A service's backups: one at a time, into `[backup] dir` (the oldest beyond `keep` then
//! deleted), uploaded to the bucket when one is configured, on demand and on the schedule;
//! counted in `/metrics`.

use super::s3::Bucket;
use super::{prune, take, BackupError, BackupSpec, Parts, Written};
use meshql_core::metrics::Collect;
use meshql_core::DynDatabase;
use meshql_log::Log;
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// A backup the service took, and what followed it.
#[derive(Debug, Clone)]
pub struct Taken {
    pub written: Written,
    /// Where it was uploaded (`s3://…`), when a bucket is configured and the upload worked.
    pub uploaded: Option<String>,
    /// Why the upload failed (the backup on disk is whole all the same).
    pub upload_error: Option<String>,
    /// Older backups deleted to keep `keep`.
    pub pruned: Vec<String>,
}

#[derive(Debug, Default)]
struct Stats {
    taken: u64,
    failed: u64,
    uploaded: u64,
    upload_failed: u64,
    last_success_ms: Option<i64>,
    last_seconds: f64,
    last_bytes: u64,
    last_pause_ms: f64,
}

/// The backups of one service.
pub struct Backups {
    spec: BackupSpec,
    databases: Vec<DynDatabase>,
    log: Option<Log>,
    running: Arc<tokio::sync::Mutex<()>>,
    stats: Mutex<Stats>,
}

impl Backups {
    pub fn new(spec: BackupSpec, databases: Vec<DynDatabase>, log: Option<Log>) -> Arc<Backups> {
        Arc::new(Backups {
            spec,
            databases,
            log,
            running: Arc::default(),
            stats: Mutex::default(),
        })
    }

    pub fn spec(&self) -> &BackupSpec {
        &self.spec
    }

    /// Takes a backup into `into`, or into the service's backup directory when `None` —
    /// then the oldest beyond `keep` are deleted and it is uploaded to the bucket. One at a
    /// time: another meanwhile gets [`BackupError::Busy`].
    pub async fn take(&self, into: Option<PathBuf>) -> Result<Taken, BackupError> {
        let _one = self
            .running
            .clone()
            .try_lock_owned()
            .map_err(|_| BackupError::Busy)?;
        let parts = Parts::of(self.spec.clone(), &self.databases, self.log.clone());
        let default_dir = into.is_none();
        let dir = into.unwrap_or_else(|| self.spec.dir.clone());
        let target = dir.clone();
        let written = tokio::task::spawn_blocking(move || take(parts, &target))
            .await
            .map_err(|e| BackupError::Io {
                path: dir.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                self.stats.lock().failed += 1;
                return Err(e);
            }
        };
        {
            let mut s = self.stats.lock();
            s.taken += 1;
            s.last_success_ms = Some(written.manifest.taken_at_ms);
            s.last_seconds = written.manifest.seconds;
            s.last_bytes = written.manifest.bytes();
            s.last_pause_ms = written.manifest.pause_ms;
        }
        let mut taken = Taken {
            written,
            uploaded: None,
            upload_error: None,
            pruned: Vec::new(),
        };
        if !default_dir {
            return Ok(taken);
        }
        let keep = self.spec.keep;
        let dir2 = dir.clone();
        taken.pruned = tokio::task::spawn_blocking(move || prune(&dir2, keep))
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
        if let Some(s3) = &self.spec.s3 {
            let uploaded = async {
                let bucket = Bucket::open(s3)?;
                let url = bucket
                    .upload(&taken.written.path, &taken.written.manifest)
                    .await?;
                let pruned = bucket.prune(keep).await?;
                Ok::<_, super::s3::S3Error>((url, pruned))
            }
            .await;
            match uploaded {
                Ok((url, pruned)) => {
                    self.stats.lock().uploaded += 1;
                    taken.uploaded = Some(url);
                    taken
                        .pruned
                        .extend(pruned.into_iter().map(|n| format!("s3: {n}")));
                }
                Err(e) => {
                    self.stats.lock().upload_failed += 1;
                    tracing::error!(error = %e, "the backup could not be uploaded");
                    taken.upload_error = Some(e.to_string());
                }
            }
        }
        Ok(taken)
    }

    /// Takes a backup at each moment of the schedule until `closing`; `None` without one.
    pub fn start_schedule(
        self: &Arc<Self>,
        mut closing: watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let text = self.spec.schedule.clone()?;
        let cron = meshql_config::schedule::parse(&text).ok()?;
        let backups = self.clone();
        Some(tokio::spawn(async move {
            loop {
                let now = meshql_core::time::now_millis();
                let Some(next) = meshql_config::schedule::next_after(&cron, now) else {
                    return;
                };
                let wait = std::time::Duration::from_millis((next - now).max(0) as u64);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = closing.wait_for(|c| *c) => return,
                }
                match backups.take(None).await {
                    Ok(t) => tracing::info!(
                        path = %t.written.path.display(),
                        bytes = t.written.manifest.bytes(),
                        uploaded = t.uploaded.as_deref().unwrap_or(""),
                        "scheduled backup taken"
                    ),
                    Err(e) => tracing::error!(error = %e, "scheduled backup failed"),
                }
            }
        }))
    }
}

impl Collect for Backups {
    fn collect(&self, out: &mut String) {
        let s = self.stats.lock();
        let _ = write!(
            out,
            "# HELP meshql_backups_total Backups taken by the service, by result.\n\
             # TYPE meshql_backups_total counter\n\
             meshql_backups_total{{result=\"ok\"}} {}\n\
             meshql_backups_total{{result=\"failed\"}} {}\n\
             # HELP meshql_backup_uploads_total Backups uploaded to the bucket, by result.\n\
             # TYPE meshql_backup_uploads_total counter\n\
             meshql_backup_uploads_total{{result=\"ok\"}} {}\n\
             meshql_backup_uploads_total{{result=\"failed\"}} {}\n",
            s.taken, s.failed, s.uploaded, s.upload_failed
        );
        if let Some(ms) = s.last_success_ms {
            let _ = write!(
                out,
                "# HELP meshql_backup_last_success_seconds When the last backup was taken (Unix time).\n\
                 # TYPE meshql_backup_last_success_seconds gauge\n\
                 meshql_backup_last_success_seconds {:.3}\n\
                 # HELP meshql_backup_last_bytes Size of the last backup.\n\
                 # TYPE meshql_backup_last_bytes gauge\n\
                 meshql_backup_last_bytes {}\n\
                 # HELP meshql_backup_last_duration_seconds How long the last backup took.\n\
                 # TYPE meshql_backup_last_duration_seconds gauge\n\
                 meshql_backup_last_duration_seconds {:.3}\n\
                 # HELP meshql_backup_last_pause_seconds How long the last backup held writes back.\n\
                 # TYPE meshql_backup_last_pause_seconds gauge\n\
                 meshql_backup_last_pause_seconds {:.6}\n",
                ms as f64 / 1000.0,
                s.last_bytes,
                s.last_seconds,
                s.last_pause_ms / 1000.0
            );
        }
    }
}
