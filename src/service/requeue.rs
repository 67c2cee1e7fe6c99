//! Requeue: items of a delivered batch go back into their key's open group,
//! as new arrivals, for parcels that could not be loaded onto their truck.

use std::collections::BTreeSet;

use tonic::Code;

use super::BatcherService;
use crate::auth::Caller;
use crate::batch::AddOutcome;
use crate::batch::{self, Batch};
use crate::error::{Error, invalid};
use crate::pb;
use crate::store::NewItem;

impl BatcherService {
    /// Requeues the named items of batch `req.batch_id`: returns how many
    /// went back (none on a repeated call) and the group's size after.
    pub(super) async fn requeue_items(
        &self,
        caller: &Caller,
        req: pb::RequeueRequest,
    ) -> Result<(u32, u32), Error> {
        let (shard, entry) = batch::Batch::parse_id(&req.batch_id)
            .filter(|(shard, _)| *shard < self.store.keyspace().shards())
            .ok_or_else(|| invalid("batch_id", "is not a batch id"))?;
        if req.item_ids.is_empty() {
            return Err(invalid("item_ids", "must name at least one item"));
        }
        let batch = self.store.batch(shard, entry).await?.ok_or_else(|| {
            Error::refused(
                Code::NotFound,
                "BATCH_NOT_FOUND",
                format!(
                    "batch {} is not retained any more (or never was)",
                    req.batch_id
                ),
            )
            .with("batch_id", &req.batch_id)
        })?;
        caller.check_key(&batch.key)?;
        let items = self.requeued(&req, batch)?;
        let report = self.store.add(items).await?;
        crate::metrics::added(&report.results);
        for (shard, due) in report.opened {
            self.sweeper.opened(shard, due);
        }
        let requeued = report
            .results
            .iter()
            .filter(|r| r.outcome == AddOutcome::Added)
            .count() as u32;
        let group_size = report.results.last().map_or(0, |r| r.group_size);
        Ok((requeued, group_size))
    }

    /// The batch's items that `req` names, ready to add again, in the
    /// batch's order; an id the batch does not hold is refused.
    fn requeued(&self, req: &pb::RequeueRequest, batch: Batch) -> Result<Vec<NewItem>, Error> {
        let held: BTreeSet<&[u8]> = batch.items.iter().map(|i| i.id.as_slice()).collect();
        if let Some(i) = req
            .item_ids
            .iter()
            .position(|id| !held.contains(id.as_bytes()))
        {
            return Err(invalid(
                format!("item_ids[{i}]"),
                format!("is not an item of batch {}", req.batch_id),
            ));
        }
        let wanted: BTreeSet<&[u8]> = req.item_ids.iter().map(|id| id.as_bytes()).collect();
        let policy = self.policies.current().resolve(&batch.key);
        let mut items = Vec::with_capacity(wanted.len());
        for mut item in batch.items {
            if !wanted.contains(item.id.as_slice()) {
                continue;
            }
            if let Some((name, value, cap)) = item
                .measures
                .iter()
                .find_map(|(n, v)| policy.capacity.get(n).filter(|c| v > c).map(|c| (n, v, c)))
            {
                return Err(invalid(
                    format!(
                        "item_ids[{}]",
                        req.item_ids
                            .iter()
                            .position(|id| id.as_bytes() == item.id)
                            .unwrap_or(0)
                    ),
                    format!(
                        "has measure {name:?} = {value}, more than the key's capacity of {cap}: it can never fit"
                    ),
                ));
            }
            item.requeue_count += 1;
            items.push(NewItem {
                key: batch.key.clone(),
                item,
                policy: policy.clone(),
                close: false,
                requeue_of: Some(req.batch_id.clone()),
            });
        }
        Ok(items)
    }
}
