//! `Node`: one PeerCache node in this process; every call that does I/O releases the GIL.

use peercache_store::{PeerCacheConfig, Store};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::args::{SendSegs, page_buffers, raw, seconds};
use crate::errors::to_py;
use crate::logging;

/// One PeerCache node in this process.
#[pyclass(frozen)]
pub(crate) struct Node {
    store: Store,
    warnings: Vec<String>,
}

#[pymethods]
impl Node {
    /// Starts a node from a JSON object of config keys (`PEERCACHE_<KEY>` variables override).
    #[new]
    fn new(py: Python<'_>, config_json: &str) -> PyResult<Self> {
        logging::install();
        let v: serde_json::Value = serde_json::from_str(config_json)
            .map_err(|e| PyValueError::new_err(format!("config is not JSON: {e}")))?;
        let map = v
            .as_object()
            .ok_or_else(|| PyValueError::new_err("config must be a JSON object"))?;
        let env = peercache_store::config::process_env();
        let (cfg, warnings) =
            PeerCacheConfig::from_sources(Some(map), None, &env, &Default::default())
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let store = py.detach(|| Store::start(cfg)).map_err(to_py)?;
        Ok(Node { store, warnings })
    }

    /// Waits until the node is in the cluster (`None`: forever).
    #[pyo3(signature = (timeout=None))]
    fn wait_ready(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let t = timeout.map(seconds).transpose()?;
        py.detach(|| self.store.wait_ready(t)).map_err(to_py)
    }

    /// Waits until discovery sees `n` members; returns whether it did within `timeout`.
    fn wait_members(&self, py: Python<'_>, n: usize, timeout: f64) -> PyResult<bool> {
        let t = seconds(timeout)?;
        Ok(py.detach(|| self.store.wait_members(n, t)))
    }

    /// This node's id.
    #[getter]
    fn node_id(&self) -> String {
        self.store.node_id().to_string()
    }

    /// Warnings from the config (unknown keys).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// The metrics endpoint, if enabled.
    #[getter]
    fn metrics_endpoint(&self) -> Option<String> {
        self.store.metrics_endpoint().map(|a| a.to_string())
    }

    /// The client API endpoint (`client_enabled`), if served.
    #[getter]
    fn client_endpoint(&self) -> Option<String> {
        self.store.client_endpoint().map(|a| a.to_string())
    }

    /// Registers host memory (SGLang's `kv_buffer`) as a local-only read destination.
    ///
    /// The memory must stay valid until the node is closed.
    fn register_host_buffer(&self, ptr: usize, length: usize) -> PyResult<()> {
        if ptr == 0 || length == 0 {
            return Err(PyValueError::new_err(
                "register_host_buffer needs a non-null pointer and a length",
            ));
        }
        // SAFETY: the caller (the Python facade) registers SGLang's host pool, which lives for
        // the whole process, as documented.
        unsafe { self.store.register_host_buffer(ptr as *mut u8, length) }.map_err(to_py)
    }

    /// Registers device (GPU) memory exported as a dma-buf (`fd`, `offset`, `length`) as a
    /// destination of `batch_get_device_ptrs`, addressed by `iova` (the device address).
    /// Only RDMA reaches device memory: a node without an RDMA path raises `RuntimeError`
    /// saying what is missing.
    ///
    /// The memory and the fd must stay valid until the node is closed.
    fn register_device_dmabuf(
        &self,
        fd: i32,
        offset: u64,
        length: usize,
        iova: u64,
    ) -> PyResult<()> {
        if fd < 0 || length == 0 || iova == 0 {
            return Err(PyValueError::new_err(
                "register_device_dmabuf needs an open fd, a length and a non-zero iova",
            ));
        }
        let mem = peercache_store::DeviceMemory::Dmabuf {
            fd,
            offset,
            len: length,
            iova,
        };
        // SAFETY: the caller keeps the device memory and its fd alive while the node runs, as
        // documented.
        unsafe { self.store.register_device_buffer(mem) }.map_err(to_py)
    }

