//! The part of a config a process serves (`meshql serve --role`): one config drives a
//! monolith, or a write service and any number of read services (CQRS).
//!
//! - `all` (the default): everything, in one process.
//! - `write`: REST (every method) on the primary, the change feed (its log, `/_changes`,
//!   relays and processors). No GraphQL, no console.
//! - `read`: GraphQL, REST reads and the console, served from each storage's replica where it
//!   has one (`read_url`); writes are refused with 405. The change feed (`/_changes`,
//!   subscriptions) comes from a log of the read process's own (`<changes.dir>-read-<port>`),
//!   which it fills from the storages' change feeds, so a read process needs nothing from the
//!   write process but the shared database, and several read processes never contend for one
//!   log.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What a process serves of its config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Role {
    #[default]
    All,
    Write,
    Read,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Write => "write",
            Role::Read => "read",
        }
    }

    /// Serves writes (REST's POST, PUT, DELETE, processors, relays).
    pub fn writes(self) -> bool {
        self != Role::Read
    }

    /// Serves GraphQL, the console and subscriptions, and reads through replicas.
    pub fn reads(self) -> bool {
        self != Role::Write
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown role name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role `{0}` (expected all, write or read)")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Role::All),
            "write" => Ok(Role::Write),
            "read" => Ok(Role::Read),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

impl crate::ResolvedConfig {
    /// Serves `role` of this config. A split role shares its storage with the other role's
    /// process: SQLite files are opened shared unless their block says `exclusive` itself. A
    /// read process runs no processors or relays (the write process does), and keeps its change
    /// log beside the write process's (`<changes.dir>-read-<port>`), since a log has one writer:
    /// read processes on one machine differ by their port. Call after the port is final.
    pub fn set_role(&mut self, role: Role) {
        self.role = role;
        if role == Role::All {
            return;
        }
        for storage in self.storages.values_mut() {
            if storage.kind == "sqlite" {
                if let Some(settings) = storage.settings.as_object_mut() {
                    settings
                        .entry("exclusive")
                        .or_insert(serde_json::Value::Bool(false));
                }
            }
        }
        if role == Role::Read {
            self.processors.clear();
            self.changes.relays.clear();
            let mut name = self
                .changes
                .dir
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_else(|| "changes".into());
            name.push(format!("-read-{}", self.port));
            self.changes.dir = self
                .changes
                .dir
                .parent()
                .map(|p| p.join(&name))
                .unwrap_or_else(|| PathBuf::from(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Role;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for role in [Role::All, Role::Write, Role::Read] {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        let err = "primary".parse::<Role>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown role `primary` (expected all, write or read)"
        );
        assert!(Role::All.reads() && Role::All.writes());
        assert!(Role::Write.writes() && !Role::Write.reads());
        assert!(Role::Read.reads() && !Role::Read.writes());
    }
}
