//! The charts of BENCHMARKS.md: SVG files drawn with plotters (its SVG
//! backend only, so no system fonts or libraries are needed) from what the
//! scenarios measured, and the Markdown section that links them.
//!
//! The scenarios' reports fill a [`Data`]; [`write_all`] draws every chart it
//! has data for into one directory and returns the links. Layout: this file
//! (the data, the files, the shared style and arithmetic), `bars.rs` (the
//! ingest scenarios' throughput), `latency.rs` (timeout lateness, flush to subscriber)
//! and `scale.rs` (p99 Add latency against open groups).

mod bars;
mod latency;
mod scale;

use std::error::Error;
use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

/// What a chart's drawing returns; plotters' errors are boxed.
type Drawn = Result<(), Box<dyn Error>>;

/// Everything the charts are drawn from, filled in as the scenarios report.
#[derive(Default)]
pub struct Data {
    /// The ingest scenarios' throughput, in the order they ran.
    pub throughput: Vec<Bar>,
    /// Scenario 3's lateness (µs, whole milliseconds) and its targets.
    pub lateness: Option<Lateness>,
    /// Scenario 4's flush-to-subscriber latency (µs) and its p99 target, in ms.
    pub delivery: Option<(Histogram<u64>, f64)>,
    /// Scenario 5's p99 Add latency at each open-group count probed.
    pub scale: Option<ScalePoints>,
}

/// One bar of the throughput chart: a scenario and its items/s.
pub struct Bar {
    pub label: String,
    pub per_sec: f64,
}

/// Scenario 3's lateness histogram and targets.
pub struct Lateness {
    pub histogram: Histogram<u64>,
    pub p99_target_ms: f64,
    pub max_target_ms: f64,
}

/// Scenario 5's probes: (open groups, p99 Add latency in ms).
pub struct ScalePoints {
    /// Probes on a freshly started service (the figure of row 5).
    pub fresh: Vec<(usize, f64)>,
    /// Probes on the service that opened the groups, as it went.
    pub opening: Vec<(usize, f64)>,
    /// The target: p99 at most this many times the first fresh probe's.
    pub target_ratio: f64,
}

/// A chart written: its title and file name.
pub struct Link {
    pub title: &'static str,
    pub file: &'static str,
}

/// Draws every chart `data` has what it needs for into `dir` (created if
/// missing) and returns the links, in the order of the scenarios.
pub fn write_all(data: &Data, dir: &Path) -> Result<Vec<Link>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut links = Vec::new();
    let mut draw = |title, file, drawn: &dyn Fn(&Path) -> Drawn| {
        let path = dir.join(file);
        drawn(&path).map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
        links.push(Link { title, file });
        Ok::<_, String>(())
    };
    if !data.throughput.is_empty() {
        let title = "Ingest throughput through the service";
        draw(title, "throughput.svg", &|p| {
            bars::throughput(p, &data.throughput)
        })?;
    }
    if let Some(lateness) = &data.lateness {
        let title = "Timeout lateness (scenario 3)";
        draw(title, "lateness.svg", &|p| latency::lateness(p, lateness))?;
    }
    if let Some((histogram, target)) = &data.delivery {
        let title = "Flush-to-subscriber latency (scenario 4)";
        draw(title, "delivery.svg", &|p| {
            latency::delivery(p, histogram, *target)
        })?;
    }
    if let Some(points) = &data.scale {
        let title = "p99 Add latency against open groups (scenario 5)";
        draw(title, "scale.svg", &|p| scale::p99_by_groups(p, points))?;
    }
    Ok(links)
}

/// The "Charts" section of the report, linking each chart under `dir` (a
/// path relative to the report); "" when there is none.
pub fn markdown(links: &[Link], dir: &str) -> String {
    if links.is_empty() {
        return String::new();
    }
    let mut out = String::from("## Charts\n\n");
    for link in links {
        out += &format!("![{}]({dir}/{})\n\n", link.title, link.file);
    }
    out
}

/// The width and height of every chart, in pixels.
const WIDTH: u32 = 960;
const HEIGHT: u32 = 540;
/// Series colours: the service, a second series, a target.
const SERVICE: RGBColor = RGBColor(31, 119, 180);
const SECOND: RGBColor = RGBColor(255, 127, 14);
const TARGET: RGBColor = RGBColor(214, 39, 40);

fn caption_style() -> TextStyle<'static> {
    ("sans-serif", 24).into_font().into()
}

fn label_style() -> TextStyle<'static> {
    ("sans-serif", 16).into_font().into()
}

/// The legend box, in the chart's upper left or right corner.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(label_style())
        .draw()
}

/// A short legend mark: a line of `style`, 20 px wide.
fn line_mark(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style)
}

