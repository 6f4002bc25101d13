"""One JSON error shape for every status, and the handlers that map exceptions into it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.api.models import ErrorBody, ErrorField
from app.api.precheck import shown

log = logging.getLogger(__name__)

MAX_FIELDS = 20
MAX_MESSAGE_CHARS = 500


def documented(description: str, **extra: Any) -> dict[str, Any]:
    """An error status as a route's OpenAPI `responses` lists it, with the one error body."""
    return {"model": ErrorBody, "description": description, **extra}


# The statuses the gate answers for every gated route, before the route runs.
GATE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: documented("The body is not valid JSON."),
    408: documented("The body did not arrive whole within RECSYS_BODY_TIMEOUT_MS."),
    413: documented("The body is larger than RECSYS_MAX_BODY_BYTES."),
    415: documented("The body is not sent as application/json."),
}


def error_body(
    code: str, message: str, request_id: str, fields: Sequence[ErrorField] = ()
) -> ErrorBody:
    """The error, with its field list and message cut so a bad request cannot make it huge."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return ErrorBody(
        error=code, message=message, fields=list(fields[:MAX_FIELDS]), request_id=request_id
    )


def request_id_of(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", ""))


def _field_name(location: Sequence[Any]) -> str:
    parts = [str(part) for part in location]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return shown(".".join(parts)) or "body"


def summary(fields: Sequence[ErrorField], total: int) -> str:
    """The first few fields and their problems, and how many more there are."""
    text = "; ".join(f"{f.field}: {f.message}" for f in fields[:3])
    return text + (f" (and {total - 3} more)" if total > 3 else "")


def _response(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    request_id = request_id_of(request)
    unparseable = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if unparseable is not None:
        reason = unparseable.get("ctx", {}).get("error", "not JSON")
        at = _field_name(unparseable.get("loc", ()))
        message = f"the body is not valid JSON ({reason} at character {at})"
        fields = [ErrorField(field="body", message=message)]
        return _response(400, error_body("invalid_json", message, request_id, fields))
    fields = [
        ErrorField(field=_field_name(error.get("loc", ())), message=str(error["msg"]))
        for error in errors[:MAX_FIELDS]
    ]
    message = summary(fields, len(errors))
    return _response(422, error_body("invalid_request", message, request_id, fields))


_HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    body = error_body(code, str(exc.detail), request_id_of(request))
    return _response(exc.status_code, body, dict(exc.headers or {}))


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    request_id = request_id_of(request)
    log.error("unhandled error on %s [request %s]", request.url.path, request_id, exc_info=exc)
    # Sent by Starlette's outermost middleware, past the gate that tags every other answer:
    # the id goes on here, so the caller can quote it as the log line does.
    headers = {"x-request-id": request_id} if request_id else None
    body = error_body("internal_error", "the request failed", request_id)
    return _response(500, body, headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
