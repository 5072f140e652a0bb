"""LoRA adapters through the data-parallel front (issue 36 with issue 32's front):
`serve --enable-lora --lora-modules ... --data-parallel-size 2` gives every replica the same
adapters; base and adapter requests give one engine's texts (itself checked against a single
server in test_server_lora.py and against peft in test_lora.py) on either replica; /v1/models
lists the adapters; runtime load/unload go to every replica, and a load that fails on one is
undone on the others. The router's key includes the adapter.

One front (round-robin, so every request's twin lands on the other replica) over two tiny-llama
replicas; its tests run in file order.
"""
import json
import sys

import httpx
import openai
import pytest

from minillm import LLM, SamplingParams
from minillm.bench.server_process import ServerProcess, free_port
from minillm.checks.harness import tiny_model
from minillm.lora import LoRARequest
from minillm.server.data_parallel.prompts import routing_text
from minillm.server.data_parallel.replicas import replica_argv
from minillm.server.data_parallel.router import Router

peft = pytest.importorskip("peft")
from lora_support import make_adapters  # noqa: E402 (after the skip)

ADAPTERS = [("sql", ["q_proj", "v_proj", "down_proj"], 4, 8, False),
            ("chat", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 8, 16, True),
            ("late", ["gate_proj", "up_proj"], 2, 4, False)]           # loaded at runtime
PROMPTS = [[1, 1597, 314, 2048, 21, 5, 99, 1000, 44], [1, 17, 23, 4000, 560, 2]]
MAX_TOKENS = 8


def test_the_routing_key_includes_the_adapter():
    body = {"model": "sql", "prompt": "The same long system prompt, then a question. " * 3}
    sql = routing_text("/v1/completions", json.dumps(body).encode())
    chat = routing_text("/v1/completions", json.dumps({**body, "model": "chat"}).encode())
    assert sql.startswith("sql\n") and chat.startswith("chat\n") and sql[4:] == chat[5:]
    router = Router(2, "cache-aware")
    assert router.route(sql).replica == 0
    assert router.route(sql).matched_chars > 0                      # the same adapter: its prefix
    assert router.route(chat).matched_chars == 0                    # another adapter: nothing cached


def test_a_replica_started_again_gets_the_adapters_served_now():
    from minillm.__main__ import build_parser
    args = build_parser().parse_args(["serve", "--data-parallel-size", "2", "--enable-lora"])
    argv = replica_argv(args, 1234, {"sql": "/a=b/sql", "late": "/late"})
    i = argv.index("--lora-modules")
    assert [json.loads(a) for a in argv[i + 1:i + 3]] == [{"name": "sql", "path": "/a=b/sql"},
                                                         {"name": "late", "path": "/late"}]
    assert "--enable-lora" in argv


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(front, {adapter: folder}, {model name: [reference text per prompt]})."""
    model, tok = tiny_model()
    root = tmp_path_factory.mktemp("adapters")
    folders = make_adapters(model, root, ADAPTERS)
    llm = LLM(model, tokenizer=tok, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=128)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    refs = {}
    for i, name in enumerate(["tiny-llama"] + [a[0] for a in ADAPTERS]):
        lora = None if i == 0 else LoRARequest(name, i, folders[name])
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False, lora_request=lora)
        refs[name] = [o.outputs[0].text for o in outs]
    assert len({tuple(texts) for texts in refs.values()}) == 4, "each adapter changes the answer"
    port = free_port()
    command = ["env", "MINILLM_ALLOW_RUNTIME_LORA_UPDATING=1", sys.executable, "-m", "minillm", "serve",
               "--port", str(port), "--data-parallel-size", "2", "--router-policy", "round-robin",
               "--model", "tiny-llama", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
               "--num-kv-blocks", "128", "--lora-modules", f"sql={folders['sql']}", f"chat={folders['chat']}"]
    log = tmp_path_factory.mktemp("front") / "front.log"
    front = ServerProcess(command, port, log=str(log), ready_timeout=180).__enter__()
    yield front, folders, refs
    front.__exit__()


def complete(url: str, model: str, prompt) -> tuple[str, str]:
    """(the replica that answered, the text)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                                      temperature=0, extra_body={"ignore_eos": True})
    return raw.headers["x-minillm-replica"], raw.parse().choices[0].text


