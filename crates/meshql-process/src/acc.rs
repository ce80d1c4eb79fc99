//! Aggregates as mergeable accumulators.
//!
//! Every aggregate of a projection field is an [`Acc`]. One input contributes a *piece* (the
//! accumulator of that input alone, [`Aggregate::piece`]); a group's value is the merge of
//! its inputs' pieces. `merge` is associative and commutative, so a group can be folded in
//! any order, incrementally as inputs arrive or from scratch from the stored pieces.
//!
//! Undoing a piece (an input updated or deleted): count, sum, average, ratio and distinct
//! count are *invertible* — the piece is subtracted ([`Acc::unmerge`]). Min, max, last and
//! windowed aggregates are not (the runner-up is not kept); the group is then folded again
//! from its remaining pieces.

use crate::time::civil_from_days;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// A calendar window (UTC) of a windowed aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Day,
    /// ISO weeks, starting on Monday.
    Week,
    Month,
}

const DAY_MS: i64 = 86_400_000;

impl Window {
    /// The index of the window holding `ms` (days, weeks or months since the epoch).
    pub fn index(self, ms: i64) -> i64 {
        let day = ms.div_euclid(DAY_MS);
        match self {
            Window::Day => day,
            // 1970-01-01 was a Thursday: day 4 of its ISO week
            Window::Week => (day + 3).div_euclid(7),
            Window::Month => {
                let (y, m, _) = civil_from_days(day);
                y * 12 + (m as i64 - 1)
            }
        }
    }
}

/// A sum that stays an integer while every piece is one.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Num {
    #[serde(default)]
    pub i: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub f: f64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub float: bool,
}

fn is_zero(f: &f64) -> bool {
    *f == 0.0
}

impl Num {
    pub fn of(v: &Value) -> Option<Num> {
        if let Some(i) = v.as_i64() {
            return Some(Num {
                i,
                f: 0.0,
                float: false,
            });
        }
        v.as_f64().map(|f| Num {
            i: 0,
            f,
            float: true,
        })
    }

    fn add(self, o: Num) -> Num {
        Num {
            i: self.i.wrapping_add(o.i),
            f: self.f + o.f,
            float: self.float || o.float,
        }
    }

    fn sub(self, o: Num) -> Num {
        Num {
            i: self.i.wrapping_sub(o.i),
            f: self.f - o.f,
            float: self.float || o.float,
        }
    }

    fn neg(self) -> Num {
        Num {
            i: -self.i,
            f: -self.f,
            float: self.float,
        }
    }

    pub fn as_f64(self) -> f64 {
        self.i as f64 + self.f
    }

    pub fn value(self) -> Value {
        if self.float {
            crate::expr::number(self.as_f64())
        } else {
            Value::from(self.i)
        }
    }
}

/// Orders JSON values for min and max: numbers by value, then strings, then anything else
/// by its text.
pub fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&y.as_f64().unwrap_or(0.0)),
        (Value::Number(_), _) => Ordering::Less,
        (_, Value::Number(_)) => Ordering::Greater,
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::String(_), _) => Ordering::Less,
        (_, Value::String(_)) => Ordering::Greater,
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// An aggregate's state, or one input's piece of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Acc {
    Count {
        n: i64,
    },
    Sum {
        s: Num,
    },
    Min {
        v: Option<Value>,
    },
    Max {
        v: Option<Value>,
    },
    /// The value of the input last in `(time, position)` order.
    Last {
        at: Option<(i64, u64)>,
        v: Value,
    },
    Avg {
        s: Num,
        n: i64,
    },
    /// `num / den`: the share of the field's total held by inputs that match a filter.
    Ratio {
        num: Num,
        den: Num,
    },
    /// How many times each distinct value was seen.
    Distinct {
        seen: BTreeMap<String, i64>,
    },
    /// Only the pieces of the newest window count.
    Window {
        start: i64,
        inner: Box<Acc>,
    },
}

impl Acc {
    /// Whether a piece can be subtracted ([`Acc::unmerge`]).
    pub fn invertible(&self) -> bool {
        matches!(
            self,
            Acc::Count { .. }
                | Acc::Sum { .. }
                | Acc::Avg { .. }
                | Acc::Ratio { .. }
                | Acc::Distinct { .. }
        )
    }

