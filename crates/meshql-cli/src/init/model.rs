//! From tables to entities: fields with their JSON Schema and SDL types, root queries,
//! resolvers and, with `--acl`, the mapping of each field from the table's columns.

use super::acl::acl_fields;
pub use super::fields::Field;
use super::fields::{enum_values, link_names, Link};
use super::introspect::{Catalog, Column, Kind, Table};
use super::names::{camel, clean, ident, pascal, plural, type_name, unique};
use serde_json::{json, Map, Value};

/// A root query binding `{"payload.<field>": "{{<arg>}}"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub name: String,
    pub arg: String,
    pub arg_type: String,
    pub field: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Resolver {
    pub name: String,
    pub key: String,
    pub query: String,
    /// The entity it resolves (an index into [`Model::entities`]).
    pub target: usize,
    pub list: bool,
}

/// `--acl`: where the entity's documents come from.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    /// The table as `postgres_cdc` names it (`name`, or `schema.name` outside `public`).
    pub table: String,
    pub key: Vec<String>,
    pub publication: String,
    pub slot: String,
    /// Comment lines for columns left out.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entity {
    pub name: String,
    pub type_name: String,
    pub table: Table,
    pub fields: Vec<Field>,
    /// Singletons besides `getById`.
    pub singletons: Vec<Query>,
    /// Vectors besides `getAll`.
    pub vectors: Vec<Query>,
    pub resolvers: Vec<Resolver>,
    pub mapping: Option<Mapping>,
}

impl Entity {
    #[cfg(test)]
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The guessed transformations.
    pub fn reviews(&self) -> usize {
        self.fields.iter().filter(|f| f.review.is_some()).count()
    }
}

#[derive(Debug, Default)]
pub struct Model {
    pub entities: Vec<Entity>,
    /// Tables not generated, and why.
    pub skipped: Vec<(String, String)>,
}

/// Whether `postgres_cdc` can name the table (an unquoted identifier in lower case, its
/// schema too).
fn capturable(t: &Table) -> bool {
    let ok = |s: &str| {
        let mut chars = s.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$')
            && s.len() <= 63
    };
    ok(&t.name) && ok(&t.schema)
}

/// Builds the entities of `catalog`'s tables (`acl`: the clean side of a mapping each).
pub fn build(catalog: Catalog, acl: bool) -> Model {
    let mut model = Model {
        entities: Vec::new(),
        skipped: catalog.skipped,
    };
    let mut tables = Vec::new();
    for t in catalog.tables {
        if acl && t.primary_key.is_empty() {
            model.skipped.push((
                t.label(),
                "no primary key: change capture cannot tell its rows apart (add one, or map \
                 the table with a `script` processor)"
                    .into(),
            ));
        } else if acl && !capturable(&t) {
            model.skipped.push((
                t.label(),
                "a quoted (mixed-case) name, which the postgres_cdc source cannot capture yet"
                    .into(),
            ));
        } else {
            tables.push(t);
        }
    }
    let mut entity_names: Vec<String> = Vec::new();
    for t in &tables {
        let base = if acl { clean(&t.name) } else { ident(&t.name) };
        // `/_meshql…` paths and `_meshql…` tables are the server's
        let base = match base.trim_start_matches('_') {
            "" => "table".to_owned(),
            b => b.to_owned(),
        };
        let name = unique(&base, "_", |c| entity_names.iter().any(|n| n == c));
        entity_names.push(name);
    }
    let mut links = find_links(&tables, acl);
    let mut entities: Vec<Entity> = Vec::new();
    let mut publications: Vec<String> = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let name = entity_names[i].clone();
        let own: Vec<usize> = (0..links.len()).filter(|l| links[*l].child == i).collect();
        let fields = if acl {
            acl_fields(t, &own, &mut links, &entity_names, &tables)
        } else {
            plain_fields(t, &own, &mut links, &entity_names)
        };
        let mapping = acl.then(|| {
            // room for a slot suffix (LEGACY_SLOT_SUFFIX) within PostgreSQL's 63 characters
            let base: String = format!("meshql_{name}").chars().take(40).collect();
            let publication = unique(&base, "_", |c| publications.iter().any(|p| p == c));
            publications.push(publication.clone());
            Mapping {
                table: t.label(),
                key: t.primary_key.clone(),
                slot: publication.clone(),
                publication,
                notes: t
                    .columns
                    .iter()
                    .filter(|c| c.generated)
                    .map(|c| {
                        format!(
                            "{}: a generated column, not in the change stream (left out)",
                            c.name
                        )
                    })
                    .collect(),
            }
        });
        let mut entity = Entity {
            type_name: unique(&type_name(&name), "", |c| {
                entities.iter().any(|e: &Entity| e.type_name == c)
            }),
            name,
            table: t.clone(),
            fields,
            singletons: Vec::new(),
            vectors: Vec::new(),
            resolvers: Vec::new(),
            mapping,
        };
        entity.singletons = unique_singletons(&entity);
        entities.push(entity);
    }
    add_relationships(&mut entities, &links);
    model.entities = entities;
    model
}

