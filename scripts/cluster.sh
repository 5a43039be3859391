#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, built from Go modules
# and Debian packages (no Docker, no kind, no downloaded binaries): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc,
# kubelet, kube-proxy (iptables) and the CNI bridge plugin.
#
# usage: scripts/cluster.sh build    build (or reuse) every binary; installs
#                                    runc, CNI plugins, iptables, nftables,
#                                    nfacct from Debian when missing
#        scripts/cluster.sh up       build, then start the cluster; waits for
#                                    the node to be Ready; prints KUBECONFIG
#        scripts/cluster.sh down     stop it and restore the host; prints (and
#                                    fails on) any difference left
#        scripts/cluster.sh status   which components run
#        scripts/cluster.sh env      print `export KUBECONFIG=... PATH=...`
#        scripts/cluster.sh import T.tar...  OCI image tarballs (made by
#                                    scripts/oci-image.py) into containerd
#        scripts/cluster.sh bin-dir  print the dir of kubectl and the other
#                                    Kubernetes programs
#        scripts/cluster.sh helm     build helm alone when missing (no root);
#                                    print its path (tests/tests/chart.rs)
#
# Root only (it runs kubelet and containerd). See docs/real-cluster.md.
#
# Environment:
#   KRL_CLUSTER_DIR        state: PKI, configs, data, logs, PIDs
#                          (default /tmp/krl-cluster)
#   KRL_CLUSTER_PORT_BASE  the ports are BASE+N (default 17000: etcd 17379
#                          and 17380, apiserver 17443, kubelet 17250, ...),
#                          none of the defaults (6443, 10250, 10257, 10259),
#                          below the ephemeral range the tests' control
#                          planes take their ports from
#   KRL_CLUSTER_READY_TIMEOUT  seconds to wait for a Ready node (default 180)
#   KRL_CLUSTER_KEEP_ON_FAILURE=1  a failed `up` leaves what it started
#                          running (default: it runs `down`)
#   KRL_CLUSTER_APISERVER_ARGS  more kube-apiserver flags (split on spaces)
#   KRL_CACHE_DIR, KRL_GO_PROCS  as for scripts/control-plane.sh
#
# The network rule: the cluster talks only to loopback and to addresses it
# creates. `up` creates the bridge krl0 with 10.217.0.1/24 (the node IP and
# the apiserver's advertise address); pods get 10.218.0.0/24 on that bridge
# from the CNI bridge plugin, with routes to the node and the Service range
# (10.219.0.0/24) only: no default route, no masquerading. The host routes
# the Service range through the bridge from the node IP (the API server
# reaches a webhook's Service; a ClusterIP is DNATed to a pod).
#
# Times on the 2-core machine (docs/real-cluster.md has them per component):
# a cold `build` took 17 min under `nice -n 19` with `-p 1` (KRL_GO_PROCS=1)
# while two others compiled Rust, after scripts/control-plane.sh had filled
# Go's build cache (helm 7 min, containerd 2.6 min, the five Kubernetes
# programs 7.3 min); 61 s with only the binaries gone (Go's caches warm); a
# warm one 1 s; `up` to a Ready node 10-12 s; `down` 3.5-11 s.
set -euo pipefail

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
moddir="$root/cluster/go"
cache="${KRL_CACHE_DIR:-${HOME:-/root}/.cache/kube-runtime-lease}"
procs="${KRL_GO_PROCS:-2}"
cmd="${1:-}"

containerd_version=v2.4.2
helm_version=v4.3.2
k8s_version="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)\( \/\/ indirect\)\{0,1\}$/\1/p' "$moddir/go.mod" | head -1)"
[ -n "$k8s_version" ] || die "cannot find the k8s.io/kubernetes version in $moddir/go.mod"
harness_version="$("$root/scripts/control-plane.sh" version)"
[ -z "${KRL_K8S_VERSION:-}" ] || [ "v${KRL_K8S_VERSION#v}" = "$k8s_version" ] ||
  die "KRL_K8S_VERSION=$KRL_K8S_VERSION: the cluster is built for k8s.io/kubernetes $k8s_version only (cluster/go/go.mod); unset it"
[ "$k8s_version" = "$harness_version" ] ||
  die "cluster/go/go.mod pins k8s.io/kubernetes $k8s_version but the control plane is $harness_version: copy harness/go/go.mod's require and replace blocks into cluster/go/go.mod and run 'go mod tidy' there"
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "bad k8s.io/kubernetes version '$k8s_version'"
k8s_minor="${BASH_REMATCH[1]}"

kbin="$cache/cluster/kubernetes-$k8s_version"
cbin="$cache/cluster/containerd-$containerd_version"
hbin="$cache/cluster/helm-$helm_version"
imgdir="$cache/cluster/images"
buildlogs="$cache/cluster/logs"
cpbin="$("$root/scripts/control-plane.sh" bin-dir)"
k8s_bins=(kube-scheduler kube-proxy kube-controller-manager kubectl kubelet)
debs=(runc containernetworking-plugins iptables nftables nfacct)
runc_bin=/usr/sbin/runc
cni_bin_dir=/usr/lib/cni

# ---------------------------------------------------------------- build
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
done

# The stamp of a build: what it was built from and with.
stamp_of() { (cat "$@"; go env GOVERSION) | sha256sum | cut -c1-16; }