    /// Registers device memory at device address `addr` (needs the `nvidia-peermem` module) as
    /// a destination of `batch_get_device_ptrs`.
    ///
    /// The memory must stay valid until the node is closed.
    fn register_device_peermem(&self, addr: u64, length: usize) -> PyResult<()> {
        if addr == 0 || length == 0 {
            return Err(PyValueError::new_err(
                "register_device_peermem needs a non-null device address and a length",
            ));
        }
        let mem = peercache_store::DeviceMemory::PeerMem { addr, len: length };
        // SAFETY: as register_device_dmabuf.
        unsafe { self.store.register_device_buffer(mem) }.map_err(to_py)
    }

    /// Reads pages straight into registered device memory over RDMA (GPUDirect); `True` = the
    /// segments hold the page. Pages this node holds and pages of peers reached without RDMA
    /// are `False` here: read those into host memory.
    fn batch_get_device_ptrs(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        counts: Vec<usize>,
    ) -> PyResult<Vec<bool>> {
        let segs = SendSegs(raw(&ptrs, &sizes)?);
        // SAFETY: the segments lie in registered device memory (checked by the store) that the
        // caller keeps alive and does not use during the call.
        py.detach(|| unsafe { self.store.batch_get_device(&keys, &segs.0, &counts) })
            .map(|r| r.iter().map(Option::is_some).collect())
            .map_err(to_py)
    }

    /// Declares the shape of this node's pages from a layout spec (JSON: model, kv_dtype,
    /// pp_rank, tp, pools); returns the fingerprint as 16 hex digits. A malformed spec is a
    /// `ValueError` naming the field.
    fn set_layout(&self, spec_json: &str) -> PyResult<String> {
        let spec = peercache_store::layout::page::LayoutSpec::from_json(spec_json)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(self.store.set_layout(&spec).to_string())
    }

    /// Publishes pages from raw segments: `counts[i]` segments (from `ptrs`/`sizes`) for key `i`.
    fn batch_set_ptrs(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        counts: Vec<usize>,
    ) -> PyResult<Vec<bool>> {
        let segs = raw(&ptrs, &sizes)?;
        let segs = SendSegs(segs);
        // SAFETY: the pointers come from live SGLang buffers or tensors the caller keeps alive
        // for the call; they are only read.
        py.detach(|| unsafe { self.store.batch_set_raw(&keys, &segs.0, &counts) })
            .map_err(to_py)
    }

    /// Reads pages into raw segments; `True` = the segments hold the page. `hint`: the node
    /// a router says holds them (asked first, instead of the directory).
    #[pyo3(signature = (keys, ptrs, sizes, counts, hint=None))]
    fn batch_get_ptrs(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        counts: Vec<usize>,
        hint: Option<String>,
    ) -> PyResult<Vec<bool>> {
        let segs = SendSegs(raw(&ptrs, &sizes)?);
        // SAFETY: the pointers come from live, writable SGLang buffers or tensors the caller
        // keeps alive and does not touch during the call.
        py.detach(|| unsafe {
            self.store
                .batch_get_raw_hinted(&keys, &segs.0, &counts, hint.as_deref())
        })
        .map_err(to_py)
    }

    /// Publishes pages from raw segments, page `i` holding data in its first `valid_lens[i]`
    /// bytes (a partial tail page; the whole page is stored).
    fn batch_set_partial_ptrs(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        counts: Vec<usize>,
        valid_lens: Vec<u32>,
    ) -> PyResult<Vec<bool>> {
        let segs = SendSegs(raw(&ptrs, &sizes)?);
        // SAFETY: as `batch_set_ptrs`: live buffers the caller keeps alive, only read.
        py.detach(|| unsafe {
            self.store
                .batch_set_partial_raw(&keys, &segs.0, &counts, &valid_lens)
        })
        .map_err(to_py)
    }

    /// Reads pages into raw segments; per page its valid length in bytes, or `None` (a miss).
    fn batch_get_valid_ptrs(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        counts: Vec<usize>,
    ) -> PyResult<Vec<Option<u32>>> {
        let segs = SendSegs(raw(&ptrs, &sizes)?);
        // SAFETY: as `batch_get_ptrs`: live, writable buffers untouched during the call.
        py.detach(|| unsafe { self.store.batch_get_valid_raw(&keys, &segs.0, &counts) })
            .map_err(to_py)
    }

