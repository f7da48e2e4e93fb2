//! The operator tools behind the binaries in `src/bin/`: [`cli`] (the node and meta server
//! commands) with [`status`], [`drive`] and [`locate`], sharing [`tool`]'s connection and
//! output helpers.

pub mod cli;
pub mod drive;
pub mod locate;
pub mod status;
pub mod tool;
