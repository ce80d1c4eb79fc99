//! One classified change: its [`Level`], where it is and what it means.

use serde::Serialize;
use std::fmt;

/// How a change affects the clients of a service and the documents it stores.
///
/// Ordered from the least to the most severe, so `max()` over changes gives the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// No client or stored document can notice it (additions, descriptions, loosening).
    Safe,
    /// Valid for every client, but one may behave differently (a new enum value it switches
    /// over, a changed default), or the change could not be proven safe.
    Dangerous,
    /// Some client request or stored document that worked before no longer does.
    Breaking,
}

impl Level {
    /// `"breaking"`, `"dangerous"` or `"safe"`, as in the JSON report.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Safe => "safe",
            Level::Dangerous => "dangerous",
            Level::Breaking => "breaking",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified difference between two versions of a schema.
///
/// `path` is a JSON Pointer into the JSON Schema (`/properties/address/properties/zip`,
/// keyword last when one keyword changed: `/properties/eggs/minimum`) or a dotted
/// coordinate in the GraphQL SDL (`Hen.name`, `Query.getById.id`, `Status.ACTIVE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub level: Level,
    pub path: String,
    pub message: String,
}

impl Change {
    pub fn new(level: Level, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            level,
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn breaking(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Level::Breaking, path, message)
    }

    pub fn dangerous(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Level::Dangerous, path, message)
    }

    pub fn safe(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Level::Safe, path, message)
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.level, self.path, self.message)
    }
}
