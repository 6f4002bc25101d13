"""The world's labelled held-out rows: what every comparison and calibration of the model reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import ConfigError
from app.world.layout import HOLDOUT_FILE, USERS_FILE
from app.world.manifest import read_manifest
from app.world.tables import load_users
from recsys_tools.world.generate.synth import generate_world
from recsys_tools.world.learn.ranker.train import training_rows
from recsys_tools.world.recipes.demo import SYNTHETIC

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from app.world.schema import FeatureSchema

    FloatArray = npt.NDArray[np.float32]

# train_ranker's test rows are its seed's first draw below this share.
DEMO_TEST_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Holdout:
    rows: FloatArray
    labels: npt.NDArray[np.int8]
    source: str


def load_holdout(world: Path, schema: FeatureSchema) -> Holdout:
    """The world's saved held-out rows, else a synthetic world's made again from its seed."""
    import numpy as np

    path = world / HOLDOUT_FILE
    if not path.is_file():
        return _regenerated(world, schema)
    with np.load(path) as saved:
        rows, labels = saved["rows"].astype(np.float32), saved["labels"].astype(np.int8)
    if rows.ndim != 2 or rows.shape[1] != schema.width or len(labels) != len(rows):
        raise ConfigError(
            f"{path} holds rows {rows.shape} and labels {labels.shape}, the schema packs "
            f"(n, {schema.width}): rebuild the world"
        )
    return Holdout(rows, labels, str(path))


def _regenerated(world: Path, schema: FeatureSchema) -> Holdout:
    import numpy as np

    manifest = read_manifest(world)
    missing = f"{world / HOLDOUT_FILE} is missing"
    if manifest.get("source") != SYNTHETIC:
        raise ConfigError(f"{missing}: rebuild the world with recsys build-world, which saves it")
    try:
        seed, training = int(manifest["seed"]), manifest["training"]
        impressions = int(training["train_rows"]) + int(training["test_rows"])
        generated = generate_world(
            schema, int(manifest["items"]), int(manifest["users"]), impressions, seed
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{missing} and the manifest lacks {exc}: rebuild the world") from None
    test = np.random.default_rng(seed).random(impressions) < DEMO_TEST_SHARE
    users = load_users(world)
    if int(test.sum()) != int(training["test_rows"]) or not (
        np.array_equal(users.embeddings, generated.users.embeddings)
        and np.array_equal(users.dense, generated.users.dense)
    ):
        raise ConfigError(
            f"{missing} and {world / USERS_FILE} is not what build-demo makes from seed {seed} "
            "today: rebuild the world with recsys build-demo"
        )
    rows = training_rows(generated, schema)[test]
    labels = generated.interactions.clicked[test]
    return Holdout(rows, labels, f"regenerated from build-demo seed {seed}")
