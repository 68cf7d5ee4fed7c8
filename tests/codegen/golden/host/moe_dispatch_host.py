# ---- host side: what the launcher in tiledsl.runtime.launch needs to know about this program ----


def tds_infer_params(tds_shapes, world):
    """The params, read off the caller's tensors."""
    tds_found = {}
    tds_value = tds_shapes['X'][0]
    tds_found['T'] = tds_value
    tds_value = tds_shapes['X'][1]
    tds_found['H'] = tds_value
    tds_value = tds_shapes['ids'][1]
    tds_found['K'] = tds_value
    tds_value = tds_shapes['recv'][0]
    tds_found['E'] = tds_value
    tds_value = tds_shapes['recv'][2]
    tds_found['C'] = tds_value
    return tds_found


def tds_tensor_shapes(tds_env):
    T = tds_env['T']
    H = tds_env['H']
    K = tds_env['K']
    E = tds_env['E']
    C = tds_env['C']
    world = tds_env['world']
    return {
        'X': (T, H, ),
        'ids': (T, K, ),
        'recv': (E, world, C, H, ),
        'count': (E, world, ),
        'slot': (T, K, ),
        'sent': (E * world, ),
        'got': (E, world, ),
        'send': (E * world, C, H, ),
    }


def tds_conditions(tds_env):
    BT = tds_env['BT']
    BR = tds_env['BR']
    return [
        (BR % BT == 0, 'BR % BT == 0 is required (programs/moe_dispatch.tds:15)'),
    ]


def tds_counts(tds_env):
    """Each family's instances."""
    T = tds_env['T']
    H = tds_env['H']
    K = tds_env['K']
    E = tds_env['E']
    world = tds_env['world']
    BT = tds_env['BT']
    BH = tds_env['BH']
    BR = tds_env['BR']
    return {
        'tally': 1,
        'route': tds_int.cdiv(T, BR),
        'pack': K * tds_int.cdiv(H, BH) * tds_int.cdiv(T, BT),
        'tell': world,
        'pull': E * world,
        'keep': 1,
    }


def tds_blocks(tds_env):
    """Launch-time constexpr blocks: the power of two that covers each size."""
    E = tds_env['E']
    world = tds_env['world']
    return {
        'tds_BLOCK_tally_groups': tds_launch.pow2_at_least(min(1024, E * world)),
        'tds_BLOCK_route_groups': tds_launch.pow2_at_least(min(1024, E * world)),
        'tds_BLOCK_keep_0': tds_launch.pow2_at_least(E),
        'tds_BLOCK_keep_1': tds_launch.pow2_at_least(world),
    }


def tds_orders(tds_env):
    """Each ordered family's instance numbers in the order it runs them on this rank (schedule/meaning.py)."""
    E = tds_env['E']
    rank = tds_env['rank']
    world = tds_env['world']
    return {
        'tell': tds_launch.ordered_instances([world], lambda d: ((d - rank) % world, d)),
        'pull': tds_launch.ordered_instances([world, E], lambda s, e: ((s - rank) % world, e, s)),
    }


