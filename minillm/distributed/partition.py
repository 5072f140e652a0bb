"""Pipeline parallelism's first decision: which decoder layers each stage runs.

A pipeline is only as fast as its slowest stage (every micro-batch waits for it), so the split
minimises the largest stage's cost, with each stage a contiguous run of layers (hidden states
flow forward only). For a Llama the layers are identical, so the cost of a layer is its weights'
size (a decode step reads every weight once); the last stage also scores the vocabulary, so its
last layer carries the head's cost too, and gets fewer layers when the head is large.

    balanced_partition([1, 1, 1, 1, 3], 2)  ->  [range(0, 3), range(3, 5)]   # 3 against 4
"""
from __future__ import annotations


def balanced_partition(costs: list[float], stages: int) -> list[range]:
    """Contiguous ranges of layer indices, one per stage, every stage at least one layer,
    minimising the largest stage's summed cost (ties: earlier stages take fewer layers, the
    first stage also embeds). Exact, by dynamic programming over (layers, stages): O(L^2 P)."""
    n = len(costs)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")
    if stages > n:
        raise ValueError(f"{stages} pipeline stages need at least {stages} layers, the model has {n}")
    if any(c < 0 for c in costs):
        raise ValueError("layer costs must be >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[p][i]: the smallest possible largest stage for layers 0..i-1 in p stages; cut[p][i]: the last stage's start
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for i in range(p, n + 1):
            for j in range(p - 1, i):                    # the last stage is layers j..i-1
                worst = max(best[p - 1][j], prefix[i] - prefix[j])
                if worst < best[p][i] - 1e-12:          # strict: on a tie the earliest cut stays
                    best[p][i], cut[p][i] = worst, j
    ranges, end = [], n
    for p in range(stages, 0, -1):
        start = cut[p][end]
        ranges.append(range(start, end))
        end = start
    return ranges[::-1]


def check_split(ranges, layers: int, stages: int, who: str) -> list[range]:
    """`ranges` as a list, if it is `stages` non-empty contiguous ranges covering layers 0..layers-1 in
    order (a lesson's partition_fn is plugged in here); else a ValueError naming `who`."""
    ranges = list(ranges)
    ok = (len(ranges) == stages and all(isinstance(r, range) and r.step == 1 and len(r) for r in ranges)
          and [r.start for r in ranges] == [0] + [r.stop for r in ranges[:-1]] and ranges[-1].stop == layers)
    if not ok:
        raise ValueError(f"{who} returned {ranges!r}: expected {stages} contiguous, non-empty ranges covering "
                         f"layers 0..{layers - 1} in order")
    return ranges


def layer_costs(model) -> list[float]:
    """Each decoder layer's weight count; the last one also carries the head's (module doc)."""
    layers = model.model.layers
    costs = [float(sum(p.numel() for p in layer.parameters())) for layer in layers]
    costs[-1] += float(model.lm_head.weight.numel())
    return costs


def describe(ranges: list[range], costs: list[float]) -> str:
    """One line per stage, as printed at startup: its layers and its share of the cost."""
    total = sum(costs) or 1.0
    return "\n".join(f"  stage {s}: layers {r.start}-{r.stop - 1} ({len(r)} layers, "
                     f"{100 * sum(costs[i] for i in r) / total:.0f}% of the cost)" for s, r in enumerate(ranges))


def micro_batches(tokens: list[int], m: int) -> list[range]:
    """Pipeline parallelism's second decision: which of a step's sequences travel together.
    Contiguous ranges of the plan (so the sampled rows keep the plan's order), at most `m`, none
    empty, cut where the running token count passes each k/m of the total (a stage's time grows
    with its micro-batch's tokens). Greedy, O(n): this runs every step.

        micro_batches([1, 1, 1, 1], 2)   ->  [range(0, 2), range(2, 4)]
        micro_batches([30, 1, 1], 2)     ->  [range(0, 1), range(1, 3)]     # a prefill chunk alone
    """
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"micro-batches must be an int >= 1, got {m!r}")
    n = len(tokens)
    m, total = min(m, n), sum(tokens)
    cuts, seen = [0], 0
    for i, t in enumerate(tokens[:-1]):
        seen += t
        k = len(cuts)                                   # the cut we are looking for
        if k < m and (seen * m >= k * total or n - (i + 1) == m - k):   # its share reached, or one seq per part left
            cuts.append(i + 1)
    return [range(a, b) for a, b in zip(cuts, cuts[1:] + [n])] if n else []
