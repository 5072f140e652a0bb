"""Every EngineConfig field is a flag of every command that builds an engine, and each flag
reaches the EngineConfig: one function derives them (cli/engine_args.py), so a new field
needs no CLI edit, and these tests fail if a command stops sharing it."""
import argparse
import dataclasses
import json
import typing

import pytest

from minillm.__main__ import build_parser
from minillm.__main__ import main as cli
from minillm.bench import decode_step
from minillm.cli.engine_args import (add_engine_arguments, engine_argv, engine_config_from_args, engine_options,
                                     flag)
from minillm.spec.config import SpeculativeConfig
from minillm.config import EngineConfig

FIELDS = dataclasses.fields(EngineConfig)
COMMANDS = [["serve"], ["generate", "hi"], ["chat"], ["bench", "throughput"], ["bench", "quant"],
            ["bench", "roofline"], ["bench", "serve"], ["bench", "overhead"]]


def shared_parser(**defaults) -> argparse.ArgumentParser:
    return add_engine_arguments(argparse.ArgumentParser(), **defaults)


def non_default(f: dataclasses.Field, parser: argparse.ArgumentParser) -> tuple[list[str], object]:
    """(the flags that ask for a value other than the field's default, that value)."""
    kind = typing.get_type_hints(EngineConfig)[f.name]
    if kind is bool:
        return [flag(f.name) if not f.default else "--no-" + flag(f.name)[2:]], not f.default
    choices = parser._option_string_actions[flag(f.name)].choices
    if choices:
        value = next(c for c in choices if c not in (f.default, "none"))
    elif f.name == "device":                          # the free-form strings
        value = "cpu"
    elif f.name == "dist_init_addr":
        value = "10.0.0.1:29500"
    elif f.name == "speculative_config":              # the one JSON object
        return [flag(f.name), '{"method": "ngram", "num_speculative_tokens": 3}'], SpeculativeConfig(
            num_speculative_tokens=3)
    else:
        value = (f.default or 0) + 3                   # every other field is an int
    return [flag(f.name), str(value)], value


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_every_engine_flag(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit:
        cli([*command[:2 if command[0] == "bench" else 1], "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    missing = [flag(f.name) for f in FIELDS if flag(f.name) not in text]
    assert not missing, missing
    bools = [f.name for f in FIELDS if f.type == "bool"]
    assert all("--no-" + flag(name)[2:] in text for name in bools)


def test_decode_step_bench_takes_every_engine_flag():
    parser = argparse.ArgumentParser()
    decode_step.add_arguments(parser)
    assert {flag(f.name) for f in FIELDS} <= set(parser._option_string_actions)


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_each_flag_reaches_the_engine_config(field):
    parser = shared_parser()
    argv, value = non_default(field, parser)
    config = engine_config_from_args(parser.parse_args(argv))
    assert getattr(config, field.name) == value != field.default
    assert dataclasses.replace(config, **{field.name: field.default}) == EngineConfig()   # nothing else moved


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_parses_every_flag_into_its_config(command):
    parser, argv, expected = build_parser(), list(command), {}
    for f in FIELDS:
        flags, expected[f.name] = non_default(f, shared_parser())
        argv += flags
    config = engine_config_from_args(parser.parse_args(argv))
    assert {f.name: getattr(config, f.name) for f in FIELDS} == expected


def test_left_out_flags_keep_the_defaults_and_only_given_ones_are_options():
    parser = shared_parser()
    assert engine_options(parser.parse_args([])) == {}
    assert engine_config_from_args(parser.parse_args([])) == EngineConfig()
    assert engine_config_from_args(argparse.Namespace(device="cpu")) == EngineConfig(device="cpu")   # a hand-built one
    args = parser.parse_args(["--compile", "--enforce-eager", "--no-enable-prefix-caching", "--block-size", "8"])
    assert engine_options(args) == {"compile": True, "enforce_eager": True, "enable_prefix_caching": False,
                                    "block_size": 8}
    assert engine_options(parser.parse_args(engine_argv(args))) == engine_options(args)    # spelled back alike


def test_quantization_none_is_the_float_weights():
    args = shared_parser().parse_args(["--quantization", "none"])
    assert engine_config_from_args(args).quantization is None
    assert engine_argv(args) == ["--quantization", "none"]


def test_a_bench_default_is_used_and_overridable():
    parser = shared_parser(dtype="float32")
    assert engine_config_from_args(parser.parse_args([])).dtype == "float32"
    assert engine_config_from_args(parser.parse_args(["--dtype", "bfloat16"])).dtype == "bfloat16"
    with pytest.raises(TypeError, match="not_a_field"):
        shared_parser(not_a_field=1)


def test_bad_values_are_refused_by_argparse_or_the_config(capsys):
    parser = shared_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduling-policy", "lifo"])
    with pytest.raises(ValueError, match="EngineConfig.block_size"):
        engine_config_from_args(parser.parse_args(["--block-size", "0"]))


def test_generate_builds_its_engine_from_the_flags(monkeypatch, capsys):
    """`generate` on the tiny model: the engine it runs has the config the flags ask for."""
    import minillm.engine.engine as engine_module
    seen = []

    class Spy(engine_module.LLMEngine):
        def __init__(self, model, tokenizer, config=None, **kw):
            seen.append(config)
            super().__init__(model, tokenizer, config, **kw)

    monkeypatch.setattr(engine_module, "LLMEngine", Spy)
    assert cli(["generate", "Hello", "--model", "tiny-llama", "--max-tokens", "3", "--device", "cpu",
                "--block-size", "4", "--num-kv-blocks", "40", "--max-model-len", "64",
                "--no-enable-prefix-caching", "--attention-backend", "torch"]) == 0
    (config,) = seen
    assert (config.block_size, config.num_kv_blocks, config.max_model_len) == (4, 40, 64)
    assert not config.enable_prefix_caching and config.attention_backend == "torch"
    assert capsys.readouterr().out.endswith("\n")


def test_bench_throughput_takes_quantization(tmp_path):
    out = tmp_path / "throughput.json"
    assert cli(["bench", "throughput", "--model", "tiny-llama", "--quick", "--num-prompts", "2",
                "--quantization", "int8", "--max-num-seqs", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine_options"]["quantization"] == "int8" and report["engine_options"]["max_num_seqs"] == 2
    assert report["results"][0]["stats"]
