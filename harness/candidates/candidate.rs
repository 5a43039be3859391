//! A candidate process for failover tests, benchmarks and the demo.
//!
//! Runs guarded "work" (a tick every `WORK_INTERVAL_MS`, default 50) and
//! prints, one per line on stdout, with `CLOCK_MONOTONIC` nanoseconds so that
//! lines from several processes on one machine compare:
//!
//! ```text
//! READY <ns> <identity>
//! EVENT started-leading <ns> <identity>
//! WORK <ns>
//! EVENT stopped-leading <ns> <identity> <reason>
//! EVENT new-leader <ns> <holder>
//! SYNCED <ns> <objects>
//! EXIT <ns>
//! ```
//!
//! `started-leading` is printed before the first piece of work of a term and
//! `stopped-leading` after the guarded work was dropped, so every `WORK` line
//! lies inside an interval.
//!
//! With `CANDIDATE_MODE=warm`, the work is a warm-standby Controller
//! (`with_leader_election_warm`) of the `ConfigMaps` in the Lease's namespace:
//! each reconcile is a piece of work (requeued every `WORK_INTERVAL_MS`), its
//! `WORK` line stamped before it checks that the term holds; `started-leading`
//! is stamped as the first reconcile of a term begins, and `stopped-leading`
//! once the term ends (or shutdown begins: no new reconcile starts then);
//! `SYNCED` is printed once the store holds the initial listing (a warm
//! standby fills it while following). With `CANDIDATE_MODE=cold` the same
//! Controller runs cold (`with_leader_election`: it lists only once it leads),
//! for the benchmark that compares the two. SIGTERM hands over: the work stops
//! at once and the Lease is released (`shutdown` with a 5 s grace bound).
//! Settings come from the environment, as for every example (see
//! `examples/common.rs`), and so does its client: the examples' own.
//!
//! With `EXIT_ON_STDIN_EOF` set, it exits when its stdin closes (the
//! process that started it is gone).
//!
//! With `LEDGER=<ConfigMap>` (the chaos run), each piece of work is an
//! append of a line `<identity> <pid>:<term> <seq> <ns>` to that `ConfigMap`
//! in the Lease's namespace, fenced by the term
//! (`kube_runtime_lease_examples::ledger`: read, check `is_valid` and the
//! stored token, write with the resourceVersion as precondition), made inside
//! the guarded stream, so that an append still in flight when the term ends
//! is dropped with the stream; `WORK` is stamped when the append begins, and
//! `LEDGER <ns> <outcome> [n]` follows it.
//!
//! With `CANDIDATE_MODE=sharded`, it is one replica of a sharded Controller
//! (`ShardedElector`, `SHARDS` shards, default 12) of the `ConfigMaps` in the
//! Lease's namespace, the shard Leases named from `LEASE_NAME`. It prints
//! `SHARDS <ns> <identity> <list|->` whenever the shards it holds change, and
//! for each reconcile (done, or dropped when its shard is lost)
//! `RECONCILE <start ns> <object> <end ns> <shard> <fencing token>`: a
//! reconcile is two steps of 10 ms of work, and `start` and `end` are its
//! first and last points of work, each stamped before a check that the
//! shard's term still holds, so that `[start, end]` lies inside the term
//! (see `kube_runtime_lease_harness::shards`). Requeued every
//! `WORK_INTERVAL_MS` (`0`: not requeued). For the benchmark: `RECONCILE_MS`
//! sets the work per reconcile (default 20, in two steps), `CONCURRENCY` the
//! Controller's concurrency (default unbounded), and SIGUSR1 reconciles every
//! object again (`reconcile_all_on`). SIGTERM hands every shard over
//! (`shutdown`, 5 s grace).

use std::time::Duration;

