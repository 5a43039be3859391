//! The Helm chart of the operator example (`deploy/chart/`), rendered by
//! `helm` for a few value sets: `helm lint` passes; the pods'
//! `terminationGracePeriodSeconds`, computed by the template, covers the
//! library's `LeaseConfig::shutdown_budget` of the same values; the RBAC is
//! exactly what the library and the controllers need; every namespaced
//! object is in the release's namespace; the pods run restricted; the
//! webhook's configuration and certificate hang together; values the program
//! would refuse at start are refused at render time; and the API server
//! accepts every rendered object (a server-side dry run against the test
//! control plane).
//!
//! `helm` comes from `scripts/cluster.sh helm`, which builds it from Go
//! modules when it is missing (7 min on a cold Go cache, 9 s with the binary
//! gone but Go's caches warm, cached after that), like the control plane.

use std::{path::PathBuf, process::Command, sync::OnceLock, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::{self, Scope},
};
use kube_runtime_lease::LeaseConfig;
use kube_runtime_lease_harness::{shared_env, workspace_root};
use serde_json::Value;

/// The path of `helm`, built by the project's script when missing.
fn helm() -> Result<PathBuf> {
    static HELM: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new(workspace_root().join("scripts/cluster.sh"))
            .arg("helm")
            .output()
            .map_err(|e| format!("running scripts/cluster.sh helm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/cluster.sh helm failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

fn chart_dir() -> PathBuf {
    workspace_root().join("deploy/chart")
}

/// `helm template` of the chart in `namespace` with `values` (YAML): its
/// output, or helm's error.
fn template(namespace: &str, values: &str) -> Result<std::result::Result<Vec<Value>, String>> {
    template_as("op", namespace, values)
}

/// `helm template` of the chart as the release `release`.
fn template_as(
    release: &str,
    namespace: &str,
    values: &str,
) -> Result<std::result::Result<Vec<Value>, String>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values)?;
    let out = Command::new(helm()?)
        .args(["template", release, "--namespace", namespace, "--values"])
        .arg(&file)
        .arg(chart_dir())
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        return Ok(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let text = String::from_utf8(out.stdout)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).context("parsing helm template's output")?;
    Ok(Ok(docs.into_iter().filter(|d| !d.is_null()).collect()))
}

fn render(namespace: &str, values: &str) -> Result<Vec<Value>> {
    template(namespace, values)?.map_err(|e| anyhow::anyhow!("helm template failed with {values:?}: {e}"))
}

fn the<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let first = found.next().with_context(|| format!("no {kind} rendered"))?;
    ensure!(found.next().is_none(), "more than one {kind} rendered");
    Ok(first)
}

/// The value of the env var `name` of the Deployment's container.
fn env<'a>(deployment: &'a Value, name: &str) -> Option<&'a str> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

fn seconds(deployment: &Value, name: &str, default: f64) -> Result<Duration> {
    let value = env(deployment, name).map_or(Ok(default), str::parse::<f64>)?;
    Ok(Duration::from_secs_f64(value))
}

/// What the operator example builds from its environment (`lease_config`,
/// `shutdown_grace`): the config and the grace.
fn lease_config_of(deployment: &Value) -> Result<(LeaseConfig, Duration)> {
    let config = LeaseConfig::new("ns", "lease", "pod")
        .lease_duration(seconds(deployment, "LEASE_DURATION", 15.0)?)
        .renew_deadline(seconds(deployment, "RENEW_DEADLINE", 10.0)?)
        .retry_period(seconds(deployment, "RETRY_PERIOD", 2.0)?);
    let config = match env(deployment, "COORDINATED_BINARY_VERSION") {
        Some(v) => config.coordinated(kube_runtime_lease::coordinated::Coordinated::new(v)),
        None => config,
    };
    let grace = seconds(
        deployment,
        "SHUTDOWN_GRACE",
        kube_runtime_lease_examples::SHUTDOWN_GRACE.as_secs_f64(),
    )?;
    Ok((config, grace))
}

/// Value sets: the defaults, fast decimal timings, slow ones, coordinated,
/// no margin.
const VALUE_SETS: &[&str] = &[
    "{}",
    "{lease: {duration: 4, renewDeadline: 2.5, retryPeriod: 0.5}, shutdownGrace: 7.5, \
     webhook: {drainDelay: 2, drainTimeout: 1.5}}",
    "{lease: {duration: 60, renewDeadline: 40, retryPeriod: 8}, shutdownGrace: 90}",
    "{lease: {coordinated: {enabled: true}}}",
    "{lease: {renewDeadline: 10.2, retryPeriod: 2.3}, shutdownGrace: 20.1, terminationGraceMargin: 0}",
];

