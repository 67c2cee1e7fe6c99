//! An item's ext, what it carries besides its id and payload (deadline,
//! measures, requeue count), both ways: packed as the add script gets it and
//! a group hash stores it, and read back from a group hash or a batch, in
//! the packed form or the text form older versions wrote. The layout is
//! documented once, in `src/lua/batch_lib.lua`.

use std::collections::BTreeMap;

use crate::batch::{DecodeError, Item};

/// An item's packed ext for a group whose capacity is `capacity`, or empty
/// for an item with nothing but an id and a payload. The usual parcel, with
/// a value of each of the capacity's measures that fits 32 bits and nothing
/// else, gets the short form: `*`, a byte k, then k little-endian u32 values
/// (the capacity's measures in order). Any other item gets the long form:
/// `+`, a byte k, k little-endian doubles (the deadline in ms or 0, then the
/// item's value of each of the capacity's measures in order, -0 for none),
/// the item's other measures (`m<name>=<value>`) and requeue count
/// (`r<count>`) as text joined by `;`, then `|`.
///
/// Measure values are at most 2^53 - 1 (the service checks them), so the
/// doubles hold them exactly. A capacity names at most
/// [`crate::policy::MAX_CAPACITY_MEASURES`] measures, so k fits its byte.
pub(crate) fn packed(item: &Item, capacity: &BTreeMap<String, u64>) -> Vec<u8> {
    if item.deadline_ms.is_none() && item.measures.is_empty() && item.requeue_count == 0 {
        return Vec::new();
    }
    if let Some(short) = short_form(item, capacity) {
        return short;
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
    ext.extend_from_slice(text.join(";").as_bytes());
    ext.push(b'|');
    ext
}

/// The short form of an item's packed ext (see [`packed`]), if it has one:
/// no deadline, no requeue, and of each of the capacity's measures and no
/// other a value that fits 32 bits.
fn short_form(item: &Item, capacity: &BTreeMap<String, u64>) -> Option<Vec<u8>> {
    let plain = item.deadline_ms.is_none() && item.requeue_count == 0;
    if !plain || capacity.is_empty() || item.measures.len() != capacity.len() {
        return None;
    }
    let mut ext = Vec::with_capacity(2 + 4 * capacity.len());
    ext.push(b'*');
    ext.push(u8::try_from(capacity.len()).ok()?);
    for name in capacity.keys() {
        let value = u32::try_from(*item.measures.get(name)?).ok()?;
        ext.extend_from_slice(&value.to_le_bytes());
    }
    Some(ext)
}

/// The length of the packed ext that `value` (a group hash item's value, or
/// a batch's ext) starts with, if it starts with one: the short form's is
/// fixed by its k, the long form's runs to its `|`.
pub(crate) fn packed_len(value: &[u8]) -> Option<usize> {
    match value {
        [b'*', k, ..] => Some(2 + 4 * usize::from(*k)).filter(|len| *len <= value.len()),
        [b'+', k, ..] => (2 + 8 * usize::from(*k)..value.len())
            .find(|at| value[*at] == b'|')
            .map(|bar| bar + 1),
        _ => None,
    }
}

/// The measure names a group's capacity field names: the field is `=`
/// then the names joined by `;` (a batch's `names` field is the same).
pub(crate) fn names_of(field: &[u8]) -> Vec<String> {
    let names = field.strip_prefix(b"=").unwrap_or(field);
    String::from_utf8_lossy(names)
        .split(';')
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Reads an item's ext into `item`. `names` names the measures of a packed
/// ext's values after its deadline, in order.
pub(crate) fn parse(ext: &[u8], names: &[String], item: &mut Item) -> Result<(), DecodeError> {
    match ext.split_first() {
        Some((b'+', body)) => parse_packed(body, names, item),
        Some((b'*', body)) => parse_short(body, names, item),
        _ => parse_text(ext, item),
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

/// Reads a short packed ext after its `*`.
fn parse_short(body: &[u8], names: &[String], item: &mut Item) -> Result<(), DecodeError> {
    let bad = |why: &str| DecodeError(format!("short packed item ext: {why}"));
    let (&k, values) = body.split_first().ok_or_else(|| bad("empty"))?;
    if values.len() != 4 * usize::from(k) {
        return Err(bad("truncated"));
    }
    if names.len() != usize::from(k) {
        return Err(bad(&format!(
            "{k} measure values, but {} names for them",
            names.len()
        )));
    }
    for (name, bytes) in names.iter().zip(values.chunks_exact(4)) {
        let value = u32::from_le_bytes(bytes.try_into().unwrap_or_default());
        item.measures.insert(name.clone(), u64::from(value));
    }
    Ok(())
}

/// Reads a text ext (`r<requeue count>`, `t<deadline ms>`,
/// `m<name>=<value>`, joined by `;`) into `item`.
fn parse_text(ext: &[u8], item: &mut Item) -> Result<(), DecodeError> {
    let ext = std::str::from_utf8(ext).map_err(|_| DecodeError("ext: not UTF-8".into()))?;
    let bad = || DecodeError(format!("bad item ext {ext:?}"));
    for field in ext.split(';').filter(|f| !f.is_empty()) {
        let (kind, value) = field.split_at(1);
        match kind {
            "r" => item.requeue_count = value.parse().map_err(|_| bad())?,
            "t" => item.deadline_ms = Some(value.parse().map_err(|_| bad())?),
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

/// Decodes the `x` blob of a batch (the items' exts, each as
/// `<length>:<ext>`, in item order) into its items; an empty blob is none.
/// `names`: see [`parse`].
pub(crate) fn decode_all(
    mut blob: &[u8],
    names: &[String],
    items: &mut [Item],
) -> Result<(), DecodeError> {
    if blob.is_empty() {
        return Ok(());
    }
    for item in items.iter_mut() {
        parse(crate::batch::take(&mut blob, "ext")?, names, item)?;
    }
    if !blob.is_empty() {
        return Err(DecodeError("ext blob: more exts than items".into()));
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

    /// A long packed ext reads back whole: the deadline, the capacity's
    /// measures (a measure of 0 kept, a missing one left out), the other
    /// measures and the requeue count.
    #[test]
    fn packed_round_trip() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let names = names_of(b"=volume_cm3;weight_g");
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
            assert_eq!(packed_len(&[&ext[..], b"12,p"].concat()), Some(ext.len()));
            assert_eq!(read(&ext, &names), original);
        }
        assert!(packed(&item(&[], None, 0), &cap).is_empty());
    }

    /// A parcel with every capacity measure, each under 2^32, and nothing
    /// else packs short and reads back whole, 0 and 2^32 - 1 included.
    #[test]
    fn short_round_trip() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let names = names_of(b"=volume_cm3;weight_g");
        for original in [
            item(&[("weight_g", 1200), ("volume_cm3", 50_000)], None, 0),
            item(
                &[("weight_g", 0), ("volume_cm3", u64::from(u32::MAX))],
                None,
                0,
            ),
        ] {
            let ext = packed(&original, &cap);
            assert_eq!(&ext[..2], &[b'*', 2]);
            assert_eq!(packed_len(&[&ext[..], b"12,p"].concat()), Some(ext.len()));
            assert_eq!(read(&ext, &names), original);
        }
    }

    /// A parcel's packed ext is 10 bytes (27 with a deadline), so that with
    /// a seq and a 32-byte payload its group hash value stays within Redis's
    /// 64-byte listpack limit.
    #[test]
    fn a_parcel_packs_small() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let mut parcel = item(&[("weight_g", 1200), ("volume_cm3", 50_000)], None, 0);
        assert_eq!(packed(&parcel, &cap).len(), 10);
        parcel.deadline_ms = Some(1);
        assert_eq!(packed(&parcel, &cap).len(), 27);
    }

    /// Without a capacity every measure is text; text exts of older
    /// versions still read.
    #[test]
    fn text_measures_and_old_exts() {
        let original = item(&[("weight_g", 1200)], Some(7), 1);
        let ext = packed(&original, &BTreeMap::new());
        assert_eq!(&ext[10..], b"mweight_g=1200;r1|");
        assert_eq!(read(&ext, &[]), original);
        assert_eq!(read(b"t7;mweight_g=1200;r1", &[]), original);
    }

    /// Names that do not match the packed values, or a cut-off ext, are an error.
    #[test]
    fn mismatches_are_errors() {
        let cap = capacity(&["volume_cm3", "weight_g"]);
        let ext = packed(&item(&[("weight_g", 1)], None, 0), &cap);
        let mut out = Item::new("i", "p");
        assert!(parse(&ext, &names_of(b"=weight_g"), &mut out).is_err());
        assert!(
            parse(
                &ext[..ext.len() - 1],
                &names_of(b"=volume_cm3;weight_g"),
                &mut out
            )
            .is_err()
        );
        assert!(parse(b"+\x02\x00|", &[], &mut out).is_err());
        let short = packed(&item(&[("weight_g", 1), ("volume_cm3", 2)], None, 0), &cap);
        assert!(parse(&short, &names_of(b"=weight_g"), &mut out).is_err());
        assert!(
            parse(
                &short[..short.len() - 1],
                &names_of(b"=volume_cm3;weight_g"),
                &mut out
            )
            .is_err()
        );
        assert_eq!(packed_len(&short[..short.len() - 1]), None);
    }
}
