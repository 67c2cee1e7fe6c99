//! Wall-clock cutoffs and minimum loads against a real Redis: a cutoff a few
//! seconds ahead, as HH:MM:SS in a non-UTC zone, makes the group due then
//! (CUTOFF) and an add after it opens the next wave's group; min_items holds
//! a small group at TIMEOUT until max_age or a cutoff, and lets it go as
//! soon as an add brings it to min_items.

use crate::support::policy::{
    Client, clock_past, cutoff_ahead, due_reason, group, held, ids, ms, now_ms, reason, shifted,
    start, subscribe_all, weighed,
};
use crate::support::{RedisServer, Service, config, next_batch, wait_for_first_sweeps};
use batcher::pb;
use pb::FlushReason;

/// An hour in ms.
const HOUR: i64 = 3_600_000;
/// How late after its due time a flush may come on a busy machine.
const LATE_MS: i64 = 1500;

/// Config for `wave-*` keys: departures at `cut` and 12 hours later, local
/// time in `zone`, and a wait window (24 h) that never comes first.
fn waves(cut: &str, zone: &str) -> String {
    format!(
        "[defaults]\nmax_items = 100\nmax_wait = \"24h\"\n\
         [keys.\"wave-*\"]\ncutoffs = [\"{}\", \"{cut}\"]\ntimezone = \"{zone}\"\n",
        shifted(cut, 12)
    )
}

/// Adds `id` under `key`, which must be accepted.
async fn added(client: &mut Client, key: &str, id: &str) -> pb::AddResponse {
    let resp = client.add(weighed(key, id, &[])).await.expect("add");
    let resp = resp.into_inner();
    assert_eq!(resp.outcome, pb::AddOutcome::Added as i32, "{resp:?}");
    resp
}

/// Checks that `wave-1`'s open group is the next wave's, holding `b`: due
/// at the departure 12 hours (give or take a DST hour) after the cutoff `at`.
async fn assert_next_wave(client: &mut Client, at: i64) {
    let next = group(client, "wave-1").await.expect("the next wave");
    assert_eq!(ids(&next.items), ["b"]);
    assert_eq!(due_reason(&next), FlushReason::Cutoff, "{next:?}");
    let ahead = ms(&next.due_at) - at;
    assert!((11 * HOUR..=13 * HOUR).contains(&ahead), "{ahead} ms");
}

/// Asserts that `batch` was flushed at the cutoff `at`, not before and not
/// more than LATE_MS after.
fn assert_flushed_at_cutoff(batch: &pb::Batch, at: i64) {
    let late = ms(&batch.flushed_at) - at;
    assert!(
        (0..LATE_MS).contains(&late),
        "flushed {late} ms after the cutoff"
    );
}

/// A cutoff 8-9 s ahead, given as HH:MM:SS in Asia/Kolkata, makes the group
/// due then (GetGroup: CUTOFF), and it flushes with CUTOFF at the cutoff,
/// not before; an item added after it opens the next wave's group.
#[tokio::test]
async fn a_cutoff_in_a_non_utc_zone_flushes_the_group_at_the_cutoff() {
    let (cut, at) = cutoff_ahead("Asia/Kolkata", 8);
    let (_redis, service, mut client) = start(&waves(&cut, "Asia/Kolkata")).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "wave-1", "a").await;
    let open = group(&mut client, "wave-1").await.expect("open");
    assert!(ms(&open.opened_at) < at, "the setup took past the cutoff");
    assert_eq!(due_reason(&open), FlushReason::Cutoff);
    assert_eq!(ms(&open.due_at), at, "cutoff {cut} in Asia/Kolkata");

    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Cutoff);
    assert_eq!(ids(&batch.items), ["a"]);
    assert_flushed_at_cutoff(&batch, at);

    added(&mut client, "wave-1", "b").await;
    assert_next_wave(&mut client, at).await;
    service.stop().await;
}