#[test]
fn the_chart_lints() -> Result<()> {
    let out = Command::new(helm()?)
        .args(["lint", "--strict", "--namespace", "op"])
        .arg(chart_dir())
        .output()?;
    ensure!(
        out.status.success(),
        "helm lint --strict: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_termination_grace_covers_the_shutdown_budget_of_the_same_values() -> Result<()> {
    for values in VALUE_SETS {
        let docs = render("op", values)?;
        let deployment = the(&docs, "Deployment")?;
        let (config, grace) = lease_config_of(deployment)?;
        config
            .validate()
            .with_context(|| format!("{values}: the timings"))?;
        let budget = config.shutdown_budget(grace);
        let rendered = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .with_context(|| format!("{values}: no terminationGracePeriodSeconds"))?;
        let rendered = Duration::from_secs(rendered);
        ensure!(
            rendered >= budget,
            "{values}: terminationGracePeriodSeconds {rendered:?} < shutdown_budget({grace:?}) = {budget:?}"
        );
        // The formula, not a constant: the budget rounded up, plus the margin.
        let margin = serde_saphyr::from_str::<Value>(values)?["terminationGraceMargin"]
            .as_u64()
            .unwrap_or(10);
        assert_eq!(
            rendered.as_secs(),
            budget.as_secs() + u64::from(budget.subsec_nanos() > 0) + margin,
            "{values}: the grace is the budget rounded up plus the margin"
        );
        // What the program checks at start (examples/operator.rs).
        let delay = seconds(deployment, "WEBHOOK_DRAIN_DELAY", 5.0)?;
        let drain = seconds(deployment, "WEBHOOK_DRAIN_TIMEOUT", 5.0)?;
        ensure!(
            drain <= grace && delay + drain <= budget,
            "{values}: the drain fits"
        );
    }
    Ok(())
}

/// Values the program (or the library) would refuse at start, refused by
/// `helm template` with a message naming them.
#[test]
fn values_the_program_refuses_are_refused_at_render_time() -> Result<()> {
    for (values, says) in [
        ("{lease: {renewDeadline: 15}}", "lease.duration"),
        ("{lease: {retryPeriod: 10}}", "lease.renewDeadline"),
        ("{webhook: {drainTimeout: 25}}", "webhook.drainTimeout"),
        ("{webhook: {drainDelay: 50}}", "shutdown budget"),
        ("{webhook: {tls: {cert: x}}}", "webhook.tls.caBundle is required"),
    ] {
        match template("op", values)? {
            Ok(_) => bail!("{values} rendered"),
            Err(e) => ensure!(e.contains(says), "{values}: {e}"),
        }
    }
    Ok(())
}

fn rules(doc: &Value) -> Vec<(String, String, Vec<String>)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for rule in doc["rules"].as_array().into_iter().flatten() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                let mut verbs = strings(&rule["verbs"]);
                verbs.sort();
                out.push((group.clone(), resource, verbs));
            }
        }
    }
    out.sort();
    out
}