fn find_links(tables: &[Table], acl: bool) -> Vec<Link> {
    let mut links = Vec::new();
    for (ci, t) in tables.iter().enumerate() {
        for (fi, fk) in t.foreign_keys.iter().enumerate() {
            let Some(pi) = tables
                .iter()
                .position(|p| p.schema == fk.ref_schema && p.name == fk.ref_table)
            else {
                continue;
            };
            let parent = &tables[pi];
            let key = if acl {
                // the parent's document id derives from its primary key: the reference is
                // computed from the child's columns in the primary key's order
                let mut key = Vec::new();
                for pk in &parent.primary_key {
                    match fk.ref_columns.iter().position(|r| r == pk) {
                        Some(at) => key.push(fk.columns[at].clone()),
                        None => break,
                    }
                }
                if key.len() != parent.primary_key.len()
                    || fk.ref_columns.len() != parent.primary_key.len()
                {
                    continue;
                }
                key
            } else {
                fk.columns.clone()
            };
            links.push(Link {
                child: ci,
                fk: fi,
                parent: pi,
                key,
                ambiguous: false,
                field: String::new(),
                role: String::new(),
            });
        }
    }
    for i in 0..links.len() {
        let same = links
            .iter()
            .filter(|l| l.child == links[i].child && l.parent == links[i].parent)
            .count();
        links[i].ambiguous = same > 1 || links[i].child == links[i].parent;
    }
    links
}

/// The fields of a plain entity: one per column (foreign keys to generated tables hold the
/// parent document's id).
fn plain_fields(
    t: &Table,
    own: &[usize],
    links: &mut [Link],
    entity_names: &[String],
) -> Vec<Field> {
    let mut fields: Vec<Field> = Vec::new();
    for c in &t.columns {
        for &l in own {
            let fk = &t.foreign_keys[links[l].fk];
            if fk.columns.first() != Some(&c.name) {
                continue;
            }
            let (base, role) = link_names(t, &links[l], &entity_names[links[l].parent], false);
            let name = unique(&base, "_", |n| {
                n == "id" || fields.iter().any(|f| f.name == n)
            });
            let required = fk.columns.iter().all(|col| {
                t.column(col)
                    .is_some_and(|c| c.not_null && c.default.is_none())
            });
            fields.push(Field {
                name: name.clone(),
                schema: json!({
                    "type": "string",
                    "format": "uuid",
                    "$comment": format!(
                        "the id of a {} document (foreign key {} ({}) to {})",
                        entity_names[links[l].parent],
                        fk.name,
                        fk.columns.join(", "),
                        fk.ref_table
                    ),
                }),
                gql: "ID".into(),
                required,
                column: None,
                mapping: None,
                review: None,
            });
            links[l].field = name;
            links[l].role = role;
        }
        let covered = own.iter().any(|&l| {
            let fk = &t.foreign_keys[links[l].fk];
            fk.columns.contains(&c.name)
                && (fk.columns.len() == 1 || !t.primary_key.contains(&c.name))
        });
        if covered {
            continue;
        }
        let base = match ident(&c.name) {
            n if n == "id" => "legacy_id".to_owned(),
            n => n,
        };
        let name = unique(&base, "_", |n| fields.iter().any(|f| f.name == n));
        let (mut schema, gql) = plain_schema(c);
        if t.primary_key.contains(&c.name) && c.numbered() {
            schema["$comment"] = json!(format!(
                "the table's key ({}, numbered by the database): documents have an `id` of \
                 their own",
                c.sql_type
            ));
        }
        fields.push(Field {
            name,
            schema,
            gql,
            required: c.not_null && c.default.is_none() && !c.identity && !c.generated,
            column: Some(c.name.clone()),
            mapping: None,
            review: None,
        });
    }
    fields
}

