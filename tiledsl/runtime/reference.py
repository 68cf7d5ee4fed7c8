"""The reference result of a schedule, in plain torch on one process: every rank's tensors side by
side, every instance run one after another in an order the schedule's meaning allows
(`meaning.Concrete.runnable`: waits first, each rank in its serial order), in float64. It shares no
code with the generated kernels, so agreement between the two is evidence about both; the instances
and their order come from the same meaning the checker proved and the code generator printed."""
from __future__ import annotations

import functools

import torch

from tiledsl.schedule import ir
from tiledsl.schedule.intcode import code
from tiledsl.schedule.meaning import instantiate
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
            if family.body:
                self.run_part(family, env, instance.rank, position, step)
            else:
                self.run_instance(family, env, instance.rank)
        return state

    def view(self, region: ir.Region, env: dict, rank: int, pad: bool = False) -> torch.Tensor:
        """The region's elements that exist (a `+n` slice is clipped at the end of its dimension), or
        with `pad`, the region at its written size with 0 past the end: what a tile's masked load
        reads."""
        owner = rank if region.owner is None else evaluate(region.owner, env)
        if region.owner is not None and region.tensor in self.staged[owner]:
            tensor = self.staged[owner][region.tensor]
        else:
            tensor = self.state[owner][region.tensor]
        index, sizes = [], []
        for dim in region.dims:
            start = evaluate(dim.start, env)
            if dim.kept:
                sizes.append(evaluate(dim.size, env))
                index.append(slice(start, start + sizes[-1]))
            else:
                index.append(start)
        view = tensor[tuple(index)]
        if not pad or tuple(view.shape) == tuple(sizes):
            return view
        padded = torch.zeros(sizes, dtype=view.dtype)
        padded[tuple(slice(0, n) for n in view.shape)] = view
        return padded

    def run_instance(self, family: ir.Family, env: dict, rank: int) -> None:
        if family.kind is ir.Kind.CHUNK:
            # a chunk moves the elements that exist in both its source and its target
            source = self.view(family.reads[0], env, rank)
            target = self.view(family.writes[0], env, rank)
            common = tuple(slice(0, min(a, b)) for a, b in zip(source.shape, target.shape))
            value = source[common].clone()
            target[common].copy_(target[common] + value if family.reduce else value)
            return
        for store in family.stores:
            self.store(store, env, rank)

    def store(self, store: ir.Store, env: dict, rank: int, names: dict | None = None) -> None:
        target = self.view(store.target, env, rank)
        value = self.value(store.value, env, rank, names)
        declared = self.schedule.tensors[store.target.tensor].dtype
        dtype = getattr(torch, self.dtype_map.get(declared, declared))
        value = value.to(dtype).double() if dtype.is_floating_point else value
        if value.dim() == 0:
            value = value.expand(target.shape)
        else:  # [BM, 1] into a region of shape [BM]: the region's written size, then clipped as it is
            sizes = [evaluate(d.size, env) for d in store.target.dims if d.kept]
            value = value.reshape(sizes)
        target.copy_(value[tuple(slice(0, n) for n in target.shape)])

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
