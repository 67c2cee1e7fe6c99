//! Paging of the listings (AIP-158): ListDeadLetters walks every dead letter
//! once, in order, through its page tokens; a page size over the maximum is
//! read as the maximum.

use std::collections::BTreeSet;

use crate::support::{RedisServer, Service, add, config, eventually, next_batch};
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;

/// Every add flushes; a batch delivered once and not acked within 300 ms is
/// dead-lettered.
const DEAD_AT_ONCE: &str = "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n\
    [subscriptions]\nack_timeout = \"300ms\"\nmax_deliveries = 1\n";

/// One page of group `g`'s dead letters.
async fn dead_page(
    client: &mut BatcherClient<Channel>,
    page_size: i32,
    page_token: String,
) -> pb::ListDeadLettersResponse {
    let request = pb::ListDeadLettersRequest {
        consumer_group: "g".into(),
        page_size,
        page_token,
    };
    client
        .list_dead_letters(request)
        .await
        .unwrap()
        .into_inner()
}

fn ids(batches: &[pb::Batch]) -> Vec<String> {
    batches.iter().map(|b| b.id.clone()).collect()
}

/// Pages of 2 walk seven dead letters spread over the shards exactly once,
/// oldest first, and the last page ends the listing with an empty token.
#[tokio::test]
async fn dead_letters_page_through_every_shard() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), DEAD_AT_ONCE)).await;
    let mut client = service.client().await;
    let request = pb::SubscribeRequest {
        consumer_group: "g".into(),
        consumer: "c".into(),
        ..Default::default()
    };
    let mut stream = client.subscribe(request).await.unwrap().into_inner();
    let items = (0..7)
        .map(|i| add(&format!("area-{i}"), "p", b""))
        .collect();
    client.add_many(pb::AddManyRequest { items }).await.unwrap();
    let mut delivered = BTreeSet::new();
    while delivered.len() < 7 {
        delivered.insert(next_batch(&mut stream).await.id);
    }
    let all = eventually("all seven batches to be dead-lettered", || {
        let mut client = client.clone();
        async move {
            let page = dead_page(&mut client, 0, String::new()).await;
            (page.batches.len() == 7).then_some(page)
        }
    })
    .await;
    assert!(all.next_page_token.is_empty(), "one page holds all seven");
    let all = ids(&all.batches);

    let (mut walked, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = dead_page(&mut client, 2, token).await;
        assert!(page.batches.len() <= 2, "a page holds at most page_size");
        walked.extend(ids(&page.batches));
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(walked, all, "the pages walk the listing once, in order");
    assert_eq!(pages, 4);
    assert_eq!(walked.iter().cloned().collect::<BTreeSet<_>>(), delivered);

    // Over the maximum is not refused (that it is read as the maximum is
    // `page_size`'s unit test, and ListGroups' below, with more groups).
    let over = dead_page(&mut client, 5000, String::new()).await;
    assert_eq!(ids(&over.batches), all, "page_size 5000 is not refused");
    service.stop().await;
}

/// A ListGroups page size over the maximum is read as the maximum, not
/// refused: with one group more than the maximum open, a page asked for
/// with `i32::MAX` holds exactly the maximum and points to the last one.
#[tokio::test]
async fn list_groups_clamps_a_large_page_size() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let mut client = service.client().await;
    let max = batcher::service::MAX_PAGE_SIZE as usize;
    let keys: Vec<String> = (0..=max).map(|i| format!("area-{i}")).collect();
    for chunk in keys.chunks(100) {
        let items = chunk.iter().map(|k| add(k, "p", b"")).collect();
        client.add_many(pb::AddManyRequest { items }).await.unwrap();
    }
    let request = pb::ListGroupsRequest {
        page_size: i32::MAX,
        ..Default::default()
    };
    let page = client.list_groups(request).await.unwrap().into_inner();
    assert_eq!(page.groups.len(), max, "a page holds the maximum");
    assert!(!page.next_page_token.is_empty(), "one group is left");
    let request = pb::ListGroupsRequest {
        page_size: i32::MAX,
        page_token: page.next_page_token,
        ..Default::default()
    };
    let last = client.list_groups(request).await.unwrap().into_inner();
    assert_eq!(last.groups.len(), 1);
    assert!(last.next_page_token.is_empty());
    service.stop().await;
}
