"""The one meaning of a schedule. The checker proves it, the code generator prints it and the
reference runs it; none of them has rules of its own about which instances exist, in which order a
rank runs them, or what an edge waits for.

- **Instances**: a family has one instance per point of its index space on every rank its `if` holds
  on (`tile red[i in N/B] if rank == 0`), none on the others; the index space, and so each rank's
  signal slots, are the same everywhere.
- **Family sequence**: a rank runs its families one after another, producers before consumers (edges
  from a family to itself aside, on its own rank or another), ties in source order. On a GPU the
  families that share programs run in this order and the others run beside them; emulated, every
  family runs in it.
- **Order**: a family runs its instances sorted by its order keys: the program's `order` keys, then the
  code generator's grouping of product tiles (unless the family waits on itself), then the index.
- **Edges**: a consumer instance waits on the producer instances its edge names. An index or rank that
  falls outside the producer family names no instance there: **no wait**, in the checker, the
  kernel (a guarded wait) and the reference alike.
- **Steps**: a tile with a loop runs as a chain of nodes: its entry (its edges' waits, what it does
  before the loop), then one node per step of the loop (that step's `wait`s, then what it reads), then
  its exit (what it does after the loop; its signal follows). A `wait` in the loop names, at each step,
  the producer instance its index map gives for that step's value of the loop variable. Every other
  instance is one node. Waits point at a producer's exit.
- **Deadlock**: the waits plus each rank's serial order (its families in sequence, each in its order,
  one instance after another, each instance's nodes in turn) have a cycle. That is the most serial way
  to run the schedule, the emulator's. A family may wait on its own instances on other ranks (a ring:
  `step[t] after step[t - 1] @ ((rank - 1) mod world)`): the cycle search runs over every rank's
  instances at once, each rank in its own order, so such an edge is proved like any other.
  The checker proves this at a few sizes (bounded, not for every size); a family that waits on itself
  also alone at sizes with up to check.WIDE_INSTANCES of its instances, where an `order` whose keys
  repeat every `world` instances first puts a waiter before what it waits on (seed 4963).
  Why the persistent kernel cannot deadlock where this graph has no cycle: a program spinning on a
  wait holds every instance queued behind it, and the kernel's programs each run a subsequence of their
  rank's serial order (program p of P takes slots p, p + P, ... of its family's order, shared programs
  take their families in sequence); all of them are resident. Take a topological order of the graph:
  the first unfinished instance in it has its producers done (they come before it) and is at the head
  of its program's queue (what its program runs before it comes before it in the serial order, so in
  the topological order): it runs. A rank's copy-engine chunks are one more such queue: its
  communication stream runs them in their families' sequence and order, each after its waits on
  counts of the tiles it names (on its own rank or, counted into its memory, on another), so the
  same argument covers it. Emulated, each family is one program in turn. The queues are
  modelled and run to the end in tests/codegen/test_residency.py.
- **Race**: two overlapping accesses to one rank's copy of a tensor, at least one a write, that no path
  of waits orders (program order does not count: a family's instances run on many programs at once).
- **Device values**: a size or index may read a tensor element on the device (`+got[e, s]`,
  `send[ids[t*BT : +BT, k], slot[...], :]`); no size ever reaches the host. Instances and waits never
  depend on them; the regions are proved **at capacity**: a size reading a `cap`ped count at its cap
  (sizes only grow with counts), a point or rank read through a gathered index anywhere in its
  dimension. So every region a call can touch lies inside the one proved. Writes through an id and
  its `arrival` (the same elements of both) never write one place twice, so two such writes whose
  index elements differ do not race. At run time an index outside its dimension skips its row, and a
  count above its cap is stored as the cap; both raise an error after the call (CapacityExceeded,
  IndexOutOfRange), in the kernel and the reference alike.
- **Valid rows**: past `upto count`, a tensor's elements are unspecified; an instance whose writes all
  fall there does nothing (kernel and reference skip it), and results there are not compared.
- **Topology**: ranks are numbered node by node; `node` and `local_rank` stand for `ir.RANK_PARTS` of
  the rank, wherever an expression is evaluated. A program that names the topology is proved at
  several nodes (`topologies`); how far each family's signal must reach follows from its waits there
  (`notify_reach`).

Expressions are compiled once to Python lambdas with integer semantics (`//`, `%`): exact divisions
stay exact and `floor`/`cdiv` of indices floor, as they do in the generated kernels."""
from __future__ import annotations

import enum
import functools
import itertools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import networkx as nx
import sympy

from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code
from tiledsl.topology import Topology

WORLDS = (2, 3, 4)    # ranks of the one node every schedule is proved at
NODE_TOPOLOGIES = ((2, 1), (2, 2), (3, 1))  # (nodes, ranks a node) a program that names the topology is proved at
MAX_INSTANCES = 5000  # default_sizes keeps the instances of all ranks together under this
MAX_MULTIPLE = 64     # default_sizes tries params = world * L * k for k up to this
QUICK_SHARE = 4       # default_sizes takes the first sizes whose instances stay under this share of the bound
GROUP_M = 8           # rows of product tiles taken together: 82% -> 99% of cuBLAS at 8192x2048x28672 (H200)


def per_schedule(fn: Callable) -> Callable:
    """`fn(schedule, *args)` memoised for as long as the schedule lives: a Schedule holds dicts, so it
    cannot key an lru_cache, and the checker asks the same questions of one schedule many times."""
    memo: dict = {}

    @functools.wraps(fn)
    def memoised(schedule: ir.Schedule, *args):
        key = (id(schedule), args)
        found = memo.get(key)
        if found is not None and found[0]() is schedule:
            return found[1]
        value = fn(schedule, *args)
        memo[key] = (weakref.ref(schedule, lambda _, key=key: memo.pop(key, None)), value)
        return value
    return memoised


@functools.lru_cache(maxsize=4096)
def compile_exprs(exprs: tuple, symbols: tuple) -> Callable[..., tuple]:
    """A function of `symbols` (positionally) that returns the integer values of `exprs` as a tuple.
    The role of `sympy.lambdify`, with `//` and `%` where lambdify would divide floats."""
    names = {sym.name: f"_a{n}" for n, sym in enumerate(symbols)}
    # node and local_rank are evaluated as what they stand for, from the rank and local_world
    exprs = tuple(sympy.sympify(e).subs(ir.RANK_PARTS) if sympy.sympify(e).free_symbols & set(ir.RANK_PARTS) else e
                  for e in exprs)
    body = "".join(code(e, kernel=False, names=names, strict=True) + ", " for e in exprs)
    return eval(f"lambda {', '.join(names.values())}: ({body})", {"min": min, "max": max})


def size_symbols(schedule: ir.Schedule) -> tuple[sympy.Symbol, ...]:
    """Params, consts and world, and nodes and local_world where the program names the topology: the
    leading arguments of every compiled expression, in this order (`size_values` gives their values)."""
    return _size_symbols(tuple(schedule.params), tuple(schedule.consts), schedule.spans_nodes)


