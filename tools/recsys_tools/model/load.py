"""`recsys model load`: have a running Triton load the versions in its repository now.

For a Triton in explicit model-control mode: after `recsys install-model --version N` has put
a version into the repository, Triton loads what the model's version policy keeps (the two
newest, in the shipped configs) while the loaded ones go on serving, and the command waits
until the version asked for is ready. Then name it in the release file and reload the API.
A Triton with model control off (`--model-control-mode=none`) refuses: restart it instead.
With `--grpc-restricted-protocol=model-repository:HEADER=SECRET`, `--admin-key-env` names the
environment variable holding SECRET (never a command-line argument, which `ps` shows).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from app.core.errors import ConfigError, UnreachableError
from app.world.schema import load_schema
from recsys_tools.commands import Commands

ADMIN_HEADER = "triton-grpc-protocol-admin-key"
# How Triton refuses a load or unload when it runs without explicit model control.
NO_MODEL_CONTROL = "explicit model load / unload is not allowed"


def without_model_control(exc: InferenceServerException) -> bool:
    return NO_MODEL_CONTROL in str(exc.message()).lower()


POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Loaded:
    model: str
    ready: tuple[str, ...]  # the versions ready once the load is done, lowest first


def _headers(admin_key_env: str | None) -> dict[str, str] | None:
    if admin_key_env is None:
        return None
    key = os.environ.get(admin_key_env)
    if not key:
        raise ConfigError(f"--admin-key-env {admin_key_env}: that variable is not set")
    return {ADMIN_HEADER: key}


def _ready_versions(client: triton_grpc.InferenceServerClient, model: str) -> tuple[str, ...]:
    metadata = client.get_model_metadata(model, as_json=True)
    return tuple(sorted((str(v) for v in metadata.get("versions", [])), key=int))


def load_versions(
    url: str,
    model: str,
    version: str = "",
    admin_key_env: str | None = None,
    timeout_s: float = 120,
) -> Loaded:
    """Load `model` again from the repository; wait for `version` ("": any) to be ready."""
    headers = _headers(admin_key_env)
    client = triton_grpc.InferenceServerClient(url)
    try:
        try:
            client.load_model(model, headers=headers, client_timeout=timeout_s)
        except InferenceServerException as exc:
            if without_model_control(exc):
                raise ConfigError(
                    f"Triton at {url} runs without model control: restart it to load new "
                    "versions, or run it with --model-control-mode=explicit (deploy/triton)"
                ) from None
            raise UnreachableError(
                f"Triton at {url} did not load {model}: {exc.message()}"
            ) from None
        give_up = time.monotonic() + timeout_s
        while not client.is_model_ready(model, version, headers=headers):
            if time.monotonic() > give_up:
                raise UnreachableError(
                    f"{model} version {version or '(latest)'} was not ready in {timeout_s:.0f} s"
                )
            time.sleep(POLL_S)
        return Loaded(model, _ready_versions(client, model))
    finally:
        client.close()


def _load(args: argparse.Namespace) -> None:
    loaded = load_versions(args.url, args.model, args.version, args.admin_key_env, args.timeout)
    print(f"{loaded.model}: versions ready {', '.join(loaded.ready)}")


def register(model_commands: Commands) -> None:
    """`model load` and its options, run through `args.run` like every other command."""
    parser = model_commands.add_parser(
        "load",
        help="have a Triton in explicit model-control mode load new versions now",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    model = load_schema().model_name
    add("--url", default="127.0.0.1:8001", help="Triton's gRPC address (default 127.0.0.1:8001)")
    add("--model", default=model, help=f"default: the feature schema's, {model}")
    add("--version", default="", help="wait for this version to be ready (default: any)")
    add("--admin-key-env", default=None, help="the variable holding the repository admin key")
    add("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    parser.set_defaults(run=_load)
