#!/usr/bin/env bash
# Runs a README example (a program, or a `fastlearn` command) in a fresh folder and checks the accuracy
# the README promises for it: the last row of the history.csv the run writes.
#   run_example.sh MIN_ACCURACY|- HISTORY_DIR COMMAND...
# HISTORY_DIR: where the run writes history.csv, relative to the fresh folder ("." for the examples).
set -euo pipefail
min_accuracy="$1" history_dir="$2"
shift 2
work="$(mktemp -d "${TMPDIR:-/tmp}/fastlearn-readme.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
start=$(date +%s.%N)
"$@"
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
echo "readme example: ${seconds} s: $*"
[[ "$min_accuracy" == "-" ]] && exit 0
history="$history_dir/history.csv"
[[ -f "$history" ]] || { echo "the run wrote no $history"; exit 1; }
accuracy=$(awk -F, 'NR == 1 {for (i = 1; i <= NF; ++i) if ($i == "accuracy") col = i} END {print $col}' "$history")
echo "readme example: test accuracy $accuracy after $(($(wc -l < "$history") - 1)) epochs (promised: >= $min_accuracy)"
awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN {exit !(a >= m)}' || { echo "below the promise"; exit 1; }
