//! Tests of the key table, the sources and the rules between keys.

use super::*;

mod security;

fn map(j: Value) -> Map<String, Value> {
    j.as_object().unwrap().clone()
}

#[test]
fn sizes_and_bools() {
    assert_eq!(parse_size("4gb"), Some(4 << 30));
    assert_eq!(parse_size("512MB"), Some(512 << 20));
    assert_eq!(parse_size("1.5g"), Some(3 << 29));
    assert_eq!(parse_size("1048576"), Some(1 << 20));
    assert_eq!(parse_size("12 KiB"), Some(12 << 10));
    assert_eq!(parse_size("4 parsecs"), None);
    assert_eq!(parse_size("-1"), None);
    for t in ["1", "true", "YES", "on"] {
        assert_eq!(parse_bool(t), Some(true));
    }
    for f in ["0", "false", "No", "off"] {
        assert_eq!(parse_bool(f), Some(false));
    }
    assert_eq!(parse_bool("maybe"), None);
}

#[test]
fn json_with_sglang_keys_and_unknown_keys() {
    let (cfg, warnings) = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:31998",
            "global_segment_size": "1gb",
            "backend_name": "peercache", "module_path": "peercache.store", "class_name": "PeerCacheStore",
            "interface_v1": 1,
            "disk_enabled": "yes",
            "typo_key": 3,
        })))
        .unwrap();
    assert_eq!(cfg.global_segment_size, 1 << 30);
    assert!(cfg.interface_v1 && cfg.disk_enabled);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("typo_key"));
}

#[test]
fn every_bad_value_gets_an_actionable_error() {
    let base = serde_json::json!({"discovery_addr": "127.0.0.1:31998"});
    let cases: &[(&str, Value)] = &[
        ("mode", "p3p".into()),
        ("write_policy", "sideways".into()),
        ("role", "boss".into()),
        ("protocol", "udp".into()),
        ("device_names", "mlx5_0,mlx5_0".into()),
        ("ib_port", 0.into()),
        ("gid_index", (-2).into()),
        ("max_channels_per_peer", 0.into()),
        ("global_segment_size", "lots".into()),
        ("vnodes", 0.into()),
        ("directory_replicas", 0.into()),
        ("directory_read_cache_ttl", (-1.0).into()),
        ("rdma_port", 70000.into()),
        ("control_port", "x".into()),
        ("disk_enabled", "perhaps".into()),
        ("disk_size", "big".into()),
        ("metrics_port", (-5).into()),
        ("node_id", "has space".into()),
        ("slot_ways", 0.into()),
        ("heartbeat_interval", 0.into()),
        ("member_ttl", "soon".into()),
        ("max_masters", 0.into()),
        ("op_timeout", 0.into()),
        ("op_timeout", 1e300.into()),
        ("member_ttl", "1e30".into()),
        ("node_id", "..".into()),
        ("node_id", ".".into()),
        ("reclaim_threshold", 1.into()),
        ("max_batch_ops", 0.into()),
        ("tp_size", 0.into()),
        ("log_level", "info; rm -rf".into()),
    ];
    for (k, v) in cases {
        let mut m = map(base.clone());
        m.insert((*k).into(), v.clone());
        let err = PeerCacheConfig::from_map(&m).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(k),
            "error for {k} does not name the key: {msg}"
        );
    }
    assert_eq!(
        PeerCacheConfig::from_map(&Map::new()).unwrap_err(),
        ConfigError::Missing("discovery_addr")
    );
    let mut m = map(base.clone());
    m.insert("tp_rank".into(), 2.into());
    m.insert("tp_size".into(), 2.into());
    assert!(
        PeerCacheConfig::from_map(&m)
            .unwrap_err()
            .to_string()
            .contains("tp_rank")
    );
    let mut m = map(base.clone());
    m.insert("member_ttl".into(), 1.0.into());
    assert!(
        PeerCacheConfig::from_map(&m)
            .unwrap_err()
            .to_string()
            .contains("heartbeat_interval")
    );
    // On a storage server a reservation must outlive the deadline of a write admitted into
    // it; elsewhere reservations do not exist and the pair is not checked.
    let mut m = map(base.clone());
    m.insert("reservation_timeout".into(), 2.0.into());
    m.insert("op_timeout".into(), 2.0.into());
    assert!(PeerCacheConfig::from_map(&m).is_ok());
    m.insert("mode".into(), "centralized".into());
    m.insert("role".into(), "storage".into());
    let e = PeerCacheConfig::from_map(&m).unwrap_err().to_string();
    assert!(
        e.contains("reservation_timeout") && e.contains("op_timeout"),
        "{e}"
    );
    let mut m = map(base);
    m.insert("discovery_addr".into(), "10.0.0.1:1,10.0.0.2:2".into());
    assert!(
        PeerCacheConfig::from_map(&m)
            .unwrap_err()
            .to_string()
            .contains("same meta port")
    );
}

