//! How Redis replies become our types. redis-rs decodes the nested parts
//! (tuples, `Vec`, `Option`, its stream reply types); the impls here only put
//! them together, so nothing in the store walks a reply by hand.

use std::collections::HashMap;
use std::time::Duration;

use redis::streams;
use redis::{FromRedisValue, ParsingError, Value, from_redis_value};

use super::add::AddOutcome;
use super::ext;
use super::groups::DueScan;
use crate::batch::{Batch, DecodeError, FlushReason, Group, Item, StreamId, decode_items};

impl From<DecodeError> for ParsingError {
    fn from(err: DecodeError) -> ParsingError {
        err.0.into()
    }
}

impl From<ParsingError> for DecodeError {
    fn from(err: ParsingError) -> DecodeError {
        DecodeError(err.to_string())
    }
}

impl FromRedisValue for StreamId {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(from_redis_value::<String>(v)?.parse()?)
    }
}

impl FromRedisValue for FlushReason {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(from_redis_value::<String>(v)?.parse()?)
    }
}

/// A batch as the scripts return it: `{stream_id, reason, opened, flushed, n,
/// items, x, names}`. The caller knows its shard and key.
pub(super) struct ScriptBatch {
    stream_id: StreamId,
    reason: FlushReason,
    opened_at_ms: u64,
    flushed_at_ms: u64,
    items: Vec<Item>,
}

impl ScriptBatch {
    pub(super) fn into_batch(self, shard: u16, key: &str) -> Batch {
        Batch {
            shard,
            stream_id: self.stream_id,
            key: key.to_owned(),
            items: self.items,
            reason: self.reason,
            opened_at_ms: self.opened_at_ms,
            flushed_at_ms: self.flushed_at_ms,
            origin: None,
            for_group: None,
        }
    }
}

/// The parts of a script's batch, in reply order.
type ScriptBatchParts = (
    StreamId,
    FlushReason,
    u64,
    u64,
    usize,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
);

impl FromRedisValue for ScriptBatch {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (stream_id, reason, opened_at_ms, flushed_at_ms, count, blob, x, names): ScriptBatchParts =
            from_redis_value(v)?;
        let mut items = decode_items(&blob, count)?;
        ext::decode_all(&x, &ext::names_of(&names), &mut items)?;
        Ok(ScriptBatch {
            stream_id,
            reason,
            opened_at_ms,
            flushed_at_ms,
            items,
        })
    }
}

impl FromRedisValue for AddOutcome {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match from_redis_value::<i64>(v)? {
            1 => Ok(AddOutcome::Added),
            2 => Ok(AddOutcome::Duplicate),
            other => Err(format!("add outcome {other}").into()),
        }
    }
}

/// The add script's reply: `{earliest due set or 0, then per item:
/// outcome, size, batches or false}`.
pub(super) struct AddReply {
    /// The earliest due time among the groups whose due time the call set.
    pub earliest: Option<u64>,
    /// One per item, in order: what it did, the group's size after, and the
    /// batches it wrote.
    pub items: Vec<(AddOutcome, u32, Option<Vec<ScriptBatch>>)>,
}

impl FromRedisValue for AddReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut parts = from_redis_value::<Vec<Value>>(v)?.into_iter();
        let earliest: u64 = next_part(&mut parts, "the earliest due time")?;
        let mut items = Vec::with_capacity(parts.len() / 3);
        while parts.len() > 0 {
            items.push((
                next_part(&mut parts, "an outcome")?,
                next_part(&mut parts, "a group size")?,
                next_part(&mut parts, "its batches")?,
            ));
        }
        Ok(AddReply {
            earliest: (earliest > 0).then_some(earliest),
            items,
        })
    }
}

/// Takes the next part of a flat reply.
fn next_part<T: FromRedisValue>(
    parts: &mut impl Iterator<Item = Value>,
    what: &str,
) -> Result<T, ParsingError> {
    from_redis_value(parts.next().ok_or_else(|| format!("reply lacks {what}"))?)
}

impl FromRedisValue for DueScan {
    /// The due scan's reply: `{now, earliest due not yet due or -1, count,
    /// count due keys, keys due next...}`.
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut parts = from_redis_value::<Vec<Value>>(v)?.into_iter();
        let now_ms = next_part(&mut parts, "now")?;
        let next_due: i64 = next_part(&mut parts, "next due")?;
        let count: usize = next_part(&mut parts, "due count")?;
        let mut keys: Vec<String> = parts.map(from_redis_value).collect::<Result<_, _>>()?;
        let next_keys = keys.split_off(count.min(keys.len()));
        Ok(DueScan {
            now_ms,
            next_due_ms: u64::try_from(next_due).ok(),
            keys,
            next_keys,
        })
    }
}

