//! Adapter overhead: items per second through
//! `stream.with_leader_election(&elector)` versus the bare stream.
//!
//! The library is built as applications build it, with tokio's real clock:
//! without tokio's `test-util`, which adds a mock-clock check to every
//! `tokio::time::Instant::now()` (this package is built alone for that; see
//! its Cargo.toml). The elector leads against the library's Lease API double
//! (`test_util::FakeLeaseApi`, whose feature leaves tokio's clock alone)
//! plugged into a real `kube::Client`, so renewals run as in production,
//! minus the network.
//! Three inner streams:
//! - `iter`: `futures::stream::iter` — no work per item, the worst case: the
//!   adapter's fixed cost per poll is all that is measured;
//! - `mpsc`: items from a bounded tokio channel fed by another task, as a
//!   controller's event stream is;
//! - `work-1us`, `work-5us`, `work-100us`: items that cost 1, 5 and 100 µs
//!   of computation (the number of rounds is calibrated at start, so that a
//!   round of them is 1 µs on any machine). The overhead target (3 %) is for
//!   items of 5 µs or more (a Controller's items are reconciles, far longer);
//!   next to 1 µs items the adapter should cost about one clock read.
//!
//! Criterion times the bare and the wrapped stream one after the other; on a
//! shared VM, drift between the two runs is as large as the overhead. So after
//! criterion's own output an interleaved A/B measurement follows (bare and
//! wrapped batches alternating, 41 rounds, median of the per-round ratios):
//! that median is the overhead `bench-driver report` judges against the 3 %
//! target. Both are printed and written to `bench/results/adapter.json`.

use std::future::Future as _;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use futures::{Stream, StreamExt};
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector, LeaseConfig, test_util::FakeLeaseApi};
use serde_json::json;

const ITEMS: u64 = 100_000;
/// The item costs measured, in µs of computation.
const WORK_US: [u32; 3] = [1, 5, 100];
/// Rounds of the interleaved A/B measurement that follows criterion's.
const AB_ROUNDS: usize = 41;

/// An elector that leads (holding one guard for the whole benchmark, so that
/// each adapter joins the running term at once).
async fn leading_elector() -> (LeaderElector, kube_runtime_lease::LeaseGuard) {
    let config = LeaseConfig::new("default", "bench", "bench-0")
        .lease_duration(Duration::from_secs(15))
        .renew_deadline(Duration::from_secs(10))
        .retry_period(Duration::from_secs(2))
        .watch(false);
    let elector = LeaderElector::new(FakeLeaseApi::default().client().0, config).expect("valid config");
    let guard = elector.acquire().await.expect("leads against the double");
    (elector, guard)
}

/// Rounds of `spin_1us` that take a microsecond here (see [`calibrate_spin`]).
static SPIN_ROUNDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(300);

/// Sets [`SPIN_ROUNDS`] so that `spin_1us` takes 1 µs on this machine: the
/// median of 21 timings of 10,000 calls.
fn calibrate_spin() -> f64 {
    use std::sync::atomic::Ordering;
    let time = || {
        let t = std::time::Instant::now();
        for i in 0..10_000 {
            black_box(spin_1us(i));
        }
        t.elapsed().as_secs_f64() / 10_000.0
    };
    for _ in 0..2 {
        let mut samples: Vec<f64> = (0..21).map(|_| time()).collect();
        samples.sort_by(f64::total_cmp);
        let per_round = samples[10] / f64::from(SPIN_ROUNDS.load(Ordering::Relaxed));
        SPIN_ROUNDS.store((1e-6 / per_round).round().max(1.0) as u32, Ordering::Relaxed);
    }
    let mut samples: Vec<f64> = (0..21).map(|_| time()).collect();
    samples.sort_by(f64::total_cmp);
    samples[10] * 1e9
}

fn spin_1us(x: u64) -> u64 {
    spin_us(x, 1)
}

// Not inlined: the same machine code runs in the bare and the wrapped case
// (inlined, its loop compiled differently in each, by up to 30 %).
#[inline(never)]
fn spin_us(x: u64, us: u32) -> u64 {
    // `us` microseconds of arithmetic, opaque to the optimizer.
    let rounds = SPIN_ROUNDS.load(std::sync::atomic::Ordering::Relaxed) * us;
    let mut h = x;
    for _ in 0..rounds {
        h = black_box(
            h.wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407),
        );
    }
    h
}

async fn drain<S: Stream<Item = u64>>(s: S) -> u64 {
    let mut s = std::pin::pin!(s);
    let mut sum = 0u64;
    while let Some(x) = s.next().await {
        sum = sum.wrapping_add(x);
    }
    sum
}

