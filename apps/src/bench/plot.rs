//! `--plot FILE.svg`: pingpong's latency, or streaming's bandwidth and
//! message rate (two panels, one above the other), against message size.
//!
//! The axes are chosen here rather than by plotters, so that they read at
//! a glance: sizes on a log2 axis labelled in bytes (1 B, 4 KiB, 1 MiB)
//! from the smallest size run to the largest; values on a log axis where
//! they span a decade or more, else on a linear one from 0; on both, the
//! labelled ticks enclose every plotted point. A run of one size still
//! gets an axis around it, and its values in the legend.

use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;

use super::op::OpKind;
use super::report::{PingpongRow, Row, StreamingRow};
use super::{App, Params, sizes};

/// At most this many labelled ticks on the size axis (about 60 px a label).
const MAX_SIZE_TICKS: usize = 12;

/// Octaves of room either side of the smallest and largest size.
const SIZE_MARGIN: f64 = 0.4;

/// How a value maps to a plot coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scale {
    /// Bytes on log2; 0 B, which log2 has no place for, at `zero_at`.
    Size {
        zero_at: f64,
    },
    Log,
    Linear,
}

/// An axis: its range and ticks in plot coordinates (log2 bytes, log10 of
/// the value or the value itself).
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    scale: Scale,
    pub range: Range<f64>,
    /// Labelled ticks, in order.
    pub ticks: Vec<(f64, String)>,
    /// Grid lines without labels (each octave; 2 to 9 times each decade).
    pub light: Vec<f64>,
}

impl Axis {
    /// Where `value` sits on this axis.
    pub fn pos(&self, value: f64) -> f64 {
        match self.scale {
            Scale::Size { zero_at } if value <= 0.0 => zero_at,
            Scale::Size { .. } => value.log2(),
            Scale::Log => value.log10(),
            Scale::Linear => value,
        }
    }

    pub fn is_log(&self) -> bool {
        self.scale != Scale::Linear
    }

    /// The label of the tick nearest `at`: plotters asks by position.
    fn label_at(&self, at: f64) -> String {
        let distance = |t: &&(f64, String)| (t.0 - at).abs();
        let nearest = self.ticks.iter().min_by(|a, b| distance(a).total_cmp(&distance(b)));
        nearest.map(|(_, label)| label.clone()).unwrap_or_default()
    }
}

// plotters draws an axis by asking it for key points and their labels:
// these are ours.
impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, at: &f64, limit: (i32, i32)) -> i32 {
        let fraction = (at - self.range.start) / (self.range.end - self.range.start);
        limit.0 + (f64::from(limit.1 - limit.0) * fraction).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.iter().map(|t| t.0).collect()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, at: &f64) -> String {
        self.label_at(*at)
    }
}

