//! Environment expansion: `${VAR}` and `${VAR:-default}` in the config text, outside TOML
//! comments. Defaults may nest (`${A:-${B:-x}}`).
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
    expand_dyn(text, &lookup)
}

fn expand_dyn(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut line = 1;
    // lexical state, just enough to know what is a comment
    let mut in_comment = false;
    let mut quote: Option<&'static str> = None;
    while i < bytes.len() {
        let rest = &text[i..];
        let c = bytes[i];
        if c == b'\n' {
            line += 1;
            in_comment = false;
            if matches!(quote, Some("\"") | Some("'")) {
                quote = None; // single-line strings end at the line end
            }
            out.push('\n');
            i += 1;
            continue;
        }
        if in_comment {
            let ch = rest.chars().next().expect("not at the end");
            out.push(ch);
            i += ch.len_utf8();
            continue;
        }
        if let Some(q) = quote {
            if rest.starts_with(q) && !(q == "\"" && is_escaped(bytes, i)) {
                out.push_str(q);
                i += q.len();
                quote = None;
                continue;
            }
        } else {
            if c == b'#' {
                in_comment = true;
                out.push('#');
                i += 1;
                continue;
            }
            if let Some(q) = ["\"\"\"", "'''", "\"", "'"]
                .into_iter()
                .find(|q| rest.starts_with(q))
            {
                quote = Some(q);
                out.push_str(q);
                i += q.len();
                continue;
            }
        }
        if rest.starts_with("$${") {
            out.push_str("${");
            i += 3;
            continue;
        }
        if rest.starts_with("${") {
            let (value, used) = reference(rest, line, lookup)?;
            out.push_str(&value);
            i += used;
            continue;
        }
        let ch = rest.chars().next().expect("not at the end");
        out.push(ch);
        i += ch.len_utf8();
    }
    Ok(out)
}

fn is_escaped(bytes: &[u8], i: usize) -> bool {
    let mut n = 0;
    let mut j = i;
    while j > 0 && bytes[j - 1] == b'\\' {
        n += 1;
        j -= 1;
    }
    n % 2 == 1
}

/// Expands the reference at the start of `s` (`${...}`); returns the value and its length.
fn reference(
    s: &str,
    line: usize,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, usize), ExpandError> {
    let err = |message: String| ExpandError { line, message };
    // find the matching `}`, counting nested `${`
    let bytes = s.as_bytes();
    let mut depth = 0;
    let mut end = None;
    let mut j = 0;
    while j < bytes.len() {
        if bytes[j] == b'\n' {
            break;
        }
        // bytes, not `s[j..]`: `j` steps through multi-byte characters one byte at a time
        if bytes[j..].starts_with(b"${") {
            depth += 1;
            j += 2;
            continue;
        }
        if bytes[j] == b'}' {
            depth -= 1;
            if depth == 0 {
                end = Some(j);
                break;
            }
        }
        j += 1;
    }
    let end = end.ok_or_else(|| err("unterminated `${`".into()))?;
    let inner = &s[2..end];
    let (name, default) = match inner.find(":-") {
        Some(k) => (&inner[..k], Some(&inner[k + 2..])),
        None => (inner, None),
    };
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(err(format!(
            "`${{{inner}}}` is not a variable reference (use ${{NAME}} or ${{NAME:-default}})"
        )));
    }
    let value = match lookup(name).filter(|v| !v.is_empty()) {
        Some(v) => v,
        None => match default {
            Some(d) => expand_dyn(d, lookup).map_err(|e| err(e.message))?,
            None => {
                return Err(err(format!(
                    "environment variable {name} is not set and has no default (write ${{{name}:-default}})"
                )))
            }
        },
    };
    if value.contains('\n') {
        return Err(err(format!(
            "environment variable {name} contains a newline"
        )));
    }
    Ok((value, end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PORT" => Some("9000".into()),
            "EMPTY" => Some(String::new()),
            "B" => Some("bee".into()),
            _ => None,
        }
    }

    #[test]
    fn unterminated_reference_before_multibyte_text_is_an_error() {
        // found by tests/props.rs: this panicked on a char boundary
        assert!(expand("${\u{a38}", env).is_err());
        assert!(expand("x = \"${\u{80}\"", env).is_err());
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
    fn defaults_nest() {
        assert_eq!(expand("u = \"${A:-${B:-x}}\"", env).unwrap(), "u = \"bee\"");
        assert_eq!(
            expand("u = \"${A:-${C:-x}}/y\"", env).unwrap(),
            "u = \"x/y\""
        );
    }

    #[test]
    fn comments_are_left_alone() {
        let text = "# uses ${UNSET} for docs\nport = ${PORT:-1} # and ${ALSO_UNSET}\ns = \"a # ${PORT}\"\n";
        assert_eq!(
            expand(text, env).unwrap(),
            "# uses ${UNSET} for docs\nport = 9000 # and ${ALSO_UNSET}\ns = \"a # 9000\"\n"
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
