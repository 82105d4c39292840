#!/bin/bash
# Reruns of the demo's frontier (throughput) stage on an idle machine. Run 1 is the main job
# (its training, generation and quality stages reused from OUT when their code is unchanged);
# runs 2-4 delete the stored throughput stage and run the same command again, so that only the
# measurement and the report are redone. The files are gathered in a temporary folder and copied
# here at the end, so that every run's report is made from a clean working tree.
# Usage: bash docs/studies/frontier-reruns/run.sh [OUT]
set -euo pipefail
out=${1:-runs/demo}
final=docs/studies/frontier-reruns
dest=$(mktemp -d)
for k in 1 2 3 4; do
  if [ "$k" -gt 1 ]; then rm "$out/stages/throughput.json"; fi
  date -u +"run $k start %H:%M:%S"
  python -m eval.experiments.compare --preset demo --out "$out" > "$dest/log-$k.txt" 2>&1
  date -u +"run $k end %H:%M:%S"
  cp "$out/stages/throughput.json" "$dest/run-$k.json"
  python - "$out/report.json" "$dest/frontier-$k.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
frontier = report["results"]["speed_frontier"]
kept = {key: value for key, value in frontier.items() if key.startswith("batch ")}
kept["provenance"] = report["provenance"]
json.dump(kept, open(sys.argv[2], "w"), indent=1)
PY
done
for k in 2 3 4; do
  python -m eval.speed.throughput_runs "$dest/run-1.json" "$dest/run-$k.json" \
    --json "$dest/compare-1-$k.json" > "$dest/compare-1-$k.md"
done
cp "$dest"/* "$final"/
cp "$out/report.md" "$final/report-4.md"
