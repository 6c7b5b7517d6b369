//! Prompt lookup: the tokens that followed the latest earlier occurrence of a sequence's last
//! few tokens are proposed as what follows them now. It pays where replies repeat their
//! context (code edits, quotes, extraction, summaries with names) and costs nothing to compute.

/// The longest suffix looked up first; shorter ones down to [`MIN_MATCH`] are tried when it
/// does not occur earlier.
pub const MAX_MATCH: usize = 3;

/// The shortest suffix looked up.
pub const MIN_MATCH: usize = 1;

/// Up to `k` tokens to propose after `context` (the sequence's tokens, prompt and generated):
/// for the longest suffix of `MAX_MATCH` down to `MIN_MATCH` tokens that also occurs earlier,
/// the tokens after its latest earlier occurrence. Empty when no suffix recurs, `k` is 0 or the
/// context is too short.
pub fn propose(context: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let len = context.len();
    for n in (MIN_MATCH..=MAX_MATCH.min(len.saturating_sub(1))).rev() {
        let suffix = &context[len - n..];
        // Latest start first, the suffix itself excluded: `start + n < len`.
        let found = (0..len - n)
            .rev()
            .find(|&start| &context[start..start + n] == suffix);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + k).min(len);
            return context[from..to].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_earlier_occurrence_of_the_longest_suffix_wins() {
        // "a b c d | x b c e | b c" : the suffix "b c" last occurred before "e".
        let context = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3];
        assert_eq!(propose(&context, 2), [5, 2]);
        assert_eq!(
            propose(&context, 8),
            [5, 2, 3],
            "never past the context's end"
        );
        // The 3-token suffix "9 2 3" recurs only with a longer context.
        let context = [9, 2, 3, 7, 7, 1, 9, 2, 3];
        assert_eq!(propose(&context, 3), [7, 7, 1]);
    }

    #[test]
    fn shorter_suffixes_are_tried_and_nothing_recurring_proposes_nothing() {
        // Only the last token, 4, recurs.
        assert_eq!(propose(&[4, 8, 6, 2, 4], 2), [8, 6]);
        assert!(propose(&[1, 2, 3, 4], 4).is_empty());
        assert!(propose(&[1, 1], 0).is_empty());
        assert!(propose(&[1], 3).is_empty());
        assert!(propose(&[], 3).is_empty());
        // A run repeats itself.
        assert_eq!(propose(&[7, 7, 7], 2), [7]);
    }
}
