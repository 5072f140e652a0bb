"""What crosses the network between the engine and its ranks: plain data in a schema'd format,
never pickle.

Unpickling runs code the bytes name, so a rank that unpickled what it received would run
whatever anyone able to reach its port sent. Every message here is JSON behind a magic prefix,
checked against a schema (each kind's fields and their types) before anyone reads it; bytes
that are not ours (pickle's start with 0x80) are refused with WireError. The model's weights
travel as raw tensors (torch.distributed send/recv), described by a manifest in the setup message.

The step plan carries only what a rank needs per sequence: its id, where its new tokens start,
the tokens, its block table, whether it samples (and so which rows the last stage scores); and
`micro`, the sizes of the micro-batches the sequences are cut into, in order (pipeline_executor.py).
"""
from __future__ import annotations

import json

MAGIC = b"MLLM1\n"

# kind -> {field: type}; a list's items are checked by LIST_ITEMS below
SCHEMAS: dict[str, dict[str, type]] = {
    "step": {"seqs": list, "micro": list},
    "block_ops": {"swap_out": list, "swap_in": list, "copies": list},
    "setup": {"model_config": dict, "layers": list, "stage": int, "stages": int, "tp_rank": int, "tp_size": int,
              "device": str, "dtype": str, "num_kv_blocks": int, "block_size": int, "num_swap_blocks": int,
              "attention_backend": str, "tensors": list, "threads": int},
    "report": {"rank": int, "stage": int, "steps": int, "micro_batches": int, "step_seconds": float,
               "busy_seconds": float, "transfer_seconds": dict, "events": list},
    "trace": {"on": bool}, "noop": {}, "counters": {}, "stop": {},
}
INT = {int}
SEQ_FIELDS = {"id": int, "start": int, "tokens": list, "table": list, "sample": bool}


class WireError(ValueError):
    """Bytes that are not a well-formed minillm message: refused, never interpreted."""


def encode(kind: str, _checked: bool = True, **fields) -> bytes:
    """kind's fields as bytes; `_checked=False`: the caller built them from its own objects (a
    step's hot path: the receiver checks them anyway, that is the check that matters)."""
    if _checked:
        check(kind, fields)
    return MAGIC + json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[str, dict]:
    """(kind, fields) of a message `encode` made; WireError for anything else."""
    data = bytes(data)
    if not data.startswith(MAGIC):
        what = "pickled data" if data[:1] == b"\x80" else f"{data[:8]!r}..."
        raise WireError(f"refusing {len(data)} bytes that are not a minillm message ({what}): "
                        "ranks never unpickle what they receive")
    try:
        message = json.loads(data[len(MAGIC):])
    except ValueError as e:
        raise WireError(f"a malformed minillm message: {e}") from None
    if not isinstance(message, dict):
        raise WireError("a minillm message must be a JSON object")
    kind = message.pop("kind", None)
    check(kind, message)
    return kind, message


def _is(value, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def check(kind, fields: dict) -> None:
    schema = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        raise WireError(f"unknown message kind {kind!r} (known: {', '.join(SCHEMAS)})")
    if set(fields) != set(schema):
        raise WireError(f"a {kind!r} message has fields {sorted(fields)}, expected {sorted(schema)}")
    for name, want in schema.items():
        if not _is(fields[name], want):
            raise WireError(f"{kind}.{name} must be {want.__name__}, got {type(fields[name]).__name__}")
    if kind == "step":
        for seq in fields["seqs"]:
            if not isinstance(seq, dict) or seq.keys() != SEQ_FIELDS.keys() or not all(
                    _is(seq[k], t) for k, t in SEQ_FIELDS.items()):
                raise WireError(f"a step's sequence must be {{{', '.join(SEQ_FIELDS)}}} with those types")
            if not set(map(type, seq["tokens"])) <= INT or not set(map(type, seq["table"])) <= INT:
                raise WireError("a step's tokens and block table must be ints")       # (map: the loop runs in C)
        micro = fields["micro"]
        if not set(map(type, micro)) <= INT or any(k < 1 for k in micro) or sum(micro) != len(fields["seqs"]):
            raise WireError("a step's micro-batch sizes must be ints >= 1 that add up to its sequences")
    if kind == "block_ops":
        for name in schema:
            if not all(isinstance(p, list) and len(p) == 2 and all(_is(x, int) for x in p) for p in fields[name]):
                raise WireError(f"block_ops.{name} must be [src, dst] int pairs")


def step_message(scheduled, micro: list[int] | None = None) -> bytes:
    """The engine's plan [(Sequence, num_new_tokens)] as the ranks read it, cut into micro-batches
    of these sizes (default: one)."""
    seqs = []
    for seq, n in scheduled:
        start = seq.num_computed_tokens
        seqs.append({"id": seq.seq_id, "start": start, "tokens": seq.input_tokens(start, start + n),
                     "table": list(seq.block_table), "sample": start + n == len(seq)})
    return encode("step", _checked=False, seqs=seqs, micro=micro if micro is not None else [len(seqs)] * bool(seqs))


def block_ops_message(ops) -> bytes:
    return encode("block_ops", swap_out=[list(p) for p in ops.swap_out], swap_in=[list(p) for p in ops.swap_in],
                  copies=[list(p) for p in ops.copies])
