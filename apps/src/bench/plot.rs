//! `--plot FILE.svg`: latency (pingpong) or bandwidth (streaming) against
//! message size, both axes logarithmic.

use std::path::Path;

use plotters::prelude::*;

use super::App;
use super::op::OpKind;
use super::report::Row;

type Series = (&'static str, RGBColor, Vec<(f64, f64)>);

/// Draws `rows` of a run of `op` into an SVG file at `path`.
pub fn draw(path: &Path, app: App, op: OpKind, rows: &[Row]) -> Result<(), String> {
    let (title, y_desc, series) = series(app, op, rows);
    let points = series.iter().flat_map(|(_, _, p)| p.iter());
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, f64::INFINITY, 0.0f64);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    // Log axes need positive ranges with some room around the data.
    let y_min = if y_min.is_finite() && y_min > 0.0 { y_min / 1.5 } else { 1e-3 };
    let y_max = (y_max * 1.5).max(y_min * 10.0);
    let x_min = 0.5;
    let x_max = x_max * 1.5;

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(y_desc)
        .x_label_formatter(&|x| super::sizes::human(x.round() as u64))
        .draw()
        .map_err(|x| e(&x))?;
    for (name, color, points) in series {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(PointSeries::of_element(points, 3, color.filled(), &|c, s, st| {
                EmptyElement::at(c) + Circle::new((0, 0), s, st)
            }))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

fn series(app: App, op: OpKind, rows: &[Row]) -> (String, &'static str, Vec<Series>) {
    let size = |bytes: u64| (bytes as f64).max(1.0);
    match app {
        App::Pingpong => {
            let (mut p50, mut avg, mut p99) = (Vec::new(), Vec::new(), Vec::new());
            for row in rows {
                if let Row::Pingpong(r) = row {
                    p50.push((size(r.bytes), r.t_p50_us));
                    avg.push((size(r.bytes), r.t_avg_us));
                    p99.push((size(r.bytes), r.t_p99_us));
                }
            }
            (
                format!("efapoll pingpong -o {}: {}", op.name(), op.latency_label()),
                "latency (µs)",
                vec![("p50", BLUE, p50), ("avg", GREEN, avg), ("p99", RED, p99)],
            )
        }
        App::Streaming => {
            let (mut peak, mut avg) = (Vec::new(), Vec::new());
            for row in rows {
                if let Row::Streaming(r) = row {
                    peak.push((size(r.bytes), r.bw_peak_mb_s));
                    avg.push((size(r.bytes), r.bw_avg_mb_s));
                }
            }
            (
                format!("efapoll streaming -o {}: bandwidth", op.name()),
                "MB/s (10^6 bytes/s)",
                vec![("peak", RED, peak), ("average", BLUE, avg)],
            )
        }
    }
}
