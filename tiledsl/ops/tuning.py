"""Choosing how an op runs, so that it is never slower than torch: the first call in each shape bucket
times every applicable path (the fused programs with their tunables, and the plain torch + collective
path) and keeps the fastest. All ranks must take the same path, or their calls would deadlock: they
exchange their times and each takes the fastest by the slowest rank's time (the same numbers on every
rank, the same rule), and a choice read from the cache is rank 0's, broadcast. Choices are kept on disk
per GPU model, world and tiledsl version; a stale or unreadable file is ignored with a warning."""
from __future__ import annotations

import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

import tiledsl
from tiledsl.ops.context import ENV_CACHE_DIR, STATE, resolve
from tiledsl.ops.timers import default_timer

CACHE_FORMAT = 1  # bump when an entry's meaning changes: older files are then ignored as stale


@dataclass(frozen=True)
class Decision:
    """The path one op takes in one shape bucket, and why."""
    op: str
    bucket: str
    choice: str
    how: str                      # tuned | cached | predicted | rule | only path | forced | capture
    times_ms: tuple = ()          # ((path, ms of the slowest rank), ...) fastest first; inf: failed
    not_applicable: tuple = ()    # ((path, why), ...)
    failures: tuple = ()          # ((path, error), ...) paths that raised while measured
    note: str = ""
    predicted_us: tuple = ()      # ((path, us predicted by tiledsl.predict), ...) fastest first: not measured

    def describe(self) -> str:
        lines = [f"{self.op} [{self.bucket}]: {self.choice} ({self.how}{': ' + self.note if self.note else ''})"]
        if self.predicted_us:
            lines.append("  predicted (not measured): " + ", ".join(f"{p} {us:.1f} us" for p, us in self.predicted_us))
        if self.times_ms:
            lines.append("  measured (slowest rank): " + ", ".join(f"{p} {_ms(t)}" for p, t in self.times_ms))
        lines += [f"  not applicable: {p}: {why}" for p, why in self.not_applicable]
        lines += [f"  failed while measured: {p}: {error}" for p, error in self.failures]
        return "\n".join(lines)


def _ms(value: float) -> str:
    return "failed" if math.isinf(value) else f"{value:.4f} ms"


# ---- agreement between ranks ------------------------------------------------------------------------

class GroupAgreement:
    """Broadcast from group rank 0, gather from every rank, barrier: over a torch.distributed group."""

    def __init__(self, name: str):
        self.group = resolve(name)
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)

    def broadcast(self, value):
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def gather(self, value) -> list:
        if self.world == 1:
            return [value]
        out = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.group)


# ---- the cache on disk ------------------------------------------------------------------------------

def cache_dir() -> Path:
    chosen = STATE.settings.cache_dir or os.environ.get(ENV_CACHE_DIR)
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tiledsl" / "tuning"


class ChoiceCache:
    """One JSON file of choices for one GPU model, world and tiledsl version. Read once; a file that
    cannot be read, or was written for something else, warns and counts as empty (the next store
    replaces it). Written by group rank 0 only, through a temporary file and a rename."""

    def __init__(self, gpu: str, world: int):
        self.header = {"format": CACHE_FORMAT, "gpu": gpu, "world": world, "tiledsl": tiledsl.__version__}
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{gpu}-world{world}-tiledsl{tiledsl.__version__}")
        self.path = cache_dir() / f"{slug}.json"
        self._entries: dict | None = None

    def entries(self) -> dict:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            warnings.warn(f"tiledsl.ops: ignoring unreadable tuning cache {self.path} ({error}); tuning again",
                          stacklevel=2)
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            warnings.warn(f"tiledsl.ops: ignoring malformed tuning cache {self.path}; tuning again", stacklevel=2)
            return {}
        header = {k: data.get(k) for k in self.header}
        if header != self.header:
            warnings.warn(f"tiledsl.ops: ignoring stale tuning cache {self.path} (written for {header}, this is "
                          f"{self.header}); tuning again", stacklevel=2)
            return {}
        return {k: v for k, v in data["entries"].items() if _valid_entry(v)}

    def lookup(self, key: str) -> dict | None:
        return self.entries().get(key)

    def store(self, key: str, entry: dict) -> None:
        entries = self.entries()
        entries[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**self.header, "entries": entries}, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as error:
            warnings.warn(f"tiledsl.ops: could not write the tuning cache {self.path} ({error})", stacklevel=2)


def _valid_entry(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("choice"), str)
            and isinstance(entry.get("times_ms"), dict)
            and all(isinstance(v, (int, float)) for v in entry["times_ms"].values()))


_CACHES: dict[tuple, ChoiceCache] = {}


def choice_cache(gpu: str, world: int) -> ChoiceCache:
    key = (gpu, world, str(cache_dir()))
    if key not in _CACHES:
        _CACHES[key] = ChoiceCache(gpu, world)
    return _CACHES[key]


# ---- deciding ---------------------------------------------------------------------------------------

DECISIONS: dict[str, Decision] = {}