fn verbs(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

#[test]
fn the_rendered_objects_are_what_a_user_needs() -> Result<()> {
    for (values, coordinated, cluster_wide) in [
        ("{}", false, false),
        ("{lease: {coordinated: {enabled: true}}}", true, false),
        (
            "{watchAllNamespaces: true, podDisruptionBudget: {maxUnavailable: 1}}",
            false,
            true,
        ),
    ] {
        let ns = "op-ns";
        let docs = render(ns, values)?;
        // Every namespaced object in the release's namespace.
        for doc in &docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            if matches!(
                kind,
                "ClusterRole" | "ClusterRoleBinding" | "ValidatingWebhookConfiguration"
            ) {
                continue;
            }
            assert_eq!(doc["metadata"]["namespace"], ns, "{values}: {kind}'s namespace");
        }
        // RBAC: exactly the library's verbs on leases (and leasecandidates
        // only when coordinated), and the controllers'.
        let named = |kind: &str, suffix: &str| {
            docs.iter()
                .find(|d| {
                    d["kind"] == kind
                        && d["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.ends_with(suffix))
                })
                .with_context(|| format!("{values}: no {kind} *{suffix}"))
        };
        let leader_election = named("Role", "-leader-election")?;
        let mut expected = vec![(
            "coordination.k8s.io".to_owned(),
            "leases".to_owned(),
            verbs(&["get", "create", "update", "list", "watch"]),
        )];
        if coordinated {
            expected.push((
                "coordination.k8s.io".to_owned(),
                "leasecandidates".to_owned(),
                verbs(&["create", "get", "list", "watch", "update", "delete"]),
            ));
        }
        expected.sort();
        let controllers_kind = if cluster_wide { "ClusterRole" } else { "Role" };
        let controllers = named(controllers_kind, "-controllers")?;
        let mut both = rules(leader_election);
        both.extend(rules(controllers));
        both.sort();
        let mut expected_all = expected.clone();
        for resource in ["configmaps", "secrets"] {
            expected_all.push((
                String::new(),
                resource.to_owned(),
                verbs(&["list", "watch", "patch"]),
            ));
        }
        expected_all.sort();
        assert_eq!(both, expected_all, "{values}: the RBAC");

        check_pods(the(&docs, "Deployment")?)?;
        let pdb = the(&docs, "PodDisruptionBudget")?;
        if cluster_wide {
            assert_eq!(pdb["spec"]["maxUnavailable"], 1);
            assert!(pdb["spec"]["minAvailable"].is_null());
        } else {
            assert_eq!(pdb["spec"]["minAvailable"], 1);
        }

        check_webhook(&docs, ns)?;
    }
    // A single replica gets no PDB: it would block every drain.
    let single = render("op-ns", "{replicas: 1}")?;
    ensure!(
        !single.iter().any(|d| d["kind"] == "PodDisruptionBudget"),
        "a PodDisruptionBudget for a single replica"
    );
    Ok(())
}

/// The pods: restricted, identity from the downward API, probes on the HTTPS
/// port, soft anti-affinity.
fn check_pods(deployment: &Value) -> Result<()> {
    // The pods: restricted, identity from the downward API, probes on
    // the HTTPS port.
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let pod_name = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "POD_NAME")
        .context("no POD_NAME")?;
    assert_eq!(pod_name["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(deployment["spec"]["replicas"], 2);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path);
        assert_eq!(get["scheme"], "HTTPS");
        assert_eq!(get["port"], "https");
    }
    assert_eq!(container["ports"][0]["containerPort"], 9443);
    let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_null(),
        "soft anti-affinity only"
    );
    Ok(())
}

/// The webhook: Service 443 -> https (9443), its configuration, the Secret
/// the pods mount, signed by the caBundle's CA.
fn check_webhook(docs: &[Value], ns: &str) -> Result<()> {
    let deployment = the(docs, "Deployment")?;
    let pod = &deployment["spec"]["template"]["spec"];
    // The webhook: Service 443 -> https (9443), its configuration, the
    // Secret the pods mount, signed by the caBundle's CA.
    let service = the(docs, "Service")?;
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
    let vwc = the(docs, "ValidatingWebhookConfiguration")?;
    let hook = &vwc["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert!(hook["timeoutSeconds"].as_u64().is_some_and(|t| t <= 10));
    assert_eq!(
        hook["clientConfig"]["service"]["name"],
        service["metadata"]["name"]
    );
    assert_eq!(hook["clientConfig"]["service"]["namespace"], ns);
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(
        hook["objectSelector"]["matchLabels"]["operator.example.com/managed"],
        "true"
    );
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE", "UPDATE"])
    );
    assert_eq!(hook["rules"][0]["resources"], serde_json::json!(["configmaps"]));
    let secret = the(docs, "Secret")?;
    assert_eq!(secret["data"]["ca.crt"], hook["clientConfig"]["caBundle"]);
    let mounted = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "tls")
        .context("no tls volume")?;
    assert_eq!(mounted["secret"]["secretName"], secret["metadata"]["name"]);
    check_certificate(secret, service, ns)?;
    Ok(())
}

