#!/usr/bin/env bash
# Quickstart: build nodeward and run it on the embedded default bundle and example config
# against a temporary host root (nothing outside it is touched):
#   1. `nodeward plan`  — every change a none-mode bootstrap would make, with diffs (the
#      example config pins no artifacts, so the plan skips the downloads with a warning);
#   2. `nodeward apply --phase setup-host --phase configure` — make those two phases' changes;
#   3. `nodeward plan --phase setup-host --phase configure` again — nothing left to do.
# Usage: scripts/quickstart.sh [ROOT]   (default: a new directory under /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
export PATH="$HOME/.cargo/bin:$PATH"

root=${1:-$(mktemp -d /tmp/nodeward-root.XXXXXX)}
mkdir -p "$root"
state=$(mktemp -d /tmp/nodeward-state.XXXXXX)
cargo build --release --quiet
nw() { ./target/release/nodeward --root "$root" --state-dir "$state" "$@"; }

printf '\n### nodeward plan: a whole bootstrap (host root %s)\n' "$root"
nw plan
printf '\n### nodeward apply --phase setup-host --phase configure\n'
nw apply --phase setup-host --phase configure --log-level warn
printf '\n### nodeward plan --phase setup-host --phase configure, again: nothing left to do\n'
nw plan --phase setup-host --phase configure
printf '\n### the host root now holds:\n'
(cd "$root" && find . -mindepth 1 | sort)
printf '\nInspect the phases and their grants: ./target/release/nodeward phases inspect --state-dir %s\n' "$state"
