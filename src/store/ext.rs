//! An item's ext, what it carries besides its id and payload (deadline,
//! measures, requeue count, trace context), both ways: packed as the add function gets it
//! and a group stores it, and read back from a batch or a group's items.
//! Its layout is described once, in [`crate::scripts::layout`].

use std::collections::BTreeMap;

use crate::batch::{DecodeError, Item, TraceContext};

/// An item's packed ext for a group whose capacity is `capacity` (its
/// values follow the capacity's names, in order), or empty for an item
/// with nothing but an id and a payload; an item without a trace context
/// packs exactly as it did before traces existed.
///
/// Measure values are at most 2^53 - 1 (the service checks them), so the
/// doubles hold them exactly. A capacity names at most
/// [`crate::policy::MAX_CAPACITY_MEASURES`] measures, so 1 + k fits its byte.
pub(crate) fn packed(item: &Item, capacity: &BTreeMap<String, u64>) -> Vec<u8> {
    if item.deadline_ms.is_none()
        && item.measures.is_empty()
        && item.requeue_count == 0
        && item.trace.is_none()
    {
        return Vec::new();
    }
    let k = u8::try_from(1 + capacity.len()).expect("a capacity names at most 64 measures");
    let mut ext = Vec::with_capacity(3 + 8 * usize::from(k));
    ext.push(b'+');
    ext.push(k);
    let deadline = item.deadline_ms.unwrap_or(0) as f64;
    ext.extend_from_slice(&deadline.to_le_bytes());
    for name in capacity.keys() {
        let value = item.measures.get(name).map_or(-0.0, |v| *v as f64);
        ext.extend_from_slice(&value.to_le_bytes());
    }
    let mut text = Vec::new();
    for (name, value) in &item.measures {
        if !capacity.contains_key(name) {
            text.push(format!("m{name}={value}"));
        }
    }
    if item.requeue_count > 0 {
        text.push(format!("r{}", item.requeue_count));
    }
    if let Some(trace) = item.trace {
        text.push(format!("t{}", trace.to_hex()));
    }
    ext.extend_from_slice(text.join(";").as_bytes());
    ext.push(b'|');
    ext
}

