//! The two latency charts: scenario 3's timeout lateness as a histogram
//! (groups per millisecond late, log scale) and scenario 4's
//! flush-to-subscriber latency as a percentile curve.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{Drawn, HEIGHT, Lateness, SECOND, SERVICE, TARGET, WIDTH};
use super::{caption_style, counts_by_ms, label_style, legend, line_mark, nines, percentile_label};

/// The deepest percentile drawn: 99.999%, or less when fewer samples.
const MAX_NINES: f64 = 5.0;

/// A vertical dashed line at `x` from `y0` to `y1`, labelled in the legend.
fn vertical<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    x: f64,
    (y0, y1): (f64, f64),
    style: ShapeStyle,
    label: String,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .draw_series(DashedLineSeries::new([(x, y0), (x, y1)], 6, 4, style))?
        .label(label)
        .legend(line_mark(style));
    Ok(())
}

/// Groups per millisecond of lateness as bars on a log scale, with the p99
/// and max targets as dashed lines and the measured p99 as a solid one.
pub(super) fn lateness(path: &Path, l: &Lateness) -> Drawn {
    let counts = counts_by_ms(&l.histogram);
    let last = counts.last().map_or(0, |(ms, _)| *ms) as f64;
    let most = counts.iter().map(|(_, c)| *c).max().unwrap_or(1) as f64;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "Timeout lateness of {} groups (scenario 3)",
        l.histogram.len()
    );
    let x_end = last.max(l.max_target_ms) + 2.0;
    // Room above the bars for the legend.
    let y_range = (0.5..most * 20.0).log_scale();
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, caption_style())
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..x_end, y_range)?;
    chart
        .configure_mesh()
        .x_desc("lateness (ms): flushed_at − (opened_at + max_wait), Redis clock")
        .y_desc("groups (log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(label_style())
        .draw()?;
    let bars = counts.iter().map(|(ms, count)| {
        let x = *ms as f64;
        Rectangle::new([(x - 0.4, 0.5), (x + 0.4, *count as f64)], SERVICE.filled())
    });
    chart
        .draw_series(bars)?
        .label("groups flushed this many ms late")
        .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], SERVICE.filled()));
    let span = (0.5, most * 20.0);
    let p99 = l.histogram.value_at_quantile(0.99) as f64 / 1000.0;
    let measured = SECOND.stroke_width(2);
    chart
        .draw_series(LineSeries::new([(p99, span.0), (p99, span.1)], measured))?
        .label(format!("measured p99: {p99:.0} ms"))
        .legend(line_mark(measured));
    let target = TARGET.stroke_width(2);
    let p99_target = format!("p99 target: ≤ {:.0} ms", l.p99_target_ms);
    vertical(&mut chart, l.p99_target_ms, span, target, p99_target)?;
    let max_target = format!("max target: ≤ {:.0} ms", l.max_target_ms);
    let dotted = TARGET.mix(0.6).stroke_width(2);
    vertical(&mut chart, l.max_target_ms, span, dotted, max_target)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

/// Latency (ms) against percentile on the nines scale, up to the deepest
/// percentile the samples resolve.
fn percentile_curve(h: &Histogram<u64>) -> (f64, Vec<(f64, f64)>) {
    let deepest = (h.len().max(10) as f64).log10().min(MAX_NINES);
    let steps = (deepest * 50.0).ceil() as usize;
    let points = (0..=steps)
        .map(|i| {
            let x = deepest * i as f64 / steps as f64;
            let q = 1.0 - 10f64.powf(-x);
            (x, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect();
    (deepest, points)
}

/// Flush-to-subscriber latency by percentile, the p99 target as a dashed
/// line and the measured p99 as a point.
pub(super) fn delivery(path: &Path, h: &Histogram<u64>, target_ms: f64) -> Drawn {
    let (deepest, points) = percentile_curve(h);
    let top = points.iter().map(|(_, y)| *y).fold(target_ms, f64::max) * 1.3;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "Flush-to-subscriber latency, {} deliveries (scenario 4)",
        h.len()
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, caption_style())
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..deepest, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("percentile of deliveries (log scale of nines)")
        .y_desc("latency (ms): received − flushed_at")
        .x_labels((deepest.floor() as usize + 1).max(2))
        .x_label_formatter(&|x| percentile_label(*x))
        .label_style(label_style())
        .draw()?;
    let line = SERVICE.stroke_width(2);
    chart
        .draw_series(LineSeries::new(points, line))?
        .label("latency at this percentile")
        .legend(line_mark(line));
    let target = TARGET.stroke_width(2);
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, target_ms), (deepest, target_ms)],
            6,
            4,
            target,
        ))?
        .label(format!("p99 target: ≤ {target_ms:.0} ms"))
        .legend(line_mark(target));
    let p99 = h.value_at_quantile(0.99) as f64 / 1000.0;
    chart
        .draw_series([Circle::new((nines(0.99), p99), 6, SECOND.filled())])?
        .label(format!("measured p99: {p99:.1} ms"))
        .legend(|(x, y)| Circle::new((x + 10, y), 6, SECOND.filled()));
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}
