"""The one-shot GPU check (scripts/gpu_check.py, a repository tool outside the package):
refuses to run without CUDA, and its stage runner records a failing, a hanging and a passing
stage and goes on after each."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))       # the scripts import as top-level modules

from gpu_check import DEFAULT_BUDGET_S, Stage, default_stages, run_stages  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_and_exits_non_zero(tmp_path):
    for command in ([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--json", str(tmp_path / "r.json")],
                    ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--json", str(tmp_path / "r.json")]):
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert "no CUDA device" in out.stderr
        assert not (tmp_path / "r.json").exists()


def test_stage_runner_records_failure_timeout_and_success_and_runs_on(tmp_path):
    py = sys.executable
    figures = tmp_path / "figures.json"
    stages = [
        Stage("fails", [py, "-c", "import sys; print('boom'); sys.exit(3)"], 30),
        Stage("hangs", ["bash", "-c", "echo waiting; sleep 60"], 2),
        Stage("passes", [py, "-c", f"import json; json.dump({{'tok_per_s': 12.5}}, open({str(figures)!r}, 'w'))"],
              30, str(figures)),
    ]
    report_path = tmp_path / "report.json"
    report = run_stages(stages, budget_s=120, report={"machine": "test"}, json_path=str(report_path))
    failed, hung, passed = report["stages"]
    assert (failed["ok"], failed["returncode"], failed["timed_out"]) == (False, 3, False)
    assert "boom" in failed["output_tail"]
    assert (hung["ok"], hung["timed_out"]) == (False, True) and hung["seconds"] < 10
    assert "waiting" in hung["output_tail"]
    assert passed["ok"] and passed["returncode"] == 0 and passed["figures"] == {"tok_per_s": 12.5}
    assert report["ok"] is False
    assert json.loads(report_path.read_text())["stages"][2]["figures"] == {"tok_per_s": 12.5}
    # what is left of the budget is what a stage gets; with nothing left it is skipped, not run
    late = run_stages([Stage("late", [py, "-c", "pass"], 30)], budget_s=1, report={})
    assert late["stages"][0] == {"name": "late", "ok": False, "skipped": "out of time", "seconds": 0.0}


def test_default_stages_cover_the_issue(tmp_path):
    stages = {s.name: s for s in default_stages(tmp_path)}
    in_process = stages["greedy-exactness"].argv[1]        # the stages script, by path: it runs from anywhere
    assert Path(in_process) == REPO / "scripts" / "gpu_check_stages.py" and Path(in_process).is_file()
    assert list(stages) == ["gpu-tests", "greedy-exactness", "roofline", "throughput-smollm2",
                            "throughput-qwen3-0.6b-shape", "lessons", "tensor-parallel"]
    assert stages["gpu-tests"].argv[-3:] == ["-m", "gpu", "tests"]
    lessons = [a for a in stages["lessons"].argv if a.endswith(".ipynb")]
    assert [Path(a).name[:3] for a in lessons] == [f"{n:02d}_" for n in range(7)]
    assert DEFAULT_BUDGET_S <= 8 * 60                   # all stages together, whatever each may take
    assert all(s.figures_path and s.figures_path.startswith(str(tmp_path))
               for s in stages.values() if s.name not in ("gpu-tests", "lessons", "tensor-parallel"))
    if torch.cuda.device_count() < 2:                  # one GPU or none: the TP stage only says so
        result = run_stages([stages["tensor-parallel"]], budget_s=60, report={})["stages"][0]
        assert result["ok"] and f"skipped: {torch.cuda.device_count()} GPU" in result["output_tail"]
    else:
        assert stages["tensor-parallel"].argv[2:5] == ["minillm", "bench", "tp"]


def test_qwen3_shape_matches_the_published_config():
    from gpu_check_stages import QWEN3_0_6B as c
    shape = (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
             c.intermediate_size, c.vocab_size, c.qk_norm, c.tie_word_embeddings)
    assert shape == (1024, 28, 16, 8, 128, 3072, 151936, True, True)
    from minillm.models.llama import LlamaForCausalLM
    with torch.device("meta"):                                         # no memory: just count
        params = sum(p.numel() for p in LlamaForCausalLM(c).parameters())
    assert 590e6 < params < 600e6                                      # "0.6B" (596M, tied embeddings)


def test_the_stages_script_runs_by_path_from_anywhere(tmp_path):
    """`gpu_check.py` starts its in-process stages as `python scripts/gpu_check_stages.py`:
    its imports resolve outside the package, from any working directory."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_stages.py"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "greedy-exactness" in out.stdout