    /// The valid length in bytes of each leading present page (the list's length is the
    /// leading count).
    fn batch_exists_valid(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<u32>> {
        py.detach(|| self.store.batch_exists_valid(&keys))
            .map_err(to_py)
    }

    /// Publishes bytes-like values (one contiguous buffer per page).
    fn batch_set_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<PyBuffer<u8>>,
    ) -> PyResult<Vec<bool>> {
        let (segs, counts) = page_buffers(keys.len(), &values, false)?;
        // SAFETY: the buffers are held (exported) by `values` for the whole call.
        let r = py
            .detach(|| unsafe { self.store.batch_set_raw(&keys, &segs.0, &counts) })
            .map_err(to_py);
        drop(values);
        r
    }

    /// Reads pages into writable bytes-like destinations (bytearray, memoryview, numpy).
    /// A read-only destination is an error, never a silent "hit".
    fn batch_get_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        dests: Vec<PyBuffer<u8>>,
    ) -> PyResult<Vec<bool>> {
        let (segs, counts) = page_buffers(keys.len(), &dests, true)?;
        // SAFETY: writable buffers held (exported) by `dests` for the whole call.
        let r = py
            .detach(|| unsafe { self.store.batch_get_raw(&keys, &segs.0, &counts) })
            .map_err(to_py);
        drop(dests);
        r
    }

    /// Where a request's prefix is, as a JSON text (see `Client.prefix_locations_json`); the
    /// node applies its key `prefix`.
    fn prefix_locations_json(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<String> {
        let runs = py
            .detach(|| self.store.prefix_locations(&keys))
            .map_err(to_py)?;
        Ok(peercache_store::prefix_json(&runs).to_string())
    }

    /// How many leading pages are present. `hint`: the node a router says holds them (asked
    /// first; the directory only for what it does not hold).
    #[pyo3(signature = (keys, hint=None))]
    fn batch_exists(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        hint: Option<String>,
    ) -> PyResult<usize> {
        py.detach(|| match hint.as_deref() {
            Some(h) => self.store.batch_exists_hinted(&keys, h),
            None => self.store.batch_exists(&keys),
        })
        .map_err(to_py)
    }

    /// Presence of every key (not only the leading run), one directory fan-out.
    fn batch_contains(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<bool>> {
        py.detach(|| self.store.batch_contains(&keys))
            .map_err(to_py)
    }

    /// Waits up to `timeout_s` seconds until every key is present; returns the leading count.
    fn wait_for_full_prefix(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        timeout_s: f64,
    ) -> PyResult<usize> {
        let t = seconds(timeout_s)?;
        py.detach(|| self.store.wait_for_full_prefix(&keys, t))
            .map_err(to_py)
    }

    /// Removes every page this node published. Returns how many.
    fn clear(&self, py: Python<'_>) -> usize {
        py.detach(|| self.store.clear())
    }

    /// Counters as a JSON object string.
    fn stats_json(&self) -> String {
        let s = self.store.stats();
        let ready = self.store.pool_readiness();
        serde_json::json!({
            "pool_ready_bytes": ready.ready_bytes, "pool_total_bytes": ready.total_bytes,
            "pool_ready": ready.is_ready(),
            "pool_pages": s.pool_pages, "pool_evictions": s.pool_evictions,
            "evictions_notified": s.evictions_notified, "directory_rpcs": s.directory_rpcs,
            "directory_local_calls": s.directory_local_calls,
            "shard_entries": s.shard_entries, "transport_read_bytes": s.transport_read_bytes,
            "transport_local_read_bytes": s.transport_local_read_bytes,
            "members": s.members, "primed": s.primed,
            "verify_rejects": s.verify_rejects, "staged_reads": s.staged_reads,
            "rdma_read_bytes": s.rdma_read_bytes, "rdma_fallbacks": s.rdma_fallbacks,
            "layout_mismatches": s.layout_mismatches,
            "read_hint_hits": s.read_hint_hits, "read_hint_misses": s.read_hint_misses,
            "layout": self.store.layout().to_string(),
        })
        .to_string()
    }

    /// The `/cluster` view as a JSON string.
    fn cluster_json(&self) -> String {
        self.store.cluster_view().to_string()
    }

    /// Leaves the cluster and releases everything; idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.store.shutdown());
    }
}
