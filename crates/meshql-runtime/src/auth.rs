//! Who the callers are and what they may do: the authorizer the config's `[auth]` names (a
//! JWT verifier, with roles from a claim or from Casbin's grouping), and the permission
//! policy of `[permissions]`.

use crate::error::BuildError;
use meshql_auth::permissions::{CasbinPolicy, RolePolicy};
use meshql_auth::JwtAuthorizer;
use meshql_config::resolve::{AuthSpec, PermissionsSpec};
use meshql_config::ResolvedConfig;
use meshql_core::{AllowAll, Authorizer, NoAuth, Policy};
use std::sync::Arc;

/// The authorizer of `[auth]` (its JWKS fetched now, refreshed in the background).
pub(crate) async fn authorizer(config: &ResolvedConfig) -> Result<Arc<dyn Authorizer>, BuildError> {
    let roles_claim = match &config.permissions {
        PermissionsSpec::Roles { roles_claim, .. } => roles_claim.as_deref(),
        _ => None,
    };
    Ok(match &config.auth {
        AuthSpec::None => Arc::new(NoAuth),
        AuthSpec::Jwt(jwt) => Arc::new(
            JwtAuthorizer::start(jwt, None)
                .await
                .map_err(BuildError::Auth)?
                .with_roles_claim(roles_claim),
        ),
        AuthSpec::Casbin { jwt, roles, .. } => Arc::new(
            JwtAuthorizer::start(
                jwt,
                Some(roles.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            )
            .await
            .map_err(BuildError::Auth)?,
        ),
    })
}

/// The policy deciding what callers may do (`AllowAll` without permissions).
pub(crate) async fn permission_policy(
    config: &ResolvedConfig,
) -> Result<Arc<dyn Policy>, BuildError> {
    Ok(match &config.permissions {
        PermissionsSpec::None => Arc::new(AllowAll::default()),
        PermissionsSpec::Roles { tables, .. } => Arc::new(RolePolicy::new(tables.clone())),
        PermissionsSpec::Casbin {
            enforce: false,
            masks,
            ..
        } if masks.is_empty() => Arc::new(AllowAll::default()),
        PermissionsSpec::Casbin {
            model,
            policy,
            enforce,
            masks,
        } => Arc::new(
            CasbinPolicy::new(
                model,
                policy,
                config.entities.iter().map(|e| e.name.clone()).collect(),
                masks.clone(),
            )
            .await
            .map_err(BuildError::Auth)?
            .enforcing(*enforce),
        ),
    })
}
