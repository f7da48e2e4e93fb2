//! The shape of the pages a store writes and expects: a [`LayoutSpec`] (model, KV dtype,
//! ranks, and every registered pool's name and geometry) and its 64-bit fingerprint
//! ([`peercache_wire::Layout`]).
//!
//! Page keys name a page's tokens, not its shape: two deployments of one model with another
//! KV dtype, head split, page size or host layout compute the same keys. The fingerprint goes
//! into every slot header and disk record the store writes, and every read path compares it
//! with the reader's own exactly like the key, so such a page is a counted miss
//! (`peercache_layout_mismatch_total`), never bytes of the wrong shape.
//!
//! ```
//! use peercache_store::layout::page::LayoutSpec;
//!
//! let bf16 = LayoutSpec::from_json(r#"{"model": "llama-3-8b", "kv_dtype": "bfloat16",
//!     "pp_rank": 0, "tp": [0, 2],
//!     "pools": [{"name": "kv", "tokens_per_page": 64, "host_layout": "layer_first",
//!                "bytes_per_page": 8388608}]}"#)?;
//! let mut fp8 = bf16.clone();
//! fp8.kv_dtype = "float8_e4m3fn".into();
//! assert_ne!(bf16.fingerprint(), fp8.fingerprint());
//! // The same spec, written another way, is the same layout.
//! let again = LayoutSpec::from_json(&bf16.to_json())?;
//! assert_eq!(again.fingerprint(), bf16.fingerprint());
//! # Ok::<(), peercache_store::layout::page::LayoutError>(())
//! ```

use peercache_wire::Layout;
use serde::{Deserialize, Serialize};

/// Longest spec text accepted.
pub const MAX_SPEC_BYTES: usize = 64 << 10;
/// Longest name (model, dtype, pool name, host layout) accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Most pools one spec lists.
pub const MAX_POOLS: usize = 64;

/// Why a layout spec was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// Not JSON of the expected form.
    #[error("layout spec is not valid: {0}")]
    Syntax(String),
    /// Longer than [`MAX_SPEC_BYTES`].
    #[error("layout spec is {0} bytes, more than {MAX_SPEC_BYTES}")]
    TooLong(usize),
    /// A field is out of range.
    #[error("layout spec field `{field}`: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// One registered host pool's geometry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolShape {
    /// The pool's name (SGLang's host pool name; `kv` for the KV pool).
    pub name: String,
    /// Tokens per page.
    pub tokens_per_page: u32,
    /// Host memory layout (`layer_first`, `page_first`, `page_first_direct`, …).
    pub host_layout: String,
    /// Bytes one page of this pool occupies.
    pub bytes_per_page: u64,
}

/// What makes a page's bytes mean what they mean.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutSpec {
    /// Model name or path.
    pub model: String,
    /// KV cache dtype (`bfloat16`, `float8_e4m3fn`, …).
    pub kv_dtype: String,
    /// Pipeline-parallel rank (pages of another stage hold other layers).
    #[serde(default)]
    pub pp_rank: u32,
    /// `[rank, size]` of the tensor-parallel shard for MHA, whose heads are split across
    /// ranks; absent for MLA, whose latent is the same on every TP rank.
    #[serde(default)]
    pub tp: Option<[u32; 2]>,
    /// Every registered pool.
    pub pools: Vec<PoolShape>,
}

fn name(field: &'static str, s: &str) -> Result<(), LayoutError> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES {
        return Err(LayoutError::Field {
            field,
            reason: format!("must be 1 to {MAX_NAME_BYTES} bytes, is {}", s.len()),
        });
    }
    Ok(())
}

impl LayoutSpec {
    /// Parses and checks a spec (what the Python package sends once its pools are
    /// registered). Untrusted input: every bound is checked, nothing panics.
    pub fn from_json(text: &str) -> Result<LayoutSpec, LayoutError> {
        if text.len() > MAX_SPEC_BYTES {
            return Err(LayoutError::TooLong(text.len()));
        }
        let spec: LayoutSpec =
            serde_json::from_str(text).map_err(|e| LayoutError::Syntax(e.to_string()))?;
        spec.check()?;
        Ok(spec)
    }

