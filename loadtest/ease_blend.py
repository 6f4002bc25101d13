"""How far blending EASE's signals goes on a public set's split: a grid's best, tuned on the
held-out answers (a figure to hold the served answers against, not a fair opponent).

`python -m loadtest.ease_blend --set latest-small --data DIR [--out docs/benchmarks.json]`
cuts the set as loadtest.served_quality does (each user's latest 20% later; drawn with
`--seed` in a set without times) and scores each user's unseen items by a blend of what the
simple models say:

- EASE over all the user's earlier positives (x·B, loadtest/ease.py);
- EASE over their latest positives only, each older one counting less (a sequence signal
  like the served world's similar score, here from the full item-item matrix B; a set
  without times has no latest positives, and goes without it);
- how many positives each item had in the earlier part's last tenth of time (what was
  popular lately; absent from a set without times).

EASE's two scores are scaled by their spread over the judged users who have positives,
what was popular lately by its spread over the items. The blend's weights, EASE's λ and the
recent window are chosen from a small grid on the later part itself: weights chosen with
the held-out answers, which no build could do, so the best of the grid is a generous
figure for what blending these signals can buy. Served answers well short of it say a
better blend would pay; near it, that beating EASE by more needs a signal of another kind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from recsys_tools.live_evaluation import Question, Tally, questions
from recsys_tools.world.judge.split import later_rows
from recsys_tools.world.read.log import InteractionLog, read_log

from app.core.cascade import RECENT_DECAY, RECENT_ITEMS
from loadtest import ease
from loadtest.record import record
from loadtest.served_quality import SETS, SHARE

log = logging.getLogger("loadtest.ease_blend")
K = ease.K
LAMBDAS = (100.0, 200.0)
# (latest positives read, decay per step back): a short window, and the served world's own.
WINDOWS = ((5, 0.8), (RECENT_ITEMS, RECENT_DECAY))
RECENT_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
LATELY_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.4)
LATELY_SHARE = 0.1  # the earlier part's last tenth of time
FloatMatrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Judged:
    """The judged users' signals, one row each, over EASE's columns."""

    asked: list[Question]
    whole: FloatMatrix  # EASE over all their positives (popularity where they have none)
    recent: dict[tuple[int, float], FloatMatrix]  # empty in a log without times
    lately: npt.NDArray[np.float32] | None
    unseen: npt.NDArray[np.bool_]  # users x columns: what may be answered
    liking: npt.NDArray[np.bool_]  # the users with earlier positives (EASE's own rows)


def _lately(model: ease.Ease, earlier: InteractionLog) -> npt.NDArray[np.float32] | None:
    if not earlier.timed:
        return None
    start, end = float(earlier.time.min()), float(earlier.time.max())
    rows = earlier.positive & (earlier.time >= end - LATELY_SHARE * (end - start))
    columns = [model.items[item] for item in earlier.items.ids[earlier.item[rows]].tolist()]
    counts: npt.NDArray[np.float32] = np.bincount(columns, minlength=len(model.ids)).astype(
        np.float32
    )
    return counts


def judged(model: ease.Ease, earlier: InteractionLog, later: InteractionLog) -> Judged:
    liked, _ = ease.histories(earlier)  # each user's positives, oldest first
    asked = questions(later, earlier)
    columns = len(model.ids)
    whole = np.zeros((len(asked), columns), dtype=np.float32)
    recent = {window: np.zeros_like(whole) for window in WINDOWS} if earlier.timed else {}
    unseen = np.ones_like(whole, dtype=bool)
    liking = np.zeros(len(asked), dtype=bool)
    for row, one in enumerate(asked):
        mine = [model.items[item] for item in liked.get(one.user, []) if item in model.items]
        unseen[row, [model.items[item] for item in one.seen if item in model.items]] = False
        if not mine:
            whole[row] = model.popularity
            continue
        liking[row] = True
        whole[row] = model.scores(mine)
        for latest, decay in recent:
            x = np.zeros(columns)
            picked = mine[::-1][:latest]  # newest first
            np.add.at(x, picked, decay ** np.arange(len(picked)))
            recent[(latest, decay)][row] = model.scores.weighted(x)
    return Judged(asked, whole, recent, _lately(model, earlier), unseen, liking)


def scored(scores: FloatMatrix, on: Judged, ids: list[str]) -> dict[str, Any]:
    """recall@K and NDCG@K of each judged user's best K unseen columns (ties in column
    order, as Ease.top breaks them), scored as the live answers are."""
    tally = Tally(K)
    for row, one in enumerate(on.asked):
        order = np.argsort(-scores[row], kind="stable")
        unseen = order[on.unseen[row, order]][:K]
        tally.add(one, [ids[column] for column in unseen.tolist()])
    return tally.report()


def _spread(values: FloatMatrix) -> float:
    scale = float(np.std(values))
    return scale if scale > 0 else 1.0


def best_blend(model: ease.Ease, on: Judged) -> dict[str, Any]:
    """EASE alone, and the grid's best blend, each with its figures and weights."""
    # EASE's spreads over its own rows: a user without positives is answered by popularity,
    # counts on another scale (only what was popular lately is added to their row).
    whole = on.whole / _spread(on.whole[on.liking])
    alone = scored(whole, on, model.ids)
    lately = np.zeros(len(model.ids), np.float32) if on.lately is None else on.lately
    lately = lately / _spread(lately)
    best = {**alone, "recent": 0.0, "window": None, "lately": 0.0}
    windows: list[tuple[int, float] | None] = [*on.recent] or [None]
    for window, recent_w, lately_w in itertools.product(
        windows,
        RECENT_WEIGHTS if on.recent else (0.0,),
        LATELY_WEIGHTS if on.lately is not None else (0.0,),
    ):
        blend = whole + lately_w * lately[None, :]
        if window is not None:
            recent = on.recent[window]
            blend = blend + recent_w * recent / _spread(recent[on.liking])
        figures = scored(blend, on, model.ids)
        if figures[f"recall@{K}"] > best[f"recall@{K}"]:
            shape = None if window is None else {"latest": window[0], "decay": window[1]}
            best = {**figures, "recent": recent_w, "window": shape, "lately": lately_w}
    return {"ease_alone": alone, "blend": best}


