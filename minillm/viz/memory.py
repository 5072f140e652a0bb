"""Pictures of paged KV memory (lessons 03-04): block tables and the physical block pool.

    from minillm.viz.memory import draw_memory
    draw_memory({"A": [5, 0, 3], "B": [5, 1]}, num_blocks=8, seq_lens={"A": 10, "B": 6}, block_size=4)

Left, the **block tables**: one row per sequence, one cell per logical block, labelled
with the physical block it maps to. A cell is filled in proportion to the slots the
sequence uses, so the empty end of the last block (the only waste paging leaves) shows.
Right, the **pool**: every physical block, colored by the sequence that holds it. A block
held by several sequences is split into their colors and marked ×n, its reference count.
A free block that still holds a cached prefix (lesson 04) is gray; a free empty one white.

Every cell is a patch with a gid, so tests (and curious learners) can find it:
"table/<name>/<i>" and "fill/<name>/<i>" for table cells, "pool/<block>" for pool cells
and "pool/<block>/<name>" for the color strips of the sequences that hold it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..utils import cdiv

FREE = "#ffffff"       # never used, or freed and forgotten
CACHED = "#c8c8c8"     # free, but still holds a cached prefix that a new request can reclaim
EDGE = "#555555"
_LABEL_BOX = dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.8)


def owner_colors(names: Iterable[str]) -> dict[str, tuple]:
    """One color per sequence, in order (matplotlib's tab10, cycling after ten)."""
    palette = plt.get_cmap("tab10").colors
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def _fill_fraction(i: int, seq_len: int | None, block_size: int | None) -> float:
    """How much of logical block i a sequence of seq_len tokens uses (1.0 if unknown)."""
    if seq_len is None or not block_size:
        return 1.0
    return min(max((seq_len - i * block_size) / block_size, 0.0), 1.0)


def draw_block_tables(ax, tables: Mapping[str, Sequence[int]], seq_lens: Mapping[str, int] | None = None,
                      block_size: int | None = None, colors: Mapping[str, tuple] | None = None,
                      ref_counts: Sequence[int] | None = None) -> None:
    """Each sequence's block table as a row of cells: logical block i -> physical block id.
    With seq_lens and block_size, each cell is filled as far as the sequence's tokens go.
    A block with a reference count above 1 is hatched (it is shared)."""
    colors = colors or owner_colors(tables)
    names = list(tables)
    for row, name in enumerate(names):
        y = -row
        for i, block in enumerate(tables[name]):
            shared = ref_counts is not None and ref_counts[block] > 1
            frac = _fill_fraction(i, (seq_lens or {}).get(name), block_size)
            ax.add_patch(Rectangle((i, y), 1, 0.8, facecolor=FREE, edgecolor=EDGE, gid=f"table/{name}/{i}"))
            if frac > 0:
                ax.add_patch(Rectangle((i, y), frac, 0.8, facecolor=colors[name], edgecolor="none",
                                       alpha=0.85, hatch="///" if shared else None, gid=f"fill/{name}/{i}"))
            ax.text(i + 0.5, y + 0.4, str(block), ha="center", va="center", fontsize=8, bbox=_LABEL_BOX)
    width = max((len(t) for t in tables.values()), default=1)
    ax.set_xlim(-0.1, max(width, 4) + 0.1)
    ax.set_ylim(-len(names) + 0.7, 0.9)
    ax.set_yticks([-r + 0.4 for r in range(len(names))], names)
    ax.set_xticks([i + 0.5 for i in range(width)], [str(i) for i in range(width)])
    ax.tick_params(length=0)
    ax.set_aspect("equal")
    ax.set_xlabel("logical block")
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("block tables")


def draw_pool(ax, num_blocks: int, tables: Mapping[str, Sequence[int]], ref_counts: Sequence[int] | None = None,
              cached: Iterable[int] = (), cols: int = 16, colors: Mapping[str, tuple] | None = None) -> None:
    """The physical pool as a grid of num_blocks cells, block 0 at the top left. A held
    block is split into the colors of the sequences holding it and marked ×n when its
    reference count n is above 1; free blocks in `cached` are gray, other free ones white."""
    colors = colors or owner_colors(tables)
    cached = set(cached)
    holders: dict[int, list[str]] = {}
    for name, table in tables.items():
        for block in dict.fromkeys(table):
            holders.setdefault(block, []).append(name)
    for block in range(num_blocks):
        r, c = divmod(block, cols)
        x, y = c, -r
        owners = holders.get(block, [])
        refs = ref_counts[block] if ref_counts is not None else len(owners)
        face = CACHED if not owners and refs == 0 and block in cached else FREE
        ax.add_patch(Rectangle((x, y), 1, 0.9, facecolor=face, edgecolor=EDGE, gid=f"pool/{block}"))
        for k, name in enumerate(owners):        # vertical strips, one per holder
            w = 1 / len(owners)
            ax.add_patch(Rectangle((x + k * w, y), w, 0.9, facecolor=colors[name], edgecolor="none",
                                   alpha=0.85, gid=f"pool/{block}/{name}"))
        if num_blocks <= 256:
            ax.text(x + 0.5, y + 0.68, str(block), ha="center", va="center", fontsize=6, color="#333333")
        if refs > 1:
            ax.text(x + 0.5, y + 0.3, f"×{refs}", ha="center", va="center", fontsize=8, fontweight="bold",
                    bbox=_LABEL_BOX)
    rows = cdiv(num_blocks, cols)
    ax.set_xlim(-0.1, min(num_blocks, cols) + 0.1)
    ax.set_ylim(-rows + 0.9, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    used = sum(1 for b in range(num_blocks) if holders.get(b) or (ref_counts is not None and ref_counts[b]))
    ax.set_title(f"physical pool: {used} of {num_blocks} blocks in use")


def draw_memory(tables: Mapping[str, Sequence[int]], num_blocks: int, *, seq_lens: Mapping[str, int] | None = None,
                block_size: int | None = None, ref_counts: Sequence[int] | None = None,
                cached: Iterable[int] = (), cols: int = 16, title: str | None = None,
                colors: Mapping[str, tuple] | None = None):
    """Block tables (left) and the pool (right) in one figure, with a legend. Returns the figure.
    `colors` (name -> color) keeps a sequence's color fixed across pictures (default: tab10 in order)."""
    tables = {str(name): list(table) for name, table in tables.items()}
    seq_lens = {str(name): n for name, n in (seq_lens or {}).items()}
    cached = list(cached)
    colors = colors or owner_colors(tables)
    width = max((len(t) for t in tables.values()), default=1)
    pool_cols, pool_rows = min(num_blocks, cols), cdiv(num_blocks, cols)
    cell = min(0.45, 14 / (max(width, 4) + pool_cols))             # inches per block; the figure stays <= 16 in wide
    fig_w, fig_h = 2 + cell * (max(width, 4) + pool_cols), 1.9 + cell * max(len(tables), pool_rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(fig_w, fig_h),
                                      gridspec_kw={"width_ratios": [max(width, 4), pool_cols]})
    draw_block_tables(left, tables, seq_lens, block_size, colors, ref_counts)
    draw_pool(right, num_blocks, tables, ref_counts, cached, cols, colors)
    legend = [Patch(facecolor=colors[n], alpha=0.85, label=n) for n in tables]
    legend.append(Patch(facecolor=FREE, edgecolor=EDGE, label="free"))
    if cached:
        legend.append(Patch(facecolor=CACHED, edgecolor=EDGE, label="free, cached prefix"))
    if ref_counts is not None and any(r > 1 for r in ref_counts):
        legend.append(Patch(facecolor=FREE, edgecolor=EDGE, hatch="///", label="shared (×n: reference count)"))
    fig.legend(handles=legend, loc="lower center", ncol=min(len(legend), 8), frameon=False, fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.45 / fig_h, 1, 1))
    return fig


def _cached_free_blocks(bm) -> list[int]:
    """Free blocks the prefix cache still names (the reference PrefixCache keeps `hash_of`)."""
    names = getattr(bm.prefix_cache, "hash_of", None) or {}
    return [b for b in names if bm.allocator.ref_counts[b] == 0]


def draw_block_manager(bm, seqs: Mapping[str, object], title: str | None = None, cols: int = 16):
    """Draw a BlockManager's pool and the block tables of `seqs` ({name: Sequence}). Cells are
    filled up to each sequence's num_computed_tokens: the tokens whose K/V are stored."""
    return draw_memory({n: s.block_table for n, s in seqs.items()}, bm.allocator.num_blocks,
                       seq_lens={n: s.num_computed_tokens for n, s in seqs.items()}, block_size=bm.block_size,
                       ref_counts=bm.allocator.ref_counts, cached=_cached_free_blocks(bm), cols=cols, title=title)


def running_sequences(engine) -> dict[str, object]:
    """An engine's running sequences by name: the request id, with "#i" for sample i when n > 1."""
    seqs = sorted(engine.scheduler.running, key=lambda s: s.seq_id)
    return {(f"{s.request_id}#{s.index}" if s.params.n > 1 else str(s.request_id)): s for s in seqs}


def draw_engine(engine, title: str | None = None, cols: int = 16):
    """Draw an LLMEngine's KV memory now: every running sequence's block table and the pool.
    Sequences are named by request id, with "#i" for sample i of a request with n > 1."""
    return draw_block_manager(engine.block_manager, running_sequences(engine), title, cols)
