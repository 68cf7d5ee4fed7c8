"""The few synchronisation helpers every generated kernel uses.

Memory ordering: a producer's threads finish their stores, meet at a CTA barrier, then one thread
writes the epoch into the consumer's signal slot with a release store at system scope; a consumer
spins on an acquire read at system scope of that slot until it reaches the epoch, and only then loads
the data. Every slot has one writer (one producer instance on one rank), so plain release stores
suffice, and slots only grow (epoch e+1 overwrites e), so no reset is needed between calls.

Every wait is bounded: after `max_spins` reads it records rank, edge, instance, expected and seen
epoch in the diagnostics buffer and gives up; later waits see the flag and give up at once, so a
broken schedule ends in a named error from the launcher instead of a hang.

Across nodes there is no peer pointer: a signal to another node is an NVSHMEM signal (`signal`, after
a system-scope fence so that what the program stored is visible to whoever reads it next, an NVSHMEM
get say), 64-bit, and its waiter, after the same bounded spin, calls NVSHMEM's own wait once the value
is there (`wait_shmem`), which enforces what NVSHMEM needs for data that came over the network. The
entry barrier of a program written for several nodes has two levels (`arrive_nodes`).
"""
import os

import triton
import triton.language as tl

# Layout of the diagnostics buffer (int32): what the launcher reads after a call.
DIAG_FLAG, DIAG_RANK, DIAG_EDGE, DIAG_INSTANCE, DIAG_EXPECTED, DIAG_SEEN = range(6)
DIAG_SIZE = 8
BARRIER_EDGE = -1  # the edge number a timed-out entry barrier reports
EXIT_EDGE = -2     # and a timed-out exit barrier (inputs peers read in place, runtime/launch.py)
GUARD_EDGE = -3    # guard site s (a device value past its bound) reports edge GUARD_EDGE - s
_GUARD_EDGE = tl.constexpr(GUARD_EDGE)
NONE_FOUND = tl.constexpr(2**31 - 1)

EMULATED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def wait(sig_ptr, epoch, diag, max_spins, rank, edge, instance):
    """Until the slot holds `epoch`; past `max_spins` reads, `diag` records `rank`, `edge` and the
    waiting `instance`, with the epochs expected and seen, and the wait gives up."""
    # The common case, a signal already there, costs one read and no loop, so that a persistent
    # loop holding this wait can still be flattened into one software pipeline.
    if tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys") < epoch:
        wait_slow(sig_ptr, epoch, diag, max_spins, rank, edge, instance)


@triton.jit
def wait_inline(sig_ptr, epoch, diag, max_spins, rank, edge, instance):
    """`wait` with its slow path in line, for a wait in a step of a tile's loop. Through the call to
    the noinline slow path there, sp_ag_attention at BM=128 (a 128x128 fp32 accumulator live through
    its loop over pieces) was wrong in the first row of some tiles at a ragged size on 1 and 2 stages;
    in line, every build was right (bench/NOTES.md, seventh session). Its speed did not change."""
    seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < epoch) & (spins < max_spins):
        seen = tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys")
        spins += 1
        if tl.load(diag, volatile=True) != 0:
            spins = max_spins  # another wait already timed out: the call is lost, stop spinning
    if seen < epoch:
        if tl.atomic_cas(diag, 0, 1, sem="relaxed", scope="gpu") == 0:
            tl.store(diag + 1, rank)
            tl.store(diag + 2, edge)
            tl.store(diag + 3, instance)
            tl.store(diag + 4, epoch)
            tl.store(diag + 5, seen)


@triton.jit(noinline=True)
def wait_slow(sig_ptr, epoch, diag_ptr, max_spins, rank, edge, instance):
    wait_inline(sig_ptr, epoch, diag_ptr, max_spins, rank, edge, instance)


