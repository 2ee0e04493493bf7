#!/usr/bin/env bash
# ratio.sh OURS PEER: prints `ratio to the peer: end to end Rx, ingest Ry` from the output
# of `notifyctl bench` (OURS: its `end to end: N deliveries/s` line and its
# `ingest: N events/s at 128 clients` line) and of bench/celery/run.sh (PEER: its
# `peer (celery, ...)` line), both of the same `make bench` run. A figure missing on
# either side (a phase left out with NOTIFY_BENCH_ONLY) prints n/a for that ratio.
set -euo pipefail
ours=$1 peer=$2
awk '
  FNR == NR && /^end to end: [0-9.]+ deliveries\/s/ { e2e = $4 }
  FNR == NR && /^ingest: [0-9.]+ events\/s at 128 clients/ { ing = $2 }
  FNR != NR && /^peer \(celery/ {
    if (match($0, /ingest [0-9.]+ events\/s/)) { split(substr($0, RSTART, RLENGTH), a, " "); ping = a[2] }
    if (match($0, /end to end [0-9.]+ deliveries\/s/)) { split(substr($0, RSTART, RLENGTH), b, " "); pe2e = b[4] }
  }
  function ratio(o, p) { return (o == "" || p == "" || p + 0 == 0) ? "n/a" : sprintf("%.1fx", o / p) }
  function or_na(v) { return v == "" ? "n/a" : v }
  END {
    printf "ratio to the peer: end to end %s, ingest %s (ours: end to end %s deliveries/s, ingest %s events/s at 128 clients; peer: %s deliveries/s, %s events/s)\n",
      ratio(e2e, pe2e), ratio(ing, ping), or_na(e2e), or_na(ing), or_na(pe2e), or_na(ping)
  }
' "$ours" "$peer"
