"""Lesson 10's pipeline grader, `check_balanced_partition`: the learner's
`balanced_partition(costs, stages) -> list[range]`, the split of a model's decoder layers into
pipeline stages that `minillm.distributed.partition.balanced_partition` makes for
`pipeline_parallel_size`.

A split is judged by what the pipeline needs, not by one expected answer: exactly `stages`
ranges, each a contiguous run of at least one layer, in order, covering every layer once, and
the largest stage's cost as small as any split can make it (the grader finds that optimum
itself, by dynamic programming, so any optimal split passes, whatever its tie-breaking). Cases:
equal costs, a heavy last layer (the output head: SmolLM2's and Llama-3.2-1B's real shapes), a
heavy first layer, free layers, ties, one stage, as many stages as layers, splits a greedy fill
gets wrong, 300 random cases; `stages` above the number of layers, or below 1, must raise
ValueError. The hint names the mistake: a gap or an overlap (range's exclusive stop), an empty
stage, a split by layer count, a greedy fill.
"""
from __future__ import annotations

import math
import random

from .harness import Grader, expect, grader

EXCLUSIVE = ("the stages must cover layers 0..n-1 in order, each starting where the previous one stopped: "
             "range(start, stop) stops *before* stop, so the next stage starts at the previous stop")
EMPTY = ("every stage must run at least one layer (a stage with no layers is a device that only forwards "
         "hidden states)")
OPTIMAL = ("The pipeline runs at the pace of its slowest stage, so minimise the largest stage's summed cost. "
           "Try every start j of the last stage: best(i layers, p stages) = min over j of "
           "max(best(j, p - 1), cost of layers j..i-1) (dynamic programming over (layers, stages)); or "
           "binary-search the answer with a greedy 'does it fit in p stages' test")
GREEDY = ("a greedy fill (add layers to a stage until it reaches total/stages) is not optimal: it decides each "
          "cut without looking ahead, and the last stage takes whatever is left. " + OPTIMAL)
BY_COUNT = ("you split the layers by count; split them by cost: the layers do not cost the same (the last one "
            "also scores the vocabulary). " + OPTIMAL)


def _shape_costs(hidden, inter, layers, heads, kv_heads, head_dim, vocab) -> list[float]:
    """A Llama's weight count per layer, the output head's added to the last (partition.layer_costs' rule)."""
    layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter + 2 * hidden
    return [float(layer)] * (layers - 1) + [float(layer + vocab * hidden)]


SMOLLM2 = _shape_costs(576, 1536, 30, 9, 3, 64, 49152)
LLAMA_1B = _shape_costs(2048, 8192, 16, 32, 8, 64, 128256)

