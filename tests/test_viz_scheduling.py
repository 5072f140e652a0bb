"""minillm.viz.scheduling: the step recorder reads the scheduler's plans right, and the
timeline picture draws what was recorded (Agg backend, asserts on the artists)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from minillm.baselines.static_batching import StaticBatchScheduler  # noqa: E402
from minillm.engine.engine import LLMEngine  # noqa: E402
from minillm.models import load_model  # noqa: E402
from minillm.sampling_params import SamplingParams  # noqa: E402
from minillm.viz.scheduling import COLORS, Timeline, _runs, plot_timeline, record_run  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def bars(ax):
    """(row, first step, length, kind) of every bar drawn, kind found from its color."""
    by_color = {to_rgba(c): k for k, c in COLORS.items()}
    return sorted((round(p.get_y() + p.get_height() / 2), round(p.get_x()), round(p.get_width()),
                   by_color[p.get_facecolor()]) for p in ax.patches)


def test_runs_merge_decodes_but_keep_each_prefill_chunk_and_skip_empty_cells():
    row = [None, "prefill", "prefill", "decode", None, "decode", "decode", "preempted", "swapped", "swapped",
           "recompute", "recompute"]
    assert list(_runs(row)) == [("prefill", 1, 1), ("prefill", 2, 1), ("decode", 3, 1), ("decode", 5, 2),
                                ("preempted", 7, 1), ("swapped", 8, 2), ("recompute", 10, 1), ("recompute", 11, 1)]
    assert list(_runs([])) == []


def test_continuous_batching_timeline_prefill_then_decodes(tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64, max_num_seqs=2)
    for rid, n in (("a", 3), ("b", 5), ("c", 2)):
        engine.add_request(rid, [1000 + ord(rid)] * 6, greedy(n))
    tl = record_run(engine)
    assert tl.request_ids == ["a", "b", "c"]
    # a and b start together; c takes a's place the step after a finishes
    assert tl.kinds_of("a") == ["prefill", "decode", "decode", None, None]
    assert tl.kinds_of("b") == ["prefill"] + ["decode"] * 4
    assert tl.kinds_of("c") == [None, None, None, "prefill", "decode"]
    assert tl.cells[0]["a"] == ("prefill", 6) and tl.cells[1]["b"] == ("decode", 1)
    assert tl.first_token == {"a": 0, "b": 0, "c": 3}
    assert tl.finished == {"a": 2, "b": 4, "c": 4}
    assert [len(tl.outputs[r].outputs[0].token_ids) for r in "abc"] == [3, 5, 2]
    assert tl.num_steps == len(tl.seconds) == 5 and all(s >= 0 for s in tl.seconds)

    ax = plot_timeline(tl, title="continuous")
    assert bars(ax) == [(0, 0, 1, "prefill"), (0, 1, 2, "decode"),
                        (1, 0, 1, "prefill"), (1, 1, 4, "decode"),
                        (2, 3, 1, "prefill"), (2, 4, 1, "decode")]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert ax.get_ylim()[0] > ax.get_ylim()[1]             # first request on top
    assert ax.get_title() == "continuous" and ax.get_xlabel() == "engine step"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["prefill", "decode"]
    plt.close("all")


def test_static_batching_leaves_the_late_request_waiting(tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64, max_num_seqs=2,
                       scheduler_cls=StaticBatchScheduler)
    for rid, n in (("a", 2), ("b", 5), ("c", 2)):
        engine.add_request(rid, [1000 + ord(rid)] * 6, greedy(n))
    tl = record_run(engine)
    assert tl.kinds_of("c")[:5] == [None] * 5                # waits for b, though a ended at step 1
    assert tl.first_token["c"] == 5


def test_preemption_chunked_prefill_and_swap_are_recorded(tiny):
    model, tokenizer = tiny
    # 3 sequences of 9 + 12 tokens need 18 blocks of 4 at their longest: 10 force preemption
    for mode, after in (("recompute", "recompute"), ("swap", "swapped")):
        engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=10, preemption_mode=mode)
        for i in range(3):
            engine.add_request(str(i), [1000 + i] * 9, greedy(12))
        tl = record_run(engine)
        kinds = [k for r in tl.request_ids for k in tl.kinds_of(r)]
        assert kinds.count("preempted") == engine.stats()["num_preemptions"] > 0
        assert after in kinds, mode
        row = next(tl.kinds_of(r) for r in tl.request_ids if "preempted" in tl.kinds_of(r))
        resumed = row[row.index("preempted") + 1:]
        if mode == "recompute":
            assert next(k for k in resumed if k) == "recompute"  # prompt + generated tokens fed again
        else:
            assert resumed[0] == "swapped" and "recompute" not in row
        assert set(tl.finished) == {"0", "1", "2"}
        ax = plot_timeline(tl)
        drawn = {k for *_, k in bars(ax)}
        assert {"prefill", "decode", "preempted", after} <= drawn
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [k for k in
                                                                     ("prefill", "decode", "recompute",
                                                                      "preempted", "swapped") if k in drawn]
        if mode == "swap":
            assert any(p.get_hatch() == "//" for p in ax.patches)
        plt.close("all")

    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64, enable_chunked_prefill=True,
                       max_num_batched_tokens=8)
    engine.add_request("short", [1000] * 3, greedy(6))
    tl = Timeline()
    tl.step(engine)                                          # prefill of "short"
    engine.add_request("long", [2000] * 20, greedy(2))       # added mid-run
    record_run(engine, tl)
    assert tl.request_ids == ["short", "long"]
    assert tl.cells[1] == {"short": ("decode", 1), "long": ("prefill", 7)}   # chunk beside a decode
    assert tl.kinds_of("long")[1:4] == ["prefill"] * 3 and tl.first_token["long"] == 3
    ax = plot_timeline(tl)
    assert [b for b in bars(ax) if b[0] == 1 and b[3] == "prefill"] == [(1, t, 1, "prefill") for t in (1, 2, 3)]
    plt.close("all")


def test_labels_and_given_axes(tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, block_size=4, num_kv_blocks=64)
    engine.add_request("x", [1000] * 4, greedy(2))
    tl = record_run(engine)
    fig, ax = plt.subplots()
    assert plot_timeline(tl, ax=ax, labels={"x": "request x"}) is ax
    assert [t.get_text() for t in ax.get_yticklabels()] == ["request x"]
    with pytest.raises(RuntimeError, match="unfinished"):
        engine.add_request("y", [1000] * 4, greedy(5))
        record_run(engine, max_steps=2)
    plt.close("all")