# What the launcher, graph replay, emulation, the trace and the tools read about this program: one
# object (tiledsl/runtime/specs.py), the functions above among its fields.
tds_SPEC = tds_launch.ProgramSpec(
    kernel=tds_kernel,
    # the kernel's arguments, once: its signature above, the launch, ahead-of-time compiles and graph
    # replay all follow this list
    args=(
        tds_launch.Arg('X', 'tensor', of='X', dtype='bfloat16'),
        tds_launch.Arg('ids', 'tensor', of='ids', dtype='int32'),
        tds_launch.Arg('recv', 'tensor', of='recv', dtype='bfloat16'),
        tds_launch.Arg('count', 'tensor', of='count', dtype='int32'),
        tds_launch.Arg('slot', 'tensor', of='slot', dtype='int32'),
        tds_launch.Arg('sent', 'tensor', of='sent', dtype='int32'),
        tds_launch.Arg('got', 'tensor', of='got', dtype='int32'),
        tds_launch.Arg('tds_peers_got', 'peers', of='got', dtype='int64'),
        tds_launch.Arg('send', 'tensor', of='send', dtype='bfloat16'),
        tds_launch.Arg('tds_peers_send', 'peers', of='send', dtype='int64'),
        tds_launch.Arg('tds_sig_tally', 'signals', of='tally', dtype='int32'),
        tds_launch.Arg('tds_sig_route', 'signals', of='route', dtype='int32'),
        tds_launch.Arg('tds_sig_pack', 'signals', of='pack', dtype='int32'),
        tds_launch.Arg('tds_sigpeers_pack', 'signal_peers', of='pack', dtype='int64'),
        tds_launch.Arg('tds_sig_tell', 'signals', of='tell', dtype='int32'),
        tds_launch.Arg('tds_sigpeers_tell', 'signal_peers', of='tell', dtype='int64'),
        tds_launch.Arg('tds_order_tell', 'order', of='tell', dtype='int32'),
        tds_launch.Arg('tds_order_pull', 'order', of='pull', dtype='int32'),
        tds_launch.Arg('T', 'size'),
        tds_launch.Arg('H', 'size'),
        tds_launch.Arg('K', 'size'),
        tds_launch.Arg('E', 'size'),
        tds_launch.Arg('C', 'size'),
        tds_launch.Arg('rank', 'size'),
        tds_launch.Arg('world', 'size'),
        tds_launch.Arg('tds_epoch_cell', 'epoch_cell', dtype='int32'),
        tds_launch.Arg('tds_diag', 'diag', dtype='int32'),
        tds_launch.Arg('tds_max_spins', 'max_spins'),
        tds_launch.Arg('tds_barrier', 'barrier', dtype='int32'),
        tds_launch.Arg('tds_barrier_peers', 'barrier_peers', dtype='int64'),
        tds_launch.Arg('BT', 'const'),
        tds_launch.Arg('BH', 'const'),
        tds_launch.Arg('BR', 'const'),
        tds_launch.Arg('tds_BLOCK_tally_groups', 'block'),
        tds_launch.Arg('tds_BLOCK_route_groups', 'block'),
        tds_launch.Arg('tds_BLOCK_keep_0', 'block'),
        tds_launch.Arg('tds_BLOCK_keep_1', 'block'),
        tds_launch.Arg('tds_trace_tally', 'trace', of='tally', dtype='int64'),
        tds_launch.Arg('tds_trace_route', 'trace', of='route', dtype='int64'),
        tds_launch.Arg('tds_trace_pack', 'trace', of='pack', dtype='int64'),
        tds_launch.Arg('tds_trace_tell', 'trace', of='tell', dtype='int64'),
        tds_launch.Arg('tds_trace_pull', 'trace', of='pull', dtype='int64'),
        tds_launch.Arg('tds_trace_keep', 'trace', of='keep', dtype='int64'),
        tds_launch.Arg('tds_entry_trace', 'trace', dtype='int64'),
        tds_launch.Arg('tds_ENTER', 'enter'),
        tds_launch.Arg('tds_EXIT', 'exit'),
        tds_launch.Arg('tds_TRACE', 'tracing'),
        tds_launch.Arg('tds_RUN_tally', 'run', of='tally'),
        tds_launch.Arg('tds_START_tally', 'start', of='tally'),
        tds_launch.Arg('tds_PROGRAMS_tally', 'programs', of='tally'),
        tds_launch.Arg('tds_RUN_route', 'run', of='route'),
        tds_launch.Arg('tds_START_route', 'start', of='route'),
        tds_launch.Arg('tds_PROGRAMS_route', 'programs', of='route'),
        tds_launch.Arg('tds_RUN_pack', 'run', of='pack'),
        tds_launch.Arg('tds_START_pack', 'start', of='pack'),
        tds_launch.Arg('tds_PROGRAMS_pack', 'programs', of='pack'),
        tds_launch.Arg('tds_RUN_tell', 'run', of='tell'),
        tds_launch.Arg('tds_START_tell', 'start', of='tell'),
        tds_launch.Arg('tds_PROGRAMS_tell', 'programs', of='tell'),
        tds_launch.Arg('tds_RUN_pull', 'run', of='pull'),
        tds_launch.Arg('tds_START_pull', 'start', of='pull'),
        tds_launch.Arg('tds_PROGRAMS_pull', 'programs', of='pull'),
        tds_launch.Arg('tds_RUN_keep', 'run', of='keep'),
        tds_launch.Arg('tds_START_keep', 'start', of='keep'),
        tds_launch.Arg('tds_PROGRAMS_keep', 'programs', of='keep'),
    ),
    tensors=(
        tds_launch.TensorSpec('X', 'in', 'bfloat16', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:17 in X : bf16[T, H]'),
        tds_launch.TensorSpec('ids', 'in', 'int32', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:18 in ids : i32[T, K]'),
        tds_launch.TensorSpec('recv', 'out', 'bfloat16', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:19 out recv : bf16[E, world, C, H] upto count'),
        tds_launch.TensorSpec('count', 'out', 'int32', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:20 out count : i32[E, world] cap C'),
        tds_launch.TensorSpec('slot', 'out', 'int32', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:21 out slot : i32[T, K]'),
        tds_launch.TensorSpec('sent', 'symm', 'int32', staged=False, peers=False,
                              where='programs/moe_dispatch.tds:22 symm sent : i32[NE] cap C'),
        tds_launch.TensorSpec('got', 'symm', 'int32', staged=False, peers=True,
                              where='programs/moe_dispatch.tds:23 symm got : i32[E, world] cap C'),
        tds_launch.TensorSpec('send', 'symm', 'bfloat16', staged=False, peers=True,
                              where='programs/moe_dispatch.tds:24 symm send : bf16[NE, C, H]'),
    ),
    families=(
        tds_launch.FamilySpec('tally', 'tile', 'sms', programs=None, notify='local',
                              split=1, ordered=False, matmul=False, counted=False,
                              signal_dtype='int32'),
        tds_launch.FamilySpec('route', 'tile', 'sms', programs=None, notify='local',
                              split=1, ordered=False, matmul=False, counted=False,
                              signal_dtype='int32'),
        tds_launch.FamilySpec('pack', 'tile', 'sms', programs=None, notify='all',
                              split=1, ordered=False, matmul=False, counted=False,
                              signal_dtype='int32'),
        tds_launch.FamilySpec('tell', 'chunk', 'sms', programs=1, notify='all',
                              split=1, ordered=True, matmul=False, counted=False,
                              signal_dtype='int32'),
        tds_launch.FamilySpec('pull', 'chunk', 'sms', programs=None, notify=None,
                              split=1, ordered=True, matmul=False, counted=False),
        tds_launch.FamilySpec('keep', 'tile', 'sms', programs=None, notify=None,
                              split=1, ordered=False, matmul=False, counted=False),
    ),
    edges=(
        'programs/moe_dispatch.tds:35 pack[t, k, h] after route[(t*BT) / BR]',
        'programs/moe_dispatch.tds:36 tell[d] after tally',
        'programs/moe_dispatch.tds:37 pull[s, e] after tell[rank] @ s, pack[*, *, *] @ s',
        'programs/moe_dispatch.tds:37 pull[s, e] after tell[rank] @ s, pack[*, *, *] @ s',
        'programs/moe_dispatch.tds:38 keep after tell[rank] @ every rank',
    ),
    # what each guard site reports (tensor whose element broke its bound, what the bound belongs to,
    # declaration); a kernel that reports one gives -3 - site as the edge in its diagnostics
    guards=(
        tds_launch.GuardSpec('capacity', 'sent', 'sent',
                             'programs/moe_dispatch.tds:22 `symm sent : i32[NE] cap C # sent[x]: rows this '
                             'rank sends to expert x`'),
        tds_launch.GuardSpec('index', 'ids', 'histogram()',
                             'programs/moe_dispatch.tds:18 `in ids : i32[T, K] # top-k expert ids, 0 .. NE-1`'),
        tds_launch.GuardSpec('index', 'ids', 'arrival()',
                             'programs/moe_dispatch.tds:18 `in ids : i32[T, K] # top-k expert ids, 0 .. NE-1`'),
        tds_launch.GuardSpec('index', 'ids', 'send',
                             'programs/moe_dispatch.tds:18 `in ids : i32[T, K] # top-k expert ids, 0 .. NE-1`'),
        tds_launch.GuardSpec('index', 'slot', 'send',
                             'programs/moe_dispatch.tds:21 `out slot : i32[T, K] # slot[t, k]: where (t, k) '
                             "landed among its expert's rows`"),
        tds_launch.GuardSpec('capacity', 'got', 'got',
                             'programs/moe_dispatch.tds:23 `symm got : i32[E, world] cap C`'),
        tds_launch.GuardSpec('capacity', 'count', 'count',
                             'programs/moe_dispatch.tds:20 `out count : i32[E, world] cap C # count[e, s]: '
                             'rows rank s sent to local expert e`'),
    ),
    params=('T', 'H', 'K', 'E', 'C', ),
    consts={'BT': 8, 'BH': 2048, 'BR': 8},
    distributed=True,
    uses_nvshmem=False,
    infer_params=tds_infer_params,
    tensor_shapes=tds_tensor_shapes,
    conditions=tds_conditions,
    counts=tds_counts,
    blocks=tds_blocks,
    orders=tds_orders,
)


def tds_load(**tds_options):
    """The callable program: `tds_load(heap=heap)(A, B, C)` under torchrun, or emulated on a CPU."""
    return tds_launch.Program(tds_sys.modules[__name__], **tds_options)
