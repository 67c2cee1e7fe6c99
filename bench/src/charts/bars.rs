//! The throughput chart: one horizontal bar per ingest scenario through the
//! service, items per second.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Bar, Drawn, SERVICE, WIDTH};
use super::{caption_style, label_style, si};

/// Height of one bar's band, in pixels, and of the rest of the chart.
const BAND: u32 = 60;
const FRAME: u32 = 150;

/// Draws `bars` top to bottom, each with its label and figure above it.
pub(super) fn throughput(path: &Path, bars: &[Bar]) -> Drawn {
    let n = bars.len();
    let root = SVGBackend::new(path, (WIDTH, FRAME + BAND * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = bars.iter().map(|b| b.per_sec).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("Ingest throughput through the service", caption_style())
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..top * 1.2, 0.0..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("items per second")
        .x_label_formatter(&|v| si(*v))
        .label_style(label_style())
        .draw()?;
    // Bar i is drawn in band n-1-i, so the first bar is on top.
    let band = |i: usize| (n - 1 - i) as f64;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let y = band(i);
        Rectangle::new([(0.0, y + 0.1), (b.per_sec, y + 0.5)], SERVICE.filled())
    }))?;
    let above = label_style().pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let text = format!("{}: {} items/s", b.label, si(b.per_sec));
        Text::new(text, (top * 0.005, band(i) + 0.75), above.clone())
    }))?;
    root.present()?;
    Ok(())
}
