"""The checker on device values (sizes and indices read on the device): each construct has a program
it accepts and a twin it refuses, with the message and the line:column asserted. The MoE programs are
also proved at sizes richer than the default ones (small tiles: several instances along every index)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sympy

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run
from tiledsl.schedule import ir
from tiledsl.schedule.check import _concrete_findings
from tiledsl.schedule.meaning import MAX_INSTANCES, QUICK_SHARE, at_capacity, default_sizes, instantiate, runs_when

ROOT = Path(__file__).resolve().parents[2]

# moe_dispatch's schedule, small: route, pack through (ids, slot), tell the counts, pull the rows
DISPATCH = textwrap.dedent("""\
    program dispatch
    param T, H, K, E, C
    const BT = 4
    let   NE = E * world
    in    X     : f32[T, H]
    in    ids   : i32[T, K]
    out   recv  : f32[E, world, C, H] upto count
    out   count : i32[E, world] cap C
    out   slot  : i32[T, K]
    symm  sent  : i32[NE] cap C
    symm  got   : i32[E, world] cap C
    symm  send  : f32[NE, C, H]
    tile  route: slot = arrival(ids, NE); sent = histogram(ids, NE)
    tile  pack[t in cdiv(T, BT), k in K]: send[ids[t*BT : +BT, k], slot[t*BT : +BT, k], :] = X[t*BT : +BT, :]
    chunk tell[d in world] on sms(1): sent[d*E : +E] -> got@d[:, rank]
    chunk pull[s in world, e in E] on sms(4): send@s[rank*E + e, 0 : +got[e, s], :] -> recv[e, s, 0 : +got[e, s], :]
    tile  keep: count = got
    pack[t, k] after route
    tell[d] after route
    pull[s, e] after tell[rank] @ s, pack[*, *] @ s
    keep after tell[rank] @ every rank
    order tell by (d - rank) mod world
    order pull by (s - rank) mod world, e
