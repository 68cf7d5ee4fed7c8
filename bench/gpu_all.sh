#!/usr/bin/env bash
# Every GPU test and benchmark of tiledsl, for one device call on a 2-, 4- or 8-GPU machine, or (checks,
# programs) on one GPU that ranks share:
#   bash bench/gpu_all.sh [STAGE...]     stages: checks programs gemm overlap collectives profile variants rebuild trace
#                                        ops (tiledsl.ops checks, teardown) block (ops vs torch, tp_block)
#                                        attention (SP prefill and decode: checks, then benchmarks, at
#                                        ATTENTION_WORLDS, default 2) moe (MoE checks and benchmark, world 2)
#                                        moe_speed (group_gemm and ag_group_gemm at world 1, block variants)
#                                        latency (world 1: MoE dispatch/combine, skinny products, the call)
#                                        ws (the causal warp-specialized attention tile's variants)
#                                        calibrate (`tiledsl calibrate`: the predictor's rates measured here)
#                                        ops_profile (world 1: where an eager tiledsl.ops MoE call's time goes)
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
deadline=""  # SECONDS past which no run starts (a stage that must end within the call sets it)
late=0       # runs not started: the deadline had come
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local log="$OUT/$name.log" began=$SECONDS
  if [ -n "$deadline" ]; then
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 20 ]; then
      echo "== $name: not started, the deadline has come"
      late=$((late + 1)); status=1
      rows+=("$(printf '%-28s %5s %5s %5s %5s %5s' "$name" late - - - 0)")
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name"
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local passes fails skips
  passes=$(grep -c '^PASS' "$log")
  fails=$(grep -c '^FAIL' "$log")
  skips=$(grep -c '^SKIP' "$log")
  # FAIL lines first and whole; then, from the rest, figures and summaries worth a glance
  grep '^FAIL' "$log"
  grep -v -E '^(PASS|FAIL|SKIP)' "$log" | grep -E "failed$|^[a-z_]+ +[A-Za-z]|rank [0-9]|^ +rank|: host|ms" \
    | grep -v -E "Warning|warn" | tail -40
  [ "$fails" -ne 0 ] && failures+=$(grep '^FAIL' "$log" | sed "s/^/$name: /")$'\n'
  if [ "$rc" -ne 0 ]; then
    echo "!! $name exited $rc$([ "$rc" -eq 124 ] && echo " (stopped at its ${limit} s limit)")"
    tail -5 "$log"
  fi
  if [ "$rc" -ne 0 ] || [ "$fails" -ne 0 ]; then status=1; fi
  rows+=("$(printf '%-28s %5s %5s %5s %5s %5s' "$name" "$rc" "$passes" "$fails" "$skips" "$((SECONDS - began))")")
  pack  # after every run, not only every stage: a call cut inside a stage keeps the runs that finished
}
pack() {
  [ -n "${PACK:-}" ] && (cd "$OUT" && find . -type f -newer .started -print0 | tar czf "$PACK" --null -T -)
  return 0
}
# Ranks sharing one GPU (a machine of one GPU; tiledsl.runtime.placement): every check suite at each of
# SHARED_WORLDS (default 2 4 8), within SHARED_CHECKS_S seconds in all (default 480; 220 beside the
# programs stage: the two fit a command of 450 s). One torchrun a world runs every suite in one process group (tests/gpu/all_checks.py:
# the start-up is paid once; each suite has a heap of its own and a share of the world's budget), the
# worlds taking 28, 32 and 40% of the time left after the teardown check (100 s for its five cases; 45 s
# and TEARDOWN_CASES timeout and exit_hook beside the programs). CHECKS_CALLS caps the calls of each repeated-call
# check (6 at world 2, 4 at world 4, 3 at world 8: a first call, then the rest back to back); the checks
# run spread over their programs (one of each before a second of any), so a budget cut leaves no program
# unchecked; the checks of NCCL's and torch's symmetric memory print SKIP by name.
both=""; case " $stages " in *" checks "*) case " $stages " in *" programs "*) both=1 ;; esac ;; esac
shared_checks() {
  local began=$SECONDS w calls share percent total teardown n=0
  total=${SHARED_CHECKS_S:-$([ -n "$both" ] && echo 220 || echo 480)}
  teardown=$([ -n "$both" ] && echo 45 || echo 100)
  deadline=$((SECONDS + total))
  local worlds_here=${SHARED_WORLDS:-2 4 8}
  for w in $worlds_here; do
    n=$((n + 1))
    case $w in 2) calls=6 percent=28 ;; 4) calls=4 percent=32 ;; *) calls=3 percent=40 ;; esac
    [ "$(echo "$worlds_here" | wc -w)" -eq 1 ] && percent=100
    calls=${CHECKS_CALLS:-$calls}
    share=$(( (total - teardown) * percent / 100 )); [ "$share" -lt 30 ] && share=30
    # the budget counts from the suites' start; start-up before it and the exit after take ~15 s
    run "checks_world$w" $((share + 40)) env CHECKS_CALLS="$calls" \
      torchrun --nproc-per-node="$w" tests/gpu/all_checks.py --budget-s $((share - 15))
  done
  run teardown_world2 $((teardown + 60)) env TEARDOWN_CASES="${TEARDOWN_CASES:-$([ -n "$both" ] && echo timeout,exit_hook || echo timeout,bad_compile,caller_raises,launch_refused,exit_hook)}" \
    python3 tests/gpu/teardown_check.py
  deadline=""
  echo "shared checks: $((SECONDS - began)) s"
}
# Every program of programs/ through `torchrun -m tiledsl run` at each of PROGRAM_WORLDS (default 2 4 8;
# 8 4 beside the checks), one torchrun a world over all of them (bench/programs_table.py), within
# PROGRAMS_S seconds (default 480, 170 beside the checks), an equal share a world; then the table of
# every world run into $OUT and of bench/results/*/programs_world*.json from earlier runs (a world not run
# here), also in $OUT/programs_table.md.
programs_stage() {
  local began=$SECONDS total=${PROGRAMS_S:-$([ -n "$both" ] && echo 170 || echo 480)}
  local worlds_here=${PROGRAM_WORLDS:-$([ -n "$both" ] && echo "8 4" || echo "2 4 8")}
  # one world after another (never two NVSHMEM jobs at once on a shared GPU: bench/programs_table.py says
  # why), each one torchrun over every program, restarted past one that dies or hangs
  # the driver writes its JSON after every program; packed every 20 s, a call cut short keeps them. A program
  # is hung after 35-60 s of silence, 100 s where world 8 runs (8 ranks compiling and starting NVSHMEM on one
  # GPU: ag_gemm's first line came after more than 35 s there, 2026-12-02)
  ( while sleep 20; do pack; done ) &
  local packer=$!
  run programs $((total + 30)) python3 bench/programs_table.py run --world $worlds_here \
    --quiet-s "$(case " $worlds_here " in *" 8 "*) echo 100 ;; *) [ -n "$both" ] && echo 35 || echo 60 ;; esac)" \
    --limit-s "$total" --out "$OUT"
  kill "$packer" 2>/dev/null
  python3 bench/programs_table.py table "$OUT" bench/results/*/*/programs_world*.json | tee "$OUT/programs_table.txt"
  pack
  echo "programs: $((SECONDS - began)) s"
}
for stage in $stages; do
  case $stage in
    checks)
      if [ "$gpus" -lt 2 ] && [ -z "${WORLDS:-}" ]; then shared_checks; continue; fi
      run smoke_runtime 120 torchrun --nproc-per-node="$gpus" bench/smoke_runtime.py
      for w in $worlds; do run "checks_world$w" 300 torchrun --nproc-per-node="$w" tests/gpu/multigpu_checks.py; done ;;
    programs) programs_stage ;;
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
    latency)  # issue 27's figures at world 1: MoE dispatch/combine and their traces, skinny products, the call
      run latency_world1 300 env OUT="$OUT" PROBE_BUDGET_S="${PROBE_BUDGET_S:-240}" \
        torchrun --nproc-per-node=1 bench/experiments/latency_probe.py
      grep '^TABLE' "$OUT/latency_world1.log" ;;
    calibrate)  # issue 29: the predictor's rates measured on this GPU (one GPU shows them), each output checked
      run calibrate 240 python3 -m tiledsl calibrate -o "$OUT/rates_measured.json"
      grep -v -E '^ +"(M|K|N|tiledsl)"' "$OUT/rates_measured.json" 2>/dev/null | head -24 ;;
    ops_profile)  # issue 27: an eager tiledsl.ops MoE call against its program's own call, host and GPU time
      run ops_profile_world1 150 torchrun --nproc-per-node=1 bench/experiments/ops_host_profile.py
      grep '^|' "$OUT/ops_profile_world1.log" ;;
    ws)  # the causal warp-specialized attention tile's variants, each checked and timed beside cuDNN
      run ws_probe 200 python3 bench/experiments/ws_probe.py
      grep '^|' "$OUT/ws_probe.log" ;;
    rebuild)  # the same programs timed with the build in .baseline/ (before) and with this one (after)
      if [ -d .baseline/tiledsl ]; then
        for round in $(seq 1 "${ROUNDS:-2}"); do
          # at world 2 where there are two GPUs, else world 1 (never a time from ranks sharing a GPU)
          run "rebuild_before_$round" 300 env PYTHONPATH="$PWD/.baseline:${PYTHONPATH:-}" \
            torchrun --nproc-per-node="$pair" bench/bench_rebuild.py --label before
          run "rebuild_after_$round" 300 torchrun --nproc-per-node="$pair" bench/bench_rebuild.py --label after
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
printf '%-28s %5s %5s %5s %5s %5s\n' stage exit PASS FAIL SKIP s
printf '%s\n' "${rows[@]}"
fail_lines=$(printf '%s' "$failures" | grep -c '^')
nonzero=$(printf '%s\n' "${rows[@]}" | awk '$2 != 0 && $2 != "late"' | wc -l)
echo "$([ "$status" -eq 0 ] && echo ok || echo FAILED): $fail_lines FAIL lines, $nonzero stages exited non-zero$(
  [ "$late" -ne 0 ] && echo ", $late not started (deadline)")"
exit $status
