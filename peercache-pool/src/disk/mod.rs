//! The L4 disk tier: bounded write-through of published pages, crash-safe records, recovery
//! after a restart, verified reads for promotion back into the pool.

mod private;
pub mod record;
mod recover;
mod state;
mod tier;
mod types;
mod writer;

pub use private::UnsafeFolder;
pub use record::{RecordError, RecordHeader};
pub use tier::{DiskTier, default_root};
pub use types::{DiskConfig, DiskError, DiskStats};
