//! Background work of a node: eviction notices, disk-tier promotion and re-publishing.

pub(crate) mod evict;
pub(crate) mod promoter;
pub(crate) mod promotion;
pub(crate) mod republish;
