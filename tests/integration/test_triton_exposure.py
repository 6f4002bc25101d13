"""Triton as the deployment runs it: the protocols the service does not need are closed.

The shipped unit restricts, behind a key only the operator holds, the gRPC protocols that
change or reveal more than scores: the model repository (loading and unloading models),
shared-memory registration, statistics, tracing and logging. The service needs health,
metadata, the model config and inference only: it serves, and with shared memory on `auto`
it falls back to plain gRPC.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc
from recsys_tools.localstack import default_triton_env, start_triton
from recsys_tools.model.load import ADMIN_HEADER
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ROOT = Path(__file__).resolve().parents[2]
KEY = "a-key-only-the-operator-holds"


def restricted_protocols() -> str:
    """The protocols the shipped quadlet restricts, read from its Exec= line."""
    unit = (ROOT / "deploy" / "quadlet" / "recsys-triton.container").read_text()
    (flag,) = [w for w in unit.split() if w.startswith("--grpc-restricted-protocol=")]
    return flag.removeprefix("--grpc-restricted-protocol=").split(":", 1)[0]


def _refused(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except InferenceServerException:
        return True
    return False


async def test_triton_refuses_what_the_service_does_not_need(stack: Stack, tmp_path: Path) -> None:
    protocols = restricted_protocols()
    assert set(protocols.split(",")) == {
        "model-repository",
        "shared-memory",
        "statistics",
        "trace",
        "logging",
    }
    process, url = start_triton(
        default_triton_env(),
        stack.model_repository,
        tmp_path / "triton",
        [stack.schema.model_name],
        extra=[f"--grpc-restricted-protocol={protocols}:admin-key={KEY}"],
    )
    try:
        async with serving(stack.settings(triton_url=url, triton_shared_memory="auto")) as api:
            answer = await api.post(
                "/recommend", json={"user_id": "u5", "num_items": 5, "context": CONTEXT}
            )
            ready = await api.get("/readyz")
        client = triton_grpc.InferenceServerClient(url)
        model = stack.schema.model_name
        keyed = {ADMIN_HEADER: KEY}  # what recsys model load sends
        try:
            assert _refused(lambda: client.unload_model(model))
            assert _refused(lambda: client.get_inference_statistics(model))
            assert _refused(lambda: client.register_system_shared_memory("r", "/r", 64))
            assert _refused(lambda: client.get_log_settings())
            # The operator, with the key, still can.
            assert client.get_inference_statistics(model, headers=keyed)
        finally:
            client.close()
    finally:
        process.stop()
    assert answer.json()["degraded"] == []
    assert answer.json()["model"]["variant"] == "stable"
    assert ready.json()["failing"] == []
