//! Percentiles of measured durations.

/// The nearest-rank `p`-th percentile (`p` in `0.0..=1.0`) of `sorted`, which
/// must be sorted ascending (`sort_by(f64::total_cmp)`): with 20 samples, p99
/// is the maximum; p0 is the minimum.
///
/// # Panics
/// When `sorted` is empty.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "sample counts are far below 2^52, and the rank is clamped to the samples"
)]
#[must_use]
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert!((percentile(&v, 0.5) - 10.0).abs() < f64::EPSILON);
        assert!((percentile(&v, 0.99) - 20.0).abs() < f64::EPSILON);
        assert!((percentile(&v, 0.0) - 1.0).abs() < f64::EPSILON);
        assert!((percentile(&[3.0], 0.5) - 3.0).abs() < f64::EPSILON);
    }
}