record_time() { # name seconds
  mkdir -p "$buildlogs"
  printf '%s %s %ss (-p %s)\n' "$(date -u +%FT%TZ)" "$1" "$2" "$procs" >>"$buildlogs/build-times.txt"
}

# go_build NAME STAMPFILE OUTDIR -- go build/install args...: runs one Go
# build into a temporary GOBIN/-o dir, times it, moves the binaries in place.
run_go() { # name logfile -- command...
  local name="$1" logfile="$2"
  shift 3
  local start=$SECONDS
  log "building $name (-p $procs; log: $logfile)"
  if ! GOMAXPROCS="$procs" CGO_ENABLED=0 "$@" >"$logfile" 2>&1; then
    tail -20 "$logfile" >&2
    die "building $name failed: $(grep -m1 -E 'error|cannot|requires go|not found|undefined' "$logfile" || tail -1 "$logfile") (full log: $logfile)"
  fi
  local took=$((SECONDS - start))
  record_time "$name" "$took"
  log "built $name in $took s"
}

build_k8s() {
  mkdir -p "$kbin" "$buildlogs"
  local stamp name tmp
  stamp="$(printf '%s\n' "$k8s_ldflags" | stamp_of "$moddir/go.mod" "$moddir/go.sum" -)"
  for name in "${k8s_bins[@]}"; do
    if [ -x "$kbin/$name" ] && [ "$(cat "$kbin/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
      continue
    fi
    tmp="$(mktemp -d "$kbin/.build.XXXXXX")"
    run_go "$name" "$buildlogs/build-$name.log" -- \
      bash -c 'cd "$1" && shift && exec go build "$@"' _ "$moddir" \
      -p "$procs" -trimpath -ldflags "$k8s_ldflags" -o "$tmp/$name" "k8s.io/kubernetes/cmd/$name"
    mv -f "$tmp/$name" "$kbin/$name" && rm -rf "$tmp"
    echo "$stamp" >"$kbin/.$name.stamp"
  done
  stamp="$(stamp_of "$moddir/go.mod" "$moddir/cmd/krl-pause/main.go")"
  if ! [ -x "$kbin/krl-pause" ] || [ "$(cat "$kbin/.krl-pause.stamp" 2>/dev/null)" != "$stamp" ]; then
    tmp="$(mktemp -d "$kbin/.build.XXXXXX")"
    run_go krl-pause "$buildlogs/build-krl-pause.log" -- \
      bash -c 'cd "$1" && shift && exec go build "$@"' _ "$moddir" \
      -p "$procs" -trimpath -ldflags "-s -w" -o "$tmp/krl-pause" ./cmd/krl-pause
    mv -f "$tmp/krl-pause" "$kbin/krl-pause" && rm -rf "$tmp"
    echo "$stamp" >"$kbin/.krl-pause.stamp"
  fi
}

# go install MODULE/cmd/...@VERSION into DIR/bin (its own go.mod, outside ours).
build_go_install() { # name dir tags ldflags packages...
  local name="$1" dir="$2" tags="$3" ldflags="$4"
  shift 4
  local stamp bin missing=0
  stamp="$(printf '%s\n' "$tags" "$ldflags" "$@" | stamp_of -)"
  for bin in "$@"; do
    [ -x "$dir/bin/$(basename "${bin%@*}")" ] || missing=1
  done
  if [ "$missing" = 0 ] && [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  mkdir -p "$dir" "$buildlogs"
  local tmp
  tmp="$(mktemp -d "$dir/.build.XXXXXX")"
  run_go "$name" "$buildlogs/build-$name.log" -- \
    bash -c 'cd "$1" && shift && exec env GOBIN="$1" go install "${@:2}"' _ "$tmp" "$tmp" \
    -p "$procs" -trimpath -tags "$tags" -ldflags "$ldflags" "$@"
  rm -rf "${dir:?}/bin" && mv "$tmp" "$dir/bin"
  echo "$stamp" >"$dir/.stamp"
}

install_debs() {
  local missing=() p
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing Debian packages: ${missing[*]} (as root: apt-get install -y ${missing[*]})"
  mkdir -p "$buildlogs"
  log "installing from Debian: ${missing[*]} (log: $buildlogs/apt.log)"
  local start=$SECONDS
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$buildlogs/apt.log" 2>&1 || { tail -20 "$buildlogs/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $buildlogs/apt.log)"; }
  record_time "apt-get install ${missing[*]}" $((SECONDS - start))
}

# The sandbox image: the name containerd's CRI config pins, from krl-pause.
sandbox_image() {
  "$cbin/bin/containerd" config default 2>/dev/null | sed -n "s/^[[:space:]]*sandbox = '\(.*\)'$/\1/p" | head -1
}

build_images() {
  local ref tar
  ref="$(sandbox_image)"
  [ -n "$ref" ] || die "cannot read the pinned sandbox image from 'containerd config default'"
  tar="$imgdir/pause-$(stamp_of "$kbin/krl-pause" "$root/scripts/oci-image.py").tar"
  if [ ! -f "$tar" ]; then
    mkdir -p "$imgdir"
    rm -f "$imgdir"/pause-*.tar
    python3 "$root/scripts/oci-image.py" --binary "$kbin/krl-pause" --path /pause \
      --name "$ref" --user 65535 --output "$tar.tmp" >&2 && mv "$tar.tmp" "$tar"
  fi
  echo "$tar"
}

helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"
helm_pkg="helm.sh/helm/v4/cmd/helm@$helm_version"
build_helm() {
  build_go_install helm "$hbin" "" "$helm_ldflags" "$helm_pkg"
}

# helm alone (the chart's tests need nothing else): built when missing, under
# the build lock; prints its path. No root needed. When it is in place, no
# lock is taken: the chart's tests do not wait for a `build` running beside
# them (scripts/test.sh runs one in the background).
helm_bin() {
  command -v go >/dev/null || die "go not found in PATH"
  if [ -x "$hbin/bin/helm" ] && [ "$(cat "$hbin/.stamp" 2>/dev/null)" = "$(printf '%s\n' "" "$helm_ldflags" "$helm_pkg" | stamp_of -)" ]; then
    echo "$hbin/bin/helm"
    return 0
  fi
  mkdir -p "$cache/cluster"
  exec 8>"$cache/cluster/.build.lock"
  flock 8 || die "cannot lock $cache/cluster/.build.lock"
  build_helm
  flock -u 8
  echo "$hbin/bin/helm"
}

build() {
  command -v go >/dev/null || die "go not found in PATH"
  mkdir -p "$cache/cluster"
  exec 8>"$cache/cluster/.build.lock"
  flock 8 || die "cannot lock $cache/cluster/.build.lock"
  local start=$SECONDS
  install_debs
  "$root/scripts/control-plane.sh" build >/dev/null
  build_k8s
  build_go_install containerd "$cbin" no_btrfs \
    "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
    "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
    "github.com/containerd/containerd/v2/cmd/ctr@$containerd_version" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version"
  build_helm
  build_images >/dev/null
  flock -u 8
  log "build: everything in place after $((SECONDS - start)) s"
}


# ---------------------------------------------------------------- layout
state="${KRL_CLUSTER_DIR:-/tmp/krl-cluster}"
state="${state%/}"
port_base="${KRL_CLUSTER_PORT_BASE:-17000}"
ready_timeout="${KRL_CLUSTER_READY_TIMEOUT:-180}"
[[ "$state" = /?*/?* || "$state" = /tmp/?* ]] && [[ "$state" != *[[:space:]]* ]] ||
  die "KRL_CLUSTER_DIR='$state' must be an absolute path below a top-level directory, without spaces"
[[ "$port_base" =~ ^[0-9]+$ ]] && [ "$port_base" -ge 1024 ] && [ "$port_base" -le 32000 ] ||
  die "KRL_CLUSTER_PORT_BASE='$port_base' must be a number from 1024 to 32000"

pki="$state/pki"
bridge=krl0
node_name=krl-node
node_ip=10.217.0.1
node_cidr=10.217.0.0/24
pod_cidr=10.218.0.0/24
pod_gw=10.218.0.1
svc_cidr=10.219.0.0/24
svc_ip=10.219.0.1
etcd_port=$((port_base + 379))
etcd_peer_port=$((port_base + 380))
api_port=$((port_base + 443))
kubelet_port=$((port_base + 250))
kubelet_healthz_port=$((port_base + 248))
proxy_metrics_port=$((port_base + 249))
proxy_healthz_port=$((port_base + 256))
cm_port=$((port_base + 257))
sched_port=$((port_base + 259))
ports=("$etcd_port" "$etcd_peer_port" "$api_port" "$kubelet_port" "$kubelet_healthz_port"
  "$proxy_metrics_port" "$proxy_healthz_port" "$cm_port" "$sched_port")
server="https://$node_ip:$api_port"
containerd_sock="$state/containerd/containerd.sock"
# Started in this order, stopped in the reverse one (kubelet first).
components=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

# What `up` records before it changes anything and `down` compares after.
sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding
  net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet net.ipv4.conf.default.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal
  net.netfilter.nf_conntrack_udp_timeout net.netfilter.nf_conntrack_udp_timeout_stream)
