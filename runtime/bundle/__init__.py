"""Ahead-of-time bundles: a partitioned network as one `NAME.prism` file.

`reader` opens and checks a bundle (light: the standalone driver imports it);
`writer` compiles a model into one; `plan_io` turns its plan back into a `Plan`;
`match` fits its device requirements onto a host's devices; `network` rebuilds the
whole network (export-onnx, the stepper). The format is described in
docs/bundle-format.md.
"""
