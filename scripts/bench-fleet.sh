#!/usr/bin/env bash
# Runs the fleet benchmark (benches/fleet.rs): N real daemon loops (default 200) against the
# real API server of a one-VM control plane with an audit log, a stand-in node under each (no
# host change). Builds the Kubernetes binaries if needed (cached), starts a systemd harness
# (the control plane lives in its pid namespace, so a crashed bench leaves no process behind;
# no kubelet runs, so the harness needs no hybrid cgroups), runs `cargo bench --bench fleet`
# inside it, and stops the harness. Prints figures; asserts none. About 22 min with the
# defaults; not part of scripts/test.sh or CI.
#
# Environment (all optional):
#   NODEWARD_FLEET_AGENTS         agents (default 200)
#   NODEWARD_FLEET_IDLE_SECS      the idle phase (default 660: every agent's first resync in it)
#   NODEWARD_FLEET_DOWN_SECS      how long the API server stays down (default 35)
#   NODEWARD_FLEET_RECONNECT_SECS the longest wait for every agent to watch (default 420)
#   NODEWARD_BENCH_PROFILE        cargo profile (default bench: the release settings)
#   TEST_SYSTEMD_STATE            the harness's state directory
#   RUST_LOG                      the daemons' own log on stderr (e.g. warn)
set -euo pipefail
cd "$(dirname "$0")/.."
NODEWARD_KUBE_DIR=$(scripts/kube-build.sh)
export NODEWARD_KUBE_DIR
export TEST_SYSTEMD_STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-bench-fleet}
PROFILE=${NODEWARD_BENCH_PROFILE:-bench}
cargo bench --profile "$PROFILE" --bench fleet --no-run
trap 'TEST_SYSTEMD_STATE=$TEST_SYSTEMD_STATE scripts/test-systemd-stop.sh' EXIT
scripts/test-systemd-start.sh
NODEWARD_TEST_CLUSTER=1 CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/in-test-systemd.sh" \
    cargo bench --profile "$PROFILE" --bench fleet
