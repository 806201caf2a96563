"""The API's interactive docs (`/docs`, Swagger UI; `/redoc`, ReDoc) with their assets served
by the gateway itself, so they render where the network stops at the cluster (air-gapped GPU
hosts): FastAPI's own pages load them from a CDN. The assets ship in the `fastapi-offline`
package (`fastapi_offline/static`); only its files are used, ReDoc's with the one remote
image it names (a badge's logo) pointed at the local favicon."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

ASSETS = "/docs/assets"
TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
router = APIRouter(include_in_schema=False)


def _assets() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def _served() -> dict[str, Path]:
    """The asset files by name: nothing but what the package ships."""
    return {p.name: p for p in _assets().iterdir() if p.suffix in TYPES}


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="draftgate - API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
    )


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="draftgate - API",
        redoc_js_url=f"{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


@cache
def _redoc_js() -> bytes:
    """ReDoc's bundle with its one remote asset (the Redocly badge's logo) pointed here."""
    text = (_assets() / "redoc.standalone.js").read_bytes()
    return text.replace(REDOC_LOGO, f"{ASSETS}/favicon.png".encode())


@router.get(f"{ASSETS}/{{name}}")
async def asset(name: str) -> Response:
    path = _served().get(name)
    if path is None:
        raise HTTPException(404, "no such asset")
    headers = {"Cache-Control": "public, max-age=86400"}
    if name == "redoc.standalone.js":
        return Response(_redoc_js(), media_type=TYPES[".js"], headers=headers)
    return FileResponse(path, media_type=TYPES[path.suffix], headers=headers)
