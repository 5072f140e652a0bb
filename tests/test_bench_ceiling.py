"""The compute-ceiling report of `bench throughput`: useful FLOPs counted by hand."""
from minillm.bench.ceiling import matmul_flops_per_second, workload_flops
from minillm.config import ModelConfig


def test_workload_flops_counts_projections_attention_and_head():
    c = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=2)
    # one prompt of 3 tokens, 2 outputs: 4 tokens fed (positions 0..3 attend to 1..4 keys)
    per_layer = 4 * (2 * 4 + 2 * 2) + 3 * 4 * 6           # q, o: 4x4; k, v: 4x2; MLP: 3 x 4x6
    expected = 2 * per_layer * 2 * 4 + 4 * 4 * 2 * (1 + 2 + 3 + 4) + 2 * 4 * 10 * 2
    assert workload_flops(c, [([1, 2, 3], 2)]) == expected
    assert workload_flops(c, [([1, 2, 3], 2)] * 3) == 3 * expected


def test_matmul_ceiling_is_a_positive_measurement():
    flops = matmul_flops_per_second("cpu", n=128, seconds=0.05)
    assert 1e8 < flops < 1e14
