//! The config model, as written in `meshql.toml`. Doc comments here become the config's
//! JSON Schema (`meshql config-schema`).

use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;

use toml::Spanned;

/// A meshql service: storage and the entities it serves on one HTTP port.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// TCP port of the single HTTP listener (REST, GraphQL, health).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Address to bind.
    #[serde(default = "default_host")]
    pub host: String,
    /// Directory for embedded storage files, relative to the config file; created if missing.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// Value of `Access-Control-Allow-Origin` on every response.
    #[serde(default = "default_cors")]
    pub cors_origin: String,
    /// Largest accepted request body, in bytes (larger bodies get 413).
    #[serde(default = "default_body_limit")]
    pub body_limit_bytes: usize,
    /// Request bodies must declare a JSON media type (`application/json` or
    /// `application/*+json`); others get 415, so that a cross-site form or `text/plain`
    /// request (sent by browsers without a CORS preflight) cannot write. `false` accepts any
    /// Content-Type, for clients that send none.
    #[serde(default = "default_true")]
    pub require_json_content_type: bool,
    /// What REST creates (`POST P`) and updates (`PUT P/{id}`) answer: `created` (201 for a
    /// create, 200 for an update, the stored document as the body, `Location: P/<id>`), or
    /// `see_other` (303 with `Location: P/<id>` and an empty body, as MeshQL's TypeScript
    /// services answer; their client suites take the new id from the `Location`). Clients
    /// that follow redirects then GET the document.
    #[serde(default)]
    pub write_response: WriteResponse,
    /// The HTTP listener's connection limits: timeouts for headers, idle keep-alive
    /// connections and request bodies, the number of connections served at once, the listen
    /// backlog, and how long a shutdown waits for requests in progress.
    #[serde(default)]
    pub server: ServerConfig,
    /// How callers are identified.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Client settings for HTTP resolvers (federation to other services).
    #[serde(default)]
    pub http_client: HttpClientConfig,
    /// What one GraphQL request may cost: its shape (checked when it is planned) and its
    /// result (checked while it runs). A request over a limit gets a GraphQL error with
    /// `extensions.code` and nothing more.
    #[serde(default)]
    pub graphql: GraphqlLimits,
    /// The change feed: every committed write, copied into an embedded log under
    /// `data_dir` and served at `/_changes`.
    #[serde(default)]
    pub changes: ChangesConfig,
    /// The console: a web page (served from the binary) to browse the entities, their
    /// documents' history through time and the live change feed.
    #[serde(default)]
    pub console: ConsoleConfig,
    /// `[backup]`: where online backups go (`meshql backup`, `POST /_meshql/backup`), how
    /// many are kept, a schedule, and an S3-compatible bucket each is uploaded to.
    #[serde(default)]
    pub backup: BackupConfig,
    /// `[cache]`: a read cache in front of every entity's storage (none when the block is
    /// absent). It is never stale: each answer is tagged with what it depends on, and every
    /// write invalidates its tags before it is acknowledged (writes by other processes: when
    /// the change feed or the shared cache brings them).
    #[serde(default)]
    #[schemars(with = "Option<CacheConfig>")]
    pub cache: Option<Spanned<CacheConfig>>,
    /// Named storage backends; entities refer to them by name. An entity without `storage`
    /// uses `default`, which is SQLite `meshql.db` unless declared.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, StorageConfig>")]
    pub storage: BTreeMap<String, Spanned<StorageConfig>>,
    /// The entities served.
    #[serde(default, rename = "entity")]
    pub entities: Vec<EntityConfig>,
    /// Processors (`[[processor]]`): consumers of the change feed that write entities, such
    /// as projections (materialised read models) computed from events. `type` selects the
    /// kind; its other fields are the kind's (see `meshql_process`).
    #[serde(default, rename = "processor")]
    #[schemars(with = "Vec<ProcessorConfig>")]
    pub processors: Vec<Spanned<ProcessorConfig>>,
}

/// What REST creates and updates answer (see [`ServiceConfig::write_response`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WriteResponse {
    /// 201 (create) or 200 (update), the stored document, `Location: P/<id>`.
    #[default]
    Created,
    /// 303 See Other, `Location: P/<id>`, no body.
    SeeOther,
}

fn default_port() -> u16 {
    3033
}
fn default_host() -> String {
    "0.0.0.0".into()
}
fn default_data_dir() -> String {
    "data".into()
}
fn default_cors() -> String {
    "*".into()
}
fn default_body_limit() -> usize {
    1024 * 1024
}

