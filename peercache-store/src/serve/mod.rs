//! What a node serves besides pages: the client API, the HTTP listener (and its `/prefix`
//! query) and the store RPCs;
//! the accept loop and thread the HTTP and KV-event listeners share.

pub(crate) mod bearer;
pub(crate) mod client;
pub(crate) mod http;
pub(crate) mod listener;
pub(crate) mod prefix;
pub(crate) mod store_rpc;
