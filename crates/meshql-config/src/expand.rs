//! Environment expansion: `${VAR}` and `${VAR:-default}` anywhere in the config text.
//!
//! Expansion happens on the raw text before parsing (so that `port = ${PORT:-5088}` works
//! for numbers too). An expanded value may not contain a newline, which keeps line numbers
//! of later errors true. `$${` stands for a literal `${`.

/// An expansion problem: the 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpandError {
    pub line: usize,
    pub message: String,
}

/// Expands the text with `lookup` (normally `std::env::var`).
pub fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut line = 1;
    while let Some(pos) = rest.find("${") {
        let before = &rest[..pos];
        line += before.matches('\n').count();
        if let Some(literal) = before.strip_suffix('$') {
            out.push_str(literal);
            out.push_str("${");
            rest = &rest[pos + 2..];
            continue;
        }
        out.push_str(before);
        let after = &rest[pos + 2..];
        let end = after.find('}').ok_or_else(|| ExpandError {
            line,
            message: "unterminated `${`".into(),
        })?;
        let inner = &after[..end];
        if inner.contains('\n') {
            return Err(ExpandError {
                line,
                message: "unterminated `${`".into(),
            });
        }
        let (name, default) = match inner.find(":-") {
            Some(i) => (&inner[..i], Some(&inner[i + 2..])),
            None => (inner, None),
        };
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(ExpandError {
                line,
                message: format!("`${{{inner}}}` is not a variable reference (use ${{NAME}} or ${{NAME:-default}})"),
            });
        }
        let value = match lookup(name).filter(|v| !v.is_empty()) {
            Some(v) => v,
            None => match default {
                Some(d) => d.to_owned(),
                None => {
                    return Err(ExpandError {
                        line,
                        message: format!(
                            "environment variable {name} is not set and has no default (write ${{{name}:-default}})"
                        ),
                    })
                }
            },
        };
        if value.contains('\n') {
            return Err(ExpandError {
                line,
                message: format!("environment variable {name} contains a newline"),
            });
        }
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PORT" => Some("9000".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_with_defaults() {
        assert_eq!(
            expand("port = ${PORT:-5088}\nx = \"${NOPE:-a b}\"", env).unwrap(),
            "port = 9000\nx = \"a b\""
        );
        assert_eq!(expand("${EMPTY:-d}", env).unwrap(), "d");
        assert_eq!(
            expand("cost = \"$${PORT}\"", env).unwrap(),
            "cost = \"${PORT}\""
        );
    }

    #[test]
    fn reports_the_line() {
        let e = expand("a = 1\nb = ${MISSING}\n", env).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("MISSING"));
        let e = expand("a = 1\n\nb = ${OPEN", env).unwrap_err();
        assert_eq!(e.line, 3);
        assert!(expand("${bad name}", env).is_err());
    }
}
