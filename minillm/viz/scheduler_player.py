"""Lessons 05-06: the scheduler player. Replay a recorded run step by step: the timeline with the
current step marked, the waiting / running / swapped queues after it, and how much of the token
budget the step fed to whom. Preemptions show in red.

    from minillm.viz.scheduler_player import SchedulerPlayer
    from minillm.viz.scheduling import record_run

    timeline = record_run(engine)
    SchedulerPlayer(timeline)                                    # or several runs, to compare:
    SchedulerPlayer({"static": static_timeline, "continuous": continuous_timeline})

A timeline is `minillm.viz.scheduling.Timeline`; it records the queues after every step.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from minillm.viz.scheduling import COLORS, Timeline, plot_timeline
from minillm.viz.widgets import PictureWidget

QUEUES = ("waiting", "running", "swapped")


class SchedulerPlayer(PictureWidget):
    def __init__(self, timelines: Timeline | dict[str, Timeline], step: int = 0):
        self.timelines = timelines if isinstance(timelines, dict) else {"run": timelines}
        if any(not t.queues for t in self.timelines.values()):
            raise ValueError("a timeline without recorded steps: record it with record_run(engine)")
        self.run = widgets.Dropdown(options=list(self.timelines), description="run")
        self.step = widgets.IntSlider(step, min=0, max=self.timeline.num_steps - 1, description="engine step",
                                      continuous_update=False)
        self.play = widgets.Play(step, min=0, max=self.step.max, interval=600, description="play")
        widgets.jslink((self.play, "value"), (self.step, "value"))
        widgets.jslink((self.step, "max"), (self.play, "max"))
        controls = ([self.run] if len(self.timelines) > 1 else []) + [self.play, self.step]
        super().__init__(controls, watched=[self.step])
        self.run.observe(self._switch, names="value")
        self.redraw()

    @property
    def timeline(self) -> Timeline:
        return self.timelines[self.run.value]

    def _switch(self, _change) -> None:
        self.step.value = min(self.step.value, self.timeline.num_steps - 1)
        self.step.max = self.play.max = self.timeline.num_steps - 1
        self.redraw()

    def state(self, t: int | None = None) -> dict:
        """What step t (default: the slider's) shows: the queues after it, who was fed how many
        tokens (request id -> (kind, tokens)), who was preempted, who finished, the budget."""
        tl = self.timeline
        t = self.step.value if t is None else t
        cells = tl.cells[t]
        return dict(step=t, budget=tl.budget, fed={r: c for r, c in cells.items() if c[1] > 0},
                    preempted=[r for r, (kind, _) in cells.items() if kind == "preempted"],
                    finished=[r for r, s in tl.finished.items() if s == t], **tl.queues[t])

    def draw(self):
        tl, s = self.timeline, self.state()
        fig = Figure(figsize=(10, 2.6 + 0.28 * len(tl.request_ids)), layout="constrained")
        top, mid, low = fig.subplots(3, 1, gridspec_kw={"height_ratios": [max(2, 0.28 * len(tl.request_ids)), 1.2,
                                                                           0.3]})
        plot_timeline(tl, ax=top, title=f"{self.run.value}: step {s['step']} of {tl.num_steps - 1}")
        top.axvspan(s["step"], s["step"] + 1, facecolor="gold", alpha=0.35, zorder=0)
        top.axvspan(s["step"], s["step"] + 1, facecolor="none", edgecolor="black", linewidth=1.5, zorder=3,
                    gid="now")
        self._draw_queues(mid, s)
        self._draw_budget(low, s)
        names = lambda ids: html.escape(", ".join(ids))                   # noqa: E731
        fed = sum(n for _, n in s["fed"].values())
        parts = ", ".join(f"{html.escape(r)} {kind} {n}" for r, (kind, n) in s["fed"].items()) or "nothing"
        caption = f"step {s['step']}: fed <b>{fed}</b> of a budget of {s['budget']} tokens ({parts})"
        if s["preempted"]:
            caption += f"; <b style='color:#d62728'>preempted: {names(s['preempted'])}</b>"
        if s["finished"]:
            caption += f"; finished: {names(s['finished'])}"
        caption += "<br>" + " &nbsp; ".join(f"{q}: [{names(s[q])}]" for q in QUEUES)
        return fig, caption

    def _draw_queues(self, ax, s):
        """One row per queue, one box per request in queue order, colored by what it did in the step."""
        for row, queue in enumerate(QUEUES):
            for i, req in enumerate(s[queue]):
                kind = "preempted" if req in s["preempted"] else s["fed"].get(req, (None,))[0]
                face = COLORS[kind] if kind else ("lightgray" if queue == "swapped" else "white")
                ax.add_patch(Rectangle((i * 1.1, -row), 1, 0.8, facecolor=face, edgecolor="#555555",
                                       hatch="//" if queue == "swapped" else None, gid=f"{queue}/{req}"))
                ax.text(i * 1.1 + 0.5, -row + 0.4, req, ha="center", va="center", fontsize=7)
        width = max([len(s[q]) for q in QUEUES] + [8])
        ax.set_xlim(-0.1, width * 1.1)
        ax.set_ylim(-len(QUEUES) + 0.8, 0.9)
        ax.set_yticks([-r + 0.4 for r in range(len(QUEUES))], [f"{q} ({len(s[q])})" for q in QUEUES])
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title("queues after the step (white: held back this step)", fontsize=9)

    def _draw_budget(self, ax, s):
        """The step's token budget as one bar, split among the requests it fed."""
        left = 0
        for req, (kind, n) in s["fed"].items():
            ax.barh(0, n, left=left, color=COLORS[kind], edgecolor="white", gid=f"budget/{req}")
            if n >= 0.06 * s["budget"]:
                ax.text(left + n / 2, 0, f"{req} {n}", ha="center", va="center", fontsize=7)
            left += n
        ax.set_xlim(0, s["budget"])
        ax.set_yticks([0], ["budget"])
        ax.set_xlabel(f"tokens fed in this step: {left} of {s['budget']}")
