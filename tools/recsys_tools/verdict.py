"""`recsys release judge`: is the candidate no worse than the stable by what users did?

Reads the archive (recsys-archive's Parquet): every logged answer names its world and its
variant, and every click, like or purchase that names an answer (its `answer_id`) is that
answer's outcome. Each arm's rate is the share of its answers with at least one such event;
the two are compared with a 95% interval on their difference (Newcombe's, from each arm's
Wilson interval: sound for small counts and rates near 0). The verdict:

- wait: an arm has fewer answers than --min-answers (fixed before looking: stopping at the
  first good-looking moment is how a worse candidate gets promoted), or the interval is too
  wide to say either way;
- roll back: the candidate is worse, the whole interval below 0; or --max-answers were seen
  and it still cannot be shown to be no worse;
- promote: the candidate is no worse than the stable by more than --margin (relative), the
  whole interval above -margin x the stable's rate.

With --act (worlds only) the verdict is carried out on the running service: promote or roll
back the candidate world through /admin/worlds (--url; the token from RECSYS_ADMIN_TOKEN or
--token-file); a wait changes nothing. A timer running it is the loop acting by itself.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import pyarrow.compute as pc

from app.archive.rows import Kind, day_of
from app.archive.store import ArchiveStore
from app.core.errors import ConfigError
from recsys_tools.commands import Commands
from recsys_tools.outcomes import TYPES, Rate
from recsys_tools.worlds_admin import add_world_verb
from recsys_tools.worlds_client import call, token_of

Z95 = 1.959964


class Verdict(StrEnum):
    PROMOTE = "promote"
    ROLL_BACK = "roll back"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    why: str
    stable_rate: float
    candidate_rate: float
    difference: float
    interval: tuple[float, float]


def difference_interval(stable: Rate, candidate: Rate) -> tuple[float, float]:
    """95% interval of candidate - stable (Newcombe's hybrid score interval)."""
    p1, p2 = stable.value, candidate.value
    l1, u1 = stable.interval()
    l2, u2 = candidate.interval()
    d = p2 - p1
    return (
        d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2),
        d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2),
    )


def judge(
    stable: Rate, candidate: Rate, min_answers: int, max_answers: int, margin: float
) -> Judgement:
    low, high = difference_interval(stable, candidate)

    def said(verdict: Verdict, why: str) -> Judgement:
        difference = candidate.value - stable.value
        return Judgement(verdict, why, stable.value, candidate.value, difference, (low, high))

    fewest = min(stable.trials, candidate.trials)
    if fewest < min_answers:
        return said(
            Verdict.WAIT,
            f"{fewest:.0f} answers on the smaller arm, {min_answers} wanted before judging",
        )
    if high < 0.0:
        why = "the candidate is worse: the whole 95% interval of the difference is below 0"
        return said(Verdict.ROLL_BACK, why)
    if low > -margin * stable.value:
        why = f"the candidate is no worse than the stable by more than {margin:.0%} (95%)"
        return said(Verdict.PROMOTE, why)
    if fewest >= max_answers:
        return said(
            Verdict.ROLL_BACK, f"{max_answers} answers an arm and still not shown to be no worse"
        )
    return said(
        Verdict.WAIT, "not yet known: the interval holds both a loss past the margin and no loss"
    )


def arm_rates(store: ArchiveStore, by: str, first: str, last: str) -> dict[str, dict[str, Rate]]:
    """Each arm's (world or variant) answers and the share of them with a click, a like, a
    purchase naming them."""
    answers = store.read(Kind.ANSWERS, first, last).select(["answer_id", by])
    events = store.read(Kind.EVENTS, first, last).select(["answer_id", "type"])
    events = events.filter(pc.is_valid(events.column("answer_id")))
    arm_of = dict(
        zip(answers.column("answer_id").to_pylist(), answers.column(by).to_pylist(), strict=True)
    )
    shown = Counter(arm_of.values())
    chosen: dict[str, set[str]] = {kind: set() for kind in TYPES}
    for answer_id, kind in zip(
        events.column("answer_id").to_pylist(), events.column("type").to_pylist(), strict=True
    ):
        if kind in chosen and answer_id in arm_of:
            chosen[kind].add(answer_id)
    rates: dict[str, dict[str, Rate]] = {}
    for arm, count in shown.items():
        rates[arm] = {
            kind: Rate(float(sum(1 for a in chosen[kind] if arm_of[a] == arm)), float(count))
            for kind in TYPES
        }
    return rates


def first_day_of(store: ArchiveStore, world_id: str) -> str:
    """The first day the archive holds an answer of this world; empty for none."""
    answers = store.read(Kind.ANSWERS).select(["world_id", "ts_ms"])
    mine = answers.filter(pc.equal(answers.column("world_id"), world_id))
    if not mine.num_rows:
        return ""
    return day_of(int(pc.min(mine.column("ts_ms")).as_py()))


