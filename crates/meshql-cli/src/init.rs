//! `meshql init --from-postgres URL`: a starting point generated from an existing
//! PostgreSQL schema — a `meshql.toml`, a JSON Schema and an SDL per table — that passes
//! `meshql check` and serves at once. Deterministic: the same schema (and, with `--acl`, the
//! same rows) gives the same files, but for the date in the header.
//!
//! # What is read
//!
//! One connection (tokio-postgres; TLS as the URL's `sslmode` / `sslrootcert` ask, read as
//! meshql's PostgreSQL store reads them) reads `pg_catalog` for the schema given
//! (`--schema`, default `public`; `--tables` to pick some): its ordinary tables (partitioned
//! tables and their partitions are listed as not generated; views are not tables), each
//! column's type (a domain's base type; an array's item type; an enum type's labels), `NOT
//! NULL`, `varchar(n)`/`char(n)` length, default, identity and generation, the primary key,
//! foreign keys (one column or several), unique constraints, and the CHECK constraints that
//! only list a column's values (`col IN ('A', 'B')`, which PostgreSQL keeps as `col = ANY
//! (ARRAY[…])`, or `col = 'A' OR col = 'B'`).
//!
//! # Plain (no `--acl`): a new service shaped like the tables
//!
//! An entity per table, named after it in lower case, with a field per column (in lower case;
//! a column `id` becomes `legacy_id`, as `id` is the document's own). JSON Schema types:
//! `smallint`/`integer`/`bigint` → integer (with the type's range), `numeric`/`real`/`double`
//! → number, `boolean` → boolean, text types → string (`maxLength` n), `date` → string
//! (`format: date`), `timestamp[tz]` → string (`format: date-time`), `uuid` → string
//! (`format: uuid`), `json`/`jsonb` → any value (SDL scalar `JSON`), arrays → array of the
//! item's type, enum types and CHECK lists → `enum`, anything else → string with a
//! `$comment`. `required`: the NOT NULL columns without a default (serial and identity keys
//! are therefore optional: documents have ids of their own). `additionalProperties: false`.
//!
//! A foreign key to another generated table becomes a field holding the parent document's
//! id (string, `format: uuid`, SDL `ID`): the column's name for a one-column key, `<parent>_id`
//! for one of several columns (which it replaces, unless they are part of the primary key).
//! Each gives the child a vector `getBy<Parent>` (`{"payload.<field>": "{{id}}"}`) and a
//! resolver to its parent (`key = <field>`, `getById`), and the parent a resolver to its
//! children (`key = "id"`, the child's `getBy<Parent>`). When one table has several foreign
//! keys to one parent (or refers to itself), the names come from the key's columns instead
//! (`getByManager`, `employeesByManager`). A one-column unique constraint (or a primary key
//! the database does not number) on a string field gives a singleton `getBy<Field>`.
//!
//! # `--acl`: the clean side of an anti-corruption layer
//!
//! Each table with a primary key becomes a clean entity fed by change capture: a `mapping`
//! processor ([`meshql_process::mapping`]) whose `postgres_cdc` source reads the table, with
//! publication and slot `meshql_<entity>` (the slot with `${LEGACY_SLOT_SUFFIX:-}`) and the
//! URL `${LEGACY_URL:-<URL without its password>}`. A table without a primary key cannot be
//! captured (its rows cannot be told apart), nor can one with a quoted mixed-case name: both
//! are left out with a warning and a comment in `meshql.toml`.
//!
//! Names are the words of the legacy names with the abbreviations of a fixed dictionary
//! expanded ([`names::DICTIONARY`]: `CUST_ACCT` → `customer_account`, `EMAIL_ADDR` → `email`).
//! Each column becomes one field, its transformation guessed; every guess is written with a
//! `# review: …` comment above the field saying what it was guessed from:
//!
//! | Column | Field |
//! |---|---|
//! | a one-column integer primary key | `legacy_<name> = { int = … }` |
//! | a foreign key to a generated table, by its primary key | `<parent>_id = { reference = "<parent table>", key = [<columns>], omit_empty = true }`, and the resolvers as above |
//! | text with a CHECK list of values | copied with an `enum` when they are lower case; else a `code` map, each code to itself lower-cased (review) |
//! | `varchar(8)`/`char(8)` named `…DT`/`…DATE` | `date` (`YYYYMMDD` → `YYYY-MM-DD`, review) |
//! | `varchar(1)`/`char(1)` named `…FLG`/`…FLAG`/`…IND` | `flag` (`Y` true; `T` or `1` when the table holds those and no `Y`; review), the name without `flag` |
//! | text named `…CD`/`…CODE`/`…TYPE`/`…STAT`/`…STATUS` | its distinct values are read (`SELECT DISTINCT … LIMIT 21`): up to 20 → a `code` map of them (review), the name without `code`; else copied (review) |
//! | text whose name has the word `name` (`NM`) | `title` (review) |
//! | text whose name has the word `email` | `lower` (review) |
//! | an integer named `…AMT`/`…AMOUNT` | `cents` (review) |
//! | other integers, `numeric`, floats | `int`, `number` |
//! | timestamps, arrays | copied as they come (review: the snapshot sends `to_jsonb`'s form — RFC 3339, a JSON array — and later changes PostgreSQL's text) |
//! | other types PostgreSQL has no JSON for (`interval`, `inet`, …) | copied as text (review) |
//! | anything else (booleans, dates, uuids, json, enum types) | copied |
//!
//! A nullable column's field has `omit_empty = true`. The clean JSON Schema follows the
//! transformations (`date` → string, `flag` → boolean, `cents` → number, `code` → a string
//! `enum` of the map's values, `reference` → string); `required` lists the NOT NULL columns'
//! fields.

