"""The lessons' widgets, driven from Python with no front-end: move a control as a learner would
(set its value), then check the picture (the matplotlib artists of `widget.fig`), the caption and
the PNG it shows changed accordingly, and that the static fallback carries that same PNG."""
import base64

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from minillm.engine.engine import LLMEngine  # noqa: E402
from minillm.models import load_model  # noqa: E402
from minillm.sampling_params import SamplingParams  # noqa: E402
from minillm.viz.block_stepper import BlockStepper, record_blocks  # noqa: E402
from minillm.viz.sampling_playground import KEPT, SamplingPlayground  # noqa: E402
from minillm.viz.scheduler_player import SchedulerPlayer  # noqa: E402
from minillm.viz.scheduling import COLORS, record_run  # noqa: E402

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def gids(fig, prefix):
    """gid -> artist for every patch of the figure whose gid starts with prefix."""
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)}


def assert_static_fallback_is_the_picture(widget):
    bundle = widget._repr_mimebundle_()
    assert WIDGET_VIEW in bundle and "text/plain" in bundle            # the live widget, where a front-end runs
    assert base64.b64decode(bundle["image/png"]) == widget.image.value  # the same picture, where none does
    assert bytes(widget.image.value).startswith(b"\x89PNG")


# ---- lesson 01: the sampling playground

def test_top_k_slider_highlights_exactly_k_bars(tiny):
    model, tokenizer = tiny
    pg = SamplingPlayground(model, tokenizer, [1, 2, 3, 4], show=20)
    assert len(gids(pg.fig, "kept/")) == 20 and not gids(pg.fig, "cut/")   # no filter: every bar kept
    before = pg.image.value
    pg.top_k.value = 5
    kept = gids(pg.fig, "kept/")
    assert sorted(kept) == [f"kept/{x}" for x in range(5)]                 # the 5 most likely, highlighted
    assert len(gids(pg.fig, "cut/")) == 15
    assert all(p.get_facecolor() == to_rgba(KEPT) for p in kept.values())
    assert "<b>5</b> tokens kept" in pg.caption.value and pg.image.value != before
    assert int(pg.kept().sum()) == 5
    assert_static_fallback_is_the_picture(pg)


def test_top_p_keeps_the_nucleus_and_temperature_reshapes_it(tiny):
    model, tokenizer = tiny
    pg = SamplingPlayground(model, tokenizer, [1, 2, 3, 4], show=20, top_p=0.3)
    probs = pg.logits.softmax(-1).sort(descending=True).values
    nucleus = int((probs.cumsum(0) - probs < 0.3).sum())                   # tokens needed to reach 0.3
    assert int(pg.kept().sum()) == nucleus
    assert len(gids(pg.fig, "kept/")) == min(nucleus, 20)                  # the shown ones of them
    heights = [p.get_height() for p in gids(pg.fig, "kept/").values()]
    pg.temperature.value = 0.5                                             # sharper: fewer tokens reach 0.3
    assert int(pg.kept().sum()) <= nucleus
    top_height = gids(pg.fig, "kept/")["kept/0"].get_height()
    assert top_height > heights[0]
    assert top_height == pytest.approx((pg.logits / 0.5).softmax(-1).max().item())


# ---- lessons 03-04: the block-map stepper

@pytest.fixture(scope="module")
def block_run(tiny):
    """n=2 samples share a 10-token prompt (blocks of 4), then a later request reuses its cached prefix."""
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, num_kv_blocks=16, block_size=4)
    engine.add_request("a", list(range(10, 20)), SamplingParams(n=2, max_tokens=6, ignore_eos=True, seed=0))
    snapshots = record_blocks(engine)
    engine.add_request("b", list(range(10, 22)), SamplingParams(max_tokens=3, ignore_eos=True, temperature=0))
    return record_blocks(engine, snapshots)


def pool_owners(fig):
    """block -> names of the sequences whose color strips fill it."""
    owners = {}
    for gid in gids(fig, "pool/"):
        _, block, *name = gid.split("/")
        owners.setdefault(int(block), [])
        if name:
            owners[int(block)].append(name[0])
    return owners


def test_block_stepper_shows_the_copy_on_write_between_two_steps(block_run):
    stepper = BlockStepper(block_run, cols=8)
    assert stepper.step.max == len(block_run) - 1
    shared = pool_owners(stepper.fig)
    assert shared[2] == ["a#0", "a#1"]                                     # after the fork: the partial block shared
    assert [t.get_text() for t in stepper.fig.axes[1].texts].count("×2") == 3
    color = gids(stepper.fig, "pool/2/a#0")["pool/2/a#0"].get_facecolor()
    stepper.step.value = 1                                                 # the first decode writes into block 2
    copied = pool_owners(stepper.fig)
    assert copied[2] == ["a#1"] and copied[3] == ["a#0"]                   # a#0 got its own copy
    assert [t.get_text() for t in stepper.fig.axes[1].texts].count("×2") == 2
    assert gids(stepper.fig, "pool/3/a#0")["pool/3/a#0"].get_facecolor() == color   # same color every step
    assert "step 1:" in stepper.caption.value and "(2 shared)" in stepper.caption.value
    assert_static_fallback_is_the_picture(stepper)


