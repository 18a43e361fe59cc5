#!/usr/bin/env bash
# Starts a real systemd as PID 1 of fresh namespaces, for the tests that need one.
#
# How it works (measured recipe: research/systemd-spike.md, section 1):
# - `unshare --pid --mount --uts --ipc --cgroup` runs systemd 252 as PID 1 of new namespaces, from
#   a cgroup of its own (`test-systemd-<pid>`) in the host's cgroup2 hierarchy.
# - Inside, a scratch unit directory ($STATE/units) is bind-mounted on /etc/systemd/system, a
#   private /run ($STATE/run) on /run and an empty directory on /var/log/journal, so the host's
#   units stay invisible and nothing systemd writes lands on the host outside $STATE.
# - systemd boots test-harness.target: basic.target plus dbus, nothing else. The units that would
#   touch the shared root filesystem are masked; the masks are mandatory, because
#   systemd-tmpfiles-setup would wipe the host's /tmp (tmp.conf has "D /tmp").
# - The system bus is reachable from the host at unix:path=$STATE/bus. Tests run inside with
#   `nsenter -t $(cat $STATE/pid) -m -p -u -i -C`, where the bus, the unit directory and the
#   PIDs systemd reports are the standard ones (see docs/testing-systemd.md).
#
# Cgroup mode (TEST_SYSTEMD_CGROUP):
# - unified (default): systemd sees a cgroup2 hierarchy without controllers (the spike's
#   "unified" mode), so resource limits are accepted but not enforced.
# - hybrid: what a kubelet needs (research/real-cluster-on-one-vm.md). /sys/fs/cgroup inside is
#   a tmpfs with every v1 hierarchy the caller is in (cpu, cpuacct, cpuset, memory, devices,
#   freezer, blkio, pids, ... and name=systemd) plus cgroup2 on unified. Each is rooted (cgroup
#   namespace) at a sub-cgroup `test-systemd-<pid>` of the CALLER's own cgroup in that
#   hierarchy, so everything stays nested (the memory one under the VM's /process_api/<id>);
#   the stop script removes them. Hybrid mode also binds plain files (copies of the host's
#   values, in $STATE/sysctl) over /proc/sys/vm/overcommit_memory, vm/panic_on_oom,
#   kernel/panic, kernel/panic_on_oops and kernel/keys/root_max{keys,bytes} inside the mount
#   namespace: the kubelet writes those global sysctls (setupKernelTunables) when they differ
#   from what it wants, and on a shared host it must not.
#
# Environment:
#   TEST_SYSTEMD_STATE    state directory (default /run/nodeward-test-systemd)
#   TEST_SYSTEMD_TIMEOUT  seconds to wait for SystemState "running" (default 30)
#   TEST_SYSTEMD_CGROUP   unified (default) or hybrid
# Writes: $STATE/pid (systemd's host PID), $STATE/bus, $STATE/console.log, $STATE/cgroup (the
# cgroup2 one), $STATE/cgroups (every cgroup directory the harness created, one a line),
# $STATE/cgroup-mode.
# Must run as root. Stop with scripts/test-systemd-stop.sh (same TEST_SYSTEMD_STATE).
set -euo pipefail

STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-test-systemd}
TIMEOUT=${TEST_SYSTEMD_TIMEOUT:-30}
MODE=${TEST_SYSTEMD_CGROUP:-unified}
HERE=$(cd "$(dirname "$0")" && pwd)
MARKER=.nodeward-test-systemd

die() { echo "test-systemd-start: $*" >&2; exit 1; }

case $STATE in
/?*) ;;
*) die "TEST_SYSTEMD_STATE must be an absolute path other than /, got '$STATE'" ;;
esac
case $MODE in unified | hybrid) ;; *) die "TEST_SYSTEMD_CGROUP must be unified or hybrid, got '$MODE'" ;; esac
[ "$(id -u)" = 0 ] || die "must run as root (it creates namespaces, mounts and cgroups)"

