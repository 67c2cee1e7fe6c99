//! The throughput chart: one horizontal bar per ceiling and ingest scenario,
//! items per second, with each scenario's target marked on its bar.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Bar, Drawn, REFERENCE, SERVICE, TARGET, WIDTH};
use super::{caption_style, label_style, legend, si};

/// Height of one bar's band, in pixels, and of the rest of the chart.
const BAND: u32 = 60;
const FRAME: u32 = 150;

/// Draws `bars` top to bottom: ceilings grey, the service's scenarios blue,
/// a red dashed mark at the items/s a scenario's target asks for, and each
/// bar's label and figure above it.
pub(super) fn throughput(path: &Path, bars: &[Bar]) -> Drawn {
    let n = bars.len();
    let root = SVGBackend::new(path, (WIDTH, FRAME + BAND * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = bars
        .iter()
        .flat_map(|b| [b.per_sec, b.target.unwrap_or(0.0)])
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Ingest throughput against the raw Redis/Lua ceilings",
            caption_style(),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..top * 1.6, 0.0..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("items per second (ceilings: EVALSHA calls per second, one item each)")
        .x_label_formatter(&|v| si(*v))
        .label_style(label_style())
        .draw()?;
    // Bar i is drawn in band n-1-i, so the first bar is on top.
    let band = |i: usize| (n - 1 - i) as f64;
    for (ceiling, name, colour) in [
        (true, "ceiling (redis-benchmark on raw Redis)", REFERENCE),
        (false, "the service (scenario)", SERVICE),
    ] {
        let rects = bars
            .iter()
            .enumerate()
            .filter(|(_, b)| b.ceiling == ceiling)
            .map(|(i, b)| {
                let y = band(i);
                Rectangle::new([(0.0, y + 0.1), (b.per_sec, y + 0.5)], colour.filled())
            });
        chart
            .draw_series(rects)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], colour.filled()));
    }
    let above = label_style().pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let text = format!("{}: {} items/s", b.label, si(b.per_sec));
        Text::new(text, (top * 0.005, band(i) + 0.75), above.clone())
    }))?;
    let style = TARGET.stroke_width(3);
    let mut marked = false;
    for (i, b) in bars.iter().enumerate() {
        let Some(target) = b.target else { continue };
        let (y, x) = (band(i), target);
        let mark = DashedLineSeries::new([(x, y + 0.02), (x, y + 0.58)], 5, 3, style);
        let series = chart.draw_series(mark)?;
        if !std::mem::replace(&mut marked, true) {
            series
                .label("target: at least this many items/s")
                .legend(super::line_mark(style));
        }
    }
    // The axis runs to 1.6× the longest bar, which leaves this corner free.
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}
