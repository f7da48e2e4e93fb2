//! What a node serves besides pages: the client API, the HTTP listener and the store RPCs.

pub(crate) mod bearer;
pub(crate) mod client;
pub(crate) mod http;
pub(crate) mod store_rpc;
