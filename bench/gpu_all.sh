#!/usr/bin/env bash
# Every GPU test and benchmark of tiledsl, for one device call on a 2-, 4- or 8-GPU machine:
#   bash bench/gpu_all.sh [STAGE...]     stages: checks gemm overlap collectives profile variants rebuild trace
#                                        ops (tiledsl.ops checks, teardown) block (ops vs torch, tp_block)
#                                        attention (SP prefill and decode: checks, then benchmarks, at
#                                        ATTENTION_WORLDS, default 2) moe (MoE checks and benchmark, world 2)
#                                        moe_speed (group_gemm and ag_group_gemm at world 1, block variants)
#                                        nodes
#                                        (default: checks gemm overlap collectives; rebuild compares with
#                                        the build unpacked in .baseline/, carried to the machine; nodes runs
#                                        the two-level programs on GPUs posing as TILEDSL_NODES=2 nodes)
# Logs and JSON go to $OUT (or bench/results/); a short table is printed last. With PACK=FILE.tgz
# they are also packed into one file after every run (the device returns at most 8 files, and a
# command stopped at its time limit still returns what was packed). WORLDS=4 picks the worlds run
# (default: 4 and 2 on four or more GPUs, else all of them); COLLECTIVE_WORLDS likewise for collectives.
# The exit status is 0 only if every stage exited 0 and no log of this run holds a FAIL line; every
# FAIL line is printed, under its stage and again in the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=${*:-checks gemm overlap collectives}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OUT=${OUT:-$PWD/bench/results}
mkdir -p "$OUT"
touch "$OUT/.started"  # what this run wrote is newer: a warm machine keeps the last run's files in $OUT
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "gpus: $gpus; $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
[ -n "${CHECKS_ONLY:-}" ] && echo "CHECKS_ONLY=$CHECKS_ONLY: the checks run only those whose name holds one of its |-separated texts"
worlds="$gpus"; [ "$gpus" -ge 4 ] && worlds="$gpus 2"
worlds=${WORLDS:-$worlds}
pair=2; [ "$gpus" -lt 2 ] && pair=1  # the stages made for world 2 run at world 1 on a one-GPU machine
status=0
rows=()      # the summary table, one row a stage
failures=""  # every FAIL line of this run, prefixed with its stage
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local log="$OUT/$name.log" began=$SECONDS
  echo "== $name"
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local passes fails
  passes=$(grep -c '^PASS' "$log")
  fails=$(grep -c '^FAIL' "$log")
  # FAIL lines first and whole; then, from the rest, figures and summaries worth a glance
  grep '^FAIL' "$log"
  grep -v -E '^(PASS|FAIL)' "$log" | grep -E "failed$|^[a-z_]+ +[A-Za-z]|rank [0-9]|^ +rank|: host|ms" \
    | grep -v -E "Warning|warn" | tail -40
  [ "$fails" -ne 0 ] && failures+=$(grep '^FAIL' "$log" | sed "s/^/$name: /")$'\n'
  if [ "$rc" -ne 0 ]; then
    echo "!! $name exited $rc$([ "$rc" -eq 124 ] && echo " (stopped at its ${limit} s limit)")"
    tail -5 "$log"
  fi
  if [ "$rc" -ne 0 ] || [ "$fails" -ne 0 ]; then status=1; fi
  rows+=("$(printf '%-28s %5s %5s %5s %5s' "$name" "$rc" "$passes" "$fails" "$((SECONDS - began))")")
  pack  # after every run, not only every stage: a call cut inside a stage keeps the runs that finished
}
pack() {
  [ -n "${PACK:-}" ] && (cd "$OUT" && find . -type f -newer .started -print0 | tar czf "$PACK" --null -T -)
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
      for w in ${COLLECTIVE_WORLDS:-$worlds}; do
        run "collectives_checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/collectives_checks.py
      done
      for w in ${COLLECTIVE_WORLDS:-$worlds}; do
        run "collectives_world$w" 300 torchrun --nproc-per-node="$w" bench/bench_collectives.py
      done ;;
    attention)  # sequence-parallel prefill and distributed decode: checks, then benchmarks
      for w in ${ATTENTION_WORLDS:-$pair}; do
        run "attention_checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/attention_checks.py
        run "attention_world$w" 420 env DEADLINE_S="${DEADLINE_S:-240}" torchrun --nproc-per-node="$w" bench/bench_attention.py
        # its tables whole (run's filter keeps only lines that name ms)
        grep -E '^(\||The tile|Every tile|SP prefill|Decode|torch.s default)' "$OUT/attention_world$w.log"
      done ;;
    profile) run profile_call 300 torchrun --nproc-per-node="$gpus" bench/profile_call.py ;;
    trace) run trace_world2 330 torchrun --nproc-per-node=2 bench/bench_trace.py ;;
    ops)  # tiledsl.ops on the GPU: every path, dtype and issue-14 shape; user graphs; torch.compile; teardown
      run "ops_checks_world$pair" 540 torchrun --nproc-per-node="$pair" tests/gpu/ops_checks.py
      run "teardown_world$pair" 300 python3 tests/gpu/teardown_check.py ;;
    block)  # the tuner's promise against the torch path, and the tensor-parallel decoder layer both ways
      run "ops_world$pair" 300 torchrun --nproc-per-node="$pair" bench/bench_ops.py
      run "tp_block_8b_world$pair" 300 torchrun --nproc-per-node="$pair" examples/tp_block.py --size llama3-8b
      run "tp_block_70b_world$pair" 300 torchrun --nproc-per-node="$pair" examples/tp_block.py --size llama3-70b ;;
    moe)  # the MoE programs at world 2: checks against torch, then the benchmark against torch's paths
      run "moe_checks_world$pair" 300 torchrun --nproc-per-node="$pair" tests/gpu/moe_checks.py
      run "moe_world$pair" 300 torchrun --nproc-per-node="$pair" bench/bench_moe.py ;;
    moe_speed)  # the grouped GEMM and AG + grouped GEMM alone, at world 1, the blocks side by side
      run moe_speed_world1 240 torchrun --nproc-per-node=1 bench/experiments/moe_speed.py ;;
    rebuild)  # the same programs timed with the build in .baseline/ (before) and with this one (after)
      if [ -d .baseline/tiledsl ]; then
        for round in $(seq 1 "${ROUNDS:-2}"); do
          run "rebuild_before_$round" 300 env PYTHONPATH="$PWD/.baseline:${PYTHONPATH:-}" \
            torchrun --nproc-per-node=2 bench/bench_rebuild.py --label before
          run "rebuild_after_$round" 300 torchrun --nproc-per-node=2 bench/bench_rebuild.py --label after
        done
        python3 bench/bench_rebuild.py --compare before after | tee "$OUT/rebuild.txt"
      else
        echo "rebuild: no .baseline/ (the build to compare against: git archive COMMIT tiledsl programs)"; status=1
      fi ;;
    variants) run gemm_variants 200 python3 bench/experiments/gemm_variants.py ;;
    nodes)  # the GPUs pose as 2 nodes (2 x 1 on 2 GPUs): ranks on the two halves talk only through NVSHMEM
      w=${NODES_WORLD:-2}
      run "nodes_checks_world$w" 300 env TILEDSL_NODES=2 torchrun --nproc-per-node="$w" tests/gpu/nodes_checks.py
      run "nodes_world$w" 300 env TILEDSL_NODES=2 torchrun --nproc-per-node="$w" bench/bench_nodes.py
      run "nodes_mlp_world$w" 120 env TILEDSL_NODES=2 torchrun --nproc-per-node="$w" examples/nodes_mlp.py ;;
    *) echo "unknown stage $stage"; status=1; rows+=("$(printf '%-28s %5s' "$stage" "?")") ;;
  esac
  pack
done
echo "== summary"
printf '%s' "$failures"
printf '%-28s %5s %5s %5s %5s\n' stage exit PASS FAIL s
printf '%s\n' "${rows[@]}"
fail_lines=$(printf '%s' "$failures" | grep -c '^')
nonzero=$(printf '%s\n' "${rows[@]}" | awk '$2 != 0' | wc -l)
echo "$([ "$status" -eq 0 ] && echo ok || echo FAILED): $fail_lines FAIL lines, $nonzero stages exited non-zero"
exit $status
