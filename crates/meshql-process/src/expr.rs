//! Derived fields of a projection: small arithmetic expressions over the projection's own
//! fields and the fields of looked-up documents.
//!
//! ```text
//! expr  := term (("+" | "-") term)*
//! term  := unary (("*" | "/") unary)*
//! unary := "-" unary | atom
//! atom  := number | 'text' | name ("." name)? | name "(" expr ("," expr)* ")" | "(" expr ")"
//! ```
//!
//! A `name` is a field of the projection (an aggregate or the key); `lookup.field` reads a
//! field of a looked-up document. Functions: `min`, `max`, `round(x)` / `round(x, digits)`,
//! `coalesce(a, b, …)` (the first that is not null). Arithmetic on a null or a non-number, and
//! a division by zero, give null; a derived field that is null is left out of the document.

use serde_json::Value;
use std::fmt;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Number(f64),
    Text(String),
    /// A field of the projection.
    Field(String),
    /// A field of a looked-up document: `(lookup, field)`.
    Lookup(String, String),
    Neg(Box<Expr>),
    Binary(Op, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Min,
    Max,
    Round,
    Coalesce,
}

/// Why an expression does not parse, with the byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at character {})", self.message, self.at + 1)
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn fail<T>(&self, message: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            at: self.pos,
            message: message.into(),
        })
    }

    fn skip_space(&mut self) {
        while self.text[self.pos..].starts_with(char::is_whitespace) {
            self.pos += self.text[self.pos..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.pos..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Option<&'a str> {
        self.skip_space();
        let rest = &self.text[self.pos..];
        let len = rest
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_alphanumeric() || *c == '_') || (*i == 0 && c.is_ascii_digit())
            })
            .map_or(rest.len(), |(i, _)| i);
        if len == 0 {
            return None;
        }
        self.pos += len;
        Some(&rest[..len])
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.term()?;
        loop {
            let op = if self.eat('+') {
                Op::Add
            } else if self.eat('-') {
                Op::Sub
            } else {
                return Ok(left);
            };
            left = Expr::Binary(op, Box::new(left), Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        loop {
            let op = if self.eat('*') {
                Op::Mul
            } else if self.eat('/') {
                Op::Div
            } else {
                return Ok(left);
            };
            left = Expr::Binary(op, Box::new(left), Box::new(self.unary()?));
        }
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.eat('-') {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        match self.peek() {
            None => self.fail("the expression ends too early"),
            Some('(') => {
                self.pos += 1;
                let e = self.expr()?;
                if !self.eat(')') {
                    return self.fail("`)` expected");
                }
                Ok(e)
            }
            Some('\'') => {
                let start = self.pos + 1;
                let Some(len) = self.text[start..].find('\'') else {
                    return self.fail("the text is not closed with `'`");
                };
                self.pos = start + len + 1;
                Ok(Expr::Text(self.text[start..start + len].to_owned()))
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                let rest = &self.text[self.pos..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(rest.len());
                match rest[..len].parse::<f64>() {
                    Ok(n) => {
                        self.pos += len;
                        Ok(Expr::Number(n))
                    }
                    Err(_) => self.fail(format!("`{}` is not a number", &rest[..len])),
                }
            }
            Some(_) => {
                let Some(name) = self.name() else {
                    return self.fail("a field, a number, a function or `(` expected");
                };
                if self.eat('(') {
                    let func = match name {
                        "min" => Func::Min,
                        "max" => Func::Max,
                        "round" => Func::Round,
                        "coalesce" => Func::Coalesce,
                        other => {
                            return self.fail(format!(
                                "unknown function `{other}` (there are min, max, round, coalesce)"
                            ))
                        }
                    };
                    let mut args = vec![self.expr()?];
                    while self.eat(',') {
                        args.push(self.expr()?);
                    }
                    if !self.eat(')') {
                        return self.fail("`)` or `,` expected");
                    }
                    let arity_ok = match func {
                        Func::Round => (1..=2).contains(&args.len()),
                        Func::Min | Func::Max | Func::Coalesce => !args.is_empty(),
                    };
                    if !arity_ok {
                        return self.fail(format!("`{name}` takes one or two arguments"));
                    }
                    return Ok(Expr::Call(func, args));
                }
                if self.peek() == Some('.') {
                    self.pos += 1;
                    let Some(field) = self.name() else {
                        return self.fail(format!("a field of `{name}` expected after `.`"));
                    };
                    return Ok(Expr::Lookup(name.to_owned(), field.to_owned()));
                }
                Ok(Expr::Field(name.to_owned()))
            }
        }
    }
}

impl Expr {
    /// Parses `text` (see the module docs).
    pub fn parse(text: &str) -> Result<Expr, ParseError> {
        let mut p = Parser { text, pos: 0 };
        let e = p.expr()?;
        if p.peek().is_some() {
            return p.fail("an operator or the end expected");
        }
        Ok(e)
    }

    /// Every name the expression reads: `(None, field)` for the projection's own fields,
    /// `(Some(lookup), field)` for a looked-up document's.
    pub fn references(&self) -> Vec<(Option<&str>, &str)> {
        let mut out = Vec::new();
        self.walk(&mut out);
        out
    }

    fn walk<'s>(&'s self, out: &mut Vec<(Option<&'s str>, &'s str)>) {
        match self {
            Expr::Number(_) | Expr::Text(_) => {}
            Expr::Field(f) => out.push((None, f)),
            Expr::Lookup(l, f) => out.push((Some(l), f)),
            Expr::Neg(e) => e.walk(out),
            Expr::Binary(_, a, b) => {
                a.walk(out);
                b.walk(out);
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.walk(out)),
        }
    }

    /// The value of the expression; `field` and `lookup` give the values of names (null when
    /// missing).
    pub fn eval(
        &self,
        field: &dyn Fn(&str) -> Value,
        lookup: &dyn Fn(&str, &str) -> Value,
    ) -> Value {
        match self {
            Expr::Number(n) => number(*n),
            Expr::Text(t) => Value::String(t.clone()),
            Expr::Field(f) => field(f),
            Expr::Lookup(l, f) => lookup(l, f),
            Expr::Neg(e) => match e.eval(field, lookup).as_f64() {
                Some(n) => number(-n),
                None => Value::Null,
            },
            Expr::Binary(op, a, b) => {
                let (Some(x), Some(y)) = (
                    a.eval(field, lookup).as_f64(),
                    b.eval(field, lookup).as_f64(),
                ) else {
                    return Value::Null;
                };
                match op {
                    Op::Add => number(x + y),
                    Op::Sub => number(x - y),
                    Op::Mul => number(x * y),
                    Op::Div if y == 0.0 => Value::Null,
                    Op::Div => number(x / y),
                }
            }
            Expr::Call(Func::Coalesce, args) => args
                .iter()
                .map(|a| a.eval(field, lookup))
                .find(|v| !v.is_null())
                .unwrap_or(Value::Null),
            Expr::Call(Func::Round, args) => {
                let Some(x) = args[0].eval(field, lookup).as_f64() else {
                    return Value::Null;
                };
                let digits = match args.get(1) {
                    Some(d) => match d.eval(field, lookup).as_f64() {
                        Some(d) => d.clamp(0.0, 15.0) as i32,
                        None => return Value::Null,
                    },
                    None => 0,
                };
                let scale = 10f64.powi(digits);
                number((x * scale).round() / scale)
            }
            Expr::Call(func @ (Func::Min | Func::Max), args) => {
                let mut best: Option<f64> = None;
                for a in args {
                    let Some(x) = a.eval(field, lookup).as_f64() else {
                        return Value::Null;
                    };
                    best = Some(match best {
                        None => x,
                        Some(b) if *func == Func::Min => b.min(x),
                        Some(b) => b.max(x),
                    });
                }
                best.map_or(Value::Null, number)
            }
        }
    }
}

/// A JSON number: an integer when `n` is a whole number that fits, else a float (null for
/// NaN and infinities).
pub fn number(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        Value::from(n as i64)
    } else {
        serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(text: &str) -> Value {
        let e = Expr::parse(text).unwrap();
        e.eval(
            &|f| match f {
                "eggs" => json!(30),
                "hens" => json!(4),
                "zero" => json!(0),
                "name" => json!("x"),
                _ => Value::Null,
            },
            &|l, f| match (l, f) {
                ("container", "capacity") => json!(120),
                _ => Value::Null,
            },
        )
    }

    #[test]
    fn arithmetic_follows_precedence() {
        assert_eq!(eval("1 + 2 * 3"), json!(7));
        assert_eq!(eval("(1 + 2) * 3"), json!(9));
        assert_eq!(eval("eggs / hens"), json!(7.5));
        assert_eq!(eval("-eggs + 1"), json!(-29));
        assert_eq!(eval("eggs * 100 / container.capacity"), json!(25));
        assert_eq!(eval("min(100, eggs * 100 / container.capacity)"), json!(25));
        assert_eq!(eval("round(10 / 3, 2)"), json!(3.33));
        assert_eq!(eval("max(1, 2, 3)"), json!(3));
    }

    #[test]
    fn nulls_propagate_and_coalesce_ends_them() {
        assert_eq!(eval("eggs / zero"), Value::Null);
        assert_eq!(eval("missing + 1"), Value::Null);
        assert_eq!(eval("name * 2"), Value::Null);
        assert_eq!(eval("coalesce(eggs / zero, 0)"), json!(0));
        assert_eq!(eval("coalesce(missing, 'local_farm')"), json!("local_farm"));
    }

    #[test]
    fn references_are_listed() {
        let e = Expr::parse("coalesce(farm.farm_type, kind) + eggs_week / total").unwrap();
        assert_eq!(
            e.references(),
            vec![
                (Some("farm"), "farm_type"),
                (None, "kind"),
                (None, "eggs_week"),
                (None, "total")
            ]
        );
    }

    #[test]
    fn bad_expressions_say_where() {
        for (text, needle) in [
            ("1 +", "ends too early"),
            ("sqrt(2)", "unknown function `sqrt`"),
            ("(1 + 2", "`)` expected"),
            ("a b", "operator or the end"),
            ("round(1, 2, 3)", "one or two"),
            ("'open", "not closed"),
            ("1..2", "not a number"),
        ] {
            let e = Expr::parse(text).unwrap_err();
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }
}
