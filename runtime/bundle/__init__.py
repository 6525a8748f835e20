"""Ahead-of-time bundles: a partitioned network as one `NAME.prism` file.

`reader` opens and checks a bundle (light: the standalone driver imports it); `driver`
runs one with onnxruntime alone (`runtime.driver` is its public name); `writer` compiles
a model into one; `plan_io` turns its plan back into a `Plan`; `match` fits its device
requirements onto a host's devices and `placed` records where they went; `contents`
rebuilds the whole network (export-onnx, the stepper). Loading one into a host is the
provisioner's (`runtime.provision.from_bundle`). The format is described in
docs/bundle-format.md.
"""