def _arms(
    rates: dict[str, dict[str, Rate]], stable: str | None, candidate: str | None
) -> tuple[str, str]:
    by_answers = sorted(rates, key=lambda arm: -rates[arm][TYPES[0]].trials)
    stable = stable or (by_answers[0] if by_answers else None)
    candidate = candidate or next((arm for arm in by_answers if arm != stable), None)
    if stable is None or candidate is None or stable not in rates or candidate not in rates:
        found = ", ".join(f"{arm} ({rates[arm][TYPES[0]].trials:.0f})" for arm in by_answers)
        raise ConfigError(
            f"the archive's answers do not hold two arms to compare (found: {found or 'none'}); "
            "name them with --stable and --candidate"
        )
    return stable, candidate


def _run(args: argparse.Namespace) -> None:
    if args.act and args.by != "world_id":
        raise ConfigError("--act carries out a verdict on worlds: use it with --by world_id")
    if args.act:
        # The arms are the worlds the service serves now, whatever else the archive holds.
        served = call(args.url, token_of(args), "show")
        if not served["candidate"]:
            print(f"no candidate world is served beside {served['stable']}: nothing to judge")
            return
        args.stable, args.candidate = served["stable"], served["candidate"]
    store = ArchiveStore(args.archive)
    if args.act and not args.since:
        # Both arms over the same days: from the candidate's first answer on.
        args.since = first_day_of(store, args.candidate) or args.since
    rates = arm_rates(store, args.by, args.since, args.until)
    stable, candidate = _arms(rates, args.stable, args.candidate)
    judgement = judge(
        rates[stable][args.outcome],
        rates[candidate][args.outcome],
        args.min_answers,
        args.max_answers,
        args.margin,
    )
    report: dict[str, Any] = {
        "by": args.by,
        "stable": stable,
        "candidate": candidate,
        "outcome": args.outcome,
        "answers": {arm: rates[arm][args.outcome].trials for arm in (stable, candidate)},
        "rates": {
            arm: {kind: rates[arm][kind].value for kind in TYPES} for arm in (stable, candidate)
        },
        **asdict(judgement),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(rates, stable, candidate, args.outcome, judgement)
    if args.act:
        print(acted(judgement.verdict, lambda verb: call(args.url, token_of(args), verb)))


def _print_report(
    rates: dict[str, dict[str, Rate]],
    stable: str,
    candidate: str,
    outcome: str,
    judgement: Judgement,
) -> None:
    for arm, name in ((stable, "stable"), (candidate, "candidate")):
        rate = rates[arm][outcome]
        low, high = rate.interval()
        print(
            f"{name:<10} {arm:<24} {rate.trials:>9.0f} answers  {outcome} rate "
            f"{rate.value:.4f} ({low:.4f}-{high:.4f})"
        )
    low, high = judgement.interval
    print(f"difference {judgement.difference:+.4f} (95%: {low:+.4f} to {high:+.4f})")
    print(f"verdict: {judgement.verdict.value}: {judgement.why}")


def acted(verdict: Verdict, admin: Callable[[str], dict[str, Any]]) -> str:
    """The verdict carried out through /admin/worlds (`admin` makes the call); a sentence."""
    if verdict is Verdict.PROMOTE:
        return f"acted: promoted, world {admin('promote')['stable']} answers every user"
    if verdict is Verdict.ROLL_BACK:
        return f"acted: rolled back, world {admin('rollback')['stable']} answers every user"
    return "acted: nothing, the candidate keeps its share until the judge can tell"


def register(commands: Commands) -> None:
    release = commands.add_parser(
        "release", help="judge a release by what users did; load, promote, roll back worlds"
    )
    verbs = release.add_subparsers(dest="verb", required=True)
    add_world_verb(verbs)
    judging = verbs.add_parser(
        "judge",
        help="promote, roll back or wait: the candidate's outcome rate against the stable's",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    judging.add_argument("--archive", required=True, help="the archive's path or URI")
    judging.add_argument(
        "--by",
        choices=("world_id", "variant"),
        default="world_id",
        help="what the arms are: worlds side by side, or model versions (stable, canary)",
    )
    judging.add_argument("--stable", help="the stable arm (default: the one with most answers)")
    judging.add_argument("--candidate", help="the candidate arm (default: the other one)")
    judging.add_argument("--since", default="", help="first day, YYYY-MM-DD (default: all)")
    judging.add_argument("--until", default="9999", help="last day, YYYY-MM-DD (default: all)")
    judging.add_argument("--outcome", choices=TYPES, default="click")
    judging.add_argument("--min-answers", type=int, default=1000)
    judging.add_argument("--max-answers", type=int, default=100_000)
    judging.add_argument("--margin", type=float, default=0.05, help="relative, 0.05: 5%%")
    judging.add_argument("--json", action="store_true", help="the report as JSON")
    judging.add_argument(
        "--act",
        action="store_true",
        help="carry the verdict out on the service: promote or roll back the candidate world",
    )
    judging.add_argument("--url", default="http://127.0.0.1:8080", help="with --act: the service")
    judging.add_argument("--token-file", help="with --act: a file holding RECSYS_ADMIN_TOKEN")
    judging.set_defaults(run=_run)
