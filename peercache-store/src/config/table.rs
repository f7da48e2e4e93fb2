//! The `settings!` macro: one declaration per key generates the [`PeerCacheConfig`] struct,
//! its `Default`, the key parser used by every source (JSON, TOML, `PEERCACHE_*`, `--set`),
//! the known-key list, the read-back used by the every-key test and the table the docs are
//! checked against. Adding a key is one entry in `config/mod.rs`.
//!
//! [`PeerCacheConfig`]: super::PeerCacheConfig

/// Declares every key. Each entry:
///
/// ```text
/// /// Doc lines (become the field docs and the key's `doc`).
/// name: Type = default_value;
///     shown "how docs/configuration.md writes the default", example "a valid non-default value",
///     parse |key, value| -> Result<Type, ConfigError>;
/// ```
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident : $ty:ty = $default:expr ;
            shown $shown:literal , example $example:literal , parse $parse:expr ;
    )*) => {
        /// Every setting of a PeerCache node (one field per key of [`KEYS`]).
        #[derive(Clone, Debug, PartialEq)]
        pub struct PeerCacheConfig {
            $( $(#[doc = $doc])+ pub $name: $ty, )*
        }

        impl Default for PeerCacheConfig {
            fn default() -> Self {
                PeerCacheConfig { $( $name: $default, )* }
            }
        }

        /// Every key this build understands, in declaration order.
        pub const KEYS: &[&str] = &[ $( stringify!($name), )* ];

        /// Every key's declaration, in declaration order.
        pub const SETTINGS: &[Setting] = &[ $(
            Setting {
                key: stringify!($name),
                shown_default: $shown,
                example: $example,
                doc: concat!($($doc, "\n"),+),
            },
        )* ];

        impl PeerCacheConfig {
            /// Parses `v` into `key`'s field: `Ok(false)` for a key this build does not know.
            fn set(&mut self, key: &str, v: &serde_json::Value) -> Result<bool, ConfigError> {
                match key {
                    $( stringify!($name) => {
                        let parse: fn(&'static str, &serde_json::Value) -> Result<$ty, ConfigError> =
                            $parse;
                        self.$name = parse(stringify!($name), v)?;
                    } )*
                    _ => return Ok(false),
                }
                Ok(true)
            }

            /// `key`'s current value as `Debug` prints it (secrets stay redacted); `None` for
            /// a key this build does not know.
            pub fn shown(&self, key: &str) -> Option<String> {
                match key {
                    $( stringify!($name) => Some(format!("{:?}", self.$name)), )*
                    _ => None,
                }
            }
        }
    };
}
