//! A run's events held encoded, a few bytes each, and decoded as they are
//! read. As `Event` values the history was ~4.6 KB a grant at 10⁵ grants
//! (padding, a heap string per name, a vector grown by doubling); the
//! operation and code names repeat, so they are held once and referred to,
//! and a full chunk is LZ4-packed (a grant's calls repeat its names).

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{CallId, Component, Event, EventKind, Outcome};
use crate::clock::VTime;

/// A chunk is closed and packed once it holds this many bytes: the log grows
/// by chunks, never by copying what it holds into a buffer twice the size.
#[cfg(not(test))]
const CHUNK: usize = 1 << 18;
/// Small in tests, so the proptest's logs span packed chunks.
#[cfg(test)]
const CHUNK: usize = 512;
/// Every this many events, where the event starts is kept, so reading from
/// an index decodes at most this many events it does not return.
const MARK_EVERY: usize = 64;

/// An append-only sequence of events, held encoded. Iterating decodes each
/// event afresh; two logs are equal when their events are.
#[derive(Clone, Default)]
pub struct EventLog {
    /// Full chunks, packed. Each chunk's first event is encoded against the
    /// default state, so a chunk decodes on its own.
    packed: Vec<Packed>,
    /// The chunk being filled (chunk number `packed.len()`).
    open: Vec<u8>,
    marks: Vec<Mark>,
    len: usize,
    names: Names,
    /// The decoder's state after the last event.
    last: State,
}

/// A full chunk: an LZ4 block, and how long it is unpacked.
#[derive(Clone)]
struct Packed {
    block: Box<[u8]>,
    len: usize,
}

impl Packed {
    fn of(chunk: &[u8]) -> Packed {
        Packed {
            block: lz4_flex::block::compress(chunk).into(),
            len: chunk.len(),
        }
    }
}

/// Where event `k × MARK_EVERY` starts, and the decoder's state there.
#[derive(Clone, Copy)]
struct Mark {
    chunk: u32,
    offset: u32,
    state: State,
}

/// What an event is encoded against: sequence numbers and times are held as
/// the difference from what came before.
#[derive(Clone, Copy, Default)]
struct State {
    next_seq: u64,
    at: u64,
}

/// Operation names and reply codes, each held once.
#[derive(Clone, Default)]
struct Names {
    index: HashMap<Arc<str>, u32>,
    all: Vec<Arc<str>>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.all.len() as u32;
        let name: Arc<str> = name.into();
        self.all.push(name.clone());
        self.index.insert(name, i);
        i
    }
}

// Tags of the encoded forms.
const STEP: u8 = 0;
const CALL: u8 = 1;
const REPLY: u8 = 2;
const NOTE: u8 = 3;
const FAULT: u8 = 4;
const HTTP: u8 = 0;
const HTTP_CODE: u8 = 1;
const GRPC: u8 = 2;
const NO_REPLY: u8 = 3;

impl EventLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of events held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no event is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the encoded events take, packed where packed (not counting the names).
    pub fn encoded_len(&self) -> usize {
        self.packed.iter().map(|p| p.block.len()).sum::<usize>() + self.open.len()
    }

    /// Append an event.
    pub fn push(&mut self, e: &Event) {
        if self.open.len() >= CHUNK {
            let full = std::mem::replace(&mut self.open, Vec::with_capacity(CHUNK));
            self.packed.push(Packed::of(&full));
            self.last = State::default();
        }
        if self.len % MARK_EVERY == 0 {
            self.marks.push(Mark {
                chunk: self.packed.len() as u32,
                offset: self.open.len() as u32,
                state: self.last,
            });
        }
        encode(&mut self.open, &mut self.names, &mut self.last, e);
        self.len += 1;
    }

    /// The events in order, each decoded as it is reached.
    pub fn iter(&self) -> Iter<'_> {
        self.iter_from(0)
    }

    /// The events from index `from` on (none when `from` is past the end).
    pub fn iter_from(&self, from: usize) -> Iter<'_> {
        let Some(mark) = self.marks.get(from / MARK_EVERY) else {
            return Iter::empty(self);
        };
        let mut it = Iter::at(
            self,
            mark.chunk as usize,
            mark.offset as usize,
            mark.state,
            self.len - (from / MARK_EVERY) * MARK_EVERY,
        );
        for _ in 0..from % MARK_EVERY {
            it.next();
        }
        it
    }

    /// Every event, decoded into one vector.
    pub fn to_vec(&self) -> Vec<Event> {
        self.iter().collect()
    }
}

