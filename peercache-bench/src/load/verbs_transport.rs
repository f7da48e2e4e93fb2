//! A bare transport whose RDMA path runs on a verbs device — what `micro --protocol rdma`
//! measures against `ib_read_bw` (the transport alone, no store). Needs the `rdma` feature.

use anyhow::{Result, bail};
use peercache_transport::{Transport, TransportConfig};

/// The device a verbs transport opens, as the node settings name it (`device_names`,
/// `gid_index`, `ib_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsDevice {
    /// The RDMA device (one rail).
    pub device: String,
    /// GID index (RoCE v2 on soft-RoCE: 1).
    pub gid_index: i32,
    /// Port number, 1-based.
    pub ib_port: u8,
}

impl VerbsDevice {
    /// The device the `--set` items name, with the node defaults (GID index 3, port 1) for
    /// what they leave out; `None` without `device_names`.
    pub fn from_settings(items: &[String]) -> Result<Option<VerbsDevice>> {
        let m = peercache_store::config::parse_overrides(items)?;
        let text = |k: &str| {
            m.get(k)
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
        };
        let Some(device) = text("device_names").filter(|d| !d.is_empty()) else {
            return Ok(None);
        };
        if device.contains(',') {
            bail!("micro's transport rows use one rail: device_names={device}");
        }
        let gid_index = text("gid_index").map_or(Ok(3), |g| g.parse())?;
        let ib_port = text("ib_port").map_or(Ok(1), |p| p.parse())?;
        Ok(Some(VerbsDevice {
            device,
            gid_index,
            ib_port,
        }))
    }

    /// As `micro-server` arguments.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--rdma-device".into(),
            self.device.clone(),
            "--gid-index".into(),
            self.gid_index.to_string(),
            "--ib-port".into(),
            self.ib_port.to_string(),
        ]
    }
}

/// A transport on loopback; with `device`, its RDMA path runs on that verbs device (and takes
/// one-sided writes: `rdma_writes`).
pub fn start(device: Option<&VerbsDevice>, name: &str) -> Result<Transport> {
    let Some(device) = device else {
        return Ok(Transport::start(TransportConfig::default(), None)?);
    };
    start_verbs(device, name)
}

#[cfg(feature = "rdma")]
fn start_verbs(device: &VerbsDevice, name: &str) -> Result<Transport> {
    use peercache_transport::rdma::path::RdmaPath;
    use peercache_transport::rdma::verbs::{SidewayVerbs, VerbsConfig};
    use peercache_wire::{NodeId, auth::Auth};
    let timeout = std::time::Duration::from_secs(20);
    let node = NodeId::new(name)?;
    let verbs = SidewayVerbs::open(VerbsConfig {
        devices: vec![device.device.clone()],
        ib_port: device.ib_port,
        gid_index: device.gid_index,
        sq_depth: 128,
        max_sge: 16,
        node: Some(node.clone()),
        auth: Auth::none(),
        bootstrap_timeout: timeout,
    })
    .map_err(|why| anyhow::anyhow!("opening {}: {why}", device.device))?;
    let path = RdmaPath::new(verbs, Some(node.clone()), Auth::none(), timeout);
    let cfg = TransportConfig {
        op_timeout: timeout,
        rdma_writes: true,
        host_local: false,
        ..TransportConfig::default()
    };
    Ok(Transport::start_with_rdma(cfg, Some(node), Some(path))?)
}

#[cfg(not(feature = "rdma"))]
fn start_verbs(device: &VerbsDevice, _name: &str) -> Result<Transport> {
    bail!(
        "micro --protocol rdma on {}: this build has no RDMA support (build with --features rdma)",
        device.device
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_comes_from_the_node_settings() {
        let items = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            VerbsDevice::from_settings(&items(&["gid_index=1"])).unwrap(),
            None
        );
        let d = VerbsDevice::from_settings(&items(&["device_names=rxe0", "gid_index=1"]))
            .unwrap()
            .unwrap();
        assert_eq!((d.device.as_str(), d.gid_index, d.ib_port), ("rxe0", 1, 1));
        assert!(VerbsDevice::from_settings(&items(&["device_names=a,b"])).is_err());
        assert!(VerbsDevice::from_settings(&items(&["device_names=x", "gid_index=z"])).is_err());
    }
}