/// The size axis of a run of `sizes`: log2 from the smallest size to the
/// largest (at least two octaves), ticks every 1, 2, 5 or 10 octaves from
/// 1 B (the densest that keeps to `max_ticks`, so units change on a tick);
/// a run of one size has it and the octave either side labelled. 0 B,
/// which log2 has no place for, sits a tick step left of the rest.
fn size_axis(sizes: &[u64], max_ticks: usize) -> Axis {
    let zero = sizes.contains(&0);
    let nonzero = || sizes.iter().copied().filter(|&s| s > 0);
    let (Some(min), Some(max)) = (nonzero().min(), nonzero().max()) else {
        let ticks = if zero { vec![(0.0, sizes::with_unit(0))] } else { Vec::new() };
        let scale = Scale::Size { zero_at: 0.0 };
        return Axis { scale, range: -1.0..1.0, ticks, light: Vec::new() };
    };
    let (mut lo, mut hi) = ((min as f64).log2(), (max as f64).log2());
    if hi - lo < 2.0 {
        lo = ((lo + hi) / 2.0 - 1.0).max(0.0);
        hi = lo + 2.0;
    }
    let (first, last) = (lo - SIZE_MARGIN, hi + SIZE_MARGIN);
    let grid = |step: f64| {
        let k = (first.max(0.0) / step).ceil() as i64;
        (k..).map(move |k| k as f64 * step).take_while(move |&o| o <= last)
    };
    let step = [1.0, 2.0, 5.0, 10.0, 20.0]
        .into_iter()
        .find(|&step| grid(step).count() + usize::from(zero) <= max_ticks)
        .unwrap_or(30.0);
    let (mut ticks, light): (Vec<(f64, String)>, Vec<f64>) = if min == max {
        let half = min.is_multiple_of(2).then_some(min / 2);
        let near = half.into_iter().chain([min, 2 * min, 4 * min]);
        let ticks = near.map(|s| ((s as f64).log2(), sizes::with_unit(s)));
        (ticks.filter(|t| (first..=last).contains(&t.0)).collect(), Vec::new())
    } else {
        (grid(step).map(|o| (o, sizes::with_unit(1 << o as u32))).collect(), grid(1.0).collect())
    };
    let zero_at = (lo / step).floor() * step - step;
    let mut range = first..last;
    if zero {
        ticks.insert(0, (zero_at, sizes::with_unit(0)));
        range.start = zero_at - SIZE_MARGIN;
    }
    Axis { scale: Scale::Size { zero_at }, range, ticks, light }
}

/// The value axis for `values`: log where they span a decade or more (and
/// none is 0), else linear from 0; between 4 and `max_ticks` labelled
/// ticks, the lowest at or below the smallest value and the highest at or
/// above the largest.
fn value_axis(values: &[f64], max_ticks: usize) -> Axis {
    let (min, max) =
        values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    if min > 0.0 && max / min >= 10.0 { log_axis(min, max, max_ticks) } else { linear_axis(max) }
}

/// Ticks at `mantissas` times every `decades`-th power of ten, from the
/// last at or below `lo` to the first at or above `hi`.
fn log_ticks(lo: f64, hi: f64, mantissas: &[f64], decades: i32) -> Vec<f64> {
    let e_lo = (lo.log10().floor() as i32).div_euclid(decades) * decades - decades;
    let e_hi = hi.log10().ceil() as i32 + decades;
    let all: Vec<f64> = (e_lo..=e_hi)
        .step_by(decades as usize)
        .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
        .collect();
    let from = all.iter().rposition(|&t| t <= lo).unwrap_or(0);
    let to = all.iter().position(|&t| t >= hi).unwrap_or(all.len() - 1);
    all[from..=to].to_vec()
}

fn log_axis(min: f64, max: f64, max_ticks: usize) -> Axis {
    // A little room, so that no point sits on the frame.
    let (lo, hi) = (min / 1.05, max * 1.05);
    let sequences: [(&[f64], i32); 6] = [
        (&[1.0, 2.0, 5.0], 1),
        (&[1.0, 3.0], 1),
        (&[1.0], 1),
        (&[1.0], 2),
        (&[1.0], 3),
        (&[1.0], 5),
    ];
    let ticks = sequences
        .iter()
        .map(|&(mantissas, decades)| log_ticks(lo, hi, mantissas, decades))
        .find(|t| t.len() <= max_ticks)
        .unwrap_or_else(|| log_ticks(lo, hi, &[1.0], 10));
    let range = ticks[0].log10()..ticks[ticks.len() - 1].log10();
    let light = (range.start.floor() as i32..=range.end.ceil() as i32)
        .flat_map(|e| (2..10).map(move |m| (f64::from(m) * 10f64.powi(e)).log10()))
        .filter(|at| range.contains(at))
        .collect();
    let ticks = ticks.into_iter().map(|t| (t.log10(), tick_number(t))).collect();
    Axis { scale: Scale::Log, range, ticks, light }
}