""")


def errors(source: str) -> list:
    with pytest.raises(TdsError) as raised:
        run(source, until="check")
    return [d for d in raised.value.diagnostics if d.severity == "error"]


def the_error(source: str, starts: str):
    found = [d for d in errors(source) if d.message.startswith(starts)]
    assert found, f"no error starting {starts!r}: {[d.message for d in errors(source)]}"
    return found[0]


def at(diagnostic) -> tuple[int, int]:
    return diagnostic.span.line, diagnostic.span.column


def where(source: str, text: str) -> tuple[int, int]:
    line = next(n for n, line in enumerate(source.splitlines(), 1) if text in line)
    return line, source.splitlines()[line - 1].index(text) + 1


def changed(old: str, new: str, source: str = DISPATCH) -> str:
    assert old in source
    return source.replace(old, new)


def test_dispatch_checks_clean():
    assert run(DISPATCH, until="check").warnings == []


# ---- races through device values -------------------------------------------------------------------

def test_writes_through_an_id_and_its_arrival_do_not_race_but_through_any_other_index_they_do():
    refused = changed("slot = arrival(ids, NE)", "slot = ids")
    error = the_error(refused, "race: instances of tile 'pack' both write the same elements of send")
    assert at(error) == where(refused, "send[ids[")


def test_a_pull_must_wait_for_the_counts_it_reads():
    refused = changed("pull[s, e] after tell[rank] @ s, pack[*, *] @ s", "pull[s, e] after pack[*, *] @ s")
    error = the_error(refused, "race: chunk 'pull' reads got while chunk 'tell' may still write it")
    assert at(error) == where(refused, "got[e, s], :] ->")


def test_a_pull_must_wait_for_every_pack_of_the_rank_it_pulls_from():
    """pack writes anywhere in send (through the ids): one pack instance is not enough."""
    refused = changed("pack[*, *] @ s", "pack[0, 0] @ s")
    error = the_error(refused, "race: chunk 'pull' reads send while tile 'pack' may still write it")
    assert at(error) == where(refused, "send@s[")


def test_counts_exchanged_in_the_wrong_order_deadlock():
    refused = changed("tell[d] after route", "tell[d] after pull[d, 0] @ d")
    error = the_error(refused, "deadlock: a cycle of waits: tell[0]@rank0 -> pull[0, 0]@rank0 -> tell[0]@rank0")
    assert at(error) == where(refused, "pull[d, 0] @ d")


# ---- sizes read on the device ----------------------------------------------------------------------

def test_a_size_read_from_a_tensor_needs_a_cap():
    refused = changed("symm  got   : i32[E, world] cap C", "symm  got   : i32[E, world]")
    refused = changed("out   count : i32[E, world] cap C", "out   count : i32[E, world]", refused)
    error = the_error(refused, "a size read from 'got' needs a bound: declare it with `cap C`")
    assert at(error) == where(refused, "send@s[")


def test_a_size_must_grow_with_its_count():
    refused = changed("recv[e, s, 0 : +got[e, s], :]", "recv[e, s, 0 : +(C - got[e, s]), :]")
    error = the_error(refused, "this size must grow with got[...]")
    assert at(error) == where(refused, "recv[e, s, 0")
    accepted = DISPATCH.replace("0 : +got[e, s], :]", "0 : +min(got[e, s], C), :]")
    run(accepted, until="check")


def test_a_region_is_proved_at_the_cap_of_its_count():
    refused = changed("out   recv  : f32[E, world, C, H] upto count", "out   recv  : f32[E, world, C - 1, H]")
    refused = changed("recv[e, s, 0 : +got[e, s], :]", "recv[e, s, 0 : got[e, s], :]", refused)
    error = the_error(refused, "out of bounds: dimension 2 of 'recv' has size")
    assert "up to" in error.message
    accepted = changed("recv[e, s, 0 : +got[e, s], :]", "recv[e, s, 0 : got[e, s], :]")
    run(accepted, until="check")


def test_capacity_regions_use_the_cap_and_gathered_points_the_whole_dimension():
    schedule = run(DISPATCH, until="check").schedule
    pull, pack = schedule.families["pull"], schedule.families["pack"]
    _, dims = at_capacity(schedule, pull.writes[0])
    assert dims[2] == (0, ir.size_symbol("C"))
    _, dims = at_capacity(schedule, pack.writes[0])
    assert dims[0] == (0, ir.size_symbol("E") * ir.WORLD) and dims[1] == (0, ir.size_symbol("C"))


def test_a_tensor_element_outside_a_region_is_refused():
    refused = changed("pull[s, e] after tell[rank] @ s, pack[*, *] @ s",
                      "pull[s, e] after tell[got[0, 0]] @ s, pack[*, *] @ s")
    error = the_error(refused, "a tensor element (a device value) may be read only in the slices")
    assert at(error) == where(refused, "got[0, 0]")


def test_a_range_may_not_start_at_a_tensor_element():
    refused = changed("recv[e, s, 0 : +got[e, s], :]", "recv[e, s, got[e, s] : +1, :]")
    error = the_error(refused, "a range's start may not read a tensor element")
    assert at(error) == where(refused, "recv[e, s, got")


def test_gathered_reads_in_one_region_have_one_length():
    refused = changed("slot[t*BT : +BT, k], :]", "slot[t*BT : +2, k], :]")
    error = the_error(refused, "the gathered reads in this region have different lengths")
    assert at(error) == where(refused, "send[ids[")


# ---- declarations ----------------------------------------------------------------------------------

def test_cap_bounds_integer_tensors_only():
    refused = changed("in    X     : f32[T, H]", "in    X     : f32[T, H] cap C")
    error = the_error(refused, "`cap` bounds counts: 'X' must be an integer tensor")
    assert at(error) == (5, refused.splitlines()[4].index("cap C") + 5)  # at the bound


def test_upto_needs_a_count_shaped_like_the_leading_dimensions():
    refused = changed("f32[E, world, C, H] upto count", "f32[world, E, C, H] upto count")
    error = the_error(refused, "'recv' [world, E, C, H] cannot be valid up to 'count' [E, world]")
    assert at(error) == (7, refused.splitlines()[6].index("upto count") + 6)  # at the count


def test_a_chunk_copies_into_a_capped_tensor_only_from_the_same_cap():
    refused = changed("symm  sent  : i32[NE] cap C", "symm  sent  : i32[NE]")
    error = the_error(refused, "'got' holds counts up to C: a chunk may copy into it only from a tensor with the")
    assert at(error) == where(refused, "chunk tell")


def test_routing_is_a_whole_store():
    refused = changed("sent = histogram(ids, NE)", "sent = histogram(ids, NE) + 1")
    error = the_error(refused, "histogram() and arrival() are whole stores")
    assert at(error) == where(refused, "histogram(ids, NE) + 1")



def test_routing_is_not_a_value_named_in_a_block():
    refused = changed("tile  route: slot = arrival(ids, NE); sent = histogram(ids, NE)",
                      "tile  route:\n    h = histogram(ids, NE)\n    sent = h\n    slot = arrival(ids, NE)")
    the_error(refused, "histogram() and arrival() are whole stores")

# ---- valid rows --------------------------------------------------------------------------------------

GROUPED = textwrap.dedent("""\
    program grouped
    param T, D, N, K, E, C
    const BM = 16, BN = 16
    in    A     : f32[E, C, D]
    in    ids   : i32[T, K]
    in    B     : f32[E, D, N]
    out   G     : f32[E, C, N] upto count
    local slot  : i32[T, K]
    out   count : i32[E] cap C
    tile  route: slot = arrival(ids, E); count = histogram(ids, E)
    tile  mm[e in E, m in cdiv(C, BM), n in cdiv(N, BN)]: G[e, m*BM : +BM, n*BN : +BN] = A[e, m*BM : +BM, :] @ B[e, :, n*BN : +BN]
    mm[e, m, n] after route