    /// Adds `piece` (an accumulator of the same aggregate).
    pub fn merge(&mut self, piece: &Acc) {
        match (self, piece) {
            (Acc::Count { n }, Acc::Count { n: m }) => *n += m,
            (Acc::Sum { s }, Acc::Sum { s: t }) => *s = s.add(*t),
            (Acc::Min { v }, Acc::Min { v: Some(w) })
                if v.as_ref().is_none_or(|v| compare(w, v) == Ordering::Less) =>
            {
                *v = Some(w.clone());
            }
            (Acc::Max { v }, Acc::Max { v: Some(w) })
                if v.as_ref()
                    .is_none_or(|v| compare(w, v) == Ordering::Greater) =>
            {
                *v = Some(w.clone());
            }
            (Acc::Last { at, v }, Acc::Last { at: Some(b), v: w }) if at.is_none_or(|a| *b > a) => {
                *at = Some(*b);
                *v = w.clone();
            }
            (Acc::Avg { s, n }, Acc::Avg { s: t, n: m }) => {
                *s = s.add(*t);
                *n += m;
            }
            (Acc::Ratio { num, den }, Acc::Ratio { num: a, den: b }) => {
                *num = num.add(*a);
                *den = den.add(*b);
            }
            (Acc::Distinct { seen }, Acc::Distinct { seen: more }) => {
                for (k, c) in more {
                    *seen.entry(k.clone()).or_insert(0) += c;
                }
                seen.retain(|_, c| *c != 0);
            }
            (Acc::Window { start, inner }, Acc::Window { start: s, inner: i }) => {
                match (*s).cmp(start) {
                    Ordering::Greater => {
                        *start = *s;
                        *inner = i.clone();
                    }
                    Ordering::Equal => inner.merge(i),
                    Ordering::Less => {}
                }
            }
            _ => {}
        }
    }

    /// Subtracts `piece`; false when this aggregate cannot (fold the group again instead).
    pub fn unmerge(&mut self, piece: &Acc) -> bool {
        match (self, piece) {
            (Acc::Count { n }, Acc::Count { n: m }) => *n -= m,
            (Acc::Sum { s }, Acc::Sum { s: t }) => *s = s.sub(*t),
            (Acc::Avg { s, n }, Acc::Avg { s: t, n: m }) => {
                *s = s.sub(*t);
                *n -= m;
            }
            (Acc::Ratio { num, den }, Acc::Ratio { num: a, den: b }) => {
                *num = num.sub(*a);
                *den = den.sub(*b);
            }
            (Acc::Distinct { seen }, Acc::Distinct { seen: less }) => {
                for (k, c) in less {
                    *seen.entry(k.clone()).or_insert(0) -= c;
                }
                seen.retain(|_, c| *c != 0);
            }
            _ => return false,
        }
        true
    }

    /// The field's value (null: left out of the document).
    pub fn value(&self) -> Value {
        match self {
            Acc::Count { n } => Value::from(*n),
            Acc::Sum { s } => s.value(),
            Acc::Min { v } | Acc::Max { v } => v.clone().unwrap_or(Value::Null),
            Acc::Last { at, v } => {
                if at.is_some() {
                    v.clone()
                } else {
                    Value::Null
                }
            }
            Acc::Avg { s, n } => {
                if *n == 0 {
                    Value::Null
                } else {
                    crate::expr::number(s.as_f64() / *n as f64)
                }
            }
            Acc::Ratio { num, den } => {
                if den.as_f64() == 0.0 {
                    Value::Null
                } else {
                    crate::expr::number(num.as_f64() / den.as_f64())
                }
            }
            Acc::Distinct { seen } => Value::from(seen.len() as i64),
            Acc::Window { inner, .. } => inner.value(),
        }
    }
}

/// What kind of aggregate a field is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Count,
    Sum,
    Min,
    Max,
    Last,
    Avg,
    Ratio,
    CountDistinct,
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Count => "count",
            Kind::Sum => "sum",
            Kind::Min => "min",
            Kind::Max => "max",
            Kind::Last => "last",
            Kind::Avg => "avg",
            Kind::Ratio => "ratio",
            Kind::CountDistinct => "count_distinct",
        }
    }
}

