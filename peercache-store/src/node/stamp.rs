//! [`Stamp`]: what names this node's copies in the directory, borrowed from the node for the
//! parts that publish or re-publish its pages.

use std::net::SocketAddr;

use peercache_wire::{Incarnation, NodeId};

/// What names this node's copies in the directory: its id and life, its data endpoint and
/// its pool's region.
#[derive(Clone, Copy)]
pub(crate) struct Stamp<'a> {
    pub(crate) me: &'a NodeId,
    pub(crate) incarnation: Incarnation,
    pub(crate) data_endpoint: SocketAddr,
    pub(crate) pool_key: u64,
    pub(crate) pool_base: u64,
}

impl Stamp<'_> {
    /// The directory location of a page resident in this node's pool.
    pub(crate) fn resident(
        &self,
        loc: &peercache_pool::PageLocation,
    ) -> peercache_directory::Location {
        peercache_directory::Location {
            addr: self.pool_base + loc.offset,
            len: loc.len,
            valid_len: loc.valid_len,
            generation: loc.generation,
            checksum: loc.checksum,
            resident: true,
            class: match loc.class {
                peercache_pool::ReplClass::Retained => peercache_directory::CopyClass::Retained,
                peercache_pool::ReplClass::Reclaimable => {
                    peercache_directory::CopyClass::Reclaimable
                }
            },
            layout: loc.layout,
            ..self.on_disk()
        }
    }

    /// Where `pool` (this node's) holds `keys` now (None: not resident there), as directory
    /// locations.
    pub(crate) fn resident_in(
        &self,
        pool: &peercache_pool::Pool,
        keys: &[peercache_wire::PageKey],
    ) -> Vec<Option<peercache_directory::Location>> {
        let mut found = Vec::with_capacity(keys.len());
        pool.lookup_batch(keys, &mut found);
        found
            .iter()
            .map(|l| l.as_ref().map(|l| self.resident(l)))
            .collect()
    }

    /// A location of this node with nothing but its identity filled in: a disk-only copy
    /// (not resident, retained) of no length yet.
    pub(crate) fn on_disk(&self) -> peercache_directory::Location {
        peercache_directory::Location {
            node: self.me.clone(),
            incarnation: self.incarnation,
            rails: smallvec::smallvec![peercache_directory::Rail {
                endpoint: self.data_endpoint,
                region: self.pool_key,
            }],
            addr: 0,
            len: 0,
            valid_len: 0,
            generation: 0,
            checksum: 0,
            resident: false,
            class: peercache_directory::CopyClass::Retained,
            layout: peercache_wire::Layout::NONE,
        }
    }
}