/// `[server]`: connection limits of the HTTP listener. Every setting is optional.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// A request's line and headers must have arrived this many milliseconds after its first
    /// byte, or the connection is closed (default 10000).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub header_read_timeout_ms: Option<Spanned<u64>>,
    /// A keep-alive connection with no request in progress and no byte of the next one is
    /// closed after this many milliseconds (default 60000).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub keep_alive_timeout_ms: Option<Spanned<u64>>,
    /// A request body must have arrived this many milliseconds after the server starts
    /// waiting for it; otherwise the answer is 408 and the connection is closed
    /// (default 30000).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub body_read_timeout_ms: Option<Spanned<u64>>,
    /// A response the client stops reading: once a write has made no progress for this many
    /// milliseconds the connection is closed (default 60000).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub write_timeout_ms: Option<Spanned<u64>>,
    /// Connections served at once; further ones wait in the listen backlog until one closes
    /// (default: 10000, or the open-file limit less 256 when that is lower).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_connections: Option<Spanned<u64>>,
    /// GraphQL subscriptions open at once on this server, over graphql-transport-ws and
    /// graphql-sse together (1 to 1000000, default 10000); one more is refused: a 503 on an
    /// event stream, an `error` message on a WebSocket.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_subscriptions: Option<Spanned<u64>>,
    /// Length of the listen queue of connections not yet accepted (default 4096; Linux caps
    /// it at `net.core.somaxconn`).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub listen_backlog: Option<Spanned<u64>>,
    /// On SIGTERM or SIGINT, requests in progress get this many milliseconds to finish
    /// before their connections are cut (default 10000; 0 cuts them at once).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub shutdown_timeout_ms: Option<Spanned<u64>>,
    /// Read-your-writes: a read that carries the consistency token of a write (the
    /// `x-meshql-consistency` header a write answers with) waits at most this many
    /// milliseconds for the entity's replica to have it, then reads the primary (default 200;
    /// 0 goes to the primary at once).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub read_your_writes_wait_ms: Option<Spanned<u64>>,
    /// `[server.tls]`: serve HTTPS instead of HTTP.
    #[serde(default)]
    #[schemars(with = "Option<TlsConfig>")]
    pub tls: Option<Spanned<TlsConfig>>,
    /// `[server.rate_limit]`: token buckets per caller (the JWT subject of a valid token,
    /// else the client's address) and per class of request. No limit when absent.
    #[serde(default)]
    #[schemars(with = "Option<RateLimitConfig>")]
    pub rate_limit: Option<Spanned<RateLimitConfig>>,
    /// `[server.persisted_queries]`: GraphQL persisted queries: `apq` (the default: Apollo's
    /// Automatic Persisted Queries), `allowlist` (only the operations of a manifest run) or
    /// `off`.
    #[serde(default)]
    #[schemars(with = "Option<PersistedQueriesConfig>")]
    pub persisted_queries: Option<Spanned<PersistedQueriesConfig>>,
}

/// `[server.rate_limit]`: a token bucket per caller and per class; a class left out is not
/// limited. A request over its class's limit is answered 429 with `Retry-After`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// REST reads (GET), and GraphQL requests when `graphql` is not set (1 each).
    #[serde(default)]
    #[schemars(with = "Option<BucketConfig>")]
    pub reads: Option<Spanned<BucketConfig>>,
    /// REST writes: POST, PUT, DELETE (a bulk create is one write, whatever its length).
    #[serde(default)]
    #[schemars(with = "Option<BucketConfig>")]
    pub writes: Option<Spanned<BucketConfig>>,
    /// GraphQL requests, each charged its cost: its root fields plus its relationship
    /// fields (the fetches it plans), at least 1.
    #[serde(default)]
    #[schemars(with = "Option<BucketConfig>")]
    pub graphql: Option<Spanned<BucketConfig>>,
    /// Callers remembered at once per class (1 to 10000000, default 100000). Beyond it the
    /// least recently used caller's bucket is dropped (it starts full when that caller comes
    /// back); an idle caller's is dropped once it would have refilled anyway. With `redis`,
    /// this bounds the buckets of this process's fallback only.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_callers: Option<Spanned<u64>>,
    /// A Redis keeping the buckets, shared by every process that names it, so that a
    /// caller's limit holds across them all (`url`, `prefix`, `timeout_ms`,
    /// `connect_timeout_ms`, `ca_file`: the fields of `[cache] redis`). A Redis that is down
    /// or slower than `timeout_ms` (default 100) is skipped: the request is decided by this
    /// process's own buckets. Without it, each process keeps its own.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    pub redis: Option<Spanned<serde_json::Value>>,
}

/// One class's token bucket: `per_second` tokens are added each second, up to `burst`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens added per second (0.001 to 1000000; fractions allowed: 0.5 is one every two
    /// seconds). Required.
    #[serde(default)]
    #[schemars(with = "Option<f64>")]
    pub per_second: Option<Spanned<f64>>,
    /// The most tokens a caller may save up: the requests it may send at once after being
    /// idle (1 to 1000000; default `per_second` rounded up). A GraphQL request costing more
    /// than the burst is charged the burst.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub burst: Option<Spanned<u64>>,
}

