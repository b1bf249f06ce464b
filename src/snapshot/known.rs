//! Where any of a run's known values (ids, secrets) occurs in a text: the
//! leftmost, and the longest there, as one leftmost-longest automaton over
//! every value would find it. That automaton grew with the values' length: a
//! 10⁵-grant run labels ~600,000 values of ~40 bytes, ~21 million states,
//! and building its contiguous form held the non-contiguous one beside it
//! (~1 GB at the end of the run). This one is built over each value's first
//! [`PREFIX`] bytes only and checks the rest where one of those occurs.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, AhoCorasickKind, Input, MatchKind};

/// Bytes of each value the automaton knows; a longer value is checked whole
/// where its first bytes occur. Long enough that ids made of a fixed
/// prefix and a random part (`bucket-<uuid>`) rarely share them.
const PREFIX: usize = 16;

/// A value found in a text: its byte span and its label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found<'a> {
    pub start: usize,
    pub end: usize,
    pub label: &'a str,
}

/// The values known at one moment, with their labels, compiled.
pub(super) struct Known {
    /// Over each value's first `PREFIX` bytes (the whole of a shorter one),
    /// each such prefix once.
    ac: AhoCorasick,
    /// Per automaton pattern, the lengths of the values it begins, longest
    /// first: `lens[starts[p]..starts[p + 1]]`.
    starts: Vec<u32>,
    lens: Vec<u32>,
    /// Every value, by its bytes, with its label.
    labels: HashMap<Box<[u8]>, Box<str>, foldhash::fast::RandomState>,
}

impl Known {
    /// Compile `(value, label)` pairs (values distinct and not empty);
    /// `None` if the automaton cannot be built (only on absurd sets).
    pub(super) fn new<'a>(values: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let mut labels: HashMap<Box<[u8]>, Box<str>, _> = HashMap::default();
        // Prefix → lengths of the values it begins.
        let mut by_prefix: HashMap<&[u8], Vec<u32>, foldhash::fast::RandomState> =
            HashMap::default();
        let values: Vec<(&str, &str)> = values.into_iter().collect();
        for (raw, label) in &values {
            let raw = raw.as_bytes();
            let len = u32::try_from(raw.len()).ok()?;
            by_prefix
                .entry(&raw[..raw.len().min(PREFIX)])
                .or_default()
                .push(len);
            labels.insert(raw.into(), (*label).into());
        }
        // Patterns in a fixed order (the automaton's pattern ids index `starts`).
        let mut prefixes: Vec<(&[u8], Vec<u32>)> = by_prefix.into_iter().collect();
        prefixes.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut starts = Vec::with_capacity(prefixes.len() + 1);
        let mut lens = Vec::with_capacity(values.len());
        for (_, l) in &mut prefixes {
            l.sort_unstable_by(|a, b| b.cmp(a));
            l.dedup();
            starts.push(lens.len() as u32);
            lens.extend_from_slice(l);
        }
        starts.push(lens.len() as u32);
        // A contiguous NFA, not the DFA `auto` picks for small sets: a run
        // scans each text once or twice, so building a DFA (most of an
        // explored case's relabelling) never paid for its faster scan.
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(prefixes.iter().map(|(p, _)| p))
            .ok()?;
        Some(Self {
            ac,
            starts,
            lens,
            labels,
        })
    }

    /// The leftmost value in `text[from..]`, the longest one there.
    pub(super) fn find(&self, text: &str, mut from: usize) -> Option<Found<'_>> {
        let bytes = text.as_bytes();
        while from < bytes.len() {
            let m = self.ac.find(Input::new(bytes).span(from..bytes.len()))?;
            let (start, rest) = (m.start(), &bytes[m.start()..]);
            let p = m.pattern().as_usize();
            let lens = &self.lens[self.starts[p] as usize..self.starts[p + 1] as usize];
            // The values this prefix begins, longest first; then a shorter
            // value that is itself a prefix of the one found (the automaton
            // reports only the longest pattern at a position).
            let longer = lens.iter().map(|&l| l as usize);
            let shorter = (1..m.len()).rev();
            for len in longer.chain(shorter) {
                if let Some(label) = rest.get(..len).and_then(|v| self.labels.get(v)) {
                    return Some(Found {
                        start,
                        end: start + len,
                        label,
                    });
                }
            }
            // Only a prefix occurs here: a value may still start further on.
            from = start + 1;
        }
        None
    }

    /// Append `text` to `out` with each value found replaced by its label.
    pub(super) fn replace_into(&self, text: &str, out: &mut String) {
        let mut at = 0;
        while let Some(f) = self.find(text, at) {
            out.push_str(&text[at..f.start]);
            out.push_str(f.label);
            at = f.end;
        }
        out.push_str(&text[at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leftmost value at or after `from`, the longest there, by brute force.
    fn naive<'a>(values: &'a [(String, String)], text: &str, from: usize) -> Option<Found<'a>> {
        (from..text.len())
            .filter(|&s| text.is_char_boundary(s))
            .find_map(|s| {
                values
                    .iter()
                    .filter(|(v, _)| text[s..].starts_with(v.as_str()))
                    .max_by_key(|(v, _)| v.len())
                    .map(|(v, l)| Found {
                        start: s,
                        end: s + v.len(),
                        label: l.as_str(),
                    })
            })
    }

    fn distinct(values: Vec<String>) -> Vec<(String, String)> {
        let mut seen = std::collections::HashSet::new();
        values
            .into_iter()
            .filter(|v| !v.is_empty() && seen.insert(v.clone()))
            .enumerate()
            .map(|(i, v)| (v, format!("<v-{i}>")))
            .collect()
    }

    proptest::proptest! {
        /// Values sharing long prefixes, shorter than, as long as and longer
        /// than the prefix, nested in each other: every match is the one a
        /// search over every whole value finds.
        #[test]
        fn finds_what_a_search_for_every_whole_value_finds(
            values in proptest::collection::vec("[ab]{1,24}|x[ab]{14,20}y?|é[ab]{0,18}", 1..24),
            text in "[abxyé ]{0,120}",
        ) {
            let values = distinct(values);
            let known = Known::new(values.iter().map(|(v, l)| (v.as_str(), l.as_str()))).unwrap();
            let mut at = 0;
            loop {
                let want = naive(&values, &text, at);
                proptest::prop_assert_eq!(known.find(&text, at), want);
                match want {
                    Some(f) => at = f.end,
                    None => break,
                }
            }
        }
    }

    #[test]
    fn a_value_longer_than_the_prefix_is_found_whole_or_not_at_all() {
        let id = "bucket-a326337b-9460-4f8b-8e31-eeb8cfe60652";
        let short = "bucket-a3";
        let values = [(id, "<bucket-1>"), (short, "<b-short>")];
        let known = Known::new(values).unwrap();
        let mut out = String::new();
        known.replace_into(
            &format!("{id} / {}X / bucket-a326337b-9460-", &id[..30]),
            &mut out,
        );
        // The full id; a cut one only as far as the short value it holds.
        assert_eq!(
            out,
            "<bucket-1> / <b-short>26337b-9460-4f8b-8e31X / <b-short>26337b-9460-"
        );
    }
}
