//! What every system's ownership snapshot shares: the normaliser. Ids are
//! labelled in first-seen order (`<uid-1>`), secrets only as labels that change
//! when the secret changes (`<secret-A>`), so a diff shows a rotation and no
//! secret is ever written out. Each system renders its own snapshot
//! (`crate::systems::*::snapshot`) through one. Snapshots are compared as
//! line diffs; a run keeps its per-step snapshots as what each step changed.
use std::collections::BTreeMap;

use drivelab_fakes::secret::Secret;

use crate::prefixed::Prefixed;

/// Assigns stable labels to ids and secrets and rewrites text with them.
#[derive(Default)]
pub struct Normalizer {
    labels: BTreeMap<String, String>,
    counters: BTreeMap<&'static str, usize>,
    secrets: BTreeMap<String, String>,
    /// The automaton over the values known when it was built, and the values
    /// added since. A snapshot calls `text` once per line, often right after
    /// labelling a new id; rebuilding per call made a step cost O(ids²) (issue
    /// 9's profile: 65% of a growth run's CPU; at 1000 nodes, 72%).
    cache: std::sync::Mutex<Cache>,
    /// The last snapshot's lines relabelled, for [`Normalizer::text_all_lines`].
    lines: Option<LineMemo>,
    /// Short texts relabelled, for [`Normalizer::text_kept`].
    texts: Option<TextMemo>,
    /// While either memo exists: the values labelled (or labelled anew) since
    /// the last [`Normalizer::text_all_lines`] call began, in order. What
    /// was relabelled knowing every value before one of them is stale if it
    /// occurs in the text.
    log: Vec<Box<str>>,
    /// How many values were logged before `log[0]`.
    log_base: usize,
    /// A labelled value holds a newline: it could span lines, so
    /// [`Normalizer::text_all_lines`] relabels texts whole.
    multiline: bool,
    /// Set by [`Normalizer::forget_lines`]: no text will be asked for again,
    /// so none is kept.
    keep_none: bool,
}

/// The lines of the last text relabelled through [`Normalizer::text_all_lines`],
/// each relabelled knowing every value before the log's start: a line none
/// of the logged values occurs in relabels as it did. A snapshot after every
/// step relabelled the whole state each step, a third of a 500-grant
/// `drivelab run`.
#[derive(Default)]
struct LineMemo {
    /// Raw line, with its newline → the line relabelled.
    lines: LineMap,
}

/// Short texts relabelled by [`Normalizer::text_kept`] (a snapshot's sort
/// keys and backend names, the same every step), each right as of the log
/// position `settled` (counting from the first value ever logged); kept
/// until a snapshot no longer asks for one.
#[derive(Default)]
struct TextMemo {
    texts: KeptTexts,
    /// The same for [`Normalizer::text_all_kept`] (hex runs labelled too).
    texts_all: KeptTexts,
    settled: usize,
}

impl TextMemo {
    /// The texts kept by [`Normalizer::text_all_kept`] (`hex`) or by
    /// [`Normalizer::text_kept`].
    fn texts_mut(&mut self, hex: bool) -> &mut KeptTexts {
        if hex {
            &mut self.texts_all
        } else {
            &mut self.texts
        }
    }
}

type KeptTexts = std::collections::HashMap<Box<str>, KeptText, foldhash::fast::RandomState>;

struct KeptText {
    labelled: Box<str>,
    /// Asked for since the last [`Normalizer::text_all_lines`] call.
    used: bool,
}

/// Raw line → the line relabelled, and the raw line's [`PairBits`]. Hashed
/// with foldhash: SipHash was a third of the relabelling that remained.
type LineMap =
    std::collections::HashMap<Box<str>, (Box<str>, PairBits), foldhash::fast::RandomState>;

/// A 256-bit summary of the adjacent byte pairs in a text: a text can hold
/// a value only if it has every bit the value has. A kept line is checked
/// against each value labelled since with four ANDs, and searched only if
/// it has them all; searching the whole snapshot for those values each
/// step was a tenth of a 1,000-grant run with a snapshot per step.
#[derive(Clone, Copy, Default)]
struct PairBits([u64; 4]);

impl PairBits {
    fn of(text: &str) -> Self {
        let mut bits = [0u64; 4];
        for w in text.as_bytes().windows(2) {
            let pair = (u32::from(w[0]) << 8) | u32::from(w[1]);
            let bit = (pair.wrapping_mul(0x9E37_79B1) >> 24) as usize;
            bits[bit >> 6] |= 1 << (bit & 63);
        }
        Self(bits)
    }

    /// Whether a text with these bits may hold one with `value`'s.
    fn may_hold(self, value: PairBits) -> bool {
        (0..4).all(|i| self.0[i] & value.0[i] == value.0[i])
    }
}

/// Where relabelled text goes: a string, or a text packed as it is written
/// (a run's last snapshot, held to the run's end).
pub trait TextSink: Default {
    /// Append `text`.
    fn push_str(&mut self, text: &str);
}

impl TextSink for String {
    fn push_str(&mut self, text: &str) {
        String::push_str(self, text)
    }
}

impl TextSink for crate::packed::PackedWriter {
    fn push_str(&mut self, text: &str) {
        crate::packed::PackedWriter::push_str(self, text)
    }
}

/// A snapshot's raw text as it is written: whole lines, held in pieces of
/// about [`RawText::PIECE`] bytes, so that [`Normalizer::relabel`] can drop
/// each piece of the last snapshot once it is relabelled (held whole beside
/// its relabelled copy, the raw text was a fifth of a 10⁵-grant run's end).
/// A piece is cut only after a newline, so its lines are the text's lines.
#[derive(Default)]
pub struct RawText {
    pieces: Vec<Piece>,
    len: usize,
    /// Each full piece is LZ4-packed ([`RawText::packing`]).
    pack: bool,
}

/// A piece of a [`RawText`].
enum Piece {
    Text(String),
    /// LZ4 block, its length prepended.
    Packed(Vec<u8>),
}

impl Piece {
    fn into_text(self) -> String {
        match self {
            Piece::Text(t) => t,
            // Only this module packs, from whole &str pieces: the block
            // decodes and is UTF-8; the fallbacks are never taken.
            Piece::Packed(b) => {
                let bytes = lz4_flex::block::decompress_size_prepended(&b).unwrap_or_default();
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
            }
        }
    }
}

