//! Standalone SVG charts for the bench's results (no external assets; open in a browser).

/// A grouped bar chart as standalone SVG: one group per label, one bar per system.
pub fn bar_chart(systems: &[&str], groups: &[(String, Vec<f64>)]) -> String {
    const COLORS: [&str; 4] = ["#8c8c8c", "#2b7bb9", "#e07b39", "#4caf50"];
    let (w, h, left, bottom, top) = (720.0, 360.0, 70.0, 50.0, 40.0);
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0f64, f64::max);
    let plot_h = h - bottom - top;
    let group_w = (w - left - 20.0) / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / systems.len().max(1) as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">Median pages/s (higher is better)</text>\n"
    );
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = h - bottom - plot_h * i as f64 / 4.0;
        s += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\n",
            w - 20.0,
            left - 6.0,
            y + 4.0,
            v
        );
    }
    for (g, (label, vals)) in groups.iter().enumerate() {
        let gx = left + g as f64 * group_w + group_w * 0.1;
        for (k, v) in vals.iter().enumerate() {
            let bh = plot_h * v / max;
            s += &format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"><title>{}: {v:.0}</title></rect>\n",
                gx + k as f64 * bar_w,
                h - bottom - bh,
                bar_w * 0.9,
                COLORS[k % COLORS.len()],
                systems[k]
            );
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>\n",
            gx + group_w * 0.4,
            h - bottom + 18.0
        );
    }
    for (k, name) in systems.iter().enumerate() {
        let x = left + k as f64 * 150.0;
        s += &format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            h - 18.0,
            COLORS[k % COLORS.len()],
            x + 16.0,
            h - 8.0
        );
    }
    s + "</svg>\n"
}

/// A line chart as standalone SVG: `x` values, one line per series (name, y values), with the
/// y axis labelled `y_label`; the point `mark` (x index) of the first series is circled.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    x: &[f64],
    series: &[(&str, Vec<f64>)],
    mark: Option<usize>,
) -> String {
    const COLORS: [&str; 4] = ["#2b7bb9", "#e07b39", "#4caf50", "#8c8c8c"];
    let (w, h, left, bottom, top) = (720.0, 360.0, 80.0, 60.0, 40.0);
    let max_y = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1e-9f64, f64::max);
    let (min_x, max_x) = x
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let span = (max_x - min_x).max(1e-9);
    let plot_w = w - left - 30.0;
    let plot_h = h - bottom - top;
    let px = |v: f64| left + plot_w * (v - min_x) / span;
    let py = |v: f64| h - bottom - plot_h * v / max_y;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">{title}</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{x_label}</text>\n\
         <text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{y_label}</text>\n",
        left + plot_w / 2.0,
        h - 22.0,
        top + plot_h / 2.0,
        top + plot_h / 2.0
    );
    for i in 0..=4 {
        let v = max_y * i as f64 / 4.0;
        s += &format!(
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>\n",
            left + plot_w,
            py(v),
            py(v),
            left - 6.0,
            py(v) + 4.0
        );
    }
    for xv in x {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{xv}</text>\n",
            px(*xv),
            h - bottom + 16.0
        );
    }
    for (k, (name, ys)) in series.iter().enumerate() {
        let pts: Vec<String> = x
            .iter()
            .zip(ys)
            .map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b)))
            .collect();
        let color = COLORS[k % COLORS.len()];
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
            pts.join(" ")
        );
        s += &format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{name}</text>\n",
            left + k as f64 * 180.0,
            h - 14.0,
            left + k as f64 * 180.0 + 16.0,
            h - 4.0
        );
    }
    if let (Some(m), Some((_, ys))) = (mark, series.first())
        && let (Some(xv), Some(yv)) = (x.get(m), ys.get(m))
    {
        s += &format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"none\" stroke=\"#d32f2f\" stroke-width=\"2\"><title>peak</title></circle>\n",
            px(*xv),
            py(*yv)
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_are_well_formed_svg() {
        let svg = bar_chart(
            &["raw-tcp", "peercache-get"],
            &[("1 thread(s)".into(), vec![100.0, 80.0])],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect").count(),
            2 + 2,
            "two bars and two legend keys"
        );
        let svg = line_chart(
            "t",
            "threads",
            "pages/s",
            &[1.0, 2.0, 4.0],
            &[("get", vec![10.0, 20.0, 15.0])],
            Some(1),
        );
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(svg.contains("<circle"));
    }
}
