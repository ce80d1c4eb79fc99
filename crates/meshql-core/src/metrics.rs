//! `/metrics` as the components write it: each part of a service that has something to
//! count (storage, replicas, the change feed, relays, processors, subscriptions, the cache,
//! connections, requests) implements [`Collect`] where it lives and is registered once with
//! the service's [`Metrics`]; the exposition is their output in registration order
//! (Prometheus text format 0.0.4).

use std::sync::{Arc, RwLock};

/// A part of the service that writes its own series.
pub trait Collect: Send + Sync {
    /// Appends its series (`# HELP`, `# TYPE` and samples) to `out`.
    fn collect(&self, out: &mut String);
}

/// The series of one service, from every registered part.
#[derive(Default)]
pub struct Metrics {
    parts: RwLock<Vec<Arc<dyn Collect>>>,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a part: its series follow those of the parts registered before it.
    pub fn register(&self, part: Arc<dyn Collect>) {
        self.parts
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(part);
    }

    /// Every part's series, in registration order.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for part in self.parts.read().unwrap_or_else(|e| e.into_inner()).iter() {
            part.collect(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Line(&'static str);

    impl Collect for Line {
        fn collect(&self, out: &mut String) {
            out.push_str(self.0);
        }
    }

    #[test]
    fn parts_write_in_registration_order() {
        let m = Metrics::new();
        m.register(Arc::new(Line("a 1\n")));
        m.register(Arc::new(Line("b 2\n")));
        assert_eq!(m.render(), "a 1\nb 2\n");
    }
}