impl RawText {
    const PIECE: usize = 64 * 1024;

    /// One whose full pieces are held LZ4-packed: the last snapshot's, read
    /// once, in order, piece by piece (its raw text is several times the
    /// size packed, and was most of what the end added at 10⁵ grants).
    pub fn packing() -> Self {
        Self {
            pack: true,
            ..Self::default()
        }
    }

    /// Append `s` (a piece is cut only where what it holds ends a line).
    pub fn push_str(&mut self, s: &str) {
        match self.pieces.last_mut() {
            Some(Piece::Text(p)) if p.len() < Self::PIECE || !p.ends_with('\n') => p.push_str(s),
            last => {
                if let (true, Some(last)) = (self.pack, last) {
                    if let Piece::Text(full) = last {
                        *last =
                            Piece::Packed(lz4_flex::block::compress_prepend_size(full.as_bytes()));
                    }
                }
                let mut p = String::with_capacity(Self::PIECE.max(s.len()) + 4096);
                p.push_str(s);
                self.pieces.push(Piece::Text(p));
            }
        }
        self.len += s.len();
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each piece, unpacked, in order.
    fn into_pieces(self) -> impl Iterator<Item = String> {
        self.pieces.into_iter().map(Piece::into_text)
    }
}

impl From<&str> for RawText {
    fn from(text: &str) -> Self {
        let mut raw = RawText::default();
        for line in text.split_inclusive('\n') {
            raw.push_str(line);
        }
        raw
    }
}

impl std::fmt::Write for RawText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// A searcher for where any of `values` occurs. Leftmost-first, because only
/// a leftmost match kind lets aho-corasick use its SIMD prefilter (Teddy)
/// for a few patterns: most of a snapshot's bytes are hex, which defeats
/// the rare-byte prefilter a standard search uses.
fn any_of(values: &[Box<str>]) -> Option<aho_corasick::AhoCorasick> {
    aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostFirst)
        .build(values.iter().map(|v| v.as_bytes()))
        .ok()
}

/// The compiled automaton and what it does not know yet.
#[derive(Default)]
struct Cache {
    matcher: Option<Matcher>,
    /// Values labelled after `matcher` was built. While none of them occurs
    /// in a text, the old automaton's rewrite of it is exactly the new one's
    /// (a leftmost-longest match can only change if a new pattern matches).
    pending: std::collections::HashSet<Box<str>>,
    /// An automaton over `pending` alone, built when one of them may occur in
    /// a text and dropped when another is added. With it a text is rewritten
    /// by both automata, and `matcher` is rebuilt only once `pending` grows
    /// past the square root of every value: a run that labels an id per step
    /// and rewrites a snapshot per step rebuilt an automaton over every id on
    /// every step (a fifth of a 500-grant `drivelab run`'s CPU).
    recent: Option<Matcher>,
}

/// Up to this many pending values are searched for one by one.
const FEW_PENDING: usize = 16;
/// `pending` is folded into `matcher` past this many values, or the square
/// root of every value if that is more.
const MIN_FOLD: usize = 64;

impl Cache {
    /// A value was labelled (`total` are known now): the automaton no longer knows every one.
    fn added(&mut self, raw: &str, total: usize) {
        if self.matcher.is_some() {
            // Even a pending value: it may have been an id and be a secret now.
            self.recent = None;
            self.pending.insert(raw.into());
            if self.pending.len() > MIN_FOLD.max(total.isqrt()) {
                self.invalidate();
            }
        }
    }

    fn invalidate(&mut self) {
        *self = Cache::default();
    }
}

// Holds raw secrets: Debug shows only counts.
impl std::fmt::Debug for Normalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Normalizer")
            .field("ids", &self.labels.len())
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// Every known secret and id with its label, compiled once.
#[derive(Clone)]
enum Matcher {
    /// Nothing is known yet: text passes unchanged.
    Empty,
    /// Every value, with its label.
    Ready(std::sync::Arc<Prefixed<Box<str>>>),
    /// The pattern set could not be compiled (only on absurd sets).
    Failed,
}

impl Matcher {
    /// Append `text` to `out` rewritten as one automaton over this one's
    /// values and `recent`'s would: the leftmost match, the longest there,
    /// `recent`'s on a tie (the same value, labelled again since: a secret
    /// that was an id, which its label as a secret wins over).
    fn replace_with(&self, recent: &Matcher, text: &str, out: &mut String) {
        let (Matcher::Ready(a), Matcher::Ready(b)) = (self, recent) else {
            return match (self, recent) {
                // Never write unlabelled text.
                (Matcher::Failed, _) => self.replace_into(text, out),
                (_, Matcher::Failed) | (Matcher::Empty, _) => recent.replace_into(text, out),
                _ => self.replace_into(text, out),
            };
        };
        fn find<'p>(
            p: &'p Prefixed<Box<str>>,
            text: &str,
            at: usize,
        ) -> Option<(usize, usize, &'p str)> {
            (p.leftmost_longest(text.as_bytes(), at)).map(|f| (f.start, f.end, &**f.value))
        }
        let (mut at, mut ma, mut mb) = (0, find(a, text, 0), find(b, text, 0));
        loop {
            // A match found earlier is still the leftmost from `at` unless it starts before.
            if ma.is_some_and(|m| m.0 < at) {
                ma = find(a, text, at);
            }
            if mb.is_some_and(|m| m.0 < at) {
                mb = find(b, text, at);
            }
            let (start, end, label) = match (ma, mb) {
                (None, None) => break,
                (Some(x), Some(y)) if (x.0, y.1 - y.0) < (y.0, x.1 - x.0) => x,
                (Some(x), None) => x,
                (_, Some(y)) => y,
            };
            out.push_str(&text[at..start]);
            out.push_str(label);
            at = end;
        }
        out.push_str(&text[at..]);
    }

    /// Append `text` to `out` with every known value replaced by its label.
    fn replace_into(&self, text: &str, out: &mut String) {
        match self {
            Matcher::Ready(p) => {
                let mut at = 0;
                while let Some(f) = p.leftmost_longest(text.as_bytes(), at) {
                    out.push_str(&text[at..f.start]);
                    out.push_str(f.value);
                    at = f.end;
                }
                out.push_str(&text[at..]);
            }
            Matcher::Empty => out.push_str(text),
            // Never write unlabelled text.
            Matcher::Failed => out.push_str("<snapshot could not be labelled>"),
        }
    }
}