fn linear_axis(max: f64) -> Axis {
    let top = if max > 0.0 { max * 1.05 } else { 1.0 };
    // A step of 1, 2, 2.5 or 5 times a power of ten, the smallest that
    // makes at most 8 intervals: 4 to 8 of them.
    let raw = top / 8.0;
    let magnitude = 10f64.powi(raw.log10().floor() as i32);
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude);
    let n = (top / step).ceil() as u32;
    let ticks = (0..=n).map(|k| f64::from(k) * step).map(|t| (t, tick_number(t))).collect();
    Axis { scale: Scale::Linear, range: 0.0..f64::from(n) * step, ticks, light: Vec::new() }
}

/// A tick's value, with no more digits than it has: 0.05, 2.5, 20000.
fn tick_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let decimals = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').into() } else { text }
}

/// One line: a name for the legend and its points, (bytes, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: &'static str,
    pub color: RGBColor,
    pub points: Vec<(u64, f64)>,
}

impl Series {
    /// The line through `points` in size order (`-S` may list sizes in any).
    fn new(name: &'static str, color: RGBColor, mut points: Vec<(u64, f64)>) -> Series {
        points.retain(|p| p.1.is_finite());
        points.sort_by_key(|p| p.0);
        Series { name, color, points }
    }
}

/// One chart of the picture.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Above the chart, when the picture has several.
    pub caption: Option<&'static str>,
    pub y_desc: String,
    /// The values' unit.
    pub unit: &'static str,
    pub y: Axis,
    pub series: Vec<Series>,
}

/// What `--plot` draws.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub title: String,
    pub x: Axis,
    pub panels: Vec<Panel>,
}

// Tableau's first colours: distinct, and readable on white.
const TAB_BLUE: RGBColor = RGBColor(31, 119, 180);
const TAB_ORANGE: RGBColor = RGBColor(255, 127, 14);
const TAB_RED: RGBColor = RGBColor(214, 39, 40);

/// Labelled value ticks per panel: a tall one, and each of two stacked.
const MAX_VALUE_TICKS: usize = 12;
const MAX_VALUE_TICKS_STACKED: usize = 8;

impl Plot {
    /// The plot of `rows`, a run of `app` with `params`.
    pub fn of_run(app: App, op: OpKind, params: &Params, rows: &[Row]) -> Plot {
        let mut title = format!("efapoll {}: -p {} -o {}", app.name(), params.device, op.name());
        let panels = match app {
            App::Pingpong => {
                let pick = |f: fn(&PingpongRow) -> f64| {
                    let rows = rows.iter().filter_map(|row| match row {
                        Row::Pingpong(r) => Some((r.bytes, f(r))),
                        Row::Streaming(_) => None,
                    });
                    rows.collect()
                };
                title += &format!(", {}", op.latency_label());
                vec![panel(
                    None,
                    &format!("{} (µs)", op.latency_label()),
                    "µs",
                    vec![
                        Series::new("p50", TAB_BLUE, pick(|r| r.t_p50_us)),
                        Series::new("avg", TAB_ORANGE, pick(|r| r.t_avg_us)),
                        Series::new("p99", TAB_RED, pick(|r| r.t_p99_us)),
                    ],
                    MAX_VALUE_TICKS,
                )]
            }
            App::Streaming => {
                let pick = |f: fn(&StreamingRow) -> f64| {
                    let rows = rows.iter().filter_map(|row| match row {
                        Row::Streaming(r) => Some((r.bytes, f(r))),
                        Row::Pingpong(_) => None,
                    });
                    rows.collect::<Vec<_>>()
                };
                title += &format!(", window {}", params.window);
                // Messages of 0 B move no bytes: no bandwidth to draw.
                let moving = |mut points: Vec<(u64, f64)>| {
                    points.retain(|&(bytes, _)| bytes > 0);
                    points
                };
                vec![
                    panel(
                        Some("bandwidth"),
                        "bandwidth (MB/s = 10^6 bytes/s)",
                        "MB/s",
                        vec![
                            Series::new("peak", TAB_RED, moving(pick(|r| r.bw_peak_mb_s))),
                            Series::new("average", TAB_BLUE, moving(pick(|r| r.bw_avg_mb_s))),
                        ],
                        MAX_VALUE_TICKS_STACKED,
                    ),
                    panel(
                        Some("message rate"),
                        "message rate (Mmsg/s)",
                        "Mmsg/s",
                        vec![Series::new("average", TAB_BLUE, pick(|r| r.mmsg_per_s))],
                        MAX_VALUE_TICKS_STACKED,
                    ),
                ]
            }
        };
        if params.flows > 1 {
            title += &format!(", {} flows", params.flows);
        }
        let sizes: Vec<u64> = rows
            .iter()
            .map(|row| match row {
                Row::Pingpong(r) => r.bytes,
                Row::Streaming(r) => r.bytes,
            })
            .collect();
        Plot { title, x: size_axis(&sizes, MAX_SIZE_TICKS), panels }
    }

