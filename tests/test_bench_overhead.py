"""`bench overhead`: each decode step split into the forward and the engine's own phases."""
import json

import pytest

from minillm.__main__ import main
from minillm.bench.overhead import PHASES, StepTimer, measure
from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams

from conftest import get_model


@pytest.fixture(scope="module")
def tiny_llama():
    return get_model("tiny-llama")


def test_the_parts_add_up_to_the_step_and_the_engine_is_left_as_it_was(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4)
    result = measure(engine, batch=3, context=8, steps=2, profile=5)
    assert result["steps"] == 2 and result["forward"] > 0
    assert all(result[p] >= 0 for p in PHASES)
    assert sum(result[p] for p in PHASES) + result["forward"] == pytest.approx(result["step"], rel=1e-9, abs=1e-9)
    assert result["overhead"] == pytest.approx(result["step"] - result["forward"])
    assert 0 < result["overhead_fraction"] < 1
    assert "function calls" in result["profile"]
    for owner, name in ((engine, "_emit"), (engine, "_sample"), (engine.runner, "execute"),
                        (engine.scheduler, "plan_step"), (engine.runner.model, "forward")):
        assert name not in vars(owner), f"{name} is still wrapped"
    assert not engine.has_unfinished_requests()


def test_each_step_is_split_with_no_negative_part(tiny_llama):
    model, tokenizer, _ = tiny_llama
    engine = LLMEngine(model, tokenizer, num_kv_blocks=64, block_size=4)
    engine.generate([[5, 6, 7]], None)
    engine.add_request("a", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    with StepTimer(engine) as timer:
        while engine.has_unfinished_requests():
            timer.step()
    assert len(timer.steps) == 4          # the prompt's step samples the first token, then 3 decode steps
    for step in timer.steps:
        assert all(step[k] >= 0 for k in ("forward", *PHASES))
        assert sum(step[k] for k in ("forward", *PHASES)) == pytest.approx(step["step"])


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "overhead.json"
    assert main(["bench", "overhead", "--model", "tiny-llama", "--batch", "1", "2", "--context", "8",
                 "--steps", "2", "--num-kv-blocks", "64", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert set(report) == {"1", "2"} and all(report[b]["steps"] == 2 for b in report)
    out = capsys.readouterr().out
    assert "else %" in out and "process_outputs" in out