/// The automata of every value known at one moment, copied (they share
/// their tables), for a text rewritten in pieces as one pass would rewrite it.
struct Frozen {
    base: Matcher,
    /// Over the values labelled since `base` was built, if any.
    recent: Option<Matcher>,
}

impl Frozen {
    /// Append `text` to `out` with every value known then replaced by its label.
    fn replace_into(&self, text: &str, out: &mut String) {
        match &self.recent {
            Some(r) => self.base.replace_with(r, text, out),
            None => self.base.replace_into(text, out),
        }
    }
}

/// An `io::Write` that hands on what is written in pieces of whole lines of
/// about [`LineChunks::PIECE`] bytes (pieces, not single lines: each search
/// of a piece has a setup cost); [`LineChunks::finish`] hands on the
/// unterminated rest.
struct LineChunks<F: FnMut(&str)> {
    pending: Vec<u8>,
    f: F,
}

impl<F: FnMut(&str)> LineChunks<F> {
    const PIECE: usize = 64 * 1024;

    fn new(f: F) -> Self {
        Self {
            pending: Vec::with_capacity(Self::PIECE + 4096),
            f,
        }
    }

    /// Hand on `pending` up to its last newline, keeping the rest.
    fn emit_lines(&mut self) {
        if let Some(end) = memchr::memrchr(b'\n', &self.pending) {
            // A newline byte never falls inside a UTF-8 sequence, so whole
            // lines cut from valid UTF-8 are valid.
            (self.f)(&String::from_utf8_lossy(&self.pending[..=end]));
            self.pending.drain(..=end);
        }
    }

    fn finish(mut self) {
        self.emit_lines();
        if !self.pending.is_empty() {
            (self.f)(&String::from_utf8_lossy(&self.pending));
        }
    }
}