@functools.lru_cache(maxsize=256)
def _size_symbols(params: tuple, consts: tuple, spans_nodes: bool) -> tuple[sympy.Symbol, ...]:
    topology = (ir.NODES, ir.LOCAL_WORLD) if spans_nodes else ()
    return tuple(ir.size_symbol(n) for n in (*params, *consts)) + (ir.WORLD, *topology)


def size_values(schedule: ir.Schedule, world: int, sizes: dict[str, int], nodes: int = 1) -> tuple[int, ...]:
    """The values of `size_symbols`: params from `sizes` (consts there override the program's)."""
    return _size_values(schedule, world, sizes, nodes)


def topologies(schedule: ir.Schedule) -> tuple[Topology, ...]:
    """Where the checker proves a schedule: one node of 2, 3 and 4 ranks; a program that names the
    topology also at 2 nodes of 1 and of 2 ranks (the paths within a node beside those across) and 3
    nodes of 1 (`mod nodes` arithmetic that two nodes would hide). Three nodes of two ranks would be
    more thorough and cost the checker four times the instances of 3 x 1; tests run it separately."""
    one = tuple(Topology.one_node(w) for w in WORLDS)
    return one + (tuple(Topology(n, local) for n, local in NODE_TOPOLOGIES) if schedule.spans_nodes else ())


# ---- sizes ---------------------------------------------------------------------------------------

def default_sizes(schedule: ir.Schedule, world: int, max_instances: int = MAX_INSTANCES,
                  nodes: int = 1) -> dict[str, int]:
    """Small values for the program's params at `world` ranks in `nodes` nodes, for checking and
    emulation (`_small_sizes`), with every capacity at the worst case of the rows routed into it
    (`_worst_case_capacities`)."""
    small = _small_sizes(schedule, world, max_instances, nodes)
    return _worst_case_capacities(schedule, world, small, max_instances, nodes)


def _worst_case_capacities(schedule: ir.Schedule, world: int, sizes: dict[str, int], max_instances: int,
                           nodes: int = 1) -> dict:
    """`sizes` with each capacity param that caps a histogram raised, where it is lower, to the most rows
    any routing puts in one bin: the rows of the routed ids where a row's ids can be distinct (top-k),
    else all of them (DeepEP's num_worst_tokens). Random routings, as `tiledsl run` and the tests draw
    them, then never exceed capacity at the default sizes. Unchanged where that breaks a launch condition
    or the instance bound."""
    topology = Topology.of(world, nodes)
    values = {ir.size_symbol(n): v for n, v in {**schedule.consts, **sizes}.items()} | {
        ir.WORLD: world, ir.NODES: topology.nodes, ir.LOCAL_WORLD: topology.local_world}
    raised = dict(sizes)
    for family in schedule.families.values():
        for store in family.stores:
            route, cap = store.value, schedule.tensors[store.target.tensor].cap
            if not (isinstance(route, ir.Route) and route.func == "histogram" and isinstance(cap, sympy.Symbol)
                    and cap.name in raised):
                continue
            try:
                shape = [int(e.subs(values)) for e in route.source.shape]
                bins = int(route.bins.subs(values))
            except TypeError:  # a shape that depends on an index: no single worst case
                continue
            rows = math.prod(shape[:-1]) if shape and shape[-1] <= bins else math.prod(shape)
            raised[cap.name] = max(raised[cap.name], rows)
    if raised == sizes:
        return sizes
    fits = _conditions_hold(schedule, world, raised, nodes) and \
        total_instances(schedule, world, raised, nodes) <= max_instances
    return raised if fits else sizes


def _small_sizes(schedule: ir.Schedule, world: int, max_instances: int, nodes: int = 1) -> dict[str, int]:
    """Small values for the program's params at `world` ranks in `nodes` nodes.

    Every param is set to world * L * k, with L the lcm of the consts and of the numbers in the launch
    conditions, and k = 1, 2, ... the smallest multiple for which every `launch_conditions` holds with
    the consts at their values, every index extent that depends on a param is at least 2, and all ranks
    together have at most `max_instances` instances. Where no k up to MAX_MULTIPLE gives that, L is cut
    to what the conditions alone need (each param's own, where they differ), then each param gets a unit
    of its own (`_units`: what it is divided by, so that batch and head counts stay small beside a
    sequence length that blocks divide), and then two instances per index are no longer insisted on.
    Sizes with two instances per index are taken from the first of those bases where they keep all
    instances under max_instances / QUICK_SHARE (quick to check and emulate), else from the base where
    they have the fewest.
    Raises ValueError when nothing meets the conditions within the bound (a condition on consts and
    world alone that fails at this world, say, or an index space that is large at any valid size)."""
    consts = {ir.size_symbol(name): value for name, value in schedule.consts.items()}
    numbers = [(c.holds.free_symbols, [int(a) for a in c.holds.subs(consts).atoms(sympy.Integer) if a > 0])
               for c in launch_conditions(schedule)]
    every = math.lcm(1, *(a for _, found in numbers for a in found))
    # per param, the lcm of the numbers in the conditions on it: `require DM % 8 == 0` makes DM's
    # multiples of 8 and leaves the other params' alone
    needed = {p: math.lcm(1, *(a for symbols, found in numbers if ir.size_symbol(p) in symbols for a in found))
              for p in schedule.params}
    cut = world * every if len(set(needed.values())) <= 1 else {p: world * n for p, n in needed.items()}
    bases = [world * math.lcm(every, *schedule.consts.values())]
    bases += [cut] if cut != bases[0] else []
    units = _units(schedule, world)
    params, fallback = set(schedule.params), None
    # per family, which of its indices have an extent that a param sets: those must reach 2
    sized = {name: [bool({str(s) for s in sympy.sympify(e).free_symbols} & params) for _, e in family.indices]
             for name, family in schedule.families.items()}
    found = []  # per base, its first multiple with two instances per index: (instances, sizes)
    for base in [*bases, units] if params else [0]:
        for k in range(1, MAX_MULTIPLE + 1 if params else 2):
            sizes = {p: (base[p] if isinstance(base, dict) else base) * k for p in schedule.params}
            if not _conditions_hold(schedule, world, sizes, nodes):
                continue
            total, too_few = 0, False
            for family in schedule.families.values():
                for rank in range(world):
                    extents = _extents(schedule, family, world, sizes, rank, nodes)
                    total += math.prod(extents)
                    too_few |= runs_on(schedule, family, world, sizes, rank, nodes) and any(
                        n < 2 and by_param for n, by_param in zip(extents, sized[family.name]))
            if total > max_instances:
                break  # larger multiples only have more instances
            if not too_few:
                found.append((total, sizes))
                break
            if fallback is None:
                fallback = sizes
        if found and found[-1][0] <= max_instances // QUICK_SHARE:
            return found[-1][1]
    if found:
        # no base's sizes are quick to check: the fewest instances (the cut base reaches two instances per
        # index in ag_group_gemm at world 2 only at 66 experts and 4000 instances, the units at 2 and 56)
        return min(found, key=lambda f: f[0])[1]
    if fallback is None:
        raise ValueError(f"no params meet the launch conditions at world {world} with at most "
                         f"{max_instances} instances")
    return fallback


