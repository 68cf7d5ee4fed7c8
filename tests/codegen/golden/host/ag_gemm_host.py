# ---- host side: what the launcher in tiledsl.runtime.launch needs to know about this program ----

# The kernel's arguments, once: its signature above, the launch, ahead-of-time compiles and graph
# replay all follow this list.
tds_ARGS = (
    tds_launch.Arg('A', 'tensor', of='A', dtype='bfloat16'),
    tds_launch.Arg('tds_peers_A', 'peers', of='A', dtype='int64'),
    tds_launch.Arg('B', 'tensor', of='B', dtype='bfloat16'),
    tds_launch.Arg('C', 'tensor', of='C', dtype='bfloat16'),
    tds_launch.Arg('A_all', 'tensor', of='A_all', dtype='bfloat16'),
    tds_launch.Arg('tds_sig_gather', 'signals', of='gather', dtype='int32'),
    tds_launch.Arg('tds_order_mm', 'order', of='mm', dtype='int32'),
    tds_launch.Arg('tds_desc_mm_a', 'descriptor', of='A_all', dtype='bfloat16', block=(128, 64)),
    tds_launch.Arg('tds_desc_mm_b', 'descriptor', of='B', dtype='bfloat16', block=(64, 256)),
    tds_launch.Arg('tds_desc_mm_c', 'descriptor', of='C', dtype='bfloat16', block=(128, 256)),
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
    tds_launch.Arg('BK', 'const'),
    tds_launch.Arg('tds_trace_mm', 'trace', of='mm', dtype='int64'),
    tds_launch.Arg('tds_entry_trace', 'trace', dtype='int64'),
    tds_launch.Arg('tds_ENTER', 'role'),
    tds_launch.Arg('tds_EXIT', 'role'),
    tds_launch.Arg('tds_TRACE', 'role'),
    tds_launch.Arg('tds_RUN_mm', 'role', of='mm'),
    tds_launch.Arg('tds_START_mm', 'role', of='mm'),
    tds_launch.Arg('tds_PROGRAMS_mm', 'role', of='mm'),
)
tds_TENSORS = (
    tds_launch.TensorSpec('A', 'in', 'bfloat16', staged=True, peers=True,
                          where='programs/ag_gemm.tds:8 in A : bf16[M / world, K]'),
    tds_launch.TensorSpec('B', 'in', 'bfloat16', staged=False, peers=False,
                          where='programs/ag_gemm.tds:9 in B : bf16[K, N]'),
    tds_launch.TensorSpec('C', 'out', 'bfloat16', staged=False, peers=False,
                          where='programs/ag_gemm.tds:10 out C : bf16[M, N]'),
    tds_launch.TensorSpec('A_all', 'symm', 'bfloat16', staged=False, peers=False,
                          where='programs/ag_gemm.tds:11 symm A_all : bf16[M, K]'),
)
tds_FAMILIES = (
    tds_launch.FamilySpec('gather', 'chunk', 'copy_engine', programs=None, notify='local',
                          split=1, ordered=True, matmul=False, counted=False),
    tds_launch.FamilySpec('mm', 'tile', 'sms', programs=None, notify=None,
                          split=1, ordered=True, matmul=True, counted=False),
)
tds_EDGES = (
    'programs/ag_gemm.tds:17 mm[i, j] after gather[(i*BM) / Ms]',
)
tds_PARAMS = ('M', 'K', 'N', )
tds_CONSTS = {'BM': 128, 'BN': 256, 'BK': 64}
tds_DISTRIBUTED = True
tds_USES_NVSHMEM = False


def tds_infer_params(tds_shapes, world):
    """The params, read off the caller's tensors."""
    tds_found = {}
    tds_value = tds_shapes['A'][0]
    tds_found['M'] = M = tds_value * world
    tds_value = tds_shapes['A'][1]
    tds_found['K'] = K = tds_value
    tds_value = tds_shapes['B'][1]
    tds_found['N'] = N = tds_value
    return tds_found


def tds_tensor_shapes(tds_env):
    M = tds_env['M']
    K = tds_env['K']
    N = tds_env['N']
    world = tds_env['world']
    return {
        'A': (M // world, K, ),
        'B': (K, N, ),
        'C': (M, N, ),
        'A_all': (M, K, ),
    }


def tds_conditions(tds_env):
    M = tds_env['M']
    world = tds_env['world']
    BM = tds_env['BM']
    return [
        (M % world == 0, 'M must be divisible by world (programs/ag_gemm.tds:8)'),
        (M // world % BM == 0, 'M/world must be divisible by BM (programs/ag_gemm.tds:16)'),
    ]


def tds_counts(tds_env):
    """Each family's instances."""
    M = tds_env['M']
    N = tds_env['N']
    world = tds_env['world']
    BM = tds_env['BM']
    BN = tds_env['BN']
    return {
        'gather': world,
        'mm': M * ((BN + N - 1) // BN) // BM,
    }


def tds_blocks(tds_env):
    """Launch-time constexpr blocks: the power of two that covers each size."""
    return {
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
        'gather': tds_launch.ordered_instances([world], lambda s: ((s - rank) % world, s)),
        'mm': tds_launch.ordered_instances([M // BM, (BN + N - 1) // BN],
                                           lambda i, j: ((i * BM * world // M - rank) % world, j, i // 8, i)),
    }


# programs/ag_gemm.tds:14 chunk gather[s in world] on copy_engine: A@s -> A_all[s*Ms : +Ms, :]
def tds_views_gather(tds_env, tds_tensor, tds_instance):
    """The source and target of one instance, as views of local or peer tensors."""
    M = tds_env['M']
    K = tds_env['K']
    world = tds_env['world']
    s, = tds_launch.unlinear(tds_instance, (world,))
    tds_source = tds_tensor('A', s)[0 : M // world, 0 : K]
    tds_target = tds_tensor('A_all', None)[s * M // world : M // world + s * M // world, 0 : K]
    return tds_source, tds_target


def tds_load(**tds_options):
    """The callable program: `tds_load(heap=heap)(A, B, C)` under torchrun, or emulated on a CPU."""
    return tds_launch.Program(tds_sys.modules[__name__], **tds_options)
