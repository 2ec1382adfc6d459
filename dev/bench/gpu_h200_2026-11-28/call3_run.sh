#!/bin/bash
# call 3 (session 46, H200): the classifier alone at N 2048 (v2 read twice, v3 the row in shared memory = the model's,
# v4 a probe with less arithmetic), the LayerNorm backward at 256 and 512 threads, and the step once more
. "$(dirname "$0")/lease_setup.sh"
step classifier 60 dev/cuda/classifier
step layernorm 40 dev/cuda/layernorm
step e2e_bf16 45 ./train_dbrx "${E2E[@]}" --steps 30 --log "$R/e2e_bf16.jsonl"
echo "== done, t+$(( $(date +%s) - T0 ))"
