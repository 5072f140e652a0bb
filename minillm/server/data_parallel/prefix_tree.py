"""What the router believes a replica has cached: an approximate prefix tree of the prompts
it sent there, bounded in size, least recently used paths forgotten first.

The router cannot see a replica's KV pool (another process), so it remembers the prompts
it routed. A prompt is cut into pieces of `chunk_chars` characters, and each piece is named
by a hash chained to the one before, as lesson 04 names KV blocks: one name stands for the
whole prefix it ends, so the set of names *is* a trie (a name's parent is the name before
it), stored flat. The longest cached prefix of a new prompt is the longest run of its names,
from the first, that the set holds.

Approximate, as SGLang's router's tree is: characters, not tokens; a replica may have
evicted what the router still remembers (or the router forgotten what it still holds).
A wrong guess costs a prefill, never a wrong answer.

Memory is bounded: at most `max_chunks` names; past that, the least recently used go first.
Names are refreshed from the last piece to the first, so a parent is always fresher than its
children and eviction takes leaves before the prefixes they hang from.
"""
from __future__ import annotations

from collections import OrderedDict

CHUNK_CHARS = 16             # characters per piece: a match is counted in whole pieces
MAX_CHUNKS = 1 << 16         # names remembered per replica (about 1 M characters of prompts)


def chunk_keys(text: str, chunk_chars: int = CHUNK_CHARS) -> list[int]:
    """The chained names of `text`'s whole pieces (a partial last piece has none)."""
    keys, parent = [], 0
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        parent = hash((parent, text[start:start + chunk_chars]))
        keys.append(parent)
    return keys


class PrefixTree:
    def __init__(self, max_chunks: int = MAX_CHUNKS, chunk_chars: int = CHUNK_CHARS):
        if max_chunks < 1 or chunk_chars < 1:
            raise ValueError("max_chunks and chunk_chars must be >= 1")
        self.max_chunks, self.chunk_chars = max_chunks, chunk_chars
        self.names: OrderedDict[int, None] = OrderedDict()     # least recently used first

    def __len__(self) -> int:
        return len(self.names)

    def match(self, keys: list[int]) -> int:
        """How many characters of the prompt (named by `keys`) this tree holds, from the start."""
        n = 0
        for key in keys:
            if key not in self.names:
                break
            n += 1
        return n * self.chunk_chars

    def insert(self, keys: list[int]) -> None:
        """Remember the prompt named by `keys`: it was sent here, so its prefix is cached here now."""
        for key in reversed(keys):              # the first piece ends up the most recent
            self.names[key] = None
            self.names.move_to_end(key)
        while len(self.names) > self.max_chunks:
            self.names.popitem(last=False)
