//! A JSON text held LZ4-packed against a dictionary shared with texts of
//! its kind: how the kube fake and its store keep the objects written over
//! HTTP (a grant's checkpoints, access and credentials, ~3 KB). Objects of
//! one kind differ in a few values, so each packs to a fraction.

use std::sync::Arc;

/// Earlier texts a text is packed against. Cloned, it is shared.
#[derive(Clone, Debug, Default)]
pub struct Dict(Arc<[u8]>);

impl Dict {
    /// LZ4 looks back at most 64 KiB; a dictionary past that is not read.
    const MAX: usize = 64 * 1024;

    /// This dictionary with `text` after it (the last 64 KiB of both).
    fn and(&self, text: &str) -> Dict {
        let mut b = Vec::with_capacity(self.0.len() + text.len());
        b.extend_from_slice(&self.0);
        b.extend_from_slice(text.as_bytes());
        Dict(b[b.len().saturating_sub(Self::MAX)..].into())
    }
}

/// The dictionary of a kind, learned from its first texts: one object
/// written over and over is still one shape, but a kind often has a few
/// (a driver's checkpoint Secrets beside the credentials Secrets). Texts
/// already packed keep the dictionary they were packed against.
#[derive(Debug, Default)]
pub struct Learner {
    dict: Dict,
    learned: usize,
}

impl Learner {
    /// How many texts it learns. Measured on a COSI run's objects (packed
    /// sizes of the live objects, against the text): 1 text 2.9×, 4 4.8×,
    /// 8 5.2×, 16 KiB of texts 5.4×.
    const TEXTS: usize = 8;

    /// `text` packed against what was learned so far; learned, if there is room.
    pub fn pack(&mut self, text: &str) -> JsonText {
        let packed = JsonText::pack(text, &self.dict);
        if self.learned < Self::TEXTS {
            self.dict = self.dict.and(text);
            self.learned += 1;
        }
        packed
    }
}

/// A JSON text, packed. Cheap to clone: clones share the one packed copy,
/// and [`JsonText::address`] names it.
#[derive(Clone, Debug)]
pub struct JsonText(Arc<Packed>);

#[derive(Debug)]
struct Packed {
    /// The LZ4 block.
    block: Box<[u8]>,
    /// The text's length in bytes.
    len: usize,
    /// What it was packed against.
    dict: Dict,
}

impl JsonText {
    /// `text` packed against `dict`.
    pub fn pack(text: &str, dict: &Dict) -> JsonText {
        let block = lz4_flex::block::compress_with_dict(text.as_bytes(), &dict.0);
        JsonText(Arc::new(Packed {
            block: block.into_boxed_slice(),
            len: text.len(),
            dict: dict.clone(),
        }))
    }

    /// `text` packed against the dictionary this one was packed against (a
    /// text like it: a part of it, or its next version).
    pub fn pack_like(&self, text: &str) -> JsonText {
        Self::pack(text, &self.0.dict)
    }

    /// The text.
    pub fn text(&self) -> String {
        let p = &*self.0;
        let mut out = vec![0; p.len];
        // A block this type packed unpacks to its length; if it ever did
        // not, what it answers does not parse and the reader says so.
        match lz4_flex::block::decompress_into_with_dict(&p.block, &mut out, &p.dict.0) {
            Ok(n) if n == p.len => String::from_utf8(out).unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// Length of the text, in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Bytes held for it, its dictionary aside (shared with its kind).
    pub fn packed_len(&self) -> usize {
        self.0.block.len()
    }

    /// Where it is held: the same for every clone.
    pub fn address(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

/// A text of its own (no dictionary).
impl From<&str> for JsonText {
    fn from(text: &str) -> Self {
        JsonText::pack(text, &Dict::default())
    }
}

impl From<String> for JsonText {
    fn from(text: String) -> Self {
        JsonText::from(text.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(n: usize) -> String {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("access-{n}"), "namespace": "driver-state",
                "resourceVersion": format!("{}", 1000 + n),
                "managedFields": [{"manager": "driver", "operation": "Apply",
                    "fieldsV1": {"f:data": {"f:accessKeyID": {}, "f:accountName": {},
                        "f:bucketId": {}, "f:state": {}}}}]},
            "data": {"accessKeyID": format!("S0FZ{n:08}"), "accountName": format!("YmEt{n}"),
                "bucketId": "YnVja2V0LTE=", "state": "UmVhZHk="}
        })
        .to_string()
    }

    #[test]
    fn a_text_reads_back_as_written_with_or_without_a_dictionary() {
        for text in ["", "{}", &checkpoint(7)] {
            let alone = JsonText::from(text);
            assert_eq!(alone.text(), text);
            assert_eq!(alone.len(), text.len());
            let packed = JsonText::pack(text, &Dict::default().and(&checkpoint(1)));
            assert_eq!(packed.text(), text);
            assert_eq!(packed.pack_like(text).text(), text);
        }
        // Past the window LZ4 reads, the dictionary keeps its end.
        let long = "x".repeat(Dict::MAX + 10);
        assert_eq!(
            JsonText::pack("xyz", &Dict::default().and(&long)).text(),
            "xyz"
        );
    }

    #[test]
    fn a_text_like_its_dictionary_packs_to_a_fraction_and_clones_share_it() {
        let dict = Dict::default().and(&checkpoint(1));
        let text = checkpoint(2);
        let packed = JsonText::pack(&text, &dict);
        let alone = JsonText::from(text.as_str());
        assert!(
            packed.packed_len() * 4 < text.len(),
            "{} of {}",
            packed.packed_len(),
            text.len()
        );
        assert!(packed.packed_len() * 2 < alone.packed_len());
        assert_eq!(packed.clone().address(), packed.address());
        assert_ne!(packed.address(), alone.address());
    }

    #[test]
    fn a_learner_packs_against_its_first_texts_and_then_stops_learning() {
        let mut kind = Learner::default();
        let first = kind.pack(&checkpoint(1));
        assert_eq!(first.text(), checkpoint(1));
        let second = kind.pack(&checkpoint(2));
        assert!(second.packed_len() * 4 < second.len());
        for n in 3..=Learner::TEXTS + 3 {
            assert_eq!(kind.pack(&checkpoint(n)).text(), checkpoint(n));
        }
        assert_eq!(kind.learned, Learner::TEXTS);
        // What was packed before it learned more still reads back.
        assert_eq!(
            (first.text(), second.text()),
            (checkpoint(1), checkpoint(2))
        );
    }
}