fn mpsc_stream() -> impl Stream<Item = u64> {
    let (tx, rx) = tokio::sync::mpsc::channel::<u64>(1024);
    tokio::spawn(async move {
        for i in 0..ITEMS {
            if tx.send(i).await.is_err() {
                break;
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// Items per batch of the `work-{us}us` stream: 10 ms of work per batch.
fn work_items(us: u32) -> u64 {
    ITEMS / 10 / u64::from(us)
}

/// The µs of work per item of a `work-{us}us` stream's name.
fn work_us(stream: &str) -> Option<u32> {
    stream.strip_prefix("work-")?.strip_suffix("us")?.parse().ok()
}

fn benches(c: &mut Criterion, rt: &tokio::runtime::Runtime, elector: &LeaderElector) {
    let mut g = c.benchmark_group("adapter");
    g.throughput(Throughput::Elements(ITEMS));

    g.bench_function(BenchmarkId::new("iter", "bare"), |b| {
        b.to_async(rt).iter(|| drain(futures::stream::iter(0..ITEMS)));
    });
    g.bench_function(BenchmarkId::new("iter", "wrapped"), |b| {
        b.to_async(rt)
            .iter(|| drain(futures::stream::iter(0..ITEMS).with_leader_election(elector)));
    });
    g.bench_function(BenchmarkId::new("mpsc", "bare"), |b| {
        b.to_async(rt).iter(|| drain(mpsc_stream()));
    });
    g.bench_function(BenchmarkId::new("mpsc", "wrapped"), |b| {
        b.to_async(rt)
            .iter(|| drain(mpsc_stream().with_leader_election(elector)));
    });
    for us in WORK_US {
        let items = work_items(us);
        let name = format!("work-{us}us");
        g.throughput(Throughput::Elements(items));
        g.bench_function(BenchmarkId::new(&name, "bare"), |b| {
            b.to_async(rt)
                .iter(|| drain(futures::stream::iter(0..items).map(move |x| spin_us(x, us))));
        });
        g.bench_function(BenchmarkId::new(&name, "wrapped"), |b| {
            b.to_async(rt).iter(|| {
                drain(
                    futures::stream::iter(0..items)
                        .map(move |x| spin_us(x, us))
                        .with_leader_election(elector),
                )
            });
        });
    }
    g.throughput(Throughput::Elements(ITEMS / 10));
    // Diagnostics: the bare stream plus one clock read, or one
    // `LeaseGuard::is_valid` (mutex + clock read), per item.
    g.bench_function(BenchmarkId::new("work-1us", "bare+clock"), |b| {
        b.to_async(rt).iter(|| {
            drain(futures::stream::iter(0..ITEMS / 10).map(|x| {
                black_box(tokio::time::Instant::now());
                spin_1us(x)
            }))
        });
    });
    let diag_guard = rt.block_on(elector.acquire()).expect("leads");
    g.bench_function(BenchmarkId::new("work-1us", "bare+is_valid"), |b| {
        b.to_async(rt).iter(|| {
            drain(futures::stream::iter(0..ITEMS / 10).map(|x| {
                black_box(diag_guard.is_valid());
                spin_1us(x)
            }))
        });
    });
    g.finish();

    // The adapter's fixed cost per poll, in parts: the guard's future polled
    // while pending, and the synchronous deadline check made on every poll.
    let mut parts = c.benchmark_group("adapter-parts");
    parts.bench_function("guard-poll-pending", |b| {
        let mut guard = rt.block_on(elector.acquire()).expect("leads");
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        b.iter(|| black_box(std::pin::Pin::new(&mut guard).poll(&mut cx).is_pending()));
    });
    parts.bench_function("guard-is-valid", |b| {
        let guard = rt.block_on(elector.acquire()).expect("leads");
        b.iter(|| black_box(guard.is_valid()));
    });
    parts.bench_function("instant-now", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()));
    });
    parts.finish();
}

/// Interleaved A/B: `rounds` rounds, each timing `reps` bare batches and
/// `reps` wrapped ones back to back (the order alternating by round), so that
/// drift of the machine (frequency, neighbours on the VM) hits both alike.
/// Returns the per-round overheads (wrapped / bare - 1, in %), sorted, and the
/// median ns/item of each side.
fn interleaved(
    rt: &tokio::runtime::Runtime,
    elector: &LeaderElector,
    stream: &str,
    rounds: usize,
) -> (Vec<f64>, f64, f64) {
    let us = work_us(stream).unwrap_or(1);
    let (items, reps) = match stream {
        "iter" => (ITEMS, 100),
        "mpsc" => (ITEMS, 2),
        _ => (work_items(us), 5),
    };
    let run = |wrapped: bool| -> f64 {
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            let sum = rt.block_on(async {
                match (stream, wrapped) {
                    ("iter", false) => drain(futures::stream::iter(0..items)).await,
                    ("iter", true) => {
                        drain(futures::stream::iter(0..items).with_leader_election(elector)).await
                    }
                    ("mpsc", false) => drain(mpsc_stream()).await,
                    ("mpsc", true) => drain(mpsc_stream().with_leader_election(elector)).await,
                    (_, false) => drain(futures::stream::iter(0..items).map(|x| spin_us(x, us))).await,
                    (_, true) => {
                        drain(
                            futures::stream::iter(0..items)
                                .map(|x| spin_us(x, us))
                                .with_leader_election(elector),
                        )
                        .await
                    }
                }
            });
            black_box(sum);
        }
        t0.elapsed().as_secs_f64() * 1e9 / (reps as f64 * items as f64)
    };
    // One warm-up round.
    run(false);
    run(true);
    let (mut overheads, mut bare, mut wrapped) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (b, w) = if round % 2 == 0 {
            let b = run(false);
            (b, run(true))
        } else {
            let w = run(true);
            (run(false), w)
        };
        overheads.push((w / b - 1.0) * 100.0);
        bare.push(b);
        wrapped.push(w);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, w) = (median(&mut bare), median(&mut wrapped));
    median(&mut overheads);
    (overheads, b, w)
}

