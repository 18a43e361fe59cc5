#!/usr/bin/env bash
# Runs the none-mode bootstrap benchmark (benches/bootstrap.rs) against the real one-VM
# cluster: builds the Kubernetes binaries if needed (cached), starts a hybrid systemd harness,
# runs `cargo bench --bench bootstrap` inside it, and stops the harness.
# NODEWARD_BENCH_PROFILE=dev measures a debug build instead of the bench (release) profile.
set -euo pipefail
cd "$(dirname "$0")/.."
NODEWARD_KUBE_DIR=$(scripts/kube-build.sh)
export NODEWARD_KUBE_DIR
export TEST_SYSTEMD_STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-bench-systemd}
PROFILE=(${NODEWARD_BENCH_PROFILE:+--profile "$NODEWARD_BENCH_PROFILE"})
cargo bench "${PROFILE[@]}" --bench bootstrap --no-run
trap 'TEST_SYSTEMD_STATE=$TEST_SYSTEMD_STATE scripts/test-systemd-stop.sh' EXIT
TEST_SYSTEMD_CGROUP=hybrid scripts/test-systemd-start.sh
NODEWARD_TEST_CLUSTER=1 CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/in-test-systemd.sh" \
    cargo bench "${PROFILE[@]}" --bench bootstrap
