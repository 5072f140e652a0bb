"""Every EngineConfig field as a command-line flag, derived from the dataclass (vLLM's EngineArgs).

`serve`, `generate`, `chat` and the benches that build an engine all call
`add_engine_arguments`, so each flag has one spelling, type, default and help (the field's
`metadata["help"]` in config.py), and a new EngineConfig field is a new flag everywhere.
Field `x_y` is flag `--x-y`; a bool is `--x-y/--no-x-y`. A flag left out is None in the
parsed args and keeps EngineConfig's default (or the default a bench passes in).
"""
from __future__ import annotations

import argparse
import json
import dataclasses
import typing

from ..config import DTYPES, LOAD_FORMATS, PREEMPTION_MODES, SCHEDULING_POLICIES, EngineConfig
from ..utils.registry import ATTENTION_BACKENDS, LINEAR_BACKENDS

NO_QUANTIZATION = "none"          # --quantization none: the float weights (EngineConfig's None)


def engine_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(EngineConfig))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _choices(name: str) -> tuple[str, ...] | None:
    """Read now, not at import: a backend registered later (a lesson's) is a valid choice."""
    return {"attention_backend": ("auto", *ATTENTION_BACKENDS.names()),
            "quantization": (*LINEAR_BACKENDS.names(), NO_QUANTIZATION),
            "scheduling_policy": SCHEDULING_POLICIES, "preemption_mode": PREEMPTION_MODES,
            "dtype": DTYPES, "load_format": LOAD_FORMATS}.get(name)


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, such as '{\"method\": \"ngram\"}'")
    return value


def _base_type(hint):
    """`int | None` -> int; `bool` -> bool."""
    kinds = [t for t in typing.get_args(hint) if t is not type(None)]
    return kinds[0] if kinds else hint


def add_engine_arguments(parser: argparse.ArgumentParser, **defaults) -> argparse.ArgumentParser:
    """Add a flag for every EngineConfig field. `defaults`: a bench's own defaults by field name
    (e.g. dtype="float32"), shown in --help and used when the flag is left out."""
    hints = typing.get_type_hints(EngineConfig)
    fields = engine_fields()
    unknown = set(defaults) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"not EngineConfig fields: {', '.join(sorted(unknown))}")
    group = parser.add_argument_group("engine options", "EngineConfig's fields (minillm/config.py)")
    for f in fields:
        text = f.metadata["help"].replace("%", "%%")
        if f.name in defaults:                           # the field's own default may be in its help
            text += f" (default here: {defaults[f.name]})"
        elif f.default is not None:
            text += f" (default: {f.default})"
        kind = _base_type(hints[f.name])
        options = dict(dest=f.name, default=defaults.get(f.name), help=text)
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif kind is dict:                               # a JSON object (speculative_config)
            options.update(type=json_object, metavar="JSON")
        else:
            options.update(type=kind, choices=_choices(f.name))
        group.add_argument(flag(f.name), **options)
    return parser


def engine_options(args) -> dict:
    """The engine flags given (or defaulted by the bench) as EngineConfig keyword arguments;
    a flag left out is absent, and so is any field `args` lacks (a hand-built Namespace)."""
    given = {f.name: getattr(args, f.name, None) for f in engine_fields()}
    options = {name: value for name, value in given.items() if value is not None}
    if options.get("quantization") == NO_QUANTIZATION:
        options["quantization"] = None
    return options


def engine_config_from_args(args, **overrides) -> EngineConfig:
    """The EngineConfig the flags ask for; `overrides` are what a bench sets itself (it wins).
    A bad value fails here, before any model is loaded."""
    return EngineConfig(**(engine_options(args) | overrides))


def engine_argv(args) -> list[str]:
    """The engine flags given, spelled back as a command line (for a child `minillm serve`)."""
    argv = []
    for name, value in engine_options(args).items():
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + flag(name)[2:])
        elif isinstance(value, dict):
            argv += [flag(name), json.dumps(value)]
        else:
            argv += [flag(name), NO_QUANTIZATION if value is None else str(value)]
    return argv
