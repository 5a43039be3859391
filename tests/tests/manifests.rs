//! The manifests in `deploy/` give each pod the time its SIGTERM handover can
//! take: `terminationGracePeriodSeconds` covers
//! `LeaseConfig::shutdown_budget(grace)` for the settings the pod's program
//! reads from its environment (the examples' `lease_config`) and the grace it
//! gives `shutdown` (`SHUTDOWN_GRACE`). No control plane needed.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease::LeaseConfig;
use kube_runtime_lease_examples::SHUTDOWN_GRACE;
use serde_json::Value;

/// What `lease_config` reads, with its defaults (client-go's timings).
fn seconds(env: &[Value], name: &str, default: f64) -> Result<Duration> {
    let value = env
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map_or(Ok(default), str::parse::<f64>)
        .with_context(|| format!("{name} is not a number of seconds"))?;
    Ok(Duration::from_secs_f64(value))
}

fn has(env: &[Value], name: &str) -> bool {
    env.iter().any(|e| e["name"] == name)
}

/// A Deployment in `deploy/`.
struct Deployment {
    file: String,
    name: String,
    termination_grace: Duration,
    /// The environment of its (first) container.
    env: Vec<Value>,
}

/// Every Deployment in `deploy/`.
fn deployments() -> Result<Vec<Deployment>> {
    let dir = kube_runtime_lease_harness::workspace_root().join("deploy");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", path.display()))?;
        for doc in docs.into_iter().filter(|d| d["kind"] == "Deployment") {
            let spec = &doc["spec"]["template"]["spec"];
            // Kubernetes' default when the field is absent.
            let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
            let env = spec["containers"][0]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            found.push(Deployment {
                file: path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                name: doc["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                termination_grace: Duration::from_secs(grace),
                env,
            });
        }
    }
    Ok(found)
}

#[test]
fn every_deployment_gives_its_pods_the_shutdown_budget() -> Result<()> {
    let deployments = deployments()?;
    ensure!(
        deployments.len() >= 2,
        "the Deployments in deploy/: {}",
        deployments.len()
    );
    for Deployment {
        file,
        name,
        termination_grace,
        env,
    } in deployments
    {
        let config = LeaseConfig::new("ns", "lease", "pod")
            .lease_duration(seconds(&env, "LEASE_DURATION", 15.0)?)
            .renew_deadline(seconds(&env, "RENEW_DEADLINE", 10.0)?)
            .retry_period(seconds(&env, "RETRY_PERIOD", 2.0)?);
        let config = if has(&env, "COORDINATED_BINARY_VERSION") {
            config.coordinated(kube_runtime_lease::coordinated::Coordinated::new("1.37.0"))
        } else {
            config
        };
        config
            .validate()
            .with_context(|| format!("{file}: {name}'s timings"))?;
        // The sharded example (`SHARDS`) leaves its roster first.
        let budget = if has(&env, "SHARDS") {
            kube_runtime_lease::shard::ShardConfig::new(config, 12).shutdown_budget(SHUTDOWN_GRACE)
        } else {
            config.shutdown_budget(SHUTDOWN_GRACE)
        };
        ensure!(
            termination_grace >= budget,
            "{file}: {name}'s terminationGracePeriodSeconds ({termination_grace:?}) is below the \
             shutdown budget of its settings ({budget:?} for a {SHUTDOWN_GRACE:?} grace)"
        );
    }
    Ok(())
}

/// The budget adds up what `shutdown` waits for, and grows with each part.
#[test]
fn the_budget_is_the_sum_of_its_parts() {
    let config = LeaseConfig::new("ns", "lease", "pod");
    let grace = Duration::from_secs(20);
    assert_eq!(
        config.shutdown_budget(grace),
        Duration::from_secs(20 + 2 * 10 + 5 + 2)
    );
    let slower = config.clone().release_timeout(Duration::from_secs(9));
    assert_eq!(slower.shutdown_budget(grace), Duration::from_secs(51));
    let coordinated = config.coordinated(kube_runtime_lease::coordinated::Coordinated::new("1.37.0"));
    assert_eq!(coordinated.shutdown_budget(grace), Duration::from_secs(57));
    assert_eq!(
        LeaseConfig::new("ns", "lease", "pod").shutdown_budget(Duration::MAX),
        Duration::MAX,
        "no overflow"
    );
    let sharded = kube_runtime_lease::shard::ShardConfig::new(LeaseConfig::new("ns", "lease", "pod"), 4);
    assert_eq!(
        sharded.shutdown_budget(grace),
        Duration::from_secs(5 + 47),
        "the roster is left first, within the release timeout"
    );
}
