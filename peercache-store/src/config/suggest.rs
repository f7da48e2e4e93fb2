//! "Did you mean …?": the known key nearest to a mistyped one.

/// The key of `known` nearest to `typed` by edit distance, if it is close enough to be a typo
/// (at most a quarter of the key's length, and at least 1, 2 for longer keys).
pub(crate) fn nearest<'k>(typed: &str, known: &[&'k str]) -> Option<&'k str> {
    let limit = (typed.len() / 4).clamp(1, 3);
    known
        .iter()
        .map(|k| (distance(typed, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over bytes (keys are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_nearest_key_and_strangers_get_none() {
        let known = ["directory_replicas", "op_timeout", "global_segment_size"];
        assert_eq!(
            nearest("directory_replica", &known),
            Some("directory_replicas")
        );
        assert_eq!(nearest("op_timout", &known), Some("op_timeout"));
        assert_eq!(
            nearest("global_segmnet_size", &known),
            Some("global_segment_size")
        );
        assert_eq!(nearest("completely_else", &known), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