# Paths kubelet, containerd, runc, CNI or iptables create by default: most are
# moved into the state dir by the configs below; these are checked anyway.
watched_paths=(/var/lib/kubelet /var/log/containers /var/log/pods /etc/kubernetes
  /usr/libexec/kubernetes /var/lib/kube-proxy /var/run/kubernetes /run/kubernetes
  /run/containerd /var/lib/containerd /opt/containerd /etc/containerd /run/nri /var/run/nri
  /var/lib/cni /etc/cni /opt/cni /run/netns /var/run/netns /run/runc /run/xtables.lock /etc/cdi /var/run/cdi)

kc() { "$kbin/kubectl" --kubeconfig "$state/admin.kubeconfig" "$@"; }

# The command line of a process, or nothing when it is gone.
cmdline() { { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null || true; }

# ---------------------------------------------------------------- processes
pid_of() { cat "$state/pids/$1.pid" 2>/dev/null || true; }

# alive NAME: its recorded PID runs, and is ours (its command line names the state dir).
alive() {
  local pid
  pid="$(pid_of "$1")"
  [ -n "$pid" ] && cmdline "$pid" | grep -qF "$state/"
}

start() { # name command...
  local name="$1"
  shift
  log "starting $name"
  setsid "$@" >>"$state/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$state/pids/$name.pid"
}

# stop_pid PID WHAT [SECONDS]: SIGTERM, then SIGKILL after the grace period.
stop_pid() {
  local pid="$1" what="$2" grace="${3:-10}" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < grace * 10; i++)); do
    [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 0
    sleep 0.1
  done
  log "$what (pid $pid) still runs after ${grace}s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.2
}

