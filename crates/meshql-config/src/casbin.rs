//! What meshql reads of a Casbin model and policy (`auth.type = "casbin"`, MeshQL's
//! `casbinParams`), checked line by line so that `meshql check` names the file and line of a
//! problem:
//!
//! * the roles each user is given by the policy's `g, <user>, <role>` lines: as in MeshQL, a
//!   caller's tokens are the roles of its JWT subject (Casbin's `getRolesForUser`: direct
//!   roles only), matched against documents' authorized tokens;
//! * the permission lines `p, <subject or role>, <entity>, <action>`, which the `casbin`
//!   crate's enforcer decides with (meshql-auth's `CasbinPolicy`); here each is checked to
//!   name an entity of the service and an action meshql asks about.
//!
//! Only RBAC models without domains (`g = _, _`) fit that use, so others are refused
//! rather than half-applied.

use std::collections::BTreeMap;

/// A problem at a 1-based line of the file read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub line: Option<usize>,
    pub message: String,
}

fn problem(line: Option<usize>, message: impl Into<String>) -> Problem {
    Problem {
        line,
        message: message.into(),
    }
}

/// Checks that a model declares users' roles as `g = _, _` in its `[role_definition]`.
pub(crate) fn check_model(text: &str) -> Result<(), Problem> {
    let mut section = "";
    let mut role_section = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') && line.ends_with(']') {
            section = line;
            if section == "[role_definition]" {
                role_section = Some(i + 1);
            }
            continue;
        }
        if section != "[role_definition]" {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(problem(
                Some(i + 1),
                format!("`{line}` is not `name = value`"),
            ));
        };
        if name.trim() != "g" {
            continue;
        }
        let arity = value.split(',').filter(|p| p.trim() == "_").count();
        return match (arity, value.split(',').count()) {
            (2, 2) => Ok(()),
            _ => Err(problem(
                Some(i + 1),
                format!(
                    "role definition `g ={value}`: only `g = _, _` (roles without domains) is supported"
                ),
            )),
        };
    }
    Err(problem(
        role_section,
        "the model has no `g = _, _` in a [role_definition] section: meshql reads users' roles from it",
    ))
}

/// A `p` line of a policy: its 1-based line and its fields after `p`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PermissionLine {
    pub line: usize,
    pub fields: Vec<String>,
}

/// The `p` lines of a policy, in order.
pub(crate) fn permission_lines(text: &str) -> Vec<PermissionLine> {
    text.lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let fields = split(raw.trim());
            (fields.first() == Some(&"p")).then(|| PermissionLine {
                line: i + 1,
                fields: fields[1..].iter().map(|f| f.to_string()).collect(),
            })
        })
        .collect()
}

fn split(line: &str) -> Vec<&str> {
    line.split(',')
        .map(|f| f.trim().trim_matches('"').trim())
        .collect()
}

/// The roles of every user in a policy (`g, <user>, <role>`), in the order given.
pub(crate) fn roles(text: &str) -> Result<BTreeMap<String, Vec<String>>, Problem> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split(line);
        match fields[0] {
            // permissions: see [`permission_lines`]
            "p" => {}
            "g" if fields.len() == 3 && !fields[1].is_empty() && !fields[2].is_empty() => {
                let roles = out.entry(fields[1].to_owned()).or_default();
                if !roles.iter().any(|r| r == fields[2]) {
                    roles.push(fields[2].to_owned());
                }
            }
            "g" => {
                return Err(problem(
                    Some(i + 1),
                    format!("`{line}`: a role line is `g, <user>, <role>`"),
                ))
            }
            other => {
                return Err(problem(
                    Some(i + 1),
                    format!("`{other}` lines are not supported (only `p` and `g`)"),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "[request_definition]\nr = sub, obj, act\n\n[policy_definition]\np = sub, obj, act\n\n[role_definition]\ng = _, _\n\n[policy_effect]\ne = some(where (p.eft == allow))\n\n[matchers]\nm = g(r.sub, p.sub) && r.obj == p.obj && r.act == p.act\n";

    #[test]
    fn the_rbac_model_of_meshql_fits() {
        assert_eq!(check_model(MODEL), Ok(()));
    }

    #[test]
    fn models_without_plain_roles_are_refused_with_their_line() {
        let domains = MODEL.replace("g = _, _", "g = _, _, _");
        let e = check_model(&domains).unwrap_err();
        assert_eq!(e.line, Some(8));
        assert!(e.message.contains("without domains"), "{}", e.message);
        let none = MODEL.replace("g = _, _\n", "");
        let e = check_model(&none).unwrap_err();
        assert_eq!(e.line, Some(7), "the section that lacks it");
        let e = check_model("[request_definition]\nr = sub\n").unwrap_err();
        assert!(e.message.contains("role_definition"), "{}", e.message);
    }

    #[test]
    fn roles_come_from_g_lines() {
        let policy = "p, admin, data1, read\np, admin, data1, write\n# users\ng, user1, admin\ng, user2, editor\n\ng, user2, \"viewer\"\ng, user2, editor\n";
        let r = roles(policy).unwrap();
        assert_eq!(r["user1"], ["admin"]);
        assert_eq!(r["user2"], ["editor", "viewer"]);
        assert!(!r.contains_key("admin"));
    }

    #[test]
    fn bad_policy_lines_are_named() {
        assert_eq!(roles("g, user1\n").unwrap_err().line, Some(1));
        let e = roles("p, a, b, c\ng2, x, y\n").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("g2"), "{}", e.message);
    }

    #[test]
    fn permission_lines_are_numbered() {
        let p = permission_lines("# x\np, admin, farm, read\ng, a, b\np, \"v\", hen , delete\n");
        assert_eq!(
            p,
            vec![
                PermissionLine {
                    line: 2,
                    fields: vec!["admin".into(), "farm".into(), "read".into()]
                },
                PermissionLine {
                    line: 4,
                    fields: vec!["v".into(), "hen".into(), "delete".into()]
                },
            ]
        );
    }
}
