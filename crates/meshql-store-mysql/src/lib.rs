//! MySQL / MariaDB storage.
//!
//! One table per entity, one row per version (`_id`, `id`, `payload JSON`, `created_at`
//! ms, `deleted`, `authorized_tokens JSON`, `latest`, `seq`), `UNIQUE(id, created_at)`.
//! Every payload field a template filters on gets a virtual generated column with an
//! index (`f_<field>`), because MariaDB cannot index JSON expressions directly; templates
//! are compiled against those columns. Writes of one id are serialised with a named lock;
//! fresh server-generated ids take none. Batched lookups pass their keys as one JSON array
//! through `JSON_TABLE`.

mod db;
mod sql;
mod store;

pub use db::{MysqlDatabase, MysqlOptions};
pub use store::MysqlStore;
