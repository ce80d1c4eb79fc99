//! Statements of an entity table that do not depend on templates.

/// Index into a table's page statements of a page read at a time, for some tokens, after an
/// id.
pub fn page_index(at: bool, tokens: bool, after: bool) -> usize {
    (at as usize) << 2 | (tokens as usize) << 1 | after as usize
}
