# ---- host side: what the launcher in tiledsl.runtime.launch needs to know about this program ----


def tds_infer_params(tds_shapes, world):
    """The params, read off the caller's tensors."""
    tds_found = {}
    tds_value = tds_shapes['A'][0]
    tds_found['M'] = tds_value
    tds_value = tds_shapes['A'][1]
    tds_found['K'] = tds_value
    tds_value = tds_shapes['B'][1]
    tds_found['N'] = tds_value
    return tds_found


def tds_tensor_shapes(tds_env):
    M = tds_env['M']
    K = tds_env['K']
    N = tds_env['N']
    world = tds_env['world']
    return {
        'A': (M, K, ),
        'B': (K, N, ),
        'C': (M // world, N, ),
        'P': (world, M // world, N, ),
    }


def tds_conditions(tds_env):
    M = tds_env['M']
    world = tds_env['world']
    BM = tds_env['BM']
    return [
        (M % world == 0, 'M must be divisible by world (programs/gemm_rs.tds:10)'),
        (M // world % BM == 0, 'M/world must be divisible by BM (programs/gemm_rs.tds:15)'),
    ]


def tds_counts(tds_env):
    """Each family's instances."""
    M = tds_env['M']
    N = tds_env['N']
    world = tds_env['world']
    BM = tds_env['BM']
    BN = tds_env['BN']
    BR = tds_env['BR']
    return {
        'mm': M * tds_int.cdiv(N, BN) // BM,
        'red': tds_int.cdiv(N, BN) * tds_int.cdiv(M, BR * world),
    }


def tds_orders(tds_env):
    """Each ordered family's instance numbers in the order it runs them on this rank (schedule/meaning.py)."""
    M = tds_env['M']
    N = tds_env['N']
    rank = tds_env['rank']
    world = tds_env['world']
    BM = tds_env['BM']
    BN = tds_env['BN']
    return {
        'mm': tds_launch.ordered_instances([M // BM, tds_int.cdiv(N, BN)],
                                           lambda i, j: ((world + i * BM * world // M - rank - 1) % world, j,
                                                         i // 8, i)),
    }


# What the launcher, graph replay, emulation, the trace and the tools read about this program: one
# object (tiledsl/runtime/specs.py), the functions above among its fields.
tds_SPEC = tds_launch.ProgramSpec(
    kernel=tds_kernel,
    # the kernel's arguments, once: its signature above, the launch, ahead-of-time compiles and graph
    # replay all follow this list
    args=(
        tds_launch.Arg('C', 'tensor', of='C', dtype='bfloat16'),
        tds_launch.Arg('P', 'tensor', of='P', dtype='bfloat16'),
        tds_launch.Arg('tds_peers_P', 'peers', of='P', dtype='int64'),
        tds_launch.Arg('tds_sig_mm', 'signals', of='mm', dtype='int32'),
        tds_launch.Arg('tds_sigpeers_mm', 'signal_peers', of='mm', dtype='int64'),
        tds_launch.Arg('tds_order_mm', 'order', of='mm', dtype='int32'),
        tds_launch.Arg('tds_desc_mm_a', 'descriptor', of='A', dtype='bfloat16', block=(128, 64)),
        tds_launch.Arg('tds_desc_mm_b', 'descriptor', of='B', dtype='bfloat16', block=(64, 256)),
        tds_launch.Arg('M', 'size'),
        tds_launch.Arg('K', 'size'),
        tds_launch.Arg('N', 'size'),
        tds_launch.Arg('rank', 'size'),
        tds_launch.Arg('world', 'size'),
        tds_launch.Arg('tds_epoch_cell', 'epoch_cell', dtype='int32'),
        tds_launch.Arg('tds_diag', 'diag', dtype='int32'),
        tds_launch.Arg('tds_max_spins', 'max_spins'),
        tds_launch.Arg('tds_barrier', 'barrier', dtype='int32'),
        tds_launch.Arg('tds_barrier_peers', 'barrier_peers', dtype='int64'),
        tds_launch.Arg('BM', 'const'),
        tds_launch.Arg('BN', 'const'),
        tds_launch.Arg('BR', 'const'),
        tds_launch.Arg('BK', 'const'),
        tds_launch.Arg('tds_trace_mm', 'trace', of='mm', dtype='int64'),
        tds_launch.Arg('tds_trace_red', 'trace', of='red', dtype='int64'),
        tds_launch.Arg('tds_entry_trace', 'trace', dtype='int64'),
        tds_launch.Arg('tds_ENTER', 'enter'),
        tds_launch.Arg('tds_EXIT', 'exit'),
        tds_launch.Arg('tds_TRACE', 'tracing'),
        tds_launch.Arg('tds_RUN_mm', 'run', of='mm'),
        tds_launch.Arg('tds_START_mm', 'start', of='mm'),
        tds_launch.Arg('tds_PROGRAMS_mm', 'programs', of='mm'),
        tds_launch.Arg('tds_RUN_red', 'run', of='red'),
        tds_launch.Arg('tds_START_red', 'start', of='red'),
        tds_launch.Arg('tds_PROGRAMS_red', 'programs', of='red'),
    ),
    tensors=(
        tds_launch.TensorSpec('A', 'in', 'bfloat16', staged=False, peers=False,
                              where='programs/gemm_rs.tds:8 in A : bf16[M, K]'),
        tds_launch.TensorSpec('B', 'in', 'bfloat16', staged=False, peers=False,
                              where='programs/gemm_rs.tds:9 in B : bf16[K, N]'),
        tds_launch.TensorSpec('C', 'out', 'bfloat16', staged=False, peers=False,
                              where='programs/gemm_rs.tds:10 out C : bf16[M / world, N]'),
        tds_launch.TensorSpec('P', 'symm', 'bfloat16', staged=False, peers=True,
                              where='programs/gemm_rs.tds:11 symm P : bf16[world, M / world, N]'),
    ),
    families=(
        tds_launch.FamilySpec('mm', 'tile', 'sms', programs=None, notify='all',
                              split=1, ordered=True, matmul=True, counted=False,
                              signal_dtype='int32'),
        tds_launch.FamilySpec('red', 'tile', 'sms', programs=None, notify=None,
                              split=1, ordered=False, matmul=False, counted=False),
    ),
    edges=(
        'programs/gemm_rs.tds:17 red[i, j] after mm[(rank*Ms + i*BR)/BM, j] @ every rank',
    ),
    params=('M', 'K', 'N', ),
    consts={'BM': 128, 'BN': 256, 'BR': 32, 'BK': 64},
    distributed=True,
    uses_nvshmem=False,
    infer_params=tds_infer_params,
    tensor_shapes=tds_tensor_shapes,
    conditions=tds_conditions,
    counts=tds_counts,
    orders=tds_orders,
)


def tds_load(**tds_options):
    """The callable program: `tds_load(heap=heap)(A, B, C)` under torchrun, or emulated on a CPU."""
    return tds_launch.Program(tds_sys.modules[__name__], **tds_options)