stop_component() {
  local name="$1" grace="${2:-10}"
  if alive "$name"; then
    stop_pid "$(pid_of "$name")" "$name" "$grace"
    log "stopped $name"
  fi
  rm -f "$state/pids/$name.pid"
}

log_tail() { # name [lines]
  local f="$state/logs/$1.log"
  [ -f "$f" ] || return 0
  echo "----- last ${2:-25} lines of $f -----" >&2
  tail -n "${2:-25}" "$f" >&2
  echo "-----" >&2
}

fail_component() { # name message
  log_tail "$1" 40
  die "$2 (log: $state/logs/$1.log)"
}

# wait_until NAME SECONDS WHAT command...: polls the command; fails with
# NAME's log tail when NAME exits or time runs out.
wait_until() {
  local name="$1" timeout="$2" what="$3"
  shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || fail_component "$name" "$name exited while waiting for $what"
    [ "$SECONDS" -lt "$deadline" ] || fail_component "$name" "timed out after ${timeout}s waiting for $what"
    sleep 0.5
  done
}

# ---------------------------------------------------------------- host state
normalize_rules() { sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]/[0:0]/'; }

snapshot() { # dir
  local d="$1" s h
  mkdir -p "$d"
  for s in "${sysctls[@]}"; do
    printf '%s = %s\n' "$s" "$(sysctl -n "$s" 2>/dev/null | tr -s '\t ' ' ' || echo '<absent>')"
  done >"$d/sysctl.txt"
  iptables-save 2>/dev/null | normalize_rules >"$d/iptables.txt" || true
  ip6tables-save 2>/dev/null | normalize_rules >"$d/ip6tables.txt" || true
  nft list ruleset 2>/dev/null | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/' >"$d/nft.txt" || true
  ip -o link show | awk '{print $2, $3}' | sed 's/@[^:]*:/:/' | sort >"$d/links.txt"
  ip -o addr show | awk '{print $2, $3, $4}' | sort >"$d/addrs.txt"
  { ip -4 route show table all; ip -6 route show table all; } 2>/dev/null | sort >"$d/routes.txt"
  awk '{ sep = 0; for (i = 7; i <= NF; i++) if ($i == "-") { sep = i; break }
         opt = ""; for (i = 7; i < sep; i++) opt = opt " " $i
         print $5, $4, $(sep + 1), $(sep + 2), opt }' /proc/self/mountinfo | sort >"$d/mounts.txt"
  # Two levels (v1: hierarchies and their top groups, where kubepods goes);
  # deeper ones come and go with other programs' processes.
  find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null | sort >"$d/cgroups.txt"
  for s in "${watched_paths[@]}"; do
    if [ -e "$s" ] || [ -L "$s" ]; then echo "$s"; fi
  done >"$d/paths.txt"
  ls /run/netns 2>/dev/null | sort >"$d/netns.txt" || true
  nfacct_names | sort >"$d/nfacct.txt"
}

# The names of the kernel's nfacct counters (kube-proxy creates two and never
# deletes them).
nfacct_names() { nfacct list 2>/dev/null | sed -n 's/.*} = \(.*\);$/\1/p' || true; }

