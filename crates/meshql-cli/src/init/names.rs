//! Names: legacy column and table names as words, the fixed dictionary of legacy
//! abbreviations that `--acl` expands, and the GraphQL spellings of those words.

/// Legacy abbreviations and the words they stand for, one word each (`--acl` renames).
/// Applied to whole words only (`cust_nm` → `customer_name`), after [`PHRASES`]; a word with
/// trailing digits keeps them (`ln1` → `line1`).
pub const DICTIONARY: &[(&str, &str)] = &[
    ("acct", "account"),
    ("addr", "address"),
    ("amt", "amount"),
    ("avg", "average"),
    ("bal", "balance"),
    ("cd", "code"),
    ("cnt", "count"),
    ("cntry", "country"),
    ("conf", "confirmation"),
    ("crt", "created"),
    ("ctry", "country"),
    ("cust", "customer"),
    ("dept", "department"),
    ("desc", "description"),
    ("dt", "date"),
    ("emp", "employee"),
    ("est", "estimated"),
    ("flg", "flag"),
    ("grp", "group"),
    ("hdr", "header"),
    ("hist", "history"),
    ("ind", "indicator"),
    ("inv", "invoice"),
    ("ln", "line"),
    ("loc", "location"),
    ("mgr", "manager"),
    ("msg", "message"),
    ("mthd", "method"),
    ("mtr", "meter"),
    ("nbr", "number"),
    ("nm", "name"),
    ("no", "number"),
    ("nr", "number"),
    ("num", "number"),
    ("ord", "order"),
    ("pct", "percent"),
    ("pmt", "payment"),
    ("prc", "price"),
    ("prd", "period"),
    ("prev", "previous"),
    ("prod", "product"),
    ("pymt", "payment"),
    ("qty", "quantity"),
    ("rdng", "reading"),
    ("ref", "reference"),
    ("rt", "rate"),
    ("seq", "sequence"),
    ("st", "state"),
    ("stat", "status"),
    ("sts", "status"),
    ("svc", "service"),
    ("tel", "phone"),
    ("tot", "total"),
    ("txn", "transaction"),
    ("typ", "type"),
    ("upd", "updated"),
    ("usr", "user"),
    ("val", "value"),
    ("yr", "year"),
];

/// Runs of words replaced as a whole before [`DICTIONARY`] (`email_addr` → `email`).
pub const PHRASES: &[(&[&str], &[&str])] = &[
    (&["email", "addr"], &["email"]),
    (&["email", "address"], &["email"]),
    (&["e", "mail"], &["email"]),
];

/// A name's words, lower-cased: split at anything not a letter or digit and where a lower-case
/// letter or digit meets an upper-case one (`CUST_ACCT`, `CustAcct` and `cust-acct` all give
/// `cust`, `acct`).
pub fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `words` with [`PHRASES`] and [`DICTIONARY`] applied.
pub fn expand(words: &[String]) -> Vec<String> {
    let mut replaced: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    'outer: while i < words.len() {
        for (from, to) in PHRASES {
            if words[i..].len() >= from.len()
                && from.iter().zip(&words[i..]).all(|(a, b)| *a == b.as_str())
            {
                replaced.extend(to.iter().map(|w| (*w).to_owned()));
                i += from.len();
                continue 'outer;
            }
        }
        replaced.push(expand_word(&words[i]));
        i += 1;
    }
    replaced
}

/// One word through [`DICTIONARY`], its trailing digits kept.
fn expand_word(word: &str) -> String {
    let stem = word.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &word[stem.len()..];
    match DICTIONARY.iter().find(|(abbr, _)| *abbr == stem) {
        Some((_, full)) => format!("{full}{digits}"),
        None => word.to_owned(),
    }
}

/// The `--acl` name of a legacy table or column: its words expanded, joined with `_`
/// (`CUST_ACCT` → `customer_account`, `EMAIL_ADDR` → `email`).
pub fn clean(name: &str) -> String {
    snake(&expand(&words(name)))
}

/// Words joined with `_`; a name that would not be a GraphQL name is made one ([`ident`]).
pub fn snake(words: &[String]) -> String {
    ident(&words.join("_"))
}

/// `name` as a GraphQL (and TOML bare key) name: lower-cased, any character other than an
/// ASCII letter, digit or `_` replaced by `_`, a leading digit or `__` prefixed with `f`;
/// `field` when nothing is left.
pub fn ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if s.trim_matches('_').is_empty() {
        return "field".to_owned();
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.starts_with("__") {
        s.insert(0, 'f');
    }
    s
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// `meter_reading` → `MeterReading`.
pub fn pascal(snake_name: &str) -> String {
    let s: String = snake_name
        .split('_')
        .filter(|w| !w.is_empty())
        .map(capitalised)
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("T{s}")
    } else {
        s
    }
}

/// `meter_reading` → `meterReading`.
pub fn camel(snake_name: &str) -> String {
    let p = pascal(snake_name);
    let mut chars = p.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => p,
    }
}