/// A field's aggregate over one input entity, compiled from its declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    pub kind: Kind,
    /// The input field aggregated (`None` for `count`).
    pub of: Option<crate::FieldPath>,
    pub negate: bool,
    /// Only inputs whose fields hold one of the listed values count (`ratio`: count in the
    /// numerator).
    pub filter: Vec<(crate::FieldPath, Vec<Value>)>,
    /// Windowed: only the inputs of the newest window of `time` count.
    pub window: Option<(Window, crate::FieldPath)>,
    /// `count_distinct` of a time: the distinct windows it falls in.
    pub bucket: Option<Window>,
}

/// Why an input cannot be aggregated (it goes to the dead letters).
pub type PieceError = String;

impl Aggregate {
    /// The accumulator of no input.
    pub fn empty(&self) -> Acc {
        let inner = match self.kind {
            Kind::Count => Acc::Count { n: 0 },
            Kind::Sum => Acc::Sum { s: Num::default() },
            Kind::Min => Acc::Min { v: None },
            Kind::Max => Acc::Max { v: None },
            Kind::Last => Acc::Last {
                at: None,
                v: Value::Null,
            },
            Kind::Avg => Acc::Avg {
                s: Num::default(),
                n: 0,
            },
            Kind::Ratio => Acc::Ratio {
                num: Num::default(),
                den: Num::default(),
            },
            Kind::CountDistinct => Acc::Distinct {
                seen: BTreeMap::new(),
            },
        };
        match self.window {
            Some(_) => Acc::Window {
                start: i64::MIN,
                inner: Box::new(inner),
            },
            None => inner,
        }
    }

    fn matches(&self, input: &serde_json::Map<String, Value>) -> bool {
        self.filter.iter().all(|(path, allowed)| {
            let v = path.get(input).unwrap_or(&Value::Null);
            allowed.iter().any(|a| a == v)
        })
    }