def total_instances(schedule, world: int, sizes: dict, nodes: int = 1) -> int:
    """All ranks' instances together at `sizes`, counted from the families' extents (nothing instantiated)."""
    return sum(math.prod(_extents(schedule, f, world, sizes, rank, nodes)) for f in schedule.families.values()
               for rank in range(world))


@per_schedule
def _units(schedule: ir.Schedule, world: int) -> dict[str, int]:
    """Per param, what its sizes are multiples of: the lcm of the numbers (consts and world at their
    values) that it is divided by anywhere in the schedule, and of those in the launch conditions on
    it; 1 for a param nothing divides (a batch, a head count)."""
    units = dict.fromkeys(schedule.params, 1)
    divisions, conditions = _divisions(schedule)
    for params, by in divisions:
        by = by.subs(ir.WORLD, world)
        if by.is_Integer and int(by) > 1:
            for p in params:
                units[p] = math.lcm(units[p], int(by))
    for params, holds in conditions:
        numbers = [int(a) for a in holds.subs(ir.WORLD, world).atoms(sympy.Integer) if a > 1]
        for p in params:
            units[p] = math.lcm(units[p], *numbers)
    return units


@per_schedule
def _divisions(schedule: ir.Schedule) -> tuple[set, list]:
    """What `_units` reads, found once per schedule with the consts at their values: (the params divided,
    the divisor) for every division and `mod` whose divisor is a number once the world is known, and
    (the params named, the condition) for every launch condition."""
    consts = {ir.size_symbol(name): value for name, value in schedule.consts.items()}
    symbols = {ir.size_symbol(p): p for p in schedule.params}

    def params_of(expr) -> tuple[str, ...]:
        return tuple(sorted(symbols[s] for s in sympy.sympify(expr).free_symbols & set(symbols)))

    exprs = [d for t in schedule.tensors.values() for d in t.shape]
    exprs += [e for f in schedule.families.values() for _, e in f.indices] + [v for _, v in schedule.lets]
    exprs += [e for f in schedule.families.values() for r in f.reads + f.writes for d in r.dims
              for e in (d.start, d.size)]
    divisions = set()
    for expr in exprs + [c.holds for c in launch_conditions(schedule)]:
        for node in sympy.preorder_traversal(sympy.sympify(expr)):
            if isinstance(node, sympy.Mod):
                divided, by = node.args
            elif node.is_Mul:
                divided, by = node.as_numer_denom()
            else:
                continue
            by = sympy.sympify(by).subs(consts)
            if params_of(divided) and by.free_symbols <= {ir.WORLD}:
                divisions.add((params_of(divided), by))
    conditions = [(params_of(c.holds), c.holds.subs(consts)) for c in launch_conditions(schedule)]
    return divisions, [(params, holds) for params, holds in conditions if params]


def ragged_sizes(schedule: ir.Schedule, world: int, max_instances: int = MAX_INSTANCES,
                 nodes: int = 1, sizes: dict[str, int] | None = None) -> dict[str, int] | None:
    """`default_sizes` with every param moved off the multiples of the consts: a param no launch
    condition binds by 1 + n (the n-th such param), so that sizes differ from one another; a bound one
    by the smallest step its conditions allow (N even: N + 2). Last tiles are partial and index maps
    meet the remainders that multiples hide; the checker proves the schedule there too. None where
    nothing can move or the result breaks a condition or the instance bound. `sizes`: default_sizes'
    answer, if known."""
    sizes = sizes or default_sizes(schedule, world, max_instances, nodes)
    bound = {s.name for c in launch_conditions(schedule) for s in c.holds.free_symbols}
    moved, free = dict(sizes), 0
    for p in schedule.params:
        if p not in bound:
            moved[p] = sizes[p] + 1 + free
            free += 1
            continue
        # the conditions that name p repeat with a period dividing world times the lcm of their consts
        # and numbers (M / world a multiple of BM: world * BM); the other conditions hold already, and
        # consts no condition on p names cannot matter (flash_decode's SMS = 132 and MINKEYS = 512 made
        # the search 33792 steps long)
        naming = [c.holds for c in launch_conditions(schedule) if p in {x.name for x in c.holds.free_symbols}]
        named = {x.name for h in naming for x in h.free_symbols}
        numbers = [int(a) for h in naming for a in h.atoms(sympy.Integer) if a > 1]
        limit = 2 * world * math.lcm(1, *(v for k, v in schedule.consts.items() if k in named), *numbers)
        step = next((d for d in range(1, limit + 1)
                     if _conditions_hold(schedule, world, {**sizes, p: sizes[p] + d}, nodes)), None)
        if step is not None:
            moved[p] = sizes[p] + step
    if moved == sizes or not _conditions_hold(schedule, world, moved, nodes):
        return None
    total = sum(math.prod(_extents(schedule, family, world, moved, rank, nodes))
                for family in schedule.families.values() for rank in range(world))
    return moved if total <= max_instances else None


def small_sizes(schedule: ir.Schedule, world: int, max_instances: int = MAX_INSTANCES,
                nodes: int = 1, sizes: dict[str, int] | None = None) -> dict[str, int] | None:
    """`default_sizes` with every param at the smallest value its launch conditions allow (1 where none
    binds it): sizes below the tiles, where one tile reads the rows of several chunks (a schedule's
    waits there can miss a chunk that multiples and their neighbours never show: a generated
    all-gather, seed 4327 of tests/schedule/gen_schedules.py). None where nothing moves or the sizes
    break a condition."""
    sizes = sizes or default_sizes(schedule, world, max_instances, nodes)
    small = dict(sizes)
    for p in schedule.params:
        naming = [c.holds for c in launch_conditions(schedule) if p in {x.name for x in c.holds.free_symbols}]
        named = {x.name for h in naming for x in h.free_symbols}
        numbers = [int(a) for h in naming for a in h.atoms(sympy.Integer) if a > 1]
        limit = 2 * world * math.lcm(1, *(v for k, v in schedule.consts.items() if k in named), *numbers)
        small[p] = next((v for v in range(1, min(limit, sizes[p]) + 1)
                         if _conditions_hold(schedule, world, {**sizes, p: v}, nodes)), sizes[p])
    if small == sizes or not _conditions_hold(schedule, world, small, nodes):
        return None
    return small


def scaled_sizes(schedule: ir.Schedule, family: ir.Family, world: int, sizes: dict[str, int], k: int,
                 nodes: int = 1) -> tuple[dict[str, int] | None, int]:
    """`sizes` with every param that sets one of the family's extents multiplied by `k`, and the
    family's instances there (all ranks): more than two per index, for a family that waits on itself
    (its order's keys may repeat only every `world` instances: `order seed by (i - rank) mod world`
    puts seed[3] before seed[1] at four instances, seed 4963 of tests/schedule/gen_schedules.py). The
    sizes are None where they break a launch condition or no param sets an extent (the instances are
    the same at every size)."""
    scaled = [p for p in schedule.params
              if any(ir.size_symbol(p) in sympy.sympify(e).free_symbols for _, e in family.indices)]
    wider = {**sizes, **{p: sizes[p] * k for p in scaled}}
    count = sum(math.prod(_extents(schedule, family, world, wider, rank, nodes)) for rank in range(world))
    if not scaled or not _conditions_hold(schedule, world, wider, nodes):
        return None, count
    return wider, count


