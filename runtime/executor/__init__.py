"""The executor: one request run over one replica of a plan (after Glow's Executor).

`executor` starts each partition as its inputs exist, on its device, and ends the request
once; `requests` is a request's record and the priority queue it waits in; `futures` the
futures `host.run` returns; `checks` what a device's outputs must be before anything
reads them.
"""