use futures::StreamExt;
use kube_runtime_lease::{LeaderElectionStreamExt, LeaderElector, Lost};
use kube_runtime_lease_examples::{client, lease_config, shutdown_signal};
use kube_runtime_lease_harness::now_ns;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        kube_runtime_lease_examples::init_tracing();
    }
    // With EXIT_ON_STDIN_EOF set, the process that started this one holds
    // its stdin: when that process is gone, so is this one. A plain thread,
    // not tokio's stdin: the runtime's shutdown would wait for its blocking
    // read, so the process would not exit after a handover.
    if std::env::var_os("EXIT_ON_STDIN_EOF").is_some() {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    let config = lease_config("candidate")?;
    if std::env::var("CANDIDATE_MODE").is_ok_and(|m| m == "sharded") {
        return sharded::run(config).await;
    }
    let work_every = Duration::from_millis(
        std::env::var("WORK_INTERVAL_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50),
    );
    let elector = LeaderElector::new(client().await?, config)?;
    // The identity it campaigns with (with Coordinated Leader Election, its
    // LeaseCandidate's name: `<identity>.<lease>`), as the Lease names it.
    let identity = elector.config().identity().to_owned();

    let mut status = elector.subscribe();
    tokio::spawn(async move {
        let mut last = None;
        while status.changed().await.is_ok() {
            let holder = status.borrow_and_update().holder.clone();
            if holder != last {
                println!(
                    "EVENT new-leader {} {}",
                    now_ns(),
                    holder.as_deref().unwrap_or("")
                );
                last = holder;
            }
        }
    });
    let on_signal = elector.clone();
    let handover = tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.shutdown(Duration::from_secs(5)).await
    });
    println!("READY {} {identity}", now_ns());
    let mode = std::env::var("CANDIDATE_MODE").unwrap_or_default();
    if mode == "warm" || mode == "cold" {
        controller::run(&elector, &identity, work_every, mode == "warm").await?;
        let result = handover.await?;
        println!("EXIT {}", now_ns());
        return result.map_err(Into::into);
    }

    if let Ok(name) = std::env::var("LEDGER") {
        ledger_mode::run(&elector, &name, &identity, work_every).await?;
        let result = handover.await?;
        println!("EXIT {}", now_ns());
        return result.map_err(Into::into);
    }

    loop {
        let work = futures::stream::unfold(true, move |first| async move {
            if !first {
                tokio::time::sleep(work_every).await;
            }
            Some((first, false))
        })
        // On SIGTERM the work stops taking new items at once (as a Controller
        // wired to `graceful_shutdown_on` does), so the release follows at once.
        .take_until(elector.shutdown_requested());
        let mut guarded = std::pin::pin!(work.with_leader_election(&elector));
        let mut led = false;
        while let Some(first) = guarded.next().await {
            if first {
                led = true;
                println!("EVENT started-leading {} {identity}", now_ns());
            }
            // Stamped before a last check that the term holds, as in the
            // other modes: a process stopped (SIGSTOP) between the item and
            // its line prints no WORK once it resumes past the term, and a
            // line printed late carries the time of its check, in the term.
            let at = now_ns();
            if guarded.is_leading() {
                println!("WORK {at}");
            }
        }
        if term_ended(led, guarded.lost().as_ref(), &identity) {
            break;
        }
    }
    let result = handover.await?;
    println!("EXIT {}", now_ns());
    result.map_err(Into::into)
}

/// After a guarded stream ended: prints `stopped-leading` if it `led`, and
/// returns whether to leave (shut down, or the work ended) rather than
/// campaign again.
fn term_ended(led: bool, lost: Option<&Lost>, identity: &str) -> bool {
    if led {
        // Work that ended on the shutdown signal gave leadership up: Shutdown.
        let reason = lost.map_or_else(|| format!("{:?}", Lost::Shutdown), |l| format!("{l:?}"));
        println!("EVENT stopped-leading {} {identity} {reason}", now_ns());
    }
    matches!(lost, None | Some(Lost::Shutdown))
}

mod ledger_mode {
    //! The chaos run's candidate: each piece of guarded work is a fenced
    //! append to the ledger.

    use std::time::Duration;

    use futures::{FutureExt as _, StreamExt as _};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube_runtime_lease::{LeaderElectionStreamExt as _, LeaderElector};
    use kube_runtime_lease_examples::{
        client,
        ledger::{Appended, append},
    };
    use kube_runtime_lease_harness::now_ns;

