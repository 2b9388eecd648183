"""``gateway/openapi.yaml``: a valid OpenAPI 3 document that lists exactly the app's routes."""

from __future__ import annotations

import pathlib

import yaml
from openapi_spec_validator import validate

from gateway.http import create_app, load_openapi

ROOT = pathlib.Path(__file__).resolve().parents[2]
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def documented(document: dict) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in METHODS
    }


def registered() -> set[tuple[str, str]]:
    app = create_app(None, 1024)  # type: ignore[arg-type]  # routes only, never served
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"  # aiohttp adds HEAD to every GET
    }


def test_document_is_valid_openapi():
    document = load_openapi()
    validate(document)
    assert document["openapi"].startswith("3.")


def test_docs_copy_is_the_package_file():
    docs = ROOT / "docs" / "openapi.yaml"
    assert docs.resolve() == (ROOT / "gateway" / "openapi.yaml").resolve()
    assert yaml.safe_load(docs.read_text()) == load_openapi()


def test_every_route_is_documented_and_nothing_else():
    routes, listed = registered(), documented(load_openapi())
    assert routes - listed == set(), "routes the document lacks"
    assert listed - routes == set(), "documented routes the app does not serve"


def test_operation_ids_are_unique():
    ids = [
        op["operationId"]
        for item in load_openapi()["paths"].values()
        for method, op in item.items()
        if method in METHODS
    ]
    assert len(ids) == len(set(ids))
