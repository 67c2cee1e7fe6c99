//! What the CLI prints: aligned tables and short lines for people (times
//! in UTC, RFC 3339 to the millisecond; due times also as "in 4m 59s"), and
//! JSON lines for scripts (`crate::json`, the protobuf JSON mapping).

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use crate::pb;

/// Most item ids a tail line shows before "+N more".
const TAIL_IDS: usize = 10;

/// Most characters of a payload `get` shows.
const PAYLOAD_PREVIEW: usize = 40;

/// Writes `text` and a newline to stdout, flushed, so a pipe sees each line as it comes.
pub fn line(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Writes `message` in the protobuf JSON mapping, as one line.
pub fn json<M: prost::Name>(message: &M) -> std::io::Result<()> {
    line(&crate::json::to_json(message).to_string())
}

/// Columns aligned on the widest cell; two spaces between columns.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Table {
        let headers = headers.iter().map(|h| (*h).to_owned()).collect();
        Table {
            rows: vec![headers],
        }
    }

    /// Adds a row (as many cells as headers).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, without trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.rows[0].len();
        let width = |c: usize| {
            let cells = self.rows.iter().map(|row| row[c].chars().count());
            cells.max().unwrap_or(0)
        };
        let widths = (0..columns).map(width).collect::<Vec<_>>();
        let mut text = String::new();
        for row in &self.rows {
            let mut out = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                out.push_str(&format!("{cell:<width$}  "));
            }
            text.push_str(out.trim_end());
            text.push('\n');
        }
        text.pop();
        text
    }
}

/// A time in UTC, RFC 3339 to the millisecond; "-" when unset.
pub fn time(at: Option<&prost_types::Timestamp>) -> String {
    let Some(at) = at else { return "-".into() };
    match jiff::Timestamp::new(at.seconds, at.nanos) {
        Ok(at) => at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        Err(_) => format!("{}s", at.seconds),
    }
}

/// How far off a due time is, as "in 4m 59s" or "now" (by this machine's clock).
pub fn due_in(at: Option<&prost_types::Timestamp>) -> String {
    let Some(at) = at else { return "-".into() };
    let now = jiff::Timestamp::now();
    let left_ms = at.seconds * 1000 + i64::from(at.nanos / 1_000_000) - now.as_millisecond();
    match u64::try_from(left_ms) {
        Ok(ms) if ms > 0 => {
            let seconds = Duration::from_secs(ms.div_ceil(1000));
            format!("in {}", humantime::format_duration(seconds))
        }
        _ => "now".into(),
    }
}

/// A flush reason without its `FLUSH_REASON_` prefix: `SIZE`, `MANUAL`.
pub fn reason(value: i32) -> String {
    match pb::FlushReason::try_from(value) {
        Ok(reason) => reason
            .as_str_name()
            .trim_start_matches("FLUSH_REASON_")
            .to_owned(),
        Err(_) => value.to_string(),
    }
}

/// Measures by name as `name=sum`, or `name=sum/capacity` where a capacity
/// is given; "-" when there are none.
pub fn measures(sums: &HashMap<String, u64>, capacity: &HashMap<String, u64>) -> String {
    let mut names = sums.keys().chain(capacity.keys()).collect::<Vec<_>>();
    names.sort();
    names.dedup();
    let shown = names.iter().map(|name| {
        let sum = sums.get(*name).copied().unwrap_or(0);
        match capacity.get(*name) {
            Some(cap) => format!("{name}={sum}/{cap}"),
            None => format!("{name}={sum}"),
        }
    });
    let text = shown.collect::<Vec<_>>().join(" ");
    if text.is_empty() { "-".into() } else { text }
}

/// A payload as text when it is printable UTF-8 (cut at PAYLOAD_PREVIEW
/// characters), else its size.
fn payload(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok("") => "-".into(),
        Ok(text) if !text.chars().any(char::is_control) => {
            match text.char_indices().nth(PAYLOAD_PREVIEW) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text.to_owned(),
            }
        }
        _ => format!("<{} bytes>", bytes.len()),
    }
}

/// Items out of the most: "3/100".
fn items(size: u32, max: u32) -> String {
    format!("{size}/{max}")
}

