#!/usr/bin/env bash
# Starts a real Kubernetes node for the cluster tests, configured by hand (not through
# nodeward): Debian's containerd and runc plus the kubelet built by scripts/kube-build.sh, joined
# to the cluster of scripts/kube-cluster-start.sh with the bootstrap token only (TLS bootstrap:
# the kubelet's CSR is auto-approved and signed by the controller-manager).
#
# MUST run inside a hybrid systemd harness (TEST_SYSTEMD_CGROUP=hybrid scripts/test-systemd-start.sh,
# then scripts/in-test-systemd.sh): containerd and the kubelet run as transient systemd units
# there, see the v1 memory controller, and write the kubelet's global sysctls into the harness's
# bind-mounted files. The traps and their fixes: research/real-cluster-on-one-vm.md.
#
# Keeps the shared host intact:
# - everything the node writes is under $NODE (containerd root, kubelet root and cert dirs, CNI
#   config and IPAM state); /run is the harness's private one;
# - /var/lib/kubelet, /var/log/pods and /var/log/containers, which the kubelet hard-codes, are
#   scratch directories bind-mounted over the host's paths in the harness's mount namespace (a
#   missing mount point is created and recorded, and removed again by the stop script);
# - the CNI bridge (nwbr<id>) lives in the host's network namespace, as the kubelet must reach
#   127.0.0.1; net.ipv4.ip_forward, which the bridge plugin turns on, is recorded here and
#   restored by scripts/kube-node-stop.sh; no masquerade, no iptables chains;
# - the node IP is this machine's own primary address (the kubelet refuses a loopback node IP);
#   the kubelet API listens there (x509 client certificates of the cluster CA only, no anonymous
#   access), so the apiserver can reach it for logs and exec; healthz on 127.0.0.1; both on
#   free random ports.
#
# Environment:
#   NODEWARD_NODE_STATE   node state directory (required; must not exist or be empty)
#   NODEWARD_CLUSTER_ENV  the cluster.env file kube-cluster-start.sh printed (required)
#   NODEWARD_NODE_NAME    node name (default nodeward-node-<pid>)
#   NODEWARD_KUBELET      kubelet binary (default the cluster's KUBELET)
# Writes $NODE/node.env: NODE_NAME NODE_KUBECONFIG KUBELET_UNIT CONTAINERD_UNIT BRIDGE POD_CIDR
set -euo pipefail

NODE=${NODEWARD_NODE_STATE:?NODEWARD_NODE_STATE is required}
CLUSTER_ENV=${NODEWARD_CLUSTER_ENV:?NODEWARD_CLUSTER_ENV is required}
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "kube-node-start: $*" >&2; }
die() { log "$*"; exit 1; }
case $NODE in /?*) ;; *) die "NODEWARD_NODE_STATE must be an absolute path, got '$NODE'" ;; esac
[ ! -e "$NODE" ] || [ -z "$(ls -A "$NODE")" ] || die "$NODE exists and is not empty"
# shellcheck disable=SC1090
. "$CLUSTER_ENV"
KUBELET_BIN=${NODEWARD_KUBELET:-$KUBELET}
NODE_NAME=${NODEWARD_NODE_NAME:-nodeward-node-$$}

# Inside a hybrid harness: systemd is PID 1 and the v1 memory controller is mounted.
[ "$(cat /proc/1/comm)" = systemd ] || die "not inside the systemd harness (PID 1 is $(cat /proc/1/comm))"
[ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ] ||
    die "no v1 memory controller: start the harness with TEST_SYSTEMD_CGROUP=hybrid"
for b in containerd containerd-shim-runc-v2 runc ctr ip systemd-run /usr/lib/cni/bridge; do
    command -v "$b" >/dev/null || die "'$b' not found (apt-get install containerd runc containernetworking-plugins iproute2)"
done

started=$(date +%s%N)
ms() { echo $((($(date +%s%N) - started) / 1000000)); }
mkdir -p "$NODE"/{containerd,cni/net.d,cni/ipam,kubelet,pki,manifests,volume-plugins,scratch,logs}
touch "$NODE/.nodeward-node"
ID=$(openssl rand -hex 3)
BRIDGE=nwbr$ID
# A /24 out of 10.200.0.0/13 not already routed on this machine.
while :; do
    POD_CIDR=10.$((200 + RANDOM % 8)).$((RANDOM % 256)).0/24
    net=${POD_CIDR%.0/24}
    routes=$(ip -4 route show; ip -4 addr show)
    [[ $routes == *" $net."* || $routes == "$net."* || $routes == *$'\n'"$net."* ]] || break