def _size_values(schedule: ir.Schedule, world: int, sizes: dict[str, int], nodes: int = 1) -> tuple[int, ...]:
    missing = [p for p in schedule.params if p not in sizes]
    if missing:
        raise ValueError(f"no value for param {', '.join(missing)}")
    topology = Topology.of(world, nodes)
    if topology.nodes > 1 and not schedule.spans_nodes:
        raise ValueError(f"{schedule.name} names no topology: it runs within one node, not on {topology}")
    extra = (topology.nodes, topology.local_world) if schedule.spans_nodes else ()
    return (*(sizes[p] for p in schedule.params), *(sizes.get(c, v) for c, v in schedule.consts.items()), world,
            *extra)


def launch_conditions(schedule: ir.Schedule) -> tuple[ir.Condition, ...]:
    """The program's launch conditions and what the generated kernel needs of the sizes beside them
    (`Schedule.kernel_conditions`: rows of a multiple of 16 bytes for the tensors it reads through TMA
    descriptors, which the pipeline's schedule stage hands down from codegen/tma.py). The sizes chosen
    for checking, emulation and GPU runs meet both."""
    return schedule.conditions + schedule.kernel_conditions


def _conditions_hold(schedule: ir.Schedule, world: int, sizes: dict[str, int], nodes: int = 1) -> bool:
    if not launch_conditions(schedule):
        return True
    return all(_compiled_conditions(schedule)(*_size_values(schedule, world, sizes, nodes)))


@per_schedule
def _compiled_conditions(schedule: ir.Schedule) -> Callable[..., tuple]:
    return compile_exprs(tuple(c.holds for c in launch_conditions(schedule)), size_symbols(schedule))


def _extents(schedule, family: ir.Family, world: int, sizes: dict[str, int], rank: int,
             nodes: int = 1) -> tuple[int, ...]:
    """The family's index extents on `rank`: all 0 on a rank its `if` excludes (no instance there)."""
    *extents, runs = _compiled_extents(schedule, family.name)(*_size_values(schedule, world, sizes, nodes), rank)
    return tuple(max(0, n) if runs else 0 for n in extents)


def runs_on(schedule: ir.Schedule, family: ir.Family, world: int, sizes: dict[str, int], rank: int,
            nodes: int = 1) -> bool:
    """Whether the family has instances on `rank` as far as its `if` goes (its extents may still be 0)."""
    return bool(_compiled_extents(schedule, family.name)(*_size_values(schedule, world, sizes, nodes), rank)[-1])


@per_schedule
def _compiled_extents(schedule: ir.Schedule, family: str) -> Callable[..., tuple]:
    """The extents, then whether the family runs on the rank (its `if`)."""
    indices = schedule.families[family].indices
    return compile_exprs((*(e for _, e in indices), schedule.families[family].runs_on),
                         (*size_symbols(schedule), ir.RANK))


# ---- the symbolic meaning: sequence, order, edges ------------------------------------------------

class FamilyCycleError(ValueError):
    """Families that wait on each other: no sequence runs them one after another."""

    def __init__(self, families: tuple[str, ...], edges: tuple[int, ...]):
        self.families, self.edges = families, edges
        super().__init__(f"families {', '.join(families)} wait on each other")


def family_sequence(schedule: ir.Schedule) -> tuple[str, ...]:
    """The order in which a rank runs its families: producers first, ties in source order."""
    graph = nx.DiGraph()
    graph.add_nodes_from(schedule.families)
    for number, edge in enumerate(schedule.edges):
        if edge.producer != edge.consumer:
            graph.add_edge(edge.producer, edge.consumer, edge=number)
    position = {name: n for n, name in enumerate(schedule.families)}
    try:
        return tuple(nx.lexicographical_topological_sort(graph, key=position.get))
    except nx.NetworkXUnfeasible:
        arcs = nx.find_cycle(graph)
        raise FamilyCycleError(tuple(a for a, _ in arcs), tuple(graph.edges[a, b]["edge"] for a, b in arcs)) from None


def runs_at(family: ir.Family, rank) -> sympy.Basic:
    """Whether `family` has instances on `rank` (an expression: a waiter's own rank, or the one an edge
    names) as its `if` says: over that rank, the sizes and the topology's sizes (`node` and
    `local_rank` as what they stand for). sympy.true for a family without an `if`."""
    if family.runs_on is sympy.true:
        return sympy.true
    return family.runs_on.subs(ir.RANK_PARTS).subs(ir.RANK, rank)


def waits_on_itself(schedule: ir.Schedule, family: ir.Family) -> bool:
    return any(e.producer == e.consumer == family.name for e in schedule.edges)


def is_product(family: ir.Family) -> bool:
    return family.kind is ir.Kind.TILE and any(_has_matmul(s.value) for s in family.stores)


def _has_matmul(value) -> bool:
    if isinstance(value, ir.MatMul):
        return True
    return isinstance(value, ir.Map) and any(_has_matmul(a) for a in value.args)


def grouped(schedule: ir.Schedule, family: ir.Family) -> bool:
    """A product whose output tiles step along rows and columns by two of its indices takes its tiles
    GROUP_M rows at a time (operands reused through L2), within the program's own order. Not where the
    family waits on itself: its chain is proved in the order the program gave."""
    return is_product(family) and _tile_axes(family) is not None and not waits_on_itself(schedule, family)


def _tile_axes(family: ir.Family) -> tuple[sympy.Symbol, sympy.Symbol] | None:
    """The indices that step a product's output along its rows and along its columns: in the start of
    each of the last two dimensions its product stores, the index declared last (`G[e, m*BM : +BM,
    n*BN : +BN]`: m and n, e a batch, an expert; `W[(d*Ms + i*BM) : +BM, ...]`: i, d a batch of row
    blocks). None where a dimension names none, or both name the same."""
    indices = [s for s, _ in family.indices]
    for store in family.stores:
        if _has_matmul(store.value) and len(store.target.dims) >= 2:
            rows, cols = ([s for s in indices if s in sympy.sympify(d.start).free_symbols]
                          for d in store.target.dims[-2:])
            if rows and cols and rows[-1] != cols[-1]:
                return rows[-1], cols[-1]
    return None


def order_keys(schedule: ir.Schedule, family: ir.Family) -> tuple[sympy.Expr, ...]:
    """What a family's instances are sorted by, over its indices, rank and world: the last keys are
    the indices themselves, so the order is total. A grouped product runs its batch indices (an
    expert, a source rank) outermost and within each the GROUP_M rows of tiles across the columns: the
    tiles on the SMs at once share one batch's operands (grouped over the experts instead, a wave of
    Mixtral's group_gemm read 8 experts' weights for one row block)."""
    indices = tuple(s for s, _ in family.indices)
    keys = tuple(family.order)
    if grouped(schedule, family):
        i, j = _tile_axes(family)
        keys += tuple(s for s in indices if s not in (i, j)) + (sympy.floor(i / GROUP_M), j)
    # a key that came before orders nothing more
    return tuple(dict.fromkeys(keys + indices))


