//! Shared helpers of the examples: logging, a client, a [`LeaseConfig`]
//! from the environment, [`probes`] (`/livez`, `/readyz`), [`ledger`]
//! (writes fenced by the term: check, write with a precondition, carry the
//! token) and [`https`] (the operator's webhook server: TLS, a bounded drain).
//!
//! Every example talks to the cluster in `KUBECONFIG` (or the in-cluster
//! configuration), and reads its Lease settings from the environment:
//! `LEASE_NAMESPACE` (default `default`), `LEASE_NAME` (default the example's
//! name), `LEASE_DURATION`, `RENEW_DEADLINE`, `RETRY_PERIOD` (seconds, with
//! client-go's 15/10/2 defaults), and `POD_NAME` for the identity. With
//! `COORDINATED_BINARY_VERSION` set (`1.37.0`), the election is coordinated
//! by the API server ([`Coordinated`](kube_runtime_lease::coordinated::Coordinated)), with
//! `COORDINATED_EMULATION_VERSION` as the emulation version (default: the
//! binary version).

pub mod https;
pub mod ledger;
pub mod probes;

use std::time::Duration;

use anyhow::Context;
use kube::Client;
use kube_runtime_lease::{LeaderElector, LeaseConfig, Lost, ShutdownError, unique_identity};
use tokio::task::JoinHandle;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), in colour only
/// on a terminal (a pod's log is none) and without `NO_COLOR`.
pub fn init_tracing() {
    use std::io::IsTerminal as _;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}

/// A client for the cluster in `KUBECONFIG`, or in-cluster, with `TCP_NODELAY`.
///
/// kube-client 5 leaves `TCP_NODELAY` off (hyper-util's default; see
/// kube-rs/kube#2056), while Go, and so client-go, turns it on. Without it the
/// first request on a new connection waits for a delayed ACK of the TLS
/// handshake's last flight (about 40 ms on Linux). A follower meets exactly
/// that on takeover: its watch holds its one pooled HTTP/1.1 connection, so
/// the write that takes the Lease opens a new one. With `KUBE_TCP_NODELAY=0`
/// this returns kube's default client instead.
///
/// The stack is kube's own (`ClientBuilder::try_from`: TLS, the configured
/// connect/read/write timeouts, base URI, auth, extra headers) minus its
/// optional retry and tracing layers.
///
/// # Errors
/// When no configuration can be found or loaded.
pub async fn client() -> anyhow::Result<Client> {
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (set KUBECONFIG)")?;
    if std::env::var("KUBE_TCP_NODELAY").is_ok_and(|v| v == "0") {
        return Ok(Client::try_from(config)?);
    }
    nodelay_client(config)
}

/// A client for `config` with `TCP_NODELAY` on: kube's own stack otherwise
/// (see [`client`]).
///
/// # Errors
/// When the TLS or auth settings of `config` cannot be loaded.
pub fn nodelay_client(config: kube::Config) -> anyhow::Result<Client> {
    use kube::client::ConfigExt as _;
    use tower::{BoxError, ServiceBuilder};

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let mut connector =
        hyper_timeout::TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// The number of seconds in the environment variable `var` (a decimal), or
/// `default` when it is not set.
///
/// # Errors
/// When the variable is not a number, or not a duration (negative, not
/// finite, too large).
pub fn env_seconds(var: &str, default: f64) -> anyhow::Result<Duration> {
    match std::env::var(var) {
        Ok(v) => {
            let seconds: f64 = v
                .parse()
                .with_context(|| format!("{var}={v:?} is not a number of seconds"))?;
            // Negative, not finite, or too large: an error, not a panic.
            Duration::try_from_secs_f64(seconds)
                .with_context(|| format!("{var}={v:?} is not a duration in seconds"))
        }
        Err(_) => Ok(Duration::from_secs_f64(default)),
    }
}

/// The count (1 to 65535, as a shard count) in the environment variable
/// `var`, or `default` when it is not set.
///
/// # Errors
/// When the variable holds anything else: a typo or a count past the range
/// must not become the default without a word.
pub fn env_count(var: &str, default: u16) -> anyhow::Result<u16> {
    match std::env::var(var) {
        Ok(v) => v
            .parse::<std::num::NonZeroU16>()
            .map(std::num::NonZeroU16::get)
            .with_context(|| format!("{var}={v:?} is not a count from 1 to 65535")),
        Err(_) => Ok(default),
    }
}

/// The boolean in the environment variable `var` (`true`, `false`, `1`, `0`,
/// `yes`, `no`, `on`, `off`, in any case), or `default` when it is not set
/// or empty.
///
/// # Errors
/// When the variable holds anything else: a value that was meant to switch
/// something off (`LEADER_ELECT=0`) must not leave it on without a word.
pub fn env_bool(var: &str, default: bool) -> anyhow::Result<bool> {
    match std::env::var(var) {
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(default),
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => anyhow::bail!("{var}={v:?} is not a boolean (true or false)"),
        },
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => Err(e).with_context(|| format!("{var} is not valid UTF-8")),
    }
}

