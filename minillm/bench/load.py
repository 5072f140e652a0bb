"""The load generator of `bench serve`: seeded Poisson arrivals, each request a streamed
completion timed chunk by chunk, and the summary of a run (TTFT, TPOT, ITL, throughput,
goodput; serve.py's docstring says what each measures). Lesson 07 drives it too."""
from __future__ import annotations

import asyncio
import json
import random
import time

import httpx


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s from the start) of n requests at `rate` per second; inf: all at once."""
    if rate == float("inf"):
        return [0.0] * n
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      send_at: float, start: float, gate: asyncio.Semaphore, extra: dict | None = None) -> dict:
    await asyncio.sleep(max(0.0, start + send_at - time.perf_counter()))
    async with gate:
        sent = time.perf_counter()
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
        chunks, usage, error = [], None, None
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                if response.status_code != 200:
                    error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                else:
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        if data.get("usage"):
                            usage = data["usage"]
                        if any(c.get("text") for c in data.get("choices", [])):
                            chunks.append(time.perf_counter())
        except httpx.HTTPError as e:
            error = repr(e)
    tokens = (usage or {}).get("completion_tokens") or len(chunks)
    return {"sent": sent, "chunks": chunks, "tokens": tokens, "error": error or (None if chunks else "no output")}


async def run_load(url: str, model: str, prompts: list[tuple[str, int]], rate: float, max_concurrency: int,
                   seed: int, structured: bool = False, extra: dict | None = None) -> tuple[list[dict], float]:
    """`extra`: more fields for every request's body (e.g. {"ignore_eos": True})."""
    from .structured import response_format
    gate = asyncio.Semaphore(max_concurrency)
    times = poisson_arrivals(len(prompts), rate, seed)
    limits = httpx.Limits(max_connections=max_concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*[one_request(client, url, model, p, n, t, start, gate,
                                                     {**(extra or {}), **(response_format(i) if structured else {})})
                                         for i, ((p, n), t) in enumerate(zip(prompts, times))])
    return results, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summarize(results: list[dict], elapsed: float, slo_ttft: float, slo_tpot: float) -> dict:
    ok = [r for r in results if r["error"] is None]
    ttft = [r["chunks"][0] - r["sent"] for r in ok]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    itl = [b - a for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    good = [r for r in ok if r["chunks"][0] - r["sent"] <= slo_ttft and
            (r["tokens"] <= 1 or (r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) <= slo_tpot)]
    out = {"completed": len(ok), "failed": len(results) - len(ok), "seconds": elapsed,
           "request_throughput": len(ok) / elapsed, "output_throughput": sum(r["tokens"] for r in ok) / elapsed,
           "goodput": len(good) / elapsed}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        out["first_error"] = errors[0]
    return out


def served_model(url: str) -> str:
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return models[0]["id"] if models else "default"
