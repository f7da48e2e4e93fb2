//! [`PageHome`]: where this node's pages live and how they are named — the pool and disk tier
//! that hold them, the directory that lists them, the background work that tells it about
//! evictions, the counters, and the [`Stamp`] that names this node's copies. Every part that
//! publishes, promotes, re-publishes or reads this node's pages borrows it from the node.

use peercache_directory::DirectoryClient;
use peercache_pool::Pool;
use peercache_pool::disk::DiskTier;

use crate::node::parts::Tasks;
use crate::node::stamp::Stamp;
use crate::observe::series::Handles;

/// Where this node's pages live and how they are named, borrowed from the node.
#[derive(Clone, Copy)]
pub(crate) struct PageHome<'a> {
    pub(crate) pool: &'a Pool,
    pub(crate) disk: Option<&'a DiskTier>,
    pub(crate) dir: &'a DirectoryClient,
    /// The eviction batcher, the promoter and the promotion lock, the background threads.
    pub(crate) tasks: &'a Tasks,
    pub(crate) metrics: &'a Handles,
    pub(crate) stamp: Stamp<'a>,
}