/// The Lease settings of an example, from the environment: `LEASE_NAMESPACE`,
/// `LEASE_NAME`, `IDENTITY`, the timings (`LEASE_DURATION`, `RENEW_DEADLINE`,
/// `RETRY_PERIOD`, in seconds), `LEASE_WATCH=false` (poll), `LEADER_ELECT=false`
/// (the off switch), `POD_NAME` and `NODE_NAME` (written on the Lease as
/// annotations by its holder), `COORDINATED_BINARY_VERSION` and
/// `COORDINATED_EMULATION_VERSION` (Coordinated Leader Election).
///
/// # Errors
/// When a timing variable is not a number, or `LEASE_WATCH` or
/// `LEADER_ELECT` not a boolean.
pub fn lease_config(default_name: &str) -> anyhow::Result<LeaseConfig> {
    let namespace = std::env::var("LEASE_NAMESPACE").unwrap_or_else(|_| "default".into());
    let name = std::env::var("LEASE_NAME").unwrap_or_else(|_| default_name.into());
    let identity = std::env::var("IDENTITY").unwrap_or_else(|_| unique_identity());
    let mut config = LeaseConfig::new(namespace, name.clone(), identity)
        .lease_duration(env_seconds("LEASE_DURATION", 15.0)?)
        .renew_deadline(env_seconds("RENEW_DEADLINE", 10.0)?)
        .retry_period(env_seconds("RETRY_PERIOD", 2.0)?)
        .watch(env_bool("LEASE_WATCH", true)?)
        // LEADER_ELECT=false: no election (a local run, a single replica): the
        // same code leads at once and makes no Lease request.
        .enabled(env_bool("LEADER_ELECT", true)?)
        // Found with `kubectl get lease -l app.kubernetes.io/name=<name>`.
        .label("app.kubernetes.io/name", name);
    // Who holds the Lease, on the Lease: written when a candidate takes it.
    for (var, key) in [
        ("POD_NAME", "leader-election.example.com/pod"),
        ("NODE_NAME", "leader-election.example.com/node"),
    ] {
        if let Ok(value) = std::env::var(var) {
            config = config.annotation(key, value);
        }
    }
    Ok(match std::env::var("COORDINATED_BINARY_VERSION") {
        Ok(binary) => {
            let mut coordinated = kube_runtime_lease::coordinated::Coordinated::new(binary);
            if let Ok(emulation) = std::env::var("COORDINATED_EMULATION_VERSION") {
                coordinated = coordinated.emulation_version(emulation);
            }
            config.coordinated(coordinated)
        }
        Err(_) => config,
    })
}

/// The grace the examples give `shutdown` for reconciles in flight. The pod's
/// `terminationGracePeriodSeconds` (`deploy/`) covers
/// `LeaseConfig::shutdown_budget(SHUTDOWN_GRACE)`; `tests/tests/manifests.rs`
/// checks it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// The grace from the environment variable `SHUTDOWN_GRACE` (seconds), or
/// [`SHUTDOWN_GRACE`] when it is not set: the operator example reads it, so
/// that its Helm chart (`deploy/chart/`) can set it and compute the pod's
/// `terminationGracePeriodSeconds` from it.
///
/// # Errors
/// When the variable is not a number.
pub fn shutdown_grace() -> anyhow::Result<Duration> {
    env_seconds("SHUTDOWN_GRACE", SHUTDOWN_GRACE.as_secs_f64())
}

/// The SIGTERM handover: a task that waits for SIGTERM (or Ctrl+C), then
/// shuts `elector` down with `grace`. Await it before the process exits, so
/// that the release has landed.
#[must_use = "await the handover before the process exits"]
pub fn handover_on_signal(elector: &LeaderElector, grace: Duration) -> JoinHandle<Result<(), ShutdownError>> {
    let elector = elector.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        elector.shutdown(grace).await
    })
}

