"""The GPU check's in-process stages (`scripts/gpu_check.py` runs each in its own process):

    python scripts/gpu_check_stages.py greedy-exactness|throughput-smollm2|throughput-qwen3-0.6b-shape
                                        --json FILE [--quick] [--device cuda]

greedy-exactness: the engine's greedy tokens against transformers' on the same device and
    dtype (float32, bfloat16, float16), chat prompts, every attention backend that runs there;
    a difference passes only as a tie (`models/reference.py` tie_tolerance). Exit 1 otherwise.
throughput-*: `bench throughput`'s workload, minillm against transformers' static batching
    and its continuous batching (`generate_batch`'s manager), in the device's "auto" dtype.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__":     # run as a script: the checkout's minillm, like every other stage
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from minillm.bench.roofline import available_backends
from minillm.bench.throughput import make_workload, run_minillm, run_transformers_static
from minillm.config import ModelConfig
from minillm.models import load_model, load_tokenizer
from minillm.models.loader import place_model, resolve_dtype
from minillm.models.reference import compare_greedy, reference_greedy, transformers_twin

QUESTIONS = ["What is the capital of France?", "Name three fruits.", "Count to five.",
             "Write a haiku about the sea."]

# Qwen/Qwen3-0.6B's config.json (hub, 2025): the shape only; weights are random.
QWEN3_0_6B = ModelConfig(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True,
                         qk_norm=True, model_type="qwen3", bos_token_id=151643, eos_token_ids=[151645])


def greedy_exactness(device: str, dtypes=("float32", "bfloat16", "float16"), max_tokens: int = 48,
                     model_name: str | None = None, save=print) -> dict:
    """{dtype: {backend: [verdict per prompt]}}; a verdict is 'identical', 'tie at step i'
    or 'FAIL: why'. `save` gets the figures so far after each backend (a timeout keeps them)."""
    from minillm.engine.engine import LLMEngine
    from minillm.sampling_params import SamplingParams
    results = {}
    for dtype in dtypes:
        model, tokenizer = load_model(model_name, device=device, dtype=dtype)
        hf = transformers_twin(model, model.dtype, device)
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
        references = [reference_greedy(hf, ids, max_tokens) for ids in prompts]
        results[dtype] = {}
        for backend in available_backends(model.device, model.dtype):
            engine = LLMEngine(model, tokenizer, attention_backend=backend, num_kv_blocks=256)
            outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            verdicts = []
            for ids, out, ref in zip(prompts, outs, references):
                try:
                    verdicts.append(compare_greedy(hf, ids, out.outputs[0].token_ids, ref))
                except AssertionError as e:
                    verdicts.append(f"FAIL: {e}")
            results[dtype][backend] = verdicts
            print(f"{dtype:>9} {backend:<11} {verdicts}", flush=True)
            save(results)
        del model, hf
    return results


def random_model(config: ModelConfig, device: str, dtype: torch.dtype, seed: int = 0):
    """A model of `config`'s shape with random weights, built on the device (fast init)."""
    from minillm.models.llama import LlamaForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return place_model(model.eval(), device, dtype)


@torch.inference_mode()
def run_transformers_continuous(hf_model, workload) -> dict:
    """transformers' own continuous batching (the manager behind `generate_batch`), each
    request with its own output length, EOS off."""
    from transformers import GenerationConfig
    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                              max_new_tokens=max(n for _, n in workload))
    start, tokens, finished = time.perf_counter(), 0, 0
    with hf_model.continuous_batching_context_manager(generation_config=config, block=True, timeout=5) as manager:
        for prompt, n in workload:
            manager.add_request(prompt, max_new_tokens=n, eos_token_id=-1)
        while finished < len(workload):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                if result.error:
                    raise RuntimeError(f"transformers continuous batching: {result.error}")
                finished, tokens = finished + 1, tokens + len(result.generated_tokens)
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching loop stopped")
    elapsed = time.perf_counter() - start
    return {"name": "transformers continuous batching", "seconds": elapsed, "output_tokens": tokens,
            "tok_per_s": tokens / elapsed}


def throughput(model, tokenizer, device: str, num_prompts: int, batch_sizes, quick: bool = False,
               save=print) -> dict:
    """minillm vs transformers static batching (each batch size) and continuous batching;
    `save` gets the report so far after each run."""
    lengths = ((16, 64), (8, 32)) if quick else ((32, 512), (32, 256))
    workload = make_workload(num_prompts, 0, model.config.vocab_size, *lengths)
    hf = transformers_twin(model, model.dtype, device)
    warm = make_workload(2, 1, model.config.vocab_size, (8, 16), (4, 8))
    options = dict(max_num_seqs=64, max_num_batched_tokens=2048)
    runs = [("minillm", lambda w: run_minillm(model, tokenizer, w, **options))]
    runs += [(f"static {bs}", lambda w, bs=bs: run_transformers_static(hf, w, bs, device)) for bs in batch_sizes]
    runs += [("continuous", lambda w: run_transformers_continuous(hf, w))]
    report = {"model": model.config.model_type, "dtype": str(model.dtype).split(".")[-1], "device": device,
              "num_prompts": num_prompts, "output_tokens": sum(n for _, n in workload), "results": []}
    results = report["results"]
    for name, run in runs:
        try:
            run(warm)                                  # kernels compiled, graphs captured: not timed
            r = run(workload)
            r.pop("stats", None)
        except Exception as e:                         # one baseline failing keeps the others
            r = {"name": name, "error": f"{type(e).__name__}: {e}"}
        results.append(r)
        print(r, flush=True)
        ours = results[0].get("tok_per_s")
        best = max((r["tok_per_s"] for r in results[1:] if "tok_per_s" in r), default=None)
        report["ratio_vs_best_transformers"] = ours / best if ours and best else None
        save(report)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["greedy-exactness", "throughput-smollm2", "throughput-qwen3-0.6b-shape"])
    p.add_argument("--json", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)

    def save(figures):
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    if args.stage == "greedy-exactness":
        figures = greedy_exactness(args.device, max_tokens=16 if args.quick else 48, save=save)
        ok = not any(v.startswith("FAIL") for per_dtype in figures.values() for vs in per_dtype.values() for v in vs)
    else:
        dtype = resolve_dtype("auto", args.device)
        if args.stage == "throughput-smollm2":
            model, tokenizer = load_model(None, device=args.device, dtype=dtype)
        else:
            model = random_model(QWEN3_0_6B, args.device, dtype)
            tokenizer = load_tokenizer(None, QWEN3_0_6B.eos_token_ids)   # ids past its vocab decode to ""
        figures = throughput(model, tokenizer, args.device, 8 if args.quick else 32, [8, 32], args.quick, save)
        ok = "tok_per_s" in figures["results"][0]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
