#!/bin/bash
# time conditioning on the demo preset: udm with and without, seeds 0 1 2, final validation NELBO
cd /work/main && . .venv/bin/activate
export OMP_NUM_THREADS=1
for seed in 0 1 2; do
  for tc in false true; do
    out=/work/study/tc/runs/udm-tc$tc-s$seed
    [ -f $out/final.json ] && continue
    /usr/bin/time -f "%e s" python train.py --preset demo --objective udm --estimator time --time-conditioning $tc \
      --seed $seed --cache-dir /work/study/cache --out $out > /work/study/tc/udm-tc$tc-s$seed.log 2>&1
  done
done