# The binaries the harness needs, and the Debian package that ships each.
for need in unshare:util-linux nsenter:util-linux setsid:util-linux busctl:systemd \
    /lib/systemd/systemd:systemd dbus-daemon:dbus pgrep:procps; do
    bin=${need%%:*} pkg=${need#*:}
    command -v "$bin" >/dev/null 2>&1 ||
        die "'$bin' not found; install it with: apt-get install -y --no-install-recommends $pkg"
done

# A running harness is someone's: refuse. A state directory left by a run that was not stopped
# (its systemd is gone): clean it up first.
if [ -e "$STATE/$MARKER" ]; then
    old_pid=$(cat "$STATE/pid" 2>/dev/null || true)
    if [ -n "$old_pid" ] && [ -d "/proc/$old_pid" ] && grep -qa systemd "/proc/$old_pid/cmdline" 2>/dev/null; then
        die "a harness is already running in $STATE (systemd PID $old_pid); stop it with scripts/test-systemd-stop.sh or choose another TEST_SYSTEMD_STATE"
    fi
    echo "test-systemd-start: stale harness state in $STATE, stopping it first" >&2
    TEST_SYSTEMD_STATE=$STATE "$HERE/test-systemd-stop.sh"
fi
[ ! -e "$STATE" ] || [ -z "$(ls -A "$STATE")" ] ||
    die "$STATE exists, is not empty and is not a harness state directory; choose another TEST_SYSTEMD_STATE"

# The cgroup2 hierarchy: /sys/fs/cgroup/unified on a hybrid host, /sys/fs/cgroup on a pure-v2 one.
if [ "$(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ]; then
    CGROOT=/sys/fs/cgroup/unified
elif [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
    CGROOT=/sys/fs/cgroup
else
    die "no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup"
fi
CG=$CGROOT/test-systemd-$$

started=$(date +%s%N)
mkdir -p "$STATE/run" "$STATE/units" "$STATE/journal"
touch "$STATE/$MARKER"
awk '{ print $5 }' /proc/self/mountinfo >"$STATE/mountinfo.before"
echo "$CG" >"$STATE/cgroup"
echo "$MODE" >"$STATE/cgroup-mode"
echo "$CG" >"$STATE/cgroups"
mkdir "$CG"

# Hybrid: one sub-cgroup of the caller's own cgroup in each v1 hierarchy; the outer bash joins
# them all (JOIN), and the inner script mounts each (V1_MOUNTS) in the new cgroup namespace.
JOIN="echo \$\$ >'$CG/cgroup.procs'"
V1_MOUNTS=
SYSCTL_BINDS=
if [ "$MODE" = hybrid ]; then
    [ "$CGROOT" = /sys/fs/cgroup/unified ] || die "TEST_SYSTEMD_CGROUP=hybrid needs a hybrid host (v1 hierarchies under /sys/fs/cgroup, cgroup2 on /sys/fs/cgroup/unified)"
    while IFS=: read -r _ ctrls path; do
        [ -n "$ctrls" ] || continue
        dir=${ctrls#name=}
        host=/sys/fs/cgroup/$dir
        [ "$(stat -f -c %T "$host" 2>/dev/null)" = cgroupfs ] || die "$host is not a cgroup v1 mount (for '$ctrls')"
        sub=$host${path%/}/test-systemd-$$
        mkdir "$sub"
        echo "$sub" >>"$STATE/cgroups"
        if [ "$dir" = cpuset ]; then
            cat "$(dirname "$sub")/cpuset.cpus" >"$sub/cpuset.cpus"
            cat "$(dirname "$sub")/cpuset.mems" >"$sub/cpuset.mems"
        fi
        JOIN="$JOIN; echo \$\$ >'$sub/cgroup.procs'"
        case $ctrls in name=*) opts=none,$ctrls ;; *) opts=$ctrls ;; esac
        V1_MOUNTS="${V1_MOUNTS}mkdir -p '/sys/fs/cgroup/$dir'
mount -n -t cgroup -o '$opts' cgroup '/sys/fs/cgroup/$dir'
"
        # cpu,cpuacct style co-mounts get the usual per-controller symlinks.
        case $dir in *,*)
            for c in ${dir//,/ }; do V1_MOUNTS="${V1_MOUNTS}ln -s '$dir' '/sys/fs/cgroup/$c'
"; done ;;
        esac
    done </proc/self/cgroup
    grep -q "^mkdir -p '/sys/fs/cgroup/memory'" <<<"$V1_MOUNTS" || die "the caller is in no v1 memory hierarchy"
    mkdir -p "$STATE/sysctl"
    for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
        kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
        f=$STATE/sysctl/${k//\//.}
        cat "/proc/sys/$k" >"$f"
        SYSCTL_BINDS="${SYSCTL_BINDS}mount -n --bind '$f' '/proc/sys/$k'
"
    done
fi

# The boot target: basic.target and the system bus, nothing else.
printf '[Unit]\nDescription=nodeward test harness\nRequires=basic.target dbus.socket dbus.service\nAfter=basic.target dbus.socket dbus.service\n' \
    >"$STATE/units/test-harness.target"
# Mandatory masks (see the header): everything that would write to the shared root filesystem,
# the kernel, or devices, plus what cannot work in a container.
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-clean.timer systemd-sysctl.service systemd-timesyncd.service \
    systemd-pstore.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
    systemd-modules-load.service kmod-static-nodes.service systemd-firstboot.service \
    systemd-sysusers.service systemd-random-seed.service systemd-machine-id-commit.service \
    systemd-update-utmp.service systemd-journal-flush.service getty.target \
    console-getty.service sys-kernel-debug.mount sys-kernel-tracing.mount \
    sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
    dev-mqueue.mount systemd-remount-fs.service swap.target systemd-journald-audit.socket \
    systemd-ask-password-console.path systemd-ask-password-wall.path systemd-udevd.service \
    systemd-udev-trigger.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
    systemd-udev-settle.service; do
    ln -sfn /dev/null "$STATE/units/$u"
done

# PID 1 of the new pid namespace: private mounts, then systemd.
cat >"$STATE/inner.sh" <<EOF
#!/bin/sh
set -e
# -n: libmount must not create /run/mount/utab on the host's /run. /run goes last, because
# \$STATE may live beneath it.
mount -n --bind '$STATE/units' /etc/systemd/system
if [ -d /var/log/journal ]; then mount -n --bind '$STATE/journal' /var/log/journal; fi
$SYSCTL_BINDS$(if [ "$MODE" = hybrid ]; then
    # /run is bound last (see above), so the tmpfs and mounts use no $STATE path after it.
    printf '%s\n' "umount -n -R /sys/fs/cgroup" "mount -n -t tmpfs -o mode=755,size=1m tmpfs /sys/fs/cgroup"
    printf '%s' "$V1_MOUNTS"
    printf '%s\n' "mkdir -p /sys/fs/cgroup/unified" "mount -n -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified"
fi)
mount -n --bind '$STATE/run' /run
$(if [ "$MODE" = unified ]; then printf '%s\n' "umount -n -R /sys/fs/cgroup" "mount -n -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup"; fi)
exec env -i container=nodeward-test-systemd /lib/systemd/systemd --system --unit=test-harness.target --show-status=no
EOF
chmod +x "$STATE/inner.sh"
ln -sfn run/dbus/system_bus_socket "$STATE/bus"

# The outer bash moves itself into the harness cgroup and records its PID, then becomes unshare;
# unshare's only child is the namespace's PID 1 (inner.sh, then systemd).
setsid bash -c "$JOIN; echo \$\$ >'$STATE/unshare.pid'; exec unshare --fork --pid --mount --uts --ipc --cgroup --propagation private --mount-proc '$STATE/inner.sh'" \
    </dev/null >"$STATE/console.log" 2>&1 &

fail() {
    echo "test-systemd-start: $*" >&2
    echo "--- $STATE/console.log ---" >&2
    tail -n 50 "$STATE/console.log" >&2 || true
    echo "--- end of console log; stopping the harness ---" >&2
    TEST_SYSTEMD_STATE=$STATE "$HERE/test-systemd-stop.sh" >&2 || true
    exit 1
}

deadline=$(($(date +%s) + TIMEOUT))
pid=
while [ -z "$pid" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "systemd did not start within ${TIMEOUT}s"
    if [ -s "$STATE/unshare.pid" ]; then
        unshare_pid=$(cat "$STATE/unshare.pid")
        pid=$(pgrep -P "$unshare_pid" || true)
        [ -n "$pid" ] || [ -d "/proc/$unshare_pid" ] || fail "unshare (PID $unshare_pid) exited before systemd started"
    fi
    [ -n "$pid" ] || sleep 0.05
done
echo "$pid" >"$STATE/pid"

state=
while :; do
    state=$(busctl --address="unix:path=$STATE/bus" get-property org.freedesktop.systemd1 \
        /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager SystemState 2>/dev/null || true)
    case $state in
    's "running"') break ;;
    's "degraded"')
        failed=$(busctl --address="unix:path=$STATE/bus" call org.freedesktop.systemd1 \
            /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager ListUnitsFiltered as 1 failed 2>&1 || true)
        fail "systemd came up degraded; failed units: $failed"
        ;;
    esac
    [ -d "/proc/$pid" ] || fail "systemd (PID $pid) exited during boot"
    [ "$(date +%s)" -lt "$deadline" ] ||
        fail "SystemState did not reach \"running\" within ${TIMEOUT}s (last: ${state:-no answer on unix:path=$STATE/bus})"
    sleep 0.05
done

elapsed_ms=$((($(date +%s%N) - started) / 1000000))
echo "test-systemd: systemd PID $pid running ($MODE cgroups) after ${elapsed_ms} ms; bus unix:path=$STATE/bus; run inside: nsenter -t $pid -m -p -u -i -C --"