    /// The piece one input contributes. `time_of` parses a time field (ms since the epoch);
    /// `position` orders inputs with the same time (`last`).
    pub fn piece(
        &self,
        input: &serde_json::Map<String, Value>,
        order: (i64, u64),
    ) -> Result<Acc, PieceError> {
        let matched = self.matches(input);
        let value = self
            .of
            .as_ref()
            .and_then(|p| p.get(input))
            .filter(|v| !v.is_null());
        let number = |v: Option<&Value>| -> Result<Option<Num>, PieceError> {
            match v {
                None => Ok(None),
                Some(v) => match Num::of(v) {
                    Some(n) => Ok(Some(if self.negate { n.neg() } else { n })),
                    None => Err(format!(
                        "`{}` is {v}, not a number",
                        self.of.as_ref().map(|p| p.text.as_str()).unwrap_or("")
                    )),
                },
            }
        };
        let mut piece = self.empty();
        let inner = match &mut piece {
            Acc::Window { start, inner } => {
                let (window, path) = self.window.as_ref().expect("windowed");
                let Some(t) = path.get(input).filter(|v| !v.is_null()) else {
                    return Err(format!("the time field `{}` is missing", path.text));
                };
                let ms = crate::time::parse_time(t)
                    .ok_or_else(|| format!("`{}` is {t}, not a time", path.text))?;
                *start = window.index(ms);
                &mut **inner
            }
            other => other,
        };
        match inner {
            Acc::Count { n } => *n = matched as i64,
            Acc::Sum { s } => {
                if let (true, Some(n)) = (matched, number(value)?) {
                    *s = n;
                }
            }
            Acc::Min { v } | Acc::Max { v } => {
                if matched {
                    *v = value.cloned();
                }
            }
            Acc::Last { at, v } => {
                if let (true, Some(value)) = (matched, value) {
                    *at = Some(order);
                    *v = value.clone();
                }
            }
            Acc::Avg { s, n } => {
                if let (true, Some(x)) = (matched, number(value)?) {
                    *s = x;
                    *n = 1;
                }
            }
            Acc::Ratio { num, den } => {
                if let Some(x) = number(value)? {
                    *den = x;
                    if matched {
                        *num = x;
                    }
                }
            }
            Acc::Distinct { seen } => {
                if let (true, Some(v)) = (matched, value) {
                    let key = match (self.bucket, v) {
                        (Some(window), v) => {
                            let ms = crate::time::parse_time(v).ok_or_else(|| {
                                format!(
                                    "`{}` is {v}, not a time",
                                    self.of.as_ref().map(|p| p.text.as_str()).unwrap_or("")
                                )
                            })?;
                            window.index(ms).to_string()
                        }
                        (None, Value::String(s)) => s.clone(),
                        (None, other) => other.to_string(),
                    };
                    seen.insert(key, 1);
                }
            }
            Acc::Window { .. } => unreachable!("windows do not nest"),
        }
        Ok(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn calendar_windows() {
        // 2024-03-04 was a Monday, 2024-03-10 a Sunday
        use crate::time::days_from_civil;
        let ms = |y, m, d| days_from_civil(y, m, d) * DAY_MS + 3_600_000;
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            Window::Week.index(ms(2024, 3, 4)),
            Window::Week.index(ms(2024, 3, 10))
        );
        assert_ne!(
            Window::Week.index(ms(2024, 3, 10)),
            Window::Week.index(ms(2024, 3, 11))
        );
        assert_eq!(
            Window::Month.index(ms(2024, 3, 1)),
            Window::Month.index(ms(2024, 3, 31))
        );
        assert_eq!(
            Window::Month.index(ms(2024, 4, 1)) - Window::Month.index(ms(2024, 3, 31)),
            1
        );
        assert_eq!(Window::Day.index(-1), -1, "before the epoch");
    }

    #[test]
    fn integer_sums_stay_integers() {
        let mut a = Acc::Sum { s: Num::default() };
        a.merge(&Acc::Sum {
            s: Num::of(&json!(3)).unwrap(),
        });
        assert_eq!(a.value(), json!(3));
        a.merge(&Acc::Sum {
            s: Num::of(&json!(0.5)).unwrap(),
        });
        assert_eq!(a.value(), json!(3.5));
    }

    fn arb_piece() -> impl Strategy<Value = Vec<Acc>> {
        (0i64..50, 0i64..3, 0u64..1000).prop_map(|(x, k, pos)| {
            vec![
                Acc::Count { n: 1 },
                Acc::Sum {
                    s: Num::of(&json!(x)).unwrap(),
                },
                Acc::Min { v: Some(json!(x)) },
                Acc::Max { v: Some(json!(x)) },
                Acc::Last {
                    at: Some((x, pos)),
                    v: json!(x),
                },
                Acc::Avg {
                    s: Num::of(&json!(x)).unwrap(),
                    n: 1,
                },
                Acc::Distinct {
                    seen: [(k.to_string(), 1)].into(),
                },
                Acc::Window {
                    start: k,
                    inner: Box::new(Acc::Sum {
                        s: Num::of(&json!(x)).unwrap(),
                    }),
                },
            ]
        })
    }

    fn empties() -> Vec<Acc> {
        vec![
            Acc::Count { n: 0 },
            Acc::Sum { s: Num::default() },
            Acc::Min { v: None },
            Acc::Max { v: None },
            Acc::Last {
                at: None,
                v: Value::Null,
            },
            Acc::Avg {
                s: Num::default(),
                n: 0,
            },
            Acc::Distinct {
                seen: BTreeMap::new(),
            },
            Acc::Window {
                start: i64::MIN,
                inner: Box::new(Acc::Sum { s: Num::default() }),
            },
        ]
    }

    fn fold(pieces: &[Vec<Acc>]) -> Vec<Value> {
        let mut accs = empties();
        for p in pieces {
            for (a, x) in accs.iter_mut().zip(p) {
                a.merge(x);
            }
        }
        accs.iter().map(Acc::value).collect()
    }

    proptest! {
        /// Folding in any order gives the same values, and removing a piece (by unmerge
        /// where possible) gives what a fold without it gives.
        #[test]
        fn merge_is_order_free_and_unmerge_undoes(
            pieces in proptest::collection::vec(arb_piece(), 1..20),
            drop in 0usize..20,
        ) {
            let mut reversed = pieces.clone();
            reversed.reverse();
            prop_assert_eq!(fold(&pieces), fold(&reversed));
            let drop = drop % pieces.len();
            let mut accs = empties();
            for p in &pieces {
                for (a, x) in accs.iter_mut().zip(p) {
                    a.merge(x);
                }
            }
            let mut rest = pieces.clone();
            let gone = rest.remove(drop);
            let want = fold(&rest);
            for (i, (a, x)) in accs.iter_mut().zip(&gone).enumerate() {
                if a.unmerge(x) {
                    prop_assert_eq!(a.value(), want[i].clone(), "aggregate {}", i);
                }
            }
        }
    }
}
