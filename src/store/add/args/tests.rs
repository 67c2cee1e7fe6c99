//! The add function's arguments, as the command gets them.

use super::*;
use crate::policy::Overflow;

/// Items of one key share a group; each distinct policy is packed once,
/// and each group and item lands where the add function reads it, with
/// no ext argument when no item has one: the groups given one item
/// first (the lead, counted in the header), and the order says which
/// item each reply is to.
#[test]
fn lays_out_policies_groups_then_items() {
    let keyspace = Keyspace::new("t", 4);
    let policy =
        |max_items, max_bytes| Policy::basic(max_items, Duration::from_millis(250), max_bytes);
    let mut args = AddArgs::new(&keyspace, 2, Duration::from_secs(60));
    args.item("a", &policy(10, None), b"1", b"x")
        .item("b", &policy(5, Some(64)), b"2", b"")
        .item("c", &policy(10, None), b"3", b"y")
        .item("a", &policy(99, None), b"4", b"z");
    let (keys, argv, order) = parts(args);
    assert_eq!(
        keys,
        ["due", "batches", "flushed", "open", "g:b", "g:c", "g:a"]
            .map(|k| format!("{}:{k}", keyspace.tag(2)))
    );
    assert_eq!(header(&argv[0]), [60000.0, 2.0, 3.0, 3.0, 2.0]);
    // Each 14 doubles: no capacity, no scope, no measure names.
    let policies = policies(&argv[0]);
    assert_eq!(
        policies.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [112, 112]
    );
    let first = policies[0].chunks_exact(8).next().unwrap();
    assert_eq!(f64::from_le_bytes(first.try_into().unwrap()), 10.0);
    assert_eq!(
        texts(&argv[1..]),
        [
            "b", "2", "c", "1", "a", "1", "1", "2", "", "2", "3", "y", "3", "1", "x", "3", "4", "z"
        ]
    );
    assert_eq!(order, [1, 2, 0, 3]);

    // Under a limit on open groups, the order of the groups is theirs.
    let mut args = AddArgs::new(&keyspace, 2, Duration::from_secs(60)).with_open_limit(8);
    args.item("a", &policy(10, None), b"1", b"x")
        .item("b", &policy(10, None), b"2", b"")
        .item("a", &policy(10, None), b"3", b"y");
    let (keys, argv, order) = parts(args);
    assert_eq!(
        &keys[4..],
        [
            format!("{}:g:a", keyspace.tag(2)),
            format!("{}:g:b", keyspace.tag(2))
        ]
    );
    assert_eq!(header(&argv[0]), [60000.0, 1.0, 2.0, 3.0, 0.0]);
    assert!(order.is_empty(), "no item moved");
}

/// A call of one group, or of one item per group, and no flags or exts
/// sends each item as its id and payload alone; a requeued item brings
/// its group number with its flags, its ext, and the requeued set as
/// the last key.
#[test]
fn leaves_out_what_no_item_of_the_call_has() {
    let keyspace = Keyspace::new("t", 4);
    let policy = Policy::basic(10, Duration::from_secs(1), None);
    let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
    args.item("a", &policy, b"1", b"x")
        .item("a", &policy, b"2", b"y");
    let (keys, argv, _) = parts(args);
    assert_eq!(keys.len(), 5);
    assert_eq!(header(&argv[0]), [5000.0, 1.0, 1.0, -2.0, 0.0]);
    assert_eq!(texts(&argv[1..]), ["a", "1", "x", "2", "y"]);

    // One item per group: no group numbers either, and an ext when one
    // item has one.
    let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
    args.item("a", &policy, b"1", b"x")
        .item("b", &policy, b"2", b"y");
    let (_, argv, _) = parts(args);
    assert_eq!(header(&argv[0]), [5000.0, 1.0, 2.0, -2.0, 0.0]);
    assert_eq!(texts(&argv[1..]), ["a", "b", "1", "x", "2", "y"]);
    let dated = Item {
        id: b"2".to_vec(),
        payload: b"y".to_vec(),
        deadline_ms: Some(1),
        ..Item::default()
    };
    let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
    args.item("a", &policy, b"1", b"x")
        .item_with("b", &policy, &dated, false, None);
    let (_, argv, _) = parts(args);
    assert_eq!(header(&argv[0]), [5000.0, 1.0, 2.0, -3.0, 0.0]);
    assert_eq!(texts(&argv[1..6]), ["a", "b", "1", "x", ""]);
    assert_eq!((&argv[6][..], &argv[7][..]), (&b"2"[..], &b"y"[..]));
    assert!(!argv[8].is_empty(), "the dated item's ext");

    let item = Item {
        id: b"3".to_vec(),
        payload: b"z".to_vec(),
        requeue_count: 1,
        ..Item::default()
    };
    let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
    args.item_with("a", &policy, &item, true, Some("7-0-b"));
    let (keys, argv, _) = parts(args);
    assert_eq!(
        keys.last().unwrap(),
        &format!("{}:requeued", keyspace.tag(1))
    );
    assert_eq!(header(&argv[0]), [5000.0, 1.0, 1.0, 4.0, 0.0]);
    assert_eq!(&texts(&argv[1..4]), &["a", "1cq7-0-b", "3"]);
    assert_eq!(argv[4], b"z");
    assert!(
        !argv[5].is_empty(),
        "a requeued item's ext holds its requeue count"
    );
}

