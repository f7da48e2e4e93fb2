//! The Python exceptions a node raises, and a store error mapped to its kind.

use peercache_store::StoreError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _peercache,
    PeerCacheError,
    PyRuntimeError,
    "A node could not do what was asked: the cluster's fault, not the caller's (a bad \
     argument raises ValueError)."
);
pyo3::create_exception!(
    _peercache,
    DirectoryError,
    PeerCacheError,
    "The directory could not answer: its shard owners unreachable, timed out or refusing."
);
pyo3::create_exception!(
    _peercache,
    TransportError,
    PeerCacheError,
    "A transport or control-plane connection failed, or a node refused a client request."
);
pyo3::create_exception!(
    _peercache,
    DiscoveryError,
    PeerCacheError,
    "Discovery failed, or the node did not join the cluster in time."
);
pyo3::create_exception!(
    _peercache,
    ShutdownError,
    PeerCacheError,
    "The node was closed."
);

/// A store error as the Python exception of its kind: the caller's mistakes as `ValueError`,
/// the cluster's as a [`PeerCacheError`] subclass (all `RuntimeError`s).
pub(crate) fn to_py(e: StoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        StoreError::Config(_) | StoreError::BadRequest(_) | StoreError::Unsupported(_) => {
            PyValueError::new_err(msg)
        }
        StoreError::Directory(_) => DirectoryError::new_err(msg),
        StoreError::Transport(_) | StoreError::Wire(_) | StoreError::Remote { .. } => {
            TransportError::new_err(msg)
        }
        StoreError::Discovery(_) => DiscoveryError::new_err(msg),
        StoreError::Shutdown => ShutdownError::new_err(msg),
        StoreError::Pool(_) | StoreError::Io(_) => PeerCacheError::new_err(msg),
    }
}
