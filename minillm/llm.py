"""`LLM`: offline batch generation, with vLLM's shape so vLLM users feel at home.

    from minillm import LLM, SamplingParams
    llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
    outs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, seed=0))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import dataclasses
import threading

from .config import EngineConfig
from .engine.engine import LLMEngine
from .models import load_model
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .text.tokenizer import check_messages

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


class LLM:
    def __init__(self, model: str | None = None, *, tokenizer=None, seed: int = 0, **engine_options):
        """`model`: a name, folder or hub id, or an already loaded model object (then pass
        `tokenizer` too). Other keyword arguments are EngineConfig's fields, plus the
        engine's seams (*_cls, slot_mapping_fn)."""
        unknown = set(engine_options) - _ENGINE_FIELDS - {
            "allocator_cls", "prefix_cache_cls", "scheduler_cls", "block_manager_cls", "slot_mapping_fn"}
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(sorted(unknown))}; "
                             f"valid: {', '.join(sorted(_ENGINE_FIELDS))}")
        classes = {k: engine_options.pop(k) for k in list(engine_options) if k.endswith(("_cls", "_fn"))}
        config = EngineConfig(**engine_options)
        if model is None or isinstance(model, str):
            # dtype "auto": bfloat16/float16 on a GPU, float32 on CPU (models/loader.py resolve_dtype)
            model, tokenizer = load_model(model, device=config.device, dtype=config.dtype, seed=seed,
                                          load_format=config.load_format)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer along with a loaded model")
        self.llm_engine = LLMEngine(model, tokenizer, config, **classes)
        self.tokenizer = tokenizer
        self._lock = threading.RLock()     # one call at a time: the engine is not thread-safe

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 priority: list[int] | None = None, use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """Prompts: a string, a list of strings, or vLLM-style {"prompt_token_ids": [...]} dicts.
        One RequestOutput per prompt, in order. Calls from several threads run one after
        another. A request that a fault ended comes back with finish_reason "error" and the
        message in `.error`; the others are unaffected."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a string, a dict or a list of them, got {type(prompts).__name__}")
        prompts = [self._prompt(p) for p in prompts]
        on_finish, bar = None, None
        if use_tqdm and prompts:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(prompts), desc="Processed prompts", unit="req", dynamic_ncols=True)
            generated = [0]

            def on_finish(out: RequestOutput):
                generated[0] += sum(len(o.token_ids) for o in out.outputs)
                bar.update(1)
                bar.set_postfix_str(f"output {generated[0] / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s")
        try:
            with self._lock:
                return self.llm_engine.generate(prompts, sampling_params, priority, on_finish, lora_request)
        finally:
            if bar is not None:
                bar.close()

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation ([{"role": ..., "content": ...}, ...]) or a list of them."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError(f"messages must be a conversation (a list of dicts) or a list of them, "
                            f"got {messages!r:.80}")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        for c in conversations:
            check_messages(c)
        prompts = [{"prompt_token_ids": self.tokenizer.apply_chat_template(c)} for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stats(self) -> dict:
        return self.llm_engine.stats()

    def shutdown(self) -> None:
        """End whatever the engine still runs and free its blocks (see LLMEngine.shutdown)."""
        with self._lock:
            self.llm_engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        close = getattr(self.llm_engine.runner, "close", None)    # tensor-parallel ranks (distributed/)
        if close is not None:
            close()

    @staticmethod
    def _prompt(p):
        if isinstance(p, str):
            return p
        if isinstance(p, dict) and "prompt_token_ids" in p:
            ids = p["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)):
                raise TypeError(f"prompt_token_ids must be a list of integers, got {type(ids).__name__}")
            return list(ids)
        if isinstance(p, dict) and "prompt" in p:
            return p["prompt"]
        raise TypeError(f"a prompt is a string or a dict with 'prompt_token_ids' or 'prompt', got {p!r:.80}")
