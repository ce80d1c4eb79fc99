//! Templates' conditions as SQL: the one compiler of `meshql_core::template` templates
//! (filters, operator queries, SQL fragments) every dialect shares. The rules of batch keys
//! and of a relationship's unbound arguments are here; what differs per database is asked
//! of the [`Dialect`].

use crate::dialect::{Dialect, Unbound};
use crate::param::{Compiled, Lists, Operand, OperandKind, Param};
use meshql_core::template::{render, CmpOp, Cond, ListValue, SqlPiece, TemplateKind};
use meshql_core::{ArgValue, FieldPath, QueryTemplate};
use serde_json::Value;

/// A statement being compiled: its parameters, numbered as the dialect numbers them.
pub struct Builder<'d> {
    d: &'d dyn Dialect,
    params: Vec<Param>,
}

impl<'d> Builder<'d> {
    pub fn new(d: &'d dyn Dialect) -> Self {
        Self {
            d,
            params: Vec::new(),
        }
    }

    pub fn dialect(&self) -> &'d dyn Dialect {
        self.d
    }

    /// Adds a parameter; its placeholder.
    pub fn push(&mut self, p: Param) -> String {
        self.params.push(p);
        self.d.placeholder(self.params.len())
    }

    pub fn finish(self, sql: String) -> Compiled {
        Compiled {
            sql,
            params: self.params,
        }
    }

    /// A template's condition on the row aliased `alias`. `key` (a batch's key column, or a
    /// parent's key in a nested statement) replaces its `id` argument; `bound` says whether
    /// its other arguments come from the request (a search) or are unbound (a relationship:
    /// see [`Unbound`]).
    pub fn predicate(
        &mut self,
        template: &QueryTemplate,
        alias: &str,
        key: Option<&str>,
        bound: bool,
    ) -> String {
        let d = self.d;
        let is_key = |name: &str| key.is_some() && name == "id";
        match &template.kind {
            TemplateKind::Filter(preds) if preds.is_empty() => d.truth(true).to_owned(),
            TemplateKind::Filter(preds) => {
                let mut out = String::new();
                for (i, (path, value)) in preds.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" AND ");
                    }
                    let rhs = match value {
                        ArgValue::Arg(name) if is_key(name) => key.unwrap_or_default().to_owned(),
                        ArgValue::Arg(name) if bound => self.push(Param::Arg {
                            name: name.clone(),
                            as_text: false,
                        }),
                        ArgValue::Arg(_) => self.push(Param::Literal(Value::Null)),
                        ArgValue::Literal(v) => self.push(Param::Literal(v.clone())),
                        ArgValue::Interpolated(pieces) if bound => {
                            self.push(Param::Render(pieces.clone()))
                        }
                        ArgValue::Interpolated(pieces) => self.push(Param::Literal(Value::String(
                            render(pieces, &Default::default()),
                        ))),
                    };
                    out.push_str(&d.field(path, alias));
                    out.push_str(" = ");
                    out.push_str(&rhs);
                }
                out
            }
            TemplateKind::Query(spec) if spec.conds.is_empty() => d.truth(true).to_owned(),
            TemplateKind::Query(spec) => {
                let mut ops = Operands {
                    b: self,
                    key,
                    bound,
                };
                let parts: Vec<String> = spec.conds.iter().map(|c| ops.cond(c, alias)).collect();
                parts.join(" AND ")
            }
            TemplateKind::Sql(pieces) => {
                let mut out = String::from("(");
                for p in pieces {
                    match p {
                        SqlPiece::Text(t) => out.push_str(t),
                        SqlPiece::Param { arg, .. } if is_key(arg) => {
                            out.push_str(key.unwrap_or_default())
                        }
                        SqlPiece::Param { arg, as_text } => {
                            let ph = if bound {
                                self.push(Param::Arg {
                                    name: arg.clone(),
                                    as_text: *as_text,
                                })
                            } else {
                                self.push(Param::Literal(Value::Null))
                            };
                            out.push_str(&d.fragment_param(ph, *as_text));
                        }
                    }
                }
                out.push(')');
                out
            }
        }
    }
}

