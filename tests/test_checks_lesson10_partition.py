"""Tests of lesson 10's pipeline grader (minillm.checks.lesson10_partition): the package's
balanced_partition passes, so does another optimal split (binary search on the answer, other
ties), and planted mistakes are rejected with the hint that names them: the last layer left out
(range's exclusive stop), overlapping stages, an empty stage, a split by layer count, a greedy
fill, no ValueError for more stages than layers, lists instead of ranges, a list of the wrong
length, costs changed in place. Addressable: `pytest -k check_balanced_partition`.
"""
import pytest
from checks_support import rejects

from minillm import checks
from minillm.checks import harness, lesson10_partition
from minillm.distributed.partition import balanced_partition


def refusing(fn):
    """fn with the reference's refusal of impossible stage counts in front."""
    def checked(costs, stages):
        if not 1 <= stages <= len(costs):
            raise ValueError(f"{stages} stages for {len(costs)} layers")
        return fn(costs, stages)
    return checked


def binary_search(costs, stages):
    """Another optimal algorithm: the smallest largest-stage cost for which a greedy fill needs
    at most `stages` stages; its ties differ from the reference's (it fills early stages first)."""
    if not 1 <= stages <= len(costs):
        raise ValueError("stages must be 1..layers")

    def split(limit):
        ranges, start, acc = [], 0, 0.0
        for i, c in enumerate(costs):
            left = len(costs) - i                     # layers still to place, i included
            if i > start and (acc + c > limit or left < stages - len(ranges)):
                ranges.append(range(start, i))
                start, acc = i, 0.0
            acc += c
        ranges.append(range(start, len(costs)))
        return ranges
    candidates = sorted({sum(costs[i:j]) for i in range(len(costs)) for j in range(i + 1, len(costs) + 1)})
    for limit in candidates:
        r = split(limit)
        if len(r) == stages and max(sum(costs[i] for i in s) for s in r) <= limit:
            return r
    raise AssertionError("unreachable")


def test_the_package_function_passes():
    assert checks.check_balanced_partition(balanced_partition)
    assert harness.REFERENCES["check_balanced_partition"] == "minillm.distributed.partition:balanced_partition"


def test_another_optimal_split_passes_whatever_its_ties():
    assert binary_search([1.0] * 5, 2) != balanced_partition([1.0] * 5, 2)      # the two break ties apart
    assert checks.check_balanced_partition(binary_search)


def last_layer_left_out(costs, stages):
    r = balanced_partition(costs, stages)
    return r[:-1] + [range(r[-1].start, r[-1].stop - 1)]


def overlapping(costs, stages):
    r = balanced_partition(costs, stages)
    return [r[0]] + [range(s.start - 1, s.stop) for s in r[1:]]


@refusing
def empty_stage_allowed(costs, stages):
    """The DP with an empty last stage allowed (j up to i): free layers make it pick one."""
    n, prefix = len(costs), [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for i in range(0, n + 1):
            for j in range(0, i + 1):
                worst = max(best[p - 1][j], prefix[i] - prefix[j])
                if worst <= best[p][i]:
                    best[p][i], cut[p][i] = worst, j
    ranges, end = [], n
    for p in range(stages, 0, -1):
        ranges.append(range(cut[p][end], end))
        end = cut[p][end]
    return ranges[::-1]


@refusing
def by_count(costs, stages):
    return lesson10_partition.by_count(len(costs), stages)


@refusing
def greedy(costs, stages):
    return lesson10_partition.greedy_fills(costs, stages)[0]


def no_error(costs, stages):
    if stages > len(costs):
        return [range(i, i + 1) for i in range(len(costs))] + [range(len(costs), len(costs))] * (stages - len(costs))
    return balanced_partition(costs, stages)


def lists(costs, stages):
    return [list(r) for r in balanced_partition(costs, stages)]


def one_too_many(costs, stages):
    return balanced_partition(costs, stages) + [range(len(costs), len(costs))]


def sorts_in_place(costs, stages):
    out = balanced_partition(costs, stages)
    costs.sort()
    return out


def stub(costs, stages):
    raise NotImplementedError("YOUR CODE HERE")


@pytest.mark.parametrize("bad, hint", [
    (last_layer_left_out, r"(?s)layer 7 is in no stage .*Hint: .*stops \*before\* stop"),
    (overlapping, r"(?s)in stage 1 and in the stage before it"),
    (empty_stage_allowed, r"(?s)stage \d is empty\n    Hint: every stage must run at least one layer"),
    (by_count, r"(?s)a heavy last layer .*Hint: you split the layers by count"),
    (greedy, r"(?s)a greedy fill gets this wrong.*Hint: a greedy fill .* is not optimal"),
    (no_error, r"(?s)balanced_partition\(\[1, 2, 3\], 4\) returned .* instead of raising ValueError"),
    (lists, r"(?s)stage 0 is \[0, 1, 2, 3\]; return range\(start, stop\) objects"),
    (one_too_many, r"(?s)returned 3 stages .*expected 2"),
    (sorts_in_place, r"(?s)changed its costs list"),
    (stub, r"(?s)not implemented yet"),
], ids=lambda x: getattr(x, "__name__", "hint"))
def test_planted_mistakes_fail_with_their_hint(bad, hint):
    rejects(checks.check_balanced_partition, bad, match=hint)


def test_the_graders_optimum_is_a_brute_force_over_every_cut():
    import itertools
    import random
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 8)
        costs = [float(rng.randint(0, 9)) for _ in range(n)]
        stages = rng.randint(1, n)
        brute = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
                    for cuts in itertools.combinations(range(1, n), stages - 1))
        assert lesson10_partition.optimum(costs, stages) == brute


# ---------------------------------------------------------------- the hook the lesson plugs the split into

def test_the_engine_refuses_a_partition_fn_split_that_is_no_pipeline_before_starting_ranks():
    """LLMEngine(partition_fn=...) checks the returned split (partition.check_split) before any rank
    starts, and refuses partition_fn without pipeline stages; the real run is the lesson's last cell."""
    from minillm import LLMEngine
    from minillm.checks.harness import tiny_model
    from minillm.distributed.partition import check_split
    model, tokenizer = tiny_model()
    layers = model.config.num_hidden_layers
    with pytest.raises(ValueError, match=r"partition_fn returned \[range\(0, 1\)\]: expected 2 contiguous"):
        LLMEngine(model, tokenizer, pipeline_parallel_size=2, num_kv_blocks=16, partition_fn=lambda c, s: [range(0, 1)])
    with pytest.raises(ValueError, match="partition_fn splits the layers into pipeline stages"):
        LLMEngine(model, tokenizer, num_kv_blocks=16, partition_fn=balanced_partition)
    assert check_split((range(0, 1), range(1, layers)), layers, 2, "f") == [range(0, 1), range(1, layers)]
    for bad in ([range(0, 1), range(2, layers)], [range(0, 0), range(0, layers)], [range(0, layers, 2), range(1, 2)],
                [[0], range(1, layers)], [range(0, layers)]):
        with pytest.raises(ValueError, match="f returned"):
            check_split(bad, layers, 2, "f")
