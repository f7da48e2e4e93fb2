//! [`Stamp`]: what names this node's copies in the directory, borrowed from the node for the
//! parts that publish or re-publish its pages.

use super::identity::Identity;

/// What names this node's copies in the directory: its identity (id, life, data endpoint,
/// pool region key) and where its pool is mapped.
#[derive(Clone, Copy)]
pub(crate) struct Stamp<'a> {
    pub(crate) id: &'a Identity,
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
            node: self.id.me.clone(),
            incarnation: self.id.incarnation,
            rails: smallvec::smallvec![peercache_directory::Rail {
                endpoint: self.id.data,
                region: self.id.pool_key,
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
