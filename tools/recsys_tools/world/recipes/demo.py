"""The demo world: generated, its ranker trained on its impressions, written whole."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.world.attributes import save_attributes
from app.world.foldin import PLAIN, save_foldin
from app.world.item_prior import save_item_prior
from app.world.layout import MODEL_FILE
from app.world.neighbours import save_neighbours
from app.world.schema import FeatureSchema
from app.world.tables import save_table
from recsys_tools.world.generate.synth import generate_world
from recsys_tools.world.generate.titles import generated_attributes, genre_names
from recsys_tools.world.learn.item_prior import ItemAttributesIn, fit_item_prior
from recsys_tools.world.learn.neighbours import item_neighbours
from recsys_tools.world.learn.ranker.train import train_ranker
from recsys_tools.world.store.catalog import write_catalog
from recsys_tools.world.store.identity import stamp_world

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DemoSize:
    items: int
    users: int
    impressions: int


DEMO = DemoSize(items=100_000, users=20_000, impressions=200_000)
LARGE = DemoSize(items=1_000_000, users=100_000, impressions=400_000)
# The manifest's `source` of a world the demo generated, and so may build again.
SYNTHETIC = "synthetic"


def build_demo_world(
    world: Path, schema: FeatureSchema, size: DemoSize, index_factory: str = "auto", seed: int = 7
) -> dict[str, object]:
    """Generate, train and write a synthetic world; returns the training report."""
    started = time.perf_counter()
    generated = generate_world(schema, size.items, size.users, size.impressions, seed)
    log.info("generated %d items, %d users", size.items, size.users)
    catalog = write_catalog(world, schema, generated.items, generated.users, index_factory)
    save_table(world, generated.seen)
    # Its vectors are generated, not fitted: new ones are folded in with plain counts.
    save_foldin(world, PLAIN)
    # Items clicked by the same users are neighbours; the pre-rank weights stay the default
    # (the user's vector alone): nothing here was held out to fit them on.
    clicked = generated.interactions.clicked == 1
    by_user = np.argsort(generated.interactions.users[clicked], kind="stable")
    save_neighbours(
        world,
        item_neighbours(
            generated.interactions.users[clicked][by_user],
            generated.interactions.items[clicked][by_user],
            size.users,
            size.items,
        ),
    )
    log.info("training the ranker on %d impressions", size.impressions)
    trained = train_ranker(generated, schema, seed)
    (world / MODEL_FILE).write_bytes(trained.onnx_model)
    attributes = generated_attributes(generated.items.categories, seed)
    save_attributes(world, attributes)
    codes = generated.items.categories
    prior, prior_report = fit_item_prior(
        ItemAttributesIn(
            tuple(genre_names(int(codes.max()) + 1)),
            [[code] for code in codes.tolist()],
            attributes["title"].tolist(),
            generated.items.dense,
        ),
        generated.items.embeddings,
        seed,
    )
    save_item_prior(world, prior)
    report = trained.report.as_dict()
    stamp_world(
        world,
        schema,
        **catalog.manifest(),
        source=SYNTHETIC,
        seed=seed,
        training=report,
        item_prior=prior_report.as_dict(),
        build_seconds=round(time.perf_counter() - started, 1),
    )
    return report
