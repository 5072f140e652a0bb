"""Lesson 01: the sampling playground. Sliders for temperature, top-k and top-p reshape the real
model's next-token distribution for one prompt; the tokens a draw can still pick are highlighted.

    from minillm.viz.sampling_playground import SamplingPlayground
    SamplingPlayground(model, tokenizer, prompt_ids)

The model runs once (`minillm.baselines.naive_generation.next_token_logits_naive`); each slider move only redoes what the
sampler does to those logits: divide by the temperature, `apply_top_k`, `apply_top_p`
(`minillm.sample.sampler`, the reference of the lesson's exercise 1). Bars are the `show` most likely tokens'
probabilities at this temperature, blue if kept, gray if cut; a black tick marks a kept token's
probability after the cut (the kept ones, renormalized: what the draw really uses).
top_k = 0 and top_p = 1.0 switch that filter off, as in `SamplingParams`.
"""
from __future__ import annotations

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from minillm.baselines.naive_generation import next_token_logits_naive
from minillm.sample.sampler import apply_top_k, apply_top_p
from minillm.text.tokenizer import prompt_to_ids
from minillm.viz.widgets import PictureWidget

KEPT, CUT = "tab:blue", "#d0d0d0"


class SamplingPlayground(PictureWidget):
    def __init__(self, model, tokenizer, prompt, *, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, show: int = 30):
        with torch.inference_mode():
            self.logits = next_token_logits_naive(model, prompt_to_ids(tokenizer, prompt)).float().cpu()
        self.show = show
        top = self.logits.topk(show).indices.tolist()                      # the same tokens at any temperature
        self.labels = [repr(tokenizer.decode([t]))[1:-1] or "∅" for t in top]
        self.top = torch.tensor(top)
        slider = dict(continuous_update=False, style={"description_width": "initial"})
        self.temperature = widgets.FloatSlider(temperature, min=0.1, max=2.0, step=0.05, description="temperature",
                                               **slider)
        self.top_k = widgets.IntSlider(top_k, min=0, max=show, description="top-k (0: off)", **slider)
        self.top_p = widgets.FloatSlider(top_p, min=0.05, max=1.0, step=0.05, description="top-p", **slider)
        super().__init__([self.temperature, self.top_k, self.top_p])
        self.redraw()

    def kept(self) -> torch.Tensor:
        """A bool mask over the vocabulary: the tokens a draw can pick with the sliders' settings."""
        scaled = self.logits / self.temperature.value
        return torch.isfinite(apply_top_p(apply_top_k(scaled, self.top_k.value), self.top_p.value))

    def draw(self):
        scaled = self.logits / self.temperature.value
        probs, kept = scaled.softmax(-1), self.kept()
        after = torch.where(kept, scaled, float("-inf")).softmax(-1)        # what the draw uses
        shown_probs, shown_kept, shown_after = probs[self.top], kept[self.top], after[self.top]

        fig = Figure(figsize=(9, 3.4))
        ax = fig.subplots()
        for x, (p, k) in enumerate(zip(shown_probs.tolist(), shown_kept.tolist())):
            ax.bar(x, p, color=KEPT if k else CUT, gid=f"{'kept' if k else 'cut'}/{x}")
        xs = [x for x in range(self.show) if shown_kept[x]]
        ax.scatter(xs, shown_after[xs].tolist(), marker="_", s=200, color="black", zorder=3,
                   label="probability after the cut")
        ax.set_xticks(range(self.show), self.labels, rotation=90, fontsize=8)
        ax.set_xlim(-0.6, self.show - 0.4)
        ax.set_ylim(0, 1.08 * max(shown_probs.max().item(), shown_after.max().item()))
        ax.set_ylabel("probability")
        n, mass = int(kept.sum()), probs[kept].sum().item()
        ax.set_title(f"T={self.temperature.value:.2f}, top-k={self.top_k.value}, top-p={self.top_p.value:.2f}: "
                     f"{n} token{'s' * (n != 1)} kept, {mass:.0%} of the probability")
        ax.legend(loc="upper right", frameon=False, fontsize=8)
        fig.tight_layout()
        more = f" ({n - len(xs)} of them beyond the {self.show} shown)" if n > len(xs) else ""
        caption = (f"<b>{n}</b> token{'s' * (n != 1)} kept{more}, holding <b>{mass:.1%}</b> of the probability "
                   f"at temperature {self.temperature.value:.2f}; a draw picks among them in proportion "
                   f"to the black ticks.")
        return fig, caption
