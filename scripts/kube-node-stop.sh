#!/usr/bin/env bash
# Stops the node of scripts/kube-node-start.sh (same NODEWARD_NODE_STATE, same harness) and removes
# every trace of it, then checks that nothing is left:
# 1. pods bound to the node are deleted through the API while the kubelet still runs (it stops
#    their containers and tears their networks down with CNI DEL), then the Node object;
# 2. the kubelet unit stops; any container task still alive is killed through containerd;
#    the containerd unit stops (KillMode=mixed: its shims go with it);
# 3. every mount beneath $NODE and /run/containerd is unmounted, then the scratch binds over
#    /var/lib/kubelet, /var/log/pods and /var/log/containers, and the mount points the start
#    script created are removed;
# 4. veths on the bridge and the bridge are deleted; net.ipv4.ip_forward gets its old value;
#    libcni's result cache on the host (/var/lib/cni) loses what this node added to it;
# 5. checks: both units inactive, no process whose command line names $NODE, no mount beneath
#    $NODE or /run/containerd or on the three /var paths, no bridge; then removes $NODE.
# Runs inside the harness (scripts/in-test-systemd.sh). Idempotent.
# Environment: NODEWARD_NODE_STATE (required), NODEWARD_CLUSTER_ENV (for the API; when the cluster
# is already gone, step 1 is skipped).
set -uo pipefail

NODE=${NODEWARD_NODE_STATE:?NODEWARD_NODE_STATE is required}
CLUSTER_ENV=${NODEWARD_CLUSTER_ENV:-}
log() { echo "kube-node-stop: $*" >&2; }
problems=()
problem() { log "$*"; problems+=("$*"); }
case $NODE in /?*) ;; *) log "NODEWARD_NODE_STATE must be an absolute path"; exit 1 ;; esac
if [ ! -e "$NODE/.nodeward-node" ]; then
    log "no node state in $NODE, nothing to stop"
    exit 0
fi
if [ "$(cat /proc/1/comm)" != systemd ]; then
    log "not inside the systemd harness (PID 1 is $(cat /proc/1/comm)); run it with scripts/in-test-systemd.sh"
    exit 1
fi
started=$(date +%s%N)
ms() { echo $((($(date +%s%N) - started) / 1000000)); }
# shellcheck disable=SC1091
. "$NODE/node.env"
CTR=(ctr --address /run/containerd/containerd.sock -n k8s.io)

# 1. pods and the Node, through the API.
if [ -n "$CLUSTER_ENV" ] && [ -e "$CLUSTER_ENV" ]; then
    # shellcheck disable=SC1090
    . "$CLUSTER_ENV"
    k() { "$KUBECTL" --kubeconfig="$ADMIN_KUBECONFIG" --request-timeout=30s "$@"; }
    if systemctl is-active -q "$KUBELET_UNIT"; then
        k delete pods --all-namespaces --field-selector "spec.nodeName=$NODE_NAME" \
            --wait=true --timeout=60s >&2 || problem "deleting the pods on $NODE_NAME failed"
    fi
    k delete node "$NODE_NAME" --ignore-not-found --wait=true --timeout=30s >&2 || problem "deleting Node $NODE_NAME failed"
fi
t_pods=$(ms)

# 2. kubelet, leftover tasks, containerd.
systemctl stop "$KUBELET_UNIT" 2>/dev/null
systemctl reset-failed "$KUBELET_UNIT" 2>/dev/null
if systemctl is-active -q "$CONTAINERD_UNIT"; then
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
        "${CTR[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1
    done
    sleep 0.2
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
        "${CTR[@]}" tasks delete -f "$t" >/dev/null 2>&1
    done
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do
        "${CTR[@]}" containers delete "$c" >/dev/null 2>&1
    done
fi
systemctl stop "$CONTAINERD_UNIT" 2>/dev/null
systemctl reset-failed "$CONTAINERD_UNIT" 2>/dev/null
# The pods' scopes and slices the kubelet made under systemd go once empty; stop what remains.
for u in $(systemctl list-units --all --plain --no-legend 'kubepods*' 2>/dev/null | awk '{ print $1 }'); do
    systemctl stop "$u" 2>/dev/null
done
# The kubelet also makes kubepods* cgroups in the hierarchies systemd does not manage (cpuset,
# cpuacct, freezer, ...): remove them once empty (the harness's own cgroup namespace only).
for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=$(find /sys/fs/cgroup -mindepth 2 -depth -type d -path '*/kubepods*' 2>/dev/null)
    [ -n "$left" ] || break
    # shellcheck disable=SC2086
    rmdir $left 2>/dev/null
    sleep 0.2
done
t_units=$(ms)

# 3. mounts: deepest first.
umount_under() { # prefix...
    local pfx m
    for pfx in "$@"; do
        for m in $(awk '{ print $5 }' /proc/self/mountinfo | grep -E "^$pfx(/|$)" | sort -r); do
            umount -n "$m" 2>/dev/null || umount -n -l "$m" 2>/dev/null || problem "cannot unmount $m"
        done
    done
}
umount_under "$NODE" /run/containerd /run/netns /var/lib/kubelet /var/log/pods /var/log/containers
while read -r p; do
    [ -n "$p" ] || continue
    rmdir "$p" 2>/dev/null || problem "cannot remove the mount point $p the node created (not empty?)"
done <"$NODE/created-mountpoints"

# 4. network.
for l in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link del "$l" 2>/dev/null
done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
if [ -s "$NODE/ip_forward.before" ]; then
    cat "$NODE/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
fi

# 5. checks.
for u in "$KUBELET_UNIT" "$CONTAINERD_UNIT"; do
    systemctl is-active -q "$u" && problem "$u is still active"
done
for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = $$ ] && continue
    c=$({ tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue
    [[ $c == *"$NODE"* ]] && problem "process $p still runs: $c"
done
for m in $(awk '{ print $5 }' /proc/self/mountinfo | grep -E "^($NODE|/run/containerd|/run/netns|/var/lib/kubelet|/var/log/pods|/var/log/containers)(/|$)"); do
    problem "still mounted: $m"
done
ip link show "$BRIDGE" >/dev/null 2>&1 && problem "bridge $BRIDGE is still there"
left=$(find /sys/fs/cgroup -mindepth 2 -type d -path '*/kubepods*' 2>/dev/null | tr '\n' ' ')
[ -z "$left" ] || problem "kubepods cgroups left: $left"
# libcni's result cache (see kube-node-start.sh): what this node added to it, or all of it.
if [ -d "$NODE" ] && [ ! -e "$NODE/cni-cache.before" ]; then
    rm -rf --one-file-system /var/lib/cni
elif [ -d /var/lib/cni ]; then
    (cd /var/lib/cni && find . -mindepth 1 | sort) | comm -13 "$NODE/cni-cache.before" - |
        sort -r | while read -r p; do
            rm -f "/var/lib/cni/$p" 2>/dev/null || rmdir "/var/lib/cni/$p" 2>/dev/null
        done
fi
rm -rf --one-file-system "$NODE" /run/containerd 2>/dev/null || problem "cannot remove $NODE"

if [ ${#problems[@]} -gt 0 ]; then
    log "FAILED after $(ms) ms: ${problems[*]}"
    exit 1
fi
log "pods gone ${t_pods} ms, units stopped ${t_units} ms, clean after $(ms) ms"
