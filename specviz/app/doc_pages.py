"""The docs pages the app links to (docs/faults.md, docs/probe.md), served under a fixed route.

They were served as Gradio static files, `/gradio_api/file=<absolute path>`: every answer that named
a fault told any visitor where the app is installed (issue 43, attack 8). Now a link is
`/specviz/docs/<name>.md`; the route serves only the pages named here, read once, as plain text
that no browser runs (`nosniff`, a CSP that loads nothing).
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from specviz.app.loading import DOCS
from specviz.views.faults import DOCS_URL_PREFIX

PAGES = ("faults.md", "probe.md")
HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'"}


@functools.lru_cache(maxsize=len(PAGES))
def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


async def _serve(request: Request) -> Response:
    name = request.path_params.get("name", "")
    if name not in PAGES:  # only the pages the app links to: nothing else of the checkout
        return PlainTextResponse("no such page", status_code=404, headers=HEADERS)
    try:
        text = _page(name)
    except OSError:  # a checkout without its docs: say so, name no path
        return PlainTextResponse("this page is not installed", status_code=404, headers=HEADERS)
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8", headers=HEADERS)


def doc_routes() -> list[Route]:
    """The route for FastAPI's `routes` (Gradio passes `launch(app_kwargs=...)` to it)."""
    return [Route(DOCS_URL_PREFIX + "{name}", _serve, methods=["GET"])]