def ordered(schedule: ir.Schedule, family: ir.Family) -> bool:
    """Whether a family runs in an order other than that of its linear instance numbers."""
    return bool(family.order) or grouped(schedule, family)


@dataclass(frozen=True)
class Target:
    """What an edge names for one consumer instance, over the consumer's indices, rank and world."""
    index: tuple[sympy.Expr | None, ...]  # per producer index; None: every value (`*`)
    rank: sympy.Expr | None               # the producer's rank; None: every rank
    exists: sympy.Expr                    # the condition under which the named instance exists
    # `@ (r for s in n)`: the rank is an expression of `s`, which runs over 0 .. n-1
    over: tuple[sympy.Symbol, sympy.Expr] | None = None


def target(schedule: ir.Schedule, edge: ir.Edge) -> Target:
    producer, consumer = schedule.families[edge.producer], schedule.families[edge.consumer]
    loop_extent = consumer.loop.extent if edge.loop is not None and consumer.loop is not None else None
    return _target(edge, producer.indices, consumer.indices, loop_extent)


@functools.lru_cache(maxsize=1024)
def _target(edge: ir.Edge, producer_indices, consumer_indices, loop_extent=None) -> Target:
    """What `edge` names, from the index spaces of its producer and consumer (proofs by sympy: once)."""
    rank = {ir.RankSet.LOCAL: ir.RANK, ir.RankSet.AT: edge.rank_expr, ir.RankSet.SET: edge.rank_expr,
            ir.RankSet.EVERY: None}[edge.ranks]
    bounds = [(i, extent) for i, (_, extent) in zip(edge.index_map, producer_indices) if i is not None]
    if edge.ranks in (ir.RankSet.AT, ir.RankSet.SET):
        bounds.append((rank, ir.WORLD))
    known = dict(consumer_indices)
    known.update({ir.RANK: ir.WORLD, ir.NODE: ir.NODES, ir.LOCAL_RANK: ir.LOCAL_WORLD})
    over = None
    if edge.ranks is ir.RankSet.SET:
        over = (edge.rank_var, edge.rank_extent)
        known[edge.rank_var] = edge.rank_extent
    if edge.loop is not None and loop_extent is not None:
        known[edge.loop] = loop_extent
    conditions = [c for i, extent in bounds for c in (sympy.Ge(i, 0), sympy.Lt(i, extent)) if not _holds(c, known)]
    return Target(edge.index_map, rank, sympy.And(*conditions), over)


def _holds(condition, known: dict) -> bool:
    """Conditions true at every size: what sympy proves (an index is >= 0), `x mod n < n`, and `x < n`
    where x is at most a consumer index (or `rank`) that runs below n; and where the topology is named,
    `x < n` for x a sum of known symbols with coefficients >= 0, at its largest (`world` being
    `nodes * local_world`): `m*local_world + local_rank < world`."""
    if condition is sympy.true:
        return True
    if isinstance(condition, sympy.StrictLessThan):
        left, right = condition.args
        if isinstance(left, sympy.Mod) and left.args[1] == right:
            return True
        if any(extent == right and (left - symbol).is_nonpositive for symbol, extent in known.items()):
            return True
        if (left.free_symbols | right.free_symbols) & set(TOPOLOGY_SYMBOLS):
            largest = largest_value(left, known)
            return largest is not None and bool((right.subs(ir.WORLD, ir.NODES * ir.LOCAL_WORLD)
                                                 - largest).expand().is_positive)
    return False


TOPOLOGY_SYMBOLS = (ir.NODE, ir.LOCAL_RANK, ir.NODES, ir.LOCAL_WORLD)


def largest_value(expr, known: dict):
    """`expr` with every known symbol at its largest value (extent - 1), where that is its largest:
    a polynomial in them (and in `a mod n`, below n) with coefficients >= 0. None otherwise."""
    known = dict(known)
    for n, mod in enumerate(sorted(expr.atoms(sympy.Mod), key=str)):
        if mod.args[1].is_positive:
            bounded = ir.index_symbol(f"tds_mod{n}")
            expr, known[bounded] = expr.subs(mod, bounded), mod.args[1]
    symbols = [s for s in known if s in expr.free_symbols]
    if not symbols or not expr.is_polynomial(*symbols):
        return None
    poly = sympy.Poly(sympy.expand(expr), *symbols)
    if not all(c.is_nonnegative for c in poly.coeffs()):
        return None
    return sympy.expand(expr.subs({s: known[s] - 1 for s in symbols}, simultaneous=True))


# ---- instances -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instance:
    """One instance of a family, run by one rank."""
    family: str
    index: tuple[int, ...]
    rank: int

    def __str__(self) -> str:
        return f"{self.family}[{', '.join(map(str, self.index))}]@rank{self.rank}"


class Access(NamedTuple):
    """A region one instance reads or writes, as a box [lo, hi) per dimension of one rank's copy. A
    named tuple: the checker makes one per instance and region, and a tuple is made fastest."""
    instance: int                          # position in Concrete.instances
    region: ir.Region
    write: bool
    copy: int                              # the rank whose copy of the tensor is accessed
    lo: tuple[int, ...]                    # clipped to the tensor's shape; empty where any lo >= hi
    hi: tuple[int, ...]
    # before clipping, per dimension: (smallest start, largest start, largest stop) over the loop variables
    reach: tuple[tuple[int, int, int], ...]
    node: int = -1                         # the node it happens at (Concrete.node_of); -1: the instance's
    # a write through an id and its arrival: (the arrival instance that routed those ids, the box of
    # index elements read); two such writes with one arrival and disjoint boxes never meet
    through: tuple | None = None

    @property
    def empty(self) -> bool:
        return any(a >= b for a, b in zip(self.lo, self.hi))


@dataclass(frozen=True)
class Wait:
    """One edge of one consumer instance: it starts (or, with `step`, that step of its loop starts)
    after every producer instance is complete."""
    consumer: int
    edge: int                   # position in schedule.edges
    producers: tuple[int, ...]  # the same tuple object for every wait on the same producer set
    step: int | None = None     # a `wait` in the consumer's loop: the step it waits at


@dataclass(frozen=True)
class Skipped:
    """A producer instance an edge names that does not exist: that part of the edge waits on nothing."""
    consumer: int
    edge: int
    index: tuple[int | None, ...]  # the producer index the map gave (None: `*`)
    rank: int                      # the producer rank it asked for
    step: int | None = None


