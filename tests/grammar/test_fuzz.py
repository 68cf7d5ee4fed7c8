"""Whatever the input, the front end (parse, schedule, check) either succeeds or raises a TdsError whose
every diagnostic points into the file (line and column >= 1, or line 0 for a whole-file problem);
it never raises anything else and never prints a Python traceback. Inputs: mutations of programs/,
programs generated from the grammar's shape, and garbage (bytes, a 10 MB line, 10,000 brackets)."""
import keyword
import random
import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiledsl.diagnostics import TdsError
from tiledsl.pipeline import run

SOURCES = [p.read_text() for p in sorted((Path(__file__).parents[2] / "programs").glob("*.tds"))]
TOKEN = re.compile(r"#[^\n]*|[A-Za-z_]\w*|\d+(?:\.\d+)?|\s+|.", re.S)
HOSTILE = keyword.kwlist + keyword.softkwlist + [
    "__import__", "__class__", "__init__", "tds_signal", "tl", "triton", "torch", "exec", "eval", "os", "sys",
    "self", "cls", "kwargs", "args", "program", "epoch", "E", "I", "oo", "nan", "floor", "Mod", "ceiling",
    "rank", "world", "rest", "every", "sum", "cdiv", "min", "max", "mod", "after", "on", "split", "reduce", "by"]
WORDS = ["program", "param", "const", "tune", "let", "in", "out", "inout", "symm", "local", "chunk", "tile",
         "order", "place", "copy_engine", "sms", "nvshmem", "add", "bf16", "f32", "i32", "gelu", "rmsnorm"]
PUNCT = ["@", " @ ", "->", "[", "]", "(", ")", ":", ": +", ",", ";", "=", "*", "/", "%", "+", "-", "\\\n", "\n",
         "#", " ", "\t"]
POOL = sorted({t for s in SOURCES for t in TOKEN.findall(s)} | set(HOSTILE) | set(WORDS) | set(PUNCT))

# derandomize: the same examples on every run, so CI never flakes; deadline: sympy warms up slowly once
FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])


def assert_accepted_or_explained(source):
    """The property: success, or a TdsError that locates every diagnostic and renders."""
    try:
        run(source, until="check", path="<fuzz>")
    except TdsError as exc:
        assert exc.diagnostics, "a TdsError with no diagnostic"
        for diagnostic in exc.diagnostics:
            for span in [diagnostic.span] + [note.span for note in diagnostic.notes]:
                whole_file = (span.line, span.column) == (0, 0)
                assert whole_file or (span.line >= 1 and span.column >= 1), (diagnostic, span)
        assert exc.render()


# ---- (a) mutations of the programs in programs/ ------------------------------------------------------

# Positions and picks come from a random.Random seeded by Hypothesis: Hypothesis's own integers (and its
# Random) lean towards 0, which would truncate to nothing or cut the header most of the time.

def delete_token(rnd, tokens):
    del tokens[rnd.randrange(len(tokens))]


def duplicate_token(rnd, tokens):
    k = rnd.randrange(len(tokens))
    tokens.insert(k, tokens[k])


def swap_tokens(rnd, tokens):
    a, b = rnd.randrange(len(tokens)), rnd.randrange(len(tokens))
    tokens[a], tokens[b] = tokens[b], tokens[a]


def replace_token(rnd, tokens):
    tokens[rnd.randrange(len(tokens))] = rnd.choice(POOL)


def insert_token(rnd, tokens):
    tokens.insert(rnd.randrange(len(tokens) + 1), rnd.choice(POOL))


def _line_starts(tokens):
    return [0] + [k + 1 for k, t in enumerate(tokens) if "\n" in t]


def delete_line(rnd, tokens):
    starts = _line_starts(tokens) + [len(tokens)]
    k = rnd.randrange(len(starts) - 1)
    del tokens[starts[k]: starts[k + 1]]


def duplicate_line(rnd, tokens):
    starts = _line_starts(tokens) + [len(tokens)]
    k = rnd.randrange(len(starts) - 1)
    tokens[starts[k]: starts[k]] = tokens[starts[k]: starts[k + 1]]


def swap_lines(rnd, tokens):
    starts = _line_starts(tokens) + [len(tokens)]
    a, b = sorted(rnd.sample(range(len(starts) - 1), 2)) if len(starts) > 2 else (0, 0)
    first, second = tokens[starts[a]: starts[a + 1]], tokens[starts[b]: starts[b + 1]]
    tokens[starts[b]: starts[b + 1]] = first
    tokens[starts[a]: starts[a + 1]] = second


