#!/usr/bin/env bash
# Every GPU test and benchmark of tiledsl in one command, for one device call on a 2- or 4-GPU machine:
#   bash bench/gpu_all.sh [checks|bench|profile|all]    (default all)
# Logs and JSON go to $OUT (or bench/results/); a short table is printed last.
set -uo pipefail
what=${1:-all}
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-$PWD/bench/results}
mkdir -p "$OUT"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "gpus: $gpus; $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
worlds="$gpus"; [ "$gpus" -ge 4 ] && worlds="4 2"
status=0
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep -E "PASS|FAIL|failed|Error|error:|ms|%" | grep -v "^\s*$" | tail -60
  local rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && { echo "!! $name exited $rc"; status=1; }
  return 0
}
if [ "$what" = checks ] || [ "$what" = all ]; then
  run smoke_runtime 120 torchrun --nproc-per-node="$gpus" bench/smoke_runtime.py
  for w in $worlds; do
    run "checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/multigpu_checks.py
  done
fi
if [ "$what" = profile ]; then
  run gemm_variants 200 python3 bench/experiments/gemm_variants.py
  run profile_call 300 torchrun --nproc-per-node="$gpus" bench/profile_call.py
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  run gemm_tile 200 python3 bench/bench_gemm.py
  for w in $worlds; do
    run "overlap_world$w" 300 torchrun --nproc-per-node="$w" bench/bench_overlap.py
  done
fi
echo "== summary"
grep -h -E "^(PASS|FAIL)|failed$" "$OUT"/*.log 2>/dev/null | sort | uniq -c | sort -rn | head -40
exit $status
