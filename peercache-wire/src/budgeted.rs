//! The length-delimited codec of an authenticated connection, its large frames charged to the
//! process's [`FrameBudget`] while they arrive.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::shares::{FrameBudget, UNCHARGED_FRAME};

/// The error a [`BudgetedCodec`] ends its connection with when a frame does not fit in what is
/// left of the budget.
#[derive(Debug, thiserror::Error)]
#[error("a {len}-byte frame does not fit in the frame budget ({held} of {cap} bytes held)")]
pub struct OverBudget {
    /// The announced frame length.
    pub len: usize,
    /// Bytes held by other frames when it arrived.
    pub held: usize,
    /// The budget.
    pub cap: usize,
}

/// Decodes like [`crate::frame::codec`] and charges each frame above [`UNCHARGED_FRAME`] to a
/// shared [`FrameBudget`] from its length prefix until it is complete. A frame that does not
/// fit ends the connection with an [`OverBudget`] I/O error; whatever a connection holds is
/// given back when its codec is dropped.
#[derive(Debug)]
pub struct BudgetedCodec {
    inner: LengthDelimitedCodec,
    budget: Option<Arc<FrameBudget>>,
    /// Inside a frame: its length prefix has been read (and the frame charged when `held > 0`).
    in_frame: bool,
    held: usize,
}

impl BudgetedCodec {
    /// Wraps `inner` (whose frame limit still applies); `None` charges nothing.
    pub fn new(inner: LengthDelimitedCodec, budget: Option<Arc<FrameBudget>>) -> Self {
        BudgetedCodec {
            inner,
            budget,
            in_frame: false,
            held: 0,
        }
    }

    /// Bytes this connection holds in the budget now.
    pub fn held(&self) -> usize {
        self.held
    }

    fn release(&mut self) {
        if let Some(b) = &self.budget
            && self.held > 0
        {
            b.give(self.held);
        }
        self.held = 0;
    }
}

impl Decoder for BudgetedCodec {
    type Item = BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, std::io::Error> {
        if !self.in_frame && src.len() >= 4 {
            let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
            // An oversize length is the inner codec's to refuse; charge only what it accepts.
            if let Some(b) = &self.budget
                && len > UNCHARGED_FRAME
                && len <= self.inner.max_frame_length()
            {
                if !b.take(len) {
                    return Err(std::io::Error::other(OverBudget {
                        len,
                        held: b.held(),
                        cap: b.cap(),
                    }));
                }
                self.held = len;
            }
            self.in_frame = true;
        }
        let out = self.inner.decode(src)?;
        if out.is_some() {
            self.in_frame = false;
            self.release();
        }
        Ok(out)
    }
}

impl Encoder<Bytes> for BudgetedCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        self.inner.encode(item, dst)
    }
}

impl Drop for BudgetedCodec {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;

    fn framed(len: usize, body: usize) -> BytesMut {
        let mut b = BytesMut::new();
        b.extend_from_slice(&(len as u32).to_be_bytes());
        b.extend_from_slice(&vec![7u8; body]);
        b
    }

    #[test]
    fn a_large_frame_holds_its_length_until_complete_and_small_ones_hold_nothing() {
        let budget = FrameBudget::new(1 << 20);
        let mut c = BudgetedCodec::new(frame::codec(1 << 20), Some(budget.clone()));
        let mut src = framed(600 << 10, 100);
        assert!(c.decode(&mut src).unwrap().is_none());
        assert_eq!(budget.held(), 600 << 10);
        src.extend_from_slice(&vec![7u8; (600 << 10) - 100]);
        // The rest arrives with a small frame behind it.
        src.extend_from_slice(&framed(10, 10));
        assert_eq!(c.decode(&mut src).unwrap().unwrap().len(), 600 << 10);
        assert_eq!(budget.held(), 0);
        assert_eq!(c.decode(&mut src).unwrap().unwrap().len(), 10);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_frame_past_the_budget_is_refused_and_a_dropped_connection_gives_back() {
        let budget = FrameBudget::new(1 << 20);
        let mut a = BudgetedCodec::new(frame::codec(1 << 20), Some(budget.clone()));
        let mut b = BudgetedCodec::new(frame::codec(1 << 20), Some(budget.clone()));
        assert!(a.decode(&mut framed(700 << 10, 1)).unwrap().is_none());
        let e = b.decode(&mut framed(700 << 10, 1)).unwrap_err();
        let over = e.get_ref().and_then(|e| e.downcast_ref::<OverBudget>());
        assert_eq!(over.map(|o| (o.len, o.held)), Some((700 << 10, 700 << 10)));
        drop(a);
        assert_eq!(budget.held(), 0);
        assert!(b.decode(&mut framed(700 << 10, 1)).unwrap().is_none());
    }

    #[test]
    fn an_oversize_frame_is_the_inner_codecs_refusal_and_charges_nothing() {
        let budget = FrameBudget::new(8 << 20);
        let mut c = BudgetedCodec::new(frame::codec(1 << 20), Some(budget.clone()));
        assert!(c.decode(&mut framed(2 << 20, 1)).is_err());
        assert_eq!(budget.held(), 0);
    }
}