# ---------------------------------------------------------------- PKI
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# cert NAME SUBJECT EXTKEYUSAGE [SANS]: a leaf signed by the cluster CA.
cert() {
  local name="$1" subject="$2" eku="$3" sans="${4:-}"
  key "$pki/$name.key"
  openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = $eku"
    [ -z "$sans" ] || echo "subjectAltName = $sans"
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days 365 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

kubeconfig() { # file user cert-name
  cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: krl
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$pki/$3.crt")
    client-key-data: $(base64 -w0 "$pki/$3.key")
contexts:
- name: krl
  context: { cluster: krl, user: $2 }
current-context: krl
KUBECONFIG
  chmod 600 "$1"
}

make_pki() {
  mkdir -p "$pki" && chmod 700 "$pki"
  key "$pki/ca.key"
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=krl-cluster-ca" -days 3650 -sha256 \
    -addext "basicConstraints = critical, CA:TRUE" -addext "keyUsage = critical, keyCertSign, cRLSign, digitalSignature" \
    -out "$pki/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" serverAuth \
    "IP:$svc_ip, IP:$node_ip, IP:127.0.0.1, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, DNS:localhost"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert admin "/O=system:masters/CN=krl-admin" clientAuth
  cert kubelet "/O=system:nodes/CN=system:node:$node_name" clientAuth
  cert kubelet-serving "/O=system:nodes/CN=system:node:$node_name" serverAuth "IP:$node_ip, DNS:$node_name"
  cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
  cert kube-proxy "/CN=system:kube-proxy" clientAuth
  key "$pki/sa.key"
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  [ -s "$pki/sa.pub" ] && [ -s "$pki/kube-proxy.crt" ] || die "creating the PKI with openssl failed (in $pki)"
  kubeconfig "$state/admin.kubeconfig" krl-admin admin
  kubeconfig "$state/kubelet.kubeconfig" "system:node:$node_name" kubelet
  kubeconfig "$state/kube-controller-manager.kubeconfig" system:kube-controller-manager kube-controller-manager
  kubeconfig "$state/kube-scheduler.kubeconfig" system:kube-scheduler kube-scheduler
  kubeconfig "$state/kube-proxy.kubeconfig" system:kube-proxy kube-proxy
}

# ---------------------------------------------------------------- configs
write_configs() {
  mkdir -p "$state/containerd" "$state/cni/net.d" "$state/cni/ipam" "$state/kubelet" "$state/volume-plugins" "$state/pod-logs"
  # containerd: every path in the state dir; CRI as REAL-CLUSTER.md found it
  # must be on this machine (no CAP_SYS_RESOURCE: restrict_oom_score_adj;
  # cgroup v1 with cgroupfs); no NRI, no CDI, no TCP.
  cat >"$state/containerd/config.toml" <<TOML
version = 4
root = '$state/containerd/root'
state = '$state/containerd/state'
imports = []
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs', 'io.containerd.differ.v1.erofs',
  'io.containerd.image-verifier.v1.bindir', 'io.containerd.tracing.processor.v1.otlp']

[plugins.'io.containerd.server.v1.grpc']
  address = '$containerd_sock'
[plugins.'io.containerd.server.v1.ttrpc']
  address = '$containerd_sock.ttrpc'
[plugins.'io.containerd.internal.v1.opt']
  path = '$state/containerd/opt'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '$(sandbox_image)'

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$runc_bin'
        Root = '$state/containerd/runc'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$cni_bin_dir']
    conf_dir = '$state/cni/net.d'
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
TOML

  # CNI: pods on the bridge krl0 (created by up, with the gateway's address):
  # no isGateway (so the plugin leaves ip_forward alone), no masquerading, and
  # routes to the node and the Service range only (no default route).
  cat >"$state/cni/net.d/10-krl.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "krl",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$state/cni/ipam",
        "ranges": [[{ "subnet": "$pod_cidr", "gateway": "$pod_gw" }]],
        "routes": [{ "dst": "$node_cidr", "gw": "$pod_gw" }, { "dst": "$svc_cidr", "gw": "$pod_gw" }]
      }
    }
  ]
}
JSON

  cat >"$state/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz_port
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $pki/ca.crt }
authorization: { mode: Webhook }
containerRuntimeEndpoint: unix://$containerd_sock
# cgroup v1 here: kubelet 1.35+ refuses it unless told not to.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# No KUBE-IPTABLES-HINT / KUBE-FIREWALL chains from kubelet (kube-proxy makes
# its own firewall rule and removes it with --cleanup).
makeIPTablesUtilChains: false
podLogsDir: $state/pod-logs
volumePluginDir: $state/volume-plugins
# No cluster DNS, and no host resolver handed to pods.
resolvConf: ""
# Images are imported, never pulled: never collect them; evict only when the
# disk is really full (the machine's disk is shared).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 2%
  imagefs.available: 2%
  nodefs.inodesFree: 2%
maxPods: 50
YAML

  cat >"$state/kube-proxy-config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $state/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $node_name
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:$proxy_healthz_port
metricsBindAddress: 127.0.0.1:$proxy_metrics_port
clusterCIDR: $pod_cidr
nodePortAddresses: ["$node_ip/32"]
# Leave the host's conntrack sysctls as they are, and route_localnet too.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
YAML
}

# ---------------------------------------------------------------- up
check_free() {
  local p
  for p in "${ports[@]}"; do
    [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ] || die "port $p is in use (KRL_CLUSTER_PORT_BASE moves every port)"
  done
  ! ip link show "$bridge" >/dev/null 2>&1 ||
    die "the interface $bridge exists already: a cluster runs, or one was not torn down (scripts/cluster.sh down; else ip link del $bridge)"
  ! ip -o addr show | grep -qE " inet (${node_ip//./\\.}|${pod_gw//./\\.})/" ||
    die "$node_ip or $pod_gw is already assigned on this host"
  local net routes
  for net in "$node_cidr" "$pod_cidr" "$svc_cidr"; do
    routes="$(ip -4 route show match "$net" 2>/dev/null | grep -v '^default ' || true)"
    [ -z "$routes" ] || die "$net, which the cluster uses, overlaps a route of this host: $routes"
  done
  # The kubelet evicts every pod once its disk has less than 2 % free
  # (evictionHard below): a test would then fail with pods "Evicted" and a
  # webhook refusing connections. Say so before starting, with 2 GiB of room
  # for the images, logs and the pods' writes.
  local avail size need
  read -r avail size < <(df --output=avail,size -B1 /var/lib | tail -1)
  need=$((size / 50 + 2 * 1024 * 1024 * 1024))
  [ "$avail" -ge "$need" ] ||
    die "only $((avail >> 20)) MiB free on the disk of /var/lib; the kubelet evicts every pod below 2 % free ($((size / 50 >> 20)) MiB here): free at least $(((need - avail) >> 20)) MiB more"
}

