import pytest

from app.clients.ranking_model import chunk_bounds, signature_from_triton


@pytest.mark.parametrize(
    ("rows", "max_batch", "bounds"),
    [
        (0, 256, []),
        (10, 256, [(0, 10)]),
        (256, 256, [(0, 256)]),
        (257, 256, [(0, 128), (128, 257)]),
        (1000, 256, [(0, 250), (250, 500), (500, 750), (750, 1000)]),
        (5, 2, [(0, 2), (2, 3), (3, 5)]),
    ],
)
def test_chunks_are_few_even_and_within_max_batch(
    rows: int, max_batch: int, bounds: list[tuple[int, int]]
) -> None:
    assert chunk_bounds(rows, max_batch) == bounds
    assert all(0 < end - start <= max_batch for start, end in bounds)


def test_signature_from_triton_json() -> None:
    metadata = {
        "name": "ranking_model",
        "versions": ["1", "2"],
        "platform": "python",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": ["-1", "121"]}],
        "outputs": [{"name": "score", "datatype": "FP32", "shape": ["-1", "1"]}],
    }
    config = {"config": {"name": "ranking_model", "max_batch_size": 2048}}
    signature = signature_from_triton(metadata, config)
    assert signature.input_shape == (-1, 121)
    assert signature.version == "2"
    assert signature.max_batch_size == 2048
    assert (signature.input_name, signature.output_name) == ("features", "score")


def test_signature_of_a_model_without_inputs() -> None:
    signature = signature_from_triton({"name": "m"}, {"config": {}})
    assert signature.input_shape == ()
    assert signature.max_batch_size == 0
