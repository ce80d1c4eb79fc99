//! Backups in an S3-compatible bucket (`[backup.s3]`): each one under `prefix/<name>/`, the
//! same files as on disk, `manifest.json` uploaded last — a backup whose manifest is there is
//! whole. Large files go up in multipart uploads. Credentials come from the standard
//! `AWS_*` variables; `endpoint` points at a server other than AWS (path-style requests).

use super::{Manifest, MANIFEST};
use futures::TryStreamExt;
use meshql_config::model::S3Config;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Why a bucket operation failed.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("`{0}` is not an S3 URL (s3://bucket or s3://bucket/prefix)")]
    Url(String),
    #[error("S3 {what}: {source}")]
    Store {
        what: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Manifest(String),
}

fn store_error(what: impl Into<String>) -> impl FnOnce(object_store::Error) -> S3Error {
    let what = what.into();
    move |source| S3Error::Store { what, source }
}

/// A bucket and the prefix backups go under.
pub struct Bucket {
    store: Arc<AmazonS3>,
    bucket: String,
    prefix: String,
}

impl Bucket {
    /// The bucket `config.url` names, with credentials from the environment.
    pub fn open(config: &S3Config) -> Result<Bucket, S3Error> {
        Self::at(config, &config.url)
    }

    /// The bucket and prefix of `url` (`s3://bucket/prefix`), reached as `config` says.
    pub fn at(config: &S3Config, url: &str) -> Result<Bucket, S3Error> {
        let (bucket, prefix) =
            meshql_config::schedule::s3_bucket(url).ok_or_else(|| S3Error::Url(url.to_owned()))?;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_region(&config.region);
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(store_error("client"))?;
        Ok(Bucket {
            store: Arc::new(store),
            bucket,
            prefix,
        })
    }

    fn key(&self, rest: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rest)
        } else {
            ObjectPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    /// `s3://bucket/prefix/<name>`.
    pub fn url_of(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }

    /// Uploads the backup directory `dir` (files of its manifest, then the manifest).
    pub async fn upload(&self, dir: &Path, manifest: &Manifest) -> Result<String, S3Error> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for f in &manifest.files {
            let path = dir.join(&f.path);
            let key = self.key(&format!("{name}/{}", f.path));
            let mut file = tokio::fs::File::open(&path)
                .await
                .map_err(|source| S3Error::Io {
                    path: path.clone(),
                    source,
                })?;
            let mut writer = object_store::buffered::BufWriter::new(self.store.clone(), key);
            let io = |source| S3Error::Io {
                path: path.clone(),
                source,
            };
            tokio::io::copy(&mut file, &mut writer).await.map_err(io)?;
            writer.shutdown().await.map_err(|source| S3Error::Io {
                path: path.clone(),
                source,
            })?;
        }
        let text = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
        self.store
            .put(
                &self.key(&format!("{name}/{MANIFEST}")),
                PutPayload::from(text),
            )
            .await
            .map_err(store_error(format!("upload of {name}/{MANIFEST}")))?;
        Ok(self.url_of(&name))
    }

    /// The names of the whole backups under the prefix (those with a manifest), newest first.
    pub async fn list(&self) -> Result<Vec<String>, S3Error> {
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let listed = self
            .store
            .list_with_delimiter(prefix.as_ref())
            .await
            .map_err(store_error("list"))?;
        let mut names = Vec::new();
        for p in listed.common_prefixes {
            let Some(name) = p.filename().map(str::to_owned) else {
                continue;
            };
            if self
                .store
                .head(&self.key(&format!("{name}/{MANIFEST}")))
                .await
                .is_ok()
            {
                names.push(name);
            }
        }
        names.sort();
        names.reverse();
        Ok(names)
    }

    /// Deletes the backups beyond the newest `keep` (0 keeps all), manifest first.
    pub async fn prune(&self, keep: u32) -> Result<Vec<String>, S3Error> {
        if keep == 0 {
            return Ok(Vec::new());
        }
        let mut deleted = Vec::new();
        for name in self.list().await?.into_iter().skip(keep as usize) {
            self.delete(&name).await?;
            deleted.push(name);
        }
        Ok(deleted)
    }

    async fn delete(&self, name: &str) -> Result<(), S3Error> {
        let manifest = self.key(&format!("{name}/{MANIFEST}"));
        self.store
            .delete(&manifest)
            .await
            .map_err(store_error(format!("delete of {name}")))?;
        let objects: Vec<_> = self
            .store
            .list(Some(&self.key(name)))
            .try_collect()
            .await
            .map_err(store_error(format!("list of {name}")))?;
        for o in objects {
            self.store
                .delete(&o.location)
                .await
                .map_err(store_error(format!("delete of {}", o.location)))?;
        }
        Ok(())
    }

    /// Downloads the backup at the prefix itself (`s3://bucket/…/<name>`) into the new
    /// directory `dest`: the manifest, then every file it lists.
    pub async fn download(&self, dest: &Path) -> Result<Manifest, S3Error> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| S3Error::Io { path, source }
        };
        let text = self
            .store
            .get(&self.key(MANIFEST))
            .await
            .map_err(store_error(format!(
                "s3://{}/{}: no manifest (not a whole backup)",
                self.bucket, self.prefix
            )))?
            .bytes()
            .await
            .map_err(store_error("download of the manifest"))?;
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| S3Error::Manifest(format!("the manifest is not one: {e}")))?;
        tokio::fs::create_dir_all(dest).await.map_err(io(dest))?;
        for f in &manifest.files {
            let path = dest.join(&f.path);
            if let Some(dir) = path.parent() {
                tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
            }
            let mut stream = self
                .store
                .get(&self.key(&f.path))
                .await
                .map_err(store_error(format!("download of {}", f.path)))?
                .into_stream();
            let mut out = tokio::fs::File::create(&path).await.map_err(io(&path))?;
            while let Some(chunk) = stream
                .try_next()
                .await
                .map_err(store_error(format!("download of {}", f.path)))?
            {
                out.write_all(&chunk).await.map_err(io(&path))?;
            }
            out.sync_all().await.map_err(io(&path))?;
        }
        tokio::fs::write(dest.join(MANIFEST), &text)
            .await
            .map_err(io(dest))?;
        Ok(manifest)
    }
}