/// `[server.persisted_queries]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PersistedQueriesConfig {
    /// `apq` (default): a request may send `extensions.persistedQuery.sha256Hash` instead of
    /// its query once the query was sent with its hash. `allowlist`: only the operations of
    /// `manifest` run (by hash or by their exact text). `off`: hashes are refused.
    #[serde(default)]
    #[schemars(with = "Option<PersistedQueryMode>")]
    pub mode: Option<Spanned<PersistedQueryMode>>,
    /// `allowlist`: an Apollo persisted-query manifest (JSON, relative to this file):
    /// `{"format": "apollo-persisted-query-manifest", "version": 1, "operations": [{"id",
    /// "name", "type", "body"}]}`. Required with `allowlist`, refused otherwise.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub manifest: Option<Spanned<String>>,
    /// `apq`: queries remembered by hash (1 to 1000000, default 4096), least recently used
    /// dropped first; a query longer than 16 KiB runs but is not remembered.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_entries: Option<Spanned<u64>>,
}

/// How GraphQL endpoints treat persisted queries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PersistedQueryMode {
    /// Automatic Persisted Queries: hashes registered by clients, any query runs.
    #[default]
    Apq,
    /// Only the manifest's operations run.
    Allowlist,
    /// No persisted queries: a request must carry its query.
    Off,
}

/// `[server.tls]`: HTTPS (TLS 1.2 and 1.3, ALPN `http/1.1`). Both files are re-read when
/// their modification time changes (checked every few seconds); a pair that does not load
/// is logged and the previous one kept.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the certificate chain, the server's certificate first (relative to the
    /// config file). Required.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub cert: Option<Spanned<String>>,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1; relative to the config file).
    /// Required.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub key: Option<Spanned<String>>,
}

/// Caller identification.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default, rename = "type")]
    #[schemars(with = "Option<AuthKind>")]
    pub kind: Option<Spanned<AuthKind>>,
    /// `casbin`: the Casbin model file (an RBAC model with `g = _, _`), relative to this file.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub model: Option<Spanned<String>>,
    /// `casbin`: the Casbin policy file; its `g, <user>, <role>` lines give JWT subjects
    /// their roles.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub policy: Option<Spanned<String>>,
    /// `jwt`: where a verified token carries the caller's roles, as a dotted path into its
    /// claims (e.g. `roles`, `realm_access.roles`): an array of strings, or a string of
    /// roles separated by spaces or commas. The roles select the `[entity.permissions.<role>]`
    /// rows that apply to the caller.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub roles_claim: Option<Spanned<String>>,
    /// `casbin`: enforce the policy's `p, <subject or role>, <entity>, <action>` lines
    /// (actions read, create, update, delete): default true when the policy has `p` lines.
    /// false keeps MeshQL's behaviour: roles become tokens, `p` lines are ignored.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub enforce_policy: Option<Spanned<bool>>,
    /// `jwt`/`casbin`: a request without a token gets 401 (default: it is served, and sees
    /// only documents that carry no authorized tokens).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub required: Option<Spanned<bool>>,
    /// `jwt`/`casbin`: decode tokens WITHOUT verifying them, because a gateway in front of
    /// meshql verified them (MeshQL's model). Anyone who reaches the port directly can then
    /// act as any user; the server warns at start.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub trusted_gateway: Option<Spanned<bool>>,
    /// HMAC secret for HS256/HS384/HS512 tokens, at least 32 bytes; use `${VAR}` to keep it
    /// out of the file. An empty value counts as none.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub secret: Option<Spanned<String>>,
    /// PEM public key files (RSA, EC P-256/P-384, Ed25519), relative to this file.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub public_keys: Vec<Spanned<String>>,
    /// URL of a JSON Web Key Set (http or https): fetched at start, every
    /// `jwks_refresh_secs`, and when a token names an unknown `kid` (at most once per
    /// `jwks_min_refresh_secs`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub jwks_url: Option<Spanned<String>>,
    /// Accepted algorithms (HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512,
    /// ES256, ES384, EdDSA). Default: whatever the key that verifies a token supports.
    /// `none` is never accepted.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    /// Accepted `iss` value(s); tokens without `iss` are then refused. Default: not checked.
    #[serde(default)]
    #[schemars(with = "Option<OneOrMany>")]
    pub issuer: Option<Spanned<OneOrMany>>,
    /// Accepted `aud` value(s): a token must name one of them. Default: not checked.
    #[serde(default)]
    #[schemars(with = "Option<OneOrMany>")]
    pub audience: Option<Spanned<OneOrMany>>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds (default 60).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub leeway_secs: Option<Spanned<u64>>,
    /// Refuse tokens without `exp` (default true).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub require_exp: Option<Spanned<bool>>,
    /// How often the JWKS is fetched again, in seconds (default 300).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub jwks_refresh_secs: Option<Spanned<u64>>,
    /// The shortest time between two JWKS fetches triggered by unknown key ids, in seconds
    /// (default 30).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub jwks_min_refresh_secs: Option<Spanned<u64>>,
}

