//! The changes of a whole service, grouped by entity, as text for people and JSON for CI.

use crate::change::{Change, Level};
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt;

/// Which of an entity's schemas a change is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The entity itself (added, removed, its REST or GraphQL side added or removed).
    Entity,
    /// The JSON Schema that validates writes.
    JsonSchema,
    /// The GraphQL SDL that clients query.
    Sdl,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Entity => "entity",
            Source::JsonSchema => "JSON Schema",
            Source::Sdl => "SDL",
        }
    }
}

/// A change and the schema it was found in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntityChange {
    pub source: Source,
    #[serde(flatten)]
    pub change: Change,
}

/// The changes of one entity, in the order found: entity, JSON Schema, SDL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntityReport {
    pub entity: String,
    pub changes: Vec<EntityChange>,
}

impl EntityReport {
    pub fn new(entity: impl Into<String>) -> Self {
        Self {
            entity: entity.into(),
            changes: Vec::new(),
        }
    }

    pub fn push(&mut self, source: Source, changes: impl IntoIterator<Item = Change>) {
        self.changes.extend(
            changes
                .into_iter()
                .map(|change| EntityChange { source, change }),
        );
    }
}

/// Every entity compared (old ones first, in their order, then the added ones), with the
/// changes found in each; an entity with no change has an empty list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub entities: Vec<EntityReport>,
}

impl Report {
    /// Every change with the name of its entity.
    pub fn changes(&self) -> impl Iterator<Item = (&str, &EntityChange)> {
        self.entities
            .iter()
            .flat_map(|e| e.changes.iter().map(move |c| (e.entity.as_str(), c)))
    }

    pub fn count(&self, level: Level) -> usize {
        self.changes()
            .filter(|(_, c)| c.change.level == level)
            .count()
    }

    /// The most severe level found, `None` when nothing changed.
    pub fn worst(&self) -> Option<Level> {
        self.changes().map(|(_, c)| c.change.level).max()
    }

    /// Whether a client or a stored document breaks (`meshql diff` exits 1).
    pub fn has_breaking(&self) -> bool {
        self.worst() == Some(Level::Breaking)
    }

    pub fn is_empty(&self) -> bool {
        self.changes().next().is_none()
    }

    /// One line per change, breaking first (then dangerous, then safe; within a level in
    /// the order found), and a summary line.
    pub fn to_text(&self) -> String {
        let mut lines: Vec<(Level, String)> = self
            .changes()
            .map(|(entity, c)| {
                let level = c.change.level;
                let line = if c.source == Source::Entity {
                    format!("{:<9} {entity}: {}", upper(level), c.change.message)
                } else {
                    format!(
                        "{:<9} {entity} {} {}: {}",
                        upper(level),
                        c.source.label(),
                        c.change.path,
                        c.change.message
                    )
                };
                (level, line)
            })
            .collect();
        lines.sort_by_key(|(level, _)| std::cmp::Reverse(*level)); // stable: keeps the order found
        let mut text = String::new();
        for (_, line) in lines {
            text.push_str(&line);
            text.push('\n');
        }
        text.push_str(&self.summary());
        text.push('\n');
        text
    }

    /// `2 breaking, 1 dangerous, 3 safe changes in 2 of 4 entities`, or `no changes ...`.
    pub fn summary(&self) -> String {
        let compared = self.entities.len();
        let changed = self
            .entities
            .iter()
            .filter(|e| !e.changes.is_empty())
            .count();
        if changed == 0 {
            return format!("no changes in {compared} entities");
        }
        format!(
            "{} breaking, {} dangerous, {} safe changes in {changed} of {compared} entities",
            self.count(Level::Breaking),
            self.count(Level::Dangerous),
            self.count(Level::Safe),
        )
    }

    /// `{"breaking": n, "dangerous": n, "safe": n, "entities": [{"entity", "changes":
    /// [{"source", "level", "path", "message"}]}]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "breaking": self.count(Level::Breaking),
            "dangerous": self.count(Level::Dangerous),
            "safe": self.count(Level::Safe),
            "entities": self.entities,
        })
    }
}

fn upper(level: Level) -> &'static str {
    match level {
        Level::Breaking => "BREAKING",
        Level::Dangerous => "DANGEROUS",
        Level::Safe => "SAFE",
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
