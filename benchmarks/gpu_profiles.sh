#!/usr/bin/env bash
# Measure GPU profiles of the shipped model cards on one CUDA device, as shipped in
# simserve/data/profiles/ (the knobs of scenarios/quickstart.yaml: 8,192-token step budget,
# 8,192-token context, 256 sequences, 16-token pages).
#
#   benchmarks/gpu_profiles.sh OUTDIR GRID SECONDS MODEL [MODEL ...]
#
# GRID is quick or full; each model gets at most SECONDS (timeout), its profile is
# OUTDIR/<model>_<gpu>_bf16.json and its log OUTDIR/<model>.log. Needs torch with CUDA (and
# Triton, for the compiled FlexAttention backend when flashinfer is not importable).
# ATTENTION=triton (environment) profiles with our split-KV paged decode kernel for decodes
# (default: the profiler's auto choice).
set -u
out=${1:?usage: gpu_profiles.sh OUTDIR GRID SECONDS MODEL...}; grid=${2:?grid}; limit=${3:?seconds}
shift 3
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit \
    --format=csv | tee "$out/nvidia-smi.csv"
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('H100-SXM' if 'H100' in n and 'PCIe' not in n else n.replace('NVIDIA ', '').replace(' ', '-'))")
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
for model in "$@"; do
    t0=$(date +%s)
    timeout "$limit" python3 -m profiler --model "$model" --device cuda --grid "$grid" \
        --attention "${ATTENTION:-auto}" \
        --max-num-batched-tokens 8192 --max-model-len 8192 --max-num-seqs 256 \
        --out "$out/${model}_${gpu}_bf16.json" \
        --note "benchmarks/gpu_profiles.sh on a lent $(nvidia-smi --query-gpu=name --format=csv,noheader)" \
        > "$out/$model.log" 2>&1
    echo "$model ($grid): exit $? after $(( $(date +%s) - t0 )) s"
    tail -n 3 "$out/$model.log"
    python3 - "$out/${model}_${gpu}_bf16.json" <<'PY' || true
import json, sys
p = json.load(open(sys.argv[1]))
print("execution:", p["provenance"].get("execution"))
print("attention:", p["attention"]["backend"], "fallback", p["attention"]["fallback"],
      "self-check", p["attention"]["self_check_rel_err"])
lin = p["linear"]
print("linear ms/layer:", {t: round(s * 1e3, 4) for t, s in zip(lin["tokens"], lin["seconds"])})
for h in p["heldout"]:
    print("heldout", len(h["prefill"]), "chunks", sum(q for q, _ in h["prefill"]), "tokens +",
          len(h["decode_ctx"]), "decodes:", round(h["seconds"] * 1e3, 3), "ms")
PY
done
