//! The change log a service's feed is copied into, opened as the config says.

use crate::error::BuildError;
use meshql_config::model::FsyncConfig;
use meshql_config::ChangesSpec;
use meshql_log::{FsyncPolicy, Log, LogOptions, Retention};
use std::time::Duration;

/// Opens the change log as the config says.
pub(crate) fn open_log(spec: &ChangesSpec) -> Result<Log, BuildError> {
    let c = &spec.config;
    let options = LogOptions {
        segment_bytes: c.segment_bytes.max(1 << 20),
        fsync: match c.fsync {
            FsyncConfig::Always => FsyncPolicy::Always,
            FsyncConfig::Interval => {
                FsyncPolicy::Interval(Duration::from_millis(c.fsync_interval_ms.max(1)))
            }
            FsyncConfig::Never => FsyncPolicy::Never,
        },
        retention: Retention {
            max_bytes: (c.retention_bytes > 0).then_some(c.retention_bytes),
            max_age: (c.retention_hours > 0).then(|| Duration::from_secs(c.retention_hours * 3600)),
        },
    };
    Log::open(&spec.dir, options).map_err(|e| BuildError::Changes {
        dir: spec.dir.display().to_string(),
        message: match e.kind() {
            meshql_log::ErrorKind::Locked => format!(
                "{e}: another meshql process serves this data directory (give each its own \
                 data_dir, or set [changes] enabled = false)"
            ),
            _ => e.to_string(),
        },
    })
}
