//! The scale chart: p99 Add latency against the number of open groups (log
//! scale), on fresh services and on the service that opened the groups, with
//! the target as a dashed line.

use std::path::Path;

use plotters::prelude::*;

use super::{Drawn, HEIGHT, SECOND, SERVICE, ScalePoints, TARGET, WIDTH};
use super::{caption_style, label_style, legend, line_mark, si};

/// A log axis label: 1, 2 or 5 times a power of ten, as 2k or 1M; ""
/// for the ticks in between, which would crowd the axis.
fn round_label(v: f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-6) {
        si(v)
    } else {
        String::new()
    }
}

/// Draws both series of `s` as lines with points, and the target line:
/// `target_ratio` × the first fresh probe's p99.
pub(super) fn p99_by_groups(path: &Path, s: &ScalePoints) -> Drawn {
    let all = || s.fresh.iter().chain(&s.opening);
    let fewest = all().map(|(g, _)| *g).min().unwrap_or(1).max(1) as f64;
    let most = all().map(|(g, _)| *g).max().unwrap_or(1).max(1) as f64;
    let base = s.fresh.first().map_or(0.0, |(_, ms)| *ms);
    let target_ms = base * s.target_ratio;
    // Room above the points for the legend.
    let top = all().map(|(_, ms)| *ms).fold(target_ms, f64::max) * 1.7;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_range = (fewest / 2.0..most * 2.0).log_scale();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "p99 Add latency against open groups (scenario 5)",
            caption_style(),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("open groups in Redis (log scale)")
        .y_desc("p99 Add latency (ms)")
        .x_label_formatter(&|v| round_label(*v))
        .x_max_light_lines(0)
        .label_style(label_style())
        .draw()?;
    for (points, name, colour) in [
        (&s.fresh, "fresh service over the groups (row 5)", SERVICE),
        (
            &s.opening,
            "the service that opened them, as it went",
            SECOND,
        ),
    ] {
        let points: Vec<(f64, f64)> = points.iter().map(|(g, ms)| (*g as f64, *ms)).collect();
        let line = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), line))?
            .label(name)
            .legend(line_mark(line));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 5, colour.filled())))?;
    }
    let target = TARGET.stroke_width(2);
    let span = [(fewest / 2.0, target_ms), (most * 2.0, target_ms)];
    chart
        .draw_series(DashedLineSeries::new(span, 6, 4, target))?
        .label(format!(
            "target: ≤ {target_ms:.2} ms ({}× the fresh p99 at {})",
            s.target_ratio,
            si(fewest)
        ))
        .legend(line_mark(target));
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_label;

    /// Only 1, 2 and 5 times a power of ten are labelled on the log axis.
    #[test]
    fn labels_only_round_ticks() {
        assert_eq!(round_label(1_000.0), "1k");
        assert_eq!(round_label(20_000.0), "20k");
        assert_eq!(round_label(500_000.0), "500k");
        assert_eq!(round_label(3_000.0), "");
    }
}
