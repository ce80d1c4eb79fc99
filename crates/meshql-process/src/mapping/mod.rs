//! Declarative anti-corruption mappings (`type = "mapping"`): one legacy table's rows become
//! one clean entity's documents, declared field by field rather than coded.
//!
//! A mapping is a [`Transform`], so it runs in the
//! [`TransformPlanner`](crate::transform::TransformPlanner) like `rust` and `script`
//! processors: lanes by key, dead letters, and the output committed with the input's position
//! (exactly once). The rows come from a `source` (`postgres_cdc`, Debezium's envelope on
//! Kafka, …) as [`Input`]s whose `entity` is the table's name and whose `payload` is the row:
//! column name → JSON value. A number may arrive as JSON (`9840`: Debezium, `postgres_cdc`'s
//! integer columns) or as text (`"9840"`: a `VARCHAR` column, `numeric` in some feeds, a
//! text-only feed); every transformation below accepts both. What a declaration cannot express
//! belongs in a `rust` or `script` processor ([`crate::transform`]).
//!
//! [`Transform`]: crate::transform::Transform
//! [`Input`]: crate::plan::Input
//!
//! # The legacy `customer` (CONTRACT §14.2.3)
//!
//! ```toml
//! [[processor]]
//! name = "customers"
//! type = "mapping"
//! inputs = ["cust_acct"]           # the tables whose rows it reads
//! output = "customer"              # the clean entity it writes
//! source = { type = "postgres_cdc", url = "${LEGACY_URL}", publication = "meshql_legacy", tables = ["cust_acct"] }
//! # or Debezium's envelope from Kafka:
//! # source = { type = "kafka", brokers = "localhost:9092", topics = ["legacy.public.cust_acct"] }
//! # optional, as for `rust` and `script` processors: batch, parallel, key, enabled
//!
//! [processor.mapping]
//! table = "cust_acct"              # one of `inputs` (may be left out when there is one input)
//! key = ["acct_id"]                # the table's primary key columns
//!
//! [processor.mapping.fields]
//! legacy_acct_id = { int = "acct_id" }
//! account_number = "acct_num"
//! first_name = { title = "cust_nm_first" }
//! last_name = { title = "cust_nm_last" }
//! address = { concat = [{ title = "addr_ln1" }, { title = "addr_ln2" }], separator = ", ", omit_empty = true }
//! city = { title = "addr_city", omit_empty = true }
//! state = { copy = "addr_st", omit_empty = true }
//! zip = { copy = "addr_zip", omit_empty = true }
//! phone = { copy = "phone_num", omit_empty = true }
//! email = { lower = "email_addr", omit_empty = true }
//! rate_class = { code = "rt_cd", map = { RES = "residential", COM = "commercial", IND = "industrial" } }
//! service_type = { code = "svc_type", map = { E = "electric", G = "gas", B = "both" } }
//! status = { code = "stat_cd", map = { A = "active", S = "suspended", C = "closed" } }
//! connected_date = { date = "conn_dt", omit_empty = true }
//! disconnected_date = { date = "disc_dt", omit_empty = true }
//! budget_billing = { flag = "budget_flg" }
//! paperless = { flag = "paperless_flg" }
//! ```
//!
//! A child's foreign key is computed from its own columns, so it equals the parent's id
//! whichever row arrives first: `customer_id = { reference = "cust_acct", key = ["acct_id"],
//! omit_empty = true }` in the `mtr_rdng`, `bill_hdr` and `pymt_hist` mappings.
//!
//! # Documents and ids
//!
//! - The document's id is [`legacy_id`]`(table, key values)`: a UUIDv5 in the namespace
//!   [`LEGACY_NAMESPACE`] of the JSON text `["<table>","<key 1>",…]` (the table in lower case,
//!   each key value as [`key_text`] writes it, no spaces: `["cust_acct","1"]`). An insert and
//!   every later update of a row write versions of one document, and a replay rewrites the same
//!   ones.
//! - **Key values are compared as text**: a JSON number is its decimal digits (`1`, and `1.0`
//!   too, give `"1"`), a string its text without trailing spaces (`CHAR(n)` pads with them), a
//!   boolean `true` / `false`. So `pgoutput`'s `"1"` and Debezium's `1` give one id, and so do a
//!   `CHAR(10)` key and the `VARCHAR` column that refers to it. Text is never read as a number:
//!   `"007"` and `"7"` stay two keys (a `VARCHAR` key may hold both). A null, missing, object or
//!   array key value is an error (a dead letter).
//! - Create and update → the document (`Emit { id: Some(id), payload: Some(doc) }`); delete →
//!   its tombstone (`payload: None`), the id computed from the key columns of the deleted row
//!   (only those are read). A row whose key changes arrives as a delete of the old key and a
//!   create of the new one (Debezium does so; a source must do the same).
//! - Changes of an input other than `table` (compared without regard to ASCII case) lead to
//!   nothing.
//! - Unless the processor sets `key` (the payload field its lanes follow, see
//!   [`crate::transform`]), it is the first key column, so one row's changes keep their order
//!   under `parallel > 1`.
//!
//! # Fields
//!
//! Each entry of `[processor.mapping.fields]` is an output field: a column name (a copy under a
//! new name), or an inline table with exactly one transformation and its options.
//!
//! | Transformation | Result |
//! |---|---|
//! | `"col"`, `{ copy = "col" }` | the value as it is (text without its trailing spaces) |
//! | `{ title = "col" }` | §14.2.3's `title`: lower-cased, then the first character and each one after a space, `-` or `'` upper-cased: `O'NEIL-SMITH` → `O'Neil-Smith`, `1ST` → `1st`, `MCDONALD` → `Mcdonald` |
//! | `{ lower = "col" }` | lower-cased text |
//! | `{ int = "col" }` | a JSON integer, from a number or numeric text (`"9840"`, `"12.0"`); a fraction or non-numeric text is an error |
//! | `{ number = "col" }` | a JSON number from a number or numeric text (`"12.5"` → `12.5`, `"7"` → `7`) |
//! | `{ cents = "col" }` | a whole number of cents as a decimal amount: `9840` → `98.4`, `42000` → `420.0` (a JSON float) |
//! | `{ date = "col", format = "YYYYMMDD" }` | `YYYY-MM-DD`. `format` (default `YYYYMMDD`) places `YYYY`, `MM` and `DD` once each among separators that are not letters (`DD.MM.YYYY`, `MM/DD/YYYY`); text of another length, or whose separators differ, is null. As §14.2.3's `date`, the digits are taken by position and not checked |
//! | `{ datetime = ["date_col", "time_col"], format = "YYYYMMDD" }` | §14.3's `ts`: `YYYY-MM-DDTHH:MM:SSZ` from a date as `date` reads it and an `HHMMSS` time; a time that is not 6 characters (null included), or no time column, is `00:00:00`; a null date is null |
//! | `{ flag = "col", true_value = "Y" }` | `true` when the text is `true_value` (default `"Y"`), else `false` — null too |
//! | `{ code = "col", map = { A = "active", … }, unknown = … }` | the map's value for the code (the text of the column: an integer column's `1` is the code `"1"`). A code not in the map: `unknown = "dead_letter"` (the default) makes the row a dead letter naming the field, column and code; `unknown = { default = X }` gives X |
//! | `{ concat = [part, …], separator = ", " }` | the parts' texts joined with `separator` (default `""`), the null and empty ones left out (so `title(LN1) + ", " + title(LN2)` only when LN2 is set); null when every part is. A part is a column name or a transformation (`{ title = "addr_ln1" }`) |
//! | `{ add = ["a", "b", …] }`, `{ subtract = ["a", "b", …] }` | the sum; the first minus the others. Integers when every operand is one, else a float; null when any operand is null |
//! | `{ reference = "table", key = ["col", …] }` | a computed foreign key: the id [`legacy_id`] gives the row of `table` whose key is these columns' values in this row; null when any of them is null or empty. A key item may be a constant instead of a column: `key = ["mandt", { value = "1000" }]` |
//! | `{ lookup = "entity", id = <column or transformation>, field = "f", wait_ms = 30000 }` | the field `f` of the current document `id` of the clean `entity` (written by another processor, or through the API): what the row does not hold but its parent's clean document does — §14.3's lay report takes its hen's `coop_id` with `id = { reference = "zequi_hen", key = ["mandt", "equnr"] }`. A document that does not exist yet is waited for, up to `wait_ms` (default 30,000, at most 600,000; the batch waits with it, so the rows keep their order), then the row is a dead letter naming it; a null id gives null. The value is read when the row is processed: a later change of the parent does not change documents already written. A field of its own (not a part of `concat`, nor a lookup's `id`) |
//!
//! Options every field takes:
//! - `default = X`: the field's value when the transformation's result is null.
//! - `omit_empty = true`: leave the field out when its value (after `default`) is null or `""`.
//!
//! **Nulls.** A column that is null or absent from the row makes the transformation's result
//! null (`flag` excepted: `false`), so the field is written as `null`, unless `default` or
//! `omit_empty` says otherwise. Blank text (only spaces) counts as null for the numeric
//! transformations (`int`, `number`, `cents`, `add`, `subtract`) and for `reference`. Column
//! names match exactly, else without regard to ASCII case (`ACCT_ID` finds `acct_id`). A
//! misspelt column therefore reads as null, not as an error (the legacy schema is not known
//! when the config is checked). An update that leaves a column out reads it as null too:
//! PostgreSQL logs an unchanged large (TOASTed) value only under `REPLICA IDENTITY FULL`, so
//! give tables with such columns that identity.
//!
//! **Text.** Every text value is read without its trailing spaces (`CHAR(n)` columns pad with
//! them); leading spaces are kept. A number read as text is its digits as in key values.
//!
//! **Errors** (the row becomes a dead letter with the message, and the processor goes on): a key
//! column that is null or missing; a value that is not numeric where a number is needed, or not
//! whole where an integer is (`int`, `cents`); an unknown code under `unknown = "dead_letter"`;
//! an object or array where text is needed. Each names the field, the column and the value.
//!
//! **Checked with the config** (each error names its field, e.g.
//! `mapping.fields.rate_class.map`): the output entity exists and has each field (when its JSON
//! Schema lists properties); `id` is not a field; `table` is one of `inputs`; without a `source`,
//! the inputs are entities of the service; `key` and every `reference`'s `key` name at least one
//! column; every transformation is known (the message lists them) and takes the options given;
//! `code` has a non-empty `map`; a date `format` has `YYYY`, `MM` and `DD` once each; a
//! `lookup`'s entity exists and has its `field`. Against the output's JSON Schema, where its
//! property declares them: the JSON type a transformation makes (`flag` a boolean, `int` an
//! integer, `cents` and `number` a number, the text ones a string), and each value of a code
//! table, its `unknown` default and a field's `default` against the property's `type` and
//! `enum` (`copy`, `lookup`, `add` and `subtract` make what the data holds, so they are not
//! checked). Across the config's mappings: a `reference` to a table another mapping reads gives
//! as many key values as that mapping's `key` has (else its ids could never match). `meshql
//! check` also asks the legacy database, when it can reach it, whether every column a mapping
//! names exists.