/// The operands of one template's conditions: a statement's builder, the key replacing the
/// template's `id` argument, and whether its other arguments are bound.
pub struct Operands<'b, 'd> {
    b: &'b mut Builder<'d>,
    key: Option<&'b str>,
    bound: bool,
}

impl Operand for Operands<'_, '_> {
    /// `v` as an operand of `kind`: the key for the `id` argument of a relationship
    /// (`NULL` for a number, `'s'` for its type class: the key is text), the dialect's
    /// unbound form for the relationship's other arguments, else a new parameter.
    fn operand(&mut self, v: &ArgValue, kind: OperandKind) -> String {
        match v {
            ArgValue::Arg(name) if self.key.is_some() && name == "id" => match kind {
                OperandKind::Num => "NULL".to_owned(),
                OperandKind::Class => "'s'".to_owned(),
                _ => self.key.unwrap_or_default().to_owned(),
            },
            ArgValue::Arg(_) | ArgValue::Interpolated(_) if !self.bound => {
                match self.b.d.unbound() {
                    Unbound::BindEmpty => self.b.push(Param::Operand(kind, v.clone())),
                    Unbound::NullParam => self
                        .b
                        .push(Param::Operand(kind, ArgValue::Literal(Value::Null))),
                    Unbound::NullLiteral => "NULL".to_owned(),
                }
            }
            v => self.b.push(Param::Operand(kind, v.clone())),
        }
    }
}

impl Operands<'_, '_> {
    /// A list operand (`$in`, `$nin`): the key's list, the dialect's unbound form, or a
    /// new parameter.
    fn list(&mut self, l: &ListValue) -> String {
        let d = self.b.d;
        let unbound = (!self.bound).then(|| d.unbound());
        match (l, unbound) {
            (ListValue::Arg(name), _) if self.key.is_some() && name == "id" => {
                d.list_of_key(self.key.unwrap_or_default())
            }
            (_, None | Some(Unbound::BindEmpty)) => self.b.push(Param::List(l.clone())),
            (ListValue::Arg(_), Some(Unbound::NullLiteral)) => match d.bind_style().lists {
                Lists::JsonText => "'[]'".to_owned(),
                Lists::TextArray => "'{}'".to_owned(),
            },
            (ListValue::Arg(_), Some(_)) => self.b.push(Param::List(ListValue::Items(Vec::new()))),
            // a relationship's template: only its literal items are bound
            (ListValue::Items(items), Some(_)) => self.b.push(Param::List(ListValue::Items(
                items
                    .iter()
                    .filter(|i| matches!(i, ArgValue::Literal(_)))
                    .cloned()
                    .collect(),
            ))),
        }
    }

    /// One condition of an operator template (semantics: `meshql_core::template::Cond`).
    pub fn cond(&mut self, cond: &Cond, alias: &str) -> String {
        let d = self.b.d;
        match cond {
            Cond::Cmp { path, op, value } => match op {
                CmpOp::Eq | CmpOp::Ne => {
                    let lhs = d.field(path, alias);
                    let (kind, cast) = d.eq_operand();
                    let rhs = self.operand(value, kind);
                    let test = format!("{lhs} = {rhs}{cast}");
                    match op {
                        CmpOp::Eq => test,
                        _ => d.is_not_true(&test),
                    }
                }
                _ => d.range(self, path, *op, value, alias),
            },
            Cond::In { path, list, negate } => {
                let lhs = d.field(path, alias);
                let list = self.list(list);
                let test = d.in_list(&lhs, &list);
                if *negate {
                    d.is_not_true(&test)
                } else {
                    test
                }
            }
            Cond::Regex {
                path,
                pattern,
                ignore_case,
            } => d.regex(self, path, pattern, *ignore_case, alias),
            Cond::Exists { path, exists } => match path {
                FieldPath::Id => d.truth(*exists).to_owned(),
                FieldPath::Payload(_) => d.exists(path, *exists, alias),
            },
            Cond::And(cs) | Cond::Or(cs) => {
                let joiner = if matches!(cond, Cond::And(_)) {
                    " AND "
                } else {
                    " OR "
                };
                let parts: Vec<String> = cs.iter().map(|c| self.cond(c, alias)).collect();
                format!("({})", parts.join(joiner))
            }
        }
    }
}
