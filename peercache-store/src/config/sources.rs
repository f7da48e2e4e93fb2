//! Where settings come from besides SGLang's JSON: a TOML file, `--set key=value` overrides and
//! the `PEERCACHE_*` environment (with PeerCache 0.8.4's millisecond timeout variable).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::ConfigError;

/// A TOML config file as one flat map of keys.
pub(super) fn read_toml(path: &std::path::Path) -> Result<Map<String, Value>, ConfigError> {
    let file_error = |reason: String| ConfigError::File {
        path: path.to_path_buf(),
        reason,
    };
    let s = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
    let table: toml::Table = toml::from_str(&s).map_err(|e| file_error(e.to_string()))?;
    match serde_json::to_value(table).map_err(|e| file_error(e.to_string()))? {
        Value::Object(m) => Ok(m),
        _ => Ok(Map::new()),
    }
}

/// Command-line overrides (`--set KEY=VALUE`, repeatable) as a map for
/// [`PeerCacheConfig::from_sources`](crate::config::PeerCacheConfig::from_sources).
///
/// ```
/// let m = peercache_store::config::parse_overrides(&["vnodes=64".to_string()]).unwrap();
/// assert_eq!(m["vnodes"], "64");
/// assert!(peercache_store::config::parse_overrides(&["vnodes".to_string()]).is_err());
/// ```
pub fn parse_overrides(items: &[String]) -> Result<Map<String, Value>, ConfigError> {
    let mut out = Map::new();
    for kv in items {
        let (k, v) = kv
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| ConfigError::Override(kv.clone()))?;
        out.insert(k.trim().to_string(), Value::String(v.to_string()));
    }
    Ok(out)
}

/// PeerCache 0.8.4's `PEERCACHE_RDMA_OP_TIMEOUT_MS` as `op_timeout` seconds, unless
/// `PEERCACHE_OP_TIMEOUT` is set too (then that one counts).
pub(super) fn legacy_op_timeout(
    env: &BTreeMap<String, String>,
) -> Result<Option<f64>, ConfigError> {
    const LEGACY: &str = "PEERCACHE_RDMA_OP_TIMEOUT_MS";
    let Some(ms) = env.get(LEGACY) else {
        return Ok(None);
    };
    if env.contains_key("PEERCACHE_OP_TIMEOUT") {
        return Ok(None);
    }
    match ms.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v / 1000.0)),
        _ => Err(ConfigError::Invalid {
            key: "op_timeout",
            value: format!("{LEGACY}={ms}"),
            reason: "milliseconds, a positive number (e.g. 2000)".into(),
        }),
    }
}

/// Reads the `PEERCACHE_*` variables of this process.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("PEERCACHE_"))
        .collect()
}
