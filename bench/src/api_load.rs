//! The API-load scenario: apiserver request rates on leases, and the idle
//! cost of the candidates, over fixed windows.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use kube_runtime_lease_harness::{Kind, TestEnv, metric_label, metric_samples, now_ns};
use serde::{Deserialize, Serialize};

use crate::candidate::{Candidate, Ctx, proc_sched_ms};
use crate::impls::{IMPLS, Impl, TIMINGS, Timing};
use crate::machine::loadavg;
use crate::{create_free_lease, ms_between};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Scrape {
    pub at_ns: u64,
    /// apiserver_request_total{resource="leases"} summed by verb.
    pub requests: BTreeMap<String, f64>,
    /// apiserver_longrunning_requests{resource="leases",verb="WATCH"}.
    pub watches_open: f64,
}

async fn scrape(env: &TestEnv) -> Result<Scrape> {
    let text = env.metrics_text().await?;
    let at_ns = now_ns();
    let mut s = Scrape {
        at_ns,
        ..Scrape::default()
    };
    let on_leases = |(line, _): &(&str, f64)| metric_label(line, "resource") == Some("leases");
    for (line, value) in metric_samples(&text, "apiserver_request_total").filter(on_leases) {
        let verb = metric_label(line, "verb").unwrap_or("?").to_owned();
        *s.requests.entry(verb).or_default() += value;
    }
    s.watches_open += metric_samples(&text, "apiserver_longrunning_requests")
        .filter(on_leases)
        .filter(|(line, _)| metric_label(line, "verb") == Some("WATCH"))
        .map(|(_, value)| value)
        .sum::<f64>();
    Ok(s)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Window {
    /// None for the baseline (no candidates).
    pub implementation: Option<Impl>,
    pub timing: Option<String>,
    pub candidates: usize,
    pub seconds: f64,
    /// Requests per minute by verb over the window (baseline not subtracted).
    pub per_minute: BTreeMap<String, f64>,
    /// Watches open on leases at the end of the window.
    pub watches_open: f64,
    pub loadavg: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Idle {
    pub implementation: Impl,
    pub timing: String,
    pub role: String,
    pub seconds: f64,
    pub cpu_ms: f64,
    /// The same from schedstat (ns resolution).
    #[serde(default)]
    pub sched_cpu_ms: f64,
    pub rss_kib: u64,
    pub loadavg: f64,
}

fn rate(a: &Scrape, b: &Scrape) -> (f64, BTreeMap<String, f64>) {
    let secs = ms_between(a.at_ns, b.at_ns) / 1000.0;
    let mut out = BTreeMap::new();
    for (verb, v) in &b.requests {
        let d = v - a.requests.get(verb).copied().unwrap_or(0.0);
        out.insert(verb.clone(), d / secs * 60.0);
    }
    (secs, out)
}

/// Measures one window: scrapes around it, and CPU/RSS of `watched`.
#[allow(
    clippy::too_many_arguments,
    reason = "one call site per scenario phase; a struct would only rename them"
)]
async fn window(
    ctx: &Ctx,
    imp: Option<Impl>,
    t: Option<Timing>,
    candidates: usize,
    len: Duration,
    watched: &[(&Candidate, &str)],
    windows: &mut Vec<Window>,
    idle: &mut Vec<Idle>,
) -> Result<()> {
    let cpu0: Vec<_> = watched.iter().map(|(c, _)| c.cpu_rss()).collect::<Result<_>>()?;
    let sched0: Vec<f64> = watched.iter().map(|(c, _)| proc_sched_ms(c.pid)).collect();
    let a = scrape(&ctx.env).await?;
    tokio::time::sleep(len).await;
    let b = scrape(&ctx.env).await?;
    let cpu1: Vec<_> = watched.iter().map(|(c, _)| c.cpu_rss()).collect::<Result<_>>()?;
    let sched1: Vec<f64> = watched.iter().map(|(c, _)| proc_sched_ms(c.pid)).collect();
    let (secs, per_minute) = rate(&a, &b);
    let la = loadavg();
    eprintln!(
        "  window {} {} n={candidates}: {:?} req/min, {} watches open (load {la})",
        imp.map_or("baseline", Impl::name),
        t.map_or("-", |t| t.name),
        per_minute
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, v)| format!("{k}={v:.1}"))
            .collect::<Vec<_>>(),
        b.watches_open
    );
    windows.push(Window {
        implementation: imp,
        timing: t.map(|t| t.name.to_owned()),
        candidates,
        seconds: secs,
        per_minute,
        watches_open: b.watches_open,
        loadavg: la,
    });
    for (i, (((c, role), (c0, _)), (c1, rss))) in watched.iter().zip(&cpu0).zip(&cpu1).enumerate() {
        idle.push(Idle {
            implementation: c.imp,
            timing: t.map_or(String::new(), |t| t.name.to_owned()),
            role: (*role).to_owned(),
            seconds: secs,
            cpu_ms: c1 - c0,
            sched_cpu_ms: sched1[i] - sched0[i],
            rss_kib: *rss,
            loadavg: la,
        });
    }
    Ok(())
}

