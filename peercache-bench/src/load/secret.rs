//! The cluster secret of one bench run. Every node a bench starts — in this process or in a
//! child process — proves it, as a deployment must (a node reachable beyond loopback refuses
//! to start without one). It is `PEERCACHE_CLUSTER_SECRET` when set (give the same value to
//! `serve` and `drive` on different hosts), else generated at start; children get it through
//! their environment.

use std::sync::OnceLock;

/// The variable the secret is read from and handed to children in.
pub const ENV: &str = "PEERCACHE_CLUSTER_SECRET";

/// This run's secret (at least 16 bytes).
pub fn generated() -> &'static str {
    static SECRET: OnceLock<String> = OnceLock::new();
    SECRET.get_or_init(|| match std::env::var(ENV) {
        Ok(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => peercache_wire::auth::generate_secret().expect("the OS random source"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_secret_per_run_long_enough_for_a_node() {
        let s = super::generated();
        assert_eq!(s, super::generated());
        assert!(s.len() >= peercache_wire::auth::MIN_SECRET_LEN, "{s}");
    }
}
