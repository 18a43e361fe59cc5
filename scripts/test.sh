#!/usr/bin/env bash
# The project's one test command (the README's, and what .ci/run calls):
#   scripts/test.sh [cargo test args] [-- test binary args]
# 1. formatting and lints for the host and both guest workspaces;
# 2. the test binaries are built (on the host);
# 3. the real-systemd harness starts (scripts/test-systemd-start.sh; needs root);
# 4. the whole test suite runs inside the harness's namespaces, including the tests marked
#    #[ignore = "needs the real systemd harness (scripts/test.sh)"] (docs/testing-systemd.md);
# 5. the harness stops, also when the tests fail; the exit status is the tests' (or the
#    stop's, when it finds a leak).
# TEST_SYSTEMD=0 skips steps 3 and 5 and runs the suite on the host without the ignored tests
# (for machines where you are not root).
# The real-cluster tests (tests/cluster_smoke.rs, the `real_cluster_*` tests) run too, by default:
# scripts/kube-build.sh first (cached by Debian source version; a cold build takes several
# minutes), then, after the suite, a second harness in hybrid cgroup mode
# (TEST_SYSTEMD_CGROUP=hybrid, state $TEST_SYSTEMD_CLUSTER_STATE) runs them inside.
# NODEWARD_TEST_CLUSTER=0 skips them (`--skip real_cluster_`), as TEST_SYSTEMD=0 does.
set -euo pipefail
cd "$(dirname "$0")/.."

# Idempotent: installs the C toolchain and rustup when missing (a fresh Debian machine).
scripts/setup-debian.sh
export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n==> %s\n' "$*"; }

# Arguments before `--` go to cargo, after it to the test binaries.
cargo_args=() test_args=()
while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then
        shift
        test_args=("$@")
        break
    fi
    cargo_args+=("$1")
    shift
done

if [ "${TEST_SYSTEMD:-1}" = 0 ]; then
    CLUSTER=${NODEWARD_TEST_CLUSTER:-0}
else
    CLUSTER=${NODEWARD_TEST_CLUSTER:-1}
fi
if [ "$CLUSTER" = 1 ]; then
    step "kube builds (scripts/kube-build.sh; cached)"
    NODEWARD_KUBE_DIR=$(scripts/kube-build.sh)
    export NODEWARD_KUBE_DIR
fi

# ---- lint ----------------------------------------------------------------------------------
step "format"
cargo fmt --all --check
(cd guest-phases && cargo fmt --all --check)
(cd tests/guests && cargo fmt --all --check)

step "clippy (host, tests, benches)"
cargo clippy --all-targets --features test-hooks -- -D warnings

step "clippy (guest workspaces, wasm32-wasip2)"
for ws in guest-phases tests/guests; do
    cargo clippy --manifest-path "$ws/Cargo.toml" --target wasm32-wasip2 \
        --target-dir target/guest-clippy -- -D warnings
done

# ---- build ---------------------------------------------------------------------------------
step "build tests"
cargo test --workspace --features test-hooks --no-run ${cargo_args[@]+"${cargo_args[@]}"}
# The none-mode tests run the stub kubelet example (tests/node/artifacts.rs); `cargo test --test X`
# does not build examples.
cargo build --features test-hooks --example stub_kubelet

if [ "${TEST_SYSTEMD:-1}" = 0 ]; then
    [ "$CLUSTER" != 1 ] || { echo "scripts/test.sh: NODEWARD_TEST_CLUSTER=1 needs the harness (not TEST_SYSTEMD=0)" >&2; exit 2; }
    step "tests (on the host; TEST_SYSTEMD=0, so the real-systemd tests stay ignored)"
    exec cargo test --workspace --features test-hooks ${cargo_args[@]+"${cargo_args[@]}"} -- ${test_args[@]+"${test_args[@]}"}
fi

# ---- systemd harness -----------------------------------------------------------------------
export TEST_SYSTEMD_STATE=${TEST_SYSTEMD_STATE:-/run/nodeward-test-systemd}
CLUSTER_STATE=${TEST_SYSTEMD_CLUSTER_STATE:-/run/nodeward-test-systemd-cluster}
stop_harness() {
    local rc=$?
    trap - EXIT INT TERM
    step "stop the systemd harness"
    if ! scripts/test-systemd-stop.sh; then
        echo "scripts/test.sh: the harness did not stop cleanly" >&2
        [ "$rc" != 0 ] || rc=1
    fi
    if [ "$CLUSTER" = 1 ]; then
        step "stop the hybrid (cluster) harness"
        if ! TEST_SYSTEMD_STATE=$CLUSTER_STATE scripts/test-systemd-stop.sh; then
            echo "scripts/test.sh: the cluster harness did not stop cleanly" >&2
            [ "$rc" != 0 ] || rc=1
        fi
    fi
    exit "$rc"
}
trap stop_harness EXIT INT TERM
step "start the systemd harness"
scripts/test-systemd-start.sh

# ---- tests ---------------------------------------------------------------------------------
# Cargo builds on the host and runs each test binary inside the harness (in cargo's working
# directory; see scripts/in-test-systemd.sh for why not bare nsenter).
step "tests (inside the harness, real-systemd tests included)"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/in-test-systemd.sh" \
    cargo test --workspace --features test-hooks ${cargo_args[@]+"${cargo_args[@]}"} -- --include-ignored --skip real_cluster_ \
    ${test_args[@]+"${test_args[@]}"}

# ---- real cluster (opt-in) -----------------------------------------------------------------
if [ "$CLUSTER" = 1 ]; then
    step "start the hybrid systemd harness (cluster tests)"
    TEST_SYSTEMD_STATE=$CLUSTER_STATE TEST_SYSTEMD_CGROUP=hybrid scripts/test-systemd-start.sh
    step "real-cluster tests (inside the hybrid harness)"
    TEST_SYSTEMD_STATE=$CLUSTER_STATE NODEWARD_TEST_CLUSTER=1 \
        CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/in-test-systemd.sh" \
        cargo test --features test-hooks --test cluster_smoke --test none_cluster --test daemon_cluster ${cargo_args[@]+"${cargo_args[@]}"} -- --include-ignored \
        --test-threads=1 ${test_args[@]+"${test_args[@]}"}
fi
