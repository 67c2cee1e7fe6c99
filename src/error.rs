//! Errors of the API (the gRPC service and the token checks in `auth`), and
//! the one place that decides gRPC status codes. Every status carries a
//! `google.rpc.ErrorInfo` (Google AIP-193): a `reason` in UPPER_SNAKE_CASE,
//! the domain `batcher`, and the dynamic values in `metadata`; invalid input
//! also carries a `google.rpc.BadRequest` with one field violation per bad
//! field.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::store::StoreError;

/// The `ErrorInfo.domain` of every error batcher returns.
pub const DOMAIN: &str = "batcher";

/// `ErrorInfo.reason` of invalid input; the `BadRequest` detail names the fields.
pub const REASON_INVALID_FIELD: &str = "INVALID_FIELD";

/// One bad request field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field's path in the request, as `items[3].item.id`.
    pub field: String,
    /// What is wrong, as a sentence that follows the field name.
    pub message: String,
}

/// Errors of the service layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Request fields are invalid (at least one); nothing was written. The
    /// message is the first violation's, as `field: message`.
    #[error("{}", invalid_message(.0))]
    InvalidArgument(Vec<Violation>),
    /// A request refused for a reason of its own (a missing token, a key out
    /// of scope, an overloaded shard): the code, the `ErrorInfo` reason, and
    /// the dynamic values that go into its metadata.
    #[error("{message}")]
    Refused {
        code: Code,
        reason: &'static str,
        message: String,
        metadata: Vec<(&'static str, String)>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid_message(violations: &[Violation]) -> String {
    match violations {
        [] => "invalid request".to_owned(),
        [one] => format!("{}: {}", one.field, one.message),
        [first, rest @ ..] => format!(
            "{}: {} (and {} more invalid fields)",
            first.field,
            first.message,
            rest.len()
        ),
    }
}

/// An INVALID_ARGUMENT error for one bad field.
pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
    Error::InvalidArgument(vec![Violation {
        field: field.into(),
        message: message.into(),
    }])
}

impl Error {
    /// A refusal with `code` and `reason`; add metadata with [`Error::with`].
    pub fn refused(code: Code, reason: &'static str, message: impl Into<String>) -> Error {
        Error::Refused {
            code,
            reason,
            message: message.into(),
            metadata: Vec::new(),
        }
    }

    /// Adds `key = value` to a refusal's `ErrorInfo.metadata`.
    pub fn with(mut self, key: &'static str, value: impl ToString) -> Error {
        if let Error::Refused { metadata, .. } = &mut self {
            metadata.push((key, value.to_string()));
        }
        self
    }

    /// The gRPC code, the `ErrorInfo` reason and metadata of this error.
    fn parts(&self) -> (Code, &'static str, HashMap<String, String>) {
        let meta = |pairs: &[(&str, String)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect::<HashMap<_, _>>()
        };
        match self {
            Error::InvalidArgument(violations) => {
                let fields = violations.iter().map(|v| v.field.as_str());
                let fields = fields.collect::<Vec<_>>().join(",");
                (
                    Code::InvalidArgument,
                    REASON_INVALID_FIELD,
                    meta(&[("fields", fields)]),
                )
            }
            Error::Refused {
                code,
                reason,
                metadata,
                ..
            } => (*code, reason, meta(metadata)),
            Error::Store(err) => {
                let (code, reason) = store_code(err);
                (code, reason, meta(&store_metadata(err)))
            }
        }
    }
}

/// The gRPC code and `ErrorInfo` reason of a store error.
fn store_code(err: &StoreError) -> (Code, &'static str) {
    match err {
        StoreError::Unavailable(_) => (Code::Unavailable, "REDIS_UNAVAILABLE"),
        StoreError::Redis(_) => (Code::Internal, "REDIS_ERROR"),
        StoreError::Decode(_) => (Code::Internal, "STORED_DATA_UNREADABLE"),
        StoreError::QueueFull { .. } => (Code::ResourceExhausted, "SHARD_QUEUE_FULL"),
        StoreError::OutOfMemory(_) => (Code::ResourceExhausted, "REDIS_OUT_OF_MEMORY"),
        StoreError::Timeout(_) => (Code::Unavailable, "REDIS_TIMEOUT"),
        StoreError::WrongFormat { .. } => (Code::FailedPrecondition, "DATA_FORMAT_MISMATCH"),
        StoreError::WrongShards { .. } => (Code::FailedPrecondition, "SHARD_COUNT_MISMATCH"),
    }
}

/// The dynamic values of a store error: Redis' error code, when it sent
/// one; the shard and its queue limit of a full queue; the deadline missed.
fn store_metadata(err: &StoreError) -> Vec<(&'static str, String)> {
    match err {
        StoreError::Unavailable(e) | StoreError::Redis(e) | StoreError::OutOfMemory(e) => e
            .code()
            .map(|code| vec![("redis_code", code.to_owned())])
            .unwrap_or_default(),
        StoreError::Decode(_) => Vec::new(),
        StoreError::QueueFull { shard, limit } => {
            vec![("shard", shard.to_string()), ("limit", limit.to_string())]
        }
        StoreError::Timeout(budget) => vec![("deadline_ms", budget.as_millis().to_string())],
        StoreError::WrongFormat { found, .. } => vec![("found", found.clone())],
        StoreError::WrongShards {
            found, configured, ..
        } => vec![
            ("found", found.clone()),
            ("configured", configured.to_string()),
        ],
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let (code, reason, metadata) = err.parts();
        let message = match &err {
            Error::Store(StoreError::Unavailable(e)) => format!("redis unavailable: {e}"),
            // Overload and deadlines are the client's to handle (back off,
            // retry), not errors of the service.
            Error::Store(
                e @ (StoreError::QueueFull { .. }
                | StoreError::OutOfMemory(_)
                | StoreError::Timeout(_)),
            ) => e.to_string(),
            Error::Store(e) => {
                tracing::error!(%e, "internal error");
                e.to_string()
            }
            _ => err.to_string(),
        };
        let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
        if let Error::InvalidArgument(violations) = &err {
            details.set_bad_request(
                violations
                    .iter()
                    .map(|v| FieldViolation::new(v.field.clone(), v.message.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        Status::with_error_details(code, message, details)
    }
}

/// Lets handlers `?` a store call; the conversion of [`Error`] above decides the code.
impl From<StoreError> for Status {
    fn from(err: StoreError) -> Status {
        Error::from(err).into()
    }
}
