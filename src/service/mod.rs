//! The gRPC API: the `batcher.v1.Batcher` handlers. Request validation is
//! in `checks`, the mapping between protobuf and domain types in `convert`;
//! the one place that decides gRPC status codes (with AIP-193 error
//! details) is `crate::error`, below this layer and `auth`. `deadline` wraps the whole service, giving every
//! call one deadline. `adds` holds the add path's part (validation,
//! results, refusals, trace contexts), `requeue` Requeue's body.

mod adds;
mod checks;
pub mod codec;
mod convert;
mod deadline;
mod policies;
mod requeue;

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use self::adds::{Field, traced_items, unary_outcome};
use self::checks::{
    dead_letter_token, page_after, page_size, page_token, parse_dead_letter_token, parse_page_token,
};
pub use self::convert::batch_to_pb;
use self::convert::group_to_pb;
pub use self::deadline::Deadlines;
use crate::auth::Caller;
use crate::batch::{self, FlushReason, Group};
use crate::config::{Limits, SubscriptionsConfig};
use crate::error::{Error, invalid};
use crate::pb;
use crate::policy::PolicyHandle;
use crate::policy_store::PolicyStore;
use crate::store::{Deadline, OpenLimits, Store, StoreError};
use crate::subscribers::{Cursor, Delivery, Durable, Filter, Hub};
use crate::sweeper::SweeperHandle;
use crate::telemetry::{self, AddSpan};

/// Largest page of ListGroups and ListDeadLetters; a larger `page_size` is
/// read as this.
pub const MAX_PAGE_SIZE: i32 = 1000;
/// Page size of ListGroups and ListDeadLetters when the request leaves it 0.
pub const DEFAULT_PAGE_SIZE: i32 = 100;

/// The `batcher.v1.Batcher` service.
#[derive(Clone)]
pub struct BatcherService {
    store: Store,
    policies: PolicyHandle,
    limits: Limits,
    subscriptions: SubscriptionsConfig,
    sweeper: SweeperHandle,
    hub: Hub,
    /// One permit per subscription this instance may still serve (`[limits]
    /// max_subscribers`); each stream holds one until it is dropped.
    subscribers: Arc<Semaphore>,
    /// The policy store, when `[policy_store]` is on.
    policy_store: Option<PolicyStore>,
}

/// The status that ends a subscription stream: UNAVAILABLE, saying how to
/// go on elsewhere.
fn stream_ended(durable: bool) -> Status {
    let how = match durable {
        true => {
            "subscribe again (on another instance) as the same consumer: the batches it held unacked were released to its group"
        }
        false => {
            "subscribe again (on another instance) with `after` set to the cursor of the last batch received, to resume where it stopped"
        }
    };
    Status::unavailable(format!("this instance is shutting down; {how}"))
}

/// Longest consumer group or consumer name.
pub const MAX_NAME_BYTES: usize = 64;

impl BatcherService {
    pub fn new(
        store: Store,
        policies: PolicyHandle,
        limits: Limits,
        subscriptions: SubscriptionsConfig,
        sweeper: SweeperHandle,
        hub: Hub,
    ) -> Self {
        BatcherService {
            store,
            policies,
            limits,
            subscriptions,
            sweeper,
            hub,
            subscribers: Arc::new(Semaphore::new(limits.max_subscribers.get())),
            policy_store: None,
        }
    }

    /// This service with its policies from `store`.
    pub fn with_policy_store(self, store: PolicyStore) -> Self {
        BatcherService {
            policy_store: Some(store),
            ..self
        }
    }

    /// UNAVAILABLE while the policy store (when on) has not been loaded:
    /// no add is judged by policies other than the store's.
    fn policies_loaded(&self) -> Result<(), Error> {
        self.policy_store
            .as_ref()
            .map_or(Ok(()), PolicyStore::check_loaded)
    }

    /// The policy store, or FAILED_PRECONDITION when it is off.
    fn policy_store(&self) -> Result<&PolicyStore, Error> {
        self.policy_store.as_ref().ok_or_else(|| {
            Error::refused(
                Code::FailedPrecondition,
                "POLICY_STORE_OFF",
                "policies come from the config file: turn [policy_store] enabled on to manage them over the API",
            )
        })
    }

    /// A subscription slot, held by the stream until it ends, or
    /// RESOURCE_EXHAUSTED when all `[limits] max_subscribers` are taken.
    fn subscriber_slot(&self) -> Result<OwnedSemaphorePermit, Error> {
        self.subscribers.clone().try_acquire_owned().map_err(|_| {
            let max = self.limits.max_subscribers;
            Error::refused(
                Code::ResourceExhausted,
                "TOO_MANY_SUBSCRIBERS",
                format!("this instance serves its limit of {max} subscribers; retry later"),
            )
            .with("limit", max)
        })
    }

