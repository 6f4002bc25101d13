"""The ranker learnt from what answers showed: shown-and-chosen against shown-and-skipped.

The archive keeps each logged answer's items in the order shown, and the events that
followed. A shown item was chosen when a click, like or purchase (or a rating at the log's
positive) names the answer, or, for an event that names none, when the same user acted on it
within ATTRIBUTION_S after the answer; the answer's other items were skipped. Only answers
with something chosen teach (a list nobody touched may never have been looked at), and
degraded ones, which the model did not order, are left out.

The rows are packed from the files of the world that served the answers: the features the
service had when it showed them, not ones learnt from what followed (a world built after
would hold the chosen item among the user's latest positives). As from_log's ranker, the
network learns the columns that carry to another world's factors and is blended with recall
on the answers of users it never saw. from_log's ranker learns instead against each user's
own candidates that they did not go on to like: sampled negatives, never shown to them.
`compare_on_answers` judges rankers on answers none of them learnt from: NDCG@10 of what was
chosen, ordered by each, beside the order the answer showed.

Learnt from answers alone, a ranker knows only what was shown: the items a world put first,
never the two hundred it ranks. So a third ranker keeps the lists' whole score and adds the
answers' network to it, weighed on the answers of users neither learnt from (`with_answers`;
a weight of 0 when the answers add nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from app.world.prerank import load_prerank
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.learn.blend import (
    blended_onnx,
    choose_blend,
    lists_ndcg,
    recall_scores,
)
from recsys_tools.world.learn.ranker.from_log import factor_free
from recsys_tools.world.learn.ranker.train import export_onnx, fit_ranker
from recsys_tools.world.read.tables import IntArray
from recsys_tools.world.read.times import utc_hour_weekday

FloatArray = npt.NDArray[np.float32]  # packed rows, as the model takes them
ATTRIBUTION_S = 3_600
CHOSEN_TYPES = ("click", "like", "purchase")
# Fewer answers with a choice than this teach a network nothing it can be trusted with.
MIN_CHOSEN_ANSWERS = 50
# A week of answers at full sampling is more than a network needs; beyond this many answers
# with a choice, a seeded sample.
MAX_ANSWERS = 50_000


@dataclass(frozen=True, slots=True)
class ShownRows:
    """Answers' items row by row, in the order shown, each with whether it was chosen."""

    answer: IntArray  # the answer's number, the same for all its rows
    user_ids: npt.NDArray[np.str_]
    item_ids: npt.NDArray[np.str_]
    position: IntArray
    page: npt.NDArray[np.str_]
    ts_s: IntArray
    chosen: npt.NDArray[np.int8]

    @property
    def answers(self) -> int:
        return len(np.unique(self.answer))

    def take(self, rows: npt.NDArray[np.bool_]) -> ShownRows:
        return ShownRows(
            self.answer[rows],
            self.user_ids[rows],
            self.item_ids[rows],
            self.position[rows],
            self.page[rows],
            self.ts_s[rows],
            self.chosen[rows],
        )

    def with_choice(self) -> ShownRows:
        """Only the answers where something was chosen."""
        chose = np.unique(self.answer[self.chosen == 1])
        return self.take(np.isin(self.answer, chose))

    def before(self, ts_s: int) -> ShownRows:
        return self.take(self.ts_s < ts_s)

    def since(self, ts_s: int) -> ShownRows:
        return self.take(self.ts_s >= ts_s)


Named = set[tuple[str, str]]
Unnamed = dict[tuple[str, str], list[float]]


def _chosen_keys(events: pa.Table, positive: float) -> tuple[Named, Unnamed]:
    """(answer, item) named by a positive event, and for events naming no answer, each
    (user, item)'s times in seconds."""
    kind, value = events.column("type"), events.column("value")
    # Kleene logic: a click has no value, and its null must not blank the whole test.
    is_positive = pc.or_kleene(
        pc.is_in(kind, value_set=pa.array(CHOSEN_TYPES)),
        pc.and_kleene(pc.equal(kind, "rating"), pc.greater_equal(value, positive)),
    )
    acted = events.filter(pc.fill_null(is_positive, False))
    answer_ids = acted.column("answer_id").to_pylist()
    users = acted.column("user_id").to_pylist()
    items = acted.column("item_id").to_pylist()
    times = acted.column("ts_ms").to_pylist()
    named: Named = set()
    unnamed: Unnamed = {}
    for answer, user, item, ts in zip(answer_ids, users, items, times, strict=True):
        if answer:
            named.add((answer, item))
        else:
            unnamed.setdefault((user, item), []).append(ts / 1000)
    return named, unnamed


