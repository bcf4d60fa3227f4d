"""Ray Serve LLM's OpenAI ingress with checks in front: API key, adapter names, images.

Ray Serve LLM (`ray.serve.llm.build_openai_app`) routes `model="<base>:<name>"` to the adapter
stored under `<dynamic_lora_loading_path>/<name>/`, and by its source uses `<name>` unchecked in
storage paths and in a shell command that clears its cache folder. It also fetches remote image
URLs and resizes images of any size. `GuardedIngress` is the same ingress (its routes, routing and
adapter loading) with these checks first, before any storage access or engine work:

- a request without the API key (when one is configured) gets 401;
- an adapter name outside `[A-Za-z0-9._-]`, longer than 128, or holding `..` gets 400; an unknown
  base model 404 (Ray's own check), an adapter whose folder has no `adapter_config.json` 404 (Ray's);
- an image that is not a base64 `data:` URL (unless `allow_remote_images`), bad base64, bytes that
  are not an image, more than `max_image_pixels` pixels or `max_images` per request get 400/413.

Malformed JSON and missing fields are refused with 4xx by FastAPI's request validation, as before.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
from typing import Any, Optional

from fastapi import HTTPException, Request, status
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress

from rlfw.serve.adapters import safe_adapter_name


def check_model_name(model: Optional[str]) -> None:
    """400 unless `model` is `<base>` or `<base>:<adapter name>` with a safe adapter name."""
    if model is None or ":" not in model:
        return
    name = model.split(":", 1)[1]
    if not safe_adapter_name(name):
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"adapter name {name!r}: use 1-128 characters of [A-Za-z0-9._-], not starting "
                            "with '.' and without '..'")


def _get(obj: Any, key: str, default=None):
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def check_images(messages, max_pixels: int, max_bytes: int, max_images: int, allow_remote: bool) -> None:
    """400/413 for an image part the policy must not be sent (see the module docstring)."""
    from PIL import Image, UnidentifiedImageError

    count = 0
    for message in messages or []:
        content = _get(message, "content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = _get(part, "type")
            if kind in ("text", None):
                continue
            if kind != "image_url":
                raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                    f"content part type {kind!r}: this server takes text and image_url parts")
            count += 1
            if count > max_images:
                raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                    f"more than {max_images} images in one request")
            url = _get(part, "image_url")
            url = url if isinstance(url, str) else _get(url, "url", "")
            if not str(url).startswith("data:"):
                if allow_remote:
                    continue
                raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                    "image_url must be a base64 data: URL (data:image/png;base64,...); this server "
                                    "does not fetch remote images")
            header, _, data = str(url).partition(",")
            if not header.endswith(";base64") or not data:
                raise HTTPException(status.HTTP_400_BAD_REQUEST, "image data URL: expected data:<type>;base64,<data>")
            if len(data) * 3 // 4 > max_bytes:
                raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                    f"image of about {len(data) * 3 // 4} bytes: the limit is {max_bytes}")
            try:
                raw = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise HTTPException(status.HTTP_400_BAD_REQUEST, "image data URL: invalid base64") from None
            try:
                with Image.open(io.BytesIO(raw)) as im:
                    w, h = im.size
            except (UnidentifiedImageError, OSError, ValueError):
                raise HTTPException(status.HTTP_400_BAD_REQUEST, "image data URL: the bytes are not an image") from None
            if w * h > max_pixels:
                raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                    f"a {w}x{h} image: the limit is {max_pixels} pixels")


class GuardedIngress(OpenAiIngress):
    """`OpenAiIngress` with the checks of the module docstring (bound by `rlfw.serve.app`)."""

    def __init__(self, llm_deployments, model_cards, *, lora_paths=None, api_key: Optional[str] = None,
                 max_image_pixels: int = 1 << 20, max_image_bytes: int = 4 << 20, max_images: int = 8,
                 allow_remote_images: bool = False, **kwargs):
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths, **kwargs)
        self._api_key = api_key
        self._limits = dict(max_pixels=max_image_pixels, max_bytes=max_image_bytes, max_images=max_images,
                            allow_remote=allow_remote_images)

    def _check_key(self, request: Optional[Request]) -> None:
        if not self._api_key:
            return
        given = (request.headers.get("authorization", "") if request is not None else "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.strip().encode(), self._api_key.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer <key>)")

    async def _get_response(self, *, body, call_method: str, raw_request: Optional[Request] = None):
        self._check_key(raw_request)
        check_model_name(_get(body, "model"))
        check_images(_get(body, "messages"), **self._limits)
        async for chunk in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
            yield chunk

    async def models(self, request: Request):
        self._check_key(request)
        return await super().models()

    async def model_data(self, model: str, request: Request):
        self._check_key(request)
        check_model_name(model)
        return await super().model_data(model)