    /// Whether only one size was run: the legend gives its values.
    fn single_size(&self) -> bool {
        let mut sizes = self.panels.iter().flat_map(|p| &p.series).flat_map(|s| &s.points);
        let first = sizes.next().map(|p| p.0);
        sizes.all(|p| Some(p.0) == first)
    }
}

/// A panel of `series`, with a value axis that fits them.
fn panel(
    caption: Option<&'static str>,
    y_desc: &str,
    unit: &'static str,
    series: Vec<Series>,
    max_ticks: usize,
) -> Panel {
    let values: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).collect();
    let y = value_axis(&values, max_ticks);
    let y_desc = if y.is_log() { format!("{y_desc}, log scale") } else { y_desc.to_owned() };
    Panel { caption, y_desc, unit, y, series }
}

/// Where the legend goes: the corner whose quarter of the panel holds the
/// fewest points (the upper left on a tie).
fn legend_corner(x: &Axis, panel: &Panel) -> SeriesLabelPosition {
    let fraction = |a: &Axis, v: f64| (a.pos(v) - a.range.start) / (a.range.end - a.range.start);
    let mut count = [0usize; 4]; // upper left, upper right, lower left, lower right
    for &(bytes, v) in panel.series.iter().flat_map(|s| &s.points) {
        let right = fraction(x, bytes as f64) > 0.5;
        let lower = fraction(&panel.y, v) < 0.5;
        count[usize::from(lower) * 2 + usize::from(right)] += 1;
    }
    let corners = [
        SeriesLabelPosition::UpperLeft,
        SeriesLabelPosition::UpperRight,
        SeriesLabelPosition::LowerLeft,
        SeriesLabelPosition::LowerRight,
    ];
    let best = (0..4).min_by_key(|&i| count[i]).expect("four corners");
    corners[best].clone()
}

/// Draws the plot of `rows` (a run of `app` with `params`) into an SVG
/// file at `path`.
pub fn draw(
    path: &Path,
    app: App,
    op: OpKind,
    params: &Params,
    rows: &[Row],
) -> Result<(), String> {
    render(path, &Plot::of_run(app, op, params, rows))
}

