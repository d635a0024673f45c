"""bisect-eagle: search and bisect EAGLE-3 speculative-decoding deployments, tracked in MLflow."""

__version__ = "0.1.0"
