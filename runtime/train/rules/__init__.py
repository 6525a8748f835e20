"""One module per op's gradient rule (or training rewrite), each registering itself with
`runtime.train.registry` on import; `registry.rules()` imports them all on first use.

Modules starting with `_` hold what several rules share (window geometry) and register
nothing. A rule returns, for each input that needs one, the name of a tensor holding its
gradient, shaped as that input.
"""
