"""Lesson 07: text in and out.

    tokenizer.py     loading a tokenizer, prompts to ids, chat templates
    detokenizer.py   streamed text that only grows, one token at a time
    stopping.py      when a sequence ends: EOS, stop tokens, stop strings, max_tokens
"""
