"""What the lessons' widgets share: controls above a matplotlib picture that every control redraws.

A widget is a live object only where a widget front-end runs it (JupyterLab, Colab). Elsewhere
(nbval, GitHub, nbconvert, a notebook reopened without its kernel) an output can only show what
was saved. So a `PictureWidget` displays as one output with two forms: the widget itself and a PNG
of its current picture. A front-end picks the richest form it can render: JupyterLab the widget, a
static renderer the PNG. The same picture, whichever you get.

A subclass writes `draw() -> (figure, caption)`; the figure is also kept in `self.fig`, so tests (and
curious learners) can look at its artists after moving a control from Python:

    w = SomeWidget(...)
    w.some_slider.value = 3        # what dragging the slider does
    w.fig, w.caption.value         # the picture and the caption it redrew
"""
from __future__ import annotations

import base64
import io

import ipywidgets as widgets
import matplotlib.pyplot as plt


def png_bytes(fig, dpi: int = 80) -> bytes:
    """The figure as PNG bytes (closed afterwards if pyplot knew it, so it is not shown twice)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


class PictureWidget(widgets.VBox):
    """Controls in a row, a caption, and the picture, redrawn whenever a watched control's value
    changes (`watched`: the controls whose values draw() reads; all of them by default)."""

    def __init__(self, controls: list, watched: list | None = None):
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.fig = None
        super().__init__([widgets.HBox(controls), self.caption, self.image])
        for control in controls if watched is None else watched:
            control.observe(lambda _change: self.redraw(), names="value")

    def draw(self):
        """Draw the current state: return (matplotlib figure, caption as HTML)."""
        raise NotImplementedError

    def redraw(self) -> None:
        self.fig, caption = self.draw()
        self.caption.value = caption
        self.image.value = png_bytes(self.fig)

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs) or {"text/plain": repr(self)}
        data["image/png"] = base64.b64encode(self.image.value).decode("ascii")    # the static fallback
        return data
