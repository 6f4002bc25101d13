"""Why an item was or was not served: read off a trace that followed it (trace.py).

The answer names the stage where the item left and the figure that decided it: its
similarity rank against recall's cut-off, the filter that removed it, its pre-rank rank
against what pre-rank keeps, its model score against the last item served, or the rerank
rule that took it out; for a served item, why it stands where it does.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from app.core.metrics import ServiceMetrics
from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext
from app.pipeline.recommend import RecommendPipeline
from app.pipeline.trace import Trace
from app.pipeline.types import Moment, Query
from app.release.artifacts import ServingArtifacts


@dataclass(frozen=True, slots=True)
class Explanation:
    item_id: str
    verdict: str  # served, unknown, not_recalled, filtered, not_preranked, no_features,
    # outranked, reranked_out
    stage: str | None  # the stage where it left (None: served, or not in the catalog)
    because: str  # one sentence

    def as_dict(self, trace: Trace) -> dict[str, Any]:
        followed = trace.followed
        return {
            "item_id": self.item_id,
            "verdict": self.verdict,
            "stage": self.stage,
            "because": self.because,
            "request_id": trace.request_id,
            "facts": {
                "source": followed.source,
                "removed_by": followed.removed_by,
                "prerank_rank": followed.prerank_rank,
                "prerank_keep": followed.prerank_keep,
                "prerank_pool": followed.prerank_pool,
                "fetched": followed.fetched,
                "score": followed.score,
                "model_rank": followed.model_rank,
                "served_rank": followed.served_rank,
                **followed.facts,
            },
        }


def _last_served(trace: Trace) -> dict[str, Any] | None:
    answer = _answer(trace)
    return answer[-1] if answer else None


def _score(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def explain(trace: Trace, item_id: str) -> Explanation:
    f = trace.followed
    if not trace.follows:
        return Explanation(item_id, "unknown", None, f"{item_id} is not in the served catalog")
    if f.served_rank is not None:
        moved = "" if f.model_rank is None else _moved(f.model_rank, f.served_rank)
        return Explanation(
            item_id,
            "served",
            None,
            f"served at rank {f.served_rank} of {len(_answer(trace))}: recalled by "
            f"{f.source}, pre-ranked {_rank(f.prerank_rank, f.prerank_pool)}, scored "
            f"{_score(f.score)} by the model (rank {f.model_rank} of {_scored_total(trace)})"
            f"{moved}",
        )
    if f.source is None:
        return Explanation(item_id, "not_recalled", "recall", _not_recalled(trace))
    if f.removed_by is not None:
        return Explanation(
            item_id,
            "filtered",
            "filter",
            f"recalled by {f.source}, then removed by the {f.removed_by} filter",
        )
    if f.prerank_rank is not None and f.prerank_rank > f.prerank_keep:
        return Explanation(
            item_id,
            "not_preranked",
            "prerank",
            f"recalled by {f.source}; pre-rank put it at rank {f.prerank_rank} of "
            f"{f.prerank_pool} and keeps the best {f.prerank_keep}",
        )
    if f.fetched is False or f.score is None:
        return Explanation(
            item_id,
            "no_features",
            "fetch",
            f"recalled by {f.source} and pre-ranked, but it has no item features in the "
            "store, so the model could not score it",
        )
    last = _last_served(trace)
    wanted = len(_answer(trace))
    if f.model_rank is not None and f.model_rank > wanted:
        return Explanation(
            item_id,
            "outranked",
            "rank",
            f"scored {_score(f.score)} by the model, rank {f.model_rank} of "
            f"{_scored_total(trace)}; the answer holds {wanted}, the last served scored "
            f"{_score(None if last is None else last['model_score'])}",
        )
    rule = f.facts.get("rerank_rule", "the rerank rules")
    return Explanation(
        item_id,
        "reranked_out",
        "rerank",
        f"scored {_score(f.score)}, rank {f.model_rank} of {_scored_total(trace)} by the model, "
        f"within the answer's {wanted}; removed by {rule}",
    )


def _rank(rank: int | None, pool: int) -> str:
    return "(all kept)" if rank is None else f"{rank} of {pool}"


def _moved(model_rank: int, served_rank: int) -> str:
    if model_rank == served_rank:
        return "; rerank left it there"
    way = "up" if served_rank < model_rank else "down"
    return f"; rerank moved it {way} from the model's rank {model_rank}"


def _not_recalled(trace: Trace) -> str:
    facts = trace.followed.facts
    similarity_rank = facts.get("similarity_rank")
    cut = facts.get("ann_returned")
    if similarity_rank is None:
        return "no candidate source brought it (the user has no vector to search with)"
    return (
        f"no candidate source brought it: by similarity to the user it ranks "
        f"{similarity_rank:,} of {facts.get('catalog_size', 0):,}, and the index search "
        f"returned the nearest {cut:,}; it is not near the user's latest items either"
    )


# The answer an explain request asks for: as long as the API's default answer.
EXPLAIN_ITEMS = 20


async def explain_item(
    pipeline: RecommendPipeline,
    artifacts: ServingArtifacts,
    metrics: ServiceMetrics,
    budget: tuple[float, float],
    user_id: str,
    item_id: str,
    moment: Moment,
    num_items: int = EXPLAIN_ITEMS,
) -> tuple[Trace, Explanation]:
    """Run the pipeline once for the user, following the item; `budget` is (the request's
    budget, the reserve kept from each dependency call), in seconds."""
    position = int(artifacts.lookup([item_id])[0])
    request_id = f"explain-{secrets.token_hex(6)}"
    request = {
        "user_id": user_id,
        "context": {
            "device": moment.device,
            "page": moment.page,
            "locale": moment.locale,
            "hour": moment.hour,
            "weekday": moment.weekday,
        },
        "num_items": num_items,
        "budget_ms": round(budget[0] * 1000.0),
        "explains": item_id,
    }
    trace = Trace(request_id, time.time(), request, about=position)
    ctx = RequestContext.on_budget(
        request_id,
        arrived=time.monotonic(),
        budget_s=budget[0],
        reserve_s=budget[1],
        artifacts=artifacts,
        metrics=metrics,
        user_id=user_id,
        trace=trace,
    )
    await pipeline.run(Query(user_id, num_items, moment=moment), ctx)
    return trace, explain(trace, item_id)


def _answer(trace: Trace) -> list[dict[str, Any]]:
    return trace.rows(Stage.RERANK, "answer")


def _scored_total(trace: Trace) -> int:
    record = trace.records.get(Stage.RANK)
    return 0 if record is None else int(record.facts.get("scored_total", 0))