/// A column's JSON Schema and SDL type in a plain entity.
fn plain_schema(c: &Column) -> (Value, String) {
    let (mut item, gql) = match &c.kind {
        Kind::Int(bits) => {
            let mut s = json!({"type": "integer"});
            if *bits < 64 {
                let max = (1i64 << (bits - 1)) - 1;
                s["minimum"] = json!(-max - 1);
                s["maximum"] = json!(max);
            }
            (s, "Int")
        }
        Kind::Numeric => (
            json!({"type": "number", "$comment": c.sql_type.trim_end_matches("[]")}),
            "Float",
        ),
        Kind::Float => (json!({"type": "number"}), "Float"),
        Kind::Bool => (json!({"type": "boolean"}), "Boolean"),
        Kind::Text => {
            let mut s = json!({"type": "string"});
            if let Some(n) = c.max_length {
                s["maxLength"] = json!(n);
            }
            (s, "String")
        }
        Kind::Date => (json!({"type": "string", "format": "date"}), "String"),
        Kind::Timestamp { .. } => (json!({"type": "string", "format": "date-time"}), "String"),
        Kind::Time => (
            json!({"type": "string", "$comment": "a time of day (HH:MM:SS)"}),
            "String",
        ),
        Kind::Uuid => (json!({"type": "string", "format": "uuid"}), "ID"),
        Kind::Json => (json!({"$comment": c.sql_type.clone()}), "JSON"),
        Kind::Enum(labels) => (json!({"type": "string", "enum": labels}), "String"),
        Kind::Other(t) => (
            json!({"type": "string", "$comment": format!("PostgreSQL {t}, as text")}),
            "String",
        ),
    };
    if let Some(allowed) = &c.allowed {
        item["enum"] = enum_values(allowed, c);
    }
    if c.array {
        (json!({"type": "array", "items": item}), format!("[{gql}]"))
    } else {
        (item, gql.to_owned())
    }
}

/// `getBy<Field>` singletons for single-column unique constraints (and a primary key that
/// is not numbered by the database) whose field is the column's text.
fn unique_singletons(e: &Entity) -> Vec<Query> {
    let mut keys: Vec<&Vec<String>> = e.table.uniques.iter().collect();
    if e.table.primary_key.len() == 1
        && e.table
            .column(&e.table.primary_key[0])
            .is_some_and(|c| !c.numbered())
    {
        keys.push(&e.table.primary_key);
    }
    let mut out: Vec<Query> = Vec::new();
    for k in keys {
        let [col] = k.as_slice() else { continue };
        let Some(f) = e
            .fields
            .iter()
            .find(|f| f.column.as_deref() == Some(col.as_str()) && f.gql == "String")
        else {
            continue;
        };
        let name = format!("getBy{}", pascal(&f.name));
        if name == "getById" || out.iter().any(|q| q.name == name) {
            continue;
        }
        out.push(Query {
            name,
            arg: f.name.clone(),
            arg_type: "String".into(),
            field: f.name.clone(),
        });
    }
    out
}

