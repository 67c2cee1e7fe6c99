//! Scrapes of the service's `GET /metrics`, parsed into series and values.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One scrape, parsed: series (name and sorted labels) to value.
pub struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    /// How much `name` with exactly `labels` grew since `before`. The series
    /// must be in this scrape (a misnamed one fails the test); a series not
    /// yet in `before` counts from 0 there.
    #[track_caller]
    pub fn delta(&self, before: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels) - before.value(name, labels).unwrap_or(0.0)
    }

    /// Whether the scrape has the series `name` with exactly `labels`.
    pub fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.value(name, labels).is_some()
    }

    /// The value of `name` with exactly `labels`; panics when the scrape
    /// has no such series, so a check on it cannot pass on a missing one.
    #[track_caller]
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or_else(|| {
            let known: Vec<&String> = self.0.keys().filter(|k| k.starts_with(name)).collect();
            panic!("no series {name} {labels:?} in the scrape; of that name: {known:?}")
        })
    }

    /// The value of `name` with exactly `labels`, if the scrape has it.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .get(&series(name, labels.iter().map(|(k, v)| (*k, *v))))
            .copied()
    }
}

/// The canonical form of a series: `name{k=v,...}` with labels sorted.
fn series<'a>(name: &str, labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut labels: Vec<String> = labels.map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// GETs `/metrics` at `addr` over a plain TCP connection and parses it.
pub async fn scrape(addr: SocketAddr) -> Scrape {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = "GET /metrics HTTP/1.1\r\nHost: batcher\r\nConnection: close\r\n\r\n";
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let mut values = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (id, value) = line.rsplit_once(' ').expect("`series value`");
        let (name, labels) = id.split_once('{').unwrap_or((id, "}"));
        let labels = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty());
        let labels = labels.map(|l| {
            let (k, v) = l.split_once('=').expect("k=\"v\"");
            (k, v.trim_matches('"'))
        });
        values.insert(series(name, labels), value.parse().expect("a number"));
    }
    Scrape(values)
}