/// An open group's hash as HGETALL returns it: metadata fields (see
/// `src/lua/batch_lib.lua`), one `:<id>` field per item, whose value is
/// `<sequence>,<payload>` or `<packed ext><sequence>,<payload>` (or
/// `<sequence>;<ext>,<payload>` in groups that older versions opened), and
/// a `;<id>` field holding the ext of an item written with one. The
/// dictionary in `s` names the packed exts' measures. `None` when the group
/// is not open. The key is the caller's to fill in.
pub(super) struct GroupHash(pub Option<(Group, Option<Rules>)>);

impl FromRedisValue for GroupHash {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let fields: HashMap<Vec<u8>, Vec<u8>> = from_redis_value(v)?;
        if fields.is_empty() {
            return Ok(GroupHash(None));
        }
        let mut meta: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut exts: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut held: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for (field, value) in fields {
            match field.first() {
                Some(b':') => held.push((field, value)),
                Some(b';') => {
                    exts.insert(field[1..].to_vec(), value);
                }
                _ => {
                    meta.insert(field, value);
                }
            }
        }
        let dictionary = meta.get(&b"s"[..]).and_then(|s| dictionary_of(s));
        let names = dictionary.map_or_else(Vec::new, |d| ext::names_of(d.names));
        let mut items: Vec<(u64, Item)> = Vec::with_capacity(held.len());
        for (field, value) in held {
            let (seq, item) = group_item(&field[1..], &value, &names, exts.get(&field[1..]))?;
            items.push((seq, item));
        }
        items.sort_by_key(|(seq, _)| *seq);
        let (mut group, rules) = group_meta(&meta)?;
        group.items = items.into_iter().map(|(_, item)| item).collect();
        // Every measure's sum, not only the capacity measures' the hash keeps.
        group.measures.clear();
        for item in &group.items {
            for (name, value) in &item.measures {
                *group.measures.entry(name.clone()).or_default() += value;
            }
        }
        Ok(GroupHash(Some((group, rules))))
    }
}

/// One item of a group hash: its sequence number and the item, from its
/// `:<id>` field's value and its `;<id>` field's, if any.
fn group_item(
    id: &[u8],
    value: &[u8],
    names: &[String],
    text_ext: Option<&Vec<u8>>,
) -> Result<(u64, Item), ParsingError> {
    let bad = || ParsingError::from("group item without sequence");
    let mut item = Item::new(id, Vec::new());
    let mut rest = value;
    if matches!(value.first(), Some(b'+' | b'*')) {
        let len = ext::packed_len(value).ok_or_else(bad)?;
        ext::parse(&value[..len], names, &mut item)?;
        rest = &value[len..];
    }
    let comma = rest.iter().position(|b| *b == b',').ok_or_else(bad)?;
    let mut seq = &rest[..comma];
    item.payload = rest[comma + 1..].to_vec();
    if let Some(semi) = seq.iter().position(|b| *b == b';') {
        ext::parse(&seq[semi + 1..], names, &mut item)?;
        seq = &seq[..semi];
    }
    if let Some(text) = text_ext {
        ext::parse(text, names, &mut item)?;
    }
    Ok((parse_u64(seq)?, item))
}

/// A group's metadata fields, without its items: `n` and `b` (or for a
/// group written under a capacity, its `s`), `o`, `d`, and (from groups
/// written since they exist) `r`, `l`, `x` and the capacity measures' sums
/// `=<name>;<name>`.
pub(super) fn group_meta(
    meta: &HashMap<Vec<u8>, Vec<u8>>,
) -> Result<(Group, Option<Rules>), ParsingError> {
    let field = |name: &[u8]| -> Result<u64, ParsingError> {
        parse_u64(meta.get(name).ok_or("group without metadata")?)
    };
    let opened_at_ms = field(b"o")?;
    let due_at_ms = field(b"d")?;
    let rules = meta.get(&b"x"[..]).filter(|x| !x.is_empty());
    let rules = rules.map(|x| Rules::parse(x)).transpose()?;
    let max_wait_ms = match &rules {
        Some(rules) => rules.0[0] as u64,
        None => due_at_ms.saturating_sub(opened_at_ms),
    };
    let due_reason = match meta.get(&b"r"[..]) {
        Some(r) => std::str::from_utf8(r)
            .map_err(|_| "due reason not UTF-8")?
            .parse()?,
        None => FlushReason::Timeout,
    };
    // A group written under a capacity keeps its count and bytes in `s`.
    let counts = meta.get(&b"s"[..]).and_then(|s| dictionary_of(s)?.counts);
    let (size, bytes) = match counts {
        Some(counts) => counts,
        None => (field(b"n")?, field(b"b")?),
    };
    let group = Group {
        key: String::new(),
        size: size as u32,
        bytes,
        opened_at_ms,
        due_at_ms,
        due_reason,
        last_added_ms: meta
            .get(&b"l"[..])
            .map_or(Ok(opened_at_ms), |l| parse_u64(l))?,
        max_wait: Duration::from_millis(max_wait_ms),
        measures: capacity_sums(meta).into_iter().collect(),
        items: Vec::new(),
    };
    Ok((group, rules))
}

