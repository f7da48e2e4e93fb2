//! The deployment modes beside peer-to-peer: centralized and hybrid (storage servers), slot
//! mode (pre-agreed regions), and the state each keeps.

pub(crate) mod central;
pub(crate) mod slot;
pub(crate) mod state;
pub(crate) mod storage_view;
