//! Seconds on a command line: the tools' (and the bench's) waits and deadlines are given as
//! decimal seconds and turned into a [`std::time::Duration`], which panics on a negative, NaN
//! or too large number. These clap value parsers refuse such a value with a reason instead, so
//! the conversion after them cannot fail.

/// The longest wait accepted: a year (far beyond any deadline, far inside `Duration`).
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// Parses a number of seconds for an option that may be zero (a wait that may be skipped):
/// finite, not negative, at most [`MAX_SECONDS`].
///
/// ```
/// use peercache_store::tools::secs::seconds;
/// assert_eq!(seconds("0.25"), Ok(0.25));
/// assert_eq!(seconds("0"), Ok(0.0));
/// assert!(seconds("-1").unwrap_err().contains("not negative"));
/// assert!(seconds("nan").is_err() && seconds("1e300").is_err() && seconds("soon").is_err());
/// ```
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !v.is_finite() || v < 0.0 {
        return Err("seconds must be a finite number, not negative".into());
    }
    if v > MAX_SECONDS {
        return Err(format!("at most {MAX_SECONDS} seconds (a year)"));
    }
    Ok(v)
}

/// As [`seconds`], and more than zero: a deadline, a TTL or a measuring window of zero would
/// refuse or measure nothing.
///
/// ```
/// use peercache_store::tools::secs::positive_seconds;
/// assert_eq!(positive_seconds("2"), Ok(2.0));
/// assert!(positive_seconds("0").unwrap_err().contains("more than zero"));
/// ```
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err("seconds must be more than zero".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_a_parser_accepts_converts_to_a_duration() {
        for s in ["0", "0.001", "2", " 30 ", "31536000", "1e-9"] {
            let v = seconds(s).unwrap();
            assert!(std::time::Duration::try_from_secs_f64(v).is_ok(), "{s}");
        }
        for s in ["-0.5", "-inf", "inf", "NaN", "31536001", "", "5s", "1,5"] {
            assert!(seconds(s).is_err(), "{s:?} accepted");
        }
        assert!(positive_seconds("0.0").is_err() && positive_seconds("-0").is_err());
    }
}
