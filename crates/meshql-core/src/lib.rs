//! Core types of meshql: the storage envelope, time, the storage traits every backend
//! implements, query templates, authorization and permissions.
//!
//! Nothing here knows about HTTP, GraphQL or any concrete backend: frontends depend on these
//! traits, backends implement them.

pub mod access;
pub mod auth;
pub mod backend;
pub mod change;
pub mod envelope;
pub mod error;
pub mod fault;
pub mod field_set;
pub mod graph;
pub mod legacy_id;
pub mod lru;
pub mod memo;
pub mod metrics;
pub mod nested;
pub mod output;
pub mod registry;
pub mod replica;
pub mod serving;
pub mod shared_limit;
pub mod store;
pub mod suggest;
pub mod template;
pub mod time;
pub mod visibility;

pub use access::{Action, Actions, AllowAll, Forbidden, Grant, Grants, Mask, Policy, Principal};
pub use auth::{is_visible, AuthError, Authorizer, Caller, Credentials, NoAuth};
pub use backend::{
    parse_settings, BackendContext, BackendRegistry, Database, DynDatabase, FileSnapshot,
    FileSnapshots, SettingError, Storage, StorageTarget,
};
pub use change::{ChangeOp, CommitReceiver, CommitSignal, Cursor, StoreChange, WriteContext};
pub use envelope::{payload_with_id, Envelope, NewDocument, Row};
pub use error::{ErrorKind, StoreError};
pub use field_set::{parse_payload, FieldSet};
pub use output::{DeadLetter, OutputBatch, OutputStore, OutputWrite, StateWrite};
pub use registry::{Component, Family, Registry};
pub use shared_limit::{
    LimitRule, SharedLimitError, SharedLimitRegistry, SharedLimiter, SharedLimiterTarget,
    SharedLimits,
};
pub use store::{
    in_request_order, page_as_of, BatchRows, BatchSearch, ChangeFeed, Document, DynReader,
    DynStore, DynWriter, KeyedRows, LogLag, Nested, NestedRow, Placement, ReadContext, Relation,
    RemoveOutcome, Search, Store, StoreReader, StoreStats, StoreWriter, TokenFilter,
};
pub use template::{ArgValue, BoundArgs, FieldPath, QueryTemplate, TemplateError};
pub use time::{now_millis, Millis};
pub use visibility::Visibility;