#[test]
fn env_overrides_beat_json_and_toml() {
    let dir = std::env::temp_dir().join(format!("pc-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("node.toml");
    std::fs::write(
        &file,
        "discovery_addr = \"127.0.0.1:31998\"\nvnodes = 100\nprefix = \"file\"\n",
    )
    .unwrap();
    let json = map(serde_json::json!({"vnodes": 50, "tp_rank": 0}));
    let mut env = BTreeMap::new();
    env.insert("PEERCACHE_PREFIX".to_string(), "tenant-a".to_string());
    env.insert("PEERCACHE_TP_SIZE".to_string(), "4".to_string());
    env.insert("PEERCACHE_TP_RANK".to_string(), "3".to_string());
    env.insert("OTHER".to_string(), "x".to_string());
    let mut over = Map::new();
    over.insert("vnodes".into(), Value::String("120".into()));
    let (cfg, _) =
        PeerCacheConfig::from_sources(Some(&json), Some(&file), &env, &Map::new()).unwrap();
    assert_eq!(cfg.vnodes, 100, "the file overrides the JSON");
    assert_eq!(cfg.prefix, "tenant-a", "the environment overrides the file");
    assert_eq!((cfg.tp_rank, cfg.tp_size), (3, 4));
    assert_eq!(cfg.pool_bytes(), 1 << 30);
    let (cfg, _) = PeerCacheConfig::from_sources(Some(&json), Some(&file), &env, &over).unwrap();
    assert_eq!(cfg.vnodes, 120, "command-line overrides beat everything");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn device_names_per_local_rank() {
    let per_rank = serde_json::json!({"0": "mlx5_0,mlx5_1", "3": ["mlx5_6", "mlx5_7"]});
    let cfg = |tp_rank: u32| {
        PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:1", "tp_size": 4, "tp_rank": tp_rank,
            "device_names": per_rank.clone(),
        })))
    };
    assert_eq!(cfg(0).unwrap().0.rdma_devices(), ["mlx5_0", "mlx5_1"]);
    assert_eq!(cfg(3).unwrap().0.rdma_devices(), ["mlx5_6", "mlx5_7"]);
    let e = cfg(1).unwrap_err().to_string();
    assert!(e.contains("no entry for local rank 1"), "{e}");
    let bad = PeerCacheConfig::from_map(&map(serde_json::json!({
        "discovery_addr": "127.0.0.1:1", "device_names": {"gpu0": "mlx5_0"},
    })));
    assert!(bad.unwrap_err().to_string().contains("not a local rank"));
    let dup = PeerCacheConfig::from_map(&map(serde_json::json!({
        "discovery_addr": "127.0.0.1:1", "device_names": {"0": "mlx5_0,mlx5_0"},
    })));
    assert!(dup.unwrap_err().to_string().contains("duplicate device"));
}

#[test]
fn every_listed_key_is_parsed_not_ignored() {
    // A key in KEYS without a `set` arm would be documented and silently ignored; every
    // arm either takes the value or refuses it with a typed error, never "unknown".
    for k in KEYS {
        let mut cfg = PeerCacheConfig::default();
        for v in [Value::Null, Value::String("1".into()), Value::Bool(true)] {
            assert!(
                !matches!(cfg.set(k, &v), Ok(false)),
                "`{k}` is listed and documented but not parsed"
            );
        }
    }
    let (cfg, warnings) = PeerCacheConfig::from_map(&map(serde_json::json!({
        "discovery_addr": "127.0.0.1:1", "max_frame_bytes": "1mb",
        "max_inbound_connections": 7, "eviction_queue_depth": 9, "disk_queue_depth": 11,
    })))
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        (
            cfg.max_frame_bytes,
            cfg.max_inbound_connections,
            cfg.eviction_queue_depth,
            cfg.disk_queue_depth
        ),
        (1 << 20, 7, 9, 11)
    );
}

