//! A run's large texts (the labelled history, the sealed record) held
//! LZ4-compressed from when they are written until a report or the runs db
//! reads them. Both were built whole in memory at a run's end and kept to its
//! report: at 10⁵ grants, most of a gigabyte of the run's peak for text that
//! compresses several times over.

use std::io::{self, Read, Write};

use lz4_flex::frame::{FrameDecoder, FrameEncoder};

/// A text kept compressed (an LZ4 frame). Equal texts compare equal.
#[derive(Clone, Default)]
pub struct Packed {
    /// The frame; empty for the empty text (no frame written).
    frame: Vec<u8>,
    /// The text's length in bytes.
    len: usize,
}

impl Packed {
    /// Pack a whole text.
    pub fn new(text: &str) -> Self {
        let mut w = PackedWriter::new();
        w.push_str(text);
        w.finish()
    }

    /// Length of the text, in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held for it.
    pub fn packed_len(&self) -> usize {
        self.frame.len()
    }

    /// The text, read a piece at a time.
    pub fn reader(&self) -> impl Read + '_ {
        FrameDecoder::new(&self.frame[..])
    }

    /// The whole text, unpacked.
    pub fn text(&self) -> String {
        let mut out = Vec::with_capacity(self.len);
        // Only frames this module wrote are read, from memory: they decode.
        if self.reader().read_to_end(&mut out).is_err() {
            return String::new();
        }
        // Written from &str pieces: valid UTF-8 whole.
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
    }
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        // Equal frames are equal texts; texts written in other pieces may
        // still be equal in different frames, so those are compared unpacked.
        self.len == other.len
            && (self.frame == other.frame || same_bytes(self.reader(), other.reader()))
    }
}

impl Eq for Packed {}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} bytes in {})", self.len, self.frame.len())
    }
}

/// Whether two readers yield the same bytes (a read error: not the same).
fn same_bytes(a: impl Read, b: impl Read) -> bool {
    let (mut a, mut b) = (io::BufReader::new(a), io::BufReader::new(b));
    loop {
        let (Ok(x), Ok(y)) = (io::BufRead::fill_buf(&mut a), io::BufRead::fill_buf(&mut b)) else {
            return false;
        };
        let n = x.len().min(y.len());
        if x[..n] != y[..n] {
            return false;
        }
        if n == 0 {
            return x.is_empty() && y.is_empty();
        }
        io::BufRead::consume(&mut a, n);
        io::BufRead::consume(&mut b, n);
    }
}

/// Builds a [`Packed`] from pieces of text, compressing as it goes: the
/// whole text is never held.
pub struct PackedWriter {
    enc: FrameEncoder<Vec<u8>>,
    len: usize,
}

impl Default for PackedWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PackedWriter {
    /// An empty text.
    pub fn new() -> Self {
        Self {
            enc: FrameEncoder::new(Vec::new()),
            len: 0,
        }
    }

    /// Append a piece of text.
    pub fn push_str(&mut self, piece: &str) {
        // Writing to a Vec fails only if memory does, which aborts anyway.
        let _ = self.write_all(piece.as_bytes());
    }

    /// The text written.
    pub fn finish(self) -> Packed {
        if self.len == 0 {
            return Packed::default();
        }
        let mut frame = self.enc.finish().unwrap_or_default();
        frame.shrink_to_fit();
        Packed {
            frame,
            len: self.len,
        }
    }
}

/// Bytes written must be UTF-8 once whole (serde_json writes only that).
impl Write for PackedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.enc.write(buf)?;
        self.len += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history_like(n: usize) -> String {
        (0..n)
            .map(|i| format!("{{\"seq\":{i},\"kind\":\"call\",\"op\":\"PutObject\",\"subject\":\"<bucket-{}>\"}}\n", i % 97))
            .collect()
    }

    #[test]
    fn a_text_reads_back_as_written_whole_or_in_pieces() {
        let text = history_like(20_000);
        let whole = Packed::new(&text);
        assert_eq!(whole.text(), text);
        assert_eq!(whole.len(), text.len());
        let mut w = PackedWriter::new();
        for piece in text.split_inclusive('\n') {
            w.push_str(piece);
        }
        let pieces = w.finish();
        assert_eq!(pieces.text(), text);
        assert_eq!(pieces, whole);
        let mut streamed = String::new();
        pieces.reader().read_to_string(&mut streamed).unwrap();
        assert_eq!(streamed, text);
        // What it is for: a repetitive text held in a fraction of its size.
        assert!(whole.packed_len() * 4 < text.len(), "{whole:?}");
    }

    #[test]
    fn texts_that_differ_anywhere_are_not_equal() {
        let text = history_like(5_000);
        let mut other = text.clone().into_bytes();
        let at = other.len() - 7;
        other[at] = b'X';
        let other = String::from_utf8(other).unwrap();
        assert_ne!(Packed::new(&text), Packed::new(&other));
        assert_ne!(Packed::new(&text), Packed::new(&text[..text.len() - 1]));
        assert_eq!(Packed::new(""), Packed::default());
        assert_eq!(Packed::new("").text(), "");
        assert!(Packed::new("").is_empty());
        assert_ne!(Packed::new("a"), Packed::default());
    }

    #[test]
    fn json_written_into_one_parses_back_from_its_reader() {
        let v: Vec<serde_json::Value> = (0..1000)
            .map(|i| serde_json::json!({"seq": i, "note": "ünïcode ✓", "n": [i, i * 2]}))
            .collect();
        let mut w = PackedWriter::new();
        serde_json::to_writer(&mut w, &v).unwrap();
        let p = w.finish();
        let back: Vec<serde_json::Value> =
            serde_json::from_reader(io::BufReader::new(p.reader())).unwrap();
        assert_eq!(back, v);
        assert_eq!(p.text(), serde_json::to_string(&v).unwrap());
    }
}
