"""Lesson 01: from a batch of logits to one token per row.

    sampler.py     greedy, temperature, top-k, top-p, seeded generators per sequence
    logits_processors.py   vLLM's extras before sampling: penalties, logit_bias, min_tokens, min_p
    logprobs.py    the sampled token's log-probability and the top k
"""
