//! Help text for every series: each crate declares its metric names with
//! [`metric_names!`](crate::metric_names), whose doc comments become the `# HELP` lines of the
//! exposition, and the process that installs the recorder calls [`describe`] once per crate.
//!
//! ```
//! mod names {
//!     peercache_wire::metric_names! {
//!         /// Widgets made, label `colour`.
//!         pub const WIDGETS: &str = "example_widgets_total";
//!     }
//! }
//! assert_eq!(names::WIDGETS, "example_widgets_total");
//! assert_eq!(names::DESCRIPTIONS, &[("example_widgets_total", " Widgets made, label `colour`.")]);
//! assert_eq!(peercache_wire::describe::help_text(names::DESCRIPTIONS[0].1), "Widgets made, label colour.");
//! ```

/// Declares metric-name constants, each with its doc comment, and `DESCRIPTIONS`: every
/// name paired with its doc comment (the series' help text).
#[macro_export]
macro_rules! metric_names {
    ($( $(#[doc = $doc:literal])+ pub const $name:ident: &str = $value:literal; )*) => {
        $( $(#[doc = $doc])+ pub const $name: &str = $value; )*
        /// Every metric name of this module with its help text (its doc comment).
        pub const DESCRIPTIONS: &[(&str, &str)] = &[ $( ($value, concat!($($doc),+)) ),* ];
    };
}

/// A doc comment as one line of plain text: joined lines, no Markdown code or link marks.
pub fn help_text(doc: &str) -> String {
    let plain: String = doc
        .chars()
        .filter(|c| !matches!(c, '`' | '[' | ']'))
        .collect();
    plain.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Gives each named series its help text in the installed recorder (call it with the
/// recorder installed, once per process; the kind does not matter to the exposition).
pub fn describe(descriptions: &[(&'static str, &'static str)]) {
    for (name, doc) in descriptions {
        metrics::describe_counter!(*name, help_text(doc));
    }
}
