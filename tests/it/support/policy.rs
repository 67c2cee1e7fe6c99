//! Helpers for the logistics-policy tests: adds with measures, deadlines and
//! close_group, times in ms, group reads, subscriptions, and cutoffs a few
//! seconds ahead in a time zone.

use std::time::{SystemTime, UNIX_EPOCH};

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;

use super::{RedisServer, Service, add, config, eventually};

/// A connected client.
pub type Client = BatcherClient<Channel>;

/// An add under `key` of item `id` (payload = id) carrying `measures`.
pub fn weighed(key: &str, id: &str, measures: &[(&str, u64)]) -> pb::AddRequest {
    let mut req = add(key, id, id.as_bytes());
    let item = req.item.as_mut().expect("add builds an item");
    item.measures = measures.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    req
}

/// `req` with its item's deadline at `at_ms` (ms since the Unix epoch).
pub fn due_by(mut req: pb::AddRequest, at_ms: i64) -> pb::AddRequest {
    req.item.as_mut().expect("an item").deadline = Some(ts(at_ms));
    req
}

/// `req` with close_group set.
pub fn closing(mut req: pb::AddRequest) -> pb::AddRequest {
    req.close_group = true;
    req
}

/// A timestamp at `ms` since the Unix epoch.
pub fn ts(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A timestamp in ms since the Unix epoch.
pub fn ms(at: &Option<prost_types::Timestamp>) -> i64 {
    let at = at.as_ref().expect("a timestamp");
    at.seconds * 1000 + i64::from(at.nanos) / 1_000_000
}

/// This host's clock in ms since the Unix epoch (the tests' Redis runs on
/// this host, so it is Redis's clock too).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// Waits until this host's clock has passed `at_ms`: for a test that must
/// act after a due time (the event is the clock passing it).
pub async fn clock_past(at_ms: i64) {
    eventually(&format!("the clock to pass {at_ms}"), || async move {
        (now_ms() > at_ms).then_some(())
    })
    .await;
}

/// A Redis and the service on it with `extra` config, and a client.
pub async fn start(extra: &str) -> (RedisServer, Service, Client) {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), extra)).await;
    let client = service.client().await;
    (redis, service, client)
}

/// A live subscription to every key, from now on.
pub async fn subscribe_all(client: &mut Client) -> tonic::Streaming<pb::Batch> {
    client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .expect("subscribe")
        .into_inner()
}

/// The open group of `key`, if any.
pub async fn group(client: &mut Client, key: &str) -> Option<pb::Group> {
    let req = pb::GetGroupRequest { key: key.into() };
    client
        .get_group(req)
        .await
        .expect("GetGroup")
        .into_inner()
        .group
}

/// Waits until the open group of `key` has `reason` as its due_reason;
/// panics at once if the group is gone (flushed instead of held).
pub async fn held(client: &Client, key: &str, reason: pb::FlushReason) -> pb::Group {
    eventually(
        &format!("the group of {key} to be due by {reason:?}"),
        || {
            let mut client = client.clone();
            async move {
                let found = group(&mut client, key).await;
                let found = found.unwrap_or_else(|| panic!("the group of {key} was flushed"));
                (found.due_reason == reason as i32).then_some(found)
            }
        },
    )
    .await
}

/// The item ids of a batch (or group), as strings, in order.
pub fn ids(items: &[pb::Item]) -> Vec<String> {
    items.iter().map(|i| i.id.clone()).collect()
}

/// The reason of a batch, decoded, for readable assertions.
pub fn reason(batch: &pb::Batch) -> pb::FlushReason {
    pb::FlushReason::try_from(batch.reason).expect("a known reason")
}

/// The due reason of a group, decoded.
pub fn due_reason(group: &pb::Group) -> pb::FlushReason {
    pb::FlushReason::try_from(group.due_reason).expect("a known reason")
}

/// A cutoff `secs_ahead` to `secs_ahead + 1` seconds from now, on a whole
/// second: its local wall-clock time in `zone` as HH:MM:SS, and the instant
/// in ms. Near midnight the local time wraps to the next day, which is still
/// the first cutoff after now.
pub fn cutoff_ahead(zone: &str, secs_ahead: i64) -> (String, i64) {
    let second = now_ms().div_euclid(1000) + 1 + secs_ahead;
    let tz = jiff::tz::TimeZone::get(zone).expect("a known time zone");
    let local = jiff::Timestamp::from_second(second)
        .expect("a valid time")
        .to_zoned(tz);
    (local.strftime("%H:%M:%S").to_string(), second * 1000)
}

/// `hh_mm_ss` moved by `hours` (wrapping around the day), for a second
/// cutoff far from the first.
pub fn shifted(hh_mm_ss: &str, hours: i64) -> String {
    let hour: i64 = hh_mm_ss[..2].parse().expect("HH");
    format!("{:02}{}", (hour + hours).rem_euclid(24), &hh_mm_ss[2..])
}

/// Waits until no group is open, so every accepted item is in a batch.
pub async fn all_flushed(client: &Client) {
    eventually("every group to flush", || {
        let mut client = client.clone();
        async move {
            let first = pb::ListGroupsRequest {
                page_size: 1,
                ..Default::default()
            };
            let page = client.list_groups(first).await.ok()?.into_inner();
            // A page can come back empty while groups remain (its group
            // flushed between the scan and the read): only an empty page
            // with no next page means none is open.
            (page.groups.is_empty() && page.next_page_token.is_empty()).then_some(())
        }
    })
    .await;
}
