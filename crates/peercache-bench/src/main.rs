//! The PeerCache benchmark binary.
fn main() {}