def on_both_replicas(front, refs, models) -> None:
    """Each (model, prompt) twice in a row, so once on each replica: the reference text each time."""
    for model in models:
        for i, prompt in enumerate(PROMPTS):
            answers = [complete(front.url, model, prompt) for _ in range(2)]
            assert sorted(r for r, _ in answers) == ["0", "1"], answers
            assert [t for _, t in answers] == [refs[model][i]] * 2, (model, i, answers)


def replica_models(front) -> list[set]:
    """The model names each replica serves, asked of each directly."""
    states = httpx.get(front.url + "/replicas", timeout=10).json()["replicas"]
    return [{m["id"] for m in httpx.get(s["url"] + "/v1/models", timeout=10).json()["data"]} for s in states]


def test_base_and_adapters_on_every_replica_give_one_engines_texts(setup):
    front, folders, refs = setup
    on_both_replicas(front, refs, ["tiny-llama", "sql", "chat"])
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"tiny-llama", "sql", "chat"} and cards["sql"].root == folders["sql"]
    assert client.models.retrieve("chat").parent == "tiny-llama"
    with pytest.raises(openai.NotFoundError) as e:
        complete(front.url, "nope", PROMPTS[0])
    assert e.value.body["param"] == "model"


def test_runtime_load_and_unload_go_to_every_replica(setup):
    front, folders, refs = setup
    load, unload = front.url + "/v1/load_lora_adapter", front.url + "/v1/unload_lora_adapter"
    r = httpx.post(load, json={"lora_name": "broken", "lora_path": folders["late"] + "-nowhere"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
    assert "replica 0" in r.json()["error"]["message"] and "replica 1" in r.json()["error"]["message"]
    r = httpx.post(load, json={"lora_name": "late", "lora_path": folders["late"]}, timeout=60)
    assert r.status_code == 200 and "late" in r.text, r.text
    assert all("late" in names for names in replica_models(front))
    on_both_replicas(front, refs, ["late"])
    assert httpx.post(unload, json={"lora_name": "late"}, timeout=60).status_code == 200
    assert not any("late" in names for names in replica_models(front))
    r = httpx.post(front.url + "/v1/completions", json={"model": "late", "prompt": PROMPTS[0], "max_tokens": 1})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_a_load_that_fails_on_one_replica_is_undone_on_the_others(setup):
    front, folders, refs = setup
    replica_1 = httpx.get(front.url + "/replicas", timeout=10).json()["replicas"][1]["url"]
    r = httpx.post(replica_1 + "/v1/load_lora_adapter", json={"lora_name": "twin", "lora_path": folders["sql"]},
                   timeout=60)                                     # behind the front's back: the name is taken there
    assert r.status_code == 200, r.text
    r = httpx.post(front.url + "/v1/load_lora_adapter", json={"lora_name": "twin", "lora_path": folders["chat"]},
                   timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "lora_name" and error["code"] == "lora_update_failed", r.text
    assert error["message"].startswith("replica 1: 400") and "undone on replica 0" in error["message"]
    assert [("twin" in names) for names in replica_models(front)] == [False, True]
    r = httpx.post(front.url + "/v1/unload_lora_adapter", json={"lora_name": "twin"}, timeout=60)
    assert r.status_code == 404 and "unloaded from replica 1" in r.json()["error"]["message"], r.text
    assert not any("twin" in names for names in replica_models(front))
    assert complete(front.url, "sql", PROMPTS[1])[1] == refs["sql"][1]
