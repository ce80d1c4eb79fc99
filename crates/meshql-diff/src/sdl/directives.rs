//! Directive definitions: removed, added, their locations, `repeatable`, their arguments.

use super::{description, SdlDiffer};
use crate::change::Level;
use apollo_compiler::Schema;

impl SdlDiffer<'_> {
    pub(super) fn directives(&mut self) {
        let custom = |schema: &'_ Schema| {
            schema
                .directive_definitions
                .iter()
                .filter(|(_, d)| !d.is_built_in())
                .map(|(n, d)| (n.clone(), d.clone()))
                .collect::<Vec<_>>()
        };
        let (old, new) = (custom(self.old), custom(self.new));
        for (name, def) in &old {
            let at = format!("@{name}");
            let Some((_, after)) = new.iter().find(|(n, _)| n == name) else {
                self.push(Level::Breaking, at, format!("directive `@{name}` removed"));
                continue;
            };
            for location in def
                .locations
                .iter()
                .filter(|l| !after.locations.contains(l))
            {
                self.push(
                    Level::Breaking,
                    &at,
                    format!("directive `@{name}` no longer allowed on {location}"),
                );
            }
            for location in after
                .locations
                .iter()
                .filter(|l| !def.locations.contains(l))
            {
                self.push(
                    Level::Safe,
                    &at,
                    format!("directive `@{name}` now allowed on {location}"),
                );
            }
            match (def.repeatable, after.repeatable) {
                (true, false) => self.push(
                    Level::Breaking,
                    &at,
                    format!("directive `@{name}` is no longer repeatable"),
                ),
                (false, true) => self.push(
                    Level::Safe,
                    &at,
                    format!("directive `@{name}` is now repeatable"),
                ),
                _ => {}
            }
            self.description(
                &at,
                &format!("directive `@{name}`"),
                description(&def.description),
                description(&after.description),
            );
            self.arguments(&at, &def.arguments, &after.arguments);
        }
        for (name, _) in new.iter().filter(|(n, _)| !old.iter().any(|(o, _)| o == n)) {
            self.push(
                Level::Safe,
                format!("@{name}"),
                format!("directive `@{name}` added"),
            );
        }
    }
}
