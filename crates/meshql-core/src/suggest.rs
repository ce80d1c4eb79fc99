//! "Did you mean …?" for names a user misspelt: the known name closest to the one given,
//! if it is close enough to be a likely typo.

/// How alike two names must be (normalised Damerau–Levenshtein similarity, 0..=1) for one
/// to be suggested for the other: `lmit` → `limit` is 0.8, `nme` → `name` 0.75; `zone` →
/// `name` (0.5) is not suggested.
const MIN_SIMILARITY: f64 = 0.6;

/// The name among `known` closest to `given` (case-insensitively), if any is close enough.
pub fn closest<'k>(given: &str, known: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    let given = given.to_lowercase();
    known
        .into_iter()
        .map(|k| {
            (
                strsim::normalized_damerau_levenshtein(&given, &k.to_lowercase()),
                k,
            )
        })
        .filter(|(score, _)| *score >= MIN_SIMILARITY)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// How every route that takes named query parameters refuses one it does not take:
/// ``unknown query parameter `lmit`: did you mean `limit`? (this route takes: limit, after, at)``.
pub fn unknown_parameter(name: &str, known: &[&str]) -> String {
    if known.is_empty() {
        return format!("unknown query parameter `{name}` (this route takes no query parameters)");
    }
    let suggestion = closest(name, known.iter().copied())
        .map_or(String::new(), |k| format!(": did you mean `{k}`?"));
    format!(
        "unknown query parameter `{name}`{suggestion} (this route takes: {})",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_name_and_strangers_find_none() {
        assert_eq!(closest("lmit", ["limit", "after", "at"]), Some("limit"));
        assert_eq!(closest("nme", ["id", "name", "farm", "hens"]), Some("name"));
        assert_eq!(closest("Name", ["id", "name"]), Some("name"));
        assert_eq!(closest("afterr", ["limit", "after", "at"]), Some("after"));
        assert_eq!(closest("zone", ["id", "name", "farm"]), None);
        assert_eq!(closest("x", ["limit", "after", "at"]), None);
        assert_eq!(closest("x", []), None);
    }

    #[test]
    fn unknown_parameters_are_named_with_the_known_ones() {
        assert_eq!(
            unknown_parameter("sinc", &["since", "limit"]),
            "unknown query parameter `sinc`: did you mean `since`? (this route takes: since, limit)"
        );
        assert_eq!(
            unknown_parameter("x", &[]),
            "unknown query parameter `x` (this route takes no query parameters)"
        );
    }
}
