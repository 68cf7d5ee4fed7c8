# ---- host side: what the launcher in tiledsl.runtime.launch needs to know about this program ----


def tds_infer_params(tds_shapes, world):
    """The params, read off the caller's tensors."""
    tds_found = {}
    tds_value = tds_shapes['X'][0]
    tds_found['N'] = tds_value
    return tds_found


def tds_tensor_shapes(tds_env):
    N = tds_env['N']
    return {
        'X': (N, ),
    }


def tds_conditions(tds_env):
    return [
    ]


def tds_counts(tds_env):
    """Each family's instances."""
    N = tds_env['N']
    BLOCK = tds_env['BLOCK']
    return {
        'add': tds_int.cdiv(N, BLOCK),
    }


# What the launcher, graph replay, emulation, the trace and the tools read about this program: one
# object (tiledsl/runtime/specs.py), the functions above among its fields.
tds_SPEC = tds_launch.ProgramSpec(
    kernel=tds_kernel,
    # the kernel's arguments, once: its signature above, the launch, ahead-of-time compiles and graph
    # replay all follow this list
    args=(
        tds_launch.Arg('X', 'tensor', of='X', dtype='bfloat16'),
        tds_launch.Arg('tds_peers_X', 'peers', of='X', dtype='int64'),
        tds_launch.Arg('N', 'size'),
        tds_launch.Arg('rank', 'size'),
        tds_launch.Arg('world', 'size'),
        tds_launch.Arg('tds_epoch_cell', 'epoch_cell', dtype='int32'),
        tds_launch.Arg('tds_diag', 'diag', dtype='int32'),
        tds_launch.Arg('tds_max_spins', 'max_spins'),
        tds_launch.Arg('tds_barrier', 'barrier', dtype='int32'),
        tds_launch.Arg('tds_barrier_peers', 'barrier_peers', dtype='int64'),
        tds_launch.Arg('BLOCK', 'const'),
        tds_launch.Arg('tds_trace_add', 'trace', of='add', dtype='int64'),
        tds_launch.Arg('tds_entry_trace', 'trace', dtype='int64'),
        tds_launch.Arg('tds_ENTER', 'enter'),
        tds_launch.Arg('tds_EXIT', 'exit'),
        tds_launch.Arg('tds_TRACE', 'tracing'),
        tds_launch.Arg('tds_RUN_add', 'run', of='add'),
        tds_launch.Arg('tds_START_add', 'start', of='add'),
        tds_launch.Arg('tds_PROGRAMS_add', 'programs', of='add'),
    ),
    tensors=(
        tds_launch.TensorSpec('X', 'inout', 'bfloat16', staged=True, peers=True,
                              where='programs/allreduce.tds:8 inout X : bf16[N]'),
    ),
    families=(
        tds_launch.FamilySpec('add', 'tile', 'sms', programs=None, notify=None,
                              split=1, ordered=False, matmul=False, counted=False),
    ),
    edges=(),
    params=('N', ),
    consts={'BLOCK': 2048},
    distributed=True,
    uses_nvshmem=False,
    infer_params=tds_infer_params,
    tensor_shapes=tds_tensor_shapes,
    conditions=tds_conditions,
    counts=tds_counts,
)


def tds_load(**tds_options):
    """The callable program: `tds_load(heap=heap)(A, B, C)` under torchrun, or emulated on a CPU."""
    return tds_launch.Program(tds_sys.modules[__name__], **tds_options)