done
cat /proc/sys/net/ipv4/ip_forward >"$NODE/ip_forward.before"
# libcni's result cache is hard-coded on the host (/var/lib/cni, containerd 1.6's CRI): the stop
# script removes it when this node made it, else only the results this node added.
if [ -d /var/lib/cni ]; then
    (cd /var/lib/cni && find . -mindepth 1 | sort) >"$NODE/cni-cache.before"
fi
cat >"$NODE/node.env" <<EOF
NODE_NAME=$NODE_NAME
NODE_KUBECONFIG=$NODE/kubelet.kubeconfig
KUBELET_UNIT=nodeward-kubelet-$ID.service
CONTAINERD_UNIT=nodeward-containerd-$ID.service
BRIDGE=$BRIDGE
POD_CIDR=$POD_CIDR
EOF

# --- the kubelet's hard-coded paths: scratch directories bound over them -----------------------
: >"$NODE/binds"
: >"$NODE/created-mountpoints"
for p in /var/lib/kubelet /var/log/pods /var/log/containers; do
    s=$NODE/scratch/${p//\//_}
    mkdir -p "$s"
    if [ ! -d "$p" ]; then
        mkdir "$p"
        echo "$p" >>"$NODE/created-mountpoints"
    fi
    mount -n --bind "$s" "$p"
    echo "$p" >>"$NODE/binds"
done

# --- containerd ---------------------------------------------------------------------------------
cat >"$NODE/containerd/config.toml" <<EOF
version = 2
root = "$NODE/containerd/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # These VMs lack CAP_SYS_RESOURCE: without it every sandbox fails ("can't get final child's
  # PID from pipe: EOF").
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
EOF
cat >"$NODE/cni/net.d/10-nodeward.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nodeward-$ID",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
systemd-run --quiet --unit="nodeward-containerd-$ID" -p Delegate=yes -p KillMode=mixed \
    -p TimeoutStopSec=10 -p Type=notify \
    /usr/bin/containerd --config "$NODE/containerd/config.toml"
limit=$(($(date +%s) + 30))
until ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$limit" ] || die "containerd did not answer within 30 s: $(journalctl -u "nodeward-containerd-$ID" --no-pager | tail -n 20)"
    sleep 0.1
done
t_containerd=$(ms)
for tar in "$PAUSE_IMAGE_TAR" "$WORKLOAD_IMAGE_TAR"; do
    ctr --address /run/containerd/containerd.sock -n k8s.io images import "$tar" >>"$NODE/logs/ctr.log" 2>&1 ||
        die "ctr images import $tar failed: $(tail -n 5 "$NODE/logs/ctr.log")"
done
t_images=$(ms)

# --- kubelet ------------------------------------------------------------------------------------
free_port() {
    local used p
    used=$(ss -Htanl | awk '{ print $4 }' | sed 's/.*://' | sort -u)
    while :; do
        p=$((40000 + RANDOM % 20000))
        grep -qx "$p" <<<"$used" || { echo "$p"; return; }
    done
}
NODE_IP=$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
[ -n "$NODE_IP" ] || NODE_IP=$(ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')
[ -n "$NODE_IP" ] || die "no global IPv4 address on this machine for the node IP"
KUBELET_PORT=$(free_port)
HEALTHZ_PORT=$(free_port)
[ "$HEALTHZ_PORT" != "$KUBELET_PORT" ] || HEALTHZ_PORT=$((KUBELET_PORT + 1))
cat >"$NODE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
failSwapOn: false
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $CA_CERT
authorization:
  mode: AlwaysAllow
staticPodPath: $NODE/manifests
volumePluginDir: $NODE/volume-plugins
makeIPTablesUtilChains: false
rotateCertificates: true
serializeImagePulls: false
# The shared disk is fuller than the default eviction thresholds allow.
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
echo "NODE_IP=$NODE_IP" >>"$NODE/node.env"
echo "KUBELET_PORT=$KUBELET_PORT" >>"$NODE/node.env"
echo "HEALTHZ_PORT=$HEALTHZ_PORT" >>"$NODE/node.env"
systemd-run --quiet --unit="nodeward-kubelet-$ID" -p KillMode=mixed -p TimeoutStopSec=15 \
    "$KUBELET_BIN" --bootstrap-kubeconfig="$BOOTSTRAP_KUBECONFIG" \
    --kubeconfig="$NODE/kubelet.kubeconfig" --config="$NODE/kubelet.yaml" \
    --container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --root-dir="$NODE/kubelet" --cert-dir="$NODE/pki" --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP"
log "containerd up ${t_containerd} ms, images imported ${t_images} ms, kubelet started $(ms) ms; node $NODE_NAME, bridge $BRIDGE, pods $POD_CIDR"
echo "$NODE/node.env"