/// Decodes a log's events in order.
pub struct Iter<'a> {
    log: &'a EventLog,
    chunk: usize,
    offset: usize,
    left: usize,
    state: State,
    /// The current chunk unpacked, when it is a packed one.
    buf: Vec<u8>,
}

impl<'a> Iter<'a> {
    fn empty(log: &'a EventLog) -> Self {
        Self::at(log, 0, 0, State::default(), 0)
    }

    /// `left` events from `offset` in chunk `chunk`, where the decoder is in `state`.
    fn at(log: &'a EventLog, chunk: usize, offset: usize, state: State, left: usize) -> Self {
        let mut it = Iter {
            log,
            chunk,
            offset,
            left,
            state,
            buf: Vec::new(),
        };
        if left > 0 && it.unpack().is_none() {
            debug_assert!(false, "an event log's chunk did not unpack");
            it.left = 0;
        }
        it
    }

    /// Unpack the current chunk if it is a packed one.
    fn unpack(&mut self) -> Option<()> {
        let Some(p) = self.log.packed.get(self.chunk) else {
            return (self.chunk == self.log.packed.len()).then_some(());
        };
        self.buf.resize(p.len, 0);
        let n = lz4_flex::block::decompress_into(&p.block, &mut self.buf).ok()?;
        (n == p.len).then_some(())
    }

    fn decode(&mut self) -> Option<Event> {
        let len = |it: &Self| match it.log.packed.get(it.chunk) {
            Some(p) => p.len,
            None => it.log.open.len(),
        };
        if self.offset >= len(self) {
            self.chunk += 1;
            self.offset = 0;
            self.state = State::default();
            self.unpack()?;
        }
        let bytes: &[u8] = if self.chunk < self.log.packed.len() {
            &self.buf
        } else {
            &self.log.open
        };
        let mut r = Reader {
            bytes,
            at: self.offset,
            names: &self.log.names,
        };
        let seq = self.state.next_seq.wrapping_add(r.delta()?);
        let at = self.state.at.wrapping_add(r.delta()?);
        let kind = match r.byte()? {
            STEP => EventKind::Step {
                index: r.uint()? as usize,
                name: r.string()?,
            },
            CALL => EventKind::Call {
                id: CallId(r.uint()?),
                from: r.component()?,
                to: r.component()?,
                op: r.name()?,
                subject: r.string()?,
            },
            REPLY => EventKind::Reply {
                id: CallId(r.uint()?),
                outcome: match r.byte()? {
                    HTTP => Outcome::Http {
                        status: r.uint()? as u16,
                        code: None,
                    },
                    HTTP_CODE => Outcome::Http {
                        status: r.uint()? as u16,
                        code: Some(r.name()?),
                    },
                    GRPC => Outcome::Grpc {
                        code: r.name()?,
                        message: r.string()?,
                    },
                    NO_REPLY => Outcome::NoReply {
                        reason: r.string()?,
                    },
                    _ => return None,
                },
            },
            NOTE => EventKind::Note {
                component: r.component()?,
                text: r.string()?,
            },
            FAULT => EventKind::Fault {
                call: r.uint()?.checked_sub(1).map(CallId),
                fault: r.string()?,
                detail: r.string()?,
            },
            _ => return None,
        };
        self.offset = r.at;
        self.state = State {
            next_seq: seq.wrapping_add(1),
            at,
        };
        Some(Event {
            seq,
            at: VTime(at),
            kind,
        })
    }
}

