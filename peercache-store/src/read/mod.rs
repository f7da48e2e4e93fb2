//! The read wing: `get` (local copy or one transport batch per owner, then verification),
//! router hints (owners from the hinted node instead of the directory), device reads, `exists`/`contains`, prefix locations, this node's own pool first, local copies (threads side by side for large batches), the sans-IO read plan, the exists →
//! get hand-off and the registered scratch memory reads land in.

pub(crate) mod api;
pub(crate) mod dest;
pub(crate) mod device;
pub(crate) mod exists;
pub(crate) mod get;
pub(crate) mod hint;
pub(crate) mod local_copy;
pub(crate) mod own;
pub(crate) mod plan;
pub(crate) mod prefix;
pub(crate) mod prime;
pub(crate) mod scratch;
pub(crate) mod wing;
