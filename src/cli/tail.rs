//! `batcher tail`: prints flushed batches as they arrive, one line each (a
//! JSON object with `--json`), until Ctrl-C or SIGTERM, which exit 0.
//!
//! A live tail keeps the cursor of the last batch it printed. When the
//! stream drops (the service restarts, the network fails), it reconnects
//! with backoff and resumes right after that batch, so nothing is missed or
//! printed twice. Before the first batch there is no cursor: it resumes
//! from `--after`, or from the moment it reconnects when that was "".
//!
//! A durable tail (`--group`, `--consumer`) acks each batch after printing
//! it (not with `--no-ack`) and reconnects under the same consumer name, so
//! the service delivers again what it held unacked. A batch printed whose
//! ack was lost with the connection is printed again: at least once.

use std::time::Duration;

use super::TailArgs;
use super::client::CliError;
use super::output;
use crate::pb;

/// The first pause before a reconnect; it doubles up to RECONNECT_MAX.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);

/// The longest pause between reconnects.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Runs the tail until a signal (Ok) or an error a reconnect would not cure.
pub async fn run(args: TailArgs) -> Result<(), CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        result = follow(&args) => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = term.recv() => Ok(()),
    }
}

/// Subscribes, prints, and subscribes again when the stream drops.
async fn follow(args: &TailArgs) -> Result<(), CliError> {
    let mut after = args.after.clone();
    let mut pause = RECONNECT_FIRST;
    loop {
        let mut subscribed = false;
        let why = match session(args, &mut after, &mut subscribed).await {
            Ok(()) => "the stream ended".to_owned(),
            Err(err) if err.is_transient() => err.to_string(),
            Err(err) => return Err(err),
        };
        if subscribed {
            pause = RECONNECT_FIRST;
        }
        eprintln!(
            "batcher: {why}; reconnecting in {}",
            humantime::format_duration(pause)
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// One subscription: prints its batches (acking them in a group) and keeps
/// `after` at the last live cursor printed. Sets `subscribed` once the
/// service has accepted the subscription.
async fn session(
    args: &TailArgs,
    after: &mut String,
    subscribed: &mut bool,
) -> Result<(), CliError> {
    let remote = &args.remote;
    let mut client = remote.connect().await?;
    let group = args.group.clone().unwrap_or_default();
    let request = pb::SubscribeRequest {
        keys: args.keys.clone(),
        key_prefixes: args.prefixes.clone(),
        after: after.clone(),
        consumer_group: group.clone(),
        consumer: args.consumer.clone().unwrap_or_default(),
    };
    let mut stream = client.subscribe(request).await?.into_inner();
    *subscribed = true;
    while let Some(batch) = stream.message().await? {
        match remote.json {
            true => output::json(&batch)?,
            false => output::line(&output::batch_line(&batch))?,
        }
        if !batch.cursor.is_empty() {
            after.clone_from(&batch.cursor);
        }
        if !group.is_empty() && !args.no_ack {
            let ack = pb::AckRequest {
                consumer_group: group.clone(),
                batch_ids: vec![batch.id],
            };
            remote.call(client.ack(ack)).await?;
        }
    }
    Ok(())
}
