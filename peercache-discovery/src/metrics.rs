//! Every metric name of the discovery crate.

peercache_wire::metric_names! {
    /// Discovery requests a server refused, label `reason` (`not_yours`: acted for another member;
    /// `too_many_members`, `oversized`, `table_full`: past the table's bounds).
    pub const REFUSED_TOTAL: &str = "peercache_discovery_refused_total";
}
