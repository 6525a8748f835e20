"""JSON in and out for the routes that are not inference."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.server.tensors import TensorError, json_object


def json_response(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


async def json_body(request: Request, what: str) -> dict[str, Any]:
    """The body as a JSON object; an empty body is {}."""
    body = await request.body()
    return json_object(body, what) if body.strip() else {}


def parameters(body: dict[str, Any], what: str) -> dict[str, Any]:
    value = body.get("parameters") or {}
    if not isinstance(value, dict):
        raise TensorError(f"{what} 'parameters' must be an object")
    return value
