#!/usr/bin/env bash
# Stops the systemd started by scripts/test-systemd-start.sh and removes every trace of it.
#
# 1. SIGRTMIN+4 (poweroff; systemd exits when it runs in a container), then SIGKILL after
#    TEST_SYSTEMD_STOP_TIMEOUT seconds (default 10). SIGKILL to a pid namespace's PID 1 kills
#    the whole namespace, so no service survives it.
# 2. Waits until systemd and its unshare parent are gone.
# 3. Removes the cgroup directories created beneath the harness cgroups, then those cgroups (one
#    in cgroup2; in hybrid mode one in each v1 hierarchy too, listed in $STATE/cgroups).
# 4. Verifies: no process left in the harness cgroup, the host's mountinfo has as many lines as
#    before the start (all harness mounts lived in the private mount namespace), no mount beneath
#    the state directory; then removes the state directory.
#
# Idempotent: without a state directory it does nothing and succeeds.
# Environment: TEST_SYSTEMD_STATE (default /run/nodeward-test-systemd), TEST_SYSTEMD_STOP_TIMEOUT.
set -euo pipefail

STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-test-systemd}
TIMEOUT=${TEST_SYSTEMD_STOP_TIMEOUT:-10}
MARKER=.nodeward-test-systemd

die() { echo "test-systemd-stop: $*" >&2; exit 1; }

case $STATE in
/?*) ;;
*) die "TEST_SYSTEMD_STATE must be an absolute path other than /, got '$STATE'" ;;
esac
if [ ! -e "$STATE/$MARKER" ]; then
    echo "test-systemd-stop: no harness state in $STATE, nothing to stop"
    exit 0
fi
started=$(date +%s%N)

# Whether $1 is a live (not zombie) process.
alive() {
    local st
    st=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# Waits until none of the PIDs given is alive, at most $1 seconds; fails when one still is.
wait_gone() {
    local limit=$(($(date +%s) + $1)) p any
    shift
    while :; do
        any=
        for p in "$@"; do alive "$p" && any=1; done
        [ -z "$any" ] && return 0
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.05
    done
}

pids=()
pid=$(cat "$STATE/pid" 2>/dev/null || true)
unshare_pid=$(cat "$STATE/unshare.pid" 2>/dev/null || true)
# Only signal what is still ours: systemd must be the unshare's child.
if [ -n "$pid" ] && alive "$pid"; then
    if [ -n "$unshare_pid" ] && [ "$(awk '{ print $4 }' "/proc/$pid/stat" 2>/dev/null)" = "$unshare_pid" ]; then
        pids+=("$pid")
    else
        echo "test-systemd-stop: PID $pid is no longer the harness's systemd; not signalling it" >&2
    fi
fi
if [ -n "$unshare_pid" ] && alive "$unshare_pid" &&
    grep -qa unshare "/proc/$unshare_pid/cmdline" 2>/dev/null; then
    pids+=("$unshare_pid")
fi

if [ ${#pids[@]} -gt 0 ]; then
    if [ -n "$pid" ] && [ "${pids[0]}" = "$pid" ]; then
        kill -s RTMIN+4 "$pid" 2>/dev/null || true
        if ! wait_gone "$TIMEOUT" "${pids[@]}"; then
            echo "test-systemd-stop: systemd did not power off within ${TIMEOUT}s; SIGKILL" >&2
            kill -9 "$pid" 2>/dev/null || true
        fi
    else
        kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    wait_gone 10 "${pids[@]}" || die "processes ${pids[*]} are still alive after SIGKILL"
fi

# Every process that ever ran in the harness sat in its cgroups (or below): none may be left.
# $STATE/cgroups lists them all (hybrid mode: one per hierarchy); older states only have
# $STATE/cgroup.
cgs=()
if [ -s "$STATE/cgroups" ]; then
    mapfile -t cgs <"$STATE/cgroups"
elif [ -s "$STATE/cgroup" ]; then
    cgs=("$(cat "$STATE/cgroup")")
fi
for CG in "${cgs[@]}"; do
    case $CG in
    /sys/fs/cgroup/*/test-systemd-* | /sys/fs/cgroup/test-systemd-*) ;;
    *) die "refusing to remove unexpected cgroup path '$CG' from $STATE/cgroups" ;;
    esac
done
for CG in "${cgs[@]}"; do
    [ -d "$CG" ] || continue
    left=$(find "$CG" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' ')
    if [ -n "${left// /}" ]; then
        kill -9 $left 2>/dev/null || true
        sleep 0.2
        left=$(find "$CG" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | tr '\n' ' ')
        [ -z "${left// /}" ] || die "processes left in $CG: $left"
    fi
done
for CG in "${cgs[@]}"; do
    [ -d "$CG" ] || continue
    # A v1 memory cgroup can take a moment to go after its last process: retry briefly.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        find "$CG" -depth -type d -exec rmdir {} + 2>/dev/null && break
        sleep 0.2
    done
    [ ! -d "$CG" ] || die "could not remove the cgroup directories beneath $CG"
done

if grep -q " $STATE[/ ]" /proc/self/mountinfo; then
    die "mounts beneath $STATE remain: $(grep " $STATE[/ ]" /proc/self/mountinfo)"
fi
if [ -e "$STATE/mountinfo.before" ]; then
    before=$(wc -l <"$STATE/mountinfo.before")
    after=$(wc -l </proc/self/mountinfo)
    if [ "$before" != "$after" ]; then
        echo "test-systemd-stop: mount points (host) before the harness vs now:" >&2
        diff <(sort "$STATE/mountinfo.before") <(awk '{ print $5 }' /proc/self/mountinfo | sort) >&2 || true
        die "the host's mountinfo had $before lines before the harness and has $after now"
    fi
fi

rm -rf --one-file-system "$STATE"
echo "test-systemd: stopped after $((($(date +%s%N) - started) / 1000000)) ms; no process, cgroup or mount left"
