//! Names derived from a table's name (indexes, a rebuild's table), kept within a database's
//! identifier limit.

/// How long an identifier may be, and in what unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentLimit {
    /// PostgreSQL: 63 bytes (a longer name is truncated, silently).
    Bytes(usize),
    /// MySQL / MariaDB: 64 characters (a longer name is an error).
    Chars(usize),
}

/// The 64-bit FNV-1a hash of `text`'s bytes.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// `name` then `tail` if that fits `limit`; else the first characters of `name` that leave
/// room for `_`, a hash of all of `name` (16 hex digits) and `tail`, then those. One name
/// always shortens the same way, and two long names sharing their first characters do not
/// collide.
pub fn shorten(name: &str, tail: &str, limit: IdentLimit) -> String {
    let (fits, room) = match limit {
        IdentLimit::Bytes(max) => (name.len() + tail.len() <= max, max),
        IdentLimit::Chars(max) => (name.chars().count() + tail.len() <= max, max),
    };
    if fits {
        return format!("{name}{tail}");
    }
    let hash = fnv1a(name);
    let keep = room - 17 - tail.len();
    let head = match limit {
        IdentLimit::Bytes(_) => {
            let mut cut = keep;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            &name[..cut]
        }
        IdentLimit::Chars(_) => name
            .char_indices()
            .nth(keep)
            .map_or(name, |(i, _)| &name[..i]),
    };
    format!("{head}_{hash:016x}{tail}")
}

/// The table a rebuild of `table` writes (`OutputStore::rebuild_store`): always the same
/// name for one table, so a rebuild that died half-way leaves a table the next one drops,
/// and a long name is shortened (`limit`), never truncated into the entity's own.
pub fn rebuild_table(table: &str, limit: Option<IdentLimit>) -> String {
    match limit {
        Some(limit) => shorten(table, "__rebuild", limit),
        None => format!("{table}__rebuild"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept() {
        assert_eq!(
            shorten("hen", "__rebuild", IdentLimit::Bytes(63)),
            "hen__rebuild"
        );
        assert_eq!(shorten("hen", "", IdentLimit::Chars(64)), "hen");
        assert_eq!(rebuild_table("hen", None), "hen__rebuild");
        let exactly = "a".repeat(54);
        assert_eq!(
            shorten(&exactly, "__rebuild", IdentLimit::Bytes(63)),
            format!("{exactly}__rebuild")
        );
    }

    #[test]
    fn long_names_fit_their_limit_in_their_unit() {
        let long = "ä".repeat(40); // 40 characters, 80 bytes
        let bytes = shorten(&long, "__rebuild", IdentLimit::Bytes(63));
        assert!(bytes.len() <= 63, "{bytes}");
        assert!(bytes.ends_with("__rebuild"));
        // cut at a character boundary, below 63 - 17 - 9 = 37 bytes
        assert_eq!(bytes.len(), 36 + 17 + 9);
        // 40 characters and a tail of 9 fit 64 characters: kept
        assert_eq!(
            shorten(&long, "__rebuild", IdentLimit::Chars(64)),
            format!("{long}__rebuild")
        );
        let longer = "ä".repeat(70);
        let chars = shorten(&longer, "__old", IdentLimit::Chars(64));
        assert_eq!(chars.chars().count(), 64);
        assert!(chars.starts_with(&"ä".repeat(42)));
        assert_ne!(
            shorten(&format!("{longer}x"), "", IdentLimit::Chars(64)),
            shorten(&format!("{longer}y"), "", IdentLimit::Chars(64))
        );
    }
}
