#!/usr/bin/env bash
# Fuzzes everything nodeward parses from untrusted bytes (docs/fuzzing.md):
#   scripts/fuzz.sh [TARGET...] [-runs=N] [other libFuzzer flags...]
# With no TARGET, every target in fuzz/fuzz_targets/ runs, one after the other, each for
# -runs=1000000 executions unless given. The corpus of each target lives in
# fuzz/corpus/<target>/ (seeds committed, what the fuzzer adds kept locally, ignored by git);
# a crash, a failed invariant, a slow input or an allocation over the bound leaves its input
# in fuzz/artifacts/<target>/. Prints, per target, executions, exec/s and peak RSS; exits 1
# when any target failed.
#
# Bounds (libFuzzer flags, override them on the command line): -rss_limit_mb=512 for the whole
# process, -malloc_limit_mb=64 for one allocation (enforced by the targets' own allocator,
# fuzz/src/lib.rs, since libFuzzer checks it only under a sanitizer), -timeout=10 s per input.
#
# Build: `cargo fuzz build --sanitizer none` (why no sanitizer: docs/fuzzing.md) with the
# pinned toolchain (rust-toolchain.toml) and RUSTC_BOOTSTRAP=1 for the nightly-only flags
# cargo-fuzz passes; only if that fails, with a local `nightly` toolchain. The first build
# compiles nodeward and wasmtime once more (≈ 10 min on 2 cores); later ones are incremental.
# Not part of scripts/test.sh (CI time budget).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

targets=() flags=() runs_given=0
for a in "$@"; do
    case "$a" in
        -runs=*) runs_given=1; flags+=("$a") ;;
        -*) flags+=("$a") ;;
        *) targets+=("$a") ;;
    esac
done
[ "$runs_given" = 1 ] || flags+=(-runs=1000000)
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
for t in "${targets[@]}"; do
    [ -f "fuzz/fuzz_targets/$t.rs" ] || { echo "fuzz.sh: no target $t (fuzz/fuzz_targets/)" >&2; exit 2; }
done

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

echo "==> building the fuzz targets"
toolchain=()
if ! RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer none; then
    if rustup toolchain list | grep -q '^nightly'; then
        echo "==> the pinned toolchain failed; retrying with nightly" >&2
        toolchain=(+nightly)
        cargo "${toolchain[@]}" fuzz build --sanitizer none
    else
        exit 1
    fi
fi
bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release

failed=() summary=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t/last-run.log"
    echo "==> $t"
    status=0
    start=$(date +%s.%N)
    "$bin_dir/$t" "fuzz/corpus/$t" \
        -rss_limit_mb=512 -malloc_limit_mb=64 -timeout=10 \
        -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 \
        "${flags[@]}" >"$log" 2>&1 || status=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
    execs=$(stat number_of_executed_units)
    # libFuzzer's own exec/s is rounded to whole seconds; this is executions over wall time.
    rate=$(awk -v n="${execs:-0}" -v s="$secs" 'BEGIN { printf "%d", (s > 0 ? n / s : 0) }')
    line=$(printf '%-18s %9s execs in %6.1f s  %7s exec/s  peak RSS %4s MiB' "$t" \
        "${execs:-?}" "$secs" "$rate" "$(stat peak_rss_mb)")
    if [ "$status" -ne 0 ]; then
        line="$line  FAILED (exit $status; $log)"
        failed+=("$t")
        grep -E '^(==[0-9]+==|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)' "$log" | head -20 >&2 || true
    fi
    echo "$line"
    summary+=("$line")
done

echo
echo "==> summary"
printf '%s\n' "${summary[@]}"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}" >&2; exit 1; }