/// A count or rate in few characters: 950, 12.5k, 1.2M.
fn si(value: f64) -> String {
    let (scaled, unit) = match value.abs() {
        v if v >= 1e6 => (value / 1e6, "M"),
        v if v >= 1e3 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let text = format!("{scaled:.1}");
    format!("{}{unit}", text.trim_end_matches(".0"))
}

/// The "nines" scale of a percentile chart: quantile q sits at
/// −log10(1 − q), so 90% is at 1, 99% at 2, 99.9% at 3.
fn nines(quantile: f64) -> f64 {
    -(1.0 - quantile).max(1e-12).log10()
}

/// The percentile at `x` on the nines scale: "0%", "90%", "99.9%".
fn percentile_label(x: f64) -> String {
    let percent = 100.0 * (1.0 - 10f64.powf(-x));
    let text = format!("{percent:.4}");
    format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
}

/// A whole-millisecond histogram's groups by lateness: (ms, count) for each
/// millisecond that has any, in order.
fn counts_by_ms(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    let mut counts: Vec<(u64, u64)> = Vec::new();
    for v in h.iter_recorded() {
        let ms = (h.median_equivalent(v.value_iterated_to()) + 500) / 1000;
        match counts.last_mut() {
            Some((last, count)) if *last == ms => *count += v.count_at_value(),
            _ => counts.push((ms, v.count_at_value())),
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(values_us: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for v in values_us {
            h.record(*v).unwrap();
        }
        h
    }

    /// Quantiles map to nines and back to the labels a reader expects.
    #[test]
    fn nines_and_their_labels() {
        assert!((nines(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(percentile_label(0.0), "0%");
        assert_eq!(percentile_label(1.0), "90%");
        assert_eq!(percentile_label(3.0), "99.9%");
        assert_eq!(si(950.0), "950");
        assert_eq!(si(12_500.0), "12.5k");
        assert_eq!(si(1_000_000.0), "1M");
    }

    /// Whole-millisecond lateness is counted per millisecond, in order.
    #[test]
    fn lateness_is_counted_per_millisecond() {
        let h = histogram(&[1, 1000, 1000, 2000, 25_000, 25_000, 25_000]);
        assert_eq!(counts_by_ms(&h), vec![(0, 1), (1, 2), (2, 1), (25, 3)]);
    }

    fn sample() -> Data {
        let bar = |label: &str, per_sec| Bar {
            label: label.into(),
            per_sec,
        };
        // 1000 samples resolve percentiles down to 99.9%.
        let deliveries: Vec<u64> = (1..=1000).map(|i| 500 + 4 * i).collect();
        Data {
            throughput: vec![bar("1. AddMany", 90_000.0), bar("2. unary Add", 15_000.0)],
            lateness: Some(Lateness {
                histogram: histogram(&[1, 1000, 1000, 2000, 7000]),
                p99_target_ms: 5.0,
                max_target_ms: 25.0,
            }),
            delivery: Some((histogram(&deliveries), 5.0)),
            scale: Some(ScalePoints {
                fresh: vec![(1_000, 1.0), (1_000_000, 1.1)],
                opening: vec![(10_000, 1.2), (100_000, 1.3), (1_000_000, 1.4)],
                target_ratio: 1.25,
            }),
        }
    }

    /// Every chart is written as an SVG with its series, targets and axis
    /// titles, and the Markdown links each one under the given directory.
    #[test]
    fn writes_every_chart_with_its_series() {
        let dir = tempfile::tempdir().unwrap();
        let links = write_all(&sample(), dir.path()).unwrap();
        let expected = [
            (
                "throughput.svg",
                ["1. AddMany", "2. unary Add", "items per second"],
            ),
            ("lateness.svg", ["p99 target", "max target", "lateness"]),
            ("delivery.svg", ["p99 target", "latency (ms)", "99.9%"]),
            ("scale.svg", ["fresh service", "target", "open groups"]),
        ];
        assert_eq!(links.len(), expected.len());
        for ((file, needles), link) in expected.iter().zip(&links) {
            assert_eq!(link.file, *file);
            let svg = std::fs::read_to_string(dir.path().join(file)).unwrap();
            assert!(svg.starts_with("<svg"), "{file} is not an SVG");
            for needle in needles {
                assert!(svg.contains(needle), "{file} lacks {needle:?}");
            }
        }
        let md = markdown(&links, "bench");
        assert!(md.contains("](bench/lateness.svg)"), "{md}");
    }

    /// A run without the data of a chart leaves that chart out.
    #[test]
    fn draws_only_what_was_measured() {
        let dir = tempfile::tempdir().unwrap();
        let data = Data {
            lateness: sample().lateness,
            ..Data::default()
        };
        let links = write_all(&data, dir.path()).unwrap();
        let files: Vec<&str> = links.iter().map(|l| l.file).collect();
        assert_eq!(files, ["lateness.svg"]);
        assert!(markdown(&[], "bench").is_empty());
    }
}