/// What a group's `s` holds when it starts with or holds a dictionary (a
/// group written under a capacity): the dictionary (`=` then the measure
/// names joined by `;`), the sums' bytes (empty when they were dropped), and
/// the item count and payload bytes, when `s` holds them instead of the
/// fields `n` and `b`. `s` is the sequence number as text, or the
/// dictionary, `=`, then as doubles the sequence number and either nothing,
/// or the count, the bytes and the sums (or, as older versions wrote it,
/// the sums alone); older still, the sequence number as text, then the
/// dictionary, `=` and the sums. See `src/lua/batch_lib.lua`.
struct Dictionary<'a> {
    names: &'a [u8],
    sums: &'a [u8],
    counts: Option<(u64, u64)>,
}

fn dictionary_of(s: &[u8]) -> Option<Dictionary<'_>> {
    let at = s.iter().position(|b| *b == b'=')?;
    let end = at + 1 + s[at + 1..].iter().position(|b| *b == b'=')?;
    let after = &s[end + 1..];
    if at != 0 {
        let names = &s[at..end];
        return Some(Dictionary {
            names,
            sums: after,
            counts: None,
        });
    }
    let names = &s[..end];
    let count = 1 + names.iter().filter(|b| **b == b';').count();
    if after.len() != 8 * (3 + count) {
        let sums = after.get(8..).unwrap_or_default();
        return Some(Dictionary {
            names,
            sums,
            counts: None,
        });
    }
    let double = |i: usize| {
        let bytes = after[8 * i..8 * i + 8].try_into().unwrap_or_default();
        f64::from_le_bytes(bytes) as u64
    };
    let counts = Some((double(1), double(2)));
    Some(Dictionary {
        names,
        sums: &after[24..],
        counts,
    })
}

/// The capacity measures' sums a group holds, when it does: in its `s`
/// after its dictionary, one little-endian double per name, or (from
/// groups older versions wrote) in a field `=<names>` of its own.
fn capacity_sums(meta: &HashMap<Vec<u8>, Vec<u8>>) -> Vec<(String, u64)> {
    let from_s = meta.get(&b"s"[..]).and_then(|s| dictionary_of(s));
    let from_s = from_s.map(|d| (d.names, d.sums));
    let older = meta.iter().find(|(field, _)| field.first() == Some(&b'='));
    let Some((names, sums)) = from_s.or(older.map(|(f, v)| (&f[..], &v[..]))) else {
        return Vec::new();
    };
    let names = ext::names_of(names);
    if sums.len() != 8 * names.len() {
        return Vec::new();
    }
    let sums = sums
        .chunks_exact(8)
        .map(|bytes| f64::from_le_bytes(bytes.try_into().unwrap_or_default()) as u64);
    names.into_iter().zip(sums).collect()
}

/// A group's due rules (its `x` field): max_wait, max_idle, the cutoff,
/// deadline_lead, max_age, the earliest item deadline and opened-at, in ms
/// (0 = none), as little-endian doubles.
pub(super) struct Rules([f64; 7]);

impl Rules {
    fn parse(x: &[u8]) -> Result<Rules, ParsingError> {
        if x.len() != 56 {
            return Err("group rules of the wrong size".into());
        }
        let mut rules = [0.0; 7];
        for (rule, bytes) in rules.iter_mut().zip(x.chunks_exact(8)) {
            *rule = f64::from_le_bytes(bytes.try_into().unwrap_or_default());
        }
        Ok(Rules(rules))
    }

    /// The group's due time and the rule that sets it, as the scripts'
    /// `due_of` computes it: the stored due time may be an earlier wake-up
    /// when only max_idle moved it later.
    pub(super) fn due(&self, last: u64, size: u32, min_items: u32, now: u64) -> (u64, FlushReason) {
        let [wait, idle, cutoff, lead, age, deadline, opened] = self.0.map(|r| r as u64);
        let held = age > 0 && size < min_items;
        let passed = |t: u64| held && t <= now;
        let mut due = (u64::MAX, FlushReason::MaxAge);
        if !passed(opened + wait) {
            due = (opened + wait, FlushReason::Timeout);
        }
        if idle > 0 && last + idle < due.0 && !passed(last + idle) {
            due = (last + idle, FlushReason::Idle);
        }
        for (at, set, reason) in [
            (cutoff, cutoff > 0, FlushReason::Cutoff),
            (
                deadline.saturating_sub(lead),
                deadline > 0,
                FlushReason::Deadline,
            ),
            (opened + age, age > 0, FlushReason::MaxAge),
        ] {
            if set && at <= due.0 {
                due = (at, reason);
            }
        }
        due
    }
}

