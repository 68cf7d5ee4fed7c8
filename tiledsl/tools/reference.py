"""The reference result of a schedule, in plain torch on one process: every rank's tensors side by
side, every instance run one after another in an order the schedule's meaning allows
(`meaning.Concrete.runnable`: waits first, each rank in its serial order), in float64. It shares no
code with the generated kernels, so agreement between the two is evidence about both; the instances
and their order come from the same meaning the checker proved and the code generator printed."""
from __future__ import annotations

import functools

import sympy
import torch

from tiledsl.runtime import guards
from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code
from tiledsl.schedule.meaning import instantiate, runs_when
from tiledsl.schedule.wording import declared
from tiledsl.tables import FUNCTIONS


@functools.lru_cache(maxsize=4096)
def _host(expr) -> "callable":
    text = code(expr, kernel=False)
    return eval(f"lambda env: eval({text!r}, {{'min': min, 'max': max}}, env)")  # noqa: S307 - our printer's output


def evaluate(expr, env) -> int:
    return int(_host(expr)(env))


class Reference:
    def __init__(self, schedule: ir.Schedule, world: int, sizes: dict[str, int], consts: dict[str, int] | None = None,
                 dtype_map: dict[str, str] | None = None, nodes: int = 1):
        self.schedule = schedule
        self.dtype_map = dtype_map or {}  # emulation stores bf16 tensors as float32: round like it does
        self.world = world
        self.nodes = nodes
        self.sizes = {**(consts or {}), **sizes}
        self.env = {"world": world, "nodes": nodes, "local_world": world // nodes, **schedule.consts, **(consts or {}),
                    **sizes}

    def rank_env(self, rank: int) -> dict:
        """The sizes, and this rank with its node and place in the node as the IR defines them."""
        env = {**self.env, "rank": rank}
        return {**env, **{symbol.name: evaluate(value, env) for symbol, value in ir.RANK_PARTS.items()}}

    def shapes(self, rank: int = 0) -> dict[str, tuple[int, ...]]:
        env = self.rank_env(rank)
        return {n: tuple(evaluate(d, env) for d in t.shape) for n, t in self.schedule.tensors.items()}

    def run(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """inputs[r]: rank r's caller tensors (in and inout; out ones are ignored). Returns every
        rank's tensors after one call, in float64. `symm` and `local` tensors start at zero and keep
        what a call leaves in them for the next, as the program's own buffers do."""
        kept = getattr(self, "state", None)
        state = []
        for rank in range(self.world):
            tensors = {}
            for name, shape in self.shapes(rank).items():
                given = inputs[rank].get(name)
                if given is not None:
                    tensors[name] = given.double().clone()
                elif kept is not None and self.schedule.tensors[name].role in (ir.Role.SYMM, ir.Role.LOCAL):
                    tensors[name] = kept[rank][name]
                else:
                    tensors[name] = torch.zeros(shape, dtype=torch.float64)
            state.append(tensors)
        self.state = state
        # which elements of each rank's tensors some instance stores to this call: a run tells an element
        # its kernel computed as NaN from one nothing writes, which keeps the NaN it was passed
        self.written = [{n: torch.zeros(t.shape, dtype=torch.bool) for n, t in tensors.items()} for tensors in state]
        # a caller tensor read on a peer (`X@s`) is read from its copy staged at the call's start
        staged = self.schedule.staged_inputs()
        self.staged = [{n: tensors[n].clone() for n in staged} for tensors in state]
        concrete = instantiate(self.schedule, self.world, self.sizes, self.nodes)
        self.names: dict[int, dict] = {}  # an instance with a block: its names, from node to node
        for node in concrete.runnable():
            position, step = concrete.instance_of(node)
            instance = concrete.instances[position]
            family = self.schedule.families[instance.family]
            env = {**self.rank_env(instance.rank), **dict(zip(family.index_names, instance.index))}
            if not self.resolve(runs_when(self.schedule, family), env, instance.rank):
                continue  # every write past the valid rows: nothing to do, at any of its nodes
            if family.body:
                self.run_part(family, env, instance.rank, position, step)
            else:
                self.run_instance(family, env, instance.rank)
        return state

    # ---- device values ---------------------------------------------------------------------------
    def tensor(self, name: str, owner: int, peer: bool) -> torch.Tensor:
        """Rank `owner`'s copy; named as a peer's (`X@s`, even where s is this rank), a caller tensor
        is read from its copy staged at the call's start."""
        if peer and name in self.staged[owner]:
            return self.staged[owner][name]
        return self.state[owner][name]

    def element(self, value, env: dict, rank: int) -> tuple[int, tuple[int, ...]] | None:
        """A device value read from the tensor it names, with its index; None where the index lies
        outside the tensor (a gathered row past the end of its index tensor)."""
        owner = evaluate(ir.value_owner(value), env)
        index = tuple(evaluate(a, env) for a in ir.value_index(value))
        if not 0 <= owner < self.world:
            return None
        tensor = self.tensor(ir.value_tensor(value), owner, ir.value_owner(value) != ir.RANK)
        if not 0 <= owner < self.world or any(not 0 <= i < n for i, n in zip(index, tensor.shape)):
            return None
        return int(tensor[index]), index

    def count(self, value, env: dict, rank: int) -> int:
        """A capped count as sizes read it: above its cap, the cap, and an error."""
        found = self.element(value, env, rank)
        name = ir.value_tensor(value)
        cap = evaluate(self.schedule.tensors[name].cap, env)
        if found[0] > cap:
            raise guards.capacity_error(rank, name, found[1], found[0], cap, declared(self.schedule, name))
        return found[0]

    def resolve(self, expr, env: dict, rank: int) -> int | None:
        """An expression's value with its device values read; None where one lies outside its tensor."""
        expr = sympy.sympify(expr)
        values = ir.device_values(expr)
        if not values:
            return evaluate(expr, env)
        known = {}
        for value in values:
            if self.schedule.tensors[ir.value_tensor(value)].cap is not None:
                known[value] = self.count(value, env, rank)
                continue
            found = self.element(value, env, rank)
            if found is None:
                return None
            known[value] = found[0]
        return evaluate(expr.xreplace({v: sympy.Integer(n) for v, n in known.items()}), env)

    def rows(self, region: ir.Region, env: dict, rank: int):
        """A gathered region, row by row: (row, owner, the index of its box), for the rows whose index
        elements exist; an index outside the dimension it names is an error."""
        for row in range(evaluate(region.rows, env)):
            at = {**env, ir.ROW.name: row}
            owner = rank if region.owner is None else self.resolve(region.owner, at, rank)
            if owner is None:
                continue
            index, missing = [], False
            for n, dim in enumerate(region.dims):
                start = self.resolve(dim.start, at, rank)
                if start is None:
                    missing = True
                    break
                if dim.kept:
                    index.append(slice(start, start + evaluate(dim.size, at)))
                else:
                    index.append(start)
            if missing:
                continue
            self.check_index(region, index, owner, at, rank)
            yield row, owner, tuple(index)

    def check_index(self, region: ir.Region, index, owner: int, env: dict, rank: int) -> None:
        shape = self.state[0][region.tensor].shape
        for n, (dim, at) in enumerate(zip(region.dims, index)):
            if dim.kept or 0 <= at < shape[n]:
                continue
            value = next(iter(ir.device_values(dim.start)))
            _, element = self.element(value, env, rank)
            raise guards.index_error(rank, ir.value_tensor(value), element, self.element(value, env, rank)[0],
                                     shape[n], region.tensor, declared(self.schedule, ir.value_tensor(value)))
        if not 0 <= owner < self.world:
            value = next(iter(ir.device_values(region.owner)))
            found, element = self.element(value, env, rank)
            raise guards.index_error(rank, ir.value_tensor(value), element, found, self.world, f"{region.tensor}@rank",
                                     declared(self.schedule, ir.value_tensor(value)))

    def view(self, region: ir.Region, env: dict, rank: int, pad: bool = False) -> torch.Tensor:
        """The region's elements that exist (a `+n` slice is clipped at the end of its dimension), or
        with `pad`, the region at its written size with 0 past the end: what a tile's masked load
        reads."""
        if region.rows is not None:
            return self.gather(region, env, rank)
        owner, index, sizes = self.box(region, env, rank)
        tensor = self.tensor(region.tensor, owner, region.owner is not None)
        view = tensor[index]
        if not pad or tuple(view.shape) == tuple(sizes):
            return view
        padded = torch.zeros(sizes, dtype=view.dtype)
        padded[tuple(slice(0, n) for n in view.shape)] = view
        return padded

    def box(self, region: ir.Region, env: dict, rank: int) -> tuple[int, tuple, list[int]]:
        """A region that is not gathered: the rank owning it, its index (slices not yet clipped), and
        its written size along each kept dimension."""
        owner = rank if region.owner is None else self.resolve(region.owner, env, rank)
        index, sizes = [], []
        for dim in region.dims:
            start = self.resolve(dim.start, env, rank)
            if dim.kept:
                sizes.append(max(0, self.resolve(dim.size, env, rank)))
                index.append(slice(start, start + sizes[-1]))
            else:
                index.append(start)
        if any(ir.device_values(d.start) for d in region.dims if not d.kept):
            self.check_index(region, index, owner, env, rank)
        return owner, tuple(index), sizes

    def mark(self, region: ir.Region, env: dict, rank: int, common: tuple | None = None) -> None:
        """Record a store into a region that is not gathered (`common`: the part of it a chunk moves)."""
        if region.rows is not None:
            return
        owner, index, _ = self.box(region, env, rank)
        covered = self.written[owner][region.tensor][index]
        covered[common if common is not None else ...] = True

    def gather(self, region: ir.Region, env: dict, rank: int) -> torch.Tensor:
        """A gathered region's rows at their written size: 0 for a row whose index does not exist and
        past the end of a dimension, as a masked load reads them."""
        sizes = [evaluate(d.size, env) for d in region.dims if d.kept]
        out = torch.zeros([evaluate(region.rows, env), *sizes], dtype=torch.float64)
        for row, owner, index in self.rows(region, env, rank):
            part = self.tensor(region.tensor, owner, region.owner is not None)[index]
            out[(row, *(slice(0, n) for n in part.shape))] = part.double()
        return out

    def scatter(self, region: ir.Region, env: dict, rank: int, value: torch.Tensor) -> None:
        """A store into a gathered region: each row whose index exists, clipped at the tensor's end."""
        for row, owner, index in self.rows(region, env, rank):
            target = self.state[owner][region.tensor][index]
            self.written[owner][region.tensor][index] = True
            part = value[row] if value.dim() else value
            target.copy_(part.expand(target.shape) if part.dim() == 0 else part[tuple(slice(0, n) for n in target.shape)])

    def route(self, value: ir.Route, env: dict, rank: int) -> torch.Tensor:
        """histogram() or arrival() of a region of ids, which must lie in 0..bins-1."""
        ids = self.view(value.source, env, rank).long()
        bins = evaluate(value.bins, env)
        flat = ids.flatten()
        bad = ((flat < 0) | (flat >= bins)).nonzero()
        if len(bad):
            first = int(bad[0])
            start = [evaluate(d.start, env) for d in value.source.dims]
            local = guards.unflatten(first, ids.shape)
            kept = iter(local)
            element = tuple(s + next(kept) if d.kept else s for s, d in zip(start, value.source.dims))
            raise guards.index_error(rank, value.source.tensor, element, int(flat[first]), bins,
                                     f"{value.func}(..., {bins})", declared(self.schedule, value.source.tensor))
        if value.func == "histogram":
            return torch.bincount(flat, minlength=bins).double()
        seen = torch.zeros(bins, dtype=torch.long)
        arrival = torch.empty_like(flat)
        for n, group in enumerate(flat.tolist()):
            arrival[n] = seen[group]
            seen[group] += 1
        arrival = arrival.reshape(ids.shape)
        if value.part is not None:  # a box of the whole region's numbering, at its written size (0 past the end)
            box = torch.zeros([evaluate(d.size, env) for d in value.part], dtype=arrival.dtype)
            starts = [evaluate(d.start, env) for d in value.part]
            found = arrival[tuple(slice(a, a + n) for a, n in zip(starts, box.shape))]
            box[tuple(slice(0, n) for n in found.shape)] = found
            arrival = box
        return arrival.double()

    def check_cap(self, region: ir.Region, env: dict, rank: int, value: torch.Tensor) -> None:
        """A tile's store into a capped tensor: every value at most the cap."""
        cap = evaluate(self.schedule.tensors[region.tensor].cap, env)
        above = (value > cap).nonzero()
        if not len(above):
            return
        local = tuple(int(i) for i in above[0])
        starts = iter(local)
        element = tuple(evaluate(d.start, env) + (next(starts) if d.kept else 0) for d in region.dims)
        raise guards.capacity_error(rank, region.tensor, element, int(value[local]), cap,
                                    declared(self.schedule, region.tensor))

    def run_instance(self, family: ir.Family, env: dict, rank: int) -> None:
        if family.kind is ir.Kind.CHUNK:
            # a chunk moves the elements that exist in both its source and its target
            source = self.view(family.reads[0], env, rank)
            target = self.view(family.writes[0], env, rank)
            common = tuple(slice(0, min(a, b)) for a, b in zip(source.shape, target.shape))
            value = source[common].clone()
            target[common].copy_(target[common] + value if family.reduce else value)
            self.mark(family.writes[0], env, rank, common)
            return
        for store in family.stores:
            self.store(store, env, rank)

    def store(self, store: ir.Store, env: dict, rank: int, names: dict | None = None) -> None:
        value = self.value(store.value, env, rank, names)
        tensor = self.schedule.tensors[store.target.tensor]
        dtype = getattr(torch, self.dtype_map.get(tensor.dtype, tensor.dtype))
        # a float stored into an integer tensor converts as a cast does (toward zero), as the kernel's store does
        value = value.to(dtype).double() if dtype.is_floating_point or value.is_floating_point() else value
        if store.target.rows is not None:
            self.scatter(store.target, env, rank, value)
            return
        target = self.view(store.target, env, rank)
        if value.dim() == 0:
            value = value.expand(target.shape)
        else:  # [BM, 1] into a region of shape [BM]: the region's written size, then clipped as it is
            sizes = [max(0, self.resolve(d.size, env, rank)) for d in store.target.dims if d.kept]
            value = value.reshape(sizes)
        value = value[tuple(slice(0, n) for n in target.shape)]
        if tensor.cap is not None:
            self.check_cap(store.target, env, rank, value)
        target.copy_(value)
        self.mark(store.target, env, rank)

    def run_part(self, family: ir.Family, env: dict, rank: int, position: int, step: int | None) -> None:
        """One node of a tile written as a block (meaning.py): before its loop (step -1), one step of
        the loop, or after it (step None; the whole block where there is no loop)."""
        names = self.names.setdefault(position, {})
        sizes = names.setdefault(None, {})  # the tile's size names bound so far (before its loop)
        loop = family.loop
        at = family.body.index(loop) if loop is not None else len(family.body)
        if step is not None and step >= 0:
            self.statements(loop.body, {**env, **sizes, loop.var.name: step}, rank, names)
            return
        part = family.body[:at] if step == -1 else family.body if loop is None else family.body[at + 1:]
        env = {**env, **sizes}
        self.statements(part, env, rank, names)
        sizes.update({k: v for k, v in env.items() if k not in self.env and k not in ("rank", *family.index_names)})
        if step is None:
            del self.names[position]

    def statements(self, statements, env: dict, rank: int, names: dict) -> None:
        """In order; a size name updates `env` (in place) for what follows."""
        for statement in statements:
            if isinstance(statement, ir.Loop):  # a loop inside a step: every value, here
                for value in range(evaluate(statement.extent, env)):
                    self.statements(statement.body, {**env, statement.var.name: value}, rank, names)
            elif isinstance(statement, ir.SizeLet):
                env[statement.symbol.name] = evaluate(statement.value, env)
            elif isinstance(statement, ir.Let):
                names[statement.name] = self.value(statement.value, env, rank, names)
            elif isinstance(statement, ir.Store):
                self.store(statement, env, rank, names)

    def value(self, value: ir.Value, env: dict, rank: int, names: dict | None = None) -> torch.Tensor:
        if isinstance(value, ir.Route):
            return self.route(value, env, rank)
        if isinstance(value, ir.Scalar):
            number = value.value if isinstance(value.value, (int, float)) else evaluate(value.value, env)
            return torch.tensor(float(number), dtype=torch.float64)
        if isinstance(value, ir.Load):
            return self.view(value.region, env, rank, pad=True)  # past the end reads as 0, as in the kernel
        if isinstance(value, ir.Local):
            return names[value.name]
        if isinstance(value, ir.Iota):
            size = evaluate(value.size, env)
            return torch.arange(size, dtype=torch.float64).reshape((size, 1) if value.axis == 0 else (1, size))
        if isinstance(value, ir.Transpose):
            return self.value(value.value, env, rank, names).transpose(0, 1)
        if isinstance(value, ir.MatMul):
            return self.value(value.left, env, rank, names) @ self.value(value.right, env, rank, names)
        if isinstance(value, ir.Reduce):
            total = None
            for v in range(evaluate(value.extent, env)):
                term = self.value(value.body, {**env, value.var.name: v}, rank, names)
                total = term.clone() if total is None else \
                    torch.maximum(total, term) if value.op == "max" else total + term
            return total
        args = [self.value(a, env, rank, names) for a in value.args]
        return apply(value.func, args)


def apply(func: str, args: list[torch.Tensor]) -> torch.Tensor:
    if func.startswith("cast:"):
        return args[0].to(getattr(torch, func[5:])).double()
    # a bias row [n] against a block [m, n] broadcasts from the trailing side, as in the kernels
    return FUNCTIONS[func].torch(*args)
