"""/debug against real Redis and Triton: a traced request as it happened, "why not item X"
for an item planted to leave at each stage, and who may look."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from pydantic import SecretStr

from app.main import create_app
from app.world.tables import load_items, load_seen, load_users
from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
USER = "u3"
WANTED = 10
STAGES = ["features", "recall", "filter", "prerank", "fetch", "pack", "rank", "rerank"]
TOKEN = "debug-token-0123456789"


def _rules(folder: Path, blocked: list[str]) -> Path:
    """At most two items a category, the blocked items: a rule for each way rerank and the
    filters can remove an item."""
    path = folder / "debug-rules.toml"
    listed = ", ".join(f'"{item}"' for item in blocked)
    path.write_text(f"[diversity]\nmax_per_category = 2\n\n[block]\nitem_ids = [{listed}]\n")
    return path


def _settings(stack: Stack, rules: Path, **more: Any) -> Any:
    # A small pool and a small pre-rank cut, so that an item can be lost at every stage.
    return stack.settings(
        debug_pages=True,
        trace_sample_percent=0.0,
        candidate_count=60,
        prerank_keep=40,
        rules_file=rules,
        **more,
    )


async def _answer(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/recommend", json={"user_id": USER, "num_items": WANTED, "context": CONTEXT, **body}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def debug(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    folder = tmp_path_factory.mktemp("debug")
    async with serving(_settings(stack, _rules(folder, []))) as plain:
        first = await _answer(plain)
    # The user's second-best item is blocked: recalled (it is near them), then filtered.
    blocked = first["items"][1]["item_id"]
    async with serving(_settings(stack, _rules(folder, [blocked]))) as client:
        yield client, blocked


async def _explain(client: httpx.AsyncClient, item: str) -> dict[str, Any]:
    response = await client.get(
        "/debug/explain",
        params={"user_id": USER, "item_id": item, "num_items": WANTED, **CONTEXT},
    )
    assert response.status_code == 200, response.text
    said: dict[str, Any] = response.json()
    return said


async def test_a_traced_request_shows_each_stage_and_what_it_did(debug: Any) -> None:
    client, blocked = debug
    answer = await _answer(client, debug=True)
    # Unsampled (0%), but asked for with debug: true.
    trace = (await client.get(f"/debug/traces/{answer['answer_id']}")).json()
    assert [span["stage"] for span in trace["spans"]] == STAGES
    starts = [span["start_ms"] for span in trace["spans"]]
    assert starts == sorted(starts)
    records = trace["records"]
    # Each stage that changes the candidates wrote its own record, in the order they ran.
    assert list(records) == ["recall", "filter", "prerank", "rank", "rerank"]
    sources = records["recall"]["tables"]["sources"]["rows"]
    sourced = [s["source"] for s in sources]
    assert sourced == ["viewed", "ann", "arrivals", "similar", "trending", "popular"]
    removed = {r["reason"]: r for r in records["filter"]["removed"]}
    assert set(removed) == {"blocked", "withdrawn", "seen", "excluded", "viewed"}
    assert removed["blocked"]["first"] == [blocked]
    assert records["prerank"]["facts"]["keep"] == 40
    assert records["prerank"]["went_out"] == 40
    scored = records["rank"]["tables"]["scored"]["rows"]
    assert 0 < len(scored) <= 50
    assert {"rank", "item_id", "score", "recall", "p_interact"} <= set(scored[0])
    served = [item["item_id"] for item in answer["items"]]
    answered = records["rerank"]["tables"]["answer"]["rows"]
    assert [item["item_id"] for item in answered] == served
    assert trace["model"]["version"] == answer["model"]["version"]
    assert trace["request"]["user_id"] == USER
    listed = (await client.get("/debug/traces")).json()
    assert answer["answer_id"] in [entry["request_id"] for entry in listed]
    # An unsampled request that does not ask is not traced; the header asks too.
    quiet = await _answer(client)
    assert (await client.get(f"/debug/traces/{quiet['answer_id']}")).status_code == 404
    asked = await client.post("/recommend", json={"user_id": USER}, headers={"X-Recsys-Trace": "1"})
    assert (await client.get(f"/debug/traces/{asked.json()['answer_id']}")).status_code == 200


async def test_why_not_names_the_stage_each_planted_item_left(debug: Any, stack: Stack) -> None:
    client, blocked = debug
    answer = await _answer(client, debug=True)
    trace = (await client.get(f"/debug/traces/{answer['answer_id']}")).json()
    verdicts: dict[str, dict[str, Any]] = {}

    async def ask(item: str) -> dict[str, Any]:
        said = await _explain(client, item)
        verdicts.setdefault(said["verdict"], said)
        return said

    served = await ask(answer["items"][0]["item_id"])
    assert served["verdict"] == "served"
    assert served["facts"]["served_rank"] == 1
    unknown = await ask("no-such-item")
    assert unknown["verdict"] == "unknown"
    filtered = await ask(blocked)
    assert (filtered["verdict"], filtered["facts"]["removed_by"]) == ("filtered", "blocked")
    # The item least like the user: no source brings it.
    items, users = load_items(stack.world), load_users(stack.world)
    user_vector = users.embeddings[users.ids.tolist().index(USER)]
    farthest = str(items.ids[int(np.argmin(items.embeddings @ user_vector))])
    far = await ask(farthest)
    assert far["verdict"] == "not_recalled"
    assert far["facts"]["similarity_rank"] > far["facts"]["ann_returned"]
    # Seen items that recall brings are removed as seen.
    seen = load_seen(stack.world)
    assert seen is not None
    at = seen.user_ids.tolist().index(USER)
    for item in seen.item_ids[seen.offsets[at] : seen.offsets[at + 1]].tolist()[:40]:
        if (await ask(item))["verdict"] == "filtered":
            break
    assert verdicts["filtered"]["stage"] == "filter"
    # The popular items recall adds: most are cut by pre-rank.
    records = trace["records"]
    sources = records["recall"]["tables"]["sources"]["rows"]
    for item in next(s for s in sources if s["source"] == "popular")["first"]:
        await ask(item)
    assert "keeps the best 40" in verdicts["not_preranked"]["because"]
    # Scored past the answer: outranked; in the model's top N but not served: rerank's cap.
    scored = [row["item_id"] for row in records["rank"]["tables"]["scored"]["rows"]]
    for item in scored[WANTED + 5 :]:
        await ask(item)
    assert verdicts["outranked"]["stage"] == "rank"
    changes = records["rerank"]["tables"]["changes"]["rows"]
    left_out = [c["item_id"] for c in changes if "category cap" in c["change"]]
    assert left_out, changes
    capped = await ask(left_out[0])
    assert capped["verdict"] == "reranked_out"
    assert "category cap" in capped["because"]


async def test_only_the_token_or_loopback_sees_the_pages(stack: Stack, tmp_path: Path) -> None:
    rules = _rules(tmp_path, [])
    admin = "admin-token-0123456789"
    app = create_app(
        _settings(stack, rules, debug_token=SecretStr(TOKEN), admin_token=SecretStr(admin))
    )
    basic = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        refused = await c.get("/debug/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert "Traceback" not in refused.text
        assert (
            await c.get("/debug/", headers={"authorization": f"Basic {basic}"})
        ).status_code == 200
        bearer = {"authorization": f"Bearer {TOKEN}"}
        assert (await c.get("/debug/traces", headers=bearer)).status_code == 200
        wrong = {"authorization": "Bearer not-the-token-at-all"}
        assert (await c.get("/debug/traces", headers=wrong)).status_code == 401
        # The admin token reloads releases; it does not read traces.
        assert (
            await c.get("/debug/traces", headers={"authorization": f"Bearer {admin}"})
        ).status_code == 401
        # The JSON routes take a bearer only: a browser's cached sign-in never reaches them,
        # so no page elsewhere can make an operator's browser run an explanation.
        signed_in = {"authorization": f"Basic {basic}"}
        assert (await c.get("/debug/traces", headers=signed_in)).status_code == 401
        explain = {"user_id": USER, "item_id": "i1"}
        assert (await c.get("/debug/explain", params=explain, headers=signed_in)).status_code == 401
        page = await c.get("/debug/", headers=signed_in)
        policy = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        assert "default-src 'none'" in policy
        assert "script-src" not in policy  # no script at all: default-src 'none' rules
        # Without the token, asking for a trace does not make one: the ring is the operators'.
        forced = await c.post(
            "/recommend", json={"user_id": USER, "debug": True}, headers={"X-Recsys-Trace": "1"}
        )
        assert forced.status_code == 200
        answer_id = forced.json()["answer_id"]
        assert (await c.get(f"/debug/traces/{answer_id}", headers=bearer)).status_code == 404
        with_token = await c.post(
            "/recommend", json={"user_id": USER}, headers={"X-Recsys-Trace": "1", **bearer}
        )
        traced = f"/debug/traces/{with_token.json()['answer_id']}"
        assert (await c.get(traced, headers=bearer)).status_code == 200
    # No token: loopback only.
    app = create_app(_settings(stack, rules))
    away = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=away, base_url="http://t") as c,
    ):
        assert (await c.get("/debug/traces")).status_code == 403
    # Off (the default): there is no /debug at all.
    async with serving(stack.settings()) as off:
        assert (await off.get("/debug/")).status_code == 404
