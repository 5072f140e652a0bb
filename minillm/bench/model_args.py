"""The model flags every bench shares: which model, or which shape with dummy weights.

    --model M                       a name, folder or hub id (models/loader.py)
    --model-shape llama-3.2-1b      dummy weights in a real model's shape (models/shapes.py)
    --hf-config path/config.json    dummy weights in the shape of any config.json
    --load-format dummy --model S   the same, spelled as vLLM spells it (an engine flag)

A dummy run says so in its header, its JSON and wherever a result is printed (`label`): its
speed is the shape's, its tokens mean nothing.
"""
from __future__ import annotations

from ..models.dummy import DUMMY_MARK
from ..models.embedded import EMBEDDED_NAME
from ..models.shapes import SHAPES

DUMMY_SEED = 0                     # every bench's dummy model (and its GGUF) is this seed's


def add_model_arguments(p, help: str = "the model (default: the embedded SmolLM2-135M-Instruct)") -> None:
    p.add_argument("--model", default=None, help=help)
    p.add_argument("--model-shape", choices=list(SHAPES), default=None,
                   help="dummy weights (seeded random) in this real model's shape: no download "
                        "(sets --load-format dummy)")
    p.add_argument("--hf-config", default=None, metavar="CONFIG_JSON",
                   help="dummy weights in the shape of this config.json (sets --load-format dummy)")


def resolve_model_args(args):
    """--model-shape / --hf-config -> args.model and args.load_format = "dummy" (in place)."""
    shape, config = getattr(args, "model_shape", None), getattr(args, "hf_config", None)
    given = [x for x in (shape, config) if x]
    if len(given) > 1 or (given and args.model not in (None, given[0])):      # (a second call is harmless)
        raise ValueError("give one of --model, --model-shape and --hf-config")
    if given:
        args.model, args.load_format = given[0], "dummy"
    if not hasattr(args, "load_format"):
        args.load_format = None
    if is_dummy_run(args) and args.model is None:
        args.model = "smollm2-135m"
    return args


def is_dummy_run(args) -> bool:
    return getattr(args, "load_format", None) == "dummy"


def label(args) -> str:
    """What the bench ran, as printed: "llama-3.2-1b [DUMMY WEIGHTS, seed 0]" or the model's name."""
    if is_dummy_run(args):
        return f"{args.model} [{DUMMY_MARK}, seed {DUMMY_SEED}]"
    return args.model or EMBEDDED_NAME


def load(args, device=None, dtype=None):
    """load_model for the bench's flags: (model, tokenizer)."""
    from ..models import load_model
    kwargs = {} if dtype is None else {"dtype": dtype}
    return load_model(args.model, device=device, load_format=getattr(args, "load_format", None) or "auto",
                      seed=DUMMY_SEED, **kwargs)


def tokenizer_and_vocabulary(args):
    """(tokenizer, vocab size) without building the model when its weights are dummy (at 1B, half
    a minute and 5 GB saved); else from the loaded model."""
    if is_dummy_run(args):
        from ..models.dummy import dummy_config, dummy_tokenizer
        vocab = dummy_config(args.model).vocab_size
        return dummy_tokenizer(vocab), vocab
    model, tokenizer = load(args, device="cpu")
    return tokenizer, model.config.vocab_size


def print_header(args) -> None:
    print(f"model: {label(args)}" + (" -- seeded random weights in a real model's shape: speed only, "
                                     "the tokens mean nothing" if is_dummy_run(args) else ""), flush=True)
