//! Background work of a node: eviction notices, disk-tier promotion, re-publishing and the
//! membership sync.

pub(crate) mod evict;
pub(crate) mod membership;
pub(crate) mod promoter;
pub(crate) mod promotion;
pub(crate) mod republish;
