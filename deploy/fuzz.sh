#!/usr/bin/env bash
# `make fuzz`: runs every cargo-fuzz target (fuzz/fuzz_targets/) for FUZZ_SECONDS (60)
# each with libFuzzer and AddressSanitizer, on its corpus in fuzz/corpus/<target>/ (kept
# in the repository; new interesting inputs are added to it). Prints one line per target:
#   fuzz: <target> <runs> runs, <exec/s> exec/s, cov <edges>, corpus <n>, no crash
# and exits non-zero on the first crash (the reproducer is in fuzz/artifacts/<target>/).
#
# cargo fuzz passes nightly-only compiler flags (-Zsanitizer); the project has one stable
# toolchain, so RUSTC_BOOTSTRAP=1 lets that compiler accept them.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo_fuzz=$("$repo/deploy/tools.sh" cargo-fuzz)
export PATH="$(dirname "$cargo_fuzz"):$PATH"
export RUSTC_BOOTSTRAP=1
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"validate_event event_key template_render line_split push_shorten sensitive_guard"}
cd "$repo/fuzz"
mkdir -p "${NOTIFY_STACK_DIR:-$repo/.stack}/logs"
for t in $targets; do
  log=${NOTIFY_STACK_DIR:-$repo/.stack}/logs/fuzz-$t.log
  mkdir -p "corpus/$t"
  cargo fuzz build --release --debug-assertions "$t" >/dev/null 2>"$log.build" || {
    cat "$log.build"; exit 1; }
  if ! cargo fuzz run --release --debug-assertions "$t" "corpus/$t" -- \
      -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t CRASHED; reproducer in fuzz/artifacts/$t/ (log $log)"
    exit 1
  fi
  # Keep the committed corpus small: only inputs that add coverage stay.
  cargo fuzz cmin --release --debug-assertions "$t" "corpus/$t" >"$log.cmin" 2>&1 || true
  runs=$(awk '/stat::number_of_executed_units:/ {print $2}' "$log")
  speed=$(awk '/stat::average_exec_per_sec:/ {print $2}' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  n=$(find "corpus/$t" -type f | wc -l)
  echo "fuzz: $t ${runs:-?} runs, ${speed:-?} exec/s, cov ${cov:-?}, corpus $n, no crash (${seconds}s)"
done