impl AuthConfig {
    /// `type`, `none` when not given.
    pub fn kind(&self) -> AuthKind {
        self.kind.as_ref().map(|k| *k.get_ref()).unwrap_or_default()
    }
}

/// One value or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn values(&self) -> Vec<String> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// `none`: everyone sees everything. `jwt`: the `sub` claim of a `Bearer` JWT is the
/// caller's token, once the token verifies (signature, `exp`/`nbf`, `iss`/`aud` when
/// configured; see `secret`, `public_keys`, `jwks_url`, or `trusted_gateway`). `casbin`: the
/// caller's tokens are the roles the Casbin policy gives that subject (MeshQL's
/// `casbinParams`), with the same verification.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthKind {
    #[default]
    None,
    Jwt,
    Casbin,
}

/// The change feed and its embedded log.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangesConfig {
    /// Copy every committed write into the embedded log and serve `/_changes`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The log's directory, relative to `data_dir`.
    #[serde(default = "default_changes_dir")]
    pub dir: String,
    /// When the log is forced to disk: `always` (every append), `interval` (every
    /// `fsync_interval_ms`), or `never` (the OS decides). The log is rebuilt from storage
    /// after a crash, so nothing acknowledged is lost with any of them.
    #[serde(default)]
    pub fsync: FsyncConfig,
    #[serde(default = "default_fsync_interval")]
    pub fsync_interval_ms: u64,
    /// Size at which a log segment is closed and a new one started.
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    /// Oldest segments are deleted when the log is larger than this (0: no size limit).
    #[serde(default = "default_retention_bytes")]
    pub retention_bytes: u64,
    /// Segments whose newest change is older than this are deleted (0: no age limit).
    #[serde(default)]
    pub retention_hours: u64,
    /// Relays (`[[changes.relay]]`): every change of the log sent on to Kafka or NATS
    /// JetStream, in log order and at least once; each resumes after a restart from the last
    /// position its broker confirmed. A broker that is down never fails a write: its relay
    /// retries and falls behind (see `meshql_relay_lag` in `/metrics`), then catches up.
    #[serde(default)]
    #[schemars(with = "Vec<RelayConfig>")]
    pub relay: Vec<Spanned<RelayConfig>>,
}

impl Default for ChangesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: default_changes_dir(),
            fsync: FsyncConfig::default(),
            fsync_interval_ms: default_fsync_interval(),
            segment_bytes: default_segment_bytes(),
            retention_bytes: default_retention_bytes(),
            retention_hours: 0,
            relay: Vec::new(),
        }
    }
}

/// `[cache]`: a read cache for REST reads by id and lists, GraphQL root queries, relationship
/// levels and nested reads. Answers are cached per entity, operation, arguments, the
/// documents the caller's credentials let it see, and (for a read at a past moment) `at`.
/// In process by default; `redis = { url = "redis://…" }` keeps them in Redis, shared by
/// every process that names it.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Serve reads through the cache (default true when the block is present).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub enabled: Option<bool>,
    /// The in-process cache's size in bytes of cached answers (default 67108864, 64 MiB);
    /// the least recently useful answers are evicted beyond it.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_bytes: Option<Spanned<u64>>,
    /// An answer is kept at most this many milliseconds (default 300000).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub ttl_ms: Option<Spanned<u64>>,
    /// A read `at` a moment at least this many milliseconds old cannot change any more and
    /// is cached without invalidation (default 5000; raise it when the clocks of the
    /// processes writing one database differ by more).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub settle_ms: Option<Spanned<u64>>,
    /// With a shared cache (Redis): an operation of an entity (reads by id, a query, a
    /// relationship's batch) consults it on every read only while at least this share of
    /// its reads hit (default 0.1; 0 consults always). Below it, one read in 32 consults it
    /// and keeps measuring; the others go straight to storage instead of paying a round
    /// trip that almost never saves one.
    #[serde(default)]
    #[schemars(with = "Option<f64>")]
    pub min_hit_rate: Option<Spanned<f64>>,
    /// A Redis server keeping the answers and their tags, shared by several processes
    /// (`url`, `prefix`, `timeout_ms`, `connect_timeout_ms`; see meshql-cache-redis). A Redis
    /// that is down or slower than `timeout_ms` is skipped: reads go to storage.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    pub redis: Option<Spanned<serde_json::Value>>,
}

