//! Lease-based leader election for [kube-runtime] controllers and streams.
//!
//! Run several replicas of a controller (behind a `PodDisruptionBudget`) and let
//! exactly one of them reconcile: the replicas campaign for a
//! `coordination.k8s.io/v1` Lease with [client-go's `leaderelection`
//! protocol][client-go], so Rust and Go candidates honour each other, and the
//! guarded work runs only while its replica leads.
//!
//! # Quick start
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::{Api, Client};
//! use kube_runtime::{Controller, controller::Action, watcher};
//! use kube_runtime_lease::{LeaderElectionControllerExt, LeaderElector, LeaseConfig, unique_identity};
//!
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::try_default().await?;
//! // One elector per Lease; the identity must be unique per process.
//! let elector = LeaderElector::new(
//!     client.clone(),
//!     LeaseConfig::new("my-namespace", "my-controller", unique_identity()),
//! )?;
//! // On SIGTERM: finish reconciles in flight (up to 20 s), release, so that a
//! // standby takes over at once.
//! let on_sigterm = elector.clone();
//! tokio::spawn(async move {
//!     tokio::signal::ctrl_c().await.ok();
//!     on_sigterm.shutdown(Duration::from_secs(20)).await
//! });
//! Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
//!     .with_leader_election(&elector)
//!     .run(
//!         |_cm, _ctx| async { Ok::<_, kube_client::Error>(Action::await_change()) },
//!         |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
//!         Arc::new(()),
//!     )
//!     .for_each(|_| async {})
//!     .await;
//! # Ok(())
//! # }
//! ```
//!
//! The core:
//! - [`LeaderElector`] campaigns for one Lease in a background task: one
//!   renewal loop per Lease, shared by every stream and guard given it.
//! - [`LeaderElectionControllerExt::with_leader_election`] and
//!   [`LeaderElectionStreamExt::with_leader_election`] guard a
//!   [`Controller`](kube_runtime::Controller) or any [`Stream`](futures::Stream):
//!   not polled before the Lease is won, dropped the moment it is lost.
//! - [`LeaderElector::acquire`] returns a [`LeaseGuard`], a future resolving to
//!   [`Lost`] when the term ends, with fencing helpers.
//! - [`LeaderElector::with_lease`] is the future form: any future run while
//!   leading, dropped the moment the term ends (`Err(Lost)`); tasks that
//!   belong to one term are spawned with [`LeaseGuard::tasks`]
//!   ([`TermTasks`]: ended with the term, waited for by the release).
//!   ```no_run
//!   # async fn doc(elector: kube_runtime_lease::LeaderElector) {
//!   let done = elector.with_lease(async { /* work that needs leadership */ }).await;
//!   # }
//!   ```
//! - [`LeaderElector::run_each_term`] rejoins the election after a loss.
//! - [`LeaseConfig::enabled`]`(false)` is the off switch (a
//!   `--leader-elect=false`): the same types, always leading, no API call.
//! - [`LeaderElector::status`], [`subscribe`](LeaderElector::subscribe) and
//!   [`health_check`](LeaderElector::health_check) show who leads;
//!   [`contact_check`](LeaderElector::contact_check) lets a liveness probe
//!   see a standby (or leader) that has not heard from the API server for
//!   longer than a limit you set.
//! - [`LeaseObserver`] follows who holds a Lease without ever campaigning
//!   (the same [`LeaderStatus`], no writes): for dashboards, CLIs and pods
//!   that only serve.
//!   <!-- upstream: omit -->
//!   The repository's `examples/probes.rs` serves them as `/readyz` and
//!   `/livez` probes.
//!   <!-- upstream: end -->
//!
//! <!-- upstream: omit -->
//! The extras, each a feature (see [Features](#features)):
//! - `with_leader_election_warm` is warm standby (`warm-standby`): the Controller's
//!   watches and store run on every replica, leadership gates only
//!   reconciliation, and a new leader reconciles its whole store at once,
//!   without a LIST.
//! - `LeaseConfig::label`, `annotation` and `owner_reference`
//!   (`lease-metadata`) put the holder's pod and node on the Lease (`kubectl
//!   get lease -l ...`) and let it be garbage-collected with the operator;
//!   only those keys are written.
//! - `LeaderElector::with_events` (`events`) publishes Kubernetes Events on
//!   the Lease when this candidate becomes leader and when it stops (with the
//!   reason).
//! - `LeaseConfig::coordinated` (`coordinated`): Coordinated Leader
//!   Election, where the API server picks the leader.
//! - `metrics::LeaseMetrics` (`metrics`) exports Prometheus metrics,
//!   client-go's names included.
//! - `shard` (`unstable-shards`): elected shards, one owner per shard.
//! - `test_util` (`test-util`): an in-memory Lease API double.
//!
//! <!-- upstream: end -->
//! # RBAC
//! The candidates' service account needs, in the Lease's namespace:
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: { name: my-controller-leader-election, namespace: my-namespace }
//! rules:
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["get", "create", "update", "list", "watch"]
//! ```
//! `get`, `create` and `update` are required; `list` and `watch` make the
//! election watch-driven (see [`LeaseConfig::watch`]); without them it polls,
//! with one warning, while the watch is retried with kube-runtime's default
//! backoff (up to 30 s, jittered), so that a 403 that passes (an apiserver
//! just restarted answers before its authorization cache has synced) does
//! not leave it polling. A missing verb is logged with the rule to add.
//! <!-- upstream: omit -->
//! With `LeaderElector::with_events`, also `create` on `events` in
//! `events.k8s.io` (each Event is a new one: none is patched). A sharded election (`unstable-shards`) also needs
//! `delete` on `leases`: its replicas delete departed members' roster
//! entries (without it they stay, one per process started, with one
//! warning per outage).
//! <!-- upstream: end -->
//!
//! # Timings
//! Defaults are client-go's: 15 s lease duration, 10 s renew deadline, 2 s
//! retry period. The lease duration bounds the downtime after a crash (a
//! standby takes over that long after it last saw the Lease change); a
//! graceful handover (SIGTERM, [`LeaderElector::shutdown`]) takes one watch
//! event and one write. The gap between lease duration and renew deadline is
//! the safety margin: it absorbs differences in clock *rate* between nodes
//! (tolerated skew about lease duration / renew deadline) and the time it
//! takes to stop guarded work. Clock *offsets* do not matter: expiry is judged
//! on each candidate's own monotonic clock, never from `renewTime`.
//!
//! A leader keeps its term while its renewals are answered in less than
//! **half** the renew deadline (client-go's: within the renew deadline). Each
//! renewal carries the resourceVersion of the answer to the one before, and
//! the deadline counts from the instant the last successful renewal was sent,
//! so two round trips must fit in it; a renewal that takes half of it or more
//! logs a warning,
//! and the term ends at the next one as slow (the candidate then takes its
//! own record back after one read). The price of never acting past it.
//!
//! ## Handover latency and `TCP_NODELAY`
//! A follower's watch holds its client's one pooled HTTP/1.1 connection, so
//! the write that takes a released Lease goes out on a new connection. kube
//! 5's default [`Client`](kube_client::Client) leaves `TCP_NODELAY` off
//! (hyper-util's default; [kube-rs/kube#2056]), and that first request then
//! waits for a delayed ACK of the TLS handshake: tens of milliseconds on
//! Linux, several times the whole handover with `TCP_NODELAY` on (as Go, and
//! so client-go, always has it).
//! <!-- upstream: omit -->
//! The figures are in the repository's `BENCHMARKS.md`.
//! <!-- upstream: end -->
//! The election uses the client it is given and does not change it; where
//! those 40 ms matter, build the client from an `HttpConnector` with
//! `set_nodelay(true)`.
//! <!-- upstream: omit -->
//! The repository's `examples/common.rs` does.
//! <!-- upstream: end -->
//! Safety does not depend on it.
//!
//! ## The client's stack
//! Every Lease request goes through the layers of the client the elector is
//! given, and is bounded by the time its caller has left (a renewal: the
//! renew deadline less the time since the last one was sent), retries and
//! queueing in the stack included. kube's default client can be shared with
//! the controllers: it has no limit, its watches hold no connection a request
//! waits for, and its retry layer (`Config::default_retry`: 429, 503 and 504,
//! up to 15 times) may resend a write the API server applied and answered
//! 504: the 409 that follows is recognised as this candidate's own write. A
//! limit shared with the controllers' requests (tower's
//! `ConcurrencyLimitLayer` or `RateLimitLayer`) queues the
//! renewals behind them, and a healthy leader loses its term under its own
//! load (`lease update request timed out`): give the elector a client of its
//! own (`Client::try_from(config.clone())`), as client-go's leader election
//! has its own client and rate limiter. A watch takes no slot of a
//! concurrency limit (the permit goes with the response's head). The Lease's
//! namespace is the [`LeaseConfig`]'s, never the client's default namespace;
//! a client that impersonates (`Impersonate-User`: a kubeconfig's `as:`)
//! campaigns as the identity it impersonates, which needs the Role.
//!
//! # Choices the election makes (where client-go is silent or unsafe)
//! The one promise is "exactly one leader, never none": where client-go's
//! protocol leaves a schedule open, the election closes it, at the cost noted.
//!
//! - A record with a missing, zero or negative `leaseDurationSeconds` is held
//!   for this candidate's own lease duration (client-go would take it at once).
//!   A time past the last instant k8s-openapi's `MicroTime` holds (the end of
//!   year 9999, a "never expires" sentinel some tools write) is read as that
//!   instant: a record is judged by when it last changed, as client-go does.
//! - **The creation hold.** A deleted Lease leaves no trace, and its last
//!   holder may still believe it leads until its renew deadline. A candidate
//!   that *creates* the Lease, or takes over a Lease object that replaced one
//!   it saw held, holds it (renewing) until the longest lease duration seen on
//!   the replaced record has passed since it saw it go (at least one lease
//!   duration after creating) before it leads, and every record it writes
//!   during the hold carries a `leaseDurationSeconds` that covers the rest of
//!   the hold, so that candidates that never saw the old record wait as long.
//!   The Lease is never written free during the hold (a shutdown or a dropped
//!   `acquire` lets it expire), a later campaign of the same elector keeps the
//!   hold, and its end is confirmed with a read before any guard is handed out.
//!   Cost: a brand-new Lease is led one lease duration after its creation.
//!   [`LeaseConfig::creation_hold`]`(false)` turns it off (client-go's
//!   behaviour), for installs where nothing deletes a held Lease; its docs
//!   say what is then given up.
//! - **"Ours" means our own term's record**: the same Lease object (`uid`)
//!   and holder as the write that began our term, with the `renewTime` of our
//!   last write (an edit by someone else that keeps it, such as a changed
//!   `leaseTransitions`, leaves the record ours). Every term begins with a new acquisition (`acquireTime = now`,
//!   `leaseTransitions` above every value seen on the Lease's name, starting
//!   again at 0 at the top of its range), also when
//!   the record it takes names our identity. So a record written by another
//!   process with the same identity (a duplicate, a paused leader's successor)
//!   or by a write of ours that we gave up on (unless it is exactly the
//!   takeover we sent last, applied though its answer was lost) is waited
//!   out like anyone else's, and a leader that finds such a record at a renewal has been taken
//!   over. So has a leader that finds its own term's record renewed by
//!   someone else (a `renewTime` it did not write): another process with its
//!   identity takes the term for its own, as a client-go candidate does with
//!   a record that names its identity; that record is then waited out like
//!   anyone else's.
//! - A write answered 409 that was in fact applied (a request answered 504
//!   and retried by the client) is recognised by one read: the record is
//!   exactly the one sent (holder, duration, times to the microsecond,
//!   transitions).
//! - **Release only after the guarded work ended.** A Lease is written free
//!   (on [`LeaderElector::shutdown`], when the last guard is dropped, or on a
//!   step-down) only if every guard of the term had been dropped before the
//!   term ended. If guarded work had to be stopped (a grace that ran out, a
//!   step-down, a loss, or its owner dropping it unfinished: a guarded stream
//!   dropped before its inner stream ended, a `with_lease` future or
//!   `TermTasks` task dropped before it completed), requests it sent may
//!   still land, so the Lease is left
//!   to expire instead, and for lease duration − renew deadline after such a
//!   stop no later term of this elector releases either. client-go's
//!   `ReleaseOnCancel` asks its users for the same; here it is enforced.
//! - Once the watch has delivered our own last write, a later event showing a
//!   record not of our term (a takeover, a deletion, a free record written by
//!   an admin or by client-go ≥ 0.34's release path) ends the term on the
//!   event itself; an event that may be older is confirmed with a read first.
//! - **`preferredHolder`** (Coordinated Leader Election): a free Lease whose
//!   `preferredHolder` names another candidate is left to it for one lease
//!   duration; a held Lease whose end of term is marked for a third candidate
//!   is left to the preferred holder for one lease duration after it expires.
//!   A leader steps down only for a `preferredHolder` set during its term: one
//!   already on the record when it took the Lease was given its chance, so a
//!   preferred holder that never campaigns (a pod that no longer exists)
//!   cannot stop the election. The term ends at once, and the Lease is
//!   released only if no guarded work had to be stopped. A leader that
//!   stepped down without releasing and campaigns again (as
//!   [`LeaderElector::run_each_term`] does) does not take its own record back
//!   at once: it waits as a third candidate would, so that the preferred
//!   holder takes the record when it expires, one lease duration after it
//!   last changed (client-go's leader, which keeps renewing, never lets it).
//! <!-- upstream: omit -->
//! - **Coordinated Leader Election** itself, where the API server picks the
//!   leader among published `LeaseCandidate`s, is opt-in:
//!   `LeaseConfig::coordinated` (see `coordinated::Coordinated`).
//! <!-- upstream: end -->
//! - Releasing re-reads the Lease and writes it free only if it still holds
//!   our term's record as we wrote it last (not renewed since by another
//!   process with our identity), with the resourceVersion just read; a conflict is
//!   retried once after a fresh read, as client-go does.
//! - A passed renew deadline is final, as guards and guarded streams see it on
//!   their own clock: a renewal answered after it does not bring the term
//!   back, no guard of that term is handed out any more, a [`LeaseGuard`]
//!   resolves at the deadline on its own timer (also when the elector's task
//!   can no longer run), a guarded stream stops within one item of it
//!   (a clock read before each poll of the stream it guards, and one per
//!   item), never polls that stream once it passed (after a pause, or a step
//!   that blocked the runtime) and never hands out an item made after it (a
//!   pause inside its poll, or in its consumer), and
//!   [`LeaderElector::is_leader`] says no from then on (and from the moment
//!   [`LeaderElector::shutdown`] begins).
//! - The fencing token ([`LeaseGuard::fencing_token`]) grows with every term,
//!   across re-creations of the Lease object and past `i32::MAX`.
//! - Why a term ended is exact: [`Lost::Shutdown`] only ever follows
//!   [`LeaderElector::shutdown`], so a loop that campaigns again after any
//!   other loss (as [`LeaderElector::run_each_term`] does) stops only when it
//!   should; a background task lost with its runtime ends terms as
//!   [`Lost::ElectorStopped`] and fails waiting acquisitions with
//!   [`AcquireError::ElectorStopped`].
//! - One background task per elector at a time, on the runtime of the
//!   `acquire` that started it (as kube's `Client` runs its buffer on the
//!   runtime it was built on): keep that runtime running while the elector is
//!   in use. A new task starts only once the last one ended or was dropped
//!   with its runtime, so two never talk to the API at once. A runtime kept
//!   but no longer driven stops the election as it stops the client: guards
//!   end at their renew deadline on their own timer, and
//!   [`LeaderElector::shutdown`] returns after its budget.
//! - **Work that blocks the runtime** (a CPU-bound loop without `.await`, a
//!   blocking call outside `spawn_blocking`) stops the election task and
//!   every timer of a current-thread runtime (`#[tokio::main(flavor =
//!   "current_thread")]`, `#[tokio::test]`) while it runs, and of a
//!   multi-threaded one once every worker is blocked: nothing renews, and a
//!   step longer than lease duration − renew deadline past the renew deadline
//!   runs beside the next leader. No election can prevent that. What holds:
//!   the election itself needs no worker thread (no `spawn_blocking`, no
//!   `block_in_place`), and once the step ends every check reads its own
//!   clock before anything else runs ([`LeaseGuard::is_valid`], the guard
//!   and its [`lost_signal`](LeaseGuard::lost_signal), a guarded stream
//!   before it polls the stream it guards, [`LeaderElector::is_leader`],
//!   [`LeaderElector::current_guard`], [`LeaderElector::acquire`],
//!   [`TermTasks::spawn`]: the term is over). The election task warns that
//!   it ran late.
//!   A guarded stream spends Tokio's cooperative budget, so one that is
//!   always ready yields to the election task on its own.
//! - When nobody wants leadership any more, the task keeps its watch for one
//!   retry period before it stops, so that demand that flaps (an `acquire`
//!   created and dropped repeatedly) costs no new LIST, WATCH and GET.
//!
//! # Liveness: how long a Lease can be without a leader
//! Safety comes first (no two leaders), but a Lease must not stay without
//! one either. With lease duration *LD*, renew deadline *RD* and retry period
//! *RP*, while at least one candidate campaigns:
//! - **After a release** (a shutdown, the last guard dropped, a step-down with
//!   no work stopped): a watching follower takes the Lease on the watch event,
//!   with one write; a polling one within one to 2.2 *RP*.
//! - **After a crash, or work that had to be stopped**: one *LD* after a
//!   follower last saw the record change (it judges by its own clock, never
//!   by `renewTime`; a re-list served by a watch cache behind, which shows
//!   an older record before the last one again, does not restart that
//!   clock; nor does a campaign begun again by a later `acquire`, on a Lease
//!   not written since), and at most 2.2 *RP* more when it polls. A
//!   watching follower whose watch has been silent for two *RP* (a dead
//!   holder, or a watch that stalled) reads the Lease every jittered *RP*,
//!   as a polling one does, so that a stalled watch costs no more than polling.
//! - **After the Lease was deleted**: the creation hold, one *LD* after the
//!   new object was created (or the lease duration of the deleted record, if
//!   longer: the longest seen since its holder last wrote it, so that a
//!   value edited in by someone else counts only until the holder renews).
//!   A record pinned by hand with a huge duration (to pause the election)
//!   and then deleted is held that long, as a live holder's would be: to
//!   resume, delete it while no candidate runs.
//! - **After a step-down for a `preferredHolder`**: the preferred holder takes
//!   the record when it expires (one *LD* after its last change); if it never
//!   comes, the candidates take it one *LD* later (with Coordinated Leader
//!   Election, where the API server elects, the candidate that stepped down
//!   takes its record back 2 *LD* + 10 s after its last change, if the API
//!   server gave it to nobody).
//! - **Once faults heal** (every request answered again): a leader within
//!   2 *LD* + 2.2 *RP*: a failed request is retried every 1 to 2.2 *RP*
//!   (client-go's jittered retry period, whatever failed), and the record
//!   then seen may need up to two *LD* (a `preferredHolder` that never
//!   comes) or one (the creation hold).
//!   <!-- upstream: omit -->
//!   The repository's simulation checks this bound, with 1.8 *RP* more for
//!   the reads and retries that confirm the record (2 *LD* + 4 *RP*), after
//!   thousands of random fault schedules.
//!   <!-- upstream: end -->
//!
//! What does not leave a Lease without a leader:
//! - **A 404 is a deletion only when the API server says so**: a `Status`
//!   with reason `NotFound` whose details name the Lease. Any other 404 (a
//!   plain-text answer from a proxy or load balancer, an API server still
//!   starting that does not serve the group yet) is an error like a 500: a
//!   renewal answered so is checked with one read and costs that renewal,
//!   not the term; a read answered so is retried, never taken for a missing
//!   Lease (which would begin a creation hold on a Lease that exists).
//! - **No request loop runs without a delay**: every retry waits at least
//!   *RP*, so a `replace` that keeps failing while reads succeed costs one
//!   request per retry period, not a loop.
//! - **Each renewal changes the record**: `renewTime` moves forward by at
//!   least a microsecond even when the wall clock stands still or went back,
//!   so that followers, which judge by observed change, see every renewal.
//! - **Fencing tokens never repeat** (see [`LeaseGuard::fencing_token`]): the
//!   token is stored on the Lease in the annotation
//!   `leases.kube.rs/fencing-token`, so it goes on past `i32::MAX`, where
//!   `leaseTransitions` ends (the counter then starts again at 0, so that
//!   client-go's takeover, which adds one to it as an int32, is not
//!   refused), and
//!   after the counter was edited down (unless others' annotations leave it
//!   no room: see *Fencing*).
//!
//! # Fencing: what a term's writes can rely on
//! Leader election alone cannot stop a stale write: a process paused (or
//! partitioned) past its lease wakes up still believing it leads, and a
//! write it had already decided on lands after its successor's. client-go
//! hands out no means against it. The election gives a term two: its clock
//! ([`LeaseGuard::is_valid`], false from the renew deadline on, which is
//! before any other candidate may take the Lease), and its fencing token
//! ([`LeaseGuard::fencing_token`]), which grows from term to term. Used
//! together with the object's own optimistic concurrency they close the
//! gap for writes to Kubernetes objects:
//!
//! 1. read the object;
//! 2. after the read, check [`LeaseGuard::is_valid`], and compare the token
//!    stored in the object (a label, an annotation, a status field) with the
//!    term's: if the stored one is larger, a newer term has written; stop;
//! 3. write with the resourceVersion that was read as the precondition
//!    (`replace`, or a patch that carries `metadata.resourceVersion`), the
//!    term's token stored in the object.
//!
//! What that guarantees: once a newer term has written the object, no write
//! of an older term lands on it, whatever the older process's timing. Its
//! read came either before the newer write (so its precondition fails with
//! 409) or after it (so it sees the newer token and stops). The token check
//! needs no clock. The clock check stops most stale writes before they are
//! attempted; alone, it would fail only if this process's clock disagreed
//! with the other candidates' about how much time had passed.
//!
//! What it does not guarantee:
//! - An older term's write can still land after the newer term *began*, but
//!   only before the newer term's first write to that object. It is ordered
//!   before that write, not lost or reordered, and the newer term reads it
//!   before writing (step 1).
//! - Writes made without a precondition are not fenced: a blind `PUT`, a
//!   merge patch without `resourceVersion`, or server-side apply with
//!   `force`. Neither are side effects outside the API server (a database, a
//!   cloud API) unless that system stores and compares the token itself.
//! - Tokens order the terms of one Lease name as the candidates saw it. A
//!   candidate that never saw an older, deleted Lease object may start again
//!   from lower numbers. Fenced objects then refuse it (safe), and they
//!   accept writes again from the next term whose token is larger.
//! - A Lease whose annotations (someone else's) leave no room under the API
//!   server's 256 KiB limit for the token's annotation is still taken (a
//!   warning says so), with the token kept only in memory: a later term of
//!   another process may then hand out the same token.
//!
//! <!-- upstream: omit -->
//! `examples/fenced_write.rs` is the pattern on a `ConfigMap`
//! (`kube_runtime_lease_examples::ledger`). The repository's chaos run is the
//! evidence: `tests/tests/chaos.rs` runs it in CI, and `scripts/chaos.sh`
//! runs it for longer, with the results in RELIABILITY.md. It runs this
//! crate's candidates and client-go's on a three-member etcd with two
//! apiservers, with SIGKILL, SIGSTOP past the lease, partitions, apiserver
//! and etcd-leader restarts, Lease deletion and API Priority and Fairness
//! 429s. The checker reads every version of each group's ledger `ConfigMap`.
//! This crate's column shows no stale write. client-go's candidates, writing
//! the same way but with only their leading context to check, do write
//! stale.
//! <!-- upstream: end -->
//!
//! <!-- upstream: omit -->
//! # Features
//! The core is what `default-features = false` builds: [`LeaseConfig`],
//! [`LeaderElector`] (acquire, renew, release, observe, shutdown),
//! [`LeaseGuard`] / [`Lost`], the stream and Controller adapters and
//! [`LeaderElector::run_each_term`]. The extras are features built on the
//! core, and nothing in the core depends on one:
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `coordinated` | yes | Coordinated Leader Election: `LeaseConfig::coordinated`, `coordinated::Coordinated` |
//! | `events` | yes | Kubernetes Events on the Lease when a term begins and ends: `LeaderElector::with_events` |
//! | `lease-metadata` | yes | labels, annotations and an owner reference written on the Lease: `LeaseConfig::label`, `annotation`, `owner_reference` |
//! | `warm-standby` | yes | warm standby: `LeaderElectionControllerExt::with_leader_election_warm`, `warm::WarmController` |
//! | `metrics` | no | `metrics::LeaseMetrics`: leader-election metrics in a `prometheus-client` registry, client-go's names included |
//! | `unstable-shards` | no | elected shards: `shard::ShardedElector`, `shard::ShardedController` (one controller across many replicas, each shard behind its own Lease, each object reconciled on the replica holding its shard); the API may change in any release |
//! | `test-util` | no | `test_util`: an in-memory Lease API double behind a real `kube::Client`, to test guarded code without a cluster; on paused time when the test crate enables `tokio`'s `test-util` (this feature does not, so that it changes no clock) |
//!
//! This crate does not pick a Kubernetes version: enable one of
//! `k8s-openapi`'s version features in your application, as with kube.
//!
//! <!-- upstream: end -->
//! [kube-runtime]: https://docs.rs/kube-runtime
//! [kube-rs/kube#2056]: https://github.com/kube-rs/kube/issues/2056
//! [client-go]: https://pkg.go.dev/k8s.io/client-go/tools/leaderelection
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
// docs.rs (`--cfg docsrs`, nightly): each extra's items carry a badge naming
// the feature they need, derived from their `cfg` attributes.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod controller;
mod elector;
mod error;
mod guard;
mod lease_observer;
mod record;
mod scope;
mod stream;
mod term;

