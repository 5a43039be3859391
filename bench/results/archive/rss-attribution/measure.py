#!/usr/bin/env python3
"""Idle RSS of candidate binaries, as bench/src/api_load.rs measures it.

For each trial, for each binary (order rotated per trial): a fresh namespace
and a free Lease (as create_free_lease), the leader alone (wait for
started-leading, settle 8 s = 3 * retry + 2, window 60 s, read /proc), then two
followers beside it (wait READY, settle 8 s, window 60 s, read /proc of the
first follower, and of the leader again). Timings 15/10/2.

Env of the candidate: as harness rust_candidate + bench Ctx::spawn_env
(KUBECONFIG, LEASE_NAMESPACE, LEASE_NAME, LEASE_DURATION, RENEW_DEADLINE,
RETRY_PERIOD, IDENTITY, WORK_INTERVAL_MS=86400000, EXIT_ON_STDIN_EOF=1, no
RUST_LOG, no NO_COLOR); stdin a pipe kept open, stdout to a file.
"""
import json, os, signal, subprocess, sys, time

RSS = "/work/rss"
BINS = sys.argv[1].split(",")  # labels: candidate-<label> in /work/rss
TRIALS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
WINDOW = float(os.environ.get("WINDOW", 60))
SETTLE = 3 * 2 + 2
OUT = os.environ.get("OUT", os.path.join(RSS, "results"))
os.makedirs(OUT, exist_ok=True)
bin_dir = os.path.expanduser("~/.cache/kube-runtime-lease/bin/v1.37.2")

started = []  # every process we start, to stop at the end


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def proc_read(pid):
    st = open(f"/proc/{pid}/status").read()
    rec = {}
    for line in st.splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize", "VmData", "Threads"):
            rec[k] = int(v.split()[0])
    roll = {}
    for line in open(f"/proc/{pid}/smaps_rollup").read().splitlines()[1:]:
        k, _, v = line.partition(":")
        roll[k.strip()] = int(v.split()[0])
    rec["rollup"] = roll
    rec["smaps"] = open(f"/proc/{pid}/smaps").read()
    return rec


def kubectl(kc, *args, input=None):
    for attempt in range(10):
        r = subprocess.run(["kubectl", f"--kubeconfig={kc}", *args], input=input, text=True,
                           capture_output=True)
        if r.returncode == 0:
            return r.stdout
        log("kubectl", args, "failed:", r.stderr.strip())
        time.sleep(2)
    raise RuntimeError("kubectl failed")


def spawn(binary, kc, ns, lease, ident, outpath):
    env = {k: v for k, v in os.environ.items() if k not in ("RUST_LOG", "NO_COLOR")}
    env.update(KUBECONFIG=kc, LEASE_NAMESPACE=ns, LEASE_NAME=lease, LEASE_DURATION="15",
               RENEW_DEADLINE="10", RETRY_PERIOD="2", IDENTITY=ident,
               WORK_INTERVAL_MS="86400000", EXIT_ON_STDIN_EOF="1")
    out = open(outpath, "w")
    p = subprocess.Popen([binary], env=env, stdin=subprocess.PIPE, stdout=out,
                         stderr=open(outpath + ".err", "w"))
    started.append(p)
    return p


def wait_line(path, word, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(word in l for l in open(path).read().splitlines()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"no {word} in {path} after {timeout} s")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill(); p.wait()


def main():
    hold = subprocess.Popen([os.path.join(RSS, "control-plane-hold")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, KRL_BIN_DIR=bin_dir))
    line = hold.stdout.readline().split()
    assert line[0] == "PIDS", line
    os.kill(hold.pid, signal.SIGSTOP)  # its 600 s sleep never ends; the control plane stays up
    etcd, apiserver, d = line[1], line[2], line[3]
    kc = os.path.join(d, "admin.kubeconfig")
    log("control plane", etcd, apiserver, d, "hold", hold.pid)
    open(os.path.join(OUT, "control-plane.txt"), "w").write(f"hold {hold.pid} etcd {etcd} apiserver {apiserver} dir {d}\n")
    time.sleep(20)  # the apiserver's start-up traffic settles, as in scenario_api
    results = []
    try:
        for t in range(1, TRIALS + 1):
            order = BINS[(t - 1) % len(BINS):] + BINS[:(t - 1) % len(BINS)]
            for label in order:
                binary = os.path.join(RSS, f"candidate-{label}")
                ns = f"rss-{label}-t{t}"
                lease = f"bench-{label}-t{t}"
                kubectl(kc, "create", "namespace", ns)
                kubectl(kc, "apply", "-f", "-", input=json.dumps({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": lease, "namespace": ns},
                    "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 0}}))
                base = os.path.join(OUT, f"{label}-t{t}")
                log("trial", t, label, "leader")
                leader = spawn(binary, kc, ns, lease, "ours-0", base + "-c0.out")
                wait_line(base + "-c0.out", "started-leading", 60)
                time.sleep(SETTLE + WINDOW)
                r_leader = proc_read(leader.pid)
                log("  leader VmRSS", r_leader["VmRSS"], "anon", r_leader["rollup"]["Anonymous"])
                fol = [spawn(binary, kc, ns, lease, f"ours-{i}", base + f"-c{i}.out") for i in (1, 2)]
                for i in (1, 2):
                    wait_line(base + f"-c{i}.out", "READY", 30)
                time.sleep(SETTLE + WINDOW)
                r_fol = proc_read(fol[0].pid)
                r_leader2 = proc_read(leader.pid)
                if any("started-leading" in open(base + f"-c{i}.out").read() for i in (1, 2)):
                    log("  WARNING: a follower took the lease")
                log("  follower VmRSS", r_fol["VmRSS"], "anon", r_fol["rollup"]["Anonymous"])
                for p in fol + [leader]:
                    stop(p)
                for role, r in (("leader", r_leader), ("follower", r_fol), ("leader-with-followers", r_leader2)):
                    open(f"{base}-{role}.smaps", "w").write(r.pop("smaps"))
                    results.append(dict(label=label, trial=t, role=role, **r))
                json.dump(results, open(os.path.join(OUT, "results.json"), "w"), indent=1)
    finally:
        for p in started:
            stop(p)
        os.kill(hold.pid, signal.SIGKILL)  # the children exit on stdin EOF
        hold.wait()
        log("control plane stopped")


main()
