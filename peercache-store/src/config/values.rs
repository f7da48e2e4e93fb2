//! Value parsers shared by every key: one JSON value (a TOML value, an environment string and
//! a `--set` string arrive as JSON too) in, a typed value or a [`ConfigError`] naming the key
//! and what is accepted out.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{ConfigError, Devices, Secret};

/// Parses a size: an integer, or a number with `k`/`m`/`g`/`t` (optionally `b`, `ib`) units,
/// powers of two: `"4gb"` = 4 GiB.
///
/// ```
/// use peercache_store::config::parse_size;
/// assert_eq!(parse_size("4gb"), Some(4 << 30));
/// assert_eq!(parse_size("1.5 KiB"), Some(1536));
/// assert_eq!(parse_size("lots"), None);
/// ```
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase().replace('_', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        (f >= 0.0 && f.is_finite()).then_some((f * mult as f64) as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Parses a boolean: `1/true/yes/on` and `0/false/no/off`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The error for `key` = `v`.
pub(super) fn bad(key: &'static str, v: &Value, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: text(v),
        reason: reason.into(),
    }
}

/// Text, trimmed.
pub(super) fn string(_key: &'static str, v: &Value) -> Result<String, ConfigError> {
    Ok(text(v).trim().to_string())
}

pub(super) fn uint(key: &'static str, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| bad(key, v, "expected a non-negative integer")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| bad(key, v, "expected a non-negative integer")),
        _ => Err(bad(key, v, "expected a non-negative integer")),
    }
}

pub(super) fn int(key: &'static str, v: &Value) -> Result<i64, ConfigError> {
    match v {
        Value::Number(n) => n.as_i64().ok_or_else(|| bad(key, v, "expected an integer")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| bad(key, v, "expected an integer")),
        _ => Err(bad(key, v, "expected an integer")),
    }
}

/// The longest duration a setting may hold: 30 days. Longer ones overflow deadline arithmetic
/// (`Instant + Duration`), and no timeout or interval of a node needs them.
pub(super) const MAX_SECONDS: f64 = 30.0 * 86_400.0;

/// Non-negative seconds, at most [`MAX_SECONDS`].
pub(super) fn seconds(key: &'static str, v: &Value) -> Result<f64, ConfigError> {
    let f = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match f {
        Some(f) if f.is_finite() && (0.0..=MAX_SECONDS).contains(&f) => Ok(f),
        Some(f) if f.is_finite() && f > MAX_SECONDS => Err(bad(
            key,
            v,
            "longer than 2592000 seconds (30 days), the longest duration a setting may hold",
        )),
        _ => Err(bad(key, v, "expected a non-negative number of seconds")),
    }
}

/// Seconds greater than zero.
pub(super) fn positive(key: &'static str, v: &Value) -> Result<f64, ConfigError> {
    let f = seconds(key, v)?;
    if f <= 0.0 {
        return Err(bad(key, v, "must be greater than zero"));
    }
    Ok(f)
}

pub(super) fn size(key: &'static str, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| bad(key, v, "expected a size such as 4gb or 1073741824")),
        Value::String(s) => parse_size(s)
            .ok_or_else(|| bad(key, v, "expected a size such as 4gb, 512mb or 1073741824")),
        _ => Err(bad(key, v, "expected a size such as 4gb or 1073741824")),
    }
}

pub(super) fn boolean(key: &'static str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
        Value::String(s) => {
            parse_bool(s).ok_or_else(|| bad(key, v, "expected 1/true/yes/on or 0/false/no/off"))
        }
        _ => Err(bad(key, v, "expected a boolean")),
    }
}

/// `x` if within `lo..=hi`.
pub(super) fn within<T: PartialOrd + std::fmt::Display + Copy>(
    key: &'static str,
    v: &Value,
    x: T,
    lo: T,
    hi: T,
) -> Result<T, ConfigError> {
    if x < lo || x > hi {
        return Err(bad(key, v, format!("must be within {lo}..={hi}")));
    }
    Ok(x)
}