#[test]
fn every_key_is_documented() {
    let doc = include_str!("../../../../docs/configuration.md");
    for k in KEYS {
        assert!(
            doc.contains(&format!("`{k}`")),
            "docs/configuration.md lacks `{k}`"
        );
    }
}

/// The rows of a key table (`docs/configuration.md` or its translation), in order: key →
/// default column.
fn table_rows(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let (key, rest) = l.split_once("` | ")?;
            let default = rest.split(" | ").next()?;
            Some((key.to_string(), default.trim().to_string()))
        })
        .collect()
}

/// The rows of the key table in `docs/configuration.md`: key → default column.
fn documented_defaults() -> BTreeMap<String, String> {
    table_rows(include_str!("../../../../docs/configuration.md"))
        .into_iter()
        .collect()
}

#[test]
fn the_translated_table_has_the_same_keys_and_code_defaults() {
    let en = table_rows(include_str!("../../../../docs/configuration.md"));
    let zh = table_rows(include_str!("../../../../docs/configuration.zh.md"));
    let keys = |rows: &[(String, String)]| rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(&zh),
        keys(&en),
        "docs/configuration.zh.md: keys or their order"
    );
    for ((key, en_default), (_, zh_default)) in en.iter().zip(&zh) {
        // Words ("required", "auto") are translated; values in code are not.
        if en_default.starts_with('`') {
            assert_eq!(
                zh_default, en_default,
                "docs/configuration.zh.md: default of `{key}`"
            );
        }
    }
}

#[test]
fn the_docs_table_is_the_declaration_table() {
    let documented = documented_defaults();
    for s in SETTINGS {
        assert_eq!(
            documented.get(s.key).map(String::as_str),
            Some(s.shown_default),
            "docs/configuration.md: the row of `{}` must show the default {}",
            s.key,
            s.shown_default
        );
        assert!(!s.doc.trim().is_empty(), "`{}` has no doc line", s.key);
    }
    for k in documented.keys() {
        assert!(
            KEYS.contains(&k.as_str()),
            "docs/configuration.md documents `{k}`, which this build does not know"
        );
    }
    assert_eq!(SETTINGS.len(), KEYS.len());
}

