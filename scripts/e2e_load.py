#!/usr/bin/env python3
"""Load and observation for scripts/e2e.sh (Python standard library only).

    e2e_load.py run --dir D --webhook IP:PORT --server-name NAME --ca CA.pem
                    --proxy PORT --namespace NS --lease NAME --configmap CM
        Until SIGTERM (or its parent's end), in threads:
        - webhook: admission reviews POSTed to https://IP:PORT/validate without
          pause, each on a new connection (TLS verified against CA.pem for
          NAME), alternately one to allow and one to deny; a request fails
          unless it gets a 200 with the request's uid and the right verdict;
        - churn: a merge patch of ConfigMap CM's data every 0.25 s through
          `kubectl proxy` on 127.0.0.1:PORT (so through the API server and the
          webhook, failurePolicy Fail); a non-2xx is a failure;
        - lease: a watch of Lease NAME (through the proxy), each holder change
          logged to D/lease.log: received time, holder, acquireTime.
        Counters in D/counters.json (rewritten every 0.2 s); each failure a
        line of D/failures.log.

    e2e_load.py counters --dir D
        The counters, as `webhook_ok webhook_fail churn_ok churn_fail`.

    e2e_load.py leaderless --dir D --since T
        From D/lease.log, after epoch time T: the longest time (ms) during
        which no replica held the Lease (holder empty, or an identity that is
        not "<pod>_<suffix>"), measured between acquireTimes, and the holder
        changes, and when the last replica's term began (ms after T).
"""

import argparse
import datetime
import http.client
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import uuid

stop = threading.Event()
lock = threading.Lock()
counters = {"webhook_ok": 0, "webhook_fail": 0, "churn_ok": 0, "churn_fail": 0}


def failed(d, kind, what):
    with lock:
        counters[kind + "_fail"] += 1
        with open(os.path.join(d, "failures.log"), "a") as f:
            f.write(f"{time.time():.3f} {kind} {what}\n")


def ok(kind):
    with lock:
        counters[kind + "_ok"] += 1


def review(deny):
    uid = str(uuid.uuid4())
    data = {"password" if deny else "colour": "blue"}
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": "cm",
            "namespace": "e2e",
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "e2e"},
                "data": data,
            },
        },
    }
    return uid, json.dumps(body).encode()


def webhook(a):
    host, port = a.webhook.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=a.ca)
    deny = False
    while not stop.is_set():
        deny = not deny
        uid, body = review(deny)
        sock = None
        try:
            raw = socket.create_connection((host, int(port)), timeout=5)
            sock = ctx.wrap_socket(raw, server_hostname=a.server_name)
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.sock = sock
            conn.request("POST", "/validate", body, {"Content-Type": "application/json", "Connection": "close"})
            resp = conn.getresponse()
            text = resp.read()
            if resp.status != 200:
                failed(a.dir, "webhook", f"status {resp.status}: {text[:200]!r}")
                continue
            r = json.loads(text)["response"]
            if r["uid"] != uid or r["allowed"] == deny:
                failed(a.dir, "webhook", f"wrong answer {r}")
                continue
            ok("webhook")
        except Exception as e:  # noqa: BLE001 (every failure counts)
            failed(a.dir, "webhook", f"{type(e).__name__}: {e}")
            time.sleep(0.05)
        finally:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


def churn(a):
    n = 0
    path = f"/api/v1/namespaces/{a.namespace}/configmaps/{a.configmap}"
    while not stop.is_set():
        n += 1
        body = json.dumps({"data": {"n": str(n)}}).encode()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", a.proxy, timeout=15)
            conn.request("PATCH", path, body, {"Content-Type": "application/merge-patch+json"})
            resp = conn.getresponse()
            text = resp.read()
            conn.close()
            if 200 <= resp.status < 300:
                ok("churn")
            else:
                failed(a.dir, "churn", f"status {resp.status}: {text[:300]!r}")
        except Exception as e:  # noqa: BLE001
            failed(a.dir, "churn", f"{type(e).__name__}: {e}")
        stop.wait(0.25)


def lease(a):
    path = (
        f"/apis/coordination.k8s.io/v1/namespaces/{a.namespace}/leases"
        f"?watch=true&fieldSelector=metadata.name%3D{a.lease}&allowWatchBookmarks=false"
    )
    last = None
    log = os.path.join(a.dir, "lease.log")
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", a.proxy, timeout=30)
            conn.request("GET", path)
            resp = conn.getresponse()
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    break
                ev = json.loads(line)
                spec = ev.get("object", {}).get("spec", {})
                holder = spec.get("holderIdentity") or ""
                if holder != last:
                    last = holder
                    with open(log, "a") as f:
                        f.write(f"{time.time():.3f} {holder or '-'} {spec.get('acquireTime', '-')}\n")
            conn.close()
        except (OSError, http.client.HTTPException, ValueError):
            stop.wait(0.5)


def write_counters(d):
    with lock:
        text = json.dumps(dict(counters, t=time.time()))
    tmp = os.path.join(d, "counters.json.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(d, "counters.json"))


def run(a):
    os.makedirs(a.dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [threading.Thread(target=f, args=(a,), daemon=True) for f in (webhook, churn, lease)]
    for t in threads:
        t.start()
    # Ends with the script that started it, even one killed with SIGKILL.
    parent = os.getppid()
    while not stop.is_set():
        write_counters(a.dir)
        if os.getppid() != parent:
            stop.set()
        stop.wait(0.2)
    write_counters(a.dir)


def micro(ts):
    return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def leaderless(a):
    rows = []
    try:
        with open(os.path.join(a.dir, "lease.log")) as f:
            for line in f:
                seen, holder, acquired = line.split()
                rows.append((float(seen), holder, micro(acquired) if acquired != "-" else float(seen)))
    except FileNotFoundError:
        pass
    is_replica = lambda h: h != "-" and "_" in h  # noqa: E731
    # The state at `since`: the last change before it.
    before = [r for r in rows if r[0] < a.since]
    after = [r for r in rows if r[0] >= a.since]
    longest, gap_from = 0.0, None
    if before and not is_replica(before[-1][1]):
        gap_from = a.since
    for _, holder, at in after:
        if is_replica(holder):
            if gap_from is not None:
                longest = max(longest, at - gap_from)
                gap_from = None
        elif gap_from is None:
            gap_from = at
    if gap_from is not None:
        longest = max(longest, time.time() - gap_from)
    replicas = [at for _, h, at in after if is_replica(h)]
    print(json.dumps({
        "leaderless_ms": round(longest * 1000),
        # When the last replica's term in the window began, after `since`.
        "settled_ms": round((replicas[-1] - a.since) * 1000) if replicas else "-",
        "changes": [h for _, h, _ in after],
    }))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--webhook", required=True)
    r.add_argument("--server-name", required=True)
    r.add_argument("--ca", required=True)
    r.add_argument("--proxy", type=int, required=True)
    r.add_argument("--namespace", required=True)
    r.add_argument("--lease", required=True)
    r.add_argument("--configmap", required=True)
    c = sub.add_parser("counters")
    c.add_argument("--dir", required=True)
    g = sub.add_parser("leaderless")
    g.add_argument("--dir", required=True)
    g.add_argument("--since", type=float, required=True)
    a = p.parse_args()
    if a.cmd == "run":
        run(a)
    elif a.cmd == "counters":
        with open(os.path.join(a.dir, "counters.json")) as f:
            c = json.load(f)
        print(c["webhook_ok"], c["webhook_fail"], c["churn_ok"], c["churn_fail"])
    else:
        leaderless(a)


if __name__ == "__main__":
    sys.exit(main())