def insert_characters(rnd, tokens):
    def one():
        if rnd.random() < 0.8:
            return rnd.choice(string.printable)
        point = rnd.randrange(0x110000)
        return chr(point) if not 0xD800 <= point < 0xE000 else "\ufeff"
    tokens.insert(rnd.randrange(len(tokens) + 1), "".join(one() for _ in range(rnd.randint(1, 4))))


def truncate(rnd, tokens):
    del tokens[rnd.randrange(len(tokens)):]


MUTATIONS = [delete_token, duplicate_token, swap_tokens, replace_token, insert_token, delete_line,
             duplicate_line, swap_lines, insert_characters, truncate]


@st.composite
def mutated_programs(draw):
    rnd = random.Random(draw(st.integers(0, 2**64)))
    tokens = TOKEN.findall(draw(st.sampled_from(SOURCES)))
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=4)):
        if tokens:
            mutation(rnd, tokens)
    data = "".join(tokens).encode()  # bytes: a str ending in .tds would be taken for a path
    if rnd.random() < 0.1:  # random bytes somewhere: often not UTF-8 any more
        k = rnd.randrange(len(data) + 1)
        data = data[:k] + rnd.randbytes(rnd.randint(1, 8)) + data[k:]
    return data


@settings(max_examples=1400, **FUZZ)
@given(mutated_programs())
def test_mutated_programs_are_accepted_or_explained(source):
    assert_accepted_or_explained(source)


# ---- (b) programs generated from the grammar's shape ------------------------------------------------

KNOWN = ["M", "N", "K", "BM", "BN", "Ms", "A", "B", "C", "S", "P", "X", "i", "j", "s", "g", "mm", "red"]
# mostly names that resolve, so that many programs reach the later stages; some that must be refused
new_names = st.one_of(*[st.sampled_from(KNOWN * 20 + HOSTILE)] * 8,
                      st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True))
names = st.one_of(*[new_names] * 4, st.sampled_from(["world", "rank", "rest"]))
numbers = st.one_of(st.integers(0, 300).map(str), st.sampled_from(["0", "1", "2", "128", "1.5", "1e3", "99999999999"]))


def _slices(expr):
    one = st.one_of(expr, st.tuples(expr, expr).map(" : ".join), expr.map(lambda e: f"{e} : +{e}"), st.just(":"),
                    expr.map(lambda e: f"{e} : +BM"))
    return st.lists(one, min_size=1, max_size=3).map(", ".join)


expressions = st.recursive(
    st.one_of(names, numbers),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" + ", " - ", "*", " / ", " mod ", " % ", " @ "]), inner).map("".join),
        inner.map(lambda e: f"({e})"),
        inner.map(lambda e: f"-{e}"),
        st.tuples(st.sampled_from(["cdiv", "min", "max", "relu", "gelu", "f32", "bf16", "rmsnorm", "sqrt"]) | names,
                  st.lists(inner, max_size=3).map(", ".join)).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, _slices(inner)).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(names, st.one_of(names, numbers, inner.map(lambda e: f"({e})")), _slices(inner))
          .map(lambda t: f"{t[0]}@{t[1]}[{t[2]}]"),
        st.tuples(inner, new_names, inner).map(lambda t: f"sum({t[0]} for {t[1]} in {t[2]})"),
    ),
    max_leaves=10)


def _list(strategy, most=3):
    return st.lists(strategy, min_size=1, max_size=most).map(", ".join)


indices = _list(st.tuples(new_names, expressions).map(lambda t: f"{t[0]} in {t[1]}"))
some_engine = st.tuples(st.sampled_from(["copy_engine", "sms", "nvshmem"]) | names,
                        st.sampled_from(["", "(4)", "(rest)", "(BM)"]) | expressions.map(lambda e: f"({e})"),
                        ).map(lambda t: f" on {t[0]}{t[1]}")
engines = st.one_of(st.just(""), some_engine)
deps = st.tuples(names, _list(st.one_of(expressions, st.just("*"))),
                 st.sampled_from(["", " @ every rank", " @ 0", "@rank", " @ ((rank + 1) mod world)"]))