/// `[backup]`: online backups of the embedded databases and the change log.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackupConfig {
    /// The directory backups are written to, relative to `data_dir` (default `backups`).
    #[serde(default = "default_backup_dir")]
    pub dir: String,
    /// When to take one on its own: a cron expression of five fields (minute, hour, day of
    /// month, month, day of week; or six, seconds first), in UTC — `"0 3 * * *"` is every
    /// day at 03:00. None without it.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub schedule: Option<Spanned<String>>,
    /// How many backups to keep (in `dir`, and in the bucket): after each new one the
    /// oldest beyond this are deleted. 0 keeps them all. Default 7.
    #[serde(default = "default_backup_keep")]
    pub keep: u32,
    /// An S3-compatible bucket each backup the service takes is also uploaded to.
    #[serde(default)]
    #[schemars(with = "Option<S3Config>")]
    pub s3: Option<Spanned<S3Config>>,
}

impl Default for BackupConfig {
    fn default() -> Self {
        Self {
            dir: default_backup_dir(),
            schedule: None,
            keep: default_backup_keep(),
            s3: None,
        }
    }
}

fn default_backup_dir() -> String {
    "backups".into()
}
fn default_backup_keep() -> u32 {
    7
}

/// An S3-compatible bucket (`[backup.s3]`). Credentials come from the environment:
/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN` when set).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// `s3://bucket` or `s3://bucket/prefix`: each backup goes under `prefix/<backup name>/`.
    pub url: String,
    /// The server's URL, for an S3-compatible server other than AWS (MinIO, SeaweedFS,
    /// Ceph…): `http://127.0.0.1:8333`. Default: AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The bucket's region (default `us-east-1`).
    #[serde(default = "default_s3_region")]
    pub region: String,
}

fn default_s3_region() -> String {
    "us-east-1".into()
}

/// The console (`[console]`): the page a browser opens first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console. It reads and writes only through the service's own APIs, with the
    /// token the user gives it, so it shows what those APIs would return.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Where the page is served (its JSON endpoints and assets are under
    /// `/_meshql/console/`).
    #[serde(default = "default_console_path")]
    pub path: String,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: default_console_path(),
        }
    }
}

fn default_console_path() -> String {
    "/".into()
}

/// A relay of the change feed (`[[changes.relay]]`): `type` selects the relay; `name`,
/// `batch` and `retry_backoff_max_ms` are every relay's ([`RelayFields`]); its other fields
/// belong to its type, which checks them when the server starts or `meshql check` runs (the
/// config crate knows no relay; see `meshql_changes::RelayRegistry`). Every message carries
/// the change's `change_id` (`entity:id:created_at`), the same on every delivery: consumers
/// de-duplicate on it to be exactly once.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    pub name: Spanned<String>,
    /// The `type` field.
    pub kind: Spanned<String>,
    pub batch: Option<Spanned<usize>>,
    pub retry_backoff_max_ms: Option<Spanned<u64>>,
    /// Every field of the relay's type, as JSON.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Where each field starts in the config text (byte offsets; every field included).
    pub offsets: BTreeMap<String, usize>,
}

/// The fields every relay has besides `type` (the JSON Schema of [`RelayConfig`]'s own
/// fields; `meshql config-schema` adds those of each relay type).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RelayFields {
    /// Unique among the relays: letters, digits, `.`, `_`, `-`. The relay's consumer group
    /// in the change log is `relay-<name>`.
    pub name: String,
    /// Changes sent per batch at most; the position is committed after each (default 500).
    #[serde(default)]
    pub batch: Option<usize>,
    /// Longest wait between retries while the broker fails; the wait doubles from 100 ms up
    /// to this (default 10000).
    #[serde(default)]
    pub retry_backoff_max_ms: Option<u64>,
}

impl<'de> Deserialize<'de> for RelayConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;

        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = RelayConfig;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a relay's fields")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RelayConfig, A::Error> {
                use serde::de::Error;
                let (mut name, mut kind, mut batch, mut retry_backoff_max_ms) =
                    (None, None, None, None);
                let mut settings = serde_json::Map::new();
                let mut offsets = BTreeMap::new();
                // the fields every relay has are typed here, so that a type error names
                // their own line; the others are kept for the relay's type
                while let Some(key) = map.next_key::<String>()? {
                    let start = match key.as_str() {
                        "name" => name.insert(map.next_value::<Spanned<String>>()?).span(),
                        "type" => kind.insert(map.next_value::<Spanned<String>>()?).span(),
                        "batch" => batch.insert(map.next_value::<Spanned<usize>>()?).span(),
                        "retry_backoff_max_ms" => retry_backoff_max_ms
                            .insert(map.next_value::<Spanned<u64>>()?)
                            .span(),
                        _ => {
                            let value = map.next_value::<Spanned<toml::Value>>()?;
                            let span = value.span();
                            let value = serde_json::to_value(value.into_inner())
                                .map_err(A::Error::custom)?;
                            settings.insert(key.clone(), value);
                            span
                        }
                    }
                    .start;
                    offsets.insert(key, start);
                }
                Ok(RelayConfig {
                    name: name.ok_or_else(|| A::Error::missing_field("name"))?,
                    kind: kind.ok_or_else(|| A::Error::missing_field("type"))?,
                    batch,
                    retry_backoff_max_ms,
                    settings,
                    offsets,
                })
            }
        }

        deserializer.deserialize_map(Fields)
    }
}

