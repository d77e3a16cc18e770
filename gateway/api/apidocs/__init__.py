"""``/docs``: Swagger UI for the API of the port it is served on, from vendored assets."""

from gateway.api.apidocs.routes import SWAGGER_UI_VERSION, docs_router, index_router

__all__ = ["SWAGGER_UI_VERSION", "docs_router", "index_router"]
