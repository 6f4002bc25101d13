"""The HTTP layer: routes, request and response bodies, middleware and error mapping."""
