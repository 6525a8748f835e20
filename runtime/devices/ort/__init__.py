"""onnxruntime, as the devices use it: session options (`options`, light: the driver
imports it), sessions of models the installed release accepts (`sessions`), and which
nodes it can run (`kernels`)."""
