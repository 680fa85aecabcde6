"""The REST API reference, from the OpenAPI document the app itself serves (`/openapi.json`): every path and
method with its summary, description, roles, parameters, request body and answers (by schema name).

The app is built with `broker.app.create_app(Settings())` and never started: no lifespan, no database, no loop."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from docsgen.markdown import GENERATED_NOTE, anchor, cell, code, table

METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True)
class RouteDoc:
    method: str  # "POST"
    path: str
    operation_id: str
    tag: str
    summary: str
    description: str
    parameters: tuple[tuple[str, str, bool, str, str], ...]  # name, in, required, type, description
    request: str
    responses: tuple[tuple[str, str, str], ...]  # status, description, schema/media
    security: str


def build_app() -> Any:
    from broker.app import create_app
    from broker.config.settings import Settings

    return create_app(Settings())


def openapi_document(app: Any = None) -> dict[str, Any]:
    return (app or build_app()).openapi()


def served_routes(app: Any) -> Iterator[tuple[str, tuple[str, ...], str]]:
    """(path, methods, first line of the endpoint's docstring) of every route the app serves, included routers
    and mounts walked (FastAPI >= 0.165 wraps an included router; older ones copy its routes)."""

    def walk(routes: Any, prefix: str) -> Iterator[tuple[str, tuple[str, ...], str]]:
        for r in routes:
            if hasattr(r, "original_router"):
                yield from walk(r.original_router.routes, prefix + (getattr(r.include_context, "prefix", "") or ""))
            elif hasattr(r, "routes") and not hasattr(r, "methods"):
                yield from walk(r.routes, prefix + r.path)
            elif hasattr(r, "path"):
                endpoint = getattr(r, "endpoint", None)
                doc = (getattr(endpoint, "__doc__", None) or "").strip().split("\n\n")[0]
                methods = tuple(sorted(m for m in (getattr(r, "methods", None) or ()) if m != "HEAD"))
                yield prefix + r.path, methods, " ".join(doc.split())

    yield from walk(app.routes, "")


def schema_name(schema: dict[str, Any] | None) -> str:
    """`JobPublic`, `list[JobPublic]`, `string`, `A | null`... for a (possibly $ref) schema."""
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(schema_name(s) for s in schema[key])
    kind = schema.get("type", "")
    if kind == "array":
        return f"list[{schema_name(schema.get('items'))}]"
    if "enum" in schema:
        return " | ".join(repr(e) for e in schema["enum"])
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind or schema.get("title", "object"))


def _content(content: dict[str, Any] | None) -> str:
    if not content:
        return ""
    parts = []
    for media, body in content.items():
        name = schema_name(body.get("schema"))
        parts.append(f"{name} ({media})" if name else media)
    return "; ".join(parts)


def route_docs(document: dict[str, Any] | None = None) -> Iterator[RouteDoc]:
    doc = document or openapi_document()
    for path, ops in doc["paths"].items():
        for method in METHODS:
            op = ops.get(method)
            if op is None:
                continue
            params = tuple(
                (
                    p["name"],
                    p["in"],
                    bool(p.get("required")),
                    schema_name(p.get("schema")),
                    " ".join((p.get("description") or "").split()),
                )
                for p in [*ops.get("parameters", []), *op.get("parameters", [])]
            )
            body = op.get("requestBody") or {}
            responses = tuple(
                (str(status), " ".join((r.get("description") or "").split()), _content(r.get("content")))
                for status, r in op.get("responses", {}).items()
            )
            security = ", ".join(name for req in op.get("security", []) for name in req) or "none"
            yield RouteDoc(
                method=method.upper(),
                path=path,
                operation_id=op.get("operationId", ""),
                tag=(op.get("tags") or ["other"])[0],
                summary=op.get("summary", ""),
                description=(op.get("description") or "").strip(),
                parameters=params,
                request=_content(body.get("content")),
                responses=responses,
                security=security,
            )


def api_markdown(app: Any = None) -> str:
    app = app or build_app()
    doc = openapi_document(app)
    routes = list(route_docs(doc))
    info = doc.get("info", {})
    out = [
        "# REST API\n",
        GENERATED_NOTE.format(source="the app's OpenAPI document, `broker.app.create_app(...).openapi()`"),
        f"{info.get('summary', '')} OpenAPI {doc.get('openapi', '')}, API version {info.get('version', '')}. "
        "A running broker serves the same document at `/openapi.json` and Swagger UI at `/docs`. How to "
        "authenticate, page through lists and read errors: [Calling the API](../guides/calling-the-api.md).\n",
        "| method | path | operation | summary |\n|---|---|---|---|",
    ]
    for r in routes:
        heading = f"{r.method} {r.path}"
        out.append(
            f"| {r.method} | [{code(r.path)}](#{anchor(heading)}) | {code(r.operation_id)} | {cell(r.summary)} |"
        )
    out.append("")
    tags: dict[str, list[RouteDoc]] = {}
    for r in routes:
        tags.setdefault(r.tag, []).append(r)
    for tag, items in tags.items():
        out.append(f"## {tag}\n")
        for r in items:
            out.append(f"### {r.method} {r.path}\n")
            out.append(f"**{r.summary}** · operation `{r.operation_id}` · auth: {r.security}\n")
            if r.description:
                out.append(r.description + "\n")
            if r.parameters:
                rows = [
                    (code(n), where, "yes" if req else "", code(t) if t else "", cell(d))
                    for n, where, req, t, d in r.parameters
                ]
                out.append(table(("parameter", "in", "required", "type", "description"), rows))
            if r.request:
                out.append(f"Request body: {cell(r.request)}\n")
            rows = [(code(s), cell(d), cell(c)) for s, d, c in r.responses]
            out.append(table(("status", "meaning", "body"), rows))
    hidden = [(p, m, d) for p, m, d in served_routes(app) if p not in doc["paths"]]
    if hidden:
        out.append("## Routes outside the OpenAPI document\n")
        out.append("Served by the broker for people and browsers, not part of the API contract:\n")
        out.append(table(("path", "methods", "what"), [(code(p), ", ".join(m), cell(d)) for p, m, d in hidden]))
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out.append("## Schemas\n")
        out.append(
            "Every schema named above, with its fields. The job spec is described field by field in "
            "[Job spec](job-spec.md).\n"
        )
        for name, schema in sorted(schemas.items()):
            out.append(f"### {name}\n")
            if schema.get("description"):
                out.append(" ".join(schema["description"].split()) + "\n")
            props = schema.get("properties") or {}
            required = set(schema.get("required") or [])
            if props:
                rows = [
                    (code(p), code(schema_name(s)), "yes" if p in required else "", cell(s.get("description", "")))
                    for p, s in props.items()
                ]
                out.append(table(("field", "type", "required", "description"), rows))
            elif "enum" in schema:
                out.append("One of: " + ", ".join(code(e) for e in schema["enum"]) + "\n")
    return "\n".join(out)
