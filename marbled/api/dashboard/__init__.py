"""The web dashboard: a read-only page the broker serves at /dashboard/ (docs/dashboard.md).

Three static files shipped in the package (index.html, app.js, style.css): no build step,
no library, nothing fetched from another site (compute nodes have no internet). The page
reads the same JSON API as `marble` (GET /v1/status, /v1/jobs, /v1/runs, /v1/jobs/{id}, and
/v1/forecast where the broker has it), polling it every 1.5 s.

Auth: the files hold no data, so they are served without the token -- a browser cannot send
a header when it navigates. The page takes the token from its URL fragment
(`/dashboard/#token=...`; a fragment is never sent to the server, so never logged) and sends
it as `Authorization: Bearer` on its own requests to /v1, which stay behind the token.
`is_public` names these routes to the access middleware (api/server.py) by the route the
router matched, not by a prefix of the path.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

HERE = Path(__file__).parent
FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
ROUTES = ("dashboard-redirect", "dashboard-index", "dashboard-file")
HEADERS = {
    # the page runs only its own script and talks only to the broker it came from
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # a new marbled's page, not the browser's old copy
}


def is_public(request: web.Request) -> bool:
    """Whether the request is for one of the dashboard's static files (no token needed)."""
    return request.match_info.route.name in ROUTES


def _file(name: str) -> web.Response:
    if name not in FILES:
        raise web.HTTPNotFound(reason=f"the dashboard has no file '{name}'; "
                                      f"it has {', '.join(sorted(FILES))}")
    return web.Response(body=(HERE / name).read_bytes(), content_type=FILES[name],
                        charset="utf-8", headers=HEADERS)


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPMovedPermanently("/dashboard/")  # the browser keeps the #token fragment


async def index(request: web.Request) -> web.Response:
    return _file("index.html")


async def static_file(request: web.Request) -> web.Response:
    return _file(request.match_info["file"])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/dashboard", redirect, name="dashboard-redirect")
    router.add_get("/dashboard/", index, name="dashboard-index")
    router.add_get("/dashboard/{file}", static_file, name="dashboard-file")
