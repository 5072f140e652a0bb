"""Lessons 05-06: the engine. Requests in, one scheduled step at a time, outputs out.

    engine.py            LLMEngine: add_request / step / abort_request / generate / stats
    fault_isolation.py   one step's stages, each behind per-request fault isolation
    sampling_stage.py    the runner's logits to a token per sequence (greedy rows: a short road)
    output_processor.py  tokens to what a user sees: detokenized text, stop checks, logprobs
    scheduler.py         who runs this step: token budget, preemption, priorities, seats
    request.py           a request and the checks it passes at the door
    sequence.py          one sequence being generated (plain data)
"""