statements = st.one_of(
    _list(new_names).map(lambda n: f"param {n}"),
    _list(st.tuples(new_names, expressions).map(" = ".join)).map(lambda c: f"const {c}"),
    st.tuples(new_names, _list(expressions)).map(lambda t: f"tune {t[0]} in [{t[1]}]"),
    st.tuples(new_names, expressions).map(lambda t: f"let {t[0]} = {t[1]}"),
    st.tuples(st.sampled_from(["in", "out", "inout", "symm", "local"]), new_names,
              st.sampled_from(["bf16", "f32", "i32", "f16", "fp8"]) | names, _list(expressions))
      .map(lambda t: f"{t[0]} {t[1]} : {t[2]}[{t[3]}]"),
    st.tuples(new_names, indices, engines, st.sampled_from(["", " split 2", " split 0"]), expressions, expressions,
              st.sampled_from(["", " reduce add", " reduce max"]))
      .map(lambda t: f"chunk {t[0]}[{t[1]}]{t[2]}{t[3]}: {t[4]} -> {t[5]}{t[6]}"),
    st.tuples(new_names, indices, engines, st.lists(st.tuples(expressions, expressions).map(" = ".join),
                                                min_size=1, max_size=2).map("; ".join))
      .map(lambda t: f"tile {t[0]}[{t[1]}]{t[2]}: {t[3]}"),
    st.tuples(names, _list(new_names), st.lists(deps.map(lambda d: f"{d[0]}[{d[1]}]{d[2]}"), min_size=1, max_size=2)
              .map(", ".join)).map(lambda t: f"{t[0]}[{t[1]}] after {t[2]}"),
    st.tuples(names, _list(expressions)).map(lambda t: f"order {t[0]} by {t[1]}"),
    st.tuples(names, some_engine).map(lambda t: f"place {t[0]}{t[1]}"),
    st.sampled_from(["", "# a comment", "   "]),
)
PRELUDE = ("param M, N, K\nconst BM = 128, BN = 64\nlet Ms = M / world\nin A : bf16[M, K]\nin B : bf16[K, N]\n"
           "out C : bf16[M, N]\nsymm S : bf16[world, M, N]\ninout X : f32[M]\n")
FAMILIES = [
    "chunk g[s in world] on copy_engine: A@s -> S[s, :, :]",  # shape mismatch on purpose half the time
    "chunk g[s in world] on sms(4): C -> S@s[rank, :, :]",
    "tile mm[i in M/BM, j in cdiv(N, BN)]: C[i*BM : +BM, j*BN : +BN] = A[i*BM : +BM, :] @ B[:, j*BN : +BN]",
    "tile red[i in M/BM]: C[i*BM : +BM, :] = sum(S[s, i*BM : +BM, :] for s in world)",
    "mm[i, j] after g[(i*BM) / Ms]", "red[i] after g[*] @ every rank", "red[i] after mm[i, 0], red[i]",
    "order mm by ((i*BM)/Ms - rank) mod world, j", "place g on copy_engine",
]


@st.composite
def generated_programs(draw):
    lines = [f"program {draw(new_names)}"]
    if draw(st.booleans()):  # a known world of names, so that more programs reach the later stages
        lines.append(PRELUDE)
        lines += draw(st.lists(st.sampled_from(FAMILIES), max_size=5))
    lines += draw(st.lists(statements, max_size=8))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@settings(max_examples=700, **FUZZ)
@given(generated_programs())
def test_generated_programs_are_accepted_or_explained(source):
    assert_accepted_or_explained(source)


# ---- (c) garbage -------------------------------------------------------------------------------------

@settings(max_examples=200, **FUZZ)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                 st.binary(max_size=100).map(lambda b: b"program p\n" + b)))
def test_garbage_is_explained(source):
    assert_accepted_or_explained(source)


MB = 1 << 20


@pytest.mark.parametrize("tail", [
    "let a = " + "M" * (10 * MB),                              # a 10 MB name
    "# " + "x" * (10 * MB),                                    # a 10 MB comment
    "let a = " + "1" * (10 * MB),                              # a 10 MB number
    "let a = " + "M + " * (10 * MB // 4),                      # 10 MB of operators
    "param " + "M, " * (10 * MB // 3) + "N",                   # 10 MB of names
    "let a = M" + " " * (10 * MB) + "$",                       # the error at the end of a 10 MB line
], ids=["name", "comment", "number", "operators", "names", "late-error"])
def test_ten_megabyte_line(tail):
    assert_accepted_or_explained(("program p\nparam M\n" + tail + "\n").encode())


@pytest.mark.parametrize("middle", ["(" * 10_000 + "M" + ")" * 10_000, "[" * 10_000, ")" * 10_000,
                                    "(\\\n" * 10_000 + "M", "A" + "[0]" * 10_000, "-" * 10_000 + "M"],
                         ids=["balanced", "open", "close", "continued", "subscripts", "negations"])
def test_ten_thousand_brackets(middle):
    assert_accepted_or_explained(f"program p\nparam M\nlet a = {middle}\n".encode())


def test_random_bytes():
    data = random.Random(0).randbytes(200_000)
    assert_accepted_or_explained(data)
    assert_accepted_or_explained(b"program p\n" + data)
    assert_accepted_or_explained(data.decode("latin-1").encode())  # valid UTF-8, every character odd


def test_file_too_large_is_refused_before_parsing():
    with pytest.raises(TdsError) as caught:
        run(b"program p\n#" + b"x" * (17 * MB), until="check")
    assert caught.value.diagnostics[0].span.line == 0
