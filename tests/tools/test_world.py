"""The synthetic world has learnable structure, and the exported model serves it."""

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import pytest
from recsys_tools.world.generate.synth import World, generate_world
from recsys_tools.world.learn.ranker.train import TrainedRanker, train_ranker, training_rows
from recsys_tools.world.store.index import build_index, default_factory

from app.release.catalog import set_search_breadth
from app.world.schema import HEADS_OUTPUT, FeatureSchema, load_schema


@dataclass(frozen=True)
class Trained:
    schema: FeatureSchema
    world: World
    ranker: TrainedRanker


@pytest.fixture(scope="module")
def trained() -> Trained:
    schema = load_schema()
    world = generate_world(schema, n_items=3000, n_users=600, n_impressions=40_000, seed=3)
    return Trained(schema, world, train_ranker(world, schema, seed=3))


def test_ranker_beats_random_and_popularity(trained: Trained) -> None:
    report = trained.ranker.report
    assert report.auc_model > 0.65
    assert report.auc_model > report.auc_popularity + 0.05


def test_each_head_learns_its_own_objective(trained: Trained) -> None:
    # The generated world plants a like that depends on taste and quality, not popularity.
    heads = trained.ranker.report.auc_heads
    assert (heads["interact"] or 0) > 0.65, heads
    assert (heads["like"] or 0) > 0.65, heads
    assert 0.1 < trained.ranker.report.like_rate < 0.9


def test_exported_onnx_returns_the_score_and_the_heads(trained: Trained) -> None:
    schema, world, ranker = trained.schema, trained.world, trained.ranker
    session = ort.InferenceSession(ranker.onnx_model, providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    model_output, heads_output = session.get_outputs()
    assert (model_input.name, model_input.shape) == (schema.input_name, [None, schema.width])
    assert model_output.name == schema.output_name
    assert (heads_output.name, heads_output.shape) == (HEADS_OUTPUT, [None, 2])
    rows = training_rows(world, schema)[:50]
    scores, heads = session.run(None, {schema.input_name: rows})
    assert scores.shape == (50, 1)
    assert np.all((heads >= 0) & (heads <= 1))
    # The score is a log-odds: the interact head's, never more (the like value is at most 1).
    interact = np.log(heads[:, 0] / (1 - heads[:, 0]))
    assert np.all(scores[:, 0] <= interact + 1e-4)
    assert np.all(scores[:, 0] >= interact + np.log(0.5) - 1e-4)


def test_index_factory_by_catalog_size() -> None:
    assert default_factory(5_000) == "Flat"
    assert default_factory(100_000) == "IVF1264,Flat"


def test_ivf_index_finds_the_exact_neighbour() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((30_000, 8)).astype(np.float32)
    index = build_index(vectors, "IVF64,Flat")
    set_search_breadth(index, 64)  # every list: exact
    query = vectors[123] * 10
    _, ids = index.search(query.reshape(1, -1), 1)
    expected = int(np.argmax(vectors @ query))
    assert ids[0, 0] == expected