mod acl;
mod fields;
mod introspect;
mod model;
mod names;
mod render;

use clap::Args;
use meshql_process::pgcdc::redacted_url;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct InitArgs {
    /// The PostgreSQL database to read: postgres://user[:password]@host[:port]/database.
    #[arg(long = "from-postgres", value_name = "URL")]
    from_postgres: String,
    /// Where to write the config (default: ./meshql-<database>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The schema whose tables are read.
    #[arg(long, default_value = "public")]
    schema: String,
    /// Only these tables (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "TABLES")]
    tables: Vec<String>,
    /// Serve the tables' rows through an anti-corruption layer: per table a clean entity
    /// written by a `mapping` processor that reads the table by change capture.
    #[arg(long)]
    acl: bool,
    /// The port of the generated config (`${PORT:-N}`).
    #[arg(long, default_value_t = 4000)]
    port: u16,
    /// Write into a directory that is not empty (overwriting the files it generates).
    #[arg(long)]
    force: bool,
}

/// Why `meshql init` failed.
#[derive(Debug)]
pub enum InitError {
    /// The URL does not parse.
    BadUrl {
        url: String,
        reason: String,
    },

    Connect {
        url: String,
        reason: String,
    },
    /// A catalog query failed.
    Query {
        what: String,
        reason: String,
    },
    NoTables {
        schema: String,
        url: String,
    },
    UnknownTables {
        names: Vec<String>,
        schema: String,
        known: Vec<String>,
    },
    /// Every table was left out (`--acl`).
    NothingToGenerate {
        reasons: Vec<String>,
    },
    NotEmpty {
        dir: PathBuf,
    },
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitError::BadUrl { url, reason } => write!(
                f,
                "`{url}` is not a PostgreSQL URL ({reason}); e.g. postgres://user@host:5432/database"
            ),
            InitError::Connect { url, reason } => write!(f, "cannot connect to {url}: {reason}"),
            InitError::Query { what, reason } => write!(f, "reading {what}: {reason}"),
            InitError::NoTables { schema, url } => {
                write!(f, "no tables in schema {schema} of {url}")
            }
            InitError::UnknownTables {
                names,
                schema,
                known,
            } => write!(
                f,
                "no table {} in schema {schema} (its tables: {})",
                names.join(", "),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
            InitError::NothingToGenerate { reasons } => {
                write!(f, "no table can be generated: {}", reasons.join("; "))
            }
            InitError::NotEmpty { dir } => write!(
                f,
                "{} is not empty: choose another --out, or give --force to write into it",
                dir.display()
            ),
            InitError::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for InitError {}

pub fn run(args: InitArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("meshql init: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(init(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meshql init: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `url` without its password (the URL form's `user:password@` and `password=` parameter,
/// or the `password=…` of the key/value form).
fn without_password(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match main.find('/') {
            Some(i) => main.split_at(i),
            None => (main, ""),
        };
        let authority = match authority.rsplit_once('@') {
            Some((user, host)) => {
                let name = user.split_once(':').map_or(user, |(n, _)| n);
                format!("{name}@{host}")
            }
            None => authority.to_owned(),
        };
        let query: Vec<&str> = query
            .map(|q| {
                q.split('&')
                    .filter(|p| !p.starts_with("password="))
                    .collect()
            })
            .unwrap_or_default();
        let mut out = format!("{scheme}://{authority}{path}");
        if !query.is_empty() {
            out.push('?');
            out.push_str(&query.join("&"));
        }
        out
    } else {
        url.split_whitespace()
            .filter(|p| !p.starts_with("password="))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The URL as messages show it (its password redacted, in either form).
fn shown(url: &str) -> String {
    if url.contains("://") {
        redacted_url(url)
    } else {
        url.split_whitespace()
            .map(|p| {
                if p.starts_with("password=") {
                    "password=***"
                } else {
                    p
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A directory name from a database name.
fn dir_name(database: &str) -> String {
    let name: String = database
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("meshql-{}", name.trim_start_matches('.'))
}

async fn connect(url: &str) -> Result<(tokio_postgres::Client, tokio_postgres::Config), InitError> {
    let meshql_pg::Connection {
        mut config, tls, ..
    } = meshql_pg::read_url(url.trim()).map_err(|reason| InitError::BadUrl {
        url: shown(url),
        reason,
    })?;
    config
        .application_name("meshql init")
        .connect_timeout(Duration::from_secs(10));
    let connect_error = |reason: String| InitError::Connect {
        url: shown(url),
        reason,
    };
    let (client, connection) = tokio::time::timeout(Duration::from_secs(15), config.connect(tls))
        .await
        .map_err(|_| connect_error("no answer within 15 s".into()))?
        .map_err(|e| connect_error(introspect::db_error(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, config))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InitError + '_ {
    move |error| InitError::Io {
        path: path.to_owned(),
        error,
    }
}

/// Refuses a directory that holds anything, unless `force`.
fn check_out_dir(dir: &Path, force: bool) -> Result<(), InitError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() && !force {
                return Err(InitError::NotEmpty {
                    dir: dir.to_owned(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(dir)(e)),
    }
}

async fn init(args: &InitArgs) -> Result<(), InitError> {
    let url = args.from_postgres.trim();
    if let Some(dir) = &args.out {
        // before connecting: a refusal costs nothing
        check_out_dir(dir, args.force)?;
    }
    let (client, config) = connect(url).await?;
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres")
        .to_owned();
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(dir_name(&database)));
    check_out_dir(&dir, args.force)?;

    let mut catalog = introspect::read(&client, &args.schema).await?;
    if catalog.tables.is_empty() && args.tables.is_empty() {
        return Err(InitError::NoTables {
            schema: args.schema.clone(),
            url: shown(url),
        });
    }
    if !args.tables.is_empty() {
        let find = |want: &str| {
            catalog
                .tables
                .iter()
                .position(|t| t.name == want)
                .or_else(|| {
                    catalog
                        .tables
                        .iter()
                        .position(|t| t.name.eq_ignore_ascii_case(want))
                })
        };
        let wanted: Vec<&str> = args
            .tables
            .iter()
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
            .collect();
        let missing: Vec<String> = wanted
            .iter()
            .filter(|t| find(t).is_none())
            .map(|t| (*t).to_owned())
            .collect();
        if !missing.is_empty() {
            return Err(InitError::UnknownTables {
                names: missing,
                schema: args.schema.clone(),
                known: catalog.tables.iter().map(|t| t.name.clone()).collect(),
            });
        }
        let keep: Vec<usize> = wanted.iter().filter_map(|t| find(t)).collect();
        let mut i = 0;
        catalog.tables.retain(|_| {
            i += 1;
            keep.contains(&(i - 1))
        });
        catalog.skipped.clear();
    }
    if args.acl {
        for t in &mut catalog.tables {
            let table = t.clone();
            for c in &mut t.columns {
                if acl::wants_sample(&table, c) {
                    c.sample = Some(introspect::sample(&client, &table, &c.name).await);
                }
            }
        }
    }
    drop(client);

    let model = model::build(catalog, args.acl);
    if model.entities.is_empty() {
        return Err(InitError::NothingToGenerate {
            reasons: model
                .skipped
                .iter()
                .map(|(t, why)| format!("{t}: {why}"))
                .collect(),
        });
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let origin = render::Origin {
        redacted_url: shown(url),
        default_url: without_password(url),
        had_password: config.get_password().is_some(),
        schema: args.schema.clone(),
        at: render::rfc3339(secs),
        acl: args.acl,
        port: args.port,
    };
    write_files(&dir, &model, &origin)?;

    let reviews: usize = model.entities.iter().map(model::Entity::reviews).sum();
    let resolvers: usize = model.entities.iter().map(|e| e.resolvers.len()).sum();
    println!(
        "meshql init: wrote {} from {} ({} entities, {resolvers} resolvers{})",
        dir.display(),
        shown(url),
        model.entities.len(),
        if args.acl {
            format!(", {reviews} guessed transformations marked `# review:`")
        } else {
            String::new()
        }
    );
    for e in &model.entities {
        println!("  {} <- table {}", e.name, e.table.label());
    }
    for (table, why) in &model.skipped {
        eprintln!("warning: table {table} not generated: {why}");
    }
    println!("next: meshql check {0} && meshql serve {0}", dir.display());
    Ok(())
}

fn write_files(dir: &Path, model: &model::Model, origin: &render::Origin) -> Result<(), InitError> {
    for sub in [dir.to_owned(), dir.join("schema"), dir.join("graph")] {
        std::fs::create_dir_all(&sub).map_err(io(&sub))?;
    }
    let write = |path: PathBuf, text: String| std::fs::write(&path, text).map_err(io(&path));
    for (i, e) in model.entities.iter().enumerate() {
        write(
            dir.join("schema").join(format!("{}.schema.json", e.name)),
            render::schema_file(e, origin.acl),
        )?;
        write(
            dir.join("graph").join(format!("{}.graphql", e.name)),
            render::sdl(model, i),
        )?;
    }
    write(dir.join("meshql.toml"), render::config(model, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_left_out_of_the_default_url() {
        assert_eq!(
            without_password("postgres://u:secret@h:5432/db?sslmode=disable&password=x"),
            "postgres://u@h:5432/db?sslmode=disable"
        );
        assert_eq!(without_password("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            without_password("host=h user=u password=secret dbname=db"),
            "host=h user=u dbname=db"
        );
        assert_eq!(shown("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            shown("host=h password=secret dbname=db"),
            "host=h password=*** dbname=db"
        );
    }

    #[test]
    fn default_directories() {
        assert_eq!(
            dir_name("springfield_electric"),
            "meshql-springfield_electric"
        );
        assert_eq!(dir_name("../x y"), "meshql-_x_y");
    }
}