/// How a program whose guarded work ended for the term's reason `lost`
/// exits: after a shutdown (the work ended when it began, or was stopped by
/// it), once `handover` has run to its end; after any other loss, with an
/// error, so that the pod restarts and campaigns again (`run_each_term`
/// would rejoin in process instead).
///
/// # Errors
/// The loss, or the handover's failure.
pub async fn exit_after_work(
    lost: Option<Lost>,
    handover: JoinHandle<Result<(), ShutdownError>>,
) -> anyhow::Result<()> {
    match lost {
        None | Some(Lost::Shutdown) => {
            handover.await??;
            tracing::info!("stopped: shut down, lease handed over");
            Ok(())
        }
        Some(lost) => {
            tracing::info!(%lost, "stopped: leadership lost");
            Err(lost.into())
        }
    }
}

/// Resolves on SIGTERM or Ctrl+C.
///
/// # Panics
/// If the signal handlers cannot be installed.
pub async fn shutdown_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The examples' error policy: log the error, and try the object again in
/// five seconds.
pub fn error_policy<K>(
    _object: std::sync::Arc<K>,
    err: &kube::Error,
    _ctx: std::sync::Arc<()>,
) -> kube::runtime::controller::Action {
    tracing::warn!(error = %err, "reconcile failed");
    kube::runtime::controller::Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    /// Runs this binary's test `name` again in a child process with `env`
    /// set (setting the environment in process needs `unsafe`); fails, with
    /// the child's output, if the child's test failed.
    fn in_child(name: &str, env: &[(&str, &str)]) {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture"])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&child.stdout) + String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "{env:?}:\n{out}");
    }

    /// `LEADER_ELECT=0` (or `False`, `no`), meant to
    /// switch the election off for a single replica without Lease RBAC, must
    /// switch it off, and a value that is no boolean must be an error at
    /// start, not an election left on without a word (the replica then
    /// campaigns, is refused, and never leads). Each value is read in a
    /// child process of this test, as above.
    #[test]
    fn leader_elect_off_in_any_spelling_switches_the_election_off_and_nonsense_is_refused() {
        const VAR: &str = "LEADER_ELECT";
        const MARK: &str = "KRL_TEST_LEADER_ELECT_EXPECTED";
        if let Ok(expected) = std::env::var(MARK) {
            let config = super::lease_config("x");
            match expected.as_str() {
                "off" => assert!(
                    !config.as_ref().expect("a valid configuration").is_enabled(),
                    "{VAR}={:?} left the election on",
                    std::env::var(VAR)
                ),
                _ => assert!(config.is_err(), "{VAR}={:?} accepted", std::env::var(VAR)),
            }
            return;
        }
        for (value, expected) in [("0", "off"), ("False", "off"), ("no", "off"), ("flase", "error")] {
            in_child(
                "tests::leader_elect_off_in_any_spelling_switches_the_election_off_and_nonsense_is_refused",
                &[(VAR, value), (MARK, expected)],
            );
        }
    }

    /// A malformed timing in the environment (negative, not a
    /// finite number, too large) is an error at start, not a panic. Each
    /// value is read in a child process of this test (setting the
    /// environment in process needs `unsafe`).
    #[test]
    fn env_seconds_refuses_what_is_no_duration_without_panicking() {
        const VAR: &str = "KRL_TEST_SECONDS";
        if let Ok(bad) = std::env::var(VAR) {
            assert!(super::env_seconds(VAR, 1.0).is_err(), "{VAR}={bad} accepted");
            return;
        }
        for bad in ["-1", "NaN", "inf", "1e300"] {
            in_child(
                "tests::env_seconds_refuses_what_is_no_duration_without_panicking",
                &[(VAR, bad)],
            );
        }
    }

    /// `SHARDS` (the sharded example's shard count) that is no count of 1 to
    /// 65535 (past `u16`, negative, a typo) is an error at start: it fell
    /// back to 12 shards without a word, and a replica of that count beside
    /// replicas of the count meant made a rollout of two counts (section 28
    /// of the regressions) that nobody asked for. Read in a child process of
    /// this test, as above.
    #[test]
    fn a_shard_count_that_is_no_count_is_refused_not_replaced_by_the_default() {
        const VAR: &str = "KRL_TEST_SHARDS";
        if let Ok(value) = std::env::var(VAR) {
            let shards = super::env_count(VAR, 12);
            match value.as_str() {
                "24" => assert_eq!(shards.unwrap(), 24),
                _ => assert!(shards.is_err(), "{VAR}={value:?} accepted: {shards:?}"),
            }
            return;
        }
        for value in ["24", "70000", "-1", "0", "twelve"] {
            in_child(
                "tests::a_shard_count_that_is_no_count_is_refused_not_replaced_by_the_default",
                &[(VAR, value)],
            );
        }
    }
}