def measure(name: str, data: Path, seed: int) -> dict[str, Any]:
    public = SETS[name]
    whole = read_log(data / public.ratings, public.columns)
    later = later_rows(whole, SHARE, seed=seed)
    earlier, judged_part = whole.subset(~later), whole.subset(later)
    by_lambda: dict[str, Any] = {}
    for lam in LAMBDAS:
        model = ease.fit(earlier, lam)
        by_lambda[f"{lam:g}"] = best_blend(model, judged(model, earlier, judged_part))
        log.info("%s, λ %g: %s", name, lam, json.dumps(by_lambda[f"{lam:g}"]))
    top = max(by_lambda.values(), key=lambda one: one["blend"][f"recall@{K}"])
    # EASE alone at the grid's λ only: EASE at its best (served_quality) tries more.
    alone = max(one["ease_alone"][f"recall@{K}"] for one in by_lambda.values())
    return {
        "set": name,
        "seed": seed if not public.timed else None,
        "held_out": "each user's latest 20%" if public.timed else "20% of each user's rows, drawn",
        "by_lambda": by_lambda,
        f"ease_alone_recall@{K}": alone,
        f"blend_recall@{K}": top["blend"][f"recall@{K}"],
        "blend_over_ease_alone": round(top["blend"][f"recall@{K}"] / alone, 3) if alone else None,
        f"blend_ndcg@{K}": top["blend"][f"ndcg@{K}"],
        "chosen_on": "the judged part itself, from a small grid",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--data", type=Path, required=True, help="the folder with its files")
    parser.add_argument("--seed", type=int, default=7, help="the draw, in a set without times")
    parser.add_argument("--out", type=Path, help="merge the figures into this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    figures = measure(args.set, args.data, args.seed)
    print(json.dumps(figures, indent=2))
    if args.out:
        record(args.out, f"ease_blend_{args.set}", figures)


if __name__ == "__main__":
    main()