/// An add that comes after the cutoff of a group no sweeper has flushed yet
/// flushes that group first (CUTOFF, in the add's batches), and the item
/// opens the next wave's group.
#[tokio::test]
async fn an_add_after_the_cutoff_flushes_the_unswept_group_first() {
    let zone = "America/New_York";
    let (cut, at) = cutoff_ahead(zone, 9);
    let redis = RedisServer::start();
    let extra = format!("{}\n[sweeper]\nmax_sleep = \"60s\"\n", waves(&cut, zone));
    let cfg = config(&redis.url(), &extra);
    // Its sweepers scan once, find nothing, and sleep for max_sleep.
    let later = Service::start(cfg.clone()).await;
    wait_for_first_sweeps(&redis).await;
    let opener = Service::start(cfg).await;
    added(&mut opener.client().await, "wave-1", "a").await;
    // Stopped, the opener cannot sweep the group it opened.
    opener.stop().await;

    let mut client = later.client().await;
    let open = group(&mut client, "wave-1").await.expect("open");
    assert_eq!(
        (due_reason(&open), ms(&open.due_at)),
        (FlushReason::Cutoff, at)
    );
    clock_past(at + 200).await;
    let open = group(&mut client, "wave-1").await;
    assert!(open.is_some(), "swept already: the test needs it unswept");

    let resp = added(&mut client, "wave-1", "b").await;
    let reasons: Vec<_> = resp.batches.iter().map(reason).collect();
    assert_eq!(reasons, [FlushReason::Cutoff], "{resp:?}");
    assert_eq!(ids(&resp.batches[0].items), ["a"]);
    assert_eq!(resp.group_size, 1);
    assert_next_wave(&mut client, at).await;
    later.stop().await;
}

/// min_items with max_age: TIMEOUT on a too-small group holds it open,
/// re-armed to opened + max_age (MAX_AGE), and then it flushes with MAX_AGE.
/// (max_wait is 3 s so that the group is read before its TIMEOUT on a busy
/// machine.)
#[tokio::test]
async fn min_items_holds_a_small_group_until_max_age() {
    let extra = "[defaults]\nmax_items = 100\nmax_wait = \"3s\"\nmin_items = 3\nmax_age = \"6s\"\n";
    let (_redis, service, mut client) = start(extra).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "k", "a").await;
    added(&mut client, "k", "b").await;
    let open = group(&mut client, "k").await.expect("open");
    let opened = ms(&open.opened_at);
    assert_eq!(
        (due_reason(&open), ms(&open.due_at)),
        (FlushReason::Timeout, opened + 3000)
    );

    let hold = held(&client, "k", FlushReason::MaxAge).await;
    assert_eq!((hold.size, ms(&hold.due_at)), (2, opened + 6000));
    assert!(now_ms() >= opened + 3000, "held before its TIMEOUT");

    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::MaxAge);
    assert_eq!(ids(&batch.items), ["a", "b"]);
    let late = ms(&batch.flushed_at) - (opened + 6000);
    assert!(
        (0..LATE_MS).contains(&late),
        "flushed {late} ms after max_age"
    );
    service.stop().await;
}

/// min_items with a cutoff: the TIMEOUT hold is re-armed to the cutoff
/// (given as HH:MM:SS in America/New_York), where it flushes with CUTOFF.
/// (max_wait is 3 s so that the group is read before its TIMEOUT on a busy
/// machine, and the cutoff well after it.)
#[tokio::test]
async fn min_items_with_a_cutoff_holds_until_the_cutoff() {
    let zone = "America/New_York";
    let (cut, at) = cutoff_ahead(zone, 12);
    let extra = format!(
        "[defaults]\nmax_items = 100\nmax_wait = \"3s\"\nmin_items = 3\nmax_age = \"1h\"\n\
         cutoffs = [\"{cut}\"]\ntimezone = \"{zone}\"\n"
    );
    let (_redis, service, mut client) = start(&extra).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "k", "a").await;
    let open = group(&mut client, "k").await.expect("open");
    assert!(ms(&open.opened_at) + 3000 < at, "the setup took too long");
    assert_eq!(due_reason(&open), FlushReason::Timeout);

    let hold = held(&client, "k", FlushReason::Cutoff).await;
    assert_eq!((hold.size, ms(&hold.due_at)), (1, at));

    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Cutoff);
    assert_eq!(ids(&batch.items), ["a"]);
    assert_flushed_at_cutoff(&batch, at);
    service.stop().await;
}

/// A held group that an add brings to min_items becomes due at once and
/// flushes (TIMEOUT) within moments, long before max_age.
#[tokio::test]
async fn a_held_group_reaching_min_items_flushes_at_once() {
    let extra = "[defaults]\nmax_items = 100\nmax_wait = \"1s\"\nmin_items = 3\nmax_age = \"1h\"\n";
    let (_redis, service, mut client) = start(extra).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "k", "a").await;
    added(&mut client, "k", "b").await;
    let hold = held(&client, "k", FlushReason::MaxAge).await;
    assert_eq!(ms(&hold.due_at), ms(&hold.opened_at) + HOUR);

    let third_at = now_ms();
    added(&mut client, "k", "c").await;
    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Timeout);
    assert_eq!(ids(&batch.items), ["a", "b", "c"]);
    let after = ms(&batch.flushed_at) - third_at;
    assert!(after < 2000, "flushed {after} ms after the third add");
    assert!(group(&mut client, "k").await.is_none());
    service.stop().await;
}
