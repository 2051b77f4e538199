"""The main job, `popxl-run configs/mnist.yaml`: config-driven MNIST training and testing on the
project's own popxl and popxl_addons API (see `run.py`)."""
