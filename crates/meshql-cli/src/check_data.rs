//! `meshql check CONFIG --data`: every entity's current documents validated against the JSON
//! Schema the config names now — what a schema change would refuse of the data already stored.
//! Per entity: how many documents were read and how many fail, then each failing rule (the
//! field's path and the schema's message) with its count and a few document ids.

use crate::transfer::Opened;
use meshql_core::{ReadContext, TokenFilter};
use std::collections::BTreeMap;
use std::process::ExitCode;

/// Documents read per round trip.
const PAGE: usize = 2048;
/// Ids shown per failing rule.
const EXAMPLES: usize = 3;

/// One failing rule: how many documents break it, and a few of their ids.
#[derive(Default)]
struct Rule {
    count: u64,
    ids: Vec<String>,
}

pub fn run(config: &meshql_config::ResolvedConfig) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("meshql check --data: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(check(config)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("meshql check --data: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn check(config: &meshql_config::ResolvedConfig) -> Result<bool, String> {
    let opened = Opened::open(config).await?;
    let result = check_stores(config, &opened).await;
    opened.close().await;
    result
}

async fn check_stores(
    config: &meshql_config::ResolvedConfig,
    opened: &Opened,
) -> Result<bool, String> {
    let mut clean = true;
    let declared = meshql_runtime::migrations::configure(config)
        .map_err(|errors| meshql_config::ConfigErrors(errors).to_string())?;
    for entity in &config.entities {
        if let Some((_, migrations)) = declared.iter().find(|(n, _)| *n == entity.name) {
            let store = opened.store(&entity.name);
            let states = meshql_process::migration::status(&entity.name, store, migrations)
                .await
                .map_err(|e| e.to_string())?;
            let pending: Vec<&str> = states
                .iter()
                .filter(|(_, s)| !matches!(s, meshql_process::migration::State::Applied(_)))
                .map(|(n, _)| n.as_str())
                .collect();
            if !pending.is_empty() {
                println!(
                    "{}: migrations not applied yet ({}): the documents below are checked as \
                     stored; `meshql migrate --dry-run` checks them as they will be after",
                    entity.name,
                    pending.join(", ")
                );
            }
        }
        let Some(schema) = entity.rest.as_ref().and_then(|r| r.schema.as_ref()) else {
            println!("{}: no JSON Schema, nothing to check", entity.name);
            continue;
        };
        let validator = meshql_engine::PayloadValidator::new(schema)
            .map_err(|e| format!("{}: {}", entity.name, e.0))?;
        let store = opened.store(&entity.name);
        let filter = TokenFilter::All;
        let ctx = ReadContext::new(&filter, None);
        let (mut read, mut failing) = (0u64, 0u64);
        let mut rules: BTreeMap<String, Rule> = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = store
                .list_page(after.as_deref(), PAGE, &ctx)
                .await
                .map_err(|e| format!("{}: {e}", entity.name))?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            for doc in &page {
                read += 1;
                let mut body: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&doc.payload)
                        .map_err(|e| format!("{} {}: {e}", entity.name, doc.id))?;
                // validated as a write's body is: the id is the store's, not the schema's
                body.remove("id");
                let value = serde_json::Value::Object(body);
                let violations = validator.violations(&value);
                if violations.is_empty() {
                    continue;
                }
                failing += 1;
                for v in violations {
                    let rule = format!(
                        "{}: {}",
                        v["path"].as_str().unwrap_or("/"),
                        v["message"].as_str().unwrap_or("")
                    );
                    let r = rules.entry(rule).or_default();
                    r.count += 1;
                    if r.ids.len() < EXAMPLES {
                        r.ids.push(doc.id.clone());
                    }
                }
            }
            if page.len() < PAGE {
                break;
            }
        }
        if failing == 0 {
            println!("{}: {read} documents, all valid", entity.name);
            continue;
        }
        clean = false;
        println!(
            "{}: {failing} of {read} documents fail its JSON Schema",
            entity.name
        );
        let mut by_count: Vec<(&String, &Rule)> = rules.iter().collect();
        by_count.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
        for (rule, r) in by_count {
            println!("  {:>8} × {rule}   e.g. {}", r.count, r.ids.join(", "));
        }
    }
    Ok(clean)
}
