"""What the four MoE programs compute, written directly in torch from their header comments, with
Python loops where that is plainest: nothing here reads a .tds file or imports tiledsl. Each function
takes every rank's tensors as lists (index = rank) and returns every rank's expected outputs, in
float64. A row's place among its expert's rows (`arrival`) is the order of (token, k) pairs, token by
token, as in the programs' header comments."""
from __future__ import annotations

import torch


def arrival(ids: torch.Tensor) -> torch.Tensor:
    """For each (t, k), how many pairs before it (row-major) chose the same expert."""
    seen: dict[int, int] = {}
    out = torch.empty_like(ids, dtype=torch.long)
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            expert = int(ids[t, k])
            out[t, k] = seen.get(expert, 0)
            seen[expert] = seen.get(expert, 0) + 1
    return out


def histogram(ids: torch.Tensor, experts: int) -> torch.Tensor:
    return torch.bincount(ids.flatten().long(), minlength=experts)


def moe_dispatch(X, ids, E: int, C: int):
    """recv[d][e, s, c] = X_s[t] for the c-th pair (t, k) of rank s that chose expert d*E + e."""
    world = len(X)
    H = X[0].shape[1]
    recv = [torch.zeros(E, world, C, H, dtype=torch.float64) for _ in range(world)]
    count = [torch.zeros(E, world, dtype=torch.long) for _ in range(world)]
    slot = [arrival(i) for i in ids]
    for s in range(world):
        for t in range(ids[s].shape[0]):
            for k in range(ids[s].shape[1]):
                expert = int(ids[s][t, k])
                d, e = divmod(expert, E)
                recv[d][e, s, slot[s][t, k]] = X[s][t].double()
                count[d][e, s] += 1
    return {"recv": recv, "count": count, "slot": slot}


def quantise_e4m3(rows: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's fp8 layout in float32, as the pack tile computes it: per `group` values of a row,
    scale = max(largest magnitude, 1e-30) / 448, value = (x / scale) rounded to e4m3. Returns (values,
    scales) in float64, the values e4m3's exactly."""
    x = rows.float().reshape(*rows.shape[:-1], rows.shape[-1] // group, group)
    scale = x.abs().amax(dim=-1).clamp_min(1e-30) / 448
    values = (x / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return values.double().reshape(rows.shape), scale.double()


def moe_dispatch_fp8(X, ids, E: int, C: int, group: int):
    """moe_dispatch's rows as they travel in fp8: recv the e4m3 values, rscale a scale per `group`."""
    out = moe_dispatch(X, ids, E, C)
    quantised = [quantise_e4m3(r, group) for r in out["recv"]]
    return {"recv": [q for q, _ in quantised], "rscale": [s for _, s in quantised], "count": out["count"],
            "slot": out["slot"]}


def moe_combine(Y, ids, w, E: int):
    """out_s[t] = sum over k of w_s[t, k] * Y_d[e, s, c], (t, k) being the c-th pair of rank s that
    chose expert d*E + e."""
    out = []
    for s, (mine, weights) in enumerate(zip(ids, w, strict=True)):
        slot = arrival(mine)
        rows = torch.zeros(mine.shape[0], Y[0].shape[-1], dtype=torch.float64)
        for t in range(mine.shape[0]):
            for k in range(mine.shape[1]):
                d, e = divmod(int(mine[t, k]), E)
                rows[t] += float(weights[t, k]) * Y[d][e, s, slot[t, k]].double()
        out.append(rows)
    return {"out": out}


def ag_group_gemm(A, ids, B, C: int):
    """G_r[s, e, c] = A_s[t] @ B_r[e] for the c-th pair (t, k) of rank s that chose expert e; every
    rank's counts count[s, e]."""
    world, E = len(A), B[0].shape[0]
    count = torch.stack([histogram(i, E) for i in ids])
    G = []
    for r in range(world):
        out = torch.zeros(world, E, C, B[r].shape[-1], dtype=torch.float64)
        for s in range(world):
            slot = arrival(ids[s])
            for t in range(ids[s].shape[0]):
                for k in range(ids[s].shape[1]):
                    e = int(ids[s][t, k])
                    out[s, e, slot[t, k]] = A[s][t].double() @ B[r][e].double()
        G.append(out)
    return {"G": G, "count": [count.clone() for _ in range(world)]}


def moe_gemm_rs(Hx, ids, w, B):
    """Y_r[t] = sum over ranks q and over k of w_r[t, k] * (Hx_q[r, e, c] @ B_q[e]), (t, k) being the
    c-th pair of rank r that chose expert e."""
    world = len(Hx)
    Y = []
    for r in range(world):
        slot = arrival(ids[r])
        rows = torch.zeros(ids[r].shape[0], B[0].shape[-1], dtype=torch.float64)
        for t in range(ids[r].shape[0]):
            for k in range(ids[r].shape[1]):
                e = int(ids[r][t, k])
                for q in range(world):
                    rows[t] += float(w[r][t, k]) * (Hx[q][r, e, slot[t, k]].double() @ B[q][e].double())
        Y.append(rows)
    return {"Y": Y}


def group_gemm(count, P, B):
    """G[e, c] = P[e, c] @ B[e] below count[e] (zeros past it, never compared); count given back."""
    G = []
    for n, P_r, B_r in zip(count, P, B, strict=True):
        out = torch.zeros(P_r.shape[0], P_r.shape[1], B_r.shape[-1], dtype=torch.float64)
        for e in range(P_r.shape[0]):
            rows = int(n[e])
            out[e, :rows] = P_r[e, :rows].double() @ B_r[e].double()
        G.append(out)
    return {"G": G, "count": list(count)}


def group_gemm_fp8(count, P, S, B, group: int):
    """group_gemm on fp8 rows: each row's values times their group's scale, rounded to bf16 (as the
    tile rounds them before its product), then @ B[e] below count[e]."""
    rows = [(p.double().unflatten(-1, (-1, group)) * s.double().unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
            for p, s in zip(P, S, strict=True)]
    return group_gemm(count, rows, B)