# (what the case is, costs, stages)
CASES = [
    ("equal costs", [1.0] * 8, 2),
    ("equal costs, stages not dividing the layers", [1.0] * 7, 3),
    ("one stage", [3.0, 1.0, 2.0], 1),
    ("as many stages as layers", [3.0, 1.0, 4.0, 1.0, 5.0], 5),
    ("a heavy last layer (the output head)", [1.0] * 6 + [5.0], 2),
    ("a heavy first layer", [6.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3),
    ("ties: several optimal splits", [1.0] * 5, 2),
    ("ties: equal costs, three stages", [2.0, 2.0, 2.0, 2.0, 2.0, 2.0], 3),
    ("free layers still take a stage each", [0.0, 0.0, 5.0, 0.0], 3),
    ("a greedy fill gets this wrong", [2.0, 3.0, 1.0, 4.0], 3),
    ("a greedy fill gets this wrong", [1.0, 1.0, 4.0, 1.0, 1.0, 4.0], 3),
    ("SmolLM2-135M's weight counts, the head on the last layer, 2 stages", SMOLLM2, 2),
    ("SmolLM2-135M's weight counts, the head on the last layer, 4 stages", SMOLLM2, 4),
    ("Llama-3.2-1B's weight counts, the head on the last layer, 3 stages", LLAMA_1B, 3),
]


def optimum(costs: list[float], stages: int) -> float:
    """The smallest possible largest stage cost (the grader's own DP; only the value)."""
    n, prefix = len(costs), [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [prefix[i] if i else math.inf for i in range(n + 1)]      # one stage: layers 0..i-1
    for p in range(2, stages + 1):
        best = [math.inf] * p + [min(max(best[j], prefix[i] - prefix[j]) for j in range(p - 1, i))
                                 for i in range(p, n + 1)]
    return best[n]


def by_count(n: int, stages: int) -> list[range]:
    """Equal layer counts, the remainder to the first stages."""
    sizes = [n // stages + (s < n % stages) for s in range(stages)]
    return [range(sum(sizes[:s]), sum(sizes[:s + 1])) for s in range(stages)]


def greedy_fills(costs: list[float], stages: int) -> list[list[range]]:
    """The two greedy fills learners write: close a stage before it would pass total/stages, or once it reaches it."""
    target, out = sum(costs) / stages, []
    for overshoot in (False, True):
        ranges, start, acc = [], 0, 0.0
        for i, c in enumerate(costs):
            if len(ranges) < stages - 1 and i > start and (acc >= target if overshoot else acc + c > target):
                ranges.append(range(start, i))
                start, acc = i, 0.0
            acc += c
        out.append(ranges + [range(start, len(costs))])
    return out


def _stage_cost(costs, r) -> float:
    return sum(costs[i] for i in r)


def _show(ranges) -> str:
    return "[" + ", ".join(f"range({r.start}, {r.stop})" if isinstance(r, range) else repr(r) for r in ranges) + "]"


def _short(costs) -> str:
    if len(costs) <= 10:
        return "[" + ", ".join(f"{c:g}" for c in costs) + "]"
    return f"[{costs[0]:g}, {costs[1]:g}, ... ({len(costs)} layers) ..., {costs[-1]:g}]"


def _check_split(g, fn, what: str, costs: list[float], stages: int) -> None:
    call = f"balanced_partition({_short(costs)}, {stages})"
    given = list(costs)
    with g.case(f"calling {call}"):
        got = fn(given, stages)
    expect(given == costs, f"{call} changed its costs list: read it, do not modify it (the engine keeps it)")
    expect(isinstance(got, (list, tuple)), f"{call} returned {got!r}: return a list of ranges, one per stage")
    got = list(got)
    expect(len(got) == stages, f"{what}: {call} returned {len(got)} stages {_show(got)}, expected {stages}: "
                               "one range per stage")
    for s, r in enumerate(got):
        expect(isinstance(r, range) and r.step == 1,
               f"{what}: {call} returned {_show(got)}: stage {s} is {r!r}; return range(start, stop) objects "
               "(the engine reads .start and .stop, and a stage is a contiguous run of layers)")
    n, expected_start = len(costs), 0
    for s, r in enumerate(got):
        expect(len(r) > 0, f"{what}: {call} returned {_show(got)}: stage {s} is empty\n    Hint: {EMPTY}")
        if r.start > expected_start:
            missing = f"layer {expected_start} is" if r.start == expected_start + 1 else \
                f"layers {expected_start}..{r.start - 1} are"
            raise AssertionError(f"{what}: {call} returned {_show(got)}: {missing} in no stage\n    Hint: {EXCLUSIVE}")
        expect(r.start == expected_start,
               f"{what}: {call} returned {_show(got)}: layer {r.start} is in stage {s} and in the stage before it"
               f"\n    Hint: {EXCLUSIVE}")
        expected_start = r.stop
    expect(expected_start <= n, f"{what}: {call} returned {_show(got)}: the model has only {n} layers "
                                f"(0..{n - 1})\n    Hint: {EXCLUSIVE}")
    left = f"layer {n - 1} is" if expected_start == n - 1 else f"layers {expected_start}..{n - 1} are"
    expect(expected_start == n, f"{what}: {call} returned {_show(got)}: {left} in no stage (the model has {n} "
                                f"layers)\n    Hint: {EXCLUSIVE}")
    best, worst = optimum(costs, stages), max(_stage_cost(costs, r) for r in got)
    if worst <= best * (1 + 1e-9) + 1e-12:
        return
    slowest = max(range(stages), key=lambda s: _stage_cost(costs, got[s]))
    hint = BY_COUNT if got == by_count(n, stages) else GREEDY if got in greedy_fills(costs, stages) else OPTIMAL
    raise AssertionError(f"{what}: {call} returned {_show(got)}, whose slowest stage (stage {slowest}, layers "
                         f"{got[slowest].start}-{got[slowest].stop - 1}) costs {worst:g}; the best split's slowest "
                         f"stage costs {best:g}\n    Hint: {hint}")


def _check_refused(g, fn, costs: list[float], stages, why: str) -> None:
    call = f"balanced_partition({_short(costs)}, {stages})"
    with g.case(f"calling {call}"):
        try:
            got = fn(list(costs), stages)
        except ValueError:
            return
    raise AssertionError(f"{call} returned {_show(got) if isinstance(got, list) else repr(got)} instead of raising "
                         f"ValueError\n    Hint: {why}: refuse it with a ValueError that says so (a wrong "
                         "--pipeline-parallel-size should stop the engine at startup, not leave a device idle)")


@grader
def check_balanced_partition(fn) -> bool:
    """fn(costs, stages) -> a list of `stages` contiguous ranges of layer indices, each non-empty,
    minimising the largest stage's summed cost; like `minillm.distributed.partition.balanced_partition`."""
    g = Grader("check_balanced_partition", "your balanced_partition")
    expect(callable(fn), f"check_balanced_partition takes your function balanced_partition, got {fn!r}")
    for what, costs, stages in CASES:
        _check_split(g, fn, what, costs, stages)
    _check_refused(g, fn, [1.0, 2.0, 3.0], 4, "4 stages of 3 layers would leave a stage without a layer")
    _check_refused(g, fn, [1.0] * 30, 31, "31 stages of 30 layers would leave a stage without a layer")
    _check_refused(g, fn, [1.0, 2.0], 0, "a pipeline needs at least one stage")
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        costs = [float(rng.choice([0, 1, 1, 2, 3, 5, 8, 13])) for _ in range(n)]
        _check_split(g, fn, "a random case", costs, rng.randint(1, n))
    return g.passed()
