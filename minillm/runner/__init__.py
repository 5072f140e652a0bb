"""Lessons 03 and 08: one forward pass of a scheduled step over the paged KV cache.

    model_runner.py        lay out a step as a flat batch, run the model, return logits
    fixed_shape_decode.py  a decode step with fixed shapes and buffers (what compile and graphs need)
    compiled_decode.py     that step through torch.compile (`compile=True`)
    cuda_graphs.py         that step recorded once and replayed as CUDA graphs
"""
