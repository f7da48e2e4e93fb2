//! Rust `tracing` events forwarded to Python's `logging` (logger `peercache`), so an SGLang
//! process sees PeerCache's logs where it sees its own.

use std::sync::Once;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

struct PyLogLayer;

struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest
                .push_str(&format!(" {}={:?}", field.name(), value));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest.push_str(&format!(" {}={}", field.name(), value));
        }
    }
}

impl<S: Subscriber> Layer<S> for PyLogLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = match *event.metadata().level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            Level::INFO => 20,
            _ => 10,
        };
        let mut f = Fields {
            message: String::new(),
            rest: String::new(),
        };
        event.record(&mut f);
        let text = format!("{}{}", f.message, f.rest);
        Python::attach(|py| {
            if let Ok(logging) = py.import("logging")
                && let Ok(logger) = logging.call_method1("getLogger", ("peercache",))
            {
                let _ = logger.call_method1("log", (level, text));
            }
        });
    }
}

/// Installs the forwarding subscriber once (INFO and above unless `RUST_LOG` says otherwise).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter =
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
        let subscriber = tracing_subscriber::registry().with(filter).with(PyLogLayer);
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}
