//! The failover chart (`failover.svg`).

use std::fmt::Write as _;

use super::stats::{stats, values};
use crate::chain::Trial;
use crate::impls::{IMPLS, TIMINGS};

/// A strip plot of kill → leader latencies: one panel per timing set, one
/// column per implementation, the lease duration dashed, p50 and p99 ticked.
pub(super) fn svg(trials: &[Trial]) -> String {
    let (pw, ph, top, left, gap) = (420.0, 360.0, 50.0, 60.0, 70.0);
    let width = left + 2.0 * pw + gap + 20.0;
    let height = top + ph + 70.0;
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Failover after SIGKILL: kill → new leader (each dot one trial)</text>"#,
        width / 2.0
    );
    for (pi, t) in TIMINGS.iter().enumerate() {
        let x0 = left + pi as f64 * (pw + gap);
        let all: Vec<f64> = trials
            .iter()
            .filter(|x| x.timing == t.name && x.error.is_none())
            .filter_map(|x| x.signal_to_leader_ms)
            .collect();
        let hi = all.iter().copied().fold(t.lease_ms as f64, f64::max) * 1.08;
        let lo = all.iter().copied().fold(t.lease_ms as f64, f64::min) * 0.9;
        let lo = (lo / 1000.0).floor() * 1000.0;
        let hi = (hi / 1000.0).ceil() * 1000.0;
        let y = |v: f64| top + ph - (v - lo) / (hi - lo) * ph;
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{} s (lease / renew / retry)</text>"#,
            x0 + pw / 2.0,
            top - 8.0,
            t.name
        );
        // Y ticks every second (or half second).
        let step = if hi - lo > 6000.0 { 1000.0 } else { 500.0 };
        let mut v = lo;
        while v <= hi + 1.0 {
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{:.1} s</text>"##,
                x0 + pw,
                x0 - 5.0,
                yy + 4.0,
                v / 1000.0
            );
            v += step;
        }
        let ly = y(t.lease_ms as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" x2="{}" y1="{ly:.1}" y2="{ly:.1}" stroke="#000" stroke-dasharray="6,4"/><text x="{}" y="{:.1}" text-anchor="end" font-size="11">lease duration</text>"##,
            x0 + pw,
            x0 + pw - 4.0,
            ly - 4.0
        );
        let cw = pw / 3.0;
        for (ci, imp) in IMPLS.iter().enumerate() {
            let cx = x0 + cw * (ci as f64 + 0.5);
            let vals = values(trials, *imp, t.name, |x| x.signal_to_leader_ms);
            for (i, v) in vals.iter().enumerate() {
                // Deterministic jitter.
                let jx = ((i * 37 % 19) as f64 / 19.0 - 0.5) * cw * 0.5;
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}" fill-opacity="0.65"/>"#,
                    cx + jx,
                    y(*v),
                    colors[ci]
                );
            }
            if let Some(st) = stats(&vals) {
                for (label, v) in [("p50", st.p50), ("p99", st.p99)] {
                    let yy = y(v);
                    let _ = writeln!(
                        s,
                        r#"<line x1="{:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="10">{label} {:.2} s</text>"#,
                        cx - cw * 0.35,
                        cx + cw * 0.35,
                        colors[ci],
                        cx + cw * 0.36 - 30.0,
                        yy - 3.0,
                        v / 1000.0
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{}" text-anchor="middle" fill="{}">{}</text>"#,
                top + ph + 18.0,
                colors[ci],
                imp.name()
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#444">Dots below the dashed line are not unsafe: expiry counts from the dead leader's last renewal, which came before the kill.</text>"##,
        width / 2.0,
        top + ph + 50.0
    );
    s.push_str("</svg>\n");
    s
}
