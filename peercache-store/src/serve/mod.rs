//! What a node serves besides pages: the HTTP listener and the store RPCs.

pub(crate) mod http;
pub(crate) mod store_rpc;