#[test]
fn every_key_is_set_from_toml_env_and_the_command_line_and_read_back() {
    // A base every example is valid against (ranks below the sizes, a pool big enough).
    let base = || {
        map(serde_json::json!({
            "discovery_addr": "127.0.0.1:1", "tp_size": 8, "pp_size": 4,
            // So `discovery = "etcd"` alone is valid too (ignored with the builtin discovery).
            "etcd_endpoints": "http://127.0.0.1:2379",
        }))
    };
    let (plain, _) = PeerCacheConfig::from_map(&base()).unwrap();
    let dir = std::env::temp_dir().join(format!("pc-every-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("node.toml");
    for s in SETTINGS {
        let toml_value = toml::Value::String(s.example.to_string()).to_string();
        std::fs::write(&file, format!("{} = {toml_value}\n", s.key)).unwrap();
        let env: BTreeMap<String, String> = [(
            format!("PEERCACHE_{}", s.key.to_ascii_uppercase()),
            s.example.to_string(),
        )]
        .into();
        let set = parse_overrides(&[format!("{}={}", s.key, s.example)]).unwrap();
        let none = BTreeMap::new();
        let sources = [
            ("TOML", Some(file.as_path()), &none, Map::new()),
            ("PEERCACHE_*", None, &env, Map::new()),
            ("--set", None, &none, set),
        ];
        for (source, toml_file, env, over) in sources {
            let (cfg, warnings) =
                PeerCacheConfig::from_sources(Some(&base()), toml_file, env, &over)
                    .unwrap_or_else(|e| panic!("`{}` = {:?} from {source}: {e}", s.key, s.example));
            assert!(warnings.is_empty(), "{source}: {warnings:?}");
            let got = cfg.shown(s.key).unwrap();
            assert_ne!(
                got,
                plain.shown(s.key).unwrap(),
                "`{}` = {:?} from {source} did not reach its field",
                s.key,
                s.example
            );
            // Every source lands the same value; the field is the only one that changed.
            let (via_json, _) = PeerCacheConfig::from_map(&{
                let mut m = base();
                m.insert(s.key.into(), Value::String(s.example.into()));
                m
            })
            .unwrap();
            assert_eq!(cfg, via_json, "`{}` from {source}", s.key);
            for other in KEYS.iter().filter(|k| **k != s.key) {
                assert_eq!(
                    cfg.shown(other),
                    plain.shown(other),
                    "setting `{}` changed `{other}`",
                    s.key
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
    assert_eq!(PeerCacheConfig::default().shown("no_such_key"), None);
}

#[test]
fn a_malformed_override_is_a_typed_error() {
    for bad in ["vnodes", "=3", " =x"] {
        assert_eq!(
            parse_overrides(&[bad.to_string()]),
            Err(ConfigError::Override(bad.to_string()))
        );
    }
    let m = parse_overrides(&["prefix=a=b".to_string()]).unwrap();
    assert_eq!(m["prefix"], "a=b", "only the first = splits");
}

#[test]
fn a_mistyped_key_warns_with_the_nearest_known_key() {
    let mut m = map(serde_json::json!({"discovery_addr": "127.0.0.1:31998"}));
    m.insert("directory_replica".into(), 3.into());
    let (_, warnings) = PeerCacheConfig::from_map(&m).unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("did you mean `directory_replicas`?"),
        "{warnings:?}"
    );
}

#[test]
fn the_rdma_op_timeout_ms_variable_of_0_8_4_sets_op_timeout_in_seconds() {
    let base = || {
        let mut env = BTreeMap::new();
        env.insert(
            "PEERCACHE_DISCOVERY_ADDR".to_string(),
            "127.0.0.1:31998".to_string(),
        );
        env
    };
    let load = |env: &BTreeMap<String, String>, set: &Map<String, serde_json::Value>| {
        PeerCacheConfig::from_sources(None, None, env, set)
    };
    let mut env = base();
    env.insert("PEERCACHE_RDMA_OP_TIMEOUT_MS".into(), "1500".into());
    assert_eq!(load(&env, &Map::new()).unwrap().0.op_timeout, 1.5);
    // The key's own variable wins over the old one; `--set` over both.
    env.insert("PEERCACHE_OP_TIMEOUT".into(), "4".into());
    assert_eq!(load(&env, &Map::new()).unwrap().0.op_timeout, 4.0);
    let mut set = Map::new();
    set.insert("op_timeout".into(), serde_json::json!(0.5));
    assert_eq!(load(&env, &set).unwrap().0.op_timeout, 0.5);
    // Not a number of milliseconds: a typed error naming the variable.
    for bad in ["soon", "-3", "0", "inf"] {
        let mut env = base();
        env.insert("PEERCACHE_RDMA_OP_TIMEOUT_MS".into(), bad.into());
        match load(&env, &Map::new()) {
            Err(ConfigError::Invalid { key, value, .. }) => {
                assert_eq!(key, "op_timeout");
                assert!(value.contains("PEERCACHE_RDMA_OP_TIMEOUT_MS"), "{value}");
            }
            other => panic!("{bad}: expected Invalid, got {other:?}"),
        }
    }
}

#[test]
fn etcd_settings_are_checked_together_and_lowered() {
    let with = |extra: serde_json::Value| {
        let mut m = map(serde_json::json!({"discovery": "etcd"}));
        m.extend(map(extra));
        PeerCacheConfig::from_map(&m).map(|(c, _)| c)
    };
    // No discovery_addr needed with etcd; endpoints are.
    assert_eq!(
        with(serde_json::json!({})).unwrap_err(),
        ConfigError::Missing("etcd_endpoints")
    );
    let ok = with(serde_json::json!({
        "etcd_endpoints": "http://10.0.0.5:2379, http://10.0.0.6:2379",
        "etcd_user": "pc", "etcd_password": "pw", "member_ttl": 2.5, "op_timeout": 1.5,
    }))
    .unwrap();
    let e = ok.etcd().unwrap();
    assert_eq!(
        e.endpoints,
        ["http://10.0.0.5:2379", "http://10.0.0.6:2379"]
    );
    assert_eq!(e.lease_ttl_secs(), 3);
    assert_eq!(e.rpc_timeout, Duration::from_millis(1500));
    assert_eq!(e.user, Some(("pc".into(), "pw".into())));
    assert!(
        !format!("{ok:?}").contains("\"pw\""),
        "the password is redacted"
    );
    for (extra, key, says) in [
        (
            serde_json::json!({"etcd_endpoints": "10.0.0.5"}),
            "etcd_endpoints",
            "host:port",
        ),
        (
            serde_json::json!({"etcd_endpoints": "https://e:2379"}),
            "etcd_endpoints",
            "etcd_ca_file",
        ),
        (
            serde_json::json!({"etcd_endpoints": "http://e:2379", "etcd_ca_file": "/ca.pem"}),
            "etcd_endpoints",
            "https://",
        ),
        (
            serde_json::json!({"etcd_endpoints": "http://e:2379", "etcd_user": "pc"}),
            "etcd_user",
            "go together",
        ),
        (
            serde_json::json!({"etcd_endpoints": "http://e:2379", "etcd_password": "x"}),
            "etcd_user",
            "go together",
        ),
        (
            serde_json::json!({
                "etcd_endpoints": "https://e:2379", "etcd_ca_file": "/ca.pem",
                "etcd_cert_file": "/c.pem",
            }),
            "etcd_cert_file",
            "both or neither",
        ),
        (
            serde_json::json!({"etcd_endpoints": "http://e:2379", "etcd_prefix": "pc"}),
            "etcd_prefix",
            "start with /",
        ),
    ] {
        match with(extra.clone()) {
            Err(ConfigError::Invalid { key: k, reason, .. }) => {
                assert_eq!(k, key, "{extra}");
                assert!(reason.contains(says), "{extra}: {reason}");
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    // The password file is read at lowering, trimmed; a missing one names the key.
    let dir = std::env::temp_dir().join(format!("pc-etcd-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pw"), "from-file\n").unwrap();
    let c = with(serde_json::json!({
        "etcd_endpoints": "http://e:2379", "etcd_user": "pc",
        "etcd_password_file": dir.join("pw").display().to_string(),
    }))
    .unwrap();
    assert_eq!(c.etcd().unwrap().user.unwrap().1, "from-file");
    let c = with(serde_json::json!({
        "etcd_endpoints": "http://e:2379", "etcd_user": "pc",
        "etcd_password_file": dir.join("missing").display().to_string(),
    }))
    .unwrap();
    assert!(
        c.etcd()
            .unwrap_err()
            .to_string()
            .contains("etcd_password_file")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_http_token_is_read_trimmed_and_a_short_or_spaced_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_with = |token: &str| {
        let path = dir.path().join("token");
        std::fs::write(&path, token).unwrap();
        let (cfg, _) = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:31998",
            "http_token_file": path.to_str().unwrap(),
        })))
        .unwrap();
        cfg
    };
    let token = "0123456789abcdef0123";
    assert_eq!(
        cfg_with(&format!("{token}\n"))
            .http_token()
            .unwrap()
            .as_deref(),
        Some(token)
    );
    for bad in ["short-token", "0123456789 abcdef0123"] {
        match cfg_with(bad).http_token() {
            Err(ConfigError::Invalid { key, value, .. }) => {
                assert_eq!(key, "http_token_file");
                assert_eq!(value, "<redacted>", "the token never appears in an error");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let (open, _) = PeerCacheConfig::from_map(&map(serde_json::json!({
        "discovery_addr": "127.0.0.1:31998",
    })))
    .unwrap();
    assert_eq!(open.http_token().unwrap(), None);
}