/// For each link: the child's `getBy<Role>` vector and resolver to its parent, and the
/// parent's resolver to its children.
fn add_relationships(entities: &mut [Entity], links: &[Link]) {
    for link in links {
        if link.field.is_empty() {
            continue;
        }
        let child_name = entities[link.child].name.clone();
        let child = &mut entities[link.child];
        let query_base = format!("getBy{}", pascal(&link.role));
        let query = unique(&query_base, "", |q| {
            q == "getById"
                || q == "getAll"
                || child.singletons.iter().any(|s| s.name == q)
                || child.vectors.iter().any(|s| s.name == q)
        });
        child.vectors.push(Query {
            name: query.clone(),
            arg: "id".into(),
            arg_type: "ID".into(),
            field: link.field.clone(),
        });
        let name = free_field(child, &camel(&link.role));
        child.resolvers.push(Resolver {
            name,
            key: link.field.clone(),
            query: "getById".into(),
            target: link.parent,
            list: false,
        });
        let children = plural(&child_name);
        let base = if link.ambiguous {
            format!("{}By{}", camel(&children), pascal(&link.role))
        } else {
            camel(&children)
        };
        let parent = &mut entities[link.parent];
        let name = free_field(parent, &base);
        parent.resolvers.push(Resolver {
            name,
            key: "id".into(),
            query,
            target: link.child,
            list: true,
        });
    }
}

/// `base`, or `base2`, … : a name no field or resolver of `e` has.
fn free_field(e: &Entity, base: &str) -> String {
    unique(base, "", |n| {
        n == "id" || e.fields.iter().any(|f| f.name == n) || e.resolvers.iter().any(|r| r.name == n)
    })
}

/// The JSON Schema of an entity's documents.
pub fn json_schema(e: &Entity, acl: bool) -> Value {
    let mut properties = Map::new();
    properties.insert("id".into(), json!({"type": "string"}));
    for f in &e.fields {
        properties.insert(f.name.clone(), f.schema.clone());
    }
    let required: Vec<&str> = e
        .fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.name.as_str())
        .collect();
    let description = if acl {
        format!(
            "Clean documents of the legacy table {} (written by its mapping); generated by \
             meshql init: review",
            e.table.label()
        )
    } else {
        format!(
            "Documents shaped like the rows of table {}; generated by meshql init: review",
            e.table.label()
        )
    };
    let mut schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": e.type_name,
        "description": description,
        "type": "object",
        "properties": properties,
    });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema["additionalProperties"] = json!(false);
    schema
}

#[cfg(test)]
mod tests {
    use super::super::introspect::{Allowed, ForeignKey};
    use super::*;

    fn col(name: &str, sql_type: &str, kind: Kind, not_null: bool) -> Column {
        let max_length = sql_type
            .split_once('(')
            .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
            .filter(|_| kind == Kind::Text);
        Column {
            name: name.into(),
            sql_type: sql_type.into(),
            kind,
            array: false,
            not_null,
            max_length,
            default: None,
            identity: false,
            generated: false,
            allowed: None,
            sample: None,
        }
    }

    fn serial(name: &str) -> Column {
        Column {
            default: Some(format!("nextval('{name}_seq'::regclass)")),
            ..col(name, "integer", Kind::Int(32), true)
        }
    }

    fn table(name: &str, columns: Vec<Column>, pk: &[&str]) -> Table {
        Table {
            schema: "public".into(),
            name: name.into(),
            columns,
            primary_key: pk.iter().map(|s| (*s).to_owned()).collect(),
            foreign_keys: Vec::new(),
            uniques: Vec::new(),
        }
    }