/// An integer within `lo..=hi`, converted to the field's type.
pub(super) fn ranged<T: TryFrom<u64>>(
    key: &'static str,
    v: &Value,
    lo: u64,
    hi: u64,
) -> Result<T, ConfigError> {
    let x = within(key, v, uint(key, v)?, lo, hi)?;
    T::try_from(x).map_err(|_| bad(key, v, format!("must be within {lo}..={hi}")))
}

/// A size within `lo..=hi`.
pub(super) fn sized(key: &'static str, v: &Value, lo: u64, hi: u64) -> Result<u64, ConfigError> {
    within(key, v, size(key, v)?, lo, hi)
}

pub(super) fn port(key: &'static str, v: &Value) -> Result<u16, ConfigError> {
    ranged(key, v, 0, 65535)
}

/// One of `options` (case-insensitive).
pub(super) fn choice<T: Copy>(
    key: &'static str,
    v: &Value,
    options: &[(&str, T)],
) -> Result<T, ConfigError> {
    let s = text(v).trim().to_ascii_lowercase();
    if let Some((_, t)) = options.iter().find(|(name, _)| *name == s) {
        return Ok(*t);
    }
    let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
    let list = match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(bad(key, v, format!("expected {list}")))
}

pub(super) fn secret(key: &'static str, v: &Value) -> Result<Secret, ConfigError> {
    let s = text(v);
    if !s.is_empty() && s.len() < peercache_wire::auth::MIN_SECRET_LEN {
        return Err(ConfigError::Invalid {
            key,
            value: "<redacted>".into(),
            reason: format!(
                "must be at least {} bytes (e.g. `openssl rand -hex 32`)",
                peercache_wire::auth::MIN_SECRET_LEN
            ),
        });
    }
    Ok(Secret::new(s))
}

/// A password of another system (any length; redacted like the cluster secret).
pub(super) fn password(_key: &'static str, v: &Value) -> Result<Secret, ConfigError> {
    Ok(Secret::new(text(v)))
}

pub(super) fn node_id(key: &'static str, v: &Value) -> Result<String, ConfigError> {
    let s = string(key, v)?;
    if !s.is_empty() {
        peercache_wire::NodeId::new(&s).map_err(|e| bad(key, v, e.to_string()))?;
    }
    Ok(s)
}

pub(super) fn log_filter(key: &'static str, v: &Value) -> Result<String, ConfigError> {
    let l = string(key, v)?;
    if l.is_empty()
        || !l
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_=,:.-".contains(c))
    {
        return Err(bad(
            key,
            v,
            "expected a filter such as info, debug or peercache_transport=debug,info",
        ));
    }
    Ok(l)
}

/// A device list (`"mlx5_0,mlx5_1"` or `["mlx5_0", "mlx5_1"]`) without duplicates; `whole`
/// is the key's value, for the error.
fn device_list(key: &'static str, whole: &Value, v: &Value) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = match v {
        Value::Array(items) => items.iter().map(|i| text(i).trim().to_string()).collect(),
        _ => text(v).split(',').map(|s| s.trim().to_string()).collect(),
    };
    let list: Vec<String> = list.into_iter().filter(|s| !s.is_empty()).collect();
    let mut seen = std::collections::HashSet::new();
    if !list.iter().all(|d| seen.insert(d.clone())) {
        return Err(bad(key, whole, "duplicate device"));
    }
    Ok(list)
}

/// One device list, or one per local rank (`{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`).
pub(super) fn devices(key: &'static str, v: &Value) -> Result<Devices, ConfigError> {
    match v {
        Value::Object(per_rank) => {
            let mut by_rank = BTreeMap::new();
            for (rank, devs) in per_rank {
                let r: u32 = rank.trim().parse().map_err(|_| {
                    bad(
                        key,
                        v,
                        format!("`{rank}` is not a local rank (expected 0, 1, …)"),
                    )
                })?;
                by_rank.insert(r, device_list(key, v, devs)?);
            }
            Ok(Devices::PerRank(by_rank))
        }
        _ => Ok(Devices::List(device_list(key, v, v)?)),
    }
}
