"""Graders for the lessons' check cells: your piece against the reference, on small cases.

Each `check_*` takes your function or class — with exactly the signature of the
reference it replaces — runs it on a few deterministic cases (the graders of lessons
03-06 then plug it into the real engine on the tiny random Llama), and either prints
"✅ ... passed" and returns True, or raises AssertionError with a hint saying what
went wrong and where to look.

    from minillm.checks import check_top_p
    check_top_p(my_apply_top_p)

| lesson | grader                 | your piece has the signature of                          |
|--------|------------------------|----------------------------------------------------------|
| 00     | check_rope             | minillm.models.llama.apply_rope                          |
| 01     | check_top_k            | minillm.sample.sampler.apply_top_k                             |
| 01     | check_top_p            | minillm.sample.sampler.apply_top_p                             |
| 01     | check_sampler          | minillm.sample.sampler.sample                                  |
| 01     | check_generate_naive   | minillm.baselines.naive_generation.generate_naive                             |
| 02     | check_contiguous_cache | minillm.kv.contiguous.ContiguousKVCache                  |
| 03     | check_block_allocator  | minillm.kv.block_allocator.BlockAllocator                |
| 03     | check_slot_mapping     | minillm.attention.paged.slot_mapping                     |
| 03     | check_paged_attention  | minillm.attention.per_sequence.paged_attention           |
| 04     | check_block_hash       | minillm.kv.prefix_cache.block_hash                       |
| 04     | check_prefix_cache     | minillm.kv.prefix_cache.PrefixCache                      |
| 04     | check_copy_on_write    | a BlockManager subclass overriding append_slots          |
| 05     | check_scheduler        | a ContinuousBatchingScheduler subclass overriding schedule |
| 06     | check_preemption       | a Scheduler subclass overriding pick_victim / _preempt   |
| 06     | check_swap             | a BlockManager subclass overriding swap_out / swap_in    |
| 07     | check_detokenizer      | minillm.text.detokenizer.IncrementalDetokenizer               |
| 07     | check_request_stream   | minillm.server.async_engine.RequestStream                |
| 08     | check_paged_decode_kernel | minillm.attention.triton_decode.paged_decode_kernel   |
| 09     | check_int8_quantizer   | minillm.quant.reference.quantize_int8, dequantize_int8   |
| 09     | check_int4_quantizer   | minillm.quant.reference.quantize_int4, dequantize_int4   |
| 10     | check_layer_sharding   | minillm.distributed.sharding.shard_decoder_layer         |
| 10     | check_router_choice    | minillm.server.data_parallel.choice.choose_replica       |
| 10     | check_balanced_partition | minillm.distributed.partition.balanced_partition       |
| 11     | check_ngram_proposer   | minillm.spec.ngram.propose_ngram                         |
| 11     | check_rejection_sampler | minillm.spec.rejection.verify                           |
| 12     | check_structured_outputs | a StructuredOutputs subclass overriding mask_logits / advance |
| 12     | check_choice_constraint | minillm.structured.choice_trie.ChoiceConstraint         |
| 13     | check_lora_delta       | minillm.lora.batched_delta.gathered_delta                |
| 13     | check_chain_root       | minillm.kv.prefix_cache.chain_root                       |

Each lesson's graders live in `lessonNN*.py`, built on `harness.py` (cases, verdicts,
hints) and, for lessons 03-06, `engine_runs.py` (engine runs compared with the
reference's). Every case uses fixed seeds, so a check gives the same verdict every time
it runs.

A failed check raises `CheckFailed` (an AssertionError) whose notebook traceback is the
message alone. The cells that plug your piece into the engine take
`passed_or_reference(yours, "check_...")`: yours once its check passed, else the reference,
with a printed note, so one unfinished exercise does not break every later cell.
"""
from .harness import CheckFailed, passed_or_reference
from .lesson00 import check_rope
from .lesson01_generation import check_generate_naive
from .lesson01_sampling import check_sampler, check_top_k, check_top_p
from .lesson02 import check_contiguous_cache
from .lesson03 import check_block_allocator, check_slot_mapping
from .lesson03_attention import check_paged_attention
from .lesson04_copy_on_write import check_copy_on_write
from .lesson04_prefix_cache import check_block_hash, check_prefix_cache
from .lesson05 import check_scheduler
from .lesson06 import check_preemption, check_swap
from .lesson07_detokenizer import check_detokenizer
from .lesson07_stream import check_request_stream
from .lesson08 import check_paged_decode_kernel
from .lesson09_int4 import check_int4_quantizer
from .lesson09_int8 import check_int8_quantizer
from .lesson10_partition import check_balanced_partition
from .lesson10_router import check_router_choice
from .lesson10_sharding import check_layer_sharding
from .lesson11_ngram import check_ngram_proposer
from .lesson11_rejection import check_rejection_sampler
from .lesson12_choice import check_choice_constraint
from .lesson12_masks import check_structured_outputs
from .lesson13_cache_key import check_chain_root
from .lesson13_delta import check_lora_delta

__all__ = ["check_rope", "check_top_k", "check_top_p", "check_sampler", "check_generate_naive",
           "check_contiguous_cache", "check_block_allocator", "check_slot_mapping", "check_paged_attention",
           "check_block_hash",
           "check_prefix_cache", "check_copy_on_write", "check_scheduler", "check_preemption", "check_swap",
           "check_detokenizer", "check_request_stream",
           "check_paged_decode_kernel",
           "check_int8_quantizer", "check_int4_quantizer",
           "check_layer_sharding", "check_router_choice", "check_balanced_partition",
           "check_ngram_proposer", "check_rejection_sampler",
           "check_structured_outputs", "check_choice_constraint",
           "check_lora_delta", "check_chain_root"]
