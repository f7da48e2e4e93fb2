//! The operator tools behind the binaries in `src/bin/`: [`cli`] (the node and meta server
//! commands) with [`status`], [`drive`], [`locate`], [`token`] and [`cert`], sharing [`tool`]'s
//! connection and output helpers, and [`secs`]' parsers of seconds on a command line.

pub mod cert;
pub mod cli;
pub mod drive;
pub mod locate;
pub mod secs;
pub mod status;
pub mod token;
pub mod tool;
