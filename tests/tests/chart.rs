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
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values)?;
    let out = Command::new(helm()?)
        .args(["template", "op", "--namespace", namespace, "--values"])
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
                verbs(&["get", "list", "watch", "patch"]),
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
/// the webhook's certificate, which it generates (so a committed rendering
/// would hand every user the same private key).
#[test]
fn a_plain_rendering_differs_between_runs_only_in_the_generated_certificate() -> Result<()> {
    let masked = || -> Result<Vec<Value>> {
        let mut docs = render("operators", "{}")?;
        let mut masked = 0;
        for doc in &mut docs {
            if doc["kind"] == "Secret" {
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