@dataclass
class Concrete:
    schedule: ir.Schedule
    world: int
    sizes: dict[str, int]                               # params and consts
    sequence: tuple[str, ...] | None                    # family_sequence; None where families wait on each other
    instances: list[Instance]
    order: list[tuple[int, ...]]                        # per instance: its family's order keys
    ranges: dict[str, list[range]]                      # family -> per rank, its instances' positions
    extents: dict[str, list[tuple[int, ...]]]           # family -> per rank, its index extents
    shapes: dict[str, tuple[int, ...]]
    accesses: list[Access]
    waits: list[Wait]
    skipped: list[Skipped]
    nodes: int = 1                                      # the world split in this many nodes

    @property
    def topology(self) -> Topology:
        return Topology.of(self.world, self.nodes)
    # the nodes of instances with a loop, after the instances' own: (instance, step), step -1 the entry
    parts: list[tuple[int, int]] = None
    looped: dict[int, tuple[int, int]] = None           # instance with a loop -> (its entry node, its steps)

    @property
    def node_count(self) -> int:
        return len(self.instances) + len(self.parts)

    def entry(self, position: int) -> int:
        """The node an instance starts at: its own, or its entry node where it has a loop."""
        return self.looped[position][0] if position in self.looped else position

    def steps(self, position: int) -> int:
        """How many steps the instance's loop runs (0 without a loop)."""
        return self.looped[position][1] if position in self.looped else 0

    def step_node(self, position: int, step: int) -> int:
        return self.looped[position][0] + 1 + step

    def node_of(self, access_or_wait) -> int:
        """The node where an access happens or a wait holds."""
        if isinstance(access_or_wait, Wait):
            if access_or_wait.step is None:
                return self.entry(access_or_wait.consumer)
            return self.step_node(access_or_wait.consumer, access_or_wait.step)
        return access_or_wait.instance if access_or_wait.node < 0 else access_or_wait.node

    def instance_of(self, node: int) -> tuple[int, int | None]:
        """(instance, step) of a node: step None for the instance's exit (or its only node), -1 its entry."""
        if node < len(self.instances):
            return node, None
        return self.parts[node - len(self.instances)]

    def chain(self):
        """Arcs of program order inside each instance with a loop: entry, each step, exit."""
        for position, (entry, count) in self.looped.items():
            nodes = [entry] + [entry + 1 + n for n in range(count)] + [position]
            yield from zip(nodes, nodes[1:])

    def position(self, family: str, rank: int, index: Sequence[int]) -> int | None:
        """The position of an instance in `instances`, or None outside the family's index space."""
        extents = self.extents[family][rank]
        flat = 0
        for i, n in zip(index, extents):
            if not 0 <= i < n:
                return None
            flat = flat * n + i
        return self.ranges[family][rank].start + flat

    def in_order(self, family: str, rank: int) -> list[int]:
        """A family's instances on one rank, in the order it runs them."""
        return sorted(self.ranges[family][rank], key=self.order.__getitem__)

    def serial(self, rank: int) -> list[int]:
        """Every instance of one rank in the most serial order it may run them: its families in
        sequence, each in its order."""
        return [p for family in self.sequence for p in self.in_order(family, rank)]

    def runnable(self) -> list[int]:
        """Every node (an instance, or an entry, step or exit of one with a loop) of every rank in an
        order that respects the waits, each rank's serial order and each instance's own order: what the
        reference runs. Raises ValueError if there is none (a deadlock)."""
        after: list[list[int]] = [[] for _ in range(self.node_count)]
        for wait in self.waits:
            for producer in wait.producers:
                after[producer].append(self.node_of(wait))
        for first, then in self.chain():
            after[first].append(then)
        for rank in range(self.world):
            serial = self.serial(rank)
            for first, then in zip(serial, serial[1:]):
                after[first].append(self.entry(then))
        waiting = [0] * self.node_count
        for nexts in after:
            for n in nexts:
                waiting[n] += 1
        ready = [p for p, w in enumerate(waiting) if w == 0]
        for p in ready:
            for n in after[p]:
                waiting[n] -= 1
                if waiting[n] == 0:
                    ready.append(n)
        if len(ready) < self.node_count:
            raise ValueError("the schedule deadlocks at these sizes")
        return ready


def instantiate(schedule: ir.Schedule, world: int, sizes: dict[str, int], nodes: int = 1,
                accesses: bool = True, families: Sequence[str] | None = None) -> Concrete:
    """Every instance of `schedule` at `world` ranks in `nodes` nodes and these param values (consts may
    be overridden too), with its accesses as integer boxes and its waits as producer instances. `split`
    is ignored: an instance is signalled once, when all of it is complete. Where the families wait on
    each other there is no serial order (`sequence` is None), for the checker to say so.
    `families`: only these families' instances and the edges among them (numbered as in the schedule),
    each rank's serial order their part of the whole one (a rank runs a family's instances one after
    another, so what is consecutive here is consecutive there)."""
    try:
        sequence = family_sequence(schedule)
    except FamilyCycleError:
        sequence = None
    if families is not None:
        sequence = (tuple(f for f in sequence if f in families) if sequence is not None
                    else tuple(families) if len(families) == 1 else None)
    values = _size_values(schedule, world, sizes, nodes)
    all_sizes = dict(zip((*schedule.params, *schedule.consts), values))
    shapes = {name: tuple(compile_exprs(t.shape, size_symbols(schedule))(*values))
              for name, t in schedule.tensors.items()}
    done = Concrete(schedule, world, all_sizes, sequence, [], [], {}, {}, shapes, [], [], [], nodes, [], {})
    chosen = [f for f in schedule.families.values() if families is None or f.name in families]
    for family in chosen:
        _family_instances(done, family, values)
    for family in chosen:
        _family_steps(done, family, values)
    for family in chosen if accesses else ():  # without: instances and waits only
        _family_accesses(done, family, values)
    _resolve_through(done)
    for number, edge in enumerate(schedule.edges):
        if families is None or (edge.producer in families and edge.consumer in families):
            _edge_waits(done, number, edge, values)
    return done


def _family_instances(done: Concrete, family: ir.Family, values: tuple) -> None:
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices))
    keys = functools.partial(compile_exprs(order_keys(done.schedule, family), symbols), *values)
    done.ranges[family.name], done.extents[family.name] = [], []
    for rank in range(done.world):
        extents = _extents(done.schedule, family, done.world, done.sizes, rank, done.nodes)
        start = len(done.instances)
        for index in itertools.product(*map(range, extents)):
            done.instances.append(Instance(family.name, index, rank))
            done.order.append(keys(rank, *index))
        done.ranges[family.name].append(range(start, len(done.instances)))
        done.extents[family.name].append(extents)


def ragged_count(tensors: dict, region: ir.Region):
    """For a write into a tensor valid `upto` a count, with points before the ragged dimension and a
    range there: (the count's element, the range's start). None for any other region."""
    tensor = tensors[region.tensor]
    if tensor.upto is None or region.rows is not None:
        return None
    prefix = len(tensors[tensor.upto].shape)
    before, ragged = region.dims[:prefix], region.dims[prefix]
    if any(d.kept for d in before) or not ragged.kept:
        return None
    owner = region.owner if region.owner is not None else ir.RANK
    return ir.element(tensor.upto)(owner, *(d.start for d in before)), ragged.start


def runs_when(schedule: ir.Schedule, family: ir.Family):
    """When a tile instance does anything: not where each of its writes starts past the valid rows of
    a tensor declared `upto` a count (those elements are unspecified). sympy.true for every other family."""
    if family.kind is not ir.Kind.TILE:
        return sympy.true
    found = [ragged_count(schedule.tensors, r) for r in family.writes]
    if not found or None in found:
        return sympy.true
    return sympy.Or(*(sympy.Lt(start, count) for count, start in found))


ANY_RANK = ir.index_symbol("tds_any_rank")  # a rank read through a device value: each of them