pub async fn scenario_api(
    ctx: &Ctx,
    quick: bool,
    windows: &mut Vec<Window>,
    idle: &mut Vec<Idle>,
) -> Result<()> {
    let base_len = Duration::from_secs(if quick { 10 } else { 60 });
    // Let the apiserver's start-up traffic settle before the baseline.
    tokio::time::sleep(Duration::from_secs(if quick { 5 } else { 20 })).await;
    eprintln!("api load: baseline window ({base_len:?}, no candidates)");
    window(ctx, None, None, 0, base_len, &[], windows, idle).await?;
    for t in TIMINGS {
        let len = Duration::from_secs(match (quick, t.lease_ms >= 15_000) {
            (true, _) => 10,
            (false, true) => 60,
            (false, false) => 30,
        });
        let settle = t.retry() * 3 + Duration::from_secs(2);
        for imp in IMPLS {
            eprintln!("api load: {} {} ({len:?} windows)", imp.name(), t.name);
            let ns = ctx.env.new_namespace(&format!("api-{}", imp.short())).await?;
            create_free_lease(&ctx.client, &ns, "bench").await?;
            let spawn = |i: usize| ctx.spawn(imp, &ns, "bench", &format!("{}-{i}", imp.short()), t);
            let leader = spawn(0)?;
            leader
                .wait_event(Kind::StartedLeading, t.lease() * 2 + Duration::from_secs(30))
                .await?;
            tokio::time::sleep(settle).await;
            window(
                ctx,
                Some(imp),
                Some(t),
                1,
                len,
                &[(&leader, "leader")],
                windows,
                idle,
            )
            .await?;
            let mut followers = Vec::new();
            for n in [3usize, 10] {
                while followers.len() + 1 < n {
                    followers.push(spawn(followers.len() + 1)?);
                }
                for f in &followers {
                    f.wait_event(Kind::Ready, Duration::from_secs(30)).await?;
                }
                tokio::time::sleep(settle).await;
                if followers.iter().any(|f| f.find(Kind::StartedLeading).is_some()) {
                    bail!(
                        "a follower of {} took the lease during the api-load scenario",
                        imp.name()
                    );
                }
                let watched: Vec<(&Candidate, &str)> = if n == 3 {
                    vec![(&followers[0], "follower")]
                } else {
                    vec![]
                };
                window(ctx, Some(imp), Some(t), n, len, &watched, windows, idle).await?;
            }
            for f in followers {
                f.stop().await;
            }
            leader.stop().await;
        }
    }
    eprintln!("api load: baseline window again");
    window(ctx, None, None, 0, base_len, &[], windows, idle).await?;
    Ok(())
}