impl JsonSchema for RelayConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RelayConfig".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A relay of the change feed: `type` selects the relay, `name`, `batch` and `retry_backoff_max_ms` are every relay's, the other fields are that relay's. Every message carries the change's `change_id` (`entity:id:created_at`), the same on every delivery: consumers de-duplicate on it to be exactly once.",
            "type": "object",
            "properties": { "type": { "type": "string" }, "name": { "type": "string" } },
            "required": ["name", "type"]
        })
    }
}

/// A processor (`[[processor]]`): `name` and `type` are typed here; every other field
/// belongs to the processor's kind, which checks it (the config crate knows no processor).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorConfig {
    pub name: Spanned<String>,
    /// The `type` field.
    pub kind: Spanned<String>,
    /// Every other field, as JSON.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Where each field starts in the config text (byte offsets; every field included).
    pub offsets: BTreeMap<String, usize>,
}

impl<'de> Deserialize<'de> for ProcessorConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let block = Block::deserialize(deserializer)?;
        Ok(ProcessorConfig {
            name: block.name.ok_or_else(|| D::Error::missing_field("name"))?,
            kind: block.kind.ok_or_else(|| D::Error::missing_field("type"))?,
            settings: block.settings,
            offsets: block.offsets,
        })
    }
}

/// A table whose `name` (and `type`, when it has one) are typed and whose other fields are
/// kept as JSON with where each starts: a processor's or a migration's entry.
struct Block {
    name: Option<Spanned<String>>,
    kind: Option<Spanned<String>>,
    settings: serde_json::Map<String, serde_json::Value>,
    offsets: BTreeMap<String, usize>,
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;

        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Block;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table of fields")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Block, A::Error> {
                read_block(map)
            }
        }

        deserializer.deserialize_map(Fields)
    }
}

fn read_block<'de, A: serde::de::MapAccess<'de>>(mut map: A) -> Result<Block, A::Error> {
    use serde::de::Error;
    let (mut name, mut kind) = (None, None);
    let mut settings = serde_json::Map::new();
    let mut offsets = BTreeMap::new();
    while let Some(key) = map.next_key::<String>()? {
        let start = match key.as_str() {
            "name" => name.insert(map.next_value::<Spanned<String>>()?).span(),
            "type" => kind.insert(map.next_value::<Spanned<String>>()?).span(),
            _ => {
                let value = map.next_value::<Spanned<Located>>()?;
                let span = value.span();
                let located = value.into_inner();
                for (path, start) in located.offsets {
                    offsets.insert(format!("{key}{path}"), start);
                }
                let value = serde_json::to_value(located.value).map_err(A::Error::custom)?;
                settings.insert(key.clone(), value);
                span
            }
        }
        .start;
        offsets.insert(key, start);
    }
    Ok(Block {
        name,
        kind,
        settings,
        offsets,
    })
}

/// A declared migration of an entity's documents (`[[entity.migration]]`): `name` is typed
/// here; the other fields (`rename`, `set`, `drop`, `default`, `batch`) are checked by
/// `meshql_process::migration` against the entity's JSON Schema.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationConfig {
    pub name: Spanned<String>,
    /// Every other field, as JSON.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Where each field starts in the config text (byte offsets; every field included).
    pub offsets: BTreeMap<String, usize>,
}

impl<'de> Deserialize<'de> for MigrationConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let block = Block::deserialize(deserializer)?;
        if block.kind.is_some() {
            return Err(D::Error::custom(
                "a migration has no `type`: it declares `rename`, `set`, `drop` and `default`",
            ));
        }
        Ok(MigrationConfig {
            name: block.name.ok_or_else(|| D::Error::missing_field("name"))?,
            settings: block.settings,
            offsets: block.offsets,
        })
    }
}

impl JsonSchema for MigrationConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MigrationConfig".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A declared migration of the entity's current documents, run once, in order, before the service serves: `rename` (old field = new name), `set` (field = a mapping transformation reading the document as it was), `drop` (fields), `default` (field = value when absent or null), `batch` (documents per transaction).",
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "rename": { "type": "object", "additionalProperties": { "type": "string" } },
                "set": { "type": "object" },
                "drop": { "type": "array", "items": { "type": "string" } },
                "default": { "type": "object" },
                "batch": { "type": "integer", "minimum": 1, "maximum": 10000 }
            },
            "required": ["name"],
            "additionalProperties": false
        })
    }
}

/// A TOML value with where each key and item inside it starts: paths relative to the value
/// (`.fields.eggs`, `.key[0]`), so a processor's errors can name the line of a nested field.
struct Located {
    value: toml::Value,
    offsets: Vec<(String, usize)>,
}