impl Iterator for Iter<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.left == 0 {
            return None;
        }
        let e = self.decode();
        // Only this module writes the bytes; a failure to read them back is
        // its bug, and the proptest below is what rules it out.
        debug_assert!(e.is_some(), "an event log did not decode");
        self.left = if e.is_some() { self.left - 1 } else { 0 };
        e
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a EventLog {
    type Item = Event;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<Event> for EventLog {
    fn from_iter<I: IntoIterator<Item = Event>>(events: I) -> Self {
        let mut log = EventLog::new();
        for e in events {
            log.push(&e);
        }
        log
    }
}

impl From<Vec<Event>> for EventLog {
    fn from(events: Vec<Event>) -> Self {
        events.into_iter().collect()
    }
}

impl PartialEq for EventLog {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for EventLog {}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As a sequence of events, like the vector it replaces.
impl Serialize for EventLog {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for EventLog {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Event>::deserialize(d).map(EventLog::from)
    }
}

/// Append `e` to `w`, against the state the event before left.
fn encode(w: &mut Vec<u8>, names: &mut Names, last: &mut State, e: &Event) {
    put_delta(w, last.next_seq, e.seq);
    put_delta(w, last.at, e.at.0);
    *last = State {
        next_seq: e.seq.wrapping_add(1),
        at: e.at.0,
    };
    match &e.kind {
        EventKind::Step { index, name } => {
            w.push(STEP);
            put_uint(w, *index as u64);
            put_str(w, name);
        }
        EventKind::Call {
            id,
            from,
            to,
            op,
            subject,
        } => {
            w.push(CALL);
            put_uint(w, id.0);
            w.push(*from as u8);
            w.push(*to as u8);
            put_uint(w, names.id(op) as u64);
            put_str(w, subject);
        }
        EventKind::Reply { id, outcome } => {
            w.push(REPLY);
            put_uint(w, id.0);
            match outcome {
                Outcome::Http { status, code: None } => {
                    w.push(HTTP);
                    put_uint(w, *status as u64);
                }
                Outcome::Http {
                    status,
                    code: Some(code),
                } => {
                    w.push(HTTP_CODE);
                    put_uint(w, *status as u64);
                    put_uint(w, names.id(code) as u64);
                }
                Outcome::Grpc { code, message } => {
                    w.push(GRPC);
                    put_uint(w, names.id(code) as u64);
                    put_str(w, message);
                }
                Outcome::NoReply { reason } => {
                    w.push(NO_REPLY);
                    put_str(w, reason);
                }
            }
        }
        EventKind::Note { component, text } => {
            w.push(NOTE);
            w.push(*component as u8);
            put_str(w, text);
        }
        EventKind::Fault {
            call,
            fault,
            detail,
        } => {
            w.push(FAULT);
            put_uint(w, call.map_or(0, |c| c.0.wrapping_add(1)));
            put_str(w, fault);
            put_str(w, detail);
        }
    }
}

/// `to - from`, wrapping, zigzagged so a small step back is small too.
fn put_delta(w: &mut Vec<u8>, from: u64, to: u64) {
    let d = to.wrapping_sub(from) as i64;
    put_uint(w, ((d << 1) ^ (d >> 63)) as u64);
}

/// LEB128.
fn put_uint(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push(v as u8 | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    put_uint(w, s.len() as u64);
    w.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    names: &'a Names,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn uint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// A zigzagged difference, as the wrapping amount to add.
    fn delta(&mut self) -> Option<u64> {
        let z = self.uint()?;
        Some(((z >> 1) as i64 ^ -((z & 1) as i64)) as u64)
    }

    fn string(&mut self) -> Option<String> {
        let n = self.uint()? as usize;
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        String::from_utf8(s.to_vec()).ok()
    }

    fn name(&mut self) -> Option<String> {
        let i = self.uint()? as usize;
        self.names.all.get(i).map(|n| n.to_string())
    }

    fn component(&mut self) -> Option<Component> {
        Component::ALL.get(self.byte()? as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn component() -> impl Strategy<Value = Component> {
        proptest::sample::select(Component::ALL.to_vec())
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            (any::<u16>(), proptest::option::of("[A-Za-z]{0,12}"))
                .prop_map(|(status, code)| Outcome::Http { status, code }),
            ("[A-Z_]{0,16}", ".{0,40}").prop_map(|(code, message)| Outcome::Grpc { code, message }),
            ".{0,20}".prop_map(|reason| Outcome::NoReply { reason }),
        ]
    }

    fn kind() -> impl Strategy<Value = EventKind> {
        // Few op names, so they repeat as in a run.
        let op = proptest::sample::select(vec![
            "add_user",
            "get_secret",
            "",
            "DriverGrantBucketAccess",
        ]);
        prop_oneof![
            (any::<usize>(), ".{0,20}").prop_map(|(index, name)| EventKind::Step { index, name }),
            (any::<u64>(), component(), component(), op, ".{0,30}").prop_map(
                |(id, from, to, op, subject)| EventKind::Call {
                    id: CallId(id),
                    from,
                    to,
                    op: op.into(),
                    subject,
                }
            ),
            (any::<u64>(), outcome()).prop_map(|(id, outcome)| EventKind::Reply {
                id: CallId(id),
                outcome
            }),
            (component(), ".{0,60}")
                .prop_map(|(component, text)| EventKind::Note { component, text }),
            (proptest::option::of(any::<u64>()), ".{0,10}", ".{0,30}").prop_map(
                |(call, fault, detail)| EventKind::Fault {
                    call: call.map(CallId),
                    fault,
                    detail,
                }
            ),
        ]
    }

    /// Events as a history records them (seq counting up, time not going
    /// back) or as anything else might hand them over (any seq, any time).
    fn events() -> impl Strategy<Value = Vec<Event>> {
        let event = (any::<bool>(), any::<u64>(), 0u64..5, any::<u64>(), kind());
        proptest::collection::vec(event, 0..300).prop_map(|raw| {
            let (mut seq, mut at) = (0u64, 0u64);
            raw.into_iter()
                .map(|(wild, any_seq, step, any_at, kind)| {
                    (seq, at) = if wild {
                        (any_seq, any_at)
                    } else {
                        (seq.wrapping_add(1), at.wrapping_add(step))
                    };
                    Event {
                        seq,
                        at: VTime(at),
                        kind,
                    }
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn what_is_pushed_is_read_back_from_any_index(events in events(), from in 0usize..320) {
            let log: EventLog = events.clone().into();
            prop_assert_eq!(log.len(), events.len());
            prop_assert_eq!(log.to_vec(), events.clone());
            let tail: Vec<Event> = log.iter_from(from).collect();
            prop_assert_eq!(tail, events.get(from..).unwrap_or_default().to_vec());
            prop_assert_eq!(log.iter_from(from).len(), events.len().saturating_sub(from));
            let json = serde_json::to_string(&log).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&events).unwrap());
            prop_assert_eq!(serde_json::from_str::<EventLog>(&json).unwrap(), log);
        }
    }

    #[test]
    fn each_component_sits_at_its_own_discriminant() {
        for (i, c) in Component::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c}");
        }
    }

    #[test]
    fn a_long_log_spans_packed_chunks_and_reads_back_across_them() {
        let text = "x".repeat(100);
        let events: Vec<Event> = (0..(3 * CHUNK / 100) as u64)
            .map(|seq| Event {
                seq,
                at: VTime(seq / 7),
                kind: EventKind::Note {
                    component: Component::Lab,
                    text: text.clone(),
                },
            })
            .collect();
        let log = EventLog::from(events.clone());
        assert!(log.packed.len() >= 2, "{} packed chunks", log.packed.len());
        // Repeated text packs to a fraction of itself.
        for p in &log.packed {
            assert!(p.block.len() < p.len / 4, "{} of {}", p.block.len(), p.len);
        }
        assert_eq!(log.to_vec(), events);
        let from = events.len() - 5;
        assert_eq!(log.iter_from(from).collect::<Vec<_>>(), events[from..]);
    }

    #[test]
    fn a_recorded_call_takes_a_few_bytes_beside_its_subject() {
        let mut log = EventLog::new();
        for i in 0..1000u64 {
            log.push(&Event {
                seq: 2 * i,
                at: VTime(i),
                kind: EventKind::Call {
                    id: CallId(i),
                    from: Component::Driver,
                    to: Component::S3Admin,
                    op: "add_user".into(),
                    subject: "ba-0123456789".into(),
                },
            });
            log.push(&Event {
                seq: 2 * i + 1,
                at: VTime(i),
                kind: EventKind::Reply {
                    id: CallId(i),
                    outcome: Outcome::Http {
                        status: 200,
                        code: None,
                    },
                },
            });
        }
        // seq, time, tag, id, from, to, op, subject's length and bytes; then
        // the reply's seq, time, tag, id, form and status. Counted unpacked:
        // what is measured is the encoding, not what LZ4 makes of it.
        let unpacked = log.packed.iter().map(|p| p.len).sum::<usize>() + log.open.len();
        assert!(unpacked <= 1000 * (9 + 13 + 8), "{unpacked}");
    }
}
