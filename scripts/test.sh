#!/usr/bin/env bash
# The project's one test command (the README's, and what .ci/run calls):
#   scripts/test.sh [extra cargo test args]
# 1. formatting and lints for the host and both guest workspaces;
# 2. the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Idempotent: installs the C toolchain and rustup when missing (a fresh Debian machine).
scripts/setup-debian.sh
export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n==> %s\n' "$*"; }

step "format"
cargo fmt --all --check
(cd guest-phases && cargo fmt --all --check)
(cd tests/guests && cargo fmt --all --check)

step "clippy (host, tests, benches)"
cargo clippy --all-targets -- -D warnings

step "clippy (guest workspaces, wasm32-wasip2)"
for ws in guest-phases tests/guests; do
    cargo clippy --manifest-path "$ws/Cargo.toml" --target wasm32-wasip2 \
        --target-dir target/guest-clippy -- -D warnings
done

step "tests"
cargo test "$@"
