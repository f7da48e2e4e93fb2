//! The store's error type.

use thiserror::Error;

/// Why a node could not start or an operation could not run.
#[derive(Debug, Error)]
pub enum StoreError {
    /// A setting was rejected.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A mode or feature this release does not run yet.
    #[error("{0} is not supported by this release")]
    Unsupported(String),
    /// The pool could not be created.
    #[error("pool: {0}")]
    Pool(#[from] peercache_pool::PoolError),
    /// The transport could not start.
    #[error("transport: {0}")]
    Transport(#[from] peercache_transport::TransportError),
    /// Discovery failed or did not become ready.
    #[error("discovery: {0}")]
    Discovery(#[from] peercache_discovery::DiscoveryError),
    /// The directory could not answer (its shard owners unreachable, timed out or refusing):
    /// the cluster's fault, not the caller's.
    #[error("directory: {0}")]
    Directory(#[from] peercache_directory::DirError),
    /// A control-plane socket failed.
    #[error("control plane: {0}")]
    Wire(#[from] peercache_wire::WireError),
    /// Bad arguments to an API call.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A node refused a client request (see [`crate::client`]); `code` is an RPC error code.
    #[error("node refused the request (code {code}): {message}")]
    Remote {
        /// The `RpcError` code.
        code: u16,
        /// The node's reason.
        message: String,
    },
    /// The node was shut down.
    #[error("the node is shut down")]
    Shutdown,
    /// Other I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl StoreError {
    /// [`StoreError::Shutdown`] once `stopping` is set: what every entry point checks first.
    pub(crate) fn refuse_if_stopping(
        stopping: &std::sync::atomic::AtomicBool,
    ) -> Result<(), StoreError> {
        if stopping.load(std::sync::atomic::Ordering::Acquire) {
            Err(StoreError::Shutdown)
        } else {
            Ok(())
        }
    }
}