fn mean_ns(target: &std::path::Path, stream: &str, variant: &str) -> Option<f64> {
    let path = target.join(format!("criterion/adapter/{stream}/{variant}/new/estimates.json"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (elector, guard) = rt.block_on(leading_elector());
    let spin_ns = calibrate_spin();
    println!(
        "work-1us: {} rounds of arithmetic per item, {spin_ns:.0} ns",
        SPIN_ROUNDS.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Defaults that the command line (--measurement-time, --sample-size) overrides.
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(8))
        .sample_size(30)
        .configure_from_args();
    // The work-1us group has a tenth of the items per batch.
    benches(&mut c, &rt, &elector);
    c.final_summary();
    assert!(
        guard.is_valid(),
        "the elector stopped leading during the benchmark"
    );

    // bench/: where the bench workspace keeps its target/ and results/.
    let manifest = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| manifest.join("target"), Into::into);
    let mut rows = Vec::new();
    let mut parts = serde_json::Map::new();
    println!("\nadapter overhead (criterion mean time per batch):");
    let streams = [("iter".to_owned(), ITEMS), ("mpsc".to_owned(), ITEMS)]
        .into_iter()
        .chain(WORK_US.map(|us| (format!("work-{us}us"), work_items(us))));
    for (stream, items) in streams {
        let stream = stream.as_str();
        let (Some(bare), Some(wrapped)) = (
            mean_ns(&target, stream, "bare"),
            mean_ns(&target, stream, "wrapped"),
        ) else {
            println!("  {stream}: no estimates (filtered out?)");
            continue;
        };
        let (b, w) = (bare / items as f64, wrapped / items as f64);
        println!(
            "  {stream:9} bare {b:8.2} ns/item ({:.3e} items/s), wrapped {w:8.2} ns/item ({:.3e} items/s): throughput ratio {:.3}, overhead {:+.1} %",
            1e9 / b,
            1e9 / w,
            b / w,
            (w / b - 1.0) * 100.0
        );
        let (ab, ab_bare, ab_wrapped) = interleaved(&rt, &elector, stream, AB_ROUNDS);
        let q = |p: f64| ab[((p * (ab.len() - 1) as f64).round() as usize).min(ab.len() - 1)];
        println!(
            "  {stream:9} interleaved A/B, {AB_ROUNDS} rounds: bare {ab_bare:8.2} ns/item, wrapped {ab_wrapped:8.2} ns/item; overhead median {:+.1} % (quartiles {:+.1} % / {:+.1} %)",
            q(0.5),
            q(0.25),
            q(0.75)
        );
        rows.push(json!({
            "stream": stream, "items": items, "bare_ns_per_item": b, "wrapped_ns_per_item": w,
            "ab_rounds": AB_ROUNDS, "ab_bare_ns_per_item": ab_bare, "ab_wrapped_ns_per_item": ab_wrapped,
            "ab_overhead_pct_median": q(0.5), "ab_overhead_pct_q1": q(0.25), "ab_overhead_pct_q3": q(0.75),
        }));
    }
    for variant in ["bare+clock", "bare+is_valid"] {
        if let (Some(bare), Some(v)) = (
            mean_ns(&target, "work-1us", "bare"),
            mean_ns(&target, "work-1us", variant),
        ) {
            let n = (ITEMS / 10) as f64;
            println!(
                "  work-1us  {variant:13} {:8.2} ns/item: {:+.1} % over bare",
                v / n,
                (v / bare - 1.0) * 100.0
            );
            parts.insert(format!("work-1us {variant} (ns/item)"), json!(v / n));
            parts.insert("work-1us bare (ns/item)".to_owned(), json!(bare / n));
        }
    }
    parts.insert("work-1us calibrated spin (ns/item)".to_owned(), json!(spin_ns));
    for part in ["guard-poll-pending", "guard-is-valid", "instant-now"] {
        let path = target.join(format!("criterion/adapter-parts/{part}/new/estimates.json"));
        if let Some(ns) = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["mean"]["point_estimate"].as_f64())
        {
            println!("  part {part:20} {ns:8.2} ns per call");
            parts.insert(part.to_owned(), json!(ns));
        }
    }
    if !parts.is_empty() {
        let out = manifest.join("results");
        let _ = std::fs::create_dir_all(&out);
        std::fs::write(
            out.join("adapter_parts.json"),
            serde_json::to_vec_pretty(&parts).unwrap(),
        )
        .unwrap();
    }
    if !rows.is_empty() {
        let out = manifest.join("results");
        let _ = std::fs::create_dir_all(&out);
        std::fs::write(
            out.join("adapter.json"),
            serde_json::to_vec_pretty(&rows).unwrap(),
        )
        .unwrap();
    }
}