/// The measure names of a dictionary: names joined by `;` (a batch's
/// `names` field, the names a group's reply gives).
pub(crate) fn names_of(field: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(field)
        .split(';')
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Reads an item's ext into `item`. `names` names the measures of a packed
/// ext's values after its deadline, in order.
pub(crate) fn parse(ext: &[u8], names: &[String], item: &mut Item) -> Result<(), DecodeError> {
    match ext.split_first() {
        None => Ok(()),
        Some((b'+', body)) => parse_packed(body, names, item),
        _ => Err(DecodeError("item ext: not packed".into())),
    }
}

/// Reads a packed ext after its `+`.
fn parse_packed(body: &[u8], names: &[String], item: &mut Item) -> Result<(), DecodeError> {
    let bad = |why: &str| DecodeError(format!("packed item ext: {why}"));
    let (&k, rest) = body.split_first().ok_or_else(|| bad("empty"))?;
    let k = usize::from(k);
    let text = rest
        .strip_suffix(b"|")
        .filter(|rest| k >= 1 && rest.len() >= 8 * k)
        .ok_or_else(|| bad("truncated"))?;
    let (values, text) = text.split_at(8 * k);
    let mut values = values
        .chunks_exact(8)
        .map(|bytes| f64::from_le_bytes(bytes.try_into().unwrap_or_default()));
    let deadline = values.next().unwrap_or(0.0);
    if deadline != 0.0 {
        item.deadline_ms = Some(deadline as u64);
    }
    if k > 1 && names.len() != k - 1 {
        return Err(bad(&format!(
            "{} measure values, but {} names for them",
            k - 1,
            names.len()
        )));
    }
    for (name, value) in names.iter().zip(values) {
        if !(value == 0.0 && value.is_sign_negative()) {
            item.measures.insert(name.clone(), value as u64);
        }
    }
    parse_text(text, item)
}

/// Reads a packed ext's text (`r<requeue count>`, `m<name>=<value>`,
/// `t<trace context>`, joined by `;`) into `item`.
fn parse_text(ext: &[u8], item: &mut Item) -> Result<(), DecodeError> {
    let ext = std::str::from_utf8(ext).map_err(|_| DecodeError("ext: not UTF-8".into()))?;
    let bad = || DecodeError(format!("bad item ext {ext:?}"));
    for field in ext.split(';').filter(|f| !f.is_empty()) {
        let (kind, value) = field.split_at(1);
        match kind {
            "r" => item.requeue_count = value.parse().map_err(|_| bad())?,
            "t" => item.trace = Some(TraceContext::from_hex(value.as_bytes()).ok_or_else(bad)?),
            "m" => {
                let (name, v) = value.split_once('=').ok_or_else(bad)?;
                item.measures
                    .insert(name.to_owned(), v.parse().map_err(|_| bad())?);
            }
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(names: &[&str]) -> BTreeMap<String, u64> {
        names.iter().map(|name| (name.to_string(), 100)).collect()
    }

    fn item(measures: &[(&str, u64)], deadline_ms: Option<u64>, requeue_count: u32) -> Item {
        let mut item = Item::new("i", "p");
        item.measures = measures.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        item.deadline_ms = deadline_ms;
        item.requeue_count = requeue_count;
        item
    }

    fn read(ext: &[u8], names: &[String]) -> Item {
        let mut out = Item::new("i", "p");
        parse(ext, names, &mut out).unwrap();
        out
    }

    /// A packed ext reads back whole: the deadline, the capacity's
    /// measures (a measure of 0 kept, a missing one left out), the other
    /// measures and the requeue count.
    #[test]
    fn packed_round_trip() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let names = names_of(b"volume_cm3;weight_g");
        for original in [
            item(&[("weight_g", 1200), ("volume_cm3", 50_000)], Some(9), 0),
            item(&[("weight_g", 0)], Some(1_893_456_000_123), 2),
            item(&[("colli", 3), ("weight_g", (1 << 53) - 1)], None, 0),
            item(&[("weight_g", 1), ("volume_cm3", 1 << 32)], None, 0),
            item(&[("weight_g", 1), ("volume_cm3", 2)], None, 1),
            item(&[], Some(5), 0),
        ] {
            let ext = packed(&original, &cap);
            assert_eq!(&ext[..2], &[b'+', 3]);
            assert_eq!(read(&ext, &names), original);
        }
        assert!(packed(&item(&[], None, 0), &cap).is_empty());
        assert_eq!(read(b"", &names), Item::new("i", "p"));
    }

    /// A parcel's packed ext is 27 bytes, so that with a seq and a 32-byte
    /// payload its group hash value stays within Redis's 64-byte listpack
    /// limit.
    #[test]
    fn a_parcel_packs_small() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let parcel = item(&[("weight_g", 1200), ("volume_cm3", 50_000)], None, 0);
        assert_eq!(packed(&parcel, &cap).len(), 27);
    }

    /// Without a capacity every measure is text.
    #[test]
    fn text_measures() {
        let original = item(&[("weight_g", 1200)], Some(7), 1);
        let ext = packed(&original, &BTreeMap::new());
        assert_eq!(&ext[10..], b"mweight_g=1200;r1|");
        assert_eq!(read(&ext, &[]), original);
    }

    fn traced(mut item: Item) -> Item {
        item.trace = TraceContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        item
    }

    /// A trace context is one more text entry, after the others, and reads
    /// back whole, alone or with every other part of an ext; an item
    /// without one packs to the same bytes as before traces existed.
    #[test]
    fn trace_contexts() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let names = names_of(b"volume_cm3;weight_g");
        let alone = packed(&traced(item(&[], None, 0)), &BTreeMap::new());
        assert_eq!(alone.len(), 62);
        assert_eq!(
            &alone[10..],
            b"t4bf92f3577b34da6a3ce929d0e0e473600f067aa0ba902b701|"
        );
        for original in [
            traced(item(&[], None, 0)),
            traced(item(&[("weight_g", 1200), ("colli", 2)], Some(9), 3)),
        ] {
            assert_eq!(read(&packed(&original, &cap), &names), original);
        }
        let parcel = item(&[("weight_g", 1200), ("volume_cm3", 50_000)], None, 0);
        assert_eq!(packed(&parcel, &cap).len(), 27);
        let mut out = Item::new("i", "p");
        assert!(parse(b"+\x01\0\0\0\0\0\0\0\0t00|", &[], &mut out).is_err());
    }

    /// Names that do not match the packed values, a cut-off ext, or one
    /// that is not packed, are an error.
    #[test]
    fn mismatches_are_errors() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let ext = packed(&item(&[("weight_g", 1)], None, 0), &cap);
        let mut out = Item::new("i", "p");
        assert!(parse(&ext, &names_of(b"weight_g"), &mut out).is_err());
        assert!(
            parse(
                &ext[..ext.len() - 1],
                &names_of(b"volume_cm3;weight_g"),
                &mut out
            )
            .is_err()
        );
        assert!(parse(b"+\x02\x00|", &[], &mut out).is_err());
        assert!(parse(b"t7;r1", &[], &mut out).is_err());
    }
}
