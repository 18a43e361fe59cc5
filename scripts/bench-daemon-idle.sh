#!/usr/bin/env bash
# Runs the daemon idle benchmark (benches/daemon_idle.rs): a none-mode node joined to the real
# one-VM cluster, then `nodeward daemon` (release profile) watching its Machine for
# NODEWARD_BENCH_IDLE_SECS (default 300) with nothing changing; prints its RSS and CPU from
# /proc. Builds the Kubernetes binaries if needed (cached), starts a hybrid systemd harness,
# runs the bench inside it and stops the harness. ~8 min with a warm release build.
set -euo pipefail
cd "$(dirname "$0")/.."
NODEWARD_KUBE_DIR=$(scripts/kube-build.sh)
export NODEWARD_KUBE_DIR
export TEST_SYSTEMD_STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-bench-idle-systemd}
cargo bench --bench daemon_idle --no-run
trap 'TEST_SYSTEMD_STATE=$TEST_SYSTEMD_STATE scripts/test-systemd-stop.sh' EXIT
TEST_SYSTEMD_CGROUP=hybrid scripts/test-systemd-start.sh
NODEWARD_TEST_CLUSTER=1 CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/in-test-systemd.sh" \
    cargo bench --bench daemon_idle