def at_capacity(schedule: ir.Schedule, region: ir.Region) -> tuple[sympy.Expr | None, tuple[tuple, ...]]:
    """The region's owner and (start, size) per dimension with no device value left: every size at its
    counts' caps, a point read through a device value the whole dimension, such a rank ANY_RANK."""
    caps = {}  # a size's counts at their caps; the owner's values need none (it becomes ANY_RANK)
    for value in {v for d in region.dims for v in ir.device_values(d.size)}:
        caps[value] = schedule.tensors[ir.value_tensor(value)].cap
    owner = region.owner
    if owner is not None and ir.device_values(owner):
        owner = ANY_RANK
    shape = schedule.tensors[region.tensor].shape
    dims = []
    for n, dim in enumerate(region.dims):
        if ir.device_values(dim.start):
            dims.append((sympy.Integer(0), shape[n]))
        else:
            dims.append((dim.start, dim.size.subs(caps) if caps else dim.size))
    return owner, tuple(dims)


def _family_steps(done: Concrete, family: ir.Family, values: tuple) -> None:
    """The entry and step nodes of each instance of a tile with a loop (its exit is the instance)."""
    loop = family.loop
    if loop is None:
        return
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices))
    extent = compile_exprs((family.expand(loop.extent),), symbols)
    for rank in range(done.world):
        for position in done.ranges[family.name][rank]:
            (count,) = extent(*values, rank, *done.instances[position].index)
            done.looped[position] = (done.node_count, max(0, count))
            done.parts.append((position, -1))
            done.parts.extend((position, step) for step in range(max(0, count)))


def _family_accesses(done: Concrete, family: ir.Family, values: tuple) -> None:
    """Each region an instance reads or writes, at the node where it does (meaning's docstring), as
    the hull over the variables it runs along inside that node: a reduction's (`s` of sum(... for s in
    world)), an inner loop's of the tile's loop, whose extent may depend on the instance and step, and
    ANY_RANK, a rank read through a device value. Regions are taken at capacity (`at_capacity`)."""
    hull = [s for s, _ in family.loops] + [ANY_RANK]
    step_var = () if family.loop is None else (family.loop.var,)
    at_node = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices), *step_var)
    symbols = (*at_node, *hull)
    hull_extents = compile_exprs(tuple(family.expand(e) for _, e in family.loops) + (ir.WORLD,), at_node)
    regions = [(r, False) for r in family.reads] + [(r, True) for r in family.writes]
    keyed = _keyed_writes(done.schedule, family)
    phases = family.phases or (None,) * len(regions)
    for (region, write), phase in zip(regions, phases):
        owner, dims = at_capacity(done.schedule, region)
        exprs = tuple(family.expand(e) for e in (owner if owner is not None else ir.RANK,
                                                 *(e for d in dims for e in d)))
        evaluate = functools.partial(compile_exprs(exprs, symbols), *values)
        mentioned = set().union(*(sympy.sympify(e).free_symbols for e in exprs))
        runs_along = [s in mentioned for s in hull]  # once: sympy's == is dear, and this is per instance
        hulled = any(runs_along)
        shape = done.shapes[region.tensor]
        accesses = done.accesses
        for rank in range(done.world):
            for position in done.ranges[family.name][rank]:
                index = done.instances[position].index
                # resolved once every family's accesses are known (`_resolve_through`)
                through = (keyed[region], rank, index) if write and region in keyed else None
                if phase is ir.Phase.STEP:  # one access per step, at that step's node
                    at = [((step,), done.step_node(position, step)) for step in range(done.steps(position))]
                elif phase is ir.Phase.ENTRY:
                    at = [((0,), done.entry(position))]
                else:
                    at = [((0,) * len(step_var), -1)]
                for step, node in at:
                    if not hulled:  # one point: the common case, kept cheap (the checker runs it often)
                        owner, *dims = evaluate(rank, *index, *step, *((0,) * len(hull)))
                        accesses.append(_box(position, region, write, owner, (dims,), shape, node, through))
                        continue
                    extents = hull_extents(*values, rank, *index, *step)
                    looped = [range(max(0, n)) if along else range(1) for along, n in zip(runs_along, extents)]
                    by_copy: dict[int, list[tuple]] = {}
                    for loop_values in itertools.product(*looped):
                        owner, *dims = evaluate(rank, *index, *step, *loop_values)
                        by_copy.setdefault(owner, []).append(dims)
                    for copy, points in by_copy.items():
                        accesses.append(_box(position, region, write, copy, points, shape, node, through))


def _keyed_writes(schedule: ir.Schedule, family: ir.Family) -> dict:
    """For each gathered write of `family` through an id and its arrival (two point dimensions indexed by
    ids[x] and slot[x] for the same elements x, where a tile stored slot = arrival(ids)), a function of
    (concrete, rank, instance index) giving its `through` key, or None where no one arrival routed all
    the elements it reads. None for a tile with a loop: its writes come after the loop, and a key per
    instance is what is proved here."""
    if family.loop is not None:
        return {}
    arrivals = {(s.value.source.tensor, s.target.tensor): name for name, f in schedule.families.items()
                for s in f.stores if isinstance(s.value, ir.Route) and s.value.func == "arrival"}
    indices = {s for s, _ in family.indices}
    found = {}
    for region in family.writes:
        if region.rows is None:
            continue
        by_args = {}
        for dim in region.dims:
            for value in ir.device_values(dim.start):
                rest = dim.start - value
                if not ir.device_values(rest) and not rest.free_symbols & (indices | {ir.ROW}):
                    by_args.setdefault(value.args, []).append(ir.value_tensor(value))
        for args, tensors in by_args.items():
            pair = next(((a, b) for a in tensors for b in tensors if (a, b) in arrivals), None)
            if pair is not None and args[0] == ir.RANK:
                index_region = next(r for r in family.reads if r.tensor == pair[0] and r.rows is None
                                    and _reads_args(r, args))
                found[region] = functools.partial(_through, arrivals[pair], pair[1], index_region, family)
                break
    return found


def _resolve_through(done: "Concrete") -> None:
    routed: dict = {}  # (router family, slot tensor, rank) -> [(arrival instance, lo, hi)] of its slot stores
    sources = _arrival_sources(done.schedule)
    numbering: dict = {}  # (router family, rank, box of the ids it numbers) -> the first instance storing it
    for access in done.accesses:
        family = done.instances[access.instance].family
        if access.write:
            routed.setdefault((family, access.region.tensor, access.copy),
                              []).append((access.instance, access.lo, access.hi))
        elif access.region in sources.get(family, ()):
            # instances storing parts of one arrival (`arrival(ids, n)[b*BR : +BR, :]`) number the same ids
            # once between them: one key, so that writes through different parts are told apart too
            key = (family, done.instances[access.instance].rank, access.copy, access.lo, access.hi)
            numbering.setdefault(access.instance, numbering.setdefault(key, access.instance))
    boxes: dict = {}
    for n, access in enumerate(done.accesses):
        if access.through is not None:
            find, rank, index = access.through
            if find not in boxes:
                boxes[find] = find(done)
            through = _covering(routed, find.args[:2], rank, *boxes[find](rank, *index))
            if through is not None:
                through = (numbering.get(through[0], through[0]), *through[1:])
            done.accesses[n] = access._replace(through=through)