    /// The spec as JSON ([`LayoutSpec::from_json`] reads it back).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a spec always serializes")
    }

    /// Checks every field's range.
    pub fn check(&self) -> Result<(), LayoutError> {
        name("model", &self.model)?;
        name("kv_dtype", &self.kv_dtype)?;
        if let Some([rank, size]) = self.tp
            && (size == 0 || rank >= size)
        {
            return Err(LayoutError::Field {
                field: "tp",
                reason: format!("rank {rank} is not below size {size}"),
            });
        }
        if self.pools.is_empty() || self.pools.len() > MAX_POOLS {
            return Err(LayoutError::Field {
                field: "pools",
                reason: format!(
                    "must list 1 to {MAX_POOLS} pools, lists {}",
                    self.pools.len()
                ),
            });
        }
        let mut names: Vec<&str> = Vec::with_capacity(self.pools.len());
        for p in &self.pools {
            name("pools.name", &p.name)?;
            name("pools.host_layout", &p.host_layout)?;
            if p.tokens_per_page == 0 {
                return Err(LayoutError::Field {
                    field: "pools.tokens_per_page",
                    reason: "must be positive".into(),
                });
            }
            if p.bytes_per_page == 0 || p.bytes_per_page > u32::MAX as u64 {
                return Err(LayoutError::Field {
                    field: "pools.bytes_per_page",
                    reason: format!("must be 1 to {}, is {}", u32::MAX, p.bytes_per_page),
                });
            }
            names.push(&p.name);
        }
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(LayoutError::Field {
                field: "pools.name",
                reason: format!("pool `{}` is listed twice", w[0]),
            });
        }
        Ok(())
    }

    /// The canonical bytes the fingerprint hashes: versioned, every string length-prefixed,
    /// pools in name order and names compared case-insensitively where SGLang's spelling
    /// varies (dtype, host layout) — so equal layouts give equal bytes however they were
    /// listed.
    pub fn canonical(&self) -> Vec<u8> {
        fn put(out: &mut Vec<u8>, s: &str) {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        let mut out = Vec::with_capacity(128 + 64 * self.pools.len());
        out.extend_from_slice(b"peercache-layout/1\0");
        put(&mut out, &self.model);
        put(
            &mut out,
            &self.kv_dtype.trim_start_matches("torch.").to_lowercase(),
        );
        out.extend_from_slice(&self.pp_rank.to_le_bytes());
        match self.tp {
            Some([rank, size]) => {
                out.push(1);
                out.extend_from_slice(&rank.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
            }
            None => out.push(0),
        }
        let mut pools: Vec<&PoolShape> = self.pools.iter().collect();
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend_from_slice(&(pools.len() as u32).to_le_bytes());
        for p in pools {
            put(&mut out, &p.name);
            out.extend_from_slice(&p.tokens_per_page.to_le_bytes());
            put(&mut out, &p.host_layout.to_lowercase());
            out.extend_from_slice(&p.bytes_per_page.to_le_bytes());
        }
        out
    }

    /// The layout fingerprint of this spec (never [`Layout::NONE`]).
    pub fn fingerprint(&self) -> Layout {
        Layout::from_canonical(&self.canonical())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LayoutSpec {
        LayoutSpec {
            model: "m".into(),
            kv_dtype: "bfloat16".into(),
            pp_rank: 0,
            tp: Some([0, 2]),
            pools: vec![
                PoolShape {
                    name: "kv".into(),
                    tokens_per_page: 64,
                    host_layout: "layer_first".into(),
                    bytes_per_page: 1 << 20,
                },
                PoolShape {
                    name: "swa".into(),
                    tokens_per_page: 64,
                    host_layout: "layer_first".into(),
                    bytes_per_page: 1 << 16,
                },
            ],
        }
    }

    #[test]
    fn every_field_that_changes_the_bytes_changes_the_fingerprint() {
        let base = spec().fingerprint();
        let variants: [fn(&mut LayoutSpec); 11] = [
            |s| s.model = "m2".into(),
            |s| s.kv_dtype = "float8_e4m3fn".into(),
            |s| s.pp_rank = 1,
            |s| s.tp = Some([1, 2]),
            |s| s.tp = Some([0, 4]),
            |s| s.tp = None,
            |s| s.pools[0].name = "kv2".into(),
            |s| s.pools[0].tokens_per_page = 32,
            |s| s.pools[0].host_layout = "page_first".into(),
            |s| s.pools[1].bytes_per_page += 1,
            |s| {
                s.pools.pop();
            },
        ];
        for (i, v) in variants.iter().enumerate() {
            let mut s = spec();
            v(&mut s);
            assert_ne!(s.fingerprint(), base, "variant {i} kept the fingerprint");
        }
    }

    #[test]
    fn spelling_and_order_do_not_change_the_fingerprint() {
        let mut s = spec();
        s.pools.reverse();
        s.kv_dtype = "torch.BFloat16".into();
        s.pools[0].host_layout = "LAYER_FIRST".into();
        assert_eq!(s.fingerprint(), spec().fingerprint());
        assert!(!s.fingerprint().is_none());
    }

    #[test]
    fn bad_specs_get_typed_errors() {
        let cases = [
            ("{", "Syntax"),
            (r#"{"model":"","kv_dtype":"x","pools":[]}"#, "model"),
            (r#"{"model":"m","kv_dtype":"x","pools":[]}"#, "pools"),
            (
                r#"{"model":"m","kv_dtype":"x","tp":[2,2],"pools":[{"name":"kv","tokens_per_page":1,"host_layout":"l","bytes_per_page":1}]}"#,
                "tp",
            ),
            (
                r#"{"model":"m","kv_dtype":"x","pools":[{"name":"kv","tokens_per_page":0,"host_layout":"l","bytes_per_page":1}]}"#,
                "pools.tokens_per_page",
            ),
            (
                r#"{"model":"m","kv_dtype":"x","pools":[{"name":"kv","tokens_per_page":1,"host_layout":"l","bytes_per_page":0}]}"#,
                "pools.bytes_per_page",
            ),
            (
                r#"{"model":"m","kv_dtype":"x","pools":[{"name":"kv","tokens_per_page":1,"host_layout":"l","bytes_per_page":1},{"name":"kv","tokens_per_page":1,"host_layout":"l","bytes_per_page":1}]}"#,
                "pools.name",
            ),
            (
                r#"{"model":"m","kv_dtype":"x","pools":[],"extra":1}"#,
                "Syntax",
            ),
        ];
        for (text, want) in cases {
            match LayoutSpec::from_json(text) {
                Err(LayoutError::Field { field, .. }) => assert_eq!(field, want, "{text}"),
                Err(LayoutError::Syntax(_)) => assert_eq!(want, "Syntax", "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let long = format!("\"{}\"", "x".repeat(MAX_SPEC_BYTES));
        assert!(matches!(
            LayoutSpec::from_json(&long),
            Err(LayoutError::TooLong(_))
        ));
    }

    #[test]
    fn json_round_trips() {
        let s = spec();
        assert_eq!(LayoutSpec::from_json(&s.to_json()).unwrap(), s);
    }
}
