#!/bin/bash
# Re-judge the committed runs with the current rules, from the files run.sh saved (no timing):
# each rerun against run 1 (compare-1-K.md/.json), then the tables (summary.md).
# Usage: bash docs/studies/frontier-reruns/rejudge.sh
set -euo pipefail
here=docs/studies/frontier-reruns
for k in 2 3 4; do
  python -m eval.speed.throughput_runs "$here/run-1.json" "$here/run-$k.json" \
    --json "$here/compare-1-$k.json" > "$here/compare-1-$k.md"
done
python "$here/summarize.py" > "$here/summary.md"
