//! The README's quick start, built and run as a new user would, against a real
//! kube-apiserver and etcd (the shared control plane of the harness).
//!
//! The test takes *exactly* the two blocks the README marks with
//! `<!-- quickstart:Cargo.toml -->` and `<!-- quickstart:main.rs -->`, writes
//! them into a scratch crate in a temporary directory, changing one line only:
//! `kube-runtime-lease = "<version>"` gets `path = <this checkout>` beside its
//! version (so the README's version requirement must still match the crate's),
//! builds it with cargo (the workspace's `Cargo.lock` copied in, so versions
//! match the workspace's; crates missing from it are fetched; target directory
//! `target/readme-scratch`, so reruns are incremental), and fails on any
//! compiler warning in the quick start itself.
//!
//! Then it runs two copies, as two replicas, in a fresh namespace
//! (`POD_NAMESPACE`) with identities from `POD_NAME`, and checks what the
//! README promises: the first creates the Lease under its identity and
//! reconciles (here: a `ConfigMap` the test created, which the quick start
//! prints as `<namespace>/<name>`), the second stands by; on SIGTERM the first
//! exits 0 after releasing the Lease and the second takes over at once (well
//! within a lease duration, so by the release and not by expiry); on SIGTERM
//! the second exits 0 and leaves the Lease free. Every wait is bounded (and
//! cut short when a replica exits unasked); the processes are killed when the
//! test ends either way.
//!
//! The quick start's dependency block must give rustls a crypto provider: one
//! without (kube with `default-features = false` and no `ring`) makes the
//! quick start panic at its first request, and this test then fails at once,
//! with the panic in its log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use kube_runtime_lease_harness::TestEnv;
use kube_runtime_lease_harness::{
    Entry, EventLog, Flavor, Kind, LeaseRecorder, LeaseRef, Process, Sig, cargo::Build, fmt_ms, serial,
    shared_env, workspace_root,
};
use tokio::process::Command;

/// The README's quick start uses the default timings: client-go's 15 s lease
/// duration. A brand-new Lease is led one lease duration after its creation.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// A cold build of the scratch crate (kube, k8s-openapi, rustls...) on a small
/// machine; a warm one takes seconds.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long a replica may take to exit after SIGTERM: the quick start's grace
/// (20 s) would only be used by slow reconciles, which this one has not.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The scratch crate's package, and so its binary.
const QUICKSTART: &str = "readme-quickstart";
/// The `ConfigMap` the replicas reconcile.
const CONFIGMAP: &str = "readme-quickstart";

/// The fenced block right after the README's `<!-- quickstart:{name}` marker,
/// verbatim (with a final newline).
fn quickstart_block(readme: &str, name: &str) -> Result<String> {
    let marker = format!("<!-- quickstart:{name}");
    let lines: Vec<&str> = readme.lines().collect();
    let at: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with(&marker))
        .collect();
    let &[at] = at.as_slice() else {
        bail!(
            "README.md has {} `{marker} -->` markers, expected exactly one",
            at.len()
        );
    };
    let fence = lines
        .get(at + 1)
        .filter(|l| l.starts_with("```"))
        .ok_or_else(|| anyhow!("README.md: the line after `{marker} -->` is not a ``` fence"))?;
    let body: Vec<&str> = lines[at + 2..]
        .iter()
        .copied()
        .take_while(|l| *l != "```")
        .collect();
    ensure!(
        at + 2 + body.len() < lines.len(),
        "README.md: the {fence} block after `{marker} -->` is not closed"
    );
    Ok(body.iter().fold(String::new(), |mut s, l| {
        s.push_str(l);
        s.push('\n');
        s
    }))
}

