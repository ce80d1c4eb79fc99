//! The change feed: every committed write becomes one [`StoreChange`].
//!
//! Every backend answers [`crate::Store::changes`] with the versions it committed after a
//! [`Cursor`], in feed order. The contract, checked by `meshql-conformance` on every backend:
//!
//! * each committed create, update, delete (and each item of a bulk write) yields exactly one
//!   change; a write that fails or rolls back yields none;
//! * cursors strictly increase along the feed; the feed order agrees with commit order for
//!   every two writes of one document, and for every two writes where one began after the
//!   other was acknowledged;
//! * a reader that resumes after the cursor of the last change it saw sees every later change
//!   exactly once, including changes whose transactions were still in flight when it last
//!   read: a backend only hands out a change once nothing can commit before it any more (its
//!   *visibility horizon*).
//!
//! A change *is* a stored version (a tombstone for a delete), so a feed costs no second copy
//! of the payload in the store; backends keep the version's correlation id beside it.

use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a write did to its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeOp {
    /// The first version of an id.
    Create,
    /// A later version.
    Update,
    /// A tombstone.
    Delete,
}

impl ChangeOp {
    /// The op of a stored version: a tombstone is a delete, a document's first version a
    /// create, any other version an update.
    pub fn of_version(deleted: bool, first_version: bool) -> Self {
        if deleted {
            ChangeOp::Delete
        } else if first_version {
            ChangeOp::Create
        } else {
            ChangeOp::Update
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Create => "create",
            ChangeOp::Update => "update",
            ChangeOp::Delete => "delete",
        }
    }
}

/// A position in one store's feed. Ordered lexicographically; backends whose commit order is
/// one counter use `Cursor(0, n)`, PostgreSQL uses `(transaction id, row id)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor(pub u64, pub u64);

impl Cursor {
    /// Before every change.
    pub const START: Cursor = Cursor(0, 0);

    /// A one-counter cursor.
    pub fn seq(n: u64) -> Self {
        Cursor(0, n)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a store cursor (two integers joined by a dot)");
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        Ok(Cursor(
            a.parse().map_err(|_| bad())?,
            b.parse().map_err(|_| bad())?,
        ))
    }
}

/// One committed version, as a store's feed hands it out.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreChange {
    pub cursor: Cursor,
    pub id: String,
    /// The version's time (its `created_at`).
    pub created_at: Millis,
    pub op: ChangeOp,
    /// The version's payload text (for a delete, the last payload before it).
    pub payload: String,
    pub authorized_tokens: Vec<String>,
    pub correlation_id: Option<String>,
}

impl StoreChange {
    /// The change a stored version is: `first_version` when no version of its id came before.
    pub fn of_version(
        cursor: Cursor,
        version: crate::Envelope,
        first_version: bool,
        correlation_id: Option<String>,
    ) -> Self {
        StoreChange {
            cursor,
            op: ChangeOp::of_version(version.deleted, first_version),
            id: version.id,
            created_at: version.created_at,
            payload: version.payload,
            authorized_tokens: version.authorized_tokens,
            correlation_id,
        }
    }
}

/// Who writes, and what their write carries into the change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteContext {
    /// Authorized tokens stamped on the versions written. For an update or a delete, `None`
    /// keeps the current version's tokens (a write does not change who owns a document);
    /// for a create, `None` stamps none.
    pub tokens: Option<Vec<String>>,
    /// Which existing documents the writer may change (update and remove).
    pub filter: crate::TokenFilter,
    /// Ties the changes of one request (or one upstream event) together in the feed.
    pub correlation_id: Option<String>,
}

impl WriteContext {
    /// A writer that sees everything and stamps no tokens (tests, tools, processors).
    pub const SYSTEM: WriteContext = WriteContext {
        tokens: None,
        filter: crate::TokenFilter::All,
        correlation_id: None,
    };

    /// The tokens a new document gets.
    pub fn create_tokens(&self) -> &[String] {
        self.tokens.as_deref().unwrap_or(&[])
    }

    pub fn with_tokens(mut self, tokens: Vec<String>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    pub fn with_filter(mut self, filter: crate::TokenFilter) -> Self {
        self.filter = filter;
        self
    }

    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
}

impl Default for WriteContext {
    fn default() -> Self {
        Self::SYSTEM
    }
}

/// What a feed tailer waits on: its value changes after every local commit.
pub type CommitReceiver = tokio::sync::watch::Receiver<u64>;

/// Wakes feed readers after a local commit, so that a tailer needs no polling for writes
/// made in this process (writes by other processes are found by polling).
#[derive(Debug)]
pub struct CommitSignal {
    sender: tokio::sync::watch::Sender<u64>,
}

impl Default for CommitSignal {
    fn default() -> Self {
        Self {
            sender: tokio::sync::watch::channel(0).0,
        }
    }
}

impl CommitSignal {
    /// Called by a backend after a commit that wrote something.
    pub fn notify(&self) {
        self.sender.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn subscribe(&self) -> CommitReceiver {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_order_and_round_trip() {
        assert!(Cursor(1, 9) < Cursor(2, 0));
        assert!(Cursor::seq(3) < Cursor::seq(4));
        let c: Cursor = "17.42".parse().unwrap();
        assert_eq!(c, Cursor(17, 42));
        assert_eq!(c.to_string(), "17.42");
        assert!("17".parse::<Cursor>().is_err());
        assert!("a.b".parse::<Cursor>().is_err());
    }

    #[test]
    fn ops_of_versions() {
        assert_eq!(ChangeOp::of_version(false, true), ChangeOp::Create);
        assert_eq!(ChangeOp::of_version(false, false), ChangeOp::Update);
        assert_eq!(ChangeOp::of_version(true, false), ChangeOp::Delete);
        assert_eq!(
            serde_json::to_string(&ChangeOp::Delete).unwrap(),
            "\"delete\""
        );
    }
}
