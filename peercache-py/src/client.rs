//! `Client`: a client of one node's client API, for processes that run no node.

use std::time::Duration;

use peercache_store::PeerCacheConfig;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::args::buffer_segs;
use crate::errors::to_py;

/// A client of one node's client API (`client_enabled` on that node): for processes that do
/// not run a node themselves. Every call copies the pages through a frame and releases the GIL.
#[pyclass(frozen)]
pub(crate) struct Client {
    inner: peercache_store::client::Client,
}

#[pymethods]
impl Client {
    /// A client of the node serving the client API at `endpoint` (`host:port`); the cluster
    /// secret if the cluster has one; `timeout` bounds each call, in seconds.
    #[new]
    #[pyo3(signature = (endpoint, cluster_secret=None, timeout=10.0))]
    fn new(endpoint: &str, cluster_secret: Option<String>, timeout: f64) -> PyResult<Self> {
        let addr: std::net::SocketAddr = endpoint
            .parse()
            .map_err(|e| PyValueError::new_err(format!("endpoint {endpoint:?}: {e}")))?;
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        let cfg = PeerCacheConfig {
            cluster_secret: peercache_store::config::Secret::new(
                cluster_secret.unwrap_or_default(),
            ),
            ..Default::default()
        };
        let auth = cfg
            .cluster_auth()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Client {
            inner: peercache_store::client::Client::new(
                addr,
                auth,
                Duration::from_secs_f64(timeout),
            ),
        })
    }

    /// Publishes pages (bytes-like, all the same size) on the node. One flag per page.
    fn put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        pages: Vec<PyBuffer<u8>>,
    ) -> PyResult<Vec<bool>> {
        let segs = buffer_segs(&pages, false)?;
        // SAFETY: each segment is a C-contiguous buffer the `pages` list keeps alive (and
        // exported, so not resized) for the whole call.
        let slices: Vec<&[u8]> = segs
            .iter()
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect();
        py.detach(|| self.inner.put(&keys, &slices)).map_err(to_py)
    }

    /// Reads pages of `page_bytes` each: `bytes` per key, or `None` for a miss.
    fn get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        page_bytes: usize,
    ) -> PyResult<Vec<Option<Bound<'py, pyo3::types::PyBytes>>>> {
        let got = py
            .detach(|| self.inner.get(&keys, page_bytes))
            .map_err(to_py)?;
        Ok(got
            .into_iter()
            .map(|p| p.map(|p| pyo3::types::PyBytes::new(py, &p.bytes)))
            .collect())
    }

    /// Which keys are stored anywhere in the cluster.
    fn exists(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<bool>> {
        py.detach(|| self.inner.exists(&keys)).map_err(to_py)
    }

    /// Where a request's prefix is, as a JSON text: every node holding the first key, with
    /// its leading run of `keys` (in order) and the in-memory part of it, longest first
    /// (`[{"node", "leading", "resident"}, …]`); one directory fan-out.
    fn prefix_locations_json(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<String> {
        let runs = py
            .detach(|| self.inner.prefix_locations(&keys))
            .map_err(to_py)?;
        Ok(peercache_store::prefix_json(&runs).to_string())
    }

    /// Where the directory says each key lives, as a JSON text: per key, a list of owners
    /// (`node`, `resident`, `class`, `generation`, `len`, `valid_len`, `data`); empty = not
    /// listed.
    fn locate_json(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<String> {
        let found = py.detach(|| self.inner.locate(&keys)).map_err(to_py)?;
        let rows: Vec<Vec<serde_json::Value>> = found
            .iter()
            .map(|owners| {
                owners
                    .iter()
                    .map(peercache_store::tools::locate::location_json)
                    .collect()
            })
            .collect();
        Ok(serde_json::Value::from(rows).to_string())
    }
}