/// The open groups of a `list` page. The MEASURES column shows only when
/// some group carries measure sums.
pub fn groups(groups: &[pb::Group]) -> String {
    let with_measures = groups.iter().any(|g| !g.measures.is_empty());
    let mut headers = vec!["KEY", "ITEMS", "BYTES", "OPENED", "DUE", "BY"];
    if with_measures {
        headers.insert(3, "MEASURES");
    }
    let mut table = Table::new(&headers);
    for g in groups {
        let mut row = vec![
            g.key.clone(),
            items(g.size, g.max_items),
            g.bytes.to_string(),
            time(g.opened_at.as_ref()),
            due_in(g.due_at.as_ref()),
            reason(g.due_reason),
        ];
        if with_measures {
            row.insert(3, measures(&g.measures, &g.capacity));
        }
        table.row(row);
    }
    table.render()
}

/// "1 item", "3 items".
pub fn count_items(n: usize) -> String {
    match n {
        1 => "1 item".into(),
        n => format!("{n} items"),
    }
}

/// One open group with its items, for `get`.
pub fn group(g: &pb::Group) -> String {
    let due = format!(
        "{} ({}, {})",
        time(g.due_at.as_ref()),
        due_in(g.due_at.as_ref()),
        reason(g.due_reason)
    );
    let bytes = match g.max_bytes {
        0 => g.bytes.to_string(),
        max => format!("{}/{max}", g.bytes),
    };
    let mut head = Table::new(&["key:", &g.key]);
    head.row(vec!["items:".into(), items(g.size, g.max_items)]);
    head.row(vec!["bytes:".into(), bytes]);
    head.row(vec!["measures:".into(), measures(&g.measures, &g.capacity)]);
    head.row(vec!["opened:".into(), time(g.opened_at.as_ref())]);
    head.row(vec!["last add:".into(), time(g.last_added_at.as_ref())]);
    head.row(vec!["due:".into(), due]);
    let headers = ["ID", "BYTES", "MEASURES", "DEADLINE", "REQUEUED", "PAYLOAD"];
    let mut table = Table::new(&headers);
    for item in &g.items {
        table.row(vec![
            item.id.clone(),
            item.payload.len().to_string(),
            measures(&item.measures, &HashMap::new()),
            time(item.deadline.as_ref()),
            item.requeue_count.to_string(),
            payload(&item.payload),
        ]);
    }
    format!("{}\n\n{}", head.render(), table.render())
}

/// Batches as a table, for `dead-letters`.
pub fn batches(batches: &[pb::Batch]) -> String {
    let headers = ["BATCH", "KEY", "REASON", "ITEMS", "DELIVERIES", "FLUSHED"];
    let mut table = Table::new(&headers);
    for b in batches {
        table.row(vec![
            b.id.clone(),
            b.key.clone(),
            reason(b.reason),
            b.items.len().to_string(),
            b.delivery_count.to_string(),
            time(b.flushed_at.as_ref()),
        ]);
    }
    table.render()
}

/// One batch as a line, for `tail`: when, key, reason, size, batch id, the
/// first item ids, and the delivery count of a redelivery.
pub fn batch_line(b: &pb::Batch) -> String {
    let mut ids = b.items.iter().take(TAIL_IDS).map(|i| i.id.as_str());
    let mut ids = ids.by_ref().collect::<Vec<_>>().join(" ");
    if b.items.len() > TAIL_IDS {
        ids.push_str(&format!(" +{} more", b.items.len() - TAIL_IDS));
    }
    let mut text = format!(
        "{}  {:<12}  {:<8}  {:>9}  {}  {ids}",
        time(b.flushed_at.as_ref()),
        b.key,
        reason(b.reason),
        count_items(b.items.len()),
        b.id,
    );
    if b.delivery_count > 1 {
        text.push_str(&format!("  (delivery {})", b.delivery_count));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Columns align on the widest cell, and rows end without spaces.
    #[test]
    fn a_table_aligns_its_columns() {
        let mut table = Table::new(&["KEY", "ITEMS"]);
        table.row(vec!["north-1".into(), "3/100".into()]);
        table.row(vec!["s".into(), "".into()]);
        assert_eq!(table.render(), "KEY      ITEMS\nnorth-1  3/100\ns");
    }

    /// Times print in UTC to the millisecond; payloads as text or their size.
    #[test]
    fn times_and_payloads() {
        let at = prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 5_000_000,
        };
        assert_eq!(time(Some(&at)), "2023-11-14T22:13:20.005Z");
        assert_eq!(time(None), "-");
        assert_eq!(payload(b"to Berlin"), "to Berlin");
        assert_eq!(payload(&[0xff, 0]), "<2 bytes>");
        assert_eq!(reason(pb::FlushReason::Manual as i32), "MANUAL");
    }
}