    /// Campaigns until shutdown; each term appends to the ledger `name` every
    /// `every`. The append is the guarded stream's item, not its consumer's
    /// work, so that a request still in flight when the term ends is dropped
    /// with the stream, and `stopped-leading` is printed when the term ends,
    /// not when a request that met a fault returns.
    pub(super) async fn run(
        elector: &LeaderElector,
        name: &str,
        identity: &str,
        every: Duration,
    ) -> anyhow::Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(client().await?, elector.config().namespace());
        for round in 1u64.. {
            let (api, elector_for_work) = (api.clone(), elector.clone());
            let term = format!("{}:{round}", std::process::id());
            let (name, identity_for_work) = (name.to_owned(), identity.to_owned());
            let work = futures::stream::unfold(1u64, move |seq| {
                let (api, elector, term, name, identity) = (
                    api.clone(),
                    elector_for_work.clone(),
                    term.clone(),
                    name.clone(),
                    identity_for_work.clone(),
                );
                async move {
                    if seq > 1 {
                        tokio::time::sleep(every).await;
                    }
                    let at = now_ns();
                    // This term's guard: the stream is polled only while it holds.
                    let outcome = match elector.acquire().now_or_never() {
                        Some(Ok(guard)) => {
                            let entry = format!("{identity} {term} {seq} {at}");
                            match append(&api, &name, &guard, &entry).await {
                                Ok(Appended::Written { n }) => format!("written {n}"),
                                Ok(refused) => refused.name().to_owned(),
                                Err(e) => format!("error {e}"),
                            }
                        }
                        _ => Appended::TermEnded.name().to_owned(),
                    };
                    Some(((seq, at, outcome), seq + 1))
                }
            })
            .take_until(elector.shutdown_requested());
            let mut guarded = std::pin::pin!(work.with_leader_election(elector));
            let mut led = false;
            while let Some((seq, at, outcome)) = guarded.next().await {
                if seq == 1 {
                    led = true;
                    println!("EVENT started-leading {at} {identity}");
                }
                println!("WORK {at}");
                println!("LEDGER {} {outcome}", now_ns());
            }
            if super::term_ended(led, guarded.lost().as_ref(), identity) {
                break;
            }
        }
        Ok(())
    }
}

mod controller {
    //! The Controller candidates: warm standby, or cold.

    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use futures::{FutureExt, StreamExt};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api,
        runtime::{Controller, controller::Action, watcher},
    };
    use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector};
    use kube_runtime_lease_harness::now_ns;

    struct Ctx {
        elector: LeaderElector,
        identity: String,
        every: Duration,
        /// The fencing token of the term whose `started-leading` was printed.
        term: Mutex<Option<i64>>,
    }

    async fn reconcile(_cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let at = now_ns();
        if let Some(Ok(guard)) = ctx.elector.acquire().now_or_never() {
            let token = guard.fencing_token();
            let begun = {
                let mut term = ctx.term.lock().expect("lock");
                let begun = *term != Some(token);
                *term = Some(token);
                begun
            };
            if begun {
                println!("EVENT started-leading {at} {}", ctx.identity);
                let (identity, shutdown) = (ctx.identity.clone(), ctx.elector.shutdown_requested());
                tokio::spawn(async move {
                    let reason = futures::select! {
                        lost = guard.fuse() => format!("{lost:?}"),
                        () = shutdown.fuse() => "Shutdown".to_owned(),
                    };
                    println!("EVENT stopped-leading {} {identity} {reason}", now_ns());
                });
            }
            println!("WORK {at}");
        }
        Ok(Action::requeue(ctx.every))
    }

    pub(super) async fn run(
        elector: &LeaderElector,
        identity: &str,
        every: Duration,
        warm: bool,
    ) -> anyhow::Result<()> {
        let client = kube_runtime_lease_examples::client().await?;
        let ns = elector.config().namespace().to_owned();
        let ctx = Arc::new(Ctx {
            elector: elector.clone(),
            identity: identity.to_owned(),
            every,
            term: Mutex::new(None),
        });
        let controller = Controller::new(
            Api::<ConfigMap>::namespaced(client, &ns),
            watcher::Config::default(),
        );
        let store = controller.store();
        tokio::spawn(async move {
            // `wait_until_ready` is re-polled: kube-runtime 5's readiness
            // signal (a futures oneshot behind a mutex) keeps only the waker
            // of its last poll, and the Controller polls it too, so a second
            // waiter is never woken (it sees the signal only when polled again).
            loop {
                match tokio::time::timeout(Duration::from_millis(20), store.wait_until_ready()).await {
                    Ok(Ok(())) => break println!("SYNCED {} {}", now_ns(), store.state().len()),
                    Ok(Err(_)) => break,
                    Err(_) => {}
                }
            }
        });
        let error_policy =
            |_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>| Action::requeue(Duration::from_millis(100));
        if warm {
            controller
                .with_leader_election_warm(elector)
                .run(reconcile, error_policy, ctx)
                .for_each(|_| async {})
                .await;
        } else {
            controller
                .with_leader_election(elector)
                .run(reconcile, error_policy, ctx)
                .for_each(|_| async {})
                .await;
        }
        Ok(())
    }
}

