//! The operator tools behind the binaries in `src/bin/`: [`cli`] (the node and meta server
//! commands) with [`status`], [`drive`], [`locate`], [`token`] and [`cert`], sharing [`tool`]'s
//! connection and output helpers.

pub mod cert;
pub mod cli;
pub mod drive;
pub mod locate;
pub mod status;
pub mod token;
pub mod tool;
