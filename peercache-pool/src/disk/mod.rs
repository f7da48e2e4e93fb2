//! The L4 disk tier: bounded write-through of published pages, crash-safe records, recovery
//! after a restart, verified reads for promotion back into the pool.

mod private;
pub mod record;
mod tier;

pub use private::UnsafeFolder;
pub use record::{RecordError, RecordHeader};
pub use tier::{DiskConfig, DiskError, DiskStats, DiskTier, default_root};
