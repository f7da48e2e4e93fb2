//! The HTTP port's optional bearer token (`http_token_file`): which requests carry it.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

/// The token `/cluster` requires, and the counter of requests refused without it.
#[derive(Clone)]
pub(crate) struct BearerGuard {
    token: std::sync::Arc<[u8]>,
    refused: metrics::Counter,
}

impl BearerGuard {
    /// Requires `token` (already checked for length) and counts refusals in `refused`.
    pub(crate) fn new(token: &[u8], refused: metrics::Counter) -> Self {
        BearerGuard {
            token: token.into(),
            refused,
        }
    }

    /// True when `headers` carry `Authorization: Bearer <token>`; a refusal is counted.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(<[u8]>::trim_ascii);
        let ok = given.is_some_and(|g| same(g, &self.token));
        if !ok {
            self.refused.increment(1);
        }
        ok
    }
}

/// `a == b` in time that depends on their lengths only, not on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn only_the_exact_token_after_bearer_is_admitted() {
        let g = BearerGuard::new(b"0123456789abcdef", metrics::Counter::noop());
        assert!(g.admits(&headers("Bearer 0123456789abcdef")));
        assert!(!g.admits(&headers("Bearer 0123456789abcdeF")));
        assert!(!g.admits(&headers("Bearer 0123456789abcde")));
        assert!(!g.admits(&headers("Basic 0123456789abcdef")));
        assert!(!g.admits(&headers("0123456789abcdef")));
        assert!(!g.admits(&HeaderMap::new()));
    }
}
