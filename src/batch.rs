//! The domain types: items, batches, groups, the table of flush reasons
//! (shared with the Lua scripts), and the item blob the scripts write a
//! batch's items in.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One item: an id unique within its key, an opaque payload, and what the
/// policies read: its measures and its deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Item {
    pub id: Vec<u8>,
    pub payload: Vec<u8>,
    /// Named amounts (weight, volume...), by name.
    pub measures: BTreeMap<String, u64>,
    /// The latest time its batch may be flushed (ms since the Unix epoch).
    pub deadline_ms: Option<u64>,
    /// How many times Requeue has put it back.
    pub requeue_count: u32,
    /// The trace context of the span that added it, kept while it waits in
    /// its group so that its batch's flush span can link to it. Only with
    /// tracing on, for an add that carried a `traceparent`.
    pub trace: Option<TraceContext>,
}

/// A W3C trace context (`traceparent`): a trace id, a span id and the trace
/// flags. An item keeps one compactly in its ext (see `store::ext`); its
/// `tracestate`, if any, is not kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceContext {
    /// Reads a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`, or a
    /// later version with more after it), or None for one that W3C Trace
    /// Context says to ignore: malformed, version `ff`, or a zero id.
    pub fn from_traceparent(text: &str) -> Option<TraceContext> {
        let bytes = text.as_bytes();
        if bytes.len() < 55 || !is_lower_hex(&bytes[..2]) || &bytes[..2] == b"ff" {
            return None;
        }
        // Version 00 is exactly 55 characters; a later one may go on after a '-'.
        if (&bytes[..2] == b"00" && bytes.len() != 55) || bytes.get(55).is_some_and(|b| *b != b'-')
        {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let mut hex = [0u8; 50];
        hex[..32].copy_from_slice(&bytes[3..35]);
        hex[32..48].copy_from_slice(&bytes[36..52]);
        hex[48..].copy_from_slice(&bytes[53..55]);
        TraceContext::from_hex(&hex)
    }

    /// The `traceparent` value: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }

    /// The compact form an item's ext holds: trace id, span id and flags
    /// as 50 lower-case hex digits.
    pub(crate) fn to_hex(self) -> String {
        let mut bytes = [0u8; 25];
        bytes[..16].copy_from_slice(&self.trace_id);
        bytes[16..24].copy_from_slice(&self.span_id);
        bytes[24] = self.flags;
        hex::encode(bytes)
    }

    /// Reads [`TraceContext::to_hex`]'s form; None unless it is 50
    /// lower-case hex digits with non-zero ids.
    pub(crate) fn from_hex(text: &[u8]) -> Option<TraceContext> {
        if text.len() != 50 || !is_lower_hex(text) {
            return None;
        }
        let mut bytes = [0u8; 25];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        let context = TraceContext {
            trace_id: bytes[..16].try_into().ok()?,
            span_id: bytes[16..24].try_into().ok()?,
            flags: bytes[24],
        };
        (context.trace_id != [0; 16] && context.span_id != [0; 8]).then_some(context)
    }
}

