//! Many values searched for at once, through an automaton over only their
//! first [`Prefixed::LEN`] bytes; each match is checked against the whole
//! values that start so. An automaton over whole values has a state per byte
//! of every value, and building it held a larger one beside it: the
//! relabeller's was the high-water mark of a 10⁴-grant run (+81 MiB while
//! it was built), the leak scanner's ~2.6 KB a grant.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, Input, MatchKind};

/// Values (byte strings), each with what a match of it yields.
pub struct Prefixed<T> {
    /// Over each distinct prefix: a value's first `LEN` bytes, or all of it.
    ac: AhoCorasick,
    /// Per prefix (the automaton's pattern), the lengths of the values
    /// that start with it, longest first: `lengths[starts[p]..starts[p + 1]]`.
    starts: Vec<u32>,
    lengths: Vec<u32>,
    values: HashMap<Box<[u8]>, T, foldhash::fast::RandomState>,
}

/// Where a value occurs: `start..end` in the text searched, and its `T`.
pub struct Found<'a, T> {
    /// Where the value starts.
    pub start: usize,
    /// Where it ends (exclusive).
    pub end: usize,
    /// What it was given with.
    pub value: &'a T,
}

impl<T> Prefixed<T> {
    /// Enough to tell a random value from text, so few matches of a prefix
    /// are not the value; a shared one (a token's fixed header) costs a hash
    /// lookup per length at each of its occurrences.
    pub const LEN: usize = 8;

    /// Over `values`, distinct (a later one replaces an earlier one);
    /// empty ones are never found.
    pub fn new(mut values: Vec<(Box<[u8]>, T)>) -> Result<Self, aho_corasick::BuildError> {
        values.retain(|(v, _)| !v.is_empty());
        let mut by_prefix: Vec<(&[u8], std::cmp::Reverse<u32>)> = values
            .iter()
            .map(|(v, _)| {
                (
                    &v[..v.len().min(Self::LEN)],
                    std::cmp::Reverse(v.len() as u32),
                )
            })
            .collect();
        by_prefix.sort_unstable();
        by_prefix.dedup();
        let (mut prefixes, mut starts, mut lengths) = (Vec::new(), Vec::new(), Vec::new());
        for (prefix, std::cmp::Reverse(len)) in by_prefix {
            if prefixes.last() != Some(&prefix) {
                prefixes.push(prefix);
                starts.push(lengths.len() as u32);
            }
            lengths.push(len);
        }
        starts.push(lengths.len() as u32);
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
            .build(&prefixes)?;
        Ok(Self {
            ac,
            starts,
            lengths,
            values: values.into_iter().collect(),
        })
    }

    /// The lengths of the values that start with prefix `pattern`, longest first.
    fn lengths(&self, pattern: usize) -> &[u32] {
        let (from, to) = (self.starts[pattern], self.starts[pattern + 1]);
        &self.lengths[from as usize..to as usize]
    }

    /// The value of length `len` at `start` in `text`, if there is one.
    fn value_at(&self, text: &[u8], start: usize, len: u32) -> Option<Found<'_, T>> {
        let end = start + len as usize;
        let value = self.values.get(text.get(start..end)?)?;
        Some(Found { start, end, value })
    }

    /// Every occurrence of every value in `text`, overlapping ones too, in
    /// order of where their prefixes end.
    pub fn each_in(&self, text: &[u8], mut f: impl FnMut(Found<'_, T>)) {
        for m in self.ac.find_overlapping_iter(text) {
            for &len in self.lengths(m.pattern().as_usize()) {
                if let Some(found) = self.value_at(text, m.start(), len) {
                    f(found);
                }
            }
        }
    }

    /// The leftmost value in `text[from..]`, the longest there: what an
    /// automaton over the whole values finds leftmost-longest.
    pub fn leftmost_longest(&self, text: &[u8], from: usize) -> Option<Found<'_, T>> {
        let mut best: Option<Found<'_, T>> = None;
        let input = Input::new(text).span(from..text.len());
        // Matches come in order of their ends, and a prefix is at most LEN
        // long: once one ends past best.start + LEN, none can start at or
        // before it.
        for m in self.ac.find_overlapping_iter(input) {
            if let Some(b) = &best {
                if m.end() > b.start + Self::LEN {
                    break;
                }
                if m.start() > b.start {
                    continue;
                }
            }
            let lengths = self.lengths(m.pattern().as_usize()).iter();
            let Some(f) = lengths
                .filter_map(|&len| self.value_at(text, m.start(), len))
                .next()
            else {
                continue;
            };
            let better = best.as_ref().is_none_or(|b| {
                (f.start, std::cmp::Reverse(f.end)) < (b.start, std::cmp::Reverse(b.end))
            });
            if better {
                best = Some(f);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Values sharing prefixes (a fixed header), of several lengths, some
    /// shorter than the prefix, inside and overlapping each other.
    fn values() -> impl Strategy<Value = Vec<String>> {
        let value = proptest::collection::vec(
            prop_oneof![Just("eyJhbGci".to_string()), "[ab]{1,3}", "[a-c0-9]{1,12}"],
            1..4,
        )
        .prop_map(|parts| parts.concat());
        proptest::collection::vec(value, 1..8)
    }

    fn text(values: &[String]) -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            proptest::sample::select(values.to_vec()),
            Just("eyJhbGci".to_string()),
            "[a-c0-9]{0,12}",
        ];
        proptest::collection::vec(piece, 0..30).prop_map(|p| p.concat())
    }

    proptest! {
        /// Leftmost-longest, match after match, as aho-corasick finds it
        /// with an automaton over the whole values.
        #[test]
        fn finds_what_a_whole_value_automaton_finds(
            (values, text) in values().prop_flat_map(|v| { let t = text(&v); (Just(v), t) })
        ) {
            let p = Prefixed::new(values.iter().enumerate()
                .map(|(i, v)| (v.as_bytes().into(), i)).collect()).unwrap();
            let whole = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&values)
                .unwrap();
            let mut at = 0;
            for want in whole.find_iter(&text) {
                let got = p.leftmost_longest(text.as_bytes(), at).expect("a match");
                prop_assert_eq!((got.start, got.end), (want.start(), want.end()));
                // Duplicates: the last one given is kept.
                prop_assert_eq!(&values[*got.value], &text[got.start..got.end]);
                at = got.end;
            }
            prop_assert!(p.leftmost_longest(text.as_bytes(), at).is_none());

            // Every occurrence, overlapping too.
            let mut all: Vec<(usize, usize)> = Vec::new();
            p.each_in(text.as_bytes(), |f| all.push((f.start, f.end)));
            all.sort_unstable();
            let mut want: Vec<(usize, usize)> = whole_overlapping(&values, &text);
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }

    /// Each distinct value at each place it occurs.
    fn whole_overlapping(values: &[String], text: &str) -> Vec<(usize, usize)> {
        let mut distinct: Vec<&String> = values.iter().collect();
        distinct.sort();
        distinct.dedup();
        let mut out = Vec::new();
        for v in distinct {
            for start in 0..text.len() {
                if text[start..].starts_with(v.as_str()) {
                    out.push((start, start + v.len()));
                }
            }
        }
        out
    }
}
