"""MLflow runs and their stores, host and owner information, system metrics, and the one redaction
policy for every byte written or printed.
"""
