"""`recsys model compare`: the world's FP32 ranker against FP16 and INT8 copies of it.

Each model scores the same labelled held-out rows on the CPU with onnxruntime; the report
gives each one's AUC and its loss against FP32, how far the scores and the top of each
request's ranking move, file sizes and the latency of one request's batch. Held-out rows come
from the world's holdout.npz (model/holdout.py).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.clients.onnx_scorer import OnnxScorer, onnx_scorer
from app.core.cascade import PRERANK_KEEP
from app.core.errors import ConfigError
from app.pipeline.packing import pack_rows
from app.world.layout import MODEL_FILE
from recsys_tools.model.holdout import load_holdout
from recsys_tools.model.precision import fp16_copy, ties_made
from recsys_tools.world.judge.measures import auc

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from app.world.schema import FeatureSchema

    FloatArray = npt.NDArray[np.float32]

PRECISIONS = ("fp16", "int8")
CANDIDATES: int = PRERANK_KEEP  # rows one request ranks
INT8_AUC_BUDGET = 0.005  # the AUC loss the serving article accepted for INT8 after an A/B
TIMED_RUNS = 30
TENSORRT_NOTE = (
    "A TensorRT engine on a GPU host is compared the same way: the same held-out rows and "
    "the same report, with the engine as another scorer in place of onnxruntime's CPU session."
)


@dataclass(frozen=True, slots=True)
class Agreement:
    """How far a reduced-precision model moves from FP32 (FP32 minus reduced for AUC)."""

    auc_loss: float
    top_overlap_mean: float
    top_overlap_min: float
    kendall_tau_mean: float
    spearman_mean: float
    max_abs_diff: float
    mean_abs_diff: float
    # Candidates that lost a score of their own to the reduction, over every request (a tie
    # orders them by whatever came before, not by the model), and the widest FP32 gap
    # between two it made equal.
    ties_added: int = 0
    tied_gap_max: float = 0.0


@dataclass(frozen=True, slots=True)
class Scores:
    """One model's scores of the labelled rows and of each request."""

    rows: FloatArray
    requests: list[FloatArray]


@dataclass(frozen=True, slots=True)
class ModelReport:
    precision: str
    path: str | None  # None: a converted copy that was not kept (no --out)
    size_bytes: int
    auc: float
    batch_ms_p50: float
    batch_ms_p99: float
    against_fp32: Agreement | None = None  # None: FP32 itself


def reduce_model(model: Path, precision: str, out: Path) -> Path:
    """Write an FP16 or INT8 copy of the model into `out`; inputs and outputs stay FP32, and
    an FP16 copy keeps the score's tail in FP32 (precision.py)."""
    import onnx

    target = out / f"{model.stem}.{precision}.onnx"
    if precision == "fp16":
        onnx.save(fp16_copy(onnx.load(model)), target)
    else:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # It advises a pre-processing pass, which breaks this model's quantization: hush it.
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(model, target, weight_type=QuantType.QInt8)
        finally:
            logging.disable(logging.NOTSET)
    return target


def _score(scorer: OnnxScorer, rows: FloatArray, candidates: int) -> FloatArray:
    import numpy as np

    # Batches as large as a request's: INT8 scales its activations over the whole batch.
    parts = [scorer.score(rows[i : i + candidates]) for i in range(0, len(rows), candidates)]
    return np.concatenate(parts)


def _latency_ms(scorer: OnnxScorer, requests: list[FloatArray]) -> tuple[float, float]:
    import numpy as np

    scorer.score(requests[0])  # the first run allocates
    times = []
    for k in range(max(TIMED_RUNS, len(requests))):
        started = time.perf_counter()
        scorer.score(requests[k % len(requests)])
        times.append(1000 * (time.perf_counter() - started))
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def requests_from(schema: FeatureSchema, rows: FloatArray, candidates: int) -> list[FloatArray]:
    """One request per `candidates` consecutive rows: its first row's user and context with
    every row's item, packed as the service packs a request (one user, many candidates)."""
    import numpy as np

    size, blocks = min(candidates, len(rows)), schema.blocks
    packed = []
    for start in range(0, len(rows) - size + 1, size):
        chunk = rows[start : start + size]
        user = np.concatenate([chunk[0, blocks["user_embedding"]], chunk[0, blocks["user_dense"]]])
        items = np.concatenate(
            [chunk[:, blocks["item_embedding"]], chunk[:, blocks["item_dense"]]], axis=1
        )
        sequence = chunk[:, blocks["sequence"]] if schema.sequence else None
        packed.append(
            pack_rows(schema, user, items, chunk[0, blocks["context"]], sequence=sequence)
        )
    return packed


def _top(scores: FloatArray, n: int) -> set[int]:
    import numpy as np

    return {int(i) for i in np.argsort(-scores, kind="stable")[:n]}


def agreement(labels: npt.NDArray[np.int8], base: Scores, reduced: Scores, top: int) -> Agreement:
    import numpy as np
    from scipy.stats import kendalltau, spearmanr

    pairs = list(zip(base.requests, reduced.requests, strict=True))
    overlaps = [len(_top(a, top) & _top(b, top)) / min(top, len(a)) for a, b in pairs]
    diff = np.abs(base.rows.astype(np.float64) - reduced.rows)
    ties = [ties_made(a, b) for a, b in pairs]
    return Agreement(
        auc_loss=auc(labels, base.rows) - auc(labels, reduced.rows),
        top_overlap_mean=float(np.mean(overlaps)),
        top_overlap_min=float(np.min(overlaps)),
        kendall_tau_mean=float(np.mean([kendalltau(a, b).statistic for a, b in pairs])),
        spearman_mean=float(np.mean([spearmanr(a, b).statistic for a, b in pairs])),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        ties_added=sum(made[0] for made in ties),
        tied_gap_max=max((made[1] for made in ties), default=0.0),
    )


