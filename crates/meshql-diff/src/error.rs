//! What can stop a diff: a schema that does not parse.

use std::fmt;
use thiserror::Error;

/// Which of the two versions a problem is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Old,
    New,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Old => "old",
            Side::New => "new",
        })
    }
}

#[derive(Debug, Error)]
pub enum DiffError {
    /// A GraphQL SDL that apollo-compiler cannot parse.
    #[error("the {side} GraphQL SDL does not parse: {message}")]
    Sdl { side: Side, message: String },
    /// A problem in the schemas of one entity.
    #[error("entity `{entity}`: {source}")]
    Entity {
        entity: String,
        #[source]
        source: Box<DiffError>,
    },
}