impl<F: FnMut(&str)> std::io::Write for LineChunks<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.pending.len() >= Self::PIECE {
            self.emit_lines();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Normalizer {
    /// Label `raw` as `<category-N>` (first time seen) and return the label.
    pub fn id(&mut self, category: &'static str, raw: &str) -> String {
        if raw.is_empty() {
            return String::new();
        }
        if let Some(l) = self.labels.get(raw) {
            return l.clone();
        }
        let n = self.counters.entry(category).or_insert(0);
        *n += 1;
        let label = format!("<{category}-{n}>");
        self.labels.insert(raw.to_string(), label.clone());
        self.added(raw);
        label
    }

    /// Whether `raw` has a label (as an id or a secret); the empty text has
    /// none and needs none.
    pub fn knows(&self, raw: &str) -> bool {
        raw.is_empty() || self.labels.contains_key(raw) || self.secrets.contains_key(raw)
    }

    /// Label a fixed value with a fixed name (e.g. the endpoint URL).
    pub fn fixed(&mut self, raw: &str, label: &str) {
        if !raw.is_empty() {
            // May relabel a known value, which the automaton would still use.
            self.labels.insert(raw.to_string(), format!("<{label}>"));
            self.cache_mut().invalidate();
            self.log_for_lines(raw);
        }
    }

    /// Label a secret `<secret-A>`, `<secret-B>`, ... in first-seen order.
    pub fn secret(&mut self, s: &Secret) -> String {
        let raw = s.expose();
        if raw.is_empty() {
            return "<empty-secret>".to_string();
        }
        if let Some(l) = self.secrets.get(raw) {
            return l.clone();
        }
        let label = format!("<secret-{}>", letters(self.secrets.len()));
        self.secrets.insert(raw.to_string(), label.clone());
        self.added(raw);
        label
    }

    /// Like [`Normalizer::text`], then labels any remaining run of 16+ lowercase
    /// hex digits (names a driver derived from random ids, e.g. `key-<sha256>`)
    /// as `<hex-N>` in order of appearance, so two runs of one seed compare equal.
    pub fn text_all(&mut self, text: &str) -> String {
        let known = self.text(text);
        let mut out = String::with_capacity(known.len());
        self.label_hex(&known, &mut out);
        out
    }

    /// [`Normalizer::text_all`] of a text much like the last one given here,
    /// line by line: see [`Normalizer::relabel`] (which takes the text as a
    /// snapshot writes it).
    pub fn text_all_lines(&mut self, text: &str) -> String {
        self.relabel(RawText::from(text))
    }

    /// [`Normalizer::text_all`] of a snapshot's raw text, line by line: a
    /// line given last time is not relabelled again unless a value labelled
    /// since occurs in it. The result is `text_all`'s of the whole text, byte
    /// for byte (a test checks it); a snapshot taken after every step pays
    /// for what the step changed, not for the whole state again. After
    /// [`Normalizer::forget_lines`], each raw piece is dropped once relabelled.
    pub fn relabel<S: TextSink>(&mut self, raw: RawText) -> S {
        let start = self.log.len();
        // The end of a snapshot: kept texts it did not ask for go.
        self.settle_texts(true);
        let mut out = S::default();
        if self.multiline {
            self.lines = None;
            out.push_str(&self.text_all(&raw.into_pieces().collect::<String>()));
        } else if self.keep_none {
            // Nothing is kept, but a line at a time all the same: the whole
            // text relabelled once and then hex-labelled again held two
            // copies beside the raw one (+120 MiB at 10⁵ grants); the raw
            // text held whole beside the relabelled one was another.
            self.lines = None;
            let (known, mut scratch, mut line_out) =
                (self.frozen_matchers(), String::new(), String::new());
            for piece in raw.into_pieces() {
                for line in piece.split_inclusive('\n') {
                    line_out.clear();
                    self.line_all(&known, line, &mut scratch, &mut line_out);
                    out.push_str(&line_out);
                }
            }
        } else {
            let pieces: Vec<String> = raw.into_pieces().collect();
            out.push_str(&self.relabel_kept_lines(&pieces));
        }
        // Every kept line and text was relabelled knowing these.
        self.log.drain(..start);
        self.log_base += start;
        out
    }

    /// [`Normalizer::relabel`] keeping each line relabelled for the next call.
    fn relabel_kept_lines(&mut self, pieces: &[String]) -> String {
        let mut memo = self.lines.take().unwrap_or_default();
        let since: Vec<(PairBits, Box<str>)> = (self.log.iter())
            .map(|v| (PairBits::of(v), v.clone()))
            .collect();
        let is_stale = |line: &str, bits: PairBits| {
            since.iter().any(|(vb, v)| {
                bits.may_hold(*vb) && memchr::memmem::find(line.as_bytes(), v.as_bytes()).is_some()
            })
        };
        let mut kept = std::mem::take(&mut memo.lines);
        // Values labelled from here on are logged for the next call.
        self.lines = Some(memo);
        let known = self.frozen_matchers();
        let mut lines = LineMap::with_capacity_and_hasher(kept.len() + 16, Default::default());
        let mut out = String::with_capacity(pieces.iter().map(String::len).sum());
        let mut rewritten = String::new();
        for line in pieces.iter().flat_map(|p| p.split_inclusive('\n')) {
            if let Some((l, _)) = lines.get(line) {
                out.push_str(l);
                continue;
            }
            let (key, entry) = match kept.remove_entry(line) {
                Some((key, (l, bits))) if !is_stale(line, bits) => (key, (l, bits)),
                _ => {
                    let mut l = String::with_capacity(line.len());
                    self.line_all(&known, line, &mut rewritten, &mut l);
                    (line.into(), (l.into_boxed_str(), PairBits::of(line)))
                }
            };
            out.push_str(&entry.0);
            lines.insert(key, entry);
        }
        if let Some(memo) = &mut self.lines {
            memo.lines = lines;
        }
        out
    }

    /// Append `line` (no value spans lines) to `out` as [`Normalizer::text_all`]
    /// relabels it within a whole text, knowing what `known` knows.
    fn line_all(&mut self, known: &Frozen, line: &str, scratch: &mut String, out: &mut String) {
        scratch.clear();
        known.replace_into(line, scratch);
        self.label_hex(scratch, out);
    }

    /// [`Normalizer::text`] of a short text asked for again and again (a
    /// sort key, a name): kept from the last time unless a value labelled
    /// since occurs in it. Kept texts are checked in one search when values
    /// were labelled since the last check, and dropped when nothing asked
    /// for them between two checks.
    pub fn text_kept(&mut self, raw: &str) -> String {
        self.kept(raw, false)
    }

    /// [`Normalizer::text_all`] of a short text asked for again and again
    /// (a mount's target path), kept as [`Normalizer::text_kept`] keeps. A
    /// hex run the first call labels is itself a value labelled since, so
    /// that text is relabelled once more at the next call, by then knowing it.
    pub fn text_all_kept(&mut self, raw: &str) -> String {
        self.kept(raw, true)
    }

    fn kept(&mut self, raw: &str, hex: bool) -> String {
        if self.keep_none {
            return if hex {
                self.text_all(raw)
            } else {
                self.text(raw)
            };
        }
        let now = self.log_base + self.log.len();
        if self.texts.as_ref().is_some_and(|m| m.settled < now) {
            // Values were labelled since: one search over every kept text.
            self.settle_texts(false);
        }
        let memo = self.texts.get_or_insert_with(|| TextMemo {
            settled: now,
            ..Default::default()
        });
        if let Some(k) = memo.texts_mut(hex).get_mut(raw) {
            k.used = true;
            return k.labelled.to_string();
        }
        let labelled = if hex {
            self.text_all(raw)
        } else {
            self.text(raw)
        };
        if let Some(memo) = &mut self.texts {
            let kept = KeptText {
                labelled: labelled.as_str().into(),
                used: true,
            };
            memo.texts_mut(hex).insert(raw.into(), kept);
        }
        labelled
    }

    /// The end of a snapshot that kept texts but no lines: texts it did not
    /// ask for go, and so do the logged values every kept text now knows.
    pub fn end_kept_snapshot(&mut self) {
        self.settle_texts(true);
        if self.lines.is_none() {
            self.log_base += self.log.len();
            self.log.clear();
        }
    }

    /// Check every kept text against the values logged since the memo was
    /// last settled, in one search, and drop the stale ones; with
    /// `drop_unused`, also those nothing asked for since the last such call.
    fn settle_texts(&mut self, drop_unused: bool) {
        let Some(memo) = &mut self.texts else { return };
        let values = &self.log[memo.settled - self.log_base..];
        let ac = if values.is_empty() {
            None
        } else {
            match any_of(values) {
                Some(ac) => Some(ac),
                // Cannot search: keep nothing.
                None => {
                    memo.texts.clear();
                    memo.texts_all.clear();
                    None
                }
            }
        };
        let keep = |raw: &str, k: &mut KeptText| {
            let used = !drop_unused || std::mem::take(&mut k.used);
            used && ac.as_ref().is_none_or(|ac| !ac.is_match(raw.as_bytes()))
        };
        memo.texts.retain(|raw, k| keep(raw, k));
        memo.texts_all.retain(|raw, k| keep(raw, k));
        memo.settled = self.log_base + self.log.len();
    }

    /// Drop what [`Normalizer::text_all_lines`] and [`Normalizer::text_kept`]
    /// keep, and keep nothing from now on (nor log labelled values for
    /// them): they relabel as [`Normalizer::text_all`] and
    /// [`Normalizer::text`] do. For a run's last snapshot, whose kept lines
    /// and texts (three copies of the snapshot, and one of every sort key)
    /// would only add to the end of the run's peak.
    pub fn forget_lines(&mut self) {
        self.lines = None;
        self.texts = None;
        self.log_base += self.log.len();
        self.log = Vec::new();
        self.keep_none = true;
    }

    /// `value` as pretty JSON, relabelled as [`Normalizer::text_all`] relabels
    /// the whole text, but built a line at a time and packed as it goes: the
    /// JSON of a long history is never held whole, raw or relabelled (with
    /// its relabelled copies it was a third of a 2,000-grant run's peak).
    /// `each_lines(raw, labelled)` sees each piece of whole lines both ways,
    /// in order.
    pub fn json_all<T: serde::Serialize + ?Sized>(
        &mut self,
        value: &T,
        mut each_lines: impl FnMut(&str, &str),
    ) -> crate::packed::Packed {
        // Ids known now rewrite every line, as the whole text's one pass would;
        // hex runs labelled on the way are rewritten by the hex pass alone,
        // which finds the same label. No id, secret or hex run spans a line:
        // JSON escapes a newline inside a string.
        let known = self.frozen_matchers();
        crate::phases::phase("relabelling automaton");
        let mut out = crate::packed::PackedWriter::new();
        let (mut rewritten, mut labelled) = (String::new(), String::new());
        let mut lines = LineChunks::new(|raw: &str| {
            rewritten.clear();
            known.replace_into(raw, &mut rewritten);
            labelled.clear();
            self.label_hex(&rewritten, &mut labelled);
            each_lines(raw, &labelled);
            out.push_str(&labelled);
        });
        // Serialising a Serialize to memory fails only on a map with
        // non-string keys, which no history holds.
        let _ = serde_json::to_writer_pretty(&mut lines, value);
        lines.finish();
        out.finish()
    }

    /// Append `known` to `out` with each remaining run of 16+ lowercase hex
    /// digits, standing alone, replaced by its `<hex-N>` label.
    fn label_hex(&mut self, known: &str, out: &mut String) {
        let bytes = known.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let is_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            if is_hex(bytes[i]) && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
                let mut j = i;
                while j < bytes.len() && is_hex(bytes[j]) {
                    j += 1;
                }
                let boundary = j == bytes.len() || !bytes[j].is_ascii_alphanumeric();
                if j - i >= 16 && boundary {
                    out.push_str(&self.id("hex", &known[i..j]));
                    i = j;
                    continue;
                }
                out.push_str(&known[i..j]);
                i = j;
                continue;
            }
            let ch = known[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }

    /// `text` with every known secret and id replaced by its label.
    pub fn text(&self, text: &str) -> String {
        // A whole text that is one known value is its label (the automaton's
        // leftmost-longest match would cover it all; secrets win, as there).
        if let Some(l) = self.secrets.get(text).or_else(|| self.labels.get(text)) {
            return l.clone();
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let cache = &mut *cache;
        let base = cache.matcher.get_or_insert_with(|| self.compile(None));
        let mut out = String::new();
        // A few pending values: their automaton is wanted only if one occurs
        // (a memchr-fast scan for each). More: it is searched beside the old one.
        let pending_may_occur = match cache.pending.len() {
            0 => false,
            n if n <= FEW_PENDING => cache
                .pending
                .iter()
                .any(|v| memchr::memmem::find(text.as_bytes(), v.as_bytes()).is_some()),
            _ => true,
        };
        if pending_may_occur {
            let recent = cache
                .recent
                .get_or_insert_with(|| self.compile(Some(&cache.pending)));
            base.replace_with(recent, text, &mut out);
        } else {
            base.replace_into(text, &mut out);
        }
        out
    }

    fn added(&mut self, raw: &str) {
        let total = self.labels.len() + self.secrets.len();
        self.cache_mut().added(raw, total);
        self.log_for_lines(raw);
    }

    /// A value labelled, or labelled anew: lines it occurs in must be relabelled.
    fn log_for_lines(&mut self, raw: &str) {
        // Whether or not lines are kept yet: one labelled before the first
        // call can span lines as well.
        self.multiline |= raw.contains('\n');
        if self.lines.is_some() || self.texts.is_some() {
            self.log.push(raw.into());
        }
    }

    /// Both automata as they are now, for a text rewritten in pieces as its
    /// one pass would be (values labelled on the way are not used by it).
    fn frozen_matchers(&self) -> Frozen {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let cache = &mut *cache;
        let base = cache
            .matcher
            .get_or_insert_with(|| self.compile(None))
            .clone();
        let recent = (!cache.pending.is_empty()).then(|| {
            cache
                .recent
                .get_or_insert_with(|| self.compile(Some(&cache.pending)))
                .clone()
        });
        Frozen { base, recent }
    }

    fn cache_mut(&mut self) -> &mut Cache {
        self.cache.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// Every known value with its label, or `only` those (secrets win over ids).
    fn patterns<'a>(
        &'a self,
        only: Option<&'a std::collections::HashSet<Box<str>>>,
    ) -> Vec<(&'a str, &'a str)> {
        let mut patterns = Vec::new();
        if let Some(only) = only {
            for raw in only {
                if let Some(label) = self.secrets.get(&**raw).or_else(|| self.labels.get(&**raw)) {
                    patterns.push((&**raw, label.as_str()));
                }
            }
        } else {
            patterns.extend(self.secrets.iter().map(|(r, l)| (r.as_str(), l.as_str())));
            let ids = self
                .labels
                .iter()
                .filter(|(r, _)| !self.secrets.contains_key(*r));
            patterns.extend(ids.map(|(r, l)| (r.as_str(), l.as_str())));
        }
        patterns
    }

    /// The matcher over every known value, or over `only` those.
    fn compile(&self, only: Option<&std::collections::HashSet<Box<str>>>) -> Matcher {
        // One pass over the text (leftmost-longest, so no fragment of a longer
        // id or secret survives a shorter match).
        let patterns = self.patterns(only);
        if patterns.is_empty() {
            return Matcher::Empty;
        }
        let values = (patterns.into_iter())
            .map(|(raw, label)| (raw.as_bytes().into(), label.into()))
            .collect();
        match Prefixed::new(values) {
            Ok(p) => Matcher::Ready(std::sync::Arc::new(p)),
            Err(_) => Matcher::Failed,
        }
    }
}

fn letters(mut n: usize) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'A' + (n % 26) as u8);
        n /= 26;
        if n == 0 {
            break;
        }
        n -= 1;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}
