#!/usr/bin/env bash
# Stops what scripts/kube-cluster-start.sh started (same NODEWARD_CLUSTER_STATE), by the PIDs it
# recorded, and removes the state directory (certificates, etcd data, logs).
#
# SIGTERM to kube-controller-manager, kube-apiserver, then etcd; SIGKILL to whichever is still
# alive after NODEWARD_CLUSTER_STOP_TIMEOUT seconds (default 10). A PID is signalled only while
# its command line still names the state directory, so a reused PID is never hit. Fails when a
# process still names the state directory afterwards. Idempotent: no state, nothing to do.
# NODEWARD_CLUSTER_KEEP=1 keeps the state directory (for reading the logs).
set -euo pipefail

STATE=${NODEWARD_CLUSTER_STATE:-/tmp/nodeward-cluster}
TIMEOUT=${NODEWARD_CLUSTER_STOP_TIMEOUT:-10}
MARKER=.nodeward-cluster

die() { echo "kube-cluster-stop: $*" >&2; exit 1; }
case $STATE in /?*) ;; *) die "NODEWARD_CLUSTER_STATE must be an absolute path other than /, got '$STATE'" ;; esac
if [ ! -e "$STATE/$MARKER" ]; then
    echo "kube-cluster-stop: no cluster state in $STATE, nothing to stop" >&2
    exit 0
fi
started=$(date +%s%N)

# ours PID: alive, not a zombie, and its command line names $STATE.
ours() {
    local st
    st=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ] || return 1
    local c
    c=$({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null) || return 1
    [[ $c == *"$STATE"* ]]
}

for name in kube-controller-manager kube-apiserver etcd; do
    f=$STATE/pids/$name
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    ours "$pid" || continue
    kill -TERM "$pid" 2>/dev/null || true
    limit=$(($(date +%s) + TIMEOUT))
    while ours "$pid" && [ "$(date +%s)" -lt "$limit" ]; do sleep 0.05; done
    if ours "$pid"; then
        echo "kube-cluster-stop: $name (PID $pid) did not exit on SIGTERM within ${TIMEOUT}s; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 100); do ours "$pid" || break; sleep 0.05; done
    fi
    ours "$pid" && die "$name (PID $pid) is still alive"
done

left=
for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = $$ ] || [ "$p" = "$PPID" ] && continue
    if ours "$p" 2>/dev/null; then left="$left $p"; fi
done
[ -z "$left" ] || die "processes still naming $STATE:$left"

if [ "${NODEWARD_CLUSTER_KEEP:-0}" = 1 ]; then
    rm -f "$STATE/$MARKER"
    echo "kube-cluster-stop: stopped after $((($(date +%s%N) - started) / 1000000)) ms; state kept in $STATE" >&2
else
    rm -rf --one-file-system "$STATE"
    echo "kube-cluster-stop: stopped after $((($(date +%s%N) - started) / 1000000)) ms; no process or state left" >&2
fi
