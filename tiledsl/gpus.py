"""What the compiler assumes about a GPU, as inputs rather than constants: the SM count the checker's
residency proof is made for (every program of the persistent kernel resident at once: programs that
spin on signals deadlock otherwise) and the shared memory a block may ask for.

A build names its GPU (`--gpu NAME`, or the GPU an `--arch` stands for by default); a launch reads the
device it runs on (`of_device`) and refuses, by name, a kernel whose programs would not all be resident
there. The figures are the vendors' (CUDA occupancy tables: SMs, and the opt-in shared memory a block
may use)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    arch: str            # what `--arch` compiles for
    sms: int             # streaming multiprocessors: the programs of a persistent kernel resident at once
    shared_bytes: int    # shared memory a block may opt in to

    def describe(self) -> str:
        return f"{self.name} ({self.arch}, {self.sms} SMs, {self.shared_bytes // 1024} KB shared memory a block)"


_HOPPER_SHARED = 227 * 1024
GPUS: dict[str, GPU] = {gpu.name: gpu for gpu in (
    GPU("H200", "sm_90", 132, _HOPPER_SHARED),
    GPU("H100", "sm_90", 132, _HOPPER_SHARED),        # SXM
    GPU("H100-PCIe", "sm_90", 114, _HOPPER_SHARED),
    GPU("H20", "sm_90", 78, _HOPPER_SHARED),
    GPU("H800", "sm_90", 132, _HOPPER_SHARED),
)}
DEFAULT = GPUS["H200"]
ARCH_DEFAULTS = {"sm_90": DEFAULT, "sm_90a": DEFAULT}


class UnknownGPU(ValueError):
    pass


def named(name: str | GPU | None) -> GPU:
    """A GPU of the table by name (case does not matter), the default for None."""
    if name is None:
        return DEFAULT
    if isinstance(name, GPU):
        return name
    for gpu in GPUS.values():
        if gpu.name.lower() == name.lower():
            return gpu
    raise UnknownGPU(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")


def for_arch(arch: str | None, gpu: str | GPU | None = None) -> GPU:
    """The GPU a build for `arch` is checked for: the one named, else the arch's usual one."""
    if gpu is not None:
        return named(gpu)
    return ARCH_DEFAULTS.get(arch or "sm_90", DEFAULT)


def of_device(device=None) -> GPU:
    """The GPU a launch runs on, its SM count and shared memory read from the device itself (a MIG
    slice or a GPU not in the table has its own)."""
    import torch
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    name = getattr(props, "name", "GPU")
    known = next((g for g in GPUS.values() if g.name.lower() in name.lower().replace(" ", "-")), DEFAULT)
    shared = getattr(props, "shared_memory_per_block_optin", 0) or known.shared_bytes
    arch = f"sm_{props.major}{props.minor}" if hasattr(props, "major") else known.arch
    return GPU(name, arch, props.multi_processor_count, shared)


def of_launch(device=None, emulated: bool = False) -> GPU:
    """The GPU a launch from this process runs on, which the compiler proves residency and fits blocks
    for: the device's own facts (of_device; the current CUDA device unless `device` names one), the
    default GPU's emulated (the interpreter has neither SMs nor shared memory to run out of) or where
    there is no CUDA device to read."""
    if emulated:
        return DEFAULT
    try:
        return of_device(device)
    except (AssertionError, RuntimeError, ValueError):  # torch without CUDA, no device, or a CPU device
        return DEFAULT


def resident_refusal(fixed: dict[str, int], rest: int, shared: list[str], gpu: GPU) -> str | None:
    """Why the kernel's programs cannot all be resident on `gpu` (None if they can): families with a
    fixed `sms(N)` take N programs each, the `sms(rest)` families `rest` more (at least one)."""
    need = sum(fixed.values()) + (max(1, rest) if shared else 0)
    if need <= gpu.sms:
        return None
    asks = [f"'{name}' sms({n})" for name, n in fixed.items()]
    if shared:
        asks.append(f"{', '.join(repr(s) for s in shared)} {max(1, rest)} (sms(rest))")
    return (f"the kernel needs {need} resident programs ({', '.join(asks)}) but the {gpu.describe()} runs at "
            f"most {gpu.sms} at once: programs that spin on signals must all be resident, or they deadlock; "
            f"ask for fewer (sms(...), num_sms=)")