/// A line diff (Myers, minimal) with `context` unchanged lines around each
/// change: lines start with "  ", "- " or "+ "; skipped runs become "…".
/// Empty when equal. Linear in the lines when few of them changed.
pub fn line_diff(a: &str, b: &str, context: usize) -> Vec<String> {
    use similar::DiffOp;
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let mut ops: Vec<(char, &str)> = Vec::new();
    // A run of changes shows its removals before its additions, as `diff -u`.
    let (mut removed, mut added): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for op in similar::capture_diff_slices(similar::Algorithm::Myers, &a, &b) {
        let (old, new) = (op.old_range(), op.new_range());
        if let DiffOp::Equal { .. } = op {
            ops.extend(removed.drain(..).map(|l| ('-', l)));
            ops.extend(added.drain(..).map(|l| ('+', l)));
            ops.extend(a[old].iter().map(|l| (' ', *l)));
        } else {
            removed.extend(&a[old]);
            added.extend(&b[new]);
        }
    }
    ops.extend(removed.drain(..).map(|l| ('-', l)));
    ops.extend(added.drain(..).map(|l| ('+', l)));
    if ops.iter().all(|(k, _)| *k == ' ') {
        return Vec::new();
    }
    // Distance to the nearest change, both ways, in two passes.
    let mut near = vec![false; ops.len()];
    for order in [true, false] {
        let mut since: Option<usize> = None;
        let idx: Box<dyn Iterator<Item = usize>> = match order {
            true => Box::new(0..ops.len()),
            false => Box::new((0..ops.len()).rev()),
        };
        for i in idx {
            since = match ops[i].0 {
                ' ' => since.map(|d| d + 1),
                _ => Some(0),
            };
            near[i] |= since.is_some_and(|d| d <= context);
        }
    }
    let mut out = Vec::new();
    let mut skipped = false;
    for ((k, line), shown) in ops.iter().zip(near) {
        if shown {
            if skipped {
                out.push("…".to_string());
                skipped = false;
            }
            out.push(format!("{k} {line}"));
        } else {
            skipped = true;
        }
    }
    if skipped {
        out.push("…".to_string());
    }
    out
}

