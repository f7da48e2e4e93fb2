//! Starting a node: validates the config, allocates and registers the pool, starts the
//! transport, the directory shard and its control listener, the client API, discovery, the
//! disk tier and the background tasks, and assembles the [`Core`]. `build` is long because it
//! is one sequence whose order matters (memory before the listeners that serve it; every
//! listener before discovery advertises it); each step is a few lines.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use peercache_directory::{DirectoryClient, DirectoryService};
use peercache_discovery::{DiscoveryServer, Hosting, Membership, NodeInfo, Source};
use peercache_pool::{Pool, PoolConfig};
use peercache_transport::{Access, RegionOptions, Transport};
use peercache_wire::envelope::Message;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, Reply, RpcClient, RpcError, RpcServer, ServerConfig};
use peercache_wire::{Incarnation, NodeId};

use crate::StoreError;
use crate::config::{Mode, PeerCacheConfig, Protocol, Role};
use crate::control::StoreRequest;
use crate::modes::state::{ModeState, StorageMode, StorageServer};
use crate::node::core::Core;
use crate::node::identity::Identity;
use crate::node::keys::Keyspace;
use crate::node::parts::{ReadState, Servers, Tasks};
use crate::observe::series::Handles;
use crate::tasks::evict::EvictionBatcher;

use crate::node::setup::{
    PoolResidency, advertise, bind_addr, open_disk, rank_port, rdma_plane, resolve_local_host,
};

/// Starts a node: checks `cfg`, picks the transport, derives the node id, and builds the node
/// under its own metrics recorder when metrics are on.
pub(crate) fn start(cfg: PeerCacheConfig) -> Result<Arc<Core>, StoreError> {
    cfg.validate()?;
    if cfg.mode == Mode::P2p && cfg.role == Role::Storage {
        return Err(StoreError::Unsupported(
            "role storage needs mode centralized or hybrid".into(),
        ));
    }
    let transport_why: String = match (cfg.protocol, cfg.rdma_backend) {
        (Protocol::Tcp, _) => "protocol=tcp".into(),
        (Protocol::Rdma, crate::RdmaBackend::Soft) => "rdma (software fabric)".into(),
        (Protocol::Rdma, crate::RdmaBackend::Verbs) => {
            use peercache_transport::rdma::{memlock_shortfall, probe};
            let ready = probe(&cfg.rdma_devices()).and_then(|devices| {
                match memlock_shortfall(cfg.pool_bytes()) {
                    Some(why) => Err(why),
                    None => Ok(devices),
                }
            });
            match ready {
                Ok(devices) => format!("rdma (devices {devices:?}; tcp to peers without)"),
                Err(why) => {
                    tracing::warn!("protocol=rdma requested but {why}; using the TCP transport");
                    format!("tcp (rdma fallback: {why})")
                }
            }
        }
    };
    // With etcd there are no seeds: the node routes towards etcd, and a derived id has
    // meta port 0 unless `discovery_addr` still names one.
    let seeds = if cfg.discovery_addr.is_empty() {
        Vec::new()
    } else {
        peercache_discovery::parse_seeds(&cfg.discovery_addr).map_err(StoreError::Discovery)?
    };
    let meta_port = seeds.first().map_or(0, |s| s.port());
    let host = if seeds.is_empty() {
        resolve_local_host(&cfg, &cfg.etcd_addrs())
    } else {
        resolve_local_host(&cfg, &seeds)
    };
    let me = if cfg.node_id.is_empty() {
        peercache_discovery::derive_node_id(
            &host.to_string(),
            meta_port,
            cfg.tp_rank,
            cfg.pp_rank,
            cfg.dp_rank,
            &cfg.prefix,
        )
        .map_err(StoreError::Wire)?
    } else {
        NodeId::new(&cfg.node_id).map_err(StoreError::Wire)?
    };
    if cfg.metrics_enabled {
        // Every handle the node and its crates register gets `node=<id>`.
        let rec = crate::observe::node_recorder(me.as_str());
        metrics::with_local_recorder(&rec, || {
            build(cfg, me, host, seeds, meta_port, transport_why)
        })
    } else {
        build(cfg, me, host, seeds, meta_port, transport_why)
    }
}

