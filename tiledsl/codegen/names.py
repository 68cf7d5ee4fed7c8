"""The names generated code holds where a tile's statements run, and how a value gets a name beside them.
A value is named after what it computes or loads (`tds_diag` for a load of a tensor `diag`), and the
program may use any name the language accepts: a value must never shadow a kernel argument
(interface.py), a name of the kernel template or a module it calls."""
from __future__ import annotations

import re

EPOCH = "tds_epoch"  # not an argument: the kernel reads it from the cell and hands it to its families

# names the kernel template, the statements' printers (printer.py) and the kernel's argument list use as they are
HELD = frozenset({
    "tds_ENTER", "tds_EXIT", "tds_TRACE", "tds_a", "tds_b", "tds_barrier", "tds_barrier_peers", "tds_barrier_shmem",
    "tds_base", "tds_block", "tds_c", "tds_c0", "tds_diag", "tds_earlier", "tds_entry_trace", "tds_epoch",
    "tds_epoch_cell", "tds_first", "tds_float", "tds_g", "tds_g0", "tds_id", "tds_inside", "tds_inst", "tds_k",
    "tds_kernel", "tds_last", "tds_launch", "tds_max_spins", "tds_mine", "tds_ours", "tds_part", "tds_peer",
    "tds_pid", "tds_program", "tds_programs", "tds_r", "tds_r0", "tds_rank", "tds_s", "tds_s0", "tds_seen",
    "tds_step", "tds_sync", "tds_t", "tds_timeline", "tds_wait_began", "tds_waited", "tds_wpart",
    "tds_elems", "tds_rows", "tds_cols",  # a one-block tile's aranges (printer.AXES)
})
# names made from a family's or a tensor's name: the kernel's arguments, block sizes, tile functions
HELD_PREFIXES = ("tds_peers_", "tds_shmem_", "tds_sig_", "tds_sigpeers_", "tds_sigshmem_", "tds_order_",
                 "tds_count_", "tds_countpeers_", "tds_desc_", "tds_trace_", "tds_RUN_", "tds_START_",
                 "tds_PROGRAMS_", "tds_valid_", "tds_BLOCK_", "tds_tile_")
ARANGE = re.compile(r"tds_[erc](\d+|_b\w*)\Z")  # a block tile's aranges (blocks.py)


def held(name: str) -> bool:
    return name in HELD or name.startswith(HELD_PREFIXES) or ARANGE.match(name) is not None


def value_name(hint: str, taken: set[str]) -> str:
    """`tds_{hint}`, numbered past the names `taken` (and taken now); `tds_v_{hint}` where that name,
    or a numbering of it, is held by the generated code."""
    base = f"tds_{hint}"
    if held(base) or held(f"{base}2"):
        base = f"tds_v_{hint}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    taken.add(name)
    return name
