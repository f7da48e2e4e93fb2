//! Every metric name of the directory, and the client's [`Tally`] counters behind both the
//! series and `DirectoryClient::stats`.

use peercache_wire::tally::Tally;

peercache_wire::metric_names! {
    /// Entries in this node's shard.
    pub const SHARD_ENTRIES: &str = "peercache_directory_shard_entries";
    /// Directory RPCs sent, label `op`.
    pub const RPCS_TOTAL: &str = "peercache_directory_rpcs_total";
    /// Directory calls answered by this node's own shard (no RPC).
    pub const LOCAL_CALLS_TOTAL: &str = "peercache_directory_local_calls_total";
    /// Directory RPCs that failed.
    pub const RPC_ERRORS_TOTAL: &str = "peercache_directory_rpc_errors_total";
    /// Lookups retried on a replica.
    pub const FALLBACKS_TOTAL: &str = "peercache_directory_fallbacks_total";
    /// Lookup and exists keys a shard missed while still receiving them by hand-off, asked
    /// again of the member that held them before.
    pub const HANDOFF_REDIRECTS_TOTAL: &str = "peercache_directory_handoff_redirects_total";
    /// Entries handed off to new owners.
    pub const HANDOFF_SENT_TOTAL: &str = "peercache_directory_handoff_sent_total";
    /// Entries dropped after their ownership moved.
    pub const HANDOFF_DROPPED_TOTAL: &str = "peercache_directory_handoff_dropped_total";
    /// Hand-off entries or owners a shard refused, label `reason` (`not_a_holder`: the sender did
    /// not hold the range; `dead_owner`: an owner that is not a live member; `too_many_owners`; `too_early`: too many arrived before the shard's
    /// first ring).
    pub const HANDOFF_REFUSED_TOTAL: &str = "peercache_directory_handoff_refused_total";
    /// Malformed directory requests.
    pub const MALFORMED_TOTAL: &str = "peercache_directory_malformed_total";
}

/// The directory client's counters.
pub(crate) struct Counters {
    pub(crate) rpcs: Tally,
    pub(crate) local_calls: Tally,
    pub(crate) errors: Tally,
    pub(crate) fallbacks: Tally,
    pub(crate) redirects: Tally,
    pub(crate) handoff_sent: Tally,
    pub(crate) handoff_dropped: Tally,
}

impl Counters {
    pub(crate) fn register() -> Self {
        let t = |name: &'static str| Tally::new(metrics::counter!(name));
        Counters {
            rpcs: t(RPCS_TOTAL),
            local_calls: t(LOCAL_CALLS_TOTAL),
            errors: t(RPC_ERRORS_TOTAL),
            fallbacks: t(FALLBACKS_TOTAL),
            redirects: t(HANDOFF_REDIRECTS_TOTAL),
            handoff_sent: t(HANDOFF_SENT_TOTAL),
            handoff_dropped: t(HANDOFF_DROPPED_TOTAL),
        }
    }
}
