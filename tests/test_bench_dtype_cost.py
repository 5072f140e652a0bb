"""`python -m minillm.bench.dtype_cost`: another dtype's greedy tokens against float32's, and batch dependence."""
from minillm.bench.dtype_cost import first_difference, measure

from conftest import get_model

PROMPTS = [[1000 + 7 * i + j for j in range(5 + 3 * i)] for i in range(3)]


def test_first_difference_is_the_first_position_that_differs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([4], [5]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2          # one stopped early


def test_float32_against_itself_is_equal_and_a_lower_precision_is_counted():
    model, tokenizer, _ = get_model("tiny-llama")
    same = measure(model, tokenizer, PROMPTS, 6, "float32", num_kv_blocks=64, block_size=4)
    assert same["equal_to_float32"] == 3 and same["first_difference_positions"] == []
    assert same["batch_dependent"] == same["batch_dependent_float32"] == 0
    half = measure(model, tokenizer, PROMPTS, 6, "bfloat16", num_kv_blocks=64, block_size=4)
    assert half["equal_to_float32"] + len(half["first_difference_positions"]) == 3
    assert all(0 <= d < 6 for d in half["first_difference_positions"])
    assert 0 <= half["batch_dependent"] <= 3