    /// Creates or joins a consumer group; returns the group's filter.
    async fn join_group(
        &self,
        req: &pb::SubscribeRequest,
        filter: Filter,
        caller: &Caller,
    ) -> Result<Filter, Error> {
        self.check_name("consumer_group", &req.consumer_group)?;
        self.check_name("consumer", &req.consumer)?;
        if !matches!(req.after.as_str(), "" | "0") {
            return Err(invalid(
                "after",
                "must be \"\" or \"0\" for a consumer group (it starts where the group is)",
            ));
        }
        let definition = match self.store.consumer_group(&req.consumer_group).await? {
            Some(definition) => definition,
            None => {
                self.store
                    .create_consumer_group(
                        &req.consumer_group,
                        &caller.narrow(filter.clone()).encode(),
                        req.after == "0",
                    )
                    .await?
            }
        };
        let defined = Filter::decode(&definition).ok_or_else(|| {
            StoreError::Decode(batch::DecodeError("consumer group definition".into()))
        })?;
        caller.check_stored_filter(&req.consumer_group, &defined)?;
        if !filter.is_empty() && filter.encode() != defined.encode() {
            return Err(invalid(
                "keys",
                "differ from the consumer group's key filters (repeat them or leave keys and key_prefixes empty)",
            ));
        }
        Ok(defined)
    }

    /// The body of a request about one key, once the caller's token may
    /// touch that key and the key is valid (field `key`).
    fn keyed<T>(&self, request: Request<T>, key: impl Fn(&T) -> &String) -> Result<T, Error> {
        Caller::of(&request).check_key(key(request.get_ref()))?;
        let req = request.into_inner();
        self.check_key("key", key(&req))?;
        Ok(req)
    }

    /// An open group for the wire, with the policy its key resolves to now.
    fn group_pb(&self, group: Group) -> pb::Group {
        let policy = self.policies.current().resolve(&group.key);
        group_to_pb(group, &policy)
    }
}

type BatchStream = Pin<Box<dyn Stream<Item = Result<pb::Batch, Status>> + Send>>;

#[tonic::async_trait]
impl pb::batcher_server::Batcher for BatcherService {
    async fn add(
        &self,
        request: Request<pb::AddRequest>,
    ) -> Result<Response<pb::AddResponse>, Status> {
        Caller::of(&request).check_key(&request.get_ref().key)?;
        self.policies_loaded()?;
        let deadline = request.extensions().get::<Deadline>().copied();
        // With tracing on and a traceparent (the request's, or else the
        // metadata's): the call's span, whose context the item keeps.
        let own = &request.get_ref().trace_context;
        let span = AddSpan::of_call(request.metadata(), "Add", own);
        let mut item = self.new_item(&self.policies.load(), Field::Unary, request.into_inner())?;
        if let Some(span) = &span {
            span.item(&item.key, &String::from_utf8_lossy(&item.item.id));
            item.item.trace = Some(span.context());
        }
        let result = self
            .add_items(vec![item], deadline)
            .await
            .and_then(|mut results| unary_outcome(results.pop().unwrap_or_default()))
            .map_err(Status::from);
        if let Some(span) = span {
            span.finish(result.as_ref());
        }
        Ok(Response::new(result?))
    }

    async fn add_many(
        &self,
        request: Request<pb::AddManyRequest>,
    ) -> Result<Response<pb::AddManyResponse>, Status> {
        let caller = Caller::of(&request);
        let deadline = request.extensions().get::<Deadline>().copied();
        let span = AddSpan::of_call(request.metadata(), "AddMany", "");
        let requests = request.into_inner().items;
        if requests.len() > self.limits.max_add_many.get() {
            return Err(invalid(
                "items",
                format!(
                    "holds {} adds, more than the limit of {}",
                    requests.len(),
                    self.limits.max_add_many
                ),
            )
            .into());
        }
        // Every key in scope, or nothing is written.
        caller.check_keys(requests.iter().map(|r| r.key.as_str()))?;
        self.policies_loaded()?;
        // Validate everything before writing anything, and name every bad item.
        let mut items = Vec::with_capacity(requests.len());
        let mut violations = Vec::new();
        // With tracing on, each item's own trace context, by index.
        let tracing = telemetry::on();
        let mut parents = Vec::new();
        {
            let table = self.policies.load();
            for (i, mut req) in requests.into_iter().enumerate() {
                if tracing {
                    parents.push(std::mem::take(&mut req.trace_context));
                }
                match self.new_item(&table, Field::Item(i), req) {
                    Ok(item) => items.push(item),
                    Err(Error::InvalidArgument(bad)) => violations.extend(bad),
                    Err(err) => return Err(err.into()),
                }
            }
        }
        if !violations.is_empty() {
            return Err(Error::InvalidArgument(violations).into());
        }
        let item_spans = match tracing {
            true => traced_items(&mut items, span.as_ref(), &parents),
            false => Vec::new(),
        };
        let results = if items.is_empty() {
            Ok(Vec::new())
        } else {
            self.add_items(items, deadline).await.map_err(Status::from)
        };
        for (i, item_span) in item_spans.into_iter().enumerate() {
            if let Some(item_span) = item_span {
                item_span.finish(results.as_ref().map(|r| &r[i]));
            }
        }
        if let Some(span) = span {
            span.finish_many(results.as_ref().map(Vec::len));
        }
        Ok(Response::new(pb::AddManyResponse { results: results? }))
    }