/// The serving certificate names the Service (`<svc>.<ns>.svc` and
/// `.svc.cluster.local`) and verifies against the CA of the caBundle
/// (`openssl`, installed with the system).
fn check_certificate(secret: &Value, service: &Value, ns: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    for key in ["ca.crt", "tls.crt"] {
        let b64 = secret["data"][key]
            .as_str()
            .with_context(|| format!("no {key}"))?;
        std::fs::write(dir.path().join(format!("{key}.b64")), b64)?;
        let out = Command::new("openssl")
            .current_dir(dir.path())
            .args(["base64", "-d", "-A", "-in"])
            .arg(format!("{key}.b64"))
            .arg("-out")
            .arg(key)
            .output()
            .context("running openssl base64")?;
        ensure!(out.status.success(), "openssl base64 -d of {key}");
    }
    let svc = service["metadata"]["name"]
        .as_str()
        .context("the Service's name")?;
    let out = Command::new("openssl")
        .current_dir(dir.path())
        .args(["verify", "-CAfile", "ca.crt"])
        .arg("-verify_hostname")
        .arg(format!("{svc}.{ns}.svc"))
        .arg("tls.crt")
        .output()
        .context("running openssl verify")?;
    ensure!(
        out.status.success(),
        "openssl verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = Command::new("openssl")
        .current_dir(dir.path())
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in", "tls.crt"])
        .output()?;
    let text = String::from_utf8_lossy(&text.stdout);
    for name in [format!("{svc}.{ns}.svc"), format!("{svc}.{ns}.svc.cluster.local")] {
        ensure!(text.contains(&format!("DNS:{name}")), "no SAN {name}: {text}");
    }
    Ok(())
}

async fn api_for(client: &Client, obj: &DynamicObject) -> Result<Api<DynamicObject>> {
    let types = obj.types.as_ref().context("manifest without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types)?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    Ok(match (caps.scope, obj.metadata.namespace.as_deref()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => bail!("{gvk:?} without a namespace"),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    })
}

/// Every object the chart renders, for each value set, accepted by the API
/// server (a server-side dry run: validation and admission, nothing stored).
#[tokio::test]
async fn the_rendered_chart_is_accepted_by_the_api_server() -> Result<()> {
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("chart").await?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for values in VALUE_SETS
        .iter()
        .copied()
        .chain(["{watchAllNamespaces: true, podDisruptionBudget: {maxUnavailable: 1}}"])
    {
        let docs = render(&ns, values)?;
        ensure!(docs.len() >= 10, "{values}: only {} objects", docs.len());
        for doc in docs {
            let obj: DynamicObject = serde_json::from_value(doc)?;
            let name = obj.metadata.name.clone().unwrap_or_default();
            let kind = obj.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
            api_for(&client, &obj)
                .await?
                .create(&dry_run, &obj)
                .await
                .with_context(|| format!("{values}: the API server rejected {kind} {name}"))?;
        }
    }
    Ok(())
}

/// No rendered copy of the chart is kept in `deploy/` (docs/real-cluster.md,
/// *Raw manifests*): `helm template` with the default values, the documented
/// way to get plain manifests, renders the same objects every time but for
/// the webhook's certificate (and its recorded expiry), which it generates (so a committed rendering
/// would hand every user the same private key).
#[test]
fn a_plain_rendering_differs_between_runs_only_in_the_generated_certificate() -> Result<()> {
    let masked = || -> Result<Vec<Value>> {
        let mut docs = render("operators", "{}")?;
        let mut masked = 0;
        for doc in &mut docs {
            if doc["kind"] == "Secret" {
                // Its expiry, recorded when it is generated (to the second).
                let not_after = &mut doc["metadata"]["annotations"]["operator.example.com/tls-not-after"];
                ensure!(not_after.is_string(), "the Secret has no expiry annotation");
                *not_after = Value::from("<generated>");
                for key in ["ca.crt", "tls.crt", "tls.key"] {
                    ensure!(doc["data"][key].is_string(), "the Secret has no {key}");
                    doc["data"][key] = Value::from("<generated>");
                    masked += 1;
                }
            }
            if doc["kind"] == "ValidatingWebhookConfiguration" {
                for hook in doc["webhooks"].as_array_mut().into_iter().flatten() {
                    hook["clientConfig"]["caBundle"] = Value::from("<generated>");
                    masked += 1;
                }
            }
        }
        ensure!(masked == 4, "masked {masked} generated values, not 4");
        Ok(docs)
    };
    let (first, second) = (masked()?, masked()?);
    assert_eq!(first, second, "two renderings differ beyond the certificate");
    let ca = |docs: &[Value]| -> Result<Value> { Ok(the(docs, "Secret")?["data"]["ca.crt"].clone()) };
    ensure!(
        ca(&render("operators", "{}")?)? != ca(&render("operators", "{}")?)?,
        "the certificate is not generated per rendering"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Review (deployment of the operator example): faults found in the chart.
// ---------------------------------------------------------------------------

/// Review: values the operator (its `lease_config`, `LeaseConfig::validate`,
/// `Shutdown::from_env`) refuses at start rendered fine, so a first install
/// went to `CrashLoopBackOff` instead of failing at `helm install`: a renew
/// deadline within client-go's jitter of the retry period (the chart checked
/// only `>`), a lease duration with a fraction, a Lease name that is no label
/// value (the elector labels its Lease `app.kubernetes.io/name=<name>`:
/// 63 characters at most), a negative drain delay, a coordinated version that
/// is not `MAJOR.MINOR.PATCH` or an emulation version newer than the binary's,
/// a shutdown grace beyond `i32::MAX` seconds (`Shutdown::from_env`).
/// Each is shown refused by the library (or the examples' env parsing) first,
/// then expected refused by `helm template` with a message naming it.
#[test]
fn review_values_the_operator_refuses_at_start_are_refused_at_render_time() -> Result<()> {
    let long = "a".repeat(64);
    let refused_by_the_library = [
        LeaseConfig::new("op", "op", "pod")
            .renew_deadline(Duration::from_secs_f64(2.2))
            .retry_period(Duration::from_secs(2))
            .validate()
            .is_err(),
        LeaseConfig::new("op", "op", "pod")
            .lease_duration(Duration::from_secs_f64(15.5))
            .validate()
            .is_err(),
        LeaseConfig::new("op", long.clone(), "pod")
            .label("app.kubernetes.io/name", long.clone())
            .validate()
            .is_err(),
        LeaseConfig::new("op", "op", "pod")
            .coordinated(kube_runtime_lease::coordinated::Coordinated::new("1.37"))
            .validate()
            .is_err(),
        LeaseConfig::new("op", "op", "pod")
            .coordinated(
                kube_runtime_lease::coordinated::Coordinated::new("1.37.0").emulation_version("1.38.0"),
            )
            .validate()
            .is_err(),
        Duration::try_from_secs_f64(-1.0).is_err(),
    ];
    ensure!(
        refused_by_the_library.iter().all(|r| *r),
        "the library accepts one of them: {refused_by_the_library:?}"
    );
    let values = [
        (
            "{lease: {renewDeadline: 2.2, retryPeriod: 2}}".to_owned(),
            "lease.renewDeadline",
        ),
        ("{lease: {duration: 15.5}}".to_owned(), "lease.duration"),
        (format!("{{lease: {{name: {long}}}}}"), "lease.name"),
        ("{webhook: {drainDelay: -1}}".to_owned(), "webhook.drainDelay"),
        (
            "{shutdownGrace: 3e9, webhook: {drainDelay: 1}}".to_owned(),
            "shutdownGrace",
        ),
        (
            "{lease: {coordinated: {enabled: true, binaryVersion: '1.37'}}}".to_owned(),
            "lease.coordinated.binaryVersion",
        ),
        (
            "{lease: {coordinated: {enabled: true, emulationVersion: 1.38.0}}}".to_owned(),
            "lease.coordinated.emulationVersion",
        ),
    ];
    let mut rendered = Vec::new();
    for (values, says) in &values {
        match template("op", values)? {
            Ok(_) => rendered.push(values.clone()),
            Err(e) => ensure!(e.contains(says), "{values}: refused without naming {says}: {e}"),
        }
    }
    ensure!(
        rendered.is_empty(),
        "rendered, though the operator refuses them at start (CrashLoopBackOff after install): {rendered:?}"
    );
    // What must still render: the boundary values the library accepts.
    for ok in [
        "{lease: {renewDeadline: 2.5, retryPeriod: 2}}",
        "{lease: {name: op.lease-1}}",
        "{lease: {coordinated: {enabled: true, emulationVersion: 1.36.0}}}",
        "{webhook: {drainDelay: 0}}",
    ] {
        render("op", ok)?;
    }
    Ok(())
}

/// Review: a `PodDisruptionBudget` that lets no replica be evicted
/// (`minAvailable` >= replicas, `maxUnavailable: 0`, `100%`) rendered: every
/// `kubectl drain` and node upgrade then hangs on it; one that keeps none
/// (`minAvailable: 0`, `maxUnavailable` >= replicas) let a drain evict both
/// replicas at once: no webhook endpoint (`failurePolicy: Fail`, so every
/// labelled `ConfigMap` write fails) and no standby.
#[test]
fn review_a_disruption_budget_that_blocks_every_drain_or_keeps_no_replica_is_refused() -> Result<()> {
    let mut rendered = Vec::new();
    for values in [
        "{podDisruptionBudget: {minAvailable: 2}}",
        "{podDisruptionBudget: {maxUnavailable: 0}}",
        "{replicas: 3, podDisruptionBudget: {minAvailable: 100%}}",
        "{replicas: 3, podDisruptionBudget: {minAvailable: 3}}",
        "{podDisruptionBudget: {minAvailable: 0}}",
        "{podDisruptionBudget: {maxUnavailable: 2}}",
        "{podDisruptionBudget: {maxUnavailable: 100%}}",
    ] {
        match template("op", values)? {
            Ok(_) => rendered.push(values),
            Err(e) => ensure!(e.contains("podDisruptionBudget."), "{values}: {e}"),
        }
    }
    ensure!(
        rendered.is_empty(),
        "rendered a budget that cannot work: {rendered:?}"
    );
    for ok in [
        "{}",
        "{replicas: 3, podDisruptionBudget: {minAvailable: 2}}",
        "{replicas: 3, podDisruptionBudget: {minAvailable: 50%}}",
        "{podDisruptionBudget: {maxUnavailable: 1}}",
        "{podDisruptionBudget: {maxUnavailable: 50%}}",
        "{replicas: 1}",
        "{podDisruptionBudget: {enabled: false, minAvailable: 2}}",
    ] {
        render("op", ok)?;
    }
    Ok(())
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `helm` with `args` against the test control plane (`kubeconfig`), bounded.
async fn helm_on(kubeconfig: &std::path::Path, args: &[&str]) -> Result<std::process::Output> {
    let mut command = tokio::process::Command::new(helm()?);
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("krl-review-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("krl-review-helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("krl-review-helm/data"),
        )
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .with_context(|| format!("helm {args:?} took over 120 s"))?
        .with_context(|| format!("running helm {args:?}"))
}

/// `helm <verb>` of the release `op` of `chart` in `ns`, with `extra`.
async fn helm_release(kc: &std::path::Path, verb: &str, chart: &str, ns: &str, extra: &[&str]) -> Result<()> {
    let mut args = vec![verb, "op", chart, "--namespace", ns, "--timeout", "60s"];
    args.extend_from_slice(extra);
    helm_ok(kc, &args).await
}

async fn helm_ok(kubeconfig: &std::path::Path, args: &[&str]) -> Result<()> {
    let out = helm_on(kubeconfig, args).await?;
    ensure!(
        out.status.success(),
        "helm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Review (never two): `helm upgrade --set lease.name=...` under running
/// replicas rolled the pods over to another Lease. During the rolling
/// update (`maxSurge: 1`, `maxUnavailable: 0`) the old replicas keep leading
/// the old Lease while a new replica leads the new one (at once when that
/// Lease exists and is free, as after renaming back, else after its creation
/// hold; for as long as the rollout lasts, or for good when it stalls on a
/// pod that cannot be scheduled), and the operator's fencing compares tokens
/// of one Lease only: two replicas reconcile at once. The chart now looks
/// the running Deployment up and refuses the change while it has replicas.
#[tokio::test]
async fn review_an_upgrade_that_renames_the_lease_under_running_replicas_is_refused() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("chart-rename").await?;
    let kc = env.kubeconfig_path();
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path")?;
    let base = ["--namespace", ns.as_str(), "--timeout", "60s"];
    let run = |extra: &'static [&'static str], verb: &'static str| {
        let mut args = vec![verb, "op", chart];
        args.extend_from_slice(&base);
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    helm_ok(kc, &as_refs(&run(&[], "install"))).await?;
    let outcome = async {
        // The same Lease: an ordinary upgrade goes through. (Each upgrade
        // sets a value: helm reuses the last release's values otherwise.)
        helm_ok(kc, &as_refs(&run(&["--set", "logLevel=info"], "upgrade"))).await?;
        let renamed = helm_on(kc, &as_refs(&run(&["--set", "lease.name=renamed"], "upgrade"))).await?;
        let stderr = String::from_utf8_lossy(&renamed.stderr).into_owned();
        ensure!(
            !renamed.status.success(),
            "helm upgrade changed the Lease (op-kube-runtime-lease-operator -> renamed) under 2 running replicas: \
             during the rollout an old replica leads the old Lease and a new one the new Lease"
        );
        ensure!(stderr.contains("lease.name"), "refused without naming lease.name: {stderr}");
        // Scaled to zero first, the rename is allowed.
        helm_ok(kc, &as_refs(&run(&["--set", "replicas=0"], "upgrade"))).await?;
        helm_ok(kc, &as_refs(&run(&["--set", "replicas=0,lease.name=renamed"], "upgrade"))).await?;
        helm_ok(kc, &as_refs(&run(&["--set", "lease.name=renamed"], "upgrade"))).await?;
        Ok(())
    }
    .await;
    helm_ok(kc, &["uninstall", "op", "--namespace", &ns, "--timeout", "60s"]).await?;
    outcome
}

/// The certificates of a PEM bundle, each as PEM.
fn pem_certs(bundle: &str) -> Vec<String> {
    bundle
        .split_inclusive("-----END CERTIFICATE-----")
        .filter(|c| c.contains("-----BEGIN CERTIFICATE-----"))
        .map(|c| c.trim().to_owned())
        .collect()
}

/// `openssl` with `args` in `dir`: whether it succeeded.
fn openssl_in(dir: &std::path::Path, args: &[&str]) -> Result<bool> {
    Ok(Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?
        .status
        .success())
}

/// Review (the webhook served throughout; first year): the generated
/// certificate was "kept across upgrades while the Secret exists", expired
/// or not, and nothing renewed it: `validityDays` (365) after the install
/// the API server could no longer call the webhook (`failurePolicy: Fail`:
/// every labelled `ConfigMap` write refused), and `helm upgrade`, the
/// natural remedy, kept the expired certificate. Installed here with
/// `validityDays: 1`, an upgrade with the default 365 kept the one-day
/// certificate. Now an upgrade in the certificate's last third renews it,
/// and that upgrade's `caBundle` holds the new CA and the old one (the pods
/// serve the old certificate until the kubelet updates their volume).
#[tokio::test]
async fn review_an_upgrade_renews_a_generated_certificate_near_its_expiry_without_a_gap() -> Result<()> {
    use k8s_openapi::api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret};
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("chart-cert").await?;
    let kc = env.kubeconfig_path();
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path")?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let secret_name = "op-kube-runtime-lease-operator-webhook-tls";
    let hook_name = format!("{ns}-op-kube-runtime-lease-operator");
    let read = || async {
        let secret = secrets.get(secret_name).await?;
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| -> Result<String> {
            Ok(String::from_utf8(
                data.get(k).with_context(|| format!("no {k}"))?.0.clone(),
            )?)
        };
        let hook = hooks.get(&hook_name).await?;
        let bundle = hook.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone()
            .context("no caBundle")?
            .0;
        anyhow::Ok((text("ca.crt")?, text("tls.crt")?, String::from_utf8(bundle)?))
    };
    helm_release(
        kc,
        "install",
        chart,
        &ns,
        &["--set", "webhook.tls.validityDays=1"],
    )
    .await?;
    let outcome = async {
        let (old_ca, old_cert, _) = read().await?;
        helm_release(kc, "upgrade", chart, &ns, &["--reset-values"]).await?;
        let (ca, cert, bundle) = read().await?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("tls.crt"), &cert)?;
        std::fs::write(dir.path().join("ca.crt"), &ca)?;
        std::fs::write(dir.path().join("old.crt"), &old_cert)?;
        // 30 days from now.
        ensure!(
            openssl_in(
                dir.path(),
                &["x509", "-noout", "-checkend", "2592000", "-in", "tls.crt"]
            )?,
            "helm upgrade (validityDays 365) kept the generated certificate that expires within a day: \
             once it expires every webhook call fails TLS verification, and no upgrade renews it"
        );
        ensure!(
            openssl_in(dir.path(), &["verify", "-CAfile", "ca.crt", "tls.crt"])?,
            "the new certificate does not verify against the Secret's CA"
        );
        // The bundle of the renewing upgrade: the new CA and the old one, so
        // that pods still serving the old certificate are trusted.
        let certs = pem_certs(&bundle);
        ensure!(
            certs.contains(&ca.trim().to_owned()),
            "the caBundle lacks the new CA"
        );
        ensure!(
            certs.contains(&old_ca.trim().to_owned()),
            "the caBundle of the renewing upgrade lacks the old CA: the pods serve the old certificate \
             until the kubelet updates their volume, and every webhook call fails until then"
        );
        std::fs::write(dir.path().join("bundle.crt"), &bundle)?;
        ensure!(
            openssl_in(dir.path(), &["verify", "-CAfile", "bundle.crt", "old.crt"])?,
            "the old certificate does not verify against the renewing upgrade's caBundle"
        );
        // Renewed once: the next upgrade keeps it, and drops the old CA.
        helm_release(kc, "upgrade", chart, &ns, &["--reset-values"]).await?;
        let (kept_ca, kept_cert, kept_bundle) = read().await?;
        ensure!(
            kept_ca == ca && kept_cert == cert,
            "an upgrade renewed a certificate with 365 days left"
        );
        ensure!(
            pem_certs(&kept_bundle) == vec![ca.trim().to_owned()],
            "the old CA stayed in the caBundle"
        );
        Ok(())
    }
    .await;
    helm_ok(kc, &["uninstall", "op", "--namespace", &ns, "--timeout", "60s"]).await?;
    outcome
}

/// Review (first hour): names made from the release. The
/// `ValidatingWebhookConfiguration`, cluster-scoped, was named
/// `<namespace>-<fullname>` cut to 63 characters (a limit it does not have),
/// so two releases in one long namespace got the same name and the second
/// `helm install` failed on an object the first owns. And a release name
/// Helm accepts but that starts with a digit or holds a dot (`1op`,
/// `op.v2`) rendered a webhook Service name the API server refuses (a
/// DNS-1035 label): the chart now refuses it at render time, naming it.
#[tokio::test]
async fn review_release_names_give_object_names_that_are_valid_and_distinct() -> Result<()> {
    let long_ns = "platform-observability-controllers-production-eu1";
    let hook_name = |release: &str| -> Result<String> {
        let docs = template_as(release, long_ns, "{}")?.map_err(|e| anyhow::anyhow!("{release}: {e}"))?;
        Ok(the(&docs, "ValidatingWebhookConfiguration")?["metadata"]["name"]
            .as_str()
            .context("no name")?
            .to_owned())
    };
    let (a, b) = (hook_name("operator-team-a")?, hook_name("operator-team-b")?);
    ensure!(
        a != b,
        "two releases in the namespace {long_ns} name their ValidatingWebhookConfiguration alike: {a:?}"
    );
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("chart-names").await?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for release in ["1op", "op.v2"] {
        match template_as(release, &ns, "{}")? {
            Err(e) => ensure!(
                e.contains(release),
                "{release}: refused without naming the release: {e}"
            ),
            Ok(docs) => {
                for doc in docs {
                    let obj: DynamicObject = serde_json::from_value(doc)?;
                    let name = obj.metadata.name.clone().unwrap_or_default();
                    let kind = obj.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
                    api_for(&client, &obj)
                        .await?
                        .create(&dry_run, &obj)
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!(
                                "release {release:?} rendered, but the API server rejects its {kind} {name}: {e}"
                            )
                        })?;
                }
            }
        }
    }
    Ok(())
}

/// A self-signed certificate and its key (PEM), made by `openssl` in `dir`.
fn self_signed(dir: &std::path::Path, name: &str) -> Result<(String, String)> {
    let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
    let out = Command::new("openssl")
        .current_dir(dir)
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-keyout", &key, "-out", &crt, "-days", "30", "-subj"])
        .arg(format!("/CN={name}"))
        .output()
        .context("running openssl req")?;
    ensure!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((
        std::fs::read_to_string(dir.join(crt))?,
        std::fs::read_to_string(dir.join(key))?,
    ))
}

/// Review (the webhook served throughout a certificate rotation): an
/// upgrade to a new certificate given in `webhook.tls` (a renewal from
/// another CA) switched the webhook's `caBundle` to the new CA at once,
/// while the pods serve the old certificate until the kubelet updates
/// their Secret volume (up to a minute and more) and they reload it: every
/// webhook call in between fails verification, and `failurePolicy: Fail`
/// refuses the write. The rotating upgrade's bundle must hold both CAs.
#[tokio::test]
async fn review_an_upgrade_to_a_new_given_certificate_keeps_the_old_ca_in_the_bundle() -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("chart-rotate").await?;
    let kc = env.kubeconfig_path();
    let chart = chart_dir();
    let chart = chart.to_str().context("chart path")?;
    let dir = tempfile::tempdir()?;
    let mut files = Vec::new();
    for name in ["old", "new"] {
        let (cert, key) = self_signed(dir.path(), name)?;
        let values = serde_json::json!({"webhook": {"tls": {"cert": cert, "key": key, "caBundle": cert}}});
        let file = dir.path().join(format!("{name}-values.json"));
        std::fs::write(&file, values.to_string())?;
        files.push((cert, file.to_str().context("path")?.to_owned()));
    }
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let hook_name = format!("{ns}-op-kube-runtime-lease-operator");
    let bundle = || async {
        let hook = hooks.get(&hook_name).await?;
        let bundle = hook.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone()
            .context("no caBundle")?
            .0;
        anyhow::Ok(pem_certs(&String::from_utf8(bundle)?))
    };
    let (old, new) = (&files[0], &files[1]);
    helm_release(kc, "install", chart, &ns, &["-f", &old.1]).await?;
    let outcome = async {
        helm_release(kc, "upgrade", chart, &ns, &["-f", &new.1]).await?;
        let certs = bundle().await?;
        ensure!(
            certs.contains(&new.0.trim().to_owned()),
            "the caBundle lacks the new CA"
        );
        ensure!(
            certs.contains(&old.0.trim().to_owned()),
            "the upgrade to a new certificate left only the new CA in the caBundle: the pods still serving \
             the old certificate (until the kubelet updates their volume) fail every webhook call"
        );
        // The next upgrade drops the old CA.
        helm_release(kc, "upgrade", chart, &ns, &["-f", &new.1]).await?;
        ensure!(
            bundle().await? == vec![new.0.trim().to_owned()],
            "the old CA stayed in the caBundle"
        );
        Ok(())
    }
    .await;
    helm_ok(kc, &["uninstall", "op", "--namespace", &ns, "--timeout", "60s"]).await?;
    outcome
}