/// The plural of a snake-case name's last word (`meter_reading` → `meter_readings`,
/// `payment_history` → `payment_histories`, `status` → `statuses`; `orders` stays).
pub fn plural(snake_name: &str) -> String {
    let s = snake_name;
    let consonant_y = s.ends_with('y')
        && s.len() > 1
        && !matches!(s.as_bytes()[s.len() - 2], b'a' | b'e' | b'i' | b'o' | b'u');
    if consonant_y {
        format!("{}ies", &s[..s.len() - 1])
    } else if ["ss", "us", "x", "z", "ch", "sh"]
        .iter()
        .any(|e| s.ends_with(e))
    {
        format!("{s}es")
    } else if s.ends_with('s') {
        // already a plural (`orders`)
        s.to_owned()
    } else {
        format!("{s}s")
    }
}

/// GraphQL's own type names, and the scalar meshql init declares: an entity type is never
/// one of them.
const TAKEN_TYPES: &[&str] = &[
    "Query",
    "Mutation",
    "Subscription",
    "String",
    "Int",
    "Float",
    "Boolean",
    "ID",
    "JSON",
];

/// The GraphQL type of an entity's documents (`customer_account` → `CustomerAccount`).
pub fn type_name(entity: &str) -> String {
    let p = pascal(entity);
    if TAKEN_TYPES.contains(&p.as_str()) {
        format!("{p}Entity")
    } else {
        p
    }
}

/// `base`, or `base_2`, `base_3`, … (`sep` between), the first `taken` refuses.
pub fn unique(base: &str, sep: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_owned();
    }
    (2..)
        .map(|n| format!("{base}{sep}{n}"))
        .find(|c| !taken(c))
        .expect("some suffix is free")
}

/// The identifier quoted for SQL.
pub fn sql_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A TOML basic string (`${` written `$${`, so that the config's expansion leaves it).
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out.replace("${", "$${")
}

/// A TOML key: bare when it can be.
pub fn toml_key(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        s.to_owned()
    } else {
        toml_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_legacy_and_camel_names() {
        assert_eq!(words("CUST_ACCT"), ["cust", "acct"]);
        assert_eq!(words("CustAcct"), ["cust", "acct"]);
        assert_eq!(words("addr-ln1"), ["addr", "ln1"]);
        assert_eq!(words("Order Lines"), ["order", "lines"]);
        assert_eq!(words("ADDR_LN1"), ["addr", "ln1"]);
        assert_eq!(words("__x"), ["x"]);
    }

    #[test]
    fn the_dictionary_expands_whole_words() {
        // the last three: words not in the dictionary stay; an abbreviation inside a word is
        // no word
        for (legacy, clean_name) in [
            ("CUST_ACCT", "customer_account"),
            ("MTR_RDNG", "meter_reading"),
            ("BILL_HDR", "bill_header"),
            ("PYMT_HIST", "payment_history"),
            ("CUST_NM_FIRST", "customer_name_first"),
            ("ACCT_NUM", "account_number"),
            ("EMAIL_ADDR", "email"),
            ("ADDR_LN1", "address_line1"),
            ("ADDR_ST", "address_state"),
            ("TOT_AMT", "total_amount"),
            ("CONF_NUM", "confirmation_number"),
            ("BILL_PRD_FROM", "bill_period_from"),
            ("PYMT_MTHD", "payment_method"),
            ("STAT_CD", "status_code"),
            ("SVC_TYPE", "service_type"),
            ("EST_FLG", "estimated_flag"),
            ("ORDER_NO", "order_number"),
            ("ITEM_QTY", "item_quantity"),
            ("UNIT_PRC", "unit_price"),
            ("PROD_DESC", "product_description"),
            ("REC_TYP", "rec_type"),
            ("LN2", "line2"),
            ("STATE_NMX", "state_nmx"),
            ("status", "status"),
            ("description", "description"),
        ] {
            assert_eq!(clean(legacy), clean_name, "{legacy}");
        }
    }

    #[test]
    fn the_dictionary_is_sorted_without_duplicates() {
        for pair in DICTIONARY.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{:?} before {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn graphql_spellings() {
        assert_eq!(pascal("meter_reading"), "MeterReading");
        assert_eq!(camel("customer_account"), "customerAccount");
        assert_eq!(plural("meter_reading"), "meter_readings");
        assert_eq!(plural("payment_history"), "payment_histories");
        assert_eq!(plural("status"), "statuses");
        assert_eq!(plural("day"), "days");
        assert_eq!(plural("box"), "boxes");
        assert_eq!(plural("address"), "addresses");
        assert_eq!(plural("orders"), "orders");
        assert_eq!(type_name("query"), "QueryEntity");
        assert_eq!(type_name("2fa"), "T2fa");
        assert_eq!(ident("Unit Price"), "unit_price");
        assert_eq!(ident("1st"), "f1st");
        assert_eq!(ident("__meta"), "f__meta");
        assert_eq!(ident("$"), "field");
        assert_eq!(unique("a", "_", |c| c == "a" || c == "a_2"), "a_3");
        assert_eq!(sql_ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn toml_strings_and_keys() {
        assert_eq!(toml_str("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(toml_str("${X}"), "\"$${X}\"");
        assert_eq!(toml_key("A"), "A");
        assert_eq!(toml_key("A B"), "\"A B\"");
        assert_eq!(toml_key(""), "\"\"");
    }
}