fn parse_u64(b: &[u8]) -> Result<u64, ParsingError> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("expected a number, got {b:?}").into())
}

/// A batch as a stream entry holds it: fields `key`, `reason`, `opened`,
/// `flushed`, `n`, `items`, when its items carry exts `x` and (if its group
/// had a capacity) `names`, and on a re-driven copy `origin` and `for_group`.
pub(super) fn batch_from_entry(
    shard: u16,
    entry: streams::StreamId,
) -> Result<Batch, ParsingError> {
    let streams::StreamId { id, mut map, .. } = entry;
    let mut field = |name: &str| {
        map.remove(name)
            .ok_or_else(|| ParsingError::from(format!("stream entry {id} lacks {name:?}")))
    };
    let count: usize = from_redis_value(field("n")?)?;
    let blob: Vec<u8> = from_redis_value(field("items")?)?;
    let mut items = decode_items(&blob, count)?;
    if let Ok(x) = field("x") {
        let names: Vec<u8> = field("names").map_or(Ok(Vec::new()), from_redis_value)?;
        let x: Vec<u8> = from_redis_value(x)?;
        ext::decode_all(&x, &ext::names_of(&names), &mut items)?;
    }
    Ok(Batch {
        shard,
        key: from_redis_value(field("key")?)?,
        reason: from_redis_value(field("reason")?)?,
        opened_at_ms: from_redis_value(field("opened")?)?,
        flushed_at_ms: from_redis_value(field("flushed")?)?,
        items,
        origin: field("origin").ok().map(from_redis_value).transpose()?,
        for_group: field("for_group").ok().map(from_redis_value).transpose()?,
        stream_id: id.parse()?,
    })
}

/// The batches of stream entries.
pub(super) fn batches_from_entries(
    shard: u16,
    entries: Vec<streams::StreamId>,
) -> Result<Vec<Batch>, DecodeError> {
    entries
        .into_iter()
        .map(|entry| Ok(batch_from_entry(shard, entry)?))
        .collect()
}

/// The batches of an XREAD or XREADGROUP reply for one stream (`None` when
/// a blocking read timed out).
pub(super) fn batches_from_read(
    shard: u16,
    reply: Option<streams::StreamReadReply>,
) -> Result<Vec<Batch>, DecodeError> {
    let entries = reply
        .into_iter()
        .flat_map(|reply| reply.keys)
        .flat_map(|key| key.ids)
        .collect();
    batches_from_entries(shard, entries)
}

/// One entry of the claim script's reply: `{entry id, fields, delivery count}`.
pub(super) struct Claimed {
    pub entry: streams::StreamId,
    pub deliveries: u32,
}

impl FromRedisValue for Claimed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (id, map, deliveries): (String, HashMap<String, Value>, u32) = from_redis_value(v)?;
        Ok(Claimed {
            entry: streams::StreamId {
                id,
                map,
                ..Default::default()
            },
            deliveries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Each layout of `s` gives its dictionary, its sums and, only for the
    /// one written under a capacity now, the count and bytes.
    #[test]
    fn every_s_layout_is_read() {
        let dict = &b"=kg;l"[..];
        let counters = [&b"=kg;l="[..], &doubles(&[7.0, 3.0, 90.0, 12.0, 5.0])].concat();
        let d = dictionary_of(&counters).expect("counters");
        assert_eq!((d.names, d.counts), (dict, Some((3, 90))));
        assert_eq!(d.sums, doubles(&[12.0, 5.0]));

        let older = [&b"=kg;l="[..], &doubles(&[7.0, 12.0, 5.0])].concat();
        let d = dictionary_of(&older).expect("seq and sums");
        assert_eq!((d.names, d.counts), (dict, None));
        assert_eq!(d.sums, doubles(&[12.0, 5.0]));

        let seq_only = [&b"=kg;l="[..], &doubles(&[7.0])].concat();
        let d = dictionary_of(&seq_only).expect("seq only");
        assert_eq!((d.names, d.sums, d.counts), (dict, &[][..], None));

        let oldest = [&b"7=kg;l="[..], &doubles(&[12.0, 5.0])].concat();
        let d = dictionary_of(&oldest).expect("text seq first");
        assert_eq!((d.names, d.counts), (dict, None));
        assert_eq!(d.sums, doubles(&[12.0, 5.0]));

        assert!(dictionary_of(b"7").is_none());
    }
}