/// The call's keys, arguments and order, as the command gets them.
fn parts(args: AddArgs) -> (Vec<String>, Vec<Vec<u8>>, Vec<usize>) {
    let call = args.finish();
    let (mut keys, mut argv) = (Vec::<Vec<u8>>::new(), Vec::new());
    call.write_keys(&mut keys);
    call.write_args(&mut argv);
    assert_eq!(
        (keys.len(), argv.len()),
        (call.key_count(), call.arg_count())
    );
    let keys = keys
        .into_iter()
        .map(|k| String::from_utf8(k).unwrap())
        .collect();
    (keys, argv, call.order().to_vec())
}

/// The header's five numbers.
fn header(arg: &[u8]) -> Vec<f64> {
    arg.chunks_exact(8)
        .take(5)
        .map(|d| f64::from_le_bytes(d.try_into().unwrap()))
        .collect()
}

/// The policies the header packs, by the lengths after its numbers.
fn policies(arg: &[u8]) -> Vec<&[u8]> {
    let count = header(arg)[1] as usize;
    let mut at = 8 * (5 + count);
    (0..count)
        .map(|j| {
            let len = f64::from_le_bytes(arg[8 * (5 + j)..][..8].try_into().unwrap());
            let packed = &arg[at..at + len as usize];
            at += len as usize;
            packed
        })
        .collect()
}

fn texts(args: &[Vec<u8>]) -> Vec<&str> {
    args.iter()
        .map(|a| std::str::from_utf8(a).unwrap())
        .collect()
}

/// A policy under limits on open groups packs each shard's part of
/// them (rounded up), its overflow and its scope, before its measure
/// names; one without its own limit packs no scope.
#[test]
fn packs_the_limits_on_open_groups() {
    let keyspace = Keyspace::new("t", 4);
    let mut policy = Policy::basic(10, Duration::from_secs(1), None);
    policy.max_groups = 10;
    policy.overflow = Overflow::FlushOldest;
    policy.scope = Some("kscan-*".into());
    let mut args = AddArgs::new(&keyspace, 0, Duration::from_secs(60)).with_open_limit(9);
    args.item("scan-1", &policy, b"1", b"x");
    let (_, argv, _) = parts(args);
    let packed = policies(&argv[0])[0];
    let double = |slot: PolicySlot| {
        let at = 8 * slot as usize;
        f64::from_le_bytes(packed[at..at + 8].try_into().unwrap())
    };
    use PolicySlot::{MaxGroups, MaxOpenGroups, Overflow as OverflowSlot, ScopeLength};
    assert_eq!(
        (
            double(MaxGroups),
            double(MaxOpenGroups),
            double(OverflowSlot),
            double(ScopeLength)
        ),
        (3.0, 3.0, 1.0, 7.0)
    );
    assert_eq!(&packed[8 * PolicySlot::ALL.len()..], b"kscan-*");

    policy.scope = None;
    let mut args = AddArgs::new(&keyspace, 0, Duration::from_secs(60));
    args.item("scan-1", &policy, b"1", b"x");
    let (_, argv, _) = parts(args);
    let packed = policies(&argv[0])[0];
    let double = |slot: PolicySlot| {
        let at = 8 * slot as usize;
        f64::from_le_bytes(packed[at..at + 8].try_into().unwrap())
    };
    assert_eq!(
        (
            double(MaxGroups),
            double(MaxOpenGroups),
            double(ScopeLength)
        ),
        (0.0, 0.0, 0.0)
    );
    assert_eq!(packed.len(), 8 * PolicySlot::ALL.len());
}
