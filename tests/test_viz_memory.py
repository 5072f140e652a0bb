"""minillm.viz.memory draws what the block tables and the pool hold (checked on Agg figures)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minillm.kv.block_manager import BlockManager  # noqa: E402
from minillm.sampling_params import SamplingParams  # noqa: E402
from minillm.engine.sequence import Sequence  # noqa: E402
from minillm.viz.memory import CACHED, FREE, draw_engine, draw_block_manager, draw_memory  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def patches(fig, prefix):
    """gid -> patch for every patch of the figure whose gid starts with prefix."""
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches
            if p.get_gid() and p.get_gid().startswith(prefix)}


def texts(ax):
    return [t.get_text() for t in ax.texts]


def test_tables_and_pool_have_one_cell_per_block():
    fig = draw_memory({"A": [5, 0, 3], "B": [5, 1]}, num_blocks=8, seq_lens={"A": 10, "B": 6}, block_size=4,
                      ref_counts=[1, 1, 0, 1, 0, 2, 0, 0], cached=[2], title="demo")
    tables, pool = fig.axes
    assert set(patches(fig, "table/")) == {"table/A/0", "table/A/1", "table/A/2", "table/B/0", "table/B/1"}
    assert texts(tables) == ["5", "0", "3", "5", "1"]                 # physical ids, row by row
    assert [t.get_text() for t in tables.get_yticklabels()] == ["A", "B"]
    cells = patches(fig, "pool/")
    assert {g for g in cells if g.count("/") == 1} == {f"pool/{b}" for b in range(8)}
    assert fig.get_suptitle() == "demo"
    assert pool.get_title() == "physical pool: 4 of 8 blocks in use"


def test_fill_shows_the_partly_used_last_block():
    fig = draw_memory({"A": [5, 0, 3], "B": [5, 1]}, num_blocks=8, seq_lens={"A": 10, "B": 6}, block_size=4)
    fills = patches(fig, "fill/")
    assert [fills[f"fill/A/{i}"].get_width() for i in range(3)] == [1.0, 1.0, 0.5]     # 10 tokens = 2.5 blocks
    assert [fills[f"fill/B/{i}"].get_width() for i in range(2)] == [1.0, 0.5]


def test_empty_logical_block_has_an_outline_but_no_fill():
    fig = draw_memory({"A": [2, 7]}, num_blocks=8, seq_lens={"A": 4}, block_size=4)
    assert "table/A/1" in patches(fig, "table/") and "fill/A/1" not in patches(fig, "fill/")


def test_shared_block_is_split_among_holders_and_marked_with_its_ref_count():
    fig = draw_memory({"A": [5, 0], "B": [5, 1], "C": [5]}, num_blocks=8, ref_counts=[1, 1, 0, 0, 0, 3, 0, 0])
    strips = patches(fig, "pool/5/")
    assert set(strips) == {"pool/5/A", "pool/5/B", "pool/5/C"}
    assert all(abs(s.get_width() - 1 / 3) < 1e-9 for s in strips.values())
    assert set(patches(fig, "pool/0/")) == {"pool/0/A"}
    pool = fig.axes[1]
    assert texts(pool).count("×3") == 1 and not any(t in ("×1", "×2") for t in texts(pool))
    hatched = {g for g, p in patches(fig, "fill/").items() if p.get_hatch()}
    assert hatched == {"fill/A/0", "fill/B/0", "fill/C/0"}            # only the shared block
    assert any(t.get_text().startswith("shared") for t in fig.legends[0].get_texts())


def test_free_blocks_are_white_and_cached_free_blocks_gray():
    fig = draw_memory({"A": [0]}, num_blocks=4, ref_counts=[1, 0, 0, 0], cached=[2])
    cells = patches(fig, "pool/")
    to_rgb = matplotlib.colors.to_rgba
    assert cells["pool/2"].get_facecolor() == to_rgb(CACHED)
    assert cells["pool/1"].get_facecolor() == to_rgb(FREE) == cells["pool/3"].get_facecolor()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["A", "free", "free, cached prefix"]


def test_pool_wraps_into_rows_of_cols_blocks():
    fig = draw_memory({"A": [0, 20]}, num_blocks=24, cols=8)
    cells = patches(fig, "pool/")
    assert cells["pool/7"].get_xy() == (7, 0) and cells["pool/8"].get_xy() == (0, -1)
    assert cells["pool/20"].get_xy() == (4, -2)


def seq(i, n):
    return Sequence(i, f"r{i}", list(range(100 * i, 100 * i + n)), SamplingParams())


def computed(bm, s):
    bm.allocate(s)
    bm.append_slots(s, s.num_uncomputed_tokens)
    bm.mark_computed(s, s.num_uncomputed_tokens)


def test_block_manager_after_fork_and_copy_on_write():
    bm = BlockManager(12, 4)
    parent, child = seq(1, 10), seq(2, 10)
    computed(bm, parent)
    bm.fork(parent, child)
    fig = draw_block_manager(bm, {"parent": parent, "child": child})
    assert texts(fig.axes[1]).count("×2") == 3                         # all 3 blocks shared after fork
    child.output_token_ids.append(7)
    bm.append_slots(child, 1)                                          # writes into the shared partial block
    bm.mark_computed(child, 1)
    fig = draw_block_manager(bm, {"parent": parent, "child": child})
    assert texts(fig.axes[1]).count("×2") == 2
    copy = child.block_table[2]
    assert set(patches(fig, f"pool/{copy}/")) == {f"pool/{copy}/child"}
    assert patches(fig, "fill/")["fill/child/2"].get_width() == 0.75   # 11 tokens computed


def test_block_manager_shows_freed_cached_prefix_blocks_gray():
    bm = BlockManager(8, 4)
    done, running = seq(1, 9), seq(2, 3)
    computed(bm, done)                        # blocks 0, 1 full (named in the prefix cache), block 2 partial
    table = list(done.block_table)
    bm.free(done)
    computed(bm, running)                     # takes a never-used block
    fig = draw_block_manager(bm, {"running": running})
    cells = patches(fig, "pool/")
    gray = {g for g, p in cells.items() if p.get_facecolor() == matplotlib.colors.to_rgba(CACHED)}
    assert gray == {f"pool/{table[0]}", f"pool/{table[1]}"}
    assert running.block_table[0] not in table


def test_draw_engine_names_the_samples_of_a_request():
    from minillm.engine.engine import LLMEngine
    from minillm.models import load_model

    model, tokenizer = load_model("tiny-llama", device="cpu")
    engine = LLMEngine(model, tokenizer, num_kv_blocks=16, block_size=4)
    engine.add_request("req", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, max_tokens=4, seed=0))
    engine.step()                             # prefill, then the fork: both samples share the prompt's blocks
    fig = draw_engine(engine, title="n=2")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["req#0", "req#1"]
    assert texts(fig.axes[1]).count("×2") == 2