""")


def test_a_tile_past_the_valid_rows_reads_its_count_so_must_wait_for_it():
    run(GROUPED, until="check")
    refused = GROUPED.replace("mm[e, m, n] after route\n", "")
    error = the_error(refused, "race: tile 'mm' reads count while tile 'route' may still write it")
    assert at(error) == where(refused, "G[e, m*BM")
    schedule = run(GROUPED, until="check").schedule
    condition = runs_when(schedule, schedule.families["mm"])
    e, m = ir.index_symbol("e"), ir.index_symbol("m")
    assert condition == sympy.Lt(m * ir.size_symbol("BM"), ir.element("count")(ir.RANK, e))


# ---- the MoE programs at sizes richer than the default ones ---------------------------------------

RICH = {
    "moe_dispatch": ({"T": 9, "H": 5, "K": 3, "E": 2, "C": 7}, {"BT": 4, "BH": 2, "BR": 4}),
    "moe_combine": ({"T": 9, "H": 5, "K": 3, "E": 2, "C": 7}, {"BT": 4, "BH": 2, "BR": 4}),
    "ag_group_gemm": ({"T": 9, "D": 5, "N": 5, "K": 3, "E": 2, "C": 5}, {"BM": 2, "BN": 2, "BT": 4, "BR": 4}),
    "moe_gemm_rs": ({"T": 9, "I": 5, "N": 5, "K": 3, "E": 2, "C": 5}, {"BM": 2, "BN": 2, "BT": 4, "BR": 4}),
}


@pytest.mark.parametrize("name", sorted(RICH))
@pytest.mark.parametrize("world", [2, 3])
def test_moe_program_has_no_race_or_deadlock_with_several_instances_along_every_index(name, world):
    schedule = run(ROOT / "programs" / f"{name}.tds", until="check").schedule
    params, consts = RICH[name]
    concrete = instantiate(schedule, world, {**params, **consts})
    for family in schedule.families.values():
        extents = concrete.extents[family.name][0]
        assert all(n >= 2 for n, (_, e) in zip(extents, family.indices) if e.free_symbols - {ir.WORLD}), \
            (family.name, extents)
    found = [d for _, d in _concrete_findings(concrete) if d.severity == "error"]
    assert not found, [d.message for d in found]


@pytest.mark.parametrize("name", ["ag_group_gemm", "moe_gemm_rs", "group_gemm"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_default_sizes_of_the_grouped_gemms_are_quick_to_check(name, world):
    # the sizes cut to the launch conditions reach two instances per index at world 2 only with 66 experts
    # (4000 instances, 2 s to check); the params' units reach them with 2 experts
    schedule = run(ROOT / "programs" / f"{name}.tds", until="check").schedule
    sizes = default_sizes(schedule, world)
    concrete = instantiate(schedule, world, sizes)
    assert len(concrete.instances) <= MAX_INSTANCES // QUICK_SHARE, sizes
    for family in schedule.families.values():
        extents = concrete.extents[family.name][0]
        assert all(n >= 2 for n, (_, e) in zip(extents, family.indices) if e.free_symbols - {ir.WORLD}), \
            (family.name, extents)


# ---- an arrival numbered in parts (one route tile per block of rows) ---------------------------------

PARTS = changed("tile  route: slot = arrival(ids, NE); sent = histogram(ids, NE)\n",
                "tile  tally: sent = histogram(ids, NE)\n"
                "tile  route[b in cdiv(T, BR)]: slot[b*BR : +BR, :] = arrival(ids, NE)[b*BR : +BR, :]\n",
                changed("const BT = 4\n", "const BT = 4, BR = 8\n").replace(
                    "pack[t, k] after route\n", "pack[t, k] after route[(t*BT) / BR]\n").replace(
                    "tell[d] after route\n", "tell[d] after tally\n"))


def test_parts_of_one_arrival_number_each_id_once():
    assert run(PARTS, until="check").warnings == []


def test_parts_of_different_arrivals_do_not():
    """Each block numbered on its own: two blocks' rows of one expert get the same slots."""
    refused = changed("arrival(ids, NE)[b*BR : +BR, :]", "arrival(ids[b*BR : +BR, :], NE)", PARTS)
    error = the_error(refused, "race: instances of tile 'pack' both write the same elements of send")
    assert at(error) == where(refused, "send[ids[")