/// Draws `plot` into an SVG file at `path`.
fn render(path: &Path, plot: &Plot) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let height = 140 + 420 * plot.panels.len() as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root.titled(&plot.title, ("sans-serif", 24)).map_err(|x| e(&x))?;
    let single = plot.single_size();
    let x = &plot.x;
    for (area, panel) in root.split_evenly((plot.panels.len(), 1)).iter().zip(&plot.panels) {
        let mut builder = ChartBuilder::on(area);
        if let Some(caption) = panel.caption {
            builder.caption(caption, ("sans-serif", 18));
        }
        let mut chart = builder
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d(x.clone(), panel.y.clone())
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("message size, log2 scale")
            .y_desc(panel.y_desc.as_str())
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .bold_line_style(RGBColor(190, 190, 190))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|x| e(&x))?;
        for series in &panel.series {
            let color = series.color;
            let points: Vec<(f64, f64)> =
                series.points.iter().map(|&(b, v)| (x.pos(b as f64), panel.y.pos(v))).collect();
            let name = match series.points.first() {
                Some(&(_, v)) if single => {
                    format!("{}: {} {}", series.name, legend_number(v), panel.unit)
                }
                _ => series.name.to_owned(),
            };
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&at| Circle::new(at, 4, color.filled())))
                .map_err(|x| e(&x))?;
        }
        chart
            .configure_series_labels()
            .position(legend_corner(x, panel))
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(120, 120, 120))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// A measured value as the legend gives it: 3 significant digits.
fn legend_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Axis {
        fn labels(&self) -> Vec<&str> {
            self.ticks.iter().map(|(_, label)| label.as_str()).collect()
        }

        /// Where the lowest and highest labelled ticks sit.
        fn tick_span(&self) -> (f64, f64) {
            (self.ticks[0].0, self.ticks[self.ticks.len() - 1].0)
        }
    }

    /// The SVG's texts: plotters writes each on a line of its own.
    fn texts(svg: &str) -> Vec<&str> {
        svg.lines().filter(|l| !l.starts_with('<')).collect()
    }

    fn params(app: App, device: &str, op: OpKind, flows: usize) -> Params {
        Params {
            app: app.name().into(),
            device: device.into(),
            op: op.name().into(),
            sizes: Vec::new(),
            iterations: Vec::new(),
            warmup: 10,
            window: 64,
            verify: false,
            flows,
            duration_ms: None,
            prime: true,
        }
    }

    fn pingpong(bytes: u64, p50: f64, avg: f64, p99: f64) -> Row {
        Row::Pingpong(PingpongRow {
            bytes,
            iterations: 2000,
            t_min_us: p50 * 0.9,
            t_p50_us: p50,
            t_avg_us: avg,
            t_p99_us: p99,
            t_p999_us: p99 * 2.0,
            t_max_us: p99 * 3.0,
            mb_per_s: bytes as f64 / avg,
            mmsg_per_s: 1.0 / avg,
            batch: 1,
            t_stddev_us: 0.01,
        })
    }

    fn streaming(bytes: u64, peak: f64, avg: f64, mmsg: f64) -> Row {
        Row::Streaming(StreamingRow {
            bytes,
            iterations: 2000,
            window: 64,
            bw_peak_mb_s: peak,
            bw_avg_mb_s: avg,
            mmsg_per_s: mmsg,
            usec_per_xfer: 1.0 / mmsg,
            busy_pct: 100.0,
        })
    }

    /// A sim run of pingpong -S 1,64,4k,64k,1m: latency rising with size.
    fn pingpong_rows() -> Vec<Row> {
        vec![
            pingpong(1, 0.14, 0.15, 0.46),
            pingpong(64, 0.14, 0.14, 0.2),
            pingpong(4096, 0.2, 0.2, 0.35),
            pingpong(65536, 2.68, 11.79, 4.54),
            pingpong(1 << 20, 29.57, 87.08, 2101.0),
        ]
    }

    #[test]
    fn sizes_sit_on_log2_ticks_labelled_with_units() {
        let x = size_axis(&[1, 64, 4096, 65536, 1 << 20], MAX_SIZE_TICKS);
        assert_eq!(
            x.labels(),
            [
                "1 B", "4 B", "16 B", "64 B", "256 B", "1 KiB", "4 KiB", "16 KiB", "64 KiB",
                "256 KiB", "1 MiB"
            ]
        );
        for (k, &(at, _)) in x.ticks.iter().enumerate() {
            assert_eq!(at, 2.0 * k as f64, "a tick every two octaves");
        }
        assert_eq!(x.pos(4096.0), 12.0);
        assert!(-1.0 < x.range.start && x.range.start < 0.0, "{:?}", x.range);
        assert!(20.0 < x.range.end && x.range.end < 21.0, "{:?}", x.range);
        assert_eq!(x.light.len(), 21, "a grid line each octave");
    }

    #[test]
    fn the_size_axis_spans_the_sizes_run_not_from_1_byte() {
        let x = size_axis(&[64, 4096, 65536, 1 << 20], MAX_SIZE_TICKS);
        assert_eq!(x.labels()[0], "64 B");
        assert_eq!(*x.labels().last().unwrap(), "1 MiB");
        assert!(5.0 < x.range.start && x.range.start < 6.0, "{:?}", x.range);
    }

    #[test]
    fn every_size_to_8_mib_keeps_to_the_tick_limit() {
        let x = size_axis(&sizes::all(), MAX_SIZE_TICKS);
        assert!(x.ticks.len() <= MAX_SIZE_TICKS, "{:?}", x.labels());
        assert!(x.ticks.len() >= 8, "{:?}", x.labels());
        assert_eq!(x.labels()[..3], ["1 B", "4 B", "16 B"]);
        assert!(x.range.contains(&0.0) && x.range.contains(&23.0));
        let x = size_axis(&[1, 1 << 30], MAX_SIZE_TICKS);
        assert_eq!(x.labels(), ["1 B", "32 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB"]);
    }

    #[test]
    fn one_size_is_labelled_with_the_octave_either_side() {
        assert_eq!(size_axis(&[4096], 12).labels(), ["2 KiB", "4 KiB", "8 KiB"]);
        assert_eq!(size_axis(&[1500], 12).labels(), ["750 B", "1500 B", "3000 B"]);
        assert_eq!(size_axis(&[1], 12).labels(), ["1 B", "2 B", "4 B"]);
        let x = size_axis(&[1500, 1500], 12);
        assert!(x.range.contains(&x.pos(1500.0)));
        assert!(x.light.is_empty(), "no unlabelled octaves beside the labelled sizes");
    }

    #[test]
    fn zero_bytes_sit_a_tick_step_left_of_the_smallest_size() {
        let x = size_axis(&[0, 1, 64, 8192], MAX_SIZE_TICKS);
        assert_eq!(x.labels()[..2], ["0 B", "1 B"]);
        assert!(x.pos(0.0) < x.pos(1.0));
        assert!(x.range.contains(&x.pos(0.0)));
        let step = x.ticks[2].0 - x.ticks[1].0;
        assert_eq!(x.pos(1.0) - x.pos(0.0), step);
        assert_eq!(size_axis(&[0], 12).labels(), ["0 B"]);
    }

    #[test]
    fn values_over_decades_get_a_log_axis_whose_ticks_enclose_them() {
        let values = [0.14, 0.15, 0.46, 0.2, 11.79, 29.57, 87.08, 2101.0];
        let y = value_axis(&values, MAX_VALUE_TICKS);
        assert!(y.is_log());
        let (lowest, highest) = y.tick_span();
        assert!(lowest <= y.pos(0.14), "the lowest p50 is above the lowest label");
        assert!(highest >= y.pos(2101.0));
        assert_eq!(y.range, lowest..highest);
        assert!((5..=MAX_VALUE_TICKS).contains(&y.ticks.len()), "{:?}", y.labels());
        assert_eq!(y.labels()[..3], ["0.1", "0.3", "1"]);
        // A decade and a bit: 1, 2, 5 in each.
        let y = value_axis(&[0.5, 3.0, 6.0], MAX_VALUE_TICKS);
        assert_eq!(y.labels(), ["0.2", "0.5", "1", "2", "5", "10"]);
    }

    #[test]
    fn values_within_a_decade_get_a_linear_axis_from_zero() {
        let y = value_axis(&[0.194, 0.195, 0.211], MAX_VALUE_TICKS);
        assert!(!y.is_log());
        assert_eq!(y.labels(), ["0", "0.05", "0.1", "0.15", "0.2", "0.25"]);
        assert_eq!(y.range, 0.0..0.25);
        let y = value_axis(&[7592.0], MAX_VALUE_TICKS_STACKED);
        assert_eq!(
            y.labels(),
            ["0", "1000", "2000", "3000", "4000", "5000", "6000", "7000", "8000"]
        );
        // A 0 has no place on a log axis.
        let y = value_axis(&[0.0, 500.0, 20_000.0], MAX_VALUE_TICKS);
        assert!(!y.is_log() && y.tick_span().1 >= 20_000.0);
    }

    #[test]
    fn every_value_axis_has_at_least_four_labelled_ticks_around_its_values() {
        for values in [[1.0, 1.0], [0.3, 2.9], [1e-3, 7.0], [5.0, 5e6], [99.0, 101.0], [0.0, 0.0]] {
            for max_ticks in [MAX_VALUE_TICKS, MAX_VALUE_TICKS_STACKED] {
                let y = value_axis(&values, max_ticks);
                let (lowest, highest) = y.tick_span();
                assert!((4..=max_ticks).contains(&y.ticks.len()), "{values:?}: {:?}", y.labels());
                for v in values {
                    assert!(lowest <= y.pos(v) && y.pos(v) <= highest, "{values:?}: {v}");
                }
            }
        }
    }

    #[test]
    fn tick_numbers_have_no_spare_digits() {
        assert_eq!(tick_number(0.05000000000000001), "0.05");
        assert_eq!(tick_number(2.5), "2.5");
        assert_eq!(tick_number(20_000.0), "20000");
        assert_eq!(tick_number(3.0 * 10f64.powi(-1)), "0.3");
        assert_eq!(tick_number(0.0), "0");
        assert_eq!(legend_number(0.19432), "0.194");
        assert_eq!(legend_number(7592.4), "7592");
    }

    #[test]
    fn titles_name_the_app_device_and_op() {
        let p = params(App::Pingpong, "shm", OpKind::Send, 1);
        let plot = Plot::of_run(App::Pingpong, OpKind::Send, &p, &pingpong_rows());
        assert_eq!(plot.title, "efapoll pingpong: -p shm -o send, half round trip");
        assert_eq!(plot.panels[0].y_desc, "half round trip (µs), log scale");
        let p = params(App::Pingpong, "sim", OpKind::Read, 2);
        let plot = Plot::of_run(App::Pingpong, OpKind::Read, &p, &pingpong_rows());
        assert_eq!(plot.title, "efapoll pingpong: -p sim -o read, whole round trip, 2 flows");
        let p = params(App::Streaming, "udp", OpKind::Write, 1);
        let plot = Plot::of_run(App::Streaming, OpKind::Write, &p, &[streaming(64, 1.0, 1.0, 1.0)]);
        assert_eq!(plot.title, "efapoll streaming: -p udp -o write, window 64");
    }

    #[test]
    fn pingpong_draws_p50_avg_and_p99_in_size_order() {
        let mut rows = pingpong_rows();
        rows.reverse();
        let p = params(App::Pingpong, "sim", OpKind::Send, 1);
        let plot = Plot::of_run(App::Pingpong, OpKind::Send, &p, &rows);
        let [panel] = &plot.panels[..] else { panic!("one panel") };
        let names: Vec<&str> = panel.series.iter().map(|s| s.name).collect();
        assert_eq!(names, ["p50", "avg", "p99"]);
        let p50 = &panel.series[0].points;
        assert_eq!(p50[0], (1, 0.14));
        assert_eq!(p50[4], (1 << 20, 29.57));
        assert!(panel.y.tick_span().0 <= panel.y.pos(0.14));
        assert_eq!(plot.x.labels()[0], "1 B");
    }

    #[test]
    fn streaming_draws_bandwidth_and_message_rate() {
        let rows = [
            streaming(0, 0.0, 0.0, 9.1),
            streaming(64, 430.0, 429.0, 6.7),
            streaming(4096, 14_800.0, 14_800.0, 3.6),
            streaming(1 << 20, 25_120.0, 14_500.0, 0.0138),
        ];
        let p = params(App::Streaming, "sim", OpKind::Send, 1);
        let plot = Plot::of_run(App::Streaming, OpKind::Send, &p, &rows);
        let [bandwidth, rate] = &plot.panels[..] else { panic!("two panels") };
        assert_eq!((bandwidth.caption, bandwidth.unit), (Some("bandwidth"), "MB/s"));
        assert_eq!((rate.caption, rate.unit), (Some("message rate"), "Mmsg/s"));
        assert_eq!(rate.y_desc, "message rate (Mmsg/s), log scale");
        assert_eq!(rate.series[0].points, [(0, 9.1), (64, 6.7), (4096, 3.6), (1 << 20, 0.0138)]);
        // Messages of 0 B have a rate but move no bytes.
        let peak = &bandwidth.series[0];
        assert_eq!((peak.name, peak.points.len(), peak.points[0]), ("peak", 3, (64, 430.0)));
        assert!(bandwidth.y.is_log() && bandwidth.y.tick_span().0 <= bandwidth.y.pos(429.0));
        assert!(rate.y.tick_span().0 <= rate.y.pos(0.0138));
        assert_eq!(plot.x.labels()[0], "0 B");
    }

    #[test]
    fn the_legend_takes_the_emptiest_corner() {
        let p = params(App::Streaming, "sim", OpKind::Send, 1);
        let rows: Vec<Row> = (0..8)
            .map(|k| {
                streaming(
                    64 << (2 * k),
                    100.0 * 3f64.powi(k),
                    100.0 * 3f64.powi(k),
                    9.0 / 4f64.powi(k),
                )
            })
            .collect();
        let plot = Plot::of_run(App::Streaming, OpKind::Send, &p, &rows);
        // Bandwidth rises to the right; the rate falls.
        assert_eq!(legend_corner(&plot.x, &plot.panels[0]), SeriesLabelPosition::UpperLeft);
        let rate = legend_corner(&plot.x, &plot.panels[1]);
        assert!(
            matches!(rate, SeriesLabelPosition::UpperRight | SeriesLabelPosition::LowerLeft),
            "{rate:?}"
        );
    }

    #[test]
    fn the_svg_has_the_title_size_labels_and_both_streaming_panels() {
        let path = std::env::temp_dir().join(format!("efapoll-plot-{}.svg", std::process::id()));
        let p = params(App::Streaming, "shm", OpKind::Send, 1);
        let rows =
            [streaming(64, 430.0, 429.0, 6.7), streaming(1 << 20, 25_120.0, 14_500.0, 0.0138)];
        draw(&path, App::Streaming, OpKind::Send, &p, &rows).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for text in [
            "efapoll streaming: -p shm -o send, window 64",
            "64 B",
            "1 MiB",
            "bandwidth",
            "message rate",
            "message rate (Mmsg/s), log scale",
            "peak",
        ] {
            assert!(texts(&svg).contains(&text), "{text} is not in the SVG");
        }
    }

    #[test]
    fn a_one_size_run_gives_its_values_in_the_legend() {
        let path = std::env::temp_dir().join(format!("efapoll-plot1-{}.svg", std::process::id()));
        let p = params(App::Pingpong, "sim", OpKind::Send, 1);
        draw(&path, App::Pingpong, OpKind::Send, &p, &[pingpong(4096, 0.194, 0.195, 0.211)])
            .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for text in ["p50: 0.194 µs", "p99: 0.211 µs", "4 KiB", "2 KiB", "0.25"] {
            assert!(texts(&svg).contains(&text), "{text} is not in the SVG");
        }
    }
}
