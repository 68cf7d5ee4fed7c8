"""`split` over consts (`split PIECES`): the parts of a chunk instance are a const the build may set, as a
program count is (`sms(COPY_SMS)`). The meaning does not depend on it (a consumer waits for every part
of the instance it names); the plan, the module's family specs and its part arithmetic take the value
built."""
from __future__ import annotations

import pytest

from tiledsl.api import build_module
from tiledsl.diagnostics import TdsError
from tiledsl.graph import to_dot
from tiledsl.pipeline import run

SOURCE = """\
program pieces
param M, N
const PIECES = 4, SMS = 8
in   X : f32[M / world, N]
out  Y : f32[M, N]
symm G : f32[M, N]
let Ms = M / world
chunk put[s in world] on sms(SMS) split PIECES: X -> G@s[rank*Ms : +Ms, :]
chunk mine[s in world] on sms(SMS) split PIECES: G[s*Ms : +Ms, :] -> Y[s*Ms : +Ms, :]
mine[s] after put[rank] @ s
"""


def _family(module, name):
    return next(f for f in module.tds_SPEC.families if f.name == name)


@pytest.mark.parametrize("consts, parts", [({}, 4), ({"PIECES": 1}, 1), ({"PIECES": 16}, 16)])
def test_the_module_splits_each_instance_in_the_parts_the_build_sets(consts, parts):
    module = build_module(SOURCE, consts)
    assert _family(module, "put").split == parts and _family(module, "mine").split == parts
    spec = module.tds_SPEC
    counts = spec.counts({**spec.consts, "M": 8, "N": 4, "rank": 0, "world": 2, "nodes": 1, "local_world": 2})
    assert counts == {"put": 2, "mine": 2}
    text = run(SOURCE, consts=consts).module
    if parts > 1:  # each program takes one part of one instance; a consumer waits for every part
        assert f"tds_part = tds_t % {parts}" in text and f"PARTS={parts}, BLOCK=" in text
    else:
        assert "tds_part" not in text


def test_the_checker_proves_the_schedule_whatever_the_parts():
    assert not run(SOURCE, until="check").warnings  # errors would have raised


def test_a_split_over_params_is_refused_with_its_place():
    with pytest.raises(TdsError) as refused:
        run(SOURCE.replace("split PIECES: X", "split M: X"), until="schedule")
    assert "split must be known at compile time" in str(refused.value) and ":8:" in str(refused.value)


def test_the_graph_names_the_split_as_written():
    assert "split PIECES" in to_dot(run(SOURCE, until="schedule").schedule)