fn build(
    cfg: PeerCacheConfig,
    me: NodeId,
    host: IpAddr,
    seeds: Vec<SocketAddr>,
    meta_port: u16,
    transport_why: String,
) -> Result<Arc<Core>, StoreError> {
    let incarnation = Incarnation::fresh();
    let nofile = crate::node::fdlimit::raise_nofile();
    let conn_cap = crate::node::fdlimit::connection_cap(cfg.max_inbound_connections, nofile);
    let explicit_host = !cfg.local_hostname.is_empty();
    let metrics = Handles::register(me.as_str());
    let auth = cfg.cluster_auth()?;
    if let Some(cert) = auth.identity().and_then(|i| i.cert())
        && !cert.covers(&me)
    {
        return Err(crate::config::ConfigError::Invalid {
            key: "node_cert_file",
            value: cert.subject.clone(),
            reason: format!(
                "the certificate covers {:?}, not this node's id {me} (set node_id, or \
                     issue a certificate for it)",
                cert.subject
            ),
        }
        .into());
    }
    if let Some(warning) = cfg.check_authentication(&auth)? {
        tracing::warn!("{warning}");
    }
    if let Some(warning) = cfg.secret_file_warning() {
        tracing::warn!("{warning}");
    }
    // Discovery: host the meta server if the port is free (with etcd there is no meta
    // server: etcd keeps the membership). Claimed before any listener on an ephemeral port,
    // so the kernel cannot hand the configured meta port to one of this node's own sockets;
    // the node joins once its endpoints are known, below.
    let source = match cfg.discovery {
        crate::DiscoveryKind::Builtin => Source::Masters(cfg.discovery(seeds, auth.clone())),
        crate::DiscoveryKind::Etcd => Source::Etcd(cfg.etcd()?),
    };
    // The meta, control and client ports' shares: one frame budget for all three, one
    // share of each port's connection cap per source address when configured.
    let frame_budget = peercache_wire::shares::FrameBudget::new(
        usize::try_from(cfg.frame_budget_bytes).unwrap_or(usize::MAX),
    );
    let shares = || rpc::Shares {
        per_source: (cfg.max_inbound_connections_per_source > 0).then(|| {
            peercache_wire::shares::SourceShare::new(cfg.max_inbound_connections_per_source)
        }),
        frame_budget: Some(frame_budget.clone()),
    };
    let meta = match &source {
        Source::Masters(_) => {
            let ttl = Duration::from_secs_f64(cfg.member_ttl);
            let meta_bind = bind_addr(&cfg.meta_bind_host, meta_port)?;
            let hosting = DiscoveryServer::try_host_with(
                meta_bind,
                ttl,
                Some(me.clone()),
                auth.clone(),
                shares(),
            )?;
            match hosting {
                Hosting::Hosting(s) => {
                    s.check_sources(cfg.meta_check_sources);
                    Some(s)
                }
                Hosting::PortTaken => {
                    // Normal for co-located ranks; if nobody answers there, this line
                    // and the join timeout name the port to look at.
                    tracing::info!(meta = %meta_bind, "meta port taken: joining the discovery server listening there");
                    None
                }
            }
        }
        Source::Etcd(_) => None,
    };
    let cell: crate::node::core::NodeCell = Default::default();
    let http = if cfg.metrics_enabled {
        let port = rank_port(cfg.metrics_port, &cfg);
        // The unauthenticated port binds the node's own address unless told otherwise.
        let bind = if cfg.metrics_bind_host.is_empty() {
            SocketAddr::new(host, port)
        } else {
            bind_addr(&cfg.metrics_bind_host, port)?
        };
        let limits = crate::serve::http::HttpLimits {
            max_connections: crate::serve::http::HttpLimits::default()
                .max_connections
                .min(conn_cap),
            ..Default::default()
        };
        let refused =
            metrics::counter!(crate::observe::series::HTTP_REFUSED, "node" => me.to_string());
        if let Some(warning) = cfg.http_token_file_warning() {
            tracing::warn!("{warning}");
        }
        // Registered (at 0) with or without a token: every documented series is there.
        let unauthorized = metrics::counter!(
            crate::observe::series::HTTP_UNAUTHORIZED, "node" => me.to_string()
        );
        let guard = cfg
            .http_token()?
            .map(|t| crate::serve::bearer::BearerGuard::new(t.as_bytes(), unauthorized));
        Some(crate::observe::serve(
            bind,
            cell.clone(),
            crate::observe::Pages {
                dashboard: cfg.metrics_dashboard,
                guard,
            },
            limits,
            refused,
        )?)
    } else {
        None
    };
    let metrics_endpoint = http
        .as_ref()
        .map(|h| advertise(h.addr, host, explicit_host));

    // Memory first: allocate and pre-fault the pool once.
    let storage_role = cfg.role == Role::Storage;
    // A centralized inference node publishes nothing itself: a minimal pool keeps the
    // read-side machinery (leases, scratch) uniform.
    // Slotmap nodes keep their pages in the slot region instead.
    let pool_bytes =
        if (cfg.mode == Mode::Centralized && !storage_role) || cfg.mode == Mode::Slotmap {
            4 << 20
        } else {
            cfg.pool_bytes() as usize
        };
    // With the host-local path the pool lives in a sealed memory file that readers on this
    // host map read-only. The first slabs are faulted in now, the rest in the background
    // while the node serves.
    let pool_cfg = PoolConfig {
        fault_threads: cfg.pool_fault_threads,
        allow_overcommit: cfg.pool_allow_overcommit,
        ..PoolConfig::new(pool_bytes)
    };
    let pool = if cfg.host_local {
        Pool::with_alloc(pool_cfg, &peercache_pool::mem::MemfdAlloc::default())
    } else {
        Pool::new(pool_cfg)
    };
    let pool = Arc::new(pool.map_err(|e| match e {
        peercache_pool::PoolError::HostTooSmall { .. } => {
            StoreError::Config(crate::config::ConfigError::Invalid {
                key: "global_segment_size",
                value: cfg.global_segment_size.to_string(),
                reason: format!(
                    "{e} (lower global_segment_size, or set pool_allow_overcommit = true)"
                ),
            })
        }
        e => StoreError::Pool(e),
    })?);
    let rdma = if transport_why.starts_with("rdma") {
        rdma_plane(&cfg, &me, &auth, pool.slab_bytes())
    } else {
        None
    };
    let transport_why = if rdma.is_none() && transport_why.starts_with("rdma") {
        "tcp (rdma fallback: the RDMA backend did not open)".to_string()
    } else {
        transport_why
    };
    tracing::info!(transport = %transport_why, "transport selected");
    let transport = Arc::new(Transport::start_with_rdma(
        cfg.transport(
            bind_addr(&cfg.rdma_bind_host, rank_port(cfg.rdma_port, &cfg))?,
            conn_cap,
            auth.clone(),
        ),
        Some(me.clone()),
        rdma,
    )?);
    // Storage servers accept remote writes, only into reserved slots and only from the
    // node that reserved them; every other pool is remote-read only.
    let reservations = storage_role.then(|| {
        Arc::new(Mutex::new(
            crate::modes::storage_view::Reservations::default(),
        ))
    });
    let region = match &reservations {
        Some(r) => RegionOptions::guarded(Arc::new(crate::modes::storage_view::ReservationGuard(
            r.clone(),
        ))),
        None => RegionOptions::new(Access::RemoteRead),
    };
    // The pool warms in the background: each RDMA registration chunk waits for its slabs.
    let region = region.resident_when(Arc::new(PoolResidency(Arc::downgrade(&pool))));
    // SAFETY: the pool's mapping outlives the registration: `Core` drops `pool_region`
    // (explicitly in shutdown, and by field order) before `pool`.
    let pool_region = unsafe { transport.register_with(pool.base(), pool.len(), region) }?;
    if let Some(fd) = pool.shared_fd() {
        transport.share(&pool_region, fd, 0)?;
    }
    let pool_key = pool_region.key().0;
    let (slots, slot_layout) = if cfg.mode == Mode::Slotmap {
        let map = Arc::new(peercache_pool::slotmap::SlotMap::new(
            cfg.slot_max_page_bytes as u32,
            cfg.slot_ways,
            cfg.slot_num_buckets,
            cfg.pool_bytes(),
        )?);
        // SAFETY: the slot region outlives its registration: `Core` drops `slot_region`
        // (explicitly in shutdown, and by field order) before `slotmap`.
        let h = unsafe { transport.register(map.base(), map.len(), Access::RemoteRead) }?;
        let layout =
            crate::modes::slot::encode_layout(h.key().0, map.base() as u64, &map.geometry());
        let slots = crate::modes::state::SlotMode {
            region: Mutex::new(Some(h)),
            map,
            layouts: Default::default(),
            refused: Default::default(),
        };
        (Some(slots), Some(layout))
    } else {
        (None, None)
    };
    let data_endpoint = advertise(transport.local_endpoint(), host, explicit_host);

    // Directory shard and the control listener that serves it.
    let dir_service = Arc::new(DirectoryService::new(cfg.shard()));
    let event_counters = crate::events::EventCounters::register(&me);
    let kv_events = if cfg.kv_events_port > 0 {
        let host_of = |h: &str| -> Result<IpAddr, StoreError> {
            Ok(if h.is_empty() {
                host
            } else {
                bind_addr(h, 0)?.ip()
            })
        };
        let ip = host_of(&cfg.kv_events_bind_host)?;
        let replay = rank_port(cfg.kv_events_replay_port, &cfg);
        Some(crate::events::KvEvents::start(
            crate::events::KvEventsConfig {
                bind: SocketAddr::new(ip, rank_port(cfg.kv_events_port, &cfg)),
                replay_bind: (replay > 0).then(|| SocketAddr::new(ip, replay)),
                block_size: cfg.kv_events_block_size,
                interval: crate::events::INTERVAL,
                node: me.clone(),
            },
            dir_service.clone(),
            event_counters,
        )?)
    } else {
        None
    };
    let (svc, node_cell) = (dir_service.clone(), cell.clone());
    let handler: rpc::Handler = Arc::new(move |peer, env| {
        if env.kind == StoreRequest::KIND {
            return crate::serve::store_rpc::serve_store(&node_cell, peer, env);
        }
        svc.handle(peer, env).unwrap_or_else(|| Reply::Error {
            error: RpcError {
                code: RpcError::CODE_UNKNOWN_KIND,
                message: format!("kind {:#06x} is not served on the control port", env.kind),
            },
            close: true,
        })
    });
    let control = RpcServer::start(
        ServerConfig {
            bind: bind_addr(&cfg.control_bind_host, rank_port(cfg.control_port, &cfg))?,
            planes: vec![Plane::Control],
            node: Some(me.clone()),
            incarnation,
            max_frame: cfg.max_frame_bytes as usize,
            handshake_timeout: cfg.op_timeout(),
            max_connections: conn_cap,
            offload: &[StoreRequest::KIND],
            workers: 1,
            name: "pc-control",
            auth: auth.clone(),
            shares: shares(),
        },
        handler,
    )?;
    let control_endpoint = advertise(control.local_addr(), host, explicit_host);
    // The client API: its own listener and threads, so client batches (which may read from
    // peers) never queue behind directory requests on the control port.
    let client = if cfg.client_enabled {
        let node_cell = cell.clone();
        let handler: rpc::Handler = Arc::new(move |peer, env| {
            crate::serve::client::serve(node_cell.get().and_then(|w| w.upgrade()), peer.grant, env)
        });
        Some(RpcServer::start(
            ServerConfig {
                bind: bind_addr(&cfg.control_bind_host, rank_port(cfg.client_port, &cfg))?,
                planes: vec![Plane::Control],
                node: Some(me.clone()),
                incarnation,
                max_frame: crate::client::MAX_CLIENT_FRAME,
                handshake_timeout: cfg.op_timeout(),
                max_connections: conn_cap,
                offload: &[],
                workers: 2,
                name: "pc-client",
                // The one port that also takes the read-only client token.
                auth: cfg.client_auth()?,
                shares: shares(),
            },
            handler,
        )?)
    } else {
        None
    };
    let client_endpoint = client
        .as_ref()
        .map(|c| advertise(c.local_addr(), host, explicit_host));
    if let Some(ep) = client_endpoint
        && !auth.is_enabled()
    {
        tracing::warn!(
            client = %ep,
            "client API enabled without a cluster_secret: any process that reaches this \
             port can publish pages into this node's pool"
        );
    }
    let dir = Arc::new(DirectoryClient::new(
        me.clone(),
        dir_service.clone(),
        RpcClient::new(cfg.rpc_client(
            Hello::new(Plane::Control, Some(me.clone()), incarnation),
            auth.clone(),
        ))
        .with_suspect_for(Duration::from_secs_f64(cfg.suspect_for)),
        cfg.directory_client(),
    ));

    let meta_role = match (&source, meta.is_some()) {
        (Source::Etcd(_), _) => "etcd member",
        (_, true) => "hosting meta",
        (_, false) => "meta client (port taken by a co-located rank)",
    };
    let info = NodeInfo {
        node: me.clone(),
        incarnation,
        host,
        meta: meta
            .as_ref()
            .map(|m| advertise(m.local_addr(), host, explicit_host)),
        control: control_endpoint,
        data: vec![data_endpoint],
        role: if storage_role { "storage" } else { "inference" }.into(),
        attrs: {
            let mut a = vec![
                ("tp_rank".to_string(), cfg.tp_rank.to_string()),
                ("pp_rank".to_string(), cfg.pp_rank.to_string()),
            ];
            if let Some(m) = metrics_endpoint {
                a.push(("metrics".to_string(), m.to_string()));
            }
            if let Some(c) = client_endpoint {
                a.push((crate::client::CLIENT_ATTR.to_string(), c.to_string()));
            }
            if let Some(l) = &slot_layout {
                a.push((crate::modes::slot::LAYOUT_ATTR.to_string(), l.clone()));
            }
            a
        },
    };
    let discovery = Membership::start(info, source)?;
    let disk = if cfg.disk_enabled {
        open_disk(&cfg, &me)
    } else {
        None
    };
    if disk.is_some() {
        metrics.disk_capacity.set(cfg.disk_size as f64);
    }
    let evictions = EvictionBatcher::start(
        me.clone(),
        dir.clone(),
        disk.clone(),
        cfg.eviction_queue_depth,
    );
    tracing::info!(
        node = %me, transport = %transport_why, data = %data_endpoint, control = %control_endpoint,
        meta = meta_role, pool_bytes = pool.len(),
        discovery = %if cfg.discovery == crate::DiscoveryKind::Etcd { &cfg.etcd_endpoints } else { &cfg.discovery_addr },
        incarnation = incarnation.0, authenticated = auth.is_enabled(), insecure = cfg.insecure,
        metrics = %metrics_endpoint.map(|m| m.to_string()).unwrap_or_else(|| "off".into()),
        client = %client_endpoint.map(|c| c.to_string()).unwrap_or_else(|| "off".into()),
        kv_events = %kv_events.as_ref().map(|e| e.addr.to_string()).unwrap_or_else(|| "off".into()),
        kv_events_replay = %kv_events.as_ref().and_then(|e| e.replay_addr).map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
        "peercache node started"
    );
    let mode =
        match (cfg.mode, reservations) {
            (Mode::P2p, _) => ModeState::P2p,
            (Mode::Hybrid | Mode::Centralized, Some(reservations)) => {
                ModeState::StorageServer(StorageServer { reservations })
            }
            (Mode::Hybrid, None) => ModeState::Hybrid(StorageMode::new(cfg.write_policy)),
            (Mode::Centralized, None) => ModeState::Centralized(StorageMode::new(cfg.write_policy)),
            (Mode::Slotmap, _) => ModeState::Slotmap(slots.ok_or_else(|| {
                StoreError::Unsupported("slotmap mode without a slot region".into())
            })?),
        };
    // Pages a previous run left are re-published once the scan (in the background) has found
    // them.
    let republish = disk.as_ref().is_some_and(|d| d.found_previous_run());
    let inner = Arc::new(Core {
        keys: Keyspace::new(&cfg.prefix),
        cfg,
        id: Identity {
            me,
            incarnation,
            auth_enabled: auth.is_enabled(),
            pool_key,
            data: data_endpoint,
            control: control_endpoint,
            client: client_endpoint,
            http: metrics_endpoint,
        },
        metrics,
        tasks: Tasks::new(evictions, republish),
        discovery,
        dir,
        dir_service,
        servers: Servers {
            control: Mutex::new(Some(control)),
            client: Mutex::new(client),
            meta: Mutex::new(meta),
            http: Mutex::new(http),
            kv_events: Mutex::new(kv_events),
            client_refusals: peercache_wire::limits::Throttle::new(),
        },
        reads: ReadState::new(),
        pool_region: Mutex::new(Some(pool_region)),
        transport,
        pool,
        disk,
        stopping: AtomicBool::new(false),
        mode,
        layout: std::sync::atomic::AtomicU64::new(0),
    });
    crate::node::threads::start_promoter(&inner)?;
    let _ = cell.set(Arc::downgrade(&inner));
    let t = crate::node::threads::spawn_membership(&inner)?;
    *inner.tasks.membership.lock() = Some(t);
    Ok(inner)
}