up() {
  [ "$(id -u)" = 0 ] || die "up needs root (kubelet and containerd)"
  local c
  for c in "${components[@]}"; do
    ! alive "$c" || die "$c runs already in $state (scripts/cluster.sh status; down)"
  done
  [ ! -e "$state/host-before" ] ||
    die "$state holds a cluster that was not torn down: scripts/cluster.sh down first"
  local t0=$SECONDS
  build
  local tb=$SECONDS
  check_free
  command -v iptables-save >/dev/null && [ -x "$runc_bin" ] && [ -x "$cni_bin_dir/bridge" ] ||
    die "iptables, runc or the CNI plugins are missing (scripts/cluster.sh build installs them)"

  ! awk -v s="$state" '$5 == s || index($5, s "/") == 1 {found = 1} END {exit !found}' /proc/self/mountinfo ||
    die "there are mounts under $state: scripts/cluster.sh down first"
  rm -rf "$state"
  mkdir -p "$state/logs" "$state/pids"
  touch "$state/.krl-cluster"
  snapshot "$state/host-before"
  # From here on, a failure tears down what was started.
  trap 'up_failed' EXIT

  ip link add "$bridge" type bridge
  ip addr add "$node_ip/24" dev "$bridge"
  ip addr add "$pod_gw/24" dev "$bridge"
  ip link set "$bridge" up
  # The Service range through the bridge, from the node IP: what the host
  # sends to a ClusterIP (the API server calling a webhook's Service) is
  # routed here, then DNATed by kube-proxy to a pod on this bridge, which
  # answers the node IP. Without it the host's default route would be used.
  # It goes with the bridge.
  ip route add "$svc_cidr" dev "$bridge" src "$node_ip"

  make_pki
  write_configs
  export PATH="$cbin/bin:$kbin:$PATH:/usr/sbin:/sbin"

  start etcd "$cpbin/krl-control-plane" etcd --name=krl --data-dir="$state/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="krl=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync=true --log-level=warn
  wait_until etcd 30 "etcd's /health" curl -sf "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$cpbin/krl-control-plane" kube-apiserver \
    --advertise-address="$node_ip" --bind-address="$node_ip" --secure-port="$api_port" \
    --etcd-servers="http://127.0.0.1:$etcd_port" --service-cluster-ip-range="$svc_cidr" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --cert-dir="$state/apiserver" --profiling=false ${KRL_CLUSTER_APISERVER_ARGS:-}
  wait_until kube-apiserver 120 "the apiserver's /readyz" \
    curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server/readyz"

  start kube-controller-manager "$kbin/kube-controller-manager" \
    --kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$state/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$cm_port" \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --service-cluster-ip-range="$svc_cidr" --allocate-node-cidrs=false \
    --flex-volume-plugin-dir="$state/volume-plugins" --leader-elect=false --profiling=false
  start kube-scheduler "$kbin/kube-scheduler" \
    --kubeconfig="$state/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$state/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$state/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false --profiling=false

  start containerd "$cbin/bin/containerd" --config "$state/containerd/config.toml"
  wait_until containerd 30 "containerd's socket" ctr --address "$containerd_sock" version
  ctr --address "$containerd_sock" -n k8s.io images import "$(build_images)" >>"$state/logs/images.log" 2>&1 ||
    fail_component images "importing the sandbox image failed"

  start kubelet "$kbin/kubelet" --config="$state/kubelet-config.yaml" --kubeconfig="$state/kubelet.kubeconfig" \
    --root-dir="$state/kubelet" --cert-dir="$state/kubelet/pki" \
    --hostname-override="$node_name" --node-ip="$node_ip" --v=1
  start kube-proxy "$kbin/kube-proxy" --config="$state/kube-proxy-config.yaml" --v=1

  wait_until kube-controller-manager 60 "kube-controller-manager's /healthz" curl -sfk "https://127.0.0.1:$cm_port/healthz"
  wait_until kube-scheduler 60 "kube-scheduler's /healthz" curl -sfk "https://127.0.0.1:$sched_port/healthz"
  wait_until kubelet 60 "kubelet's /healthz" curl -sf "http://127.0.0.1:$kubelet_healthz_port/healthz"
  node_ready() { [ "$(kc get node "$node_name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
  if ! wait_ready node_ready; then
    log_tail containerd 20
    kc get node "$node_name" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
    fail_component kubelet "node $node_name not Ready after ${ready_timeout}s"
  fi
  wait_until kube-proxy 60 "kube-proxy's /healthz" curl -sf "http://127.0.0.1:$proxy_healthz_port/healthz"
  # Pods can be created once the default ServiceAccount and the root CA
  # ConfigMap exist (kube-controller-manager makes both).
  wait_until kube-controller-manager 60 "the default ServiceAccount and kube-root-ca.crt" \
    kc -n default get serviceaccount/default configmap/kube-root-ca.crt

  trap - EXIT
  echo "$((SECONDS - tb))" >"$state/up-seconds"
  log "node $node_name Ready: cluster up in $((SECONDS - tb)) s (build check $((tb - t0)) s); state, logs and PIDs in $state"
  print_env
}

wait_ready() { # predicate: waits up to ready_timeout for it; kubelet or containerd exiting fails at once
  local deadline=$((SECONDS + ready_timeout))
  until "$1"; do
    alive kubelet || fail_component kubelet "kubelet exited before the node was Ready"
    alive containerd || fail_component containerd "containerd exited before the node was Ready"
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 1
  done
}

up_failed() {
  local rc=$?
  trap - EXIT
  if [ "${KRL_CLUSTER_KEEP_ON_FAILURE:-0}" = 1 ]; then
    log "up failed; left running as asked (KRL_CLUSTER_KEEP_ON_FAILURE=1): scripts/cluster.sh down restores the host"
  else
    log "up failed: tearing down what was started (logs stay in $state/logs)"
    down || true
  fi
  exit "$([ "$rc" = 0 ] && echo 1 || echo "$rc")"
}

# import TAR...: OCI image tarballs (scripts/oci-image.py) into the cluster's
# containerd, where kubelet finds them (pods: imagePullPolicy: Never).
import_images() {
  [ $# -gt 0 ] || die "usage: scripts/cluster.sh import IMAGE.tar..."
  alive containerd || die "containerd does not run (scripts/cluster.sh up)"
  local tar out
  for tar in "$@"; do
    [ -f "$tar" ] || die "$tar not found"
    out="$("$cbin/bin/ctr" --address "$containerd_sock" -n k8s.io images import "$tar" 2>&1)" ||
      { echo "$out" >&2; die "ctr images import $tar failed"; }
    grep -v DEPRECATION <<<"$out" >&2 || true
  done
}

print_env() {
  echo "export KUBECONFIG=$state/admin.kubeconfig"
  echo "export PATH=$kbin:$cbin/bin:$hbin/bin:\$PATH"
}

# ---------------------------------------------------------------- down
# Processes in the cgroups kubelet made (the pods' containers and pause).
pod_pids() {
  local h
  for h in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
    [ -d "$h" ] && find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# Our containerd's shims: their command line names our containerd socket.
shim_pids() {
  local p
  for p in /proc/[0-9]*; do
    cmdline "${p#/proc/}" | grep -qF -- "-address $containerd_sock " && echo "${p#/proc/}"
  done
  return 0
}

stop_pods() {
  local ids id
  if alive containerd; then
    ids="$(ctr --address "$containerd_sock" -n k8s.io tasks ls -q 2>/dev/null || true)"
    for id in $ids; do
      ctr --address "$containerd_sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $ids; do
      timeout 10 ctr --address "$containerd_sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    done
    [ -z "$ids" ] || log "killed $(echo "$ids" | wc -w) containers"
  fi
}

# kill_leftovers: containers and shims still running once containerd is gone.
kill_leftovers() {
  local pids pid
  pids="$(pod_pids) $(shim_pids)"
  for pid in $pids; do
    [ "$pid" -gt 1 ] 2>/dev/null || continue
    log "killing leftover pid $pid: $(cmdline "$pid" | cut -c1-100)"
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ -z "${pids// /}" ] || sleep 0.5
}

# Every mount under the state dir (kubelet's bind mount of its root dir, pod
# volumes, the sandboxes' /dev/shm, overlay root file systems, network
# namespaces), deepest first.
unmount_all() {
  local m i
  for i in 1 2 3; do
    mapfile -t mounts < <(awk -v s="$state" '$5 == s || index($5, s "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
    [ "${#mounts[@]}" -gt 0 ] || return 0
    for m in "${mounts[@]}"; do
      m="$(printf '%b' "$m")" # mountinfo writes a space as \040
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
}

# Chains named KUBE-* (kube-proxy, kubelet) and the rules that jump to them.
remove_kube_chains() {
  local save="$1" restore="$2" table lines chains
  command -v "$save" >/dev/null || return 0
  for table in filter nat mangle raw; do
    lines="$("$save" -t "$table" 2>/dev/null || true)"
    chains="$(sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' <<<"$lines")"
    [ -n "$chains" ] || continue
    {
      echo "*$table"
      grep -E '^-A [^ ]+ .*-j KUBE-' <<<"$lines" | grep -vE '^-A KUBE-' | sed 's/^-A /-D /' || true
      sed 's/^/-F /' <<<"$chains"
      sed 's/^/-X /' <<<"$chains"
      echo COMMIT
    } | "$restore" --noflush 2>&1 | sed 's/^/cluster.sh: /' >&2 || true
    log "removed $(wc -w <<<"$chains") KUBE-* chains from $save -t $table"
  done
}

# nftables tables that iptables-nft created and left empty.
remove_new_nft_tables() {
  command -v nft >/dev/null || return 0
  local before="$state/host-before/nft.txt"
  nft list tables 2>/dev/null | while read -r _ family name; do
    grep -qxF "table $family $name {" "$before" 2>/dev/null && continue
    if nft list table "$family" "$name" 2>/dev/null | grep -qE '^\s+(ip|ip6|meta|counter|jump|goto|tcp|udp|ct|mark|oifname|iifname|fib|return|drop|accept)\b'; then
      log "nft table $family $name has rules left: not removing it"
      continue
    fi
    nft delete table "$family" "$name" && log "removed the empty nft table $family $name"
  done
}

remove_new_nfacct() {
  command -v nfacct >/dev/null || return 0
  local n
  for n in $(nfacct_names); do
    grep -qxF "$n" "$state/host-before/nfacct.txt" 2>/dev/null && continue
    nfacct delete "$n" >/dev/null 2>&1 && log "removed the nfacct counter $n" || log "could not remove the nfacct counter $n"
  done
}

restore_sysctls() {
  local before="$state/host-before/sysctl.txt" name value now
  [ -f "$before" ] || return 0
  while IFS= read -r line; do
    name="${line%% = *}"
    value="${line#* = }"
    [ "$value" = "<absent>" ] && continue
    now="$(sysctl -n "$name" 2>/dev/null | tr -s '\t ' ' ' || true)"
    if [ "$now" != "$value" ]; then
      sysctl -qw "$name=$value" && log "restored $name = $value (was $now)"
    fi
  done <"$before"
}

remove_cgroups() {
  local d
  for d in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
    [ -d "$d" ] || continue
    grep -qxF "$d" "$state/host-before/cgroups.txt" 2>/dev/null && continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ ! -d "$d" ] || log "could not remove the cgroup $d"
  done
}

remove_new_paths() {
  local p
  for p in "${watched_paths[@]}"; do
    { [ -e "$p" ] || [ -L "$p" ]; } || continue
    grep -qxF "$p" "$state/host-before/paths.txt" 2>/dev/null && continue
    if awk -v s="$p" '$5 == s || index($5, s "/") == 1 {found = 1} END {exit !found}' /proc/self/mountinfo; then
      log "$p holds mounts: not removing it"
      continue
    fi
    rm -rf "$p" && log "removed $p (it did not exist before up)"
  done
}

down() {
  [ "$(id -u)" = 0 ] || die "down needs root"
  if [ ! -e "$state/.krl-cluster" ]; then
    log "no cluster in $state: nothing to do"
    return 0
  fi
  local t0=$SECONDS c
  export PATH="$cbin/bin:$kbin:$PATH:/usr/sbin:/sbin"
  stop_component kubelet 15
  stop_pods
  stop_component kube-proxy
  for c in kube-scheduler kube-controller-manager containerd; do
    stop_component "$c"
  done
  kill_leftovers
  stop_component kube-apiserver
  stop_component etcd
  if [ -x "$kbin/kube-proxy" ]; then
    timeout 60 "$kbin/kube-proxy" --cleanup --v=0 >>"$state/logs/kube-proxy-cleanup.log" 2>&1 ||
      log "kube-proxy --cleanup failed (log: $state/logs/kube-proxy-cleanup.log)"
  fi
  remove_kube_chains iptables-save iptables-restore
  remove_kube_chains ip6tables-save ip6tables-restore
  remove_new_nft_tables
  remove_new_nfacct
  unmount_all
  remove_cgroups
  if ip link show "$bridge" >/dev/null 2>&1 && ! grep -q "^$bridge:" "$state/host-before/links.txt" 2>/dev/null; then
    # Host ends of pod veths whose namespace is still alive somehow.
    for c in $(ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//'); do
      ip link del "$c" 2>/dev/null || true
    done
    ip link del "$bridge" && log "removed the bridge $bridge"
  fi
  restore_sysctls
  remove_new_paths

  local report=0
  if [ -d "$state/host-before" ]; then
    snapshot "$state/host-after"
    local f
    for f in sysctl iptables ip6tables nft nfacct links addrs routes mounts cgroups paths netns; do
      [ -f "$state/host-before/$f.txt" ] || continue
      if ! diff -u "$state/host-before/$f.txt" "$state/host-after/$f.txt" >"$state/host-after/$f.diff" 2>&1; then
        report=1
        log "host state differs from before up ($f):"
        sed 's/^/    /' "$state/host-after/$f.diff" >&2
      fi
    done
  fi
  local left
  left="$(for c in /proc/[0-9]*; do cmdline "${c#/proc/}" | grep -qF "$state/" && echo "${c#/proc/}"; done || true)"
  if [ -n "$left" ]; then
    report=1
    log "processes still running with $state in their command line: $left"
  fi

  # Keep the logs (and the host diffs) for a look after the fact.
  find "$state" -mindepth 1 -maxdepth 1 ! -name logs ! -name host-after -exec rm -rf {} + 2>/dev/null ||
    log "could not remove everything in $state"
  if [ "$report" = 0 ]; then
    rm -rf "$state/host-after"
    log "down in $((SECONDS - t0)) s: host state as before up (sysctls, iptables, nftables, nfacct, links, addresses, routes, mounts, cgroups, paths)"
  else
    log "down in $((SECONDS - t0)) s, but the host state differs from before up (above; diffs in $state/host-after)"
    return 1
  fi
}

# ---------------------------------------------------------------- status
status() {
  local c any=0
  for c in "${components[@]}"; do
    if alive "$c"; then
      printf '%-24s running (pid %s)\n' "$c" "$(pid_of "$c")"
      any=1
    else
      printf '%-24s not running\n' "$c"
    fi
  done
  if [ "$any" = 1 ] && alive kube-apiserver; then
    kc get nodes -o wide 2>&1 || true
  fi
  [ "$any" = 1 ] && echo "state: $state" && print_env
  [ "$any" = 1 ]
}

case "$cmd" in
  build) build ;;
  up) up ;;
  down) down ;;
  status) status ;;
  env) print_env ;;
  import) shift && import_images "$@" ;;
  bin-dir) echo "$kbin" ;;
  helm) helm_bin ;;
  *) die "usage: scripts/cluster.sh build|up|down|status|env|import IMAGE.tar...|bin-dir|helm" ;;
esac; exit "$?" # on the line of esac: bash has read the whole file before running anything, so editing it meanwhile is safe