@dataclass(frozen=True, slots=True)
class CompareOptions:
    precisions: tuple[str, ...] = PRECISIONS
    rows: int | None = None  # None: every held-out row
    top: int = 20
    candidates: int = CANDIDATES
    out: Path | None = None  # keeps the converted models


@dataclass(frozen=True, slots=True)
class Comparison:
    world: str
    holdout: str
    rows: int
    positives: int
    requests: int
    options: CompareOptions
    models: tuple[ModelReport, ...]

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        del report["options"]
        report["models"] = {model["precision"]: model for model in report["models"]}
        return report | {
            "candidates": self.options.candidates,
            "top": self.options.top,
            "int8_auc_budget": INT8_AUC_BUDGET,
            "tensorrt": TENSORRT_NOTE,
        }


def compare_models(world: Path, schema: FeatureSchema, options: CompareOptions) -> Comparison:
    """Score the held-out rows with the world's model and each reduced copy of it."""
    import numpy as np

    model = world / MODEL_FILE
    if not model.is_file():
        raise ConfigError(f"{model} is missing: build the world (recsys build-world or build-demo)")
    holdout = load_holdout(world, schema)
    rows, labels = holdout.rows[: options.rows], holdout.labels[: options.rows]
    if len(np.unique(labels)) < 2:
        raise ConfigError(f"--rows {len(rows)}: the held-out rows hold one label only; use more")
    requests = requests_from(schema, rows, options.candidates)
    base, base_scores = _measure("fp32", model, rows, labels, requests, options)
    models = [base]
    with tempfile.TemporaryDirectory() as scratch:
        out = options.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        for precision in options.precisions:
            path = reduce_model(model, precision, out)
            report, scores = _measure(precision, path, rows, labels, requests, options)
            vs = agreement(labels, base_scores, scores, options.top)
            models.append(replace(report, against_fp32=vs))
    positives = int(labels.sum())
    return Comparison(
        str(world), holdout.source, len(rows), positives, len(requests), options, tuple(models)
    )


def _measure(
    precision: str,
    path: Path,
    rows: FloatArray,
    labels: npt.NDArray[np.int8],
    requests: list[FloatArray],
    options: CompareOptions,
) -> tuple[ModelReport, Scores]:
    # One thread, as the in-process fallback runs: comparable from host to host.
    scorer = onnx_scorer(path, threads=1)
    scores = Scores(_score(scorer, rows, options.candidates), [scorer.score(r) for r in requests])
    p50, p99 = _latency_ms(scorer, requests)
    kept = precision == "fp32" or options.out is not None
    size = path.stat().st_size
    report = ModelReport(
        precision, str(path) if kept else None, size, auc(labels, scores.rows), p50, p99
    )
    return report, scores


_ROWS = (
    ("AUC loss vs fp32", "auc_loss", 4),
    ("top-{top} overlap mean", "top_overlap_mean", 3),
    ("top-{top} overlap min", "top_overlap_min", 3),
    ("Kendall tau mean", "kendall_tau_mean", 4),
    ("Spearman mean", "spearman_mean", 4),
    ("max |score diff|", "max_abs_diff", 6),
    ("mean |score diff|", "mean_abs_diff", 6),
    ("candidates tied", "ties_added", 0),
    ("widest gap tied", "tied_gap_max", 6),
)


def render_text(report: Comparison) -> str:
    models, top = report.models, report.options.top
    lines = [
        f"world {report.world}: {report.rows:,} held-out rows ({report.positives:,} positive; "
        f"{report.holdout}); {report.requests} requests of {report.options.candidates} "
        "candidates; onnxruntime CPU, 1 thread, one request per batch",
        f"{'':<22}" + "".join(f"{model.precision:>12}" for model in models),
    ]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"{label:<22}" + "".join(f"{value:>12}" for value in values))

    row("file size (KiB)", [f"{m.size_bytes / 1024:.1f}" for m in models])
    row("AUC", [f"{m.auc:.4f}" for m in models])
    row("batch ms p50", [f"{m.batch_ms_p50:.3f}" for m in models])
    row("batch ms p99", [f"{m.batch_ms_p99:.3f}" for m in models])
    for label, field, digits in _ROWS:
        vs = [m.against_fp32 for m in models]
        row(
            label.format(top=top),
            ["-" if v is None else f"{getattr(v, field):.{digits}f}" for v in vs],
        )
    for m in models:
        if m.precision == "int8" and m.against_fp32 is not None:
            loss = m.against_fp32.auc_loss
            change = f"loses {loss:.4f}" if loss >= 0 else f"gains {-loss:.4f}"
            verdict = "within" if loss <= INT8_AUC_BUDGET else "beyond"
            lines.append(
                f"\nINT8 {change} AUC: {verdict} the ~{INT8_AUC_BUDGET} loss the serving article "
                "accepted for INT8 after an A/B."
            )
    lines.append(TENSORRT_NOTE)
    return "\n".join(lines)