def shown_items(answers: pa.Table, events: pa.Table, positive: float) -> ShownRows:
    """The answers' items (degraded answers left out), each marked chosen or skipped by the
    events that followed."""
    answers = answers.filter(pc.invert(pc.fill_null(answers.column("degraded"), False)))
    items = answers.column("items")
    parent = pc.list_parent_indices(items).to_numpy().astype(np.int64)
    flat = np.asarray(pc.list_flatten(items).to_pylist(), dtype=np.str_)
    lengths = pc.list_value_length(items).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    position = np.arange(len(flat), dtype=np.int64) - starts[parent]
    answer_ids = np.asarray(answers.column("answer_id").to_pylist(), dtype=np.str_)[parent]
    users = np.asarray(answers.column("user_id").to_pylist(), dtype=np.str_)[parent]
    pages = np.asarray(answers.column("page").to_pylist(), dtype=np.str_)[parent]
    ts_s = answers.column("ts_ms").to_numpy()[parent] // 1000
    named, unnamed = _chosen_keys(events, positive)
    chosen = np.zeros(len(flat), dtype=np.int8)
    for row, (answer, user, item, shown_at) in enumerate(
        zip(answer_ids.tolist(), users.tolist(), flat.tolist(), ts_s.tolist(), strict=True)
    ):
        if (answer, item) in named or any(
            0 <= at - shown_at <= ATTRIBUTION_S for at in unnamed.get((user, item), ())
        ):
            chosen[row] = 1
    return ShownRows(parent, users, flat, position, pages, ts_s.astype(np.int64), chosen)


def _sample(shown: ShownRows, seed: int) -> ShownRows:
    numbers = np.unique(shown.answer)
    if len(numbers) <= MAX_ANSWERS:
        return shown
    kept = np.random.default_rng(seed).choice(numbers, size=MAX_ANSWERS, replace=False)
    return shown.take(np.isin(shown.answer, kept))


def packed_rows(world: WorldAnswers, shown: ShownRows) -> tuple[ShownRows, FloatArray]:
    """The rows `world` packs for each answer's items (those its catalog holds), with the
    answer's page and its hour and weekday as the context."""
    hours, weekdays = utc_hour_weekday(shown.ts_s)
    bounds = np.flatnonzero(np.diff(shown.answer)) + 1
    kept = np.zeros(len(shown.answer), dtype=bool)
    parts: list[FloatArray] = []
    for rows in np.split(np.arange(len(shown.answer)), bounds):
        if not len(rows):
            continue
        first = int(rows[0])
        moment = AskContext(
            page=str(shown.page[first]), hour=int(hours[first]), weekday=int(weekdays[first])
        )
        known, packed = world.rows_for(str(shown.user_ids[first]), shown.item_ids[rows], moment)
        kept[rows[known]] = True
        parts.append(packed)
    width = world.schema.width
    rows = np.concatenate(parts) if parts else np.empty((0, width), dtype=np.float32)
    return shown.take(kept), rows.astype(np.float32)


@dataclass(frozen=True, slots=True)
class ImpressionRanker:
    onnx_model: bytes  # the answers' network, blended with recall: the ranker on its own
    report: dict[str, Any]
    # The lists' ranker with the answers' network added to its score.
    with_lists: bytes | None = None


def _sequence(schema: FeatureSchema, rows: FloatArray) -> FloatArray | None:
    return rows[:, schema.blocks["sequence"]] if schema.sequence else None