fn is_lower_hex(text: &[u8]) -> bool {
    text.iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

impl Item {
    /// An item with only an id and a payload.
    pub fn new(id: impl Into<Vec<u8>>, payload: impl Into<Vec<u8>>) -> Item {
        Item {
            id: id.into(),
            payload: payload.into(),
            ..Item::default()
        }
    }
}

/// Defines [`FlushReason`] and its table from one list of `Variant = "WORD"`.
macro_rules! flush_reasons {
    ($($(#[$doc:meta])* $variant:ident = $word:literal,)+) => {
        /// Why a group was flushed.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum FlushReason {
            $($(#[$doc])* $variant,)+
        }

        impl FlushReason {
            /// Every reason with the word the scripts store in the stream: the
            /// one table that the Rust enum and the Lua scripts both read.
            pub const ALL: &[(FlushReason, &str)] = &[$((FlushReason::$variant, $word),)+];

            /// The word the scripts store in the stream.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(FlushReason::$variant => $word,)+
                }
            }
        }
    };
}

flush_reasons! {
    /// The group reached its `max_items`.
    Size = "SIZE",
    /// The group's wait window passed.
    Timeout = "TIMEOUT",
    /// The group reached its `max_bytes`.
    Bytes = "BYTES",
    /// A client asked for the flush.
    Manual = "MANUAL",
    /// The next item would not fit the key's capacity, or the sums reached it.
    Capacity = "CAPACITY",
    /// No item arrived for the key's `max_idle`.
    Idle = "IDLE",
    /// One of the key's cutoffs (departure times) came.
    Cutoff = "CUTOFF",
    /// An item's deadline minus the key's `deadline_lead` came.
    Deadline = "DEADLINE",
    /// The group reached the key's `max_age`.
    MaxAge = "MAX_AGE",
    /// An add with `close_group` closed it.
    Closed = "CLOSED",
    /// An add whose key's policy flushes the oldest made room under a
    /// limit on open groups.
    Overflow = "OVERFLOW",
}

impl FlushReason {
    /// The table as a Lua snippet for the scripts to start with:
    /// `local REASON = { SIZE = 'SIZE', ... }`, so a script names a reason as
    /// `REASON.SIZE` and a new reason is added here only.
    pub fn lua_table() -> String {
        let entries: Vec<String> = Self::ALL
            .iter()
            .map(|(_, word)| format!("{word} = '{word}'"))
            .collect();
        format!("local REASON = {{ {} }}\n", entries.join(", "))
    }
}

impl FromStr for FlushReason {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self, DecodeError> {
        Self::ALL
            .iter()
            .find(|(_, word)| *word == s)
            .map(|(reason, _)| *reason)
            .ok_or_else(|| DecodeError(format!("unknown flush reason {s:?}")))
    }
}

/// A position in one shard's stream: a Redis stream entry id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    /// The position before every entry.
    pub const ZERO: StreamId = StreamId { ms: 0, seq: 0 };
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for StreamId {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self, DecodeError> {
        let bad = || DecodeError(format!("bad stream id {s:?}"));
        let (ms, seq) = s.split_once('-').ok_or_else(bad)?;
        Ok(StreamId {
            ms: ms.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// A flushed group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The shard whose stream holds the batch.
    pub shard: u16,
    /// The batch's entry in that stream; with the shard, it is the batch's identity.
    pub stream_id: StreamId,
    pub key: String,
    /// In arrival order.
    pub items: Vec<Item>,
    pub reason: FlushReason,
    /// Milliseconds since the Unix epoch, Redis clock.
    pub opened_at_ms: u64,
    /// Milliseconds since the Unix epoch, Redis clock.
    pub flushed_at_ms: u64,
    /// Set on a re-driven copy: the entry of the original batch, whose id the
    /// copy keeps.
    pub origin: Option<StreamId>,
    /// Set on a re-driven copy: the one consumer group it is for.
    pub for_group: Option<String>,
}

impl Batch {
    /// The batch's unique id: `<shard>-<stream entry id>` of the original
    /// entry. Stable across redeliveries and re-drives, because it is derived
    /// from where the batch was first stored.
    pub fn id(&self) -> String {
        format!("{}-{}", self.shard, self.origin.unwrap_or(self.stream_id))
    }

    /// Parses a batch id into its shard and original entry id.
    pub fn parse_id(id: &str) -> Option<(u16, StreamId)> {
        let (shard, entry) = id.split_once('-')?;
        Some((shard.parse().ok()?, entry.parse().ok()?))
    }
}

/// An open group, as GetGroup and ListGroups report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub key: String,
    pub size: u32,
    pub bytes: u64,
    pub opened_at_ms: u64,
    pub due_at_ms: u64,
    /// The rule that set `due_at_ms`.
    pub due_reason: FlushReason,
    /// When the latest item arrived (ms, Redis clock).
    pub last_added_ms: u64,
    /// The wait window the group was opened with.
    pub max_wait: Duration,
    /// The sums of the items' measures.
    pub measures: BTreeMap<String, u64>,
    /// Empty in listings.
    pub items: Vec<Item>,
}

/// Data in Redis that does not have the shape the scripts write.
#[derive(Clone, Debug, thiserror::Error)]
#[error("unexpected data in Redis: {0}")]
pub struct DecodeError(pub String);

/// Takes one `<length>:<value>` off the front of a `what` blob.
pub(crate) fn take<'a>(blob: &mut &'a [u8], what: &str) -> Result<&'a [u8], DecodeError> {
    let colon = blob
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| DecodeError(format!("{what} blob: missing length")))?;
    let len: usize = std::str::from_utf8(&blob[..colon])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DecodeError(format!("{what} blob: bad length")))?;
    let rest = &blob[colon + 1..];
    if rest.len() < len {
        return Err(DecodeError(format!("{what} blob: truncated")));
    }
    let (value, tail) = rest.split_at(len);
    *blob = tail;
    Ok(value)
}

