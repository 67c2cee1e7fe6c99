//! Requests that are not valid protobuf: they are bad input like any other,
//! INVALID_ARGUMENT naming the field, and nothing is written.

use crate::support;

use crate::support::{RedisServer, Service, assert_invalid, config};
use batcher::pb;
use tonic::codegen::http::uri::PathAndQuery;

/// `Item` with `id` as bytes, so that a test can send an id that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawItem {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    payload: Vec<u8>,
}

/// `AddRequest` over [`RawItem`].
#[derive(Clone, PartialEq, prost::Message)]
struct RawAdd {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    item: Option<RawItem>,
}

/// An item id that is not UTF-8 is INVALID_ARGUMENT naming `item.id`, not
/// INTERNAL, and the service stays up and writes nothing.
#[tokio::test]
async fn an_id_that_is_not_utf8_is_invalid_argument() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let mut client = service.client().await;

    let channel = support::channel(service.addr);
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let request = RawAdd {
        key: "k".into(),
        item: Some(RawItem {
            id: vec![b'a', 0xff, 0xfe],
            payload: b"p".to_vec(),
        }),
    };
    let codec = tonic_prost::ProstCodec::<RawAdd, pb::AddResponse>::default();
    let path = PathAndQuery::from_static("/batcher.v1.Batcher/Add");
    let status = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await
        .unwrap_err();
    assert_invalid(&status, "item.id");
    assert!(status.message().contains("UTF-8"), "{status:?}");
    assert_eq!(redis.data_keys(), "0", "nothing was written");

    // The service goes on serving well-formed requests.
    let ok = client.add(support::add("k", "a", b"p")).await.unwrap();
    assert_eq!(ok.into_inner().group_size, 1);
    service.stop().await;
}
