//! Every metric name of the discovery crate.

peercache_wire::metric_names! {
    /// Discovery requests a server refused, label `reason` (`not_yours`: acted for another member;
    /// `too_many_members`, `oversized`, `table_full`: past the table's bounds;
    /// `foreign_address`: a registration announced another host's address).
    pub const REFUSED_TOTAL: &str = "peercache_discovery_refused_total";
    /// Registrations that changed a live member's entry without a restart (same incarnation):
    /// someone registered in its name, or the member repaired such an entry.
    pub const ENTRY_CHANGES_TOTAL: &str = "peercache_discovery_entry_changes_total";
    /// 1 while the membership is the last one seen because its source is unreachable (etcd
    /// lost), 0 while it is current.
    pub const STALE: &str = "peercache_discovery_stale";
    /// Sessions opened with etcd: the first, then one per reconnect (`discovery = "etcd"` only).
    pub const ETCD_SESSIONS_TOTAL: &str = "peercache_discovery_etcd_sessions_total";
}
