//! What crosses from Python: waits in seconds, raw segments from addresses and lengths, and
//! the segments of bytes-like buffers, each checked into a `ValueError` rather than a panic.

use std::time::Duration;

use peercache_store::RawSeg;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A wait in seconds from Python: finite and not negative (a `ValueError` otherwise, never a
/// panic).
pub(crate) fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| PyValueError::new_err(format!("{s} is not a number of seconds (finite, ≥ 0)")))
}

/// Segments from parallel lists of addresses and lengths (Python ints); a `ValueError` for
/// lists of different lengths or a null pointer.
pub(crate) fn raw(ptrs: &[usize], sizes: &[usize]) -> PyResult<Vec<RawSeg>> {
    if ptrs.len() != sizes.len() {
        return Err(PyValueError::new_err(format!(
            "{} pointers but {} sizes",
            ptrs.len(),
            sizes.len()
        )));
    }
    if ptrs.contains(&0) {
        return Err(PyValueError::new_err("a segment pointer is null"));
    }
    Ok(ptrs
        .iter()
        .zip(sizes)
        .map(|(&p, &l)| RawSeg {
            ptr: p as *mut u8,
            len: l,
        })
        .collect())
}

/// The segments of bytes-like buffers (one per page); destinations must be writable.
pub(crate) fn buffer_segs(bufs: &[PyBuffer<u8>], writable: bool) -> PyResult<Vec<RawSeg>> {
    let mut segs = Vec::with_capacity(bufs.len());
    for b in bufs {
        if writable && b.readonly() {
            return Err(PyValueError::new_err(
                "destination is read-only (bytes); pass a bytearray, memoryview or array",
            ));
        }
        if !b.is_c_contiguous() {
            return Err(PyValueError::new_err("buffers must be C-contiguous"));
        }
        segs.push(RawSeg {
            ptr: b.buf_ptr() as *mut u8,
            len: b.len_bytes(),
        });
    }
    Ok(segs)
}

/// One page per bytes-like buffer, for `keys` keys: the segments, carried across the GIL
/// release, and their counts (one each). A count that differs from the keys' is a
/// `ValueError`, as is a buffer [`buffer_segs`] refuses.
pub(crate) fn page_buffers(
    keys: usize,
    bufs: &[PyBuffer<u8>],
    writable: bool,
) -> PyResult<(SendSegs, Vec<usize>)> {
    if keys != bufs.len() {
        let what = if writable { "destinations" } else { "values" };
        return Err(PyValueError::new_err(format!(
            "{keys} keys but {} {what}",
            bufs.len()
        )));
    }
    let segs = buffer_segs(bufs, writable)?;
    let counts = vec![1; segs.len()];
    Ok((SendSegs(segs), counts))
}

/// Raw segments carried across the GIL release.
pub(crate) struct SendSegs(pub(crate) Vec<RawSeg>);
