"""64 clients stream at once; a random (seeded) third of them hang up mid-way. Every other
stream completes with exactly the engine's offline text, and the hung-up requests are
aborted at once: nothing is left running or holding KV blocks afterwards. Two more
clients wait for a long non-streamed answer and give up (a read timeout): aborted too.

How "at once" is checked without timing: the hung-up requests ask for 900 tokens each
(ignoring EOS). Aborted promptly they hold a few blocks; left running, 21 of them would
(and the two impatient ones, 8 samples each) would need ~2100 blocks of a 256-block pool, so the engine would have to preempt. The test
asserts that it never preempted and that it went idle.
"""
import asyncio
import random
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm.engine.engine import LLMEngine
from minillm.models import load_model
from minillm.sampling_params import SamplingParams
from minillm.server.app import build_app
from minillm.server.run import serve_in_thread, stop_server

CLIENTS, MAX_TOKENS, LONG = 64, 16, 900
OPTIONS = dict(num_kv_blocks=256, max_model_len=1024, max_num_seqs=64)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


def gauges(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_clients_hanging_up_mid_stream_free_everything(tiny):
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(["red", "blue", "cat", "sea", "sun", "tree", "code", "song"])
                        for _ in range(rng.randint(3, 12))) for _ in range(CLIENTS)]
    quitters = set(rng.sample(range(CLIENTS), CLIENTS // 3))
    quit_after = {i: rng.randint(1, 4) for i in quitters}          # chunks read before hanging up
    keepers = [i for i in range(CLIENTS) if i not in quitters]
    offline = LLMEngine(*tiny, **OPTIONS).generate([prompts[i] for i in keepers],
                                                  SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    expected = {i: out.outputs[0].text for i, out in zip(keepers, offline)}

    app = build_app(LLMEngine(*tiny, **OPTIONS), "tiny-llama")
    srv = serve_in_thread(app)

    async def one(client, i):
        long = i in quitters
        stream = await client.completions.create(
            model="tiny-llama", prompt=prompts[i], temperature=0, stream=True,
            max_tokens=LONG if long else MAX_TOKENS, extra_body={"ignore_eos": long})
        text, chunks = "", 0
        async for chunk in stream:
            text += chunk.choices[0].text
            chunks += 1
            if long and chunks == quit_after[i]:
                await stream.close()                                # hang up mid-stream
                return None
        return text

    async def impatient(http):
        """A non-streaming client that gives up waiting: its request is aborted too."""
        body = {"prompt": "wait for me", "max_tokens": LONG, "ignore_eos": True, "n": 8}
        with pytest.raises(httpx.ReadTimeout):          # only the read times out: connecting to a busy
            await http.post(srv.url + "/v1/completions", json=body,     # server may take longer (CI)
                            timeout=httpx.Timeout(120, read=0.5))

    async def everyone():
        limits = httpx.Limits(max_connections=CLIENTS + 8)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", http_client=http,
                                        max_retries=0)
            *texts, _, _ = await asyncio.gather(*(one(client, i) for i in range(CLIENTS)),
                                                impatient(http), impatient(http))
            return texts

    try:
        texts = asyncio.run(everyone())
        assert {i: texts[i] for i in keepers} == expected
        assert all(texts[i] is None for i in quitters)
        deadline, g = time.monotonic() + 60, gauges(srv.url)
        while (g["minillm:num_requests_running"] or g["minillm:num_requests_waiting"]
               or g["minillm:kv_blocks_used"]) and time.monotonic() < deadline:
            time.sleep(0.05)
            g = gauges(srv.url)
        assert g["minillm:num_requests_running"] == g["minillm:num_requests_waiting"] == 0
        assert g["minillm:kv_blocks_used"] == 0 and g["minillm:kv_cache_usage_perc"] == 0
        assert g["minillm:num_preemptions_total"] == 0         # the hung-up requests stopped at once
        assert g["minillm:request_success_total"] == len(keepers)
        assert not app.state.served.front.engine.has_unfinished_requests()
    finally:
        stop_server(srv)
