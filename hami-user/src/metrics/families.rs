//! Making and registering the gauge and counter families, and clamping `u64` figures into
//! the gauges' `i64`.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

/// A gauge family `name` with `labels`, registered in `r`.
pub(super) fn gauge_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// A gauge `name`, registered in `r`.
pub(super) fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// A counter `name`, registered in `r`.
pub(super) fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// `v` as a gauge value (`i64::MAX` at most).
pub(super) fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}