/// The scratch crate's manifest: a `[package]` header, then the README's
/// dependency block with its one `kube-runtime-lease` line pointed at `krl`.
fn scratch_manifest(dependencies: &str, krl: &Path) -> Result<String> {
    ensure!(
        dependencies.lines().any(|l| l.trim() == "[dependencies]"),
        "the README's Cargo.toml block has no [dependencies] table:\n{dependencies}"
    );
    let krl = krl.to_str().context("the crate's path is not UTF-8")?;
    ensure!(
        !krl.contains(['"', '\\']),
        "the crate's path {krl:?} needs escaping in TOML"
    );
    let path = format!("path = \"{krl}\"");
    let mut replaced = 0;
    let mut out = format!(
        "[package]\nname = \"{QUICKSTART}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         # Not part of any enclosing workspace.\n[workspace]\n\n",
    );
    for line in dependencies.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        if key == "kube-runtime-lease" {
            replaced += 1;
            let (_, value) = line.split_once('=').unwrap_or_default();
            let value = value.trim();
            let line = if let Some(table) = value.strip_prefix('{') {
                // { version = "...", features = [...] }: add the path.
                format!("kube-runtime-lease = {{ {path},{table}")
            } else {
                // "0.1", possibly followed by a comment: keep the version.
                let (version, comment) = match value.split_once('#') {
                    Some((v, c)) => (v.trim(), format!("   #{c}")),
                    None => (value, String::new()),
                };
                format!("kube-runtime-lease = {{ version = {version}, {path} }}{comment}")
            };
            out.push_str(&line);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    ensure!(
        replaced == 1,
        "the README's Cargo.toml block has {replaced} kube-runtime-lease lines, expected one:\n{dependencies}"
    );
    Ok(out)
}

/// Builds the scratch crate in `dir`; returns its executable. Fails on a
/// compiler warning in the quick start.
async fn build(dir: &Path, root: &Path) -> Result<PathBuf> {
    let built = Build::in_dir(dir)
        .env("CARGO_TARGET_DIR", root.join("target").join("readme-scratch"))
        // As the workspace's profile does: no debug info, which is most of
        // what a target directory holds.
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .run_within(BUILD_TIMEOUT)
        .await
        .context("building the quick start")?;
    if !built.status.success() {
        // Errors of any crate (a broken path dependency shows up here too).
        bail!(
            "the README's quick start does not build ({}):\n{}\n{}",
            built.status,
            built.errors().join("\n"),
            built.stderr_tail(30)
        );
    }
    let diagnostics = built.diagnostics(QUICKSTART);
    ensure!(
        diagnostics.is_empty(),
        "the README's quick start builds with warnings:\n{}",
        diagnostics.join("\n")
    );
    built
        .executable(QUICKSTART)
        .ok_or_else(|| anyhow!("cargo reported no executable for the quick start"))
}

/// One replica of the quick start, as a pod would run it.
fn replica(bin: &Path, env: &TestEnv, namespace: &str, pod: &str, log: &EventLog) -> Result<Process> {
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAMESPACE", namespace)
        .env("POD_NAME", pod)
        .env("RUST_BACKTRACE", "0");
    Process::spawn(pod, Flavor::Rust, cmd, log)
}

/// A replica whose output ended although the test had not sent it SIGTERM:
/// it crashed or exited (its stderr is in the log).
fn exited_early(entries: &[Entry]) -> Option<String> {
    entries
        .iter()
        .filter(|e| e.kind == Kind::StdoutClosed)
        .find(|e| {
            !entries
                .iter()
                .any(|s| s.process == e.process && s.kind == Kind::Signal(Sig::Term))
        })
        .map(|e| e.process.clone())
}

/// [`EventLog::wait_for`], failing at once when a replica exits early.
async fn wait_for(
    log: &EventLog,
    what: &str,
    timeout: Duration,
    mut pred: impl FnMut(&Entry) -> bool,
) -> Result<Entry> {
    log.wait_until(what, timeout, |entries| {
        if let Some(e) = entries.iter().find(|e| pred(e)) {
            return Some(Ok(e.clone()));
        }
        exited_early(entries).map(|p| Err(anyhow!("{p} exited while the test waited for {what}")))
    })
    .await?
}

/// The Lease the quick start created in `namespace` (the namespace is fresh:
/// any Lease in it is the quick start's).
async fn wait_for_lease(
    client: &Client,
    namespace: &str,
    log: &EventLog,
    timeout: Duration,
) -> Result<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    tokio::time::timeout(timeout, async {
        loop {
            if let Some(name) = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find_map(|l| l.metadata.name)
            {
                return Ok(name);
            }
            if let Some(p) = exited_early(&log.entries()) {
                bail!("{p} exited before any Lease appeared in {namespace}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .map_err(|_| anyhow!("no Lease appeared in {namespace} within {timeout:?}"))?
}

/// Whether `e` is `process` printing that it reconciles the test's `ConfigMap`.
fn reconciles(e: &Entry, process: &str, namespace: &str) -> bool {
    e.process == process && e.kind == Kind::Other && e.detail.contains(&format!("{namespace}/{CONFIGMAP}"))
}

async fn scenario(bin: &Path, env: &TestEnv, client: &Client, namespace: &str, log: &EventLog) -> Result<()> {
    let mut a = replica(bin, env, namespace, "readme-a", log)?;
    let lease = LeaseRef {
        namespace: namespace.to_owned(),
        name: wait_for_lease(client, namespace, log, Duration::from_secs(30)).await?,
    };
    let _recorder = LeaseRecorder::start(client.clone(), lease.clone(), log).await?;
    wait_for(
        log,
        "the Lease to name readme-a's identity",
        Duration::from_secs(10),
        |e| e.kind == Kind::Record && e.who.starts_with("readme-a_"),
    )
    .await?;

    let mut b = replica(bin, env, namespace, "readme-b", log)?;
    wait_for(log, "readme-b to start", Duration::from_secs(30), |e| {
        e.process == "readme-b" && e.kind == Kind::Other
    })
    .await?;
    let leads = wait_for(
        log,
        "readme-a to reconcile the ConfigMap",
        LEASE_DURATION * 2 + Duration::from_secs(30),
        |e| reconciles(e, "readme-a", namespace),
    )
    .await?;
    log.note(&format!("readme-a leads (reconciled {CONFIGMAP})"));

    let term_a = a.signal(Sig::Term)?;
    let status = a.wait_exit(EXIT_TIMEOUT).await?;
    ensure!(status.success(), "readme-a exited with {status} after SIGTERM");
    wait_for(
        log,
        "readme-a's release (a free Lease)",
        Duration::from_secs(10),
        |e| e.kind == Kind::Record && e.who.is_empty() && e.at >= term_a,
    )
    .await?;
    let took_over = wait_for(
        log,
        "readme-b to take over and reconcile",
        LEASE_DURATION / 2,
        |e| reconciles(e, "readme-b", namespace),
    )
    .await?;
    ensure!(
        log.find(|e| e.kind == Kind::Record && e.who.starts_with("readme-b_") && e.at >= term_a)
            .is_some(),
        "readme-b reconciled but the Lease never named it"
    );
    ensure!(
        log.find(|e| reconciles(e, "readme-b", namespace) && e.at < term_a)
            .is_none(),
        "readme-b reconciled while readme-a led"
    );
    let spawned_a = log
        .find(|e| e.kind == Kind::Spawned && e.process == "readme-a")
        .map_or(0, |e| e.at);
    log.note(&format!(
        "readme-a reconciled {} after its start, readme-b {} after readme-a's SIGTERM",
        fmt_ms(leads.at.saturating_sub(spawned_a)),
        fmt_ms(took_over.at.saturating_sub(term_a)),
    ));

    let term_b = b.signal(Sig::Term)?;
    let status = b.wait_exit(EXIT_TIMEOUT).await?;
    ensure!(status.success(), "readme-b exited with {status} after SIGTERM");
    wait_for(
        log,
        "readme-b's release (a free Lease)",
        Duration::from_secs(10),
        |e| e.kind == Kind::Record && e.who.is_empty() && e.at >= term_b,
    )
    .await?;
    let holder = Api::<Lease>::namespaced(client.clone(), namespace)
        .get(&lease.name)
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    ensure!(
        holder.is_empty(),
        "the Lease names {holder:?} after both replicas exited"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_quick_start_builds_elects_and_hands_over() -> Result<()> {
    let _serial = serial().await;
    let started = std::time::Instant::now();
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let dependencies = quickstart_block(&readme, "Cargo.toml")?;
    let main_rs = quickstart_block(&readme, "main.rs")?;

    let dir = tempfile::Builder::new().prefix("readme-quickstart-").tempdir()?;
    std::fs::create_dir(dir.path().join("src"))?;
    std::fs::write(
        dir.path().join("Cargo.toml"),
        scratch_manifest(&dependencies, &root.join("kube-runtime-lease"))?,
    )?;
    std::fs::write(dir.path().join("src").join("main.rs"), main_rs)?;
    std::fs::copy(root.join("Cargo.lock"), dir.path().join("Cargo.lock")).context("copying Cargo.lock")?;

    let (env, bin) = tokio::try_join!(shared_env(), build(dir.path(), &root))?;
    let built = started.elapsed();
    println!(
        "setup: control plane and quick-start build {:.1} s",
        built.as_secs_f64()
    );

    let client = env.client().await?;
    let namespace = env.new_namespace("readme").await?;
    Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CONFIGMAP.to_owned()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .context("creating the ConfigMap")?;

    let log = EventLog::new();
    let result = scenario(&bin, env, &client, &namespace, &log).await;
    println!("{}", log.dump());
    println!(
        "run: {:.1} s; {:.1} s in all",
        started.elapsed().saturating_sub(built).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    result
}