    fn fk(name: &str, cols: &[&str], parent: &str, ref_cols: &[&str]) -> ForeignKey {
        ForeignKey {
            name: name.into(),
            columns: cols.iter().map(|s| (*s).to_owned()).collect(),
            ref_schema: "public".into(),
            ref_table: parent.into(),
            ref_columns: ref_cols.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn legacy() -> Catalog {
        let text = |n: &str, len: u32, nn: bool| {
            col(n, &format!("character varying({len})"), Kind::Text, nn)
        };
        let mut cust = table(
            "cust_acct",
            vec![
                serial("acct_id"),
                text("acct_num", 12, true),
                text("cust_nm_first", 30, true),
                text("email_addr", 60, false),
                Column {
                    sample: Some(Ok(vec!["A".into(), "C".into(), "S".into()])),
                    ..text("stat_cd", 1, true)
                },
                text("conn_dt", 8, true),
                text("disc_dt", 8, false),
                Column {
                    default: Some("'N'::character varying".into()),
                    sample: Some(Ok(vec!["N".into(), "Y".into()])),
                    ..text("budget_flg", 1, false)
                },
            ],
            &["acct_id"],
        );
        cust.uniques.push(vec!["acct_num".into()]);
        let mut rdng = table(
            "mtr_rdng",
            vec![
                serial("rdng_id"),
                col("acct_id", "integer", Kind::Int(32), true),
                col("tot_amt", "integer", Kind::Int(32), true),
                Column {
                    allowed: Some(Allowed {
                        values: vec!["A".into(), "E".into()],
                        numeric: false,
                        constraint: "rdng_type_check".into(),
                    }),
                    ..text("rdng_type", 1, true)
                },
            ],
            &["rdng_id"],
        );
        rdng.foreign_keys.push(fk(
            "mtr_rdng_acct_id_fkey",
            &["acct_id"],
            "cust_acct",
            &["acct_id"],
        ));
        let nokey = table("audit_log", vec![text("msg", 200, false)], &[]);
        Catalog {
            tables: vec![nokey, cust, rdng],
            skipped: Vec::new(),
        }
    }

    #[test]
    fn plain_entities_follow_the_columns() {
        let m = build(legacy(), false);
        let names: Vec<&str> = m.entities.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["audit_log", "cust_acct", "mtr_rdng"]);
        let cust = &m.entities[1];
        assert_eq!(cust.type_name, "CustAcct");
        let key = cust.field("acct_id").unwrap();
        assert!(!key.required);
        assert_eq!(key.schema["type"], "integer");
        assert_eq!(cust.field("conn_dt").unwrap().schema["maxLength"], 8);
        assert!(cust.field("acct_num").unwrap().required);
        assert!(!cust.field("email_addr").unwrap().required);
        assert_eq!(cust.singletons[0].name, "getByAcctNum");
        let rdng = &m.entities[2];
        let fkf = rdng.field("acct_id").unwrap();
        assert_eq!(
            (fkf.gql.as_str(), fkf.schema["format"].as_str()),
            ("ID", Some("uuid"))
        );
        assert_eq!(rdng.vectors[0].name, "getByCustAcct");
        assert_eq!(rdng.vectors[0].field, "acct_id");
        assert_eq!(rdng.resolvers[0].name, "custAcct");
        assert_eq!(rdng.resolvers[0].key, "acct_id");
        assert_eq!(cust.resolvers[0].name, "mtrRdngs");
        assert_eq!(cust.resolvers[0].query, "getByCustAcct");
        assert_eq!(
            rdng.field("rdng_type").unwrap().schema["enum"],
            json!(["A", "E"])
        );
        assert!(m.skipped.is_empty());
    }

    #[test]
    fn acl_entities_clean_the_columns() {
        let m = build(legacy(), true);
        assert_eq!(m.skipped.len(), 1);
        assert_eq!(m.skipped[0].0, "audit_log");
        let names: Vec<&str> = m.entities.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["customer_account", "meter_reading"]);
        let cust = &m.entities[0];
        let rule = |name: &str| cust.field(name).unwrap().mapping.clone().unwrap();
        assert_eq!(rule("legacy_account_id"), "{ int = \"acct_id\" }");
        assert_eq!(rule("account_number"), "{ copy = \"acct_num\" }");
        assert_eq!(rule("customer_name_first"), "{ title = \"cust_nm_first\" }");
        assert_eq!(
            rule("email"),
            "{ lower = \"email_addr\", omit_empty = true }"
        );
        assert_eq!(
            rule("status"),
            "{ code = \"stat_cd\", map = { A = \"a\", C = \"c\", S = \"s\" } }"
        );
        assert_eq!(rule("conn_date"), "{ date = \"conn_dt\" }");
        assert_eq!(
            rule("disc_date"),
            "{ date = \"disc_dt\", omit_empty = true }"
        );
        assert_eq!(rule("budget"), "{ flag = \"budget_flg\" }");
        assert_eq!(
            cust.field("status").unwrap().schema,
            json!({"type": "string", "enum": ["a", "c", "s"]})
        );
        assert!(cust
            .field("status")
            .unwrap()
            .review
            .as_deref()
            .unwrap()
            .contains("SELECT DISTINCT"));
        assert_eq!(cust.singletons[0].name, "getByAccountNumber");
        assert_eq!(cust.resolvers[0].name, "meterReadings");
        assert_eq!(cust.resolvers[0].query, "getByCustomerAccount");
        let rdng = &m.entities[1];
        let fkf = rdng.field("customer_account_id").unwrap();
        assert_eq!(
            fkf.mapping.as_deref(),
            Some("{ reference = \"cust_acct\", key = [\"acct_id\"], omit_empty = true }")
        );
        assert!(rdng.field("acct_id").is_none());
        assert_eq!(
            rdng.field("total_amount").unwrap().mapping.as_deref(),
            Some("{ cents = \"tot_amt\" }")
        );
        assert_eq!(
            rdng.field("reading_type").unwrap().mapping.as_deref(),
            Some("{ code = \"rdng_type\", map = { A = \"a\", E = \"e\" } }")
        );
        assert_eq!(rdng.resolvers[0].name, "customerAccount");
        let mapping = rdng.mapping.as_ref().unwrap();
        assert_eq!(mapping.key, ["rdng_id"]);
        assert_eq!(mapping.slot, "meshql_meter_reading");
        let schema = json_schema(rdng, true);
        assert_eq!(schema["additionalProperties"], json!(false));
        assert!(schema["required"]
            .as_array()
            .unwrap()
            .contains(&json!("customer_account_id")));
    }