mod sharded {
    //! The sharded candidate: one replica of a sharded Controller.

    use std::{fmt::Write as _, sync::Arc, time::Duration};

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api, ResourceExt,
        runtime::{Controller, controller::Action, watcher},
    };
    use kube_runtime_lease::{
        LeaseConfig,
        shard::{ShardConfig, ShardedElector, current_shard},
    };
    use kube_runtime_lease_examples::{client, shutdown_signal};
    use kube_runtime_lease_harness::now_ns;

    /// Steps of work per reconcile.
    const STEPS: u32 = 2;

    struct Ctx {
        sharded: ShardedElector,
        /// Requeued after this (`None`: not requeued).
        every: Option<Duration>,
        /// The length of each step.
        step: Duration,
    }

    fn env_u64(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// One reconcile's record, printed when it ends (done or dropped).
    struct Record {
        object: String,
        shard: u16,
        token: i64,
        start: u64,
        last: u64,
    }

    impl Drop for Record {
        fn drop(&mut self) {
            println!(
                "RECONCILE {} {} {} {} {}",
                self.start, self.object, self.last, self.shard, self.token
            );
        }
    }

    async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let Some(current) = current_shard() else {
            return Ok(Action::await_change());
        };
        // The guard of the term this reconcile runs in (none: that term ended).
        let Some(guard) = ctx
            .sharded
            .guard(current.shard)
            .filter(|g| g.fencing_token() == current.fencing_token)
        else {
            return Ok(Action::await_change());
        };
        // Each point of work is stamped, then checked: it lies in the term.
        let start = now_ns();
        if !guard.is_valid() {
            return Ok(Action::await_change());
        }
        let mut record = Record {
            object: cm.name_any(),
            shard: current.shard,
            token: current.fencing_token,
            start,
            last: start,
        };
        for _ in 0..STEPS {
            tokio::time::sleep(ctx.step).await;
            let at = now_ns();
            if !guard.is_valid() {
                return Ok(Action::await_change());
            }
            record.last = at;
        }
        drop(record);
        Ok(ctx.every.map_or_else(Action::await_change, Action::requeue))
    }

    pub(super) async fn run(config: LeaseConfig) -> anyhow::Result<()> {
        let identity = config.identity().to_owned();
        let namespace = config.namespace().to_owned();
        let shards = u16::try_from(env_u64("SHARDS", 12))?;
        let every = Some(env_u64("WORK_INTERVAL_MS", 100))
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        let step = Duration::from_millis(env_u64("RECONCILE_MS", 20)) / STEPS;
        let concurrency = u16::try_from(env_u64("CONCURRENCY", 0))?;
        let client = client().await?;
        let sharded = ShardedElector::new(client.clone(), ShardConfig::new(config, shards))?;
        let mut held = sharded.held();
        let who = identity.clone();
        tokio::spawn(async move {
            loop {
                let list = held
                    .borrow_and_update()
                    .iter()
                    .fold(String::new(), |mut s, shard| {
                        let _ = write!(s, "{}{shard}", if s.is_empty() { "" } else { "," });
                        s
                    });
                let list = if list.is_empty() { "-".to_owned() } else { list };
                println!("SHARDS {} {who} {list}", now_ns());
                if held.changed().await.is_err() {
                    return;
                }
            }
        });
        let on_signal = sharded.clone();
        let handover = tokio::spawn(async move {
            shutdown_signal().await;
            on_signal.shutdown(Duration::from_secs(5)).await;
        });
        println!("READY {} {identity}", now_ns());
        // SIGUSR1: every object reconciled again (the benchmark's pass).
        let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
        let again = futures::stream::poll_fn(move |cx| usr1.poll_recv(cx));
        let controller = Controller::new(
            Api::<ConfigMap>::namespaced(client, &namespace),
            watcher::Config::default(),
        )
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_all_on(again);
        let ctx = Arc::new(Ctx {
            sharded: sharded.clone(),
            every,
            step,
        });
        let error_policy =
            |_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Ctx>| Action::requeue(Duration::from_millis(100));
        let run = sharded
            .controller(controller)
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {});
        tokio::select! {
            () = run => {}
            handed = handover => handed?,
        }
        println!("EXIT {}", now_ns());
        Ok(())
    }
}
