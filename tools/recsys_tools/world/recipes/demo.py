"""The demo world: generated, its ranker trained on its impressions, written whole."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.world.foldin import PLAIN
from app.world.neighbours import Neighbours
from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema
from app.world.tables import save_table
from recsys_tools.world.generate.synth import World, generate_world
from recsys_tools.world.generate.titles import generated_attributes, genre_names
from recsys_tools.world.learn.item_prior import ItemAttributesIn, fit_item_prior
from recsys_tools.world.learn.neighbours import item_neighbours
from recsys_tools.world.learn.ranker.train import train_ranker
from recsys_tools.world.store.identity import stamp_world
from recsys_tools.world.store.world import WorldParts, write_world

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
    log.info("training the ranker on %d impressions", size.impressions)
    trained = train_ranker(generated, schema, seed)
    attributes = generated_attributes(generated.items.categories, seed)
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
    parts = WorldParts(
        items=generated.items,
        users=generated.users,
        attributes=attributes,
        # Its vectors are generated, not fitted: new ones are folded in with plain counts.
        foldin=PLAIN,
        neighbours=_clicked_together(generated, size),
        page_neighbours=None,
        prior=prior,
        prior_report=prior_report.as_dict(),
        # Nothing was held out to fit pre-rank's weights on: the user's vector alone.
        prerank=PrerankWeights(),
        model=trained.onnx_model,
        held_out=trained.held_out,
    )
    written = write_world(
        world, schema, parts, index_factory, lambda path: save_table(path, generated.seen)
    )
    report = trained.report.as_dict()
    stamp_world(
        world,
        schema,
        **written.manifest,
        source=SYNTHETIC,
        seed=seed,
        training=report,
        build_seconds=round(time.perf_counter() - started, 1),
    )
    return report


def _clicked_together(generated: World, size: DemoSize) -> Neighbours:
    """Items clicked by the same users are neighbours."""
    clicked = generated.interactions.clicked == 1
    by_user = np.argsort(generated.interactions.users[clicked], kind="stable")
    return item_neighbours(
        generated.interactions.users[clicked][by_user],
        generated.interactions.items[clicked][by_user],
        size.users,
        size.items,
    )