    #[test]
    fn self_references_and_two_keys_to_one_table_are_told_apart() {
        let mut emp = table(
            "emp",
            vec![
                serial("emp_id"),
                col("mgr_id", "integer", Kind::Int(32), false),
            ],
            &["emp_id"],
        );
        emp.foreign_keys
            .push(fk("emp_mgr_fkey", &["mgr_id"], "emp", &["emp_id"]));
        let acct = table("acct", vec![serial("acct_id")], &["acct_id"]);
        let mut xfer = table(
            "xfer",
            vec![
                serial("xfer_id"),
                col("from_acct", "integer", Kind::Int(32), true),
                col("to_acct", "integer", Kind::Int(32), true),
            ],
            &["xfer_id"],
        );
        xfer.foreign_keys
            .push(fk("xfer_from", &["from_acct"], "acct", &["acct_id"]));
        xfer.foreign_keys
            .push(fk("xfer_to", &["to_acct"], "acct", &["acct_id"]));
        let m = build(
            Catalog {
                tables: vec![acct, emp, xfer],
                skipped: Vec::new(),
            },
            true,
        );
        let emp = &m.entities[1];
        assert!(emp.field("manager_id").is_some(), "{:?}", emp.fields);
        let names: Vec<&str> = emp.resolvers.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["manager", "employeesByManager"]);
        let xfer = &m.entities[2];
        assert!(xfer.field("from_account_id").is_some());
        assert!(xfer.field("to_account_id").is_some());
        let q: Vec<&str> = xfer.vectors.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(q, ["getByFromAccount", "getByToAccount"]);
        let acct = &m.entities[0];
        let names: Vec<&str> = acct.resolvers.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["xfersByFromAccount", "xfersByToAccount"]);
    }
}
