//! The add path's part of the handlers: each add validated and resolved,
//! the store's results counted and answered, a refusal by a limit on open
//! groups as a unary Add's error, and AddMany's per-item trace contexts.

use tonic::Code;

use super::BatcherService;
use super::checks::{self, check_size};
use super::convert::add_response;
use crate::batch;
use crate::error::{Error, invalid};
use crate::pb;
use crate::policy::Policies;
use crate::store::{Deadline, NewItem};
use crate::telemetry::AddSpan;

impl BatcherService {
    /// Validates one add and resolves its key's policy in `table` (one
    /// table per call, so a call is judged by one revision of the
    /// policies). `field` prefixes the names in error messages (`items[3].`
    /// in AddMany).
    pub(super) fn new_item(
        &self,
        table: &Policies,
        field: Field,
        req: pb::AddRequest,
    ) -> Result<NewItem, Error> {
        // Names are written out only for an error.
        self.check_key(format_args!("{field}key"), &req.key)?;
        let item = req
            .item
            .ok_or_else(|| invalid(format!("{field}item"), "is required"))?;
        self.check_id(format_args!("{field}item.id"), &item.id)?;
        check_size(
            format_args!("{field}item.payload"),
            item.payload.len(),
            self.limits.max_payload_bytes,
        )?;
        let policy = table.resolve(&req.key);
        let measures =
            checks::measures(format_args!("{field}item.measures"), item.measures, &policy)?;
        let deadline_ms = item
            .deadline
            .map(|at| checks::timestamp_ms(format_args!("{field}item.deadline"), at))
            .transpose()?;
        Ok(NewItem {
            key: req.key,
            item: batch::Item {
                id: item.id.into_bytes(),
                payload: item.payload,
                measures,
                deadline_ms,
                requeue_count: 0,
                trace: None,
            },
            policy,
            close: req.close_group,
            requeue_of: None,
        })
    }

    /// Adds `items`; a part still queued for Redis at the call's `deadline`
    /// (set by [`Deadlines`]) is dropped unwritten.
    pub(super) async fn add_items(
        &self,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
    ) -> Result<Vec<pb::AddResponse>, Error> {
        let report = self.store.add_within(items, deadline).await?;
        crate::metrics::added(&report.results);
        for (shard, due) in report.opened {
            self.sweeper.opened(shard, due);
        }
        Ok(report.results.into_iter().map(add_response).collect())
    }
}

/// A unary Add's response, or RESOURCE_EXHAUSTED naming the limit on open
/// groups that refused it (AddMany answers REFUSED per item instead).
pub(super) fn unary_outcome(response: pb::AddResponse) -> Result<pb::AddResponse, Error> {
    if response.outcome() != pb::AddOutcome::Refused {
        return Ok(response);
    }
    let limit = response.limit;
    Err(Error::refused(
        Code::ResourceExhausted,
        "OPEN_GROUPS_LIMIT",
        format!(
            "the key has no open group, and opening one would pass {limit}; retry later, or raise the limit"
        ),
    )
    .with("limit", limit))
}

/// Gives each of AddMany's `items` the trace context it keeps: the span
/// started for its own context (`parents[i]`, its request's
/// `trace_context`, when valid), else the call's span's. Returns the
/// items' own spans, by index, to finish when the call is done.
pub(super) fn traced_items(
    items: &mut [NewItem],
    call: Option<&AddSpan>,
    parents: &[String],
) -> Vec<Option<AddSpan>> {
    let mut spans = Vec::with_capacity(items.len());
    for (new, parent) in items.iter_mut().zip(parents) {
        let id = String::from_utf8_lossy(&new.item.id);
        let own = AddSpan::of_item(parent, call, &new.key, &id);
        new.item.trace = own.as_ref().or(call).map(AddSpan::context);
        spans.push(own);
    }
    spans
}

/// Where an add sits in its request, which prefixes the names of its fields
/// in error messages: nothing in a unary Add, `items[3].` in AddMany. It is
/// written out only for an error.
#[derive(Clone, Copy)]
pub(super) enum Field {
    Unary,
    Item(usize),
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Unary => Ok(()),
            Field::Item(i) => write!(f, "items[{i}]."),
        }
    }
}