def test_a_write_must_wait_for_the_part_that_numbers_its_ids():
    refused = changed("pack[t, k] after route[(t*BT) / BR]", "pack[t, k] after route[0]", PARTS)
    the_error(refused, "race: tile 'pack' reads slot while tile 'route' may still write it")


def test_only_arrival_is_taken_in_parts():
    refused = changed("tile  tally: sent = histogram(ids, NE)", "tile  tally: sent = histogram(ids, NE)[0 : +NE]",
                      PARTS)
    error = the_error(refused, "only arrival() may be sliced")
    assert at(error) == where(refused, "histogram(ids, NE)[")


def test_a_part_of_an_arrival_keeps_its_dimensions():
    refused = changed("slot[b*BR : +BR, :] = arrival(ids, NE)[b*BR : +BR, :]",
                      "slot[b*BR : +BR, 0] = arrival(ids, NE)[b*BR : +BR, 0]", PARTS)
    the_error(refused, "a part of an arrival keeps its dimensions")


def test_the_reference_stores_the_box_of_the_whole_numbering():
    import torch

    from tiledsl.tools.reference import Reference
    schedule = run(PARTS, until="check").schedule
    world, T, K, E = 2, 10, 2, 2  # BR = 8: rows 8 and 9 are numbered after the 16 ids before them
    generator = torch.Generator().manual_seed(3)
    ids = [torch.rand(T, E * world, generator=generator).argsort(dim=1)[:, :K].to(torch.int32) for _ in range(world)]
    got = Reference(schedule, world, {"T": T, "H": 3, "K": K, "E": E, "C": T * K}).run(
        [{"X": torch.randn(T, 3, generator=generator), "ids": i} for i in ids])
    for rank in range(world):
        seen, want = [0] * (E * world), []
        for group in ids[rank].flatten().tolist():
            want.append(seen[group])
            seen[group] += 1
        assert got[rank]["slot"].flatten().tolist() == want