@dataclass
class Question:
    """What one decision needs: the paths, why some do not apply, the rule without timings, and how
    to run and check a path while it is measured."""
    op: str
    bucket: str              # the shape bucket, in words
    key: str                 # the bucket and all the choice depends on (dtype, heap kind, group): in memory
    cache_key: str           # the same without the group's name, which another run may give another group
    paths: list              # path names, in the order ties are broken
    not_applicable: dict     # path -> why
    rule: str                # the path taken when nothing is measured
    measure: Callable        # path -> a function making one call (no check)
    verify: Callable         # path -> None, or raises if a measured call failed
    gpu: str                 # GPU model ("cpu (emulated)" on the CPU)
    world: int
    device: torch.device
    predict: Callable | None = None  # path -> its predicted us (None: not predicted), for a bucket not measured


def decide(question: Question, agreement, tune: bool) -> Decision:
    """The path for this bucket: remembered, cached on disk (rank 0's), measured, or by rule."""
    remembered = DECISIONS.get(question.key)
    if remembered is not None:
        return remembered
    applicable = [p for p in question.paths if p not in question.not_applicable]
    skipped = tuple(question.not_applicable.items())
    if len(applicable) == 1:
        decision = Decision(question.op, question.bucket, applicable[0], "only path", not_applicable=skipped)
        DECISIONS[question.key] = decision
        return decision
    from tiledsl.ops.context import capturing
    if capturing():  # no collectives and no timing inside a capture; not remembered
        return Decision(question.op, question.bucket, question.rule, "capture", not_applicable=skipped,
                        note="first call inside a CUDA-graph capture: the rule, not tuned (warm up first)")
    cache = choice_cache(question.gpu, question.world)
    # rank 0's cached choice and rank 0's switch: a rank that measured while another did not would hang
    cached, tune = agreement.broadcast((cache.lookup(question.cache_key), tune) if agreement.rank == 0 else None)
    if cached is not None and sorted(cached["times_ms"]) == sorted(applicable) and cached["choice"] in applicable:
        times = tuple(sorted(cached["times_ms"].items(), key=lambda kv: kv[1]))
        decision = Decision(question.op, question.bucket, cached["choice"], "cached", times, skipped,
                            note=str(cache.path))
    elif not tune:
        decision = (_by_prediction(question, applicable, skipped)
                    or Decision(question.op, question.bucket, question.rule, "rule", not_applicable=skipped,
                                note="tuning is off"))
    else:
        decision = _measure(question, applicable, agreement, skipped)
        if agreement.rank == 0:
            cache.store(question.cache_key, {"choice": decision.choice, "times_ms": dict(decision.times_ms)})
    DECISIONS[question.key] = decision
    return decision


def _by_prediction(question: Question, applicable: list, skipped: tuple) -> Decision | None:
    """Nothing measured at this world and shape: the program paths ranked by their predicted time, where
    two or more of them can be predicted (the torch path has no schedule to simulate, so it is not
    ranked; the predict callable leaves out paths the rule would not take without a measurement)."""
    if question.predict is None:
        return None
    found = {p: question.predict(p) for p in applicable}
    predicted = {p: us for p, us in found.items() if us is not None}
    if len(predicted) < 2:
        return None
    ranked = sorted(predicted, key=lambda p: (predicted[p], applicable.index(p)))
    best, other = ranked[0], ranked[1]
    note = (f"chosen by prediction (not measured): {best} predicted {predicted[best]:.1f} us vs {other} "
            f"{predicted[other]:.1f} us at world {question.world}")
    return Decision(question.op, question.bucket, best, "predicted", not_applicable=skipped,
                    predicted_us=tuple((p, predicted[p]) for p in ranked), note=note)


def _measure(question: Question, applicable: list, agreement, skipped: tuple) -> Decision:
    timer = default_timer(question.device)
    times, failures = {}, {}
    with _progress(len(applicable), f"tiledsl.ops tuning {question.op} [{question.bucket}]",
                   STATE.settings.progress and agreement.rank == 0) as bar:
        for path in applicable:
            bar.set_postfix_str(path)
            agreement.barrier()  # no rank's time includes waiting for a late peer's previous path
            try:
                seconds = timer(path, question.measure(path))
                question.verify(path)
            except Exception as error:  # noqa: BLE001 - a path that fails is a path not taken
                seconds, failures[path] = math.inf, f"{type(error).__name__}: {error}".splitlines()[0]
            times[path] = seconds * 1e3
            bar.update(1)
    everyone = agreement.gather((times, failures))
    slowest = {p: max(rank_times[p] for rank_times, _ in everyone) for p in applicable}
    failed = {p: error for _, rank_failures in everyone for p, error in rank_failures.items()}
    ranked = sorted(applicable, key=lambda p: (slowest[p], applicable.index(p)))
    if math.isinf(slowest[ranked[0]]):
        raise RuntimeError(f"tiledsl.ops: every path of {question.op} failed: "
                           + "; ".join(f"{p}: {e}" for p, e in failed.items()))
    return Decision(question.op, question.bucket, ranked[0], "tuned", tuple((p, slowest[p]) for p in ranked),
                    skipped, tuple(sorted(failed.items())))


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def set_postfix_str(self, text):
        pass

    def update(self, n):
        pass


def _progress(total: int, description: str, shown: bool):
    if not shown:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # a declared dependency; a bare environment still tunes, silently
        return _NoBar()
    return tqdm(total=total, desc=description, leave=False, file=sys.stderr)


def forget() -> None:
    """Drop the decisions made in this process (the disk cache stays)."""
    DECISIONS.clear()
    _CACHES.clear()
