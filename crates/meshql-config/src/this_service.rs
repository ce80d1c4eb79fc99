//! URLs that name this service.
//!
//! A relationship may reach a graphlette over HTTP even when it is served by the same
//! process (MeshQL's farm example does, so its entities can be split over processes by
//! changing one URL). Such a `url` names this service when its host is a loopback
//! (`localhost`, `127.0.0.1`, `::1`, `0.0.0.0`) or the config's own `host`, and its port is the
//! config's `port`. `meshql check` then checks it like an in-process target, and when the
//! service is served on another port (`meshql serve --port`), the URL follows it
//! ([`ResolvedConfig::serve_on`]): otherwise the relationship would call whatever listens on
//! the config's port — nothing (and answer `null` with an "unreachable" error), or another
//! server's data.

use crate::{ResolvedConfig, ResolverTarget};

/// The parts of an `http(s)://` URL this module needs.
struct Parts<'u> {
    scheme: &'u str,
    /// As written, brackets of an IPv6 literal included.
    host: &'u str,
    port: u16,
    /// From the first `/` on (`/` when there is none).
    path: &'u str,
}

fn parts(url: &str) -> Option<Parts<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let default_port = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        // `[::1]` or `[::1]:3033`
        let (inside, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (&authority[..inside.len() + 2], port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, default_port),
        }
    };
    Some(Parts {
        scheme,
        host,
        port,
        path,
    })
}

/// The path of `url` (its query and fragment dropped) when it names the service at
/// `own_host`:`own_port`.
pub(crate) fn path_on(url: &str, own_host: &str, own_port: u16) -> Option<String> {
    let p = parts(url)?;
    let host = p.host.trim_start_matches('[').trim_end_matches(']');
    let local = ["localhost", "127.0.0.1", "::1", "0.0.0.0"].contains(&host)
        || host.eq_ignore_ascii_case(own_host);
    let path = p.path.split(['?', '#']).next().unwrap_or(p.path);
    (local && p.port == own_port).then(|| path.to_owned())
}

/// `url` with its port replaced by `port`.
fn with_port(url: &str, port: u16) -> Option<String> {
    let p = parts(url)?;
    Some(format!("{}://{}:{port}{}", p.scheme, p.host, p.path))
}

/// A relationship URL that followed the service to the port it is served on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedUrl {
    /// `entity.field`.
    pub relationship: String,
    pub from: String,
    pub to: String,
}

impl ResolvedConfig {
    /// Serves the config on `port` instead of its own (`meshql serve --port`): relationship
    /// URLs that name this service at its configured port follow to `port`. Returns the
    /// URLs moved (none when `port` is the config's).
    pub fn serve_on(&mut self, port: u16) -> Vec<MovedUrl> {
        let mut moved = Vec::new();
        if port != self.port {
            for entity in &mut self.entities {
                let Some(graph) = entity.graph.as_mut() else {
                    continue;
                };
                for resolver in &mut graph.resolvers {
                    let ResolverTarget::Http { url } = &mut resolver.target else {
                        continue;
                    };
                    if path_on(url, &self.host, self.port).is_none() {
                        continue;
                    }
                    if let Some(to) = with_port(url, port) {
                        moved.push(MovedUrl {
                            relationship: format!("{}.{}", entity.name, resolver.field),
                            from: std::mem::replace(url, to.clone()),
                            to,
                        });
                    }
                }
            }
        }
        self.port = port;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_on_a_loopback_or_the_own_host_at_the_own_port_are_this_service() {
        let on = |url| path_on(url, "farm.internal", 3033);
        assert_eq!(
            on("http://localhost:3033/coop/graph").as_deref(),
            Some("/coop/graph")
        );
        assert_eq!(
            on("http://127.0.0.1:3033/coop/graph?x=1").as_deref(),
            Some("/coop/graph")
        );
        assert_eq!(
            on("http://[::1]:3033/coop/graph").as_deref(),
            Some("/coop/graph")
        );
        assert_eq!(on("https://FARM.internal:3033/x").as_deref(), Some("/x"));
        assert_eq!(on("http://0.0.0.0:3033").as_deref(), Some("/"));
        assert_eq!(on("http://localhost:3034/coop/graph"), None, "another port");
        assert_eq!(
            on("http://hens.internal:3033/hen/graph"),
            None,
            "another host"
        );
        assert_eq!(on("http://localhost/coop/graph"), None, "port 80");
        assert_eq!(
            path_on("http://localhost/x", "h", 80).as_deref(),
            Some("/x")
        );
        assert_eq!(path_on("https://[::1]/x", "h", 443).as_deref(), Some("/x"));
        assert_eq!(on("localhost:3033/x"), None, "not a URL");
    }

    #[test]
    fn the_port_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_port("http://localhost:3033/coop/graph", 6102).as_deref(),
            Some("http://localhost:6102/coop/graph")
        );
        assert_eq!(
            with_port("http://[::1]:3033/g", 1).as_deref(),
            Some("http://[::1]:1/g")
        );
        assert_eq!(
            with_port("http://localhost/g", 8).as_deref(),
            Some("http://localhost:8/g")
        );
    }
}
