//! `peercache._peercache`: the Rust core behind the `peercache` Python package.
//!
//! A thin layer: `Node` wraps a [`peercache_store::Store`]; every call that does I/O releases
//! the GIL, so SGLang's prefetch, backup and scheduler threads run concurrently. Pointers come
//! from SGLang (`get_page_buffer_meta`, tensor `data_ptr()`), bytes-like objects through the
//! buffer protocol. The pure-Python `peercache.store.PeerCacheStore` adapts this to SGLang's
//! `HiCacheStorage`.

mod args;
mod client;
mod errors;
mod logging;
mod node;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::client::Client;
use crate::errors::{
    DirectoryError, DiscoveryError, PeerCacheError, ShutdownError, TransportError,
};
use crate::node::Node;

/// Runs `peercache-node` with `argv` (program name first) until SIGINT/SIGTERM.
#[pyfunction]
fn run_node(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    use clap::Parser;
    let args = peercache_store::tools::cli::NodeArgs::try_parse_from(argv)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.detach(|| peercache_store::tools::cli::run_node(args, peercache_store::Role::Inference))
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))
}

/// Runs `peercache-storage-server` with `argv`.
#[pyfunction]
fn run_storage_server(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    use clap::Parser;
    let args = peercache_store::tools::cli::NodeArgs::try_parse_from(argv)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.detach(|| peercache_store::tools::cli::run_node(args, peercache_store::Role::Storage))
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))
}

/// Runs `peercache-meta` with `argv`.
#[pyfunction]
fn run_meta(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    use clap::Parser;
    let args = peercache_store::tools::cli::MetaArgs::try_parse_from(argv)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.detach(|| peercache_store::tools::cli::run_meta(args))
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))
}

/// The block hash KV events carry for `key` (docs/operations.md, "KV events"): its 16-byte page key, big
/// endian, in the keyspace of `prefix` (a node's `prefix` key; empty: none).
#[pyfunction]
#[pyo3(signature = (key, prefix = ""))]
fn page_hash<'py>(py: Python<'py>, key: &str, prefix: &str) -> Bound<'py, pyo3::types::PyBytes> {
    let k = peercache_store::Keyspace::new(prefix).page_key(key);
    pyo3::types::PyBytes::new(py, &k.0.to_be_bytes())
}

/// The read-only client token of the cluster `secret` (64 hex digits): a `Client` that gives it
/// as its `cluster_secret` may read, check and locate pages on a node's client API, and its
/// writes are refused. `ValueError` for a secret shorter than 16 bytes.
#[pyfunction]
fn read_only_token(secret: &str) -> PyResult<String> {
    peercache_wire::auth::read_only_token(secret.as_bytes())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The extension module.
#[pymodule]
fn _peercache(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Node>()?;
    m.add_class::<Client>()?;
    m.add_function(wrap_pyfunction!(run_node, m)?)?;
    m.add_function(wrap_pyfunction!(page_hash, m)?)?;
    m.add_function(wrap_pyfunction!(read_only_token, m)?)?;
    m.add_function(wrap_pyfunction!(run_meta, m)?)?;
    m.add_function(wrap_pyfunction!(run_storage_server, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let py = m.py();
    m.add("PeerCacheError", py.get_type::<PeerCacheError>())?;
    m.add("DirectoryError", py.get_type::<DirectoryError>())?;
    m.add("TransportError", py.get_type::<TransportError>())?;
    m.add("DiscoveryError", py.get_type::<DiscoveryError>())?;
    m.add("ShutdownError", py.get_type::<ShutdownError>())?;
    Ok(())
}