/// The snapshot after each step, kept as what each step changed (a run of N
/// steps over a state of N objects would otherwise hold N² lines), and the
/// text after the last step, which the final snapshot is compared with.
#[derive(Clone, Debug, Default)]
pub struct SnapshotTrail {
    /// Each snapshotted step, in order.
    pub steps: Vec<StepSnapshot>,
    /// The snapshot after the last of them (empty before the first).
    pub last: String,
}

/// What one step changed in the ownership snapshot.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepSnapshot {
    /// 0-based step index.
    pub step: usize,
    /// The step, described.
    pub name: String,
    /// [`line_diff`] (3 lines of context) from the snapshot after the previous
    /// snapshotted step (the empty text before the first) to this one.
    pub diff: Vec<String>,
}

/// Lines of context around each change in a step's diff.
pub const STEP_DIFF_CONTEXT: usize = 3;

impl SnapshotTrail {
    /// Record the snapshot `text` taken after step `step`.
    pub fn push(&mut self, step: usize, name: String, text: String) {
        let diff = line_diff(&self.last, &text, STEP_DIFF_CONTEXT);
        self.steps.push(StepSnapshot { step, name, diff });
        self.last = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_few_changes_in_a_long_snapshot_diff_as_a_few_lines() {
        let a: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let b = a
            .replace("line 7000\n", "line 7000 changed\n")
            .replace("line 15000\n", "");
        let d = line_diff(&a, &b, 1);
        assert_eq!(
            d,
            vec![
                "…",
                "  line 6999",
                "- line 7000",
                "+ line 7000 changed",
                "  line 7001",
                "…",
                "  line 14999",
                "- line 15000",
                "  line 15001",
                "…",
            ]
        );
    }

    #[test]
    fn a_trail_keeps_what_each_step_changed_and_the_last_text() {
        let mut t = SnapshotTrail::default();
        t.push(0, "create".into(), "a\n".into());
        t.push(2, "grant".into(), "a\nb\n".into());
        t.push(3, "noop".into(), "a\nb\n".into());
        assert_eq!(t.steps[0].diff, vec!["+ a"]);
        assert_eq!(t.steps[1].diff, vec!["  a", "+ b"]);
        assert!(t.steps[2].diff.is_empty());
        assert_eq!(t.last, "a\nb\n");
    }

    fn lines() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d"]), 0..40)
            .prop_map(|v| v.into_iter().map(String::from).collect())
    }

    proptest! {
        /// With context wide enough to show every line, the diff is both
        /// texts: its `-` and ` ` lines are the old one, `+` and ` ` the new;
        /// within a run of changes removals come first; equal texts give nothing.
        #[test]
        fn a_full_context_diff_is_both_texts(a in lines(), b in lines()) {
            let (ta, tb) = (a.join("\n"), b.join("\n"));
            let d = line_diff(&ta, &tb, usize::MAX);
            prop_assert_eq!(d.is_empty(), a == b);
            if a != b {
                let side = |keep: char| -> Vec<String> {
                    d.iter()
                        .filter(|l| l.starts_with(' ') || l.starts_with(keep))
                        .map(|l| l[2..].to_string())
                        .collect()
                };
                prop_assert_eq!(side('-'), a);
                prop_assert_eq!(side('+'), b);
                for w in d.windows(2) {
                    prop_assert!(!(w[0].starts_with('+') && w[1].starts_with('-')), "{:?}", d);
                }
            }
        }
    }

    #[test]
    fn secrets_get_letters_in_first_seen_order_and_never_appear() {
        let mut n = Normalizer::default();
        let a = Secret::new("supersecretvalue-aaaaaaaa");
        let bb = Secret::new("anothersecretvalue-bbbbbb");
        assert_eq!(n.secret(&a), "<secret-A>");
        assert_eq!(n.secret(&bb), "<secret-B>");
        assert_eq!(n.secret(&a), "<secret-A>");
        let t = n.text("x supersecretvalue-aaaaaaaa y anothersecretvalue-bbbbbb");
        assert_eq!(t, "x <secret-A> y <secret-B>");
    }

    #[test]
    fn ids_are_labelled_by_category_and_rewritten_inside_other_ids() {
        let mut n = Normalizer::default();
        assert_eq!(n.id("uid", "1234-abcd"), "<uid-1>");
        assert_eq!(n.id("uid", "9999-ffff"), "<uid-2>");
        assert_eq!(n.id("key", "AKIA1"), "<key-1>");
        assert_eq!(
            n.text("bucket-1234-abcd and ba-9999-ffff"),
            "bucket-<uid-1> and ba-<uid-2>"
        );
    }

