//! Who a request counts against: the subject of a valid token, else the client's address.
//!
//! A token is verified by the service's own authorizer (a forged or expired one identifies
//! nobody, so its sender is limited by address). Verifying costs a signature check, which the
//! request's handler pays again; the subjects of recently verified `Authorization` values are
//! therefore remembered (a bounded cache, entries kept a minute): only a value that verified
//! is remembered, and only the exact same value finds it, so a forged token can never borrow
//! another caller's bucket. A token's expiry is still the handler's to enforce.
//!
//! Addresses are the TCP peer's (no proxy header is trusted): IPv4 as is, IPv6 by its /64
//! prefix, the block one client usually holds whole.

use meshql_core::Authorizer;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The client address of a request's connection, set as a request extension by the listener
/// when the server limits rates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub(crate) IpAddr);

/// The identity a request is counted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum CallerKey {
    /// The `sub` of a valid token.
    Subject(Arc<str>),
    /// An IPv4 address, or an IPv6 /64 prefix (as the high 64 bits).
    Address(u128),
    /// A request with neither (one not read from a connection).
    Unknown,
}

impl CallerKey {
    fn of_address(ip: IpAddr) -> CallerKey {
        match ip {
            IpAddr::V4(v4) => CallerKey::Address(u128::from(u32::from(v4))),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => CallerKey::Address(u128::from(u32::from(v4))),
                None => CallerKey::Address(u128::from(v6) & !u128::from(u64::MAX)),
            },
        }
    }
}

/// Verified `Authorization` values remembered at once.
const SUBJECTS_REMEMBERED: u64 = 10_000;
/// How long one is remembered.
const SUBJECT_TTL: Duration = Duration::from_secs(60);
/// `Authorization` values longer than this are verified every time, never remembered.
const LONGEST_REMEMBERED: usize = 8 * 1024;

/// Finds the caller of a request.
pub(crate) struct Callers {
    authorizer: Arc<dyn Authorizer>,
    /// `Authorization` value → its verified subject.
    subjects: moka::sync::Cache<String, Arc<str>>,
}

impl Callers {
    pub(crate) fn new(authorizer: Arc<dyn Authorizer>) -> Callers {
        Callers {
            authorizer,
            subjects: moka::sync::Cache::builder()
                .max_capacity(SUBJECTS_REMEMBERED)
                .time_to_live(SUBJECT_TTL)
                .build(),
        }
    }

    /// The caller presenting `authorization` from `client`.
    pub(crate) fn key(&self, authorization: Option<&str>, client: Option<IpAddr>) -> CallerKey {
        if let Some(subject) = authorization
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .and_then(|a| self.subject(a))
        {
            return CallerKey::Subject(subject);
        }
        client.map_or(CallerKey::Unknown, CallerKey::of_address)
    }

    /// The subject of a valid token (remembered or verified now).
    fn subject(&self, authorization: &str) -> Option<Arc<str>> {
        if let Some(subject) = self.subjects.get(authorization) {
            return Some(subject);
        }
        let caller = self.authorizer.caller(Some(authorization)).ok()?;
        let subject: Arc<str> = Arc::from(caller.principal.subject?);
        if authorization.len() <= LONGEST_REMEMBERED {
            self.subjects
                .insert(authorization.to_owned(), subject.clone());
        }
        Some(subject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_core::{AuthError, Caller, Credentials, Principal};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Accepts `Bearer good-<name>` as subject `<name>`, counting the verifications.
    #[derive(Default)]
    struct Named {
        verified: AtomicUsize,
    }

    impl Authorizer for Named {
        fn credentials(&self, a: Option<&str>) -> Result<Credentials, AuthError> {
            self.caller(a).map(|c| c.credentials)
        }

        fn caller(&self, a: Option<&str>) -> Result<Caller, AuthError> {
            self.verified.fetch_add(1, Ordering::Relaxed);
            let name = a
                .and_then(|a| a.strip_prefix("Bearer good-"))
                .ok_or(AuthError::Malformed("not good".into()))?;
            Ok(Caller {
                credentials: Credentials::Tokens(vec![name.to_owned()]),
                principal: Principal {
                    subject: Some(name.to_owned()),
                    roles: Vec::new(),
                },
            })
        }
    }

    #[test]
    fn a_valid_token_is_its_subject_anything_else_the_address() {
        let named = Arc::new(Named::default());
        let callers = Callers::new(named.clone());
        let here: IpAddr = "10.1.2.3".parse().unwrap();
        let there: IpAddr = "10.1.2.4".parse().unwrap();
        let alice = CallerKey::Subject(Arc::from("alice"));
        assert_eq!(callers.key(Some("Bearer good-alice"), Some(here)), alice);
        // the same subject from elsewhere is the same caller
        assert_eq!(callers.key(Some("Bearer good-alice"), Some(there)), alice);
        // remembered: verified once
        assert_eq!(named.verified.load(Ordering::Relaxed), 1);
        // a bad token, an empty header, none: the address
        assert_eq!(
            callers.key(Some("Bearer forged-alice"), Some(here)),
            CallerKey::of_address(here)
        );
        assert_eq!(
            callers.key(Some("  "), Some(here)),
            CallerKey::of_address(here)
        );
        assert_ne!(
            callers.key(None, Some(here)),
            callers.key(None, Some(there))
        );
        assert_eq!(callers.key(None, None), CallerKey::Unknown);
    }

    #[test]
    fn ipv6_clients_count_by_their_64_prefix() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(CallerKey::of_address(a), CallerKey::of_address(b));
        assert_ne!(CallerKey::of_address(a), CallerKey::of_address(c));
        // an IPv4 client on a dual-stack socket is its IPv4 address
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(CallerKey::of_address(mapped), CallerKey::of_address(v4));
    }
}