mod checks;
mod eval;
mod expression;
mod ids;
mod row;
mod rules;
mod transform;

#[cfg(test)]
mod tests;

pub use checks::value_fits;
pub use eval::title;
pub use expression::Expression;
pub use meshql_core::legacy_id::{key_text, legacy_id, LEGACY_NAMESPACE};
pub use rules::TRANSFORMATIONS;
pub use transform::Mapping;

use crate::transform::{TransformSpec, MAX_PARALLEL};
use crate::EntityInfo;
use meshql_core::{parse_settings, SettingError};
use rules::err;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    inputs: Vec<String>,
    output: String,
    #[serde(default)]
    batch: Option<usize>,
    #[serde(default)]
    parallel: Option<usize>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
    mapping: Map<String, Value>,
}

fn yes() -> bool {
    true
}

/// Checks a `type = "mapping"` processor; `has_source`: it reads a `source` (its inputs are
/// legacy tables), else the service's change log (its inputs must be entities).
pub fn compile(
    name: &str,
    settings: &Value,
    entities: &[EntityInfo],
    has_source: bool,
) -> Result<TransformSpec, SettingError> {
    let s: Settings = parse_settings(settings)?;
    let names = || {
        entities
            .iter()
            .map(|x| x.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let output = entities
        .iter()
        .find(|e| e.name == s.output)
        .ok_or_else(|| {
            err(
                "output",
                format!(
                    "unknown entity `{}` (this config has: {})",
                    s.output,
                    names()
                ),
            )
        })?;
    if s.inputs.is_empty() {
        return Err(err("inputs", "name the table(s) whose rows it reads"));
    }
    for (i, input) in s.inputs.iter().enumerate() {
        if input.trim().is_empty() {
            return Err(err(format!("inputs[{i}]"), "a table's name"));
        }
        if !has_source && !entities.iter().any(|e| e.name == *input) {
            return Err(err(
                format!("inputs[{i}]"),
                format!(
                    "unknown entity `{input}` (this config has: {}); a mapping of legacy tables \
                     reads them from a `source`",
                    names()
                ),
            ));
        }
    }
    if let Some(b) = s.batch {
        if !(1..=10_000).contains(&b) {
            return Err(err("batch", "must be between 1 and 10000"));
        }
    }
    let parallel = s.parallel.unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        return Err(err(
            "parallel",
            format!("must be between 1 and {MAX_PARALLEL}"),
        ));
    }
    if let Some(k) = &s.key {
        if k.trim().is_empty() {
            return Err(err(
                "key",
                "name the payload field whose value orders the inputs",
            ));
        }
    }
    let mut block = s.mapping;
    match block.get("table") {
        None if s.inputs.len() == 1 => {
            block.insert("table".into(), Value::String(s.inputs[0].clone()));
        }
        None => {
            return Err(err(
                "mapping.table",
                format!(
                    "name the table it maps: one of the inputs ({})",
                    s.inputs.join(", ")
                ),
            ))
        }
        Some(Value::String(t)) if !s.inputs.contains(t) => {
            return Err(err(
                "mapping.table",
                format!(
                    "`{t}` is not one of the inputs ({}): the mapping would never see a row",
                    s.inputs.join(", ")
                ),
            ))
        }
        Some(_) => {}
    }
    let mapping = Mapping::new(&Value::Object(block), output, entities)?;
    Ok(TransformSpec {
        name: name.to_owned(),
        kind: "mapping",
        inputs: s.inputs,
        output: s.output,
        batch: s.batch.unwrap_or(100),
        parallel,
        key: s.key.or_else(|| mapping.key().first().cloned()),
        enabled: s.enabled,
        transform: Arc::new(mapping),
        source: None,
    })
}