    async fn remove(
        &self,
        request: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveResponse>, Status> {
        let req = self.keyed(request, |r| &r.key)?;
        self.check_id("item_id", &req.item_id)?;
        let (removed, group_size) = self.store.remove(&req.key, req.item_id.as_bytes()).await?;
        Ok(Response::new(pb::RemoveResponse {
            removed,
            group_size,
        }))
    }

    async fn flush(
        &self,
        request: Request<pb::FlushRequest>,
    ) -> Result<Response<pb::FlushResponse>, Status> {
        let req = self.keyed(request, |r| &r.key)?;
        let batches: Vec<pb::Batch> = self
            .store
            .flush(&req.key, FlushReason::Manual)
            .await?
            .iter()
            .map(|b| batch_to_pb(b, String::new(), 0))
            .collect();
        Ok(Response::new(pb::FlushResponse {
            batch: batches.first().cloned(),
            batches,
        }))
    }

    async fn get_group(
        &self,
        request: Request<pb::GetGroupRequest>,
    ) -> Result<Response<pb::GetGroupResponse>, Status> {
        let req = self.keyed(request, |r| &r.key)?;
        let group = self.store.group(&req.key).await?;
        Ok(Response::new(pb::GetGroupResponse {
            group: group.map(|g| self.group_pb(g)),
        }))
    }

    async fn list_groups(
        &self,
        request: Request<pb::ListGroupsRequest>,
    ) -> Result<Response<pb::ListGroupsResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let limit = page_size(req.page_size)?;
        let after = page_after(&req.page_token, parse_page_token, "ListGroups")?;
        if req.key_prefix.len() as u64 > self.limits.max_key_bytes.as_u64() {
            return Err(invalid("key_prefix", "is longer than the longest key").into());
        }
        let prefixes = caller.list_prefixes(&req.key_prefix)?;
        let (groups, next) = self
            .store
            .list_groups(limit, after.as_ref(), &prefixes)
            .await?;
        // The limits count every key's groups: only for a caller who may
        // see every key.
        let limits = match (&after, caller.reaches_every_key()) {
            (None, true) => self.store.open_limits().await?,
            _ => OpenLimits::default(),
        };
        Ok(Response::new(pb::ListGroupsResponse {
            groups: groups.into_iter().map(|g| self.group_pb(g)).collect(),
            next_page_token: next
                .map(|(due, key)| page_token(due, &key))
                .unwrap_or_default(),
            open_group_limits: limits
                .rows
                .into_iter()
                .map(|(name, open_groups, limit)| pb::OpenGroupLimit {
                    name,
                    open_groups,
                    limit,
                })
                .collect(),
            oldest_limited_group_age: limits.oldest_age.map(convert::duration),
        }))
    }