def train_impression_ranker(
    served_by: Path,
    shown: ShownRows,
    schema: FeatureSchema,
    blend_world: Path,
    seed: int = 7,
    network: str = "auto",
    lists_model: bytes | None = None,
) -> ImpressionRanker | None:
    """The network learnt on the shown rows of half the users (packed from `served_by`, the
    world that showed them), blended with recall on the other half's answers (blend.
    choose_blend: the network keeps a say only where it orders them better than `blend_world`'s
    pre-rank weights, the world it is to serve in, or the signals alone do); and, given the
    lists' ranker, that ranker with the network added. None when too few answers had a
    choice."""
    taught = _sample(shown.with_choice(), seed)
    if taught.answers < MIN_CHOSEN_ANSWERS:
        return None
    served = WorldAnswers(served_by)
    taught, rows = packed_rows(served, taught)
    users = np.unique(taught.user_ids)
    rng = np.random.default_rng(seed)
    blending = np.isin(taught.user_ids, rng.permutation(users)[: max(1, len(users) // 2)])
    learning = ~blending
    if not taught.chosen[learning].any() or not taught.chosen[blending].any():
        return None
    ignored = factor_free(schema, None)
    model = fit_ranker(
        rows[learning],
        taught.chosen[learning],
        seed,
        None,
        network,
        check=(rows[blending], taught.chosen[blending]),
        ignored=ignored,
    )
    checked = rows[blending]
    blend = choose_blend(
        schema,
        load_prerank(blend_world),
        (taught.answer[blending], taught.chosen[blending]),
        recall_scores(schema, checked),
        model.scores(checked),
        _sequence(schema, checked),
        np.zeros(len(schema.sequence), dtype=bool),
    )
    report: dict[str, Any] = {
        "learnt_on": "shown and chosen against shown and skipped",
        "answers": taught.answers,
        "rows": int(learning.sum()),
        "chosen": int(taught.chosen[learning].sum()),
        "kind": model.shape.kind,
        "considered": model.considered,
        "blend": blend.as_dict(),
        "network_in_score": blend.model != 0,
    }
    exported = export_onnx(model, schema)
    combined = None
    if lists_model is not None:
        lists_scores = served.ranked_by(lists_model).score(checked).astype(np.float64)
        weight, tried = added_weight(
            taught.answer[blending], taught.chosen[blending], lists_scores, model.scores(checked)
        )
        report["added_to_lists"] = {"weight": weight, "ndcg@10_by_weight": tried}
        combined = with_answers(lists_model, exported, schema, weight)
    return ImpressionRanker(blended_onnx(exported, schema, blend), report, combined)


# The answers' network's weight beside the lists' score, in units of the two scores' spread.
ADDED_GRID = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0)


def added_weight(
    answers: IntArray,
    chosen: npt.NDArray[np.int8],
    lists_scores: npt.NDArray[np.float64],
    network_scores: npt.NDArray[np.floating],
) -> tuple[float, dict[str, float]]:
    """The weight under which lists + weight x network orders these answers best (0 kept on
    a tie: the answers earn their place), and each weight's NDCG@10."""
    spread = float(np.std(network_scores)) or 1.0
    scale = (float(np.std(lists_scores)) or 1.0) / spread
    network = network_scores.astype(np.float64)
    figures = {
        str(step): lists_ndcg(answers, chosen, lists_scores + step * scale * network)
        for step in ADDED_GRID
    }
    best = max(ADDED_GRID, key=lambda step: (figures[str(step)], -step))
    return best * scale, {k: round(v, 4) for k, v in figures.items()}


def with_answers(lists_model: bytes, network: bytes, schema: FeatureSchema, weight: float) -> bytes:
    """One graph: the lists' ranker's score plus `weight` x the answers' network's, on the
    same input; the heads stay the lists' ranker's."""
    import onnx
    from onnx import TensorProto, compose, helper, numpy_helper

    base = onnx.load_from_string(lists_model)
    added = compose.add_prefix(onnx.load_from_string(network), "answers_", rename_inputs=False)
    out = schema.output_name
    inner = f"{out}_lists"
    for node in base.graph.node:
        node.output[:] = [inner if name == out else name for name in node.output]
    base.graph.initializer.extend(added.graph.initializer)
    base.graph.node.extend(added.graph.node)
    base.graph.initializer.append(
        numpy_helper.from_array(np.array(weight, dtype=np.float32), "answers_weight")
    )
    steps = [
        ("Mul", [f"answers_{out}", "answers_weight"], "answers_weighted"),
        ("Add", [inner, "answers_weighted"], out),
    ]
    for op, inputs, output in steps:
        name = f"answers_add_{output}"  # the lists' graph has a node named after the score
        base.graph.node.append(helper.make_node(op, inputs, [output], name=name))
    others = [output for output in base.graph.output if output.name != out]
    del base.graph.output[:]
    base.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, 1]))
    base.graph.output.extend(others)
    onnx.checker.check_model(base)
    return bytes(base.SerializeToString())


def compare_on_answers(
    answers: WorldAnswers, shown: ShownRows, models: dict[str, bytes]
) -> dict[str, Any]:
    """Each model's NDCG@10 of what was chosen, ordering each answer's items as packed from
    the world `answers` reads, beside the order shown; over the answers with a choice."""
    judged = shown.with_choice()
    if not judged.answers:
        return {"answers": 0}
    judged, rows = packed_rows(answers, judged)
    figures: dict[str, Any] = {
        "answers": judged.answers,
        "as_shown": round(
            lists_ndcg(judged.answer, judged.chosen, -judged.position.astype(np.float64)), 4
        ),
    }
    for name, model in models.items():
        scores = answers.ranked_by(model).score(rows).astype(np.float64)
        figures[name] = round(lists_ndcg(judged.answer, judged.chosen, scores), 4)
    return figures
