#!/usr/bin/env bash
# Restarts the kube-apiserver of a control plane that scripts/kube-cluster-start.sh started (same
# NODEWARD_CLUSTER_STATE), as an API server upgrade looks to its clients: SIGTERM to its recorded
# PID (it stops listening at once, then drains; SIGKILL after NODEWARD_CLUSTER_STOP_TIMEOUT s,
# since open HTTP/1.1 watches keep a v1.20 server draining for up to a minute), and DOWN seconds
# after the SIGTERM it is started again with exactly the flags it had ($STATE/kube-apiserver.cmd,
# written by the start script; the audit log, if any, is appended to). etcd and the
# controller-manager keep running. benches/fleet.rs uses it.
#
# Must run in the pid namespace the cluster was started in (the tests' and benches' hybrid
# harness): the PID is signalled only while its command line names the state directory, as
# scripts/kube-cluster-stop.sh checks, so a reused PID is never hit.
#
# Usage: scripts/kube-apiserver-restart.sh [DOWN]   (seconds, default 30)
# Environment:
#   NODEWARD_CLUSTER_STATE         the cluster's state directory (default /tmp/nodeward-cluster)
#   NODEWARD_CLUSTER_TIMEOUT       seconds to wait for /readyz after the start (default 60)
#   NODEWARD_CLUSTER_STOP_TIMEOUT  seconds before SIGTERM becomes SIGKILL (default 10)
# Prints one line: STOPPED_NS=<ns> EXITED_NS=<ns> STARTED_NS=<ns> READY_NS=<ns>, the wall clock
# (nanoseconds since the epoch) of the SIGTERM, of the old process's exit, of the new one's
# start, and of its /readyz's first ok.
set -euo pipefail

STATE=${NODEWARD_CLUSTER_STATE:-/tmp/nodeward-cluster}
TIMEOUT=${NODEWARD_CLUSTER_TIMEOUT:-60}
STOP_TIMEOUT=${NODEWARD_CLUSTER_STOP_TIMEOUT:-10}
DOWN=${1:-30}

log() { echo "kube-apiserver-restart: $*" >&2; }
die() { log "$*"; exit 1; }
case $STATE in /?*) ;; *) die "NODEWARD_CLUSTER_STATE must be an absolute path other than /, got '$STATE'" ;; esac
case $DOWN in '' | *[!0-9]*) die "DOWN must be whole seconds, got '$DOWN'" ;; esac
[ -e "$STATE/.nodeward-cluster" ] || die "no cluster state in $STATE (scripts/kube-cluster-start.sh)"
[ -s "$STATE/kube-apiserver.cmd" ] ||
    die "$STATE/kube-apiserver.cmd missing: the cluster was started by an older kube-cluster-start.sh"
# shellcheck disable=SC1091
. "$STATE/cluster.env"
P=$STATE/pki

# ours PID: alive, not a zombie, and its command line names $STATE (as kube-cluster-stop.sh).
ours() {
    local st c
    st=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ] || return 1
    c=$({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null) || return 1
    [[ $c == *"$STATE"* ]]
}

pid=$(cat "$STATE/pids/kube-apiserver")
ours "$pid" || die "kube-apiserver (PID $pid) is not running from $STATE (another pid namespace?)"
stopped=$(date +%s%N)
kill -TERM "$pid"
limit=$(($(date +%s) + STOP_TIMEOUT))
while ours "$pid" && [ "$(date +%s)" -lt "$limit" ]; do sleep 0.05; done
if ours "$pid"; then
    log "kube-apiserver (PID $pid) did not exit on SIGTERM within ${STOP_TIMEOUT}s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 100); do ours "$pid" || break; sleep 0.05; done
fi
ours "$pid" && die "kube-apiserver (PID $pid) is still alive"
exited=$(date +%s%N)
wait_ms=$(((stopped + DOWN * 1000000000 - exited) / 1000000))
log "PID $pid exited $(((exited - stopped) / 1000000)) ms after SIGTERM; starting it again in ${wait_ms} ms"
[ "$wait_ms" -le 0 ] || sleep "$(printf '%d.%03d' $((wait_ms / 1000)) $((wait_ms % 1000)))"
mapfile -d '' cmd <"$STATE/kube-apiserver.cmd"
setsid "${cmd[@]}" </dev/null >>"$STATE/logs/kube-apiserver.log" 2>&1 &
new=$!
echo "$new" >"$STATE/pids/kube-apiserver"
started=$(date +%s%N)

limit=$(($(date +%s) + TIMEOUT))
until curl -fsS --max-time 2 --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
    "$API_URL/readyz" >/dev/null 2>&1; do
    ours "$new" || die "kube-apiserver (PID $new) exited before /readyz; see $STATE/logs/kube-apiserver.log"
    [ "$(date +%s)" -lt "$limit" ] || die "kube-apiserver /readyz: not within ${TIMEOUT}s"
    sleep 0.1
done
ready=$(date +%s%N)
log "PID $new ready $(((ready - started) / 1000000)) ms after its start"
echo "STOPPED_NS=$stopped EXITED_NS=$exited STARTED_NS=$started READY_NS=$ready"