impl<'de> Deserialize<'de> for Located {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        fn plain(value: toml::Value) -> Located {
            Located {
                value,
                offsets: Vec::new(),
            }
        }

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Located;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a TOML value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Located, E> {
                Ok(plain(toml::Value::Boolean(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Located, E> {
                Ok(plain(toml::Value::Integer(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Located, E> {
                i64::try_from(v)
                    .map(|v| plain(toml::Value::Integer(v)))
                    .map_err(|_| E::custom("an integer out of range"))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Located, E> {
                Ok(plain(toml::Value::Float(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Located, E> {
                Ok(plain(toml::Value::String(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Located, E> {
                Ok(plain(toml::Value::String(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Located, A::Error> {
                let (mut items, mut offsets) = (Vec::new(), Vec::new());
                while let Some(item) = seq.next_element::<Spanned<Located>>()? {
                    let i = items.len();
                    offsets.push((format!("[{i}]"), item.span().start));
                    let item = item.into_inner();
                    offsets.extend(
                        item.offsets
                            .into_iter()
                            .map(|(p, o)| (format!("[{i}]{p}"), o)),
                    );
                    items.push(item.value);
                }
                Ok(Located {
                    value: toml::Value::Array(items),
                    offsets,
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Located, A::Error> {
                let (mut table, mut offsets) = (toml::Table::new(), Vec::new());
                while let Some(key) = map.next_key::<String>()? {
                    if key == "$__toml_private_datetime" {
                        // how the TOML deserializer hands over a date-time
                        use serde::de::Error;
                        let text = map.next_value::<String>()?;
                        let datetime = text.parse().map_err(A::Error::custom)?;
                        return Ok(plain(toml::Value::Datetime(datetime)));
                    }
                    let value = map.next_value::<Spanned<Located>>()?;
                    offsets.push((format!(".{key}"), value.span().start));
                    let value = value.into_inner();
                    offsets.extend(
                        value
                            .offsets
                            .into_iter()
                            .map(|(p, o)| (format!(".{key}{p}"), o)),
                    );
                    table.insert(key, value.value);
                }
                Ok(Located {
                    value: toml::Value::Table(table),
                    offsets,
                })
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

impl JsonSchema for ProcessorConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ProcessorConfig".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A processor of the change feed: `type` selects the kind (`projection`, `script`, `rust`), `name` is unique among processors (its consumer group in the log is `processor-<name>`); the other fields are the kind's.",
            "type": "object",
            "properties": { "type": { "type": "string" }, "name": { "type": "string" } },
            "required": ["name", "type"]
        })
    }
}

/// See [`ChangesConfig::fsync`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FsyncConfig {
    Always,
    #[default]
    Interval,
    Never,
}

fn default_changes_dir() -> String {
    "changes".into()
}
fn default_fsync_interval() -> u64 {
    1000
}
fn default_segment_bytes() -> u64 {
    64 << 20
}
fn default_retention_bytes() -> u64 {
    1 << 30
}

/// Timeouts of HTTP resolver calls.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpClientConfig {
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_request_timeout")]
    pub request_timeout_ms: u64,
}

impl Default for HttpClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: default_connect_timeout(),
            request_timeout_ms: default_request_timeout(),
        }
    }
}

fn default_connect_timeout() -> u64 {
    10_000
}
fn default_request_timeout() -> u64 {
    30_000
}

pub use meshql_core::graph::GraphqlLimits;

/// A storage block: `type` selects the backend; its other fields belong to that backend,
/// which checks them when the server starts or `meshql check` runs (the config crate knows
/// no backend; see `meshql_core::BackendRegistry`).
#[derive(Debug, Clone, PartialEq)]
pub struct StorageConfig {
    /// The `type` field.
    pub kind: String,
    /// Every other field, as JSON.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Where each field starts in the config text (byte offsets; `type` included).
    pub offsets: BTreeMap<String, usize>,
}

impl<'de> Deserialize<'de> for StorageConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = BTreeMap::<String, Spanned<toml::Value>>::deserialize(deserializer)?;
        let offsets = table
            .iter()
            .map(|(k, v)| (k.clone(), v.span().start))
            .collect();
        let kind = match table.remove("type").map(Spanned::into_inner) {
            Some(toml::Value::String(kind)) => kind,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "`type` must be a string naming a storage backend, not {}",
                    other.type_str()
                )))
            }
            None => return Err(D::Error::missing_field("type")),
        };
        let settings = table
            .into_iter()
            .map(|(k, v)| serde_json::to_value(v.into_inner()).map(|v| (k, v)))
            .collect::<Result<_, _>>()
            .map_err(D::Error::custom)?;
        Ok(Self {
            kind,
            settings,
            offsets,
        })
    }
}

impl JsonSchema for StorageConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StorageConfig".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A storage block: `type` selects the backend, the other fields are that backend's.",
            "type": "object",
            "properties": { "type": { "type": "string" } },
            "required": ["type"]
        })
    }
}

/// One entity: its storage, REST API and GraphQL API.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EntityConfig {
    /// Entity name (letters, digits, `_`); default paths are `/<name>/api` and `/<name>/graph`.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// Name of a `[storage.<name>]` block.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub storage: Option<Spanned<String>>,
    /// Table (or collection) name; default: the entity name.
    #[serde(default)]
    pub table: Option<String>,
    /// Tokens stamped on every document written through REST; when empty, the writer's
    /// own credentials are stamped (none with `auth.type = "none"`).
    #[serde(default)]
    pub tokens: Vec<String>,
    /// The REST API (omit for a read-only service).
    #[serde(default)]
    pub rest: Option<RestConfig>,
    /// The GraphQL API (omit for a write-only service).
    #[serde(default)]
    pub graphql: Option<GraphqlConfig>,
    /// Who may do what with this entity, by role: `[entity.permissions.<role>]` with
    /// `actions` and an optional field mask. Role `*` is every caller, `anonymous` a caller
    /// without a token; other roles come from `auth.roles_claim` (or, with Casbin, the
    /// policy's `g` lines). Without this table every caller may do everything.
    #[serde(default)]
    #[schemars(with = "Option<BTreeMap<String, PermissionConfig>>")]
    pub permissions: Option<Spanned<BTreeMap<String, Spanned<PermissionConfig>>>>,
    /// Declared migrations of this entity's documents (`[[entity.migration]]`), in the
    /// order they run; each runs once (see `meshql_process::migration`).
    #[serde(default)]
    #[schemars(with = "Vec<MigrationConfig>")]
    pub migration: Vec<Spanned<MigrationConfig>>,
}

/// What one role may do with an entity.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionConfig {
    /// Any of `read`, `create`, `update`, `delete` (not with `auth.type = "casbin"`, where
    /// the policy's `p` lines decide).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub actions: Option<Spanned<Vec<Spanned<String>>>>,
    /// Fields this role may not read (removed from REST bodies and the change feed; null
    /// with a `FORBIDDEN` error when selected in GraphQL).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub hidden_fields: Option<Spanned<Vec<Spanned<String>>>>,
    /// The only fields this role may read (`id` is always readable); not with
    /// `hidden_fields`.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub fields: Option<Spanned<Vec<Spanned<String>>>>,
}

/// The REST API of an entity.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestConfig {
    /// Base path; default `/<name>/api`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub path: Option<Spanned<String>>,
    /// JSON Schema (draft-07) file that POST and PUT bodies must satisfy.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub schema: Option<Spanned<String>>,
    /// Validate bodies against `schema` (set false to accept any JSON object).
    #[serde(default = "yes")]
    pub validate: bool,
}

fn yes() -> bool {
    true
}

/// The GraphQL API of an entity.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphqlConfig {
    /// Endpoint path; default `/<name>/graph`. In-process resolvers target graphlettes by it.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub path: Option<Spanned<String>>,
    /// GraphQL SDL file.
    #[schemars(with = "String")]
    pub schema: Spanned<String>,
    /// Root queries returning one object.
    #[serde(default)]
    pub singletons: Vec<QueryConfig>,
    /// Root queries returning a list (they accept `limit`).
    #[serde(default)]
    pub vectors: Vec<QueryConfig>,
    /// Relationship fields resolved through another entity's root query.
    #[serde(default)]
    pub resolvers: Vec<ResolverConfig>,
}

/// A root query bound to a template. Exactly one of `query` and `sql`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryConfig {
    /// Field name on `type Query`.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// Mongo-style JSON template: `{"id": "{{id}}"}`, `{"payload.zone": "{{zone}}"}`, `{}`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub query: Option<Spanned<String>>,
    /// Raw SQL fragment (SQL backends), e.g. `json_extract(payload, '$.zone') = '{{zone}}'`;
    /// placeholders become bound parameters.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub sql: Option<Spanned<String>>,
    /// Sort order of a JSON `query`'s results, as a JSON object of fields and directions
    /// (`1` ascending, `-1` descending): `{"payload.price": -1, "id": 1}`. Ties keep
    /// creation order.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub sort: Option<Spanned<String>>,
}

/// A relationship field. Exactly one of `graph` (in-process) and `url` (HTTP).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolverConfig {
    /// Field on the entity's GraphQL type. A list type makes it a vector resolver.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// Parent field whose value is passed as the target query's `id` argument.
    #[serde(default = "default_key")]
    pub key: String,
    /// Root query of the target graphlette; it must take an `id` argument.
    #[schemars(with = "String")]
    pub query: Spanned<String>,
    /// Path of a graphlette in this service, e.g. `/coop/graph` (resolved in-process).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub graph: Option<Spanned<String>>,
    /// URL of a remote graphlette, e.g. `http://coop-service:3033/coop/graph`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub url: Option<Spanned<String>>,
}

fn default_key() -> String {
    "id".into()
}

fn default_true() -> bool {
    true
}