pub use config::{ConfigError, Field, LeaseConfig, unique_identity};
pub use controller::{ControllerResource, ControllerWithLeaderElection, LeaderElectionControllerExt};
pub use elector::{Acquire, HealthError, LeaderElector, LeaderStatus};
pub use error::{AcquireError, ApiError, ShutdownError};
pub use guard::LeaseGuard;
pub use lease_observer::LeaseObserver;
pub use scope::TermTasks;
pub use stream::{LeaderElectionStreamExt, RunEnded, WithLeaderElection};
pub use term::Lost;

// The extras: each a feature, built on the core above.
/// Coordinated Leader Election (feature `coordinated`): the API server picks
/// the leader among the candidates' `LeaseCandidate`s. Asked for with
/// [`LeaseConfig::coordinated`].
#[cfg(feature = "coordinated")]
pub mod coordinated {
    pub use crate::config::extras::coordinated::Coordinated;
}
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "unstable-shards")]
pub mod shard;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
/// Warm standby (feature `warm-standby`): the Controller's watches and
/// store run on every replica, leadership gates only reconciliation. Asked
/// for with
/// [`LeaderElectionControllerExt::with_leader_election_warm`].
///
/// The feature adds that method to the trait, which is sealed so that the
/// feature is additive: a type of your own implementing the trait (which
/// would then need this method with the feature, and not without) cannot.
///
/// ```compile_fail,E0277
/// use kube_runtime::Controller;
/// use kube_runtime_lease::{
///     ControllerResource, ControllerWithLeaderElection, LeaderElectionControllerExt, LeaderElector,
///     warm::WarmController,
/// };
///
/// struct MyController<K: ControllerResource>(Controller<K>);
///
/// impl<K: ControllerResource> LeaderElectionControllerExt<K> for MyController<K> {
///     fn with_leader_election(self, elector: &LeaderElector) -> ControllerWithLeaderElection<K> {
///         self.0.with_leader_election(elector)
///     }
///     fn with_leader_election_warm(self, elector: &LeaderElector) -> WarmController<K> {
///         self.0.with_leader_election_warm(elector)
///     }
/// }
/// ```
#[cfg(feature = "warm-standby")]
pub mod warm {
    pub use crate::controller::warm::WarmController;
}

#[cfg(test)]
mod tests;
