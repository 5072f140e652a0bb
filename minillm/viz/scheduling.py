"""Lessons 05-06: who ran in which engine step, as a picture.

Run an engine step by step while recording what its scheduler planned, then draw one
row per request and one column per step:

    from minillm.viz.scheduling import Timeline, plot_timeline, record_run

    timeline = record_run(engine)            # engine.step() until every request is done
    plot_timeline(timeline, title="continuous batching")

To add requests mid-run (a late, urgent one), drive the steps yourself:

    timeline = Timeline()
    for _ in range(3):
        timeline.step(engine)
    engine.add_request("urgent", prompt, params, priority=0)
    record_run(engine, timeline)

What a cell means, read from `engine.last_plan` after each step:
  prefill    the request fed (a chunk of) its prompt
  decode     it fed its newest token and got the next one
  recompute  it fed prompt + generated tokens again after a recompute preemption
  preempted  it was preempted in this step (lost its device blocks)
  swapped    its KV waited in CPU memory (swap preemption)
An empty cell is a request waiting, or done.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

KINDS = ("prefill", "decode", "recompute", "preempted", "swapped")
COLORS = {"prefill": "tab:blue", "decode": "tab:green", "recompute": "tab:orange",
          "preempted": "tab:red", "swapped": "lightgray"}


@dataclass
class Timeline:
    """What each engine step did, per request.

    request_ids:  rows, in the order requests were added
    cells:        one dict per step: request id -> (kind, tokens fed in that step)
    seconds:      wall time of each step
    first_token:  request id -> step in which it got its first generated token
    finished:     request id -> step in which it finished
    outputs:      request id -> its final RequestOutput
    queues:       one dict per step: "waiting" / "running" / "swapped" -> request ids, after the step
    budget:       the scheduler's max_num_batched_tokens (tokens one step may feed)
    """
    request_ids: list[str] = field(default_factory=list)
    cells: list[dict[str, tuple[str, int]]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    first_token: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    queues: list[dict[str, list[str]]] = field(default_factory=list)
    budget: int | None = None

    @property
    def num_steps(self) -> int:
        return len(self.cells)

    def step(self, engine) -> list:
        """Run one `engine.step()`, record what its scheduler planned, return its outputs."""
        seqs = [s for req in engine.requests.values() for s in req.seqs]
        for req_id in engine.requests:
            if req_id not in self.request_ids:
                self.request_ids.append(req_id)
        generated_before = {s.seq_id: len(s.output_token_ids) for s in seqs}

        t0 = time.perf_counter()
        outputs = engine.step()
        self.seconds.append(time.perf_counter() - t0)

        t = len(self.cells)
        plan = engine.last_plan
        cells: dict[str, tuple[str, int]] = {}
        for seq, n in plan.scheduled:
            had = generated_before.get(seq.seq_id, 0)
            kind = "prefill" if had == 0 else "decode" if n == 1 else "recompute"
            _, fed = cells.get(seq.request_id, (kind, 0))     # n > 1 samples share one row
            cells[seq.request_id] = (kind, fed + n)
        for seq in plan.preempted:
            cells[seq.request_id] = ("preempted", 0)
        for seq in engine.scheduler.swapped:
            cells.setdefault(seq.request_id, ("swapped", 0))
        self.cells.append(cells)
        sched = engine.scheduler
        self.queues.append({q: list(dict.fromkeys(s.request_id for s in getattr(sched, q)))
                            for q in ("waiting", "running", "swapped")})
        self.budget = sched.max_num_batched_tokens

        for seq in seqs:
            if seq.output_token_ids:
                self.first_token.setdefault(seq.request_id, t)
        for out in outputs:
            if out.finished:
                self.finished[out.request_id] = t
                self.outputs[out.request_id] = out
        return outputs

    def kinds_of(self, request_id: str) -> list[str | None]:
        """The request's row: its kind at every step (None: waiting or done)."""
        return [c.get(request_id, (None, 0))[0] for c in self.cells]


def record_run(engine, timeline: Timeline | None = None, max_steps: int = 100_000) -> Timeline:
    """Step the engine until it has no unfinished request, recording every step."""
    timeline = timeline if timeline is not None else Timeline()
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return timeline
        timeline.step(engine)
    raise RuntimeError(f"the engine still had unfinished requests after {max_steps} steps")


def _runs(row: list[str | None], merge=("decode", "swapped")):
    """(kind, first step, length) for each bar to draw: consecutive steps of a kind in
    `merge` make one bar; every other non-empty cell (a prefill chunk, a preemption) is
    its own bar, so chunks stay visible."""
    start = 0
    for t in range(1, len(row) + 1):
        if t == len(row) or row[t] != row[start] or row[start] not in merge:
            if row[start] is not None:
                yield row[start], start, t - start
            start = t


def plot_timeline(timeline: Timeline, ax=None, title: str | None = None, labels: dict | None = None):
    """One row per request (first added on top), one column per engine step, colored by
    what the request did in that step (each prefill chunk is its own box). `labels`
    renames rows (request id -> text). Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        rows = max(1, len(timeline.request_ids))
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.3 * rows))
    labels = labels or {}
    seen = set()
    for y, req_id in enumerate(timeline.request_ids):
        for kind, start, length in _runs(timeline.kinds_of(req_id)):
            seen.add(kind)
            ax.barh(y, length, left=start, height=0.8, color=COLORS[kind], edgecolor="white", linewidth=0.5,
                    hatch="//" if kind == "swapped" else None)
    ax.set_yticks(range(len(timeline.request_ids)))
    ax.set_yticklabels([labels.get(r, r) for r in timeline.request_ids])
    ax.set_ylim(len(timeline.request_ids) - 0.5, -0.5)
    ax.set_xlim(0, max(1, timeline.num_steps))
    ax.set_xlabel("engine step")
    if title:
        ax.set_title(title)
    ax.legend(handles=[Patch(facecolor=COLORS[k], edgecolor="white", label=k,
                             hatch="//" if k == "swapped" else None) for k in KINDS if k in seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return ax
