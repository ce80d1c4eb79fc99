//! Read-your-writes across replicas and caches.
//!
//! Every acknowledged write answers with a consistency token: the version it wrote
//! (`<stamp>:<entity>:<id>`, in the [`HEADER`] response header). A read that sends the token
//! back is served by the entity's replica (or cache) only once that has the version; until
//! then, for at most the configured wait, it checks again, and past the wait the whole request
//! reads the primary. A replica applies its primary's changes in commit order, so having the
//! token's version means having every write acknowledged before it on that database: a client
//! keeps the token of its last write and sees everything it wrote. Entities without a replica
//! need no check.

use crate::{EngineError, EntityService};
use meshql_core::Millis;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The header a write answers with and a read may send back.
pub const HEADER: &str = "x-meshql-consistency";

/// The version a write stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub stamp: Millis,
    pub entity: String,
    pub id: String,
}

impl Token {
    /// The token of a write stamped `stamp` or later (a delete answers no version: its
    /// token is the moment before it was made).
    pub fn format(stamp: Millis, entity: &str, id: &str) -> String {
        format!("{stamp}:{entity}:{id}")
    }

    pub fn parse(text: &str) -> Result<Token, EngineError> {
        let bad = || {
            EngineError::BadRequest(format!(
                "invalid {HEADER} header `{}`: expected the value a write answered with \
                 (<stamp>:<entity>:<id>)",
                text.chars().take(200).collect::<String>()
            ))
        };
        let mut parts = text.trim().splitn(3, ':');
        let stamp = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let entity = parts.next().filter(|e| !e.is_empty()).ok_or_else(bad)?;
        let id = parts.next().filter(|i| !i.is_empty()).ok_or_else(bad)?;
        Ok(Token {
            stamp,
            entity: entity.to_owned(),
            id: id.to_owned(),
        })
    }
}

/// Decides, per request, whether a consistency token sends its reads to the primary.
pub struct ReadAfter {
    services: HashMap<String, Arc<EntityService>>,
    wait: Duration,
}

impl ReadAfter {
    /// Over a process's services; a replica that lacks a token's version gets `wait` to
    /// apply it.
    pub fn new(services: HashMap<String, Arc<EntityService>>, wait: Duration) -> Self {
        Self { services, wait }
    }

    /// Whether a request carrying `token` must read the primary: its entity's reader has not
    /// got the version within the wait (or cannot tell). A token naming no entity of this
    /// process is a 400.
    pub async fn needs_primary(&self, token: &str) -> Result<bool, EngineError> {
        let token = Token::parse(token)?;
        let service = self.services.get(&token.entity).ok_or_else(|| {
            EngineError::BadRequest(format!(
                "invalid {HEADER} header: no entity `{}` here",
                token.entity
            ))
        })?;
        if !service.replicated() {
            return Ok(false);
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match service.reader().has_version(&token.id, token.stamp).await {
                Ok(true) => return Ok(false),
                Ok(false) => {}
                Err(_) => return Ok(true),
            }
            let left = self.wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok(true);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_ones_are_refused() {
        let t = Token::parse(&Token::format(1732380000123, "hen", "a:b")).unwrap();
        assert_eq!(
            t,
            Token {
                stamp: 1732380000123,
                entity: "hen".into(),
                id: "a:b".into()
            }
        );
        for bad in ["", "x:hen:1", "12:hen", "12::1", "12:hen:"] {
            assert!(
                matches!(Token::parse(bad), Err(EngineError::BadRequest(_))),
                "{bad:?}"
            );
        }
    }
}
