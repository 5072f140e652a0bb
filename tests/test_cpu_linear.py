"""The small-batch linear kernel (minillm/models/cpu_linear.py) against F.linear."""
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm.models import cpu_linear
from minillm.models.cpu_linear import MAX_ROWS, PANEL, PanelLinear, load_kernel, use_panel_linears

from conftest import run_without_a_compiler

needs_kernel = pytest.mark.skipif(load_kernel() is None, reason=f"kernel not built: {cpu_linear.load_error}")


def test_kernel_builds_where_a_c_compiler_exists():
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler on this machine")
    assert load_kernel() is not None, cpu_linear.load_error


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 40, MAX_ROWS])
@pytest.mark.parametrize("in_features, out_features, bias", [(37, 64, False), (576, 1536, True), (100, 32, True)])
def test_panel_linear_matches_f_linear(rows, in_features, out_features, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(in_features, out_features, bias=bias)
    panel = PanelLinear(linear, load_kernel())
    x = torch.randn(rows, in_features)
    with torch.inference_mode():
        torch.testing.assert_close(panel(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_row_gets_the_same_bits_alone_or_in_a_batch():
    torch.manual_seed(0)
    panel = PanelLinear(nn.Linear(96, 128), load_kernel())
    batch = torch.randn(23, 96)
    with torch.inference_mode():
        together = panel(batch)
        for r in (0, 5, 6, 22):
            assert torch.equal(panel(batch[r:r + 1]), together[r:r + 1])


@needs_kernel
def test_large_batches_and_other_dtypes_go_to_f_linear():
    torch.manual_seed(0)
    linear = nn.Linear(64, 64)
    panel = PanelLinear(linear, load_kernel())
    with torch.inference_mode():
        x = torch.randn(MAX_ROWS + 1, 64)
        assert torch.equal(panel(x), F.linear(x, linear.weight, linear.bias))
        x3 = torch.randn(2, 3, 64)                      # not a flat batch
        assert torch.equal(panel(x3), F.linear(x3, linear.weight, linear.bias))
        xd = torch.randn(4, 64, dtype=torch.float64)
        assert torch.equal(panel.double()(xd), F.linear(xd, linear.weight.double(), linear.bias.double()))


@needs_kernel
def test_use_panel_linears_keeps_weights_state_dict_and_ties():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1024, 512)
            self.small = nn.Linear(512, 64)             # below MIN_WEIGHTS: stays an nn.Linear
            self.odd = nn.Linear(512, 1030)             # width not a multiple of PANEL: stays
            self.head = nn.Linear(512, 1024, bias=False)
            self.head.weight = self.embed.weight        # tied, like SmolLM2's output head
    model = Tiny()
    keys = list(model.state_dict())
    assert use_panel_linears(model) == 1
    assert isinstance(model.head, PanelLinear) and type(model.small) is nn.Linear and type(model.odd) is nn.Linear
    assert model.head.weight is model.embed.weight
    assert list(model.state_dict()) == keys
    assert model.head.panels.shape == (1024 // PANEL, 512, PANEL)


def test_without_a_compiler_nothing_is_replaced(tmp_path):
    script = ("from minillm.models import load_model\n"
              "from minillm.models.cpu_linear import PanelLinear\n"
              "model, _ = load_model('tiny-llama')\n"
              "print(sum(isinstance(m, PanelLinear) for m in model.modules()))\n")
    assert run_without_a_compiler(script, tmp_path) == ["0"]


@needs_kernel
def test_a_weight_written_after_packing_is_repacked():
    torch.manual_seed(0)
    linear = nn.Linear(64, 64, bias=False)
    panel = PanelLinear(linear, load_kernel())
    x = torch.randn(3, 64)
    with torch.no_grad():
        panel.load_state_dict({"weight": torch.randn(64, 64)})
    with torch.inference_mode():
        torch.testing.assert_close(panel(x), F.linear(x, panel.weight), rtol=1e-5, atol=1e-5)
