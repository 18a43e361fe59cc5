#!/usr/bin/env bash
# Runs a command inside the namespaces of the harness systemd (scripts/test-systemd-start.sh),
# in the current directory. scripts/test.sh uses it as cargo's target runner, so test binaries
# are built on the host and run inside, where the system bus, /etc/systemd/system and the PIDs
# systemd reports are the harness's.
#
# Why not plain `nsenter -t PID -m -p -u -i -C --`: entering a mount namespace moves the working
# directory to its root, and cargo runs each test binary in its package directory.
#
# Usage: scripts/in-test-systemd.sh COMMAND [ARGS...]
# Environment: TEST_SYSTEMD_STATE (default /run/nodeward-test-systemd).
set -euo pipefail
STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-test-systemd}
pid=$(cat "$STATE/pid" 2>/dev/null) ||
    { echo "in-test-systemd: no harness running ($STATE/pid missing); start scripts/test-systemd-start.sh" >&2; exit 1; }
# The host's bus address would point outside the namespaces; inside, the default one is right.
unset DBUS_SYSTEM_BUS_ADDRESS
exec nsenter -t "$pid" -m -p -u -i -C --wd="$PWD" -- "$@"
