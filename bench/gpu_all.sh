#!/usr/bin/env bash
# Every GPU test and benchmark of tiledsl, for one device call on a 2-, 4- or 8-GPU machine:
#   bash bench/gpu_all.sh [STAGE...]     stages: checks gemm overlap collectives profile variants
#                                        (default: checks gemm overlap collectives)
# Logs and JSON go to $OUT (or bench/results/); a short table is printed last. With PACK=FILE.tgz
# they are also packed into one file after every stage (the device returns at most 8 files, and a
# command stopped at its time limit still returns what was packed). WORLDS=4 picks the worlds run
# (default: 4 and 2 on four or more GPUs, else all of them); COLLECTIVE_WORLDS likewise for collectives.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=${*:-checks gemm overlap collectives}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-$PWD/bench/results}
mkdir -p "$OUT"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "gpus: $gpus; $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
worlds="$gpus"; [ "$gpus" -ge 4 ] && worlds="$gpus 2"
worlds=${WORLDS:-$worlds}
status=0
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "^(PASS|FAIL)|failed$|^[a-z_]+ +[A-Za-z]|rank [0-9]|^ +rank|: host|ms" "$OUT/$name.log" | grep -v -E "^PASS|Warning|warn" | tail -40
  [ "$rc" -ne 0 ] && { echo "!! $name exited $rc"; tail -5 "$OUT/$name.log"; status=1; }
  return 0
}
for stage in $stages; do
  case $stage in
    checks)
      run smoke_runtime 120 torchrun --nproc-per-node="$gpus" bench/smoke_runtime.py
      for w in $worlds; do run "checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/multigpu_checks.py; done ;;
    gemm) run gemm_tile 200 python3 bench/bench_gemm.py ;;
    overlap)
      for w in $worlds; do run "overlap_world$w" 300 torchrun --nproc-per-node="$w" bench/bench_overlap.py; done ;;
    collectives)
      if [ -f tests/gpu/collectives_checks.py ]; then
        for w in ${COLLECTIVE_WORLDS:-$worlds}; do run "collectives_checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/collectives_checks.py; done
      fi
      if [ -f bench/bench_collectives.py ]; then
        for w in ${COLLECTIVE_WORLDS:-$worlds}; do run "collectives_world$w" 300 torchrun --nproc-per-node="$w" bench/bench_collectives.py; done
      fi ;;
    profile) run profile_call 300 torchrun --nproc-per-node="$gpus" bench/profile_call.py ;;
    variants) run gemm_variants 200 python3 bench/experiments/gemm_variants.py ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
  [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$OUT" .
done
echo "== summary"
echo "$(cat "$OUT"/*.log 2>/dev/null | grep -c '^PASS') PASS, $(cat "$OUT"/*.log 2>/dev/null | grep -c '^FAIL') FAIL"
exit $status
