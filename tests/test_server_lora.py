"""LoRA adapters through a real `python -m minillm serve --enable-lora --lora-modules ...` (issue 36):
a request's `model` picks the adapter, through the `openai` client, token-exact against the
engine's LLM(enable_lora=True) (itself checked against transformers + peft in test_lora.py);
/v1/models lists the adapters; an unknown name is a 404 naming `model`; with
MINILLM_ALLOW_RUNTIME_LORA_UPDATING=1 adapters load and unload while it serves, a bad folder
being a 400 naming the field. One server (tiny Llama) for the module; tests run in file order.
"""
from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
import sys

import httpx
import pytest
from fastapi import FastAPI

from minillm import LLM, SamplingParams
from minillm.bench.server_process import ServerProcess, free_port
from minillm.checks.harness import tiny_model
from minillm.lora import LoRARequest
from minillm.server import lora_routes
from minillm.server.lora_models import ServedAdapters, parse_lora_modules

peft = pytest.importorskip("peft")
from lora_support import make_adapters  # noqa: E402 (after the skip)
openai = pytest.importorskip("openai")

# (name, target modules, rank, alpha, rsLoRA)
ADAPTERS = [("sql", ["q_proj", "v_proj", "down_proj"], 4, 8, False),
            ("chat", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 8, 16, True),
            ("late", ["gate_proj", "up_proj"], 2, 4, False)]           # loaded at runtime
PROMPTS = [[1, 1597, 314, 2048, 21, 5, 99, 1000, 44], [1, 17, 23, 4000, 560, 2]]
MAX_TOKENS = 8
ENGINE = dict(max_loras=2, max_lora_rank=8, num_kv_blocks=128)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(server, {adapter name: folder}, {adapter name or None: [reference text per prompt]})."""
    model, tok = tiny_model()
    root = tmp_path_factory.mktemp("adapters")
    folders = make_adapters(model, root, ADAPTERS)
    llm = LLM(model, tokenizer=tok, enable_lora=True, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    refs = {}
    for i, name in enumerate([None] + [a[0] for a in ADAPTERS]):
        lora = None if name is None else LoRARequest(name, i, folders[name])
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False, lora_request=lora)
        refs[name] = [o.outputs[0].text for o in outs]
    assert len({tuple(texts) for texts in refs.values()}) == 4, "each adapter changes the answer"
    port = free_port()
    command = ["env", "MINILLM_ALLOW_RUNTIME_LORA_UPDATING=1", sys.executable, "-m", "minillm", "serve",
               "--port", str(port), "--model", "tiny-llama", "--enable-lora", "--max-loras", "2",
               "--max-lora-rank", "8", "--num-kv-blocks", "128",
               "--lora-modules", f"sql={folders['sql']}", '{"name": "chat", "path": "%s"}' % folders["chat"]]
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = ServerProcess(command, port, log=str(log), ready_timeout=180).__enter__()
    yield server, folders, refs
    server.__exit__()


def complete(server, model, prompt):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text


def test_adapters_by_name_mixed_concurrently_match_the_engine(setup):
    server, _, refs = setup
    jobs = [(model, i) for i in range(len(PROMPTS)) for model in ("tiny-llama", "sql", "chat")] * 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda job: complete(server, job[0], PROMPTS[job[1]]), jobs))
    for (model, i), text in zip(jobs, texts):
        assert text == refs[None if model == "tiny-llama" else model][i], (model, i)


def test_models_lists_the_adapters_and_unknown_names_are_404(setup):
    server, folders, refs = setup
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"tiny-llama", "sql", "chat"}
    assert cards["sql"].parent == "tiny-llama" and cards["sql"].root == folders["sql"]
    assert cards["tiny-llama"].parent is None
    assert client.models.retrieve("chat").parent == "tiny-llama"
    with pytest.raises(openai.NotFoundError) as e:
        complete(server, "nope", PROMPTS[0])
    assert e.value.body["param"] == "model" and "nope" in e.value.body["message"]
    assert complete(server, "sql", PROMPTS[0]) == refs["sql"][0]          # still serving
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert r.model == "chat" and r.choices[0].message.content is not None    # the adapter's name, as vLLM


def test_runtime_load_use_unload(setup):
    server, folders, refs = setup
    load, unload = server.url + "/v1/load_lora_adapter", server.url + "/v1/unload_lora_adapter"
    bad = folders["late"] + "-broken"
    shutil.copytree(folders["late"], bad)
    (pathlib.Path(bad) / "adapter_config.json").write_text("{not json")
    r = httpx.post(load, json={"lora_name": "broken", "lora_path": bad}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "adapter_config.json", r.text
    r = httpx.post(load, json={"lora_name": "missing", "lora_path": bad + "-nowhere"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
    r = httpx.post(load, json={"lora_name": "sql", "lora_path": folders["late"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name", r.text     # the name is taken
    r = httpx.post(load, json={"lora_name": "late", "lora_path": folders["late"]}, timeout=60)
    assert r.status_code == 200, r.text
    # three adapters, two slots: each request still gets its own adapter's tokens
    jobs = [("late", 0), ("sql", 1), ("chat", 0), ("late", 1)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda job: complete(server, job[0], PROMPTS[job[1]]), jobs))
    assert texts == [refs[m][i] for m, i in jobs]
    assert httpx.post(unload, json={"lora_name": "late"}, timeout=60).status_code == 200
    r = httpx.post(server.url + "/v1/completions", json={"model": "late", "prompt": PROMPTS[0], "max_tokens": 1})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert httpx.post(unload, json={"lora_name": "late"}, timeout=60).status_code == 404
    assert "late" not in {m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert complete(server, "tiny-llama", PROMPTS[1]) == refs[None][1]


def test_runtime_routes_exist_only_when_the_environment_allows():
    for env, want in (({}, False), ({"MINILLM_ALLOW_RUNTIME_LORA_UPDATING": "0"}, False),
                      ({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}, True)):
        app = FastAPI()
        assert lora_routes.install(app, ServedAdapters("base"), env) is want
        paths = {getattr(r, "path", None) for r in app.routes}
        assert ("/v1/load_lora_adapter" in paths) is want and ("/v1/unload_lora_adapter" in paths) is want


def test_lora_modules_flag_forms():
    assert parse_lora_modules(["a=/x/y", '{"name": "b", "path": "/z"}']) == [("a", "/x/y"), ("b", "/z")]
    for bad in (["noequals"], ["=path"], ['{"name": "b"}'], ["{oops"]):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_modules(bad)


def test_serve_refuses_bad_lora_flags_before_listening():
    """A missing adapter folder (for one server or a data-parallel front), --lora-modules without
    --enable-lora: each an error naming what is wrong, exit 2, before the server listens."""
    import subprocess
    serve = [sys.executable, "-m", "minillm", "serve", "--model", "tiny-llama", "--port", "0"]
    for flags, said in ((["--enable-lora", "--lora-modules", "x=/nowhere/adapter"], "lora_path: no such adapter"),
                        (["--lora-modules", "x=/nowhere"], "--lora-modules needs --enable-lora"),
                        (["--enable-lora", "--lora-modules", "x=/nowhere/adapter", "--data-parallel-size", "2"],
                         "lora_path: no such adapter")):                       # the front checks before starting any
        r = subprocess.run(serve + flags, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr, (flags, r.returncode, r.stderr[-500:])
