"""A `choice` constraint written by hand: the teaching version of lesson 12's exercise 2.

The engine does not use it: `StructuredOutputsParams(choice=[...])` becomes a grammar that
llguidance compiles (grammar.py), and llguidance computes every mask. This module shows what
such a mask is, for the simplest grammar there is, a list of strings, and the grader of lesson
12 holds the learner's version (and this one, `tests/test_checks_lesson12.py`) to llguidance's
masks token for token.

The idea is a trie of the choices' *bytes*, walked by each token's bytes:

  - the answer must spell one of the choices, however the model splits it into tokens ("green"
    as "green", or "g" + "reen"), so the trie holds bytes, not the choices' own tokenizations;
  - bytes, not characters: a byte-level BPE token may hold half of "é" (2 bytes in UTF-8) or a
    quarter of an emoji, and decoding it alone gives U+FFFD;
  - a token may come next when its bytes, read from the node the generated text reached, stay
    inside the trie; EOS may come when that node ends a choice ("yes" of ["yes", "yes please"]
    may end there, or go on). Special tokens (<|im_start|>, ...) spell no text and never fit.

`token_bytes(tokenizer)` gives each token's bytes, the one piece of tokenizer knowledge the
constraint needs (llguidance reads the same from the tokenizer when it is built).
"""
from __future__ import annotations

END = "end"          # the key that marks a trie node where a choice ends (the other keys are bytes, 0-255)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character (bytes_to_unicode):
    the printable ASCII and Latin-1 bytes as themselves, the others as chr(256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, n = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + n)] = byte
            n += 1
    return alphabet


def token_bytes(tokenizer) -> list[bytes | None]:
    """Token id -> the bytes it stands for, for every id of the tokenizer; None for special
    tokens, which spell no text. Byte-level BPE (SmolLM2, Llama 3, Qwen, GPT-2): each character
    of a token's string is one byte; SentencePiece: "▁" is a space and "<0x0A>" a raw byte."""
    hf = getattr(tokenizer, "hf", tokenizer)           # minillm's Tokenizer or a Hugging Face one
    special = set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}
    alphabet = _byte_level_alphabet()
    out: list[bytes | None] = []
    for token, piece in enumerate(hf.convert_ids_to_tokens(list(range(len(hf))))):
        if token in special or piece is None:
            out.append(None)
        elif all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("▁", " ").encode("utf-8"))
    return out


class ChoiceConstraint:
    """The answer is one of `choices`: which tokens may come next, and whether it may end now.
    A trie of the choices' bytes (dicts: byte -> child node; END marks where a choice ends).
    `tokenizer`: minillm's Tokenizer (its `.hf` is the Hugging Face one)."""

    def __init__(self, choices: list[str], tokenizer):
        self.vocab = token_bytes(tokenizer)               # token id -> bytes (None: special)
        self.eos_token_id = tokenizer.hf.eos_token_id     # what ends the answer (llguidance allows the same)
        self.root: dict = {}
        for choice in choices:
            node = self.root
            for byte in choice.encode("utf-8"):
                node = node.setdefault(byte, {})
            node[END] = {}
        self.starting_with: dict[int, list[int]] = {}     # first byte -> the tokens that start with it
        for token, data in enumerate(self.vocab):
            if data:
                self.starting_with.setdefault(data[0], []).append(token)

    def walk(self, node: dict, data: bytes) -> dict | None:
        """The node reached from `node` along `data`, or None when the bytes leave the trie."""
        for byte in data:
            node = node.get(byte)
            if node is None:
                return None
        return node

    def allowed(self, generated: list[int]) -> set[int]:
        """The token ids that may follow `generated` (EOS when the text so far is a whole choice)."""
        node = self.walk(self.root, b"".join(self.vocab[t] for t in generated))
        if node is None:
            return set()
        out = {self.eos_token_id} if END in node else set()
        for byte in node:
            if byte != END:
                out.update(t for t in self.starting_with.get(byte, ()) if self.walk(node, self.vocab[t]) is not None)
        return out

    def is_complete(self, generated: list[int]) -> bool:
        """Whether `generated` spells one of the choices exactly (the answer may end here)."""
        node = self.walk(self.root, b"".join(self.vocab[t] for t in generated))
        return node is not None and END in node
