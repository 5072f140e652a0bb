"""quant/ab.py: two builds of a kernel's C file timed in one run (speed.py --against)."""
import shutil

import pytest

from minillm.quant import ab, kernels


def test_model_shapes_are_the_presets_linears():
    layers, head = ab.model_shapes("llama-3.2-1b")
    assert len(layers) == 7 * 16 and head == (128256, 2048)
    assert layers[:7] == [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048),
                          (2048, 8192)]
    with pytest.raises(ValueError, match="unknown model shape"):
        ab.model_shapes("gpt-5")


def test_an_old_copy_of_the_int8_kernel_is_timed_against_the_current_one(tmp_path):
    if kernels.load_kernels() is None:
        pytest.skip(f"no C compiler: {kernels.load_error}")
    old = tmp_path / "old_quantized_linear.c"
    shutil.copy(kernels.KERNEL.source, old)
    kind, results = ab.compare(old, "smollm2-135m", rows=(1,), repeats=1, head_only=True)
    assert kind == "int8" and [r[:2] for r in results] == [("head", 1)]
    part, rows, old_ms, new_ms, old_gb, new_gb = results[0]
    assert old_ms > 0 and new_ms > 0 and old_gb == new_gb == 49152 * 576 / 1e9
    (tmp_path / "other.c").write_text("int f(void) { return 0; }\n")
    with pytest.raises(ValueError, match="neither int8_linear nor w4a8_linear"):
        ab.builds(tmp_path / "other.c")
