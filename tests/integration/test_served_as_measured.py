"""What is served is what was measured: the service's answer is the build's, item for item.

A world built from a log is served by real Redis and a real Triton with rules that change
nothing; for every user the answer must be the list the build's own evaluation computes
from the world's files (recsys_tools.world.judge.answers). A second copy of the world carries a
blend with the weights the public movie-ratings sets gave (recall 10, similar 17, recent
295): its scores reach far past where a sigmoid is 1.0 in float32, and must still never
tie, on Triton, between distinct candidates. A third is built with the order model: its
signal is stepped in process from each user's latest positives, by the service as by the
build.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from recsys_tools.cli import main
from recsys_tools.demo import StackOptions, prepare_model_repository
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    project_root,
    start_redis,
    start_triton,
)
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.learn.blend import Blend, blended_onnx
from recsys_tools.world.learn.ranker.export import export_net
from recsys_tools.world.learn.ranker.net import MLP, Layer, RankerNet
from recsys_tools.world.store.identity import stamp_world

from app.core.settings import Settings
from app.world.layout import MODEL_FILE, REPORT_FILE
from app.world.prerank import load_prerank, save_prerank
from app.world.schema import FeatureSchema, world_schema
from tests.integration.conftest import PLAIN_RULES, in_process_settings, serving
from tests.integration.movie_log import build_movie_world, write_movie_log

pytestmark = pytest.mark.integration
MOMENT = AskContext(device="mobile", page="home", locale="en-US", hour=10, weekday=2)
# What both public movie-ratings worlds were given: the network none, the rest this.
REPORTED = Blend(recall=10.0, model=0.0, bias=0.0, sequence=(17.0, 295.0, 0.0, 0.0, 0.0))
# From here a float32 sigmoid is exactly 1.0.
SIGMOID_SATURATES = 17.0


@dataclass(frozen=True)
class Served:
    world: Path
    saturating: Path
    ordered: Path
    repository: Path
    redis_urls: dict[Path, str]
    triton_url: str
    rules: Path
    users: list[str]

    def settings(self, world: Path, **overrides: Any) -> Settings:
        return in_process_settings(
            artifacts_dir=world,
            redis_url=self.redis_urls[world],
            triton_url=self.triton_url,
            rules_file=self.rules,
            **overrides,
        )


def _blend_only(schema: FeatureSchema) -> bytes:
    """A network that says nothing (the blend gives it no weight), with REPORTED after it."""
    hidden = 4
    net = RankerNet(
        MLP,
        np.zeros(schema.width, np.float32),
        np.ones(schema.width, np.float32),
        (),
        (Layer(np.zeros((schema.width, hidden), np.float32), np.zeros(hidden, np.float32)),),
        Layer(np.zeros((hidden, 2), np.float32), np.zeros(2, np.float32)),
    )
    network = export_net(net, schema.input_name, schema.output_name, schema.width)
    return blended_onnx(network, schema, REPORTED)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("measured")
    ratings, movies, rated = write_movie_log(folder)
    world, saturating, ordered = folder / "world", folder / "saturating", folder / "ordered"
    build_movie_world(ratings, movies, world)
    build_movie_world(ratings, movies, ordered, "--order-model")
    # Pre-rank weighs the order signal, whatever this small log's fit chose, so the cut it
    # makes (the test serves with a small keep) depends on the signal.
    fitted = load_prerank(ordered)
    save_prerank(ordered, replace(fitted, order=4.0 * max(fitted.user, 1.0)))
    stamp_world(ordered, world_schema(ordered, None))
    shutil.copytree(world, saturating)
    schema = world_schema(saturating, None)
    (saturating / MODEL_FILE).write_bytes(_blend_only(schema))
    stamp_world(saturating, schema)
    rules = folder / "rules.toml"
    rules.write_text(PLAIN_RULES)
    options = StackOptions(world, project_root() / "model_repository", folder / "run")
    repository = prepare_model_repository(options, schema.model_name)
    started: list[ManagedProcess] = []
    try:
        urls = {}
        for name, built in (("a", world), ("b", saturating), ("c", ordered)):
            process, url = start_redis(folder / f"redis-{name}")
            started.append(process)
            assert main(["load-redis", "--world", str(built), "--redis-url", url]) == 0
            urls[built] = url
        triton, triton_url = start_triton(
            default_triton_env(),
            repository,
            folder / "triton",
            [schema.model_name],
            model_control=True,
        )
        started.append(triton)
        # Every user of the log, and one the world never met (a cold start).
        users = [*sorted(rated, key=int), "stranger"]
        yield Served(world, saturating, ordered, repository, urls, triton_url, rules, users)
    finally:
        for process in reversed(started):
            process.stop()


async def _served_answers(
    served: Served, world: Path, settings: Settings | None = None
) -> dict[str, list[str]]:
    answers = {}
    async with serving(settings or served.settings(world)) as api:
        for user in served.users:
            response = await api.post(
                "/recommend",
                json={"user_id": user, "num_items": 10, "context": MOMENT.as_json()},
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["degraded"] == [], body
            answers[user] = [item["item_id"] for item in body["items"]]
    return answers


def _install(served: Served, world: Path) -> None:
    name = world_schema(world, None).model_name
    main(["install-model", "--world", str(world), "--model-repository", str(served.repository)])
    client = triton_grpc.InferenceServerClient(served.triton_url)
    try:
        client.load_model(name)  # Triton reads the model and its config anew
    finally:
        client.close()


def _triton_scores(served: Served, schema: FeatureSchema, rows: np.ndarray) -> np.ndarray:
    client = triton_grpc.InferenceServerClient(served.triton_url)
    try:
        parts = []
        for start in range(0, len(rows), 128):
            chunk = np.ascontiguousarray(rows[start : start + 128])
            given = triton_grpc.InferInput(schema.input_name, list(chunk.shape), "FP32")
            given.set_data_from_numpy(chunk)
            result = client.infer(schema.model_name, [given])
            parts.append(result.as_numpy(schema.output_name).reshape(-1))
    finally:
        client.close()
    return np.concatenate(parts)


async def test_every_answer_is_the_list_the_build_computes_from_the_files(
    served: Served,
) -> None:
    expected = dict(WorldAnswers(served.world).answers(served.users, MOMENT))
    answers = await _served_answers(served, served.world)
    differing = [user for user in served.users if answers[user] != expected[user]]
    assert not differing, {user: (answers[user], expected[user]) for user in differing[:3]}


async def test_the_build_and_the_service_hand_the_model_the_same_candidates(
    served: Served,
) -> None:
    # The build's evaluation runs the service's own candidate stages over the world's files;
    # the service's trace says what its stages did with Redis and Triton, user by user.
    # A pool short of the catalog and a pre-rank cut, so every source and the cut count.
    settings = served.settings(
        served.world,
        debug_pages=True,
        trace_sample_percent=0.0,
        candidate_count=60,
        popular_candidates=20,
        prerank_keep=40,
    )
    world = WorldAnswers(served.world, settings)
    sample = served.users[:: max(1, len(served.users) // 20)]
    async with serving(settings) as api:
        for user in sample:
            response = await api.post(
                "/recommend",
                json={"user_id": user, "num_items": 10, "context": MOMENT.as_json(), "debug": True},
            )
            answer_id = response.json()["answer_id"]
            records = (await api.get(f"/debug/traces/{answer_id}")).json()["records"]
            pool, by_model = world.candidates(user, MOMENT)
            assert records["filter"]["went_out"] == len(pool), user
            assert records["rank"]["came_in"] == len(by_model) == 40, user
            scored = [row["item_id"] for row in records["rank"]["tables"]["scored"]["rows"]]
            # The model's order of what pre-rank kept: Triton's against onnxruntime's, the
            # first ten in order, the rest among what the build kept.
            assert scored[:10] == by_model[:10], user
            assert set(scored) <= set(by_model), user


async def test_scores_far_past_a_sigmoids_range_never_tie_on_triton(served: Served) -> None:
    _install(served, served.saturating)
    try:
        files = WorldAnswers(served.saturating)
        for user in served.users[:5]:
            items, rows = files.model_input(user, MOMENT)
            scores = _triton_scores(served, files.schema, rows)
            assert len(set(items)) == len(items) == len(scores)
            # The regime the public sets put the score in: a sigmoid would answer 1.0 here.
            assert scores.max() > SIGMOID_SATURATES, scores.max()
            distinct_rows = len(np.unique(rows, axis=0))
            assert len(np.unique(scores)) == distinct_rows, user
        expected = dict(files.answers(served.users, MOMENT))
        answers = await _served_answers(served, served.saturating)
        differing = [user for user in served.users if answers[user] != expected[user]]
        assert not differing, {user: (answers[user], expected[user]) for user in differing[:3]}
    finally:
        _install(served, served.world)


async def test_a_world_with_the_order_model_serves_what_its_files_say(served: Served) -> None:
    # A keep short of the pool: what pre-rank hands on turns on the order signal too.
    settings = served.settings(served.ordered, prerank_keep=30)
    files = WorldAnswers(served.ordered, settings)
    assert files.schema.sequence[-1] == "order"
    # The report says what was learnt and how its training went.
    learnt = json.loads((served.ordered / REPORT_FILE).read_text())["order_model"]
    assert learnt["items"] == len(files.item_ids)
    assert learnt["window"] == 20
    assert learnt["checking_users"] > 0
    assert 0.0 <= learnt["checking_hit@10"] <= 1.0
    # The signal is there to be weighed: each rated user's candidates score apart by it.
    column = files.schema.blocks["sequence"].stop - 1
    for user in served.users[:5]:
        _, rows = files.model_input(user, MOMENT)
        assert np.ptp(rows[:, column]) > 0, user
    _, cold = files.model_input("stranger", MOMENT)
    assert not cold[:, column].any()
    _install(served, served.ordered)
    try:
        expected = dict(files.answers(served.users, MOMENT))
        answers = await _served_answers(served, served.ordered, settings)
        differing = [user for user in served.users if answers[user] != expected[user]]
        assert not differing, {user: (answers[user], expected[user]) for user in differing[:3]}
    finally:
        _install(served, served.world)