def test_block_stepper_shows_freed_blocks_cached_then_reused(block_run):
    stepper = BlockStepper(block_run, cols=8)
    done = next(i for i, s in enumerate(block_run) if "a" in s.finished)
    stepper.step.value = done
    cells = gids(stepper.fig, "pool/")
    gray = {g for g, p in cells.items() if p.get_facecolor() == to_rgba("#c8c8c8")}
    assert {"pool/0", "pool/1"} <= gray                                   # the prompt's full blocks stay cached
    assert "finished in this step: a" in stepper.caption.value
    stepper.step.value = done + 1                                          # b arrives with the same first 8 tokens
    assert pool_owners(stepper.fig)[0] == ["b"] and pool_owners(stepper.fig)[1] == ["b"]
    assert "running: b" in stepper.caption.value


# ---- lessons 05-06: the scheduler player

@pytest.fixture(scope="module")
def pressured(tiny):
    """5 requests, 3 seats, a 16-token budget and a 10-block pool: queues, chunks and a swap preemption."""
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, num_kv_blocks=10, block_size=4, max_num_seqs=3, max_num_batched_tokens=16,
                       preemption_mode="swap")
    for i in range(5):
        engine.add_request(f"r{i}", list(range(10 + i, 20 + i)), SamplingParams(max_tokens=8, ignore_eos=True,
                                                                                  temperature=0))
    return record_run(engine)


def test_player_shows_the_queues_and_the_budget_of_each_step(pressured):
    player = SchedulerPlayer(pressured)
    assert player.state() == dict(step=0, budget=16, fed={"r0": ("prefill", 10), "r1": ("prefill", 6)},
                                  preempted=[], finished=[], waiting=["r2", "r3", "r4"], running=["r0", "r1"],
                                  swapped=[])
    assert set(gids(player.fig, "waiting/")) == {"waiting/r2", "waiting/r3", "waiting/r4"}
    assert sum(p.get_width() for p in gids(player.fig, "budget/").values()) == 16     # the whole budget fed
    before = player.image.value
    player.step.value = 1
    assert player.state()["waiting"] == ["r3", "r4"] and "r2" in player.state()["running"]
    assert set(gids(player.fig, "waiting/")) == {"waiting/r3", "waiting/r4"}
    assert "waiting: [r3, r4]" in player.caption.value and player.image.value != before
    assert gids(player.fig, "now")["now"].get_x() == 1                     # the marked column moved
    assert_static_fallback_is_the_picture(player)


def test_player_marks_the_preemption_and_the_swapped_queue(pressured):
    player = SchedulerPlayer(pressured)
    t = next(i for i, cells in enumerate(pressured.cells) if any(k == "preempted" for k, _ in cells.values()))
    player.step.value = t
    victim = player.state()["preempted"][0]
    assert victim in player.state()["swapped"]
    box = gids(player.fig, f"swapped/{victim}")[f"swapped/{victim}"]
    assert box.get_facecolor() == to_rgba(COLORS["preempted"])
    assert f"preempted: {victim}" in player.caption.value
    player.step.value = t + 1
    assert not player.state()["preempted"]
    assert gids(player.fig, f"swapped/{victim}")[f"swapped/{victim}"].get_facecolor() == to_rgba("lightgray")


def test_player_switches_runs_and_keeps_the_step_in_range(pressured, tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, num_kv_blocks=16, block_size=4)
    engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True, temperature=0))
    short = record_run(engine)
    player = SchedulerPlayer({"long": pressured, "short": short})
    player.step.value = pressured.num_steps - 1
    player.run.value = "short"
    assert player.step.max == player.play.max == short.num_steps - 1
    assert player.step.value == short.num_steps - 1
    assert player.state()["running"] == (["x"] if player.step.value < short.finished["x"] else [])
    assert player.fig.axes[0].get_title().startswith("short: step")


def test_widgets_refuse_empty_recordings():
    from minillm.viz.scheduling import Timeline

    with pytest.raises(ValueError, match="record_blocks"):
        BlockStepper([])
    with pytest.raises(ValueError, match="record_run"):
        SchedulerPlayer(Timeline())


def test_playground_logits_come_from_the_model(tiny):
    from minillm.baselines.naive_generation import next_token_logits_naive

    model, tokenizer = tiny
    pg = SamplingPlayground(model, tokenizer, [5, 6, 7])
    assert torch.equal(pg.logits, next_token_logits_naive(model, [5, 6, 7]).float())