/// Reads measure sums as the scripts write them: `name=v;name=v`.
pub fn parse_sums(sums: &[u8]) -> Result<BTreeMap<String, u64>, DecodeError> {
    let text = std::str::from_utf8(sums).map_err(|_| DecodeError("sums: not UTF-8".into()))?;
    text.split(';')
        .filter(|f| !f.is_empty())
        .map(|field| {
            let (name, v) = field
                .split_once('=')
                .ok_or_else(|| DecodeError(format!("bad measure sums {text:?}")))?;
            let v = v
                .parse()
                .map_err(|_| DecodeError(format!("bad measure sums {text:?}")))?;
            Ok((name.to_owned(), v))
        })
        .collect()
}

/// What an add did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    Added,
    Duplicate,
    /// Nothing was written: the key had no open group, and opening one
    /// would pass this limit on open groups (and its policy's overflow
    /// refuses, or flushing the oldest did not make room in time).
    Refused(OpenLimit),
}

/// A limit on open groups that an add can meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenLimit {
    /// The service's `[limits] max_open_groups`.
    Service,
    /// The `max_groups` of the key's policy, by its scope ("d" for the
    /// defaults, "k" and the pattern for a key table).
    Policy(std::sync::Arc<str>),
}

impl OpenLimit {
    /// The limit as the config and the policy API name it, such as
    /// "limits.max_open_groups" or "policies/keys/area-*.max_groups".
    pub fn name(&self) -> String {
        match self {
            OpenLimit::Service => "limits.max_open_groups".into(),
            OpenLimit::Policy(scope) => match scope.strip_prefix('k') {
                Some(pattern) => format!("policies/keys/{pattern}.max_groups"),
                None => "policies/defaults.max_groups".into(),
            },
        }
    }
}

/// The result of one add.
#[derive(Clone, Debug)]
pub struct AddResult {
    pub outcome: AddOutcome,
    /// Size of the open group after the add; 0 when it flushed.
    pub group_size: u32,
    /// Every batch this add wrote, oldest first: the group it completed,
    /// and before it the group it flushed because the item did not fit.
    pub flushed: Vec<Batch>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason survives its word, and the Lua table names each one.
    #[test]
    fn flush_reasons_come_from_one_table() {
        for (reason, word) in FlushReason::ALL {
            assert_eq!(reason.as_str(), *word);
            assert_eq!(word.parse::<FlushReason>().unwrap(), *reason);
        }
        assert!("size".parse::<FlushReason>().is_err());
        assert_eq!(
            FlushReason::lua_table(),
            "local REASON = { SIZE = 'SIZE', TIMEOUT = 'TIMEOUT', BYTES = 'BYTES', MANUAL = 'MANUAL', \
             CAPACITY = 'CAPACITY', IDLE = 'IDLE', CUTOFF = 'CUTOFF', DEADLINE = 'DEADLINE', \
             MAX_AGE = 'MAX_AGE', CLOSED = 'CLOSED', OVERFLOW = 'OVERFLOW' }\n"
        );
    }

    /// A traceparent reads back as it was written; what W3C says to
    /// ignore (bad lengths, upper case, version ff, zero ids) is None.
    #[test]
    fn traceparents() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = TraceContext::from_traceparent(text).unwrap();
        assert_eq!(
            context.span_id,
            [0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(context.flags, 1);
        assert_eq!(context.traceparent(), text);
        assert_eq!(
            TraceContext::from_hex(context.to_hex().as_bytes()),
            Some(context)
        );
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(TraceContext::from_traceparent(later), Some(context));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceContext::from_traceparent(bad), None, "{bad:?}");
        }
    }

    /// Stream ids order numerically, not as strings.
    #[test]
    fn stream_ids_order_numerically() {
        let a: StreamId = "9-5".parse().unwrap();
        let b: StreamId = "10-0".parse().unwrap();
        assert!(a < b);
        assert_eq!(b.to_string(), "10-0");
        assert!("10".parse::<StreamId>().is_err());
    }
}