@triton.jit
def wait_parts(sig_ptr, epoch, diag, max_spins, rank, edge, instance, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """Until each of the PARTS slots from `sig_ptr` (the parts of one instance of a `split` producer)
    holds `epoch`. One vector read of them all in the common case, not PARTS reads one after another:
    a copy in 64 parts would otherwise spend 64 round trips to memory before each of its own parts.
    Past `max_spins` reads, each part's own wait records which one is missing."""
    lanes = tl.arange(0, BLOCK)
    inside = lanes < PARTS
    slots = sig_ptr + tl.minimum(lanes, PARTS - 1)
    seen = tl.atomic_add(slots, 0, mask=inside, sem="acquire", scope="sys")
    least = tl.min(tl.where(inside, seen, epoch), axis=0)
    spins = 0
    while (least < epoch) & (spins < max_spins):
        seen = tl.atomic_add(slots, 0, mask=inside, sem="acquire", scope="sys")
        least = tl.min(tl.where(inside, seen, epoch), axis=0)
        spins += 1
        if tl.load(diag, volatile=True) != 0:
            spins = max_spins  # another wait already timed out: the call is lost, stop spinning
    if least < epoch:
        for part in range(0, PARTS):
            wait(sig_ptr + part, epoch, diag, max_spins, rank, edge, instance)


@triton.jit
def load_relaxed(pointers):
    """A strong (relaxed, system-scope) read of each int32, no ordering among them."""
    return tl.inline_asm_elementwise("ld.relaxed.sys.global.b32 $0, [$1];", "=r,l", [pointers], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def fence_sys():
    """fence.acq_rel at system scope: orders this thread's accesses before it against those after it."""
    tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


# the interpreter runs no PTX: there the reads of a ranged wait are acquires, one by one
_RELAXED_SPANS = tl.constexpr(not EMULATED)


@triton.jit
def read_span(slots, inside):
    if _RELAXED_SPANS:
        return load_relaxed(slots)
    else:
        return tl.atomic_add(slots, 0, mask=inside, sem="acquire", scope="sys")


@triton.jit
def wait_span(sig_ptr, count, stride, epoch, diag, max_spins, rank, edge, instance, BLOCK: tl.constexpr):
    """Until each of the `count` slots `sig_ptr + j * stride` (`*` over a run of a producer's indices:
    every pack tile of one rank, say, stride 1; or every expert and row block of one column block)
    holds `epoch`, BLOCK of them a read, so that a GEMM tile after 3072 pack tiles makes one round trip
    to memory, not 3072. The reads are relaxed loads, then one acquire fence. As acquire loads (what
    Triton makes of an acquire atomic add of 0) a thread's 16-32 lanes of a block went one round trip
    after another, each acquire ordering every later load after it: an MoE pull instance over 28672
    pack slots (4096 tokens a rank) made 224 round trips, and dispatch took 3.5 ms, 32.6 ms in fp8
    (229376 slots), 0.44 ms at 128 tokens (one H200, bench/NOTES.md session 13). Relaxed loads are all
    in flight at once. A relaxed read that sees the producer's release store, then fence.acq_rel in
    the same thread, is an acquire (PTX memory model; the C++ ABI maps a seq_cst load to ld.relaxed +
    fence the same way); the CTA barrier after the fence hands that to the threads that did not read
    the slot. Past `max_spins` reads of a block, each of its slots' own wait records which one is
    missing."""
    lanes = tl.arange(0, BLOCK)
    for first in range(0, count, BLOCK):
        inside = first + lanes < count
        slots = sig_ptr + tl.minimum(first + lanes, count - 1) * stride  # every lane reads a real slot
        seen = read_span(slots, inside)
        least = tl.min(tl.where(inside, seen, epoch), axis=0)
        spins = 0
        while (least < epoch) & (spins < max_spins):
            seen = read_span(slots, inside)
            least = tl.min(tl.where(inside, seen, epoch), axis=0)
            spins += 1
            if tl.load(diag, volatile=True) != 0:
                spins = max_spins  # another wait already timed out: the call is lost, stop spinning
        if least < epoch:
            for slot in range(first, tl.minimum(first + BLOCK, count)):
                wait(sig_ptr + slot * stride, epoch, diag, max_spins, rank, edge, instance)
    if _RELAXED_SPANS:
        fence_sys()
        tl.debug_barrier()


@triton.jit
def report(diag_ptr, rank, site, bad, element, value, bound):
    """A device value past its bound (runtime/guards.py): where `bad` holds, the first element (the
    smallest flat offset) is recorded in the diagnostics as guard `site`, with its value and the bound,
    unless something was recorded already. The call goes on (the kernel skips what the value would
    have reached) and the launcher raises after it; later waits of this rank give up at once."""
    bad = bad | (tl.zeros([1], tl.int32) != 0)  # a block even where the arguments are scalars
    first = tl.min(tl.where(bad, element, NONE_FOUND))
    if first != NONE_FOUND:
        found = tl.max(tl.where(bad & (element == first), value, -NONE_FOUND).to(tl.int32))
        if tl.atomic_cas(diag_ptr, 0, 1, sem="relaxed", scope="gpu") == 0:
            tl.store(diag_ptr + 1, rank)
            tl.store(diag_ptr + 2, _GUARD_EDGE - site)
            tl.store(diag_ptr + 3, first.to(tl.int32))
            tl.store(diag_ptr + 4, bound)
            tl.store(diag_ptr + 5, found)


@triton.jit
def capped(count, cap, diag_ptr, rank, site, element):
    """A count read for a size: above its cap it is reported and read as the cap."""
    report(diag_ptr, rank, site, count > cap, element, count, cap)
    return tl.minimum(count, cap)


@triton.jit
def notify(sig_ptr, epoch):
    # the barrier makes every thread's stores of this instance happen before the one release store
    tl.debug_barrier()
    tl.atomic_xchg(sig_ptr, epoch, sem="release", scope="sys")


@triton.jit
def count(count_ptr):
    """One more instance of a row done: the communication stream waits until the row's count is
    complete, then copies it. Release at system scope, as for a signal: the copy engine reads the
    instance's stores after it sees the count."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release", scope="sys")


@triton.jit
def advance(epoch_cell):
    """A call's first step on the GPU, in an entry kernel of its own: the epoch cell moves to this
    call's epoch, which every later kernel of the call reads. Every thread reads before any writes."""
    epoch = tl.load(epoch_cell) + 1
    tl.debug_barrier()
    tl.store(epoch_cell, epoch)
    return epoch


@triton.jit
def last_to_finish(count_ptr):
    """Count this program in at `count_ptr`; True for the last of the kernel's programs, which resets
    the count for the next call. A kernel that is its call's entry stores the epoch in the cell
    there: every program read the cell before it counted itself, so all of them saw the last call's
    epoch, and the next call's kernel, after this one on the stream, sees this one. GPU scope: a
    system-scope fence in every program would cost microseconds, and only this GPU reads the cell."""
    tl.debug_barrier()
    last = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1
    if last:
        tl.store(count_ptr, 0)
    return last


@triton.jit
def enter(epoch_cell):
    """The entry of a call that talks to no other rank."""
    advance(epoch_cell)


@triton.jit(do_not_specialize=["rank", "max_spins"])
def barrier_all(bar_ptr, peers_bar, rank, world, epoch_cell, diag_ptr, max_spins):
    """The entry of a call that communicates: advance the epoch, then every rank tells every rank it
    reached this call and waits to hear from all, so inputs are staged everywhere and no rank still
    reads buffers that this call will overwrite."""
    epoch = advance(epoch_cell)
    for r in range(0, world):
        notify(bar_ptr + tl.load(peers_bar + r) + rank, epoch)
    for r in range(0, world):
        wait(bar_ptr + r, epoch, diag=diag_ptr, max_spins=max_spins, rank=rank, edge=-1, instance=r)


@triton.jit
def copy_put(dst_ptr, src_ptr, nelems, sig_ptr, epoch, pe, peers_dst, peers_sig, BLOCK: tl.constexpr):
    """A put with signal done by this program's own loads and stores: what an nvshmem put does,
    for the emulator, where NVSHMEM's device library cannot run."""
    remote = dst_ptr + tl.load(peers_dst + pe)
    for start in range(0, nelems, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(remote + offs, tl.load(src_ptr + offs, mask=offs < nelems), mask=offs < nelems)
    notify(sig_ptr + tl.load(peers_sig + pe), epoch)


@triton.jit
def copy_get(dst_ptr, src_ptr, nelems, pe, peers_src, rank, BLOCK: tl.constexpr):
    """A get done by this program's own loads and stores, for the emulator: `peers_src` is the PE table
    of `src_ptr`, which only NVSHMEM's stand-ins receive."""
    remote = src_ptr + tl.load(peers_src + pe)
    for start in range(0, nelems, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(remote + offs, mask=offs < nelems), mask=offs < nelems)


@triton.jit
def copy_signal(sig_ptr, epoch, pe, peers_sig):
    """An NVSHMEM signal done by this program's own store: what nvshmemx_signal_op does, for the
    emulator. `peers_sig` is the PE table only NVSHMEM's stand-ins receive."""
    notify(sig_ptr + tl.load(peers_sig + pe), epoch)


@triton.jit
def arrive_nodes(bar_ptr, peers_bar, shmem_bar, rank, nodes, local_world, epoch, first, diag, max_spins, edge):
    """The entry barrier in two levels (`edge` BARRIER_EDGE; the exit barrier too, on the slots after the
    entry's, EXIT_EDGE). Slots 0 .. local_world-1 of `bar_ptr`: each rank of this node
    arrived (stored through peer pointers); slots local_world + m: the rank of this local rank on node m
    saw its whole node arrive (an NVSHMEM signal). Passing both levels, every rank of every node has
    arrived: a node's signal is sent only once that node's first level is complete. The program with
    `first` sends this rank's stores and signals; every program waits."""
    node = rank // local_world
    local_rank = rank % local_world
    if first:
        for r in range(node * local_world, node * local_world + local_world):
            notify(bar_ptr + tl.load(peers_bar + r) + local_rank, epoch)
    for r in range(0, local_world):
        wait(bar_ptr + r, epoch, diag=diag, max_spins=max_spins, rank=rank, edge=edge, instance=node * local_world + r)
    if first:
        for m in range(1, nodes):
            signal(bar_ptr + local_world + node, epoch, ((node + m) % nodes) * local_world + local_rank, shmem_bar)
    for m in range(1, nodes):
        other = (node + m) % nodes
        wait_shmem(bar_ptr + local_world + other, epoch, diag=diag, max_spins=max_spins, rank=rank, edge=edge,
                   instance=other * local_world + local_rank)


@triton.jit(do_not_specialize=["rank", "max_spins"])
def barrier_nodes(bar_ptr, peers_bar, shmem_bar, rank, nodes, local_world, epoch_cell, diag_ptr, max_spins):
    """The entry of a call of a program written for several nodes, as a kernel of its own: advance the
    epoch, then the two-level barrier."""
    epoch = advance(epoch_cell)
    arrive_nodes(bar_ptr, peers_bar, shmem_bar, rank, nodes, local_world, epoch, True, diag_ptr, max_spins, -1)


@triton.jit
def no_fence():
    pass


@triton.jit
def proxy_fence():
    """After a program's waits, before its TMA loads: those loads run in the async proxy, which an
    acquire in the generic proxy does not order by itself (PTX memory model: data written by another
    SM's stores or by the copy engine and flagged by a release is seen by TMA only after
    fence.proxy.async). Being an asm with side effects, it also keeps the compiler from moving the
    loads above the wait."""
    tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


if EMULATED:
    put_signal = copy_put
    get = copy_get
    signal = copy_signal
    wait_shmem = wait       # the stand-ins store through shared memory, which the spin reads
    wait_parts_shmem = wait_parts
    fence_async = no_fence  # the interpreter runs no PTX, and has one proxy
else:
    fence_async = proxy_fence
    from tiledsl.runtime import nvshmem_device

    @triton.jit
    def signal(sig_ptr, epoch, pe, peers_sig):
        # every thread's stores of this instance visible at system scope before the signal leaves (the
        # waiter on the other node may read them with an NVSHMEM get); NVSHMEM takes it from there
        tl.debug_barrier()
        fence_sys()
        nvshmem_device.signal_op(sig_ptr, epoch, nvshmem_device.NVSHMEM_SIGNAL_SET, pe)

    @triton.jit
    def get(dst_ptr, src_ptr, nelems, pe, peers_src, rank, BLOCK: tl.constexpr):
        # the source's symmetric address is that of this rank's copy (of a staged input: the heap copy
        # its peers read, `peers_src[rank]` from the caller's tensor); the rows are here on return
        here = src_ptr + tl.load(peers_src + rank)
        nbytes = tl.cast(nelems, tl.int64) * (dst_ptr.dtype.element_ty.primitive_bitwidth // 8)
        if nbytes > 0:
            nvshmem_device.getmem_block(dst_ptr, here, nbytes, pe)

    @triton.jit
    def wait_parts_shmem(sig_ptr, epoch, diag, max_spins, rank, edge, instance, PARTS: tl.constexpr,
                         BLOCK: tl.constexpr):
        wait_parts(sig_ptr, epoch, diag, max_spins, rank, edge, instance, PARTS, BLOCK)
        # as wait_shmem, for every part at once: each thread calls NVSHMEM's wait on its lanes' slots
        slots = sig_ptr + tl.minimum(tl.arange(0, BLOCK), PARTS - 1)
        seen = tl.atomic_add(slots, 0, sem="acquire", scope="sys")
        if tl.min(seen, axis=0) >= epoch:
            nvshmem_device.signal_wait_until(slots, nvshmem_device.NVSHMEM_CMP_GE, epoch)

    @triton.jit
    def wait_shmem(sig_ptr, epoch, diag, max_spins, rank, edge, instance):
        wait(sig_ptr, epoch, diag, max_spins, rank, edge, instance)
        # the value is there (unless the wait gave up): NVSHMEM's wait returns at once, after doing
        # what its transport needs for the data that came with or before the signal to be visible
        if tl.atomic_add(sig_ptr, 0, sem="acquire", scope="sys") >= epoch:
            nvshmem_device.signal_wait_until(sig_ptr, nvshmem_device.NVSHMEM_CMP_GE, epoch)

    @triton.jit
    def put_signal(dst_ptr, src_ptr, nelems, sig_ptr, epoch, pe, peers_dst, peers_sig, BLOCK: tl.constexpr):
        # NVSHMEM orders the data before the signal on the target PE; the signal slot is symmetric
        nbytes = tl.cast(nelems, tl.int64) * (dst_ptr.dtype.element_ty.primitive_bitwidth // 8)
        if nbytes > 0:
            nvshmem_device.putmem_signal_block(dst_ptr, src_ptr, nbytes, sig_ptr, epoch,
                                               nvshmem_device.NVSHMEM_SIGNAL_SET, pe)
        else:  # a region clipped away whole (past the end of a ragged size): the signal alone
            nvshmem_device.signal_op(sig_ptr, epoch, nvshmem_device.NVSHMEM_SIGNAL_SET, pe)
