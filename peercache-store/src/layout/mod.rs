//! Page layouts: the shape of the pages a store writes and expects ([`page`]) and slot mode's
//! pre-agreed regions ([`slot`]).

pub mod page;
pub mod slot;