def _arrival_sources(schedule: ir.Schedule) -> dict[str, tuple]:
    """Per router family, the regions of ids its arrival() stores number."""
    return {name: tuple(s.value.source for s in f.stores if isinstance(s.value, ir.Route) and s.value.func == "arrival")
            for name, f in schedule.families.items()}


def _reads_args(region: ir.Region, args) -> bool:
    """Whether `region` is the index region whose elements args (owner, *index over ROW) read."""
    kept = [d for d in region.dims if d.kept]
    return len(region.dims) == len(args) - 1 and len(kept) == 1 and all(
        sympy.simplify(a - (d.start + ir.ROW if d.kept else d.start)) == 0 for a, d in zip(args[1:], region.dims))


def _through(router: str, slot: str, index_region: ir.Region, family: ir.Family, done: "Concrete"):
    """A function of (rank, *instance index) giving the box [lo, hi) of index elements a write reads."""
    owner, dims = at_capacity(done.schedule, index_region)
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in family.indices))
    values = _size_values(done.schedule, done.world, done.sizes, done.nodes)
    evaluate = functools.partial(compile_exprs(tuple(family.expand(e) for d in dims for e in d), symbols), *values)
    shape = done.shapes[index_region.tensor]

    def box(rank: int, *index) -> tuple[tuple, tuple]:
        found = evaluate(rank, *index)
        lo = tuple(max(0, a) for a in found[0::2])
        return lo, tuple(min(n, a + b) for n, a, b in zip(shape, found[0::2], found[1::2]))
    return box


def _covering(routed: dict, key: tuple, rank: int, lo: tuple, hi: tuple) -> tuple | None:
    """The `through` key of a write whose index elements are the box [lo, hi): the arrival instance on
    `rank` whose slot store covers it, or None where none does (then the write is not keyed)."""
    for instance, slot_lo, slot_hi in routed.get((*key, rank), ()):
        if all(a <= b and c <= d for a, b, c, d in zip(slot_lo, lo, hi, slot_hi)):
            return instance, lo, hi
    return None


def _box(position, region, write, copy, points, shape, node: int = -1, through=None) -> Access:
    """The hull of a region over its loop variables' values, on one copy."""
    if len(points) == 1:
        starts = points[0][0::2]
        stops = [a + n for a, n in zip(starts, points[0][1::2])]
        return Access(position, region, write, copy, tuple([a if a > 0 else 0 for a in starts]),
                      tuple(map(min, shape, stops)), tuple(zip(starts, starts, stops)), node, through)
    reach, lo, hi = [], [], []
    columns = list(zip(*points))  # per dimension, the column of its starts, then of its sizes
    for n, extent in enumerate(shape):
        starts = columns[2 * n]
        first, stop = min(starts), max(map(operator.add, starts, columns[2 * n + 1]))
        reach.append((first, max(starts), stop))
        lo.append(max(0, first))
        hi.append(min(extent, stop))
    return Access(position, region, write, copy, tuple(lo), tuple(hi), tuple(reach), node, through)


def _edge_waits(done: Concrete, number: int, edge: ir.Edge, values: tuple) -> None:
    consumer = done.schedule.families[edge.consumer]
    named = target(done.schedule, edge)
    mapped = [e for e in named.index if e is not None]
    exprs = tuple(consumer.expand(e) for e in (*mapped, named.rank if named.rank is not None else ir.RANK))
    over = () if named.over is None else (named.over[0],)
    step_var = () if edge.loop is None else (edge.loop,)
    symbols = (*size_symbols(done.schedule), ir.RANK, *(s for s, _ in consumer.indices), *over, *step_var)
    evaluate = functools.partial(compile_exprs(exprs, symbols), *values)
    steps = [()]
    if named.over is not None:
        (count,) = compile_exprs((named.over[1],), size_symbols(done.schedule))(*values)
        steps = [(v,) for v in range(count)]
    shared: dict[tuple, tuple[int, ...]] = {}
    for rank in range(done.world):
        for position in done.ranges[edge.consumer][rank]:
            instance = done.instances[position].index
            first = steps[0] if steps else (0,) * len(over)
            for step in [None] if edge.loop is None else range(done.steps(position)):
                at_step = () if step is None else (step,)
                *found, at = evaluate(rank, *instance, *first, *at_step)
                it = iter(found)
                index = tuple(None if e is None else next(it) for e in named.index)
                if named.over is not None:
                    ranks = tuple(dict.fromkeys(evaluate(rank, *instance, *v, *at_step)[-1] for v in steps))
                else:
                    ranks = range(done.world) if named.rank is None else (at,)
                key = (index, tuple(ranks))
                if key not in shared:
                    shared[key] = _producers(done, edge.producer, index, ranks)
                producers, missing = shared[key]
                if missing is not None:
                    done.skipped.append(Skipped(position, number, index, missing, step))
                if producers:
                    done.waits.append(Wait(position, number, producers, step))


def _producers(done: Concrete, family: str, index, ranks) -> tuple[tuple[int, ...], int | None]:
    """The positions of the named producer instances that exist, and a rank where a named one does not."""
    found, missing = [], None
    for rank in ranks:
        if not 0 <= rank < done.world:
            missing = rank
            continue
        extents = done.extents[family][rank]
        if any(i is not None and not 0 <= i < n for i, n in zip(index, extents)):
            missing = rank
            continue
        choices = [range(n) if i is None else (i,) for i, n in zip(index, extents)]
        found.extend(done.position(family, rank, chosen) for chosen in itertools.product(*choices))
    return tuple(found), missing


# ---- how far signals reach -------------------------------------------------------------------------

class Reach(enum.Enum):
    """The ranks that wait on a family's instances, as far as its signal must go."""
    RANK = 1   # its own rank only
    NODE = 2   # other ranks of its node (of the one node, for a program that names no topology)
    WORLD = 3  # ranks on other nodes too: there only through NVSHMEM signals


def notify_reach(schedule: ir.Schedule) -> dict[str, Reach]:
    """Each family some instance waits on, and how far its signal must reach: RANK where every edge
    on it is local, else NODE; WORLD where, at a topology of several nodes the program is proved at
    (`topologies`, at the checker's sizes), a rank waits on an instance of another node."""
    reach: dict[str, Reach] = {}
    for edge in schedule.edges:
        here = Reach.RANK if edge.ranks is ir.RankSet.LOCAL else Reach.NODE
        reach[edge.producer] = max(reach.get(edge.producer, here), here, key=lambda r: r.value)
    for topology in topologies(schedule):
        if topology.nodes == 1:
            continue
        try:
            concrete = instantiate(schedule, topology.world, default_sizes(schedule, topology.world,
                                                                           nodes=topology.nodes),
                                   topology.nodes, accesses=False)
        except (ValueError, ArithmeticError):
            continue  # sizes the launch conditions exclude here: the checker says so
        for wait in concrete.waits:
            rank = concrete.instances[wait.consumer].rank
            producer = concrete.instances[wait.producers[0]].family
            if any(not topology.same_node(rank, concrete.instances[p].rank) for p in wait.producers):
                reach[producer] = Reach.WORLD
    return reach