    #[test]
    fn leftover_hex_runs_are_labelled_in_order() {
        let mut n = Normalizer::default();
        let t = n.text_all("key-0123456789abcdef0123 then key-fedcba9876543210 then key-0123456789abcdef0123 and cafe");
        assert_eq!(t, "key-<hex-1> then key-<hex-2> then key-<hex-1> and cafe");
    }

    /// `text` as one automaton over every whole value (aho-corasick's
    /// leftmost-longest, independent of the matcher the normaliser builds)
    /// rewrites it.
    fn from_scratch(n: &Normalizer, text: &str) -> String {
        let (values, labels): (Vec<&str>, Vec<&str>) = n.patterns(None).into_iter().unzip();
        let ac = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&values)
            .expect("small pattern sets compile");
        ac.replace_all(text, &labels)
    }

    #[test]
    fn a_long_value_by_pieces_is_the_whole_text_relabelled() {
        // Longer than several pieces, with known ids and hex runs throughout
        // and hex runs repeating across pieces.
        let values: Vec<String> = (0..20_000u64)
            .map(|i| format!("ba-{:04} key-{:016x} {}", i % 97, (i % 1500) * 7919, i))
            .collect();
        let fresh = || {
            let mut n = Normalizer::default();
            for i in (0..97).step_by(3) {
                n.id("uid", &format!("ba-{i:04}"));
            }
            n
        };
        let (mut whole, mut lines) = (fresh(), fresh());
        let text = serde_json::to_string_pretty(&values).unwrap();
        assert!(text.len() > 4 * LineChunks::<fn(&str)>::PIECE);
        let want = whole.text_all(&text);
        let mut pieces = 0;
        let got = lines.json_all(&values, |_, _| pieces += 1).text();
        assert_eq!(got, want);
        assert!(pieces > 4, "{pieces} pieces");
        assert!(got.contains("<hex-1500>") && !got.contains("<hex-1501>"));
    }

    proptest::proptest! {
        /// A value relabelled a line at a time is the whole text relabelled:
        /// same text, same labels after, and the lines handed on are the raw
        /// and the relabelled text, each whole.
        #[test]
        fn json_by_lines_is_the_whole_text_relabelled(
            known in proptest::collection::vec((proptest::bool::ANY, "[0-9a-f]{2,20}"), 0..8),
            values in proptest::collection::vec("[0-9a-f\\- \n\"]{0,48}", 0..12),
        ) {
            let fresh = || {
                let mut n = Normalizer::default();
                n.fixed("http://127.0.0.1:1", "endpoint");
                for (secret, v) in &known {
                    if *secret {
                        n.secret(&Secret::new(v));
                    } else {
                        n.id("uid", v);
                    }
                }
                n
            };
            let (mut whole, mut lines) = (fresh(), fresh());
            let want = whole.text_all(&serde_json::to_string_pretty(&values).unwrap());
            let (mut raw, mut labelled) = (String::new(), String::new());
            let got = lines.json_all(&values, |r, l| {
                raw.push_str(r);
                labelled.push_str(l);
            }).text();
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(raw, serde_json::to_string_pretty(&values).unwrap());
            proptest::prop_assert_eq!(labelled, got);
            proptest::prop_assert_eq!(whole.text_all("ffff0123456789abcdef"), lines.text_all("ffff0123456789abcdef"));
        }
    }

    proptest::proptest! {
        /// Labelling between rewrites (the automaton reused while no new value
        /// occurs, then beside one over the new values, then rebuilt) never
        /// changes a rewrite: overlapping and nested values included.
        #[test]
        fn reusing_the_automaton_rewrites_as_a_fresh_one(
            ops in proptest::collection::vec(
                (proptest::bool::ANY, "[ab-]{1,6}", "[ab-]{0,24}"), 1..160)
        ) {
            let mut n = Normalizer::default();
            for (secret, value, text) in ops {
                if secret {
                    n.secret(&Secret::new(&value));
                } else {
                    n.id("x", &value);
                }
                proptest::prop_assert_eq!(n.text(&text), from_scratch(&n, &text));
            }
        }
    }

    /// With nothing kept (the last snapshot), a text is still relabelled a
    /// line at a time, as `text_all` relabels it whole: hex runs first seen
    /// in one line are labelled there and not inside a word of a later one.
    #[test]
    fn the_last_snapshot_relabelled_by_lines_is_the_text_relabelled_whole() {
        let text = "user ba-0001 key 0123456789abcdef0123\n\
                    again 0123456789abcdef0123 and x0123456789abcdef0123\n\
                    ba-0001 fedcba98765432100000 end";
        let fresh = || {
            let mut n = Normalizer::default();
            n.id("uid", "ba-0001");
            n.secret(&Secret::new("key"));
            n
        };
        let mut last = fresh();
        last.forget_lines();
        let got = last.text_all_lines(text);
        assert_eq!(got, fresh().text_all(text));
        assert!(got.contains("<hex-1> and x0123456789abcdef0123"), "{got}");
        assert!(got.contains("<hex-2> end"), "{got}");
    }

    /// A snapshot longer than a piece, written in pieces of many lines: its
    /// lines are the text's, and relabelled they are the whole text
    /// relabelled, kept or not (hex runs labelled in one piece are known
    /// in the next).
    #[test]
    fn a_text_written_in_pieces_relabels_as_the_whole_text() {
        use std::fmt::Write as _;
        let mut text = String::new();
        for i in 0..6_000usize {
            let _ = writeln!(
                text,
                "line {i}: uid-{} key {:020x} again {:020x}",
                i % 7,
                i * 7919,
                i.saturating_sub(1) * 7919
            );
        }
        text.push_str("no newline at the end");
        for raw in [RawText::default(), RawText::packing()] {
            let mut raw = raw;
            for line in text.split_inclusive('\n') {
                raw.push_str(line);
            }
            assert_eq!(raw.len(), text.len());
            let packed = raw
                .pieces
                .iter()
                .filter(|p| matches!(p, Piece::Packed(_)))
                .count();
            assert_eq!(packed, if raw.pack { raw.pieces.len() - 1 } else { 0 });
            let pieces: Vec<String> = raw.into_pieces().collect();
            assert!(pieces.len() >= 3, "{} pieces", pieces.len());
            let cut = &pieces[..pieces.len() - 1];
            assert!(cut.iter().all(|p| p.ends_with('\n')));
            assert_eq!(pieces.concat(), text);
        }

        let fresh = || {
            let mut n = Normalizer::default();
            for u in 0..7 {
                n.id("uid", &format!("uid-{u}"));
            }
            n
        };
        let want = fresh().text_all(&text);
        let mut last = fresh();
        last.forget_lines();
        assert_eq!(last.relabel::<String>(RawText::from(text.as_str())), want);
        let mut packing = RawText::packing();
        for line in text.split_inclusive('\n') {
            packing.push_str(line);
        }
        let mut last = fresh();
        last.forget_lines();
        assert_eq!(last.relabel::<String>(packing), want);
        // Relabelled into a packed text as it is written: the same text.
        let mut last = fresh();
        last.forget_lines();
        let packed = last.relabel::<crate::packed::PackedWriter>(RawText::from(text.as_str()));
        assert_eq!(packed.finish().text(), want);
        let mut kept = fresh();
        assert_eq!(kept.relabel::<String>(RawText::from(text.as_str())), want);
        assert_eq!(kept.relabel::<String>(RawText::from(text.as_str())), want);
    }

    proptest::proptest! {
        /// A text relabelled through the last text's lines is the text
        /// relabelled whole, step after step, with values labelled between
        /// and during (hex runs), lines repeated, and values that hold a
        /// newline; so is a short text kept through `text_kept`. After
        /// `forget_lines` (op 5) the same, with nothing kept.
        #[test]
        fn relabelling_by_kept_lines_is_relabelling_whole(
            // `x` next to a hex run keeps the hex pass from labelling it there.
            pool in proptest::collection::vec("[0-9a-fx -]{0,40}", 1..8),
            steps in proptest::collection::vec(
                (0..8u8, "[0-9a-f]{1,20}", proptest::collection::vec(0..8usize, 0..12), proptest::bool::ANY),
                1..40),
        ) {
            let (mut whole, mut lines) = (Normalizer::default(), Normalizer::default());
            for (op, value, picks, end_newline) in steps {
                for n in [&mut whole, &mut lines] {
                    match op {
                        0 | 1 => { n.id("uid", &value); }
                        2 => { n.secret(&Secret::new(&value)); }
                        3 => n.fixed(&value, "endpoint"),
                        4 => { n.id("uid", &format!("{value}\n{value}")); }
                        _ => {}
                    }
                }
                if op == 5 {
                    lines.forget_lines();
                }
                let mut text = picks.iter().map(|&i| pool[i % pool.len()].as_str()).collect::<Vec<_>>().join("\n");
                if end_newline {
                    text.push('\n');
                }
                // Kept short texts, asked for before and after the hex pass
                // labels what it finds, are the text relabelled then.
                for &i in &picks {
                    let short = &pool[i % pool.len()];
                    proptest::prop_assert_eq!(lines.text_kept(short), whole.text(short));
                }
                proptest::prop_assert_eq!(lines.text_all_lines(&text), whole.text_all(&text));
                for &i in picks.iter().rev() {
                    let short = &pool[i % pool.len()];
                    proptest::prop_assert_eq!(lines.text_kept(short), whole.text(short));
                }
                proptest::prop_assert_eq!(&lines.labels, &whole.labels);
                proptest::prop_assert_eq!(&lines.secrets, &whole.secrets);
                if lines.keep_none {
                    proptest::prop_assert!(lines.lines.is_none() && lines.texts.is_none());
                    proptest::prop_assert!(lines.log.is_empty());
                }
            }
        }
    }

    proptest::proptest! {
        /// Short texts kept through `text_kept` and `text_all_kept`, snapshot
        /// after snapshot, with values labelled between and hex runs labelled
        /// by the texts themselves, are the texts relabelled then.
        #[test]
        fn kept_texts_are_the_texts_relabelled_now(
            pool in proptest::collection::vec("[0-9a-fx /-]{0,40}", 1..8),
            steps in proptest::collection::vec(
                (0..6u8, "[0-9a-f]{1,20}", proptest::collection::vec((0..8usize, proptest::bool::ANY), 0..12)),
                1..40),
        ) {
            let (mut whole, mut kept) = (Normalizer::default(), Normalizer::default());
            for (op, value, picks) in steps {
                for n in [&mut whole, &mut kept] {
                    match op {
                        0 | 1 => { n.id("uid", &value); }
                        2 => { n.secret(&Secret::new(&value)); }
                        3 => n.fixed(&value, "endpoint"),
                        _ => {}
                    }
                }
                for (i, all) in picks {
                    let short = &pool[i % pool.len()];
                    if all {
                        proptest::prop_assert_eq!(kept.text_all_kept(short), whole.text_all(short));
                    } else {
                        proptest::prop_assert_eq!(kept.text_kept(short), whole.text(short));
                    }
                }
                kept.end_kept_snapshot();
                proptest::prop_assert_eq!(&kept.labels, &whole.labels);
                proptest::prop_assert!(kept.log.is_empty());
            }
        }
    }

    proptest::proptest! {
        /// A text's pair bits cover those of everything it holds (the filter
        /// may pass a line that holds nothing, never reject one that does).
        #[test]
        fn a_text_has_the_pair_bits_of_what_it_holds(
            text in "[0-9a-fx <>/:-]{0,80}", from in 0..80usize, len in 0..40usize,
        ) {
            let from = from.min(text.len());
            let part = &text[from..(from + len).min(text.len())];
            proptest::prop_assert!(PairBits::of(&text).may_hold(PairBits::of(part)));
        }
    }

    #[test]
    fn a_hex_run_labelled_during_a_call_relabels_kept_lines_next_time() {
        // The first line shows the run glued to an `x` (the hex pass leaves
        // it); the second alone, so the pass labels it there. Next time the
        // automaton knows it and rewrites it in the first line too.
        let text = "x0123456789abcdef0\n 0123456789abcdef0\n";
        let (mut whole, mut lines) = (Normalizer::default(), Normalizer::default());
        for _ in 0..2 {
            assert_eq!(lines.text_all_lines(text), whole.text_all(text));
        }
        assert_eq!(lines.text_all_lines(text), "x<hex-1>\n <hex-1>\n");
    }

    #[test]
    fn letters_go_past_z() {
        assert_eq!(letters(0), "A");
        assert_eq!(letters(25), "Z");
        assert_eq!(letters(26), "AA");
    }
}
