"""`prism serve`: a HostManager behind the Open Inference Protocol (KServe v2) REST API, as
Triton serves it, with `/metrics`. `create_app` builds the ASGI app from route modules."""
