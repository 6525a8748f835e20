"""What a training run may choose, by name: light to import (the command line's parser
reads these without loading onnx)."""

LOSSES = ("cross_entropy", "mse")
OPTIMIZERS = ("sgd", "momentum", "adam")
SCHEDULES = ("gpipe", "1f1b")