    type SubscribeStream = BatchStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<BatchStream>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        for (i, key) in req.keys.iter().enumerate() {
            self.check_key(format_args!("keys[{i}]"), key)?;
        }
        for (i, prefix) in req.key_prefixes.iter().enumerate() {
            self.check_key(format_args!("key_prefixes[{i}]"), prefix)?;
        }
        let filter = Filter {
            keys: req.keys.iter().cloned().collect::<HashSet<_>>(),
            prefixes: req.key_prefixes.clone(),
        };
        caller.check_filter(&filter)?;
        let slot = self.subscriber_slot()?;
        let durable = !req.consumer_group.is_empty() || !req.consumer.is_empty();
        let deliveries = if durable {
            let filter = self.join_group(&req, filter, &caller).await?;
            let durable = Durable {
                group: req.consumer_group,
                consumer: req.consumer,
                ack_timeout: self.subscriptions.ack_timeout,
                max_deliveries: self.subscriptions.max_deliveries.get(),
                max_unacked: self.subscriptions.max_unacked.get(),
            };
            self.hub.subscribe_durable(durable, filter)
        } else {
            let shards = self.store.keyspace().shards();
            let from = match req.after.as_str() {
                "" => self.hub.now().await?,
                "0" => Cursor(vec![batch::StreamId::ZERO; usize::from(shards)]),
                text => {
                    let unknown = || {
                        invalid(
                            "after",
                            "is not a cursor of this service (use \"\", \"0\" or a Batch.cursor)",
                        )
                    };
                    let cursor = Cursor::decode(text, shards).ok_or_else(unknown)?;
                    if !self.hub.is_known(&cursor).await? {
                        return Err(unknown().into());
                    }
                    cursor
                }
            };
            self.hub.subscribe(from, caller.narrow(filter))
        };
        // The stream holds the slot: it frees when the stream is dropped.
        let hub = self.hub.clone();
        let stream = ReceiverStream::new(deliveries)
            // Once the drain has begun, what is still queued is not sent: a
            // live subscriber resumes from its last cursor, and a durable
            // consumer's batches are released to the group (the queue ends
            // once they are).
            .filter(move |_| !hub.is_closing())
            .map(move |d: Delivery| {
                let _slot = &slot;
                Ok(batch_to_pb(&d.batch, d.cursor, d.delivery_count))
            })
            // The service ends a subscription only when it drains (or its
            // subscriber task failed): a status the client retries elsewhere.
            .chain(tokio_stream::once(Err(stream_ended(durable))));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let ids = self.group_batch_ids(&req.consumer_group, &req.batch_ids)?;
        caller.check_group(&self.store, &req.consumer_group).await?;
        let acked = self.store.ack(&req.consumer_group, &ids).await?;
        if acked > 0 {
            self.hub.acked(&req.consumer_group);
        }
        Ok(Response::new(pb::AckResponse { acked }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        self.check_name("consumer_group", &req.consumer_group)?;
        caller.check_group(&self.store, &req.consumer_group).await?;
        let limit = page_size(req.page_size)?;
        let after = page_after(&req.page_token, parse_dead_letter_token, "ListDeadLetters")?;
        let (batches, next) = self
            .store
            .dead_letters(&req.consumer_group, limit, after)
            .await?;
        Ok(Response::new(pb::ListDeadLettersResponse {
            batches: batches
                .iter()
                .map(|b| batch_to_pb(b, String::new(), self.subscriptions.max_deliveries.get()))
                .collect(),
            next_page_token: next.map(dead_letter_token).unwrap_or_default(),
        }))
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let ids = self.group_batch_ids(&req.consumer_group, &req.batch_ids)?;
        caller.check_group(&self.store, &req.consumer_group).await?;
        let redriven = self.store.redrive(&req.consumer_group, &ids).await?;
        Ok(Response::new(pb::RedriveResponse { redriven }))
    }

    async fn requeue(
        &self,
        request: Request<pb::RequeueRequest>,
    ) -> Result<Response<pb::RequeueResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let (requeued, group_size) = self.requeue_items(&caller, req).await?;
        Ok(Response::new(pb::RequeueResponse {
            requeued,
            group_size,
        }))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        Ok(Response::new(self.get_policy_body(request).await?))
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        Ok(Response::new(self.list_policies_body(request).await?))
    }

    async fn update_policy(
        &self,
        request: Request<pb::UpdatePolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        Ok(Response::new(self.update_policy_body(request).await?))
    }

    async fn delete_policy(
        &self,
        request: Request<pb::DeletePolicyRequest>,
    ) -> Result<Response<pb::DeletePolicyResponse>, Status> {
        Ok(Response::new(self.delete_policy_body(request).await?))
    }

    /// An import is CPU work over every policy it carries (their checks,
    /// the plan, the revision written and read back), so it runs on a
    /// blocking thread: on one worker, the instance's other calls go on
    /// meanwhile (scenario 13 times an add during a 100k-policy import).
    async fn import_policies(
        &self,
        request: Request<pb::ImportPoliciesRequest>,
    ) -> Result<Response<pb::ImportPoliciesResponse>, Status> {
        let service = self.clone();
        let runtime = tokio::runtime::Handle::current();
        let import = tokio::task::spawn_blocking(move || {
            runtime.block_on(service.import_policies_body(request))
        });
        let done = import
            .await
            .map_err(|e| Status::internal(format!("the import stopped: {e}")))??;
        Ok(Response::new(done))
    }

    async fn list_policy_revisions(
        &self,
        request: Request<pb::ListPolicyRevisionsRequest>,
    ) -> Result<Response<pb::ListPolicyRevisionsResponse>, Status> {
        Ok(Response::new(
            self.list_policy_revisions_body(request).await?,
        ))
    }
}
